"""Dumps in the format torch's NCCL watchdog writes, built here from the schema (NCCL is the boundary this
machine lacks: it cannot start without a GPU).

Our own builder, not torch's code and not the shim's writer. It follows:

* torch/csrc/distributed/c10d/FlightRecorderDetail.hpp (torch 2.15, ``getCollectiveTrace`` and
  ``dump``): the top-level keys ``version`` ("2.10"), ``pg_config`` (``{name: {name, desc, ranks}}``,
  ranks as a string), ``comm_lib_version``, ``pg_status`` (``{pg_id: {last_enqueued_collective,
  last_started_collective, last_completed_collective}}``) and ``entries``, each entry's keys in the
  order it writes them; ``state`` "completed" when a completion was discovered, "started" when only the
  start was (timing on), else "scheduled";
* the trace tests of test/distributed/test_c10d_nccl.py (``NCCLTraceTest``): ``_verify_trace`` (the
  default group "0", "default_pg", ``last_started_collective`` -1 with timing off, timeout 600000 ms),
  ``test_individual_send_recv`` (``"nccl:recv 0<-1"``, ``"nccl:send 1->0"``: collective_seq_id 0,
  p2p_seq_id and op_id counting up, state "completed"), ``test_batched_send_recv`` (each op of a
  ``batch_isend_irecv`` stays "scheduled"; a ``"nccl:coalesced"`` entry with the batch's p2p_seq_id,
  empty sizes, carries the state), ``test_trace_while_stuck`` (the stuck all_reduce "started" or
  "scheduled", ``time_discovered_completed_ns`` None) and ``test_long`` (a 10-entry buffer keeps the
  newest: the collective numbers of the first and last differ by 9).

:class:`Rank` records one rank's ops in order, as ProcessGroupNCCL numbers them per group;
:func:`write` pickles a rank's dump under a prefix (torch's default name, ``nccl_trace_rank_``).
``pg_status`` counts every op (p2p included) in ``last_*_collective``, as NCCL's counters do.

``Rank(lib="nccl2")`` writes what torch 2.15's ``FlightRecorderHook`` records for a hooked backend (plain
``"nccl"``, ``ProcessGroupNCCL2``), from torch/csrc/distributed/c10d/hooks/FlightRecorderHook.cpp: profiling
names ``"nccl2:<op>"`` (the backend's own name), every op of a ``batch_isend_irecv`` its own entry with its own
p2p number (the hook counts per op) and no ``coalesced`` entry, each op retired by its own completion.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TIMEOUT_MS", "VERSION", "Clock", "Group", "Rank", "write"]

VERSION = "2.10"
TIMEOUT_MS = 600_000
_T0 = 1_796_000_000_000_000_000
_FRAMES = [
    {"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 3012},
    {"name": "wrapper", "filename": "torch/distributed/c10d_logger.py", "line": 81},
    {"name": "train_step", "filename": "train.py", "line": 120},
]


def _fresh(value: Any) -> Any:
    """A new object equal to ``value``, as torch's pickler sees each entry's own strings: written out again, not
    referred to (it memoizes by object, so the shared keys and frames are written once)."""
    return value.encode().decode() if isinstance(value, str) else value


@dataclass
class Clock:
    """One timeline for every rank of a scenario: each op is posted 1 ms after the last; :meth:`settle` marks
    the completed ones done (discovered) after every op posted so far, as a collective or a matched p2p
    pair completes only once all its parties have posted it."""

    now_ns: int = _T0
    unsettled: list[dict[str, Any]] = field(default_factory=list)

    def take(self) -> int:
        self.now_ns += 1_000_000
        return self.now_ns

    def settle(self) -> None:
        done = self.take()
        for entry in self.unsettled:
            entry["time_discovered_completed_ns"] = done
            if entry["time_discovered_started_ns"] is not None:
                entry["time_discovered_started_ns"] = min(entry["time_discovered_started_ns"], done)
        self.unsettled.clear()


@dataclass(frozen=True)
class Group:
    """A process group as torch names it: ``name`` ("0" for the default), ``desc``, global ranks in group order."""

    name: str
    desc: str
    ranks: tuple[int, ...]

    def group_rank(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass
class Rank:
    """One rank's recorder: ops appended in order, numbered per group as ProcessGroupNCCL does."""

    rank: int
    groups: list[Group]
    clock: Clock
    timing: bool = False  # TORCH_NCCL_ENABLE_TIMING: "started" states and durations
    frames: bool = True  # includeStackTraces, the watchdog's default
    lib: str = "nccl"  # the recorder: "nccl" (ProcessGroupNCCL's own), "nccl2" (torch 2.15's hook)
    entries: list[dict[str, Any]] = field(default_factory=list)
    _coll: dict[str, int] = field(default_factory=dict)
    _p2p: dict[str, int] = field(default_factory=dict)
    _op_id: dict[str, int] = field(default_factory=dict)
    _record_id: int = 0

    def _pg_id(self, group: Group) -> int:
        return self.groups.index(group)

    def _base(self, group: Group, name: str, sizes: list[list[int]], state: str, is_p2p: bool) -> dict[str, Any]:
        self._op_id[group.name] = self._op_id.get(group.name, 0) + 1
        created = self.clock.take()
        started = created + 1000 if state in ("started", "completed") and self.timing else None
        entry: dict[str, Any] = {}
        if self.frames:  # torch symbolizes each distinct frame once and every entry refers to that one dict
            entry["frames"] = list(_FRAMES)
        entry.update(
            record_id=self._record_id,
            pg_id=self._pg_id(group),
            process_group=(_fresh(group.name), _fresh(group.desc)),
            thread_name=_fresh("pt_main_thread"),
            thread_id=_fresh("139872345"),
            collective_seq_id=0,
            p2p_seq_id=0,
            op_id=self._op_id[group.name],
            profiling_name=_fresh(f"{self.lib}:{name}"),
            time_created_ns=created,
        )
        if self.timing and state == "completed":
            entry["duration_ms"] = 0.036
        entry.update(
            input_sizes=sizes,
            input_dtypes=[_fresh("Float") for _ in sizes],
            output_sizes=sizes,
            output_dtypes=[_fresh("Float") for _ in sizes],
            state=_fresh(state),
            time_discovered_started_ns=started,
            time_discovered_completed_ns=None,
            retired=state == "completed",
            timeout_ms=TIMEOUT_MS,
            is_p2p=is_p2p,
        )
        if entry["state"] == "started" and not self.timing:
            entry["state"] = "scheduled"  # without timing NCCL cannot see a start
        if state == "completed":
            self.clock.unsettled.append(entry)  # its completion time comes with the clock's next settle()
        self._record_id += 1
        return entry

    def collective(
        self, group: Group, op: str = "all_reduce", sizes: Any = ((4,),), state: str = "completed", out: Any = None
    ) -> int:
        """One collective on ``group`` (``out``: output sizes, where they differ, as a reduce_scatter's do);
        returns its collective_seq_id."""
        self._coll[group.name] = self._coll.get(group.name, 0) + 1
        entry = self._base(group, op, [list(s) for s in sizes], state, False)
        if out is not None:
            entry["output_sizes"] = [list(s) for s in out]
        entry["collective_seq_id"] = self._coll[group.name]
        self.entries.append(entry)
        return self._coll[group.name]

    def send(self, group: Group, peer: int, state: str = "completed") -> int:
        """A plain ``send`` to global rank ``peer``; returns its p2p_seq_id."""
        return self._plain(group, f"send {group.group_rank(self.rank)}->{group.group_rank(peer)}", state)

    def recv(self, group: Group, peer: int, state: str = "completed") -> int:
        """A plain ``recv`` from global rank ``peer``; returns its p2p_seq_id."""
        return self._plain(group, f"recv {group.group_rank(self.rank)}<-{group.group_rank(peer)}", state)

    def _plain(self, group: Group, name: str, state: str) -> int:
        self._p2p[group.name] = self._p2p.get(group.name, 0) + 1
        entry = self._base(group, name, [[4]], state, True)
        entry["p2p_seq_id"] = self._p2p[group.name]
        self.entries.append(entry)
        return self._p2p[group.name]

    def coalesced(self, group: Group, ops: list[str], state: str = "completed") -> int:
        """A coalesced collective (``_coalescing_manager``, ``allreduce_coalesced``): an entry per op, each
        'scheduled', under one collective number, then the ``coalesced`` closer, which carries the state."""
        self._coll[group.name] = self._coll.get(group.name, 0) + 1
        for op in ops:
            entry = self._base(group, op, [[4]], "scheduled", False)
            entry["collective_seq_id"] = self._coll[group.name]
            self.entries.append(entry)
        closer = self._base(group, "coalesced", [], state, False)
        closer["collective_seq_id"] = self._coll[group.name]
        self.entries.append(closer)
        return self._coll[group.name]

    def batch(self, group: Group, ops: list[tuple[str, int]], state: str = "completed") -> int:
        """A ``batch_isend_irecv`` of ``[("send"|"recv", global peer), ...]``: an entry per op, then the closer
        (``lib="nccl2"``: an entry per op, each with its own number and ``state``, no closer)."""
        if self.lib != "nccl":
            for kind, peer in ops:
                (self.send if kind == "send" else self.recv)(group, peer, state)
            return self._p2p[group.name]
        self._p2p[group.name] = self._p2p.get(group.name, 0) + 1
        me = group.group_rank(self.rank)
        for kind, peer in ops:
            arrow = "->" if kind == "send" else "<-"
            entry = self._base(group, f"{kind} {me}{arrow}{group.group_rank(peer)}", [[4]], "scheduled", True)
            entry["p2p_seq_id"] = self._p2p[group.name]
            self.entries.append(entry)
        closer = self._base(group, "coalesced", [], state, True)
        closer["p2p_seq_id"] = self._p2p[group.name]
        self.entries.append(closer)
        return self._p2p[group.name]

    def dump(self, buffer: int | None = None) -> dict[str, Any]:
        """The pickle's contents: the newest ``buffer`` entries (all when None), as the ring buffer keeps them."""
        self.clock.settle()
        entries = self.entries if buffer is None else self.entries[-buffer:]
        status = {}
        for group in self.groups:
            mine = [e for e in self.entries if e["process_group"][0] == group.name]
            # NCCL's counters number every work item of the group, p2p included (the "counts p2p too" of #22)
            count = len(mine)
            done = sum(1 for e in mine if e["state"] == "completed")
            status[str(self._pg_id(group))] = {
                "last_enqueued_collective": count,
                "last_started_collective": done if self.timing else -1,
                "last_completed_collective": done,
            }
        return {
            "version": VERSION,
            "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))} for g in self.groups},
            "comm_lib_version": "2.27.5",
            "pg_status": status,
            "entries": entries,
        }


def write(directory: Path, rank: Rank, *, buffer: int | None = None, prefix: str = "nccl_trace_rank_") -> Path:
    """Pickle ``rank``'s dump to ``directory/<prefix><rank>``, as the watchdog's DebugInfoWriter names it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}{rank.rank}"
    path.write_bytes(pickle.dumps(rank.dump(buffer)))
    return path
