"""Run several commands at once, each bounded in time, and collect how each ended.

The suite's command-line tests mostly wait: on imports in fresh interpreters, on a rendezvous,
on a stalled rank's timeout. A module fixture that starts its commands together shares those
waits instead of adding them up. Each command gets its own process group
(``start_new_session``), so a command that outlives the bound is killed with every process it
started (torchrun's ranks, a preflight's ranks), and none is left when the fixture ends,
whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finished", "run_at_once"]


@dataclass
class Finished:
    """One command's end: ``returncode`` is None when it was killed at the bound (``timed_out``)."""

    args: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _run_one(args: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: Path) -> Finished:
    start = time.monotonic()
    process = subprocess.Popen(
        list(args), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        out, err = process.communicate()
        err += f"\n(killed by the test {timeout_s:g} s after its start)"
    finally:
        _kill_group(process)  # whatever the command left behind in its group, however it ended
        if process.poll() is None:
            process.wait()
    wall = time.monotonic() - start
    return Finished(list(args), None if timed_out else process.returncode, out, err, wall, timed_out)


def run_at_once(
    commands: Mapping[str, tuple[Sequence[str], Mapping[str, str]]], *, timeout_s: float, cwd: Path
) -> dict[str, Finished]:
    """Start every ``name: (args, env)`` now; each is killed, with its process group, ``timeout_s`` after its start."""
    with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        futures = {name: pool.submit(_run_one, args, env, timeout_s, cwd) for name, (args, env) in commands.items()}
        return {name: future.result() for name, future in futures.items()}
