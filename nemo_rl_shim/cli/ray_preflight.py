"""``nemo-rl-shim preflight --ray [ADDRESS]``: the per-rank checks in Ray actors, placed as NeMo RL places its workers.

NeMo RL runs its training workers as Ray actors, one per bundle of a placement group, and
gives each the torch.distributed environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). This does the same on an existing cluster (``auto``, or
an address; inside the allocation ``ray.sub`` starts, ``auto``):

* one placement group, strategy ``PACK``: a GPU and a CPU per bundle where the cluster has
  at least two GPUs (one rank per GPU, or ``--nproc``), one CPU per bundle otherwise (two
  ranks, or ``--nproc``);
* one actor per bundle, which runs :func:`nemo_rl_shim.cli._rank_checks.check_rank`, the
  same checks as the other modes; the ranks meet on ``127.0.0.1`` when every actor is on
  one node, else on rank 0's node address, at a port free on that node;
* each rank's node (id, address, host name) is in the report.

Bounded: ``--timeout-s`` runs from connecting to the last result. A rank still running
then is named with what it was doing, for how long, and where (each actor answers a ``phase``
call while its checks run: a long ``setup_distributed`` is a slow or stuck start, not a stalled
peer; the JSON report adds the rank's innermost Python frames). An actor that dies, or whose
checks gave up on a stalled peer (a collective timed out), is named at once and the others get
:data:`FAILURE_GRACE_S` to finish; one still running then is named with its phase. The actors
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
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli._rank_checks import gave_up_on_peers
from nemo_rl_shim.cli._report import PreflightReport, find_problems
from nemo_rl_shim.cli.options import MIN_RANKS, PreflightOptions, ranks_for_world

__all__ = ["FAILURE_GRACE_S", "RayPlan", "plan_ray_ranks", "run_on_ray"]

#: After one actor fails or dies, how long the others get before they are killed.
FAILURE_GRACE_S = 10.0
#: How long the driver waits for Ray to drop the killed actors before it returns.
CLEANUP_WAIT_S = 15.0
#: Beyond ``--timeout-s``: a connect or clean-up that hangs ends the process with one line.
WATCHDOG_GRACE_S = 60.0
_PHASE_ANSWER_S = 5.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RayPlan:
    """How many actors, and what each bundle asks for."""

    world_size: int
    bundle: dict[str, float]
    env: dict[str, str]
    note: str


def plan_ray_ranks(nproc: int | None, cluster_gpus: int) -> RayPlan:
    """One rank per GPU (a GPU and a CPU per bundle) with two GPUs or more, else ``nproc`` (default 2) CPU ranks."""
    if nproc is not None and nproc < MIN_RANKS:
        raise ValueError(f"--nproc must be at least {MIN_RANKS}, got {nproc}")
    if cluster_gpus >= MIN_RANKS:
        if nproc is not None and nproc > cluster_gpus:
            raise ValueError(f"--nproc {nproc} exceeds the cluster's {cluster_gpus} GPUs: NCCL needs one per rank")
        world = nproc or cluster_gpus
        return RayPlan(world, {"CPU": 1, "GPU": 1}, {}, f"{world} GPU bundles (1 GPU, 1 CPU each), strategy PACK")
    world = nproc or MIN_RANKS
    why = (
        "no GPU in the Ray cluster"
        if cluster_gpus == 0
        else f"{cluster_gpus} GPU in the Ray cluster, a CUDA run needs {MIN_RANKS}"
    )
    return RayPlan(world, {"CPU": 1}, {"CUDA_VISIBLE_DEVICES": ""}, f"{why}: {world} CPU bundles (gloo), strategy PACK")


class _PreflightRank:
    """One rank of the check, as a Ray actor (made remote in :func:`run_on_ray`; ``max_concurrency=2``
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
        from nemo_rl_shim.cli.launch import free_port

        return free_port("")

    def phase(self) -> tuple[str, float, list[str]]:
        """What the rank is doing, for how many seconds it has been at it, and where (the innermost frames)."""
        return self._phase, time.monotonic() - self._since, _innermost_frames(self._thread)

    def _set_phase(self, what: str) -> None:
        self._phase, self._since = what, time.monotonic()

    def run(self, env: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
        os.environ.update(env)
        self._thread = threading.get_ident()
        self._set_phase("importing torch and nemo-automodel")
        import torch.distributed as dist

        from nemo_rl_shim.cli._rank_checks import check_rank

        try:
            return check_rank(params, phase=self._set_phase)
        except Exception:
            return {"rank": int(env["RANK"]), "error": traceback.format_exc()}
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


def _in_phase(result: dict[str, Any]) -> str:
    """``all_reduce on group default for 78 s``: how long tells a slow start from a stuck one."""
    seconds = result.get("phase_s")
    return result["phase"] if seconds is None else f"{result['phase']} for {seconds:.0f} s"


def _watchdog(seconds: float) -> threading.Timer:
    def expire() -> None:
        print(f"preflight: the Ray run did not end within {seconds:g} s (--timeout-s plus clean-up)", file=sys.stderr)
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


class _Run:
    """One Ray preflight: the placement group, the actors, and what became of each rank."""

    def __init__(self, options: PreflightOptions, progress: Progress) -> None:
        self.options = options
        self.progress = progress
        self.deadline = time.monotonic() + options.timeout_s
        self.tag = f"nemo-rl-shim-preflight-{uuid.uuid4().hex[:8]}"
        self.group: Any = None
        self.actors: list[Any] = []
        self.nodes: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.timed_out = False

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def place(self, plan: RayPlan) -> bool:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.group = placement_group([dict(plan.bundle)] * plan.world_size, strategy="PACK", name=self.tag)
        ready, _ = ray.wait([self.group.ready()], timeout=self.remaining())
        if not ready:
            self.timed_out = True
            self.problems.append(
                f"the placement group of {plan.world_size} bundles {plan.bundle} was not placed within "
                f"{self.options.timeout_s:g} s (--timeout-s): the cluster has {ray.cluster_resources()}"
            )
            return False
        actor_class = ray.remote(max_concurrency=2)(_PreflightRank)
        for index in range(plan.world_size):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
            self.actors.append(
                actor_class.options(
                    name=f"{self.tag}-rank{index}",
                    num_cpus=plan.bundle.get("CPU", 0),
                    num_gpus=plan.bundle.get("GPU", 0),
                    scheduling_strategy=strategy,
                ).remote()
            )
        refs = [actor.locate.remote() for actor in self.actors]
        located, _ = ray.wait(refs, num_returns=len(refs), timeout=self.remaining())
        if len(located) < len(refs):
            self.timed_out = True
            self.problems.append(
                f"{len(refs) - len(located)} of {len(refs)} actors did not start within "
                f"{self.options.timeout_s:g} s (--timeout-s)"
            )
            return False
        self.nodes = ray.get(refs)
        return True

    def rank_env(self, plan: RayPlan) -> list[dict[str, str]]:
        import ray

        one_node = len({n["node_id"] for n in self.nodes}) == 1
        master = "127.0.0.1" if one_node else self.nodes[0]["node_ip"]
        port = ray.get(self.actors[0].free_port.remote(), timeout=max(1.0, self.remaining()))
        seen: dict[str, int] = {}
        envs = []
        for rank, node in enumerate(self.nodes):
            local_rank = seen[node["node_id"]] = seen.get(node["node_id"], -1) + 1
            envs.append(
                {
                    **plan.env,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(local_rank),
                    "WORLD_SIZE": str(plan.world_size),
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                }
            )
        return envs

    def describe(self, rank: int) -> str:
        node = self.nodes[rank] if rank < len(self.nodes) else {}
        return f"rank {rank} (actor {self.tag}-rank{rank} on node {node.get('node_ip', '?')})"

    def collect(self, envs: list[dict[str, str]]) -> list[dict[str, Any]]:
        import ray

        refs = {
            actor.run.remote(env, self.options.params()): rank
            for rank, (actor, env) in enumerate(zip(self.actors, envs, strict=True))
        }
        results: dict[int, dict[str, Any]] = {}
        failed_at, why = None, None
        pending = list(refs)
        while pending:
            limit = (
                self.remaining()
                if failed_at is None
                else min(self.remaining(), failed_at + FAILURE_GRACE_S - time.monotonic())
            )
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, limit))
            if not done:
                break
            for ref in done:
                rank = refs[ref]
                results[rank] = self._result(ref, rank)
                gave_up = gave_up_on_peers(results[rank])
                if failed_at is None and ("rows" not in results[rank] or gave_up):
                    failed_at = time.monotonic()
                    why = f"rank {rank} gave up on its peers ({gave_up})" if gave_up else None
            self.progress(f"{len(results)} of {len(refs)} ranks finished")
        if pending:
            self._name_the_stuck(sorted(refs[ref] for ref in pending), results, failed_at, why)
        return [results[rank] for rank in sorted(results)]

    def _name_the_stuck(
        self, stuck: list[int], results: dict[int, dict[str, Any]], failed_at: float | None, why: str | None
    ) -> None:
        """Ranks still running at the deadline, or :data:`FAILURE_GRACE_S` after a peer failed or gave up."""
        self.timed_out = failed_at is None
        for rank in stuck:
            results[rank] = {"rank": rank, "error": "did not finish", **self._phase(rank)}
        where = "; ".join(f"{self.describe(r)} was in {_in_phase(results[r])}" for r in stuck)
        ranks = f"{'ranks' if len(stuck) > 1 else 'rank'} {', '.join(map(str, stuck))}"
        if failed_at is None:
            self.problems.append(f"{ranks} did not finish within {self.options.timeout_s:g} s (--timeout-s): {where}")
        elif why:  # a rank that died is the finding; the ranks still waiting on it are not
            self.problems.append(f"{ranks} did not finish: still running {FAILURE_GRACE_S:g} s after {why}: {where}")

    def _result(self, ref: Any, rank: int) -> dict[str, Any]:
        import ray

        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.problems.append(f"{self.describe(rank)} died: {cause}")
            return {"rank": rank, "error": f"actor died: {cause}"}
        except ray.exceptions.RayError as e:
            return {"rank": rank, "error": str(e)}
        return result

    def _phase(self, rank: int) -> dict[str, Any]:
        """``{"phase": what, "phase_s": for how long, "stack": innermost frames}`` as the actor says (``phase_s``
        None, and no ``stack``, if it cannot)."""
        import ray

        try:
            what, seconds, frames = ray.get(self.actors[rank].phase.remote(), timeout=_PHASE_ANSWER_S)
        except Exception as e:  # a dead or wedged actor cannot say; that is the finding
            return {"phase": f"an unknown phase (the actor did not answer: {type(e).__name__})", "phase_s": None}
        return {"phase": str(what), "phase_s": round(float(seconds), 1), "stack": list(frames)}

    def clean_up(self) -> None:
        """Kill every actor and remove the placement group, then wait (bounded) until Ray no longer lists them."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # keep going: the group and the other actors must go too
                self.progress(f"could not kill an actor: {type(e).__name__}: {e}")
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception as e:
                self.progress(f"could not remove the placement group: {type(e).__name__}: {e}")
        end = time.monotonic() + CLEANUP_WAIT_S
        while self.actors and time.monotonic() < end:
            if not [name for name in ray.util.list_named_actors() if name.startswith(self.tag)]:
                break
            time.sleep(0.2)


def run_on_ray(options: PreflightOptions, address: str, progress: Progress) -> PreflightReport:
    """Check ``options`` on Ray actors of the cluster at ``address``; see the module docstring."""
    import ray

    # As NeMo RL's ray.sub does: under `uv run`, Ray (2.47 and later) would otherwise make every worker run
    # `uv run` in a copy of the current directory, a fresh environment per worker. The actors must run
    # the cluster's own Python, as NeMo RL's workers do. A value the user set is kept.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    start = time.monotonic()
    watchdog = _watchdog(options.timeout_s + WATCHDOG_GRACE_S)
    run = _Run(options, progress)
    ranks: list[dict[str, Any]] = []
    plan = None
    try:
        ray.init(address=address, namespace=run.tag, log_to_driver=False, logging_level=logging.ERROR)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        room = plan_ray_ranks(None, gpus)
        here = f"the Ray cluster can place {room.world_size} ranks ({room.note})"
        plan = plan_ray_ranks(ranks_for_world(options, room.world_size, here), gpus)
        progress(f"Ray cluster at {address}: {plan.note}; placing {plan.world_size} actors...")
        try:
            if run.place(plan):
                progress(f"actors on {', '.join(sorted({n['node_ip'] for n in run.nodes}))}; running the checks...")
                ranks = run.collect(run.rank_env(plan))
                for rank in ranks:
                    if rank["rank"] < len(run.nodes):
                        rank["node"] = run.nodes[rank["rank"]]
        finally:
            run.clean_up()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        watchdog.cancel()
    world = plan.world_size if plan is not None else 0
    report = PreflightReport(
        "ray", world, options, ranks, time.monotonic() - start, plan.note if plan else None, run.timed_out
    )
    report.problems = run.problems or find_problems(ranks, options)
    return report
