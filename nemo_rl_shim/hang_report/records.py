"""What the hang report reads out of one rank's dump: typed records, as torch's ``flight_recorder/types.py`` keeps
its own apart from its loader.

:class:`Entry` is one op of one rank, with where it was called (the innermost user frame of torch's
``frames``); :class:`RankDump` one rank's dump, reduced to what the analysis needs; :class:`Recorder` what one
Flight Recorder instance of that rank says of itself (torch keeps one per backend: Gloo's, stock NCCL's, and one
per hooked backend such as torch 2.15's ``nccl2``). A group is keyed by
:data:`GroupKey`, its name and the recorder that numbered its ops (``("0", "gloo")``, ``("0", "nccl")``): the
two halves of a ``cpu:gloo,cuda:nccl`` group are numbered apart. :class:`DumpError` is the one line for input
that cannot be read. :class:`GroupFacts` is a process group as one dump knows it: its members as a record lists them
(``stated``), or, where no record does, only the rank that wrote the dump. :class:`RunEvidence` (with a
:class:`GroupMarks` per group) is what a dump says of the run it belongs to, for :mod:`.run_evidence` to tell runs
apart.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.frames import Frame

__all__ = [
    "DumpError",
    "Entry",
    "GroupFacts",
    "GroupKey",
    "GroupMarks",
    "P2PKey",
    "RankDump",
    "Recorder",
    "RunEvidence",
]

#: A process group as the entries name it, with the recorder (comm library) that numbered its ops.
GroupKey = tuple[str, str]
#: A rank's point-to-point ops of one kind toward one peer (its rank in the group) in one group.
P2PKey = tuple[GroupKey, str, "int | None"]
_DONE = "completed"


class DumpError(ValueError):
    """A folder or file that cannot be read as rank dumps; the message is the one line to print."""


@dataclass(slots=True)
class Entry:
    """One collective or point-to-point op of one rank, as the analysis needs it."""

    group: str
    seq: int  # collective_seq_id; for p2p, p2p_seq_id
    op: str  # "all_reduce", "send", "recv", "coalesced", ...
    sizes: str  # input sizes as text
    state: str  # "scheduled", "started", "completed"
    created_ns: int
    completed_ns: int | None
    timeout_ms: int | None
    pg_id: str
    is_p2p: bool = False
    peer: int | None = None  # p2p: the peer's rank in the group, as torch names it ("send 1->0": 0)
    me: int | None = None  # p2p: the writer's own rank in the group, as torch names it ("send 1->0": 1)
    batched: bool = False  # p2p: one op of a batch_isend_irecv (its state is its coalesced entry's)
    lib: str = ""  # the recorder: the comm library in profiling_name ("nccl", "nccl2", "gloo")
    ordinal: int = 0  # p2p: its place among this rank's ops of its kind toward its peer in the buffer (1: oldest)
    where: Frame | None = None  # where it was called: the innermost user frame of the entry's ``frames``
    p2p_seq: int = 0  # p2p_seq_id as torch wrote it (a collective's: the group's p2p count then, L-COLL)

    @property
    def done(self) -> bool:
        """Whether the entry itself says it finished: its state, or a completion time."""
        return self.state == _DONE or self.completed_ns is not None

    @property
    def key(self) -> GroupKey:
        return (self.group, self.lib)


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """One process group as one rank's dump knows it.

    ``stated``: a record lists its members (the shim's group map, in the dump or its sidecar; torch's ``pg_config``),
    and ``ranks`` are those, in group-rank order. Otherwise the group is known only from this rank's entries, and
    ``ranks`` is this rank alone: a member that recorded nothing of the group cannot be seen, so such a group is never
    reported as agreeing.
    """

    ranks: Sequence[int]  # a range where they step evenly (compared at once), else a tuple
    stated: bool
    axes: tuple[str, ...] = ()
    desc: str = ""


@dataclass(frozen=True, slots=True)
class Recorder:
    """One recorder's buffer in a dump: how far back it reaches, and whether it marks entries completed."""

    wrapped: bool  # its oldest entry is not its first (record_id > 0): older ones were overwritten
    oldest_ns: int | None  # its oldest entry's creation time
    # whether its "completed" is evidence that an op finished: NCCL's (stock and torch 2.15's hook) marks an entry
    # completed only once the op finished; Gloo's never is: it leaves every entry 'scheduled', and retires a
    # collective that timed out, and counts it in pg_status's last_completed_collective, as one that finished
    tracks_completion: bool


@dataclass(frozen=True, slots=True)
class GroupMarks:
    """What one dump says of one group's collectives (as one recorder numbered them), for telling runs apart."""

    ranks: Sequence[int]  # the group's members, as this dump's record lists them
    first: tuple[int, int] | None  # (number, time created) of its first record, where the buffer never wrapped
    done: tuple[int, int] | None  # (number, time completed) of a late collective every member's input goes into


@dataclass(frozen=True, slots=True)
class RunEvidence:
    """What a dump says of its run (see :mod:`.run_evidence`): versions, the world it states, its time range, its
    groups' collective marks."""

    version: str  # torch's dump format ("2.10"), "" where it is not written
    comm_lib: str  # the comm library's version torch records (NCCL's "2.27.5"), "" where it is not written
    world: int | None  # the world it states (its default group's size, or the shim's world_size)
    start_ns: int | None  # its oldest entry's creation
    end_ns: int | None  # its newest time: an entry's, or the dump's own
    until_ns: int | None  # as late as it may have been dumped: ``end_ns``, or an unfinished entry's creation + timeout
    groups: dict[tuple[str, str, Sequence[int]], GroupMarks]  # (name, recorder, members) -> marks
    only_active: bool  # no entry completed: TORCH_INCLUDE_ONLY_ACTIVE=1 may have dropped those that did
    timeout_ms: int | None = None  # the longest timeout among its newest entries


@dataclass
class RankDump:
    """One rank's dump, reduced: groups, the last collective per group, signatures, unfinished p2p ops."""

    rank: int
    path: Path
    version: str
    n_entries: int
    groups: dict[str, GroupFacts]  # group name -> its members, from every record (or from its entries alone)
    last: dict[GroupKey, Entry]  # the collective with the highest sequence number
    signatures: dict[GroupKey, tuple[array.array, array.array]]  # (numbers, signature ids)
    sig_table: list[tuple[str, str]]  # signature id -> (profiling name, sizes text)
    pending_p2p: list[Entry]
    p2p_last: dict[P2PKey, Entry]  # the newest such op
    p2p_count: dict[P2PKey, int]  # how many such ops the buffer holds
    latest: Entry | None  # the newest entry: what the rank was in, or did last, when it dumped
    recorders: dict[str, Recorder]  # lib -> its buffer's facts
    # where the group's last collectives were called (seq -> innermost user frame, None where the entry has none):
    # the last one always, and those among the dump's newest entries (dump_format.CALLS_KEPT per group at most)
    calls: dict[GroupKey, dict[int, Frame | None]] = field(default_factory=dict)
    pg_status: dict[str, Any] = field(default_factory=dict)
    world_size: int | None = None  # as the shim's dump or sidecar states it
    default_ranks: tuple[int, ...] | range | None = None  # the default group's members, as a record lists them
    reason: str | None = None
    dump_time_ns: int | None = None
    writer: str = "torch"
    backend: str = ""  # "nccl", "gloo", ... from the op names
    # a window of the newest entries (the quick read): they reach back only to this time, whatever the recorder
    window_oldest_ns: int | None = None
    world_size_from: Path | None = None  # the file ``world_size`` came from: the dump, or its group map
    comm_lib_version: str = ""
    fingerprint: tuple[int, int] | None = None  # (size, CRC-32) of the file's bytes (:mod:`.file_identity`)
    evidence: RunEvidence | None = None  # what it says of its run (:mod:`.run_evidence`)
    # per group, collective numbers missing between its first and last in the buffer (:mod:`.recording_rules`),
    # and (first, last) number
    gaps: dict[GroupKey, tuple[int, ...]] = field(default_factory=dict)
    spans: dict[GroupKey, tuple[int, int]] = field(default_factory=dict)
    p2p_logged: bool = False  # the dump carries the shim's log of Gloo's sends and receives (:mod:`.shim_p2p`)

    def recorder(self, lib: str) -> Recorder:
        """``lib``'s buffer facts; a recorder with no entry here reaches back to nothing and tracks nothing (in a
        window of the newest entries, it reaches back to the window's oldest: its older entries were not read)."""
        found = self.recorders.get(lib)
        if found is not None:
            return found
        if self.window_oldest_ns is not None:
            return Recorder(wrapped=True, oldest_ns=self.window_oldest_ns, tracks_completion=False)
        return Recorder(wrapped=False, oldest_ns=None, tracks_completion=False)

    def finished(self, entry: Entry) -> bool:
        """Whether ``entry`` is known to have finished: it says so, and its recorder's word is evidence."""
        return entry.done and self.recorder(entry.lib).tracks_completion

    @property
    def wrapped(self) -> bool:
        """Whether any of its recorders' buffers wrapped."""
        return any(r.wrapped for r in self.recorders.values())

    @property
    def tracks_completion(self) -> bool:
        return any(r.tracks_completion for r in self.recorders.values())
