"""What a recorder's dump can show, and what it cannot: the report says "cannot tell" where the recorder hides a state.

Each rule names its row of ``docs/recorder-semantics.md``:

* **Completion** (:func:`tracks_completion`; ``C-STATE``, ``L-TIMING-OFF``, ``H-STATE``, ``G-STATE``). Legacy
  ProcessGroupNCCL and NCCL2's hook mark an op ``"completed"`` once it finished; with timing off (every NCCL2 dump,
  and legacy by default) an unfinished op reads ``"scheduled"``, so a dump whose every entry reads ``"scheduled"``
  still says its ops did not finish. Gloo's recorder never says (every entry ``"scheduled"``, a timed-out collective
  retired). Another recorder is believed only once one of its entries reads otherwise than ``"scheduled"``.
* **Only-active dumps** (:func:`may_have_dropped`; ``C-ONLY-ACTIVE``, ``C-ONLY-ACTIVE-VAR``). With
  ``TORCH_INCLUDE_ONLY_ACTIVE=1`` a dump drops every entry whose completion was seen: an op missing from it may have
  completed, or never been posted. Such a dump is told by its content: no entry reads ``"completed"`` while its
  ``pg_status`` counts a completed op; never where the recorder marks no entry completed (Gloo's,
  ``G-ONLY-ACTIVE``; a hooked backend without completion hooks, ``H-STATE``). A dump with no completed entry whose
  ``pg_status`` counts none (or has no row: a group shows there once it recorded) dropped nothing: its rank
  completed nothing, or recorded nothing.
* **pg_status as evidence** (:func:`absent_op`; ``L-PG-STATUS``, ``C-PG-STATUS``, ``C-PG-ID``, ``H-PG-STATUS``,
  ``G-RETIRE``). Where an only-active dump lacks collective #n of a group, legacy NCCL's ``pg_status`` row of that
  group says what became of it: ``last_completed_collective`` >= n, it finished; ``last_enqueued_collective`` < n,
  it was never posted. Only on a group with no p2p work (``pg_status`` counts ``work.seq_``, the p2p number for p2p
  work): no p2p entry of the group in the dump, and the group's kept entry counting no p2p op before it
  (``p2p_seq_id`` 0). The row is found by the ``pg_id`` of an entry of the group kept in the same dump (``pg_id`` is
  the rank's own counter: nothing else ties a row to a group). NCCL2's counters are ``op_id`` s in arrival order
  (``H-PG-STATUS``) and Gloo counts timed-out work (``G-RETIRE``): neither is evidence here.
* **NCCL2's p2p** (:func:`nccl2_p2p_groups`; ``H-BATCH-DONE``, ``H-NO-CLOSE``). Inside a batch, NCCL2's send and
  recv return a completed stand-in: their records read completed when queued, and no closer records the batch. A
  hung ``batch_isend_irecv`` does not show; a group with NCCL2 p2p records is never "every rank agrees".
* **Every dump empty** (:func:`dropped_everything`; ``C-PG-STATUS``, ``H-ONLY-ACTIVE``). A group appears in
  ``pg_status`` only once it recorded an entry: dumps that hold no entry while their ``pg_status`` counts enqueued
  ops dropped them (only-active), which is "cannot tell", not an empty recorder (Gloo's p2p, ``TORCH_FR_BUFFER_SIZE=0``:
  no row at all).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from nemo_rl_shim.flight_recorder.names import PG_STATUS_KEY
from nemo_rl_shim.hang_report.records import Entry, GroupKey, RankDump

__all__ = [
    "FINISHED",
    "TRACKING",
    "UNPOSTED",
    "absent_op",
    "dropped_everything",
    "may_have_dropped",
    "nccl2_p2p_groups",
    "tracks_completion",
]

#: Recorders whose ``"completed"`` is evidence and whose ``"scheduled"`` is "not finished" (``C-STATE``,
#: ``L-TIMING-OFF``, ``H-STATE``): legacy ProcessGroupNCCL's and torch 2.15's hook over NCCL2.
TRACKING = ("nccl", "nccl2")
FINISHED, UNPOSTED = "finished", "unposted"
Absent = Literal["finished", "unposted"]
_P2P_OPS = ("send", "recv")


def tracks_completion(lib: str, seen_not_scheduled: bool) -> bool:
    """Whether ``lib``'s recorder says an op finished (see the module docstring): NCCL's always, Gloo's never, another
    once one of its entries reads otherwise than ``"scheduled"``."""
    if lib == "gloo":
        return False
    return lib in TRACKING or seen_not_scheduled


def _completed_counts(dump: RankDump, lib: str) -> bool:
    """Whether the dump's ``pg_status`` counts a completed op: legacy NCCL numbers works from 1 (``L-PG-STATUS``:
    ``seq_``), NCCL2 from 0 (``H-PG-STATUS``: ``op_id``); -1 (``C-PG-STATUS``) is none."""
    first = 0 if lib == "nccl2" else 1
    rows = [row for row in dump.pg_status.values() if isinstance(row, dict)]
    return any(row.get("last_completed_collective", -1) >= first for row in rows)


def may_have_dropped(dump: RankDump, lib: str) -> bool:
    """``C-ONLY-ACTIVE``, ``C-ONLY-ACTIVE-VAR``: whether the dump may have dropped ``lib``'s completed entries: none
    of its entries reads completed while its ``pg_status`` counts a completion. A recorder that never marks an entry
    completed drops nothing: Gloo's (``G-ONLY-ACTIVE``), a hooked backend without completion hooks (``H-STATE``)."""
    evidence = dump.evidence
    held = dump.recorders.get(lib)  # a dump that dropped every entry holds no recorder: the group's own decides
    tracks = held.tracks_completion if held is not None else tracks_completion(lib, False)
    if not tracks or evidence is None or not evidence.only_active:
        return False
    return _completed_counts(dump, lib)


def _tie(dump: RankDump, key: GroupKey) -> Entry | None:
    """An entry of the group kept in the dump, whose ``pg_id`` names its ``pg_status`` row (``C-PG-ID``)."""
    found = dump.last.get(key)
    if found is not None:
        return found
    return next((e for (k, _, _), e in dump.p2p_last.items() if k == key), None)


def absent_op(dump: RankDump, key: GroupKey, number: int) -> Absent | None:
    """What became of collective ``number`` of group ``key``, which ``dump`` does not hold (see the module
    docstring): :data:`UNPOSTED` where the dump drops nothing (a full dump holds every op its rank posted, back to
    its oldest entry); in an only-active dump, what legacy NCCL's ``pg_status`` proves (``L-PG-STATUS``), or None:
    it cannot tell."""
    if not may_have_dropped(dump, key[1]):
        return UNPOSTED
    tie = _tie(dump, key)
    if tie is None or key[1] != "nccl" or tie.is_p2p or tie.p2p_seq:
        return None  # C-PG-ID: no row to read; H-PG-STATUS, G-RETIRE; L-PG-STATUS: p2p work counted in it
    if any(k == key for (k, _, _) in dump.p2p_count):
        return None  # L-PG-STATUS: the group ran p2p work
    row = dump.pg_status.get(PG_STATUS_KEY.format(backend=tie.lib, pg_id=tie.pg_id), dump.pg_status.get(tie.pg_id))
    if not isinstance(row, dict):
        return None
    completed, enqueued = row.get("last_completed_collective"), row.get("last_enqueued_collective")
    if isinstance(completed, int) and completed >= number:
        return FINISHED
    if isinstance(enqueued, int) and 0 <= enqueued < number and enqueued >= tie.seq:
        return UNPOSTED
    return None


def nccl2_p2p_groups(dumps: Iterable[RankDump]) -> dict[GroupKey, Entry]:
    """``H-BATCH-DONE``: every group with an NCCL2 send or recv record, and its newest such record: what its dump
    cannot show (a hung batch reads completed)."""
    found: dict[GroupKey, Entry] = {}
    for dump in dumps:
        for (key, op, _), entry in dump.p2p_last.items():
            newer = key not in found or entry.created_ns > found[key].created_ns
            if key[1] == "nccl2" and op in _P2P_OPS and newer:
                found[key] = entry
    return found


def dropped_everything(dumps: Mapping[int, RankDump]) -> tuple[int, int] | None:
    """``C-PG-STATUS``, ``H-ONLY-ACTIVE``: where no dump holds an entry yet some ``pg_status`` row counts an enqueued
    op, ``(rank, its highest last_enqueued_collective)`` of the first such dump; None otherwise."""
    if not dumps or any(d.n_entries for d in dumps.values()):
        return None
    for rank in sorted(dumps):
        counted = [
            row["last_enqueued_collective"]
            for row in dumps[rank].pg_status.values()
            if isinstance(row, dict) and isinstance(row.get("last_enqueued_collective"), int)
        ]
        if counted and max(counted) >= 0:
            return rank, max(counted)
    return None
