"""``run_preflight``: size the world, pick the runner, run it, and assemble the report, once for all four runners.

The runner (:mod:`~nemo_rl_shim.cli.preflight.runner`): a dry run on torch's fake backend
(``options.dry_run``), Ray actors (``options.ray_address``), the torchrun/srun world this
process is a rank of (:func:`~nemo_rl_shim.cli.preflight.join.detect_launcher`), or local
spawned ranks. The world: the runner's own when it has one (a launcher's, a dry run's), else
the training world when it fits what the runner can hold
(:func:`~nemo_rl_shim.cli.preflight.options.ranks_for_world`), else the runner's default (one
rank per GPU, or 2 CPU ranks); ``--nproc`` always wins. The problems: the runner's own, else
those :func:`~nemo_rl_shim.cli.preflight.report.find_problems` reads from the rows. A failed run
with the Flight Recorder on ends with hang-report's line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from nemo_rl_shim.cli.preflight.join import JoinRunner, detect_launcher
from nemo_rl_shim.cli.preflight.options import PreflightOptions, ranks_for_world
from nemo_rl_shim.cli.preflight.report import PreflightReport, find_problems
from nemo_rl_shim.cli.preflight.runner import Progress, RankPlan, Runner

__all__ = ["pick_runner", "run_preflight"]


def pick_runner(options: PreflightOptions, environ: Mapping[str, str] | None = None) -> Runner:
    """The runner ``options`` ask for; see the module docstring."""
    if options.dry_run:
        from nemo_rl_shim.cli.preflight.dry_run import DryRunner

        return DryRunner()
    if options.ray_address is not None:
        from nemo_rl_shim.cli.preflight.ray_actors import RayRunner

        return RayRunner(options.ray_address, options.timeout_s)
    launcher = detect_launcher(environ)
    if launcher is not None:
        return JoinRunner(launcher)
    from nemo_rl_shim.cli.preflight.spawn import SpawnRunner

    return SpawnRunner()


def _size(runner: Runner, options: PreflightOptions) -> RankPlan:
    capacity = runner.capacity(options)
    if capacity.world is not None:
        return runner.plan(capacity.world)
    room = runner.plan(None)
    return runner.plan(ranks_for_world(options, room.world_size, capacity.here))


def run_preflight(
    options: PreflightOptions, progress: Progress | None = None, environ: Mapping[str, str] | None = None
) -> PreflightReport:
    """Check ``options`` on the runner they ask for (see the module docstring); the report of every rank.

    Raises ``ValueError`` (exit 2) for a world that does not fit
    (:class:`~nemo_rl_shim.cli.preflight.options.WorldTooLarge`) or a layout that cannot be built.
    """
    progress = progress or (lambda message: None)
    with pick_runner(options, environ) as runner:
        plan = _size(runner, options)
        start = time.monotonic()
        run = runner.run(options, plan, progress)
    report = PreflightReport(
        run.launcher, run.world_size, options, run.ranks, time.monotonic() - start, run.note, run.timed_out,
        details=run.details, facts=run.facts,
    )  # fmt: skip
    report.problems = run.problems or find_problems(run.ranks, options, run.timed_out)
    if isinstance(runner, JoinRunner) and runner.launcher.rank != 0:
        return report  # rank 0 prints the report, and says who did not join
    return _with_hang_report(report, options)


def _with_hang_report(report: PreflightReport, options: PreflightOptions) -> PreflightReport:
    """A failed run with the Flight Recorder on ends with hang-report's line (``report.facts["hang_report"]``)."""
    recorder = options.flight_recorder
    if recorder is None or report.ok or options.dry_run:
        return report
    from nemo_rl_shim.cli.hang_report import preflight_summary

    hosts = sorted({r["node"]["node_ip"] for r in report.ranks if r.get("node")})
    report.facts["hang_report"] = preflight_summary(recorder.dump_dir, report.world_size, hosts)
    return report
