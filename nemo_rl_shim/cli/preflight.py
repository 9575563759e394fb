"""``nemo-rl-shim preflight``: run the real set-up on local ranks and check every process group.

Library API (the command is a thin argparse layer over it):

* :func:`build_options` - the role's config section from a NeMo RL YAML and/or
  flags, validated before any process starts.
* :func:`run_preflight` - spawn the ranks (:func:`nemo_rl_shim.cli.launch.spawn_ranks`),
  or, under torchrun / srun (:func:`detect_launcher`), join that world, or place them as
  Ray actors (``--ray``, :mod:`nemo_rl_shim.cli.ray_preflight`), or play every rank of the
  training world in this process on torch's fake backend (``--dry-run``,
  :mod:`nemo_rl_shim.cli.dry_run`); every rank runs :func:`check_rank` and the results are gathered.
* :func:`find_problems` / :attr:`PreflightReport.problem` - what is wrong, one line.
* :func:`render_report` / :meth:`PreflightReport.to_json` - table or JSON.

Ranks: one per CUDA device when there are at least two; otherwise two CPU ranks
on gloo (with exactly one CUDA device it is hidden from the ranks, since NCCL
needs one device per rank). With a training world (the config's ``cluster`` section
read with NeMo RL's rule, or ``--world``), that many ranks when they fit, and
:class:`WorldTooLarge` (exit 2, one line pointing to ``--dry-run``) when they do not;
``--nproc`` always wins.

Embedded default (no ``--config``): ``distributed_timeout_minutes: 45``, no
after-init value, ``patch_automodel: true``, CPU offload on, every parallel
size 1 (dp = number of ranks). CPU offload is on because it is the
configuration the timeout regression is about, and because it runs the
``full_tensor()`` check. On a CPU-only machine the default group is plain gloo and the
cpu-mesh-timeout workaround is applied with or without CPU offload, since 0.5.0-0.7.0's
override returns nothing for a non-CUDA mesh; with ``--no-patch`` the sub-groups the mesh
build makes keep gloo's 30-minute default, which preflight then reports.

CPU offload check: FSDP2 ``fully_shard`` with ``CPUOffloadPolicy`` on the ``dp``
mesh (it works on a gloo mesh with torch 2.15, so CPU and GPU runs use the same
code), then ``full_tensor()`` compared with the unsharded weight.

The per-rank half lives in ``_rank_checks``, the report (problems, table) in
``_report``, the options in ``options``; all are re-exported here.

Fault injection, for tests only: ``stall_rank`` / ``stall_s`` (``--stall-rank``,
``--stall-s``, hidden flags) make one rank sleep after set-up, so its peers wait
in a collective on it. A spawned run ends 15 s (``launch.FAILURE_GRACE_S``) after a
peer's collective timed out on it (``--timeout-minutes`` shorter than ``--timeout-s``),
naming it; else at ``timeout_s``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.cli._rank_checks import check_rank, gave_up_on_peers
from nemo_rl_shim.cli._report import COLUMNS, PreflightReport, find_problems, render_report
from nemo_rl_shim.cli.options import (
    DEFAULT_SECTION,
    DEFAULT_TIMEOUT_S,
    MIN_RANKS,
    PreflightOptions,
    WorldTooLarge,
    build_options,
    ranks_for_world,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_SECTION",
    "DEFAULT_TIMEOUT_S",
    "MIN_RANKS",
    "Launcher",
    "PreflightOptions",
    "PreflightReport",
    "RankPlan",
    "WorldTooLarge",
    "build_options",
    "check_rank",
    "detect_launcher",
    "find_problems",
    "plan_ranks",
    "render_report",
    "run_preflight",
]

PROGRESS_EVERY_S = 10.0
RANK_TARGET = "nemo_rl_shim.cli._rank_checks:check_rank"

Progress = Callable[[str], None]


# --- where the ranks come from ---------------------------------------------------------------


@dataclass(frozen=True)
class Launcher:
    """An existing launcher's world that this process joins."""

    name: str  # "torchrun" (any RANK/WORLD_SIZE launcher) or "slurm"
    rank: int
    world_size: int
    local_rank: int


def detect_launcher(environ: Mapping[str, str] | None = None) -> Launcher | None:
    """The launcher world this process belongs to, or None when preflight should spawn its own ranks.

    torchrun-style: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (``LOCAL_RANK``
    optional). Slurm ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``MASTER_ADDR``,
    ``MASTER_PORT`` (``SLURM_LOCALID`` optional).
    """
    env = os.environ if environ is None else environ
    if not ("MASTER_ADDR" in env and "MASTER_PORT" in env):
        return None
    if "RANK" in env and "WORLD_SIZE" in env:
        return Launcher("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        local = int(env.get("SLURM_LOCALID", "0"))
        return Launcher("slurm", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), local)
    return None


@dataclass(frozen=True)
class RankPlan:
    """How many local ranks to spawn, on which device, with which extra environment."""

    world_size: int
    device: str
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None


def plan_ranks(nproc: int | None, cuda_devices: int) -> RankPlan:
    """One rank per CUDA device when there are at least two, else ``nproc`` (default 2) CPU ranks."""
    if nproc is not None and nproc < MIN_RANKS:
        raise ValueError(f"--nproc must be at least {MIN_RANKS}, got {nproc}")
    if cuda_devices >= MIN_RANKS:
        if nproc is not None and nproc > cuda_devices:
            raise ValueError(f"--nproc {nproc} exceeds the {cuda_devices} CUDA devices: NCCL needs one per rank")
        return RankPlan(nproc or cuda_devices, "cuda")
    world = nproc or MIN_RANKS
    if cuda_devices == 1:
        note = f"1 CUDA device found, a CUDA run needs {MIN_RANKS}: running {world} CPU ranks (gloo)"
        return RankPlan(world, "cpu", {"CUDA_VISIBLE_DEVICES": ""}, note)
    return RankPlan(world, "cpu", note="no CUDA device: CPU ranks on gloo")


# --- running ---------------------------------------------------------------------------------


def _spawn(options: PreflightOptions, progress: Progress) -> PreflightReport:
    import torch

    from nemo_rl_shim.cli.launch import spawn_ranks

    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    room = plan_ranks(None, cuda_devices)
    here = f"this machine can run {room.world_size} {room.device.upper()} ranks"
    here += f" ({room.note})" if room.note else ""
    plan = plan_ranks(ranks_for_world(options, room.world_size, here), cuda_devices)
    progress(f"starting {plan.world_size} {plan.device.upper()} ranks (importing Automodel takes ~10 s)...")
    last = [0.0]

    def on_tick(elapsed: float) -> None:
        if elapsed - last[0] >= PROGRESS_EVERY_S:
            last[0] = elapsed
            progress(f"waiting... {elapsed:.0f} s")

    start = time.monotonic()
    results = spawn_ranks(
        RANK_TARGET, options.params(), world_size=plan.world_size, timeout_s=options.timeout_s,
        env=plan.env, check=False, on_tick=on_tick, gave_up=gave_up_on_peers,
    )  # fmt: skip
    ranks = []
    for r in results:
        if r.ok and isinstance(r.result, dict):
            ranks.append(r.result)
        else:
            error = r.error or ("timed out" if r.timed_out else f"exit {r.returncode}")
            rank = {"rank": r.rank, "error": error, "timed_out": r.timed_out, "output": r.output[-4000:]}
            ranks.append({**rank, "killed_because": r.killed_because} if r.killed_because else rank)
    timed_out = any(r.timed_out for r in results)
    report = PreflightReport("spawn", plan.world_size, options, ranks, time.monotonic() - start, plan.note, timed_out)
    report.problems = find_problems(ranks, options, timed_out)
    return report


def _watchdog(timeout_s: float, rank: int) -> threading.Timer:
    def expire() -> None:
        print(
            f"preflight: rank {rank} did not finish within {timeout_s:g} s (--timeout-s): "
            "a rank is stuck at start-up or in a collective",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _join(options: PreflightOptions, launcher: Launcher, progress: Progress) -> PreflightReport:
    import torch.distributed as dist

    os.environ.update(RANK=str(launcher.rank), WORLD_SIZE=str(launcher.world_size), LOCAL_RANK=str(launcher.local_rank))
    if launcher.rank == 0:
        progress(f"joining the {launcher.name} world of {launcher.world_size} ranks...")
    start = time.monotonic()
    timer = _watchdog(options.timeout_s, launcher.rank)
    try:
        try:
            result = check_rank(options.params())
        except Exception:
            result = {"rank": launcher.rank, "error": traceback.format_exc()}
        gathered: list[Any] = [result]
        if dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            try:
                dist.all_gather_object(gathered, result)  # every rank gets every row: one verdict, one exit code
            except RuntimeError as e:  # a peer stalled or died, and the default group timed out on it
                why = f"did not report: the gather timed out or failed ({type(e).__name__})"
                gathered = [result if r == launcher.rank else {"rank": r, "error": why} for r in range(len(gathered))]
            dist.destroy_process_group()
    finally:
        timer.cancel()
    report = PreflightReport(launcher.name, launcher.world_size, options, gathered, time.monotonic() - start)
    report.problems = find_problems(gathered, options)
    return report


def run_preflight(
    options: PreflightOptions, progress: Progress | None = None, environ: Mapping[str, str] | None = None
) -> PreflightReport:
    """Check ``options`` in this process on torch's fake backend (``options.dry_run``), on Ray actors
    (``options.ray_address``), on the launcher's world when run under one, or on spawned local ranks."""
    progress = progress or (lambda message: None)
    if options.dry_run:
        from nemo_rl_shim.cli.dry_run import run_dry

        return run_dry(options, progress)
    if options.ray_address is not None:
        from nemo_rl_shim.cli.ray_preflight import run_on_ray

        return _with_hang_report(run_on_ray(options, options.ray_address, progress), options)
    launcher = detect_launcher(environ)
    if launcher is None:
        return _with_hang_report(_spawn(options, progress), options)
    report = _join(options, launcher, progress)
    return _with_hang_report(report, options) if launcher.rank == 0 else report


def _with_hang_report(report: PreflightReport, options: PreflightOptions) -> PreflightReport:
    """A failed run with the Flight Recorder on ends with hang-report's line (``report.facts["hang_report"]``)."""
    recorder = options.flight_recorder
    if recorder is None or report.ok:
        return report
    from nemo_rl_shim.cli.hang_report import preflight_summary

    hosts = sorted({r["node"]["node_ip"] for r in report.ranks if r.get("node")})
    report.facts["hang_report"] = preflight_summary(recorder.dump_dir, report.world_size, hosts)
    return report
