"""``nemo-rl-shim preflight --dry-run``: the training world checked rank by rank in this process.

Everything runs in the test process, through the real command (:func:`nemo_rl_shim.cli.main`)
and the real set-up path: the shim's validation and decision, the workaround layers and the
installed nemo-automodel's ``MeshContext.build`` (0.7.0 here and on the py3.13-torch-2.11 and torch-2.10 lanes,
0.5.0 on the torch-2.9 lane). What stands in is the boundary this machine lacks: GPUs, NCCL and
a rendezvous, as :mod:`nemo_rl_shim.cli.preflight.fake_backend` describes (torch's own fake backend).

The seed case: a CPU-offload config at 45 minutes on a 16-rank world with tensor, context and
expert parallelism. Without the patch, the decision keeps the timeout off the mesh sub-groups
and the dry run fails naming them; with it, every group has 45 minutes on both halves.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import device_mesh
from torch.distributed import distributed_c10d as c10d

import automodel_patch
from nemo_rl_shim.cli import main
from nemo_rl_shim.cli.preflight import build_options, run_preflight
from nemo_rl_shim.cli.preflight.dry_run import ALL_RANKS_UP_TO

pytestmark = [
    pytest.mark.skipif(
        automodel_patch.installed_version() is None, reason="nemo-automodel is not installed (the automodel extra)"
    ),
    pytest.mark.every_lane,
]

CONFIG = """\
policy:
  dtensor_cfg:
    _v2: true
    cpu_offload: true
    tensor_parallel_size: 2
    context_parallel_size: 2
    expert_parallel_size: 4
  automodel_cfg:
    distributed_timeout_minutes: 45
cluster:
  num_nodes: 2
  gpus_per_node: 8
"""
WORLD = 16
#: Groups each rank holds: default, the 5 mesh axes (pp, dp_replicate, dp_shard, cp, tp), the
#: flattened dp, dp_cp and dp_shard_cp (dp_replicate_dp_shard_cp_tp spans the world and reuses
#: the default group), the MoE mesh's ep_shard and ep, and the worker's replica group (cp, tp)
#: flattened after set-up (preflight.later_groups).
GROUPS_PER_RANK = 12


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dry_run") / "offload.yaml"
    path.write_text(CONFIG)
    return str(path)


def _state() -> dict[str, Any]:
    """Everything global a dry run touches, as it is now."""
    backend = dist.Backend
    layers = automodel_patch.active()  # first: it imports Automodel, whose imports register torch's fake backend
    return {
        "registry": {
            name: repr(getattr(backend, name))
            for name in ("_plugins", "backend_list", "backend_capability", "backend_type_map")
        },
        "default_device_backend_map": dict(backend.default_device_backend_map),
        "FAKE": backend.__dict__.get("FAKE"),
        "ProcessGroup": c10d.ProcessGroup,
        "helper": c10d._new_process_group_helper,
        "init_process_group": dist.init_process_group,
        "cuda": [getattr(torch.cuda, n) for n in ("is_available", "is_initialized", "device_count", "set_device")],
        "mesh_resources": getattr(device_mesh, "_mesh_resources", None),
        "env": dict(os.environ),
        "layers": layers,
        "initialized": dist.is_initialized(),
    }


def _run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | str, str]:
    code = main(["preflight", "--dry-run", *argv])
    out, err = capfd.readouterr()
    return code, json.loads(out) if "--json" in argv else out, err


def _all_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for rank in report["ranks"] for row in rank["rows"]]


def test_seed_without_patch_fails_naming_the_sub_groups(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    before = _state()
    code, report, err = _run(capfd, "--config", config, "--json", "--no-patch")
    assert code == 1, err[-3000:]
    assert report["decision"]["action"] == "not_forwarded"
    assert report["world_size"] == WORLD and report["launcher"] == "dry run"
    line = next(line for line in err.splitlines() if "FAILED" in line)
    assert "groups at torch's default, not the configured timeout: " in line, line
    for axis in ("dp_shard", "cp", "tp", "cp_tp", "moe.ep"):  # cp_tp: made after set-up, as the worker makes it
        assert axis in line.split(": ")[3].split(" (+")[0].split(", "), line
    tp = next(problem for problem in report["problems"] if problem.startswith("group tp: "))
    assert tp.startswith("group tp: cpu:gloo,cuda:nccl at torch's default 30 min, configured 45 min (group_desc "), tp
    assert tp.endswith(", group ranks 0-1 | 2-3 | 4-5 | 6-7 | 8-9 | 10-11 | 12-13 | 14-15) (ranks 0-15)"), tp
    default = [row for row in _all_rows(report) if row["is_default"]]
    assert default and all(row["timeout_minutes"] == {"cpu": 45.0, "cuda": 45.0} for row in default)
    assert _state() == before


def test_seed_with_patch_passes_every_group_45_minutes_both_halves(
    config: str, capfd: pytest.CaptureFixture[str]
) -> None:
    before = _state()
    code, report, err = _run(capfd, "--config", config, "--json")
    assert code == 0, err[-3000:]
    assert report["ok"] and report["problem"] is None
    assert report["decision"]["action"] in ("patch_and_forward", "forward")
    assert report["training_world"] == WORLD and "cluster.num_nodes 2" in report["training_world_source"]
    assert sorted(int(r) for r in report["dry_run"]["checked_ranks"]) == list(range(WORLD))
    for rank in report["ranks"]:
        assert rank["process_groups"] == len(rank["groups"]) == GROUPS_PER_RANK, rank["rank"]
        recorded = {tuple(group["ranks"]) for group in rank["groups"]}
        assert {tuple(row["ranks"]) for row in rank["rows"]} <= recorded  # every named group was recorded
        for group in rank["groups"]:
            assert rank["rank"] in group["ranks"]
            assert group["backends"] == {"cuda": "nccl", "cpu": "gloo"}, group
            assert group["timeout_minutes"] == {"cuda": 45.0, "cpu": 45.0}, group
        for row in rank["rows"]:  # the same shape as preflight's rows
            assert row["backends"] == {"cpu": "gloo", "cuda": "nccl"}, row
            assert row["timeout_minutes"] == {"cpu": 45.0, "cuda": 45.0}, row
            assert row["cpu_all_reduce"] == row["cuda_all_reduce"] == "not run (dry run)"
        assert rank["offload"] is None and rank["device"] == "cuda"
        assert rank["default_backend"] == "cuda:nccl,cpu:gloo"
    assert report["dry_run"]["process_groups"] == {str(r): GROUPS_PER_RANK for r in range(WORLD)}
    assert _state() == before


def test_table_says_what_was_checked(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, text, err = _run(capfd, "--config", config)
    assert code == 0, err[-3000:]
    assert f"preflight: {WORLD} ranks (dry run), policy section" in text
    assert f"checked ranks: all {WORLD}\n" in text
    assert f"process groups per rank (= NCCL communicators it will hold): {GROUPS_PER_RANK} on ranks" in text
    assert "not run (dry run)" in text and "CPU offload: full_tensor() check not run (dry run)" in text
    assert "OK: every group torch holds carries the configured timeout on every backend (dry run" in text


def test_steady_timeout_after_init_on_every_group(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, report, err = _run(capfd, "--config", config, "--json", "--timeout-minutes-after-init", "10")
    assert code == 0, err[-3000:]
    for rank in report["ranks"]:
        for group in [*rank["rows"], *rank["groups"]]:
            assert group["timeout_minutes"] == {"cpu": 45.0, "cuda": 45.0}, group
            assert group["timeout_minutes_after_init"] == {"cpu": 10.0, "cuda": 10.0}, group
        for row in rank["rows"]:  # as the audit judged each: the start-up value, then the steady one
            assert row["sources"] == row["sources_after_init"] == {"cpu": "configured", "cuda": "configured"}, row


#: The sample of a 128-rank world at dp_replicate 2, tp 2, cp 2, ep 4, worked out by hand. The mesh
#: (dp_replicate 2, dp_shard 16, cp 2, tp 2) in row-major order has strides 64, 4, 2, 1; the MoE mesh
#: (ep_shard 32, ep 4) strides 4, 1. Each axis of size > 1 is seen at its second and last position.
SAMPLE_OF_128 = {
    "0": "first rank",
    "1": "last on tp, second on ep",
    "2": "last on cp",
    "3": "last on ep",
    "4": "second on dp_shard, second on ep_shard",
    "60": "last on dp_shard",
    "64": "last on dp_replicate",
    "124": "last on ep_shard",
    "127": "last rank",
}


def test_the_sample_is_each_axis_at_its_second_and_last_position(
    config: str, capfd: pytest.CaptureFixture[str]
) -> None:
    world = 2 * ALL_RANKS_UP_TO  # above the all-ranks limit: a sample
    flags = ["--config", config, "--json", "--world", str(world), "++policy.dtensor_cfg.dp_replicate_size=2"]
    code, sample, err = _run(capfd, *flags)
    assert code == 0, err[-3000:]
    assert sample["dry_run"]["checked_ranks"] == SAMPLE_OF_128
    assert [rank["rank"] for rank in sample["ranks"]] == sorted(map(int, SAMPLE_OF_128))
    code, full, err = _run(capfd, *flags, "--ranks", "all")
    assert code == 0, err[-3000:]
    assert [rank["rank"] for rank in full["ranks"]] == list(range(world))
    names = {row["group"] for row in _all_rows(full)}
    assert {"dp_replicate", "dp_shard", "cp", "tp", "moe.ep"} <= names


def test_a_world_of_exactly_the_limit_checks_every_rank(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, report, err = _run(capfd, "--config", config, "--json", "--world", str(ALL_RANKS_UP_TO))
    assert code == 0, err[-3000:]
    assert report["dry_run"]["checked_ranks"] == {str(rank): "every rank" for rank in range(ALL_RANKS_UP_TO)}
    assert [rank["rank"] for rank in report["ranks"]] == list(range(ALL_RANKS_UP_TO))


def test_default_world_is_nproc_or_two(capfd: pytest.CaptureFixture[str]) -> None:
    code, text, err = _run(capfd)
    assert code == 0, err[-3000:]
    assert "training world: 2 ranks, from the default of 2 ranks (no training world" in text
    code, report, err = _run(capfd, "--nproc", "4", "--json")
    assert code == 0 and report["world_size"] == 4, err[-3000:]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--world", "10"], "is not divisible by tensor_parallel_size 2 x context_parallel_size 2"),
        (["--world", "1", "~policy.dtensor_cfg.tensor_parallel_size", "~policy.dtensor_cfg.context_parallel_size",
          "~policy.dtensor_cfg.expert_parallel_size"], "policy.dtensor_cfg.cpu_offload is true on a world of 1 rank"),
        (["--world", "16", "++policy.dtensor_cfg.dp_replicate_size=3"], "policy.dtensor_cfg.dp_replicate_size must"),
    ],
    ids=["not-divisible", "offload-on-one-rank", "hsdp"],
)  # fmt: skip
def test_bad_layout_is_bad_input(
    config: str, capfd: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    before = _state()
    code, out, err = _run(capfd, "--config", config, *argv)
    assert code == 2, err[-3000:]
    assert out == "" or "preflight:" not in out
    assert expected in err, err[-3000:]
    assert _state() == before


def test_layers_applied_before_stay_applied(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    if automodel_patch.detect("keep-cpu-backend").verdict is not automodel_patch.Verdict.NEEDED:
        pytest.skip(f"keep-cpu-backend is not needed on nemo-automodel {automodel_patch.installed_version()}")
    automodel_patch.apply("keep-cpu-backend")
    try:
        before = _state()
        code, report, err = _run(capfd, "--config", config, "--json", "--no-patch")
        assert code == 0, err[-3000:]  # the fork fix is in force: the decision forwards the timeout
        assert report["decision"]["action"] == "forward"
        assert _state() == before
    finally:
        automodel_patch.revert("keep-cpu-backend")


def test_a_lost_cpu_half_is_found(config: str, capfd: pytest.CaptureFixture[str], monkeypatch) -> None:
    """NeMo RL without the shim: the timeout forwarded to the genuine ``MeshContext.build`` under CPU offload."""
    from nemo_rl_shim.setup import distributed
    from nemo_rl_shim.setup.decision import Action, Decision

    def forward_as_upstream(timeout_minutes: float | None, *, cpu_offload: bool, **kwargs: Any) -> Decision:
        reason = "forwarded as NeMo RL does, no workaround"
        return Decision(Action.FORWARD, timeout_minutes, cpu_offload, reason, every_group=True)

    monkeypatch.setattr(distributed, "decide", forward_as_upstream)
    code, report, err = _run(capfd, "--config", config, "--json", "--world", "8")
    assert code == 1, err[-3000:]
    assert "no CPU backend under CPU offload (backends cuda:nccl)" in report["problem"], report["problem"]
    lost = {row["group"] for row in _all_rows(report) if row["backends"] == {"cuda": "nccl"}}
    assert {"dp_shard", "tp"} <= lost, lost  # and moe.ep from 0.6.0 (0.5.0 passes the MoE axes no override)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--ranks", "all"], "--ranks chooses the ranks of a dry run: add --dry-run"),
        (["--dry-run", "--ray", "auto"], "--dry-run checks the world in this process, --ray on a cluster"),
    ],
    ids=["ranks-without-dry-run", "dry-run-with-ray"],
)
def test_flags_that_do_not_go_together_are_bad_input(
    config: str, capfd: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    code = main(["preflight", "--config", config, *argv])
    out, err = capfd.readouterr()
    assert (code, out) == (2, ""), err[-3000:]
    assert expected in err, err


def test_flight_recorder_is_off_in_a_dry_run_and_nothing_is_written(
    config: str, capfd: pytest.CaptureFixture[str], tmp_path
) -> None:
    dump_dir = tmp_path / "fr"
    before = _state()
    code, report, err = _run(capfd, "--config", config, "--json", "--world", "8", "--flight-recorder", str(dump_dir))
    assert code == 0, err[-3000:]
    assert report["section"]["nemo_rl_shim"]["flight_recorder"]["enabled"] is True  # what the real run will do
    assert not dump_dir.exists() or not any(dump_dir.iterdir()), sorted(p.name for p in dump_dir.iterdir())
    assert _state() == before


def test_the_header_counts_the_groups_the_table_shows(capfd: pytest.CaptureFixture[str]) -> None:
    """A row per name: where several names are one group (``dp_shard`` spans the world: the default group), the
    header says how many groups and how many rows, and which rows share a group."""
    code, report, err = _run(capfd, "--json")
    assert code == 0, err[-3000:]
    code, text, err = _run(capfd)
    assert code == 0, err[-3000:]
    for rank in report["ranks"]:
        distinct = [row for row in rank["rows"] if row["same_as"] is None]
        assert len(distinct) == rank["process_groups"], rank["rows"]  # every group a row, every row a group or a name
    rows = len(report["ranks"][0]["rows"])
    groups = report["ranks"][0]["process_groups"]
    table = [line for line in text.split("\n\n")[1].splitlines()[1:] if not line.startswith("(")]
    assert len(table) == rows, table
    line = next(line for line in text.splitlines() if line.startswith("process groups per rank"))
    shared = [row["group"] for row in report["ranks"][0]["rows"] if row["same_as"] == "default"]
    assert shared, report["ranks"][0]["rows"]  # on 2 ranks the world-spanning axes are the default group
    assert line.startswith(
        f"process groups per rank (= NCCL communicators it will hold): {groups} on ranks 0-1, shown as the table's "
        f"{rows} rows ({', '.join(shared)} are group default"
    ), line


@pytest.mark.parametrize(
    ("override", "key"),
    [("policy.dtensor_cfg._v2=false", "_v2 is False"), ("++policy.dtensor_cfg.enabled=false", "enabled is false")],
    ids=["v1-worker", "megatron"],
)
def test_a_config_off_the_automodel_path_exits_1_saying_what_was_checked(
    config: str, capfd: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    code, text, err = _run(capfd, "--config", config, "--world", "8", override)
    assert code == 1, err[-3000:]
    assert f"preflight: FAILED: policy.dtensor_cfg.{key}: NeMo RL runs" in err, err[-3000:]
    assert "OK:" not in text, text
    assert (
        "checked the Automodel path, which this config does not run (note above): every group torch holds carries the "
        "configured timeout on every backend (dry run: no collective run)"
    ) in text.splitlines(), text


@pytest.mark.parametrize("key", ["distributed_timeout_minute", "bogus"])
def test_an_unknown_automodel_cfg_key_is_refused_with_json_on_stdout(
    config: str, capfd: pytest.CaptureFixture[str], key: str
) -> None:
    code, report, err = _run(capfd, "--config", config, "--json", f"++policy.automodel_cfg.{key}=45")
    assert code == 2, err[-3000:]
    assert report["ok"] is False and report["exit_code"] == 2, report
    assert report["problem"].startswith(f"policy.automodel_cfg.{key} is not an automodel_cfg key (known: "), report
    assert err.strip().splitlines()[-1] == f"preflight: {report['problem']}"


def test_a_shim_key_in_its_old_place_is_refused_naming_the_new_one_with_json_on_stdout(
    config: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A recipe written before the move: exit 2, one line naming the old key, the new key and the value."""
    old = "++policy.automodel_cfg.distributed_timeout_minutes_after_init=10"
    code, report, err = _run(capfd, "--config", config, "--json", old)
    assert code == 2, err[-3000:]
    assert report["problem"] == (
        "policy.automodel_cfg.distributed_timeout_minutes_after_init has moved to "
        "policy.nemo_rl_shim.distributed_timeout_minutes_after_init (NeMo RL's automodel_cfg holds only "
        "distributed_timeout_minutes and refuses any other key), got 10"
    ), report
    assert err.strip().splitlines()[-1] == f"preflight: {report['problem']}"


def test_a_dry_run_the_machine_cannot_finish_in_time_is_refused_at_once_with_its_estimate(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import time

    start = time.monotonic()
    code, report, err = _run(capfd, "--world", "1000000", "--json")
    elapsed = time.monotonic() - start
    assert code == 2, err[-3000:]
    problem = report["problem"]
    assert problem.startswith(
        "a dry run of 1000000 ranks is refused before it starts: 3 ranks to check at about 5,000,000 new_group calls "
        "each: about 600 s"
    ), problem
    assert problem.endswith("past --timeout-s 300; raise --timeout-s to run it"), problem
    assert elapsed < 60, f"refused after {elapsed:.1f} s: nothing should have run"


def test_ranks_a_dry_run_does_not_reach_by_its_bound_are_named() -> None:
    """Estimated under the bound (2 ranks of 8 calls: under 1 ms), but entering the fake world and one rank's set-up
    take longer than 1 ms: the ranks not reached by then are named, and only those. Through the API, where the
    runner gets the whole ``timeout_s`` (the command's ``--timeout-s`` also covers the reading and the imports)."""
    options = dataclasses.replace(build_options(timeout_s=0.001), dry_run=True)
    report = run_preflight(options).to_json()
    assert report["ok"] is False
    assert report["timed_out"] is True
    unreached = [rank["rank"] for rank in report["ranks"] if not rank["checked"]]
    assert unreached and unreached[-1] == 1, report["ranks"]
    named = "rank 1" if unreached == [1] else "ranks 0-1"
    assert report["problem"] == (
        f"{named} did not finish within 0.001 s (--timeout-s): the dry run plays one rank after another, and did "
        "not reach these"
    ), report["problem"]


def test_bad_flags_with_json_print_json(config: str, capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["preflight", "--config", config, "--ranks", "all", "--json"])
    out, err = capfd.readouterr()
    problem = "--ranks chooses the ranks of a dry run: add --dry-run, or leave --ranks out"
    assert code == 2 and json.loads(out) == {"ok": False, "exit_code": 2, "problem": problem}, err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own errors too
        main(["preflight", "--dry-run", "--json", "--tp", "0"])
    out, err = capfd.readouterr()
    assert exit_info.value.code == 2
    assert json.loads(out) == {
        "ok": False,
        "exit_code": 2,
        "problem": "argument --tp: must be a positive integer, got 0",
    }
