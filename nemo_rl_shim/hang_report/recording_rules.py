"""What torch's recorder guarantees of one dump, checked, each rule with the torch code that makes it so.

A dump that breaks one of these was not written by torch as one rank's record (a copy, an edit, two files joined),
or torch wrote it under one of the named exceptions, which are never refused:

* **One pickle per file** (:func:`one_pickle`). ``DebugInfoWriter::write`` opens the file with a fresh
  ``std::ofstream`` (truncating it) and writes the one string ``FlightRecorder::dump`` returns, which is
  ``pickle_str`` of one dict (``torch/csrc/distributed/c10d/FlightRecorder.cpp`` and ``FlightRecorderDetail.hpp``,
  2.4 to 2.15; ``NCCLUtils.cpp`` before); the shim's :func:`~nemo_rl_shim.flight_recorder.recorder.dump_now` writes
  one ``pickle.dumps`` through a temporary file and a rename. Bytes after the pickle's ``STOP``: refused.
* **A p2p name says who wrote it** (:func:`check_p2p_sides`). ``ProcessGroupNCCL::send`` and ``::recv`` name their
  record ``"nccl:send <rank_>-><dstRank>"`` and ``"nccl:recv <rank_><-<srcRank>"``, where ``rank_`` is the
  backend's rank *in the group* and the peer is the group rank ``distributed_c10d.send``/``isend`` hand it
  (``group_dst = _canonicalize_group_rank(group, dst, group_dst)``; ``get_group_rank`` before 2.6); torch 2.15's
  ``FlightRecorderHook::profilingName`` writes the same from ``pg->getRank()`` ("Both ranks are group-local"), and
  ``"<rank><-?"`` for a receive from any source. Group ranks, in every version read (2.4 to 2.15): so the writer's
  global rank is the group's member at the name's first number, as the dump's own record lists the group (torch's
  ``pg_config`` lists a group's global ranks in group-rank order: ``record_pg_ranks``), and must be the rank its
  file name gives; and both numbers must lie inside the group. On the default group the two numberings agree. A
  group no record lists (Gloo's dumps keep only ``''``) proves nothing, and is not checked.
* **Collective numbers without a gap** (:func:`collective_gaps`, judged across ranks in :mod:`.analysis`).
  ``ProcessGroupNCCL::collective`` bumps ``seqCollective_`` and records the op under it, one record per op; torch
  2.15's hook (``FlightRecorderHook::onPre``) likewise, per group. The ring buffer (``FlightRecorder::record``)
  overwrites the oldest records and ``dump_entries`` returns the rest in order, from the current ``reset_epoch_``
  only: what a dump keeps of a group is the numbers from its oldest kept to its newest, each present. The
  exceptions, none refused:

  - a **wrapped** buffer or a ``reset_all`` keeps no number below its oldest: only the numbers *between* a group's
    first and last kept are looked at, never whether the first is 1;
  - a **coalesced** collective (``startCoalescing``/``endCoalescing``) gives its ops and its ``coalesced`` closer
    one number: repeats are not gaps;
  - **p2p** ops keep ``collective_seq_id`` where it was and count ``p2p_seq_id``: they are left out;
  - ``TORCH_INCLUDE_ONLY_ACTIVE=1`` (``getCollectiveTrace``'s ``onlyActive``) drops every completed record: a dump
    with no completed record is not looked at;
  - a number torch burned on every rank alike: a ``startCoalescing``/``endCoalescing`` with no op between (its
    comment: "we burn a seq_"), an op issued under CUDA graph capture (stock ProcessGroupNCCL does not record it,
    as ``FlightRecorderHook::onPre``'s comment says; the hook does not number it either). Such a number is missing
    from every member's buffer alike, so a number one rank lacks is a gap only where another member's buffer holds
    it (:func:`unexplained`); where no other member's buffer spans it, nothing can say which it is.

  torch 2.15's hook records outside its lock, so two threads may record one group's ops out of order: the numbers
  are compared as a set, not in order.
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from nemo_rl_shim.hang_report.records import DumpError, Entry, GroupFacts
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["GAPS_KEPT", "check_p2p_sides", "collective_gaps", "one_pickle", "p2p_sides", "unexplained"]

#: Per group, the missing numbers a dump keeps (past this many, the first ones: a gap is a gap).
GAPS_KEPT = 16


def one_pickle(size: int, consumed: int, path: Path) -> None:
    """:class:`DumpError` where ``size - consumed`` bytes follow the pickle's end (see the module docstring)."""
    if consumed < size:
        raise DumpError(
            f"{shown_path(path)}: {size - consumed:,} bytes follow the pickle's end (its STOP at byte {consumed:,}): "
            "torch writes one pickle per file (DebugInfoWriter::write): two files joined, or one appended to"
        )


def p2p_sides(where: str) -> tuple[int | None, int | None]:
    """The two group ranks of a p2p name's tail: ``"1->0"`` -> ``(1, 0)``; ``"0<-?"`` -> ``(0, None)``; ``(None,
    None)`` where it names none (digits in ASCII, at most 7 of them)."""
    for arrow in ("->", "<-"):
        if arrow in where:
            mine, _, peer = where.partition(arrow)
            me = int(mine) if mine.isascii() and mine.isdigit() and len(mine) < 8 else None
            other = int(peer) if peer.isascii() and peer.isdigit() and len(peer) < 8 else None
            return me, other
    return None, None


def check_p2p_sides(path: Path, rank: int, groups: Mapping[str, GroupFacts], ops: Iterable[Entry]) -> None:
    """Every p2p op of a group its record lists: its writer is the file's rank, its peer inside the group (see the
    module docstring); :class:`DumpError` naming the file, the op and both ranks."""
    for op in ops:
        if op.op not in ("send", "recv"):
            continue
        facts = groups.get(op.group)
        if facts is None or not facts.stated:
            continue
        members = facts.ranks
        arrow = "->" if op.op == "send" else "<-"
        name = f"{op.op} {'?' if op.me is None else op.me}{arrow}{'?' if op.peer is None else op.peer}"
        where = f"process group {op.group!r}, ranks {format_ranks(members)}"
        for side, value in (("its own", op.me), ("its peer's", op.peer)):
            if value is not None and value >= len(members):
                raise DumpError(
                    f"{shown_path(path)}: its {op.lib}:{name} #{op.seq} names {side} group rank {value}, outside "
                    f"{where} ({len(members)} ranks): torch names a p2p op by the two ranks in its group"
                )
        if op.me is not None and members[op.me] != rank:
            raise DumpError(
                f"{shown_path(path)}: its {op.lib}:{name} #{op.seq} on {where} was written by rank {members[op.me]}, "
                f"its file name says rank {rank}: torch names a p2p op from its writer's own rank"
            )


def collective_gaps(numbers: array.array) -> tuple[tuple[int, ...], tuple[int, int]]:
    """The numbers missing between a group's first and last kept collective (the first :data:`GAPS_KEPT`), and
    ``(first, last)``; ``numbers`` in buffer order, repeats allowed (see the module docstring)."""
    first = numbers[0]
    if numbers == array.array(numbers.typecode, range(first, first + len(numbers))):
        return (), (first, numbers[-1])  # the usual case, compared in C: each number once, in order, none missing
    low, high = min(numbers), max(numbers)
    present = set(numbers)  # a repeat may hide a gap from a count alone
    if len(present) == high - low + 1:
        return (), (low, high)
    missing: list[int] = []
    for number in range(low, high + 1):
        if number not in present:
            missing.append(number)
            if len(missing) == GAPS_KEPT:
                break
    return tuple(missing), (low, high)


def _holds(number: int, gaps: Sequence[int], span: tuple[int, int] | None) -> bool | None:
    """Whether a buffer holds ``number`` (None: it does not span it, so it cannot say)."""
    if span is None or not span[0] <= number <= span[1]:
        return None
    if len(gaps) >= GAPS_KEPT and number > gaps[-1]:
        return None  # past the missing numbers it kept: cannot say
    return number not in gaps


def unexplained(
    rank: int,
    gaps: Sequence[int],
    others: Mapping[int, tuple[Sequence[int], tuple[int, int] | None]],
) -> tuple[int, list[int], bool] | None:
    """The first of ``rank``'s missing numbers that is not one torch burned on every rank alike: ``(number, the
    members whose buffers hold it, whether any other buffer spans it)``; None where every missing number is
    missing from every other member's buffer that spans it (see the module docstring). ``others``: each other
    member's ``(gaps, span)`` for the group."""
    for number in gaps:
        holders, spanned = [], False
        for other, (their_gaps, span) in others.items():
            held = _holds(number, their_gaps, span)
            if held is not None:
                spanned = True
                if held:
                    holders.append(other)
        if holders or not spanned:
            return number, sorted(holders), spanned
    return None
