"""Which lowering rule: the shipped one (NVRx's) against lowering to a recent window, on simulated step times.

No ranks: :class:`nemo_rl_shim.timeouts.learned_rule.Learning` is plain arithmetic, so the rule is replayed on
step-time traces of 2,000 steps (10 seeds per trace), exactly as a rank drives it: each step runs
under the value in force, then is counted (an agreement every ``min_steps`` steps, a local raise
after a longer step between them). Per rule and trace:

* **false timeouts**: steps longer than the value they ran under (a healthy run killed);
* **timeout / median step**: the mean value in force over the steady steps, in units of the
  trace's median step: how long a stall would go undetected;
* **changes**: how often the value changed (each change sets every group).

Rules, all raising at once:

* ``run`` (shipped): the longest step of the whole process, as NVRx's calculator keeps it; a value
  loaded from an earlier run comes down by NVRx's 50/50 blend;
* ``window_blend``: the last window's longest step (``min_steps`` steps), lowered by the 50/50 blend;
* ``window_at_once``: the last window's longest step, lowered at once.

Traces (a median step of about 1 s; factor 5, ``min_steps`` 8, floor 1 ms, ceiling 45 min):
``jitter3`` (uniform 1 to 3 s), ``spikes`` (uniform 1 to 1.5 s, 2% of steps 5 s), ``periodic``
(every 50th step 4.5x), ``rare8x`` (every 100th step 8x, the first one at step 6, before the first
agreement), ``one_off_10x`` (step 300 is 10x),
``grows`` (1 to 3 s over the run, +-20%), ``shrinks`` (3 to 1 s), and ``resumed`` (steps of 0.9 to
1.1 s after loading the state of a run whose longest step was 3 s; ``run_at_once`` shows what the
blend costs there).

Run: ``uv run python benchmarks/learned_timeouts_rule.py``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make nemo_rl_shim and benchmarks importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import environment, print_table, write_results  # noqa: E402
from nemo_rl_shim.config import LearnedTimeoutsSettings  # noqa: E402
from nemo_rl_shim.timeouts.learned_rule import Learned, LearnedState, Learning, next_minutes, target_minutes  # noqa: E402

__all__ = ["RULES", "TRACES", "main", "replay"]

SETTINGS = LearnedTimeoutsSettings(ceiling_minutes=45.0, factor=5.0, min_steps=8, floor_minutes=1 / 60_000)
STEPS = 2000
SEEDS = 10


def _at_once(settings: LearnedTimeoutsSettings, current: float | None, longest_s: float) -> float:
    return target_minutes(settings, longest_s)


class _Window(Learning):
    """The rule with its memory cut to the last window, lowering by ``lower``."""

    def __init__(self, settings: LearnedTimeoutsSettings, lower: Callable[..., float]) -> None:
        super().__init__(settings)
        self._lower = lower

    def agree_steps(self, longest_s: float) -> float:
        previous = self.state.steady
        minutes = self._lower(self.settings, None if previous is None else previous.minutes, longest_s)
        self.state.steady = Learned(minutes, longest_s)
        self.window_longest_s = 0.0
        return minutes


class _RunAtOnce(Learning):
    """The shipped memory (the whole process), lowering a loaded value at once instead of by the blend."""

    def agree_steps(self, longest_s: float) -> float:
        self.state.steady = None  # no value in force: the new one is taken as it is
        return super().agree_steps(longest_s)


RULES: dict[str, Callable[[LearnedTimeoutsSettings], Learning]] = {
    "run": Learning,
    "window_blend": lambda settings: _Window(settings, next_minutes),
    "window_at_once": lambda settings: _Window(settings, _at_once),
    "run_at_once": _RunAtOnce,
}
#: ``run_at_once`` differs from ``run`` only after a load: it is replayed on ``resumed`` alone.
RESUMED_ONLY = ("run_at_once",)


def _jitter3(rng: random.Random, n: int) -> list[float]:
    return [rng.uniform(1.0, 3.0) for _ in range(n)]


def _spikes(rng: random.Random, n: int) -> list[float]:
    return [5.0 if rng.random() < 0.02 else rng.uniform(1.0, 1.5) for _ in range(n)]


def _periodic(rng: random.Random, n: int) -> list[float]:
    return [4.5 if i % 50 == 49 else rng.uniform(0.9, 1.1) for i in range(n)]


def _rare8x(rng: random.Random, n: int) -> list[float]:
    return [8.0 if i % 100 == 5 else rng.uniform(0.9, 1.1) for i in range(n)]


def _one_off_10x(rng: random.Random, n: int) -> list[float]:
    return [10.0 if i == 300 else rng.uniform(0.9, 1.1) for i in range(n)]


def _grows(rng: random.Random, n: int) -> list[float]:
    return [(1.0 + 2.0 * i / n) * rng.uniform(0.8, 1.2) for i in range(n)]


def _shrinks(rng: random.Random, n: int) -> list[float]:
    return [(3.0 - 2.0 * i / n) * rng.uniform(0.8, 1.2) for i in range(n)]


TRACES: dict[str, Callable[[random.Random, int], list[float]]] = {
    "jitter3": _jitter3,
    "spikes": _spikes,
    "periodic": _periodic,
    "rare8x": _rare8x,
    "one_off_10x": _one_off_10x,
    "grows": _grows,
    "shrinks": _shrinks,
    "resumed": lambda rng, n: [rng.uniform(0.9, 1.1) for _ in range(n)],
}
#: What ``resumed`` loads: the state of a run whose longest step was 3 s.
RESUMED_FROM_S = 3.0


def replay(rule: str, steps: list[float], *, resumed: bool = False) -> dict[str, Any]:
    """Drive one rank's rule through ``steps`` (seconds), after a load when ``resumed``; what it did."""
    learning = RULES[rule](SETTINGS)
    if resumed:
        minutes = target_minutes(SETTINGS, RESUMED_FROM_S)
        learning.load({**LearnedState().to_json(), "steady": Learned(minutes, RESUMED_FROM_S).to_json()})
    outside = learning.outside_minutes()
    false, changes, in_force = 0, 0, []
    for duration in steps:
        if learning.steady_minutes is not None:
            in_force.append(outside * 60)
            false += duration > outside * 60
        before = outside
        if learning.count_step(duration):
            outside = learning.agree_steps(learning.window_longest_s)  # one rank: its own longest is the agreed one
        elif (raised := learning.raise_for(outside, duration)) is not None:
            outside = raised
        changes += outside != before
    return {"false_timeouts": false, "changes": changes, "mean_timeout_s": statistics.fmean(in_force)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Replay every rule on every trace, print the table, write ``results/learned_timeouts_rule.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"benchmark": "learned_timeouts_rule", "settings": SETTINGS.to_dict(), "steps": STEPS}
    rows, table = [], {}
    for trace, make in TRACES.items():
        for rule in RULES:
            if rule in RESUMED_ONLY and trace != "resumed":
                continue
            runs = []
            for seed in range(args.seeds):
                steps = make(random.Random(seed), STEPS)
                median = statistics.median(steps)
                run = replay(rule, steps, resumed=trace == "resumed")
                runs.append({**run, "timeout_over_median_step": run["mean_timeout_s"] / median})
            figures = {
                "false_timeouts": sum(r["false_timeouts"] for r in runs),
                "runs_with_a_false_timeout": sum(r["false_timeouts"] > 0 for r in runs),
                "timeout_over_median_step": round(statistics.fmean(r["timeout_over_median_step"] for r in runs), 2),
                "changes_per_1000_steps": round(statistics.fmean(r["changes"] for r in runs) * 1000 / STEPS, 1),
            }
            table[f"{trace}/{rule}"] = figures
            rows.append([trace, rule, *figures.values()])
    results["figures"] = table
    results["seeds"] = args.seeds
    results["environment"] = environment()
    print_table(
        f"lowering rules, {STEPS} steps x {args.seeds} seeds per trace",
        ["trace", "rule", "false timeouts", "runs with one", "timeout / median step", "changes / 1000 steps"],
        rows,
    )
    print(f"wrote {write_results('learned_timeouts_rule', results)}")
    return results


if __name__ == "__main__":
    main()
