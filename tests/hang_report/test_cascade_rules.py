"""A cascade's rules (:mod:`nemo_rl_shim.hang_report.cascade`), each on findings built for it, and the kind that
:func:`~nemo_rl_shim.hang_report.kinds.classify` names from its root.

The shape of #42's NCCL category A: the free ranks wait in the next dp reduce-scatter on a rank of the tp group
where the incident is; the reader named that rank "never came" there. Drawn whole: the named seeds of
``tests/hang_report/test_nccl_cascades.py``.
"""

from __future__ import annotations

import pytest

from nemo_rl_shim.hang_report.analysis import Analysis, Finding
from nemo_rl_shim.hang_report.cascade import chain_of, held_in, root_of
from nemo_rl_shim.hang_report.kinds import classify
from tests.harness.hang_records import GLOO, dump, entry, group, p2p, stall

pytestmark = [pytest.mark.every_lane]

TP = group("tp", range(4, 8), axes=["tp"])
DP = group("dp", (0, 4), axes=["dp"])


@pytest.fixture(autouse=True)
def _fresh_groups() -> None:
    """Each test starts with the two groups holding no entry (tests add the ones their rule reads)."""
    TP.entries.clear()
    DP.entries.clear()


def _held(rank: int, seq: int = 2, name: str = "tp") -> dict:
    """Rank ``rank``'s dump: its newest op the group's collective ``seq``, unfinished."""
    return {"latest": entry(name, seq)}


def _dumps(**more: dict) -> dict:
    return {r: dump(r, **more.get(str(r), {})) for r in range(8)}


def _waiting_in_dp() -> Finding:
    DP.entries[0] = entry("dp", 3, "_reduce_scatter_base")
    return stall(DP, [4], [0], seq=3, op="_reduce_scatter_base", created_ns=3_000)


def _kind(findings: list[Finding], dumps: dict) -> tuple[str, tuple[int, ...]]:
    kind = classify(Analysis(findings, [DP, TP], [], dumps, 8), {}, {})
    return kind.name, kind.ranks


def _in_tp(seq: int = 2) -> None:
    TP.entries.update({r: entry("tp", seq, created_ns=2_000) for r in TP.ranks})


def test_a_rank_waited_on_that_is_held_in_a_collective_none_finished_names_that_collective() -> None:
    """Rank 4 is named in dp's reduce-scatter only because it is in tp's all_reduce, which no member finished."""
    _in_tp()
    none_finished = Finding("not finished", TP, [4, 5, 6, 7], 2, "all_reduce", [], 600.0, 2_000)
    findings = [_waiting_in_dp(), none_finished]
    assert root_of(findings[0], findings, _dumps()) is none_finished
    assert _kind(findings, _dumps()) == ("all_entered_none_finished", (4, 5, 6, 7))
    kind = classify(Analysis(findings, [DP, TP], [], _dumps(), 8), {}, {})
    assert "rank 0 waits on it in _reduce_scatter_base #3 on dp, ranks 0, 4" in kind.body
    assert [step["kind"] for step in kind.evidence["cascade"]] == ["stall", "not finished"]


def test_a_rank_that_did_not_finish_what_its_peers_finished_is_named_there_not_where_others_wait_on_it() -> None:
    _in_tp()
    did_not = Finding("not finished", TP, [4], 2, "all_reduce", [5, 6, 7], None, 2_000)
    assert _kind([_waiting_in_dp(), did_not], _dumps()) == ("did_not_finish", (4,))


def test_an_op_left_unfinished_that_the_rank_went_on_past_does_not_hold_it() -> None:
    """A later op of rank 4 finished (a batch's closer, a collective): it went on; the op left unfinished (torch's
    batch members that stay ``scheduled``, L-COAL-MEMBERS) is not where it stopped: rank 4 is named where it is
    waited on."""
    _in_tp()
    did_not = Finding("not finished", TP, [4], 2, "all_reduce", [5, 6, 7], None, 2_000)
    went_on = _dumps(**{"4": {"latest": entry("other", 7, state="completed", created_ns=2_500)}})
    assert _kind([_waiting_in_dp(), did_not], went_on) == ("never_came", (4,))
    before = _dumps(**{"4": {"latest": entry("other", 7, state="completed", created_ns=1_500)}})
    assert _kind([_waiting_in_dp(), did_not], before) == ("did_not_finish", (4,))


def test_a_rank_in_a_send_both_sides_posted_is_held_there_by_its_own_pending_op() -> None:
    pair = Finding("not finished", TP, [4, 5], 1, "send/recv", [], None, 2_000, "the send #1 of rank 4 and ...")
    mine = entry("tp", 1, "send", is_p2p=True, peer=1, created_ns=2_000)
    assert _kind([_waiting_in_dp(), pair], _dumps(**{"4": {"pending_p2p": [mine]}})) == (
        "all_entered_none_finished", (4, 5))  # fmt: skip
    assert _kind([_waiting_in_dp(), pair], _dumps()) == ("never_came", (4,))  # no op of its own pending there


def test_a_wait_on_a_rank_held_nowhere_else_is_no_cascade() -> None:
    """Rank 9 is named with rank 4 and is held in no op: it may well never have come; the walk stops."""
    DP9 = group("dp9", (0, 4, 9), axes=["dp"], entries={0: entry("dp9", 3)})
    wait = stall(DP9, [4, 9], [0], seq=3)
    none_finished = Finding("not finished", TP, [4, 5, 6, 7], 2, "all_reduce", [], 600.0, 2_000)
    assert chain_of(wait, [wait, none_finished], _dumps()) == [wait]
    assert held_in(9, [wait, none_finished], _dumps(), but=wait) is None


def test_a_chain_of_waits_is_followed_to_the_rank_that_waits_on_no_one() -> None:
    """0 waits on 4 in dp; 4 waits on 6 in tp (its newest op); 6 is held nowhere: 6 never came."""
    TP.entries[4] = entry("tp", 2)
    in_tp = stall(TP, [6], [4, 5, 7], seq=2, created_ns=2_000)
    findings = [_waiting_in_dp(), in_tp]
    dumps = _dumps(**{"4": _held(4)})
    assert chain_of(findings[0], findings, dumps) == findings
    assert _kind(findings, dumps) == ("never_came", (6,))
    moved_on = _dumps(**{"4": {"latest": entry("other", 9)}})  # rank 4 left tp's op (a Gloo recorder cannot say)
    moved_on[4] = dump(4, entry("other", 9), recorder=GLOO)
    assert chain_of(findings[0], findings, moved_on) == findings[:1]


def test_a_rank_waiting_on_a_send_that_never_came_is_followed_to_the_sender() -> None:
    pp = group("pp", (4, 6))
    no_send = p2p(pp, 6, [4])
    findings = [_waiting_in_dp(), no_send]
    assert _kind(findings, _dumps()) == ("p2p_stall", (6,))


def test_a_circle_of_holds_stops_where_it_closes() -> None:
    back = stall(DP, [0], [4], seq=3)
    findings = [_waiting_in_dp(), back]
    dumps = _dumps(**{"0": {"latest": entry("dp", 3, "_reduce_scatter_base")}})
    chain = chain_of(findings[0], findings, dumps)
    assert len(chain) == len({id(f) for f in chain})  # no finding twice


def _unconfirmed(status: dict | None) -> tuple[list[Finding], dict]:
    TP.entries.update({r: entry("tp", 2) for r in TP.ranks})
    unsure = Finding("unconfirmed", TP, [4, 5, 6, 7], 2, "all_reduce", [], None, 2_000, "no entry finished")
    more = {"latest": entry("tp", 2), "pg_status": {"tp": status} if status else {}}
    return [_waiting_in_dp(), unsure], _dumps(**{str(r): more for r in TP.ranks})


def test_a_rank_in_a_collective_its_status_does_not_count_ended_is_cannot_tell_never_a_rank_guessed() -> None:
    """L-PG-STATUS: last_completed_collective below the op's number: the op did not end on that rank, so the rank
    is held there; whether the tp collective finished, no recorder says: "cannot tell", not "rank 4 never came"."""
    findings, dumps = _unconfirmed({"last_completed_collective": 1})
    kind = classify(Analysis(findings, [DP, TP], [], dumps, 8), {}, {})
    assert (kind.name, kind.variant) == ("cannot_tell", "unconfirmed")
    assert kind.body.startswith("cannot tell whether ranks 4-7 finished all_reduce #2 on tp")


@pytest.mark.parametrize("status", [None, {"last_completed_collective": 2}], ids=["no status", "counted ended"])
def test_a_rank_whose_status_counts_its_op_ended_or_says_nothing_is_not_held_there(status: dict | None) -> None:
    findings, dumps = _unconfirmed(status)
    assert _kind(findings, dumps) == ("never_came", (4,))


def test_a_gloo_ranks_status_holds_it_nowhere() -> None:
    """G-RETIRE, G-PG-STATUS: Gloo's status counts op_ids and a collective that timed out as ended; its dumps are
    judged as before: the rank the others wait on is named."""
    findings, dumps = _unconfirmed({"last_completed_collective": 1})
    TP.entries.update({r: entry("tp", 2, lib="gloo") for r in TP.ranks})
    for r in TP.ranks:
        dumps[r] = dump(r, TP.entries[r], recorder=GLOO, lib="gloo", pg_status={"tp": {"last_completed_collective": 1}})
    assert _kind(findings, dumps) == ("never_came", (4,))


def test_a_rank_waited_on_that_waits_where_no_buffer_tells_who_kept_it_is_unclear_not_named() -> None:
    """The root is an ``unclear`` finding where the rank waited on still waits in its op: unclear, never that rank
    as the one that never came (#42's seed 59)."""
    _in_tp()
    unclear = Finding("unclear", TP, [], 2, "all_reduce", [4], None, 2_000)
    findings = [_waiting_in_dp(), unclear]
    assert root_of(findings[0], findings, _dumps(**{"4": _held(4)})) is unclear
    assert _kind(findings, _dumps(**{"4": _held(4)}))[0] == "unclear"
    TP.entries[4] = entry("tp", 2, state="completed", created_ns=2_000)  # it finished it, and went on
    assert root_of(findings[0], findings, _dumps(**{"4": _held(4, seq=3)})) is findings[0]


def test_a_rank_whose_part_its_recorder_hides_makes_the_root_what_cannot_be_told() -> None:
    """H-BATCH-DONE, C-ONLY-ACTIVE: a member of a ``hidden`` finding's group, not known to wait there, that finished
    nothing after it: whether it is held there cannot be told (#42's seeds 126, 156, 163)."""
    _in_tp()
    hidden = Finding("hidden", TP, [], 2, "recv", [5], None, 2_000)
    findings = [_waiting_in_dp(), hidden]
    assert root_of(findings[0], findings, _dumps()) is hidden
    assert _kind(findings, _dumps())[0] == "cannot_tell"
    waits_there = Finding("hidden", TP, [], 2, "recv", [4, 5], None, 2_000)  # rank 4 is known to wait: not hidden
    assert root_of(findings[0], [findings[0], waits_there], _dumps()) is findings[0]
    went_on = _dumps(**{"4": {"latest": entry("tp", 3, state="completed", created_ns=2_500)}})
    assert root_of(findings[0], findings, went_on) is findings[0]  # it finished an op after it: it went on
    other = Finding("hidden", group("pp", (5, 6)), [], 2, "recv", [5], None, 2_000)
    assert root_of(findings[0], [findings[0], other], _dumps()) is findings[0]  # rank 4 is not of that group


def test_what_a_batch_hides_does_not_overrule_a_send_shown_unfinished() -> None:
    """From a point-to-point finding (a send its recorder shows unfinished, outside a batch), a ``hidden`` finding on
    the peer's group holds nobody: the p2p stall stands (the hang-report scenario ``nccl2_batched_p2p_stall``)."""
    _in_tp()
    waits = p2p(TP, 5, [4], seq=3)
    hidden = Finding("hidden", TP, [], 2, "recv", [], None, 2_000)
    assert root_of(waits, [waits, hidden], _dumps()) is waits
    stalled = _waiting_in_dp()
    assert root_of(stalled, [stalled, hidden], _dumps()) is hidden  # from a collective's stall, it does


def test_a_wait_on_a_receiver_and_the_peer_it_waits_on_moves_to_the_p2p_finding() -> None:
    """Rank 0 waits in dp9's collective on ranks 4 and 9: rank 4 waits in a recv from rank 9 (a p2p finding), rank 9
    is held nowhere but is the one that did not send: the walk moves to the p2p finding (``_p2p_naming``), which names
    rank 9 alone (the shape of the Gloo seeds 1007 and 1019: #42)."""
    DP9 = group("dp9", (0, 4, 9), axes=["dp"], entries={0: entry("dp9", 3)})
    wait = stall(DP9, [4, 9], [0], seq=3)
    pp = group("pp", (4, 9))
    no_send = p2p(pp, 9, [4])
    assert chain_of(wait, [wait, no_send], _dumps()) == [wait, no_send]
    kind = classify(Analysis([wait, no_send], [DP9, pp], [], _dumps(), 10), {}, {})
    assert (kind.name, kind.ranks) == ("p2p_stall", (9,))
    assert "rank 0 waits on it in all_reduce #3 on dp, ranks 0, 4, 9" in kind.line, kind.line


@pytest.mark.parametrize(
    "names",
    [
        [9, 11],  # the p2p finding names rank 9, not rank 11, which the wait names too
        [11],  # it names another rank than the unheld one
    ],
)
def test_a_p2p_finding_that_does_not_name_every_unheld_rank_is_not_followed(names: list[int]) -> None:
    """Rank 11 is named by the wait and held nowhere, and the p2p finding (holding rank 4) does not name it: it may
    well never have come; the walk stops at the wait."""
    group_ranks = (0, 4, *names)
    dpx = group("dpx", group_ranks, axes=["dp"], entries={0: entry("dpx", 3)})
    wait = stall(dpx, [4, *names], [0], seq=3)
    no_send = p2p(group("pp", (4, 9)), 9, [4])
    assert chain_of(wait, [wait, no_send], _dumps()) == [wait]


def test_a_rank_held_in_a_p2p_finding_as_its_culprit_only_is_not_followed_there() -> None:
    """The p2p finding names the unheld rank but holds none of the wait's ranks (its waiter is another rank): no
    step: what holds none of the wait's ranks explains none of them."""
    DP9 = group("dp9", (0, 9), axes=["dp"], entries={0: entry("dp9", 3)})
    wait = stall(DP9, [9], [0], seq=3)
    no_send = p2p(group("pp", (5, 9)), 9, [5])
    assert chain_of(wait, [wait, no_send], _dumps()) == [wait]
