"""A rank's CPU time and I/O counters while it stays in a watched block past its deadline, read by another process.

The stack watch (:mod:`.stack_watchdog`) samples a rank's Python stack more than once after a block's deadline;
whether the rank was working or asleep also shows in its counters: CPU time and bytes read or written. Those must
be read even while the rank holds the GIL (a C call that never releases it), where no Python thread of the rank can
run. So a small helper process reads them from ``/proc/<pid>/`` (``stat`` and ``io``, for the process and for the
thread that armed the block, ``/proc/<pid>/task/<tid>/``): it needs nothing of the rank but its files.

* **Started** by :func:`start` (the stack watch calls it when it first opens a rank's stack file): this file run by
  path (``python -I -S``), so it imports the standard library alone, never the rank's packages. It ends when the rank
  does (its parent changes) or when :func:`stop` ends it.
* **What it watches.** The stack file's header (written at each arming: the block, when it was entered, its deadline
  ``after_s``, the thread, how many samples and how far apart). Once the armed block is past its deadline it takes
  ``samples`` samples, ``interval_s`` apart, the first at the deadline, as long as the header names the same block.
* **What it writes.** ``fr_progress_rank_<rank>.jsonl`` beside the stack file, one JSON object a line
  (:func:`counters` per sample: ``cpu_s``, ``state`` and ``io`` of the process and of the thread, ``t_ns``, the
  block's ``entered_ns`` and ``pid`` to match the stack file's header), emptied at each new block's first sample: at
  most ``samples`` lines. Where ``/proc/<pid>/io`` cannot be read, ``io`` is null.

Where there is no ``/proc`` (not Linux), :func:`start` starts nothing and the stack samples alone tell.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

__all__ = ["FORMAT", "POLL_S", "counters", "main", "start", "stop"]

FORMAT = 1
#: How often the helper reads the stack file's header while no armed block is due.
POLL_S = 0.2
_IO_KEYS = ("rchar", "wchar", "read_bytes", "write_bytes")
_MAX_HEADER = 4096


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(4096).decode("ascii", errors="replace")
    except OSError:
        return None


def _task(base: str) -> dict[str, Any] | None:
    """``{"state", "cpu_s", "io"}`` of one ``/proc`` task folder (a process, or one of its threads); None if gone."""
    stat = _read(f"{base}/stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces and parentheses
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (IndexError, ValueError):
        return None
    io_text = _read(f"{base}/io")
    io = None
    if io_text is not None:
        found = dict(line.split(":", 1) for line in io_text.splitlines() if ":" in line)
        io = {key: int(found[key]) for key in _IO_KEYS if key in found and found[key].strip().isdigit()}
    return {"state": fields[0][:1], "cpu_s": round(ticks / os.sysconf("SC_CLK_TCK"), 3), "io": io}


def counters(pid: int, tid: int | None) -> dict[str, Any]:
    """The process's and the thread's counters now: ``{"t_ns", "process": {...}, "thread": {...} or None}``."""
    thread = _task(f"/proc/{pid}/task/{tid}") if tid else None
    return {"t_ns": time.time_ns(), "process": _task(f"/proc/{pid}"), "thread": thread}


def _header(stack_file: str, prefix: str) -> dict[str, Any] | None:
    try:
        with open(stack_file, "rb") as handle:
            first = handle.readline(_MAX_HEADER).decode("utf-8", errors="replace")
    except OSError:
        return None
    if not first.startswith(prefix):
        return None
    try:
        facts = json.loads(first[len(prefix) :])
    except ValueError:
        return None
    return facts if isinstance(facts, dict) else None


def _due(facts: dict[str, Any], taken: int) -> int | None:
    """When sample ``taken`` (0: the first) of the header's block falls due (``time.time_ns``); None if never."""
    entered, after, samples, interval = (facts.get(k) for k in ("entered_ns", "after_s", "samples", "interval_s"))
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (entered, after, samples, interval))
    if not numbers or taken >= samples:
        return None
    return int(entered + (after + taken * interval) * 1e9)


def _write(progress_file: str, line: dict[str, Any], first: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if first else os.O_APPEND)
    fd = os.open(progress_file, flags, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    """``progress_sampler.py PID STACK_FILE PROGRESS_FILE HEADER_PREFIX``: sample while PID is this one's parent."""
    pid, stack_file, progress_file, prefix = int(argv[0]), argv[1], argv[2], argv[3]
    block: tuple[Any, Any] | None = None
    taken, last_ns = 0, 0
    while os.getppid() == pid:
        facts = _header(stack_file, prefix)
        identity = None if facts is None else (facts.get("entered_ns"), facts.get("pid"))
        if identity != block:
            block, taken = identity, 0
        due = None if facts is None else _due(facts, taken)
        if due is not None and taken:  # a helper that woke late keeps its samples apart all the same
            due = max(due, last_ns + int(facts["interval_s"] * 1e9))
        now = time.time_ns()
        if facts is not None and due is not None and now >= due:
            tid = facts.get("tid") if isinstance(facts.get("tid"), int) else None
            line = {"format": FORMAT, "pid": pid, "tid": tid, "entered_ns": facts.get("entered_ns"), "sample": taken}
            sample = counters(pid, tid)
            with contextlib.suppress(OSError):  # a help to the report: an unwritable folder stops nothing
                _write(progress_file, {**line, **sample}, first=taken == 0)
            # The next is due an interval after this one's own time: under load the reading itself can be late
            taken, last_ns = taken + 1, max(now, sample["t_ns"])
            continue
        wait = POLL_S if due is None else min(POLL_S, max(0.0, (due - now) / 1e9))
        time.sleep(wait)
    return 0


def start(pid: int, stack_file: str, progress_file: str, prefix: str) -> subprocess.Popen[bytes] | None:
    """Start the helper for rank process ``pid`` (this process); None where it cannot run (no ``/proc``, no
    interpreter to run it with, or it fails to start: the stack samples alone then tell)."""
    if not os.path.isdir(f"/proc/{pid}") or not sys.executable:
        return None
    command = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(pid), stack_file, progress_file, prefix]
    try:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True
        )
    except OSError:
        return None


def stop(helper: subprocess.Popen[bytes] | None) -> None:
    """End a helper :func:`start` returned (and reap it)."""
    if helper is None or helper.poll() is not None:
        return
    helper.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        helper.wait(5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
