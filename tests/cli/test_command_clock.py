"""The command's clock (#46): ``--timeout-s`` from the start, the phase, and the watchdog that ends a stuck phase.

On a clock this test moves (no sleeping on the deadline): the watchdog fires a phase's slack past the deadline, with
that phase's line and exit code, follows a change of phase (and its slack), and never fires once stopped.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from nemo_rl_shim.cli.command_clock import CommandClock, Phase, descendants, end_descendants

READING = Phase("reading the recipe", 2, slack_s=1.0)
RANKS = Phase("running the ranks", 1, slack_s=50.0)


class Clock:
    """A monotonic clock that moves when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watched(clock: CommandClock) -> tuple[threading.Event, list[tuple[str, int]], list[int]]:
    """The watchdog started with stand-ins for its three acts; ``codes`` holds ``-1`` where the clean-up ran, so
    its place before the end is checked. (The real clean-up would end this test worker's own children.)"""
    ended, said, codes = threading.Event(), [], []

    def end(code: int) -> None:
        codes.append(code)
        ended.set()

    clock.watch(lambda line, code: said.append((line, code)), end, clean_up=lambda: codes.append(-1))
    return ended, said, codes


def test_left_counts_down_from_the_start_and_stops_at_zero() -> None:
    time = Clock()
    clock = CommandClock(10, clock=time)
    assert clock.left() == 10
    time.now += 4
    assert clock.left() == 6
    time.now += 60
    assert clock.left() == 0
    assert clock.ran_out(READING) == "--timeout-s 10 ran out while reading the recipe"


def test_the_watchdog_ends_a_phase_its_slack_past_the_deadline_with_its_code(capsys: pytest.CaptureFixture) -> None:
    time = Clock()
    clock = CommandClock(10, clock=time)
    clock.enter(READING)
    ended, said, codes = _watched(clock)
    time.now += 10.5  # past the deadline, within the slack
    clock.enter(READING)  # wakes the watchdog: nothing yet
    assert not ended.wait(0.3)
    time.now += 1.0
    clock.enter(READING)
    assert ended.wait(10), "the watchdog did not fire"
    assert said == [("--timeout-s 10 ran out while reading the recipe", 2)] and codes == [-1, 2]
    assert capsys.readouterr().err == "preflight: --timeout-s 10 ran out while reading the recipe\n"


def test_a_phase_with_more_slack_is_given_it_and_the_code_follows_the_phase() -> None:
    time = Clock()
    clock = CommandClock(10, clock=time)
    clock.enter(RANKS)
    ended, said, codes = _watched(clock)
    time.now += 30
    clock.enter(RANKS)
    assert not ended.wait(0.3), "the ranks' phase has 50 s of slack"
    time.now += 31
    clock.enter(RANKS)
    assert ended.wait(10)
    assert codes == [-1, 1] and said[0][0] == "--timeout-s 10 ran out while running the ranks"


def test_a_stopped_watchdog_never_fires() -> None:
    time = Clock()
    clock = CommandClock(1, clock=time)
    clock.enter(READING)
    ended, said, _ = _watched(clock)
    clock.stop()
    time.now += 100
    clock.enter(READING)
    assert not ended.wait(1.5) and said == []


_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_the_clean_up_ends_every_process_below_the_command_and_nothing_above() -> None:
    """A runner's rank (a child) and what that rank started (a grandchild) are both ended; the process asked about
    is not, nor any process outside its tree."""
    runner = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(runner.stdout.readline())
        assert descendants(runner.pid) == [grandchild]
        assert end_descendants(runner.pid) == [grandchild]
        end = time.monotonic() + 30
        while descendants(runner.pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert descendants(runner.pid) == [], "the grandchild outlived the clean-up"
        assert runner.poll() is None, "the clean-up ended the process it was asked about"
    finally:
        runner.kill()
        runner.wait(30)


def test_the_clean_up_of_a_process_that_is_gone_finds_nothing_and_does_not_raise() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    assert descendants(gone.pid) == [] and end_descendants(gone.pid) == []
