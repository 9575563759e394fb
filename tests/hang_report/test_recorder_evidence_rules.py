"""What a recorder can show and what it cannot: each rule of :mod:`nemo_rl_shim.hang_report.recorder_evidence` on
inputs built for it, and the analysis's use of them (:func:`~nemo_rl_shim.hang_report.analysis.analyse`, and the
kind :func:`~nemo_rl_shim.hang_report.kinds.classify` gives), each test naming its row of
``docs/recorder-semantics.md``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nemo_rl_shim.hang_report.analysis import HIDDEN, GroupState, analyse, peer_posted
from nemo_rl_shim.hang_report.kinds import classify
from nemo_rl_shim.hang_report.recorder_evidence import (
    FINISHED,
    UNPOSTED,
    absent_op,
    dropped_everything,
    may_have_dropped,
    nccl2_p2p_groups,
    tracks_completion,
)
from nemo_rl_shim.hang_report.records import GroupFacts, RankDump, RunEvidence
from tests.harness.hang_records import GLOO, dump, entry

pytestmark = [pytest.mark.every_lane]

KEY = ("1", "nccl")


def vars_of(found: RankDump) -> dict[str, Any]:
    return {f.name: getattr(found, f.name) for f in dataclasses.fields(found)}


def _evidence(only_active: bool) -> RunEvidence:
    return RunEvidence("2.10", "", None, None, None, None, {}, only_active)


def _status(enqueued: int, completed: int) -> dict[str, int]:
    return {"last_enqueued_collective": enqueued, "last_started_collective": -1, "last_completed_collective": completed}


def _only_active(rank: int = 0, *, status: dict[str, Any] | None = None, **more: Any) -> RankDump:
    """A rank's only-active dump: no entry completed, its pg_status (by pg_id ``"1"``) counting a completion."""
    pg_status = {"1": status if status is not None else _status(4, 3)}
    return dump(rank, evidence=_evidence(True), pg_status=pg_status, **more)


def test_nccl_says_an_op_did_not_finish_even_when_every_entry_reads_scheduled() -> None:
    """C-STATE, L-TIMING-OFF, H-STATE: with timing off an unfinished NCCL op reads scheduled; Gloo never says
    (G-STATE); another recorder once one of its entries reads otherwise."""
    assert tracks_completion("nccl", False) and tracks_completion("nccl2", False)
    assert not tracks_completion("gloo", True)
    assert not tracks_completion("mpi", False) and tracks_completion("mpi", True)


def test_an_only_active_dump_is_told_by_its_content() -> None:
    """C-ONLY-ACTIVE-VAR: no completed entry while pg_status counts a completion; a rank that completed nothing yet
    (every row -1), or with no row (a group shows once it recorded), dropped nothing; a dump with a completed entry
    is full."""
    assert may_have_dropped(_only_active(), "nccl")
    assert not may_have_dropped(_only_active(status=_status(0, -1)), "nccl")
    assert not may_have_dropped(_only_active(status=_status(1, 0)), "nccl")  # legacy numbers work from 1
    assert may_have_dropped(dump(0, lib="nccl2", evidence=_evidence(True), pg_status={"1": _status(1, 0)}), "nccl2")
    assert not may_have_dropped(dump(0, n_entries=0, evidence=_evidence(True)), "nccl")  # recorded nothing: no row
    emptied = RankDump(**{**vars_of(dump(0, n_entries=0)), "recorders": {}, "evidence": _evidence(True),
                          "pg_status": {"1": _status(4, 3)}})  # fmt: skip
    assert may_have_dropped(emptied, "nccl")  # every entry dropped: no recorder left, the group's own decides
    assert not may_have_dropped(dump(0, evidence=_evidence(False), pg_status={"1": _status(4, 3)}), "nccl")


def test_gloos_recorder_drops_nothing() -> None:
    """G-ONLY-ACTIVE, G-STATE, G-RETIRE: every Gloo entry reads scheduled and pg_status counts its retired work, yet
    no Gloo entry gets a completion time: an only-active dump keeps them all."""
    gloo = dump(0, lib="gloo", recorder=GLOO, evidence=_evidence(True), pg_status={"1": _status(4, 3)})
    assert not may_have_dropped(gloo, "gloo")
    assert absent_op(gloo, ("1", "gloo"), 5) == UNPOSTED


def test_a_full_dump_holds_every_op_its_rank_posted() -> None:
    """C-ONLY-ACTIVE: without only-active, an op missing from a dump was never posted."""
    assert absent_op(dump(0, evidence=_evidence(False)), KEY, 5) == UNPOSTED


def test_pg_status_proves_a_dropped_collective_finished() -> None:
    """L-PG-STATUS: last_completed_collective at or past the number, on a group with no p2p work."""
    kept = entry("1", seq=3, op="broadcast", pg_id="1")  # a batch member: kept for ever (L-COAL-MEMBERS)
    assert absent_op(_only_active(status=_status(5, 5), last={KEY: kept}), KEY, 5) == FINISHED


def test_pg_status_proves_a_collective_was_never_posted() -> None:
    """L-PG-STATUS: last_enqueued_collective below the number: the rank never posted it."""
    kept = entry("1", seq=3, op="broadcast", pg_id="1")
    assert absent_op(_only_active(status=_status(4, 4), last={KEY: kept}), KEY, 5) == UNPOSTED


def test_pg_status_is_no_evidence_on_a_group_with_p2p_work() -> None:
    """L-PG-STATUS: pg_status counts work.seq_, the p2p number for p2p work: a kept entry that counts p2p ops before
    it, or a p2p entry of the group, and it proves nothing."""
    counted = entry("1", seq=3, op="broadcast", pg_id="1", p2p_seq=2)
    assert absent_op(_only_active(status=_status(5, 5), last={KEY: counted}), KEY, 5) is None
    kept = entry("1", seq=3, op="broadcast", pg_id="1")
    p2p = {(KEY, "send", 1): 1}
    assert absent_op(_only_active(status=_status(5, 5), last={KEY: kept}, p2p_count=p2p), KEY, 5) is None


def test_pg_status_needs_an_entry_of_the_group_to_find_its_row() -> None:
    """C-PG-ID: pg_id is the rank's own counter; with no entry of the group kept, no row is the group's."""
    assert absent_op(_only_active(status=_status(5, 5)), KEY, 5) is None


def test_nccl2_pg_status_is_no_evidence() -> None:
    """H-PG-STATUS (op_ids in arrival order): never evidence here (G-RETIRE: Gloo drops nothing to judge)."""
    kept = entry("1", seq=3, op="all_reduce", pg_id="1", lib="nccl2")
    nccl2 = dump(0, lib="nccl2", evidence=_evidence(True), pg_status={"1": _status(9, 9)}, last={("1", "nccl2"): kept})
    assert absent_op(nccl2, ("1", "nccl2"), 5) is None


def test_nccl2_p2p_records_are_what_the_dump_cannot_show() -> None:
    """H-BATCH-DONE: every group with an NCCL2 send or recv record, its newest."""
    old = entry("1", seq=1, op="send", state="completed", lib="nccl2", is_p2p=True, created_ns=1)
    new = entry("1", seq=2, op="recv", state="completed", lib="nccl2", is_p2p=True, created_ns=2)
    legacy = entry("2", seq=1, op="send", state="completed", is_p2p=True)
    dumps = [dump(0, p2p_last={(("1", "nccl2"), "send", 1): old, (("2", "nccl"), "send", 1): legacy}),
             dump(1, p2p_last={(("1", "nccl2"), "recv", 0): new})]  # fmt: skip
    assert nccl2_p2p_groups(dumps) == {("1", "nccl2"): new}


def test_dumps_with_no_entry_whose_pg_status_counts_ops_dropped_them() -> None:
    """C-PG-STATUS, H-ONLY-ACTIVE: a group shows in pg_status only once it recorded; empty dumps that count enqueued
    ops dropped them; empty dumps with no row recorded nothing (Gloo's p2p, TORCH_FR_BUFFER_SIZE=0)."""
    counted = {0: dump(0, n_entries=0, pg_status={"0": _status(5, 5)}), 1: dump(1, n_entries=0)}
    assert dropped_everything(counted) == (0, 5)
    assert dropped_everything({0: dump(0, n_entries=0), 1: dump(1, n_entries=0)}) is None
    assert dropped_everything({0: dump(0, n_entries=3, pg_status={"0": _status(5, 5)})}) is None


# --- the analysis on these rules --------------------------------------------------------------------------------


def _members(*ranks: int) -> dict[str, GroupFacts]:
    return {"1": GroupFacts(tuple(ranks), stated=True)}


def test_an_only_active_absence_is_cannot_tell_never_a_side() -> None:
    """C-ONLY-ACTIVE: rank 1 waits in all_reduce #5; rank 0's only-active dump lacks it, and its pg_status cannot
    say (no entry of the group kept): cannot tell, no rank named; exit 1, never "never came"."""
    waiting = entry("1", seq=5)
    dumps = [_only_active(0, groups=_members(0, 1)),
             _only_active(1, groups=_members(0, 1), last={KEY: waiting})]  # fmt: skip
    found = analyse(dumps, world=2)
    assert [(f.kind, f.ranks) for f in found.findings] == [(HIDDEN, [])]
    kind = classify(found, {}, {})
    assert (kind.name, kind.variant, kind.ranks) == ("cannot_tell", HIDDEN, ())
    assert "only-active" in kind.line


def test_pg_status_evidence_names_the_rank_that_did_not_finish() -> None:
    """L-PG-STATUS: rank 0's entry of #5 was dropped, and its pg_status counts #5 completed: rank 1 did not finish."""
    kept = entry("1", seq=3, op="broadcast", state="completed", pg_id="1")
    dumps = [_only_active(0, groups=_members(0, 1), last={KEY: kept}, status=_status(5, 5)),
             _only_active(1, groups=_members(0, 1), last={KEY: entry("1", seq=5)})]  # fmt: skip
    kind = classify(analyse(dumps, world=2), {}, {})
    assert (kind.name, kind.ranks) == ("did_not_finish", (1,))


def test_nccl2_p2p_is_never_agreement() -> None:
    """H-BATCH-DONE, H-NO-CLOSE: every NCCL2 record completed, a p2p one among them: cannot tell, never agree."""
    done = entry("1", seq=1, op="send", state="completed", lib="nccl2", is_p2p=True, completed_ns=2_000, peer=1)
    coll = entry("1", seq=1, state="completed", lib="nccl2", completed_ns=2_000)
    dumps = [dump(0, lib="nccl2", groups=_members(0, 1), last={("1", "nccl2"): coll},
                  p2p_last={(("1", "nccl2"), "send", 1): done}, p2p_count={(("1", "nccl2"), "send", 1): 1}),
             dump(1, lib="nccl2", groups=_members(0, 1), last={("1", "nccl2"): coll})]  # fmt: skip
    found = analyse(dumps, world=2)
    assert [f.kind for f in found.findings] == [HIDDEN]
    assert classify(found, {}, {}).name == "cannot_tell"


def test_an_unfinished_recv_is_never_agreement() -> None:
    """C-STATE: a recv that reads started (unretired) did not finish; where no other rule explains it, the report
    cannot tell, never agree."""
    recv = entry("1", seq=4, op="recv", state="started", is_p2p=True, peer=0, ordinal=1)
    send = entry("1", seq=4, op="send", state="completed", is_p2p=True, peer=1, completed_ns=2_000, ordinal=1)
    coll = entry("1", seq=2, state="completed", completed_ns=2_000)
    dumps = [dump(0, groups=_members(0, 1), last={KEY: coll}, p2p_last={(KEY, "send", 1): send},
                  p2p_count={(KEY, "send", 1): 1}),
             dump(1, groups=_members(0, 1), last={KEY: coll}, pending_p2p=[recv],
                  p2p_last={(KEY, "recv", 0): recv}, p2p_count={(KEY, "recv", 0): 1})]  # fmt: skip
    found = analyse(dumps, world=2)
    assert found.findings and all(f.kind == HIDDEN for f in found.findings)
    assert classify(found, {}, {}).name == "cannot_tell"


def test_a_group_of_one_that_did_not_finish_is_did_not_finish() -> None:
    """The H200 dump (#42): the only member of a group did not finish its collective: that rank did not finish."""
    dumps = [dump(0, groups={"0": GroupFacts((0,), stated=True, desc="default_pg")},
                  last={("0", "nccl"): entry("0", seq=2)})]  # fmt: skip
    kind = classify(analyse(dumps, world=1), {}, {})
    assert (kind.name, kind.ranks) == ("did_not_finish", (0,))
    assert kind.body.startswith("rank 0 did not finish all_reduce #2")


def test_an_only_active_peers_missing_side_is_cannot_tell_never_blamed() -> None:
    """C-ONLY-ACTIVE: rank 1 waits in a recv from rank 0, whose only-active dump holds no send: it may have sent
    (eagerly, completed, dropped) or not: the peer is not blamed (peer_posted None), the report cannot tell."""
    recv = entry("1", seq=2, op="recv", state="scheduled", is_p2p=True, peer=0, ordinal=1)
    kept = entry("1", seq=1, state="scheduled")
    dumps = [_only_active(0, groups=_members(0, 1), last={KEY: kept}),
             dump(1, groups=_members(0, 1), last={KEY: kept}, pending_p2p=[recv], p2p_last={(KEY, "recv", 0): recv},
                  p2p_count={(KEY, "recv", 0): 1})]  # fmt: skip
    state = GroupState("1", (0, 1), [])
    assert peer_posted(recv, dumps[1], dumps[0], state) is None
    found = analyse(dumps, world=2)
    p2p = [f for f in found.findings if f.op == "recv"]
    assert [(f.kind, f.ranks, f.waiting) for f in p2p] == [(HIDDEN, [], [1])]
