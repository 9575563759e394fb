"""Coalesced work judged as torch records it: by the batch's closing record, never by its members.

Each rule names its row of ``docs/recorder-semantics.md``:

* ``L-COAL-MEMBERS``: inside ``startCoalescing``/``endCoalescing`` (``batch_isend_irecv`` on NCCL, or the slow path
  of ``_coalescing_manager``), legacy ProcessGroupNCCL records each op with no CUDA events: a member reads
  ``"scheduled"`` and unretired for ever, finished or not. Its state says nothing; no rank is blamed for it.
* ``L-COAL-CLOSE``: ``endCoalescing`` records one closer, ``"nccl:coalesced"`` (or ``"nccl:<OP>_coalesced"``), with
  **empty** sizes, ``is_p2p`` False even for a p2p batch, the batch's ``p2p_seq_id`` and the ``op_id`` of its last
  member; it alone carries the batch's state. A p2p batch's members share its ``p2p_seq_id``
  (:func:`closes_p2p` tells a p2p batch's closer from a collective batch's, :func:`judge_p2p_batches` hands each
  member its closer's state).
* ``L-ONLY-ACTIVE``: an only-active dump drops a completed batch's closer and keeps its members, so members with no
  closer in such a dump are a completed batch.
* ``C-RING``: the closer is recorded after its members, so a buffer that keeps a member keeps its closer: in a dump
  that is not only-active, members without a closer are a batch still open when the dump was taken (its state
  unknown: they are not pending either).

``_coalescing_manager``'s fast path (``L-COAL-FAST``, ``"nccl:allreduce_coalesced"`` with sizes, then a closer with
its numbers) is a collective: its closer follows it under one collective number and is judged as the group's last
record by :mod:`.dump_format`'s scan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.hang_report.records import Entry, GroupKey

__all__ = ["LOOK_BACK", "Batches", "closes_p2p", "completed_batch", "is_closer", "judge_p2p_batches", "open_member"]

#: Entries looked back through, from a closer, for the record before it of its group (its last member).
LOOK_BACK = 64
_P2P_OPS = ("send", "recv")


def is_closer(name: str, sizes: Any) -> bool:
    """``L-COAL-CLOSE``: a batch's closing record: its name ends in ``coalesced`` and its sizes are empty (the fast
    path's ``allreduce_coalesced`` carries every tensor's sizes: it is a collective, not a closer)."""
    return name.endswith("coalesced") and not sizes


def closes_p2p(entries: Sequence[Any], index: int) -> bool:
    """``L-COAL-CLOSE``: whether the closer at ``index`` closes a p2p batch: the record before it of its group (its
    last member, recorded just before it, within :data:`LOOK_BACK` entries) is a p2p op with the closer's ``op_id``
    (where both carry one) and ``p2p_seq_id``. A collective batch's members are collectives."""
    closer = entries[index]
    group = closer["process_group"][0]
    for back in range(index - 1, max(-1, index - 1 - LOOK_BACK), -1):
        raw = entries[back]
        if type(raw) is not dict:
            return False
        pg = raw.get("process_group")
        if type(pg) not in (tuple, list) or not pg or pg[0] != group:
            continue
        if raw.get("is_p2p") is not True:
            return False
        same_op = raw.get("op_id") is None or closer.get("op_id") is None or raw.get("op_id") == closer.get("op_id")
        return same_op and raw.get("p2p_seq_id") == closer.get("p2p_seq_id")
    return False


@dataclass
class Batches:
    """A dump's p2p ops with their batches judged: the ops (closers left out), and the batches with no closer."""

    ops: list[Entry] = field(default_factory=list)
    open_batches: list[tuple[GroupKey, int]] = field(default_factory=list)  # (group, p2p number) with no closer


def judge_p2p_batches(ops: Sequence[Entry], closers: Sequence[Entry], *, only_active: bool) -> Batches:
    """Each p2p batch judged by its closer (``L-COAL-CLOSE``): a member (a send or recv that shares its group and
    p2p number with a closer, or with another op) takes the closer's state and completion time and is marked
    ``batched``. Members with no closer are a completed batch in an only-active dump (``L-ONLY-ACTIVE``: marked
    completed); in a full dump, a batch still open (``C-RING``), listed in ``open_batches``, its members neither
    pending nor blamed (``L-COAL-MEMBERS``). ``closers`` carry the batch's p2p number in ``p2p_seq``. The entries are
    changed in place."""
    by_batch: dict[tuple[GroupKey, int], Entry] = {(c.key, c.p2p_seq): c for c in closers}
    shared: dict[tuple[GroupKey, int], int] = {}
    for e in ops:
        if e.op in _P2P_OPS:
            shared[(e.key, e.seq)] = shared.get((e.key, e.seq), 0) + 1
    found = Batches()
    for e in ops:
        batch = (e.key, e.seq)
        closer = by_batch.get(batch)
        if closer is not None:
            e.batched, e.state, e.completed_ns = True, closer.state, closer.completed_ns
        elif e.op in _P2P_OPS and shared.get(batch, 0) > 1 and e.lib == "nccl":
            e.batched = True  # L-COAL-MEMBERS: legacy members share one p2p number; NCCL2 numbers each op (H-SEQ)
            if only_active:
                e.state, e.completed_ns = "completed", e.completed_ns or e.created_ns  # L-ONLY-ACTIVE
            elif batch not in found.open_batches:
                found.open_batches.append(batch)
        found.ops.append(e)
    return found


def open_member(e: Entry, open_batches: Sequence[tuple[GroupKey, int]]) -> bool:
    """Whether ``e`` is a member of a batch with no closer in a full dump (``C-RING``: still open, state unknown)."""
    return e.batched and (e.key, e.seq) in open_batches


def completed_batch(last: Mapping[GroupKey, Entry], joined: Mapping[GroupKey, int], *, only_active: bool) -> None:
    """``L-ONLY-ACTIVE`` for a collective batch (``_coalescing_manager``'s slow path): where a group's last collective
    number joined several members and no closer (``joined``: how many ops that number joined; the last record not a
    closer), an only-active dump dropped the closer because the batch completed: its last member is marked
    completed. ``last`` is changed in place."""
    if not only_active:
        return
    for key, count in joined.items():
        entry = last.get(key)
        if entry is not None and count > 1 and not entry.op.endswith("coalesced") and not entry.done:
            entry.state, entry.completed_ns = "completed", entry.completed_ns or entry.created_ns
