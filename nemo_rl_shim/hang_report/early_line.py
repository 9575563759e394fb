"""The quick first line: the kind and who, from each rank's newest entries, before every entry is read.

At thousands of ranks, unpickling every dump takes longer than a user waits for the first word. Where a run's dumps
hold :data:`QUICK_FROM_BYTES` or more, each rank's newest :data:`WINDOW` entries are read first
(:mod:`.newest_entries`: the head and the tail of each file, in the same bounded readers as the full reading), the
analysis runs on those windows, and the kind is classified. A window is a buffer that reaches back only to its
oldest entry: a rank without a group's entry in it is out of reach, never behind. Where the verdict needs more, the
ranks concerned are read further (:data:`GROWTH` times more entries, up to :data:`ROUNDS` rounds):

* a group where members are out of reach, or a point-to-point op whose peer's window cannot tell;
* a rank whose ``pg_status`` says a group has unfinished work, where its window holds none (the op it waits in is
  older than the window).

The line is given only for a kind of failure (never "every rank agrees", never "cannot tell"): the exit code, and a
healthy verdict, come from the full reading, which follows and stands (the command says so where its first line
differs). None where the quick read does not apply (a small run, a dump torch did not write as protocol 2, the
lowest rank's dump unreadable so, the windows of several runs: :mod:`.run_split`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.hang_report.analysis import Analysis, analyse
from nemo_rl_shim.hang_report.folder import RunFiles
from nemo_rl_shim.hang_report.kinds import Kind, classify
from nemo_rl_shim.hang_report.loader import Job, reader_count, run_readers
from nemo_rl_shim.hang_report.newest_entries import read_window
from nemo_rl_shim.hang_report.progress import Progress
from nemo_rl_shim.hang_report.records import DumpError, RankDump
from nemo_rl_shim.hang_report.run_split import split_runs
from nemo_rl_shim.hang_report.stacks import RankStack

__all__ = ["GROWTH", "QUICK_FROM_BYTES", "ROUNDS", "WINDOW", "QuickLine", "quick_line"]

#: Runs whose dumps hold fewer bytes are read in full at once (a few seconds at most).
QUICK_FROM_BYTES = 256 << 20
#: Newest entries read per rank at first; times :data:`GROWTH` for a rank read further; rounds of reading further.
WINDOW = 32
GROWTH = 8
ROUNDS = 3
#: Files per reader process in the quick read (each costs milliseconds: more per process than the full reading).
QUICK_CHUNK = 256
_NOT_A_VERDICT = ("agree", "cannot_tell", "unclear")


@dataclass
class QuickLine:
    """The quick first line, its kind, when it was ready, and how much was read for it."""

    line: str
    kind: Kind
    seconds: float
    windows: int  # ranks read as a window of their newest entries
    read_further: list[int] = field(default_factory=list)  # ranks read further than the first window
    rounds: int = 1

    def to_json(self, full_line: str | None = None) -> dict[str, Any]:
        found = {
            "line": self.line,
            "kind": self.kind.name,
            "variant": self.kind.variant,
            "ranks": list(self.kind.ranks),
            "seconds": round(self.seconds, 3),
            "windows": self.windows,
            "read_further": self.read_further,
            "rounds": self.rounds,
        }
        if full_line is not None:
            found["same_as_full"] = full_line == self.line
        return found


def _total_bytes(run: RunFiles) -> int:
    total = 0
    for path in run.dumps.values():
        try:
            total += os.lstat(path).st_size
        except OSError:
            continue
    return total


def _read(run: RunFiles, sidecars: Mapping[int, Mapping[str, Any]], counts: Mapping[int, int]) -> dict[int, Any]:
    """``{rank: (window dump, whole)}`` for the ranks of ``counts``, each its newest ``counts[rank]`` entries;
    ``(None, False)`` where a dump cannot be read so."""

    def work(job: Job, keep: list[Any]) -> tuple[int, RankDump | None, bool]:
        window = read_window(job.path, job.rank, counts[job.rank], job.sidecar, job.root)
        return (job.rank, None, False) if window is None else (job.rank, window.dump, window.whole)

    jobs = [Job(run.dumps[rank], rank, sidecars.get(rank), run.root) for rank in sorted(counts)]
    readers = max(1, min(reader_count(len(jobs) * 32), len(jobs)))  # windows: worth a reader from few files
    chunk = max(1, min(QUICK_CHUNK, -(-len(jobs) // readers)))
    return {rank: (dump, whole) for rank, dump, whole in run_readers(work, jobs, readers, chunk)}


def _unfinished_hidden(dump: RankDump) -> bool:
    """``pg_status`` says a group of this rank has unfinished work, and its window shows none of that group."""
    if not dump.tracks_completion:
        return False
    shown = {e.pg_id for e in [*dump.last.values(), *dump.pending_p2p] if not e.done}
    for pg_id, status in dump.pg_status.items():
        if not isinstance(status, Mapping):
            continue
        enqueued, completed = status.get("last_enqueued_collective"), status.get("last_completed_collective")
        if type(enqueued) is int and type(completed) is int and completed < enqueued and pg_id not in shown:
            return True
    return False


def _read_further(analysis: Analysis, windowed: set[int]) -> set[int]:
    """The ranks read as windows that the verdict needs more of (see the module docstring)."""
    more = {r for group in analysis.groups for r in group.out_of_reach if r in windowed}
    for finding in analysis.findings:
        if finding.kind == "unclear":
            more |= {r for r in finding.group.ranks if r in windowed}
    more |= {r for r in windowed if r in analysis.dumps and _unfinished_hidden(analysis.dumps[r])}
    return more


def quick_line(
    run: RunFiles,
    sidecars: Mapping[int, Mapping[str, Any]],
    stacks: Mapping[int, RankStack],
    progress: Mapping[int, Progress],
    world: int | None = None,
    from_bytes: int | None = None,
) -> QuickLine | None:
    """The quick first line of the run (see the module docstring), or None where it does not apply or tells no
    kind of failure (the full reading then gives the first line). ``from_bytes``: the size from which it applies
    (:data:`QUICK_FROM_BYTES`)."""
    start = time.perf_counter()
    if not run.dumps or _total_bytes(run) < (QUICK_FROM_BYTES if from_bytes is None else from_bytes):
        return None
    counts = dict.fromkeys(run.dumps, WINDOW)
    try:
        read = _read(run, sidecars, counts)
    except DumpError:
        return None  # the full reading says what is wrong, naming the file
    if any(dump is None for dump, _ in read.values()):
        return None  # not all as torch writes them: the full reading alone
    if len(split_runs(dump for dump, _ in read.values())) > 1:
        return None  # several runs' dumps: which one is meant, the full reading says
    further: list[int] = []
    kind, rounds = None, 0
    for rounds in range(1, ROUNDS + 1):
        try:
            analysis = analyse([dump for dump, _ in read.values()], world=world)
        except DumpError:
            return None
        kind = classify(analysis, stacks, progress)
        windowed = {rank for rank, (_, whole) in read.items() if not whole}
        more = _read_further(analysis, windowed)
        if not more or rounds == ROUNDS:
            break
        further += sorted(more)
        for rank in more:
            counts[rank] *= GROWTH
        try:
            read.update(_read(run, sidecars, {rank: counts[rank] for rank in more}))
        except DumpError:
            return None
        if any(dump is None for dump, _ in read.values()):
            return None
    if kind is None or kind.name in _NOT_A_VERDICT:
        return None
    windows = sum(1 for _, whole in read.values() if not whole)
    return QuickLine(kind.line, kind, time.perf_counter() - start, windows, sorted(set(further)), rounds)
