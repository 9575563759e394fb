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
will hold. A group without the configured timeout, or without its CPU half under CPU
offload, is a problem (exit 1), as in preflight.

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

import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli.preflight.fake_backend import GPUS_PER_NODE, fake_backend
from nemo_rl_shim.cli.preflight.options import MIN_RANKS, PreflightOptions
from nemo_rl_shim.cli.preflight.rank_checks import NOT_RUN, check_rank
from nemo_rl_shim.cli.preflight.runner import PROGRESS_EVERY_S, Capacity, Progress, RankPlan, RankRun, Runner
from nemo_rl_shim.distributed_setup import ParallelSizes, check_layout, parallel_sizes
from nemo_rl_shim.rank_ranges import format_ranks

__all__ = ["ALL_RANKS_UP_TO", "LAUNCHER", "DryRunner", "Mesh", "mesh_of", "sample_ranks"]

LAUNCHER = "dry run"
#: Worlds up to this size are checked on every rank.
ALL_RANKS_UP_TO = 64


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


def _extra_rows(result: dict[str, Any], groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row for each group the rank created that no name of the meshes reaches (none expected)."""
    named = {tuple(row["ranks"]) for row in result["rows"]}
    return [
        {
            "group": f"unnamed {group['desc'] or 'group'}",
            "ranks": group["ranks"],
            "is_default": False,
            "backends": group["backends"],
            "timeout_minutes": group["timeout_minutes"],
            "cpu_all_reduce": NOT_RUN,
            "cuda_all_reduce": NOT_RUN,
            "timeout_minutes_after_init": group.get("timeout_minutes_after_init"),
        }
        for group in groups
        if tuple(group["ranks"]) not in named
    ]


def _check_one(world: Any, rank: int, params: dict[str, Any]) -> dict[str, Any]:
    """One rank's result, as a spawned rank would return it, plus the groups it created.

    The groups are read when the set-up is done (check_rank's ``"after_first_step"`` phase, when its
    rows are read too), and again after it when a steady-state timeout was applied.
    """
    with world.rank(rank, rank % GPUS_PER_NODE) as records:
        groups: list[dict[str, Any]] = []

        def phase(what: str) -> None:
            if what == "after_first_step":
                groups[:] = [record.to_dict() for record in records]

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # DeviceMesh: "did not set the default device"
                result = check_rank(params, phase)
        except (ValueError, NotImplementedError) as e:  # the set-up's own input checks: the same on every rank
            raise ValueError(f"the layout cannot be built on {world.world_size} ranks: {e}") from e
        except Exception:  # anything else is a finding about this rank, as a spawned rank's failure is
            return {"rank": rank, "error": traceback.format_exc()}
        if result["timeout_minutes_after_init"] is not None:
            for group, record in zip(groups, records, strict=True):
                group["timeout_minutes_after_init"] = record.to_dict()["timeout_minutes"]
        result["rows"] += _extra_rows(result, groups)
        result["process_groups"] = len(records)
        result["new_group_calls"] = world.new_group_calls
        result["groups"] = groups
        return result


def _details(
    checked: dict[int, str], ranks: list[dict[str, Any]], world_size: int, source: str, source_shown: bool
) -> list[str]:
    by_count: dict[int, list[int]] = {}
    for result in ranks:
        if "process_groups" in result:
            by_count.setdefault(result["process_groups"], []).append(result["rank"])
    counts = "; ".join(f"{n} on rank{'s' * (len(r) > 1)} {format_ranks(r)}" for n, r in sorted(by_count.items()))
    calls = next((r["new_group_calls"] for r in ranks if "new_group_calls" in r), 0)
    if len(checked) == world_size:
        which = f"all {world_size}"
    else:
        which = f"{len(checked)} of {world_size} ({', '.join(f'{r}: {checked[r]}' for r in checked)})"
    return [
        *([] if source_shown else [f"training world: {world_size} ranks, from {source}"]),
        "dry run: every checked rank set up in this process on torch's fake backend; no collective run",
        f"checked ranks: {which}",
        f"process groups per rank (= NCCL communicators it will hold): {counts}; new_group calls per rank: {calls}",
    ]


def _without_recorder(section: dict[str, Any]) -> dict[str, Any]:
    """The section with ``automodel_cfg.flight_recorder`` off: a dry run runs no collective, so it has nothing
    to record, and it must write nothing into the run's dump directory."""
    automodel = section.get("automodel_cfg") or {}
    recorder = automodel.get("flight_recorder")
    if not isinstance(recorder, dict) or not recorder.get("enabled"):
        return section
    return {**section, "automodel_cfg": {**automodel, "flight_recorder": {**recorder, "enabled": False}}}


class DryRunner(Runner):
    """Every checked rank of the training world, played in turn by this process; see the module docstring."""

    def capacity(self, options: PreflightOptions) -> Capacity:
        return Capacity(world=_world_and_source(options)[0])

    def plan(self, ranks: int | None) -> RankPlan:
        return RankPlan(ranks or MIN_RANKS, "fake")

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        """Raises ``ValueError`` for a layout that cannot be built on that world (exit 2)."""
        world_size, source = ranks.world_size, _world_and_source(options)[1]
        sizes = _check_input(options, world_size)
        checked = sample_ranks(mesh_of(sizes, world_size), world_size, every_rank=options.all_ranks)
        section = _without_recorder(options.section)
        params = {**options.params(), "section": section, "dry_run": True, "stall_rank": None}
        progress(f"dry run of {world_size} ranks ({source}): checking {len(checked)} rank(s) in this process...")
        start = last = time.monotonic()
        rows = []
        with fake_backend(world_size) as world:
            for done, rank in enumerate(checked, 1):
                rows.append(_check_one(world, rank, params))
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    progress(f"{done} of {len(checked)} ranks checked, {last - start:.0f} s")
        facts = {
            "dry_run": {
                "world_source": source,
                "checked_ranks": {str(rank): why for rank, why in checked.items()},
                "process_groups": {str(r["rank"]): r["process_groups"] for r in rows if "process_groups" in r},
            }
        }
        details = _details(checked, rows, world_size, source, options.world_size is not None)
        return RankRun(LAUNCHER, world_size, rows, details=details, facts=facts)
