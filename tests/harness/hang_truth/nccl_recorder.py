"""One rank's NCCL Flight Recorder as ``docs/recorder-semantics.md`` says torch fills it, row by row.

Built on :class:`tests.harness.nccl_format_dumps.Rank` (its entry layout, clock, frames and its writer), with the
rows where that older writer departs from torch's source put right, each at the line that follows it:

* ``L-P2P``, ``L-COLL``: a p2p entry carries the group's current collective count (the older writer: 0), a
  collective the current p2p count;
* ``L-COAL-MEMBERS``, ``L-COAL-CLOSE``: a batch's closer has ``is_p2p`` False and the last member's ``op_id`` (the
  older writer: True, and an ``op_id`` of its own);
* ``L-COAL-FAST``: ``_coalescing_manager``'s fast path, one ``allreduce_coalesced`` entry and, with a device, a closer;
* ``L-PG-STATUS``, ``C-PG-STATUS``: ``pg_status`` holds the ``seq_`` of the group's works (a p2p batch's is its p2p
  number), and only groups that recorded (the older writer: a count of entries, every group);
* ``C-ONLY-ACTIVE``: an only-active dump drops every entry with a completion time;
* ``H-*`` (``lib="nccl2"``): ``op_id`` from 0, no ``started`` state, completed entries' two discovery times equal,
  batch members completed when queued (``H-BATCH-DONE``), no closer, ``pg_status`` in ``op_id``\\s.

A work is what the watchdog (or the hook) tracks: a plain op's own entry, or a batch's closer. Its state is the
state of the entry that carries it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.harness.nccl_format_dumps import VERSION, Group, Rank

__all__ = ["PENDING", "RulesRank"]

#: A posted op that did not finish: ``started`` where timing is on (legacy), ``scheduled`` otherwise (``L-TIMING-*``).
PENDING = "started"


@dataclass
class _Work:
    """One work of a group: its ``seq_`` (legacy) or ``op_id`` (NCCL2), and the entry that carries its state."""

    number: int
    entry: dict[str, Any]


@dataclass
class RulesRank(Rank):
    """:class:`Rank` with the rows of ``docs/recorder-semantics.md`` (see the module docstring)."""

    only_active: bool = False  # C-ONLY-ACTIVE: TORCH_INCLUDE_ONLY_ACTIVE=1 at the dump
    works: dict[str, list[_Work]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lib == "nccl2":
            self.timing = False  # H-STATE, H-TIMING: the hook owns no events, whatever TORCH_NCCL_ENABLE_TIMING says

    # --- entries --------------------------------------------------------------------------------------------------

    def _base(self, group: Group, name: str, sizes: list[list[int]], state: str, is_p2p: bool) -> dict[str, Any]:
        entry = super()._base(group, name, sizes, state, is_p2p)
        entry["p2p_seq_id"] = self._p2p.get(group.name, 0)  # L-COLL: the group's current p2p count
        entry["collective_seq_id"] = self._coll.get(group.name, 0)  # L-P2P: the group's current collective count
        if self.lib == "nccl2":
            entry["op_id"] -= 1  # H-SEQ: ProcessGroup::hookOpIdCounter_ counts from 0
        return entry

    def _track(self, group: Group, number: int, entry: dict[str, Any]) -> None:
        self.works.setdefault(group.name, []).append(_Work(number, entry))

    def collective(
        self, group: Group, op: str = "all_reduce", sizes: Any = ((4,),), state: str = "completed", out: Any = None
    ) -> int:
        """``L-COLL`` / ``H-SEQ``: one collective; returns its collective number."""
        number = super().collective(group, op, sizes, state, out)
        entry = self.entries[-1]
        self._track(group, entry["op_id"] if self.lib == "nccl2" else number, entry)
        return number

    def _plain(self, group: Group, name: str, state: str) -> int:
        """``L-P2P`` / ``H-SEQ``: one send or recv outside a batch; returns its p2p number."""
        number = super()._plain(group, name, state)
        entry = self.entries[-1]
        entry["collective_seq_id"] = self._coll.get(group.name, 0)
        self._track(group, entry["op_id"] if self.lib == "nccl2" else number, entry)
        return number

    def _member(self, group: Group, name: str, is_p2p: bool, sizes: list[list[int]]) -> dict[str, Any]:
        """``L-COAL-MEMBERS``: an op inside a batch, recorded with no events: scheduled and unretired for ever."""
        entry = self._base(group, name, sizes, "scheduled", is_p2p)
        self.entries.append(entry)
        return entry

    def _closer(self, group: Group, state: str, number: int, title: str = "coalesced") -> dict[str, Any]:
        """``L-COAL-CLOSE``: the batch's closing entry: empty sizes, ``is_p2p`` False, the last member's ``op_id``."""
        last_op = self._op_id[group.name]
        entry = self._base(group, title, [], state, False)
        self._op_id[group.name] = last_op  # endCoalescing does not bump op_id_
        entry["op_id"] = last_op
        self.entries.append(entry)
        self._track(group, number, entry)
        return entry

    def batch(self, group: Group, ops: list[tuple[str, int]], state: str = "completed") -> int:
        """A ``batch_isend_irecv`` of ``[("send"|"recv", global peer), ...]``; returns its p2p number (NCCL2: the last
        op's). Legacy: ``L-COAL-MEMBERS`` then ``L-COAL-CLOSE`` with ``state``; NCCL2: ``H-BATCH-DONE``, every op
        completed when queued, whatever ``state`` the batch really reached, and no closer (``H-NO-CLOSE``)."""
        if not ops:  # L-COAL-EMPTY: endCoalescing with no op records nothing
            return self._p2p.get(group.name, 0)
        if self.lib == "nccl2":
            for kind, peer in ops:
                (self.send if kind == "send" else self.recv)(group, peer, "completed")
                entry = self.entries[-1]
                self.clock.unsettled.remove(entry)  # CompletedWork: retired at once, not when the batch ends
                entry["time_discovered_completed_ns"] = entry["time_created_ns"]
            return self._p2p[group.name]
        self._p2p[group.name] = self._p2p.get(group.name, 0) + 1  # once per batch, at its first p2p op
        me = group.group_rank(self.rank)
        for kind, peer in ops:
            arrow = "->" if kind == "send" else "<-"
            self._member(group, f"{kind} {me}{arrow}{group.group_rank(peer)}", True, [[4]])
        self._closer(group, state, self._p2p[group.name])  # a p2p batch's work has the p2p number as seq_
        return self._p2p[group.name]

    def coalesced(self, group: Group, ops: list[str], state: str = "completed") -> int:
        """``L-COAL-MEMBERS`` / ``L-COAL-CLOSE``: collectives issued through C++ inside a coalescing window (the slow
        path: broadcasts, ...); returns the batch's collective number. NCCL2 records each as its own collective."""
        if self.lib == "nccl2":
            for op in ops:
                self.collective(group, op, state=state)
            return self._coll[group.name]
        self._coll[group.name] = self._coll.get(group.name, 0) + 1  # once, at the batch's first collective
        for op in ops:
            self._member(group, op, False, [[4]])
        self._closer(group, state, self._coll[group.name])
        return self._coll[group.name]

    def fast_coalesced(
        self, group: Group, sizes: list[list[int]], *, device: bool = True, state: str = "completed"
    ) -> int:
        """``L-COAL-FAST``: ``_coalescing_manager`` over ``all_reduce``s: one ``allreduce_coalesced`` entry with every
        tensor's sizes; with a device, a ``coalesced`` closer with its numbers. NCCL2 (``H-NAMES``): the one entry."""
        number = self.collective(group, "allreduce_coalesced", sizes=[tuple(s) for s in sizes], state=state)
        if device and self.lib != "nccl2":
            self.works[group.name].pop()  # the closer is the work the watchdog judges
            self._closer(group, state, number)
        return number

    # --- the dump -------------------------------------------------------------------------------------------------

    def _status(self, group: Group) -> dict[str, int]:
        """``L-PG-STATUS`` / ``H-PG-STATUS``: the last enqueued, started and completed work numbers of ``group``."""
        if self.lib == "nccl2":  # every recorded op is enqueued, batch members included
            mine = [e for e in self.entries if e["process_group"][0] == group.name]
            done = [e["op_id"] for e in mine if e["state"] == "completed"]
            return {
                "last_enqueued_collective": mine[-1]["op_id"],
                "last_started_collective": -1,
                "last_completed_collective": done[-1] if done else -1,
            }
        works = self.works[group.name]
        done = [w.number for w in works if w.entry["state"] == "completed"]
        started = [w.number for w in works if w.entry["state"] in ("started", "completed")]
        last_started = -1 if not self.timing or not started else max(started)  # lastStartedSeq < seq_: only upward
        return {
            "last_enqueued_collective": works[-1].number,
            "last_started_collective": last_started,
            "last_completed_collective": done[-1] if done else -1,
        }

    def dump(self, buffer: int | None = None) -> dict[str, Any]:
        """The pickle's contents (``C-KEYS``): the newest ``buffer`` entries (``C-RING``), less the completed ones in
        an only-active dump (``C-ONLY-ACTIVE``); ``pg_status`` for the groups that recorded (``C-PG-STATUS``)."""
        self.clock.settle()
        if self.lib == "nccl2":  # H-STATE: retire_completed sets both times to the moment completion was seen
            for entry in self.entries:
                entry["time_discovered_started_ns"] = entry["time_discovered_completed_ns"]
        entries = self.entries if buffer is None else self.entries[-buffer:]
        if self.only_active:
            entries = [e for e in entries if e["time_discovered_completed_ns"] is None]
        recorded = [g for g in self.groups if g.name in self.works or self._has_entries(g)]
        return {
            "version": VERSION,
            "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))} for g in self.groups},
            "comm_lib_version": "2.27.5",
            "pg_status": {str(self._pg_id(g)): self._status(g) for g in recorded},
            "entries": entries,
        }

    def _has_entries(self, group: Group) -> bool:
        return any(e["process_group"][0] == group.name for e in self.entries)
