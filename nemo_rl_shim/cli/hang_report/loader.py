"""Finding a folder's Flight Recorder dumps, one per rank, and reading them (in forked processes when many).

What a dump holds, and how it is read and checked, is :mod:`.dump_format`'s alone; this module knows where
dumps are and how many processes read them.

* **Where.** The folder and every subfolder (dumps gathered per node), as torch's own loader walks them.
  The file names: the shim's (:data:`~nemo_rl_shim.flight_recorder.DUMP_FILE_NAME`), the prefix in
  ``TORCH_FR_DUMP_TEMP_FILE`` (or its older name), torch's default (``nccl_trace_rank_``, which NCCL's watchdog
  and torch 2.15's ``FlightRecorderHook`` both write), or the one prefix that every ``<prefix><rank>`` file
  shares. The group maps written at set-up (:data:`~nemo_rl_shim.flight_recorder.SIDECAR_NAME`) are read beside.
* **Processes.** Many dumps are read by forked processes, a chunk of files each, which end without freeing what
  they read (freeing costs a third of reading).
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.hang_report.dump_format import read_dump, read_sidecar, summarize
from nemo_rl_shim.cli.hang_report.records import DumpError, Entry, RankDump
from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME, ENV_PAIRS, SIDECAR_NAME, TORCH_DEFAULT_PREFIX
from nemo_rl_shim.one_line.exception import first_line

__all__ = ["DumpError", "Entry", "RankDump", "dump_prefixes", "find_dumps", "load_dumps", "read_raw", "summarize"]

_DUMP_NAME = re.compile(r"^(?P<prefix>[^.].*?)(?P<rank>\d+)$")
_SIDECAR = re.compile("^" + re.escape(SIDECAR_NAME).replace(re.escape("{rank}"), r"(?P<rank>\d+)") + "$")
#: Below this many files one process reads them all; above, a pool of up to :data:`MAX_READERS` does.
PARALLEL_FROM = 32
MAX_READERS = 8
#: Files per reader process.
CHUNK = 64
MIN_CHUNK = 16
#: The dump as torch wrote it (plain data, top level checked): what torch's own analyzer is handed.
read_raw = read_dump


def dump_prefixes(environ: Mapping[str, str] | None = None) -> list[str]:
    """Dump-file prefixes, the first found wins: the shim's, ``TORCH_FR_DUMP_TEMP_FILE``'s, torch's default."""
    env = os.environ if environ is None else environ
    named = [Path(env[name]).name for name in ENV_PAIRS["dump_file"] if env.get(name)]
    return list(dict.fromkeys([DUMP_FILE_NAME, *named, Path(TORCH_DEFAULT_PREFIX).name]))


def _walk(directory: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return files


def _choose_prefix(names: Iterable[str], directory: Path, environ: Mapping[str, str] | None) -> str:
    found = {m["prefix"] for name in names if (m := _DUMP_NAME.match(name)) and not _SIDECAR.match(name)}
    for prefix in dump_prefixes(environ):
        if prefix in found:
            return prefix
    if not found:
        raise DumpError(f"{directory} holds no flight-recorder dumps (files named <prefix><rank>)")
    if len(found) > 1:
        raise DumpError(
            f"{directory} holds dumps under several prefixes ({', '.join(sorted(found))}); keep one run per folder"
        )
    return next(iter(found))


def find_dumps(
    directory: str | Path, environ: Mapping[str, str] | None = None
) -> tuple[dict[int, Path], dict[int, dict[str, Any]]]:
    """``({rank by file name: dump path}, {rank: sidecar})`` in ``directory`` and its subfolders."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{directory} is not a directory")
    files = _walk(directory)
    sidecars: dict[int, dict[str, Any]] = {}
    for path in files:
        if m := _SIDECAR.match(path.name):
            sidecars[int(m["rank"])] = read_sidecar(path)
    prefix = _choose_prefix((p.name for p in files), directory, environ)
    dumps: dict[int, Path] = {}
    for path in files:
        m = _DUMP_NAME.match(path.name)
        if not m or m["prefix"] != prefix:
            continue
        rank = int(m["rank"])
        if rank in dumps:
            raise DumpError(f"rank {rank} has two dumps, {dumps[rank]} and {path}: keep one run per folder")
        dumps[rank] = path
    return dumps, sidecars


def _readers(count: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_READERS, count // PARALLEL_FROM))


def _read_chunk(jobs: list[tuple[Path, int, dict[str, Any] | None]], conn: Any) -> None:
    """A reader process: summarize ``jobs``, send them, and end without freeing what it read (freeing a dump's
    hundred thousand small objects costs a third of reading it)."""
    gc.disable()
    kept: list[Any] = []
    try:
        conn.send(("ok", [summarize(*job, keep=kept) for job in jobs]))
    except DumpError as e:
        conn.send(("error", str(e)))
    except BaseException as e:  # any other failure still reaches the parent as one line
        conn.send(("error", f"reading {jobs[0][0].parent}: {first_line(e)}"))
    finally:
        conn.close()
        os._exit(0)


def _read_in_processes(jobs: list[tuple[Path, int, dict[str, Any] | None]], readers: int) -> Iterator[RankDump]:
    """Chunks of up to :data:`CHUNK` files, each read by a forked process, ``readers`` at a time, as they end."""
    # fork: the readers need nothing but this module, already imported (a fresh interpreter would import torch)
    context = multiprocessing.get_context("fork")
    size = max(MIN_CHUNK, min(CHUNK, len(jobs) // (readers * 4)))
    chunks = deque(jobs[i : i + size] for i in range(0, len(jobs), size))
    running: dict[Any, Any] = {}
    try:
        while chunks or running:
            while chunks and len(running) < readers:
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_read_chunk, args=(chunks.popleft(), send), daemon=True)
                process.start()
                send.close()
                running[receive] = process
            for conn in multiprocessing.connection.wait(list(running)):
                process = running.pop(conn)
                try:
                    status, payload = conn.recv()
                except EOFError:
                    raise DumpError(f"a reader process ended with {process.exitcode} before sending") from None
                finally:
                    conn.close()
                    process.join()
                if status != "ok":
                    raise DumpError(payload)
                yield from payload
    finally:
        for process in running.values():
            process.kill()


def load_dumps(directory: str | Path, environ: Mapping[str, str] | None = None) -> Iterator[RankDump]:
    """Every rank's dump in ``directory`` (and subfolders), reduced, as each is read; :class:`DumpError` when
    the folder or a file cannot be read. Many files are read by forked processes, a chunk each."""
    paths, sidecars = find_dumps(directory, environ)
    jobs = [(path, rank, sidecars.get(rank)) for rank, path in sorted(paths.items())]
    readers = _readers(len(jobs))
    if readers == 1:
        yield from (summarize(*job) for job in jobs)
        return
    yield from _read_in_processes(jobs, readers)
