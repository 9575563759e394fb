"""The example configs: each one loads, documents the timeout keys, and validates.

Every role (``policy``, and ``value`` for PPO) must carry ``automodel_cfg.distributed_timeout_minutes`` and
``nemo_rl_shim.distributed_timeout_minutes_after_init`` explicitly (null, with a comment above), so a user editing
an example sees the knob, and each key in the block that holds it. No process group is created here.
"""

from __future__ import annotations

import pytest

from nemo_rl_shim import (
    distributed_timeout_minutes,
    distributed_timeout_minutes_after_init,
    knobs,
    patch_automodel,
)
from nemo_rl_shim.cli.nemo_rl import load_recipe
from nemo_rl_shim.setup.distributed import ParallelSizes, parallel_sizes
from tests.harness.paths import REPO_ROOT

EXAMPLES_DIR = REPO_ROOT / "examples"
EXPECTED = ("dpo", "grpo", "ppo", "sft")
#: Each timeout key and the block it belongs in: NeMo RL's ``automodel_cfg``, or this package's ``nemo_rl_shim``.
TIMEOUT_KEYS = {
    "distributed_timeout_minutes": "automodel_cfg",
    "distributed_timeout_minutes_after_init": "nemo_rl_shim",
}


def _roles(config: dict) -> list[str]:
    return [role for role in ("policy", "value") if role in config]


def test_the_four_examples_exist() -> None:
    found = sorted(path.stem for path in EXAMPLES_DIR.glob("*.yaml"))
    assert found == sorted(EXPECTED), f"examples in {EXAMPLES_DIR}: {found}"


@pytest.mark.parametrize("name", EXPECTED)
def test_example_has_its_algorithm_section_and_roles(name: str) -> None:
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    assert isinstance(config.get(name), dict), f"{name}.yaml has no {name}: section"
    assert _roles(config) == (["policy", "value"] if name == "ppo" else ["policy"])


@pytest.mark.parametrize("name", EXPECTED)
def test_every_role_carries_the_timeout_keys_as_null_in_their_blocks(name: str) -> None:
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        for key, block_name in TIMEOUT_KEYS.items():
            block = config[role].get(block_name)
            assert isinstance(block, dict), f"{name}.yaml: {role}.{block_name} is missing or not a mapping"
            assert key in block, f"{name}.yaml: {role}.{block_name} has no {key}"
            assert block[key] is None, f"{name}.yaml: {role}.{block_name}.{key} is {block[key]!r}, expected null"
        assert list(config[role]["automodel_cfg"]) == ["distributed_timeout_minutes"], (
            f"{name}.yaml: {role}.automodel_cfg holds {sorted(config[role]['automodel_cfg'])}: NeMo RL's "
            "AutomodelConfig forbids every key but distributed_timeout_minutes"
        )


@pytest.mark.parametrize("name", EXPECTED)
def test_every_timeout_key_has_a_comment_line_above_it(name: str) -> None:
    lines = (EXAMPLES_DIR / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    keyed = [i for i, line in enumerate(lines) if line.strip().startswith(tuple(TIMEOUT_KEYS))]
    assert len(keyed) == len(TIMEOUT_KEYS) * (2 if name == "ppo" else 1)
    for i in keyed:
        assert lines[i - 1].strip().startswith("#"), f"{name}.yaml line {i + 1} ({lines[i].strip()}) has no comment"


@pytest.mark.parametrize("name", EXPECTED)
def test_example_validates(name: str) -> None:
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        block = knobs(config, role)
        assert distributed_timeout_minutes(block, role) is None
        assert distributed_timeout_minutes_after_init(block, role) is None
        assert patch_automodel(block, role) is True
        dtensor_cfg = config[role]["dtensor_cfg"]
        assert dtensor_cfg["enabled"] is True
        assert isinstance(dtensor_cfg["cpu_offload"], bool)
        assert isinstance(parallel_sizes(dtensor_cfg, f"{role}.dtensor_cfg"), ParallelSizes)


@pytest.mark.parametrize("name", EXPECTED)
def test_example_with_a_timeout_set_validates(name: str) -> None:
    """What a user does with the example: set the key. 45 then 15 after init is accepted as floats."""
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        config[role]["automodel_cfg"]["distributed_timeout_minutes"] = 45
        config[role]["nemo_rl_shim"]["distributed_timeout_minutes_after_init"] = 15
        block = knobs(config, role)
        assert distributed_timeout_minutes(block, role) == 45.0
        assert distributed_timeout_minutes_after_init(block, role) == 15.0
