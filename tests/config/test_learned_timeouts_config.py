"""``nemo_rl_shim.learned_timeouts``: accepted and refused values, each refusal naming the full key and the value.

The refusals are also checked through ``setup_distributed`` itself, for the policy and PPO's value
model: it must refuse before any process group exists, so it runs in this process without ranks.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim import RuntimeConfig, setup_distributed
from nemo_rl_shim.config import LEARNED_TIMEOUTS_DEFAULTS, LearnedTimeoutsSettings, learned_timeouts
from tests.harness.paths import REPO_ROOT

CEILING = 45
EXAMPLE = REPO_ROOT / "examples" / "grpo.yaml"

#: A block that must be refused (with the start-up value set), and the words its message must carry.
REFUSED: dict[str, tuple[Any, str]] = {
    "string": ("on", "learned_timeouts must be a mapping (factor, min_steps, floor_minutes) or null, got 'on'"),
    "true": (True, "learned_timeouts must be a mapping"),
    "list": ([5], "learned_timeouts must be a mapping"),
    "unknown-key": (
        {"factr": 5},
        "learned_timeouts.factr is not a learned_timeouts key (known: factor, min_steps, floor_minutes), got 5",
    ),
    "factor-one": ({"factor": 1}, "learned_timeouts.factor must be a number greater than 1"),
    "factor-half": ({"factor": 0.5}, "learned_timeouts.factor must be a number greater than 1"),
    "factor-bool": ({"factor": True}, "learned_timeouts.factor must be a number greater than 1"),
    "factor-string": ({"factor": "5"}, "learned_timeouts.factor must be a number greater than 1"),
    "factor-nan": ({"factor": math.nan}, "learned_timeouts.factor must be a number greater than 1"),
    "factor-inf": ({"factor": math.inf}, "learned_timeouts.factor must be a number greater than 1"),
    "min-steps-zero": ({"min_steps": 0}, "learned_timeouts.min_steps must be a positive integer"),
    "min-steps-float": ({"min_steps": 2.5}, "learned_timeouts.min_steps must be a positive integer"),
    "min-steps-bool": ({"min_steps": True}, "learned_timeouts.min_steps must be a positive integer"),
    "min-steps-string": ({"min_steps": "8"}, "learned_timeouts.min_steps must be a positive integer"),
    "floor-zero": ({"floor_minutes": 0}, "learned_timeouts.floor_minutes must be a positive number of minutes"),
    "floor-bool": ({"floor_minutes": True}, "learned_timeouts.floor_minutes must be a positive number of minutes"),
    "floor-string": ({"floor_minutes": "1"}, "learned_timeouts.floor_minutes must be a positive number of minutes"),
    "floor-above-ceiling": (
        {"floor_minutes": 50},
        "learned_timeouts.floor_minutes must not exceed {where}.automodel_cfg.distributed_timeout_minutes "
        f"({CEILING}), got 50",
    ),
}


def _cfg(block: Any, **others: Any) -> dict[str, Any]:
    """A role's knobs (:func:`nemo_rl_shim.config.knobs`) with ``learned_timeouts`` set to ``block``."""
    return {"distributed_timeout_minutes": CEILING, "learned_timeouts": block, **others}


def _section(block: Any, **others: Any) -> dict[str, Any]:
    """A role's section with ``learned_timeouts`` set to ``block``, each key in its block."""
    shim = {"learned_timeouts": block, **others}
    return {"automodel_cfg": {"distributed_timeout_minutes": CEILING}, "nemo_rl_shim": shim, "dtensor_cfg": {}}


@pytest.fixture
def no_process_group():
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    yield
    assert not dist.is_initialized(), "the test left a process group behind"


def test_absent_or_null_is_off():
    assert learned_timeouts({"distributed_timeout_minutes": CEILING}) is None
    assert learned_timeouts(_cfg(None)) is None


def test_an_empty_mapping_is_on_with_every_default():
    assert learned_timeouts(_cfg({})) == LearnedTimeoutsSettings(CEILING, 5.0, 8, 1.0)
    assert LEARNED_TIMEOUTS_DEFAULTS == {"factor": 5.0, "min_steps": 8, "floor_minutes": 1.0}


def test_values_given_are_kept_and_nulls_take_the_default():
    settings = learned_timeouts(_cfg({"factor": 3, "min_steps": 20, "floor_minutes": 2.5}))
    assert settings == LearnedTimeoutsSettings(CEILING, 3.0, 20, 2.5)
    assert isinstance(settings.factor, float)
    assert learned_timeouts(_cfg({"factor": None, "min_steps": None})) == LearnedTimeoutsSettings(CEILING)


def test_the_default_floor_comes_down_to_a_lower_ceiling_but_a_given_one_is_refused():
    cfg = {"distributed_timeout_minutes": 0.5, "learned_timeouts": {}}
    assert learned_timeouts(cfg).floor_minutes == 0.5
    with pytest.raises(ValueError, match=r"floor_minutes must not exceed .*\(0\.5\), got 1"):
        learned_timeouts({**cfg, "learned_timeouts": {"floor_minutes": 1}})


@pytest.mark.parametrize("name", list(REFUSED))
def test_bad_values_are_refused_naming_the_full_key_and_the_value(name):
    block, words = REFUSED[name]
    where = "value"
    with pytest.raises(ValueError) as caught:
        learned_timeouts(_cfg(block), where)
    assert f"{where}.nemo_rl_shim.{words.format(where=where)}" in str(caught.value)


def test_it_needs_the_start_up_value_as_its_ceiling():
    with pytest.raises(ValueError) as caught:
        learned_timeouts({"learned_timeouts": {}})
    assert str(caught.value) == (
        "policy.nemo_rl_shim.learned_timeouts needs policy.automodel_cfg.distributed_timeout_minutes "
        "(the start-up value, and the most a learned value may be), got None"
    )


def test_with_a_hand_set_steady_value_it_says_to_choose_one():
    with pytest.raises(ValueError) as caught:
        learned_timeouts(_cfg({}, distributed_timeout_minutes_after_init=10))
    message = str(caught.value)
    assert "policy.nemo_rl_shim.learned_timeouts and policy.nemo_rl_shim.distributed_timeout_minutes_after_init" in (
        message
    )
    assert "choose one" in message and "(10)" in message


@pytest.mark.parametrize("role", ["policy", "value"])
@pytest.mark.parametrize("name", ["factor-one", "unknown-key", "min-steps-zero"])
def test_setup_distributed_refuses_before_any_process_group(role, name, no_process_group):
    block, words = REFUSED[name]
    with pytest.raises(ValueError) as caught:
        setup_distributed(_section(block), RuntimeConfig(), role=role)
    assert str(caught.value).startswith(f"{role}.nemo_rl_shim.{words.split(' ')[0]}"), caught.value
    with pytest.raises(ValueError, match="choose one"):
        setup_distributed(
            _section({}, distributed_timeout_minutes_after_init=5),
            RuntimeConfig(),
            role=role,
        )


def test_preflight_refuses_it_before_any_rank():
    from nemo_rl_shim.cli.preflight.options import build_options

    overrides = [
        "++policy.automodel_cfg.distributed_timeout_minutes=45",
        "++policy.nemo_rl_shim.distributed_timeout_minutes_after_init=null",
    ]
    with pytest.raises(ValueError) as caught:
        build_options(str(EXAMPLE), recipe_overrides=[*overrides, "++policy.nemo_rl_shim.learned_timeouts.factor=1"])
    assert str(caught.value).startswith("policy.nemo_rl_shim.learned_timeouts.factor must be a number greater than 1")
    build_options(str(EXAMPLE), recipe_overrides=[*overrides, "++policy.nemo_rl_shim.learned_timeouts.factor=3"])
