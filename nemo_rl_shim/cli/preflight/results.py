"""Preflight's data at its seams: a rank's parameters, a group row, and a rank's result (checked or failed).

Every runner hands the same types to :func:`~nemo_rl_shim.cli.preflight.run.run_preflight`, and the
report reads nothing else:

* :class:`RankParams` - what every rank's :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank` gets;
* :class:`GroupRow` - one process group as a rank sees it: ranks, backend and timeout per device, the
  all-reduce outcomes, the steady-state timeouts;
* :class:`RankChecked` (the rank ran its checks; its rows, its CPU-offload check, the decision) or
  :class:`RankFailed` (it raised, died, was ended after the grace, or did not finish): a
  :data:`RankOutcome`.

All are frozen. They become JSON (``to_json``/``from_json``) only where they cross a process - a
spawned rank's parameter and result files, a torchrun/srun world's gather - or a Ray actor; the dry
run, in one process, passes the objects themselves. The JSON of a :class:`RankChecked` or a
:class:`RankFailed` is also what ``preflight --json`` prints for that rank; ``"checked"`` tells them
apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NEMO_RL_SETUP",
    "SETUPS",
    "SHIM_SETUP",
    "CreatedGroup",
    "DryRunFacts",
    "GroupRow",
    "Node",
    "OffloadCheck",
    "RankChecked",
    "RankFailed",
    "RankOutcome",
    "RankParams",
    "gave_up_on_peers",
    "outcome_from_json",
]


#: ``--setup``: the shim's ``setup_distributed`` (the default), or NeMo RL's own (``nemo_rl.models.automodel.setup``).
SHIM_SETUP, NEMO_RL_SETUP = "shim", "nemo-rl"
SETUPS = (SHIM_SETUP, NEMO_RL_SETUP)


def _minutes(value: Mapping[str, Any] | None) -> dict[str, float] | None:
    return None if value is None else {str(device): float(minutes) for device, minutes in value.items()}


def _readings(value: Mapping[str, Any]) -> dict[str, float | None]:
    """``{device: minutes}``, None where the backend keeps no timeout that can be read."""
    return {str(device): None if minutes is None else float(minutes) for device, minutes in value.items()}


def _sources(value: Mapping[str, Any] | None) -> dict[str, str] | None:
    return None if value is None else {str(device): str(source) for device, source in value.items()}


def _ints(values: Sequence[Any] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(value) for value in values)


@dataclass(frozen=True)
class RankParams:
    """What every rank's checks get: the role's section as ``setup_distributed`` receives it, and how to check.

    ``stall_rank`` / ``stall_s``: fault injection for tests (that rank sleeps ``stall_s`` after set-up,
    so its peers wait in a collective on it). ``dry_run``: the groups are on torch's fake backend
    (:mod:`~nemo_rl_shim.cli.preflight.dry_run`), so no collective and no ``full_tensor()`` check runs.
    ``setup``: whose ``setup_distributed`` the rank runs (:data:`SETUPS`: the shim's, or NeMo RL's own).
    """

    section: Mapping[str, Any]
    role: str = "policy"
    cpu_offload: bool = True
    stall_rank: int | None = None
    stall_s: float = 0.0
    dry_run: bool = False
    setup: str = SHIM_SETUP

    def to_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "role": self.role,
            "cpu_offload": self.cpu_offload,
            "stall_rank": self.stall_rank,
            "stall_s": self.stall_s,
            "dry_run": self.dry_run,
            "setup": self.setup,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankParams:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"rank parameters: unknown key {unknown[0]!r} (known: {', '.join(cls.__dataclass_fields__)})"
            )
        stall = data.get("stall_rank")
        return cls(
            section=dict(data["section"]),
            role=str(data.get("role", "policy")),
            cpu_offload=bool(data.get("cpu_offload", True)),
            stall_rank=None if stall is None else int(stall),
            stall_s=float(data.get("stall_s", 0.0)),
            dry_run=bool(data.get("dry_run", False)),
            setup=str(data.get("setup", SHIM_SETUP)),
        )


@dataclass(frozen=True)
class GroupRow:
    """One process group on one rank: under the name the training code gives it (``named``), or, for a group torch
    holds that no mesh names (a plain ``new_group``), under its description.

    ``timeout_minutes``: per device, as read from the group's backend (None: the backend keeps none that can
    be read). ``sources``: per device, where that value came from, as the audit judged it
    (:class:`nemo_rl_shim.audit.TimeoutSource` values: ``configured``, ``own``, ``torch_default``,
    ``unreadable``). ``desc`` and ``group_name``: torch's ``group_desc`` and ``group_name``. ``same_as``: the
    name of an earlier row of this rank that is the very same group object (``dp_shard`` is ``default`` when
    it spans the world), so the table's rows can be counted as groups. ``timeout_minutes_after_init`` and
    ``sources_after_init``: read again after ``after_first_step`` when a steady-state timeout is configured,
    else None.
    """

    group: str
    ranks: tuple[int, ...]
    backends: Mapping[str, str]
    timeout_minutes: Mapping[str, float | None]
    cpu_all_reduce: str
    cuda_all_reduce: str
    is_default: bool = False
    same_as: str | None = None
    timeout_minutes_after_init: Mapping[str, float | None] | None = None
    named: bool = True
    desc: str = ""
    group_name: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    sources_after_init: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "ranks": list(self.ranks),
            "is_default": self.is_default,
            "same_as": self.same_as,
            "backends": dict(self.backends),
            "timeout_minutes": dict(self.timeout_minutes),
            "cpu_all_reduce": self.cpu_all_reduce,
            "cuda_all_reduce": self.cuda_all_reduce,
            "timeout_minutes_after_init": None
            if self.timeout_minutes_after_init is None
            else _readings(self.timeout_minutes_after_init),
            "named": self.named,
            "desc": self.desc,
            "group_name": self.group_name,
            "sources": dict(self.sources),
            "sources_after_init": _sources(self.sources_after_init),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupRow:
        steady = data.get("timeout_minutes_after_init")
        return cls(
            group=str(data["group"]),
            ranks=_ints(data["ranks"]) or (),
            backends={str(device): str(name) for device, name in data["backends"].items()},
            timeout_minutes=_readings(data["timeout_minutes"]),
            cpu_all_reduce=str(data["cpu_all_reduce"]),
            cuda_all_reduce=str(data["cuda_all_reduce"]),
            is_default=bool(data.get("is_default", False)),
            same_as=data.get("same_as"),
            timeout_minutes_after_init=None if steady is None else _readings(steady),
            named=bool(data.get("named", True)),
            desc=str(data.get("desc", "")),
            group_name=str(data.get("group_name", "")),
            sources=_sources(data.get("sources")) or {},
            sources_after_init=_sources(data.get("sources_after_init")),
        )


@dataclass(frozen=True)
class OffloadCheck:
    """The CPU-offload check: a parameter sharded with FSDP2's ``CPUOffloadPolicy`` on ``mesh``, then rebuilt.

    ``skipped`` says why it did not run (an earlier collective timed out); ``error`` why it failed.
    """

    method: str
    mesh: str = "dp"
    mesh_ranks: tuple[int, ...] = ()
    ok: bool = False
    local_device: str | None = None
    local_shape: tuple[int, ...] | None = None
    full_shape: tuple[int, ...] | None = None
    error: str | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mesh": self.mesh,
            "mesh_ranks": list(self.mesh_ranks),
            "ok": self.ok,
            "local_device": self.local_device,
            "local_shape": None if self.local_shape is None else list(self.local_shape),
            "full_shape": None if self.full_shape is None else list(self.full_shape),
            "error": self.error,
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OffloadCheck:
        return cls(
            method=str(data["method"]),
            mesh=str(data.get("mesh", "dp")),
            mesh_ranks=_ints(data.get("mesh_ranks")) or (),
            ok=bool(data.get("ok", False)),
            local_device=data.get("local_device"),
            local_shape=_ints(data.get("local_shape")),
            full_shape=_ints(data.get("full_shape")),
            error=data.get("error"),
            skipped=data.get("skipped"),
        )


@dataclass(frozen=True)
class Node:
    """Where a Ray actor ran: its node's id and address, its host name and process id."""

    node_id: str
    node_ip: str
    host: str
    pid: int

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "node_ip": self.node_ip, "host": self.host, "pid": self.pid}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Node:
        return cls(str(data["node_id"]), str(data["node_ip"]), str(data["host"]), int(data["pid"]))


@dataclass(frozen=True)
class CreatedGroup:
    """A process group a dry-run rank created (its ``new_group`` call on torch's fake backend): what the real run
    would build, and the timeout each backend has after set-up and (with a steady value) after ``after_first_step``."""

    desc: str | None
    ranks: tuple[int, ...]
    backend: str
    backends: Mapping[str, str]
    timeout_minutes: Mapping[str, float]
    timeout_minutes_after_init: Mapping[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "desc": self.desc,
            "ranks": list(self.ranks),
            "backend": self.backend,
            "backends": dict(self.backends),
            "timeout_minutes": dict(self.timeout_minutes),
            "timeout_minutes_after_init": _minutes(self.timeout_minutes_after_init),
        }


@dataclass(frozen=True)
class DryRunFacts:
    """What a dry run adds to a checked rank: the groups it created, and its ``new_group`` calls (every group of
    the world, as torch requires of every rank)."""

    groups: tuple[CreatedGroup, ...]
    new_group_calls: int

    @property
    def process_groups(self) -> int:
        """The groups this rank holds: in the real run, its NCCL communicators."""
        return len(self.groups)


@dataclass(frozen=True)
class RankChecked:
    """A rank that ran its checks: the set-up's facts, one :class:`GroupRow` per group, the CPU-offload check.

    ``decision``: what the shim's ``setup_distributed`` decided (None under NeMo RL's own set-up, which makes
    none; ``set_up`` then says what ran, and what stood in for NCCL). ``later_groups``: the groups made after
    set-up as a NeMo RL worker makes them, in words. ``gave_up``: the collective that timed out or lost its
    peer, after which the rank skipped the rest (a runner then gives the other ranks the grace,
    :class:`~nemo_rl_shim.cli.preflight.stuck.Grace`). ``node``: where a Ray actor ran; ``dry_run``: what a
    dry run adds.
    """

    rank: int
    host: str
    world_size: int
    default_backend: str
    device: str
    decision: Mapping[str, Any] | None
    timeout_minutes_after_init: float | None
    rows: tuple[GroupRow, ...]
    offload: OffloadCheck | None = None
    gave_up: str | None = None
    warnings: tuple[str, ...] = ()
    node: Node | None = None
    dry_run: DryRunFacts | None = None
    set_up: str | None = None
    later_groups: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "checked": True,
            "rank": self.rank,
            "host": self.host,
            "world_size": self.world_size,
            "default_backend": self.default_backend,
            "device": self.device,
            "decision": None if self.decision is None else dict(self.decision),
            "set_up": self.set_up,
            "later_groups": list(self.later_groups),
            "timeout_minutes_after_init": self.timeout_minutes_after_init,
            "rows": [row.to_json() for row in self.rows],
            "offload": None if self.offload is None else self.offload.to_json(),
            "gave_up": self.gave_up,
            "warnings": list(self.warnings),
            "node": None if self.node is None else self.node.to_json(),
        }
        if self.dry_run is not None:
            data.update(
                process_groups=self.dry_run.process_groups,
                new_group_calls=self.dry_run.new_group_calls,
                groups=[group.to_json() for group in self.dry_run.groups],
            )
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankChecked:
        """A rank's result as a spawned rank, a gathered rank or a Ray actor sent it (no dry-run facts: a dry run
        never crosses a process)."""
        offload, node, decision = data.get("offload"), data.get("node"), data.get("decision")
        steady = data.get("timeout_minutes_after_init")
        return cls(
            rank=int(data["rank"]),
            host=str(data["host"]),
            world_size=int(data["world_size"]),
            default_backend=str(data["default_backend"]),
            device=str(data["device"]),
            decision=None if decision is None else dict(decision),
            timeout_minutes_after_init=None if steady is None else float(steady),
            rows=tuple(GroupRow.from_json(row) for row in data["rows"]),
            offload=None if offload is None else OffloadCheck.from_json(offload),
            gave_up=data.get("gave_up"),
            warnings=tuple(str(w) for w in data.get("warnings") or ()),
            node=None if node is None else Node.from_json(node),
            set_up=data.get("set_up"),
            later_groups=tuple(str(line) for line in data.get("later_groups") or ()),
        )


@dataclass(frozen=True)
class RankFailed:
    """A rank without checks to show: it raised (``error`` is the traceback), died, was ended, or did not finish.

    ``timed_out``: still running at ``--timeout-s``. ``killed_because``: ended by its runner before
    that, after a peer failed or gave up (``"still running 15 s after rank 0 failed (exit 1)"``).
    ``output``: the end of a spawned rank's log. ``phase``, ``phase_s``, ``stack``: what a Ray actor
    that did not finish was doing, for how long, and its innermost Python frames (innermost last).
    """

    rank: int
    error: str
    timed_out: bool = False
    killed_because: str | None = None
    output: str = ""
    phase: str | None = None
    phase_s: float | None = None
    stack: tuple[str, ...] = ()
    node: Node | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": False,
            "rank": self.rank,
            "error": self.error,
            "timed_out": self.timed_out,
            "killed_because": self.killed_because,
            "output": self.output,
            "phase": self.phase,
            "phase_s": self.phase_s,
            "stack": list(self.stack),
            "node": None if self.node is None else self.node.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankFailed:
        node, seconds = data.get("node"), data.get("phase_s")
        return cls(
            rank=int(data["rank"]),
            error=str(data["error"]),
            timed_out=bool(data.get("timed_out", False)),
            killed_because=data.get("killed_because"),
            output=str(data.get("output") or ""),
            phase=data.get("phase"),
            phase_s=None if seconds is None else float(seconds),
            stack=tuple(str(frame) for frame in data.get("stack") or ()),
            node=None if node is None else Node.from_json(node),
        )


#: A rank's result: checked, or failed.
RankOutcome = RankChecked | RankFailed


def outcome_from_json(data: Any, rank: int) -> RankOutcome:
    """The :data:`RankOutcome` that ``data`` (sent by rank ``rank`` across a process or a Ray actor) holds.

    Anything that is not one is that rank's failure, naming what arrived: a result that cannot be
    read is a finding about the rank, not a crash of the command.
    """
    if not isinstance(data, Mapping) or "checked" not in data:
        return RankFailed(rank, f"rank {rank} sent a result preflight cannot read: {str(data)[:200]}")
    try:
        return RankChecked.from_json(data) if data["checked"] else RankFailed.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return RankFailed(rank, f"rank {rank} sent a result preflight cannot read ({type(e).__name__}: {e})")


def gave_up_on_peers(data: Any) -> str | None:
    """What a finished rank's JSON result says it stopped waiting on (its ``gave_up``), if anything.

    Read from the JSON a spawned rank wrote, while its peers still run, so that its runner can start
    the grace (:class:`~nemo_rl_shim.cli.preflight.stuck.Grace`) without waiting for them.
    """
    return data.get("gave_up") if isinstance(data, Mapping) else None
