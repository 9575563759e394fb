"""Who did not join: every process group across the ranks' dumps, from each entry's own state.

Pure functions of :class:`~nemo_rl_shim.hang_report.records.RankDump` s (none is changed: the analysis
keeps copies without the signatures it merged), nothing here touches torch.distributed. Per process group,
keyed by the name torch gives it in every entry and the recorder that numbered its ops (the Gloo and the NCCL
half of a ``cpu:gloo,cuda:nccl`` group count apart):

* **Members.** A group's members come only from records that list them (torch's ``pg_config``, the shim's group
  maps); the default group's are the world's (:mod:`.world`). Records that disagree on a group, or a rank whose
  entries place it in a group that a record lists without it, are refused. A group no record lists is known only
  by the ranks whose entries name it (``GroupState.members_stated`` is false): its label says ``seen ranks``, and
  it is never reported as agreeing.
* **Collectives.** The highest sequence number a member entered is the collective the group is in.
  A member whose last number is lower did not enter it (a stall). Where the entries say whether
  they finished (NCCL's ``state``: stock NCCL's and torch 2.15's hook's), a member that entered but did not
  finish while others did, or a collective that every member entered and none finished, is unfinished.
* **Evidence.** Only a recorder that tracks completion says an op finished (:meth:`.records.RankDump.finished`):
  Gloo's leaves every entry ``scheduled``, and retires a collective that timed out (and counts it in ``pg_status``)
  like one that finished. A group whose last collective no member is known to have finished is *unconfirmed*:
  never "every rank agrees". ``pg_status`` never overrides an entry (NCCL counts p2p work in the same
  ``last_completed_collective``, Gloo counts timed-out work): it is kept as a hint; it is evidence only for an entry
  an only-active dump dropped, on a group with no p2p work (:mod:`.recorder_evidence`, ``L-PG-STATUS``).
* **What a recorder cannot show** (:mod:`.recorder_evidence`, :mod:`.coalesced`). A batch is judged by its closer;
  an op an only-active dump may have dropped, a hung NCCL2 batch, dumps emptied by only-active, an unfinished p2p op
  no rule explains: "cannot tell" (``hidden``), no rank named, never "every rank agrees".
* **Wraparound.** A ring buffer keeps the newest entries, so a rank that recorded any op of a group
  has its last one. A rank with none, whose buffer (that recorder's) wrapped and whose oldest entry is newer
  than the collective, cannot say whether it entered: it is *out of reach*, never *behind*.
* **Point-to-point** (:func:`peer_posted`, the one rule). Sends and receives between two ranks of a group
  meet in order: an unfinished op that is this rank's k-th of its kind toward a peer is met by the peer's
  k-th opposite op. Where neither buffer wrapped the counts are exact, whatever the states say (a batch's
  ``started`` state may come from its other half; torch 2.15's hook writes a batch's ops apart, without a
  ``coalesced`` entry). Where one wrapped, the peer's newest opposite op decides: still waiting, or finished
  after this op was posted, and the peer did its side; none, and its buffer still reaching back, and it did
  not; none, and its buffer not reaching back that far, and nobody is blamed.
* **Mismatch.** At one sequence number, the odd one out by op or sizes; a tie names every rank.
* **Gaps.** A rank's buffer that lacks a collective number between its group's first and last kept, where another
  member's buffer holds that number or none spans it, is not the whole record torch keeps
  (:mod:`.recording_rules`: torch records every collective it numbers; a number it burns, it burns on every rank):
  what follows from that buffer cannot be told (``gap``), never "every rank agrees".
* **Order of blame.** A mismatch first (what follows may be its consequence), then a rank with no
  dump, then the ranks that others wait on and that wait on no one, then their waiting peers; then what cannot be
  told: a world no record states (ranks above the highest dump may be missing), a collective not known to have
  finished.
* **Where.** Each finding keeps where its ranks called the op (``Finding.called_at``: the innermost user frame of
  the entry's ``frames``): where the waiting peers called the collective, or the point-to-point op, they wait in;
  for a mismatch, where every rank at that number called it. A mismatch whose odd ranks called the op from
  another place than all the others is not one call with other sizes: one side skipped a collective, or made an
  extra one (the line says both places); where the places agree, or are not all known, it says none.
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.dump_format import pg_status_of
from nemo_rl_shim.hang_report.frames import Frame, by_place, same_place
from nemo_rl_shim.hang_report.recorder_evidence import (
    FINISHED,
    UNPOSTED,
    absent_op,
    dropped_everything,
    may_have_dropped,
    nccl2_p2p_groups,
)
from nemo_rl_shim.hang_report.recording_rules import unexplained
from nemo_rl_shim.hang_report.records import DumpError, Entry, GroupKey, RankDump
from nemo_rl_shim.hang_report.shim_p2p import LIB as LOGGED_LIB
from nemo_rl_shim.hang_report.shim_p2p import posted as logged_posted
from nemo_rl_shim.hang_report.world import GIVE_THE_WORLD, World, world_of
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = [
    "CANNOT_TELL",
    "HIDDEN",
    "PLACES_SHOWN",
    "Analysis",
    "Finding",
    "GroupState",
    "analyse",
    "axis_of",
    "peer_posted",
    "pg_status_counts_done",
]

#: Ops whose input sizes must agree on every rank (gather, scatter, all_to_all and p2p may differ).
_SAME_SIZES = ("all_reduce", "allreduce", "broadcast", "reduce", "allgather", "all_gather", "reduce_scatter", "barrier")
_PRIORITY = {
    "mismatch": 0,
    "missing": 1,
    "stall": 2,
    "p2p": 2,
    "not finished": 3,
    "unclear": 4,
    "gap": 5,
    "hidden": 5,
    "world unknown": 5,
    "unconfirmed": 6,
    "unproved run": 7,
    "several runs": 7,
}
#: Kinds that say what cannot be told, not what went wrong.
CANNOT_TELL = ("gap", "hidden", "world unknown", "unconfirmed", "unproved run", "several runs")
#: What the recorder cannot show (:mod:`.recorder_evidence`): an only-active dump's absences, NCCL2's p2p.
HIDDEN = "hidden"
_OPPOSITE = {"send": "recv", "recv": "send"}
_PAIR = "send/recv"  # the op of a finding on a send and its receive
#: Places named on a line where ranks called the op from several (by group of ranks at one place, the fewest first).
PLACES_SHOWN = 2


def axis_of(desc: str) -> str | None:
    """The mesh axis torch's group description names: ``mesh_tp`` -> ``tp``, ``default_pg`` -> ``default``."""
    if desc == "default_pg":
        return "default"
    if desc.startswith("mesh_"):
        return desc[len("mesh_") :]
    return desc if desc and desc not in ("undefined", "unknown") else None


@dataclass
class GroupState:
    """One process group, as one recorder numbered its ops, across the ranks that dumped: who is at which
    collective."""

    name: str
    ranks: Sequence[int]  # members, in group-rank order where torch or the shim gave it (a tuple once merged)
    axes: list[str]
    desc: str = ""
    backend: str = ""  # the recorder (comm library) that numbered its ops: "nccl", "gloo", "nccl2"; "" for none
    halves: bool = False  # other recorders number ops of the same group (a cpu:gloo,cuda:nccl group): label says
    members_stated: bool = True  # a record lists its members (else: only the ranks whose entries name it)
    last: dict[int, int] = field(default_factory=dict)  # rank -> last collective number entered (0: none)
    entries: dict[int, Entry] = field(default_factory=dict)  # rank -> that collective's entry
    missing: list[int] = field(default_factory=list)  # members without a dump
    out_of_reach: list[int] = field(default_factory=list)  # silent ranks whose buffer does not reach back
    # (numbers, signature ids) as bytes -> [numbers, ids, ranks]: ranks with the same history share one
    variants: dict[bytes, list[Any]] = field(default_factory=dict)

    @property
    def key(self) -> GroupKey:
        return (self.name, self.backend)

    @property
    def label(self) -> str:
        """``"dp_shard (also dp), ranks 0-7"``: the mesh axes first, the process-group name if none; the recorder
        where the group has several (``"default, ranks 0-3 (its gloo half)"``)."""
        axes = self.axes or [f"process group {self.name}"]
        more = f", +{len(axes) - 3} more" if len(axes) > 3 else ""
        also = f" (also {', '.join(axes[1:3])}{more})" if len(axes) > 1 else ""
        half = f" (its {self.backend} half)" if self.halves else ""
        seen = "" if self.members_stated else "seen "
        return f"{axes[0]}{also}, {seen}ranks {format_ranks(self.ranks)}{half}"

    @property
    def kind(self) -> str:
        """What groups of the same shape share: the first axis, or ``process group`` when torch names none."""
        return self.axes[0] if self.axes else "process group"

    def group_rank(self, rank: int) -> int | None:
        return self.ranks.index(rank) if rank in self.ranks else None

    def global_rank(self, group_rank: int | None) -> int | None:
        return self.ranks[group_rank] if group_rank is not None and 0 <= group_rank < len(self.ranks) else None


@dataclass
class Finding:
    """A stall, an unfinished collective or p2p op, a missing dump or a mismatch, on one group."""

    # "stall", "not finished", "missing", "mismatch", "p2p", "unclear" (someone waits; no buffer tells who);
    # what cannot be told: "world unknown" (no record states it), "unconfirmed" (no member known to have finished)
    kind: str
    group: GroupState
    ranks: list[int]  # the ranks named: the laggards, the missing, those that differ, or the peer that did not act
    seq: int
    op: str
    waiting: list[int]
    waited_s: float | None
    created_ns: int
    detail: str = ""
    called_at: dict[int, Frame | None] = field(default_factory=dict)  # rank -> where it called the op (see module)

    def waited_at(self) -> str:
        """`` at /job/train.py:42 in step``: where the waiting ranks called the op they wait in (by place where they
        called it from several: `` at X (rank 2), Y (ranks 0-1)``); empty where no frame tells."""
        places = _at(by_place(self.waiting, self.called_at), len(self.waiting))
        return f" at {places}" if places else ""

    def called_from(self) -> str:
        """A mismatch's ``; called from X where ranks 0-2 called from Y``: said only where every rank's place is
        known and the odd ranks' places are all other than the rest's (a tie: where the ranks called from more
        than one place)."""
        others = [r for r in sorted(self.called_at) if r not in self.ranks]
        if self.kind != "mismatch" or any(self.called_at.get(r) is None for r in [*self.ranks, *others]):
            return ""
        odd = by_place(self.ranks, self.called_at)
        if not others:
            return f"; called from {_places(odd)}" if len(odd) > 1 else ""
        rest = by_place(others, self.called_at)
        if any(same_place(a, b) for a, _ in odd for b, _ in rest):
            return ""
        return f"; called from {_places(odd)} where {_ranks(others)} called from {_places(rest)}"

    def line(self) -> str:
        """The one line that names the rank(s), and where the ranks waiting called the op."""
        who = f"rank{'s' * (len(self.ranks) > 1)} {format_ranks(self.ranks)}"
        waiters = f"rank{'s' * (len(self.waiting) > 1)} {format_ranks(self.waiting)}" if self.waiting else ""
        waited = f" waited {self.waited_s:.1f} s" if self.waited_s is not None else " waited"
        where = f"{self.op} #{self.seq} on {self.group.label}"
        if self.kind == "stall":
            return f"{who} did not enter {where}, in which {waiters}{waited}{self.waited_at()}"
        if self.kind == "p2p":
            places = _at(by_place(self.waiting, self.called_at), len(self.waiting))
            return f"{who} {self.detail} on {self.group.label}" + (f"; waiting at {places}" if places else "")
        if self.kind in ("unclear", "world unknown", "gap", "hidden", "unproved run", "several runs"):
            return self.detail
        if self.kind == "unconfirmed":
            return f"cannot tell whether {who} finished {where}: {self.detail}"
        if self.kind == "not finished" and self.op == _PAIR:
            return f"{who} did not finish {self.detail} on {self.group.label}"
        if self.kind == "not finished" and not self.waiting:
            took = f" (running {self.waited_s:.1f} s when dumped)" if self.waited_s is not None else ""
            return f"{who} did not finish {where}: every member entered it, none finished{took}"
        if self.kind == "not finished":
            return f"{who} did not finish {where}, which {waiters} finished"
        if self.kind == "missing":
            if not self.waiting:
                return f"no dump from {who}: {self.detail}"
            return (
                f"no dump from {who}: {waiters} {'were' if len(self.waiting) > 1 else 'was'} last in {where}"
                + (f" ({waited.strip()})" if self.waited_s is not None else "")
                + self.waited_at()
            )
        if " where " in self.detail:  # the odd ones out
            verb = "differs" if len(self.ranks) == 1 else "differ"
            return f"{who} {verb} on {where}: {self.detail}{self.called_from()}"
        return f"{who} disagree on {where}: {self.detail}{self.called_from()}"


def _places(groups: list[tuple[Frame, list[int]]]) -> str:
    """One place as ``/job/train.py:42 in step``; several with their ranks, up to :data:`PLACES_SHOWN`."""
    if len(groups) == 1:
        return groups[0][0].where
    shown = ", ".join(f"{place.where} ({_ranks(ranks)})" for place, ranks in groups[:PLACES_SHOWN])
    return shown + (f", +{len(groups) - PLACES_SHOWN} more places" if len(groups) > PLACES_SHOWN else "")


def _at(groups: list[tuple[Frame, list[int]]], of: int) -> str:
    """The places of ``groups``, where they hold ``of`` ranks in all; with the ranks, where they do not."""
    if len(groups) == 1 and len(groups[0][1]) != of:
        place, ranks = groups[0]
        return f"{place.where} ({_ranks(ranks)})"
    return _places(groups) if groups else ""


@dataclass
class Analysis:
    """Findings (first: the one to act on), every group, the ranks without a dump, and the dumps themselves."""

    findings: list[Finding]
    groups: list[GroupState]
    missing: list[int]
    dumps: dict[int, RankDump]
    world_size: int
    world: World | None = None  # where the world size comes from


def pg_status_counts_done(dump: RankDump, entry: Entry) -> bool | None:
    """What torch's ``pg_status`` says of ``entry``'s group: counted as completed (a hint only: NCCL counts p2p
    work in it, Gloo counts a timed-out collective); None where the dump has no status for the group."""
    status = pg_status_of(dump, entry)
    if not isinstance(status, dict) or not isinstance(status.get("last_completed_collective"), int):
        return None
    return int(status["last_completed_collective"]) >= entry.seq


# --- merging the dumps, one at a time ------------------------------------------------------------------------------


class _Signatures:
    """Every distinct (profiling name, sizes) across the dumps, numbered once."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str], int] = {}
        self.table: list[tuple[str, str]] = []
        self._seen: dict[tuple[tuple[str, str], ...], list[int]] = {}

    def global_ids(self, local: list[tuple[str, str]]) -> list[int]:
        key = tuple(local)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = [self._id(sig) for sig in local]
        return found

    def _id(self, sig: tuple[str, str]) -> int:
        if sig not in self.ids:
            self.ids[sig] = len(self.table)
            self.table.append(sig)
        return self.ids[sig]


@dataclass
class _Members:
    """A group name's members, axes and description, merged across the dumps (whichever recorder numbered it): as the
    first record that lists them gives them (``stated``, in ``stated_in``), and the ranks whose entries name it where
    their own records do not list it (``seen``: a set, so that merging many dumps stays linear)."""

    stated: Sequence[int] | None = None
    stated_in: Path | None = None
    seen: set[int] = field(default_factory=set)
    axes: list[str] = field(default_factory=list)
    desc: str = ""


def _merge_members(members: dict[str, _Members], dump: RankDump) -> None:
    for name, facts in dump.groups.items():
        known = members.get(name)
        if known is None:
            known = members[name] = _Members(desc=facts.desc)
        if not facts.stated:
            known.seen.add(dump.rank)
        elif known.stated is None:
            known.stated, known.stated_in = facts.ranks, dump.path
        elif facts.ranks is not known.stated and facts.ranks != known.stated and set(facts.ranks) != set(known.stated):
            raise DumpError(
                f"the dumps disagree on process group {name!r}: {shown_path(known.stated_in or '?')} lists ranks "
                f"{format_ranks(known.stated)}, {shown_path(dump.path)} lists ranks {format_ranks(facts.ranks)}"
            )
        for axis in facts.axes:
            if axis not in known.axes:
                known.axes.append(axis)
        known.desc = known.desc or facts.desc


def _members_of(name: str, known: _Members, dumps: dict[int, RankDump], world: World) -> tuple[Sequence[int], bool]:
    """A group's members and whether a record states them: the world's for the default group (where known), a
    record's, or the ranks seen; a rank seen in a group a record lists without it is refused."""
    if known.desc == "default_pg" and world.known:
        stated: Sequence[int] | None = range(world.size)  # torch's default group is the world
    else:
        stated = known.stated
    if stated is None:
        return tuple(sorted(known.seen)), False
    inside = stated if isinstance(stated, range) else set(stated)
    outside = [r for r in known.seen if r not in inside]
    if outside:
        rank = min(outside)
        where = shown_path(known.stated_in) if known.stated_in else "the world"
        raise DumpError(
            f"{shown_path(dumps[rank].path)}: its entries place rank {rank} in process group {name!r}, which "
            f"{where} lists as ranks {format_ranks(stated)}"
        )
    return stated, True


def _merge(found: dict[GroupKey, GroupState], dump: RankDump, sigs: _Signatures) -> None:
    """One dump's collectives and signatures into the groups, by name and recorder (``dump`` is not changed)."""
    mapping = sigs.global_ids(dump.sig_table)
    identity = mapping == list(range(len(mapping)))
    for key in {*dump.last, *dump.signatures, *(k[0] for k in dump.p2p_count)}:
        found.setdefault(key, GroupState(key[0], (), [], backend=key[1]))
    for key, entry in dump.last.items():
        found[key].last[dump.rank] = entry.seq
        found[key].entries[dump.rank] = entry
    for key, (seqs, ids) in dump.signatures.items():
        if not identity:
            ids = array.array("q", [mapping[i] for i in ids])
        variants = found[key].variants
        variant = variants.setdefault(seqs.tobytes() + b"|" + ids.tobytes(), [seqs, ids, []])
        variant[2].append(dump.rank)


def _finish_groups(
    members: dict[str, _Members], found: dict[GroupKey, GroupState], dumps: dict[int, RankDump], world: World
) -> list[GroupState]:
    """Every group with its members; a group no recorder numbered any op of still shows (``backend`` "")."""
    named = {name for name, _ in found}
    for name in members:
        if name not in named:
            found[(name, "")] = GroupState(name, (), [])
    recorders: dict[str, int] = {}
    for name, _ in found:
        recorders[name] = recorders.get(name, 0) + 1
    resolved: dict[str, tuple[tuple[int, ...], bool]] = {}
    for (name, _), state in found.items():
        known = members.get(name) or _Members()
        if name not in resolved:
            ranks, stated = _members_of(name, known, dumps, world)
            resolved[name] = (tuple(ranks), stated)
        state.ranks, state.members_stated = resolved[name]
        state.axes, state.desc, state.halves = list(known.axes), known.desc, recorders[name] > 1
        if not state.axes and (axis := axis_of(state.desc)):
            state.axes.append(axis)
        state.missing = [r for r in state.ranks if r not in dumps]
        for rank in state.ranks:
            if rank in dumps:
                state.last.setdefault(rank, 0)
    return sorted(found.values(), key=lambda s: (-len(s.ranks), s.ranks, s.name, s.backend))


# --- findings ------------------------------------------------------------------------------------------------------


def _show(sig: tuple[str, str]) -> tuple[str, str]:
    """A signature as ``(op, sizes)`` text: ``("nccl:broadcast", "[[4]]")`` -> ``("broadcast", "[[4]]")``."""
    name, sizes = sig
    ops = "+".join(part.partition(":")[2].partition(" ")[0] or part for part in name.split("+"))
    return ops, sizes


def _deviations(state: GroupState) -> dict[int, dict[int, list[int]]]:
    """``{seq: {signature id: ranks}}`` at the numbers where the ranks' histories disagree."""
    variants = list(state.variants.values())
    if len(variants) < 2:
        return {}
    reference: dict[int, int] = {}
    for seqs, ids, _ in variants:
        for seq, sig in zip(seqs, ids, strict=True):
            reference.setdefault(seq, sig)
    differing = {seq for seqs, ids, _ in variants for seq, sig in zip(seqs, ids, strict=True) if reference[seq] != sig}
    out: dict[int, dict[int, list[int]]] = {}
    for seqs, ids, ranks in variants:
        for seq, sig in zip(seqs, ids, strict=True):
            if seq in differing:
                out.setdefault(seq, {}).setdefault(sig, []).extend(ranks)
    return out


def _calls_at(dumps: dict[int, RankDump], state: GroupState, seq: int, ranks: Iterable[int]) -> dict[int, Frame | None]:
    """Where each of ``ranks`` called the group's collective ``seq`` (None where its dump does not keep it)."""
    return {r: dumps[r].calls.get(state.key, {}).get(seq) for r in ranks if r in dumps}


def _entries_at(state: GroupState, ranks: Iterable[int]) -> dict[int, Frame | None]:
    """Where each of ``ranks`` called the group's last collective it entered."""
    return {r: state.entries[r].where for r in ranks if r in state.entries}


def _mismatch(state: GroupState, table: list[tuple[str, str]], dumps: dict[int, RankDump]) -> Finding | None:
    deviations = _deviations(state)
    for seq in sorted(deviations):
        by_sig = {table[sig]: sorted(ranks) for sig, ranks in deviations[seq].items()}
        ops = {_show(sig)[0] for sig in by_sig}
        if len(ops) == 1 and not any(k in next(iter(ops)) for k in _SAME_SIZES):
            continue  # sizes may differ for this op
        what, pick = ("op", 0) if len(ops) > 1 else ("input sizes", 1)
        entry = next((state.entries[r] for r in state.ranks if r in state.entries), None)
        created = entry.created_ns if entry else 0
        counts = sorted((len(ranks), sig) for sig, ranks in by_sig.items())
        if counts[-1][0] > counts[-2][0]:  # a majority: name the odd ones out
            major = counts[-1][1]
            odd = sorted(r for sig, ranks in by_sig.items() if sig != major for r in ranks)
            shown = "; ".join(f"{_show(sig)[pick]} ({_ranks(rs)})" for sig, rs in by_sig.items() if sig != major)
            detail = f"{what} {shown} where ranks {format_ranks(by_sig[major])} have {_show(major)[pick]}"
            calls = _calls_at(dumps, state, seq, [*odd, *by_sig[major]])
            return Finding("mismatch", state, odd, seq, _show(major)[0], [], None, created, detail, calls)
        of_rank = {r: sig for sig, rs in by_sig.items() for r in rs}
        shown = "; ".join(f"rank {r}: {_show(of_rank[r])[pick]}" for r in sorted(of_rank))
        first_op = _show(of_rank[min(of_rank)])[0]
        calls = _calls_at(dumps, state, seq, of_rank)
        return Finding("mismatch", state, sorted(of_rank), seq, first_op, [], None, created, f"{what} {shown}", calls)
    return None


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def _waited(dumps: dict[int, RankDump], waiting: list[int], state: GroupState) -> float | None:
    waits = []
    for rank in waiting:
        entry = state.entries[rank]
        end = dumps[rank].dump_time_ns
        if end is not None:
            waits.append((end - entry.created_ns) / 1e9)
        elif not entry.done and entry.timeout_ms:  # torch's own dump, written on the timeout: at least that long
            waits.append(entry.timeout_ms / 1000)
    return max(waits) if waits else None


def _same_op(a: Entry | None, b: Entry | None) -> bool:
    return a is not None and b is not None and (a.key, a.seq, a.is_p2p) == (b.key, b.seq, b.is_p2p)


def _top(state: GroupState, dumps: dict[int, RankDump]) -> tuple[int, list[int]]:
    """The highest collective number a member with a dump entered, and who entered it."""
    present = [r for r in state.ranks if r in dumps]
    top = max((state.last.get(r, 0) for r in present), default=0)
    return top, [r for r in present if top and state.last.get(r, 0) == top]


def _out_of_reach(dumps: dict[int, RankDump], state: GroupState) -> list[int]:
    """Members with no entry of the group, whose recorder's wrapped buffer starts after the collective began
    elsewhere: they cannot say whether they entered it."""
    top, waiting = _top(state, dumps)
    if not top:
        return []
    began = min(state.entries[r].created_ns for r in waiting)
    silent = {r: dumps[r].recorder(state.backend) for r in state.ranks if r in dumps and state.last.get(r, 0) == 0}
    return [r for r, buffer in silent.items() if buffer.wrapped and (buffer.oldest_ns or 0) > began]


def _stall(dumps: dict[int, RankDump], state: GroupState) -> Finding | None:
    top, waiting = _top(state, dumps)
    if top == 0:
        return None
    entry = state.entries[waiting[0]]
    lower = [r for r in state.ranks if r in dumps and state.last.get(r, 0) < top and r not in state.out_of_reach]
    told = {r: absent_op(dumps[r], state.key, top) for r in lower}  # C-ONLY-ACTIVE, L-PG-STATUS
    behind = [r for r in lower if told[r] == UNPOSTED]
    created = entry.created_ns
    if behind:
        waited = _waited(dumps, waiting, state)
        return Finding("stall", state, behind, top, entry.op, waiting, waited, created, "", _entries_at(state, waiting))
    if any(told[r] is None for r in lower):
        return _hidden_stall(dumps, state, [r for r in lower if told[r] is None], waiting, top, entry)
    done = [r for r in waiting if dumps[r].finished(state.entries[r])] + [r for r in lower if told[r] == FINISHED]
    unfinished = [r for r in waiting if r not in done]
    tracking = [r for r in unfinished if dumps[r].recorder(state.backend).tracks_completion]
    if state.out_of_reach and not done:  # the silent ranks may well have entered it: their buffers do not reach back
        if tracking:
            detail = (
                f"{_ranks(tracking)} waited in {entry.op} #{top} on {state.label}, and the buffers of "
                f"{_ranks(state.out_of_reach)} do not reach back to it: cannot tell whether they entered it"
            )
            waited = _waited(dumps, tracking, state)
            return Finding("unclear", state, [], top, entry.op, tracking, waited, created, detail)
        return _unconfirmed(state, waiting, top, entry)
    if done and tracking:
        return Finding("not finished", state, tracking, top, entry.op, done, None, created)
    if not done and not state.missing and tracking:
        # every member entered it and none finished: a collective that hangs or runs past its timeout (on a
        # one-rank group, the only finding there can be)
        return Finding("not finished", state, unfinished, top, entry.op, [], _waited(dumps, waiting, state), created)
    latest = [r for r in waiting if _same_op(dumps[r].latest, state.entries[r])]
    if state.missing and (unfinished or latest):  # the others were still in it, or it was their last, when they dumped
        waited, calls = _waited(dumps, waiting, state), _entries_at(state, waiting)
        return Finding("missing", state, list(state.missing), top, entry.op, waiting, waited, created, "", calls)
    return _unconfirmed(state, waiting, top, entry) if not done else None


def _hidden_stall(
    dumps: dict[int, RankDump], state: GroupState, hidden: list[int], waiting: list[int], top: int, entry: Entry
) -> Finding:
    """``C-ONLY-ACTIVE``, ``L-PG-STATUS``: members whose only-active dumps lack the collective others are in, and
    whose ``pg_status`` cannot say whether they finished it or never posted it: cannot tell (no rank named)."""
    detail = (
        f"cannot tell whether {_ranks(hidden)} finished {entry.op} #{top} on {state.label} or never posted it, "
        f"which {_ranks(waiting)} {'is' if len(waiting) == 1 else 'are'} in: {'its' if len(hidden) == 1 else 'their'} "
        "only-active dumps (TORCH_INCLUDE_ONLY_ACTIVE=1) drop completed entries, and pg_status cannot say (p2p work "
        "counted in it, no entry of the group to find its row, or not legacy NCCL's)"
    )
    return Finding(HIDDEN, state, [], top, entry.op, waiting, _waited(dumps, waiting, state), entry.created_ns, detail)


def _unseen(dumps: dict[int, RankDump], groups: list[GroupState], world: World) -> list[Finding]:
    """What the recorders cannot show (:mod:`.recorder_evidence`): every dump empty while ``pg_status`` counts ops
    (``C-PG-STATUS``, ``H-ONLY-ACTIVE``); a group with NCCL2 p2p records (``H-BATCH-DONE``); an unfinished p2p op
    no other finding explains. Each is "cannot tell", never "every rank agrees"."""
    found: list[Finding] = []
    dropped = dropped_everything(dumps)
    if dropped is not None:
        rank, count = dropped
        detail = (
            f"cannot tell: the {len(dumps)} dumps hold no entry, yet rank {rank}'s pg_status counts ops up to "
            f"#{count}: only-active dumps (TORCH_INCLUDE_ONLY_ACTIVE=1) dropped every completed entry, and NCCL2 "
            "records a batch's send/recv completed when queued (H-BATCH-DONE): a hung op may leave nothing"
        )
        everyone = GroupState("", range(world.size), ["world"])
        found.append(Finding(HIDDEN, everyone, [], 0, "", [], None, 0, detail))
    by_key = {g.key: g for g in groups}
    for key, entry in nccl2_p2p_groups(dumps.values()).items():
        state = by_key.get(key)
        if state is not None:
            detail = (
                f"cannot tell whether the sends and receives on {state.label} finished: NCCL2 records a "
                "batch_isend_irecv's ops completed when queued and no closing record (H-BATCH-DONE, H-NO-CLOSE), "
                "so a hung batch does not show in the dumps"
            )
            found.append(Finding(HIDDEN, state, [], entry.seq, entry.op, [], None, entry.created_ns, detail))
    return found


def _unsettled(dumps: dict[int, RankDump], groups: list[GroupState], findings: list[Finding]) -> list[Finding]:
    """An unfinished send or recv on a group no finding names: never agreement (a ``started`` or unretired p2p op
    did not finish, ``C-STATE``); cannot tell who is to blame."""
    named = {f.group.key for f in findings}
    by_key = {g.key: g for g in groups}
    found: list[Finding] = []
    for rank in sorted(dumps):
        for op in dumps[rank].pending_p2p:
            state = by_key.get(op.key)
            if state is None or op.key in named:
                continue
            named.add(op.key)
            detail = (
                f"cannot tell why rank {rank}'s {op.op} #{op.seq} on {state.label} did not finish: it reads "
                f"{op.state}, and its peer's dump does not show the other side unfinished"
            )
            found.append(Finding(HIDDEN, state, [], op.seq, op.op, [rank], None, op.created_ns, detail))
    return found


def _unconfirmed(state: GroupState, waiting: list[int], top: int, entry: Entry) -> Finding:
    """No member is known to have finished the group's last collective: its recorder does not say."""
    if state.backend == "gloo":
        why = "Gloo's recorder does not say (it retires a collective that timed out as one that finished)"
    else:
        why = f"their {state.backend or 'own'} recorder marked no entry finished"
    return Finding("unconfirmed", state, list(waiting), top, entry.op, [], None, entry.created_ns, why)


def peer_posted(op: Entry, mine: RankDump, peer: RankDump, state: GroupState) -> bool | None:
    """Whether ``peer`` posted its side of ``mine``'s unfinished send or recv ``op`` (None: its buffer cannot tell).

    The one p2p rule (see the module docstring): exact counts where neither recorder's buffer wrapped; else the
    peer's newest opposite op toward ``mine``.
    """
    if mine.p2p_logged and op.lib == LOGGED_LIB:
        return logged_posted(op, state.group_rank(mine.rank), peer)  # S-P2P-MATCH: the shim's log of Gloo's p2p
    key = (op.key, _OPPOSITE[op.op], state.group_rank(mine.rank))
    theirs = peer.p2p_last.get(key)
    their_buffer = peer.recorder(op.lib)
    if (theirs is None or theirs.done) and may_have_dropped(peer, op.lib):
        return None  # C-ONLY-ACTIVE: the peer's side may have completed and been dropped
    if theirs is None:
        too_short = their_buffer.wrapped and (their_buffer.oldest_ns or 0) > op.created_ns
        return None if too_short else False
    if not (their_buffer.wrapped or mine.recorder(op.lib).wrapped):
        return peer.p2p_count[key] >= op.ordinal  # the k-th op toward a peer meets the peer's k-th: counted in full
    if not theirs.done:
        return True  # posted, and waiting too
    return theirs.completed_ns is not None and theirs.completed_ns >= op.created_ns


def _p2p(dumps: dict[int, RankDump], groups: dict[GroupKey, GroupState]) -> list[Finding]:
    """Per unfinished send or recv: the peer that did not post its side; a pair that both posted and neither
    finished; or, where the peer's buffer cannot tell, that nobody can be blamed."""
    blamed: dict[tuple[GroupKey, int], list[tuple[int, Entry]]] = {}
    findings: list[Finding] = []
    pairs: set[tuple[GroupKey, int, int]] = set()
    for rank, dump in dumps.items():
        for op in dump.pending_p2p:
            state = groups.get(op.key)
            peer = state.global_rank(op.peer) if state and op.op in _OPPOSITE else None
            if state is None or peer is None or peer not in dumps:
                continue  # a peer without a dump: the missing-dump finding names it
            posted = peer_posted(op, dump, dumps[peer], state)
            if posted is False:
                blamed.setdefault((op.key, peer), []).append((rank, op))
            elif posted is None and dump.p2p_logged and op.lib == LOGGED_LIB:
                findings.append(_unclear_p2p(rank, peer, op, state, unlogged=True))
            elif posted is None:
                findings.append(_unclear_p2p(rank, peer, op, state, dropped=may_have_dropped(dumps[peer], op.lib)))
            elif _both_waiting(op, dump, dumps[peer], state) and (op.key, *sorted((rank, peer))) not in pairs:
                pairs.add((op.key, *sorted((rank, peer))))
                findings.append(_pair_not_finished(rank, peer, op, state))
    for (key, culprit), waits in blamed.items():
        parts = []
        for rank, op in sorted(waits, key=lambda w: (w[0], w[1].op)):
            verb = "send to" if op.op == "recv" else "receive from"
            batch = " of a batch_isend_irecv" if op.batched else ""
            parts.append(f"did not {verb} rank {rank}, which waited in its {op.op} #{op.seq}{batch}")
        first = min(op.created_ns for _, op in waits)
        waiting = sorted({rank for rank, _ in waits})
        calls: dict[int, Frame | None] = {}
        for rank, op in sorted(waits, key=lambda w: (w[0], w[1].op)):
            calls.setdefault(rank, op.where)
        op = waits[0][1]
        kind = "send" if op.op == "recv" else "recv"
        detail = "; ".join(parts)
        findings.append(Finding("p2p", groups[key], [culprit], op.seq, kind, waiting, None, first, detail, calls))
    return findings


def _both_waiting(op: Entry, mine: RankDump, peer: RankDump, state: GroupState) -> bool:
    """The peer's newest opposite op toward ``mine`` is unfinished too, and both recorders mark completion."""
    theirs = peer.p2p_last.get((op.key, _OPPOSITE[op.op], state.group_rank(mine.rank)))
    tracked = mine.recorder(op.lib).tracks_completion and peer.recorder(op.lib).tracks_completion
    return theirs is not None and not theirs.done and tracked


def _pair_not_finished(rank: int, peer: int, op: Entry, state: GroupState) -> Finding:
    detail = f"the {op.op} #{op.seq} of rank {rank} and its match on rank {peer}: both posted, neither finished"
    return Finding("not finished", state, sorted((rank, peer)), op.seq, _PAIR, [], None, op.created_ns, detail)


def _unclear_p2p(
    rank: int, peer: int, op: Entry, state: GroupState, *, dropped: bool = False, unlogged: bool = False
) -> Finding:
    source = "sent" if op.op == "recv" else "received"
    if unlogged:  # S-P2P-MATCH: no log is no evidence (G-NO-P2P)
        why = f"rank {peer}'s dump carries no log of its sends and receives (Gloo's recorder writes none: G-NO-P2P)"
    elif dropped:
        why = f"rank {peer}'s only-active dump (TORCH_INCLUDE_ONLY_ACTIVE=1) drops completed entries (C-ONLY-ACTIVE)"
    else:
        why = f"rank {peer}'s buffer does not reach back to it"
    detail = (
        f"rank {rank} waited in its {op.op} #{op.seq} {'from' if op.op == 'recv' else 'to'} rank {peer} on "
        f"{state.label}, and {why}: cannot tell whether rank {peer} {source}"
    )
    if dropped:  # what the recorder cannot show, not a buffer too short: cannot tell, no rank named
        return Finding(HIDDEN, state, [], op.seq, op.op, [rank], None, op.created_ns, "cannot tell: " + detail)
    return Finding("unclear", state, [], op.seq, op.op, [rank], None, op.created_ns, detail)


def _gaps(dumps: dict[int, RankDump], state: GroupState) -> list[Finding]:
    """A member's buffer that lacks a collective number it should hold (see the module docstring): one finding for
    the group, naming its first such member."""
    for rank in state.ranks:
        dump = dumps.get(rank)
        gaps = dump.gaps.get(state.key) if dump is not None else None
        if not gaps:
            continue
        others = {
            m: (dumps[m].gaps.get(state.key, ()), dumps[m].spans.get(state.key))
            for m in state.ranks
            if m in dumps and m != rank
        }
        found = unexplained(rank, gaps, others)
        if found is None:
            continue
        number, holders, _ = found
        low, high = dump.spans[state.key]
        entry = state.entries.get(rank)
        op = entry.op if entry else "collective"
        if holders:
            why = f"which {_ranks(holders)} recorded"
        else:  # unexplained() gives a number no member holds only where no other buffer spans it
            why = "and no other member's buffer spans it, to tell whether torch skipped it on every rank"
        detail = (
            f"cannot tell what rank {rank}'s dump says of {state.label}: it holds #{low} to #{high} but not #{number}, "
            f"{why}; torch records every collective it numbers (a joined or edited file: {shown_path(dump.path)})"
        )
        return [Finding("gap", state, [rank], number, op, [], None, entry.created_ns if entry else 0, detail)]
    return []


def _world_missing(missing: list[int], groups: list[GroupState], world: World, dumps: dict[int, RankDump]) -> Finding:
    everyone = GroupState("", range(world.size), ["world"])
    known = {r for g in groups for r in g.missing}
    unplaced = [r for r in missing if r not in known]
    detail = f"ranks {format_ranks(dumps)} of {world.size} dumped ({world.source}); no group map places rank" + (
        f"{'s' * (len(unplaced) > 1)} {format_ranks(unplaced)}"
    )
    return Finding("missing", everyone, unplaced, 0, "", [], None, 0, detail)


def _world_unknown(world: World, dumps: dict[int, RankDump]) -> Finding:
    """No record states the world: the ranks above the highest dump may have left none."""
    everyone = GroupState("", range(world.size), ["world"], members_stated=False)
    detail = (
        f"cannot tell whether every rank dumped: no record states the world (torch's Gloo dumps list no default "
        f"group, and there is no group map), and ranks above {world.size - 1} may have left no dump (dumps from "
        f"{_ranks(list(dumps))}): {GIVE_THE_WORLD}"
    )
    return Finding("world unknown", everyone, [], 0, "", [], None, 0, detail)


def _order(findings: list[Finding]) -> list[Finding]:
    """Mismatch, missing dump, then culprits that wait on no one before those that wait (a cascade's victims)."""
    waiting = {r for f in findings for r in f.waiting}
    return sorted(
        findings,
        key=lambda f: (
            _PRIORITY[f.kind],
            all(r in waiting for r in f.ranks),
            -len(f.group.ranks) if f.kind == "unconfirmed" else 0,  # the widest group first
            f.created_ns,
        ),
    )


def analyse(dumps_in: Iterable[RankDump], world: int | None = None) -> Analysis:
    """Merge the dumps as they come and find who did not join. The dumps are not changed: the analysis keeps each
    without its signatures, which it merged. ``world``: the user's ``--world``. :class:`DumpError` where the dumps
    disagree on the world or a group's members."""
    found: dict[GroupKey, GroupState] = {}
    members: dict[str, _Members] = {}
    dumps: dict[int, RankDump] = {}
    sigs = _Signatures()
    for dump in dumps_in:
        _merge(found, dump, sigs)
        _merge_members(members, dump)
        dumps[dump.rank] = dataclasses.replace(dump, signatures={})  # merged: the per-rank copy is not kept
    the_world = world_of(dumps, given=world)
    groups = _finish_groups(members, found, dumps, the_world)
    for state in groups:
        state.out_of_reach = _out_of_reach(dumps, state)
    findings = [f for s in groups for f in (_mismatch(s, sigs.table, dumps), _stall(dumps, s)) if f is not None]
    findings += _p2p(dumps, {g.key: g for g in groups})
    findings += [f for s in groups for f in _gaps(dumps, s)]
    findings += _unseen(dumps, groups, the_world)
    findings += _unsettled(dumps, groups, findings)
    missing = [r for r in range(the_world.size) if r not in dumps]
    placed = {m for g in groups for m in g.missing}
    if any(r not in placed for r in missing):
        findings.append(_world_missing(missing, groups, the_world, dumps))
    if not the_world.known and dumps:
        findings.append(_world_unknown(the_world, dumps))
    return Analysis(_order(findings), groups, missing, dumps, the_world.size, the_world)
