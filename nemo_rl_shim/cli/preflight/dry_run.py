"""``nemo-rl-shim preflight --dry-run``: the training world's set-up, checked rank by rank in this process.

The fourth runner of preflight, beside spawn, torchrun/srun and Ray: the same per-rank
checks (:func:`nemo_rl_shim.cli.preflight.rank_checks.check_rank`, so the real ``setup_distributed``:
validation, NeMo RL's layout checks, the decision, the workaround layers, Automodel's real
``MeshContext.build``) and the same report, but every rank is played in turn by this one
process on torch's fake backend (:mod:`nemo_rl_shim.cli.preflight.fake_backend`): no GPU, no network,
no other process. Each rank's default group is the one the real run would have:
``"cuda:nccl,cpu:gloo"`` under CPU offload, ``"nccl"`` otherwise. Collectives and the
``full_tensor()`` check are not run.

Every process group a checked rank creates is recorded: its ranks, the backend of each
device and each one's timeout. Their number is the number of NCCL communicators the rank
will hold. The rows are built by the same code as every runner's
(:func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank`): every group torch holds, the
groups a NeMo RL worker makes after set-up included (:mod:`~nemo_rl_shim.cli.preflight.later_groups`),
under the names the training code gives them, and the others under their description. A group
without the configured timeout, at torch's default, with a timeout that cannot be read, or
without its CPU half under CPU offload, is a problem (exit 1), as in preflight.

Bounded: before any rank is played, the run is estimated (:func:`estimate`: a checked rank's
cost is its ``new_group`` calls, one per group of the world, the later groups' included, at
:data:`SECONDS_PER_NEW_GROUP` and :data:`BYTES_PER_NEW_GROUP` each, measured). A run estimated
past ``--timeout-s``, or past the memory this machine has available, is refused with the
estimate (exit 2); otherwise the estimate is in the progress line, and ranks not reached by
``--timeout-s`` are named (exit 1).

Which ranks (:func:`sample_ranks`): every rank of a world of up to :data:`ALL_RANKS_UP_TO`;
above it a sample, or all of them with ``--ranks all``. The mesh is Automodel's
``(pp, dp_replicate, dp_shard, cp, tp)`` in row-major rank order, and the MoE mesh
``(pp, ep_shard, ep)`` over the same ranks. A rank holds one group per axis, and on one axis
every group is the same set of ranks shifted: the *shape* of a group is its axis and its
ranks less the first one. So every rank holds a group of every shape,
and what tells ranks apart is where they sit on each axis. The sample is rank 0, the last
rank, and for each axis of size > 1 the rank one step along it and the rank at its far end
(every other coordinate 0): each axis is seen at its first, second and last position, and
rank 0's node and the last node are both in. That is at most 2 + 2 x 6 ranks whatever the
world. A layout that cannot be built (sizes that do not divide the world, CPU offload on a
world of 1) is bad input: exit 2, raised here as ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli.preflight.fake_backend import GPUS_PER_NODE, FakeBackend, fake_backend
from nemo_rl_shim.cli.preflight.later_groups import refit_gpus_per_engine
from nemo_rl_shim.cli.preflight.options import MIN_RANKS, PreflightOptions
from nemo_rl_shim.cli.preflight.rank_checks import check_rank
from nemo_rl_shim.cli.preflight.report import groups_line
from nemo_rl_shim.cli.preflight.results import (
    CreatedGroup,
    DryRunFacts,
    RankChecked,
    RankFailed,
    RankOutcome,
    RankParams,
)
from nemo_rl_shim.cli.preflight.runner import (
    PROGRESS_EVERY_S,
    Capacity,
    Progress,
    RankPlan,
    RankRun,
    Runner,
    available_memory_mib,
)
from nemo_rl_shim.cli.preflight.stuck import past_deadline
from nemo_rl_shim.config.settings import SHIM_CFG
from nemo_rl_shim.setup.distributed import ParallelSizes, check_layout, parallel_sizes

__all__ = [
    "ALL_RANKS_UP_TO",
    "BYTES_PER_NEW_GROUP",
    "LAUNCHER",
    "SECONDS_PER_NEW_GROUP",
    "DryRunner",
    "Estimate",
    "Mesh",
    "estimate",
    "later_sizes",
    "mesh_of",
    "sample_ranks",
]

LAUNCHER = "dry run"
#: Worlds up to this size are checked on every rank.
ALL_RANKS_UP_TO = 64
#: What one ``new_group`` call costs a checked rank: measured 26-34 us of CPU per call here (2 cores, torch 2.15,
#: nemo-automodel 0.7.0, 1,024 to 32,768 ranks); benchmarks/README.md has 30-44 us up to 65,536 ranks.
SECONDS_PER_NEW_GROUP = 40e-6
#: Memory a checked rank holds per ``new_group`` call at its peak: measured 0.34 KiB (44 MiB more for 131,072 calls
#: at 32,768 ranks) and 0.6 KiB (benchmarks/README.md, 65,536 ranks); 1 KiB allowed.
BYTES_PER_NEW_GROUP = 1024


@dataclass(frozen=True)
class Mesh:
    """Automodel's FSDP2 meshes for a world: axis sizes in row-major order, for the mesh and the MoE mesh."""

    axes: tuple[tuple[str, int], ...]
    moe_axes: tuple[tuple[str, int], ...]


def mesh_of(sizes: ParallelSizes, world_size: int) -> Mesh:
    """The mesh Automodel's ``_create_fsdp2_device_mesh`` builds (pp is 1 here, as in ``setup_distributed``)."""
    dp = world_size // (sizes.tp * sizes.cp)
    ep_shard = world_size // sizes.ep if sizes.ep < world_size else 1
    axes = (("dp_replicate", sizes.dp_replicate), ("dp_shard", dp // sizes.dp_replicate), ("cp", sizes.cp))
    return Mesh(
        (*axes, ("tp", sizes.tp)),
        (("ep_shard", ep_shard), ("ep", sizes.ep)) if sizes.ep > 1 else (),
    )


def _rank_at(axes: tuple[tuple[str, int], ...], coordinates: dict[str, int]) -> int:
    rank = 0
    for name, size in axes:
        rank = rank * size + coordinates.get(name, 0)
    return rank


def sample_ranks(mesh: Mesh, world_size: int, *, every_rank: bool = False) -> dict[int, str]:
    """``{rank: why it is checked}``: every rank up to :data:`ALL_RANKS_UP_TO` (or ``every_rank``), else
    the sample of the module docstring."""
    if every_rank or world_size <= ALL_RANKS_UP_TO:
        return {rank: "every rank" for rank in range(world_size)}
    chosen: dict[int, list[str]] = {0: ["first rank"], world_size - 1: ["last rank"]}
    for axes in (mesh.axes, mesh.moe_axes):
        for name, size in (axis for axis in axes if axis[1] > 1):
            for position in sorted({1, size - 1}):
                label = "last" if position == size - 1 else "second"
                chosen.setdefault(_rank_at(axes, {name: position}), []).append(f"{label} on {name}")
    return {rank: ", ".join(chosen[rank]) for rank in sorted(chosen)}


def _world_and_source(options: PreflightOptions) -> tuple[int, str]:
    """The world a dry run checks, and where it came from: the training world, else ``--nproc``, else 2."""
    if options.world_size is not None:
        return options.world_size, options.world_source or f"{options.world_size} ranks"
    if options.nproc is not None:
        return options.nproc, f"--nproc {options.nproc} (no training world in the config, no --world)"
    return MIN_RANKS, f"the default of {MIN_RANKS} ranks (no training world in the config, no --world, no --nproc)"


def _check_input(options: PreflightOptions, world_size: int) -> ParallelSizes:
    """The layout checks that need no group: NeMo RL's, and Automodel's divisibility rules."""
    where = f"{options.role}.dtensor_cfg"
    sizes = parallel_sizes(options.section.get("dtensor_cfg") or {}, where)
    try:
        check_layout(sizes, world_size, cpu_offload=options.cpu_offload, where=where)
    except NotImplementedError as e:
        raise ValueError(str(e)) from e
    if world_size % (sizes.tp * sizes.cp) or world_size % sizes.ep:
        raise ValueError(
            f"{where}: a world of {world_size} ranks is not divisible by tensor_parallel_size {sizes.tp} x "
            f"context_parallel_size {sizes.cp} = {sizes.tp * sizes.cp}, or by expert_parallel_size {sizes.ep}"
        )
    return sizes


@dataclass(frozen=True)
class Estimate:
    """What a dry run will cost before it runs: ``checked`` ranks of ``new_group_calls`` each."""

    checked: int
    new_group_calls: int

    @property
    def seconds(self) -> float:
        return self.checked * self.new_group_calls * SECONDS_PER_NEW_GROUP

    @property
    def memory_mib(self) -> float:
        return self.new_group_calls * BYTES_PER_NEW_GROUP / 2**20

    def words(self) -> str:
        """``"8 ranks to check at about 180,248 new_group calls each: about 58 s, and 176 MiB at a rank's peak"``."""
        seconds = f"about {self.seconds:.0f} s" if self.seconds >= 1 else "under 1 s"
        memory = f"{self.memory_mib:.0f} MiB" if self.memory_mib >= 1 else "under 1 MiB"
        return (
            f"{self.checked} rank{'s' * (self.checked != 1)} to check at about {self.new_group_calls:,} new_group "
            f"calls each: {seconds}, and {memory} at a rank's peak"
        )


def estimate(mesh: Mesh, world_size: int, checked: int, later: Sequence[int] = ()) -> Estimate:
    """The cost of checking ``checked`` ranks of a ``world_size`` world laid out as ``mesh``.

    Every rank calls ``new_group`` for every group of the world (torch's rule): for each axis of
    the mesh (pp, of size 1 here, included) and of the MoE mesh, ``world_size / size`` groups; an axis
    that spans the world reuses the default group. The flattened axes add a few more. ``later``: the
    group sizes of the groups made after set-up (:func:`later_sizes`), ``world_size / size`` calls each.
    """
    axes = (("pp", 1), *mesh.axes, *mesh.moe_axes)
    calls = sum(world_size // size for _, size in axes if size < world_size)
    return Estimate(checked, calls + sum(world_size // size for size in later))


def later_sizes(options: PreflightOptions, sizes: ParallelSizes) -> tuple[int, ...]:
    """The sizes of the groups a worker makes after set-up (:mod:`~nemo_rl_shim.cli.preflight.later_groups`): the
    ``(cp, tp)`` replica group of a policy worker, and SGLang's refit groups where the section makes them."""
    replica = (sizes.cp * sizes.tp,) if options.role == "policy" else ()
    refit = refit_gpus_per_engine(options.section, options.role)
    return (*replica, *(() if refit is None else (refit,)))


def _refuse_beyond(cost: Estimate, world_size: int, options: PreflightOptions, available_mib: int | None) -> None:
    """Raise ``ValueError`` (exit 2, nothing run) for a run estimated past ``--timeout-s`` or this machine's memory."""
    fewer = " (or leave --ranks all out: a sample covers every group shape)" if options.all_ranks else ""
    if cost.seconds > options.timeout_s:
        raise ValueError(
            f"a dry run of {world_size} ranks is refused before it starts: {cost.words()} "
            f"({SECONDS_PER_NEW_GROUP * 1e6:g} us a call, measured), past --timeout-s {options.timeout_s:g}; "
            f"raise --timeout-s to run it{fewer}"
        )
    if available_mib is not None and cost.memory_mib > available_mib:
        raise ValueError(
            f"a dry run of {world_size} ranks is refused before it starts: {cost.words()}, more than the "
            f"{available_mib} MiB of memory this machine has available"
        )


def _check_one(world: FakeBackend, rank: int, params: RankParams) -> RankOutcome:
    """One rank's result, as any runner's rank returns it, with the groups it created (:class:`DryRunFacts`).

    The groups are read when the set-up is done (check_rank's ``"after_first_step"`` phase, when its
    rows are read too), and again after it when a steady-state timeout was applied.
    """
    with world.rank(rank, rank % GPUS_PER_NODE) as records:
        created: list[CreatedGroup] = []

        def phase(what: str) -> None:
            if what == "after_first_step":
                created[:] = [record.read() for record in records]

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # DeviceMesh: "did not set the default device"
                result = check_rank(params, phase)
        except (ValueError, NotImplementedError) as e:  # the set-up's own input checks: the same on every rank
            raise ValueError(f"the layout cannot be built on {world.world_size} ranks: {e}") from e
        except Exception:  # anything else is a finding about this rank, as a spawned rank's failure is
            return RankFailed(rank, traceback.format_exc())
        if result.timeout_minutes_after_init is not None:
            created = [
                dataclasses.replace(group, timeout_minutes_after_init=record.read().timeout_minutes)
                for group, record in zip(created, records, strict=True)
            ]
        return dataclasses.replace(result, dry_run=DryRunFacts(tuple(created), world.new_group_calls))


def _groups_line(ranks: Sequence[RankChecked]) -> str:
    """How many groups each checked rank holds, and how the table's rows show them (:func:`.report.groups_line`),
    with the ``new_group`` calls each made."""
    title = "process groups per rank (= NCCL communicators it will hold)"
    line = groups_line(ranks, title, lambda r: r.dry_run.process_groups if r.dry_run is not None else len(r.rows))
    calls = next((r.dry_run.new_group_calls for r in ranks if r.dry_run is not None), 0)
    return f"{line}; new_group calls per rank: {calls}"


def _details(
    checked: Mapping[int, str], ranks: Sequence[RankOutcome], world_size: int, source: str, source_shown: bool,
    cost: Estimate,
) -> list[str]:  # fmt: skip
    if len(checked) == world_size:
        which = f"all {world_size}"
    else:
        which = f"{len(checked)} of {world_size} ({', '.join(f'{r}: {checked[r]}' for r in checked)})"
    return [
        *([] if source_shown else [f"training world: {world_size} ranks, from {source}"]),
        "dry run: every checked rank set up in this process on torch's fake backend; no collective run",
        f"checked ranks: {which}",
        f"estimated before the run: {cost.words()}",
        _groups_line([r for r in ranks if isinstance(r, RankChecked)]),
    ]


def _without_recorder(section: dict[str, Any]) -> dict[str, Any]:
    """The section with ``nemo_rl_shim.flight_recorder`` off: a dry run runs no collective, so it has nothing
    to record, and it must write nothing into the run's dump directory."""
    shim = section.get(SHIM_CFG) or {}
    recorder = shim.get("flight_recorder")
    if not isinstance(recorder, dict) or not recorder.get("enabled"):
        return section
    return {**section, SHIM_CFG: {**shim, "flight_recorder": {**recorder, "enabled": False}}}


class DryRunner(Runner):
    """Every checked rank of the training world, played in turn by this process; see the module docstring.

    ``available_mib``: the memory a dry run may take (default: what this machine has available now).
    """

    def __init__(self, available_mib: int | None = None) -> None:
        self.available_mib = available_mib if available_mib is not None else available_memory_mib()

    def capacity(self, options: PreflightOptions) -> Capacity:
        return Capacity(world=_world_and_source(options)[0])

    def plan(self, ranks: int | None) -> RankPlan:
        return RankPlan(ranks or MIN_RANKS, "fake")

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        """Raises ``ValueError`` (exit 2) for a layout that cannot be built on that world, or a run estimated past
        ``--timeout-s`` or this machine's memory."""
        world_size, source = ranks.world_size, _world_and_source(options)[1]
        sizes = _check_input(options, world_size)
        mesh = mesh_of(sizes, world_size)
        checked = sample_ranks(mesh, world_size, every_rank=options.all_ranks)
        cost = estimate(mesh, world_size, len(checked), later_sizes(options, sizes))
        _refuse_beyond(cost, world_size, options, self.available_mib)
        params = dataclasses.replace(
            options.rank_params(), section=_without_recorder(options.section), dry_run=True, stall_rank=None
        )
        progress(f"dry run of {world_size} ranks ({source}): {cost.words()}, in this process...")
        outcomes, unreached = self._play(checked, world_size, params, options.timeout_s, progress)
        facts = {
            "dry_run": {
                "world_source": source,
                "checked_ranks": {str(rank): why for rank, why in checked.items()},
                "estimate": {"new_group_calls": cost.new_group_calls, "seconds": round(cost.seconds, 1),
                             "memory_mib": round(cost.memory_mib, 1)},
                "process_groups": {
                    str(r.rank): r.dry_run.process_groups
                    for r in outcomes
                    if isinstance(r, RankChecked) and r.dry_run is not None
                },
            }
        }  # fmt: skip
        details = _details(checked, outcomes, world_size, source, options.world_size is not None, cost)
        problems = ()
        if unreached:
            where = "the dry run plays one rank after another, and did not reach these"
            problems = (past_deadline(unreached, options.timeout_s, where, options.timeout_whole_s),)
        return RankRun(
            LAUNCHER, world_size, outcomes, timed_out=bool(unreached), problems=problems, details=tuple(details),
            facts=facts,
        )  # fmt: skip

    @staticmethod
    def _play(
        checked: Mapping[int, str], world_size: int, params: RankParams, timeout_s: float, progress: Progress
    ) -> tuple[tuple[RankOutcome, ...], list[int]]:
        """Each checked rank in turn, until ``timeout_s``; the results, and the ranks not reached by then."""
        start = last = time.monotonic()
        outcomes: list[RankOutcome] = []
        unreached: list[int] = []
        with fake_backend(world_size) as world:
            for done, rank in enumerate(checked, 1):
                if time.monotonic() - start > timeout_s:
                    unreached.append(rank)
                    outcomes.append(RankFailed(rank, "not checked: the dry run reached --timeout-s", timed_out=True))
                    continue
                outcomes.append(_check_one(world, rank, params))
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    progress(f"{done} of {len(checked)} ranks checked, {last - start:.0f} s")
        return tuple(outcomes), unreached
