"""Was a rank still working: each rule of :func:`~nemo_rl_shim.hang_report.progress.judge` on samples and
counters built for it, at the edges of its thresholds.

The files read and judged whole: tests/hang_report/test_hang_report_progress.py; real ranks:
tests/hang_report/test_hang_kinds_progress.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.counters import Counters, CounterSample
from nemo_rl_shim.hang_report.frames import frame
from nemo_rl_shim.hang_report.progress import (
    CANNOT_JUDGE,
    MIN_BYTES,
    MIN_CPU_SHARE,
    MIN_SPAN_S,
    NOT_WORKING,
    WORKING,
    judge,
    judge_all,
)
from nemo_rl_shim.hang_report.stacks import RankStack, StackSample

pytestmark = [pytest.mark.every_lane]

ENTERED = 1_000_000_000_000
A = (frame("/job/ckpt.py", 88, "write_shard"), frame("/job/train.py", 120, "save"))
B = (frame("/job/ckpt.py", 91, "write_shard"), frame("/job/train.py", 120, "save"))


def _stack(*samples: tuple, what: str | None = "checkpoint save", fired: bool = True) -> RankStack:
    """A stack file's samples, one a second from 35 s into the block."""
    taken = tuple(StackSample(frames, ENTERED + (35 + i) * 10**9) for i, frames in enumerate(samples))
    return RankStack(3, Path("/d/fr_stack_rank_3.txt"), frames=samples[-1] if samples else (), samples=taken,
                     fired=fired, what=what, entered_ns=ENTERED, after_s=35.0)  # fmt: skip


def _task(cpu: float | None = 1.0, **io: int) -> Counters:
    return Counters(cpu, "S", io)


def _at(seconds: float, process: Counters | None = None, thread: Counters | None = None) -> CounterSample:
    """A counters sample ``seconds`` after the first one."""
    return CounterSample(0, ENTERED + 35 * 10**9 + round(seconds * 1e9), 1, ENTERED, process, thread)


# --- the stack moved ------------------------------------------------------------------------------------------------


def test_the_stack_moved_where_two_samples_in_a_row_differ() -> None:
    assert judge(_stack(A), []).moved is None  # one sample: nothing to compare
    assert judge(_stack(A, A, A), []).moved is False
    moved = judge(_stack(A, A, B), [])
    assert (moved.moved, moved.verdict, moved.reason) == (True, WORKING, "stack moved")


def test_two_samples_are_enough_to_say_the_stack_did_not_move() -> None:
    assert judge(_stack(A, A), []).reason == (
        "the stack did not move in 2 samples, and no counters tell a C call from sleep"
    )  # fmt: skip
    idle = judge(_stack(A, A), [_at(0, _task(1.0)), _at(2, _task(1.0))])
    assert (idle.verdict, idle.reason) == (
        NOT_WORKING, "no CPU, no I/O of the process in 2.0 s; the stack did not move in 2 samples"
    )  # fmt: skip


def test_a_stack_that_did_not_move_and_no_counters_cannot_be_judged() -> None:
    found = judge(_stack(A, A, A), [])
    assert (found.verdict, found.reason) == (
        CANNOT_JUDGE, "the stack did not move in 3 samples, and no counters tell a C call from sleep"
    )  # fmt: skip
    assert (judge(_stack(A), []).reason, judge(_stack(), []).reason) == ("one sample", "no sample")


# --- whose counters -------------------------------------------------------------------------------------------------


def test_the_threads_counters_judge_where_two_samples_have_them_else_the_processs() -> None:
    """Thread counters in one sample only (the helper lost the thread) hide nothing: the process's, in all, judge."""
    process = [_task(0.0), _task(1.0), _task(2.0)]
    once = [_at(0, process[0], _task(0.0)), _at(1, process[1]), _at(2, process[2])]
    found = judge(_stack(A, A, A), once)
    assert (found.of, found.cpu_s, found.verdict) == ("process", 2.0, WORKING)
    twice = [_at(0, process[0], _task(0.0)), _at(1, process[1]), _at(2, process[2], _task(0.0))]
    found = judge(_stack(A, A, A), twice)
    assert (found.of, found.cpu_s, found.verdict) == ("thread", 0.0, NOT_WORKING)
    assert found.reason == "no CPU, no I/O of its thread in 2.0 s; the stack did not move in 3 samples"
    neither = judge(_stack(A), [_at(0), _at(2)])
    assert (neither.of, neither.verdict, neither.counter_samples) == (None, CANNOT_JUDGE, 2)


def test_the_process_is_named_where_its_counters_judge() -> None:
    found = judge(_stack(A), [_at(0, _task(1.0)), _at(2, _task(1.0))])
    assert (found.verdict, found.reason) == (NOT_WORKING, "no CPU, no I/O of the process in 2.0 s")


# --- CPU, bytes and the span ----------------------------------------------------------------------------------------


def test_cpu_time_that_went_down_is_no_progress() -> None:
    """A counter that went back (a new thread with the same id, a wrapped counter) is no work, however large."""
    found = judge(_stack(A), [_at(0, _task(5.0)), _at(2, _task(3.0))])
    assert (found.cpu_s, found.verdict) == (0.0, NOT_WORKING)
    assert judge(_stack(A), [_at(0, _task(None)), _at(2, _task(3.0))]).cpu_s is None
    assert judge(_stack(A), [_at(0, _task(1.0)), _at(2, _task(None))]).cpu_s is None


def test_a_tenth_of_a_core_is_working_and_less_is_not() -> None:
    assert MIN_CPU_SHARE == 0.10
    at_share = judge(_stack(A), [_at(0, _task(0.0)), _at(2, _task(0.2))])
    assert (at_share.verdict, at_share.reason) == (WORKING, "CPU +0.2 s in 2.0 s")
    below = judge(_stack(A), [_at(0, _task(0.0)), _at(2, _task(0.199))])
    assert below.verdict == NOT_WORKING


def test_a_task_runnable_at_every_sample_is_working_however_little_cpu_a_loaded_host_gave_it() -> None:
    """#42's seed 1085: a computing rank got 7% of a core at a load of 20, its stack on one line, its thread ``R`` at
    all 3 samples. Runnable throughout is computing; one sample asleep (``S``) and it is not."""

    def runnable(cpu: float, state: str = "R") -> Counters:
        return Counters(cpu, state, {})

    starved = [_at(0, thread=runnable(5.78)), _at(1, thread=runnable(6.06)), _at(2, thread=runnable(5.92))]
    found = judge(_stack(A, A, A), starved)
    assert (found.verdict, found.reason, found.of) == (WORKING, "runnable at all 3 samples", "thread")
    once_asleep = [_at(0, thread=runnable(5.78)), _at(1, thread=runnable(5.8, "S")), _at(2, thread=runnable(5.9))]
    assert judge(_stack(A, A, A), once_asleep).verdict == NOT_WORKING
    in_io_wait = [_at(0, thread=runnable(1.0, "D")), _at(2, thread=runnable(1.0, "D"))]
    assert judge(_stack(A, A), in_io_wait).verdict == NOT_WORKING
    too_close = [_at(0, thread=runnable(1.0)), _at(0.2, thread=runnable(1.0))]  # under MIN_SPAN_S: judges nothing
    assert judge(_stack(A), too_close).verdict == CANNOT_JUDGE


def test_cpu_alone_counts_over_a_span_shorter_than_a_second() -> None:
    found = judge(_stack(A), [_at(0, _task(0.0)), _at(0.5, _task(0.05))])
    assert (found.verdict, found.reason) == (WORKING, "CPU +0.1 s in 0.5 s")


def test_64_kib_read_or_written_is_working_and_less_is_not() -> None:
    assert MIN_BYTES == 64 * 1024
    for key, verb in (("wchar", "written"), ("write_bytes", "written"), ("rchar", "read"), ("read_bytes", "read")):
        enough = judge(_stack(A), [_at(0, _task(0.0, **{key: 1000})), _at(2, _task(0.0, **{key: 1000 + MIN_BYTES}))])
        assert (enough.verdict, enough.reason) == (WORKING, f"65,536 bytes {verb}"), key
        less = judge(_stack(A), [_at(0, _task(0.0, **{key: 1000})), _at(2, _task(0.0, **{key: 999 + MIN_BYTES}))])
        assert less.verdict == NOT_WORKING, key


def test_the_bytes_are_the_largest_growth_of_the_counters_both_samples_hold() -> None:
    first = _task(0.0, rchar=0, read_bytes=0, wchar=10)
    last = _task(0.0, rchar=300_000, read_bytes=5, write_bytes=2_000_000)  # wchar gone, write_bytes new
    found = judge(_stack(A), [_at(0, first), _at(2, last)])
    assert (found.read, found.written) == (300_000, None)
    assert found.reason == "0.3 MB read"


def test_bytes_read_and_written_are_shown_in_their_unit() -> None:
    def shown(count: int) -> str:
        return judge(_stack(A), [_at(0, _task(0.0, wchar=0)), _at(2, _task(0.0, wchar=count))]).reason

    assert (shown(99_999), shown(100_000), shown(999_999_999), shown(10**9)) == (
        "99,999 bytes written", "0.1 MB written", "1000.0 MB written", "1.0 GB written"
    )  # fmt: skip


def test_every_sign_of_work_is_said_in_one_reason() -> None:
    found = judge(_stack(A, B), [_at(0, _task(0.0, rchar=0, wchar=0)), _at(2, _task(1.0, rchar=10**6, wchar=10**6))])
    assert found.reason == "stack moved; CPU +1.0 s in 2.0 s; 1.0 MB written; 1.0 MB read"


def test_counter_samples_closer_than_a_quarter_second_judge_nothing() -> None:
    assert MIN_SPAN_S == 0.25
    busy = (_task(0.0, wchar=0), _task(5.0, wchar=10**8))
    short = judge(_stack(A), [_at(0, busy[0]), _at(0.249, busy[1])])
    assert (short.verdict, short.cpu_s, short.span_s) == (CANNOT_JUDGE, None, None)
    enough = judge(_stack(A), [_at(0, busy[0]), _at(0.25, busy[1])])
    assert (enough.verdict, enough.span_s) == (WORKING, 0.25)
    assert enough.to_json()["span_s"] == 0.25


# --- what the judgement carries -------------------------------------------------------------------------------------


def test_how_long_the_block_ran_is_from_its_entry_to_the_newest_sample() -> None:
    stack = _stack(A, A)  # stack samples at 35 s and 36 s
    assert judge(stack, []).ran_s == 36.0
    assert judge(stack, [_at(0), _at(4.5)]).ran_s == 39.5  # the counters' newest is later
    before = CounterSample(0, ENTERED - 10, 1, ENTERED, None, None)
    early = _stack()
    assert judge(early, [before]).ran_s == 35.0  # a sample before the entry says nothing: the header's after_s
    assert judge(early, []).ran_s == 35.0


def test_a_sample_without_a_time_or_at_the_entry_itself() -> None:
    untimed = RankStack(3, Path("/d/fr_stack_rank_3.txt"), frames=A, samples=(StackSample(A, None),), fired=True,
                        entered_ns=ENTERED, after_s=35.0)  # fmt: skip
    assert judge(untimed, []).ran_s == 35.0  # the header's after_s
    assert judge(untimed, [_at(4.5)]).ran_s == 39.5  # the counters' time, the untimed sample passed over
    at_entry_counted = CounterSample(0, ENTERED, 1, ENTERED, None, None)
    assert judge(untimed, [at_entry_counted]).ran_s == 0.0  # a sample at the entry itself: it had just begun
    out_of_order = (StackSample(A, ENTERED + 40 * 10**9), StackSample(A, ENTERED + 36 * 10**9))
    late_first = RankStack(3, Path("/d/fr_stack_rank_3.txt"), frames=A, fired=True, entered_ns=ENTERED, after_s=35.0,
                           samples=out_of_order)  # fmt: skip
    assert judge(late_first, []).ran_s == 40.0  # the latest time of any sample
    at_entry = RankStack(3, Path("/d/fr_stack_rank_3.txt"), frames=A, samples=(StackSample(A, ENTERED),), fired=True,
                         entered_ns=ENTERED, after_s=35.0)  # fmt: skip
    assert judge(at_entry, []).ran_s == 0.0


def test_the_phase_is_the_watched_block_else_the_function_the_rank_was_in() -> None:
    assert judge(_stack(A), []).phase == "checkpoint save"
    assert judge(_stack(A, what=None), []).phase == "write_shard"
    assert judge(_stack(what=None), []).phase is None


def test_the_judgement_as_json() -> None:
    found = judge(_stack(A, B), [_at(0, _task(0.0, wchar=0)), _at(2.0004, _task(0.5, wchar=7))])
    assert found.to_json() == {
        "verdict": WORKING, "reason": "stack moved; CPU +0.5 s in 2.0 s", "stack_samples": 2, "counter_samples": 2,
        "moved": True, "cpu_s": 0.5, "of": "process", "read_bytes": None, "written_bytes": 7, "span_s": 2.0,
        "ran_s": 37.0, "phase": "checkpoint save", "where": B[0].to_json(),
    }  # fmt: skip
    assert found.working and not judge(_stack(A), []).working
    bare = judge(_stack(what=None), []).to_json()
    assert (bare["span_s"], bare["where"], bare["moved"]) == (None, None, None)
    timeless = RankStack(3, Path("/d/fr_stack_rank_3.txt"), fired=True)  # no header time, no sample time
    assert judge(timeless, []).to_json()["ran_s"] is None


def test_only_ranks_whose_watchdog_wrote_a_stack_are_judged(tmp_path: Path) -> None:
    fired = RankStack(1, tmp_path / "fr_stack_rank_1.txt", frames=A, samples=(StackSample(A, 5),), fired=True)
    quiet = RankStack(2, tmp_path / "fr_stack_rank_2.txt")
    found = judge_all({1: fired, 2: quiet}, tmp_path)
    assert list(found) == [1] and found[1].reason == "one sample"
