"""The training world a NeMo RL config asks for (``cli.nemo_rl.training_world``), and how preflight uses it.

NeMo RL's rule (``grpo.setup`` / ``ppo.setup``): colocated generation trains on the whole
cluster; non-colocated generation takes GPUs off one node, or whole nodes; a reward-model
environment takes its share. The configs are dicts written here. In-process, no ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.cli import main
from nemo_rl_shim.cli.nemo_rl.training_world import World, training_world, world_from_flag
from nemo_rl_shim.cli.preflight.options import WorldTooLarge, build_options, ranks_for_world
from nemo_rl_shim.cli.preflight.report import PreflightReport, render_report

__all__: list[str] = []


def _config(nodes: int, gpus: int, generation: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {"dtensor_cfg": {"cpu_offload": True}}
    if generation is not None:
        policy["generation"] = generation
    return {"cluster": {"num_nodes": nodes, "gpus_per_node": gpus}, "policy": policy, **extra}


def _non_colocated(gpus: int | None, nodes: int | None) -> dict[str, Any]:
    return {"colocated": {"enabled": False, "resources": {"gpus_per_node": gpus, "num_nodes": nodes}}}


_COLOCATED = {"colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}}}


def test_colocated_generation_trains_on_the_whole_cluster() -> None:
    assert training_world(_config(2, 8, _COLOCATED)) == World(
        16, "cluster.num_nodes 2 x cluster.gpus_per_node 8 = 16 (colocated generation)", 2, 8
    )


def test_no_generation_section_trains_on_the_whole_cluster() -> None:
    world = training_world(_config(4, 4))
    assert (world.size, world.source) == (
        16,
        "cluster.num_nodes 4 x cluster.gpus_per_node 4 = 16 (no generation section)",
    )


def test_non_colocated_on_one_node_takes_gpus_off_it() -> None:
    world = training_world(_config(1, 8, _non_colocated(2, None)))
    assert world == World(
        6, "cluster.gpus_per_node 8 less 2 generation GPUs on 1 node (non-colocated generation) = 6", 1, 6, 2
    )


def test_non_colocated_on_several_nodes_takes_whole_nodes() -> None:
    world = training_world(_config(4, 8, _non_colocated(8, 1)))
    assert world == World(
        24,
        "(cluster.num_nodes 4 less 1 generation node = 3) x cluster.gpus_per_node 8 (non-colocated generation) = 24",
        3,
        8,
        8,
    )


@pytest.mark.parametrize(
    ("nodes", "resources", "message"),
    [
        (1, (None, None), "policy.generation.colocated.resources.gpus_per_node must be set to a positive integer"),
        (1, (2, 2), "policy.generation.colocated.resources.num_nodes must be 1 or null"),
        (
            1,
            (8, 1),
            "no GPUs left for training: cluster.gpus_per_node 8 - policy.generation.colocated.resources."
            "gpus_per_node 8 = 0",
        ),
        (2, (4, 1), "policy.generation.colocated.resources.gpus_per_node must equal cluster.gpus_per_node (8)"),
        (2, (8, None), "policy.generation.colocated.resources.num_nodes must be a positive integer"),
        (2, (8, 2), "no nodes left for training: 2 policy nodes - policy.generation.colocated.resources.num_nodes 2"),
    ],
    ids=["one-node-no-gpus", "one-node-two-nodes", "one-node-all-gpus", "nodes-partial", "nodes-null", "nodes-all"],
)
def test_impossible_splits_are_refused_as_nemo_rl_refuses_them(
    nodes: int, resources: tuple[int | None, int | None], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        training_world(_config(nodes, 8, _non_colocated(*resources)))


def _reward_model(nodes: int | None, gpus: int) -> dict[str, Any]:
    return {
        "data": {"train": {"env_name": "reward_model"}},
        "env": {"reward_model": {"resources": {"num_nodes": nodes, "gpus_per_node": gpus}}},
    }


def test_a_reward_model_takes_gpus_on_one_node_and_nodes_on_several() -> None:
    one = training_world(_config(1, 8, _COLOCATED, **_reward_model(None, 2)))
    assert (one.size, one.reward_model_gpus) == (6, 2)
    assert one.source == "cluster.gpus_per_node 8 less 2 reward-model GPUs on 1 node (colocated generation) = 6"
    several = training_world(_config(3, 8, _COLOCATED, **_reward_model(1, 8)))
    assert several.size == 16
    assert several.source == (
        "(cluster.num_nodes 3 less 1 reward-model node = 2) x cluster.gpus_per_node 8 (colocated generation) = 16"
    )


def test_non_colocated_on_one_node_takes_the_reward_model_gpus_off_it_too() -> None:
    world = training_world(_config(1, 8, _non_colocated(2, None), **_reward_model(None, 2)))
    source = (
        "cluster.gpus_per_node 8 less 2 generation GPUs and 2 reward-model GPUs on 1 node "
        "(non-colocated generation) = 4"
    )
    assert world == World(4, source, 1, 4, 2, 2)


def test_non_colocated_on_several_nodes_takes_the_reward_model_nodes_off_too() -> None:
    world = training_world(_config(4, 8, _non_colocated(8, 1), **_reward_model(1, 8)))
    source = (
        "(cluster.num_nodes 4 less 1 reward-model node less 1 generation node = 2) x cluster.gpus_per_node 8 "
        "(non-colocated generation) = 16"
    )
    assert world == World(16, source, 2, 8, 8, 0)


def test_value_role_shares_the_policy_training_cluster() -> None:
    config = _config(2, 8, _non_colocated(8, 1))
    assert training_world(config, "value") == training_world(config, "policy")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"policy": {}}, "the config has no cluster section"),
        ({"cluster": {"num_nodes": 0, "gpus_per_node": 8}}, "cluster.num_nodes must be a positive integer, got 0"),
        ({"cluster": {"num_nodes": 1, "gpus_per_node": "8"}}, "cluster.gpus_per_node must be a positive integer"),
        (
            {"cluster": {"num_nodes": 2, "gpus_per_node": 8},
             "on_policy_distillation": {"enabled": True, "non_colocated_teachers": {"enabled": True}}},
            "not mirrored here: give the training world with --world N",
        ),
    ],
    ids=["no-cluster", "zero-nodes", "string-gpus", "opd-teachers"],
)  # fmt: skip
def test_what_the_rule_cannot_give_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        training_world(config)


# --- in the options and the report ----------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


_TWO_NODES = "cluster: {num_nodes: 2, gpus_per_node: 8}\npolicy:\n  dtensor_cfg: {cpu_offload: true}\n"


def test_options_carry_the_world_and_where_it_came_from(tmp_path: Path) -> None:
    options = build_options(_yaml(tmp_path, _TWO_NODES))
    assert (options.world_size, options.world_source) == (
        16,
        "cluster.num_nodes 2 x cluster.gpus_per_node 8 = 16 (no generation section)",
    )
    assert (build_options().world_size, build_options().world_source) == (None, None)
    no_cluster = build_options(_yaml(tmp_path, "policy: {dtensor_cfg: {cpu_offload: true}}\n"))
    assert no_cluster.world_size is None


def test_world_flag_wins_over_the_config(tmp_path: Path) -> None:
    options = build_options(_yaml(tmp_path, _TWO_NODES), world=64)
    assert (options.world_size, options.world_source) == (64, "--world 64")
    assert build_options(world=4).world_source == "--world 4"
    with pytest.raises(ValueError, match="--world must be a positive integer, got 0"):
        world_from_flag(0)


def test_world_overrides_reach_the_rule(tmp_path: Path) -> None:
    options = build_options(_yaml(tmp_path, _TWO_NODES), recipe_overrides=["cluster.num_nodes=4"])
    assert options.world_size == 32


def test_report_says_where_the_world_came_from(tmp_path: Path) -> None:
    options = build_options(_yaml(tmp_path, _TWO_NODES), nproc=2)
    report = PreflightReport("spawn", 2, options, [], 0.0)
    text = render_report(report)
    assert (
        "training world: 16 ranks, from cluster.num_nodes 2 x cluster.gpus_per_node 8 = 16 (no generation section); "
        "this run checks 2 ranks"
    ) in text.splitlines()
    assert report.to_json()["training_world"] == 16
    assert report.to_json()["training_world_source"].startswith("cluster.num_nodes 2")
    same = render_report(PreflightReport("spawn", 4, build_options(world=4), [], 0.0))
    assert "training world: 4 ranks, from --world 4" in same.splitlines()


def test_ranks_for_world_runs_a_world_that_fits_and_refuses_one_that_does_not(tmp_path: Path) -> None:
    path = _yaml(tmp_path, _TWO_NODES)
    assert ranks_for_world(build_options(path), 16, "here") == 16
    assert ranks_for_world(build_options(path, nproc=2), 2, "here") == 2  # --nproc: the user chose
    assert ranks_for_world(build_options(world=1), 8, "here") == 2  # at least MIN_RANKS
    assert ranks_for_world(build_options(), 8, "here") is None  # no world: the runner's default
    with pytest.raises(WorldTooLarge, match=r"^the config asks for 16 training ranks, from .*; the Ray cluster"):
        ranks_for_world(build_options(path), 8, "the Ray cluster can place 8 ranks")


def test_a_world_this_machine_cannot_hold_exits_2_pointing_to_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4,096 ranks: more than any machine this runs on has GPUs, so no rank is started.
    config = _yaml(tmp_path, "cluster: {num_nodes: 512, gpus_per_node: 8}\npolicy: {dtensor_cfg: {}}\n")
    assert main(["preflight", "--config", config]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    line = captured.err.strip()
    assert line.startswith(
        "preflight: the config asks for 4096 training ranks, from cluster.num_nodes 512 x cluster.gpus_per_node 8 = "
        "4096 (no generation section); this machine can run "
    ), line
    assert "check that layout with --dry-run, or run on the cluster with --ray" in line


def test_world_flag_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "--world", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer, got 0" in capsys.readouterr().err
