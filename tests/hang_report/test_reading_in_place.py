"""The reading's shortcuts (#42 item 5, cost) change no answer: a dump unpickled from its bytes in place reads, ends
and fails as it did through a ``BufferedReader``; the repeated-entry check answered from reference counts refuses
what the id comparison refused, and refuses nothing else; the pass that does not look again at a name its group
had for a closer's name still sends a p2p batch's closer to the p2p ops."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.hang_report import dump_format
from nemo_rl_shim.hang_report.bounds import Budget
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.hang_report.safe_pickle import RefusedPickle, load_plain, load_plain_bytes

PLAIN = {"a": [1, "x\n" * 70_000, 2.5, (3, 4), None, True, -7, 2**70], "b": "y" * 70_000, "c": {"d": [[1, 2]]}}


def _through_a_reader(data: bytes) -> str:
    try:
        load_plain(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "loaded"


def _in_place(data: bytes) -> str:
    try:
        load_plain_bytes(data)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "loaded"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_in_place_loads_what_pickle_loads_and_ends_where_the_pickle_ends(protocol: int) -> None:
    data = pickle.dumps(PLAIN, protocol=protocol)
    loaded, end = load_plain_bytes(data + b"after")
    assert loaded == PLAIN
    assert end == len(data)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("cut", [0, 1, 2, 10, -1, -3])
def test_in_place_fails_as_a_reader_fails(protocol: int, cut: int) -> None:
    data = pickle.dumps(PLAIN, protocol=protocol)[:cut]
    assert _in_place(data) == _through_a_reader(data) != "loaded"


def test_in_place_refuses_a_callable(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."
    with pytest.raises(RefusedPickle, match=r"os\.system"):
        load_plain_bytes(payload)
    assert not marker.exists()


def _entry(name: str, seq: int, *, sizes: Any = ((4,),), p2p: bool = False, p2p_seq: int = 0) -> dict[str, Any]:
    return {
        "process_group": ("0", "default_pg"),
        "profiling_name": name,
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": 2,
        "input_sizes": [list(shape) for shape in sizes],
        "state": "completed",
        "is_p2p": p2p,
        "record_id": 0,
        "time_created_ns": 1,
        "pg_id": 0,
    }


def _reading(path: Path) -> dump_format._Reading:
    return dump_format._Reading(path, Budget.for_bytes(path, 1 << 20), "collective_seq_id")


def test_reference_counts_answer_for_a_list_unpickled_alone() -> None:
    entries = pickle.loads(pickle.dumps([_entry("nccl:all_reduce", n) for n in (1, 2, 3)], protocol=2))
    assert not dump_format._may_repeat(entries)
    assert dump_format._may_repeat([*entries, entries[1]])  # held twice
    kept = entries[0]  # held elsewhere too: the ids are compared, and find none twice
    assert dump_format._may_repeat(entries)
    assert len({id(e) for e in entries}) == len(entries)
    del kept


def test_an_entry_held_twice_is_still_refused_and_one_held_elsewhere_is_read(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    first = _entry("nccl:all_reduce", 1)
    raw = {"version": "2.10", "entries": [first, first, _entry("nccl:all_reduce", 2)]}
    with pytest.raises(DumpError, match="entry 1 is entry 0 again"):
        dump_format.reduce_dump(raw, 1000, path, 0)
    raw = pickle.loads(pickle.dumps({"version": "2.10", "entries": [_entry("nccl:all_reduce", n) for n in (1, 2)]}))
    raw["also"] = raw["entries"][0]
    dump = dump_format.reduce_dump(raw, 1000, path, 0)
    assert list(dump.signatures[("0", "nccl")][0]) == [1, 2]


def test_a_name_its_group_had_is_still_read_for_a_closer(tmp_path: Path) -> None:
    """The group's last collective is named ``nccl:coalesced`` (with sizes: a collective), and a p2p batch's closer
    that follows has that very name object: it closes the batch (L-COAL-CLOSE), it is no collective #1 again."""
    name = "nccl:coalesced"
    entries = [
        _entry(name, 1),
        _entry("nccl:send 0->1", 1, p2p=True, p2p_seq=1),
        _entry(name, 1, sizes=(), p2p_seq=1),
    ]
    assert entries[0]["profiling_name"] is entries[2]["profiling_name"]
    scan = dump_format._scan(entries, _reading(tmp_path / "nccl_trace_rank_0"))
    assert [index for index, _ in scan.p2p] == [1, 2]
    assert list(scan.seqs[("0", "nccl")]) == [1]
    assert scan.joined[("0", "nccl")] == 1
