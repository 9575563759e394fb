"""Was a rank still working: the stack samples and counters files read, and each rule of the judgement.

Files written by hand in the formats :mod:`nemo_rl_shim.flight_recorder.stack_watchdog` and
:mod:`nemo_rl_shim.flight_recorder.progress_sampler` write (tests/flight_recorder/test_stack_watchdog.py makes real
ones; tests/hang_report/test_hang_kinds.py judges real ranks). Hostile counters files read without raising.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_shim.flight_recorder.names import HEADER, PROGRESS_FILE_NAME, SAMPLE_MARK, STACK_FILE_NAME
from nemo_rl_shim.hang_report.counters import MAX_COUNTER_BYTES, counters_for, parse_counters
from nemo_rl_shim.hang_report.progress import (
    CANNOT_JUDGE,
    MIN_BYTES,
    NOT_WORKING,
    WORKING,
    judge,
)
from nemo_rl_shim.hang_report.stacks import read_stack

pytestmark = [pytest.mark.every_lane]

MAIN = 0x7F00000000AA
ENTERED = 1_796_000_000_000_000_000
PID, TID = 4242, 4243
WRITING = [("/job/ckpt.py", 88, "write_shard"), ("/job/train.py", 120, "save"), ("/job/train.py", 99, "<module>")]
WRITING_ON = [("/job/ckpt.py", 91, "write_shard"), *WRITING[1:]]
SLEEPING = [("/job/data.py", 57, "load_batch"), ("/job/train.py", 80, "step"), ("/job/train.py", 99, "<module>")]


def _thread(frames: list[tuple[str, int, str]]) -> str:
    lines = [f"Thread 0x{MAIN:016x} (most recent call first):"]
    return "\n".join(lines + [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]) + "\n\n"


def _stack_file(directory: Path, samples: list[list[tuple[str, int, str]]], rank: int = 3) -> Path:
    header = {"format": 1, "rank": rank, "pid": PID, "thread": f"0x{MAIN:016x}", "tid": TID, "what": "checkpoint save",
              "entered_ns": ENTERED, "after_s": 35.0, "samples": 3, "interval_s": 1.0}  # fmt: skip
    text = HEADER + json.dumps(header) + "\n"
    for number, frames in enumerate(samples):
        if number == 0:
            text += "Timeout (0:00:35)!\n"
        else:
            text += SAMPLE_MARK + json.dumps({"sample": number, "t_ns": ENTERED + (35 + number) * 10**9}) + "\n"
        text += _thread(frames)
    path = directory / STACK_FILE_NAME.format(rank=rank)
    path.write_text(text)
    return path


def _line(number: int, cpu: float, wchar: int = 0, entered: int = ENTERED, of: str = "thread") -> dict[str, Any]:
    task = {"state": "S", "cpu_s": cpu, "io": {"rchar": 0, "wchar": wchar, "read_bytes": 0, "write_bytes": 0}}
    other = "process" if of == "thread" else "thread"
    return {"format": 1, "pid": PID, "tid": TID, "entered_ns": entered, "sample": number,
            "t_ns": entered + (35 + number) * 10**9, of: task, other: None}  # fmt: skip


def _counters_file(directory: Path, lines: list[dict[str, Any]], rank: int = 3) -> None:
    (directory / PROGRESS_FILE_NAME.format(rank=rank)).write_text("".join(json.dumps(x) + "\n" for x in lines))


def _judged(tmp_path: Path, stacks: list, lines: list[dict[str, Any]] | None = None):
    path = _stack_file(tmp_path, stacks)
    if lines is not None:
        _counters_file(tmp_path, lines)
    return judge(read_stack(path, 3))


def test_a_moving_stack_is_working_even_without_counters(tmp_path: Path) -> None:
    found = _judged(tmp_path, [WRITING, WRITING_ON, WRITING])
    assert (found.verdict, found.moved, found.counter_samples) == (WORKING, True, 0)
    assert found.reason == "stack moved"
    assert (found.phase, found.ran_s) == ("checkpoint save", 37.0)


def test_cpu_time_grown_is_working(tmp_path: Path) -> None:
    found = _judged(tmp_path, [WRITING] * 3, [_line(0, 10.0), _line(1, 10.9), _line(2, 11.8)])
    assert (found.verdict, found.moved, found.of) == (WORKING, False, "thread")
    assert found.reason == "CPU +1.8 s in 2.0 s"


def test_bytes_written_is_working(tmp_path: Path) -> None:
    found = _judged(tmp_path, [WRITING] * 3, [_line(0, 1.0, 0), _line(1, 1.0, MIN_BYTES), _line(2, 1.0, 30_000_000)])
    assert (found.verdict, found.written, found.reason) == (WORKING, 30_000_000, "30.0 MB written")


def test_nothing_grown_with_two_counter_samples_is_not_working(tmp_path: Path) -> None:
    found = _judged(tmp_path, [SLEEPING] * 3, [_line(0, 1.0, 100), _line(1, 1.0, 100), _line(2, 1.01, 200)])
    assert found.verdict == NOT_WORKING
    assert found.reason == "no CPU, no I/O of its thread in 2.0 s; the stack did not move in 3 samples"


def test_a_log_line_or_a_tick_of_cpu_is_not_work(tmp_path: Path) -> None:
    """Below the bars (MIN_CPU_SHARE of the span, MIN_BYTES): not working."""
    found = _judged(tmp_path, [SLEEPING] * 2, [_line(0, 1.0, 0), _line(2, 1.19, MIN_BYTES - 1)])
    assert found.verdict == NOT_WORKING, found


@pytest.mark.parametrize(
    ("stacks", "lines", "reason"),
    [
        ([SLEEPING], None, "one sample"),
        ([SLEEPING], [_line(0, 1.0)], "one sample"),
        ([SLEEPING] * 3, None, "the stack did not move in 3 samples, and no counters tell a C call from sleep"),
        (
            [SLEEPING] * 3,
            [_line(0, 1.0)],
            "the stack did not move in 3 samples, and no counters tell a C call from sleep",
        ),
    ],
)
def test_one_sample_or_an_unmoved_stack_alone_cannot_be_judged(tmp_path: Path, stacks, lines, reason: str) -> None:
    found = _judged(tmp_path, stacks, lines)
    assert (found.verdict, found.reason) == (CANNOT_JUDGE, reason)


def test_counters_of_another_block_do_not_count(tmp_path: Path) -> None:
    """A helper's lines from an earlier block, or another process, are not this block's evidence."""
    stale = [_line(0, 1.0, entered=ENTERED - 5), _line(1, 9.0, entered=ENTERED - 5)]
    found = _judged(tmp_path, [SLEEPING], stale)
    assert (found.verdict, found.counter_samples) == (CANNOT_JUDGE, 0)


def test_the_process_counters_stand_in_where_the_thread_has_none(tmp_path: Path) -> None:
    lines = [_line(0, 1.0, of="process"), _line(1, 1.0, of="process"), _line(2, 1.0, of="process")]
    found = _judged(tmp_path, [SLEEPING] * 3, lines)
    assert (found.verdict, found.of) == (NOT_WORKING, "process")
    assert found.reason.startswith("no CPU, no I/O of the process")


def test_samples_too_close_together_judge_nothing(tmp_path: Path) -> None:
    close = [_line(0, 1.0), {**_line(1, 1.0), "t_ns": ENTERED + 35 * 10**9 + 1000}]
    assert _judged(tmp_path, [SLEEPING], close).verdict == CANNOT_JUDGE


def test_no_counters_file_and_no_header_read_as_no_counters(tmp_path: Path) -> None:
    path = tmp_path / STACK_FILE_NAME.format(rank=3)
    path.write_text("Timeout (0:00:08)!\n" + _thread(SLEEPING))
    assert counters_for(read_stack(path, 3)) == ()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_any_bytes_read_as_counters_without_raising(data: bytes) -> None:
    for sample in parse_counters(data):
        assert sample.number >= 0 and sample.t_ns >= 0


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12))  # fmt: skip
def test_any_json_value_in_a_field_reads_without_raising(value: Any) -> None:
    base = _line(0, 1.0)
    for key in ("sample", "t_ns", "thread", "process", "entered_ns"):
        line = json.dumps({**base, key: value}).encode()
        parse_counters(line)
    nested = json.dumps({**base, "thread": {"cpu_s": value, "state": value, "io": value}}).encode()
    for sample in parse_counters(nested):
        assert sample.thread is None or all(isinstance(v, int) for v in sample.thread.io.values())


def test_a_counters_file_is_read_up_to_its_bound(tmp_path: Path) -> None:
    path = _stack_file(tmp_path, [SLEEPING])
    (tmp_path / PROGRESS_FILE_NAME.format(rank=3)).write_text(
        json.dumps(_line(0, 1.0)) + "\n" + "x" * MAX_COUNTER_BYTES
    )
    assert len(counters_for(read_stack(path, 3))) == 1
