"""Coalesced work judged by its closing record: each rule of :mod:`nemo_rl_shim.hang_report.coalesced` on inputs
built for it, each test naming its row of ``docs/recorder-semantics.md``; and the reduction of a dump that holds a
batch (:func:`~nemo_rl_shim.hang_report.dump_format.reduce_dump`), from entries written as torch writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.hang_report.coalesced import (
    closes_p2p,
    completed_batch,
    is_closer,
    judge_p2p_batches,
    open_member,
)
from nemo_rl_shim.hang_report.dump_format import reduce_dump
from tests.harness.hang_records import entry

pytestmark = [pytest.mark.every_lane]


def _member(op: str, peer: int, seq: int = 1, lib: str = "nccl") -> Any:
    return entry("0", seq=seq, op=op, peer=peer, me=0, is_p2p=True, lib=lib, p2p_seq=seq)


def _closer(state: str, p2p_seq: int = 1, coll_seq: int = 1) -> Any:
    done = 2_000 if state == "completed" else None
    return entry("0", seq=coll_seq, op="coalesced", state=state, sizes="[]", completed_ns=done, p2p_seq=p2p_seq)


def _raw(name: str, *, p2p: bool, coll: int, p2p_seq: int, op_id: int, sizes: Any, state: str = "scheduled") -> dict:
    """One entry as legacy ProcessGroupNCCL writes it (the fields the reduction reads)."""
    done = 2_000 + op_id if state == "completed" else None
    return {
        "record_id": op_id - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": coll,
        "p2p_seq_id": p2p_seq, "op_id": op_id, "profiling_name": name, "time_created_ns": 1_000 + op_id,
        "input_sizes": sizes, "output_sizes": sizes, "state": state, "time_discovered_started_ns": None,
        "time_discovered_completed_ns": done, "retired": state == "completed", "timeout_ms": 600_000,
        "is_p2p": p2p,
    }  # fmt: skip


def _h200(*, only_active: bool = False) -> dict:
    """The H200 dump of #42 (the table in ``docs/recorder-semantics.md``): all_reduce #1, a completed batch of a send
    and a recv to itself, all_reduce #2 posted and not finished."""
    entries = [
        _raw("nccl:all_reduce", p2p=False, coll=1, p2p_seq=0, op_id=1, sizes=[[4]], state="completed"),
        _raw("nccl:send 0->0", p2p=True, coll=1, p2p_seq=1, op_id=2, sizes=[[4]]),
        _raw("nccl:recv 0<-0", p2p=True, coll=1, p2p_seq=1, op_id=3, sizes=[[4]]),
        _raw("nccl:coalesced", p2p=False, coll=1, p2p_seq=1, op_id=3, sizes=[], state="completed"),
        _raw("nccl:all_reduce", p2p=False, coll=2, p2p_seq=1, op_id=4, sizes=[[4]]),
    ]
    if only_active:
        entries = [e for e in entries if e["time_discovered_completed_ns"] is None]
    status = {"last_enqueued_collective": 2, "last_started_collective": -1, "last_completed_collective": 1}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}}
    return {"version": "2.10", "pg_config": config, "pg_status": {"0": status}, "entries": entries}


def test_a_closer_has_empty_sizes_and_the_fast_paths_entry_is_a_collective() -> None:
    """L-COAL-CLOSE, L-COAL-FAST: ``nccl:coalesced`` with empty sizes closes a batch; ``nccl:allreduce_coalesced``
    with every tensor's sizes is one collective."""
    assert is_closer("nccl:coalesced", [])
    assert is_closer("nccl:ALLREDUCE_coalesced", ())
    assert not is_closer("nccl:allreduce_coalesced", [[4], [8]])
    assert not is_closer("nccl:all_reduce", [])


def test_a_p2p_batchs_closer_is_told_from_a_collective_batchs() -> None:
    """L-COAL-CLOSE: a p2p batch's closer follows its last member (a p2p op with its op_id and p2p number); a
    collective batch's follows a collective."""
    p2p_batch = [
        _raw("nccl:send 0->1", p2p=True, coll=1, p2p_seq=1, op_id=2, sizes=[[4]]),
        _raw("nccl:recv 0<-1", p2p=True, coll=1, p2p_seq=1, op_id=3, sizes=[[4]]),
        _raw("nccl:coalesced", p2p=False, coll=1, p2p_seq=1, op_id=3, sizes=[]),
    ]
    assert closes_p2p(p2p_batch, 2)
    coll_batch = [
        _raw("nccl:broadcast", p2p=False, coll=2, p2p_seq=1, op_id=4, sizes=[[4]]),
        _raw("nccl:broadcast", p2p=False, coll=2, p2p_seq=1, op_id=5, sizes=[[4]]),
        _raw("nccl:coalesced", p2p=False, coll=2, p2p_seq=1, op_id=5, sizes=[]),
    ]
    assert not closes_p2p(coll_batch, 2)
    other = [*p2p_batch[:2], {**p2p_batch[2], "op_id": 9}]  # not its last member's op_id: not this batch's closer
    assert not closes_p2p(other, 2)


@pytest.mark.parametrize("state", ["completed", "scheduled", "started"])
def test_a_batch_is_judged_by_its_closing_record(state: str) -> None:
    """L-COAL-MEMBERS, L-COAL-CLOSE: members read scheduled for ever; each takes its closer's state."""
    members = [_member("send", 1), _member("recv", 1)]
    judged = judge_p2p_batches(members, [_closer(state)], only_active=False)
    assert [(e.state, e.batched) for e in judged.ops] == [(state, True), (state, True)]
    assert judged.open_batches == []


def test_members_without_a_closer_in_an_only_active_dump_are_a_completed_batch() -> None:
    """L-ONLY-ACTIVE: an only-active dump drops a completed batch's closer and keeps its members."""
    judged = judge_p2p_batches([_member("send", 1), _member("recv", 1)], [], only_active=True)
    assert all(e.done and e.batched for e in judged.ops)


def test_members_without_a_closer_in_a_full_dump_are_an_open_batch_neither_pending_nor_blamed() -> None:
    """C-RING, L-COAL-MEMBERS: a full dump keeps a member's closer; without one the batch was still open."""
    judged = judge_p2p_batches([_member("send", 1), _member("recv", 1)], [], only_active=False)
    assert judged.open_batches == [(("0", "nccl"), 1)]
    assert all(open_member(e, judged.open_batches) for e in judged.ops)


def test_nccl2_ops_are_never_members_each_has_its_own_number() -> None:
    """H-SEQ, H-NO-CLOSE: NCCL2 numbers each op of a batch apart and records no closer: nothing to judge by."""
    ops = [_member("send", 1, seq=1, lib="nccl2"), _member("recv", 1, seq=1, lib="nccl2")]
    judged = judge_p2p_batches(ops, [], only_active=False)
    assert not any(e.batched for e in judged.ops) and judged.open_batches == []


def test_a_collective_batch_without_its_closer_in_an_only_active_dump_completed() -> None:
    """L-ONLY-ACTIVE for ``_coalescing_manager``'s slow path: several members under one number, no closer."""
    last = {("0", "nccl"): entry("0", seq=6, op="broadcast"), ("1", "nccl"): entry("1", seq=2, op="broadcast")}
    completed_batch(last, {("0", "nccl"): 2, ("1", "nccl"): 1}, only_active=True)
    assert last[("0", "nccl")].done and not last[("1", "nccl")].done  # one op under its number: a plain collective
    full = {("0", "nccl"): entry("0", seq=6, op="broadcast")}
    completed_batch(full, {("0", "nccl"): 2}, only_active=False)
    assert not full[("0", "nccl")].done


@pytest.mark.parametrize("only_active", [False, True])
def test_the_h200_dump_reduces_to_all_reduce_2_unfinished_and_no_pending_p2p(only_active: bool) -> None:
    """L-COAL-CLOSE, L-ONLY-ACTIVE: the H200 dump's batch finished (its closer completed, or only-active, its members
    stand alone); its closer is no collective (its ``collective_seq_id`` is all_reduce #1's); all_reduce #2 did not
    finish."""
    raw = _h200(only_active=only_active)
    dump = reduce_dump(raw, 1_000, Path("/d/nccl_trace_rank_0"), 0)
    assert dump.pending_p2p == []
    last = dump.last[("0", "nccl")]
    assert (last.op, last.seq, last.done) == ("all_reduce", 2, False)
    assert [e.op for e in dump.p2p_last.values()] == ["send", "recv"]
    assert all(e.batched and e.done for e in dump.p2p_last.values())
