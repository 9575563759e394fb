"""Timeouts that follow the run's phases.

One long timeout is a trade: it survives a cold first step but leaves a real
hang at step 5,000 undetected for as long. Here the start-up value
(``distributed_timeout_minutes``) holds until :func:`after_first_step` drops
every group to the steady value (``distributed_timeout_minutes_after_init``);
:func:`extended_timeout` raises it around a slow phase (checkpoint save and
consolidation, weight refit) and restores each group's previous value after.
:func:`learned_timeouts` learns both from the run itself instead (``automodel_cfg.learned_timeouts``;
:mod:`nemo_rl_shim.learner`).

"Every group" is every process group the run created (:func:`run_groups`):
the default group, each mesh axis, each flattened axis and each MoE axis, and
on each of them every backend, the CPU (Gloo) and CUDA (NCCL) halves alike.

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

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.config import minutes_timedelta
from nemo_rl_shim.flight_recorder import dump_on_timeout
from nemo_rl_shim.groups import backend_timeouts, distinct_groups
from nemo_rl_shim.learner import Learner

__all__ = [
    "TIMEOUT_API",
    "after_first_step",
    "current_timeouts",
    "extended_timeout",
    "learned_timeouts",
    "run_groups",
    "set_group_timeout",
    "set_timeouts",
]

# Gate: torch 2.15 added the public torch.distributed.set_timeout (reaches every backend of a
# group). Delete the fallback once the torch floor in pyproject.toml is 2.15 or newer.
if hasattr(dist, "set_timeout"):
    TIMEOUT_API = "torch.distributed.set_timeout"
    set_group_timeout = dist.set_timeout
else:  # torch < 2.15: what NeMo RL's torch 2.11 uses (the torch-2.11, -2.10 and -2.9 CI lanes run it)
    TIMEOUT_API = "torch.distributed.distributed_c10d._set_pg_timeout"
    set_group_timeout = dist.distributed_c10d._set_pg_timeout


def run_groups(context: Any) -> dict[str, ProcessGroup]:
    """Every distinct process group of a ``DistributedContext``, by its first name (see ``distinct_groups``)."""
    return distinct_groups(context.device_mesh, context.moe_mesh)


def current_timeouts(context: Any) -> dict[str, dict[str, datetime.timedelta]]:
    """``{group name: {device: timeout}}`` read from the groups themselves."""
    return {name: backend_timeouts(group) for name, group in run_groups(context).items()}


def _set_backend_timeouts(group: ProcessGroup, timeouts: Mapping[str, datetime.timedelta]) -> None:
    values = set(timeouts.values())
    if len(values) == 1:
        set_group_timeout(values.pop(), group)
        return
    for device, timeout in timeouts.items():  # halves that differed before: restore each
        backend = group._get_backend(torch.device(device))
        setter = getattr(backend, "set_timeout", None) or backend._set_default_timeout
        setter(timeout)


def set_timeouts(
    context: Any,
    timeout: datetime.timedelta | Mapping[str, Mapping[str, datetime.timedelta]],
    *,
    barrier: bool = True,
) -> None:
    """Set the timeout of every group and backend of the run, behind a barrier.

    ``timeout`` is one value for all, or a ``{group: {device: timeout}}`` map as
    :func:`current_timeouts` returns. ``barrier=False`` is for a rank that is
    failing anyway and must not wait on its peers.
    """
    if barrier:
        with dump_on_timeout("the barrier before setting timeouts"):
            dist.barrier()
    for name, group in run_groups(context).items():
        if isinstance(timeout, datetime.timedelta):
            set_group_timeout(timeout, group)
        else:
            _set_backend_timeouts(group, timeout[name])


def after_first_step(context: Any, minutes: float | None = None) -> bool:
    """Drop every group to the steady timeout once the first training step is done.

    ``minutes`` defaults to ``context.timeout_minutes_after_init``. With neither
    set, nothing changes and False is returned. Call it on every rank.
    """
    if minutes is None:
        minutes = context.timeout_minutes_after_init
    if minutes is None:
        return False
    set_timeouts(context, minutes_timedelta(minutes, "the steady-state timeout"))
    return True


@contextmanager
def extended_timeout(context: Any, minutes: float) -> Iterator[None]:
    """Raise every group's timeout to ``minutes`` for a slow phase, then restore each group's previous value.

    Entering needs no barrier (raising cuts nobody short). A normal exit restores
    behind a barrier; an exception restores this rank's values without one, so a
    failing rank does not wait on peers that may never arrive.
    """
    raised = minutes_timedelta(minutes, "extended_timeout minutes")
    previous = current_timeouts(context)
    set_timeouts(context, raised, barrier=False)
    try:
        yield
    except BaseException:
        set_timeouts(context, previous, barrier=False)
        raise
    set_timeouts(context, previous)


def learned_timeouts(context: Any) -> Learner:
    """A :class:`~nemo_rl_shim.learner.Learner` for the run of ``context``, following its ``learned_timeouts`` settings.

    Off (``automodel_cfg.learned_timeouts`` unset or null, or a context without the field), the learner
    times nothing and sets nothing, so a worker can call it the same way either way. It changes
    timeouts only through :func:`set_timeouts`, on every group that function reaches.
    """
    return Learner(context, getattr(context, "learned_timeouts", None), set_timeouts)
