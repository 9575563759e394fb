"""Reading a directory of Flight Recorder dumps, one per rank, and finding who did not join.

Pure functions of files and data: nothing here touches torch.distributed. A dump is the pickle
torch writes (``entries``, ``pg_config``, ``version``), from torch's NCCL watchdog or from
:mod:`nemo_rl_shim.flight_recorder`, which adds ``rank`` and ``nemo_rl_shim`` (world size, group
map, reason, dump time). The group map also comes from the ``fr_groups_rank_<rank>.json``
sidecars written at set-up, for dumps torch wrote itself.

The analysis, per process group (keyed by its name and member ranks, as torch's analyzer does):
the highest collective sequence number any member entered is the collective the group is in;
a member whose last entry is lower did not enter it (a stall); a member that entered it but,
where torch tracks completion (NCCL), has not completed it while others have, did not finish;
a member without a dump is missing; a sequence number whose op or sizes differ across members
is a mismatch.
"""

from __future__ import annotations

import ast
import functools
import gc
import json
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DumpError", "Finding", "GroupState", "RankDump", "analyse", "format_ranks", "load_dumps"]

_DUMP_NAME = re.compile(r"^(?P<prefix>[^.].*?)(?P<rank>\d+)$")
_SIDECAR = re.compile(r"^fr_groups_rank_(?P<rank>\d+)\.json$")
#: Ops whose input sizes must agree on every rank (gather, scatter, all_to_all and p2p may differ).
_SAME_SIZES = ("all_reduce", "allreduce", "broadcast", "reduce", "allgather", "all_gather", "reduce_scatter", "barrier")


#: Which finding goes first: a mismatch causes what follows it; a missing dump explains least.
_PRIORITY = {"mismatch": 0, "stall": 1, "not finished": 2, "missing": 3}


class DumpError(ValueError):
    """A directory or file that cannot be read as rank dumps; the message is the one line to print."""


@dataclass
class RankDump:
    """One rank's dump, with the group map found for it."""

    rank: int
    path: Path
    entries: list[dict[str, Any]]
    pg_config: dict[str, Any]
    version: str
    raw: dict[str, Any]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    world_size: int | None = None
    reason: str | None = None
    dump_time_ns: int | None = None
    writer: str = "torch"

    @functools.cached_property
    def latest(self) -> dict[str, Any] | None:
        """The rank's most recent entry: what it was in, or did last, when it dumped."""
        return max(self.entries, key=lambda e: int(e.get("time_created_ns", 0)), default=None)


def format_ranks(ranks: Any) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3, 5"``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if rank is not None and prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    return ", ".join(parts)


def _read_pickle(path: Path) -> dict[str, Any]:
    was_enabled = gc.isenabled()
    gc.disable()  # as torch's loader does: unpickling many small dicts otherwise runs the collector again and again
    try:
        with open(path, "rb") as handle:
            data = pickle.load(handle)
    except Exception as e:  # truncated, not a pickle, a pickle of something else: one line, exit 2
        raise DumpError(f"{path} is not a readable flight-recorder dump: {type(e).__name__}: {e}") from e
    finally:
        if was_enabled:
            gc.enable()
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise DumpError(f"{path} is not a flight-recorder dump: no 'entries' list (got {type(data).__name__})")
    return data


def _prefix(names: list[str], directory: Path) -> str:
    prefixes = Counter(m["prefix"] for name in names if (m := _DUMP_NAME.match(name)))
    if not prefixes:
        raise DumpError(f"{directory} holds no flight-recorder dumps (files named <prefix><rank>)")
    if "fr_trace_rank_" in prefixes:
        return "fr_trace_rank_"
    if len(prefixes) > 1:
        found = ", ".join(f"{p}* ({n})" for p, n in prefixes.most_common())
        raise DumpError(f"{directory} holds dumps under several prefixes ({found}); keep one run per directory")
    return next(iter(prefixes))


def _groups_from_pg_config(pg_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups = {}
    for name, facts in pg_config.items():
        if not name:
            continue
        ranks = facts.get("ranks", "[]")
        ranks = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
        groups[str(name)] = {"axes": [], "ranks": list(ranks), "desc": facts.get("desc", "")}
    return groups


def load_dumps(directory: str | Path) -> tuple[dict[int, RankDump], dict[int, dict[str, Any]]]:
    """Every rank's dump in ``directory`` and every sidecar; :class:`DumpError` for a bad directory or file."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{directory} is not a directory")
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    sidecars: dict[int, dict[str, Any]] = {}
    for name in names:
        if m := _SIDECAR.match(name):
            try:
                sidecars[int(m["rank"])] = json.loads((directory / name).read_text())
            except (OSError, ValueError) as e:
                raise DumpError(f"{directory / name} is not a readable group map: {type(e).__name__}: {e}") from e
    prefix = _prefix(names, directory)
    dumps: dict[int, RankDump] = {}
    for name in names:
        m = _DUMP_NAME.match(name)
        if not m or m["prefix"] != prefix:
            continue
        raw = _read_pickle(directory / name)
        shim = raw.get("nemo_rl_shim") or {}
        rank = int(raw.get("rank", m["rank"]))
        side = sidecars.get(rank, {})
        groups = shim.get("groups") or side.get("groups") or _groups_from_pg_config(raw.get("pg_config") or {})
        dumps[rank] = RankDump(
            rank=rank,
            path=directory / name,
            entries=raw["entries"],
            pg_config=raw.get("pg_config") or {},
            version=str(raw.get("version", "")),
            raw=raw,
            groups={str(k): v for k, v in groups.items()},
            world_size=shim.get("world_size") or side.get("world_size"),
            reason=shim.get("reason"),
            dump_time_ns=shim.get("dump_time_ns"),
            writer="nemo_rl_shim" if shim else "torch",
        )
    return dumps, sidecars


@dataclass
class GroupState:
    """One process group across the ranks that dumped: who is at which collective."""

    name: str
    ranks: tuple[int, ...]
    axes: list[str]
    last: dict[int, int]  # rank -> last collective sequence number entered (0: none)
    entries: dict[int, dict[int, dict[str, Any]]]  # rank -> seq -> entry
    missing: list[int]

    @property
    def label(self) -> str:
        """``"dp_shard (also dp), ranks 0-7"``: the mesh axes first, the process-group name if none."""
        axes = self.axes or [f"process group {self.name}"]
        more = f", +{len(axes) - 3} more" if len(axes) > 3 else ""
        also = f" (also {', '.join(axes[1:3])}{more})" if len(axes) > 1 else ""
        return f"{axes[0]}{also}, ranks {format_ranks(self.ranks)}"


@dataclass
class Finding:
    """A stall, an unfinished collective, a missing dump or a mismatch, on one group."""

    kind: str  # "stall", "not finished", "missing", "mismatch"
    group: GroupState
    ranks: list[int]  # the ranks named: the laggards, the missing, or those that differ
    seq: int
    op: str
    waiting: list[int]
    waited_s: float | None
    created_ns: int
    detail: str = ""

    def line(self) -> str:
        """The one line that names the rank(s)."""
        who = f"rank{'s' * (len(self.ranks) > 1)} {format_ranks(self.ranks)}"
        waiters = f"rank{'s' * (len(self.waiting) > 1)} {format_ranks(self.waiting)}" if self.waiting else ""
        waited = f" waited {self.waited_s:.1f} s" if self.waited_s is not None else " waited"
        where = f"{self.op} #{self.seq} on {self.group.label}"
        if self.kind == "stall":
            return f"{who} did not enter {where}, in which {waiters}{waited}"
        if self.kind == "not finished" and not self.waiting:
            took = f" (running {self.waited_s:.1f} s when dumped)" if self.waited_s is not None else ""
            return f"{who} did not finish {where}: every member entered it, none finished{took}"
        if self.kind == "not finished":
            return f"{who} did not finish {where}, which {waiters} finished"
        if self.kind == "missing":
            return f"no dump from {who}: {waiters} {'were' if len(self.waiting) > 1 else 'was'} last in {where}" + (
                f" ({waited.strip()})" if self.waited_s is not None else ""
            )
        return f"{who} disagree on {where}: {self.detail}"


def _by_group(dump: RankDump) -> dict[str, dict[int, dict[str, Any]]]:
    """``{group name: {sequence number: entry}}`` of one rank's collectives (p2p left out)."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for entry in dump.entries:
        seq = int(entry.get("collective_seq_id", 0))
        if seq > 0 and not entry.get("is_p2p", False):
            groups.setdefault(str(entry.get("process_group", ("",))[0]), {})[seq] = entry
    return groups


def _op(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name", "?"))
    return name.split(":", 1)[1] if ":" in name else name


def _group_states(dumps: dict[int, RankDump], world: list[int]) -> list[GroupState]:
    found: dict[tuple[str, tuple[int, ...]], GroupState] = {}
    for dump in dumps.values():
        for name, facts in dump.groups.items():
            key = (name, tuple(sorted(facts["ranks"])))
            state = found.setdefault(key, GroupState(name, key[1], list(facts.get("axes") or []), {}, {}, []))
            for axis in facts.get("axes") or []:
                if axis not in state.axes:
                    state.axes.append(axis)
    by_group = {rank: _by_group(dump) for rank, dump in dumps.items()}
    for state in found.values():
        for rank in state.ranks:
            if rank not in dumps:
                state.missing.append(rank)
                continue
            seqs = by_group[rank].get(state.name, {})
            state.entries[rank] = seqs
            state.last[rank] = max(seqs, default=0)
    del world
    return sorted(found.values(), key=lambda s: (-len(s.ranks), s.ranks, s.name))


def _waited(dumps: dict[int, RankDump], waiting: list[int], state: GroupState, seq: int) -> float | None:
    waits = []
    for rank in waiting:
        entry = state.entries[rank][seq]
        end = dumps[rank].dump_time_ns
        if end is None:
            completed = entry.get("time_discovered_completed_ns")
            if completed is None and entry.get("timeout_ms"):  # torch's own dump: at least the timeout
                waits.append(entry["timeout_ms"] / 1000)
            continue
        waits.append((end - int(entry.get("time_created_ns", end))) / 1e9)
    return max(waits) if waits else None


def _tracks_completion(dump: RankDump) -> bool:
    """NCCL entries carry their state ('scheduled', 'started', 'completed'); Gloo's stay 'scheduled'."""
    return any(str(e.get("profiling_name", "")).startswith("nccl:") for e in dump.entries)


def _completed(dump: RankDump, entry: dict[str, Any]) -> bool:
    """Whether ``entry`` had completed on that rank: NCCL tracks each entry's state; Gloo leaves every entry
    'scheduled', and only the dump's ``pg_status`` (torch 2.10 and later) says how far each group completed."""
    if entry.get("state") == "completed":
        return True
    status = (dump.raw.get("pg_status") or {}).get(str(entry.get("pg_id")))
    if isinstance(status, dict) and "last_completed_collective" in status:
        return int(status["last_completed_collective"]) >= int(entry.get("collective_seq_id", 0))
    return False


def _differ(values: Any) -> bool:
    first, *rest = list(values)
    return any(value != first for value in rest)


def _mismatch(state: GroupState) -> Finding | None:
    ranks = [r for r in state.ranks if r in state.entries]
    common = sorted(set.intersection(*(set(state.entries[r]) for r in ranks))) if len(ranks) > 1 else []
    for seq in common:
        entries = {r: state.entries[r][seq] for r in ranks}
        ops = {r: _op(e) for r, e in entries.items()}
        if len(set(ops.values())) > 1:
            detail = "; ".join(f"rank {r}: {op}" for r, op in ops.items())
        elif any(k in next(iter(ops.values())) for k in _SAME_SIZES) and _differ(
            e.get("input_sizes") for e in entries.values()
        ):
            sizes = {r: e.get("input_sizes") for r, e in entries.items()}
            detail = "input sizes " + "; ".join(f"rank {r}: {s}" for r, s in sizes.items())
        else:
            continue
        first = entries[ranks[0]]
        return Finding(
            "mismatch", state, ranks, seq, ops[ranks[0]], [], None, int(first.get("time_created_ns", 0)), detail
        )
    return None


def _stall(dumps: dict[int, RankDump], state: GroupState) -> Finding | None:
    if not state.last:
        return None
    top = max(state.last.values())
    if top == 0:
        return None
    waiting = sorted(r for r, last in state.last.items() if last == top)
    behind = sorted(r for r, last in state.last.items() if last < top)
    entry = state.entries[waiting[0]][top]
    created = int(entry.get("time_created_ns", 0))
    if behind:
        return Finding("stall", state, behind, top, _op(entry), waiting, _waited(dumps, waiting, state, top), created)
    done = sorted(r for r in waiting if _completed(dumps[r], state.entries[r][top]))
    unfinished = sorted(r for r in waiting if r not in done)
    if done and unfinished:
        return Finding("not finished", state, unfinished, top, _op(entry), done, None, created)
    if not done and not state.missing and any(_tracks_completion(dumps[r]) for r in waiting):
        # every member entered it and none finished: a collective that hangs or runs past its timeout (on a
        # one-rank group, the only finding there can be)
        waited = _waited(dumps, waiting, state, top)
        return Finding("not finished", state, unfinished, top, _op(entry), [], waited, created)
    latest = [r for r in waiting if state.entries[r][top] is dumps[r].latest]
    if state.missing and (unfinished or latest):  # the others were still in it, or it was their last, when they dumped
        waited = _waited(dumps, waiting, state, top)
        return Finding("missing", state, list(state.missing), top, _op(entry), waiting, waited, created)
    return None


def analyse(dumps: dict[int, RankDump]) -> tuple[list[Finding], list[GroupState], list[int]]:
    """Findings (earliest collective first), every group's state, and the ranks of the world without a dump."""
    sizes = [d.world_size for d in dumps.values() if d.world_size]
    members = {r for d in dumps.values() for g in d.groups.values() for r in g["ranks"]}
    world_size = max([*sizes, max(members, default=-1) + 1, max(dumps, default=-1) + 1])
    world = list(range(world_size))
    states = _group_states(dumps, world)
    findings = [f for s in states for f in (_mismatch(s), _stall(dumps, s)) if f is not None]
    findings.sort(key=lambda f: (_PRIORITY[f.kind], f.created_ns))
    return findings, states, [r for r in world if r not in dumps]
