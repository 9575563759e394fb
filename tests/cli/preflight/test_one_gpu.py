"""``preflight`` on a machine with exactly one CUDA device (``nemo_rl_shim/cli/preflight/one_gpu.py``), on CPU.

This machine has no GPU: the device count is injected (``local_runner(devices=...)``), and the real command runs its
rehearsal (``NEMO_RL_SHIM_PREFLIGHT_ONE_GPU_REHEARSAL=1``: one device taken as present, the "GPU rank" a one-rank Gloo
world on CPU). What is real: the command, its 2 CPU ranks and its third rank in a world of its own, all at once; the
shim's set-up and its refusal of CPU offload on one rank; NeMo RL's set-up as ``tests/stand_in_nemo_rl`` stands in
for it (which refuses CPU offload on one rank as NeMo RL does: the GPU rank must not trip it). Only NCCL is missing,
and ``scripts/gpu_check.sh``'s preflight step runs the same command on a GPU.

Three commands at once (a module fixture, each bounded): the default config, NeMo RL's set-up with the pull request's
series applied (both exit 0), and NeMo RL's set-up as it is (exit 1: every group at torch's default, on the GPU rank
and on the CPU ranks alike).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

import pytest

from nemo_rl_shim.cli.preflight.one_gpu import (
    NEMO_RL_REFUSES_OFFLOAD,
    REHEARSAL_ENV,
    GpuRank,
    OneGpuRunner,
    cuda_device_count,
    gpu_problems,
    local_runner,
    merge,
    plan_gpu_rank,
    where_lines,
)
from nemo_rl_shim.cli.preflight.options import build_options
from nemo_rl_shim.cli.preflight.results import GroupRow, OffloadCheck, RankChecked, RankFailed
from nemo_rl_shim.cli.preflight.runner import RankRun
from nemo_rl_shim.cli.preflight.spawn import SpawnRunner
from tests.harness.at_once import Finished, run_at_once
from tests.harness.paths import REPO_ROOT

pytestmark = [pytest.mark.every_lane]

STAND_IN = REPO_ROOT / "tests" / "stand_in_nemo_rl"
RUN_TIMEOUT_S = 300  # each command: 3 ranks importing torch and Automodel on a contended CPU


def _env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NEMO_RL_STAND_IN_SERIES")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    return {**env, "OMP_NUM_THREADS": "1", REHEARSAL_ENV: "1", **extra}


def _with_stand_in(**extra: str) -> dict[str, str]:
    env = _env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STAND_IN), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def runs() -> dict[str, Finished]:
    command = [sys.executable, "-m", "nemo_rl_shim", "preflight"]
    nemo_rl = [*command, "--setup", "nemo-rl"]
    commands = {
        "shim": ([*command, "--json"], _env()),
        "shim_text": (command, _env()),
        "series": ([*nemo_rl, "--json"], _with_stand_in(NEMO_RL_STAND_IN_SERIES="applied")),
        "as_is": (nemo_rl, _with_stand_in()),
    }
    return run_at_once(commands, timeout_s=RUN_TIMEOUT_S, cwd=REPO_ROOT)


def _json(run: Finished) -> dict:
    assert not run.timed_out, f"still running at {RUN_TIMEOUT_S} s:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


# --- the command, rehearsed ------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_one_gpu_runs_the_cpu_ranks_and_a_gpu_rank_and_says_which_ran_where(runs) -> None:
    run = runs["shim"]
    report = _json(run)
    assert run.returncode == 0, (report["problem"], run.stderr[-3000:])
    assert report["world_size"] == 2 and report["launcher"] == "spawn"
    assert "1 CUDA device: 2 CPU ranks (gloo) check the layout, and 1 rank on the GPU" in report["note"]
    gpu = report["gpu_rank"]
    assert (gpu["device"], gpu["rehearsal"], gpu["checked"], gpu["timed_out"]) == ("cpu", True, True, False), gpu
    result = gpu["result"]
    assert (result["world_size"], result["rank"]) == (1, 0), result
    rows = result["rows"]
    assert {"default", "dp", "tp"} <= {row["group"] for row in rows}, rows
    assert all(set(row["timeout_minutes"].values()) == {45.0} for row in rows), rows
    assert all(row["cpu_all_reduce"] == "ok" for row in rows), rows
    # The shim's set-up refuses CPU offload on a world of one: asked, not assumed, and said.
    assert gpu["cpu_offload"] is False and "NotImplementedError" in gpu["offload_off_why"], gpu
    assert result["offload"] is None
    where = gpu["where"]
    assert where[0].startswith("on CPU: 2 ranks on gloo (the CUDA device hidden)"), where
    assert where[1].startswith(f"on the GPU: 1 rank (REHEARSAL, {REHEARSAL_ENV}=1"), where
    assert "cpu all_reduce ok on" in where[1] and "full_tensor() of a CPU-offloaded parameter: off" in where[1]
    assert where[2].startswith("on the GPU: CPU offload off: the shim's setup_distributed refuses"), where
    # The CPU ranks still check the layout, CPU offload's full_tensor() included.
    assert all(rank["offload"]["ok"] for rank in report["ranks"]), report["ranks"]


@pytest.mark.multiprocess
def test_the_text_report_names_where_each_check_ran(runs) -> None:
    run = runs["shim_text"]
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    on_cpu = [line for line in lines if line.startswith("on CPU: ")]
    on_gpu = [line for line in lines if line.startswith("on the GPU: ")]
    assert len(on_cpu) == 1 and len(on_gpu) == 2, lines[:12]
    table = next(line for line in lines if line.startswith("group "))
    assert lines.index(on_cpu[0]) < lines.index(on_gpu[0]) < lines.index(table), lines[:12]


@pytest.mark.multiprocess
def test_nemo_rl_setup_runs_the_gpu_rank_without_the_cpu_offload_it_refuses(runs) -> None:
    """The stand-in raises NotImplementedError on one rank with CPU offload, as NeMo RL does: a GPU rank that used
    it would fail; this one runs NeMo RL's set-up with offload off, says why, and passes with the series applied."""
    run = runs["series"]
    report = _json(run)
    assert run.returncode == 0, (report["problem"], run.stderr[-3000:])
    gpu = report["gpu_rank"]
    assert (gpu["checked"], gpu["cpu_offload"], gpu["offload_off_why"]) == (True, False, NEMO_RL_REFUSES_OFFLOAD)
    assert gpu["result"]["set_up"].startswith("NeMo RL's own setup_distributed"), gpu["result"]["set_up"]
    assert report["cpu_offload"] is True and all(rank["offload"]["ok"] for rank in report["ranks"])


@pytest.mark.multiprocess
def test_a_gpu_rank_problem_comes_first_and_the_cpu_ranks_problems_still_follow(runs) -> None:
    """NeMo RL as it is leaves every group at torch's default: the GPU rank's problem is named as the GPU rank's,
    and the CPU ranks' are not dropped because the runner found some of its own."""
    run = runs["as_is"]
    assert run.returncode == 1, (run.stdout[-2000:], run.stderr[-2000:])
    failure = next(line for line in run.stderr.splitlines() if "FAILED" in line)
    gpu = failure.partition("FAILED: on the GPU rank (rehearsal): ")[2]
    one = gpu.startswith("group default") and "at torch's default 30 min, configured 45 min" in gpu
    several = re.match(r"\d+ groups at torch's default, not the configured timeout: default\b", gpu)  # torch 2.9
    assert one or several, failure
    more = int(failure.rsplit("(+", 1)[1].split()[0])
    assert more >= 2, failure  # the GPU rank's other groups and the CPU ranks' groups


# --- its parts -------------------------------------------------------------------------------------------------------


def test_the_runner_follows_the_device_count() -> None:
    assert isinstance(local_runner(devices=1, environ={}), OneGpuRunner)
    for count in (0, 2):
        runner = local_runner(devices=count, environ={})
        assert type(runner) is SpawnRunner, (count, runner)
    assert cuda_device_count({REHEARSAL_ENV: "1"}) == 1
    rehearsed = local_runner(environ={REHEARSAL_ENV: "1"})
    assert isinstance(rehearsed, OneGpuRunner) and rehearsed.rehearsal
    assert rehearsed.plan(None).device == "cpu" and rehearsed.plan(None).world_size == 2
    assert "1 rank on the GPU" in (rehearsed._note(rehearsed.plan(None)) or "")


def test_the_gpu_rank_gets_a_one_rank_world_of_the_section(tmp_path) -> None:
    recorder = {"enabled": True, "dump_dir": str(tmp_path)}
    options = build_options(overrides={"tp": 2, "flight_recorder": recorder}, stall_rank=1, stall_s=5.0)
    plan = plan_gpu_rank(options)
    section = plan.params.section
    assert plan.device == "cuda" and plan.env == {}
    assert section["dtensor_cfg"]["tensor_parallel_size"] == 1, section
    assert "flight_recorder" not in section["nemo_rl_shim"], section
    assert options.section["nemo_rl_shim"]["flight_recorder"] == recorder, "the CPU ranks keep their recorder"
    assert (plan.params.stall_rank, plan.params.stall_s) == (None, 0.0)
    assert options.section["dtensor_cfg"]["tensor_parallel_size"] == 2, "the CPU ranks' section is left as it was"
    assert plan_gpu_rank(options, rehearsal=True).env == {"CUDA_VISIBLE_DEVICES": ""}


def test_cpu_offload_is_off_on_the_gpu_rank_only_where_the_set_up_refuses_it() -> None:
    shim = plan_gpu_rank(build_options())
    assert shim.params.cpu_offload is False and "NotImplementedError" in (shim.offload_off_why or "")
    assert shim.params.section["dtensor_cfg"]["cpu_offload"] is False
    off = plan_gpu_rank(build_options(overrides={"cpu_offload": False}))
    assert (off.params.cpu_offload, off.offload_off_why) == (False, None)
    nemo_rl = dataclasses.replace(build_options(), setup="nemo-rl")
    assert plan_gpu_rank(nemo_rl).offload_off_why == NEMO_RL_REFUSES_OFFLOAD


def _row(group: str, minutes: float, cpu: str = "ok") -> GroupRow:
    return GroupRow(
        group, (0,), {"cpu": "gloo", "cuda": "nccl"}, {"cpu": minutes, "cuda": minutes}, cpu, "ok",
        sources={"cpu": "configured", "cuda": "configured"},
    )  # fmt: skip


def _checked(rows: tuple[GroupRow, ...], world: int = 1, rank: int = 0) -> RankChecked:
    offload = OffloadCheck("m", ok=True) if world > 1 else None
    return RankChecked(rank, "h", world, "cuda:nccl,cpu:gloo", "cuda", None, None, rows, offload=offload)


def test_merge_puts_the_gpu_rank_first_and_keeps_the_cpu_ranks_problems() -> None:
    options = build_options()
    plan = GpuRank("cuda", options.rank_params())
    cpu_bad = RankRun("spawn", 2, (_checked((_row("default", 30.0),), 2, 0), _checked((_row("default", 45.0),), 2, 1)))
    gpu_bad = _checked((_row("tp", 45.0, cpu="failed: boom"),))
    merged = merge(cpu_bad, gpu_bad, False, plan, options)
    first = "on the GPU rank (a one-rank world of its own): group tp: CPU all_reduce failed: boom"
    assert merged.problems[0].startswith(first), merged.problems
    assert any("has 30 min, configured 45 min" in problem for problem in merged.problems[1:]), merged.problems
    assert merged.facts["gpu_rank"]["checked"] and merged.details[-1].startswith("on the GPU: 1 rank, default group")
    # A GPU rank without a problem adds none: the CPU ranks' problems are read from their rows, as before.
    assert merge(cpu_bad, _checked((_row("tp", 45.0),)), False, plan, options).problems == ()


def test_a_failed_or_stuck_gpu_rank_is_a_problem_named_as_the_gpu_ranks() -> None:
    options = build_options()
    plan = GpuRank("cuda", options.rank_params())
    failed = RankFailed(0, "Traceback...\nRuntimeError: NCCL error: unhandled cuda error")
    problems = gpu_problems(failed, plan, options, timed_out=False)
    assert problems == [
        "on the GPU rank (a one-rank world of its own): rank failed: RuntimeError: NCCL error: unhandled cuda error "
        "(rank 0)"
    ], problems
    stuck = gpu_problems(RankFailed(0, "timed out", timed_out=True), plan, options, timed_out=True)
    assert len(stuck) == 1 and "rank 0" in stuck[0] and stuck[0].startswith("on the GPU rank"), stuck
    cpu = RankRun("spawn", 2, ())
    line = where_lines(cpu, failed, plan, options)[1]
    assert line == "on the GPU: 1 rank: failed (RuntimeError: NCCL error: unhandled cuda error)", line
