"""Which dumps of a folder are one run, proved from what each says (:class:`~.records.RunEvidence`), and which run
the report is about.

A run is a set of dumps whose evidence agrees; a dump whose evidence contradicts a run is another run's, named and
set aside, never merged (a stale dump never stands in for a rank that left none). Two dumps are not one run where:

* **Versions differ**: the dump format or the comm library's version (one job runs one torch and one NCCL). An
  empty version (older formats, Gloo) says nothing.
* **The world or a group differs**: another world size; or one group name given to two rank sets that share a rank
  (a group is its rank set, and its members share its name; two *disjoint* sets under one name are two groups of one
  run: older ``split_group`` gave every color's group one counter name, and ``group_desc`` such as ``mesh_tp`` is
  shared by every TP group).
* **The collectives contradict** (per group, same name, recorder and members; ops whose every member's input goes
  into every member's output: see :mod:`.run_evidence`): one member's first record of the group, #f, was created
  more than :data:`CLOCK_SKEW_NS` after another member completed #k, k >= f. Within one run that cannot happen: #k
  needs data from the first member, which it sends only from ops it entered, and the first it entered is #f (its
  buffer never wrapped: #f is its first record of the group). Not "a completed #k that a member's buffer shows it
  never entered": where sizes mismatch, NCCL feeds one op's data into the next, and ranks finish ops their peer
  never entered (the skipped-collective case); nor a member's record of a later number: behind a mismatch, a rank
  may enter #f long after its peers finished #k on data of its earlier ops.
* **Their times do not meet**: one dump's newest time is more than :func:`run_gap_ns` before another's oldest. A
  run's ranks record within one period: a rank that stops recording is dumped once a timeout fires (its peers'
  watchdog), and its peers wait in the collective it did not enter.

Dumps are placed newest first (by their newest time), each into the first run whose evidence it agrees with, else a
run of its own: the newest run forms first, older dumps meet it. Only contradictions split; where evidence is
missing (a dump with no entry, Gloo's groups that no record lists) dumps stay together. But agreement is not yet
proof: a verdict that every rank agrees also needs the run's time ranges to meet (:func:`time_hole`: no stretch
longer than :data:`CLOCK_SKEW_NS` that no dump of the run holds a record of); a run made of dumps minutes apart
that nothing else tells apart is one run that cannot be proved so. Runs are numbered in time
order, 1 the oldest. The report is about the run ``--run`` names, else the newest *complete* run (every rank of a
world a record states left a dump in it), else the newest run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.records import DumpError, GroupMarks, RankDump, RunEvidence
from nemo_rl_shim.hang_report.world import World, stated_world
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["CLOCK_SKEW_NS", "MIN_RUN_GAP_NS", "Run", "choose_run", "for_runs", "run_gap_ns", "split_runs", "time_hole"]

#: Hosts' wall clocks may differ by this much (NTP keeps a cluster within milliseconds; generous).
CLOCK_SKEW_NS = 60 * 10**9
#: Dumps of one run are never further apart in time than this (or twice the longest timeout, if longer).
MIN_RUN_GAP_NS = 30 * 60 * 10**9
_EMPTY = RunEvidence("", "", None, None, None, None, {}, False)


def run_gap_ns(a: RunEvidence, b: RunEvidence) -> int:
    """How far apart in time two dumps of one run may lie: :data:`MIN_RUN_GAP_NS`, or twice the longer timeout."""
    timeout = max(a.timeout_ms or 0, b.timeout_ms or 0)
    return max(MIN_RUN_GAP_NS, 2 * timeout * 1_000_000)


def _when(ns: int | None) -> str:
    if ns is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _apart(ns: int) -> str:
    seconds = ns / 1e9
    if seconds >= 86_400:
        return f"{seconds / 86_400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


@dataclass
class _Mark:
    """One member's number and time, and whose."""

    number: int
    ns: int
    rank: int


@dataclass
class _GroupSeen:
    """What a run's dumps say of one group: the extreme completed and first marks."""

    done_newest: _Mark | None = None  # the highest number completed
    done_earliest: _Mark | None = None  # the earliest completion
    first_latest: _Mark | None = None  # the latest-created first record
    first_lowest: _Mark | None = None  # the lowest-numbered first record


@dataclass
class Run:
    """One run's dumps, its number (1 the oldest), its time range, and what it agrees on."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    number: int = 0
    start_ns: int | None = None
    end_ns: int | None = None
    until_ns: int | None = None
    version: str = ""
    comm_lib: str = ""
    world: int | None = None
    timeout_ms: int | None = None
    members: dict[str, dict[int, Sequence[int]]] = field(default_factory=dict)  # group name -> rank -> its members
    listed: dict[tuple[str, Any], Path] = field(default_factory=dict)  # (name, members) -> the file listing them
    seen: dict[tuple[str, str, Any], _GroupSeen] = field(default_factory=dict)
    aside: str = ""  # why it is not the run reported on (empty for that one)

    @property
    def evidence(self) -> RunEvidence:
        return RunEvidence(self.version, self.comm_lib, self.world, self.start_ns, self.end_ns, self.until_ns, {},
                           False, self.timeout_ms)  # fmt: skip

    def describe(self) -> str:
        """``run 2: 3 dumps (ranks 0-2), 2026-01-02 10:00:00 UTC to 2026-01-02 10:12:01 UTC``."""
        ranks = format_ranks(self.dumps)
        span = f"{_when(self.start_ns)} to {_when(self.end_ns)}" if self.end_ns is not None else "no times recorded"
        many = "s" * (len(self.dumps) != 1)
        return f"run {self.number}: {len(self.dumps)} dump{many} (rank{many} {ranks}), {span}"

    def files(self, limit: int = 3, directory: Path | None = None) -> str:
        """Its files, the first ``limit`` named (relative to ``directory``, where they lie in it)."""
        paths = [shown_path(_relative(d.path, directory)) for _, d in sorted(self.dumps.items())]
        return ", ".join(paths[:limit]) + (f" and {len(paths) - limit:,} more" if len(paths) > limit else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.number,
            "files": len(self.dumps),
            "ranks": format_ranks(self.dumps),
            "start": _when(self.start_ns),
            "end": _when(self.end_ns),
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "set_aside": self.aside or None,
        }


def _relative(path: Path, directory: Path | None) -> Path:
    return path.relative_to(directory) if directory is not None and path.is_relative_to(directory) else path


def _versions(e: RunEvidence, run: Run) -> str | None:
    for what, mine, theirs in (("dump format", e.version, run.version), ("comm library", e.comm_lib, run.comm_lib)):
        if mine and theirs and mine != theirs:
            return f"its {what} version is {mine}, where the run's is {theirs}"
    if e.world and run.world and e.world != run.world:
        return f"it states a world of {e.world:,} ranks, where the run's is {run.world:,}"
    return None


def _groups(dump: RankDump, run: Run) -> str | None:
    """One group name given two rank sets that share a rank (see the module docstring)."""
    for name, facts in dump.groups.items():
        if not facts.stated or (name, facts.ranks) in run.listed:
            continue
        known = run.members.get(name, {})
        for rank in facts.ranks:
            theirs = known.get(rank)
            if theirs is not None and theirs != facts.ranks:
                other = run.listed.get((name, theirs))
                return (
                    f"it lists process group {name!r} as ranks {format_ranks(facts.ranks)}, where "
                    f"{shown_path(other) if other else 'the run'} lists it as ranks {format_ranks(theirs)}"
                )
    return None


def _where(key: tuple[str, str, Sequence[int]], marks: GroupMarks, number: int) -> str:
    """``#N on process group 'name' (ranks ...)``: formatted only for the line returned (formatting every key of every
    dump cost 7 s of 36 at 8,192 ranks)."""
    return f"#{number} on process group {key[0]!r} (ranks {format_ranks(marks.ranks)})"


def _collectives(e: RunEvidence, run: Run) -> str | None:
    """The collectives contradict (see the module docstring)."""
    for key, marks in e.groups.items():
        seen = run.seen.get(key)
        if seen is None:
            continue
        if marks.first:
            for mark in (seen.done_earliest, seen.done_newest):
                if mark and mark.number >= marks.first[0] and marks.first[1] > mark.ns + CLOCK_SKEW_NS:
                    return (
                        f"it entered {_where(key, marks, marks.first[0])} {_apart(marks.first[1] - mark.ns)} after "
                        f"rank {mark.rank} finished #{mark.number}"
                    )
        if marks.done:
            for mark in (seen.first_latest, seen.first_lowest):
                if mark and mark.number <= marks.done[0] and mark.ns > marks.done[1] + CLOCK_SKEW_NS:
                    return (
                        f"it finished {_where(key, marks, marks.done[0])} {_apart(mark.ns - marks.done[1])} before "
                        f"rank {mark.rank} entered #{mark.number}"
                    )
    return None


def _times(e: RunEvidence, run: Run) -> str | None:
    gap = run_gap_ns(e, run.evidence)
    if e.until_ns is not None and run.start_ns is not None and e.until_ns + gap < run.start_ns:
        return f"its newest record is {_apart(run.start_ns - (e.end_ns or e.until_ns))} older than the run's oldest"
    if e.start_ns is not None and run.until_ns is not None and run.until_ns + gap < e.start_ns:
        return f"its oldest record is {_apart(e.start_ns - (run.end_ns or run.until_ns))} newer than the run's newest"
    return None


def conflict(dump: RankDump, run: Run) -> str | None:
    """Why ``dump`` is not one of ``run``'s (see the module docstring), or None."""
    e = dump.evidence or _EMPTY
    return _versions(e, run) or _groups(dump, run) or _collectives(e, run) or _times(e, run)


def _pick(a: _Mark | None, b: _Mark, by_ns: bool, newest: bool) -> _Mark:
    """Of two marks, the newest (or the oldest) by time (or by number)."""
    if a is None:
        return b
    value_a, value_b = (a.ns, b.ns) if by_ns else (a.number, b.number)
    return b if (value_b > value_a if newest else value_b < value_a) else a


def _add(dump: RankDump, run: Run) -> None:
    e = dump.evidence or _EMPTY
    run.dumps[dump.rank] = dump
    run.version, run.comm_lib = run.version or e.version, run.comm_lib or e.comm_lib
    run.world = run.world or e.world
    run.timeout_ms = max(run.timeout_ms or 0, e.timeout_ms or 0) or None
    if e.start_ns is not None:
        run.start_ns = e.start_ns if run.start_ns is None else min(run.start_ns, e.start_ns)
    if e.end_ns is not None:
        run.end_ns = e.end_ns if run.end_ns is None else max(run.end_ns, e.end_ns)
    if e.until_ns is not None:
        run.until_ns = e.until_ns if run.until_ns is None else max(run.until_ns, e.until_ns)
    for name, facts in dump.groups.items():
        if facts.stated and (name, facts.ranks) not in run.listed:
            run.listed[(name, facts.ranks)] = dump.path
            known = run.members.setdefault(name, {})
            for rank in facts.ranks:
                known.setdefault(rank, facts.ranks)
    for key, marks in e.groups.items():
        seen = run.seen.setdefault(key, _GroupSeen())
        if marks.done:
            mark = _Mark(*marks.done, dump.rank)
            seen.done_newest = _pick(seen.done_newest, mark, by_ns=False, newest=True)
            seen.done_earliest = _pick(seen.done_earliest, mark, by_ns=True, newest=False)
        if marks.first:
            mark = _Mark(*marks.first, dump.rank)
            seen.first_latest = _pick(seen.first_latest, mark, by_ns=True, newest=True)
            seen.first_lowest = _pick(seen.first_lowest, mark, by_ns=False, newest=False)


def split_runs(dumps: Iterable[RankDump]) -> list[Run]:
    """The dumps' runs (see the module docstring), numbered 1 (the oldest) up, oldest first."""
    ordered = sorted(dumps, key=lambda d: -(d.evidence.end_ns or 0) if d.evidence else 0)
    runs: list[Run] = []
    for dump in ordered:
        for run in runs:
            if conflict(dump, run) is None:
                _add(dump, run)
                break
        else:
            run = Run()
            _add(dump, run)
            runs.append(run)
    runs.sort(key=lambda r: (r.end_ns is not None, r.end_ns or 0))
    for number, run in enumerate(runs, 1):
        run.number = number
    return runs


def _world(run: Run, given: int | None) -> World | None:
    try:
        return stated_world(run.dumps, given=given)
    except DumpError:
        return None


def _complete(run: Run, given: int | None) -> bool:
    world = _world(run, given)
    return world is not None and len(run.dumps) == world.size and all(r < world.size for r in run.dumps)


def choose_run(runs: Sequence[Run], directory: Path, wanted: int | None = None, world: int | None = None) -> Run:
    """The run the report is about (see the module docstring); each other run's :attr:`Run.aside` says why it is
    not that one. :class:`DumpError` where ``wanted`` names no run."""
    if wanted is not None and not 1 <= wanted <= len(runs):
        raise DumpError(
            f"--run {wanted}: {shown_path(directory)} holds {len(runs)} run{'s' * (len(runs) != 1)} of dumps "
            f"({'; '.join(r.describe() for r in runs[:4])})"
        )
    if wanted is not None:
        chosen = runs[wanted - 1]
    else:
        complete = [r for r in runs if _complete(r, world)]
        chosen = (complete or list(runs))[-1]
    for run in runs:
        if run is not chosen:
            newest = max(run.dumps.values(), key=lambda d: d.evidence.end_ns or 0 if d.evidence else 0)
            why = conflict(newest, chosen) or "its evidence disagrees with another run's"
            run.aside = f"{shown_path(_relative(newest.path, directory))}: {why}"
    return chosen


def time_hole(run: Run) -> tuple[int, int] | None:
    """The longest stretch, past :data:`CLOCK_SKEW_NS`, between the run's oldest and newest times that no dump of it
    holds a record of: ``(from, to)`` in ns; None where the dumps' time ranges meet."""
    spans = sorted((e.start_ns, e.end_ns) for d in run.dumps.values() if (e := d.evidence) and e.start_ns and e.end_ns)
    hole, reach = None, None
    for start, end in spans:
        if reach is not None and start - reach > CLOCK_SKEW_NS and (hole is None or start - reach > hole[1] - hole[0]):
            hole = (reach, start)
        reach = end if reach is None else max(reach, end)
    return hole


def describe_hole(run: Run, hole: tuple[int, int]) -> str:
    """Which dumps end before a hole and which begin after it."""
    before = [r for r, d in run.dumps.items() if d.evidence and d.evidence.end_ns and d.evidence.end_ns <= hole[0]]
    after = [r for r, d in run.dumps.items() if d.evidence and d.evidence.start_ns and d.evidence.start_ns >= hole[1]]
    return (
        f"no dump holds a record from {_when(hole[0])} to {_when(hole[1])} ({_apart(hole[1] - hole[0])}): the "
        f"records of rank{'s' * (len(before) != 1)} {format_ranks(before)} end before, those of "
        f"rank{'s' * (len(after) != 1)} {format_ranks(after)} begin after"
    )


def for_runs(runs: Sequence[Run], chosen: Run) -> Mapping[str, Any]:
    """What the report says of the runs, in JSON."""
    return {"count": len(runs), "reported": chosen.number, "runs": [run.to_json() for run in runs]}
