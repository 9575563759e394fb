"""Timeouts that follow the run's phases, on every process group torch holds.

One long timeout is a trade: it survives a cold first step but leaves a real
hang at step 5,000 undetected for as long. Here the start-up value
(``distributed_timeout_minutes``) holds until :func:`after_first_step` drops
every group to the steady value (``distributed_timeout_minutes_after_init``);
:func:`extended_timeout` raises it around a slow phase (checkpoint save and
consolidation, weight refit) and restores each group's previous value after.
:func:`learned_timeouts` learns both from the run itself instead (``nemo_rl_shim.learned_timeouts``;
:mod:`nemo_rl_shim.timeouts.learned_run`).

"Every group" (:func:`run_groups`) is the run's own groups (the default group,
each mesh axis, each flattened axis and each MoE axis) and, once
``setup_distributed`` gave every group the timeout, every other group torch
holds except those with a timeout of their own: groups made later (NeMo RL's
lazily flattened ``("cp", "tp")`` group, Gloo groups, Automodel's checkpoint
groups) follow too. A group made from then on without a timeout of its own gets
the value in force (:mod:`nemo_rl_shim.process_groups.later`). On each group every
backend changes, the CPU (Gloo) and CUDA (NCCL) halves alike.

Why a barrier comes first: timeouts are per process. If a rank that finished
the slow phase lowered its timeout while a peer was still inside it, its next
collective would wait on that peer with the short timeout and be cut short.
The barrier runs under the old (long) timeout, so every rank has left the slow
phase before any rank shortens anything.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.config.settings import minutes_timedelta
from nemo_rl_shim.flight_recorder.recorder import dump_on_timeout
from nemo_rl_shim.process_groups import later
from nemo_rl_shim.process_groups.registry import backend_timeouts, distinct_groups
from nemo_rl_shim.process_groups.setting import set_backend_timeouts, set_group_timeout
from nemo_rl_shim.timeouts.learned_run import Learner

__all__ = [
    "after_first_step",
    "current_timeouts",
    "extended_timeout",
    "learned_timeouts",
    "run_groups",
    "set_timeouts",
]


def run_groups(context: Any) -> dict[str, ProcessGroup]:
    """Every group the phases move, by name: the context's own groups (each distinct group of its meshes, by its
    first name: ``"default"``, ``"tp"``, ``"dp_cp"``, ``"moe.ep"``; see ``distinct_groups``), then, while the
    shim follows the configured value, every other group torch holds without a timeout of its own, by
    :func:`~nemo_rl_shim.process_groups.registry.group_key` (``"undefined:7"``, ``"mesh_cp_tp:9"``)."""
    return later.followers(distinct_groups(context.device_mesh, context.moe_mesh))


def current_timeouts(context: Any) -> dict[str, dict[str, datetime.timedelta]]:
    """``{group name: {device: timeout}}`` of :func:`run_groups`, read from the groups themselves."""
    return {name: backend_timeouts(group) for name, group in run_groups(context).items()}


def _barrier(why: str) -> None:
    with dump_on_timeout(why):
        dist.barrier()


def set_timeouts(
    context: Any,
    timeout: datetime.timedelta | Mapping[str, Mapping[str, datetime.timedelta]],
    *,
    barrier: bool = True,
) -> None:
    """Set the timeout of every group and backend of :func:`run_groups`, behind a barrier.

    ``timeout`` is one value for all, which groups made from then on get too, or a
    ``{group: {device: timeout}}`` map as :func:`current_timeouts` returns (a group the
    map does not name is left as it is; the value later groups get does not change).
    ``barrier=False`` is for a rank that is failing anyway and must not wait on its peers.
    """
    if barrier:
        _barrier("the barrier before setting timeouts")
    groups = run_groups(context)  # judged by the value in force, before it changes
    if isinstance(timeout, datetime.timedelta):
        for group in groups.values():
            set_group_timeout(timeout, group)
        later.set_following(timeout)
        return
    for name, group in groups.items():
        if name in timeout:
            set_backend_timeouts(group, timeout[name])


def after_first_step(context: Any, minutes: float | None = None) -> bool:
    """Drop every group to the steady timeout once the first training step is done.

    ``minutes`` defaults to ``context.timeout_minutes_after_init``. With neither
    set, nothing changes and False is returned. Call it on every rank. Groups
    made afterwards get the steady value too (where ``setup_distributed`` gave
    every group the timeout).
    """
    if minutes is None:
        minutes = context.timeout_minutes_after_init
    if minutes is None:
        return False
    set_timeouts(context, minutes_timedelta(minutes, "the steady-state timeout"))
    return True


def _restore(
    context: Any, previous: Mapping[str, Mapping[str, datetime.timedelta]], followed: datetime.timedelta | None
) -> None:
    """Give each group that still follows the raised value back what it had; a group made inside the phase gets
    the value in force outside it. A group given a value of its own inside the phase keeps it."""
    groups = run_groups(context)  # still judged against the raised value
    for name, group in groups.items():
        if name in previous:
            set_backend_timeouts(group, previous[name])
        elif followed is not None:
            set_group_timeout(followed, group)
    if followed is not None:
        later.set_following(followed)


@contextmanager
def extended_timeout(context: Any, minutes: float) -> Iterator[None]:
    """Raise every group's timeout to ``minutes`` for a slow phase, then restore each group's previous value.

    Groups made inside the phase without a timeout of their own get ``minutes``, and
    the value in force outside it once the phase ends. Entering needs no barrier
    (raising cuts nobody short). A normal exit restores behind a barrier; an
    exception restores this rank's values without one, so a failing rank does not
    wait on peers that may never arrive.
    """
    raised = minutes_timedelta(minutes, "extended_timeout minutes")
    followed = later.following()
    previous = current_timeouts(context)
    set_timeouts(context, raised, barrier=False)
    try:
        yield
    except BaseException:
        _restore(context, previous, followed)
        raise
    _barrier("the barrier before setting timeouts")
    _restore(context, previous, followed)


def learned_timeouts(context: Any) -> Learner:
    """A :class:`~nemo_rl_shim.timeouts.learned_run.Learner` for the run of ``context``, following its
    ``learned_timeouts`` settings.

    Off (``nemo_rl_shim.learned_timeouts`` unset or null, or a context without the field), the learner
    times nothing and sets nothing, so a worker can call it the same way either way. It changes
    timeouts only through :func:`set_timeouts`, on every group that function reaches.
    """
    return Learner(context, getattr(context, "learned_timeouts", None), set_timeouts)
