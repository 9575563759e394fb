"""The quick first line: each rank's newest entries, read from the two ends of its dump, give the kind before every
entry is read; the full reading follows and stands.

The dumps are the catalogue's (:mod:`tests.harness.kind_scenarios`, pickled as torch pickles them: protocol 2) at 16
ranks of 400 entries, so that a window of 32 is not the whole. The quick read applies here from 0 bytes
(``from_bytes=0``; the command applies it from ``QUICK_FROM_BYTES``). ``benchmarks/hang_kinds.py`` measures it at
1,024 and 8,192 ranks. Hostile bytes: a window is read, or refused in one line, or left to the full reading.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.hang_report import early_line
from nemo_rl_shim.hang_report.dump_format import summarize
from nemo_rl_shim.hang_report.early_line import quick_line
from nemo_rl_shim.hang_report.folder import find_run
from nemo_rl_shim.hang_report.loader import read_sidecars
from nemo_rl_shim.hang_report.newest_entries import _walk as _WALK
from nemo_rl_shim.hang_report.newest_entries import read_window
from nemo_rl_shim.hang_report.progress import judge_all
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.hang_report.stacks import read_stacks
from tests.harness.kind_scenarios import CASES, Layout, culprit, write_case
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write

pytestmark = [pytest.mark.every_lane]

LAYOUT = Layout(world=16, rounds=200)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Path]:
    found = {}
    for case in CASES:
        found[case] = tmp_path_factory.mktemp(case)
        write_case(case, found[case], LAYOUT)
    return found


def _quick(directory: Path):
    run = find_run(directory)
    stacks = read_stacks(run.stacks, run.root)
    return quick_line(run, read_sidecars(run), stacks, judge_all(stacks, run.root), from_bytes=0)


def test_a_window_holds_the_newest_entries_as_the_full_reading_reads_them(cases) -> None:
    path = cases["never_came_python"] / f"nccl_trace_rank_{culprit(LAYOUT.world) - 1}"
    window = read_window(path, culprit(LAYOUT.world) - 1, 64, None, path.parent)
    full = summarize(path, culprit(LAYOUT.world) - 1, None, root=path.parent)
    assert window is not None and (window.entries, window.whole) == (64, False)
    assert {k: (e.seq, e.op, e.state, e.where) for k, e in window.dump.last.items()} == {
        k: (e.seq, e.op, e.state, e.where) for k, e in full.last.items()
    }
    assert window.dump.latest == full.latest and window.dump.groups == full.groups
    assert window.dump.pg_status == full.pg_status and window.dump.window_oldest_ns is not None
    (recorder,) = window.dump.recorders.values()
    assert recorder.wrapped and recorder.oldest_ns > full.recorder("nccl").oldest_ns, "it reaches back to the window"


def test_a_window_that_reaches_the_first_entry_is_the_whole_dump(tmp_path: Path) -> None:
    write_case("mismatch", tmp_path, Layout(world=16, rounds=3), ranks=range(9, 10))
    path = tmp_path / "nccl_trace_rank_9"
    window = read_window(path, 9, 64, None, tmp_path)
    full = summarize(path, 9, None, root=tmp_path)
    assert window is not None and window.whole and window.entries == full.n_entries == 6  # its buffer: 2 x 3
    assert window.dump.window_oldest_ns is None and window.dump.recorders == full.recorders


def test_a_dump_not_pickled_as_torch_pickles_it_is_left_to_the_full_reading(tmp_path: Path) -> None:
    """Protocol 4 (Python's default: frames, an implicit memo) cannot be read from its ends."""
    clock = Clock()
    group = Group("0", "default_pg", (0, 1))
    rank = Rank(0, [group], clock)
    for _ in range(300):
        rank.collective(group)
    path = write(tmp_path, rank)
    assert pickle.loads(path.read_bytes())["entries"] and path.read_bytes()[1] >= 4
    assert read_window(path, 0, 64, None, tmp_path) is None
    path.write_bytes(pickle.dumps(rank.dump(), protocol=2))
    found = read_window(path, 0, 64, None, tmp_path)
    assert found is not None and found.entries == 64, "the same dump as protocol 2: read from its ends"


@pytest.mark.parametrize("case", list(CASES))
def test_the_quick_line_is_the_full_readings_kind_and_ranks(cases, case: str) -> None:
    found = _quick(cases[case])
    report = hang_report.read_run(cases[case])
    assert found is not None, case
    assert (found.kind.name, found.kind.variant, found.kind.ranks) == (
        report.kind.name, report.kind.variant, report.kind.ranks,
    ), (found.line, report.line)  # fmt: skip
    assert found.line == report.line, "the same words, from the newest entries alone"
    assert found.windows == LAYOUT.world - len([r for r in range(LAYOUT.world) if not (cases[case] /
                                                f"nccl_trace_rank_{r}").exists()])  # fmt: skip


def test_a_member_whose_window_does_not_reach_back_is_read_further(tmp_path: Path) -> None:
    """The culprit never entered its tp all_reduce; it then ran 100 all_reduces on a group of its own, so its window
    of 32 holds no tp entry: out of reach, not behind. It is read further (256 entries), and then it is behind."""
    from tests.harness import kind_scenarios

    write_case("never_came_python", tmp_path, LAYOUT)
    found = _quick(tmp_path)
    assert found is not None and found.read_further == [], "the first window told it"
    c = culprit(LAYOUT.world)
    solo = kind_scenarios._group("100", "mesh_solo", (c,))
    entries = kind_scenarios._history(LAYOUT, c, [solo])
    for step in range(100):
        entries.add(solo, "all_reduce", at=2 * LAYOUT.rounds + 1 + step)
    (tmp_path / f"nccl_trace_rank_{c}").write_bytes(pickle.dumps(entries.dump(2 * LAYOUT.rounds), protocol=2))
    found = _quick(tmp_path)
    report = hang_report.read_run(tmp_path)
    assert found is not None and c in found.read_further and found.rounds == 2, found
    assert (found.kind.name, found.kind.ranks) == (report.kind.name, report.kind.ranks) == ("never_came", (c,))
    assert found.line == report.line


def test_the_command_prints_the_quick_line_first_then_the_rest(cases, capfd, monkeypatch) -> None:
    monkeypatch.setattr(early_line, "QUICK_FROM_BYTES", 0)
    directory = cases["circular_wait"]
    assert main(["hang-report", str(directory)]) == 1
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("circular wait: ") and out[1] == "groups:", out[:3]
    assert main(["hang-report", "--json", str(directory)]) == 1
    payload = json.loads(capfd.readouterr().out)
    assert "quick" not in payload and payload["kind"]["name"] == "circular_wait", "JSON waits for the full reading"
    report = hang_report.read_run(directory, early=lambda line: None)
    facts = report.to_json()["quick"]
    assert facts["same_as_full"] is True and facts["kind"] == "circular_wait" and facts["windows"] == LAYOUT.world


def test_a_quick_line_the_full_reading_corrects_is_said_so(cases, capfd, monkeypatch) -> None:
    monkeypatch.setattr(early_line, "QUICK_FROM_BYTES", 0)
    real = early_line.quick_line

    def wrong(*args, **kwargs):
        found = real(*args, **kwargs)
        found.line = "p2p stall: not what the full reading says"
        return found

    monkeypatch.setattr(hang_report.report, "quick_line", wrong)
    assert main(["hang-report", str(cases["mismatch"])]) == 1
    out = capfd.readouterr().out.splitlines()
    assert out[0] == "p2p stall: not what the full reading says"
    assert out[1].startswith("read in full, the first line is: mismatch (sizes): "), out[:3]


_HOSTILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_HOSTILE
@given(data=st.data())
def test_hostile_bytes_give_a_window_none_or_one_line(cases, tmp_path_factory, data) -> None:
    """Bytes of a real dump flipped, cut or spliced: a window, None (the full reading decides), or a DumpError."""
    source = (cases["still_working"] / "nccl_trace_rank_4").read_bytes()
    at = data.draw(st.integers(0, len(source) - 1))
    how = data.draw(st.sampled_from(["flip", "cut", "splice", "zero"]))
    if how == "flip":
        mutated = source[:at] + bytes([source[at] ^ data.draw(st.integers(1, 255))]) + source[at + 1 :]
    elif how == "cut":
        mutated = source[:at]
    elif how == "splice":
        mutated = source[:at] + data.draw(st.binary(max_size=64)) + source[at:]
    else:
        mutated = source[:at] + b"\x00" * min(64, len(source) - at) + source[at + 64 :]
    directory = tmp_path_factory.mktemp("hostile")
    path = directory / "nccl_trace_rank_4"
    path.write_bytes(mutated)
    try:
        found = read_window(path, 4, 64, None, directory)
    except DumpError as e:
        assert "\n" not in str(e)
        return
    assert found is None or found.entries >= 1


def test_unfinished_work_older_than_every_window_is_read_further(tmp_path: Path) -> None:
    """Every member of the culprit's tp group entered all_reduce #201 and none finished; then every rank ran 100
    all_reduces on a group of its own. No window of 32 shows a tp or dp group: only ``pg_status`` (enqueued past
    completed) says there is unfinished work. Those ranks are read further, and the quick line is the full
    reading's."""
    from tests.harness import kind_scenarios

    write_case("all_entered_none_finished", tmp_path, LAYOUT)
    group = LAYOUT.tp_group(culprit(LAYOUT.world))
    for rank in range(LAYOUT.world):
        solo = kind_scenarios._group(str(100 + rank), "mesh_solo", (rank,))
        entries = kind_scenarios._history(LAYOUT, rank, [solo])
        if rank in group.ranks:
            entries.add(group, "all_reduce", at=2 * LAYOUT.rounds, state="scheduled")
        for step in range(100):
            entries.add(solo, "all_reduce", at=2 * LAYOUT.rounds + 1 + step)
        data = pickle.dumps(entries.dump(2 * LAYOUT.rounds), protocol=2)
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(data)
    found = _quick(tmp_path)
    report = hang_report.read_run(tmp_path)
    assert report.kind.name == "all_entered_none_finished" and report.kind.ranks == tuple(group.ranks), report.line
    assert found is not None and set(group.ranks) <= set(found.read_further), found
    assert found.line == report.line


def test_a_group_named_like_the_entries_opening_misleads_nothing(tmp_path: Path, monkeypatch) -> None:
    """The head is first found by byte patterns; a group description holding those very bytes (the key ``entries``,
    its list, an entry's start, twice) makes that guess fail its unpickling, and the walk finds the head instead."""
    from nemo_rl_shim.hang_report import newest_entries

    walks = []
    monkeypatch.setattr(newest_entries, "_walk", lambda *a: walks.append(a) or _WALK(*a))
    fake = "X\x07\x00\x00\x00entries](}(X\x06\x00\x00\x00framesq\x05(}q\x01(h\x05 }q\x02(h\x05"
    clock = Clock()
    group = Group("0", fake, (0, 1))
    rank = Rank(0, [group], clock)
    for _ in range(300):
        rank.collective(group)
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(rank.dump(), protocol=2))
    assert fake.encode() in path.read_bytes()
    window = read_window(path, 0, 32, None, tmp_path)
    full = summarize(path, 0, None, root=tmp_path)
    assert window is not None and window.entries == 32
    assert window.dump.latest == full.latest and window.dump.groups == full.groups
    assert walks, "the guess failed its unpickling: the head was walked"
