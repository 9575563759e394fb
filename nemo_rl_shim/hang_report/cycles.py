"""A circular wait: ranks that each wait on a rank that waits, directly or not, on them.

Each stall and point-to-point finding (:mod:`.analysis`) is a wait: its waiting ranks wait on the ranks it names
(the ranks that did not enter, or did not post their side). A waiting rank counts only where it is still blocked in
that op: the op is its newest entry, or its recorder marks completion and the op has not completed. The waits make a
graph of ranks; a strongly connected part of it with two ranks or more (Tarjan's algorithm) holds a circle: every
rank in it waits, directly or not, on itself, and no rank is the culprit.

**Which circle.** The parts are taken in the order of their lowest rank; in a part, the circle is the shortest chain
of waits that starts at a wait of the part's lowest rank and closes on it (each step's ranks waited on are among the
next step's waiting ranks), the waits tried in one order (their lowest waiting rank, group, number, op, ranks):
the same circle, whatever the order of the findings. :func:`find_cycle` returns the first such circle:

    ranks 0-1 wait in all_reduce #1 on g1 for ranks 2-3, which wait in all_reduce #1 on g2 for ranks 4-5, which ...

**What a circle needs.** Collectives alone close a circle only across two groups or more (a group's stall has its
waiting ranks at its newest collective and the ranks they wait on behind it: they cannot wait on each other there).
Point-to-point ops can in one group: rank 0 receives from rank 1 while rank 1 receives from rank 0, and neither
sends. Each ``send`` or ``recv`` waits for the peer's matching op, and ops not posted together may block each other
(NCCL's user guide, "Point-to-point communication": calls that must progress concurrently are merged in one group,
which is what torch's ``batch_isend_irecv`` does). What torch records of it: each rank's unfinished ``recv`` and no
``send`` toward the other, so the analysis names each rank as the one the other waits on (two "p2p" findings). A
send and its receive that both sides posted, neither finished, is no circle: both sides did their part (the
analysis's "not finished" pair: the transport).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.hang_report.analysis import Finding, GroupState
from nemo_rl_shim.hang_report.records import RankDump
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["Cycle", "Wait", "blocked_in", "find_cycle", "waits"]

_OPPOSITE = {"send": "recv", "recv": "send"}


@dataclass(frozen=True)
class Wait:
    """Ranks blocked in one op of one group, waiting on other ranks of it."""

    waiting: tuple[int, ...]
    group: GroupState
    op: str  # the op the waiting ranks are in (a point-to-point wait: the first waiting rank's send or recv)
    seq: int
    on: tuple[int, ...]
    p2p: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting": list(self.waiting),
            "group": self.group.name,
            "label": self.group.label,
            "op": self.op,
            "seq": self.seq,
            "on": list(self.on),
            "p2p": self.p2p,
        }


@dataclass(frozen=True)
class Cycle:
    """The chain of waits that closes on itself, from a wait of its lowest rank (see the module docstring)."""

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


def blocked_in(dumps: Mapping[int, RankDump], rank: int, group: GroupState, seq: int) -> bool:
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
            waiting, op = tuple(r for r in f.waiting if blocked_in(dumps, r, f.group, f.seq)), f.op
        elif f.kind == "p2p":
            # each waited in an unfinished send or recv toward the rank named, which did not post the other side
            # (the finding's op): the first waiting rank's op is the other side's opposite
            waiting, op = tuple(f.waiting), _OPPOSITE.get(f.op, f.op)
        else:
            continue
        if waiting and f.ranks:
            found.append(Wait(waiting, f.group, op, f.seq, tuple(f.ranks), p2p=f.kind == "p2p"))
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


def _order(wait: Wait, part: set[int]) -> tuple[Any, ...]:
    """The order waits are tried in: their lowest waiting rank in the part, then what tells them apart."""
    low = min(r for r in wait.waiting if r in part)
    return (low, wait.group.key, wait.seq, wait.op, wait.p2p, wait.waiting, wait.on)


def _shortest_back(start: int, after: Callable[[int], list[int]]) -> list[int] | None:
    """The shortest chain from wait ``start`` back to it (breadth first, each wait's next ones in order)."""
    parent: dict[int, int] = {start: start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for step in after(node):
            if step == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return chain[::-1]
            if step not in parent:
                parent[step] = node
                queue.append(step)
    return None


def _closes(chain: Sequence[Wait]) -> bool:
    """A circle of collectives spans two groups or more; one with a point-to-point wait may lie in one group."""
    return len({step.group.key for step in chain}) >= 2 or any(step.p2p for step in chain)


def _chain(part: set[int], inside: Sequence[Wait]) -> tuple[Wait, ...] | None:
    """The circle of one strongly connected part: the shortest chain of waits from a wait of its lowest rank back to
    it, the waits tried in :func:`_order` (the same circle for every order of ``inside``); None where it does not
    close across two groups (:func:`_closes`)."""
    ordered = [w for _, w in sorted({_order(w, part): w for w in inside}.items(), key=lambda item: item[0])]
    waiting_in: dict[int, list[int]] = {}
    for index, wait in enumerate(ordered):
        for rank in wait.waiting:
            if rank in part:
                waiting_in.setdefault(rank, []).append(index)
    nexts: dict[int, list[int]] = {}

    def after(index: int) -> list[int]:
        if index not in nexts:
            nexts[index] = sorted({j for r in ordered[index].on if r in part for j in waiting_in.get(r, ())})
        return nexts[index]

    best: list[int] | None = None
    for start in waiting_in.get(min(part), ()):
        chain = _shortest_back(start, after)
        if chain is not None and (best is None or len(chain) < len(best)):
            best = chain
    circle = tuple(ordered[i] for i in best) if best else None
    return circle if circle and _closes(circle) else None


def find_cycle(findings: Iterable[Finding], dumps: Mapping[int, RankDump]) -> Cycle | None:
    """The circular wait among the findings' waits (the circle through the lowest rank, where there are several; see
    the module docstring), or None."""
    found = waits(findings, dumps)
    edges: dict[int, set[int]] = {}
    for wait in found:
        for rank in wait.waiting:
            edges.setdefault(rank, set()).update(r for r in wait.on if r != rank)
    for part in sorted(_strong_parts(edges)):
        if len(part) < 2:
            continue
        members = set(part)
        inside = [w for w in found if members & set(w.waiting) and members & set(w.on)]
        chain = _chain(members, inside)
        if chain is not None:
            return Cycle(chain)
    return None
