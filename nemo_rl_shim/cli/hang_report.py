"""``nemo-rl-shim hang-report DIR [--json]``: who did not join the collective, from every rank's Flight Recorder dump.

The first line names the rank(s) that did not enter, or did not finish, the collective the
others waited in: the group as its mesh axes and ranks, the op, its sequence number, and how
long the others waited. Then one line per group, the dumps found, and what torch's own analyzer
(``torch.distributed.flight_recorder``, the code behind ``torchfrtrace``) made of them.

torch's analyzer runs first on every directory, in this process, with its log captured. Where it
runs (NCCL dumps; Gloo dumps written by the shim, whose ``pg_config`` is keyed by group name) its
flagged collectives are in the report; where it fails (Gloo dumps that torch wrote, keyed by an
empty name: ``KeyError``; torch 2.9, which does not ship it) the report says so. Either way the
first line comes from :mod:`nemo_rl_shim.cli._fr_dumps`, which also knows the mesh axes and the
wait times that torch's analyzer does not.

Exit codes: 0 every rank agrees; 1 a stall, an unfinished collective, a mismatch or a missing
dump; 2 a directory or file that cannot be read (one line on stderr).
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli._fr_dumps import DumpError, Finding, GroupState, RankDump, analyse, format_ranks, load_dumps
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME

__all__ = [
    "EXIT_AGREE",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "HangReport",
    "build_report",
    "main",
    "preflight_summary",
    "render",
    "torch_analyzer",
]

EXIT_AGREE, EXIT_FOUND, EXIT_UNREADABLE = 0, 1, 2


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _collective_facts(collective: Any) -> dict[str, Any]:
    mismatch = getattr(collective, "type_of_mismatch", None)
    for other in (getattr(collective, "mismatch_collectives", None) or {}).values():
        mismatch = mismatch or getattr(other, "type_of_mismatch", None)
    return {
        "group": getattr(collective, "group_id", None),
        "pg_desc": getattr(collective, "pg_desc", None),
        "seq": getattr(collective, "collective_seq_id", None),
        "op": getattr(collective, "collective_name", None),
        "missing_ranks": sorted(getattr(collective, "missing_ranks", None) or []),
        "mismatch": str(mismatch) if mismatch is not None else None,
    }


def torch_analyzer(dumps: dict[int, RankDump]) -> dict[str, Any]:
    """Run torch's ``build_db`` on the dumps as they are: what it did (``ran``, ``flagged``) or why not (``error``)."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__}
    logger = logging.getLogger("Flight Recorder")
    capture, saved = _Capture(), (logger.handlers[:], logger.propagate)
    logger.handlers, logger.propagate = [capture], False  # its import and its run log here, not on stderr
    try:
        return {**facts, **_run_torch_analyzer(dumps, capture)}
    finally:
        logger.handlers, logger.propagate = saved


def _run_torch_analyzer(dumps: dict[int, RankDump], capture: _Capture) -> dict[str, Any]:
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # its import warns on stderr when tabulate is missing; tabulate is not needed
    try:
        from torch.distributed.flight_recorder.components import builder
    except ImportError as e:
        return {"ran": False, "error": f"not in this torch: {type(e).__name__}: {e}"}
    finally:
        logging.disable(previous)
    logger = logging.getLogger("Flight Recorder")
    logger.handlers = [capture]
    details = {
        d.path.name: {
            "host_name": f"host_rank{d.rank}",
            "rank": d.rank,
            "entries": copy.deepcopy(d.entries),
            "version": d.version,
            "pg_config": copy.deepcopy(d.pg_config),
        }
        for d in dumps.values()
    }
    args = argparse.Namespace(
        verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10, selected_ranks=None,
        pg_filters=None, print_stack_trace=False, output=None, transform_ft=False,
    )  # fmt: skip
    try:
        version = next(iter(dumps.values())).version if dumps else ""
        db = builder.build_db(details, args, version)
    except (Exception, SystemExit) as e:  # KeyError on Gloo's empty-named pg_config, SystemExit, AssertionError...
        return {"ran": False, "error": f"{type(e).__name__}: {e}", "log": capture.lines[-20:]}
    flagged = [
        _collective_facts(c)
        for c in db.collectives
        if not getattr(c, "pass_check", True) or getattr(c, "missing_ranks", None)
    ]
    return {"ran": True, "collectives": len(db.collectives), "flagged": flagged, "log": capture.lines[-20:]}


@dataclass
class HangReport:
    """What the dumps say: the findings, every group, the dumps, and torch's analyzer's outcome."""

    directory: Path
    dumps: dict[int, RankDump]
    findings: list[Finding]
    groups: list[GroupState]
    missing: list[int]
    torch: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return EXIT_FOUND if self.findings or self.missing else EXIT_AGREE

    @property
    def line(self) -> str:
        """The first line: who did not join, or that every rank agrees."""
        if self.findings:
            return self.findings[0].line()
        if self.missing:
            return f"no dump from rank{'s' * (len(self.missing) > 1)} {format_ranks(self.missing)}"
        return f"every rank agrees: {len(self.dumps)} dumps, every group at the same collective"

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "exit_code": self.exit_code,
            "directory": str(self.directory),
            "missing_dumps": self.missing,
            "findings": [_finding_json(f) for f in self.findings],
            "groups": [
                {"name": g.name, "axes": g.axes, "ranks": list(g.ranks), "last_seq": g.last, "missing": g.missing}
                for g in self.groups
            ],
            "dumps": {
                d.rank: {"file": d.path.name, "writer": d.writer, "reason": d.reason, "entries": len(d.entries)}
                for d in self.dumps.values()
            },
            "torch_analyzer": {k: v for k, v in self.torch.items() if k != "log"},
        }


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "kind": f.kind,
        "ranks": f.ranks,
        "group": f.group.name,
        "axes": f.group.axes,
        "group_ranks": list(f.group.ranks),
        "op": f.op,
        "seq": f.seq,
        "waiting": f.waiting,
        "waited_s": None if f.waited_s is None else round(f.waited_s, 3),
        "detail": f.detail,
        "line": f.line(),
    }


#: Above this many entries in all, torch's analyzer is skipped unless asked for: it took 27 s on 64 ranks of
#: 2,000 entries each (benchmarks/flight_recorder_cost.py), where the shim's own reading takes under 2 s.
TORCH_ANALYZER_MAX_ENTRIES = 20_000


def build_report(directory: str | Path, *, with_torch: bool | None = None) -> HangReport:
    """Read ``directory`` and analyse it; :class:`~nemo_rl_shim.cli._fr_dumps.DumpError` when it cannot be read.

    ``with_torch``: run torch's analyzer too (True), not (False), or when the dumps hold at most
    :data:`TORCH_ANALYZER_MAX_ENTRIES` entries in all (None).
    """
    dumps, _ = load_dumps(directory)
    findings, groups, missing = analyse(dumps)
    entries = sum(len(d.entries) for d in dumps.values())
    if with_torch is None:
        with_torch = entries <= TORCH_ANALYZER_MAX_ENTRIES
    if with_torch:
        torch_facts = torch_analyzer(dumps)
    else:
        import torch

        torch_facts = {
            "torch": torch.__version__,
            "ran": False,
            "error": f"skipped: {entries} entries, more than {TORCH_ANALYZER_MAX_ENTRIES} (--torch-analyzer runs it)",
        }
    return HangReport(Path(directory), dumps, findings, groups, missing, torch_facts)


def _group_line(group: GroupState) -> str:
    at = "; ".join(
        f"rank {r} at #{group.last[r]} {_op_at(group, r)}" if r in group.last else f"rank {r}: no dump"
        for r in group.ranks
    )
    return f"  {group.label} (process group {group.name}): {at}"


def _op_at(group: GroupState, rank: int) -> str:
    seq = group.last.get(rank, 0)
    entry = group.entries.get(rank, {}).get(seq)
    if entry is None:
        return "(no collective yet)"
    name = str(entry.get("profiling_name", "?"))
    return name.split(":", 1)[-1]


def render(report: HangReport) -> str:
    """The text ``nemo-rl-shim hang-report`` prints."""
    lines = [report.line, "", "groups:"]
    lines += [_group_line(g) for g in report.groups if len(g.ranks) > 1]
    if len(report.findings) > 1:
        lines += ["", "also:"] + [f"  {f.line()}" for f in report.findings[1:]]
    lines += ["", "dumps:"]
    for dump in sorted(report.dumps.values(), key=lambda d: d.rank):
        why = f": {dump.reason}" if dump.reason else ""
        entries = f"{len(dump.entries)} entries"
        lines.append(f"  rank {dump.rank}: {dump.path.name}, {entries}, written by {dump.writer}{why}")
    if report.missing:
        lines.append(f"  no dump from rank{'s' * (len(report.missing) > 1)} {format_ranks(report.missing)}")
    t = report.torch
    if t.get("ran"):
        flagged = ", ".join(
            f"{c['op']} #{c['seq']} ({c['mismatch'] or 'missing ranks ' + str(c['missing_ranks'])})"
            for c in t["flagged"]
        )
        lines.append(
            f"torch {t['torch']} analyzer: ran, matched {t['collectives']} collectives, flagged {len(t['flagged'])}"
            + (f": {flagged}" if flagged else "")
        )
    else:
        lines.append(f"torch {t['torch']} analyzer: did not run: {t['error']}")
    return "\n".join(lines)


def main(directory: str, *, as_json: bool = False, with_torch: bool | None = None) -> tuple[int, str]:
    """The command: ``(exit code, text)``; a :class:`DumpError` is ``(2, its one line)``."""
    import json

    try:
        report = build_report(directory, with_torch=with_torch)
    except DumpError as e:
        return EXIT_UNREADABLE, f"hang-report: {e}"
    text = json.dumps(report.to_json(), indent=2, default=str) if as_json else render(report)
    return report.exit_code, text


#: How long a failed preflight waits for every rank's dump (the last rank dumps when its watcher is asked).
PREFLIGHT_DUMP_WAIT_S = 5.0


def _wait_for_dumps(directory: Path, world_size: int, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        present = {p.name for p in directory.glob(f"{DUMP_FILE_NAME}*")}
        if all(f"{DUMP_FILE_NAME}{rank}" in present for rank in range(world_size)):
            return
        time.sleep(0.1)


def preflight_summary(
    directory: str | Path, world_size: int, hosts: list[str] | None = None, wait_s: float = PREFLIGHT_DUMP_WAIT_S
) -> dict[str, Any]:
    """What a failed ``preflight`` run with the recorder on ends with: ``summary`` (one line) and the report's JSON.

    Waits up to ``wait_s`` for every rank's dump first. ``hosts``: the nodes the ranks ran on (Ray),
    to say where the dumps were written.
    """
    directory = Path(directory)
    _wait_for_dumps(directory, world_size, wait_s)
    where = f"dumps in {directory}"
    if hosts and len(hosts) > 1:
        where += f" on this node; ranks on other nodes ({', '.join(hosts)}) wrote theirs to {directory} on their node"
    elif hosts:
        where += f", written by the Ray actors on their node ({hosts[0]})"
    try:
        report = build_report(directory)
    except DumpError as e:
        return {"summary": f"hang report ({where}): {e}", "exit_code": EXIT_UNREADABLE, "where": where}
    return {"summary": f"hang report ({where}): {report.line}", "where": where, **report.to_json()}
