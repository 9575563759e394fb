"""Preflight on a machine with exactly one CUDA device: CPU ranks check the layout, one rank on the GPU the NCCL half.

NCCL puts one rank on one GPU, so one GPU cannot hold a multi-rank NCCL world: the world's layout (2 ranks, or
``--nproc``) is checked on CPU ranks on Gloo with the CUDA device hidden, as on a machine without one. What only the
GPU can check is the default group a one-GPU run really makes. :class:`OneGpuRunner` therefore also starts, at the
same time, one rank that sees the GPU, in a world of its own: the real set-up (the shim's ``setup_distributed``, or
NeMo RL's with ``--setup nemo-rl``), with the real default group it makes on a GPU and the mesh axes a one-rank world
makes (every parallel size 1); then :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank`, unchanged: every
group's timeout read on each backend, an all_reduce on each of its halves, and, under CPU offload, a CPU-offloaded
parameter rebuilt through ``full_tensor()``. The report says which checks ran on the GPU and which on CPU
(:func:`where_lines`), and the GPU rank's problems are the run's, named as the GPU rank's (:func:`gpu_problems`).

The GPU rank never uses a configuration the code under test refuses (:func:`plan_gpu_rank`). Both set-ups refuse CPU
offload on a world of one rank (``NotImplementedError``): NeMo RL's ``setup_distributed`` ("Handle world_size=1 +
cpu_offload", nemo_rl/models/automodel/setup.py at 7ea279abf), and the shim's, which mirrors it
(:func:`~nemo_rl_shim.setup.distributed.check_layout`, asked here rather than assumed). Where the set-up refuses it,
the GPU rank runs with CPU offload off (default group ``nccl``): it checks the NCCL half of every group, and the report
says that the ``cpu:gloo`` half and ``full_tensor()`` were checked on the CPU ranks only, and why. A set-up that
accepts it gets the GPU rank ``cuda:nccl,cpu:gloo`` and the ``full_tensor()`` check on the GPU. Its Flight Recorder is
off: a one-rank world has no peer to name, and its dump would take CPU rank 0's file name in the same folder.

Rehearsal (:data:`REHEARSAL_ENV` ``=1``, for CI, which has no GPU): the device count is taken as one, and the "GPU
rank" is a one-rank Gloo world on CPU (the CUDA device hidden), so that everything but NCCL itself runs.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli.preflight.options import PreflightOptions
from nemo_rl_shim.cli.preflight.report import find_problems
from nemo_rl_shim.cli.preflight.results import (
    NEMO_RL_SETUP,
    RankChecked,
    RankFailed,
    RankOutcome,
    RankParams,
    outcome_from_json,
)
from nemo_rl_shim.cli.preflight.runner import Progress, RankPlan, RankRun, Runner
from nemo_rl_shim.cli.preflight.spawn import RANK_TARGET, RankResult, SpawnRunner, spawn_ranks
from nemo_rl_shim.config.settings import SHIM_CFG
from nemo_rl_shim.setup.distributed import check_layout, parallel_sizes

__all__ = [
    "NEMO_RL_REFUSES_OFFLOAD",
    "REHEARSAL_ENV",
    "GpuRank",
    "OneGpuRunner",
    "cuda_device_count",
    "gpu_problems",
    "local_runner",
    "merge",
    "offload_refused",
    "plan_gpu_rank",
    "where_lines",
]

#: ``1``: rehearse the one-GPU runner on a machine without one (CI): see the module docstring.
REHEARSAL_ENV = "NEMO_RL_SHIM_PREFLIGHT_ONE_GPU_REHEARSAL"
#: Why the GPU rank runs NeMo RL's set-up with CPU offload off (its words are in the module docstring's source).
NEMO_RL_REFUSES_OFFLOAD = "NeMo RL's setup_distributed refuses CPU offload on a world of 1 rank (NotImplementedError)"
#: How long past ``--timeout-s`` the runner waits for the GPU rank's launcher to return (it kills the rank then).
_JOIN_SLACK_S = 30.0
#: The ``dtensor_cfg`` keys of the parallel sizes, set to 1 for the GPU rank's one-rank world.
_SIZE_KEYS = ("tensor_parallel_size", "context_parallel_size", "expert_parallel_size", "dp_replicate_size")


def cuda_device_count(environ: Mapping[str, str] | None = None) -> int:
    """The CUDA devices this process sees (one under :data:`REHEARSAL_ENV`)."""
    if (os.environ if environ is None else environ).get(REHEARSAL_ENV) == "1":
        return 1
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_runner(devices: int | None = None, environ: Mapping[str, str] | None = None) -> Runner:
    """The runner of local ranks: :class:`OneGpuRunner` with exactly one CUDA device (``devices``; by default
    :func:`cuda_device_count`), else :class:`~nemo_rl_shim.cli.preflight.spawn.SpawnRunner`."""
    environ = os.environ if environ is None else environ
    count = cuda_device_count(environ) if devices is None else devices
    if count == 1:
        return OneGpuRunner(rehearsal=environ.get(REHEARSAL_ENV) == "1")
    return SpawnRunner()


@dataclass(frozen=True)
class GpuRank:
    """How the GPU rank runs: on ``device`` (``"cuda"``; ``"cpu"`` in the rehearsal) with ``params``;
    ``offload_off_why``: why CPU offload is off there where the options have it on."""

    device: str
    params: RankParams
    offload_off_why: str | None = None
    rehearsal: bool = False

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ""} if self.device == "cpu" else {}


def _one_rank_section(section: Mapping[str, Any], cpu_offload: bool) -> dict[str, Any]:
    """The section for a world of one: every parallel size 1, no SGLang refit engines, no Flight Recorder, and
    ``cpu_offload`` as given."""
    out = copy.deepcopy(dict(section))
    dtensor = out["dtensor_cfg"] = dict(out.get("dtensor_cfg") or {})
    for key in _SIZE_KEYS:
        if key in dtensor:
            dtensor[key] = 1
    dtensor["cpu_offload"] = cpu_offload
    out.pop("generation", None)
    shim = out.get(SHIM_CFG)
    if isinstance(shim, Mapping) and "flight_recorder" in shim:
        out[SHIM_CFG] = {key: value for key, value in shim.items() if key != "flight_recorder"}
    return out


def offload_refused(options: PreflightOptions) -> str | None:
    """Why the set-up ``options`` ask for refuses CPU offload on a world of one rank, or None where it does not
    (or the options have CPU offload off): NeMo RL's by its source, the shim's by asking its own layout check."""
    if not options.cpu_offload:
        return None
    if options.setup == NEMO_RL_SETUP:
        return NEMO_RL_REFUSES_OFFLOAD
    try:
        check_layout(parallel_sizes({}), 1, cpu_offload=True, where=f"{options.role}.dtensor_cfg")
    except NotImplementedError as refused:
        return f"the shim's setup_distributed refuses CPU offload on a world of 1 rank ({type(refused).__name__})"
    return None


def plan_gpu_rank(options: PreflightOptions, rehearsal: bool = False) -> GpuRank:
    """The GPU rank's device and parameters for ``options`` (see the module docstring)."""
    why = offload_refused(options)
    offload = options.cpu_offload and why is None
    base = options.rank_params()
    params = dataclasses.replace(
        base, section=_one_rank_section(base.section, offload), cpu_offload=offload, stall_rank=None, stall_s=0.0
    )
    return GpuRank("cpu" if rehearsal else "cuda", params, why, rehearsal)


def _outcome(result: RankResult) -> RankOutcome:
    if result.ok:
        return outcome_from_json(result.result, result.rank)
    error = result.error or ("timed out" if result.timed_out else f"exit {result.returncode}")
    return RankFailed(result.rank, error, timed_out=result.timed_out, output=result.output[-4000:])


def run_gpu_rank(plan: GpuRank, timeout_s: float) -> tuple[RankOutcome, bool]:
    """The GPU rank, spawned in a world of its own and bounded by ``timeout_s``: its outcome, and whether it timed
    out."""
    (result,) = spawn_ranks(
        RANK_TARGET, plan.params.to_json(), world_size=1, timeout_s=timeout_s, env=plan.env, check=False
    )
    return _outcome(result), result.timed_out


def gpu_problems(outcome: RankOutcome, plan: GpuRank, options: PreflightOptions, timed_out: bool) -> list[str]:
    """The GPU rank's problems, as :func:`~nemo_rl_shim.cli.preflight.report.find_problems` reads them for its own
    world and offload setting, each named as the GPU rank's."""
    own = dataclasses.replace(options, cpu_offload=plan.params.cpu_offload)
    where = "on the GPU rank (a one-rank world of its own)" if not plan.rehearsal else "on the GPU rank (rehearsal)"
    return [f"{where}: {problem}" for problem in find_problems((outcome,), own, timed_out)]


def _counts(values: list[str]) -> str:
    ok = sum(value == "ok" for value in values)
    other = [value for value in values if value != "ok"]
    shown = f"ok on {ok} of {len(values)} groups"
    return shown + (f" ({other[0]})" if other else "")


def _gpu_line(outcome: RankOutcome, plan: GpuRank) -> str:
    where = "on the GPU: 1 rank" + (
        f" (REHEARSAL, {REHEARSAL_ENV}=1: a one-rank Gloo world on CPU stands in for it)" if plan.rehearsal else ""
    )
    if isinstance(outcome, RankFailed):
        lines = [line for line in outcome.error.strip().splitlines() if line.strip()]
        return f"{where}: failed ({'timed out' if outcome.timed_out else lines[-1] if lines else 'no output'})"
    rows = outcome.rows
    timeouts = sorted({f"{d}:{row.backends.get(d, '?')} {m:g} min" for row in rows for d, m in
                       row.timeout_minutes.items() if m is not None})  # fmt: skip
    offload = outcome.offload
    rebuilt = "off" if offload is None else (offload.skipped or ("ok" if offload.ok else f"FAILED ({offload.error})"))
    return (
        f"{where}, default group {outcome.default_backend} on {outcome.device}, {len(rows)} groups "
        f"({', '.join(row.group for row in rows)}): timeouts read {', '.join(timeouts) or 'none'}; cuda all_reduce "
        f"{_counts([row.cuda_all_reduce for row in rows])}; cpu all_reduce "
        f"{_counts([row.cpu_all_reduce for row in rows])}; full_tensor() of a CPU-offloaded parameter: {rebuilt}"
    )


def where_lines(cpu: RankRun, outcome: RankOutcome, plan: GpuRank, options: PreflightOptions) -> tuple[str, ...]:
    """Which checks ran on CPU and which on the GPU, one line each (and why offload was off on the GPU)."""
    offload = "full_tensor() of a CPU-offloaded parameter" if options.cpu_offload else "CPU offload off"
    lines = [
        f"on CPU: {cpu.world_size} ranks on gloo (the CUDA device hidden): the layout of a {cpu.world_size}-rank "
        f"world, every group's timeout, a cpu all_reduce on each; {offload}",
        _gpu_line(outcome, plan),
    ]
    if plan.offload_off_why:
        lines.append(
            f"on the GPU: CPU offload off: {plan.offload_off_why}; the cpu:gloo half and full_tensor() of a "
            "CPU-offloaded parameter were checked on the CPU ranks only"
        )
    return tuple(lines)


def merge(cpu: RankRun, outcome: RankOutcome, gpu_timed_out: bool, plan: GpuRank, options: PreflightOptions) -> RankRun:
    """The CPU ranks' run with the GPU rank's: its lines under the heading, its facts in the JSON, and its problems
    first. Where the GPU rank has a problem, the CPU ranks' are listed too (a runner's problems replace those read
    from the rows)."""
    problems = gpu_problems(outcome, plan, options, gpu_timed_out)
    if problems:
        problems += list(cpu.problems) or find_problems(cpu.ranks, options, cpu.timed_out)
    lines = where_lines(cpu, outcome, plan, options)
    facts = {
        **cpu.facts,
        "gpu_rank": {
            "where": list(lines),
            "device": plan.device,
            "rehearsal": plan.rehearsal,
            "cpu_offload": plan.params.cpu_offload,
            "offload_off_why": plan.offload_off_why,
            "timed_out": gpu_timed_out,
            "checked": isinstance(outcome, RankChecked),
            "result": outcome.to_json(),
        },
    }
    details = (*cpu.details, *lines)
    return dataclasses.replace(cpu, problems=tuple(problems) or cpu.problems, details=details, facts=facts)


class OneGpuRunner(SpawnRunner):
    """:class:`~nemo_rl_shim.cli.preflight.spawn.SpawnRunner`'s CPU ranks, and one rank on the only GPU, at once."""

    def __init__(self, available_mib: int | None = None, rehearsal: bool = False) -> None:
        super().__init__(available_mib)
        self.cuda_devices = 1  # one GPU: the rule "one rank per GPU, from 2" plans CPU ranks; the GPU rank is ours
        self.rehearsal = rehearsal

    def _note(self, plan: RankPlan) -> str | None:
        return (
            f"1 CUDA device: {plan.world_size} CPU ranks (gloo) check the layout, and 1 rank on the GPU checks "
            "the default group's NCCL half"
        )

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        plan = plan_gpu_rank(options, self.rehearsal)
        found: dict[str, Any] = {}

        def gpu() -> None:
            found["outcome"], found["timed_out"] = run_gpu_rank(plan, options.timeout_s)

        thread = threading.Thread(target=gpu, name="preflight-gpu-rank", daemon=True)
        progress("starting 1 rank on the GPU, beside the CPU ranks...")
        thread.start()
        cpu = super().run(options, ranks, progress)
        thread.join(options.timeout_s + _JOIN_SLACK_S)  # the GPU rank's spawn ends at options.timeout_s by itself
        outcome = found.get("outcome") or RankFailed(0, "the GPU rank's launcher thread ended without a result")
        return merge(cpu, outcome, bool(found.get("timed_out")), plan, options)
