"""``--timeout-s`` as a bound on the whole command: the time left, the phase it is in, and a watchdog.

A command's phases each bound their own waits with what is left (:meth:`CommandClock.left`): the recipe is read
in a child process that is ended at the deadline (:mod:`nemo_rl_shim.cli.nemo_rl.bounded_read`), NeMo RL's import is
tried in one too, and the ranks get what is left when they start. What runs in this process and cannot bound
itself (importing torch, a runner's own calls) is covered by :meth:`CommandClock.watch`: a daemon thread that, a
phase's slack past the deadline, prints one line naming the phase (``--timeout-s 10 ran out while importing torch
and the checks``) and ends the process with the phase's exit code: 2 where the input could not be read in time, 1
otherwise. Before it ends the process it kills every process this one started, and theirs (:func:`end_descendants`):
a runner stuck in its own calls cannot leave its ranks (or the fork server they came from) running. Standard library
only: it runs before torch is imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SLACK_S", "CommandClock", "Phase", "descendants", "end_descendants"]

#: How long past the deadline the watchdog waits for a phase that bounds itself to end on its own.
SLACK_S = 5.0


@dataclass(frozen=True)
class Phase:
    """A phase of the command: in words (``"reading the recipe"``), the exit code if the time runs out in it, and
    the slack the watchdog gives it past the deadline (more for a phase that ends its own processes first)."""

    words: str
    code: int
    slack_s: float = SLACK_S


def _children(pid: int, proc: Path) -> list[int]:
    """``pid``'s children, from each of its threads' ``children`` file (Linux); none where it cannot be read."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found.extend(int(word) for word in (task / "children").read_text().split())
    return found


def _dead(pid: int, proc: Path) -> bool:
    """A zombie (ended, its parent has not reaped it yet), or gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"])


def descendants(pid: int | None = None, proc: Path = Path("/proc")) -> list[int]:
    """Every live process below ``pid`` (default: this one), parents before their children (a zombie's children are
    still walked); empty where ``/proc`` cannot tell (not Linux), so a caller never fails on it."""
    order: list[int] = []
    seen = {pid if pid is not None else os.getpid()}
    todo = list(seen)
    while todo:
        for child in _children(todo.pop(), proc):
            if child not in seen:
                seen.add(child)
                todo.append(child)
                if not _dead(child, proc):
                    order.append(child)
    return order


def end_descendants(pid: int | None = None) -> list[int]:
    """Stop every process below ``pid`` (default: this one) with ``SIGKILL``, all of them stopped first so that none
    starts another meanwhile; the pids signalled. Never raises: a process already gone is skipped."""
    found = descendants(pid)
    for child in found:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGSTOP)
    for child in descendants(pid) + found:  # any started between the first walk and the stop
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    return found


class CommandClock:
    """The deadline ``timeout_s`` after ``start`` (default: now), the phase the command is in, and a watchdog."""

    def __init__(
        self, timeout_s: float, *, start: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.deadline = (clock() if start is None else start) + timeout_s
        self.phase = Phase("starting", 1)
        self._stopped = threading.Event()
        self._changed = threading.Event()

    def left(self) -> float:
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self.deadline - self.clock())

    def enter(self, phase: Phase) -> None:
        """The command is now in ``phase``."""
        self.phase = phase
        self._changed.set()

    def ran_out(self, phase: Phase | None = None) -> str:
        """``"--timeout-s 10 ran out while reading the recipe"``."""
        return f"--timeout-s {self.timeout_s:g} ran out while {(phase or self.phase).words}"

    def watch(
        self,
        last_words: Callable[[str, int], None] | None = None,
        end: Callable[[int], object] = os._exit,
        clean_up: Callable[[], object] = end_descendants,
    ) -> threading.Thread:
        """Start the watchdog (see the module docstring): ``last_words(line, code)``, then ``clean_up()`` (every
        process this one started, ended), then ``end(code)``."""

        def run() -> None:
            while not self._stopped.is_set():
                phase = self.phase
                wait = self.deadline + phase.slack_s - self.clock()
                if wait <= 0:
                    self._expire(phase, last_words, end, clean_up)
                    return
                self._changed.wait(min(wait, 1.0))
                self._changed.clear()

        thread = threading.Thread(target=run, name="preflight-watchdog", daemon=True)
        thread.start()
        return thread

    def _expire(
        self,
        phase: Phase,
        last_words: Callable[[str, int], None] | None,
        end: Callable[[int], object],
        clean_up: Callable[[], object],
    ) -> None:
        line = self.ran_out(phase)
        print(f"preflight: {line}", file=sys.stderr, flush=True)
        try:
            if last_words is not None:
                last_words(line, phase.code)
        finally:
            try:
                clean_up()
            finally:
                end(phase.code)

    def stop(self) -> None:
        """Stop the watchdog (the command is ending on its own)."""
        self._stopped.set()
        self._changed.set()
