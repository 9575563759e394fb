"""Validation of ``automodel_cfg`` and ``nemo_rl_shim``: accepted values, rejected values, the messages naming them.

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
    knobs,
    patch_automodel,
    setup_distributed,
    shim_cfg,
)
from nemo_rl_shim.config import AUTOMODEL_CFG_KEYS, SHIM_CFG_KEYS, AutomodelConfig, ShimConfig, full_key

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


def _section(**knobs: Any) -> dict[str, Any]:
    """A role's section with ``knobs`` each in its block: this package's keys in ``nemo_rl_shim``, every other
    (NeMo RL's key, and the unknown ones tests pass) in ``automodel_cfg``."""
    shim = {key: value for key, value in knobs.items() if key in SHIM_CFG_KEYS}
    automodel = {key: value for key, value in knobs.items() if key not in SHIM_CFG_KEYS}
    return {"automodel_cfg": automodel, "nemo_rl_shim": shim, "dtensor_cfg": {"enabled": True}}


@pytest.fixture
def no_process_group():
    """Assert no default group exists before and after the test."""
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    yield
    assert not dist.is_initialized(), "the test left a process group behind"


# --- accepted values ------------------------------------------------------------------------------------------------


@roles
def test_unset_and_null_mean_torch_defaults(role: str) -> None:
    where = role
    assert distributed_timeout_minutes({}, where) is None
    assert distributed_timeout_minutes({KEY: None}, where) is None
    assert distributed_timeout_minutes_after_init({}, where) is None
    assert distributed_timeout_minutes_after_init({AFTER_INIT_KEY: None, KEY: 45}, where) is None


@roles
@pytest.mark.parametrize("value", [45, 1, 0.5, 90.25, 10**6], ids=["int-45", "int-1", "half", "float", "million"])
def test_positive_numbers_become_float_minutes(role: str, value: float) -> None:
    minutes = distributed_timeout_minutes({KEY: value}, role)
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
    assert distributed_timeout_minutes(automodel_cfg(config, "policy"), "policy") == 30.0
    assert distributed_timeout_minutes(automodel_cfg(config, "value"), "value") == 60.0


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
    where = role
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 45, key: value}, where)
    message = str(raised.value)
    assert message.startswith(
        f"{full_key(where, key)} must be a positive number of minutes, got {value!r}: that is "
    ), message
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
        distributed_timeout_minutes({KEY: value}, role)
    message = str(raised.value)
    assert message.startswith(f"{role}.automodel_cfg.{KEY} must be a positive number of minutes"), message
    assert repr(value) in message


@roles
@bad_minutes
def test_bad_after_init_names_key_and_value(role: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 45, AFTER_INIT_KEY: value}, role)
    message = str(raised.value)
    assert message.startswith(f"{role}.nemo_rl_shim.{AFTER_INIT_KEY} must be a positive number of minutes"), message
    assert repr(value) in message


@roles
@bad_minutes
def test_after_init_check_also_rejects_a_bad_startup_value(role: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.{KEY} must be"):
        distributed_timeout_minutes_after_init({KEY: value, AFTER_INIT_KEY: 10}, role)


@roles
def test_after_init_above_startup_is_rejected_with_both_values(role: str) -> None:
    with pytest.raises(ValueError) as raised:
        distributed_timeout_minutes_after_init({KEY: 30, AFTER_INIT_KEY: 45.5}, role)
    message = str(raised.value)
    assert f"{role}.nemo_rl_shim.{AFTER_INIT_KEY}" in message
    assert f"{role}.automodel_cfg.{KEY}" in message
    assert "30" in message and "45.5" in message


@roles
@pytest.mark.parametrize(("startup", "steady"), [(30, 30), (30, 5), (None, 5)], ids=["equal", "below", "no-startup"])
def test_after_init_at_or_below_startup_is_accepted(role: str, startup: float | None, steady: float) -> None:
    assert distributed_timeout_minutes_after_init({KEY: startup, AFTER_INIT_KEY: steady}, role) == steady


@roles
def test_patch_automodel_defaults_to_true_and_takes_bools(role: str) -> None:
    where = role
    assert patch_automodel({}, where) is True
    assert patch_automodel({"patch_automodel": True}, where) is True
    assert patch_automodel({"patch_automodel": False}, where) is False


@roles
@pytest.mark.parametrize("value", list(BAD_FLAGS.values()), ids=list(BAD_FLAGS))
def test_patch_automodel_rejects_non_bools(role: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        patch_automodel({"patch_automodel": value}, role)
    message = str(raised.value)
    assert message.startswith(f"{role}.nemo_rl_shim.patch_automodel must be true or false"), message
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
    assert message.startswith(f"{role}.nemo_rl_shim.{AFTER_INIT_KEY} must be a positive number of minutes"), message
    assert repr(value) in message
    assert not dist.is_initialized()


@roles
def test_setup_distributed_rejects_after_init_above_startup_before_any_group(role: str, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"{role}\.nemo_rl_shim\.{AFTER_INIT_KEY} must not exceed .*\(30\), got 45"):
        setup_distributed(_section(**{KEY: 30, AFTER_INIT_KEY: 45}), RuntimeConfig(), role=role)
    assert not dist.is_initialized()


@roles
@pytest.mark.parametrize("value", list(BAD_FLAGS.values()), ids=list(BAD_FLAGS))
def test_setup_distributed_rejects_bad_patch_flag_before_any_group(role: str, value: Any, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.nemo_rl_shim\.patch_automodel must be true or false"):
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
    with pytest.raises(ValueError) as raised:
        automodel_cfg({role: _section(**{KEY: 30, key: UNKNOWN_KEYS[key]})}, role)
    assert str(raised.value) == (
        f"{role}.automodel_cfg.{key} is not an automodel_cfg key (known: {', '.join(AUTOMODEL_CFG_KEYS)}; "
        f"this package's own keys go in {role}.nemo_rl_shim), got {UNKNOWN_KEYS[key]!r}"
    )


def test_the_known_keys_are_the_typed_blocks_keys() -> None:
    """One list per block: the keys each validator accepts are those its TypedDict declares, each is accepted, and
    ``automodel_cfg`` holds NeMo RL's one key only (its ``AutomodelConfig`` is ``extra="forbid"``)."""
    assert AUTOMODEL_CFG_KEYS == tuple(AutomodelConfig.__annotations__) == (KEY,)
    assert set(SHIM_CFG_KEYS) == set(ShimConfig.__annotations__)
    assert not set(AUTOMODEL_CFG_KEYS) & set(SHIM_CFG_KEYS)
    shim = {AFTER_INIT_KEY: 10, "patch_automodel": True, "flight_recorder": None, "learned_timeouts": None}
    assert set(shim) == set(SHIM_CFG_KEYS)
    config = {"policy": {"automodel_cfg": {KEY: 45}, "nemo_rl_shim": shim}}
    assert automodel_cfg(config) == {KEY: 45}
    assert shim_cfg(config) == shim
    assert knobs(config) == {KEY: 45, **shim}


# --- the shim's keys in their old place, automodel_cfg ------------------------------------------------------------

#: A valid value of each of this package's keys, as a recipe written before the move would carry it.
MOVED_VALUES: dict[str, Any] = {
    AFTER_INIT_KEY: 10,
    "patch_automodel": False,
    "flight_recorder": {"enabled": False},
    "learned_timeouts": None,
}


@roles
@pytest.mark.parametrize("key", list(MOVED_VALUES))
def test_a_shim_key_in_automodel_cfg_is_refused_naming_the_old_and_new_key_and_its_value(role: str, key: str) -> None:
    """Patched NeMo RL refuses it there, in the driver; the shim refuses it too, in one line that says where it went,
    whatever its value (null included: the key's presence is the mistake)."""
    config = {role: {"automodel_cfg": {KEY: 30, key: MOVED_VALUES[key]}}}
    with pytest.raises(ValueError) as raised:
        automodel_cfg(config, role)
    message = str(raised.value)
    assert message == (
        f"{role}.automodel_cfg.{key} has moved to {role}.nemo_rl_shim.{key} (NeMo RL's automodel_cfg holds only "
        f"{KEY} and refuses any other key), got {MOVED_VALUES[key]!r}"
    )
    assert "\n" not in message
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.{key} has moved to {role}\.nemo_rl_shim\.{key} "):
        knobs(config, role)


@roles
@pytest.mark.parametrize("key", list(MOVED_VALUES))
def test_setup_distributed_refuses_a_shim_key_in_automodel_cfg_before_any_group(
    role: str, key: str, no_process_group
) -> None:
    section = {"automodel_cfg": {KEY: 30, key: MOVED_VALUES[key]}, "dtensor_cfg": {"enabled": True}}
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.{key} has moved to {role}\.nemo_rl_shim\.{key} "):
        setup_distributed(section, RuntimeConfig(cpu_offload=True), role=role)
    assert not dist.is_initialized()


@roles
def test_a_key_in_both_places_is_refused_at_the_old_one(role: str) -> None:
    """No rule for which one wins: the old place is refused even when the new one holds the same key."""
    config = {role: {"automodel_cfg": {"patch_automodel": True}, "nemo_rl_shim": {"patch_automodel": False}}}
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.patch_automodel has moved"):
        knobs(config, role)


# --- the nemo_rl_shim block -----------------------------------------------------------------------------------------


@roles
@pytest.mark.parametrize("key", list(UNKNOWN_KEYS))
def test_an_unknown_shim_key_is_refused_naming_the_full_key_its_value_and_the_known_keys(role: str, key: str) -> None:
    with pytest.raises(ValueError) as raised:
        shim_cfg({role: {"nemo_rl_shim": {key: UNKNOWN_KEYS[key]}}}, role)
    assert str(raised.value) == (
        f"{role}.nemo_rl_shim.{key} is not a nemo_rl_shim key (known: {', '.join(SHIM_CFG_KEYS)}), "
        f"got {UNKNOWN_KEYS[key]!r}"
    )


@roles
def test_the_upstream_key_in_nemo_rl_shim_is_pointed_back_to_automodel_cfg(role: str) -> None:
    with pytest.raises(ValueError) as raised:
        knobs({role: {"nemo_rl_shim": {KEY: 45}}}, role)
    assert str(raised.value) == (
        f"{role}.nemo_rl_shim.{KEY} is not a nemo_rl_shim key (known: {', '.join(SHIM_CFG_KEYS)}) (it is NeMo RL's "
        f"key: set {role}.automodel_cfg.{KEY}), got 45"
    )


@roles
@pytest.mark.parametrize("block", [[45], "45", 45], ids=["list", "string", "number"])
def test_setup_distributed_rejects_a_non_mapping_shim_block(role: str, block: Any, no_process_group) -> None:
    with pytest.raises(ValueError) as raised:
        setup_distributed({"nemo_rl_shim": block}, RuntimeConfig(), role=role)
    assert str(raised.value) == f"{role}.nemo_rl_shim must be a mapping, got {block!r}"
    assert not dist.is_initialized()


@roles
def test_full_key_names_each_key_in_its_block(role: str) -> None:
    assert full_key(role, KEY) == f"{role}.automodel_cfg.{KEY}"
    for key in SHIM_CFG_KEYS:
        assert full_key(role, key) == f"{role}.nemo_rl_shim.{key}"


@roles
def test_setup_distributed_refuses_an_unknown_key_before_any_group(role: str, no_process_group) -> None:
    with pytest.raises(ValueError, match=rf"^{role}\.automodel_cfg\.distributed_timeout_minute is not an automodel"):
        setup_distributed(_section(distributed_timeout_minute=45), RuntimeConfig(), role=role)
    assert not dist.is_initialized()
