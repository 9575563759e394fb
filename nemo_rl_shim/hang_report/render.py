"""The report as text (first line, then readable details at any size) and as JSON (everything).

Text: the first line names the culprit ranks, the op and the group, and where they are. Then the groups
by shape (``tp: 128 groups of 8, all at #1000 but one``), each group that disagrees in full with its ranks
as ranges, the other findings, the stacks (identical ones grouped, the outliers first, up to
:data:`STACK_GROUPS_SHOWN`), the dumps (one line each up to :data:`DUMPS_IN_FULL`, a summary beyond), and
torch's analyzer in one line. JSON keeps every group, rank, finding (with where each of its ranks called the op,
``called_at``) and every rank's frames.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.analysis import CANNOT_TELL, Analysis, Finding, GroupState, pg_status_counts_done
from nemo_rl_shim.hang_report.progress import Progress
from nemo_rl_shim.hang_report.rank_lists import ranks_json
from nemo_rl_shim.hang_report.stacks import RankStack, group_stacks, is_runtime_frame
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = [
    "DUMPS_IN_FULL",
    "STACK_FRAMES_SHOWN",
    "STACK_GROUPS_SHOWN",
    "finding_json",
    "render_text",
    "report_json",
    "stack_lines",
    "torch_line",
]

#: Up to this many dumps, one line each; beyond, one summary line.
DUMPS_IN_FULL = 16
#: Groups of identical stacks printed (the outliers first); JSON has every rank's frames.
STACK_GROUPS_SHOWN = 5
#: User frames printed per group of stacks, innermost first.
STACK_FRAMES_SHOWN = 8


def _ranks(ranks: Any) -> str:
    ranks = list(ranks)
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def _named_groups(analysis: Analysis) -> set[str]:
    """The groups a finding of something wrong names (not those it only cannot tell about)."""
    return {f.group.name for f in analysis.findings if f.kind not in CANNOT_TELL}


def _agrees(group: GroupState, flagged: set[str]) -> bool:
    """Its members at one number: no finding of something wrong names it, no member lacks a dump, and they are at
    one number (whether that is confirmed, :func:`_confirmed` says)."""
    present = [r for r in group.ranks if r in group.last]
    counted = {group.last[r] for r in present if r not in group.out_of_reach}
    return group.name not in flagged and not group.missing and len(counted) <= 1


def _confirmed(group: GroupState, unsure: set[tuple[str, str]]) -> bool:
    """An agreeing group whose agreement is known: a record lists its members (else one that never recorded an op of
    it cannot be seen), and its last collective is known to have finished."""
    return group.members_stated and group.key not in unsure


def _top(group: GroupState) -> int:
    return max(group.last.values(), default=0)


def _at(values: list[int]) -> str:
    low, high = min(values), max(values)
    if high == 0:
        return "no collective recorded"
    return f"#{low}" if low == high else f"#{low}-#{high}"


def _shape_line(kind: str, groups: list[GroupState], good: list[GroupState], unsure: list[GroupState]) -> str:
    size = len(groups[0].ranks)
    count = f"{len(groups)} group{'s' * (len(groups) > 1)} of {size}"
    seen = " seen" if not groups[0].members_stated else ""
    if not good:
        return f"  {kind}: {count}{seen}, {'disagreeing' if len(groups) > 1 else 'disagrees'}"
    tops = [_top(g) for g in good]
    if seen:  # a member that never recorded an op of it cannot be seen: never "all at"
        which = "its" if len(groups) == 1 else "their"
        return f"  {kind}: {count} seen, members not recorded: {which} ranks at {_at(tops)}"
    at = _at(tops) if max(tops) == 0 else ("all at " if len(set(tops)) == 1 else "at ") + _at(tops)
    bad = len(groups) - len(good)
    but = "" if not bad else f" but {'one' if bad == 1 else bad}"
    sure = ""
    if unsure:
        which = "" if len(unsure) == len(good) else f" {len(unsure)} of them"
        sure = f";{which} not known to have finished, or not every member known"
    return f"  {kind}: {count}{seen}, {at}{but}{sure}"


def _shape_lines(analysis: Analysis) -> list[str]:
    """One line per kind and size of group (and whether its members are recorded); each disagreeing group below it,
    in full."""
    flagged = _named_groups(analysis)
    unsure_keys = {f.group.key for f in analysis.findings if f.kind in CANNOT_TELL}
    shapes: dict[tuple[str, int, bool], list[GroupState]] = {}
    for group in analysis.groups:
        if group.name and (len(group.ranks) > 1 or not group.members_stated):
            shapes.setdefault((group.kind, len(group.ranks), group.members_stated), []).append(group)
    lines = []
    for (kind, _, _), groups in shapes.items():
        good = [g for g in groups if _agrees(g, flagged)]
        bad = [g for g in groups if not _agrees(g, flagged)]
        unsure = [g for g in good if not _confirmed(g, unsure_keys)]
        lines.append(_shape_line(kind, groups, good, unsure))
        lines += [f"    {_group_line(g)}" for g in bad]
    return lines


def _group_line(group: GroupState) -> str:
    """``tp, ranks 512-519 (process group 65): rank 517 at #999 all_reduce; ranks 512-516, 518-519 at #1000 ...``."""
    at: dict[tuple[int, str], list[int]] = {}
    for rank in group.ranks:
        if rank not in group.last:
            continue
        entry = group.entries.get(rank)
        op = entry.op if entry else "(no collective yet)"
        at.setdefault((group.last[rank], op), []).append(rank)
    parts = [f"{_ranks(ranks)} at #{seq} {op}" for (seq, op), ranks in sorted(at.items())]
    if group.out_of_reach:
        parts.append(f"{_ranks(group.out_of_reach)}: out of reach (buffer wrapped)")
    if group.missing:
        parts.append(f"{_ranks(group.missing)}: no dump")
    if not group.members_stated:
        parts.append("no record lists its members")
    return f"{group.label} (process group {group.name}): {'; '.join(parts)}"


def _dump_lines(analysis: Analysis, directory: Path) -> list[str]:
    dumps = sorted(analysis.dumps.values(), key=lambda d: d.rank)
    lines = []
    if len(dumps) <= DUMPS_IN_FULL:
        for dump in dumps:
            why = f": {dump.reason}" if dump.reason else ""
            name = shown_path(dump.path.relative_to(directory) if dump.path.is_relative_to(directory) else dump.path)
            lines.append(f"  rank {dump.rank}: {name}, {dump.n_entries} entries, written by {dump.writer}{why}")
    else:
        writers = Counter(d.writer for d in dumps)
        versions = Counter(d.version for d in dumps)
        wrapped = [d.rank for d in dumps if d.wrapped]
        lines.append(
            f"  {len(dumps)} dumps ({_ranks(d.rank for d in dumps)}), {sum(d.n_entries for d in dumps):,} entries;"
            f" written by {', '.join(f'{w} ({n})' for w, n in writers.items())};"
            f" format {', '.join(f'{v or chr(63)} ({n})' for v, n in versions.items())}"
            + (f"; buffers wrapped on {_ranks(wrapped)}" if wrapped else "")
        )
    if analysis.missing:
        lines.append(f"  no dump from {_ranks(analysis.missing)}")
    return lines


def torch_line(facts: dict[str, Any]) -> str:
    """torch's analyzer in one line: what it flagged, or why it did not run."""
    if facts.get("ran"):
        flagged = ", ".join(
            f"{c['op']} #{c['seq']} ({c['mismatch'] or 'missing ranks ' + format_ranks(c['missing_ranks'])})"
            for c in facts["flagged"][:5]
        )
        more = f", +{len(facts['flagged']) - 5} more" if len(facts["flagged"]) > 5 else ""
        return (
            f"torch {facts['torch']} analyzer: ran, matched {facts['collectives']} collectives, flagged "
            f"{len(facts['flagged'])}" + (f": {flagged}{more}" if flagged else "")
        )
    if facts.get("outcome") == "skipped":
        who = "torch's" if facts.get("torch") is None else f"torch {facts['torch']}"  # not asked for: no torch
        return f"{who} analyzer: {facts['error']}"
    return f"torch {facts['torch']} analyzer: did not run: {facts['error']}"


def _judged(ranks: list[int], progress: Mapping[int, Progress]) -> str:
    """`` (3 samples; working: the stack moved)``: what the first rank's samples say, where it was judged."""
    found = progress.get(ranks[0])
    if found is None:
        return ""
    samples = max(found.stack_samples, found.counter_samples)
    return f" ({samples} sample{'s' * (samples != 1)}; {found.verdict}: {found.reason})"


def stack_lines(stacks: Mapping[int, RankStack], progress: Mapping[int, Progress] | None = None) -> list[str]:
    """The stacks written, grouped by identical frames, the outliers first; each group's user frames (and what its
    first rank's samples say of its progress), then the ranks whose block was armed when they last wrote, without a
    stack."""
    lines = []
    groups = group_stacks(stacks)
    for frames, ranks in groups[:STACK_GROUPS_SHOWN]:
        first = stacks[ranks[0]]
        lines.append(f"  {_ranks(ranks)}, {first.since}{_judged(ranks, progress or {})}:")
        user = [f for f in frames if not is_runtime_frame(f)] or list(frames[:1])
        lines += [f"    {f.where}" for f in user[:STACK_FRAMES_SHOWN]]
        hidden = len(frames) - min(len(user), STACK_FRAMES_SHOWN)
        if hidden:
            lines.append(f"    (+{hidden} more frames: torch, the shim, the standard library, or deeper)")
    if len(groups) > STACK_GROUPS_SHOWN:
        lines.append(f"  ... {len(groups) - STACK_GROUPS_SHOWN} more groups of stacks (--json has every rank's frames)")
    armed = [r for r, s in stacks.items() if not s.fired and s.what is not None]
    if armed:
        whats = sorted({str(stacks[r].what) for r in armed})
        shown = ", ".join(f'"{w}"' for w in whats[:3]) + (f", +{len(whats) - 3} more" if len(whats) > 3 else "")
        lines.append(f"  inside a watched block ({shown}) when last written, no stack: {_ranks(armed)}")
    notes = [r for r, s in stacks.items() if s.note]
    if notes:
        lines.append(f"  {_ranks(notes)}: {stacks[notes[0]].note}" + (" (and others)" if len(notes) > 1 else ""))
    return lines


def render_text(
    line: str,
    analysis: Analysis,
    directory: Path,
    torch_facts: dict[str, Any],
    stacks: Mapping[int, RankStack] | None = None,
    progress: Mapping[int, Progress] | None = None,
    runs: Sequence[str] = (),
) -> str:
    """The text ``nemo-rl-shim hang-report`` prints; ``runs``: its lines on the folder's runs and strays."""
    lines = [line, "", "groups:", *_shape_lines(analysis)]
    if len(analysis.findings) > 1:
        lines += ["", "also:"] + [f"  {f.line()}" for f in analysis.findings[1:6]]
        if len(analysis.findings) > 6:
            lines.append(f"  ... {len(analysis.findings) - 6} more (--json has every one)")
    shown = stack_lines(stacks or {}, progress)
    if shown:
        lines += ["", "stacks (where each rank was once its block ran past the timeout and grace):", *shown]
    lines += ["", "dumps:", *_dump_lines(analysis, directory), *runs, torch_line(torch_facts)]
    return "\n".join(lines)


def finding_json(f: Finding, analysis: Analysis) -> dict[str, Any]:
    """One finding, with what ``pg_status`` says (a hint) of the entries it names."""
    hints = {}
    for rank in [*f.ranks, *f.waiting]:
        entry = f.group.entries.get(rank)
        dump = analysis.dumps.get(rank)
        if entry is not None and dump is not None and entry.seq == f.seq:
            hints[rank] = pg_status_counts_done(dump, entry)
    return {
        "kind": f.kind,
        "ranks": ranks_json(f.ranks),
        "group": f.group.name,
        "axes": f.group.axes,
        "group_ranks": ranks_json(f.group.ranks),
        "op": f.op,
        "seq": f.seq,
        "waiting": ranks_json(f.waiting),
        "waited_s": None if f.waited_s is None else round(f.waited_s, 3),
        "detail": f.detail,
        "called_at": {rank: (frame.to_json() if frame else None) for rank, frame in sorted(f.called_at.items())},
        "pg_status_counts_done": hints,
        "line": f.line(),
    }


def report_json(
    line: str,
    exit_code: int,
    analysis: Analysis,
    directory: Path,
    torch_facts: dict[str, Any],
    stacks: Mapping[int, RankStack] | None = None,
) -> dict:
    """Everything: every finding, group and rank, and every rank's stack file with its frames."""
    return {
        "line": line,
        "exit_code": exit_code,
        "directory": shown_path(directory),
        "world_size": analysis.world_size,
        "world_known": bool(analysis.world and analysis.world.known),
        "world_from": analysis.world.source if analysis.world else None,
        "missing_dumps": ranks_json(analysis.missing),
        "findings": [finding_json(f, analysis) for f in analysis.findings],
        "groups": [
            {
                "name": g.name,
                "axes": g.axes,
                "desc": g.desc,
                "ranks": ranks_json(g.ranks),
                "members_stated": g.members_stated,
                "backend": g.backend,
                "last_seq": g.last,
                "missing": ranks_json(g.missing),
                "out_of_reach": ranks_json(g.out_of_reach),
            }
            for g in analysis.groups
        ],
        "dumps": {
            d.rank: {
                "file": shown_path(d.path.relative_to(directory) if d.path.is_relative_to(directory) else d.path),
                "writer": d.writer,
                "reason": d.reason,
                "entries": d.n_entries,
                "version": d.version,
                "backend": d.backend,
                "wrapped": d.wrapped,
                "pending_p2p": len(d.pending_p2p),
            }
            for d in sorted(analysis.dumps.values(), key=lambda d: d.rank)
        },
        "torch_analyzer": {k: v for k, v in torch_facts.items() if k != "log"},
        "stacks": {rank: stack.to_json() for rank, stack in sorted((stacks or {}).items())},
    }
