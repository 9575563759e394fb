"""``nemo-rl-shim hang-report DIR [--json]``: who did not join the collective, from every rank's Flight Recorder dump.

The first line names the rank(s) that did not enter, or did not finish, the collective or the
point-to-point op the others waited in: the group as its mesh axes and ranks, the op, its sequence
number; then, where that rank left a stack file, its innermost frame in user code; then how long, and
where, the others waited. Then the groups by shape, the other findings, the stacks (identical ones
grouped, the outliers first), the dumps, and, with ``--torch-analyzer``, what torch's own analyzer made of them.

Split by job, as torch's own ``flight_recorder/`` keeps loader, builder and types apart:
:mod:`.folder` (which files of a folder may be one run's, by their names), :mod:`.file_identity` (each file is its
rank's: no link, no copy), :mod:`.loader` (reading them in forked readers bounded by
their bytes), :mod:`.dump_format` (torch's dump format, read as untrusted input through :mod:`.safe_pickle` and
:mod:`nemo_rl_shim.cli.untrusted_file`, bounded by :mod:`.bounds`), :mod:`.recording_rules` (what torch's recorder
guarantees of one dump, each rule citing its torch code), :mod:`.run_evidence` and :mod:`.run_split` (which dumps
are one run, proved from what they hold, and which run is reported on), :mod:`.group_records` (a group's members as a
record lists them), :mod:`.group_identity` (a group is its rank set, whatever its name), :mod:`.schema` (every field
checked, before a healthy verdict), :mod:`.records` (the typed
records), :mod:`.world` (the run's ranks, from records or ``--world``), :mod:`.analysis` (who did not join),
:mod:`.torch_analyzer` (torch's analyzer, one line whatever it does), :mod:`.stacks` (the stack files),
:mod:`.where` (the first line, with places) and :mod:`.render` (text and JSON). This module is the command.

**One run.** A folder may hold several runs' dumps (torch's default prefix is shared by every job on a node; a
restart writes where the last run wrote). The report is about one run, proved (:mod:`.run_split`): the run
``--run N`` names, else the newest complete one; the others are named with their files and time ranges and set
aside, never merged, and a rank missing from the run reported on left no dump, whatever an older run left. Without
``--run``, a folder of several runs never gives exit 0.

Exit codes: 0 only with evidence: every rank of a known world left a dump, every group's last collective is known
to have finished, and every field of every dump was checked; 1 a stall, an unfinished collective or p2p op, a
mismatch, a missing dump, a stack written (a rank stayed in a watched block past its deadline), or what cannot be
told (a world no record states, a collective no recorder says finished: torch's Gloo dumps); 2 a folder or file
that cannot be read or is not a regular file, a dump that is malformed or refused (it would run code, or expand
past its bytes), dumps that disagree on the world, a folder of several runs, or dumps that hold no entry to
compare (one line on stderr naming the file; with ``--json`` the same line in a JSON object on stdout too).
Whatever else fails is exit 2 and one line too, never a traceback.

Imports no torch: the report reads pickles, and a login node may have no torch. Of the library it reaches only
:mod:`nemo_rl_shim.flight_recorder.names` and :mod:`nemo_rl_shim.one_line`; torch's analyzer imports torch when
asked for (``tests/test_layers.py`` holds both, from the sources and in a fresh interpreter).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.hang_report import torch_analyzer
from nemo_rl_shim.cli.hang_report.analysis import CANNOT_TELL, Analysis, Finding, GroupState, analyse
from nemo_rl_shim.cli.hang_report.file_identity import same_bytes, same_inode
from nemo_rl_shim.cli.hang_report.folder import RunFiles, find_run
from nemo_rl_shim.cli.hang_report.group_identity import distinguish_groups
from nemo_rl_shim.cli.hang_report.kinds import Kind, classify
from nemo_rl_shim.cli.hang_report.loader import DumpError, RankDump, confirm_dumps, load_dumps, read_sidecars
from nemo_rl_shim.cli.hang_report.progress import Progress, judge_all
from nemo_rl_shim.cli.hang_report.quick import QuickLine, quick_line
from nemo_rl_shim.cli.hang_report.render import render_text, report_json
from nemo_rl_shim.cli.hang_report.run_split import Run, choose_run, describe_hole, for_runs, split_runs, time_hole
from nemo_rl_shim.cli.hang_report.stacks import RankStack, read_stacks
from nemo_rl_shim.cli.hang_report.world import World, check_ranks, stated_world
from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import clean, encodable, shown_path

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
    "quick_first_line",
    "render",
    "torch_analyzer",
]

EXIT_AGREE, EXIT_FOUND, EXIT_UNREADABLE = 0, 1, 2


@dataclass
class HangReport:
    """What the dumps say: the analysis, torch's analyzer's outcome, the ranks' stack files, and the run's files
    (how its dumps were chosen, where the folder held several runs' and a rule chose)."""

    directory: Path
    analysis: Analysis
    torch: dict[str, Any]
    stacks: dict[int, RankStack] = field(default_factory=dict)
    run: RunFiles | None = None
    progress: dict[int, Progress] | None = None  # judged from the stacks (and their counters) when not given
    quick: QuickLine | None = None  # the first line given before every entry was read (:mod:`.quick`)
    runs: list[Run] = field(default_factory=list)  # the folder's runs (:mod:`.run_split`), oldest first
    chosen: Run | None = None  # the run reported on

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = judge_all(self.stacks, self.run.root if self.run is not None else None)

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
        """0 only with evidence: a known world whose every rank dumped, and no finding (every group's last collective
        known to have finished); 2 where the dumps hold nothing to compare and nothing else is wrong; else 1."""
        wrong = [f for f in self.findings if f.kind not in CANNOT_TELL]
        if wrong or self.missing or self.stalled:
            return EXIT_FOUND
        if self.empty:
            return EXIT_UNREADABLE
        return EXIT_FOUND if self.findings else EXIT_AGREE

    @property
    def kind(self) -> Kind:
        """What kind of failure it was, who, where, and what to do (:mod:`.kinds`)."""
        return classify(self.analysis, self.stacks, self.progress or {})

    @property
    def line(self) -> str:
        """The first line: the kind, who did not join and where it is, what to do; or that every rank agrees; then,
        where a rule chose the run's dumps among several runs', that rule; where the folder held several runs, which
        one this is and what was set aside; and the strays, named."""
        notes = []
        rule = self.run.rule if self.run is not None else ""
        if rule and self.run is not None:
            left = ", ".join(f"{shown_path(p)}<rank>" for p in sorted(self.run.left)[:3])
            notes.append(f"{rule}; not read: {left}")
        if len(self.runs) > 1 and self.chosen is not None:
            aside = [r for r in self.runs if r is not self.chosen]
            notes.append(
                f"run {self.chosen.number} of {len(self.runs)} in the folder; set aside: "
                + "; ".join(f"run {r.number} ({r.files(2, self.directory)})" for r in aside[:2])
                + (f" and {len(aside) - 2} more runs" if len(aside) > 2 else "")
            )
        if self.run is not None and self.run.strays:
            strays = self.run.strays
            more = f" and {len(strays) - 1:,} more" if len(strays) > 1 else ""
            notes.append(f"not dumps, not read: {shown_path(strays[0].name)}{more} (not a rank's name)")
        return self.kind.line_with(f"[{'; '.join(notes)}]") if notes else self.kind.line

    def to_json(self) -> dict[str, Any]:
        payload = report_json(self.line, self.exit_code, self.analysis, self.directory, self.torch, self.stacks)
        payload["kind"] = self.kind.to_json()
        if self.quick is not None:
            payload["quick"] = self.quick.to_json(self.line)
        payload["progress"] = {rank: found.to_json() for rank, found in sorted((self.progress or {}).items())}
        if self.run is not None and self.run.rule:
            payload["run"] = {"rule": self.run.rule, "not_read": sorted(self.run.left)}
        if self.chosen is not None:
            payload["runs"] = for_runs(self.runs, self.chosen)
        if self.run is not None:
            payload["strays"] = [shown_path(p) for p in self.run.strays]
        return payload

    def runs_lines(self) -> list[str]:
        """The text's lines on the runs, where the folder held several, and on the strays."""
        lines = []
        if len(self.runs) > 1 and self.chosen is not None:
            lines += ["", f"runs ({len(self.runs)} in the folder; this report is on run {self.chosen.number}):"]
            for run in self.runs:
                if run is self.chosen:
                    lines.append(f"  {run.describe()}: reported on")
                else:
                    lines.append(f"  {run.describe()}: set aside ({run.files(3, self.directory)}); {run.aside}")
        if self.run is not None and self.run.strays:
            lines += ["", "not dumps (named like one, but not <prefix><rank>, the rank in ASCII digits): not read"]
            lines += [f"  {shown_path(p)}" for p in self.run.strays[:8]]
            if len(self.run.strays) > 8:
                lines.append(f"  and {len(self.run.strays) - 8:,} more")
        return lines


def _early_world(run: RunFiles, sidecars: Mapping[int, Mapping[str, Any]], world: int | None) -> World | None:
    """The world the group maps and ``--world`` state, checked against every file rank before any dump is read."""
    stated = stated_world(sidecars=sidecars, given=world)
    if stated is not None:
        check_ranks(stated, run.dumps, run.dumps)
    return stated


#: Files outside the world the lowest rank's dump states that are still read (as another run's, to be set aside):
#: past this many, they are refused unread (100,000 stray files cost their names, not their reading).
OUTSIDE_READ = 4096


def _check_first(run: RunFiles, sidecars: Mapping[int, Mapping[str, Any]], world: int | None) -> Any:
    """What the lowest rank's dump states of the world, checked against every file rank before the others are read;
    then no two rank names may be one file. Where ``--world`` or a group map states the world, every file outside it
    was refused already (:func:`_early_world`); where only the lowest rank's dump does, up to :data:`OUTSIDE_READ`
    files outside it are read: another run's (a run of a larger world that wrote here before), which
    :mod:`.run_split` sets aside, or a file whose own record places it outside, which the analysis refuses."""

    def check(first: RankDump) -> None:
        stated = stated_world({first.rank: first}, sidecars, world)
        if stated is not None and sum(1 for r in run.dumps if r >= stated.size) > OUTSIDE_READ:
            check_ranks(stated, run.dumps, run.dumps)
        same_inode(run.dumps)  # two rank names of one file: refused before the others are read

    return check


def _prepare(
    directory: Path, world: int | None, environ: Mapping[str, str] | None
) -> tuple[RunFiles, dict[int, dict[str, Any]], dict[int, RankStack], dict[int, Progress]]:
    """The run's files, its group maps (the world they state checked against every file rank), its stacks, and the
    progress judged from them."""
    run = find_run(directory, environ)
    sidecars = read_sidecars(run)
    _early_world(run, sidecars, world)
    stacks = read_stacks(run.stacks, run.root)
    return run, sidecars, stacks, judge_all(stacks, run.root)


def quick_first_line(
    directory: str | Path, *, world: int | None = None, environ: Mapping[str, str] | None = None
) -> QuickLine | None:
    """The quick first line the command prints first where the dumps are many (:mod:`.quick`), alone: None where it
    does not apply."""
    run, sidecars, stacks, progress = _prepare(Path(directory), world, environ)
    return quick_line(run, sidecars, stacks, progress, world)


def _several_runs(runs: list[Run], chosen: Run, directory: Path) -> Finding:
    """Without ``--run``, a folder of several runs gives no verdict of agreement: which run is meant is not proved."""
    listed = "; ".join(run.describe() for run in runs[-3:])
    detail = (
        f"cannot tell whether run {chosen.number} is the run meant: {shown_path(directory)} holds {len(runs)} runs "
        f"({listed}); name it with --run {chosen.number} for its own verdict"
    )
    everyone = GroupState("", range(0), ["runs"])
    return Finding("several runs", everyone, [], 0, "", [], None, 0, detail)


def _unproved(chosen: Run, hole: tuple[int, int]) -> Finding:
    """A run whose dumps' time ranges do not meet gives no verdict of agreement: that they are one run is not
    proved."""
    detail = f"cannot tell that the {len(chosen.dumps)} dumps are one run: {describe_hole(chosen, hole)}"
    return Finding("unproved run", GroupState("", range(0), ["runs"]), [], 0, "", [], None, 0, detail)


def _no_entry(report: HangReport, directory: Path) -> DumpError:
    """The dumps hold no entry to compare, and nothing else was found: one line naming the input."""
    dumps = sorted(report.dumps.values(), key=lambda d: d.rank)
    what = shown_path(dumps[0].path) if len(dumps) == 1 else f"{shown_path(directory)}: its {len(dumps)} dumps"
    return DumpError(
        f"{what} {'holds' if len(dumps) == 1 else 'hold'} no entry to compare (torch's Gloo recorder records no "
        "send/recv; a recorder made with TORCH_FR_BUFFER_SIZE=0 records nothing)"
    )


def build_report(
    directory: str | Path,
    *,
    with_torch: bool = False,
    world: int | None = None,
    environ: Mapping[str, str] | None = None,
    early: Callable[[str], None] | None = None,
    run: int | None = None,
) -> HangReport:
    """Read ``directory`` (one run's files in it and its subfolders) and analyse it; :class:`DumpError` when it cannot
    be read. ``world``: the run's world size where the user knows it (``--world``); the records must agree.
    ``run``: the run to report on where the folder holds several (``--run N``: :mod:`.run_split` numbers them, 1 the
    oldest); else the newest complete one, and then no exit 0.

    A healthy verdict is given only after every field of every dump was checked (:mod:`.schema`).
    ``with_torch``: run torch's analyzer too, after the shim's analysis. It imports torch, which nothing else
    here does (:mod:`.torch_analyzer`), so it runs only when asked (``--torch-analyzer``).
    ``early``: where a run's dumps are many, it is handed the quick first line (:mod:`.quick`) as soon as the ranks'
    newest entries tell it, before every entry is read.
    """
    directory = Path(directory)
    files, sidecars, stacks, progress = _prepare(directory, world, environ)
    quick = quick_line(files, sidecars, stacks, progress, world) if early is not None else None
    if quick is not None and early is not None:
        early(quick.line)
    read = list(load_dumps(files, sidecars=sidecars, check_first=_check_first(files, sidecars, world)))
    same_bytes({d.rank: (d.path, d.fingerprint) for d in read if d.n_entries})  # empty dumps may well be alike
    runs = split_runs(read)
    chosen = choose_run(runs, directory, run, world) if runs else None
    dumps = distinguish_groups(chosen.dumps) if chosen is not None else {}
    analysis = analyse([dumps[rank] for rank in sorted(dumps)], world=world)
    report = HangReport(directory, analysis, torch_analyzer.skipped(), stacks, files, progress, quick, runs, chosen)
    if chosen is not None and report.exit_code == EXIT_AGREE and (hole := time_hole(chosen)) is not None:
        analysis.findings.append(_unproved(chosen, hole))  # agreement needs the run's records to meet in time
    if len(runs) > 1 and run is None and chosen is not None and report.exit_code == EXIT_AGREE:
        analysis.findings.append(_several_runs(runs, chosen, directory))  # the verdict is the named run's alone
    if report.exit_code == EXIT_UNREADABLE:
        raise _no_entry(report, directory)
    if report.exit_code == EXIT_AGREE:
        confirm_dumps(dataclasses.replace(files, dumps={r: files.dumps[r] for r in dumps}))
    if with_torch:
        report.torch = torch_analyzer.run(analysis.dumps)
    return report


def render(report: HangReport) -> str:
    """The text ``nemo-rl-shim hang-report`` prints."""
    return render_text(
        report.line, report.analysis, report.directory, report.torch, report.stacks, report.progress,
        report.runs_lines(),
    )  # fmt: skip


def _refusal(directory: str, line: str, as_json: bool) -> tuple[int, str]:
    if as_json:
        payload = {"line": line, "exit_code": EXIT_UNREADABLE, "directory": shown_path(directory), "error": line}
        return EXIT_UNREADABLE, json.dumps(payload, indent=2)
    return EXIT_UNREADABLE, line


def _after_quick(text: str, quick: QuickLine | None) -> str:
    """The text, less its first line where the quick line given before it was the same; else with the full reading's
    first line said as such."""
    if quick is None:
        return text
    first, _, rest = text.partition("\n")
    if first == quick.line:
        return rest.lstrip("\n")
    return f"read in full, the first line is: {first}\n{rest}"


def main(
    directory: str,
    *,
    as_json: bool = False,
    with_torch: bool = False,
    world: int | None = None,
    early: Callable[[str], None] | None = None,
    run: int | None = None,
) -> tuple[int, str]:
    """The command: ``(exit code, text)``; a :class:`DumpError` is ``(2, its one line)``, or with ``as_json`` a JSON
    object that carries it (``line``, ``exit_code``, ``error``), so that ``--json`` is JSON on every path. Whatever
    else goes wrong is exit 2 and one line too, saying it is the report's own defect (never a traceback, never the
    exit 1 of a found stall). The text is always writable as UTF-8."""
    try:
        quick_first = early if not as_json else None
        report = build_report(directory, with_torch=with_torch, world=world, early=quick_first, run=run)
        text = json.dumps(report.to_json(), indent=2, default=str) if as_json else render(report)
        if quick_first is not None:
            text = _after_quick(text, report.quick)
        return report.exit_code, encodable(text)
    except DumpError as e:
        return _refusal(directory, encodable(f"hang-report: {clean(str(e), limit=2000)}"), as_json)
    except MemoryError:  # this process's own limit (the readers' are theirs): not a defect, not a stall
        line = f"hang-report: reading {shown_path(directory)} needs more memory than this process may have"
        return _refusal(directory, encodable(line), as_json)
    except Exception as e:  # a defect of the report itself: still one line and exit 2, never read as a stall
        line = f"hang-report: could not read {shown_path(directory)}: {first_line(e)} (a defect of hang-report)"
        return _refusal(directory, encodable(clean(line, limit=2000)), as_json)


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

    Waits up to ``wait_s`` for every rank's dump first; the world is the one preflight ran (``world_size``).
    ``hosts``: the nodes the ranks ran on (Ray), to say where the dumps were written.
    """
    directory = Path(directory)
    _wait_for_dumps(directory, world_size, wait_s)
    where = f"dumps in {directory}"
    if hosts and len(hosts) > 1:
        where += f" on this node; ranks on other nodes ({', '.join(hosts)}) wrote theirs to {directory} on their node"
    elif hosts:
        where += f", written by the Ray actors on their node ({hosts[0]})"
    try:
        report = build_report(directory, world=world_size)
    except DumpError as e:
        return {"summary": f"hang report ({where}): {e}", "exit_code": EXIT_UNREADABLE, "where": where}
    return {"summary": f"hang report ({where}): {report.line}", "where": where, **report.to_json()}
