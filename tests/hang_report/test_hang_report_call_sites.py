"""Where each op was called, from the dumps' own ``frames``: the waiting peers' place on the first line, and a
skipped collective told from a size mismatch.

torch's recorder keeps, per entry, the Python stack where the op was called (innermost first; real Gloo dumps
carry it: test_hang_kinds.py and test_hang_report_torch_gloo.py, beside this file). Here the dumps are NCCL-format
(:mod:`tests.harness.nccl_format_dumps`), each entry's frames set to a place of a made-up training script
behind torch's own frames, as torch symbolizes them (one dict per distinct frame, shared by every entry).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.flight_recorder.names import HEADER, STACK_FILE_NAME
from nemo_rl_shim.hang_report import dump_format, loader
from nemo_rl_shim.hang_report.frames import Frame, same_place, user_frame
from nemo_rl_shim.hang_report.where import finding_line
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write

SITE = "/venv/lib/python3.12/site-packages"
TORCH = [
    {"name": "all_reduce", "filename": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 2868},
    {"name": "wrapper", "filename": f"{SITE}/torch/distributed/c10d_logger.py", "line": 83},
]
MAIN = {"name": "main", "filename": "/job/train.py", "line": 140}
RUNPY = {"name": "_run_code", "filename": "/usr/lib/python3.12/runpy.py", "line": 88}
LOSS, METRIC, DATA = ("/job/train.py", 86, "step"), ("/job/train.py", 84, "step"), ("/job/data.py", 57, "load")
#: A collective the shim itself calls (preflight's checks): not the user's code.
SHIM = (f"{SITE}/nemo_rl_shim/cli/preflight/checks.py", 40, "check")
WORLD = Group("0", "default_pg", (0, 1, 2, 3))
_SHARED: dict[tuple[str, int, str], dict[str, Any]] = {}


def _frame_dict(file: str, line: int, function: str) -> dict[str, Any]:
    """One dict per distinct frame, shared by every entry that holds it, as torch's dump does."""
    return _SHARED.setdefault((file, line, function), {"name": function, "filename": file, "line": line})


def _called(rank: Rank, place: tuple[str, int, str] | None) -> None:
    """Set the frames of ``rank``'s newest entry: torch's, then ``place`` and the script's ``main`` (None: torch's
    and the standard library's alone; :data:`SHIM`: the shim's, then the standard library's)."""
    inner = [] if place is None else [_frame_dict(*place)] if place == SHIM else [_frame_dict(*place), MAIN]
    rank.entries[-1]["frames"] = [*TORCH, *inner, RUNPY]


def _world() -> tuple[Clock, list[Rank]]:
    clock = Clock()
    ranks = [Rank(r, [WORLD], clock) for r in range(4)]
    for rank in ranks:  # a healthy first step, every rank at the loss all_reduce
        rank.collective(WORLD)
        _called(rank, LOSS)
    clock.settle()
    return clock, ranks


def _write_all(directory: Path, ranks: list[Rank], skip: tuple[int, ...] = ()) -> Path:
    for rank in ranks:
        if rank.rank not in skip:
            write(directory, rank)
    return directory


def _stall(directory: Path, places: dict[int, tuple[str, int, str] | None]) -> Path:
    """Ranks 0-2 enter all_reduce #2 (from ``places``); rank 3 never does."""
    _, ranks = _world()
    for rank in ranks[:3]:
        rank.collective(WORLD, state="scheduled")
        _called(rank, places.get(rank.rank))
    return _write_all(directory, ranks)


def _skipped(directory: Path, peers_go_on: int) -> Path:
    """Ranks 0-2 all_reduce a metric (2 elements) that rank 3 skips: rank 3's loss all_reduce (4) meets it as #2.
    NCCL does not check sizes: ranks 0-2 finish #2 and go on, ``peers_go_on`` more all_reduces, the last of which
    rank 3 never enters."""
    clock, ranks = _world()
    for rank in ranks[:3]:
        rank.collective(WORLD, sizes=((2,),))
        _called(rank, METRIC)
    ranks[3].collective(WORLD, state="scheduled")
    _called(ranks[3], LOSS)
    clock.settle()
    for step in range(peers_go_on):
        for rank in ranks[:3]:
            rank.collective(WORLD, state="scheduled" if step == peers_go_on - 1 else "completed")
            _called(rank, LOSS)
        clock.settle()
    return _write_all(directory, ranks)


# --- the waiting peers --------------------------------------------------------------------------------------------


def test_the_waiting_peers_place_follows_where_they_wait(tmp_path: Path) -> None:
    report = hang_report.read_run(_stall(tmp_path, {0: LOSS, 1: LOSS, 2: LOSS}), with_torch=False)
    assert report.kind.body == (
        "rank 3 did not enter all_reduce #2 on default, ranks 0-3, in which ranks 0-2 waited 600.0 s "
        "at /job/train.py:86 in step"
    )


def test_peers_that_called_from_several_places_are_grouped_the_outliers_first(tmp_path: Path) -> None:
    report = hang_report.read_run(_stall(tmp_path, {0: LOSS, 1: LOSS, 2: DATA}), with_torch=False)
    assert report.kind.body.endswith(
        "ranks 0-2 waited 600.0 s at /job/data.py:57 in load (rank 2), /job/train.py:86 in step (ranks 0-1)"
    ), report.kind.body


def test_a_peer_without_a_user_frame_is_not_placed(tmp_path: Path) -> None:
    """Frames of torch and the shim alone say nothing of the user's code: that peer has no place."""
    report = hang_report.read_run(_stall(tmp_path, {0: LOSS, 1: SHIM, 2: None}), with_torch=False)
    assert report.kind.body.endswith("ranks 0-2 waited 600.0 s at /job/train.py:86 in step (rank 0)"), report.kind.body
    assert report.findings[0].called_at == {0: Frame(*LOSS), 1: None, 2: None}
    none = hang_report.read_run(_stall(tmp_path / "none", {}), with_torch=False)
    assert (
        none.kind.body == "rank 3 did not enter all_reduce #2 on default, ranks 0-3, in which ranks 0-2 waited 600.0 s"
    )


def test_the_culprits_stack_first_then_the_peers_call_site_and_their_stacks_only_where_elsewhere(tmp_path) -> None:
    directory = _stall(tmp_path, {0: LOSS, 1: LOSS, 2: LOSS})
    here = [(f"{SITE}/torch/distributed/distributed_c10d.py", 2868, "all_reduce"), LOSS]

    def stack(rank: int, frames: list[tuple[str, int, str]]) -> None:
        header = {"rank": rank, "pid": 1, "thread": "0x01", "what": "train step", "after_s": 605.0}
        text = "".join(f'  File "{f}", line {n} in {fn}\n' for f, n, fn in frames)
        (directory / STACK_FILE_NAME.format(rank=rank)).write_text(
            HEADER + json.dumps(header) + "\nTimeout (0:10:05)!\nThread 0x01 (most recent call first):\n" + text
        )

    stack(3, [DATA])
    stack(0, here)
    stack(1, here)
    report = hang_report.read_run(directory, with_torch=False)
    start = "rank 3 did not enter all_reduce #2 on default, ranks 0-3: at /job/data.py:57 in load (its stack, 605.0 s"
    judged = "progress could not be judged: one sample"
    assert (
        report.kind.body
        == f'{start} into "train step"; {judged}); ranks 0-2 waited 600.0 s in it at /job/train.py:86 in step'
    )
    assert (report.kind.name, report.kind.variant) == ("never_came", "python")
    stack(2, [("/job/train.py", 99, "sync")])  # under NCCL a rank may wait later than it called
    report = hang_report.read_run(directory, with_torch=False)
    assert report.kind.body.endswith(
        "in it at /job/train.py:86 in step (their stacks: rank 2 at /job/train.py:99 in sync)"
    )


def test_a_dead_ranks_peers_and_a_p2p_wait_are_placed(tmp_path: Path) -> None:
    _, ranks = _world()
    for rank in ranks[:3]:
        rank.collective(WORLD, state="scheduled")
        _called(rank, LOSS)
    dead = hang_report.read_run(_write_all(tmp_path / "dead", ranks, skip=(3,)), with_torch=False)
    assert dead.kind.body == (
        "no dump from rank 3: ranks 0-2 were last in all_reduce #2 on default, ranks 0-3 (waited 600.0 s) "
        "at /job/train.py:86 in step"
    )
    assert (dead.kind.name, dead.kind.variant, dead.kind.ranks) == ("never_came", "dead", (3,))
    assert (
        dead.line
        == f"never came (dead: no dump): {dead.kind.body}; fix: rank 3's host: its process ended or hung"
        + (" (its log, memory, GPU)")
    )
    _, ranks = _world()
    ranks[3].recv(WORLD, 2, state="scheduled")
    _called(ranks[3], ("/job/pipeline.py", 31, "recv_forward"))
    p2p = hang_report.read_run(_write_all(tmp_path / "p2p", ranks), with_torch=False)
    assert p2p.kind.body == (
        "rank 2 did not send to rank 3, which waited in its recv #1 on default, ranks 0-3; "
        "waiting at /job/pipeline.py:31 in recv_forward"
    )
    assert (p2p.kind.name, p2p.kind.ranks, p2p.line.partition(":")[0]) == ("p2p_stall", (2,), "p2p stall")


# --- a skipped collective against a size mismatch -----------------------------------------------------------------


@pytest.mark.parametrize("peers_go_on", [0, 1, dump_format.CALLS_KEPT - 2])
def test_a_skipped_collective_says_where_each_side_called(tmp_path: Path, peers_go_on: int) -> None:
    """The mismatch at #2 is the last collective of every rank (0), or one the peers went past: its call sites
    still come from the dumps' newest entries."""
    report = hang_report.read_run(_skipped(tmp_path, peers_go_on), with_torch=False)
    assert report.kind.body == (
        "rank 3 differs on all_reduce #2 on default, ranks 0-3: input sizes [[4]] (rank 3) where ranks 0-2 have "
        "[[2]]; called from /job/train.py:86 in step where ranks 0-2 called from /job/train.py:84 in step"
    )
    assert (report.kind.name, report.kind.ranks) == ("skipped_collective", (3,))
    assert report.line.endswith("; fix: the code path that skips all_reduce on rank 3, or adds one"), report.line


def test_a_mismatch_older_than_the_call_sites_kept_says_no_place(tmp_path: Path) -> None:
    report = hang_report.read_run(_skipped(tmp_path, dump_format.CALLS_KEPT + 2), with_torch=False)
    assert report.kind.body.endswith("input sizes [[4]] (rank 3) where ranks 0-2 have [[2]]"), report.kind.body
    assert report.findings[0].called_at[3] is not None and report.findings[0].called_at[0] is None


def test_a_size_mismatch_from_one_place_says_no_place(tmp_path: Path) -> None:
    _, ranks = _world()
    for rank in ranks:
        rank.collective(WORLD, sizes=((8,),) if rank.rank == 2 else ((4,),), state="scheduled")
        _called(rank, LOSS)
    report = hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False)
    assert report.kind.body == (
        "rank 2 differs on all_reduce #2 on default, ranks 0-3: input sizes [[8]] (rank 2) where ranks 0-1, 3 have "
        "[[4]]"
    )
    assert (report.kind.name, report.kind.variant, report.kind.ranks) == ("mismatch", "sizes", (2,))
    assert report.line == f"mismatch (sizes): {report.kind.body}; fix: the sizes rank 2 passes to all_reduce #2"


def test_a_checkout_at_another_path_is_the_same_place(tmp_path: Path) -> None:
    """Rank 2's node holds the script elsewhere: same file name, line and function, so no place is said."""
    _, ranks = _world()
    for rank in ranks:
        rank.collective(WORLD, sizes=((8,),) if rank.rank == 2 else ((4,),), state="scheduled")
        _called(rank, ("/node2/job/train.py", 86, "step") if rank.rank == 2 else LOSS)
    report = hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False)
    assert report.kind.body.endswith("where ranks 0-1, 3 have [[4]]"), report.kind.body
    assert same_place(Frame("/a/train.py", 1, "f"), Frame("/b/train.py", 1, "f"))
    assert not same_place(Frame("/a/train.py", 1, "f"), Frame("/a/eval.py", 1, "f"))


def test_a_two_against_two_mismatch_from_two_places_says_both(tmp_path: Path) -> None:
    _, ranks = _world()
    for rank in ranks:
        rank.collective(WORLD, sizes=((2,),) if rank.rank < 2 else ((4,),), state="scheduled")
        _called(rank, METRIC if rank.rank < 2 else LOSS)
    report = hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False)
    assert report.kind.body.endswith(
        "rank 3: [[4]]; called from /job/train.py:84 in step (ranks 0-1), /job/train.py:86 in step (ranks 2-3)"
    ), report.kind.body


# --- what is kept, and --json -------------------------------------------------------------------------------------


def test_json_carries_where_each_rank_called(tmp_path: Path, capfd) -> None:
    directory = _skipped(tmp_path, 1)
    assert main(["hang-report", "--json", str(directory)]) == 1
    finding = json.loads(capfd.readouterr().out)["findings"][0]
    loss, metric = ({"file": f, "line": n, "function": fn} for f, n, fn in (LOSS, METRIC))
    assert finding["called_at"] == {"0": metric, "1": metric, "2": metric, "3": loss}


def test_only_the_innermost_user_frame_is_kept_and_ranks_share_it(tmp_path: Path) -> None:
    directory = _stall(tmp_path, {0: LOSS, 1: LOSS, 2: LOSS})
    dumps = {d.rank: d for d in loader.load_dumps(directory)}
    wheres = [d.last[("0", "nccl")].where for d in dumps.values()]
    assert wheres[:3] == [Frame(*LOSS)] * 3 and wheres[0] is wheres[1] is wheres[2], "one object for one place"
    assert dumps[0].calls[("0", "nccl")] == {1: Frame(*LOSS), 2: Frame(*LOSS)}
    torch_frame = Frame(TORCH[0]["filename"], TORCH[0]["line"], TORCH[0]["name"])
    assert user_frame([torch_frame, Frame("torch/distributed/x.py", 1, "f"), Frame(*SHIM)]) is None


def test_frames_are_read_only_where_kept(tmp_path: Path) -> None:
    """A malformed ``frames`` on an entry the reduction keeps is exit 2 naming it; on one it skips, it is not read
    for a stall (exit 1), and a healthy verdict, which checks every field, refuses it (exit 2)."""
    _, ranks = _world()
    for _ in range(3 * dump_format.CALLS_KEPT):
        for rank in ranks:
            rank.collective(WORLD)
    ranks[1].entries[0]["frames"] = "not frames"
    with pytest.raises(hang_report.DumpError, match=r"nccl_trace_rank_1: entry 0 'frames' is 'not frames' \(str\)"):
        hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False)
    ranks[0].collective(WORLD, state="scheduled")  # rank 0 waits in one more: a stall, read without the skipped entry
    assert hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False).exit_code == 1
    raw = pickle.loads((tmp_path / "nccl_trace_rank_1").read_bytes())
    raw["entries"][-1]["frames"] = [{"name": "f", "filename": b"x", "line": 1}]
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(raw))
    with pytest.raises(hang_report.DumpError, match=r"entry \d+ 'frames' holds .* not a frame \(name, filename"):
        hang_report.read_run(tmp_path, with_torch=False)


def test_a_hostile_frame_is_cut_to_size(tmp_path: Path) -> None:
    _, ranks = _world()
    for rank in ranks[:3]:
        rank.collective(WORLD, state="scheduled")
        _called(rank, ("/" + "x" * 100_000 + "/train.py", 86, "f" * 100_000))
    line = hang_report.read_run(_write_all(tmp_path, ranks), with_torch=False).kind.body
    assert len(line) < 600 and line.endswith("x/train.py:86 in " + "f" * 120), len(line)


def test_finding_line_without_stacks_is_the_findings_own(tmp_path: Path) -> None:
    report = hang_report.read_run(_stall(tmp_path, {0: LOSS, 1: LOSS, 2: LOSS}), with_torch=False)
    assert finding_line(report.findings[0], {}) == report.findings[0].line() == report.kind.body
