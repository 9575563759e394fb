"""``nemo-rl-shim hang-report DIR [--json]``: who did not join the collective, from every rank's Flight Recorder dump.

The first line names the rank(s) that did not enter, or did not finish, the collective or the
point-to-point op the others waited in: the group as its mesh axes and ranks, the op, its sequence
number; then, where that rank left a stack file, its innermost frame in user code; then how long, and
where, the others waited. Then the groups by shape, the other findings, the stacks (identical ones
grouped, the outliers first), the dumps, and, with ``--torch-analyzer``, what torch's own analyzer made of them.

Split by job, as torch's own ``flight_recorder/`` keeps loader, builder and types apart:
:mod:`.loader` (finding the dumps, reading many in processes), :mod:`.dump_format` (torch's dump format,
read as untrusted input through :mod:`.safe_pickle`), :mod:`.records` (the typed records), :mod:`.world`
(the run's ranks, from the dumps' own records), :mod:`.analysis` (who did not join),
:mod:`.torch_analyzer` (torch's analyzer, one line whatever it does), :mod:`.stacks` (the stack files),
:mod:`.where` (the first line, with places) and :mod:`.render` (text and JSON). This module is the command.

Exit codes: 0 every rank agrees; 1 a stall, an unfinished collective or p2p op, a mismatch, a missing
dump, or a stack written (a rank stayed in a watched block past its deadline); 2 a folder or file that
cannot be read, a dump that is malformed or refused (it would run code), dumps that disagree on the world,
or dumps that hold no entry to compare (one line on stderr naming the file; with ``--json`` the same line
in a JSON object on stdout too).

Imports no torch: the report reads pickles, and a login node may have no torch. Of the library it reaches only
:mod:`nemo_rl_shim.flight_recorder.names` and :mod:`nemo_rl_shim.one_line`; torch's analyzer imports torch when
asked for (``tests/test_layers.py`` holds both, from the sources and in a fresh interpreter).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.hang_report import torch_analyzer
from nemo_rl_shim.cli.hang_report.analysis import Analysis, Finding, GroupState, analyse
from nemo_rl_shim.cli.hang_report.kinds import Kind, classify
from nemo_rl_shim.cli.hang_report.loader import DumpError, RankDump, load_dumps
from nemo_rl_shim.cli.hang_report.progress import Progress, judge_all
from nemo_rl_shim.cli.hang_report.render import render_text, report_json
from nemo_rl_shim.cli.hang_report.stacks import RankStack, load_stacks
from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME

__all__ = [
    "EXIT_AGREE",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "PREFLIGHT_DUMP_WAIT_S",
    "DumpError",
    "Finding",
    "GroupState",
    "HangReport",
    "Kind",
    "Progress",
    "RankDump",
    "RankStack",
    "build_report",
    "main",
    "preflight_summary",
    "render",
    "torch_analyzer",
]

EXIT_AGREE, EXIT_FOUND, EXIT_UNREADABLE = 0, 1, 2


@dataclass
class HangReport:
    """What the dumps say: the analysis, torch's analyzer's outcome, the ranks' stack files and their progress."""

    directory: Path
    analysis: Analysis
    torch: dict[str, Any]
    stacks: dict[int, RankStack] = field(default_factory=dict)
    progress: dict[int, Progress] | None = None  # judged from the stacks when not given

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = judge_all(self.stacks)

    @property
    def dumps(self) -> dict[int, RankDump]:
        return self.analysis.dumps

    @property
    def findings(self) -> list[Finding]:
        return self.analysis.findings

    @property
    def groups(self) -> list[GroupState]:
        return self.analysis.groups

    @property
    def missing(self) -> list[int]:
        return self.analysis.missing

    @property
    def empty(self) -> bool:
        """No dump holds an entry: nothing to compare, so nothing can be told."""
        return not any(d.n_entries for d in self.dumps.values())

    @property
    def stalled(self) -> list[int]:
        """Ranks whose stack was written: they stayed in a watched block past its deadline."""
        return [rank for rank, stack in self.stacks.items() if stack.fired]

    @property
    def exit_code(self) -> int:
        if self.findings or self.missing or self.stalled:
            return EXIT_FOUND
        return EXIT_UNREADABLE if self.empty else EXIT_AGREE

    @property
    def kind(self) -> Kind:
        """What kind of failure it was, who, where, and what to do (:mod:`.kinds`)."""
        return classify(self.analysis, self.stacks, self.progress or {})

    @property
    def line(self) -> str:
        """The first line: the kind, who did not join and where it is, what to do; or that every rank agrees."""
        return self.kind.line

    def to_json(self) -> dict[str, Any]:
        payload = report_json(self.line, self.exit_code, self.analysis, self.directory, self.torch, self.stacks)
        payload["kind"] = self.kind.to_json()
        payload["progress"] = {rank: found.to_json() for rank, found in sorted((self.progress or {}).items())}
        return payload


def build_report(directory: str | Path, *, with_torch: bool = False) -> HangReport:
    """Read ``directory`` (and its subfolders) and analyse it; :class:`DumpError` when it cannot be read.

    ``with_torch``: run torch's analyzer too, after the shim's analysis. It imports torch, which nothing else
    here does (:mod:`.torch_analyzer`), so it runs only when asked (``--torch-analyzer``).
    """
    directory = Path(directory)
    analysis = analyse(load_dumps(directory))
    torch_facts = torch_analyzer.run(analysis.dumps) if with_torch else torch_analyzer.skipped()
    return HangReport(directory, analysis, torch_facts, load_stacks(directory))


def render(report: HangReport) -> str:
    """The text ``nemo-rl-shim hang-report`` prints."""
    return render_text(report.line, report.analysis, report.directory, report.torch, report.stacks, report.progress)


def main(directory: str, *, as_json: bool = False, with_torch: bool = False) -> tuple[int, str]:
    """The command: ``(exit code, text)``; a :class:`DumpError` is ``(2, its one line)``, or with ``as_json`` a JSON
    object that carries it (``line``, ``exit_code``, ``error``), so that ``--json`` is JSON on every path."""
    try:
        report = build_report(directory, with_torch=with_torch)
    except DumpError as e:
        line = f"hang-report: {e}"
        if as_json:
            payload = {"line": line, "exit_code": EXIT_UNREADABLE, "directory": str(directory), "error": str(e)}
            return EXIT_UNREADABLE, json.dumps(payload, indent=2)
        return EXIT_UNREADABLE, line
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
