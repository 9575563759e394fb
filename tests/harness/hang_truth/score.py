"""The hang report scored against a scenario's truth, run as a user runs it (#42).

:func:`score` runs ``python -m nemo_rl_shim hang-report DIR --json`` in a fresh process, bounded by
:data:`COMMAND_BOUND_S`, and :func:`judge` (pure) calls the outcome, by :mod:`.truth`'s rules:

* **right**: exit 1, the report's kind (``kind.name`` in its JSON) one of ``Truth.kinds``, and the ranks it names
  (``kind.ranks``) the truth's, as a set;
* **honest**: exit 1 and a kind that says it cannot tell (:data:`HONEST_KINDS`);
* **wrong**: anything else: exit 0 (a healthy verdict on a hang), exit 2 (the run is readable: every scenario's
  folder is one run's files), no JSON, past the bound, a kind the truth does not hold, or a wrong culprit.

The result (:class:`Scored`) keeps the first line and why, for the table and the list of wrong scenarios.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.at_once import run_at_once
from tests.harness.hang_truth.truth import Scenario, Score, Truth
from tests.harness.paths import REPO_ROOT

__all__ = ["COMMAND_BOUND_S", "HONEST_KINDS", "Reported", "Scored", "judge", "run_report", "score"]

#: The command is killed (with everything it started) this long after its start: a world of 8 ranks reads in
#: under a second; room for a loaded machine.
COMMAND_BOUND_S = 120.0
#: The report's kinds that say what cannot be told rather than who is to blame.
HONEST_KINDS = frozenset({"cannot_tell", "unclear"})


@dataclass(frozen=True)
class Reported:
    """What the command did: its exit code (None: killed at the bound), its ``--json`` payload (None: none on
    stdout), the end of its stderr, and its wall time."""

    exit_code: int | None
    payload: dict[str, Any] | None
    stderr: str
    wall_s: float

    @property
    def line(self) -> str:
        if self.payload is not None and isinstance(self.payload.get("line"), str):
            return self.payload["line"]
        return self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""

    @property
    def kind(self) -> dict[str, Any]:
        found = (self.payload or {}).get("kind")
        return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class Scored:
    """One scenario's score: right, honest or wrong, why, and what the report said."""

    score: Score
    why: str
    line: str
    exit_code: int | None
    kind: str | None
    variant: str | None
    ranks: tuple[int, ...]
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "why": self.why,
            "line": self.line,
            "exit_code": self.exit_code,
            "kind": self.kind,
            "variant": self.variant,
            "ranks": list(self.ranks),
            "wall_s": round(self.wall_s, 2),
        }


def run_report(directory: Path, *, bound_s: float = COMMAND_BOUND_S) -> Reported:
    """``python -m nemo_rl_shim hang-report DIR --json`` in a fresh process, from the repository's root."""
    args = [sys.executable, "-m", "nemo_rl_shim", "hang-report", str(directory), "--json"]
    done = run_at_once({"report": (args, dict(os.environ))}, timeout_s=bound_s, cwd=REPO_ROOT)["report"]
    try:
        payload = json.loads(done.stdout) if done.stdout.strip() else None
    except ValueError:
        payload = None
    payload = payload if isinstance(payload, dict) else None
    return Reported(done.returncode, payload, done.stderr[-2000:], done.wall_s)


def _names(ranks: Any) -> tuple[int, ...]:
    return tuple(r for r in ranks if isinstance(r, int)) if isinstance(ranks, list) else ()


def judge(truth: Truth, reported: Reported) -> tuple[Score, str]:
    """Right, honest or wrong (see the module docstring), and why, in words."""
    code, kind = reported.exit_code, reported.kind
    if code is None:
        return "wrong", "the command ran past its bound"
    if reported.payload is None:
        return "wrong", f"exit {code} and no JSON on stdout"
    if code == 0:
        return "wrong", "exit 0: a healthy verdict on a hang"
    if code == 2:
        return "wrong", "exit 2 on a readable run"
    if code != 1:
        return "wrong", f"exit {code}"
    name, ranks = kind.get("name"), _names(kind.get("ranks"))
    if name in truth.kinds and set(ranks) == set(truth.ranks):
        return "right", f"{name}, ranks {list(ranks)}"
    if name in HONEST_KINDS:
        return "honest", f"{name}: says it cannot tell"
    if name in truth.kinds:
        return "wrong", f"{name} names ranks {sorted(ranks)}, the truth ranks {sorted(truth.ranks)}"
    right = ", ".join(sorted(truth.kinds)) or "none (only 'cannot tell' is honest)"
    return "wrong", f"kind {name} (ranks {sorted(ranks)}); right: {right} with ranks {sorted(truth.ranks)}"


def score(scenario: Scenario, *, bound_s: float = COMMAND_BOUND_S) -> Scored:
    """Run the command on the scenario's folder and judge it against its truth."""
    reported = run_report(scenario.directory, bound_s=bound_s)
    verdict, why = judge(scenario.truth, reported)
    kind = reported.kind
    name, variant = kind.get("name"), kind.get("variant")
    return Scored(
        verdict, why, reported.line, reported.exit_code,
        name if isinstance(name, str) else None, variant if isinstance(variant, str) else None,
        _names(kind.get("ranks")), reported.wall_s,
    )  # fmt: skip
