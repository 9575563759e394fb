"""The learner: times a run's steps and slow phases, agrees on them across ranks, and sets every group's timeout.

Made by :func:`nemo_rl_shim.timeouts.learned_timeouts` (which hands it ``set_timeouts``, the one
function through which it changes any timeout); the rule itself is :mod:`nemo_rl_shim.timeouts.learned_rule`.

Order, so that no rank cuts short a peer:

* **Raising needs no barrier**: a longer timeout cuts nobody short. Entering a phase raises
  (never lowers) this rank's groups at once, and so does a step longer than the value in force
  allows for.
* **Lowering waits for every rank.** The steady value is lowered only right after an all-reduce
  of every rank (the agreement at every ``min_steps``-th step, or the end of a phase): no rank gets
  its result before every rank has entered it, so every peer has finished the step or left the
  phase. That all-reduce is the barrier, run under the longer value still in force.
  :meth:`Learner.load_state_dict` lowers behind a barrier of its own.

Cost: an ordinary step reads the monotonic clock twice and compares two floats; no collective.
Every ``min_steps``-th step makes one all-reduce of one number on the default group. The first
step, and each phase, make one at their end.

Every rank must make the same calls in the same order (``step()`` and ``phase(name)`` the same
number of times, ``load_state_dict`` at the same point): agreements are collectives, decided by
step counts. A step or phase whose body raises is not counted and makes no collective, so a failing
rank never waits on its peers; it puts back its own value outside phases without a barrier.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim.config import LearnedTimeoutsSettings
from nemo_rl_shim.flight_recorder.recorder import dump_on_timeout
from nemo_rl_shim.process_groups.registry import group_backends
from nemo_rl_shim.timeouts.learned_rule import FIRST_STEP, MAX_PHASE_NAME, LearnedState, Learning

__all__ = ["Learner", "SetTimeouts"]

#: ``set_timeouts(context, timeout, *, barrier)``: sets every group (:func:`nemo_rl_shim.timeouts.set_timeouts`).
SetTimeouts = Callable[..., None]


class Learner:
    """Learned timeouts for one run (see the module docstring). ``settings`` None: off, every method does nothing."""

    def __init__(self, context: Any, settings: LearnedTimeoutsSettings | None, set_timeouts: SetTimeouts) -> None:
        self._context = context
        self._set_timeouts = set_timeouts
        self._learning = None if settings is None else Learning(settings)
        #: What this rank's groups carry outside phases (the agreed value, or higher after a long step here).
        self._outside = None if settings is None else settings.ceiling_minutes
        #: What this rank's groups carry now, as this learner set them.
        self._applied = self._outside
        self._inside: str | None = None
        self._device: torch.device | None = None

    # --- what is known ----------------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether ``nemo_rl_shim.learned_timeouts`` is on."""
        return self._learning is not None

    @property
    def settings(self) -> LearnedTimeoutsSettings | None:
        return None if self._learning is None else self._learning.settings

    @property
    def minutes(self) -> float | None:
        """The agreed steady value in force, or None before it is learned (and when off)."""
        return None if self._learning is None else self._learning.steady_minutes

    @property
    def in_force_minutes(self) -> float | None:
        """What this rank's groups carry now (inside a phase, the phase's value; None when off)."""
        return self._applied

    @property
    def phases(self) -> dict[str, float]:
        """``{phase name: learned minutes}`` for every phase seen (the first step as ``"first_step"``)."""
        if self._learning is None:
            return {}
        return {name: learned.minutes for name, learned in self._learning.state.phases.items()}

    @property
    def steps(self) -> int:
        """Steps counted in this process (the first one included)."""
        return 0 if self._learning is None else self._learning.steps

    # --- the two context managers -------------------------------------------------------------------------------

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time one training step. The first one in this process runs as the phase ``"first_step"``."""
        if self._learning is None:
            yield
            return
        if self._learning.steps == 0:
            with self._phase(FIRST_STEP):
                yield
            self._learning.count_step(0.0)
            return
        self._enter("step")
        start = time.monotonic()
        try:
            yield
        finally:
            self._inside = None
        duration = time.monotonic() - start
        if self._learning.count_step(duration):
            minutes = self._learning.agree_steps(self._agree_max(self._learning.window_longest_s))
            self._outside = minutes
            self._apply(minutes)  # the all-reduce above was the barrier: every rank has finished the step
        elif (raised := self._learning.raise_for(self._outside, duration)) is not None:
            self._outside = raised
            self._apply(raised)  # raising this rank alone cuts nobody short

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one slow phase (checkpoint, refit, evaluation) under its own value: the ceiling until seen once."""
        if not isinstance(name, str) or not 0 < len(name) <= MAX_PHASE_NAME:  # as a resume reads it back
            raise ValueError(f"a phase name must be a string of 1 to {MAX_PHASE_NAME} characters, got {name!r}"[:300])
        if self._learning is None:
            yield
            return
        with self._phase(name):
            yield

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        assert self._learning is not None and self._outside is not None
        self._enter(f"phase {name!r}")
        self._apply(max(self._learning.phase_minutes(name), self._outside))  # raise only: no barrier
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self._inside = None
            self._apply(self._outside)  # failing: this rank's own value back, without waiting on peers
            raise
        duration = time.monotonic() - start
        self._inside = None
        self._learning.learn_phase(name, self._agree_max(duration))
        self._apply(self._outside)  # the all-reduce above was the barrier: every rank has left the phase

    # --- state ---------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What was learned, as plain JSON data: the same on every rank, so one rank may save it for all."""
        if self._learning is None:
            return LearnedState().to_json()
        return self._learning.state.to_json()

    def load_state_dict(self, state: Any) -> None:
        """Apply a saved state at once: every group gets its steady value (the ceiling if it has none), behind a
        barrier. Call it on every rank, outside steps and phases. Values are brought between the floor and the
        ceiling in force; off, the state is only checked."""
        if self._inside is not None:
            raise RuntimeError(f"learned timeouts: load_state_dict inside {self._inside}")
        if self._learning is None:
            LearnedState.from_json(state, LearnedTimeoutsSettings(ceiling_minutes=1.0))
            return
        self._learning.load(state)
        self._outside = self._learning.outside_minutes()
        self._apply(self._outside, barrier=True, force=True)  # lowering from the start-up value: peers may be loading

    # --- collectives and setting ----------------------------------------------------------------------------------

    def _enter(self, what: str) -> None:
        if self._inside is not None:
            raise RuntimeError(f"learned timeouts: {what} inside {self._inside}; steps and phases do not nest")
        self._inside = what

    def _agree_max(self, seconds: float) -> float:
        """The largest ``seconds`` of every rank: one all-reduce on the default group."""
        if self._device is None:
            cpu = "cpu" in group_backends(dist.group.WORLD)
            self._device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
        value = torch.tensor([seconds], dtype=torch.float64, device=self._device)
        with dump_on_timeout("the learned-timeouts agreement"):
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    def _apply(self, minutes: float, *, barrier: bool = False, force: bool = False) -> None:
        if minutes == self._applied and not force:
            return
        self._set_timeouts(self._context, datetime.timedelta(minutes=minutes), barrier=barrier)
        self._applied = minutes
