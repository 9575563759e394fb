"""Preflight's Ray runner (``--ray [ADDRESS]``): the per-rank checks in Ray actors, placed as NeMo RL places them.

NeMo RL runs its training workers as Ray actors, one per bundle of a placement group, and
gives each the torch.distributed environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). This does the same on an existing cluster (``auto``, or
an address; inside the allocation ``ray.sub`` starts, ``auto``):

* one placement group, strategy ``PACK``: a GPU and a CPU per bundle where the cluster has
  at least two GPUs (one rank per GPU, or ``--nproc``), one CPU per bundle otherwise (two
  ranks, or ``--nproc``);
* one actor per bundle, which runs :func:`nemo_rl_shim.cli.preflight.rank_checks.check_rank`, the
  same checks as the other modes; the ranks meet on ``127.0.0.1`` when every actor is on
  one node, else on rank 0's node address, at a port free on that node;
* each rank's node (id, address, host name) is in the report.

Bounded: ``--timeout-s`` runs from connecting to the last result. A rank still running
then is named with what it was doing, for how long, and where (each actor answers a ``phase``
call while its checks run: a long ``setup_distributed`` is a slow or stuck start, not a stalled
peer; the JSON report adds the rank's innermost Python frames). An actor that dies, or whose
checks gave up on a stalled peer (a collective timed out), is named at once and the others get
the grace (:class:`~nemo_rl_shim.cli.preflight.stuck.Grace`, as spawned ranks do) to finish; one
still running then is named with its phase. Each actor's parameters and result cross as JSON
(:mod:`~nemo_rl_shim.cli.preflight.results`). More CPU ranks than the cluster has CPUs, or more CUDA
ranks than GPUs, are refused before anything is placed. The actors
and the placement group are removed on every path, failure included,
and the driver disconnects.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nemo_rl_shim.cli.preflight.options import MIN_RANKS, PreflightOptions
from nemo_rl_shim.cli.preflight.results import Node, RankFailed, RankOutcome, outcome_from_json
from nemo_rl_shim.cli.preflight.runner import (
    Capacity,
    Progress,
    RankLimit,
    RankPlan,
    RankRun,
    Runner,
    plan_ranks,
    rank_env,
)
from nemo_rl_shim.cli.preflight.stuck import Grace, after_grace, past_deadline, watchdog
from nemo_rl_shim.one_line.exception import first_line

__all__ = ["RayRunner", "RayUnavailable", "bundle_of", "plan_note", "plan_ray_ranks"]

#: How long the driver waits for Ray to drop the killed actors before it returns.
CLEANUP_WAIT_S = 15.0
#: Beyond ``--timeout-s``: a connect or clean-up that hangs ends the process with one line.
WATCHDOG_GRACE_S = 60.0
_PHASE_ANSWER_S = 5.0


def plan_ray_ranks(nproc: int | None, cluster_gpus: int, cluster_cpus: int) -> RankPlan:
    """One rank per GPU of the cluster with two GPUs or more, else ``nproc`` (default 2) CPU ranks, one CPU each."""
    return plan_ranks(
        nproc,
        RankLimit(cluster_gpus, f"the cluster's {cluster_gpus} GPUs"),
        RankLimit(cluster_cpus, f"the cluster's {cluster_cpus} CPUs: a CPU rank's bundle takes one"),
    )


def bundle_of(plan: RankPlan) -> dict[str, float]:
    """What each bundle of the placement group asks for: a GPU and a CPU per CUDA rank, a CPU per CPU rank."""
    return {"CPU": 1, "GPU": 1} if plan.device == "cuda" else {"CPU": 1}


def plan_note(plan: RankPlan, cluster_gpus: int) -> str:
    """``"8 GPU bundles (1 GPU, 1 CPU each), strategy PACK"``, or why the ranks are CPU ranks."""
    if plan.device == "cuda":
        return f"{plan.world_size} GPU bundles (1 GPU, 1 CPU each), strategy PACK"
    why = (
        "no GPU in the Ray cluster"
        if cluster_gpus == 0
        else f"{cluster_gpus} GPU in the Ray cluster, a CUDA run needs {MIN_RANKS}"
    )
    return f"{why}: {plan.world_size} CPU bundles (gloo), strategy PACK"


class _PreflightRank:
    """One rank of the check, as a Ray actor (made remote in :meth:`_Placement.place`; ``max_concurrency=2``
    so that :meth:`phase` answers while :meth:`run` is inside a collective)."""

    def __init__(self) -> None:
        self._phase = "started"
        self._since = time.monotonic()
        self._thread: int | None = None  # the thread running the checks, once they start

    def locate(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def free_port(self) -> int:
        from nemo_rl_shim.cli.preflight.spawn import free_port

        return free_port("")

    def phase(self) -> tuple[str, float, list[str]]:
        """What the rank is doing, for how many seconds it has been at it, and where (the innermost frames)."""
        return self._phase, time.monotonic() - self._since, _innermost_frames(self._thread)

    def _set_phase(self, what: str) -> None:
        self._phase, self._since = what, time.monotonic()

    def run(self, env: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
        """This rank's checks: :class:`~.results.RankParams` JSON in, a :data:`~.results.RankOutcome`'s JSON out."""
        os.environ.update(env)
        self._thread = threading.get_ident()
        self._set_phase("importing torch and nemo-automodel")
        import torch.distributed as dist

        from nemo_rl_shim.cli.preflight.rank_checks import check_rank
        from nemo_rl_shim.cli.preflight.results import RankParams

        try:
            return check_rank(RankParams.from_json(params), phase=self._set_phase).to_json()
        except Exception:
            return RankFailed(int(env["RANK"]), traceback.format_exc()).to_json()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _innermost_frames(thread: int | None, depth: int = 8) -> list[str]:
    """``path:line in function`` of ``thread``'s innermost Python frames, innermost last (``[]`` if it is not
    running). A rank blocked in C++ (a rendezvous, a collective) shows the Python call that entered it."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    if frame is None:
        return []
    roots = sorted((entry.rstrip("/") + "/" for entry in sys.path if entry), key=len, reverse=True)

    def short(path: str) -> str:  # as imported: torch/distributed/..., nemo_rl_shim/cli/...
        return next((path[len(root) :] for root in roots if path.startswith(root)), path)

    frames = traceback.extract_stack(frame)[-depth:]
    return [f"{short(f.filename)}:{f.lineno} in {f.name}" for f in frames]


def _in_phase(result: RankFailed) -> str:
    """``all_reduce on group default for 78 s``: how long tells a slow start from a stuck one."""
    what = result.phase or "an unknown phase"
    return what if result.phase_s is None else f"{what} for {result.phase_s:.0f} s"


class _Placement:
    """The placement group, one actor per bundle, and the node each actor runs on."""

    def __init__(self, tag: str, deadline: float) -> None:
        self.tag = tag
        self.deadline = deadline
        self.group: Any = None
        self.actors: list[Any] = []
        self.nodes: list[Node] = []

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def place(self, plan: RankPlan, timeout_s: float) -> str | None:
        """Place the group and start the actors; the problem when they are not up before the deadline."""
        import ray
        from ray.util.placement_group import placement_group

        bundle = bundle_of(plan)
        self.group = placement_group([dict(bundle)] * plan.world_size, strategy="PACK", name=self.tag)
        ready, _ = ray.wait([self.group.ready()], timeout=self.remaining())
        if not ready:
            return (
                f"the placement group of {plan.world_size} bundles {bundle} was not placed within "
                f"{timeout_s:g} s (--timeout-s): the cluster has {ray.cluster_resources()}"
            )
        self._start_actors(plan.world_size, bundle)
        refs = [actor.locate.remote() for actor in self.actors]
        located, _ = ray.wait(refs, num_returns=len(refs), timeout=self.remaining())
        if len(located) < len(refs):
            return (
                f"{len(refs) - len(located)} of {len(refs)} actors did not start within {timeout_s:g} s (--timeout-s)"
            )
        self.nodes = [Node.from_json(node) for node in ray.get(refs)]
        return None

    def _start_actors(self, count: int, bundle: dict[str, float]) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = ray.remote(max_concurrency=2)(_PreflightRank)
        for index in range(count):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
            self.actors.append(
                actor_class.options(
                    name=f"{self.tag}-rank{index}",
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=strategy,
                ).remote()
            )

    def rank_envs(self, plan: RankPlan) -> list[dict[str, str]]:
        """Each actor's torch.distributed environment: they meet on rank 0's node (loopback on one node)."""
        import ray

        one_node = len({n.node_id for n in self.nodes}) == 1
        master = "127.0.0.1" if one_node else self.nodes[0].node_ip
        port = ray.get(self.actors[0].free_port.remote(), timeout=max(1.0, self.remaining()))
        seen: dict[str, int] = {}
        envs = []
        for rank, node in enumerate(self.nodes):
            local_rank = seen[node.node_id] = seen.get(node.node_id, -1) + 1
            envs.append(
                {
                    **plan.env,
                    **rank_env(rank, plan.world_size, local_rank),
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                }
            )
        return envs

    def describe(self, rank: int) -> str:
        where = self.nodes[rank].node_ip if rank < len(self.nodes) else "?"
        return f"rank {rank} (actor {self.tag}-rank{rank} on node {where})"

    def node(self, rank: int) -> Node | None:
        return self.nodes[rank] if rank < len(self.nodes) else None

    def unfinished(self, rank: int) -> RankFailed:
        """Rank ``rank``, which did not finish: what its actor says it was doing, for how long, and where (its
        innermost frames); an unknown phase, and no time, if the actor cannot say."""
        import ray

        try:
            what, seconds, frames = ray.get(self.actors[rank].phase.remote(), timeout=_PHASE_ANSWER_S)
        except Exception as e:  # a dead or wedged actor cannot say; that is the finding
            what = f"an unknown phase (the actor did not answer: {type(e).__name__})"
            return RankFailed(rank, "did not finish", phase=what, node=self.node(rank))
        return RankFailed(
            rank, "did not finish", phase=str(what), phase_s=round(float(seconds), 1), stack=tuple(frames),
            node=self.node(rank),
        )  # fmt: skip

    def clean_up(self, progress: Progress) -> None:
        """Kill every actor and remove the placement group, then wait (bounded) until Ray no longer lists them."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # keep going: the group and the other actors must go too
                progress(f"could not kill an actor: {type(e).__name__}: {e}")
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception as e:
                progress(f"could not remove the placement group: {type(e).__name__}: {e}")
        end = time.monotonic() + CLEANUP_WAIT_S
        while self.actors and time.monotonic() < end:
            if not [name for name in ray.util.list_named_actors() if name.startswith(self.tag)]:
                break
            time.sleep(0.2)


class _Gathering:
    """Every actor's result as it comes, bounded by the deadline and by the grace after a failure."""

    def __init__(self, placement: _Placement, options: PreflightOptions, progress: Progress) -> None:
        self.placement = placement
        self.options = options
        self.progress = progress
        self.problems: list[str] = []
        self.timed_out = False
        self.grace = Grace()
        #: Whether the grace names the ranks it ends: after a peer gave up on them, yes; after a rank failed or
        #: an actor died, that rank is the finding and those still waiting on it are not.
        self._names_the_rest = False

    def collect(self, envs: list[dict[str, str]]) -> list[RankOutcome]:
        import ray

        params = self.options.rank_params().to_json()
        refs = {
            actor.run.remote(env, params): rank
            for rank, (actor, env) in enumerate(zip(self.placement.actors, envs, strict=True))
        }
        results: dict[int, RankOutcome] = {}
        pending = list(refs)
        while pending:
            limit = min(self.placement.remaining(), self.grace.remaining())
            done, pending = ray.wait(pending, num_returns=1, timeout=limit)
            if not done:
                break
            for ref in done:
                rank = refs[ref]
                results[rank] = self._result(ref, rank)
                self._start_grace(results[rank])
            self.progress(f"{len(results)} of {len(refs)} ranks finished")
        if pending:
            self._name_the_stuck(sorted(refs[ref] for ref in pending), results)
        return [results[rank] for rank in sorted(results)]

    def _start_grace(self, result: RankOutcome) -> None:
        if isinstance(result, RankFailed):
            self.grace.start(f"rank {result.rank} failed")
        elif result.gave_up:
            self._names_the_rest = not self.grace.started
            self.grace.start(f"rank {result.rank} gave up on its peers ({result.gave_up})")

    def _name_the_stuck(self, stuck: list[int], results: dict[int, RankOutcome]) -> None:
        """Ranks still running at the deadline, or when the grace after a peer that failed or gave up is over."""
        self.timed_out = not self.grace.started
        unfinished = {rank: replace(self.placement.unfinished(rank), killed_because=self.grace.why) for rank in stuck}
        results.update(unfinished)
        where = "; ".join(f"{self.placement.describe(r)} was in {_in_phase(unfinished[r])}" for r in stuck)
        if self.timed_out:
            self.problems.append(past_deadline(stuck, self.options.timeout_s, where, self.options.timeout_whole_s))
        elif self._names_the_rest:  # a rank that died is the finding; the ranks still waiting on it are not
            self.problems.append(after_grace(stuck, self.grace.why or "", where))

    def _result(self, ref: Any, rank: int) -> RankOutcome:
        import ray

        try:
            data = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            cause = first_line(e, with_type=False)
            self.problems.append(f"{self.placement.describe(rank)} died: {cause}")
            return RankFailed(rank, f"actor died: {cause}", node=self.placement.node(rank))
        except ray.exceptions.RayError as e:
            return RankFailed(rank, str(e), node=self.placement.node(rank))
        outcome = outcome_from_json(data, rank)
        return replace(outcome, node=self.placement.node(rank))


class RayUnavailable(ValueError):
    """Ray cannot be used here (not importable, or no cluster at the address): one line, exit 2."""


def _no_cluster(address: str, error: BaseException) -> str:
    """Ray's ConnectionError in this command's words: Ray's own hint (``ray/_private/services.py``,
    ``get_ray_address_from_environment``) names an ``--address`` flag, which this command does not have."""
    if address == "auto":
        where = "--ray auto found no running Ray cluster (it looks at RAY_ADDRESS, then on this machine)"
    else:
        why = first_line(error, with_type=False)
        where = f"--ray {address}: no Ray cluster there" + ("" if "--address" in why else f" ({why[:200]})")
    return f"{where}: start one (ray start --head, or NeMo RL's ray.sub), or give its address as --ray HOST:PORT"


class RayRunner(Runner):
    """Preflight's ranks as Ray actors of the cluster at ``address``; see the module docstring.

    Entering connects to the cluster (bounded, with the connect and clean-up, by a watchdog at
    ``timeout_s`` plus :data:`WATCHDOG_GRACE_S`, which calls ``last_words`` before it ends the
    process); leaving disconnects.
    """

    def __init__(self, address: str, timeout_s: float, last_words: Callable[[str], None] | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.last_words = last_words
        self.tag = f"nemo-rl-shim-preflight-{uuid.uuid4().hex[:8]}"
        self.gpus = 0
        self.cpus = 0
        self._watchdog: threading.Timer | None = None

    def __enter__(self) -> RayRunner:
        try:
            import ray
        except ImportError as e:  # installed (build_options found it) but broken: one line, as for bad input
            raise RayUnavailable(f"--ray: Ray is installed but does not import: {first_line(e)}") from None

        # As NeMo RL's ray.sub does: under `uv run`, Ray (2.47 and later) would otherwise make every worker run
        # `uv run` in a copy of the current directory, a fresh environment per worker. The actors must run
        # the cluster's own Python, as NeMo RL's workers do. A value the user set is kept.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        seconds = self.timeout_s + WATCHDOG_GRACE_S
        line = f"the Ray run did not end within {seconds:g} s (--timeout-s plus clean-up)"
        self._watchdog = watchdog(seconds, line, self.last_words)
        try:
            try:
                ray.init(address=self.address, namespace=self.tag, log_to_driver=False, logging_level=logging.ERROR)
            except ConnectionError as e:  # Ray's own line names an `--address` flag, which this command has not
                raise RayUnavailable(_no_cluster(self.address, e)) from None
            except Exception as e:  # a cluster of another Ray version, say: Ray's words, on one line
                said = " ".join(str(e).split())[:300] or type(e).__name__
                raise RayUnavailable(f"--ray {self.address}: Ray could not join the cluster: {said}") from None
            resources = ray.cluster_resources()
            self.gpus, self.cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        import ray

        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()

    def capacity(self, options: PreflightOptions) -> Capacity:
        room = self.plan(None)
        here = f"the Ray cluster can place {room.world_size} ranks ({plan_note(room, self.gpus)})"
        return Capacity(gpus=self.gpus, here=here)

    def plan(self, ranks: int | None) -> RankPlan:
        return plan_ray_ranks(ranks, self.gpus, self.cpus)

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        note = plan_note(ranks, self.gpus)
        progress(f"Ray cluster at {self.address}: {note}; placing {ranks.world_size} actors...")
        placement = _Placement(self.tag, time.monotonic() + options.timeout_s)
        gathering = _Gathering(placement, options, progress)
        try:
            problem = placement.place(ranks, options.timeout_s)
            if problem is not None:
                return RankRun("ray", ranks.world_size, (), note, timed_out=True, problems=(problem,))
            progress(f"actors on {', '.join(sorted({n.node_ip for n in placement.nodes}))}; running the checks...")
            outcomes = tuple(gathering.collect(placement.rank_envs(ranks)))
        finally:
            placement.clean_up(progress)
        return RankRun("ray", ranks.world_size, outcomes, note, gathering.timed_out, tuple(gathering.problems))
