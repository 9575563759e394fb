"""Where a rank is when it stays in a block too long: its Python stack, written by faulthandler's C watchdog.

:func:`arm` starts :func:`faulthandler.dump_traceback_later` for a block: once the block has run
``after_s`` seconds, a C thread of the interpreter writes every Python thread's stack to the rank's
stack file. It takes no GIL, so a rank stuck in a C call that holds the GIL (``ctypes.PyDLL``, an
extension that never releases it) still writes, where a Python watcher thread could not run.
:func:`disarm` on leaving the block cancels it. ``flight_recorder.dump_on_timeout`` arms it for its
block, ``flight_recorder.stack_watch`` without the dump.

* **One watchdog per process.** faulthandler has one, and each arming replaces the last. Nested or
  concurrent blocks are kept here, and the watchdog is armed for the block whose deadline comes first;
  when it leaves, for the next one.
* **The file** (:data:`.names.STACK_FILE_NAME`) is opened once per process and stays open: faulthandler
  writes to its descriptor. While a block is armed it holds one header line (:data:`.names.HEADER`, then
  JSON: rank, pid, the thread that armed, the block, when it was entered and how long it may run);
  when the watchdog fires, faulthandler's text follows (``Timeout (0:00:08)!``, then per thread
  ``Thread 0x... (most recent call first):`` and ``  File "...", line N in func``). Leaving the last
  block empties the file, so a file with a stack means "was inside the block past its deadline".
* **The first stack stays.** A block that fired and then ends with an exception keeps its stack, and
  this process arms nothing more (as a dump is never overwritten). One that fired and then ended
  normally was slow, not stuck: its stack is dropped.
* **fork.** A child forked while the watchdog is armed must not touch faulthandler's watchdog again
  (CPython's cancel then waits for a thread the child does not have, forever): :func:`arm` does
  nothing in such a child. A child forked while nothing was armed arms as usual.
"""

from __future__ import annotations

import faulthandler
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nemo_rl_shim.flight_recorder.names import HEADER, STACK_FILE_NAME

__all__ = [
    "arm",
    "armed_blocks",
    "disarm",
    "forget",
    "header_line",
    "stack_path",
    "thread_label",
]

_FORMAT = 1
#: The shortest delay handed to faulthandler (it refuses 0).
_MIN_DELAY_S = 0.001


def stack_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its stack in ``directory``."""
    return Path(directory) / STACK_FILE_NAME.format(rank=rank)


def thread_label(ident: int) -> str:
    """A thread's id as faulthandler writes it: ``0x00007f3a2b1c0740``."""
    return f"0x{ident:016x}"


@dataclass
class _Block:
    token: int
    what: str
    deadline: float  # time.monotonic()
    entered_ns: int  # time.time_ns()
    after_s: float
    thread: int


def header_line(rank: int, block: _Block) -> bytes:
    """The header that describes ``block`` (one line, ending in a newline)."""
    facts = {
        "format": _FORMAT,
        "rank": rank,
        "pid": os.getpid(),
        "thread": thread_label(block.thread),
        "what": block.what,
        "entered_ns": block.entered_ns,
        "after_s": round(block.after_s, 3),
    }
    return (HEADER + json.dumps(facts) + "\n").encode()


class _State:
    lock = threading.Lock()
    file: BinaryIO | None = None
    path: Path | None = None
    rank = -1
    blocks: list[_Block] = []  # noqa: RUF012 - process-wide, reset after fork
    armed: _Block | None = None  # the block the watchdog is armed for
    header_len = 0
    sealed = False  # a stack was kept: arm nothing more
    forked_armed = False  # forked while the watchdog ran: faulthandler's watchdog must not be touched again
    tokens = 0


def _after_fork_in_child() -> None:
    _State.lock = threading.Lock()
    _State.forked_armed = _State.forked_armed or _State.armed is not None
    _State.blocks, _State.armed, _State.file, _State.path = [], None, None, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _open(path: Path, rank: int) -> BinaryIO:
    if _State.file is not None and _State.path == path:
        return _State.file
    if _State.file is not None:
        _State.file.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    _State.file, _State.path, _State.rank = open(path, "wb", buffering=0), path, rank  # noqa: SIM115 - kept open
    return _State.file


def _empty(file: BinaryIO) -> None:
    os.lseek(file.fileno(), 0, os.SEEK_SET)
    os.ftruncate(file.fileno(), 0)


def _watch(block: _Block, now: float) -> None:
    """Arm faulthandler's watchdog for ``block`` (replacing its previous arming), its header first in the
    emptied file."""
    file = _State.file
    assert file is not None
    header = header_line(_State.rank, block)
    _empty(file)
    os.write(file.fileno(), header)
    _State.header_len = len(header)
    faulthandler.dump_traceback_later(max(block.deadline - now, _MIN_DELAY_S), file=file)
    _State.armed = block


def arm(path: Path, rank: int, what: str, after_s: float) -> int | None:
    """Start watching a block: after ``after_s`` seconds in it, its stack goes to ``path``; a token for
    :func:`disarm`, or None when this process arms nothing more (a kept stack, or forked while armed)."""
    with _State.lock:
        if _State.sealed or _State.forked_armed:
            return None
        now = time.monotonic()
        _State.tokens += 1
        block = _Block(_State.tokens, what, now + after_s, time.time_ns(), after_s, threading.get_ident())
        if _State.blocks and _State.path != path:  # another folder while armed: keep watching the first
            return None
        _open(path, rank)
        _State.blocks.append(block)
        # an armed block with a later deadline has not fired yet: its watch moves to this one
        if _State.armed is None or block.deadline < _State.armed.deadline:
            _watch(block, now)
        return block.token


def _fired() -> bool:
    """Whether faulthandler wrote after the header (call after cancelling: the watchdog is then done)."""
    assert _State.file is not None
    return os.fstat(_State.file.fileno()).st_size > _State.header_len


def disarm(token: int | None, *, failed: bool) -> None:
    """Leave the block of ``token``: ``failed`` when an exception ends it (a stack it left is then kept)."""
    if token is None:
        return
    with _State.lock:
        block = next((b for b in _State.blocks if b.token == token), None)
        if block is None:
            return
        _State.blocks.remove(block)
        if block is not _State.armed:
            return
        faulthandler.cancel_dump_traceback_later()
        _State.armed = None
        if _fired() and failed:
            _State.sealed = True  # the stack of a block that failed: kept, and nothing is armed after it
            return
        if _State.blocks:
            _watch(min(_State.blocks, key=lambda b: b.deadline), time.monotonic())
        elif _State.file is not None:
            _empty(_State.file)


def armed_blocks() -> list[str]:
    """What this process watches now, innermost last (for tests and diagnostics)."""
    with _State.lock:
        return [b.what for b in _State.blocks]


def forget(path: Path) -> None:
    """At set-up: remove a stack file an earlier run left at ``path`` (nothing while a block is watched)."""
    with _State.lock:
        if _State.blocks:
            return
        if _State.path == path and _State.file is not None:
            _State.file.close()
            _State.file, _State.path = None, None
        _State.sealed = False
        path.unlink(missing_ok=True)
