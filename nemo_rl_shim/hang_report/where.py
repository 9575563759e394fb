"""The first line, with where: who stalled and in which collective, then where that rank's own code was, then
where its peers wait.

The finding (:mod:`.analysis`) names the rank, the op, its sequence number and the group, and where the waiting
peers called the op (their dumps' ``frames``); the stacks (:mod:`.stacks`) place the rank named. A rank named by
the finding that left a stack gets its innermost frame in user code (torch, the shim and the standard library
skipped, :func:`.frames.user_frame`) and how long its block had run; the peers, where they called the collective::

    rank 3 did not enter all_reduce #6 on default, ranks 0-3: at /job/train.py:57 in load_batch (its stack,
    8.0 s into "train step"); ranks 0-2 waited 3.0 s in it at /job/train.py:42 in step

A rank that left no dump but a stack outside ``torch.distributed`` (stuck in a C call that holds the GIL,
where its dump watcher cannot run) did not enter the collective its peers wait in, and reads the same, with
"no dump from it". Peers that left stacks too are placed by them, by group of identical places, where a stack
puts them elsewhere than where they called the collective (under NCCL a rank waits later than it calls). Any
other finding keeps its own line, and the places follow it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nemo_rl_shim.hang_report.analysis import Finding
from nemo_rl_shim.hang_report.frames import Frame, same_place
from nemo_rl_shim.hang_report.progress import CANNOT_JUDGE, NOT_WORKING, WORKING, Progress
from nemo_rl_shim.hang_report.stacks import RankStack
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["did_not_enter", "finding_line", "places", "progress_note", "stalled_line"]

#: Places of peers named on the first line (by group of identical places); the stacks section has all.
PEER_PLACES = 2


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def _written(ranks: Sequence[int], stacks: Mapping[int, RankStack]) -> list[int]:
    return [r for r in ranks if (s := stacks.get(r)) is not None and s.fired]


def places(ranks: Sequence[int], stacks: Mapping[int, RankStack]) -> list[tuple[Frame | None, list[int]]]:
    """The ranks with a written stack, grouped by their innermost user frame, the fewest first."""
    found: dict[Frame | None, list[int]] = {}
    for rank in _written(ranks, stacks):
        found.setdefault(stacks[rank].user_frame, []).append(rank)
    return sorted(found.items(), key=lambda item: (len(item[1]), item[1][0]))


def _place(frame: Frame | None) -> str:
    return f"at {frame.where}" if frame is not None else "in a stack without frames"


def progress_note(found: Progress | None) -> str:
    """What the samples say, for the parenthesis after a place: ``; not working in 3 samples``, ``; progress could
    not be judged: one sample``; empty where the rank was not judged."""
    if found is None:
        return ""
    if found.verdict == WORKING:
        return f"; working: {found.reason}"
    if found.verdict == NOT_WORKING:
        return f"; not working in {max(found.stack_samples, found.counter_samples)} samples"
    assert found.verdict == CANNOT_JUDGE
    return f"; progress could not be judged: {found.reason}"


def _culprit_places(
    ranks: Sequence[int],
    stacks: Mapping[int, RankStack],
    also: str = "",
    named: bool = True,
    progress: Mapping[int, Progress] | None = None,
) -> str:
    """``rank 3 at /job/train.py:57 in load_batch (its stack, 8.0 s into "train step")``, per group of identical
    places; ``named=False`` drops the rank where the line has just named it, alone; with ``progress``, what the
    samples of the group's first rank say."""
    grouped = places(ranks, stacks)
    parts = []
    for frame, rs in grouped:
        who = f"{_ranks(rs)} " if named or len(ranks) > 1 else ""
        whose = "its stack" if len(rs) == 1 else "their stacks"
        note = progress_note((progress or {}).get(rs[0]))
        parts.append(f"{who}{_place(frame)} ({whose}, {stacks[rs[0]].since}{also}{note})")
    return "; ".join(parts)


def _peer_places(finding: Finding, stacks: Mapping[int, RankStack]) -> str:
    """The waiting peers' stacks, where they put a peer elsewhere than where it called the collective."""
    calls = finding.called_at
    elsewhere = [r for r in finding.waiting if r not in stacks or not same_place(stacks[r].user_frame, calls.get(r))]
    grouped = places(elsewhere, stacks)
    if not grouped:
        return ""
    shown = [f"{_ranks(rs)} {_place(frame)}" for frame, rs in grouped[:PEER_PLACES]]
    more = f", +{len(grouped) - PEER_PLACES} more places" if len(grouped) > PEER_PLACES else ""
    return f" (their stacks: {'; '.join(shown)}{more})"


def _did_not_enter(finding: Finding, stacks: Mapping[int, RankStack]) -> bool:
    """A stall; or ranks without a dump whose stacks all lie outside torch.distributed, while peers wait."""
    if finding.kind == "stall":
        return True
    return (
        finding.kind == "missing"
        and bool(finding.waiting)
        and len(_written(finding.ranks, stacks)) == len(finding.ranks)
        and not any(stacks[r].in_torch_distributed for r in finding.ranks)
    )


def did_not_enter(finding: Finding, stacks: Mapping[int, RankStack]) -> bool:
    """Whether the finding's ranks did not enter the collective their peers wait in (see :func:`_did_not_enter`),
    with a stack that places them."""
    return _did_not_enter(finding, stacks) and bool(_written(finding.ranks, stacks))


def finding_line(
    finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress] | None = None
) -> str:
    """The finding's line, with the places of the ranks it names and of their waiting peers (see the module); with
    ``progress``, what each named rank's samples say."""
    culprits = _written(finding.ranks, stacks)
    peers = _peer_places(finding, stacks)
    if not culprits and not peers:
        return finding.line()
    if _did_not_enter(finding, stacks) and culprits:
        where = f"{finding.op} #{finding.seq} on {finding.group.label}"
        also = "; no dump from it" if finding.kind == "missing" and len(finding.ranks) == 1 else ""
        if finding.kind == "missing" and len(finding.ranks) > 1:
            also = "; no dump from them"
        at = _culprit_places(finding.ranks, stacks, also, named=False, progress=progress)
        waited = f"{_ranks(finding.waiting)} waited"
        waited += f" {finding.waited_s:.1f} s" if finding.waited_s is not None else ""
        return f"{_ranks(finding.ranks)} did not enter {where}: {at}; {waited} in it{finding.waited_at()}{peers}"
    at = f"; {_culprit_places(culprits, stacks)}" if culprits else ""
    return f"{finding.line()}{at}{peers}"


def stalled_line(stacks: Mapping[int, RankStack]) -> str:
    """Where the ranks that left a stack were, for a report whose dumps name no one: ``rank 3 stayed in "train
    step" past its deadline: at ...``; empty when no stack was written."""
    grouped = places(sorted(stacks), stacks)
    if not grouped:
        return ""
    parts = [f"{_ranks(rs)} stayed in a watched block past its deadline ({stacks[rs[0]].since}): {_place(frame)}"
             for frame, rs in grouped[:PEER_PLACES]]  # fmt: skip
    more = f"; +{len(grouped) - PEER_PLACES} more places" if len(grouped) > PEER_PLACES else ""
    return "; ".join(parts) + more
