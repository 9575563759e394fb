"""Was a rank still working when its peers' timeout fired? Judged from its stack samples and its counters.

A rank that stayed in a watched block past its deadline leaves several stack samples (:mod:`.stacks`) and, from a
helper process, its CPU time and I/O counters at each (:mod:`.counters`). Between the first and the last sample:

* **the stack moved**: the watched thread's frames differ between two samples in a row;
* **CPU grew**: the thread that armed the block (the process, where the thread's counters are missing) spent at
  least :data:`MIN_CPU_SHARE` of the time between the samples on a CPU;
* **bytes grew**: it read or wrote at least :data:`MIN_BYTES` (``rchar``/``wchar``, or the storage layer's
  ``read_bytes``/``write_bytes``);
* **runnable throughout**: the same task's state read :data:`RUNNABLE` at every counter sample (two or more): it
  was computing, on a host too loaded to give it :data:`MIN_CPU_SHARE` (a rank asleep, or waiting on a lock, a
  socket or a peer, reads ``S``; one in the kernel's I/O wait, ``D``).

Counter samples less than :data:`MIN_SPAN_S` apart tell nothing.

Any of them: **working**. None, with counters from two samples or more: **not working** (asleep, or waiting on
something that never comes). Otherwise **cannot judge**: one sample or none; or stacks that did not move and no
counters, which cannot tell a long C call from a rank asleep. Never a guess of "working".
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.counters import Counters, CounterSample, counters_for
from nemo_rl_shim.hang_report.frames import Frame
from nemo_rl_shim.hang_report.stacks import RankStack

__all__ = [
    "CANNOT_JUDGE",
    "MIN_BYTES",
    "MIN_CPU_SHARE",
    "MIN_SPAN_S",
    "NOT_WORKING",
    "RUNNABLE",
    "WORKING",
    "Progress",
    "judge",
    "judge_all",
]

WORKING, NOT_WORKING, CANNOT_JUDGE = "working", "not working", "cannot judge"
#: CPU time, as a share of the wall time between the first and the last counter sample, that counts as working.
MIN_CPU_SHARE = 0.10
#: Bytes read or written between the first and the last counter sample that count as working (a log line or two
#: does not).
MIN_BYTES = 64 * 1024
#: The state letter of a task on a CPU or waiting for one (``/proc/<pid>/task/<tid>/stat``'s third field, ``R``):
#: where every counter sample reads it, the task was computing, however small the share of CPU a loaded host gave it.
RUNNABLE = "R"
#: Counter samples closer together than this judge nothing (a helper that started late and sampled at once).
MIN_SPAN_S = 0.25


@dataclass(frozen=True)
class Progress:
    """One rank's progress, judged: the verdict, why, and the evidence (samples, deltas, how long the block ran)."""

    rank: int
    verdict: str  # WORKING, NOT_WORKING or CANNOT_JUDGE
    reason: str  # one short phrase: "stack moved; CPU +1.9 s in 2.0 s; 25.0 MB written"
    stack_samples: int = 0
    counter_samples: int = 0
    moved: bool | None = None  # None: fewer than two stack samples
    cpu_s: float | None = None  # CPU spent between the first and the last counter sample
    of: str | None = None  # whose counters: "thread" or "process"
    read: int | None = None  # bytes read, and written, between them
    written: int | None = None
    span_s: float | None = None  # the time between the first and the last counter sample
    ran_s: float | None = None  # how long the block had run at the last sample
    phase: str | None = None  # the watched block's name, else the function the rank was in
    where: Frame | None = None  # the rank's innermost user frame at the newest sample

    @property
    def working(self) -> bool:
        return self.verdict == WORKING

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "stack_samples": self.stack_samples,
            "counter_samples": self.counter_samples,
            "moved": self.moved,
            "cpu_s": self.cpu_s,
            "of": self.of,
            "read_bytes": self.read,
            "written_bytes": self.written,
            "span_s": None if self.span_s is None else round(self.span_s, 3),
            "ran_s": None if self.ran_s is None else round(self.ran_s, 3),
            "phase": self.phase,
            "where": self.where.to_json() if self.where else None,
        }


def _moved(stack: RankStack) -> bool | None:
    frames = [s.frames for s in stack.samples]
    return None if len(frames) < 2 else any(a != b for a, b in itertools.pairwise(frames))


def _pick(samples: Sequence[CounterSample]) -> tuple[str, list[Counters]] | None:
    """The thread's counters where two samples or more have them, else the process's; None where neither does."""
    for of in ("thread", "process"):
        found = [c for s in samples if (c := getattr(s, of)) is not None]
        if len(found) >= 2:
            return of, found
    return None


def _delta(first: Counters, last: Counters, keys: tuple[str, ...]) -> int | None:
    grown = [last.io[k] - first.io[k] for k in keys if k in first.io and k in last.io]
    return max(grown) if grown else None


def _megabytes(count: int) -> str:
    if count >= 10**9:
        return f"{count / 1e9:.1f} GB"
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count:,} bytes"


def _evidence(stack: RankStack, samples: Sequence[CounterSample]) -> dict[str, Any]:
    """The deltas between the first and the last counter sample, and the signs of work they show."""
    moved = _moved(stack)
    picked = _pick(samples)
    found: dict[str, Any] = {"moved": moved, "signs": ["stack moved"] if moved else []}
    if picked is None:
        return found
    of, counted = picked
    first, last = counted[0], counted[-1]
    span = (samples[-1].t_ns - samples[0].t_ns) / 1e9
    if span < MIN_SPAN_S:
        return found
    cpu = None if first.cpu_s is None or last.cpu_s is None else max(0.0, last.cpu_s - first.cpu_s)
    read, written = _delta(first, last, ("rchar", "read_bytes")), _delta(first, last, ("wchar", "write_bytes"))
    found.update(of=of, cpu_s=cpu, read=read, written=written, span_s=span, counted=len(counted))
    if cpu is not None and span > 0 and cpu >= MIN_CPU_SHARE * span:
        found["signs"].append(f"CPU +{cpu:.1f} s in {span:.1f} s")
    elif all(c.state == RUNNABLE for c in counted):  # on a CPU or waiting for one: a loaded host's share
        found["signs"].append(f"runnable at all {len(counted)} samples")
    for count, verb in ((written, "written"), (read, "read")):
        if count is not None and count >= MIN_BYTES:
            found["signs"].append(f"{_megabytes(count)} {verb}")
    return found


def _verdict(stack: RankStack, found: Mapping[str, Any]) -> tuple[str, str]:
    stacks, counted = len(stack.samples), found.get("counted", 0)
    if found["signs"]:
        return WORKING, "; ".join(found["signs"])
    if counted >= 2:
        of = "its thread" if found.get("of") == "thread" else "the process"
        idle = f"no CPU, no I/O of {of} in {found['span_s']:.1f} s"
        return NOT_WORKING, idle + (f"; the stack did not move in {stacks} samples" if stacks >= 2 else "")
    if stacks >= 2:
        return CANNOT_JUDGE, f"the stack did not move in {stacks} samples, and no counters tell a C call from sleep"
    return CANNOT_JUDGE, "one sample" if max(stacks, counted) == 1 else "no sample"


def judge(stack: RankStack, samples: Sequence[CounterSample] | None = None, root: Path | None = None) -> Progress:
    """``stack``'s progress, from its samples and its counters (read beside its file when not given; ``root``: the
    folder it may not leave)."""
    samples = counters_for(stack, root) if samples is None else samples
    found = _evidence(stack, samples)
    verdict, reason = _verdict(stack, found)
    last_ns = max([s.t_ns for s in samples] + [s.t_ns for s in stack.samples if s.t_ns is not None], default=None)
    ran = (last_ns - stack.entered_ns) / 1e9 if last_ns and stack.entered_ns and last_ns >= stack.entered_ns else None
    where = stack.user_frame
    return Progress(
        rank=stack.rank,
        verdict=verdict,
        reason=reason,
        stack_samples=len(stack.samples),
        counter_samples=len(samples),
        moved=found["moved"],
        cpu_s=found.get("cpu_s"),
        of=found.get("of"),
        read=found.get("read"),
        written=found.get("written"),
        span_s=found.get("span_s"),
        ran_s=ran if ran is not None else stack.ran_s,
        phase=stack.what or (where.function if where else None),
        where=where,
    )


def judge_all(stacks: Mapping[int, RankStack], root: Path | None = None) -> dict[int, Progress]:
    """Every rank with a written stack, judged."""
    return {rank: judge(stack, root=root) for rank, stack in stacks.items() if stack.fired}
