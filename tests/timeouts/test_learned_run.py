"""The Learner's order of work, in this process: what it sets, when, and which collective comes first.

A one-rank Gloo group is real (the agreement all-reduce runs on it). The clock is a fake the test
moves, and ``set_timeouts`` is a recorder, so every test reads the exact sequence of events: ``("set",
seconds, barrier)``, ``("all_reduce", seconds)`` and ``("body", ...)``. The multi-rank behaviour
(every group, every rank, real timeouts) is tests/timeouts/test_learned_timeouts.py.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim.config import LearnedTimeoutsSettings
from nemo_rl_shim.setup.distributed import DistributedContext
from nemo_rl_shim.timeouts import learned_run, learned_timeouts
from nemo_rl_shim.timeouts.learned_rule import FIRST_STEP, MAX_PHASE_NAME
from nemo_rl_shim.timeouts.learned_run import Learner

SETTINGS = LearnedTimeoutsSettings(ceiling_minutes=1.0, factor=5.0, min_steps=3, floor_minutes=0.5 / 60)
CONTEXT = DistributedContext(None, None, None, None, 1, 1, 1, learned_timeouts=SETTINGS)


class Clock:
    """``time`` as the learner sees it: ``monotonic()`` moves only when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    assert not dist.is_initialized(), "a process group leaked into this module"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def events(one_rank, monkeypatch) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []
    real = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        log.append(("all_reduce", round(tensor.item(), 6)))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return log


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(learned_run, "time", fake)
    return fake


def _learner(events: list[tuple[Any, ...]], settings: LearnedTimeoutsSettings | None = SETTINGS) -> Learner:
    def record(context: Any, timeout: datetime.timedelta, *, barrier: bool) -> None:
        assert context is CONTEXT
        events.append(("set", round(timeout.total_seconds(), 6), barrier))

    return Learner(CONTEXT, settings, record)


def _steps(learner: Learner, clock: Clock, durations: list[float]) -> None:
    for seconds in durations:
        with learner.step():
            clock.now += seconds


def _learned(events, clock) -> Learner:
    """A learner past its first agreement: steps of 3 s, 1 s, 2 s; steady 10 s."""
    learner = _learner(events)
    _steps(learner, clock, [3.0, 1.0, 2.0])
    assert learner.minutes * 60 == 10.0
    events.clear()
    return learner


def test_off_it_times_nothing_and_sets_nothing(events, clock):
    off = learned_timeouts(DistributedContext(None, None, None, None, 1, 1, 1))
    ran = []
    for _ in range(5):
        with off.step():
            ran.append("step")
    with off.phase("checkpoint"):
        ran.append("phase")
    off.load_state_dict(off.state_dict())
    assert ran == ["step"] * 5 + ["phase"]
    assert (off.enabled, off.minutes, off.phases, events) == (False, None, {}, [])
    with pytest.raises(ValueError, match="learned-timeouts state must be a mapping"):
        off.load_state_dict("not a state")


def test_the_first_step_is_a_phase_agreed_at_its_end_and_the_steady_value_comes_at_min_steps(events, clock):
    learner = _learner(events)
    _steps(learner, clock, [3.0])
    assert events == [("all_reduce", 3.0)]  # under the ceiling already: nothing to set
    assert learner.phases == {FIRST_STEP: 15 / 60} and learner.minutes is None
    _steps(learner, clock, [1.0, 2.0])
    assert events[1:] == [("all_reduce", 2.0), ("set", 10.0, False)]  # after the all-reduce: no peer is in the step
    assert learner.minutes * 60 == 10.0 and learner.steps == 3


def test_ordinary_steps_make_no_collective_and_set_nothing(events, clock):
    learner = _learned(events, clock)
    _steps(learner, clock, [1.0, 0.5])
    assert events == []
    _steps(learner, clock, [1.5])
    assert events == [("all_reduce", 1.5)]  # the agreement: no new longest, nothing set


def test_a_longer_step_raises_this_rank_at_once_without_a_collective(events, clock):
    learner = _learned(events, clock)
    _steps(learner, clock, [2.5])
    assert events == [("set", 12.5, False)]
    assert learner.in_force_minutes * 60 == 12.5 and learner.minutes * 60 == 10.0
    _steps(learner, clock, [1.0, 1.0])
    assert events[1:] == [("all_reduce", 2.5)]  # agreed on 12.5 s: in force here already, nothing to set
    assert learner.minutes * 60 == 12.5


def test_a_phase_raises_before_its_body_and_lowers_only_after_the_all_reduce(events, clock):
    learner = _learned(events, clock)
    for seconds in (4.0, 3.0):
        with learner.phase("checkpoint"):
            events.append(("body",))
            clock.now += seconds
    assert events == [
        *[("set", 60.0, False), ("body",), ("all_reduce", 4.0), ("set", 10.0, False)],  # not seen: the ceiling
        *[("set", 20.0, False), ("body",), ("all_reduce", 3.0), ("set", 10.0, False)],  # then its own value
    ]
    assert learner.phases["checkpoint"] * 60 == 20.0


def test_a_phase_shorter_than_the_steady_value_runs_under_the_steady_value(events, clock):
    learner = _learned(events, clock)
    with learner.phase("eval"):
        first = learner.in_force_minutes * 60
        clock.now += 0.2
    events.clear()
    with learner.phase("eval"):
        events.append(("body", learner.in_force_minutes * 60))
    assert first == 60.0
    assert learner.phases["eval"] * 60 == 1.0
    assert events == [("body", 10.0), ("all_reduce", 0.0)], "entering a phase lowered the timeout"


def test_a_phase_that_raises_puts_this_ranks_value_back_without_a_collective(events, clock):
    learner = _learned(events, clock)
    learner.load_state_dict({**learner.state_dict(), "phases": {"save": {"minutes": 0.5, "longest_s": 6.0}}})
    events.clear()
    with pytest.raises(OSError, match="disk full"), learner.phase("save"):
        clock.now += 1.0
        raise OSError("disk full")
    assert events == [("set", 30.0, False), ("set", 10.0, False)]
    assert learner.phases["save"] == 0.5  # not learned from a failed phase


def test_a_step_that_raises_is_not_counted_and_makes_no_collective(events, clock):
    learner = _learned(events, clock)
    with pytest.raises(RuntimeError, match="peer gone"), learner.step():
        clock.now += 50.0
        raise RuntimeError("peer gone")
    assert events == [] and learner.steps == 3
    _steps(learner, clock, [1.0, 1.0, 1.0])
    assert events == [("all_reduce", 1.0)]  # the schedule is the same as if the failed step never was


def test_steps_and_phases_do_not_nest_and_the_learner_stays_usable(events, clock):
    learner = _learned(events, clock)
    with pytest.raises(RuntimeError, match="phase 'save' inside step"), learner.step(), learner.phase("save"):
        pass
    with pytest.raises(RuntimeError, match="step inside phase 'save'"), learner.phase("save"), learner.step():
        pass
    with pytest.raises(RuntimeError, match="load_state_dict inside step"), learner.step():
        learner.load_state_dict(learner.state_dict())
    with pytest.raises(ValueError, match="a phase name must be a string of 1 to 200 characters, got ''"):
        with learner.phase(""):
            pass
    _steps(learner, clock, [1.0, 1.0, 1.0])
    assert learner.steps == 6


def test_load_state_dict_applies_the_steady_value_at_once_behind_a_barrier(events, clock):
    learner = _learned(events, clock)
    with learner.phase("checkpoint"):
        clock.now += 4.0
    saved = json.loads(json.dumps(learner.state_dict()))
    events.clear()
    resumed = _learner(events)
    resumed.load_state_dict(saved)
    assert events == [("set", 10.0, True)]
    assert (resumed.minutes, resumed.phases, resumed.state_dict()) == (learner.minutes, learner.phases, saved)
    events.clear()
    _steps(resumed, clock, [5.0])  # the resumed first step: under what the first one took before (15 s)
    assert events == [("set", 15.0, False), ("all_reduce", 5.0), ("set", 10.0, False)]


def test_every_lowering_follows_an_all_reduce_or_a_barrier(events, clock):
    """Over a mixed run: each set below the value set before it comes right after an all-reduce, or waits itself."""
    learner = _learner(events)
    _steps(learner, clock, [3.0, 1.0, 2.0, 2.5, 1.0, 1.0])
    with learner.phase("checkpoint"):
        clock.now += 8.0
    _steps(learner, clock, [1.0, 3.5, 1.0])
    with learner.phase("checkpoint"):
        clock.now += 6.0
    learner.load_state_dict(learner.state_dict())
    sets = [i for i, e in enumerate(events) if e[0] == "set"]
    assert len(sets) >= 5, events
    applied = 60.0
    for i in sets:
        seconds, barrier = events[i][1:]
        if seconds < applied:
            assert barrier or events[i - 1][0] == "all_reduce", (i, events)
        applied = seconds


def test_load_state_dict_sets_and_waits_even_where_this_rank_already_holds_the_value(events, clock):
    """A rank already at the loaded value still sets it behind the barrier: its peers, lowering from the start-up
    value, wait in that barrier for every rank."""
    learner = _learned(events, clock)
    learner.load_state_dict(learner.state_dict())
    assert events == [("set", 10.0, True)]


def test_a_phase_name_a_resume_reads_back_is_one_the_run_takes(events, clock):
    """The longest name a run takes is one its saved state loads again; one longer is refused at the phase."""
    learner = _learned(events, clock)
    longest = "p" * MAX_PHASE_NAME
    with learner.phase(longest):
        clock.now += 2.0
    resumed = _learner(events)
    resumed.load_state_dict(json.loads(json.dumps(learner.state_dict())))
    assert resumed.phases[longest] == learner.phases[longest]
    with pytest.raises(ValueError, match="a phase name must be a string of 1 to 200 characters"):
        with learner.phase(longest + "p"):
            pass
