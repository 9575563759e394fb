"""What to do about a hang, in one short phrase per kind; for a rank still working, the timeout that would have held.

A rank still working when its peers' timeout fired needs a longer timeout for the phase it was in, not a fix in its
code. The value follows the learned timeouts' rule (:func:`nemo_rl_shim.timeouts.learned_rule.target_minutes`): the
learner's default ``factor`` (:data:`~nemo_rl_shim.config.settings.LEARNED_TIMEOUTS_DEFAULTS`) times how long the
phase had run when last seen (a lower bound: it was still running), at least the learner's floor, in whole minutes
up. Where the phase is the start-up (the learner's first step, or the group's first collective), the knob is the
start-up value ``distributed_timeout_minutes``; else ``extended_timeout(ctx, N)`` around the phase, or a learned phase
(``learner.phase(name)``), which learns it from the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.config.settings import LearnedTimeoutsSettings
from nemo_rl_shim.timeouts.learned_rule import FIRST_STEP, target_minutes

__all__ = ["PHASE_CHARS", "Suggestion", "longer_timeout"]

#: A phase's name is cut to this many characters on the first line (JSON keeps it whole).
PHASE_CHARS = 40


@dataclass(frozen=True)
class Suggestion:
    """What to do, as one phrase (``text``), and for a longer timeout the numbers behind it."""

    text: str
    api: str | None = None  # "extended_timeout" or "distributed_timeout_minutes"
    minutes: int | None = None
    phase: str | None = None
    observed_s: float | None = None
    factor: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "api": self.api,
            "minutes": self.minutes,
            "phase": self.phase,
            "observed_s": None if self.observed_s is None else round(self.observed_s, 3),
            "factor": self.factor,
        }


def longer_timeout(phase: str | None, observed_s: float, *, start_up: bool = False) -> Suggestion:
    """The timeout that would have held a phase seen running ``observed_s`` seconds (see the module docstring)."""
    settings = LearnedTimeoutsSettings(ceiling_minutes=math.inf)
    minutes = max(1, math.ceil(target_minutes(settings, observed_s) - 1e-9))
    why = f"{settings.factor:g} x {observed_s:.0f} s"
    if start_up or phase == FIRST_STEP:
        text = f"fix: distributed_timeout_minutes: {minutes} ({why}) for the start-up, or learned_timeouts"
        return Suggestion(text, "distributed_timeout_minutes", minutes, phase, observed_s, settings.factor)
    shown = (phase or "that phase")[:PHASE_CHARS]
    text = f'fix: extended_timeout(ctx, {minutes}) around "{shown}" ({why}), or learner.phase("{shown}")'
    return Suggestion(text, "extended_timeout", minutes, phase, observed_s, settings.factor)
