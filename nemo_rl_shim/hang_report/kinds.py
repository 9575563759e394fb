"""What kind of failure a hang was, and what to do: the first line, from the findings, the stacks and the progress.

The first line starts with the kind, then who and where (:mod:`.where`), then what to do (:mod:`.suggest`), in at
most :data:`MAX_LINE_CHARS` characters. The kinds (``Kind.name``; ``variant`` says more):

* ``never_came``: a rank did not enter the collective its peers wait in, and was not working: stuck in Python
  (``python``), in another collective (``elsewhere``: its stack inside ``torch.distributed``, with a dump or not),
  in a C call that holds the GIL (``gil``: a stack outside ``torch.distributed`` but no dump, its dump watcher could
  not run), or dead (``dead``: no dump, no stack); ``unplaced``: a dump but no stack;
* ``still_working``: the rank that did not enter was making progress (:mod:`.progress`): a timeout too short for
  the phase it was in, with the timeout that would have held;
* ``mismatch`` (``op`` or ``sizes``) and ``skipped_collective`` (one side called the op from another place: it
  skipped a collective, or made an extra one);
* ``p2p_stall``: a rank did not post its side of a send or receive;
* ``circular_wait``: ranks each waiting in a collective of one group on a rank that waits in another, or in a
  send or receive on a rank that waits for them (:mod:`.cycles`): the cycle, no rank blamed;
* ``all_entered_none_finished``: every member of a group entered a collective (or both sides of a send and its
  receive posted) and none finished: the transport or a device, no rank blamed;
* ``did_not_finish``: a rank entered and did not finish what its peers finished: its host;
* ``unclear`` (someone waits, no buffer tells on whom), ``no_dump``, ``stayed_in_block`` (a stack alone),
  ``cannot_tell`` (no entry to compare; or, variant ``unconfirmed``, ``world unknown``, ``gap``, ``unproved run``
  or ``several runs``, what the analysis cannot tell) and ``agree``.

A circular wait comes before the stall it is made of; otherwise the first finding (:mod:`.analysis`'s order)
decides, but for a missing dump whose peers finished the op it is named in, where another op of the same rank's
peers is unfinished: that one is where the rank stopped. Pure functions of typed inputs: the analysis, the stacks
and the progress judged from them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.hang_report.analysis import CANNOT_TELL, Analysis, Finding
from nemo_rl_shim.hang_report.cascade import chain_of
from nemo_rl_shim.hang_report.cycles import Cycle, find_cycle
from nemo_rl_shim.hang_report.progress import Progress
from nemo_rl_shim.hang_report.rank_lists import ranks_json
from nemo_rl_shim.hang_report.receivers import p2p_unseen, senders_only
from nemo_rl_shim.hang_report.stacks import RankStack
from nemo_rl_shim.hang_report.suggest import Suggestion, longer_timeout
from nemo_rl_shim.hang_report.where import did_not_enter, finding_line, stalled_line
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["LABELS", "MAX_LINE_CHARS", "Kind", "classify", "fit_line"]

#: The first line is at most this long (paths are shortened first, then the middle is cut).
MAX_LINE_CHARS = 400
#: How each kind's line starts (with its variant, where it has one).
LABELS = {
    ("never_came", "python"): "never came (stuck in Python)",
    ("never_came", "elsewhere"): "never came (waiting in another collective)",
    ("never_came", "gil"): "never came (a C call holding the GIL)",
    ("never_came", "dead"): "never came (dead: no dump)",
    ("never_came", "unplaced"): "never came",
    ("still_working", None): "still working",
    ("mismatch", "op"): "mismatch (op)",
    ("mismatch", "sizes"): "mismatch (sizes)",
    ("skipped_collective", None): "skipped collective",
    ("p2p_stall", None): "p2p stall",
    ("circular_wait", None): "circular wait",
    ("all_entered_none_finished", None): "all entered, none finished",
    ("did_not_finish", None): "did not finish",
    ("unclear", None): "unclear",
    ("no_dump", None): "no dump",
    ("stayed_in_block", None): "stayed in a block",
    ("cannot_tell", None): "cannot tell",
    ("cannot_tell", "unconfirmed"): "cannot tell",
    ("cannot_tell", "world unknown"): "cannot tell",
    ("cannot_tell", "gap"): "cannot tell",
    ("cannot_tell", "hidden"): "cannot tell",
    ("cannot_tell", "unproved run"): "cannot tell",
    ("cannot_tell", "several runs"): "cannot tell",
    ("cannot_tell", "p2p unseen"): "cannot tell",
    ("agree", None): "every rank agrees",
}
_ALSO = re.compile(r" \(also [^()]*\)")
_WHOSE = re.compile(r"\((?:its stack|their stacks), ")
_WORKING = re.compile(r"; working: ")
_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[/\\](?:[^\s:;()\"',]+[/\\])+(?=[^\s/\\:;()\"',]+:\d)")
#: What :func:`fit_line` drops, in turn, from a line too long: the folders of paths, a group's other axes, the words
#: "its stack, " and "working: " (the kind says both).
_SHORTER = ((_PATH, ""), (_ALSO, ""), (_WHOSE, "("), (_WORKING, "; "))


@dataclass(frozen=True)
class Kind:
    """The kind of failure, who it names, where (``body``), what to do, and the evidence behind it."""

    name: str
    variant: str | None
    ranks: tuple[int, ...]
    body: str
    suggestion: Suggestion | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return LABELS[(self.name, self.variant)]

    @property
    def line(self) -> str:
        """``<kind>: <who, where>; <what to do>``, at most :data:`MAX_LINE_CHARS` characters."""
        return self.line_with("")

    def line_with(self, note: str) -> str:
        """:attr:`line` with ``note`` after what to do (how the run's files were chosen), within the same bound."""
        action = " ".join(part for part in (self.suggestion.text if self.suggestion else "", note) if part)
        return fit_line(self.label, self.body, action)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variant": self.variant,
            "label": self.label,
            "ranks": ranks_json(self.ranks),
            "evidence": self.evidence,
            "suggestion": self.suggestion.to_json() if self.suggestion else None,
        }


def fit_line(label: str, body: str, action: str, limit: int = MAX_LINE_CHARS) -> str:
    """``label: body; action`` (``body; action`` where the body starts with the label's words) in at most ``limit``
    characters: the folders of paths dropped first (``train.py:57`` stays), then a group's other axes (``default (also
    dp, tp), ranks 0-3`` -> ``default, ranks 0-3``), then the words the kind already says (``its stack, ``,
    ``working: ``), then the body cut in its middle; the label and the action are kept whole."""
    tail = f"; {action}" if action else ""
    head = "" if body.startswith(label) else f"{label}: "  # "cannot tell whether ...": the kind's words already
    line = f"{head}{body}{tail}"
    for pattern, replacement in _SHORTER:
        if len(line) <= limit:
            return line
        body = pattern.sub(replacement, body)
        line = f"{head}{body}{tail}"
    if len(line) <= limit:
        return line
    room = max(0, limit - len(head) - len(tail) - 1)
    return f"{head}{body[: room // 2]}…{body[len(body) - (room - room // 2) :]}{tail}"[:limit]


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def _fired(ranks: Sequence[int], stacks: Mapping[int, RankStack]) -> list[int]:
    return [r for r in ranks if (s := stacks.get(r)) is not None and s.fired]


def _place(stack: RankStack) -> str:
    frame = stack.user_frame
    if frame is None:
        return "its stack"
    return f"{frame.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.line} in {frame.function}"


def _evidence(finding: Finding | None, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]) -> dict:
    if finding is None:
        return {}
    named = [*finding.ranks, *finding.waiting]
    return {
        "finding": finding.kind,
        "group": finding.group.name,
        "op": finding.op,
        "seq": finding.seq,
        "waiting": list(finding.waiting),
        "waited_s": None if finding.waited_s is None else round(finding.waited_s, 3),
        "progress": {r: progress[r].to_json() for r in named if r in progress},
        "samples": {r: len(stacks[r].samples) for r in named if r in stacks and stacks[r].fired},
    }


def _still_working(
    finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress], body: str
) -> Kind | None:
    """The ranks named, every one with a stack judged working: a timeout too short for the phase they were in."""
    placed = _fired(finding.ranks, stacks)
    if not placed or any(r not in progress or not progress[r].working for r in placed):
        return None
    slowest = max((progress[r] for r in placed), key=lambda p: p.ran_s or 0.0)
    observed = slowest.ran_s or 0.0
    start_up = finding.seq == 1 and finding.kind == "stall"
    suggestion = longer_timeout(slowest.phase, observed, start_up=start_up)
    return Kind("still_working", None, tuple(finding.ranks), body, suggestion, _evidence(finding, stacks, progress))


def _never_came(finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress], body: str) -> Kind:
    placed = _fired(finding.ranks, stacks)
    evidence = _evidence(finding, stacks, progress)
    who = _ranks(finding.ranks)
    if finding.kind == "missing" and placed and did_not_enter(finding, stacks):
        text = f"fix: the C call {who} {'is' if len(finding.ranks) == 1 else 'are'} in at {_place(stacks[placed[0]])}"
        return Kind("never_came", "gil", tuple(finding.ranks), body, Suggestion(text + " holds the GIL"), evidence)
    if finding.kind == "missing" and not placed:
        text = f"fix: {who}'s host: its process ended or hung (its log, memory, GPU)"
        return Kind("never_came", "dead", tuple(finding.ranks), body, Suggestion(text), evidence)
    if not placed:
        text = f"fix: see where {who} stays: flight_recorder.stack_watch around the step writes its stack"
        return Kind("never_came", "unplaced", tuple(finding.ranks), body, Suggestion(text), evidence)
    stack = stacks[placed[0]]
    if stack.in_torch_distributed:
        text = f"fix: the collective {_ranks(placed[:1])} waits in, at {_place(stack)}"
        return Kind("never_came", "elsewhere", tuple(finding.ranks), body, Suggestion(text), evidence)
    if p2p_unseen(finding, stacks):  # G-NO-P2P: one may wait on another's send, and nothing says which
        text = (
            f"which of {who} is to blame: one may wait in a p2p receive on another's send (torch's Gloo recorder "
            "records no send/recv, and a receive waited on from user code leaves no torch frame)"
        )
        return Kind("cannot_tell", "p2p unseen", tuple(finding.ranks), body, Suggestion(text), evidence)
    text = f"fix: what {_ranks(placed[:1])} waits for at {_place(stack)}"
    return Kind("never_came", "python", tuple(finding.ranks), body, Suggestion(text), evidence)


def _of_finding(finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]) -> Kind:
    """The kind of the first finding (a stall's ranks in a receive set apart: :mod:`.receivers`)."""
    receiving: dict = {}
    if finding.kind == "stall":
        finding, receiving = senders_only(finding, stacks)
    kind = _of_named(finding, stacks, progress)
    if not receiving:
        return kind
    verb = "waits" if len(receiving) == 1 else "wait"
    where = ", ".join(f"rank {r} in {f.function} at {_place(stacks[r])}" for r, f in sorted(receiving.items()))
    note = f"; {_ranks(sorted(receiving))} {verb} for a send, not the culprit{'s' * (len(receiving) > 1)}: {where}"
    evidence = {**kind.evidence, "receiving": sorted(receiving)}
    return dataclasses.replace(kind, body=kind.body + note, evidence=evidence)


def _of_named(finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]) -> Kind:
    """The kind of ``finding``, as it names its ranks."""
    body = finding_line(finding, stacks, progress)
    evidence = _evidence(finding, stacks, progress)
    who, ranks = _ranks(finding.ranks), tuple(finding.ranks)
    if finding.kind in ("stall", "p2p", "missing"):
        working = _still_working(finding, stacks, progress, body)
        if working is not None:
            return working
    if finding.kind == "stall" or (finding.kind == "missing" and finding.waiting):
        return _never_came(finding, stacks, progress, body)
    if finding.kind == "mismatch":
        if finding.called_from():
            text = f"fix: the code path that skips {finding.op} on {who}, or adds one"
            return Kind("skipped_collective", None, ranks, body, Suggestion(text), evidence)
        variant = "op" if finding.detail.startswith("op ") else "sizes"
        text = f"fix: the {'op' if variant == 'op' else 'sizes'} {who} pass{'es' * (len(ranks) == 1)} to {finding.op}"
        return Kind("mismatch", variant, ranks, body, Suggestion(f"{text} #{finding.seq}"), evidence)
    if finding.kind == "p2p":
        text = f"fix: why {who} does not post {'its' if len(ranks) == 1 else 'their'} side (the pipeline's schedule)"
        return Kind("p2p_stall", None, ranks, body, Suggestion(text), evidence)
    one_rank = len(finding.group.ranks) == 1  # a group of one: its rank did not finish (the H200 dump, #42)
    if finding.kind == "not finished" and not one_rank and (not finding.waiting or finding.op == "send/recv"):
        text = f"check the network and GPUs of {_ranks(list(finding.group.ranks))}: no rank is to blame"
        every = tuple(finding.group.ranks) if not finding.waiting and finding.op != "send/recv" else ranks
        return Kind("all_entered_none_finished", None, every, body, Suggestion(text), evidence)
    if finding.kind == "not finished":
        return Kind("did_not_finish", None, ranks, body, Suggestion(f"check {who}'s host: its GPU and NIC"), evidence)
    if finding.kind == "unclear":
        text = "fix: a larger TORCH_FR_BUFFER_SIZE keeps the entries that would tell"
        return Kind("unclear", None, tuple(finding.waiting), body, Suggestion(text), evidence)
    text = f"fix: {who}'s host: its process, its dump folder, its log"
    return Kind("no_dump", None, ranks, body, Suggestion(text), evidence)  # "no dump from ...": its kind's words


def _circular(
    cycle: Cycle, finding: Finding, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]
) -> Kind:
    evidence = {**_evidence(finding, stacks, progress), "cycle": cycle.to_json()}
    if any(step.p2p for step in cycle.steps):  # each side waits for the other to post first
        text = "fix: order these ranks' sends and receives so that one side sends first, or post them together with "
        text += "batch_isend_irecv"
    else:
        text = "fix: call these groups' collectives in one order on every rank"
    return Kind("circular_wait", None, tuple(cycle.ranks), cycle.describe(), Suggestion(text), evidence)


def _without_finding(analysis: Analysis, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]) -> Kind:
    """Nothing found wrong: a missing dump, a stack alone, no entry at all, what cannot be told (a world no record
    states, a collective no member is known to have finished), or every rank agreeing."""
    dumps, missing = analysis.dumps, analysis.missing
    empty = not any(d.n_entries for d in dumps.values())
    places = stalled_line(stacks)
    stayed = _fired(sorted(stacks), stacks)
    evidence = {"progress": {r: progress[r].to_json() for r in stayed if r in progress}}
    if missing:
        line = f"no dump from {_ranks(missing)}"  # it starts with its kind's words
        text = f"fix: {_ranks(missing)}'s host: its process, its dump folder, its log"
        return Kind(
            "no_dump", None, tuple(missing), f"{line}; {places}" if places else line, Suggestion(text), evidence
        )
    if places:
        more = "hold no entry to compare" if empty else "agree, every group at the same collective"
        body = f"{places}; the {len(dumps)} dumps {more}"
        working = [r for r in stayed if r in progress and progress[r].working]
        if working and len(working) == len(stayed):
            slowest = max((progress[r] for r in working), key=lambda p: p.ran_s or 0.0)
            suggestion = longer_timeout(slowest.phase, slowest.ran_s or 0.0)
            return Kind("still_working", None, tuple(stayed), body, suggestion, evidence)
        text = f"fix: what {_ranks(stayed[:1])} waits for at {_place(stacks[stayed[0]])}"
        return Kind("stayed_in_block", None, tuple(stayed), body, Suggestion(text), evidence)
    if empty and not any(f.kind == "hidden" for f in analysis.findings):  # hidden: recorder_evidence
        body = (
            f"the {len(dumps)} dumps hold no entry (torch's Gloo recorder records no send/recv; a recorder made "
            "with TORCH_FR_BUFFER_SIZE=0 records nothing)"
        )
        return Kind("cannot_tell", None, (), body, None, evidence)
    if analysis.findings:
        return _cannot_tell(analysis.findings, stacks, progress)
    world = analysis.world.source if analysis.world else "?"
    body = f"{len(dumps)} dumps of a world of {analysis.world_size} ({world}), every group's last collective finished"
    return Kind("agree", None, (), body, None, evidence)


def _cannot_tell(
    findings: Sequence[Finding], stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]
) -> Kind:
    """Only what cannot be told: the first such finding, and how many groups more are alike."""
    first = findings[0]
    alike = [f for f in findings[1:] if f.kind == first.kind]
    more = f" (and the same for {len(alike)} more group{'s' * (len(alike) > 1)})" if alike else ""
    body = first.line() + more  # "cannot tell whether ...": it starts with its kind
    return Kind("cannot_tell", first.kind, tuple(first.ranks), body, None, _evidence(first, stacks, progress))


def _still_waiting(finding: Finding) -> bool:
    """Whether a peer the finding names as waiting has not finished the op (or its recorder cannot say)."""
    entries = [finding.group.entries.get(r) for r in finding.waiting]
    return any(e is None or not e.done for e in entries)


def _first(findings: Sequence[Finding]) -> Finding:
    """The finding to act on: the analysis's first; but of missing dumps, one whose peers still wait before one
    whose peers finished the op (which the missing rank then entered: a later op is where it stopped)."""
    first = findings[0]
    if first.kind == "missing" and first.waiting and not _still_waiting(first):
        same = [f for f in findings if f.kind == "missing" and f.ranks == first.ranks and _still_waiting(f)]
        return same[0] if same else first
    return first


def classify(analysis: Analysis, stacks: Mapping[int, RankStack], progress: Mapping[int, Progress]) -> Kind:
    """The kind of the hang the analysis, the stacks and their progress show (see the module docstring)."""
    wrong = [f for f in analysis.findings if f.kind not in CANNOT_TELL]
    if not wrong:
        return _without_finding(analysis, stacks, progress)
    first = _first(wrong)
    if first.kind in ("stall", "p2p"):
        cycle = find_cycle(wrong, analysis.dumps)
        if cycle is not None:
            return _circular(cycle, first, stacks, progress)
    chain = chain_of(first, analysis.findings, analysis.dumps)
    root = chain[-1]
    kind = _cannot_tell([root], stacks, progress) if root.kind in CANNOT_TELL else _of_finding(root, stacks, progress)
    return _cascaded(chain, kind)


def _cascaded(chain: Sequence[Finding], kind: Kind) -> Kind:
    """The root's kind, its line saying who waits on it where the finding acted on was a cascade's step
    (:mod:`.cascade`)."""
    if len(chain) < 2:
        return kind
    first = chain[0]
    verb = "waits" if len(first.waiting) == 1 else "wait"
    on = f"; {_ranks(first.waiting)} {verb} on it in {first.op} #{first.seq} on {first.group.label}"
    steps = [{"kind": f.kind, "group": f.group.name, "op": f.op, "seq": f.seq, "ranks": list(f.ranks),
              "waiting": list(f.waiting)} for f in chain]  # fmt: skip
    return dataclasses.replace(kind, body=kind.body + on, evidence={**kind.evidence, "cascade": steps})
