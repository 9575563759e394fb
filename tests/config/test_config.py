"""Validation of ``automodel_cfg``: accepted values, rejected values, and the messages naming them.

Each rejected value is checked through the validator and through
``setup_distributed`` itself, for both the policy and PPO's value model. The
set-up path must fail before any process group exists, so it runs in this
process without ranks.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim import (
    RuntimeConfig,
    automodel_cfg,
    distributed_timeout_minutes,
    distributed_timeout_minutes_after_init,
    patch_automodel,
    setup_distributed,
)

ROLES = ("policy", "value")
KEY = "distributed_timeout_minutes"
AFTER_INIT_KEY = "distributed_timeout_minutes_after_init"

#: Every value a timeout key must reject, with a readable test id.
BAD_MINUTES: dict[str, Any] = {
    "zero": 0,
    "minus-one": -1,
    "minus-half": -0.5,
    "true": True,
    "false": False,
    "nan": math.nan,
    "inf": math.inf,
    "minus-inf": -math.inf,
    "string-45": "45",
    "empty-string": "",
    "list": [45],
    "dict": {"m": 1},
    "too-large-for-timedelta": 1e18,
    "under-a-millisecond": 1e-12,
}
BAD_FLAGS: dict[str, Any] = {"one": 1, "zero": 0, "string-true": "true", "string-false": "false", "list": [True]}

bad_minutes = pytest.mark.parametrize("value", list(BAD_MINUTES.values()), ids=list(BAD_MINUTES))
roles = pytest.mark.parametrize("role", ROLES)


def _section(**automodel: Any) -> dict[str, Any]:
    return {"automodel_cfg": automodel, "dtensor_cfg": {"enabled": True}}


@pytest.fixture
def no_process_group():
    """Assert no default group exists before and after the test."""
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    yield
    assert not dist.is_initialized(), "the test left a process group behind"


# --- accepted values ------------------------------------------------------------------------------------------------


@roles
def test_unset_and_null_mean_torch_defaults(role: str) -> None:
    where = f"{role}.automodel_cfg"
    assert distributed_timeout_minutes({}, where) is None
    assert distributed_timeout_minutes({KEY: None}, where) is None
    assert distributed_timeout_minutes_after_init({}, where) is None
    assert distributed_timeout_minutes_after_init({AFTER_INIT_KEY: None, KEY: 45}, where) is None


@roles
@pytest.mark.parametrize("value", [45, 1, 0.5, 90.25, 10**6], ids=["int-45", "int-1", "half", "float", "million"])
def test_positive_numbers_become_float_minutes(role: str, value: float) -> None:
    minutes = distributed_timeout_minutes({KEY: value}, f"{role}.automodel_cfg")
    assert isinstance(minutes, float)
    assert minutes == float(value)


@pytest.mark.parametrize(
    "config",
    [{}, {"policy": None}, {"policy": {}}, {"policy": {"automodel_cfg": None}}],
    ids=["no-policy", "policy-null", "no-automodel-cfg", "automodel-cfg-null"],
)
def test_missing_blocks_read_as_unset(config: dict[str, Any]) -> None:
    assert automodel_cfg(config, "policy") == {}
    assert distributed_timeout_minutes(automodel_cfg(config, "policy")) is None


def test_value_role_reads_its_own_block() -> None:
    config = {"policy": {"automodel_cfg": {KEY: 30}}, "value": {"automodel_cfg": {KEY: 60}}}
    assert distributed_timeout_minutes(automodel_cfg(config, "policy"), "policy.automodel_cfg") == 30.0
    assert distributed_timeout_minutes(automodel_cfg(config, "value"), "value.automodel_cfg") == 60.0


def test_just_below_the_timedelta_limit_is_accepted() -> None:
    value = datetime.timedelta.max.total_seconds() / 60 * 0.999
    assert distributed_timeout_minutes({KEY: value}) == value
    assert datetime.timedelta(minutes=value) <= datetime.timedelta.max


@pytest.mark.parametrize(
    ("scale", "rule"),
    [
        # max.total_seconds() / 60 rounds up in floating point: timedelta then overflows, reported as ValueError.
        (1.0, "that datetime.timedelta can hold"),
        (1.001, "no larger than 1440000000000 (datetime.timedelta's limit)"),
    ],
    ids=["at-the-limit", "above-the-limit"],
)
def test_at_or_above_the_timedelta_limit_is_a_value_error_never_an_overflow(scale: float, rule: str) -> None:
    value = datetime.timedelta.max.total_seconds() / 60 * scale
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes({KEY: value})
    assert str(raised.value) == f"policy.automodel_cfg.{KEY} must be a positive number of minutes {rule}, got {value!r}"


@roles
@pytest.mark.parametrize("key", [KEY, AFTER_INIT_KEY])
@pytest.mark.parametrize("value", [1e-12, 1e-8, 1e-5], ids=["1e-12", "1e-8", "0.6ms"])
def test_values_under_a_millisecond_are_rejected(role: str, key: str, value: float) -> None:
    """torch keeps timeouts in whole milliseconds: anything shorter would be 0, and every collective would fail."""
    where = f"{role}.automodel_cfg"
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 45, key: value}, where)
    message = str(raised.value)
    assert message.startswith(f"{where}.{key} must be a positive number of minutes, got {value!r}: that is "), message
    assert "whole milliseconds" in message


@pytest.mark.parametrize("value", [2e-5, 1 / 60000], ids=["1.2ms", "1ms"])
def test_every_accepted_value_is_a_positive_timedelta_of_at_least_a_millisecond(value: float) -> None:
    minutes = distributed_timeout_minutes({KEY: value})
    assert minutes == value
    assert datetime.timedelta(minutes=minutes) >= datetime.timedelta(milliseconds=1)


# --- rejected values: the validators --------------------------------------------------------------------------------


def test_message_example_is_exact() -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes({KEY: 0})
    assert (
        str(raised.value)
        == "policy.automodel_cfg.distributed_timeout_minutes must be a positive number of minutes, got 0"
    )


@roles
@bad_minutes
def test_bad_timeout_names_key_and_value(role: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes({KEY: value}, f"{role}.automodel_cfg")
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.{KEY} must be a positive number of minutes"), message
    assert repr(value) in message


@roles
@bad_minutes
def test_bad_after_init_names_key_and_value(role: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 45, AFTER_INIT_KEY: value}, f"{role}.automodel_cfg")
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.{AFTER_INIT_KEY} must be a positive number of minutes"), message
    assert repr(value) in message


@roles
@bad_minutes
def test_after_init_check_also_rejects_a_bad_startup_value(role: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.{KEY} must be"):
        distributed_timeout_minutes_after_init({KEY: value, AFTER_INIT_KEY: 10}, f"{role}.automodel_cfg")


@roles
def test_after_init_above_startup_is_rejected_with_both_values(role: str) -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 30, AFTER_INIT_KEY: 45.5}, f"{role}.automodel_cfg")
    message = str(raised.value)
    assert f"{role}.automodel_cfg.{AFTER_INIT_KEY}" in message
    assert f"{role}.automodel_cfg.{KEY}" in message
    assert "30" in message and "45.5" in message


@roles
@pytest.mark.parametrize(("startup", "steady"), [(30, 30), (30, 5), (None, 5)], ids=["equal", "below", "no-startup"])
def test_after_init_at_or_below_startup_is_accepted(role: str, startup: float | None, steady: float) -> None:
    assert (
        distributed_timeout_minutes_after_init({KEY: startup, AFTER_INIT_KEY: steady}, f"{role}.automodel_cfg")
        == steady
    )


@roles
def test_patch_automodel_defaults_to_true_and_takes_bools(role: str) -> None:
    where = f"{role}.automodel_cfg"
    assert patch_automodel({}, where) is True
    assert patch_automodel({"patch_automodel": True}, where) is True
    assert patch_automodel({"patch_automodel": False}, where) is False


@roles
@pytest.mark.parametrize("value", list(BAD_FLAGS.values()), ids=list(BAD_FLAGS))
def test_patch_automodel_rejects_non_bools(role: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        patch_automodel({"patch_automodel": value}, f"{role}.automodel_cfg")
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.patch_automodel must be true or false"), message
    assert repr(value) in message


# --- rejected values: through setup_distributed, before any process group exists ------------------------------------


@roles
@bad_minutes
def test_setup_distributed_rejects_bad_timeout_before_any_group(role: str, value: Any, no_process_group) -> None:
    with pytest.raises(ValueError) as raised:
        setup_distributed(_section(**{KEY: value}), RuntimeConfig(), role=role)
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.{KEY} must be a positive number of minutes"), message
    assert repr(value) in message
    assert not dist.is_initialized()


@roles
@bad_minutes
def test_setup_distributed_rejects_bad_after_init_before_any_group(role: str, value: Any, no_process_group) -> None:
    with pytest.raises(ValueError) as raised:
        setup_distributed(_section(**{KEY: 45, AFTER_INIT_KEY: value}), RuntimeConfig(cpu_offload=True), role=role)
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.{AFTER_INIT_KEY} must be a positive number of minutes"), message
    assert repr(value) in message
    assert not dist.is_initialized()


@roles
def test_setup_distributed_rejects_after_init_above_startup_before_any_group(role: str, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"{role}\.automodel_cfg\.{AFTER_INIT_KEY} must not exceed .*\(30\), got 45"):
        setup_distributed(_section(**{KEY: 30, AFTER_INIT_KEY: 45}), RuntimeConfig(), role=role)
    assert not dist.is_initialized()


@roles
@pytest.mark.parametrize("value", list(BAD_FLAGS.values()), ids=list(BAD_FLAGS))
def test_setup_distributed_rejects_bad_patch_flag_before_any_group(role: str, value: Any, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.patch_automodel must be true or false"):
        setup_distributed(_section(**{KEY: 45, "patch_automodel": value}), RuntimeConfig(cpu_offload=True), role=role)
    assert not dist.is_initialized()


@roles
@pytest.mark.parametrize("block", [[45], "45", 45], ids=["list", "string", "number"])
def test_setup_distributed_rejects_a_non_mapping_block(role: str, block: Any, no_process_group) -> None:
    with pytest.raises(ValueError) as raised:
        setup_distributed({"automodel_cfg": block}, RuntimeConfig(), role=role)
    assert str(raised.value) == f"{role}.automodel_cfg must be a mapping, got {block!r}"
    assert not dist.is_initialized()


# --- unknown keys -----------------------------------------------------------------------------------------------------

#: Misspelt or made-up keys: dropped silently, each would leave the run at torch's defaults with no word.
UNKNOWN_KEYS: dict[str, Any] = {"distributed_timeout_minute": 45, "bogus": 1, "timeout": 45.0}


@roles
@pytest.mark.parametrize("key", list(UNKNOWN_KEYS))
def test_an_unknown_key_is_refused_naming_the_full_key_its_value_and_the_known_keys(role: str, key: str) -> None:
    from nemo_rl_shim.config import AUTOMODEL_CFG_KEYS

    with pytest.raises(ValueError) as raised:
        automodel_cfg({role: _section(**{KEY: 30, key: UNKNOWN_KEYS[key]})}, role)
    assert str(raised.value) == (
        f"{role}.automodel_cfg.{key} is not an automodel_cfg key (known: {', '.join(AUTOMODEL_CFG_KEYS)}), "
        f"got {UNKNOWN_KEYS[key]!r}"
    )


def test_the_known_keys_are_the_typed_block_s_keys() -> None:
    """One list: the keys the validator accepts are those ``AutomodelConfig`` declares, and each is accepted."""
    from nemo_rl_shim.config import AUTOMODEL_CFG_KEYS, AutomodelConfig

    assert set(AUTOMODEL_CFG_KEYS) == set(AutomodelConfig.__annotations__)
    block = {KEY: 45, AFTER_INIT_KEY: 10, "patch_automodel": True, "flight_recorder": None, "learned_timeouts": None}
    assert set(block) == set(AUTOMODEL_CFG_KEYS)
    assert automodel_cfg({"policy": {"automodel_cfg": block}}) == block


@roles
def test_setup_distributed_refuses_an_unknown_key_before_any_group(role: str, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.distributed_timeout_minute is not an automodel"):
        setup_distributed(_section(distributed_timeout_minute=45), RuntimeConfig(), role=role)
    assert not dist.is_initialized()
