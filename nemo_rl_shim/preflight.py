"""``nemo-rl-shim preflight``: run the real set-up on local ranks and check every process group.

Library API (the command is a thin argparse layer over it):

* :func:`build_options` - the role's config section from a NeMo RL YAML and/or
  flags, validated before any process starts.
* :func:`run_preflight` - spawn the ranks (:func:`nemo_rl_shim.launch.spawn_ranks`)
  or, under torchrun / srun (:func:`detect_launcher`), join that world; every
  rank runs :func:`check_rank` and the results are gathered.
* :func:`find_problems` / :attr:`PreflightReport.problem` - what is wrong, one line.
* :func:`render_report` / :meth:`PreflightReport.to_json` - table or JSON.

Ranks: one per CUDA device when there are at least two; otherwise two CPU ranks
on gloo (with exactly one CUDA device it is hidden from the ranks, since NCCL
needs one device per rank).

Embedded default (no ``--config``): ``distributed_timeout_minutes: 45``, no
after-init value, ``patch_automodel: true``, CPU offload on, every parallel
size 1 (dp = number of ranks). CPU offload is on because it is the
configuration the timeout regression is about, and because it runs the
``full_tensor()`` check. On a CPU-only machine the fork fix is applied with or
without CPU offload, since 0.5.0-0.7.0's override returns nothing for a
non-CUDA mesh; with ``--no-patch`` the size-1 axes keep gloo's 30-minute
default, which preflight then reports.

CPU offload check: FSDP2 ``fully_shard`` with ``CPUOffloadPolicy`` on the ``dp``
mesh (it works on a gloo mesh with torch 2.15, so CPU and GPU runs use the same
code), then ``full_tensor()`` compared with the unsharded weight.

The per-rank half lives in ``_preflight_rank``, the report (problems, table) in
``_preflight_report``; both are re-exported here.

Fault injection, for tests only: ``stall_rank`` / ``stall_s`` (``--stall-rank``,
``--stall-s``, hidden flags) make one rank sleep after set-up, so its peers wait
in a collective on it and the run must end at ``timeout_s``.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim import config as cfg
from nemo_rl_shim._preflight_rank import check_rank
from nemo_rl_shim._preflight_report import COLUMNS, PreflightReport, find_problems, render_report
from nemo_rl_shim.distributed_setup import parallel_sizes

__all__ = [
    "COLUMNS",
    "DEFAULT_SECTION",
    "DEFAULT_TIMEOUT_S",
    "MIN_RANKS",
    "Launcher",
    "PreflightOptions",
    "PreflightReport",
    "RankPlan",
    "build_options",
    "check_rank",
    "detect_launcher",
    "find_problems",
    "plan_ranks",
    "render_report",
    "run_preflight",
]

MIN_RANKS = 2
DEFAULT_TIMEOUT_S = 300.0
PROGRESS_EVERY_S = 10.0
RANK_TARGET = "nemo_rl_shim.preflight:check_rank"
DEFAULT_SECTION: dict[str, Any] = {
    "automodel_cfg": {"distributed_timeout_minutes": 45.0, "patch_automodel": True},
    "dtensor_cfg": {"cpu_offload": True},
}

Progress = Callable[[str], None]


# --- options -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreflightOptions:
    """What to check: the role's section as ``setup_distributed`` receives it, and how to run."""

    section: dict[str, Any]
    role: cfg.Role = "policy"
    cpu_offload: bool = True
    nproc: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_rank: int | None = None
    stall_s: float = 0.0

    @property
    def timeout_minutes(self) -> float | None:
        """The configured start-up timeout (``distributed_timeout_minutes``)."""
        block = cfg.automodel_cfg({self.role: self.section}, self.role)
        return cfg.distributed_timeout_minutes(block, f"{self.role}.automodel_cfg")

    @property
    def timeout_minutes_after_init(self) -> float | None:
        """The configured steady-state timeout (``distributed_timeout_minutes_after_init``)."""
        block = cfg.automodel_cfg({self.role: self.section}, self.role)
        return cfg.distributed_timeout_minutes_after_init(block, f"{self.role}.automodel_cfg")

    def params(self) -> dict[str, Any]:
        """The JSON params every rank's :func:`check_rank` receives."""
        return {
            "section": self.section,
            "role": self.role,
            "cpu_offload": self.cpu_offload,
            "stall_rank": self.stall_rank,
            "stall_s": self.stall_s,
        }


_AUTOMODEL_OVERRIDES = {
    "timeout_minutes": "distributed_timeout_minutes",
    "timeout_minutes_after_init": "distributed_timeout_minutes_after_init",
}
_DTENSOR_OVERRIDES = {
    "tp": "tensor_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_parallel_size",
    "dp_replicate": "dp_replicate_size",
    "cpu_offload": "cpu_offload",
}


def _base_section(config_path: str | None, role: cfg.Role) -> dict[str, Any]:
    if config_path is None:
        return copy.deepcopy(DEFAULT_SECTION)
    section = cfg.load_config(config_path).get(role)
    if not isinstance(section, Mapping):
        raise ValueError(f"{config_path} must have a {role} section (a mapping), got {section!r}")
    return copy.deepcopy(dict(section))


def build_options(
    config_path: str | None = None,
    role: cfg.Role = "policy",
    *,
    overrides: Mapping[str, Any] | None = None,
    patch: bool = True,
    nproc: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stall_rank: int | None = None,
    stall_s: float = 0.0,
) -> PreflightOptions:
    """Options from a NeMo RL YAML (its ``role`` section) or the embedded default, then ``overrides``.

    ``overrides`` keys: ``timeout_minutes``, ``timeout_minutes_after_init``, ``cpu_offload``,
    ``tp``, ``cp``, ``ep``, ``dp_replicate``; None values are ignored. ``patch=False`` sets
    ``automodel_cfg.patch_automodel: false``. Everything is validated here, before any rank
    starts; errors are ``ValueError`` naming the key and the value.
    """
    if role not in cfg.ROLES:
        raise ValueError(f"role must be one of {', '.join(cfg.ROLES)}, got {role!r}")
    section = _base_section(config_path, role)
    automodel = section["automodel_cfg"] = dict(section.get("automodel_cfg") or {})
    dtensor = section["dtensor_cfg"] = dict(section.get("dtensor_cfg") or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in _AUTOMODEL_OVERRIDES:
            automodel[_AUTOMODEL_OVERRIDES[key]] = value
        elif key in _DTENSOR_OVERRIDES:
            dtensor[_DTENSOR_OVERRIDES[key]] = value
        else:
            raise ValueError(f"unknown preflight override {key!r}")
    if not patch:
        automodel["patch_automodel"] = False
    where = f"{role}.automodel_cfg"
    cfg.distributed_timeout_minutes_after_init(automodel, where)  # checks the start-up value too
    cfg.patch_automodel(automodel, where)
    parallel_sizes(dtensor, f"{role}.dtensor_cfg")
    cpu_offload = dtensor.get("cpu_offload", False)
    if not isinstance(cpu_offload, bool):
        raise ValueError(f"{role}.dtensor_cfg.cpu_offload must be true or false, got {cpu_offload!r}")
    if nproc is not None and nproc < MIN_RANKS:
        raise ValueError(f"--nproc must be at least {MIN_RANKS}, got {nproc}")
    if not timeout_s > 0:
        raise ValueError(f"--timeout-s must be a positive number of seconds, got {timeout_s!r}")
    return PreflightOptions(section, role, cpu_offload, nproc, float(timeout_s), stall_rank, float(stall_s))


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

    from nemo_rl_shim.launch import spawn_ranks

    plan = plan_ranks(options.nproc, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    progress(f"starting {plan.world_size} {plan.device.upper()} ranks (importing Automodel takes ~10 s)...")
    last = [0.0]

    def on_tick(elapsed: float) -> None:
        if elapsed - last[0] >= PROGRESS_EVERY_S:
            last[0] = elapsed
            progress(f"waiting... {elapsed:.0f} s")

    start = time.monotonic()
    results = spawn_ranks(
        RANK_TARGET, options.params(), world_size=plan.world_size, timeout_s=options.timeout_s,
        env=plan.env, check=False, on_tick=on_tick,
    )  # fmt: skip
    ranks = []
    for r in results:
        if r.ok and isinstance(r.result, dict):
            ranks.append(r.result)
        else:
            error = r.error or ("timed out" if r.timed_out else f"exit {r.returncode}")
            ranks.append({"rank": r.rank, "error": error, "timed_out": r.timed_out, "output": r.output[-4000:]})
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
            dist.all_gather_object(gathered, result)  # every rank gets every row: one verdict, one exit code
            dist.destroy_process_group()
    finally:
        timer.cancel()
    report = PreflightReport(launcher.name, launcher.world_size, options, gathered, time.monotonic() - start)
    report.problems = find_problems(gathered, options)
    return report


def run_preflight(
    options: PreflightOptions, progress: Progress | None = None, environ: Mapping[str, str] | None = None
) -> PreflightReport:
    """Check ``options`` on spawned local ranks, or on the launcher's world when run under one."""
    progress = progress or (lambda message: None)
    launcher = detect_launcher(environ)
    if launcher is None:
        return _spawn(options, progress)
    return _join(options, launcher, progress)
