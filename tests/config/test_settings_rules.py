"""``automodel_cfg``'s and ``nemo_rl_shim``'s checks at their edges (:mod:`nemo_rl_shim.config.settings`), each on
the value built for it.

The keys accepted and refused, and through ``setup_distributed``: tests/config/test_config.py,
test_flight_recorder_config.py and test_learned_timeouts_config.py.
"""

from __future__ import annotations

import math

import pytest

from nemo_rl_shim.config.settings import (
    automodel_cfg,
    flight_recorder,
    knobs,
    learned_timeouts,
    minutes_timedelta,
    shim_cfg,
)

pytestmark = [pytest.mark.every_lane]


def test_a_role_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^policy must be a mapping, got 5$"):
        automodel_cfg({"policy": 5})
    assert automodel_cfg({"policy": None}) == {}
    with pytest.raises(ValueError, match=r"^value must be a mapping, got \[1\]$"):
        shim_cfg({"value": [1]}, "value")
    assert shim_cfg({"policy": None}) == {} == shim_cfg({"policy": {"nemo_rl_shim": None}})


def test_a_moved_key_is_named_as_moved_even_beside_an_unknown_one() -> None:
    """The move is the more useful word: it is said first, whatever the keys' order."""
    for block in ({"aaa": 1, "patch_automodel": True}, {"patch_automodel": True, "aaa": 1}):
        with pytest.raises(ValueError, match=r"^policy\.automodel_cfg\.patch_automodel has moved to "):
            automodel_cfg({"policy": {"automodel_cfg": block}})


def test_knobs_checks_both_blocks_and_keeps_each_value() -> None:
    config = {"policy": {"automodel_cfg": {"distributed_timeout_minutes": 5}, "nemo_rl_shim": {"bogus": 1}}}
    with pytest.raises(ValueError, match=r"^policy\.nemo_rl_shim\.bogus is not a nemo_rl_shim key"):
        knobs(config)
    config["policy"]["nemo_rl_shim"] = {"patch_automodel": False}
    assert knobs(config) == {"distributed_timeout_minutes": 5, "patch_automodel": False}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_infinite_and_nan_minutes_are_refused_as_not_positive(value: float) -> None:
    with pytest.raises(ValueError, match=rf"^x\.t must be a positive number of minutes, got {value!r}$"):
        minutes_timedelta(value, "x.t")


def test_minutes_that_are_none_are_refused_where_a_value_is_needed() -> None:
    with pytest.raises(ValueError, match=r"^x\.t must be a positive number of minutes, got None$"):
        minutes_timedelta(None, "x.t")
    assert minutes_timedelta(2, "x.t").total_seconds() == 120


def test_a_null_flight_recorder_value_takes_its_default(tmp_path) -> None:
    found = flight_recorder({"flight_recorder": {"enabled": True, "dump_dir": str(tmp_path), "buffer_size": None}})
    assert found is not None and found.buffer_size == 2000


def test_a_factor_is_a_number_above_one_never_a_bool() -> None:
    cfg = {"distributed_timeout_minutes": 30}
    found = learned_timeouts({**cfg, "learned_timeouts": {"factor": 1.5}})
    assert found is not None and found.factor == 1.5
    for bad in (True, 1, 0.5):
        with pytest.raises(ValueError, match=r"learned_timeouts\.factor must be a number greater than 1"):
            learned_timeouts({**cfg, "learned_timeouts": {"factor": bad}})


def test_a_floor_equal_to_the_ceiling_is_accepted_and_one_above_is_not() -> None:
    found = learned_timeouts({"distributed_timeout_minutes": 30, "learned_timeouts": {"floor_minutes": 30}})
    assert found is not None and (found.floor_minutes, found.ceiling_minutes) == (30, 30)
    with pytest.raises(ValueError, match=r"floor_minutes must not exceed .*distributed_timeout_minutes \(30\), got 31"):
        learned_timeouts({"distributed_timeout_minutes": 30, "learned_timeouts": {"floor_minutes": 31}})
