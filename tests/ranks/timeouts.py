"""Rank functions for tests/timeouts/test_timeouts.py: phase timeouts on real gloo ranks.

Each function runs on every rank started by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`,
goes through the real ``setup_distributed`` with the installed Automodel, and
returns JSON: timeouts in seconds as read back from the groups themselves, and
the outcome of collectives with one stalled rank.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.config import blocks
from nemo_rl_shim.process_groups.registry import backend_timeouts, flattened_axes
from nemo_rl_shim.setup.distributed import DistributedContext, RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step, extended_timeout, run_groups, set_group_timeout
from tests.ranks.fresh_group import forget_meshes, move_to_fresh_port
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["DISTINCT_BASE_S", "mesh_groups", "phase_readings", "section", "stall_outcomes", "stalled_all_reduce"]

#: The first of the distinct per-group timeouts (seconds) that ``phase_readings`` sets before a restore.
DISTINCT_BASE_S = 10
#: Bound on the healthy rank's wait, through the store, for the stalled rank to finish its phase.
_STORE_WAIT_S = 120


class _BodyFailed(Exception):
    """Raised inside ``extended_timeout`` to take its exception path."""


def section(startup: float | None, steady: float | None, *, ep: int = 2) -> dict[str, Any]:
    """A ``policy`` section with both timeout knobs (minutes) and expert parallelism ``ep``."""
    knobs: dict[str, Any] = {}
    if startup is not None:
        knobs["distributed_timeout_minutes"] = startup
    if steady is not None:
        knobs["distributed_timeout_minutes_after_init"] = steady
    return {**blocks(knobs), "dtensor_cfg": {"expert_parallel_size": ep}}


def mesh_groups(context: DistributedContext) -> dict[str, ProcessGroup]:
    """Every group reachable from the meshes through torch's DeviceMesh API.

    Enumerated here without ``nemo_rl_shim.process_groups.registry`` so the test can check that
    ``run_groups`` misses none: each axis of the device mesh and the MoE mesh,
    and each flattened mesh recorded on either mesh's root.
    """
    groups: dict[str, ProcessGroup] = {"default": dist.group.WORLD}
    for label, mesh in (("mesh", context.device_mesh), ("moe", context.moe_mesh)):
        if mesh is None:
            continue
        for name in mesh.mesh_dim_names:
            groups[f"{label}.{name}"] = mesh.get_group(name)
        for name, flat in flattened_axes(mesh).items():
            groups[f"{label}.flat.{name}"] = flat.get_group()
    return groups


def _readings(groups: dict[str, ProcessGroup]) -> dict[str, dict[str, float]]:
    return {
        name: {device: timeout.total_seconds() for device, timeout in backend_timeouts(group).items()}
        for name, group in groups.items()
    }


def phase_readings(params: dict[str, Any]) -> dict[str, Any]:
    """Timeouts of every group and backend through start-up, steady state and ``extended_timeout``.

    ``params``: ``startup``, ``steady``, ``raised`` and ``other_steady`` (minutes),
    each extra set-up on a fresh port (:func:`tests.ranks.fresh_group.move_to_fresh_port`).
    After the first set-up, two more set-ups in the same process check that
    ``after_first_step`` follows the config: one without the steady knob, one
    with ``other_steady``.
    """
    context = setup_distributed(section(params["startup"], params["steady"]), RuntimeConfig())
    groups = mesh_groups(context)
    run = run_groups(context)
    run_names = {id(group): name for name, group in run.items()}
    out: dict[str, Any] = {
        "decision": str(context.decision.action.value),
        "context_steady_minutes": context.timeout_minutes_after_init,
        "run_groups": list(run),
        "mesh_groups": {
            name: {
                "ranks": dist.get_process_group_ranks(group),
                "is_default": group is dist.group.WORLD,
                "in_run_groups": id(group) in run_names,
                "run_name": run_names.get(id(group)),
            }
            for name, group in groups.items()
        },
        "startup": _readings(groups),
    }
    # Give every group its own timeout (seconds 10, 11, ...): a restore must bring back each group's value.
    for index, group in enumerate(run.values()):
        set_group_timeout(datetime.timedelta(seconds=DISTINCT_BASE_S + index), group)
    out["distinct"] = _readings(groups)
    with extended_timeout(context, params["raised"]):  # a slow phase before the first step
        out["extended_at_startup"] = _readings(groups)
    out["after_extended_at_startup"] = _readings(groups)
    out["after_first_step"] = after_first_step(context)
    out["steady"] = _readings(groups)
    with extended_timeout(context, params["raised"]):
        out["extended"] = _readings(groups)
        probe = torch.ones(1)
        dist.all_reduce(probe)  # the groups still work with the raised value
        out["extended_all_reduce"] = probe.item()
    out["after_extended"] = _readings(groups)
    try:
        with extended_timeout(context, params["raised"]):
            out["extended_before_error"] = _readings(groups)
            raise _BodyFailed("slow phase failed")
    except _BodyFailed as error:
        out["body_error"] = str(error)
    out["after_error"] = _readings(groups)
    dist.barrier()  # realign the ranks (the exception path restored without a barrier) before teardown

    move_to_fresh_port()  # a fresh rendezvous for each new set-up
    dist.destroy_process_group()
    forget_meshes()
    unset = setup_distributed(section(params["startup"], None), RuntimeConfig())
    out["unset"] = {
        "context_steady_minutes": unset.timeout_minutes_after_init,
        "after_first_step": after_first_step(unset),
        "readings": _readings({"default": dist.group.WORLD}),
    }
    dist.barrier()  # no rank tears the store down while a peer still builds its groups through it

    move_to_fresh_port()
    dist.destroy_process_group()
    forget_meshes()
    other = setup_distributed(section(params["startup"], params["other_steady"]), RuntimeConfig())
    out["other"] = {
        "context_steady_minutes": other.timeout_minutes_after_init,
        "after_first_step": after_first_step(other),
        "readings": _readings(mesh_groups(other)),
    }
    return out


def stalled_all_reduce(group: ProcessGroup, stall_s: float, stalled_rank: int) -> dict[str, Any]:
    """All-reduce on ``group`` after ``stalled_rank`` sleeps ``stall_s``; the outcome as this rank saw it.

    ``seconds`` runs from this rank's call into the collective to its return or error.
    """
    if dist.get_rank() == stalled_rank:
        time.sleep(stall_s)
    tensor = torch.ones(1)
    start = time.monotonic()
    try:
        dist.all_reduce(tensor, group=group)
    except Exception as error:  # the stalled rank may see a closed connection rather than a timeout
        return {
            "outcome": "raised",
            "type": type(error).__name__,
            "is_runtime_error": isinstance(error, RuntimeError),
            "error": str(error)[:400],
            "seconds": time.monotonic() - start,
        }
    return {"outcome": "completed", "sum": tensor.item(), "seconds": time.monotonic() - start}


def _stall_last(group: ProcessGroup, stall_s: float, stalled_rank: int) -> dict[str, Any]:
    """Phase 4: the stalled rank sleeps and never enters the collective; the healthy rank must raise.

    Then both meet through the default group's store (not a process group: the sub-group
    is broken and the default group's steady timeout is short), so neither rank tears
    down while the other is still in its phase.
    """
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == stalled_rank:
        start = time.monotonic()
        time.sleep(stall_s)
        outcome = {"outcome": "skipped", "slept_s": time.monotonic() - start}
        store.set("stalled rank done", "1")
        return outcome
    outcome = stalled_all_reduce(group, stall_s, stalled_rank)
    store.wait(["stalled rank done"], datetime.timedelta(seconds=_STORE_WAIT_S))
    rank_0_leaves_last("past the wait", _STORE_WAIT_S, expected=dist.get_world_size() - 1)
    return outcome


def _late_to_steady(
    context: DistributedContext, group: ProcessGroup, stall_s: float, stalled_rank: int
) -> dict[str, Any]:
    """Phase 2: ``stalled_rank`` is still in a slow start-up phase (``stall_s``, above the steady value) when its
    peer calls ``after_first_step``; right after it, every rank all-reduces on ``group`` under the steady value.

    The barrier in ``after_first_step`` (run under the start-up value) holds the fast rank until
    the late one arrives, so the all-reduce completes. Without it, the fast rank would lower its
    timeout at once and its all-reduce would time out waiting for the late rank.
    """
    start = time.monotonic()
    if dist.get_rank() == stalled_rank:
        time.sleep(stall_s)
    after_first_step(context)
    waited_s = time.monotonic() - start
    outcome = stalled_all_reduce(group, 0.0, stalled_rank)
    return {**outcome, "waited_in_after_first_step_s": waited_s}


def stall_outcomes(params: dict[str, Any]) -> dict[str, Any]:
    """One rank stalls ``stall`` seconds in three phases, in an order that never reuses a timed-out group.

    1. start-up (``startup`` minutes): survived;
    2. the stalled rank reaches ``after_first_step`` late, and an all-reduce under the steady value
       follows at once: survived, because the barrier holds the fast rank (:func:`_late_to_steady`);
    3. after ``after_first_step``, inside ``extended_timeout(raised)``: survived;
    4. after ``after_first_step`` (``steady`` minutes): the stalled rank never arrives and the
       healthy rank raises. Last, because a gloo group that timed out stays broken.

    The collective runs on the ``dp_shard`` axis group, which FSDP2 reduces over.
    """
    context = setup_distributed(section(params["startup"], params["steady"]), RuntimeConfig())
    rank, stalled = dist.get_rank(), dist.get_world_size() - 1
    group = context.device_mesh.get_group("dp_shard")
    out: dict[str, Any] = {
        "rank": rank,
        "stalled": rank == stalled,
        "group_ranks": dist.get_process_group_ranks(group),
        "group_is_default": group is dist.group.WORLD,
        "pid": os.getpid(),
    }
    dist.barrier()
    out["startup"] = stalled_all_reduce(group, params["stall"], stalled)
    out["late_to_steady"] = _late_to_steady(context, group, params["stall"], stalled)
    if out["late_to_steady"]["outcome"] != "completed":
        return out  # a gloo group that timed out stays broken: the later phases could only hang or fail
    with extended_timeout(context, params["raised"]):
        dist.barrier()
        out["extended"] = stalled_all_reduce(group, params["stall"], stalled)
    out["steady_timeout_s"] = backend_timeouts(group)["cpu"].total_seconds()
    out["steady"] = _stall_last(group, params["stall"], stalled)
    out["returned_at"] = time.time()
    return out
