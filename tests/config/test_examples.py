"""The example configs: each one loads, documents the timeout keys, and validates.

Every ``automodel_cfg`` block (``policy``, and ``value`` for PPO) must carry
``distributed_timeout_minutes`` and ``distributed_timeout_minutes_after_init``
explicitly (null, with a comment above), so a user editing an example sees the
knob. No process group is created here.
"""

from __future__ import annotations

import pytest

from nemo_rl_shim import (
    automodel_cfg,
    distributed_timeout_minutes,
    distributed_timeout_minutes_after_init,
    patch_automodel,
)
from nemo_rl_shim.cli.nemo_rl import load_recipe
from nemo_rl_shim.setup.distributed import ParallelSizes, parallel_sizes
from tests.harness.paths import REPO_ROOT

EXAMPLES_DIR = REPO_ROOT / "examples"
EXPECTED = ("dpo", "grpo", "ppo", "sft")
TIMEOUT_KEYS = ("distributed_timeout_minutes", "distributed_timeout_minutes_after_init")


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
def test_every_automodel_cfg_carries_the_timeout_keys_as_null(name: str) -> None:
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        block = config[role].get("automodel_cfg")
        assert isinstance(block, dict), f"{name}.yaml: {role}.automodel_cfg is missing or not a mapping"
        for key in TIMEOUT_KEYS:
            assert key in block, f"{name}.yaml: {role}.automodel_cfg has no {key}"
            assert block[key] is None, f"{name}.yaml: {role}.automodel_cfg.{key} is {block[key]!r}, expected null"


@pytest.mark.parametrize("name", EXPECTED)
def test_every_timeout_key_has_a_comment_line_above_it(name: str) -> None:
    lines = (EXAMPLES_DIR / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    keyed = [i for i, line in enumerate(lines) if line.strip().startswith(TIMEOUT_KEYS)]
    assert len(keyed) == len(TIMEOUT_KEYS) * (2 if name == "ppo" else 1)
    for i in keyed:
        assert lines[i - 1].strip().startswith("#"), f"{name}.yaml line {i + 1} ({lines[i].strip()}) has no comment"


@pytest.mark.parametrize("name", EXPECTED)
def test_example_validates(name: str) -> None:
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        where = f"{role}.automodel_cfg"
        block = automodel_cfg(config, role)
        assert distributed_timeout_minutes(block, where) is None
        assert distributed_timeout_minutes_after_init(block, where) is None
        assert patch_automodel(block, where) is True
        dtensor_cfg = config[role]["dtensor_cfg"]
        assert dtensor_cfg["enabled"] is True
        assert isinstance(dtensor_cfg["cpu_offload"], bool)
        assert isinstance(parallel_sizes(dtensor_cfg, f"{role}.dtensor_cfg"), ParallelSizes)


@pytest.mark.parametrize("name", EXPECTED)
def test_example_with_a_timeout_set_validates(name: str) -> None:
    """What a user does with the example: set the key. 45 then 15 after init is accepted as floats."""
    config = load_recipe(EXAMPLES_DIR / f"{name}.yaml")
    for role in _roles(config):
        config[role]["automodel_cfg"].update(distributed_timeout_minutes=45, distributed_timeout_minutes_after_init=15)
        block, where = automodel_cfg(config, role), f"{role}.automodel_cfg"
        assert distributed_timeout_minutes(block, where) == 45.0
        assert distributed_timeout_minutes_after_init(block, where) == 15.0
