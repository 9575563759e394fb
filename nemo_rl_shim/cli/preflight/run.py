"""``run_preflight``: size the world, pick the runner, run it, and assemble the report, once for all four runners.

The runner (:mod:`~nemo_rl_shim.cli.preflight.runner`): a dry run on torch's fake backend
(``options.dry_run``), Ray actors (``options.ray_address``), the torchrun/srun world this
process is a rank of (:func:`~nemo_rl_shim.cli.preflight.join.detect_launcher`), or local
spawned ranks. The world: the runner's own when it has one (a launcher's, a dry run's), else
the training world when it fits what the runner can hold
(:func:`~nemo_rl_shim.cli.preflight.options.ranks_for_world`), else the runner's default (one
rank per GPU, or 2 CPU ranks); ``--nproc`` always wins. The problems: the runner's own, else
those :func:`~nemo_rl_shim.cli.preflight.report.find_problems` reads from the rows; before them, a
config whose job does not run on the checked path
(:func:`~nemo_rl_shim.cli.preflight.report.off_the_checked_path`), which is never OK. Who prints the
report is the runner's to say (:attr:`~nemo_rl_shim.cli.preflight.runner.Runner.reports`). A failed
run with the Flight Recorder on ends with hang-report's line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from nemo_rl_shim.cli.preflight.join import JoinRunner, detect_launcher
from nemo_rl_shim.cli.preflight.options import PreflightOptions, ranks_for_world
from nemo_rl_shim.cli.preflight.report import PreflightReport, find_problems, off_the_checked_path
from nemo_rl_shim.cli.preflight.runner import Progress, RankPlan, RankRun, Runner

__all__ = ["LastWords", "pick_runner", "problems_of", "run_preflight"]

#: Called with one line by a runner's watchdog just before it ends the process (exit 1): with ``--json``,
#: the command prints a JSON report there, so that stdout holds one on that path too.
LastWords = Callable[[str], None]


def pick_runner(
    options: PreflightOptions, environ: Mapping[str, str] | None = None, last_words: LastWords | None = None
) -> Runner:
    """The runner ``options`` ask for; see the module docstring."""
    if options.dry_run:
        from nemo_rl_shim.cli.preflight.dry_run import DryRunner

        return DryRunner()
    if options.ray_address is not None:
        from nemo_rl_shim.cli.preflight.ray_actors import RayRunner

        return RayRunner(options.ray_address, options.timeout_s, last_words)
    launcher = detect_launcher(environ)
    if launcher is not None:
        return JoinRunner(launcher, last_words)
    from nemo_rl_shim.cli.preflight.one_gpu import local_runner

    return local_runner(environ=environ)  # spawned ranks; with exactly one CUDA device, also one rank on it


def _size(runner: Runner, options: PreflightOptions) -> RankPlan:
    capacity = runner.capacity(options)
    if capacity.world is not None:
        return runner.plan(capacity.world)
    room = runner.plan(None)
    return runner.plan(ranks_for_world(options, room.world_size, capacity.here))


def problems_of(run: RankRun, options: PreflightOptions) -> tuple[list[str], bool]:
    """Every problem of ``run``, the most telling first, and whether the checks themselves found none.

    The runner's own problems (an actor that died, ranks that did not finish), else those read from
    the ranks' results; a config whose job does not run on the checked path comes first either way.
    """
    found = list(run.problems) or find_problems(run.ranks, options, run.timed_out)
    off_path = off_the_checked_path(options)
    return ([off_path] if off_path else []) + found, not found


def _within(options: PreflightOptions, deadline: float | None) -> PreflightOptions:
    """``options`` whose ``timeout_s`` is what is left before ``deadline`` (the command's ``--timeout-s`` runs from
    its start: what reading the recipe and the imports took is not the ranks' to spend)."""
    if deadline is None:
        return options
    left = round(max(deadline - time.monotonic(), 0.0), 1)
    return replace(options, timeout_s=left, timeout_whole_s=options.timeout_whole_s or options.timeout_s)


def run_preflight(
    options: PreflightOptions,
    progress: Progress | None = None,
    environ: Mapping[str, str] | None = None,
    last_words: LastWords | None = None,
    deadline: float | None = None,
) -> PreflightReport:
    """Check ``options`` on the runner they ask for (see the module docstring); the report of every rank.

    Raises ``ValueError`` (exit 2) for a world that does not fit
    (:class:`~nemo_rl_shim.cli.preflight.options.WorldTooLarge`), more ranks than the runner can hold,
    or a layout that cannot be built. ``last_words``: see :data:`LastWords`. ``deadline`` (``time.monotonic()``):
    the end of the command's ``--timeout-s``; the runner, then its ranks, get what is left of it (default:
    ``options.timeout_s`` from when the ranks start).
    """
    progress = progress or (lambda message: None)
    with pick_runner(_within(options, deadline), environ, last_words) as runner:
        plan = _size(runner, options)
        start = time.monotonic()
        given = _within(options, deadline)  # what is left of the command's --timeout-s when the ranks start
        run = runner.run(given, plan, progress)
    problems, checks_passed = problems_of(run, given)
    report = PreflightReport(
        run.launcher, run.world_size, options, run.ranks, time.monotonic() - start, run.note, run.timed_out,
        problems, details=run.details, facts=run.facts, checks_passed=checks_passed, reports=runner.reports,
        joined=runner.joined,
    )  # fmt: skip
    if not report.reports:
        return report  # the reporting process (rank 0 of a launcher's world) says who did not join
    return _with_hang_report(report, options)


def _with_hang_report(report: PreflightReport, options: PreflightOptions) -> PreflightReport:
    """A failed run with the Flight Recorder on ends with hang-report's line (``report.facts["hang_report"]``)."""
    recorder = options.flight_recorder
    if recorder is None or report.checks_passed or options.dry_run:  # a run that found nothing has no hang
        return report
    from nemo_rl_shim.hang_report import preflight_summary

    hosts = sorted({r.node.node_ip for r in report.ranks if r.node is not None})
    report.facts["hang_report"] = preflight_summary(recorder.dump_dir, report.world_size, hosts)
    return report
