"""The quick first line's rules (:mod:`nemo_rl_shim.hang_report.early_line`), on small folders written for each.

When it applies (bytes, dumps as torch pickles them), what it says (a kind of failure only), and which ranks it reads
further, how far, and for how many rounds. The catalogue's cases at 16 ranks: tests/hang_report/
test_hang_report_early_line.py.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.analysis import Analysis, Finding
from nemo_rl_shim.hang_report.early_line import (
    GROWTH,
    QUICK_FROM_BYTES,
    ROUNDS,
    WINDOW,
    QuickLine,
    _read_further,
    _unfinished_hidden,
    quick_line,
)
from nemo_rl_shim.hang_report.folder import find_run
from nemo_rl_shim.hang_report.newest_entries import read_window
from tests.harness.hang_records import GLOO, dump, entry, group
from tests.harness.nccl_format_dumps import Clock, Group, Rank

pytestmark = [pytest.mark.every_lane]

TP = Group("1", "mesh_tp", (0, 1))
ENOUGH = 40  # tp all_reduces both ranks finished (more than a window: rank 0 is read as one)


def _world(directory: Path, after: int, protocols: tuple[int, int] = (2, 2), stall: bool = True,
           enough: int = ENOUGH, clock: Clock | None = None) -> Path:  # fmt: skip
    """Ranks 0 and 1 finish ``ENOUGH`` all_reduces on tp; rank 0 enters the next and waits (unless not ``stall``);
    rank 1 then runs ``after`` all_reduces on a group of its own: its last tp entry is ``after + 1`` entries back."""
    clock = clock or Clock()
    solo = Group("2", "mesh_solo", (1,))
    ranks = [Rank(0, [TP], clock), Rank(1, [TP, solo], clock)]
    for _ in range(enough):
        for rank in ranks:
            rank.collective(TP)
    if stall:
        ranks[0].collective(TP, state="scheduled")
    for _ in range(after):
        ranks[1].collective(solo)
    directory.mkdir(parents=True, exist_ok=True)
    for rank, protocol in zip(ranks, protocols, strict=True):
        (directory / f"nccl_trace_rank_{rank.rank}").write_bytes(pickle.dumps(rank.dump(), protocol=protocol))
    return directory


def _quick(directory: Path, from_bytes: int | None = 0) -> QuickLine | None:
    return quick_line(find_run(directory, {}), {}, {}, {}, from_bytes=from_bytes)


# --- when it applies ------------------------------------------------------------------------------------------------


def test_the_quick_line_applies_from_its_size_on(tmp_path: Path) -> None:
    assert QUICK_FROM_BYTES == 256 << 20
    directory = _world(tmp_path, after=0)
    size = sum(p.stat().st_size for p in directory.iterdir())
    assert _quick(directory, from_bytes=size) is not None
    assert _quick(directory, from_bytes=size + 1) is None
    assert _quick(directory, from_bytes=None) is None  # a few kilobytes: read in full at once


def test_one_dump_not_pickled_as_torch_pickles_it_leaves_the_line_to_the_full_reading(tmp_path: Path) -> None:
    """Protocol 4 cannot be read from its ends: one such dump among protocol-2 ones, and no quick line (not a crash
    on the dump that was not read)."""
    assert _quick(_world(tmp_path / "two", after=0, protocols=(2, 2))) is not None
    assert _quick(_world(tmp_path / "mixed", after=0, protocols=(2, 4))) is None
    assert _quick(_world(tmp_path / "mixed_first", after=0, protocols=(4, 2))) is None


def test_a_healthy_run_gets_no_quick_line(tmp_path: Path) -> None:
    """ "every rank agrees" needs every entry read: the full reading says it, never the quick line."""
    assert _quick(_world(tmp_path, after=40, stall=False)) is None


def test_a_dump_the_quick_reading_refuses_leaves_the_line_to_the_full_reading(tmp_path: Path) -> None:
    directory = _world(tmp_path, after=0)
    (directory / "nccl_trace_rank_1").write_bytes(pickle.dumps({"version": 2, "entries": [{"x": 1}] * 3}, protocol=2))
    assert _quick(directory) is None


# --- how far it reads -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "after, rounds",
    [(WINDOW - 1, 1), (WINDOW, 2), (WINDOW * GROWTH - 1, 2), (WINDOW * GROWTH, 3)],
    ids=["in the first window", "one entry past it", "in the second", "one entry past it too"],
)
def test_a_rank_whose_window_does_not_reach_back_is_read_further_growth_times_more(
    tmp_path: Path, after: int, rounds: int
) -> None:
    """Rank 1's last tp entry is ``after + 1`` entries back: a window of 32 holds it only where ``after < 32``; else
    rank 1 is out of reach (not behind) and read further, 8 times more each round."""
    assert (WINDOW, GROWTH, ROUNDS) == (32, 8, 3)
    found = _quick(_world(tmp_path, after=after))
    assert found is not None
    assert (found.kind.name, found.kind.ranks, found.rounds) == ("never_came", (1,), rounds), found.line
    assert found.read_further == ([] if rounds == 1 else [0, 1])  # the unclear group's ranks: both
    read = WINDOW * GROWTH ** (rounds - 1)
    assert found.windows == (read < ENOUGH + 1) + (ENOUGH + after > read)  # the ranks whose first entry was not read
    assert found.line.startswith("never came: rank 1 did not enter all_reduce #41 on tp")


def test_a_rank_read_whole_at_first_is_not_read_again(tmp_path: Path) -> None:
    """Rank 0 holds 21 entries: its first read reached its first entry. Only rank 1, out of reach, is read further."""
    found = _quick(_world(tmp_path, after=WINDOW, enough=20))
    assert found is not None and (found.kind.name, found.read_further, found.rounds) == ("never_came", [1], 2)


def test_after_the_last_round_a_rank_still_out_of_reach_gives_no_line(tmp_path: Path) -> None:
    """Three rounds read 32, 256 and 2,048 entries: a tp entry 2,049 back stays out of reach, and "cannot tell" is
    no quick line."""
    assert _quick(_world(tmp_path / "last", after=WINDOW * GROWTH**2 - 1)) is not None
    assert _quick(_world(tmp_path / "past", after=WINDOW * GROWTH**2)) is None


def test_the_last_round_reads_nothing_further(tmp_path: Path, monkeypatch) -> None:
    """Three rounds are three reads at most (32, 256, 2,048 entries), even where the last leaves a rank out of reach.
    The readers are forked processes: each read is logged to a file."""
    log = tmp_path / "reads.txt"

    def logged(path, rank, count, *rest):
        with log.open("a") as out:
            out.write(f"{rank} {count}\n")
        return read_window(path, rank, count, *rest)

    monkeypatch.setattr("nemo_rl_shim.hang_report.early_line.read_window", logged)
    assert _quick(_world(tmp_path / "past", after=WINDOW * GROWTH**2)) is None
    reads = sorted(tuple(map(int, line.split())) for line in log.read_text().splitlines())
    # rank 0 (41 entries) is read whole by its second read; rank 1 three times
    assert reads == [(0, WINDOW), (0, WINDOW * GROWTH), *((1, WINDOW * GROWTH**r) for r in range(ROUNDS))]


# --- which ranks it reads further -----------------------------------------------------------------------------------


def test_an_unclear_finding_reads_its_groups_windowed_ranks_further() -> None:
    state = group("5", (0, 1, 2, 3))
    unclear = Finding("unclear", state, [], 3, "all_reduce", [0], None, 0, "cannot tell")
    analysis = Analysis([unclear], [state], [], {r: dump(r) for r in range(4)}, 4)
    assert _read_further(analysis, {1, 2, 7}) == {1, 2}
    other = Finding("not finished", state, [1], 3, "all_reduce", [0], None, 0)
    assert _read_further(Analysis([other], [state], [], {r: dump(r) for r in range(4)}, 4), {1, 2}) == set()


def test_members_out_of_reach_are_read_further_where_they_were_windowed() -> None:
    state = group("5", (0, 1, 2, 3), out_of_reach=[2, 3])
    assert _read_further(Analysis([], [state], [], {r: dump(r) for r in range(4)}, 4), {0, 3}) == {3}


def _status(enqueued: object, completed: object) -> dict:
    return {"7": {"last_enqueued_collective": enqueued, "last_completed_collective": completed}}


def test_unfinished_work_that_no_window_entry_shows_is_read_further() -> None:
    """``pg_status`` says group 7 has work enqueued past the work completed, and the window holds none of it."""
    hidden = dump(2, pg_status=_status(5, 4))
    assert _unfinished_hidden(hidden)
    assert _read_further(Analysis([], [], [], {2: hidden}, 4), {2}) == {2}
    assert _read_further(Analysis([], [], [], {2: hidden}, 4), set()) == set()
    shown = dump(2, pg_status=_status(5, 4), last={("7", "nccl"): entry("7", 5, pg_id="7")})
    assert not _unfinished_hidden(shown)
    pending = dump(2, pg_status=_status(5, 4), pending_p2p=[entry("7", 3, "send", pg_id="7", is_p2p=True)])
    assert not _unfinished_hidden(pending)
    finished = dump(2, pg_status=_status(5, 4), last={("7", "nccl"): entry("7", 5, state="completed", pg_id="7")})
    assert _unfinished_hidden(finished)  # a finished entry of the group is not the unfinished work


def test_only_a_recorder_that_tracks_completion_and_whole_counts_tell_of_unfinished_work() -> None:
    """Gloo's ``pg_status`` counts a timed-out collective completed, and its entries never are: no evidence."""
    assert not _unfinished_hidden(dump(2, recorder=GLOO, pg_status=_status(5, 4)))
    assert not _unfinished_hidden(dump(2, pg_status=_status(5, 5)))
    assert not _unfinished_hidden(dump(2, pg_status=_status(4, 5)))
    assert not _unfinished_hidden(dump(2, pg_status=_status(True, False)))  # not counts
    assert not _unfinished_hidden(dump(2, pg_status=_status(5, None)))
    assert not _unfinished_hidden(dump(2, pg_status=_status("5", 4)))
    assert not _unfinished_hidden(dump(2, pg_status={"7": [5, 4]}))
    assert _unfinished_hidden(dump(2, pg_status={"6": [5, 4], **_status(5, 4)}))


# --- what it says ---------------------------------------------------------------------------------------------------


def test_the_quick_line_as_json_says_whether_the_full_reading_agreed(tmp_path: Path) -> None:
    found = _quick(_world(tmp_path, after=WINDOW))
    assert found is not None
    payload = found.to_json(full_line=found.line)
    assert payload["same_as_full"] is True and found.to_json(full_line="other")["same_as_full"] is False
    assert "same_as_full" not in found.to_json()
    assert {k: payload[k] for k in ("kind", "variant", "ranks", "windows", "read_further", "rounds")} == {
        "kind": "never_came", "variant": "unplaced", "ranks": [1], "windows": 0, "read_further": [0, 1], "rounds": 2,
    }  # fmt: skip
    assert payload["line"] == found.line and payload["seconds"] == round(found.seconds, 3)
    assert 0 < found.seconds < 120  # from its start


def test_a_rank_that_cannot_be_read_further_leaves_the_line_to_the_full_reading(tmp_path: Path, monkeypatch) -> None:
    """Rank 1's second window unreadable (its file replaced between the reads, say), rank 0's read: no quick line,
    no crash."""

    def first_window_only(path, rank, count, *rest):
        return None if count > WINDOW and rank == 1 else read_window(path, rank, count, *rest)  # rank 0's reads

    monkeypatch.setattr("nemo_rl_shim.hang_report.early_line.read_window", first_window_only)
    directory = _world(tmp_path, after=WINDOW)
    assert _quick(directory) is None
    monkeypatch.setattr("nemo_rl_shim.hang_report.early_line.read_window", read_window)
    assert _quick(directory) is not None


def test_a_folder_of_two_runs_gets_no_early_line(tmp_path: Path) -> None:
    """Which run is meant, only the full reading says (:mod:`nemo_rl_shim.hang_report.run_split`): rank 1's dump from
    a run a day older gives no early line, while the run's own two dumps give one."""
    assert _quick(_world(tmp_path / "one", after=0)) is not None
    older = _world(tmp_path / "older", after=0, clock=Clock(now_ns=Clock().now_ns - 86_400 * 10**9))
    folder = _world(tmp_path / "two", after=0)
    (folder / "nccl_trace_rank_1").write_bytes((older / "nccl_trace_rank_1").read_bytes())
    assert _quick(folder) is None
