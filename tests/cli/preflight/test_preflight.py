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

import dataclasses
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
from nemo_rl_shim.cli.preflight.results import GroupRow, OffloadCheck, RankChecked, RankFailed
from nemo_rl_shim.cli.preflight.runner import RankLimit, RankPlan, Runner, plan_ranks
from nemo_rl_shim.cli.preflight.spawn import free_port
from tests.harness.at_once import Finished, run_at_once
from tests.harness.paths import REPO_ROOT

pytestmark = [pytest.mark.every_lane]

RUN_TIMEOUT_S = 420  # bound on each launched command; ranks import torch + Automodel on a contended CPU
PPO_YAML = (
    "policy:\n  automodel_cfg:\n    distributed_timeout_minutes: 99\n"
    "value:\n  automodel_cfg:\n    distributed_timeout_minutes: {startup}\n"
    "  nemo_rl_shim:\n    distributed_timeout_minutes_after_init: {steady}\n"
    "  dtensor_cfg:\n    _v2: true\n    cpu_offload: true\n"
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


def _worlds_on_fresh_ports(config: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The torchrun world and the two srun-style ranks, each world on a rendezvous port picked now."""
    torchrun_port, srun_port = _two_ports()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", torchrun_port]  # fmt: skip
    no_patch = [*_command(), "preflight", "--no-patch", "--json"]
    return {
        "torchrun": (
            [*torchrun, "-m", "nemo_rl_shim", "preflight", "--json", "--config", str(config), "--role", "value"],
            _env(),
        ),
        "srun0": (no_patch, _srun_env(0, srun_port)),
        "srun1": (no_patch, _srun_env(1, srun_port)),
    }


#: Starts of a torchrun or srun-style world: a launcher of their own picks the port, and another process can take it
#: before their rank 0 (torchrun's agent) binds it.
PORT_ATTEMPTS = 3


def says_port_taken(text: str) -> bool:
    lowered = text.lower()
    return "eaddrinuse" in lowered or "address already in use" in lowered


def _lost_their_port(runs: dict[str, Finished]) -> set[str]:
    """The worlds (``torchrun``, ``srun``) a rank of which failed because another process took the port first."""
    lost = {name for name, run in runs.items() if run.returncode != 0 and says_port_taken(run.stdout + run.stderr)}
    return {name.rstrip("01") for name in lost if name != "default"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Finished]:
    """The default run, the torchrun world and the two srun-style ranks, all started at once. A world that lost its
    rendezvous port to another process (picked free, taken before its bind) runs again on a fresh one."""
    config = tmp_path_factory.mktemp("preflight") / "ppo.yaml"
    config.write_text(PPO_YAML.format(startup=STARTUP_MIN, steady=STEADY_MIN))
    commands = {"default": ([*_command(), "preflight"], _env()), **_worlds_on_fresh_ports(config)}
    finished = run_at_once(commands, timeout_s=RUN_TIMEOUT_S, cwd=REPO_ROOT)
    for _ in range(PORT_ATTEMPTS - 1):
        lost = _lost_their_port(finished)
        if not lost:
            break
        again = {name: command for name, command in _worlds_on_fresh_ports(config).items() if name.rstrip("01") in lost}
        finished.update(run_at_once(again, timeout_s=RUN_TIMEOUT_S, cwd=REPO_ROOT))
    return finished


@pytest.mark.multiprocess
def test_default_run_exits_0_with_45_minutes_on_every_group(runs):
    default_run = runs["default"]
    assert default_run.returncode == 0, default_run.stderr[-3000:]
    rows = _table(default_run.stdout)
    # cp_tp: the worker's replica group, made after set-up (preflight.later_groups); every group torch holds is a row
    assert {"default", "pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_cp", "dp_shard_cp", "cp_tp"} <= set(rows)
    timeout, cpu, cuda = (COLUMNS.index(c) for c in ("timeout", "cpu all_reduce", "cuda all_reduce"))
    assert {name: cells[timeout] for name, cells in rows.items() if cells[timeout] != "45 min"} == {}
    assert {cells[cpu] for cells in rows.values()} == {"ok"}
    assert {cells[cuda] for cells in rows.values()} == {"n/a"}  # no GPU here
    assert "decision: patch_and_forward" in default_run.stdout
    assert "full_tensor() (4, 4): ok on every rank" in default_run.stdout


@pytest.mark.multiprocess
def test_default_run_reports_progress_on_stderr(runs):
    assert "preflight: starting 2 CPU ranks (importing Automodel takes ~10 s)..." in runs["default"].stderr


# A stalled rank ending the spawned run at --timeout-s with one line:
# tests/hang_report/test_hang_report_preflight.py, whose
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
    # Every group the mesh build made itself is at Gloo's default: the size-1 axes, and where torch gives a
    # world-sized axis its own group rather than the default one (torch 2.9), that one too; and the worker's
    # replica group (cp_tp), made after set-up, with them.
    separate = [row["group"] for row in report["ranks"][0]["rows"] if not row["is_default"] and not row["same_as"]]
    assert {"pp", "dp_replicate", "cp", "tp", "cp_tp"} <= set(separate), separate
    assert line == (
        f"preflight: FAILED: {len(separate)} groups at torch's default, not the configured timeout: "
        f"{', '.join(separate)} (+{len(separate)} more problems)"
    ), (line, separate)
    assert (
        "group tp: cpu:gloo,cuda:gloo at torch's default 30 min, configured 45 min (group_desc "
        in report["problems"][separate.index("tp") + 1]
    ), report["problems"]


# --- pure parts -------------------------------------------------------------------------------


def test_build_options_default_is_45_minutes_cpu_offload_patch_on():
    options = preflight.build_options()
    assert (options.timeout_minutes, options.timeout_minutes_after_init, options.cpu_offload) == (45.0, None, True)
    assert options.section["nemo_rl_shim"]["patch_automodel"] is True
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
        "automodel_cfg": {"distributed_timeout_minutes": 60},
        "nemo_rl_shim": {"patch_automodel": False},
        "dtensor_cfg": {"tensor_parallel_size": 2, "context_parallel_size": 2, "cpu_offload": False},
    }
    assert options.cpu_offload is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overrides": {"timeout_minutes": 0}}, "policy.automodel_cfg.distributed_timeout_minutes must be a positive"),
        (
            {"overrides": {"timeout_minutes_after_init": 50}},
            "policy.nemo_rl_shim.distributed_timeout_minutes_after_init must not exceed "
            "policy.automodel_cfg.distributed_timeout_minutes",
        ),
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


GPUS_4 = RankLimit(4, "the 4 CUDA devices")
CPUS_16 = RankLimit(16, "what this machine can hold: 16 CPU ranks")


def test_plan_ranks_one_per_gpu_else_two_cpu_ranks():
    no_gpu = RankLimit(0, "the 0 CUDA devices")
    assert plan_ranks(None, no_gpu, CPUS_16) == RankPlan(2, "cpu", {"CUDA_VISIBLE_DEVICES": ""})
    assert plan_ranks(None, GPUS_4, CPUS_16) == RankPlan(4, "cuda")
    assert plan_ranks(2, GPUS_4, CPUS_16).world_size == 2
    assert plan_ranks(3, no_gpu, CPUS_16).world_size == 3
    one = plan_ranks(None, RankLimit(1, "the 1 CUDA devices"), CPUS_16)
    assert (one.world_size, one.device, one.env) == (2, "cpu", {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(ValueError, match="--nproc 8 exceeds the 4 CUDA devices"):
        plan_ranks(8, GPUS_4, CPUS_16)


def test_plan_ranks_at_the_edges_one_rank_per_gpu_up_to_every_gpu():
    """Exactly as many ranks as GPUs fits; exactly MIN_RANKS GPUs is a CUDA run."""
    assert plan_ranks(4, GPUS_4, CPUS_16) == RankPlan(4, "cuda")
    assert plan_ranks(None, RankLimit(2, "the 2 CUDA devices"), CPUS_16) == RankPlan(2, "cuda")
    assert plan_ranks(16, RankLimit(0, "none"), CPUS_16).world_size == 16


def test_plan_ranks_refuses_more_cpu_ranks_than_the_machine_holds_naming_both_numbers():
    with pytest.raises(ValueError, match=r"^--nproc 17 exceeds what this machine can hold: 16 CPU ranks$"):
        plan_ranks(17, RankLimit(0, "none"), CPUS_16)


def test_cpu_rank_limit_is_the_available_memory_over_a_rank_s_measured_peak():
    from nemo_rl_shim.cli.preflight.spawn import RANK_MEMORY_MIB, cpu_rank_limit

    limit = cpu_rank_limit(10 * RANK_MEMORY_MIB + 1)
    assert limit.ranks == 10
    assert limit.named == (
        f"what this machine can hold: 10 CPU ranks ({10 * RANK_MEMORY_MIB + 1} MiB of memory available, "
        f"about {RANK_MEMORY_MIB} MiB a rank)"
    )


def test_nproc_far_above_the_machine_is_refused_at_once_with_the_number_and_the_limit(capfd):
    """No rank starts: the refusal comes from the plan, before the runner spawns anything."""
    import time

    from nemo_rl_shim.cli import main

    start = time.monotonic()
    assert main(["preflight", "--nproc", "10000", "--json"]) == 2
    elapsed = time.monotonic() - start
    captured = capfd.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith("preflight: --nproc 10000 exceeds what this machine can hold: "), line
    assert "CPU ranks (" in line and "MiB a rank)" in line, line
    assert json.loads(captured.out) == {"ok": False, "exit_code": 2, "problem": line.removeprefix("preflight: ")}
    print(f"\n--nproc 10000 refused in {elapsed:.2f} s: {line}")


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


def _row(group: str, **overrides: Any) -> GroupRow:
    row = GroupRow(
        group=group,
        ranks=(0, 1),
        backends={"cpu": "gloo", "cuda": "nccl"},
        timeout_minutes={"cpu": 45.0, "cuda": 45.0},
        cpu_all_reduce="ok",
        cuda_all_reduce="ok",
    )
    return dataclasses.replace(row, **overrides)


def _rank(rank: int, rows: list[GroupRow], offload: OffloadCheck | None = None) -> RankChecked:
    decision = {"action": "forward", "reason": "the installed Automodel keeps the CPU half", "warning": None}
    return RankChecked(rank, "host", 2, "gloo", "cpu", decision, None, tuple(rows), offload)


def test_find_problems_names_a_group_without_its_cpu_half_under_cpu_offload():
    # The shape of a GPU run on unpatched 0.7.0: sub-groups built as "nccl" only.
    lost = _row("tp", backends={"cuda": "nccl"}, timeout_minutes={"cuda": 45.0},
                cpu_all_reduce="failed: RuntimeError: No backend type associated with device type cpu")  # fmt: skip
    failed = OffloadCheck("m", ok=False, error="RuntimeError: No backend type")
    ranks = [_rank(r, [_row("default"), lost], failed) for r in (0, 1)]
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
        RankFailed(0, "rank 0 exited -9 before reporting"),
        RankFailed(1, "Traceback (most recent call last):\n  ...\nValueError: world_size (2) must be divisible"),
    ]
    problems = find_problems(ranks, preflight.build_options())
    assert problems[0] == "rank failed: ValueError: world_size (2) must be divisible (rank 1)"


def test_find_problems_puts_a_rank_s_own_failure_before_the_ranks_killed_after_it():
    why = "still running 15 s after rank 0 failed (exit 1)"
    killed = RankFailed(1, f"rank 1 killed: {why}", killed_because=why)
    own = RankFailed(0, "Traceback (most recent call last):\nRuntimeError: boom")
    problems = find_problems([own, killed], preflight.build_options())
    assert problems == ["rank failed: RuntimeError: boom (rank 0)"]


def test_find_problems_names_the_ranks_killed_after_a_peer_gave_up_and_skips_its_skipped_checks():
    """Rank 0 gave up (its collective timed out): its skipped rows and offload check are not findings; rank 1 is."""
    options = preflight.build_options()
    timed_out = "failed: RuntimeError: Timed out waiting 12000ms for recv operation to complete"
    rows = [_row("default", cpu_all_reduce=timed_out), _row("tp", cpu_all_reduce=SKIPPED, cuda_all_reduce=SKIPPED)]
    gave_up = _rank(0, rows, OffloadCheck("m", skipped=SKIPPED))
    why = "still running 15 s after rank 0 gave up on its peers (its cpu all_reduce on group default timed out)"
    killed = RankFailed(1, f"rank 1 killed: {why}", killed_because=why)
    assert find_problems([gave_up, killed], options) == [
        f"rank 1 did not finish: {why}: a rank is stuck in a collective"
    ]
    assert find_problems([gave_up], options) == [f"group default: CPU all_reduce {timed_out} (rank 0)"]


def test_find_problems_on_a_timed_out_run_names_the_ranks_that_did_not_finish_not_those_that_did():
    options = preflight.build_options(timeout_s=60)
    finished = [_rank(0, [_row("default")]), _rank(2, [_row("default")])]
    unfinished = [RankFailed(1, "timed out", timed_out=True), RankFailed(3, "timed out", timed_out=True)]
    assert find_problems([finished[0], unfinished[0], finished[1], unfinished[1]], options, timed_out=True) == [
        "ranks 1, 3 did not finish within 60 s (--timeout-s): a rank is stuck at start-up or in a collective"
    ]


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


# --- every group torch holds, as the audit judged it --------------------------------------------------------------


def _at(source: str, minutes: float | None, **overrides: Any) -> GroupRow:
    """A row whose every backend reads ``minutes``, judged ``source`` by the audit."""
    backends = overrides.pop("backends", {"cpu": "gloo", "cuda": "nccl"})
    return _row(
        overrides.pop("group", "unnamed undefined"), backends=backends,
        timeout_minutes=dict.fromkeys(backends, minutes), sources=dict.fromkeys(backends, source), **overrides,
    )  # fmt: skip


def test_every_group_left_at_torch_s_default_is_named_with_its_description_ranks_backends_and_value():
    """A mesh axis and a group no mesh names (a refit group made later), each at torch's default on one of two ranks'
    groups: one line names them all first, then one line per group with what the issue asks it to name."""
    options = preflight.build_options()
    ranks = [
        _rank(rank, [
            _at("configured", 45.0, group="default", ranks=(0, 1)),
            _at("torch_default", 30.0, group="tp", desc="mesh_tp", ranks=(rank,)),
            _at("torch_default", 30.0, named=False, desc="undefined", ranks=(rank,), backends={"cpu": "gloo"}),
        ])
        for rank in (0, 1)
    ]  # fmt: skip
    assert find_problems(ranks, options) == [
        "2 groups at torch's default, not the configured timeout: tp, unnamed undefined",
        "group tp: cpu:gloo,cuda:nccl at torch's default 30 min, configured 45 min (group_desc mesh_tp, group ranks "
        "0 | 1) (ranks 0-1)",
        "group unnamed undefined: cpu:gloo at torch's default 30 min, configured 45 min (group_desc undefined, group "
        "ranks 0 | 1) (ranks 0-1)",
    ]
    one = [_rank(0, [_at("configured", 45.0, group="default"), _at("torch_default", 30.0, desc="undefined")])]
    assert find_problems(one, options) == [  # one group: its line alone
        "group unnamed undefined: cpu:gloo,cuda:nccl at torch's default 30 min, configured 45 min (group_desc "
        "undefined, group ranks 0-1) (rank 0)"
    ]
    unset = preflight.build_options(overrides={"timeout_minutes": None})
    unset = dataclasses.replace(unset, section={**unset.section, "automodel_cfg": {}})
    assert find_problems(one, unset) == []  # nothing configured: torch's default is what was asked for


def test_a_group_with_a_timeout_of_its_own_is_shown_as_such_and_is_no_problem_unless_a_mesh_names_it(monkeypatch):
    own = _at("own", 20.0, named=False, timeout_minutes_after_init={"cpu": 20.0, "cuda": 20.0},
              sources_after_init={"cpu": "own", "cuda": "own"})  # fmt: skip
    steady = {"cpu": 10.0, "cuda": 10.0}
    clean = _at("configured", 45.0, group="default", timeout_minutes_after_init=steady,
                sources_after_init={"cpu": "configured", "cuda": "configured"})  # fmt: skip
    options = preflight.build_options(overrides={"timeout_minutes_after_init": 10})
    assert find_problems([_rank(0, [clean, own])], options) == []
    report = _run_on(monkeypatch, _FakeRunner((_rank(0, [clean, own]),)), overrides={"timeout_minutes_after_init": 10})
    text = preflight.render_report(report)
    assert report.ok, report.problems
    assert "20 min (own)" in next(line for line in text.splitlines() if line.startswith("unnamed undefined")), text
    assert text.splitlines()[-2] == (
        "OK: every group torch holds carries the configured timeout on every backend; collectives work; groups with a "
        "timeout of their own: unnamed undefined"
    ), text
    mesh_axis = dataclasses.replace(own, group="tp", named=True)  # a mesh axis must carry the configured value
    assert find_problems([_rank(0, [clean, mesh_axis])], options) == [
        "group tp: cpu:gloo,cuda:nccl has 20 min, configured 45 min (rank 0)",
        "group tp: cpu:gloo,cuda:nccl has 20 min after init, configured 10 min (rank 0)",
    ]


def test_a_value_within_c10d_s_millisecond_is_the_configured_one_and_one_beyond_it_is_not():
    """c10d keeps whole milliseconds; a group made later gets the value plus half a millisecond
    (``later.CREATION_SLACK``) that a backend may show: not a problem. 1.2 s off is."""
    options = preflight.build_options()
    slack = 45 + 0.0005 / 60
    assert find_problems([_rank(0, [_row("cp_tp", timeout_minutes={"cpu": slack, "cuda": slack})])], options) == []
    off = _row("cp_tp", timeout_minutes={"cpu": 45.02, "cuda": 45.0})
    expected = "group cp_tp: cpu:gloo has 45.02 min, configured 45 min (rank 0)"
    assert find_problems([_rank(0, [off])], options) == [expected]


def test_a_group_made_later_that_kept_the_start_up_value_after_init_is_named():
    """Configured at start-up, it must follow to the steady value: at 45 min after init it did not."""
    later = _at("configured", 45.0, named=False, timeout_minutes_after_init={"cpu": 45.0, "cuda": 45.0},
                sources_after_init={"cpu": "own", "cuda": "own"})  # fmt: skip
    options = preflight.build_options(overrides={"timeout_minutes_after_init": 10})
    assert find_problems([_rank(0, [later])], options) == [
        "group unnamed undefined: cpu:gloo,cuda:nccl has 45 min after init, configured 10 min (rank 0)"
    ]


def test_a_timeout_that_cannot_be_read_is_not_checked_and_never_passes(monkeypatch):
    """torch's bare fake backend keeps no timeout: the audit says unreadable, and the dry run must not call it OK."""
    fake = _at("unreadable", None, group="tp", backends={"cpu": "fake", "cuda": "fake"})
    options = dataclasses.replace(preflight.build_options(), dry_run=True)
    assert find_problems([_rank(0, [_at("configured", 45.0, group="default"), fake])], options) == [
        "group tp: cpu:fake,cuda:fake keeps no timeout that can be read: not checked against the configured 45 min "
        "(rank 0)"
    ]
    text = preflight.render_report(
        preflight.PreflightReport("dry run", 1, options, [_rank(0, [fake])], 1.0, problems=["x"])
    )
    cells = _table(text)["tp"]
    assert cells[COLUMNS.index("timeout")] == "? min (unreadable)", cells


def test_plan_ray_ranks_one_gpu_bundle_per_gpu_else_two_cpu_bundles():
    cpu = plan_ray_ranks(None, 0, 6)
    assert (cpu.world_size, bundle_of(cpu), cpu.env) == (2, {"CPU": 1}, {"CUDA_VISIBLE_DEVICES": ""})
    assert plan_note(cpu, 0) == "no GPU in the Ray cluster: 2 CPU bundles (gloo), strategy PACK"
    gpu = plan_ray_ranks(None, 8, 16)
    assert (gpu.world_size, bundle_of(gpu), gpu.env) == (8, {"CPU": 1, "GPU": 1}, {})
    assert plan_note(gpu, 8) == "8 GPU bundles (1 GPU, 1 CPU each), strategy PACK"
    assert plan_ray_ranks(4, 8, 16).world_size == 4
    assert plan_ray_ranks(6, 0, 6).world_size == 6  # a CPU per bundle: as many as the cluster's CPUs
    one = plan_ray_ranks(None, 1, 6)
    assert bundle_of(one) == {"CPU": 1}  # one GPU cannot hold two NCCL ranks
    assert plan_note(one, 1) == "1 GPU in the Ray cluster, a CUDA run needs 2: 2 CPU bundles (gloo), strategy PACK"
    with pytest.raises(ValueError, match="--nproc 16 exceeds the cluster's 8 GPUs"):
        plan_ray_ranks(16, 8, 16)
    with pytest.raises(ValueError, match="--nproc 7 exceeds the cluster's 6 CPUs: a CPU rank's bundle takes one"):
        plan_ray_ranks(7, 0, 6)


# --- typed results, the grace, who reports ----------------------------------------------------------------------


def test_a_rank_s_parameters_and_results_cross_a_process_as_json_and_come_back_equal():
    from nemo_rl_shim.cli.preflight.results import Node, RankParams, outcome_from_json

    section = {"automodel_cfg": {"distributed_timeout_minutes": 45.0}}
    params = RankParams(section, "value", False, 1, 2.5, True, "nemo-rl")
    assert RankParams.from_json(json.loads(json.dumps(params.to_json()))) == params
    offload = OffloadCheck("m", mesh_ranks=(0, 1), ok=True, local_device="cpu", local_shape=(2, 4), full_shape=(4, 4))
    rows = [_row("default", is_default=True), _row("dp", same_as="default", timeout_minutes_after_init={"cpu": 9.0})]
    unnamed = _row(
        "unnamed undefined", named=False, desc="undefined", group_name="7", timeout_minutes={"cpu": None},
        sources={"cpu": "unreadable"}, timeout_minutes_after_init={"cpu": 20.0}, sources_after_init={"cpu": "own"},
    )  # fmt: skip
    node = Node("n1", "10.0.0.2", "h", 7)
    checked = dataclasses.replace(
        _rank(1, [*rows, unnamed], offload), gave_up="its cpu all_reduce on group default timed out", warnings=("w",),
        node=node,
    )  # fmt: skip
    nemo_rl = dataclasses.replace(checked, decision=None, set_up="NeMo RL's own setup_distributed", later_groups=("r",))
    failed = RankFailed(2, "did not finish", True, "still running 15 s after x", "log", "all_reduce", 3.5, ("f:1",))
    failed = dataclasses.replace(failed, node=node)
    skipped = OffloadCheck("m", mesh_ranks=(0, 1), ok=False, skipped="an earlier collective timed out")
    gave_up = dataclasses.replace(checked, offload=skipped)
    for outcome in (checked, nemo_rl, failed, gave_up):
        assert outcome_from_json(json.loads(json.dumps(outcome.to_json())), outcome.rank) == outcome


@pytest.mark.parametrize(
    "data", [None, "text", {"rows": []}, {"checked": True, "rank": 3}], ids=["none", "text", "untyped", "partial"]
)
def test_a_result_that_cannot_be_read_is_that_rank_s_failure_not_a_crash(data):
    from nemo_rl_shim.cli.preflight.results import outcome_from_json

    outcome = outcome_from_json(data, 3)
    assert isinstance(outcome, RankFailed) and outcome.rank == 3
    assert outcome.error.startswith("rank 3 sent a result preflight cannot read"), outcome.error
    if not isinstance(data, dict) or "checked" not in data:  # named by what arrived, not by the first key missing
        assert outcome.error == f"rank 3 sent a result preflight cannot read: {data}"


def test_rank_parameters_refuse_a_key_slipped_in():
    from nemo_rl_shim.cli.preflight.results import RankParams

    with pytest.raises(ValueError, match="rank parameters: unknown key 'stal_rank'"):
        RankParams.from_json({"section": {}, "stal_rank": 1})


def test_the_grace_ends_exactly_the_seconds_its_line_names_after_the_first_cause():
    import math

    from nemo_rl_shim.cli.preflight.stuck import FAILURE_GRACE_S, Grace

    now = [100.0]
    grace = Grace(clock=lambda: now[0])
    assert (grace.started, grace.over(), grace.remaining(), grace.why) == (False, False, math.inf, None)
    grace.start("rank 0 failed (exit 1)")
    now[0] += 5.0
    grace.start("rank 1 gave up on its peers (x)")  # the first cause and its end stay
    assert grace.why == f"still running {FAILURE_GRACE_S:g} s after rank 0 failed (exit 1)"
    assert grace.remaining() == pytest.approx(FAILURE_GRACE_S - 5.0)
    now[0] = 100.0 + FAILURE_GRACE_S - 0.001
    assert not grace.over()
    now[0] = 100.0 + FAILURE_GRACE_S
    assert grace.over() and grace.remaining() == 0.0


class _Process:
    """A rank process as spawn's wait sees it: ``poll()`` gives its exit code from ``exits_at`` on (None: never)."""

    def __init__(self, clock: list[float], exits_at: float | None, code: int) -> None:
        self.clock, self.exits_at, self.code, self.killed_at = clock, exits_at, code, None

    def poll(self) -> int | None:
        if self.killed_at is not None:
            return -9
        return self.code if self.exits_at is not None and self.clock[0] >= self.exits_at else None

    def kill(self) -> None:
        self.killed_at = self.clock[0]

    def wait(self) -> int | None:
        return self.poll()


def test_spawn_ends_the_ranks_left_when_the_grace_its_line_names_is_over():
    """Rank 0 fails at t=10; rank 1 runs on. It is killed at t=10 + the grace, and the reason says that grace."""
    from nemo_rl_shim.cli.preflight import spawn
    from nemo_rl_shim.cli.preflight.stuck import FAILURE_GRACE_S, Grace

    now = [0.0]

    def clock() -> float:  # every reading moves on 0.5 s: the wait's loop runs in fake time
        now[0] += 0.5
        return now[0]

    processes = [_Process(now, 10.0, 1), _Process(now, None, 0)]
    timed_out, killed = spawn._wait(processes, 600.0, None, grace=Grace(clock=clock))
    assert (timed_out, killed) == (False, {1: f"still running {FAILURE_GRACE_S:g} s after rank 0 failed (exit 1)"})
    assert processes[1].killed_at == pytest.approx(10.0 + FAILURE_GRACE_S, abs=2.0)


def _clean_ranks() -> tuple[RankChecked, ...]:
    return tuple(_rank(r, [_row("default", is_default=True)]) for r in (0, 1))


class _FakeRunner(Runner):
    """A runner that returns ``ranks`` and ``problems`` of its own (a dead Ray actor's, say)."""

    def __init__(self, ranks: tuple[Any, ...], problems: tuple[str, ...] = (), reports: bool = True) -> None:
        self.ranks, self.problems, self.reports = ranks, problems, reports

    def capacity(self, options):
        from nemo_rl_shim.cli.preflight.runner import Capacity

        return Capacity(world=len(self.ranks))

    def plan(self, ranks):
        return RankPlan(len(self.ranks), "fake")

    def run(self, options, ranks, progress):
        from nemo_rl_shim.cli.preflight.runner import RankRun

        return RankRun("ray", len(self.ranks), self.ranks, problems=self.problems)


def _run_on(monkeypatch, runner: Runner, **option_kwargs: Any):
    from nemo_rl_shim.cli.preflight import run

    monkeypatch.setattr(run, "pick_runner", lambda options, environ=None, last_words=None: runner)
    return run.run_preflight(preflight.build_options(**option_kwargs))


def test_a_runner_s_own_problem_is_kept_when_every_rank_s_rows_are_clean(monkeypatch):
    died = "rank 1 (actor nemo-rl-shim-preflight-0-rank1 on node 127.0.0.1) died: the actor died unexpectedly"
    report = _run_on(monkeypatch, _FakeRunner(_clean_ranks(), (died,)))
    assert (report.ok, report.problems, report.checks_passed) == (False, [died], False)
    assert _run_on(monkeypatch, _FakeRunner(_clean_ranks())).problems == []  # and clean rows alone pass


def test_the_runner_decides_who_reports(monkeypatch):
    from nemo_rl_shim.cli.preflight.join import JoinRunner

    rank_0, rank_1 = JoinRunner(Launcher("torchrun", 0, 2, 0)), JoinRunner(Launcher("torchrun", 1, 2, 1))
    assert (rank_0.reports, rank_0.joined, rank_1.reports, rank_1.joined) == (True, True, False, True)
    silent = _run_on(monkeypatch, _FakeRunner(_clean_ranks(), reports=False))
    assert (silent.reports, silent.joined) == (False, False)


def test_a_config_off_the_checked_path_never_passes_and_says_what_was_checked(monkeypatch, tmp_path):
    config = tmp_path / "v1.yaml"
    config.write_text("policy:\n  dtensor_cfg: {_v2: false}\n  automodel_cfg: {distributed_timeout_minutes: 45}\n")
    report = _run_on(monkeypatch, _FakeRunner(_clean_ranks()), config_path=str(config))
    assert (report.ok, report.checks_passed) == (False, True)
    assert report.problems == [report.options.worker_note]
    v1 = "policy.dtensor_cfg._v2 is False: NeMo RL runs its v1 DTensor worker"
    assert report.problem.startswith(v1), report.problem
    text = preflight.render_report(report)
    assert "OK" not in text, text
    assert (
        "checked the Automodel path, which this config does not run (note above): every group torch holds carries the "
        "configured timeout on every backend; collectives work"
    ) in text.splitlines()


def test_a_watchdog_says_its_line_and_its_last_words_then_ends_the_process(capsys):
    """A joined rank or a Ray driver that hangs is ended by its watchdog (exit 1), after ``last_words``."""
    import threading

    from nemo_rl_shim.cli.preflight.stuck import watchdog

    said, ended = [], threading.Event()
    watchdog(0.05, "rank 0 did not finish within 0.05 s (--timeout-s)", said.append, lambda code: ended.set())
    assert ended.wait(30)
    assert said == ["rank 0 did not finish within 0.05 s (--timeout-s)"]
    assert capsys.readouterr().err == "preflight: rank 0 did not finish within 0.05 s (--timeout-s)\n"


def test_with_json_the_watchdog_s_last_words_are_the_json_on_stdout(monkeypatch, capfd):
    """The command gives a runner, with ``--json``, last words that print the JSON stand-in on stdout (then the
    watchdog ends the process: here the runner raises SystemExit in its place)."""
    from nemo_rl_shim.cli import main
    from nemo_rl_shim.cli.preflight import run

    class Hangs(_FakeRunner):
        def run(self, options, ranks, progress):
            if self.last_words is None:
                return super().run(options, ranks, progress)
            self.last_words("rank 0 did not finish within 300 s (--timeout-s)")
            raise SystemExit(1)

    runners = []

    def pick(options, environ=None, last_words=None):
        runners.append(Hangs(_clean_ranks()))
        runners[-1].last_words = last_words
        return runners[-1]

    monkeypatch.setattr(run, "pick_runner", pick)
    with pytest.raises(SystemExit):
        main(["preflight", "--json"])
    problem = "rank 0 did not finish within 300 s (--timeout-s)"
    assert json.loads(capfd.readouterr().out) == {"ok": False, "exit_code": 1, "problem": problem}
    assert main(["preflight"]) == 0 and runners[-1].last_words is None  # without --json: no last words
