"""One policy for ranks that do not finish, in every runner: the grace after a failure, the line, the watchdog.

* After one rank fails, dies or gives up on its peers (a collective timed out on a stalled
  peer), the ranks still running get :data:`FAILURE_GRACE_S` to finish; then they are ended
  and named as :func:`still_running` says.
* A rank still running at ``--timeout-s`` is named by :func:`past_deadline`; one ended after
  the grace by :func:`after_grace`.
* A process that cannot bound its own wait (a joined rank, a Ray driver) starts a
  :func:`watchdog`, which ends it with one line.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable

from nemo_rl_shim.rank_ranges import format_ranks

__all__ = ["FAILURE_GRACE_S", "STUCK", "after_grace", "past_deadline", "ranks_named", "still_running", "watchdog"]

#: After one rank fails, dies or gives up on its peers, how long the others get to finish before they are ended.
FAILURE_GRACE_S = 15.0
#: What a rank that does not finish is, when nothing more is known.
STUCK = "a rank is stuck at start-up or in a collective"


def ranks_named(ranks: Iterable[int]) -> str:
    """``"rank 3"``, ``"ranks 0-1, 5"``."""
    ranks = list(ranks)
    return f"{'ranks' if len(set(ranks)) > 1 else 'rank'} {format_ranks(ranks)}"


def still_running(cause: str) -> str:
    """Why a rank was ended after the grace: ``"still running 15 s after rank 0 failed (exit 1)"``."""
    return f"still running {FAILURE_GRACE_S:g} s after {cause}"


def past_deadline(ranks: Iterable[int], timeout_s: float, where: str = STUCK) -> str:
    """``"ranks 0-1 did not finish within 60 s (--timeout-s): ..."``."""
    return f"{ranks_named(ranks)} did not finish within {timeout_s:g} s (--timeout-s): {where}"


def after_grace(ranks: Iterable[int], why: str, where: str) -> str:
    """``"rank 1 did not finish: still running 15 s after ...: ..."``."""
    return f"{ranks_named(ranks)} did not finish: {why}: {where}"


def watchdog(seconds: float, line: str) -> threading.Timer:
    """A started daemon timer that prints ``preflight: {line}`` and ends the process (exit 1) after ``seconds``;
    cancel it when the work ends."""

    def expire() -> None:
        print(f"preflight: {line}", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer
