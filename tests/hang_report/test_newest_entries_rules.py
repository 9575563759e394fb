"""Reading a dump's newest entries from its two ends (:mod:`nemo_rl_shim.hang_report.newest_entries`): each rule.

The one rule that holds them all: a window of the newest ``count`` entries reads as the full reading of those entries
(:func:`~nemo_rl_shim.hang_report.dump_format.reduce_dump`), its recorders reaching back only to its oldest entry;
and a window that reaches the first entry is the whole dump. Checked on dumps drawn by Hypothesis (groups first used
late, hostile group names, send/recv and batches, protocols 2 and 3), then each path of the reader on bytes built for
it. The catalogue's cases: tests/hang_report/test_hang_report_early_line.py.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_shim.hang_report import newest_entries
from nemo_rl_shim.hang_report.dump_format import reduce_dump
from nemo_rl_shim.hang_report.records import DumpError, RankDump
from tests.harness.nccl_format_dumps import Clock, Group, Rank

pytestmark = [pytest.mark.every_lane]

#: Group descriptions torch would write, and ones whose bytes look like the pickle's own structure.
DESCS = ["default_pg", "mesh_tp", "x" * 300, "é ü 中", "X\x07\x00\x00\x00entries](", "}q\x01(h\x05", "}(h\x05 }(h\x07",
         "entries"]  # fmt: skip


def _rank(ops: list[tuple[int, str, bool]], descs: list[str], frames: bool = True) -> Rank:
    """Rank 0's recorder after ``ops``: (group index, op, finished) on groups of ranks 0-1."""
    clock = Clock()
    groups = [Group(str(i), desc, (0, 1)) for i, desc in enumerate(descs)]
    rank = Rank(0, groups, clock, frames=frames)
    for index, op, done in ops:
        state = "completed" if done else "scheduled"
        group = groups[index % len(groups)]
        if op == "send":
            rank.send(group, 1, state)
        elif op == "recv":
            rank.recv(group, 1, state)
        elif op == "batch":
            rank.batch(group, [("send", 1), ("recv", 1)], state)
        elif op == "coalesced":
            rank.coalesced(group, ["allreduce", "allreduce"], state)
        else:
            rank.collective(group, op, state=state)
    return rank


def _expected(raw: dict[str, Any], count: int, size: int, path: Path) -> tuple[RankDump, int, bool] | None:
    """What the window of ``count`` must read: the full reading of the newest ``count`` entries, its recorders
    reaching back to its oldest entry; the whole dump where the head's first entries and ``count`` reach it; None
    (read in full) where the dump holds no more entries than the head reads."""
    entries = raw["entries"]
    if len(entries) <= newest_entries.HEAD_ENTRIES:
        return None
    if len(entries) <= count + newest_entries.HEAD_ENTRIES:
        return reduce_dump(raw, size, path, 0, None), len(entries), True
    window = entries[-count:]
    found = reduce_dump({**raw, "entries": window}, size, path, 0, None)
    oldest = min(e["time_created_ns"] for e in window)
    recorders = {lib: dataclasses.replace(r, wrapped=True, oldest_ns=oldest) for lib, r in found.recorders.items()}
    return dataclasses.replace(found, recorders=recorders, window_oldest_ns=oldest), count, False


def _check(tmp_path: Path, rank: Rank, count: int, protocol: int = 2) -> newest_entries.Window | None:
    """The window of ``count`` read as :func:`_expected` says. It may hold more than ``count`` entries (a start that
    does not unpickle alone, a string first written in an older entry: an earlier start is taken), never fewer (but
    for the whole dump), and it reads as the full reading of those it holds."""
    raw = rank.dump()
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(raw, protocol=protocol))
    found = newest_entries.read_window(path, 0, count, None, tmp_path)
    n = len(raw["entries"])
    expected = _expected(pickle.loads(path.read_bytes()), count, path.stat().st_size, path)
    if expected is None:
        assert found is None
        return None
    assert found is not None and min(count, n) <= found.entries <= n
    if found.entries != expected[1] or found.whole != expected[2]:
        expected = _expected(pickle.loads(path.read_bytes()), found.entries, path.stat().st_size, path)
        assert expected is not None
    dump, entries, whole = expected
    assert (found.entries, found.whole) == (entries, whole)
    assert found.dump == dump
    return found


_OPS = st.tuples(
    st.integers(0, 3),
    st.sampled_from(["all_reduce", "all_reduce", "broadcast", "send", "recv", "batch", "coalesced"]),
    st.booleans(),
)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(_OPS, min_size=1, max_size=90),
    descs=st.lists(st.sampled_from(DESCS), min_size=1, max_size=4),
    count=st.integers(1, 40),
    protocol=st.sampled_from([2, 3]),
    frames=st.booleans(),
)
def test_a_window_reads_as_the_full_reading_of_its_entries(tmp_path_factory, ops, descs, count, protocol, frames):
    _check(tmp_path_factory.mktemp("w"), _rank(ops, descs, frames), count, protocol)


#: Top-level keys before the entries that look like them to a careless walk: a list, a nested "entries" list, the
#: text "entries" as a value, a nested dict at the entries' depth.
DECOYS: dict[str, Any] = {
    "a_list": [{"x": 1, "y": 2}, {"x": 3, "y": 4}, {"x": 5, "y": 6}],  # dicts of two keys or more: MARK, SETITEMS
    "b_nested": {"entries": [{"x": 1}, {"y": 2}, {"z": 3}], "more": [[1, 2], (3, 4)]},
    "c_text": "entries",
    "d_dicts": [[{"x": 1}, {"x": 2}], ({"y": 1},)],
}


def _memo(data: bytes, head: newest_entries._Head) -> dict:
    """The memo the head's bytes fill, unpickled as the reader unpickles them."""
    return newest_entries._unpickle(data[: head.cut] + b"eu.")[1].memo.copy()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    ops=st.lists(_OPS, min_size=1, max_size=40),
    descs=st.lists(st.sampled_from(DESCS), min_size=1, max_size=4),
    protocol=st.sampled_from([2, 3]),
    frames=st.booleans(),
    wanted=st.integers(1, 5),
    slot=st.integers(-1, 400),
    decoys=st.lists(st.sampled_from(sorted(DECOYS)), unique=True, max_size=4),
    after=st.lists(st.sampled_from(sorted(DECOYS)), unique=True, max_size=4),
    nested=st.booleans(),
)
def test_the_walk_ends_where_the_wanted_entry_ends_or_the_slot_named_is_filled(
    ops, descs, protocol, frames, wanted, slot, decoys, after, nested
) -> None:
    """The opcode walk (the head's fallback) against the file's own entries: it ends at the end of the ``wanted``-th
    entry, or of the first entry after memo slot ``slot`` is filled; the entries are the top-level key's, whatever
    comes before them (:data:`DECOYS`); and the byte-pattern guess, where it finds a head in a dump without hostile
    names, finds the same."""
    raw = {**{key: DECOYS[key] for key in decoys}, **_rank(ops, descs, frames).dump()}
    raw.update({f"z_{key}": DECOYS[key] for key in after})  # after the entries: a walk never reaches them
    if nested:  # a dict of its own in each entry, before its end
        raw["entries"] = [{**e, "extra": {"at": i, "more": {"x": i}}} for i, e in enumerate(raw["entries"])]
    data = pickle.dumps(raw, protocol=protocol)
    entries = raw["entries"]
    head = newest_entries._walk(data, wanted, slot)
    if len(entries) < max(wanted, 2):  # the second entry's first key tells how an entry starts
        assert head is None
        return
    if head is None:  # the slot is filled by no entry: past the entries, nothing to end at
        assert slot >= 0 and slot not in _memo(data, newest_entries._walk(data, len(entries)))  # type: ignore[arg-type]
        return
    top, _ = newest_entries._unpickle(data[: head.cut] + b"eu.")
    assert head.entries >= wanted and top["entries"] == entries[: head.entries]
    assert data[head.first_entry] == ord("}") and data[head.cut - 1] == ord("u")
    memo = _memo(data, head)
    assert head.key_op[0] in (0x68, 0x6A)  # BINGET, LONG_BINGET: the memo slot of an entry's first key
    assert memo[int.from_bytes(head.key_op[1:], "little")] == next(iter(entries[1]))
    assert slot < 0 or slot in memo
    if head.entries > max(wanted, 2):  # it went on for the slot: the entry before it had not filled it
        before = newest_entries._walk(data, head.entries - 1)
        assert before is not None and slot not in _memo(data, before)
    guess = newest_entries._found(data, wanted)
    if (
        guess is not None
        and wanted >= 2
        and not decoys
        and not set(descs) - {"default_pg", "mesh_tp", "x" * 300, "é ü 中"}
    ):
        assert guess == newest_entries._walk(data, wanted)


def test_the_walk_ends_with_the_entries_whatever_follows_them() -> None:
    raw = {**_steady(2).dump(), "z_after": DECOYS["a_list"]}
    data = pickle.dumps(raw, protocol=2)
    assert newest_entries._walk(data, 2) is not None
    assert newest_entries._walk(data, 3) is None


def test_the_walk_ends_at_the_entry_that_fills_the_slot_named() -> None:
    data = pickle.dumps(_steady(30).dump(), protocol=2)
    for k in (3, 7, 20):
        filled = max(_memo(data, newest_entries._walk(data, k)))  # type: ignore[arg-type]
        assert filled not in _memo(data, newest_entries._walk(data, k - 1))  # type: ignore[arg-type]
        head = newest_entries._walk(data, 2, filled)
        assert head is not None and head.entries == k


def _steady(n: int, descs: list[str] | None = None, late: int | None = None) -> Rank:
    """``n`` all_reduces on group 0 (group 1's first at op ``late``); the last one unfinished."""
    ops = [(1 if i == late else 0, "all_reduce", i < n - 1) for i in range(n)]
    return _rank(ops, descs or ["default_pg", "mesh_tp"])


def test_a_window_holds_the_newest_count_entries_and_its_recorder_reaches_back_to_the_oldest(tmp_path: Path) -> None:
    found = _check(tmp_path, _steady(50), 10)
    assert (found.entries, found.whole) == (10, False)
    assert found.dump.window_oldest_ns == min(e["time_created_ns"] for e in _steady(50).dump()["entries"][-10:])


@pytest.mark.parametrize("n, whole", [(12, True), (13, False)])
def test_a_window_is_the_whole_dump_where_the_heads_two_entries_and_count_reach_the_first(tmp_path, n, whole):
    assert newest_entries.HEAD_ENTRIES == 2
    found = _check(tmp_path, _steady(n), 10)
    assert found.whole is whole and found.entries == (n if whole else 10)
    assert (found.dump.window_oldest_ns is None) is whole


def test_a_group_first_used_late_is_read_with_a_longer_head(tmp_path: Path) -> None:
    """Group 1's name is first written at entry 40 (a memo slot the first two entries did not fill): the tail refers to
    it, and the head is read on to that entry."""
    found = _check(tmp_path, _steady(60, late=40), 30)
    assert ("1", "nccl") in found.dump.last


def test_the_head_is_found_by_its_byte_patterns_without_walking_it(tmp_path: Path, monkeypatch) -> None:
    """A dump as torch writes it: the key ``entries``, its list and the entries' starts are found by their bytes;
    the opcode walk is the fallback, not the way."""

    def no_walk(*_: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(newest_entries, "_walk", no_walk)
    found = _check(tmp_path, _steady(50), 10)
    assert found.entries == 10


def test_a_head_larger_than_the_first_read_is_read_in_larger_pieces(tmp_path: Path) -> None:
    """A group of 40,000 ranks listed in ``pg_config`` (before the entries): a head of about 250 KB, four first
    reads."""
    clock = Clock()
    tp, big = Group("1", "mesh_tp", (0, 1)), Group("9", "mesh_big", tuple(range(40_000)))
    rank = Rank(0, [tp, big], clock)
    for _ in range(50):
        rank.collective(tp)
    found = _check(tmp_path, rank, 10)
    assert found is not None and found.dump.groups["9"].ranks == range(40_000)
    assert (tmp_path / "nccl_trace_rank_0").stat().st_size > 3 * newest_entries.HEAD_BYTES


def test_a_group_named_entries_makes_the_key_a_memo_reference_the_walk_still_finds(tmp_path: Path) -> None:
    """pickle writes a string once: a group described as "entries" in ``pg_config`` makes the top-level key
    ``entries`` a reference to it, which the byte patterns do not find and the walk does."""
    found = _check(tmp_path, _steady(50, ["entries", "mesh_tp"]), 10)
    data = (tmp_path / "nccl_trace_rank_0").read_bytes()
    assert b"X\x07\x00\x00\x00entries]" not in data and newest_entries._found(data, 2) is None
    assert found is not None and found.entries == 10


def test_the_walk_finds_the_end_of_the_wanted_entry() -> None:
    data = pickle.dumps(_steady(5).dump(), protocol=2)
    head = newest_entries._walk(data, 2)
    assert head is not None and head.entries == 2
    top = pickle.loads(data[: head.cut] + b"eu.")
    assert len(top["entries"]) == 2 and top["entries"] == pickle.loads(data)["entries"][:2]
    assert data[head.first_entry] == ord("}") and head.key_op[0] in (ord("h"), ord("j"))
    assert newest_entries._walk(data, 9) is None  # the entries end first: a small dump, read in full
    assert newest_entries._walk(data[: head.cut - 1], 2) is None  # the bytes end first: read more
    assert newest_entries._walk(pickle.dumps(_steady(5).dump(), protocol=4), 2) is None
    assert newest_entries._walk(b"\x80", 2) is None and newest_entries._walk(b"", 2) is None
    for header in (b"\x80\x04", b"\x80\x01", b"\x81\x02", b"}\x02"):  # plain data after it: still not walked
        assert newest_entries._walk(header + data[2:], 2) is None, header
    assert newest_entries._walk(b"\x80\x03" + data[2:], 2) == head
    assert newest_entries._walk(data[:2] + b"\xff" + data[3:], 2) is None  # not an opcode of plain data


def test_the_walk_reads_on_until_the_memo_slot_named_is_filled() -> None:
    data = pickle.dumps(_steady(60, late=40).dump(), protocol=2)
    first = newest_entries._walk(data, 2)
    assert first is not None
    later = newest_entries._walk(data, 2, slot=2000)
    assert later is None or later.entries > first.entries  # past every slot: to the end (None) or an entry far on
    on = newest_entries._walk(data, 2, slot=400)
    assert on is not None and on.entries > 2 and on.cut > first.cut


@pytest.mark.parametrize(
    "data, end",
    [
        (b"N", 1), (b"K\x05", 2), (b"M\x01\x02", 3), (b"J\x01\x02\x03\x04", 5), (b"G" + bytes(8), 9),
        (b"X\x03\x00\x00\x00abc", 8), (b"X\x03\x00\x00\x00ab", -1), (b"X\x03\x00", -1), (b"U\x02ab", 4),
        (b"U\x02a", -1), (b"U\x00", 2), (b"U", -1), (b"q\x07", 2), (b"r\x01\x00\x00\x00", 5), (b"r\x01\x00", -1),
        (b"\x95", -1), (b"c", -1), (b"\x80\x02", 2), (b"\x8a\x01\x05", 3), (b"B\x00\x00\x00\x00", 5),
    ],
)  # fmt: skip
def test_each_plain_data_opcode_ends_where_its_argument_ends(data: bytes, end: int) -> None:
    assert newest_entries._op_end(data, 0) == end


def test_a_dump_that_is_not_plain_protocol_2_or_3_data_is_left_to_the_full_reading(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    for data in (pickle.dumps(_steady(50).dump(), protocol=4), b"not a pickle" * 100, b"",
                 pickle.dumps({"version": "2.10", "entries": []}, protocol=2),
                 pickle.dumps({"version": "2.10", "entries": [{"a": 1}] * 3}, protocol=2)):  # fmt: skip
        path.write_bytes(data)
        assert newest_entries.read_window(path, 0, 10, None, tmp_path) is None
    os.mkfifo(tmp_path / "nccl_trace_rank_1")
    assert newest_entries.read_window(tmp_path / "nccl_trace_rank_1", 1, 10, None, tmp_path) is None
    assert newest_entries.read_window(tmp_path / "gone", 2, 10, None, tmp_path) is None


def test_a_malformed_window_is_refused_as_the_full_reading_refuses_it(tmp_path: Path) -> None:
    rank = _steady(50)
    raw = rank.dump()
    raw["entries"][-1]["collective_seq_id"] = "seven"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(raw, protocol=2))
    with pytest.raises(DumpError, match="nccl_trace_rank_0"):
        newest_entries.read_window(path, 0, 10, None, tmp_path)


def test_an_entry_start_inside_a_string_of_the_tail_is_passed_over(tmp_path: Path) -> None:
    """A thread name in the newest entries holds the bytes an entry starts with: the start inside it does not unpickle
    to entries, and the next earlier start is tried."""
    rank = _steady(50)
    raw = rank.dump()
    data = pickle.dumps(raw, protocol=2)
    head = newest_entries._walk(data, 2)
    assert head is not None
    fake = "}(" + head.key_op.decode("latin-1") + "\xff"  # then no opcode: it does not unpickle
    raw["entries"][-1]["thread_name"] = fake  # the newest entry's: the last start found is inside it
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(raw, protocol=2))
    assert fake.encode() in path.read_bytes()
    found = newest_entries.read_window(path, 0, 1, None, tmp_path)
    assert found is not None and found.entries == 1
    expected = _expected(pickle.loads(path.read_bytes()), 1, path.stat().st_size, path)
    assert expected is not None and found.dump == expected[0]
    # the fake start still counts among the starts: a window of 2 holds 1 entry (the full reading follows and stands)
    found = newest_entries.read_window(path, 0, 2, None, tmp_path)
    assert found is not None and found.entries == 1


def test_the_constants_are_what_the_module_says() -> None:
    assert (newest_entries.HEAD_BYTES, newest_entries.HEAD_ENTRIES, newest_entries.TAIL_BYTES_PER_ENTRY) == (
        1 << 16,
        2,
        1024,
    )
    assert (newest_entries.STARTS_TRIED, newest_entries.HEAD_TRIES) == (4, 4)


# --- each path of the reader, on bytes built for it ----------------------------------------------------------------


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(raw, protocol=2))
    return path


def _window(path: Path, count: int) -> newest_entries.Window | None:
    return newest_entries.read_window(path, 0, count, None, path.parent)


def _as_expected(path: Path, found: newest_entries.Window | None) -> None:
    """``found`` reads as the full reading of the entries it holds."""
    assert found is not None
    expected = _expected(pickle.loads(path.read_bytes()), found.entries, path.stat().st_size, path)
    assert expected is not None and found.dump == expected[0]


def test_entries_whose_keys_are_written_out_each_time_are_read_in_full(tmp_path: Path) -> None:
    """An entry starts as the second one did: its first key a reference to the memo. Keys written out again in
    every entry (each its own string) mark no start: the dump is read in full."""
    raw = _steady(50).dump()
    raw["entries"] = [{k.encode().decode(): v for k, v in e.items()} for e in raw["entries"]]
    assert _window(_write(tmp_path, raw), 10) is None
    raw = _steady(50, ["entries", "mesh_tp"]).dump()  # the byte patterns fail first: the walk decides
    raw["entries"] = [{k.encode().decode(): v for k, v in e.items()} for e in raw["entries"]]
    assert _window(_write(tmp_path, raw), 10) is None


def test_entries_whose_first_key_is_not_text_are_read_in_full(tmp_path: Path) -> None:
    for descs in (["default_pg", "mesh_tp"], ["entries", "mesh_tp"]):
        raw = _steady(50, descs).dump()
        raw["entries"] = [{0: "first", **e} for e in raw["entries"]]
        assert _window(_write(tmp_path, raw), 10) is None, descs


def test_a_first_key_in_a_memo_slot_past_255_is_found_by_its_long_reference(tmp_path: Path, monkeypatch) -> None:
    clock = Clock()
    groups = [Group(str(i), f"mesh_{i}", (0, 1)) for i in range(300)]  # 300 names before the entries: slots past 255
    rank = Rank(0, groups, clock)
    for _ in range(50):
        rank.collective(groups[0])
    path = _write(tmp_path, rank.dump())
    data = path.read_bytes()
    guess = newest_entries._found(data, 2)
    assert guess is not None and guess.key_op[0] == 0x6A and guess == newest_entries._walk(data, 2)  # LONG_BINGET

    def no_walk(*_: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(newest_entries, "_walk", no_walk)
    found = _window(path, 10)
    assert found is not None and found.entries == 10
    _as_expected(path, found)


def _padded(chars: int) -> dict[str, Any]:
    """50 all_reduces; ``pg_config`` also lists a group no entry names, described in ``chars`` characters."""
    clock = Clock()
    tp, unused = Group("0", "mesh_tp", (0, 1)), Group("1", "d" * chars, (0, 1))
    rank = Rank(0, [tp, unused], clock)
    for _ in range(50):
        rank.collective(tp)
    return rank.dump()


def _first_key_at(chars: int) -> int:
    data = pickle.dumps(_padded(chars), protocol=2)
    opened = newest_entries._ENTRIES_OPEN.search(data)
    assert opened is not None
    entry = newest_entries._ENTRY_OPEN.match(data, opened.end())
    assert entry is not None
    return entry.end()


@pytest.mark.parametrize("shift", [-16, -15, -3, -1, 0, 2])
def test_a_first_read_that_ends_at_or_inside_the_first_key_reads_more(tmp_path: Path, shift: int) -> None:
    """The first read of the head ends inside the first entry's first key (its text, its length, its memo slot: the
    key starts ``-shift`` bytes before the end), or where it starts, or before it: nothing to find there yet; the
    next, larger read finds it."""
    chars = 100 + newest_entries.HEAD_BYTES + shift - _first_key_at(100)
    assert _first_key_at(chars) == newest_entries.HEAD_BYTES + shift
    path = _write(tmp_path, _padded(chars))
    found = _window(path, 10)
    assert found is not None and found.entries == 10
    _as_expected(path, found)


def _padded_slots(strings: int) -> bytes:
    """A dump with ``strings`` texts of a top-level key before the entries: each fills a memo slot."""
    raw = {"pad": [f"p{i}" for i in range(strings)], **_steady(5).dump()}
    return pickle.dumps(raw, protocol=2)


def test_a_first_key_in_slot_255_or_256_is_found_by_the_reference_that_fits() -> None:
    """A one-byte memo reference holds slots 0 to 255; slot 256 takes the four-byte one."""
    base = newest_entries._walk(_padded_slots(0), 2)
    assert base is not None
    for slot, opcode in ((255, 0x68), (256, 0x6A)):
        data = _padded_slots(slot - base.key_op[1])
        guess = newest_entries._found(data, 2)
        assert guess is not None and guess.key_op[0] == opcode and guess == newest_entries._walk(data, 2), slot
        assert int.from_bytes(guess.key_op[1:], "little") == slot


def test_a_window_reads_the_head_once_and_count_kib_of_the_tail(tmp_path: Path, monkeypatch) -> None:
    """Reading costs what a window needs: one head read, and a tail of ``count`` x 1 KiB, 4 KiB at least."""
    path = _write(tmp_path, _steady(300).dump())
    reads: list[list[tuple[int, int]]] = []
    real = newest_entries.read_parts

    def recorded(where, parts, **kwargs):
        reads.append(parts)
        return real(where, parts, **kwargs)

    monkeypatch.setattr(newest_entries, "read_parts", recorded)
    for count, tail in ((1, 4096), (10, 10 * 1024)):
        reads.clear()
        found = _window(path, count)
        assert found is not None and found.entries == count
        assert reads == [[(0, newest_entries.HEAD_BYTES)], [(-tail, tail)]], count


def test_entries_larger_than_the_tail_read_are_read_in_full(tmp_path: Path) -> None:
    raw = _steady(50).dump()
    for entry in raw["entries"][-3:]:
        entry["thread_name"] = "t" * 10_000  # no entry starts in the last 4 KiB
    assert _window(_write(tmp_path, raw), 1) is None


def _fakes(tmp_path: Path, fake: str, times: int = 1) -> Path:
    """The newest entry's thread name holds ``fake`` ``times`` over (with the entry start's bytes in it)."""
    raw = _steady(50).dump()
    head = newest_entries._walk(pickle.dumps(raw, protocol=2), 2)
    assert head is not None and head.key_op[1] < 0x80  # one byte in UTF-8 too
    raw["entries"][-1]["thread_name"] = fake.replace("KEY", head.key_op.decode("latin-1")) * times
    return _write(tmp_path, raw)


@pytest.mark.parametrize("times, read", [(3, True), (4, False)])
def test_four_starts_are_tried_before_the_window_is_left_to_the_full_reading(tmp_path, times: int, read: bool) -> None:
    path = _fakes(tmp_path, "}(KEY\xff", times)  # each start is cut short by a byte that is no opcode
    found = _window(path, 1)
    assert (found is not None) is read
    if read:
        _as_expected(path, found)


@pytest.mark.parametrize(
    "fake",
    [
        "}(KEYK\x01ueu.",  # a whole pickle: {"entries": [{first key: 1}]}, an entry without the other keys
        "}(KEYK\x05.",  # stops on an int
        "}(KEY10eu.",  # {"entries": []}
        "}(KEY10u.",  # the entries list is never closed: STOP on the list
    ],
    ids=["an entry without the keys", "an int", "no entries", "a list"],
)
def test_a_start_in_a_string_that_unpickles_to_no_entries_is_passed_over(tmp_path: Path, fake: str) -> None:
    path = _fakes(tmp_path, fake)
    found = _window(path, 1)
    assert found is not None and found.entries == 1
    _as_expected(path, found)


def _shared_late(n: int, firsts: list[int]) -> dict[str, Any]:
    """``n`` entries; from entry ``first`` on (for each of ``firsts``), a key of its own shares one string object, so
    that it is first written there and referred to after."""
    raw = _steady(n).dump()
    for index, first in enumerate(firsts):
        shared = f"shared_{index}".encode().decode()
        for entry in raw["entries"][first:]:
            entry[f"late_{index}"] = shared
    return raw


def test_a_string_first_written_after_the_heads_entries_reads_the_head_on(tmp_path: Path) -> None:
    path = _write(tmp_path, _shared_late(60, [40]))
    found = _window(path, 10)
    assert found is not None and found.entries == 10
    _as_expected(path, found)


def test_more_strings_first_written_late_than_the_head_is_read_on_for_are_left_to_the_full_reading(tmp_path) -> None:
    """The first try finds the first slot missing, and each try after reads the head on to it: three strings first
    written late are read in four tries, a fourth is one too many."""
    assert newest_entries.HEAD_TRIES == 4
    found = _window(_write(tmp_path, _shared_late(60, [40, 42, 44])), 10)
    assert found is not None and found.entries == 10
    assert _window(_write(tmp_path, _shared_late(60, [40, 42, 44, 46])), 10) is None


def test_window_entries_without_a_creation_time(tmp_path: Path) -> None:
    raw = _steady(50).dump()
    for entry in raw["entries"][-10:]:
        entry["time_created_ns"] = None
    found = _window(_write(tmp_path, raw), 10)
    assert found is not None and found.dump.window_oldest_ns == 0
    assert all(r.oldest_ns is None and r.wrapped for r in found.dump.recorders.values())
    raw["entries"][-1]["time_created_ns"] = 7
    found = _window(_write(tmp_path, raw), 10)
    assert found is not None and found.dump.window_oldest_ns == 7


def _key_start(data: bytes) -> int:
    """Where the first entry's first key starts: after ``entries``, its list's MARK and the entry's ``}`` and MARK."""
    opened = newest_entries._ENTRIES_OPEN.search(data)
    assert opened is not None
    entry = newest_entries._ENTRY_OPEN.match(data, opened.end())
    assert entry is not None
    return entry.end()


def test_the_guess_takes_a_first_key_that_is_already_a_memo_reference() -> None:
    """A first key the pickle wrote before the entries (here a top-level key of the same text) is a reference to its
    memo slot, not a string: the guess uses that reference as it is, as the walk does."""
    raw = _steady(5).dump()
    first = next(iter(raw["entries"][0]))
    data = pickle.dumps({first: 0, **raw}, protocol=2)
    assert data[_key_start(data)] in (0x68, 0x6A)  # BINGET, LONG_BINGET
    guess = newest_entries._found(data, 2)
    assert guess is not None and guess == newest_entries._walk(data, 2)


def test_the_guess_gives_up_on_a_first_key_without_a_memo_slot_or_cut_short() -> None:
    """A first key written without a memo slot (a pickler in fast mode) gives the later entries nothing to refer to:
    no guess. Nor where the data ends inside the first key, or before the wanted-th entry."""
    raw = _steady(5).dump()
    data = pickle.dumps(raw, protocol=2)
    assert newest_entries._found(data, 2) is not None
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.fast = True  # no memo: no BINPUT anywhere
    pickler.dump(raw)
    unmemoized = buffer.getvalue()
    assert data[_key_start(unmemoized)] != 0x71 and newest_entries._found(unmemoized, 2) is None
    key = _key_start(data)
    for cut in (key + 1, key + 5, key + 7):  # inside the key's length, inside its text
        assert newest_entries._found(data[:cut], 2) is None, cut
    assert newest_entries._found(data, 5) is None and newest_entries._found(data, 4) is not None  # 5 entries: no 6th


def test_the_guess_on_a_head_cut_anywhere_is_nothing_or_what_the_walk_finds() -> None:
    """The guess (:func:`newest_entries._found`) on the first bytes of a dump, cut at every byte: it never raises, and
    it finds nothing or what the walk (:func:`newest_entries._walk`) finds on the same bytes; on the whole head it
    finds it. For each way an entry's first key is written: a string with a memo slot, a reference, no memo."""
    raw = _steady(4).dump()
    first = next(iter(raw["entries"][0]))
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.fast = True
    pickler.dump(raw)
    for data in (pickle.dumps(raw, protocol=2), pickle.dumps({first: 0, **raw}, protocol=2), buffer.getvalue()):
        key = _key_start(data)
        end = len(data) if data is buffer.getvalue() else key + 64
        for cut in range(key - 2, min(end, len(data)) + 1):
            part = data[:cut]
            guess = newest_entries._found(part, 2)
            assert guess is None or guess == newest_entries._walk(part, 2), cut
    whole = pickle.dumps(raw, protocol=2)
    assert newest_entries._found(whole, 2) == newest_entries._walk(whole, 2)
