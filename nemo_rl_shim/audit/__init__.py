"""One audit of every process group torch holds in this process: its ranks, name, backends and their timeouts.

:func:`audit_groups` reads torch's registry (``distributed_c10d._world.pg_map``) and each group's
backends, and says of each backend's timeout where it came from (:class:`TimeoutSource`): the
configured value, a value of the group's own, or torch's default. It changes nothing, runs no
collective and reads no store, so it is cheap on any rank and works under torch's ``fake`` backend
(a backend without a readable timeout is ``UNREADABLE``, never guessed).

The result is typed (:class:`GroupsAudit`, :class:`GroupAudit`, :class:`BackendTimeout`) and crosses
a process as JSON (:meth:`GroupsAudit.to_json`, :meth:`GroupsAudit.from_json`). A worker logs it once
after its first step with one call::

    after_first_step(ctx)
    log_groups(ctx)  # "process groups on rank 0 of 4: 9; configured 3 s on 8; own: undefined:7 [0-3] 7 s"

A room of its own, and a room of one module: the audit reads every group and says where each timeout came from,
which is neither what a group is (:mod:`nemo_rl_shim.process_groups`) nor a phase (:mod:`nemo_rl_shim.timeouts`),
and it is one idea in one file, so its code lives in this ``__init__``: ``nemo_rl_shim.audit``, the path the
README documents, is the module itself (no alias to keep in step). May import: torch,
:mod:`nemo_rl_shim.process_groups` and :mod:`nemo_rl_shim.one_line`; nothing of the set-up or the phases.
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed import distributed_c10d as c10d

from nemo_rl_shim.one_line.rank_ranges import format_ranks
from nemo_rl_shim.process_groups.later import TimeoutSource, following, group_sources
from nemo_rl_shim.process_groups.registry import all_groups, backend_readings, named_groups

__all__ = [
    "BackendTimeout",
    "GroupAudit",
    "GroupsAudit",
    "TimeoutSource",
    "audit_groups",
    "log_groups",
]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendTimeout:
    """One backend of a group, as it reads."""

    #: The device type it serves: ``"cpu"`` or ``"cuda"``.
    device: str
    #: Its name: ``"gloo"``, ``"nccl"``, ``"fake"``.
    backend: str
    #: Its timeout in seconds; None where it keeps none that can be read.
    timeout_s: float | None
    source: TimeoutSource


@dataclass(frozen=True)
class GroupAudit:
    """One process group torch holds."""

    #: torch's ``group_name`` (unique among this rank's groups).
    group_name: str
    #: torch's ``group_desc``: ``"default_pg"``, ``"mesh_tp"``, ``"undefined"`` for a plain ``new_group``.
    group_desc: str
    #: Global ranks, in group order.
    ranks: tuple[int, ...]
    #: The backend string torch's registry holds: ``"gloo"``, ``"cuda:nccl,cpu:gloo"``, ``"fake"``.
    backend: str
    backends: tuple[BackendTimeout, ...]
    #: The names the run's meshes know it by (``"tp"``, ``"dp_cp"``, ``"moe.ep"``, ``"default"``); empty for others.
    axes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``"tp (mesh_tp:3)"``, or ``"undefined:7"`` for a group no mesh names."""
        key = f"{self.group_desc}:{self.group_name}"
        return f"{'/'.join(self.axes)} ({key})" if self.axes else key

    @property
    def sources(self) -> frozenset[TimeoutSource]:
        return frozenset(b.source for b in self.backends)


@dataclass(frozen=True)
class GroupsAudit:
    """Every process group of one rank, and the configured value they were judged against."""

    #: This process's global rank, and the world's size; None when no default group exists.
    rank: int | None
    world_size: int | None
    #: The configured value in seconds; None where nothing is configured (only torch's default and own values).
    configured_s: float | None
    groups: tuple[GroupAudit, ...]

    def with_source(self, source: TimeoutSource) -> tuple[GroupAudit, ...]:
        """The groups with at least one backend whose timeout came from ``source``."""
        return tuple(group for group in self.groups if source in group.sources)

    @property
    def at_torch_default(self) -> tuple[GroupAudit, ...]:
        """The groups with a backend left at torch's default: what a run with a configured timeout must not have."""
        return self.with_source(TimeoutSource.TORCH_DEFAULT)

    def to_json(self) -> str:
        return json.dumps(_plain(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> GroupsAudit:
        """The audit :meth:`to_json` wrote; ValueError naming the key for anything else."""
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ValueError(f"a groups audit must be JSON: {error}") from error
        return _audit(data)

    def line(self) -> str:
        """One line for a log: how many groups carry the configured value, and every other one by name and value."""
        where = "" if self.rank is None else f" on rank {self.rank} of {self.world_size}"
        parts = [f"process groups{where}: {len(self.groups)}"]
        if self.configured_s is not None:
            at_value = [g for g in self.groups if g.sources == {TimeoutSource.CONFIGURED}]
            parts.append(f"configured {_duration(self.configured_s)} on {len(at_value)}")
        for source, title in _OTHERS:
            named = [f"{g.label} [{format_ranks(g.ranks)}] {_values(g, source)}" for g in self.with_source(source)]
            if named:
                parts.append(f"{title}: {', '.join(named)}")
        return "; ".join(parts)


_OTHERS = (
    (TimeoutSource.TORCH_DEFAULT, "at torch's default"),
    (TimeoutSource.OWN, "own"),
    (TimeoutSource.UNREADABLE, "unreadable"),
)


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _values(group: GroupAudit, source: TimeoutSource) -> str:
    picked = [b for b in group.backends if b.source is source]
    values = sorted({"?" if b.timeout_s is None else _duration(b.timeout_s) for b in picked})
    devices = "" if len(picked) == len(group.backends) else f" ({'/'.join(b.device for b in picked)})"
    return "/".join(values) + devices


def _seconds(timeout: datetime.timedelta | None) -> float | None:
    return None if timeout is None else timeout.total_seconds()


def _axes(context: Any) -> dict[int, tuple[str, ...]]:
    if context is None:
        return {}
    names: dict[int, tuple[str, ...]] = {}
    for name, group in named_groups(getattr(context, "device_mesh", None), getattr(context, "moe_mesh", None)).items():
        names[id(group)] = (*names.get(id(group), ()), name)
    return names


def _group(group: ProcessGroup, configured: datetime.timedelta | None, axes: tuple[str, ...]) -> GroupAudit:
    sources = group_sources(group, configured)
    backends = tuple(
        BackendTimeout(device, name, _seconds(timeout), sources[device])
        for device, (name, timeout) in backend_readings(group).items()
    )
    registered = c10d._world.pg_map.get(group)
    return GroupAudit(
        group_name=str(group.group_name),
        group_desc=str(getattr(group, "group_desc", "undefined")),
        ranks=tuple(dist.get_process_group_ranks(group)),
        backend=str(registered[0]) if registered else "",
        backends=backends,
        axes=axes,
    )


def audit_groups(context: Any = None, *, configured: datetime.timedelta | None = None) -> GroupsAudit:
    """Audit every process group torch holds in this process.

    ``context`` (a ``DistributedContext``, the shim's or NeMo RL's: anything with ``device_mesh`` and
    ``moe_mesh``) only names the groups its meshes hold (:attr:`GroupAudit.axes`). ``configured`` is the
    value a timeout counts as configured at; by default the value groups made now get
    (:func:`nemo_rl_shim.process_groups.later.following`), None where torch's defaults apply. Changes nothing.
    """
    if configured is None:
        configured = following()
    names = _axes(context)
    groups = tuple(_group(group, configured, names.get(id(group), ())) for group in all_groups())
    initialized = dist.is_initialized()
    return GroupsAudit(
        rank=dist.get_rank() if initialized else None,
        world_size=dist.get_world_size() if initialized else None,
        configured_s=_seconds(configured),
        groups=groups,
    )


def log_groups(
    context: Any = None,
    *,
    configured: datetime.timedelta | None = None,
    logger: logging.Logger | None = None,
    level: int = logging.INFO,
) -> GroupsAudit:
    """Audit every group (:func:`audit_groups`) and log it as one line; return the audit. Call it once, after the
    first step, on any rank: it runs no collective."""
    audit = audit_groups(context, configured=configured)
    (logger or _LOG).log(level, "%s", audit.line())
    return audit


# --- JSON ------------------------------------------------------------------------------------------------


def _plain(audit: GroupsAudit) -> dict[str, Any]:
    return {
        "rank": audit.rank,
        "world_size": audit.world_size,
        "configured_s": audit.configured_s,
        "groups": [
            {
                "group_name": g.group_name,
                "group_desc": g.group_desc,
                "ranks": list(g.ranks),
                "backend": g.backend,
                "axes": list(g.axes),
                "backends": [
                    {"device": b.device, "backend": b.backend, "timeout_s": b.timeout_s, "source": b.source.value}
                    for b in g.backends
                ],
            }
            for g in audit.groups
        ],
    }


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "number": ((int, float), "a number"),
    "str": ((str,), "a string"),
    "list": ((list,), "a list"),
}


def _field(data: Any, key: str, kind: str, where: str, *, optional: bool = False) -> Any:
    """``data[key]`` checked to be of ``kind`` (a key of ``_KINDS``; None allowed when ``optional``)."""
    if not isinstance(data, dict) or key not in data:
        raise ValueError(f"{where}.{key} is missing")
    value = data[key]
    if optional and value is None:
        return None
    types, name = _KINDS[kind]
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"{where}.{key} must be {name}{' or null' if optional else ''}, got {value!r}")
    return value


def _items(data: Any, key: str, where: str) -> list[Any]:
    return list(_field(data, key, "list", where))


def _backend(data: Any, where: str) -> BackendTimeout:
    source = _field(data, "source", "str", where)
    try:
        parsed = TimeoutSource(source)
    except ValueError as error:
        known = ", ".join(s.value for s in TimeoutSource)
        raise ValueError(f"{where}.source must be one of {known}, got {source!r}") from error
    timeout = _field(data, "timeout_s", "number", where, optional=True)
    return BackendTimeout(
        _field(data, "device", "str", where),
        _field(data, "backend", "str", where),
        None if timeout is None else float(timeout),
        parsed,
    )


def _one_group(data: Any, where: str) -> GroupAudit:
    ranks = _items(data, "ranks", where)
    if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
        raise ValueError(f"{where}.ranks must be a list of integers, got {ranks!r}")
    axes = _items(data, "axes", where)
    if any(not isinstance(a, str) for a in axes):
        raise ValueError(f"{where}.axes must be a list of strings, got {axes!r}")
    return GroupAudit(
        group_name=_field(data, "group_name", "str", where),
        group_desc=_field(data, "group_desc", "str", where),
        ranks=tuple(ranks),
        backend=_field(data, "backend", "str", where),
        backends=tuple(_backend(b, f"{where}.backends[{i}]") for i, b in enumerate(_items(data, "backends", where))),
        axes=tuple(axes),
    )


def _audit(data: Any) -> GroupsAudit:
    where = "audit"
    configured = _field(data, "configured_s", "number", where, optional=True)
    return GroupsAudit(
        rank=_field(data, "rank", "int", where, optional=True),
        world_size=_field(data, "world_size", "int", where, optional=True),
        configured_s=None if configured is None else float(configured),
        groups=tuple(_one_group(g, f"{where}.groups[{i}]") for i, g in enumerate(_items(data, "groups", where))),
    )
