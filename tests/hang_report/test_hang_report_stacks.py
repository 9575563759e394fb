"""``hang-report`` with stack files: reading them (hostile ones too), the first line with places, the stacks section.

Stack files here are written by hand in faulthandler's format, as
:mod:`nemo_rl_shim.flight_recorder.stack_watchdog` writes them
(tests/flight_recorder/test_stack_watchdog.py and test_hang_kinds.py make real ones). The findings are built directly
(:class:`~nemo_rl_shim.hang_report.analysis.Finding`), so only the placing is under test here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.flight_recorder.names import HEADER, STACK_FILE_NAME
from nemo_rl_shim.hang_report.analysis import Analysis, Finding, GroupState
from nemo_rl_shim.hang_report.render import STACK_GROUPS_SHOWN, render_text, report_json, stack_lines
from nemo_rl_shim.hang_report.stacks import (
    MAX_STACK_BYTES,
    Frame,
    find_stacks,
    group_stacks,
    is_runtime_frame,
    load_stacks,
    parse_stack,
    read_stack,
)
from nemo_rl_shim.hang_report.where import finding_line

MAIN, WORKER = 0x7F00000000AA, 0x7F00000000BB
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
STDLIB = "/usr/lib/python3.11/threading.py"


def _header(rank: int = 3, what: Any = "train step", after_s: Any = 8.0, thread: Any = MAIN, **more: Any) -> str:
    label = f"0x{thread:016x}" if isinstance(thread, int) else thread
    facts = {"format": 1, "rank": rank, "pid": 4242, "thread": label, "what": what, "after_s": after_s}
    return HEADER + json.dumps({**facts, **more}) + "\n"


def _thread(ident: int, frames: list[tuple[str, int, str]], current: bool = False) -> str:
    lines = [f"{'Current thread' if current else 'Thread'} 0x{ident:016x} (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {function}' for file, line, function in frames]
    return "\n".join(lines) + "\n\n"


SLEEPING = [("/job/data.py", 57, "load_batch"), ("/job/train.py", 80, "step"), ("/job/train.py", 99, "<module>")]
IN_ALL_REDUCE = [(TORCH, 2800, "all_reduce"), ("/job/train.py", 70, "step"), ("/job/train.py", 99, "<module>")]
WATCHER = [("/job/watch.py", 10, "poll"), (STDLIB, 982, "run"), (STDLIB, 1045, "_bootstrap_inner")]


def _stack_text(frames: list[tuple[str, int, str]], **header: Any) -> str:
    return _header(**header) + "Timeout (0:00:08)!\n" + _thread(WORKER, WATCHER) + _thread(MAIN, frames)


def _write(directory: Path, rank: int, text: str) -> Path:
    path = directory / STACK_FILE_NAME.format(rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- reading ------------------------------------------------------------------------------------------------------


def test_the_watched_thread_is_the_one_the_header_names(tmp_path: Path) -> None:
    stack = parse_stack(_stack_text(SLEEPING), 3, tmp_path / "f")
    assert stack.fired and stack.threads == 2
    assert stack.frames[0] == Frame("/job/data.py", 57, "load_batch")
    assert (stack.what, stack.after_s, stack.pid, stack.thread) == ("train step", 8.0, 4242, f"0x{MAIN:016x}")
    assert list(stack.other_threads) == [f"0x{WORKER:016x}"]
    assert stack.user_frame == Frame("/job/data.py", 57, "load_batch")
    assert not stack.in_torch_distributed


def test_the_header_chooses_the_thread_wherever_it_is_listed() -> None:
    stack = parse_stack(_stack_text(SLEEPING, thread=WORKER), 3, Path("f"))
    assert stack.frames[0] == Frame("/job/watch.py", 10, "poll")
    assert list(stack.other_threads) == [f"0x{MAIN:016x}"]


def test_without_a_header_the_last_thread_listed_is_read() -> None:
    """A loop that arms faulthandler.dump_traceback_later itself: no header; the main thread is listed last."""
    text = "Timeout (0:00:08)!\n" + _thread(WORKER, WATCHER) + _thread(MAIN, SLEEPING)
    stack = parse_stack(text, 2, Path("f"))
    assert stack.fired and stack.what is None and stack.frames[0].function == "load_batch"
    current = parse_stack(_thread(WORKER, WATCHER, current=True) + _thread(MAIN, SLEEPING), 2, Path("f"))
    assert current.frames[0].function == "poll", "faulthandler's 'Current thread' wins where there is no header"


def test_of_several_dumps_in_one_file_the_last_stands() -> None:
    text = "Timeout (0:00:08)!\n" + _thread(MAIN, IN_ALL_REDUCE) + "Timeout (0:00:08)!\n" + _thread(MAIN, SLEEPING)
    assert parse_stack(text, 1, Path("f")).frames[0].function == "load_batch"
    assert parse_stack(_header() + text, 1, Path("f")).frames[0].function == "load_batch", "the header's thread too"


def test_the_user_frame_skips_torch_the_shim_and_the_standard_library() -> None:
    stack = parse_stack(_stack_text(IN_ALL_REDUCE), 3, Path("f"))
    assert stack.in_torch_distributed
    assert stack.user_frame == Frame("/job/train.py", 70, "step")
    assert is_runtime_frame(Frame(STDLIB, 1, "run"))
    assert is_runtime_frame(Frame("/repo/nemo_rl_shim/flight_recorder/recorder.py", 1, "dump_on_timeout"))
    assert is_runtime_frame(Frame("<frozen runpy>", 88, "_run_code"))
    assert not is_runtime_frame(Frame("/venv/lib/python3.11/site-packages/nemo_automodel/x.py", 1, "f"))
    assert not is_runtime_frame(Frame("/usr/lib/python3/dist-packages/ray/worker.py", 1, "f"))
    only_torch = parse_stack(_header() + _thread(MAIN, [(TORCH, 5, "barrier")]), 3, Path("f"))
    assert only_torch.user_frame == Frame(TORCH, 5, "barrier"), "no user frame: the innermost one"


def test_a_header_alone_is_a_block_armed_without_a_stack() -> None:
    stack = parse_stack(_header(what="checkpoint"), 1, Path("f"))
    assert (stack.fired, stack.what, stack.frames) == (False, "checkpoint", ())


@pytest.mark.parametrize(
    ("text", "note"),
    [
        (HEADER + "{not json\n" + _thread(MAIN, SLEEPING), "header is not JSON"),
        (HEADER + "[1, 2]\n" + _thread(MAIN, SLEEPING), "header is not a JSON object (got list)"),
    ],
)
def test_a_bad_header_is_noted_and_the_stack_still_read(text: str, note: str) -> None:
    stack = parse_stack(text, 1, Path("f"))
    assert stack.note.startswith(note) and stack.fired and stack.frames[0].function == "load_batch"


def test_hostile_header_values_are_dropped() -> None:
    text = _header(what=["x"], after_s=True, pid="1; rm -rf", thread="0xzz", entered_ns=1.5) + _thread(MAIN, SLEEPING)
    stack = parse_stack(text, 1, Path("f"))
    assert (stack.what, stack.after_s, stack.pid, stack.entered_ns) == (None, None, None, None)
    assert stack.thread is None or stack.thread == f"0x{MAIN:016x}", "an invalid thread id is not used to choose"


def test_garbage_binary_and_oversized_files_read_without_raising(tmp_path: Path) -> None:
    binary = tmp_path / "b"
    binary.write_bytes(b"\xff\xfe\x00" * 1000 + b"\n" + _thread(MAIN, SLEEPING).encode())
    assert read_stack(binary, 1).frames[0].function == "load_batch"
    big = tmp_path / "big"
    big.write_bytes(_thread(MAIN, SLEEPING).encode() + b"x" * MAX_STACK_BYTES)
    stack = read_stack(big, 1)
    assert stack.truncated and stack.note.startswith("longer than") and stack.fired
    assert read_stack(tmp_path / "missing", 1).note.startswith("cannot be read")
    cut = parse_stack(_thread(MAIN, SLEEPING) + "  ...\n", 1, Path("f"))
    assert cut.truncated, "faulthandler's '...' (more than 100 frames) is kept as truncated"


def test_stack_files_are_found_in_subfolders_by_their_exact_name(tmp_path: Path) -> None:
    _write(tmp_path / "node0", 0, _stack_text(SLEEPING))
    _write(tmp_path / "node1", 17, _stack_text(SLEEPING))
    _write(tmp_path / ".hidden", 5, _stack_text(SLEEPING))
    (tmp_path / "fr_stack_rank_x.txt").write_text("no")
    (tmp_path / "fr_stack_rank_1234567890.txt").write_text("a rank number past nine digits is not a rank")
    (tmp_path / "fr_stack_rank_3.txt.partial").write_text("no")
    assert sorted(find_stacks(tmp_path)) == [0, 17]


def test_identical_stacks_are_grouped_with_the_outliers_first(tmp_path: Path) -> None:
    for rank in range(6):
        _write(tmp_path, rank, _stack_text(SLEEPING if rank == 4 else IN_ALL_REDUCE, rank=rank))
    _write(tmp_path, 6, _header(rank=6))  # armed, no stack
    stacks = load_stacks(tmp_path)
    assert [ranks for _, ranks in group_stacks(stacks)] == [[4], [0, 1, 2, 3, 5]]
    lines = stack_lines(stacks)
    assert lines[:3] == [
        '  rank 4, 8.0 s into "train step":',
        "    /job/data.py:57 in load_batch",
        "    /job/train.py:80 in step",
    ]
    assert '  ranks 0-3, 5, 8.0 s into "train step":' in lines
    assert lines[-1] == '  inside a watched block ("train step") when last written, no stack: rank 6'


def test_at_most_a_few_groups_are_printed(tmp_path: Path) -> None:
    for rank in range(STACK_GROUPS_SHOWN + 3):
        _write(tmp_path, rank, _stack_text([("/job/train.py", 100 + rank, "step")], rank=rank))
    lines = stack_lines(load_stacks(tmp_path))
    assert lines[-1] == "  ... 3 more groups of stacks (--json has every rank's frames)"


# --- the first line -----------------------------------------------------------------------------------------------


def _group() -> GroupState:
    return GroupState("0", tuple(range(4)), ["default"], "default_pg")


def _finding(kind: str, ranks: list[int], waiting: list[int], detail: str = "") -> Finding:
    return Finding(kind, _group(), ranks, 6, "all_reduce", waiting, 3.04, 0, detail)


def _stacks(tmp_path: Path, frames: dict[int, list[tuple[str, int, str]]]) -> dict[int, Any]:
    for rank, stack in frames.items():
        _write(tmp_path, rank, _stack_text(stack, rank=rank))
    return load_stacks(tmp_path)


def test_a_stall_names_the_rank_the_collective_then_its_place_then_the_peers(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {3: SLEEPING})
    line = finding_line(_finding("stall", [3], [0, 1, 2]), stacks)
    assert line == (
        "rank 3 did not enter all_reduce #6 on default, ranks 0-3: at /job/data.py:57 in load_batch "
        '(its stack, 8.0 s into "train step"); ranks 0-2 waited 3.0 s in it'
    )


def test_without_stacks_the_finding_line_stands(tmp_path: Path) -> None:
    finding = _finding("stall", [3], [0, 1, 2])
    assert finding_line(finding, {}) == finding.line()
    _write(tmp_path, 3, _header())  # armed, never fired
    assert finding_line(finding, load_stacks(tmp_path)) == finding.line()


def test_no_dump_but_a_stack_outside_torch_distributed_did_not_enter(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {3: SLEEPING})
    line = finding_line(_finding("missing", [3], [0, 1, 2]), stacks)
    assert line == (
        "rank 3 did not enter all_reduce #6 on default, ranks 0-3: at /job/data.py:57 in load_batch "
        '(its stack, 8.0 s into "train step"; no dump from it); ranks 0-2 waited 3.0 s in it'
    )


def test_no_dump_and_a_stack_inside_torch_distributed_keeps_the_missing_line(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {3: IN_ALL_REDUCE})
    finding = _finding("missing", [3], [0, 1, 2])
    assert finding_line(finding, stacks) == (
        f'{finding.line()}; rank 3 at /job/train.py:70 in step (its stack, 8.0 s into "train step")'
    )


def test_the_peers_places_follow_grouped(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: SLEEPING, 3: SLEEPING})
    line = finding_line(_finding("stall", [3], [0, 1, 2]), stacks)
    assert line.endswith(
        "ranks 0-2 waited 3.0 s in it"
        " (their stacks: rank 2 at /job/data.py:57 in load_batch; ranks 0-1 at /job/train.py:70 in step)"
    ), line


def test_of_several_ranks_that_did_not_enter_each_place_is_named(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {2: SLEEPING})
    line = finding_line(_finding("stall", [2, 3], [0, 1]), stacks)
    assert line == (
        "ranks 2-3 did not enter all_reduce #6 on default, ranks 0-3: rank 2 at /job/data.py:57 in load_batch "
        '(its stack, 8.0 s into "train step"); ranks 0-1 waited 3.0 s in it'
    )


def test_other_findings_keep_their_line_and_gain_the_places(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {2: SLEEPING})
    finding = _finding("mismatch", [2], [], "input sizes [[8]] (rank 2) where ranks 0-1, 3 have [[4]]")
    assert finding_line(finding, stacks) == (
        f'{finding.line()}; rank 2 at /job/data.py:57 in load_batch (its stack, 8.0 s into "train step")'
    )


def _report(tmp_path: Path, findings: list[Finding], missing: list[int] | None = None) -> hang_report.HangReport:
    analysis = Analysis(findings, [_group()], missing or [], {}, 4)
    return hang_report.HangReport(tmp_path, analysis, {"torch": "x", "outcome": "skipped", "error": "e"},
                                  load_stacks(tmp_path))  # fmt: skip


def test_a_stack_alone_is_a_finding_and_exits_1(tmp_path: Path) -> None:
    _stacks(tmp_path, {3: SLEEPING})
    report = _report(tmp_path, [])
    assert report.exit_code == hang_report.EXIT_FOUND
    assert report.line.startswith(
        'stayed in a block: rank 3 stayed in a watched block past its deadline (8.0 s into "train step"): at '
        "/job/data.py:57 in load_batch"
    ), report.line
    assert report.line.endswith("; fix: what rank 3 waits for at data.py:57 in load_batch"), report.line
    missing = _report(tmp_path, [], [1])
    assert missing.line.startswith("no dump from rank 1; rank 3 stayed in a watched block"), missing.line


def test_text_and_json_carry_the_stacks(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path, {3: SLEEPING, 0: IN_ALL_REDUCE})
    analysis = Analysis([], [_group()], [], {}, 4)
    text = render_text("first", analysis, tmp_path, {"torch": "x", "outcome": "skipped", "error": "e"}, stacks)
    assert "stacks (where each rank was once its block ran past the timeout and grace):" in text.splitlines()
    payload = report_json("first", 1, analysis, tmp_path, {"torch": "x"}, stacks)
    assert sorted(payload["stacks"]) == [0, 3]
    assert payload["stacks"][3]["frames"] == [{"file": f, "line": n, "function": fn} for f, n, fn in SLEEPING]
    assert payload["stacks"][3]["user_frame"] == {"file": "/job/data.py", "line": 57, "function": "load_batch"}
    assert payload["stacks"][0]["in_torch_distributed"] is True
    json.dumps(payload)
