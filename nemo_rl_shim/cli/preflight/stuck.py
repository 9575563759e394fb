"""One policy for ranks that do not finish, in every runner: the grace after a failure, the line, the watchdog.

* After one rank fails, dies or gives up on its peers (a collective timed out on a stalled
  peer), the ranks still running get :data:`FAILURE_GRACE_S` to finish; then they are ended
  and named. One :class:`Grace` object holds that policy - when it started, why, when it ends,
  and the words that name the ranks it ended - and the spawn and Ray runners both drive it.
* A rank still running at ``--timeout-s`` is named by :func:`past_deadline`; one ended after
  the grace by :func:`after_grace`.
* A process that cannot bound its own wait (a joined rank, a Ray driver) starts a
  :func:`watchdog`, which ends it with one line.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["FAILURE_GRACE_S", "STUCK", "Grace", "after_grace", "past_deadline", "ranks_named", "watchdog"]

#: After one rank fails, dies or gives up on its peers, how long the others get to finish before they are ended.
FAILURE_GRACE_S = 15.0
#: What a rank that does not finish is, when nothing more is known.
STUCK = "a rank is stuck at start-up or in a collective"


def ranks_named(ranks: Iterable[int]) -> str:
    """``"rank 3"``, ``"ranks 0-1, 5"``."""
    ranks = list(ranks)
    return f"{'ranks' if len(set(ranks)) > 1 else 'rank'} {format_ranks(ranks)}"


@dataclass
class Grace:
    """The grace after a failure: started once, by the first rank that fails or gives up; ended ``seconds`` later.

    :meth:`start` records the cause (``"rank 0 failed (exit 1)"``). :meth:`remaining` and :meth:`over` are what a
    runner waits on; :attr:`why` is the reason given for every rank it then ends, with the same ``seconds`` the wait
    used.
    """

    seconds: float = FAILURE_GRACE_S
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    cause: str | None = None
    ends_at: float | None = None

    @property
    def started(self) -> bool:
        return self.ends_at is not None

    def start(self, cause: str) -> None:
        """Start the grace for ``cause``; a grace already started keeps its first cause and end."""
        if self.started:
            return
        self.cause = cause
        self.ends_at = self.clock() + self.seconds

    def remaining(self) -> float:
        """Seconds until the grace ends (infinite before it starts, 0 once it is over)."""
        return math.inf if self.ends_at is None else max(0.0, self.ends_at - self.clock())

    def over(self) -> bool:
        return self.ends_at is not None and self.clock() >= self.ends_at

    @property
    def why(self) -> str | None:
        """Why a rank was ended: ``"still running 15 s after rank 0 failed (exit 1)"``; None before the grace."""
        if self.cause is None:
            return None
        return f"still running {self.seconds:g} s after {self.cause}"


def past_deadline(ranks: Iterable[int], timeout_s: float, where: str = STUCK, whole_s: float | None = None) -> str:
    """``"ranks 0-1 did not finish within 60 s (--timeout-s): ..."``; where the ranks had only ``timeout_s`` of the
    command's ``whole_s`` (``--timeout-s`` bounds the whole command), ``"within 53.2 s (what --timeout-s 60 left for
    the ranks): ..."``."""
    bound = (
        "--timeout-s" if whole_s is None or whole_s == timeout_s else f"what --timeout-s {whole_s:g} left for the ranks"
    )
    return f"{ranks_named(ranks)} did not finish within {timeout_s:g} s ({bound}): {where}"


def after_grace(ranks: Iterable[int], why: str, where: str) -> str:
    """``"rank 1 did not finish: still running 15 s after ...: ..."``."""
    return f"{ranks_named(ranks)} did not finish: {why}: {where}"


def watchdog(
    seconds: float,
    line: str,
    last_words: Callable[[str], None] | None = None,
    end: Callable[[int], object] = os._exit,
) -> threading.Timer:
    """A started daemon timer that prints ``preflight: {line}`` and ends the process (``end(1)``: exit 1, at once)
    after ``seconds``; cancel it when the work ends. ``last_words(line)`` runs first (the JSON report's stand-in,
    with ``--json``)."""

    def expire() -> None:
        print(f"preflight: {line}", file=sys.stderr, flush=True)
        try:
            if last_words is not None:
                last_words(line)
        finally:
            end(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer
