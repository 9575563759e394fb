"""The rules of the shim's log of Gloo's sends and receives, read (:mod:`nemo_rl_shim.hang_report.shim_p2p`):
``S-P2P-OPS`` and ``S-P2P-COUNT`` (what the log holds, checked as untrusted input) and ``S-P2P-MATCH`` (who posted),
then the analysis's point-to-point finding on logged ops. The writer, on real Gloo ranks:
tests/flight_recorder/test_p2p_log.py; the report on real dumps: the Gloo seeds of tests/hang_report/test_hang_truth.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.hang_report.analysis import analyse
from nemo_rl_shim.hang_report.bounds import MAX_WORLD, Budget
from nemo_rl_shim.hang_report.records import DumpError, GroupFacts
from nemo_rl_shim.hang_report.shim_p2p import LIB, MAX_OPS, posted, read_log
from tests.harness.hang_records import GLOO, dump, entry

pytestmark = [pytest.mark.every_lane]

PATH = Path("/dumps/fr_trace_rank_1")


def _op(op: str = "recv", peer: int = 0, ordinal: int = 1, done: bool = False, group: str = "7") -> dict[str, Any]:
    return {"group": group, "op": op, "peer": peer, "tag": 0, "ordinal": ordinal, "created_ns": 5_000, "done": done}


def _log(ops: list[Any], counts: list[Any]) -> dict[str, Any]:
    return {"p2p": {"format": 1, "since_ns": 1, "dropped": 0, "ops": ops, "counts": counts}}


def _read(shim: dict[str, Any], budget: int = 10_000) -> Any:
    return read_log(shim, PATH, Budget(PATH, budget))


def test_no_log_is_none() -> None:
    assert _read({"world_size": 4}) is None


def test_the_logs_ops_are_the_dumps_p2p_entries_keyed_as_glooS_would_be() -> None:
    """S-P2P-OPS, S-P2P-COUNT: the unfinished ops pending, the newest per (group, kind, peer) by ordinal, the counts as
    the log states them (the dropped ops' included)."""
    ops = [_op("recv", 0, 4, done=True), _op("send", 0, 2, done=True), _op("recv", 0, 5)]
    found = _read(_log(ops, [["7", "recv", 0, 0, 5], ["7", "send", 0, 0, 2]]))
    key = ("7", LIB)
    assert [(e.op, e.peer, e.seq, e.ordinal, e.done, e.key) for e in found.pending] == [("recv", 0, 5, 5, False, key)]
    assert {k: e.ordinal for k, e in found.newest.items()} == {(key, "recv", 0): 5, (key, "send", 0): 2}
    assert found.count == {(key, "recv", 0): 5, (key, "send", 0): 2}


@pytest.mark.parametrize(
    ("shim", "field"),
    [
        ({"p2p": {"format": 2, "ops": [], "counts": []}}, "nemo_rl_shim.p2p is"),
        ({"p2p": [1]}, "nemo_rl_shim.p2p is"),
        (_log("ops", []), "nemo_rl_shim.p2p.ops is"),
        (_log([], {"7": 1}), "nemo_rl_shim.p2p.counts is"),
        (_log([], [["7", "recv", 0, 0, 0]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "sendrecv", 0, 0, 1]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "recv", -1, 0, 1]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "recv", True, 0, 1]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([_op(ordinal=0)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(done=1)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(peer=1 << 40)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([{**_op(), "created_ns": -1}], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(group="x" * 2000)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([{**_op(), "tag": -1}], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([["7", "recv", 0, 0, 1, 5_000, False]], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(op="sendrecv")], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(ordinal=True)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(ordinal=1.0)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(group=7)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(peer=MAX_WORLD)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([_op(group="x" * 1025)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([], [("7", "recv", 0, 0, 1)]), "nemo_rl_shim.p2p.counts[0] is"),  # torch's pickles: lists, as written
        (_log([], [[7, "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "recv", 0, 0, True]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "recv", 0, 0, 1]] * (MAX_OPS + 1)), "nemo_rl_shim.p2p.counts is"),
        (_log([{**_op(), "tag": "0"}], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0] is"),
        (_log([], [["7", "recv", 0, -3, 1]]), "nemo_rl_shim.p2p.counts[0] is"),
        (_log([], [["7", "recv", 0, 1]]), "nemo_rl_shim.p2p.counts[0] is"),  # the format without tags
        (_log([_op(ordinal=2)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0].ordinal is 2 (int), past"),
        (_log([{**_op(), "tag": 5}], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0].ordinal is 1 (int), past"),
        (_log([_op(peer=1)], [["7", "recv", 0, 0, 1]]), "nemo_rl_shim.p2p.ops[0].ordinal is 1 (int), past"),
    ],
)
def test_a_malformed_log_is_one_line_naming_the_file_and_the_field(shim: dict[str, Any], field: str) -> None:
    with pytest.raises(DumpError) as raised:
        _read(shim)
    line = str(raised.value)
    assert line.startswith(f"{PATH}: {field}") and "\n" not in line, line


def test_a_log_past_its_bound_or_the_dumps_budget_is_refused_before_its_items_are_read() -> None:
    with pytest.raises(DumpError, match=r"nemo_rl_shim\.p2p\.ops is .*not a list of at most 65,536 ops"):
        _read(_log([None] * (MAX_OPS + 1), []))
    with pytest.raises(DumpError, match="expands past"):
        _read(_log([_op()] * 50, [["7", "recv", 0, 0, 1]]), budget=10)
    with pytest.raises(DumpError, match="expands past"):  # the counts are charged too
        _read(_log([_op()], [["7", "recv", p, 0, 1] for p in range(50)]), budget=40)


def test_a_log_at_its_bounds_is_read() -> None:
    """65,536 ops and as many counts; a group name of 1,024 characters; the highest rank the report reads."""
    ops = [_op(ordinal=n, done=True) for n in range(1, MAX_OPS + 1)]
    counts = [["7", "recv", 0, 0, MAX_OPS], *(["7", "send", p, 0, 1] for p in range(1, MAX_OPS))]
    found = _read(_log(ops, counts), budget=4 * MAX_OPS)
    assert len(found.count) == MAX_OPS and found.pending == []
    assert found.newest[(("7", LIB), "recv", 0)].ordinal == MAX_OPS
    name, top = "x" * 1024, MAX_WORLD - 1
    edge = _read(_log([_op(group=name, peer=top)], [[name, "recv", top, 0, 1]]))
    assert [(e.peer, e.is_p2p, e.lib) for e in edge.pending] == [(top, True, LIB)]


def test_the_newest_op_per_peer_is_the_one_of_the_highest_ordinal_in_any_order() -> None:
    found = _read(_log([_op(ordinal=5, done=True), _op(ordinal=3, done=True)], [["7", "recv", 0, 0, 5]]))
    assert found.newest[(("7", LIB), "recv", 0)].ordinal == 5


@pytest.mark.parametrize(
    ("their_counts", "expected"),
    [
        ({}, False),  # the peer logged no send toward this rank: it did not post
        ({"send": 1}, False),  # its first send met this rank's first recv; this is the second
        ({"send": 2}, True),  # its second send is posted
        ({"send": 3}, True),
        ({"recv": 2}, False),  # its receives from this rank are not sends to it
    ],
)
def test_a_peer_posted_exactly_when_its_opposite_count_toward_the_rank_reaches_the_ordinal(
    their_counts: dict[str, int], expected: bool
) -> None:
    """S-P2P-MATCH: this rank (group rank 1) waits in its second recv from the peer."""
    op = entry("7", 2, "recv", lib=LIB, is_p2p=True, peer=0, ordinal=2)
    peer = dump(0, p2p_logged=True, p2p_count={(("7", LIB), kind, 1): n for kind, n in their_counts.items()})
    assert posted(op, 1, peer) is expected


def test_a_peer_without_the_log_or_a_rank_not_placed_in_the_group_cannot_tell() -> None:
    op = entry("7", 1, "recv", lib=LIB, is_p2p=True, peer=0, ordinal=1)
    assert posted(op, 1, dump(0)) is None  # G-NO-P2P: no record is no evidence
    assert posted(op, None, dump(0, p2p_logged=True)) is None


def _gloo_dump(rank: int, logged: bool, pending: list[Any], counts: dict) -> Any:
    groups = {"7": GroupFacts((1, 2), True)}
    return dump(rank, recorder=GLOO, lib="gloo", groups=groups, p2p_logged=logged, pending_p2p=pending,
                p2p_count=counts, path=Path(f"/dumps/fr_trace_rank_{rank}"))  # fmt: skip


def test_a_logged_receive_whose_peer_logged_no_send_names_the_peer_and_without_its_log_cannot_tell() -> None:
    """The analysis on logged ops: rank 1 (group rank 0 of ranks 1-2) waits in a recv from rank 2; rank 2's log holds
    no send toward it: rank 2 did not send (a p2p finding). Without its log: unclear, no rank named."""
    wait = entry("7", 1, "recv", lib=LIB, is_p2p=True, peer=1, ordinal=1)
    receiver = _gloo_dump(1, True, [wait], {(("7", LIB), "recv", 1): 1})
    found = analyse([receiver, _gloo_dump(2, True, [], {})], world=3)
    p2p = [f for f in found.findings if f.kind == "p2p"]
    assert [(f.ranks, f.waiting, f.op) for f in p2p] == [([2], [1], "send")], found.findings
    unlogged = analyse([receiver, _gloo_dump(2, False, [], {})], world=3)
    assert not [f for f in unlogged.findings if f.kind == "p2p"], unlogged.findings
    unclear = [f for f in unlogged.findings if f.kind == "unclear"]
    assert unclear and "carries no log of its sends and receives" in unclear[0].detail, unlogged.findings


def test_an_op_of_another_tag_than_0_is_left_out_and_its_counts_are_not_tag_0s() -> None:
    """S-P2P-TAG: Gloo matches a pair's ops of one tag in order; the log's ordinals count per tag, and only tag 0's
    are read: the tagged op is not pending, and its count does not stand for tag 0's."""
    tagged = {**_op("recv", 0, 1), "tag": 3}
    found = _read(_log([tagged, _op("send", 0, 1)], [["7", "recv", 0, 3, 1], ["7", "send", 0, 0, 1]]))
    assert [e.op for e in found.pending] == ["send"] and found.count == {(("7", LIB), "send", 0): 1}, found
    assert {k[1] for k in found.newest} == {"send"}
