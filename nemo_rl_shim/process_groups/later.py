"""The timeout a group made later gets, and which groups follow the phases: every group torch holds, made before
or after set-up.

torch gives a group made without ``timeout=`` the value of ``distributed_c10d._get_default_timeout(backend)``
(10 min for NCCL, 30 min otherwise), looked up by name at call time in ``init_process_group``,
``new_group``, ``_new_group_with_tag`` and ``split_group``, on torch 2.9 to 2.15. Every later group
goes through one of them: DeviceMesh's sub-groups, ``_flatten`` and ``_unflatten`` (they pass
``timeout=None`` unless a backend override carries options), NeMo RL's lazily flattened
``("cp", "tp")`` replica group, its Gloo groups for SGLang refit, Automodel's checkpoint groups.

:func:`follow` puts the configured value there: it replaces that one function with one that answers
the followed value while the default group it was installed for is still torch's default group, and
torch's own answer otherwise. Why the function and not the module globals it reads
(``default_pg_timeout``, ``default_pg_nccl_timeout``): ``destroy_process_group`` has no hook, so a
changed global would outlive the world and hand the configured value to the next one, that world's
own ``init_process_group`` included. The replacement notices the world is gone on its first call,
answers as torch and puts torch's function back; :func:`restore_torch_defaults` does it at once.

Which groups follow the phases (:func:`followers`): the run's own groups (the meshes', named by the
caller) always; every other group whose every backend reads the followed value or torch's default
for that backend. A group with any other value has a timeout of its own (made with ``timeout=``, or
given one later): it keeps it through every phase change, and is remembered as such, so a later
phase whose value happens to equal it does not take it over. A value equal to the followed one
cannot be told from a defaulted one (torch keeps no record of the argument): such a group follows.
"""

from __future__ import annotations

import datetime
import enum
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from torch.distributed import ProcessGroup
from torch.distributed import distributed_c10d as c10d

from nemo_rl_shim.process_groups.registry import all_groups, backend_readings, group_key
from nemo_rl_shim.process_groups.setting import same_timeout, set_group_timeout

__all__ = [
    "CREATION_SLACK",
    "FOLLOW_HOOK",
    "TimeoutSource",
    "follow",
    "followers",
    "following",
    "group_sources",
    "restore_torch_defaults",
    "set_following",
    "stand_in_installed",
    "torch_default_timeouts",
]

#: The torch function a defaulted timeout comes from (torch 2.9 to 2.15); None where this torch has none,
#: and then :func:`follow` warns and does nothing.
FOLLOW_HOOK = "_get_default_timeout" if callable(getattr(c10d, "_get_default_timeout", None)) else None
#: The names torch's own function gives an NCCL default for (2.9 compares with ``"nccl"`` alone).
_NCCL_NAMES = ("nccl", "nccl-legacy", "nccl2", "nccl-lazy")


class TimeoutSource(enum.StrEnum):
    """Where a backend's timeout came from, as far as it can be told."""

    #: The configured (followed) value.
    CONFIGURED = "configured"
    #: A value of the group's own: given at creation or set later; it keeps it through every phase.
    OWN = "own"
    #: torch's default for this backend (10 min NCCL, 30 min otherwise), and not the configured value.
    TORCH_DEFAULT = "torch_default"
    #: The backend keeps no timeout that can be read (torch's ``fake`` backend).
    UNREADABLE = "unreadable"


@dataclass
class _Following:
    world: ProcessGroup
    timeout: datetime.timedelta
    own: weakref.WeakSet[ProcessGroup] = field(default_factory=weakref.WeakSet)


_state: _Following | None = None
#: torch's ``_get_default_timeout`` while :func:`_following_default` stands in for it.
_torch_function: Callable[[str], datetime.timedelta] | None = None


def _torch_default(backend: str) -> datetime.timedelta:
    """torch's own default for ``backend``, whatever stands in its place now."""
    function = _torch_function or getattr(c10d, FOLLOW_HOOK or "", None)
    if function is None:  # no hook on this torch: torch's documented constants
        nccl = backend.lower() in _NCCL_NAMES and isinstance(c10d.default_pg_nccl_timeout, datetime.timedelta)
        return c10d.default_pg_nccl_timeout if nccl else c10d.default_pg_timeout
    with warnings.catch_warnings():  # "NCCL support is not compiled": it answers the Gloo default then
        warnings.simplefilter("ignore")
        return function(backend)


def _world() -> ProcessGroup | None:
    return c10d.GroupMember.WORLD


def _alive() -> _Following | None:
    """The following state while its world exists (its default group is in torch's registry); once
    ``destroy_process_group`` cleared that, drop the state and put torch's function back."""
    if _state is not None and _state.world not in c10d._world.pg_map:
        restore_torch_defaults()
    return _state


def _current() -> _Following | None:
    """The following state while its world's default group is torch's default group: not while another stands
    in for it (``automodel_patch``'s detection probes make a one-rank group the default for one call)."""
    state = _alive()
    return state if state is not None and state.world is _world() else None


#: Added to the followed value where a group is made with it. torch 2.15 keeps a new group's timeout through a
#: float number of seconds and truncates it to whole milliseconds, so ``new_group(timeout=4.001 s)`` reads
#: 4.000 s back (209 of 632 values from 1 ms to 45 min, measured; ``set_timeout`` and torch 2.9 to 2.11 keep
#: every one exact). A group made with the followed value would then read 1 ms off it, be taken for a group
#: with a timeout of its own, and stop following. Half a millisecond more lands every value on its own
#: millisecond on torch 2.9 to 2.15 (measured on each: none off). Delete it once torch keeps it exactly.
CREATION_SLACK = datetime.timedelta(microseconds=500)


def _following_default(backend: str) -> datetime.timedelta:
    """What torch's ``_get_default_timeout`` answers while the shim follows: the followed value (plus
    :data:`CREATION_SLACK`, which torch's millisecond truncation takes away again), in its world."""
    state = _current()
    return state.timeout + CREATION_SLACK if state is not None else _torch_default(backend)


def following() -> datetime.timedelta | None:
    """The value groups made without a timeout of their own get now; None where torch's defaults apply."""
    state = _current()
    return state.timeout if state is not None else None


def stand_in_installed() -> bool:
    """Whether torch's ``_get_default_timeout`` is the shim's stand-in right now (False: torch's own function)."""
    return FOLLOW_HOOK is not None and getattr(c10d, FOLLOW_HOOK) is _following_default


def torch_default_timeouts(group: ProcessGroup) -> set[datetime.timedelta]:
    """The values torch gives ``group``'s backends by default: for its backend string (``"cuda:nccl,cpu:gloo"``
    gets the Gloo default on both halves), and for each backend's own name."""
    registered = c10d._world.pg_map.get(group)
    names = {str(registered[0])} if registered else set()
    names |= {name for name, _ in backend_readings(group).values()}
    return {_torch_default(name) for name in names}


def group_sources(group: ProcessGroup, configured: datetime.timedelta | None = None) -> dict[str, TimeoutSource]:
    """``{device type: TimeoutSource}`` for each backend of ``group``, against ``configured`` (default: the followed
    value). A group remembered as having its own timeout is OWN on every readable backend."""
    state = _current()
    if configured is None and state is not None:
        configured = state.timeout
    remembered = state is not None and group in state.own
    defaults = torch_default_timeouts(group)
    sources = {}
    for device, (_, timeout) in backend_readings(group).items():
        if timeout is None:
            sources[device] = TimeoutSource.UNREADABLE
        elif remembered:
            sources[device] = TimeoutSource.OWN
        elif configured is not None and same_timeout(timeout, configured):
            sources[device] = TimeoutSource.CONFIGURED
        elif any(same_timeout(timeout, default) for default in defaults):
            sources[device] = TimeoutSource.TORCH_DEFAULT
        else:
            sources[device] = TimeoutSource.OWN
    return sources


def _follows(group: ProcessGroup, state: _Following) -> bool:
    sources = set(group_sources(group).values())
    if sources and sources <= {TimeoutSource.CONFIGURED, TimeoutSource.TORCH_DEFAULT}:
        return True
    if TimeoutSource.OWN in sources:
        state.own.add(group)  # remembered: a later phase at its value does not take it over
    return False


def followers(named: Mapping[str, ProcessGroup] | None = None) -> dict[str, ProcessGroup]:
    """The groups a phase change moves: ``named`` (the run's own groups) always, then, while the shim follows,
    every other group torch holds whose timeout is the followed value or torch's default, by :func:`group_key`.

    A group with a timeout of its own is left out, and remembered. Call it before changing the followed value:
    it judges by the value in force.
    """
    chosen = dict(named or {})
    state = _current()
    if state is None:
        return chosen
    seen = {id(group) for group in chosen.values()}
    for group in all_groups():
        if id(group) not in seen and _follows(group, state):
            chosen[group_key(group)] = group
    return chosen


def set_following(timeout: datetime.timedelta) -> None:
    """Change the followed value (what groups made from now on get); no group changes. Nothing while not following."""
    state = _current()
    if state is not None:
        state.timeout = timeout


def _set_all(groups: Iterable[ProcessGroup], timeout: datetime.timedelta) -> None:
    for group in groups:
        set_group_timeout(timeout, group)


def follow(timeout: datetime.timedelta, named: Mapping[str, ProcessGroup] | None = None) -> bool:
    """From now on, until this world ends, a group made without a timeout of its own gets the followed value.

    Installs the stand-in for torch's ``_get_default_timeout`` (once), follows ``timeout``, and gives it
    now to ``named`` and every group torch already holds at torch's default (a group with a value of its own
    keeps it). Call it on every rank after the default group exists. Returns False, with a warning, where
    there is no default group or this torch has no such function.
    """
    global _state, _torch_function
    world = _world()
    if world is None or FOLLOW_HOOK is None:
        why = "no default process group exists" if world is None else "this torch has no _get_default_timeout"
        warnings.warn(f"groups made later keep torch's default timeout: {why}", RuntimeWarning, stacklevel=2)
        return False
    current = _alive()
    if current is None or current.world is not world:
        _state = _Following(world, timeout)
    else:
        current.timeout = timeout
    moving = followers(named)
    if not stand_in_installed():
        _torch_function = getattr(c10d, FOLLOW_HOOK)
        setattr(c10d, FOLLOW_HOOK, _following_default)
    _set_all(moving.values(), timeout)
    return True


def restore_torch_defaults() -> None:
    """Stop following: groups made from now on get torch's defaults again. Safe to call at any time, and twice."""
    global _state, _torch_function
    _state = None
    if FOLLOW_HOOK is not None and _torch_function is not None:
        if stand_in_installed():
            setattr(c10d, FOLLOW_HOOK, _torch_function)
        _torch_function = None
