"""Reading one run's dumps, each in a forked reader process bounded in CPU time and memory.

Where the dumps are, and which are one run's, is :mod:`.folder`'s; what a dump holds and how it is checked is
:mod:`.dump_format`'s. This module runs the reading:

* **Bounded by the bytes.** Unpickling is done by readers forked from this process (chunks of files each, a few at a
  time), each with kernel limits derived from the bytes it reads (:func:`limits`): CPU seconds
  (``RLIMIT_CPU``: :data:`CPU_BASE_S` plus :data:`CPU_S_PER_MB`) and address space (``RLIMIT_AS``: what the
  reader had when forked, plus :data:`MEMORY_BASE` and :data:`MEMORY_PER_BYTE` times the bytes). What the dump
  format's own budget cannot reach (what the C unpickler itself could be made to do: hash a dict key built of
  shared nested tuples, 2**40 steps from 200 bytes) ends at those limits: the reader is stopped, and the file it
  was reading is named, exit 2. A reader sends each file's index before reading it, so the parent always knows
  which.
* **The world first.** The lowest rank's dump is read alone, first: the world it states (or the group maps', or
  ``--world``) refuses any file whose rank lies outside it before that file is read (100,000 stray files cost their
  names, not their reading).
* **Speed.** Readers end without freeing what they read (freeing a dump's hundred thousand small objects costs a
  third of reading it); the reduced dumps come back through a pipe.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.dump_format import read_dump, summarize
from nemo_rl_shim.hang_report.field_checks import confirm
from nemo_rl_shim.hang_report.folder import RunFiles, dump_prefixes, find_run
from nemo_rl_shim.hang_report.frames import Frame, shared
from nemo_rl_shim.hang_report.group_members import read_sidecar
from nemo_rl_shim.hang_report.records import DumpError, Entry, RankDump
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import shown_path

__all__ = [
    "CPU_BASE_S",
    "CPU_S_PER_MB",
    "MEMORY_BASE",
    "MEMORY_PER_BYTE",
    "DumpError",
    "Entry",
    "Job",
    "RankDump",
    "chunk_sizes",
    "confirm_dumps",
    "dump_prefixes",
    "find_dumps",
    "limits",
    "load_dumps",
    "read_raw",
    "read_sidecars",
    "reader_count",
    "run_readers",
]

#: Above this many files, up to :data:`MAX_READERS` readers run at once.
PARALLEL_FROM = 32
MAX_READERS = 8
#: Files per reader process: at most :data:`CHUNK`; as the files left run out, fewer (a share of what is left), down
#: to :data:`MIN_CHUNK`, so that the readers end together (:func:`chunk_sizes`).
CHUNK = 64
MIN_CHUNK = 8
#: A reader's CPU seconds: this many, plus :data:`CPU_S_PER_MB` per MiB it reads (an honest dump reads at about
#: 20 ms per MiB here: the limit is far above what any honest dump needs, and stops what is not).
CPU_BASE_S = 10
CPU_S_PER_MB = 1.0
#: A reader's address space beyond what it had when forked: this many bytes, plus :data:`MEMORY_PER_BYTE` per byte it
#: reads (an honest dump unpickles to about 10 bytes per byte of file, and a reader keeps what it read).
MEMORY_BASE = 512 << 20
MEMORY_PER_BYTE = 40
#: The dump as torch wrote it (plain data, top level checked): what torch's own analyzer is handed.
read_raw = read_dump


@dataclass(frozen=True)
class Job:
    """One file for a reader: its path, the rank its name gives, its group map (read from the sidecar), the run's
    folder (which a symlink must not leave)."""

    path: Path
    rank: int
    sidecar: Mapping[str, Any] | None
    root: Path | None


def _file_size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def limits(files_bytes: int) -> tuple[int, int]:
    """``(CPU seconds, address-space bytes beyond the reader's own)`` for a reader of ``files_bytes`` bytes."""
    cpu = CPU_BASE_S + int(CPU_S_PER_MB * files_bytes / 2**20)
    return cpu, MEMORY_BASE + MEMORY_PER_BYTE * files_bytes


def _address_space() -> int | None:
    """This process's address space in bytes (Linux), or None."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _limit_self(files_bytes: int) -> None:
    """In a reader: no core file, and the CPU time and address space :func:`limits` gives."""
    cpu, memory = limits(files_bytes)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard == resource.RLIM_INFINITY or cpu < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1 if hard == resource.RLIM_INFINITY else hard))
    used = _address_space()
    if used is not None:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        cap = used + memory
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _reader(work: Callable[[Job, list[Any]], Any], jobs: list[Job], conn: Any) -> None:
    """A reader process: limit itself, then for each job send its index and do ``work``; send the results, and end
    without freeing what it read. A failure is sent as one line naming the file."""
    kept: list[Any] = []
    current = jobs[0]
    try:
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
        _limit_self(sum(_file_size(job.path) for job in jobs))
        gc.disable()
        results = []
        for index, current in enumerate(jobs):
            conn.send(("start", index))
            results.append(work(current, kept))
        conn.send(("ok", results))
    except DumpError as e:  # its message names the file
        conn.send(("error", str(e)))
    except MemoryError:
        conn.send(("memory", None))
    except BaseException as e:  # any other failure still reaches the parent as one line
        conn.send(("error", f"{shown_path(current.path)}: reading it failed: {first_line(e)}"))
    finally:
        conn.close()
        os._exit(0)


def _ended(jobs: list[Job], at: int | None, exitcode: int | None, files_bytes: int) -> DumpError:
    """What a reader that stopped without its results says: the file it was reading, and why."""
    path = shown_path(jobs[at].path) if at is not None else f"the reader of {shown_path(jobs[0].path)} and others"
    cpu = limits(files_bytes)[0]
    if exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
        return DumpError(
            f"{path}: reading it took more than {cpu} s of CPU, the limit for {files_bytes:,} bytes: refused (a "
            "pickle built to make its reading costly, such as shared nested references)"
        )
    return DumpError(f"{path}: the process reading it ended ({exitcode}) before it was read")


def _memory(jobs: list[Job], at: int | None, files_bytes: int) -> DumpError:
    path = shown_path(jobs[at].path) if at is not None else shown_path(jobs[0].path)
    memory = limits(files_bytes)[1]
    return DumpError(
        f"{path}: reading it needs more than {memory / 2**20:,.0f} MiB, the limit for {files_bytes:,} bytes: refused "
        "(a pickle built to expand, such as shared nested references)"
    )


def run_readers(
    work: Callable[[Job, list[Any]], Any], jobs: list[Job], readers: int, chunk: int | None = None
) -> Iterator[Any]:
    """``work(job, keep)`` for every job, in forked readers (see the module docstring), ``readers`` at a time, each
    a chunk of jobs; results as each chunk ends. :class:`DumpError` naming the file where one fails or is stopped."""
    context = multiprocessing.get_context("fork")  # the readers need nothing but this module, already imported
    chunks: deque[list[Job]] = deque()
    start = 0
    for size in chunk_sizes(len(jobs), readers) if chunk is None else [chunk] * -(-len(jobs) // chunk):
        chunks.append(jobs[start : start + size])
        start += size
    running: dict[Any, tuple[Any, list[Job], list[int | None]]] = {}
    done: list[Any] = []  # readers that sent their results, left to end (freeing their pages) while others start
    try:
        while chunks or running:
            while chunks and len(running) < readers:
                receive, send = context.Pipe(duplex=False)
                part = chunks.popleft()
                process = context.Process(target=_reader, args=(work, part, send), daemon=True)
                process.start()
                send.close()
                running[receive] = (process, part, [None])
            for conn in multiprocessing.connection.wait(list(running)):
                results = _receive(conn, running, done)
                if results:
                    yield from results
    finally:
        for process, _, _ in running.values():
            process.kill()
            process.join()
        for process in done:  # reaped if it has ended; else by multiprocessing, at its next start or at exit
            process.join(0)


def chunk_sizes(count: int, readers: int) -> list[int]:
    """How many files each reader process reads, in turn, for ``count`` files and ``readers`` at a time: half of
    a reader's share of the files left (at most :data:`CHUNK`, at least :data:`MIN_CHUNK`), so that the last chunks
    are small and the readers end within a few files of each other (a reader of :data:`CHUNK` files started last
    would leave the others idle for most of its time)."""
    sizes, left = [], count
    while left > 0:
        size = min(left, max(MIN_CHUNK, min(CHUNK, left // (readers * 2))))
        sizes.append(size)
        left -= size
    return sizes


def _receive(
    conn: Any, running: dict[Any, tuple[Any, list[Job], list[int | None]]], done: list[Any]
) -> list[Any] | None:
    """One message from a reader: the index it starts (None), its results, or why it stopped (raised). A reader that
    sent its results is not waited for: it ends on its own (a reader that kept 64 dumps takes tens of milliseconds
    to give its pages back), and :func:`run_readers` starts the next one meanwhile."""
    process, part, at = running[conn]
    try:
        status, payload = conn.recv()
    except (EOFError, OSError):
        status, payload = "ended", None
    if status == "start":
        at[0] = payload
        return None
    running.pop(conn)
    conn.close()
    if status == "ok":
        done.append(process)
        return payload
    process.join()
    files_bytes = sum(_file_size(j.path) for j in part)
    if status == "ended":
        raise _ended(part, at[0], process.exitcode, files_bytes)
    if status == "memory":
        raise _memory(part, at[0], files_bytes)
    raise DumpError(payload)


def _readers(count: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_READERS, count // PARALLEL_FROM))


def reader_count(count: int) -> int:
    """How many readers run at once for ``count`` files: one per CPU this process may use, up to
    :data:`MAX_READERS`, one below :data:`PARALLEL_FROM` files."""
    return _readers(count)


def _summarize(job: Job, keep: list[Any]) -> RankDump:
    return summarize(job.path, job.rank, job.sidecar, keep=keep, root=job.root)


def _shared(where: Frame | None) -> Frame | None:
    return None if where is None else shared(where)


def _share_frames(dump: RankDump) -> RankDump:
    """The dump's frames made this process's one object per place (each reader made its own): a thousand ranks hold
    a few dozen frames, not a thousand copies."""
    for entry in [*dump.last.values(), *dump.pending_p2p, *dump.p2p_last.values(), dump.latest]:
        if entry is not None:
            entry.where = _shared(entry.where)
    for calls in dump.calls.values():
        for seq, where in calls.items():
            calls[seq] = _shared(where)
    return dump


def read_sidecars(run: RunFiles) -> dict[int, dict[str, Any]]:
    """Every group map of the run, read (JSON: linear in its bytes, read here)."""
    return {rank: read_sidecar(path, run.root) for rank, path in sorted(run.sidecars.items())}


def find_dumps(
    directory: str | Path, environ: Mapping[str, str] | None = None
) -> tuple[dict[int, Path], dict[int, dict[str, Any]]]:
    """``({rank by file name: dump path}, {rank: group map})`` of the one run in ``directory``."""
    run = find_run(directory, environ)
    return dict(run.dumps), read_sidecars(run)


def load_dumps(
    directory: str | Path | RunFiles,
    environ: Mapping[str, str] | None = None,
    *,
    sidecars: Mapping[int, Mapping[str, Any]] | None = None,
    check_first: Callable[[RankDump], None] | None = None,
) -> Iterator[RankDump]:
    """Every dump of the run, reduced, as each is read (the lowest rank's first); :class:`DumpError` when the folder
    or a file cannot be read. ``check_first``: called with the lowest rank's dump before any other is read (the
    world it states refuses files outside it)."""
    run = directory if isinstance(directory, RunFiles) else find_run(directory, environ)
    side = read_sidecars(run) if sidecars is None else sidecars
    jobs = [Job(path, rank, side.get(rank), run.root) for rank, path in sorted(run.dumps.items())]
    if not jobs:
        return
    (first,) = run_readers(_summarize, jobs[:1], 1)
    if check_first is not None:
        check_first(first)
    yield _share_frames(first)
    rest = jobs[1:]
    if rest:
        yield from map(_share_frames, run_readers(_summarize, rest, _readers(len(rest))))


def confirm_dumps(run: RunFiles) -> None:
    """Every field of every dump of the run checked (:mod:`.field_checks`), in readers as the first reading was:
    :class:`DumpError` naming the file, the entry and the key where one is amiss. What a healthy verdict needs."""
    jobs = [Job(path, rank, None, run.root) for rank, path in sorted(run.dumps.items())]
    for _ in run_readers(confirm, jobs, _readers(len(jobs))):
        pass
