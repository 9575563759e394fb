"""The learning rule (``nemo_rl_shim.timeouts.learned_rule``): plain arithmetic, checked without torch or ranks.

Settings in seconds' reach: ceiling 1 minute, factor 5, floor 0.5 s, ``min_steps`` 4, unless a test says.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from nemo_rl_shim.config import LearnedTimeoutsSettings
from nemo_rl_shim.timeouts.learned_rule import (
    FIRST_STEP,
    MAX_PHASE_NAME,
    STATE_FORMAT,
    Learned,
    LearnedState,
    Learning,
    next_minutes,
    target_minutes,
)

SETTINGS = LearnedTimeoutsSettings(ceiling_minutes=1.0, factor=5.0, min_steps=4, floor_minutes=0.5 / 60)


def _s(minutes: float | None) -> float | None:
    return None if minutes is None else round(minutes * 60, 6)


def _run(learning: Learning, durations: list[float]) -> list[float | None]:
    """Drive ``learning`` as one rank's learner does; the steady seconds after each agreement."""
    agreed = []
    for duration in durations:
        if learning.count_step(duration):
            agreed.append(_s(learning.agree_steps(learning.window_longest_s)))
    return agreed


# --- the value from a duration ---------------------------------------------------------------------------------------


def test_a_value_is_factor_times_the_longest_between_floor_and_ceiling_in_whole_ms():
    assert _s(target_minutes(SETTINGS, 2.0)) == 10.0
    assert _s(target_minutes(SETTINGS, 0.01)) == 0.5  # the floor
    assert _s(target_minutes(SETTINGS, 100.0)) == 60.0  # the ceiling
    assert _s(target_minutes(SETTINGS, 1.23456)) == 6.173  # 6.1728 s, to the millisecond


def test_a_longer_duration_raises_at_once_and_a_shorter_one_lowers_by_half():
    assert _s(next_minutes(SETTINGS, None, 2.0)) == 10.0
    assert _s(next_minutes(SETTINGS, 5 / 60, 2.0)) == 10.0  # raised at once
    assert _s(next_minutes(SETTINGS, 20 / 60, 2.0)) == 15.0  # half way from 20 s to 10 s
    assert _s(next_minutes(SETTINGS, 10.001 / 60, 2.0)) == 10.0  # never below the new value


# --- agreements ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("min_steps", "agreements"), [(4, [4, 8, 12]), (1, list(range(2, 13))), (5, [5, 10])])
def test_the_ranks_agree_at_every_min_steps_th_step_never_at_the_first(min_steps, agreements):
    learning = Learning(LearnedTimeoutsSettings(1.0, min_steps=min_steps))
    assert [step for step in range(1, 13) if learning.count_step(0.1)] == agreements


def test_the_first_step_is_left_out_of_the_steady_value():
    learning = Learning(SETTINGS)
    assert _run(learning, [30.0, 1.0, 1.0, 1.2]) == [6.0]
    assert learning.state.steady == Learned(6 / 60, 1.2, 1)


def test_within_a_process_the_value_never_comes_down():
    learning = Learning(SETTINGS)
    assert _run(learning, [0.1, 1.0, 2.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 3.0, 1.0, 1.0]) == [10.0, 10.0, 15.0]
    assert learning.state.steady.agreements == 3


def test_after_a_load_the_value_comes_down_half_way_at_each_agreement():
    learning = Learning(SETTINGS)
    learning.load({**LearnedState().to_json(), "steady": Learned(45 / 60, 9.0).to_json()})
    assert learning.outside_minutes() * 60 == 45.0
    assert _run(learning, [1.0] * 16) == [25.0, 15.0, 10.0, 7.5]


def test_a_step_that_would_need_more_raises_this_rank():
    learning = Learning(SETTINGS)
    assert learning.raise_for(10 / 60, 1.9) is None
    assert learning.raise_for(10 / 60, 2.0) is None  # exactly the value in force
    assert _s(learning.raise_for(10 / 60, 2.5)) == 12.5


def test_a_phase_runs_under_the_ceiling_until_seen_then_under_its_longest_occurrence():
    learning = Learning(SETTINGS)
    assert learning.phase_minutes("checkpoint") == SETTINGS.ceiling_minutes
    assert _s(learning.learn_phase("checkpoint", 4.0)) == 20.0
    assert _s(learning.learn_phase("checkpoint", 2.0)) == 20.0  # the longest occurrence stays
    assert _s(learning.phase_minutes("checkpoint")) == 20.0
    assert learning.phase_minutes("refit") == SETTINGS.ceiling_minutes
    assert learning.state.steady is None, "a phase taught the steady value"


# --- state -----------------------------------------------------------------------------------------------------


def _state() -> dict[str, Any]:
    learning = Learning(SETTINGS)
    _run(learning, [3.0, 1.0, 1.0, 1.5])
    learning.learn_phase(FIRST_STEP, 3.0)
    learning.learn_phase("checkpoint", 8.0)
    return learning.state.to_json()


def test_the_state_survives_json_and_loads_into_a_new_learning():
    saved = _state()
    loaded = Learning(SETTINGS)
    loaded.load(json.loads(json.dumps(saved)))
    assert loaded.state.to_json() == saved
    assert _s(loaded.steady_minutes) == 7.5
    assert _s(loaded.phase_minutes("checkpoint")) == 40.0
    assert saved["format"] == STATE_FORMAT


def test_loaded_values_are_brought_within_the_settings_in_force():
    tighter = LearnedTimeoutsSettings(ceiling_minutes=0.5, factor=5.0, min_steps=4, floor_minutes=10 / 60)
    loaded = Learning(tighter)
    loaded.load(_state())
    assert _s(loaded.steady_minutes) == 10.0  # 7.5 s, raised to the new floor
    assert _s(loaded.phase_minutes("checkpoint")) == 30.0  # 40 s, lowered to the new ceiling


BAD_STATES: dict[str, tuple[Any, str]] = {
    "not-a-mapping": ([1], "learned-timeouts state must be a mapping, got list"),
    "other-format": ({"format": "x", "version": 1}, "must have format 'nemo_rl_shim.learned_timeouts'"),
    "other-version": ({"version": 2}, "and version 1, got format 'nemo_rl_shim.learned_timeouts' and version 2"),
    "steady-list": ({"steady": [1]}, "steady must be a mapping, got [1]"),
    "minutes-zero": ({"steady": {"minutes": 0, "longest_s": 1}}, "steady.minutes must be a positive finite number"),
    "minutes-nan": ({"steady": {"minutes": math.nan, "longest_s": 1}}, "steady.minutes must be a positive finite"),
    "minutes-string": ({"steady": {"minutes": "1", "longest_s": 1}}, "steady.minutes must be a positive finite"),
    "minutes-bool": ({"steady": {"minutes": True, "longest_s": 1}}, "steady.minutes must be a positive finite"),
    "longest-negative": ({"steady": {"minutes": 1, "longest_s": -1}}, "steady.longest_s must be a non-negative"),
    "agreements-zero": ({"steady": {"minutes": 1, "longest_s": 1, "agreements": 0}}, "steady.agreements must be"),
    "phases-list": ({"phases": []}, "phases must be a mapping, got []"),
    "phase-name-empty": ({"phases": {"": {"minutes": 1, "longest_s": 1}}}, "a phase name must be a string of 1 to"),
    "phase-name-long": ({"phases": {"x" * (MAX_PHASE_NAME + 1): {}}}, "a phase name must be a string of 1 to 200"),
    "phase-entry": ({"phases": {"save": {"minutes": -1, "longest_s": 1}}}, "phases.save.minutes must be a positive"),
}


@pytest.mark.parametrize("name", list(BAD_STATES))
def test_a_bad_state_is_refused_naming_the_key_and_nothing_changes(name):
    change, words = BAD_STATES[name]
    learning = Learning(SETTINGS)
    _run(learning, [1.0] * 4)
    before = learning.state.to_json()
    data = change if not isinstance(change, dict) else {**LearnedState().to_json(), **change}
    with pytest.raises(ValueError) as caught:
        learning.load(data)
    assert words in str(caught.value)
    assert learning.state.to_json() == before
