"""A list of ranks as a person reads it: ``[0, 1, 2, 3, 5]`` -> ``"0-3, 5"``.

One formatter for every report (preflight, dry run, hang report), so a line about 1,024 ranks
stays one short line: runs of consecutive ranks become ranges, a regular stride is written once,
and past ``limit`` parts only the first ones and the count are kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from nemo_rl_shim.config.integers import positive_int

__all__ = ["format_ranks", "rank_runs"]

#: Parts (ranges or single ranks) printed before the rest is summarised as a count.
DEFAULT_LIMIT = 8


def rank_runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, de-duplicated ``ranks`` as inclusive ``(first, last)`` runs of consecutive ranks."""
    runs: list[tuple[int, int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def _stride(ordered: list[int]) -> int | None:
    """The common step of ``ordered`` when it is an arithmetic progression of at least 3 with step > 1."""
    if len(ordered) < 3:
        return None
    step = ordered[1] - ordered[0]
    if step <= 1 or any(b - a != step for a, b in itertools.pairwise(ordered)):
        return None
    return step


def format_ranks(ranks: Iterable[int], limit: int = DEFAULT_LIMIT) -> str:
    """``"0-3, 5"``; ``"0, 8, ..., 8184 (1024 ranks)"`` for a stride; ``"0-1, 4-5, ... (N ranks)"`` past ``limit``."""
    positive_int(limit, "limit")
    ordered = sorted(set(ranks))
    runs = rank_runs(ordered)
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) <= limit:
        return ", ".join(parts)
    step = _stride(ordered)
    if step is not None:
        return f"{ordered[0]}, {ordered[1]}, ..., {ordered[-1]} ({len(ordered)} ranks)"
    return f"{', '.join(parts[: limit - 1])}, ..., {parts[-1]} ({len(ordered)} ranks)"
