"""One run's dumps read and judged: :func:`read_run` gives the :class:`HangReport`, the typed result.

The order of the reading, and why: the run's files first (:mod:`.folder`), the world the group maps or the caller
state checked against every file rank before any dump is read, the stacks and the progress judged from them; then,
where a caller asks for it, the early first line (:mod:`.early_line`) before every entry is read; then every dump,
each in its bounded reader (:mod:`.loader`); the runs told apart (:mod:`.run_split`), one chosen, its groups known by
their rank sets (:mod:`.group_identity`) and analysed (:mod:`.analysis`). Agreement needs more evidence still: the
run's records meet in time, the run is the one named where the folder holds several, and every field of every dump
is checked (:mod:`.field_checks`, through :func:`~.loader.confirm_dumps`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME
from nemo_rl_shim.hang_report import torch_analyzer
from nemo_rl_shim.hang_report.analysis import CANNOT_TELL, HIDDEN, Analysis, Finding, GroupState, analyse
from nemo_rl_shim.hang_report.early_line import QuickLine, quick_line
from nemo_rl_shim.hang_report.file_identity import same_bytes, same_inode
from nemo_rl_shim.hang_report.folder import RunFiles, find_run
from nemo_rl_shim.hang_report.group_identity import distinguish_groups
from nemo_rl_shim.hang_report.kinds import Kind, classify
from nemo_rl_shim.hang_report.loader import DumpError, RankDump, confirm_dumps, load_dumps, read_sidecars
from nemo_rl_shim.hang_report.progress import Progress, judge_all
from nemo_rl_shim.hang_report.render import render_text, report_json
from nemo_rl_shim.hang_report.run_split import Run, choose_run, describe_hole, for_runs, split_runs, time_hole
from nemo_rl_shim.hang_report.stacks import RankStack, read_stacks
from nemo_rl_shim.hang_report.world import World, check_ranks, stated_world
from nemo_rl_shim.one_line.printable import shown_path

__all__ = [
    "EXIT_AGREE",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "OUTSIDE_READ",
    "PREFLIGHT_DUMP_WAIT_S",
    "HangReport",
    "preflight_summary",
    "quick_first_line",
    "read_run",
    "render",
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
    quick: QuickLine | None = None  # the first line given before every entry was read (:mod:`.early_line`)
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
        if self.empty and not any(f.kind == HIDDEN for f in self.findings):  # C-PG-STATUS: dropped, not empty
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
    """The quick first line the command prints first where the dumps are many (:mod:`.early_line`), alone: None where it
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


def read_run(
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

    A healthy verdict is given only after every field of every dump was checked (:mod:`.field_checks`).
    ``with_torch``: run torch's analyzer too, after the shim's analysis. It imports torch, which nothing else
    here does (:mod:`.torch_analyzer`), so it runs only when asked (``--torch-analyzer``).
    ``early``: where a run's dumps are many, it is handed the early first line (:mod:`.early_line`) as soon as the
    ranks' newest entries tell it, before every entry is read.
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
        report = read_run(directory, world=world_size)
    except DumpError as e:
        return {"summary": f"hang report ({where}): {e}", "exit_code": EXIT_UNREADABLE, "where": where}
    return {"summary": f"hang report ({where}): {report.line}", "where": where, **report.to_json()}
