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
* **More than one sample.** Once the watchdog fired, a sampler thread of this process writes the stack again,
  :data:`SAMPLE_INTERVAL_S` apart, up to :data:`SAMPLES` in all, each after a line
  (:data:`.names.SAMPLE_MARK` and JSON: the sample's number and time), through ``faulthandler.dump_traceback``,
  while the same block is armed. That thread needs the GIL: a rank stuck in a C call that holds it leaves the
  first sample alone. Its CPU time and I/O counters come from a helper process
  (:mod:`.progress_sampler`, started when the file is first opened), which reads ``/proc`` and needs no GIL of
  this one; the header says how many samples and how far apart, and the native id of the thread that armed.
  Whether the rank was working is the reader's to judge (``nemo_rl_shim.hang_report.progress``).
* **fork.** A child forked while the watchdog is armed must not touch faulthandler's watchdog again
  (CPython's cancel then waits for a thread the child does not have, forever): :func:`arm` does
  nothing in such a child. A child forked while nothing was armed arms as usual (with its own sampler thread
  and helper).
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nemo_rl_shim.config.numbers import ascii_int
from nemo_rl_shim.flight_recorder import progress_sampler
from nemo_rl_shim.flight_recorder.names import HEADER, PROGRESS_FILE_NAME, SAMPLE_MARK, STACK_FILE_NAME

__all__ = [
    "SAMPLES",
    "SAMPLE_INTERVAL_S",
    "arm",
    "armed_blocks",
    "disarm",
    "forget",
    "header_line",
    "progress_path",
    "stack_path",
    "thread_label",
]

_FORMAT = 1
#: The shortest delay handed to faulthandler (it refuses 0).
_MIN_DELAY_S = 0.001
#: Stack samples per block past its deadline (the watchdog's first included), and how far apart: short, since a
#: launcher ends the remaining ranks within seconds of the first failure.
SAMPLES = 3
SAMPLE_INTERVAL_S = 1.0


def stack_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its stack in ``directory``."""
    return Path(directory) / STACK_FILE_NAME.format(rank=rank)


def progress_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where the helper writes rank ``rank``'s counters in ``directory`` (beside its stack file)."""
    return Path(directory) / PROGRESS_FILE_NAME.format(rank=rank)


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
    native_id: int | None = None  # the thread's id in the kernel (/proc/<pid>/task/<tid>)
    samples: int = SAMPLES
    interval_s: float = SAMPLE_INTERVAL_S
    taken: int = 1  # stack samples written: the watchdog's first counts (the sampler writes the rest)
    last: float = 0.0  # time.monotonic() of the last sample the sampler wrote


def header_line(rank: int, block: _Block) -> bytes:
    """The header that describes ``block`` (one line, ending in a newline)."""
    facts = {
        "format": _FORMAT,
        "rank": rank,
        "pid": os.getpid(),
        "thread": thread_label(block.thread),
        "tid": block.native_id,
        "what": block.what,
        "entered_ns": block.entered_ns,
        "after_s": round(block.after_s, 3),
        "samples": block.samples,
        "interval_s": block.interval_s,
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
    wake = threading.Condition(lock)  # the sampler thread waits on it; arming and leaving wake it
    sampler: threading.Thread | None = None
    helper: subprocess.Popen[bytes] | None = None  # the counters' helper process, for _State.path


def _after_fork_in_child() -> None:
    _State.lock = threading.Lock()
    _State.wake = threading.Condition(_State.lock)
    _State.forked_armed = _State.forked_armed or _State.armed is not None
    _State.blocks, _State.armed, _State.file, _State.path = [], None, None, None
    _State.sampler, _State.helper = None, None  # the parent's: this child starts its own


os.register_at_fork(after_in_child=_after_fork_in_child)


def _open(path: Path, rank: int) -> BinaryIO:
    if _State.file is not None and _State.path == path:
        return _State.file
    if _State.file is not None:
        _State.file.close()
    progress_sampler.stop(_State.helper)
    path.parent.mkdir(parents=True, exist_ok=True)
    _State.file, _State.path, _State.rank = open(path, "wb", buffering=0), path, rank  # noqa: SIM115 - kept open
    progress = str(progress_path(path.parent, rank))
    _State.helper = progress_sampler.start(os.getpid(), str(path), progress, HEADER)
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
    block.taken, block.last = 1, 0.0
    if _State.sampler is None or not _State.sampler.is_alive():
        _State.sampler = threading.Thread(target=_sample_loop, name="nemo-rl-shim-stack-sampler", daemon=True)
        _State.sampler.start()
    _State.wake.notify_all()


def _sample_loop() -> None:
    """The sampler thread: while a block stays armed past its deadline, its stack again every ``interval_s``."""
    with _State.wake:
        while True:
            block = _State.armed
            if block is None or block.taken >= block.samples:
                _State.wake.wait()
                continue
            # a thread that woke late (the GIL held by a busy rank) keeps its samples apart all the same
            due = max(block.deadline + block.taken * block.interval_s, block.last + block.interval_s)
            wait = due - time.monotonic()
            if wait > 0:
                _State.wake.wait(wait)
                continue
            if _fired():  # the watchdog wrote the first: the rank is still in the block
                _sample(block.taken)
            block.taken, block.last = block.taken + 1, time.monotonic()


def _sample(number: int) -> None:
    """One more stack in the file: the mark line, then every thread's stack (faulthandler's text)."""
    file = _State.file
    assert file is not None
    try:
        os.write(file.fileno(), (SAMPLE_MARK + json.dumps({"sample": number, "t_ns": time.time_ns()}) + "\n").encode())
        faulthandler.dump_traceback(file=file, all_threads=True)
    except (OSError, ValueError):  # a help to the report: a file that cannot be written stops nothing
        pass


def arm(
    path: Path, rank: int, what: str, after_s: float, *, samples: int = SAMPLES, interval_s: float = SAMPLE_INTERVAL_S
) -> int | None:
    """Start watching a block: after ``after_s`` seconds in it, its stack goes to ``path`` (then ``samples`` - 1 more,
    ``interval_s`` apart, while it stays); a token for :func:`disarm`, or None when this process arms nothing more (a
    kept stack, or forked while armed)."""
    with _State.lock:
        if _State.sealed or _State.forked_armed:
            return None
        now = time.monotonic()
        _State.tokens += 1
        ident, native = threading.get_ident(), threading.get_native_id()
        block = _Block(_State.tokens, what, now + after_s, time.time_ns(), after_s, ident, native, samples, interval_s)
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
        _State.wake.notify_all()
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
    """At set-up: remove a stack file an earlier run left at ``path``, and its counters (nothing while a block is
    watched)."""
    with _State.lock:
        if _State.blocks:
            return
        if _State.path == path and _State.file is not None:
            _State.file.close()
            _State.file, _State.path = None, None
            progress_sampler.stop(_State.helper)
            _State.helper = None
        _State.sealed = False
        path.unlink(missing_ok=True)
        rank = _rank_of(path)
        if rank is not None:
            progress_path(path.parent, rank).unlink(missing_ok=True)


def _rank_of(path: Path) -> int | None:
    """The rank a stack file's name gives (None for another name)."""
    prefix, _, suffix = STACK_FILE_NAME.partition("{rank}")
    middle = path.name[len(prefix) : len(path.name) - len(suffix)]
    ok = path.name.startswith(prefix) and path.name.endswith(suffix)
    return ascii_int(middle) if ok else None  # ASCII digits only: "²".isdigit() is true, and int("²") fails
