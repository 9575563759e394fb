"""``nemo-rl-shim preflight``: the real command on real gloo ranks, and its pure parts.

Multi-rank scenarios, launched together by one module fixture (they mostly wait on imports and
rendezvous, so they share the wait; each is bounded in time, tests/harness/at_once.py), on this CPU
machine with the installed nemo-automodel:

* the default run (``nemo-rl-shim preflight``, no arguments): spawned ranks, table, exit 0;
* torchrun (``python -m torch.distributed.run``, i.e. ``torchrun``) with a NeMo RL
  YAML's ``value`` section: joins that world, rank 0 prints every rank's rows;
* srun-style ranks with ``--no-patch``: the fork fix turned off on 0.7.0 leaves the
  CPU sub-groups at gloo's 30-minute default; every rank exits 1, one line says why.

The rest (options, rank planning, launcher detection, problem finding) is pure
and tested directly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.cli import preflight
from nemo_rl_shim.cli.preflight.join import Launcher, detect_launcher
from nemo_rl_shim.cli.preflight.options import DEFAULT_SECTION
from nemo_rl_shim.cli.preflight.rank_checks import SKIPPED
from nemo_rl_shim.cli.preflight.ray_actors import bundle_of, plan_note, plan_ray_ranks
from nemo_rl_shim.cli.preflight.report import COLUMNS, find_problems
from nemo_rl_shim.cli.preflight.runner import RankPlan, Runner, plan_ranks
from nemo_rl_shim.cli.preflight.spawn import free_port
from tests.harness.at_once import Finished, run_at_once
from tests.harness.paths import REPO_ROOT

pytestmark = [pytest.mark.every_lane, pytest.mark.nemo_rl_python]

RUN_TIMEOUT_S = 420  # bound on each launched command; ranks import torch + Automodel on a contended CPU
PPO_YAML = (
    "policy:\n  automodel_cfg:\n    distributed_timeout_minutes: 99\n"
    "value:\n  automodel_cfg:\n    distributed_timeout_minutes: {startup}\n"
    "    distributed_timeout_minutes_after_init: {steady}\n  dtensor_cfg:\n    cpu_offload: true\n"
)
STARTUP_MIN, STEADY_MIN = 40.0, 10.0  # not 30: that is gloo's default and would prove nothing


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    # The command as users run it: each rank a fresh interpreter (tests/conftest.py forks them elsewhere).
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NEMO_RL_SHIM_FORK_RANKS"):
        env.pop(key, None)
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _command() -> list[str]:
    """The installed console script when present, else ``python -m nemo_rl_shim``."""
    script = Path(sys.executable).with_name("nemo-rl-shim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "nemo_rl_shim"]


def _table(stdout: str) -> dict[str, list[str]]:
    """The group table of the text report: {group: cells}."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("group "))
    header = lines[start]
    columns = [header.index(name) for name in COLUMNS]
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("("):
            break
        cells = [line[a:b].strip() for a, b in zip(columns, [*columns[1:], None], strict=True)]
        rows[cells[0]] = cells
    return rows


def _failure_line(stderr: str) -> str:
    """The one line a failed run ends with; asserting it is the only ``FAILED`` line."""
    failed = [line for line in stderr.splitlines() if "FAILED" in line]
    assert len(failed) == 1, stderr
    assert stderr.rstrip().splitlines()[-1] == failed[0]
    return failed[0]


# --- real runs --------------------------------------------------------------------------------


def _two_ports() -> tuple[str, str]:
    """Rendezvous ports for the torchrun world and the srun-style world, started at the same time."""
    ports = {free_port(), free_port()}
    while len(ports) < 2:
        ports.add(free_port())
    return tuple(str(port) for port in ports)  # type: ignore[return-value]


def _srun_env(rank: int, port: str) -> dict[str, str]:
    # srun is the boundary we lack: these are the variables it gives each task.
    return _env(
        SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Finished]:
    """The default run, the torchrun world and the two srun-style ranks, all started at once."""
    config = tmp_path_factory.mktemp("preflight") / "ppo.yaml"
    config.write_text(PPO_YAML.format(startup=STARTUP_MIN, steady=STEADY_MIN))
    torchrun_port, srun_port = _two_ports()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", torchrun_port]  # fmt: skip
    no_patch = [*_command(), "preflight", "--no-patch", "--json"]
    commands = {
        "default": ([*_command(), "preflight"], _env()),
        "torchrun": (
            [*torchrun, "-m", "nemo_rl_shim", "preflight", "--json", "--config", str(config), "--role", "value"],
            _env(),
        ),
        "srun0": (no_patch, _srun_env(0, srun_port)),
        "srun1": (no_patch, _srun_env(1, srun_port)),
    }
    return run_at_once(commands, timeout_s=RUN_TIMEOUT_S, cwd=REPO_ROOT)


@pytest.mark.multiprocess
def test_default_run_exits_0_with_45_minutes_on_every_group(runs):
    default_run = runs["default"]
    assert default_run.returncode == 0, default_run.stderr[-3000:]
    rows = _table(default_run.stdout)
    assert {"default", "pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_cp", "dp_shard_cp"} <= set(rows)
    timeout, cpu, cuda = (COLUMNS.index(c) for c in ("timeout", "cpu all_reduce", "cuda all_reduce"))
    assert {name: cells[timeout] for name, cells in rows.items() if cells[timeout] != "45 min"} == {}
    assert {cells[cpu] for cells in rows.values()} == {"ok"}
    assert {cells[cuda] for cells in rows.values()} == {"n/a"}  # no GPU here
    assert "decision: patch_and_forward" in default_run.stdout
    assert "full_tensor() (4, 4): ok on every rank" in default_run.stdout


@pytest.mark.multiprocess
def test_default_run_reports_progress_on_stderr(runs):
    assert "preflight: starting 2 CPU ranks (importing Automodel takes ~10 s)..." in runs["default"].stderr


# A stalled rank ending the spawned run at --timeout-s with one line: tests/test_hang_report_preflight.py, whose
# spawned run (--stall-rank 1, Flight Recorder on) checks that line and the hang report's line in one spawn.


@pytest.mark.multiprocess
def test_torchrun_joins_the_world_and_rank_0_prints_every_rank(runs):
    done = runs["torchrun"]
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["launcher"], report["world_size"], report["role"]) == ("torchrun", 2, "value")
    assert [r["rank"] for r in report["ranks"]] == [0, 1]  # gathered from both ranks
    for rank in report["ranks"]:
        for row in rank["rows"]:
            assert set(row["timeout_minutes"].values()) == {STARTUP_MIN}, row
            assert set(row["timeout_minutes_after_init"].values()) == {STEADY_MIN}, row
            assert row["cpu_all_reduce"] == "ok", row
        assert rank["offload"]["ok"], rank["offload"]


@pytest.mark.multiprocess
def test_no_patch_on_0_7_0_leaves_cpu_subgroups_at_gloo_default_and_every_rank_fails(runs):
    ranks = [runs["srun0"], runs["srun1"]]
    assert [r.returncode for r in ranks] == [1, 1], ranks[0].stderr[-3000:]
    stdout, stderr, other_stdout = ranks[0].stdout, ranks[0].stderr, ranks[1].stdout
    assert other_stdout == ""  # rank 0 alone prints
    report = json.loads(stdout)
    # On a CPU (gloo) mesh only cpu-mesh-timeout matters: forwarded as is, with the warning that sub-groups keep 30 min.
    assert (report["launcher"], report["decision"]["action"]) == ("slurm", "forward")
    assert "sub-groups keep gloo's 30-minute default" in report["decision"]["warning"]
    line = _failure_line(stderr)
    assert "has 30 min, configured 45 min (ranks 0-1)" in line
    # Every group the mesh build made itself is short: the size-1 axes, and where torch gives a world-sized
    # axis its own group rather than the default one (torch 2.9), that one too.
    separate = [row["group"] for row in report["ranks"][0]["rows"] if not row["is_default"]]
    assert {"pp", "dp_replicate", "cp", "tp"} <= set(separate), separate
    assert line.startswith(f"preflight: FAILED: groups {', '.join(separate)}: "), (line, separate)


# --- pure parts -------------------------------------------------------------------------------


def test_build_options_default_is_45_minutes_cpu_offload_patch_on():
    options = preflight.build_options()
    assert (options.timeout_minutes, options.timeout_minutes_after_init, options.cpu_offload) == (45.0, None, True)
    assert options.section["automodel_cfg"]["patch_automodel"] is True
    assert preflight.build_options().section is not DEFAULT_SECTION


def test_build_options_flags_override_the_config_section(tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text(
        "policy:\n  automodel_cfg:\n    distributed_timeout_minutes: 20\n  dtensor_cfg:\n    tensor_parallel_size: 2\n"
    )
    options = preflight.build_options(
        str(config), overrides={"timeout_minutes": 60, "cpu_offload": False, "cp": 2, "tp": None}, patch=False
    )
    assert options.section == {
        "automodel_cfg": {"distributed_timeout_minutes": 60, "patch_automodel": False},
        "dtensor_cfg": {"tensor_parallel_size": 2, "context_parallel_size": 2, "cpu_offload": False},
    }
    assert options.cpu_offload is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overrides": {"timeout_minutes": 0}}, "policy.automodel_cfg.distributed_timeout_minutes must be a positive"),
        ({"overrides": {"timeout_minutes_after_init": 50}}, "must not exceed policy.automodel_cfg.distributed_timeout"),
        ({"overrides": {"tp": 0}}, "policy.dtensor_cfg.tensor_parallel_size must be a positive integer, got 0"),
        ({"nproc": 1}, "--nproc must be at least 2, got 1"),
        ({"timeout_s": 0}, "--timeout-s must be a positive number of seconds, got 0"),
        ({"role": "critic"}, "role must be one of policy, value, got 'critic'"),
    ],
)
def test_build_options_rejects_bad_values_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        preflight.build_options(**kwargs)


def test_build_options_needs_the_role_section(tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text("policy: {}\n")
    with pytest.raises(ValueError, match="must have a value section"):
        preflight.build_options(str(config), "value")


def test_plan_ranks_one_per_gpu_else_two_cpu_ranks():
    gpus = "the 4 CUDA devices"
    assert plan_ranks(None, 0, gpus) == RankPlan(2, "cpu", {"CUDA_VISIBLE_DEVICES": ""})
    assert plan_ranks(None, 4, gpus) == RankPlan(4, "cuda")
    assert plan_ranks(2, 4, gpus).world_size == 2
    assert plan_ranks(3, 0, gpus).world_size == 3
    one = plan_ranks(None, 1, gpus)
    assert (one.world_size, one.device, one.env) == (2, "cpu", {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(ValueError, match="--nproc 8 exceeds the 4 CUDA devices"):
        plan_ranks(8, 4, gpus)


def test_the_four_runners_implement_the_one_runner_interface():
    from nemo_rl_shim.cli.preflight import dry_run, join, ray_actors, spawn

    runners = (spawn.SpawnRunner, join.JoinRunner, ray_actors.RayRunner, dry_run.DryRunner)
    for runner in runners:
        assert issubclass(runner, Runner), runner
        missing = [name for name in ("capacity", "plan", "run") if getattr(runner, name) is getattr(Runner, name)]
        assert missing == [], f"{runner.__name__} does not implement {missing}"


def test_detect_launcher_torchrun_slurm_or_none():
    master = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    torchrun = {**master, "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    slurm = {**master, "SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "2"}
    assert detect_launcher(torchrun) == Launcher("torchrun", 3, 8, 1)
    assert detect_launcher(slurm) == Launcher("slurm", 5, 16, 2)
    assert detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None  # no rendezvous address
    assert detect_launcher({}) is None


def _row(group: str, **overrides: Any) -> dict[str, Any]:
    row = {
        "group": group,
        "ranks": [0, 1],
        "backends": {"cpu": "gloo", "cuda": "nccl"},
        "timeout_minutes": {"cpu": 45.0, "cuda": 45.0},
        "cpu_all_reduce": "ok",
        "cuda_all_reduce": "ok",
        "timeout_minutes_after_init": None,
    }
    return {**row, **overrides}


def _rank(rank: int, rows: list[dict[str, Any]], offload: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"rank": rank, "rows": rows, "offload": offload}


def test_find_problems_names_a_group_without_its_cpu_half_under_cpu_offload():
    # The shape of a GPU run on unpatched 0.7.0: sub-groups built as "nccl" only.
    lost = _row("tp", backends={"cuda": "nccl"}, timeout_minutes={"cuda": 45.0},
                cpu_all_reduce="failed: RuntimeError: No backend type associated with device type cpu")  # fmt: skip
    ranks = [_rank(r, [_row("default"), lost], {"ok": False, "error": "RuntimeError: No backend type"}) for r in (0, 1)]
    problems = find_problems(ranks, preflight.build_options())
    assert problems == [
        "group tp: no CPU backend under CPU offload (backends cuda:nccl) (ranks 0-1)",
        "group tp: CPU all_reduce failed: RuntimeError: No backend type associated with device type cpu (ranks 0-1)",
        "full_tensor() of a CPU-offloaded parameter on mesh dp failed: RuntimeError: No backend type (ranks 0-1)",
    ]


def test_find_problems_is_empty_for_a_clean_run_and_report_problem_is_one_line():
    options = preflight.build_options(overrides={"timeout_minutes_after_init": 10})
    clean = [_rank(r, [_row("default", timeout_minutes_after_init={"cpu": 10.0, "cuda": 10.0})]) for r in (0, 1)]
    assert find_problems(clean, options) == []
    steady_off = [_rank(0, [_row("dp", timeout_minutes_after_init={"cpu": 45.0, "cuda": 10.0})])]
    assert find_problems(steady_off, options) == [
        "group dp: cpu:gloo has 45 min after init, configured 10 min (rank 0)"
    ]
    report = preflight.PreflightReport("spawn", 2, options, [], 1.0, problems=["a", "b", "c"])
    assert report.problem == "a (+2 more problems)"


def test_find_problems_reports_a_rank_failure_by_its_last_traceback_line():
    ranks = [
        {"rank": 0, "error": "rank 0 exited -9 before reporting"},
        {"rank": 1, "error": "Traceback (most recent call last):\n  ...\nValueError: world_size (2) must be divisible"},
    ]
    problems = find_problems(ranks, preflight.build_options())
    assert problems[0] == "rank failed: ValueError: world_size (2) must be divisible (rank 1)"


def test_find_problems_puts_a_rank_s_own_failure_before_the_ranks_killed_after_it():
    why = "still running 15 s after rank 0 failed (exit 1)"
    killed = {"rank": 1, "error": f"rank 1 killed: {why}", "killed_because": why}
    own = {"rank": 0, "error": "Traceback (most recent call last):\nRuntimeError: boom"}
    problems = find_problems([own, killed], preflight.build_options())
    assert problems == ["rank failed: RuntimeError: boom (rank 0)"]


def test_find_problems_names_the_ranks_killed_after_a_peer_gave_up_and_skips_its_skipped_checks():
    """Rank 0 gave up (its collective timed out): its skipped rows and offload check are not findings; rank 1 is."""
    options = preflight.build_options()
    timed_out = "failed: RuntimeError: Timed out waiting 12000ms for recv operation to complete"
    rows = [_row("default", cpu_all_reduce=timed_out), _row("tp", cpu_all_reduce=SKIPPED, cuda_all_reduce=SKIPPED)]
    gave_up = _rank(0, rows, {"method": "m", "skipped": SKIPPED})
    why = "still running 15 s after rank 0 gave up on its peers (its cpu all_reduce on group default timed out)"
    killed = {"rank": 1, "error": f"rank 1 killed: {why}", "killed_because": why}
    assert find_problems([gave_up, killed], options) == [
        f"rank 1 did not finish: {why}: a rank is stuck in a collective"
    ]
    assert find_problems([gave_up], options) == [f"group default: CPU all_reduce {timed_out} (rank 0)"]


def test_find_problems_names_a_start_up_shortfall_per_half_and_per_value():
    """Start-up timeouts below the configured 45 min: each distinct wrong value, with the halves that carry it."""
    options = preflight.build_options()
    short = _row("pp", timeout_minutes={"cpu": 10.0, "cuda": 10.0})
    split = _row("tp", timeout_minutes={"cpu": 45.0, "cuda": 30.0})
    ranks = [_rank(r, [_row("default"), short, split]) for r in (0, 1)]
    assert find_problems(ranks, options) == [
        "group pp: cpu:gloo,cuda:nccl has 10 min, configured 45 min (ranks 0-1)",
        "group tp: cuda:nccl has 30 min, configured 45 min (ranks 0-1)",
    ]


def test_plan_ray_ranks_one_gpu_bundle_per_gpu_else_two_cpu_bundles():
    cpu = plan_ray_ranks(None, 0)
    assert (cpu.world_size, bundle_of(cpu), cpu.env) == (2, {"CPU": 1}, {"CUDA_VISIBLE_DEVICES": ""})
    assert plan_note(cpu, 0) == "no GPU in the Ray cluster: 2 CPU bundles (gloo), strategy PACK"
    gpu = plan_ray_ranks(None, 8)
    assert (gpu.world_size, bundle_of(gpu), gpu.env) == (8, {"CPU": 1, "GPU": 1}, {})
    assert plan_note(gpu, 8) == "8 GPU bundles (1 GPU, 1 CPU each), strategy PACK"
    assert plan_ray_ranks(4, 8).world_size == 4
    one = plan_ray_ranks(None, 1)
    assert bundle_of(one) == {"CPU": 1}  # one GPU cannot hold two NCCL ranks
    assert plan_note(one, 1) == "1 GPU in the Ray cluster, a CUDA run needs 2: 2 CPU bundles (gloo), strategy PACK"
    with pytest.raises(ValueError, match="--nproc 16 exceeds the cluster's 8 GPUs"):
        plan_ray_ranks(16, 8)
