"""A circular wait: ranks that each wait in a collective of one group on a rank that waits in another group.

Each stall and point-to-point finding (:mod:`.analysis`) is a wait: its waiting ranks wait on the ranks it names
(the ranks that did not enter, or did not post their side). A waiting rank counts only where it is still blocked in
that op: the op is its newest entry, or its recorder marks completion and the op has not completed. The waits make a
graph of ranks; a strongly connected part of it with two ranks or more (Tarjan's algorithm) is a cycle: every rank
in it waits, directly or not, on itself, and no rank is the culprit. :func:`find_cycle` returns the cycle as the
chain of waits that closes it, from the wait of its lowest rank, each step a group:

    ranks 0-1 wait in all_reduce #1 on g1 for ranks 2-3, which wait in all_reduce #1 on g2 for ranks 4-5, which ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli.hang_report.analysis import Finding, GroupState
from nemo_rl_shim.cli.hang_report.records import RankDump
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["Cycle", "Wait", "find_cycle", "waits"]


@dataclass(frozen=True)
class Wait:
    """Ranks blocked in one op of one group, waiting on other ranks of it."""

    waiting: tuple[int, ...]
    group: GroupState
    op: str
    seq: int
    on: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting": list(self.waiting),
            "group": self.group.name,
            "label": self.group.label,
            "op": self.op,
            "seq": self.seq,
            "on": list(self.on),
        }


@dataclass(frozen=True)
class Cycle:
    """The chain of waits that closes on itself, from the wait of its lowest rank."""

    steps: tuple[Wait, ...]

    @property
    def ranks(self) -> list[int]:
        return sorted({r for step in self.steps for r in (*step.waiting, *step.on)})

    def describe(self) -> str:
        """``ranks 0-1 wait in all_reduce #1 on <group> for ranks 2-3, which wait in ... for ranks 0-1``."""
        parts = []
        for index, step in enumerate(self.steps):
            verb = "waits" if len(step.waiting) == 1 else "wait"
            same = index and tuple(step.waiting) == tuple(self.steps[index - 1].on)
            lead = "which" if same else _ranks(step.waiting)
            parts.append(f"{lead} {verb} in {step.op} #{step.seq} on {step.group.label} for {_ranks(step.on)}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "steps": [step.to_json() for step in self.steps]}


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def _blocked(dumps: Mapping[int, RankDump], rank: int, group: GroupState, seq: int) -> bool:
    """Whether ``rank`` is still in ``group``'s collective ``seq``: its newest op, or one its recorder marks
    unfinished."""
    entry = group.entries.get(rank)
    dump = dumps.get(rank)
    if entry is None or dump is None or entry.seq != seq:
        return False
    latest = dump.latest
    if latest is not None and (latest.key, latest.seq, latest.is_p2p) == (entry.key, entry.seq, entry.is_p2p):
        return True
    return not entry.done and dump.recorder(entry.lib).tracks_completion


def waits(findings: Iterable[Finding], dumps: Mapping[int, RankDump]) -> list[Wait]:
    """The waits the stall and point-to-point findings show, each with the waiting ranks still blocked in it."""
    found = []
    for f in findings:
        if f.kind == "stall":
            waiting = tuple(r for r in f.waiting if _blocked(dumps, r, f.group, f.seq))
        elif f.kind == "p2p":
            waiting = tuple(f.waiting)  # each waited in an unfinished send or recv toward the rank named
        else:
            continue
        if waiting and f.ranks:
            found.append(Wait(waiting, f.group, f.op, f.seq, tuple(f.ranks)))
    return found


def _strong_parts(edges: Mapping[int, set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected parts of the rank graph, iteratively (a cycle may span thousands of ranks)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    parts: list[list[int]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                parts.append(sorted(part))
    return parts


def _chain(part: set[int], inside: list[Wait]) -> tuple[Wait, ...]:
    """The waits of one strongly connected part, in the order they close: from the wait of its lowest rank."""
    first = min(inside, key=lambda w: min(r for r in w.waiting if r in part))
    chain = [first]
    reached = {r for r in first.on if r in part}
    while True:
        step = next((w for w in inside if w not in chain and reached & set(w.waiting)), None)
        if step is None or set(chain[0].waiting) & reached:
            break
        chain.append(step)
        reached = {r for r in step.on if r in part}
    return tuple(chain)


def find_cycle(findings: Iterable[Finding], dumps: Mapping[int, RankDump]) -> Cycle | None:
    """The circular wait among the findings' waits (the one with the lowest rank, where there are several), or None."""
    found = waits(findings, dumps)
    edges: dict[int, set[int]] = {}
    for wait in found:
        for rank in wait.waiting:
            edges.setdefault(rank, set()).update(r for r in wait.on if r != rank)
    for part in _strong_parts(edges):
        if len(part) < 2:
            continue
        members = set(part)
        inside = [w for w in found if members & set(w.waiting) and members & set(w.on)]
        chain = _chain(members, inside)
        if len({step.group.key for step in chain}) >= 2 and set(chain[0].waiting) & {
            r for r in chain[-1].on if r in members
        }:
            return Cycle(chain)
    return None
