"""The rule that learns timeouts from the run's own step and phase times, and its JSON state.

Plain arithmetic on seconds and minutes, with no torch: :class:`Learning` is what every rank
computes the same way from the same agreed numbers. :class:`nemo_rl_shim.timeouts.learned_run.Learner` times
the steps, runs the one all-reduce that agrees on them, and sets the groups' timeouts.

The rule (``nemo_rl_shim.learned_timeouts``: ``factor``, ``min_steps``, ``floor_minutes``; the
ceiling is ``distributed_timeout_minutes``):

* a value learned from a longest duration ``d`` is ``factor x d``, at least the floor, at most the
  ceiling, in whole milliseconds (torch keeps timeouts in whole milliseconds);
* the steady value: at every ``min_steps``-th step (the first step counted, but never at the first
  step itself) the ranks agree on the longest step since the last agreement. The value follows the
  longest step agreed on in this process, the first step left out (it is the start-up step, timed
  as the phase :data:`FIRST_STEP`). A longer step raises it at once. Between agreements, a rank
  whose own step would give a higher value raises its own timeouts at once (raising cuts nobody
  short); the next agreement makes every rank the same again;
* a phase (checkpoint, refit, evaluation) runs under the ceiling until it has been seen once, then
  under its own value, learned by the same rule from its longest occurrence, agreed at each end;
* lowering follows NVRx (``fault_tolerance/timeouts_calc.py``): its calculator keeps the longest
  interval of the whole run, and blends a new value 50/50 with the one in force. Within one process
  the longest only grows, so a value comes down only from where an earlier run left it (a loaded
  state): at each agreement it moves half way to this run's own value. A step that was survived once
  is survived again, however rare: ``benchmarks/learned_timeouts_rule.py`` measures that rule against
  lowering to the last window's longest step, which keeps the timeout up to 2.4x lower on spiky traces
  but kills every run whose rare long step (8x) exceeds ``factor`` x the usual one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.config import LearnedTimeoutsSettings
from nemo_rl_shim.config.integers import is_positive_int

__all__ = [
    "BLEND",
    "FIRST_STEP",
    "MAX_PHASE_NAME",
    "STATE_FORMAT",
    "STATE_VERSION",
    "Learned",
    "LearnedState",
    "Learning",
    "next_minutes",
    "target_minutes",
]

#: The phase name of a learner's first step: the start-up step (compile, load, cold caches) of every process.
FIRST_STEP = "first_step"
#: Weight of the value in force when a lower one is learned (NVRx's ``_ema`` with ``alpha=0.5``).
BLEND = 0.5
#: ``state_dict()``'s ``format`` and ``version``.
STATE_FORMAT = "nemo_rl_shim.learned_timeouts"
STATE_VERSION = 1
#: Longest phase name a state may carry (a checkpoint is data from disk: names are bounded, not trusted).
MAX_PHASE_NAME = 200

_MS_PER_MINUTE = 60_000


def _whole_ms(minutes: float) -> float:
    return max(1, round(minutes * _MS_PER_MINUTE)) / _MS_PER_MINUTE


def _clamp(settings: LearnedTimeoutsSettings, minutes: float) -> float:
    return min(settings.ceiling_minutes, max(settings.floor_minutes, _whole_ms(minutes)))


def target_minutes(settings: LearnedTimeoutsSettings, longest_s: float) -> float:
    """``factor x longest_s`` in minutes, between the floor and the ceiling, in whole milliseconds."""
    return _clamp(settings, settings.factor * longest_s / 60)


def next_minutes(settings: LearnedTimeoutsSettings, current: float | None, longest_s: float) -> float:
    """The value after agreeing on ``longest_s``: raised at once, lowered by :data:`BLEND`."""
    new = target_minutes(settings, longest_s)
    if current is None or new >= current:
        return new
    return max(new, _clamp(settings, BLEND * current + (1 - BLEND) * new))


@dataclass(frozen=True)
class Learned:
    """One learned value: the minutes in force, the longest agreed duration behind them, and how many agreements."""

    minutes: float
    longest_s: float
    agreements: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"minutes": self.minutes, "longest_s": self.longest_s, "agreements": self.agreements}


def _number(value: Any, where: str, *, positive: bool) -> float:
    rule = f"learned-timeouts state: {where} must be a {'positive' if positive else 'non-negative'} finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{rule}, got {value!r}"[:300])
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{rule}, got {value!r}")
    return float(value)


def _learned_from(data: Any, where: str, settings: LearnedTimeoutsSettings) -> Learned:
    if not isinstance(data, Mapping):
        raise ValueError(f"learned-timeouts state: {where} must be a mapping, got {data!r}"[:300])
    agreements = data.get("agreements", 1)
    if not is_positive_int(agreements):
        raise ValueError(f"learned-timeouts state: {where}.agreements must be a positive integer, got {agreements!r}")
    minutes = _number(data.get("minutes"), f"{where}.minutes", positive=True)
    longest = _number(data.get("longest_s"), f"{where}.longest_s", positive=False)
    return Learned(_clamp(settings, minutes), longest, agreements)


@dataclass
class LearnedState:
    """What a run has learned, the same on every rank: the steady value and each phase's.

    :meth:`to_json` is ``Learner.state_dict()``; :meth:`from_json` reads it back, checked, with
    every value brought between the floor and the ceiling of the settings in force (a resumed run
    may have changed them).
    """

    steady: Learned | None = None
    phases: dict[str, Learned] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "steady": None if self.steady is None else self.steady.to_json(),
            "phases": {name: learned.to_json() for name, learned in self.phases.items()},
        }

    @classmethod
    def from_json(cls, data: Any, settings: LearnedTimeoutsSettings) -> LearnedState:
        """The state in ``data`` (as :meth:`to_json` wrote it); ``ValueError`` naming the key on anything else."""
        if not isinstance(data, Mapping):
            raise ValueError(f"learned-timeouts state must be a mapping, got {type(data).__name__}")
        if data.get("format") != STATE_FORMAT or data.get("version") != STATE_VERSION:
            raise ValueError(
                f"learned-timeouts state must have format {STATE_FORMAT!r} and version {STATE_VERSION}, "
                f"got format {data.get('format')!r} and version {data.get('version')!r}"[:300]
            )
        steady = data.get("steady")
        phases = data.get("phases", {})
        if not isinstance(phases, Mapping):
            raise ValueError(f"learned-timeouts state: phases must be a mapping, got {phases!r}"[:300])
        learned = {}
        for name, entry in phases.items():
            if not isinstance(name, str) or not 0 < len(name) <= MAX_PHASE_NAME:
                raise ValueError(
                    f"learned-timeouts state: a phase name must be a string of 1 to {MAX_PHASE_NAME} characters, "
                    f"got {name!r}"[:300]
                )
            learned[name] = _learned_from(entry, f"phases.{name}", settings)
        return cls(None if steady is None else _learned_from(steady, "steady", settings), learned)


class Learning:
    """The rule, driven by one rank's events; what it returns is the same on every rank given the same agreed numbers.

    ``steps`` counts this process's steps (the first included), so every rank reaches an
    agreement at the same step: the decision rests on step counts, never on local times.
    """

    def __init__(self, settings: LearnedTimeoutsSettings) -> None:
        self.settings = settings
        self.state = LearnedState()
        self.steps = 0
        #: The longest step since the last agreement, on this rank (the first step left out).
        self.window_longest_s = 0.0
        #: The longest agreed duration in this process: of the steps, and of each phase.
        self._run_longest_s: dict[str | None, float] = {}

    @property
    def steady_minutes(self) -> float | None:
        return None if self.state.steady is None else self.state.steady.minutes

    def outside_minutes(self) -> float:
        """The agreed value outside phases: the steady value once learned, the ceiling before."""
        steady = self.steady_minutes
        return self.settings.ceiling_minutes if steady is None else steady

    def phase_minutes(self, name: str) -> float:
        """The value a phase runs under: its own once seen, the ceiling before."""
        learned = self.state.phases.get(name)
        return self.settings.ceiling_minutes if learned is None else learned.minutes

    def count_step(self, duration_s: float) -> bool:
        """Count one finished step (the first one is the phase :data:`FIRST_STEP`, not timed here); whether the
        ranks agree now, at this step."""
        self.steps += 1
        if self.steps == 1:
            return False
        self.window_longest_s = max(self.window_longest_s, duration_s)
        return self.steps % self.settings.min_steps == 0

    def _learn(self, key: str | None, previous: Learned | None, longest_s: float) -> Learned:
        longest = max(self._run_longest_s.get(key, 0.0), longest_s)
        self._run_longest_s[key] = longest
        minutes = next_minutes(self.settings, None if previous is None else previous.minutes, longest)
        return Learned(minutes, longest, 1 if previous is None else previous.agreements + 1)

    def agree_steps(self, longest_s: float) -> float:
        """Take the agreed longest step of the window; return the new steady minutes."""
        self.state.steady = self._learn(None, self.state.steady, longest_s)
        self.window_longest_s = 0.0
        return self.state.steady.minutes

    def raise_for(self, in_force_minutes: float, duration_s: float) -> float | None:
        """The value this rank raises itself to after a step of ``duration_s``, or None when it needs none."""
        minutes = target_minutes(self.settings, duration_s)
        return minutes if minutes > in_force_minutes else None

    def learn_phase(self, name: str, longest_s: float) -> float:
        """Take the agreed duration of one occurrence of phase ``name``; return its new minutes."""
        learned = self._learn(name, self.state.phases.get(name), longest_s)
        self.state.phases[name] = learned
        return learned.minutes

    def load(self, data: Any) -> None:
        """Replace what was learned with the state in ``data`` (checked first: nothing changes on an error).

        What this process has measured so far is forgotten: the loaded values come down, by the blend,
        only to what the steps and phases after the load show."""
        self.state = LearnedState.from_json(data, self.settings)
        self.window_longest_s = 0.0
        self._run_longest_s = {}
