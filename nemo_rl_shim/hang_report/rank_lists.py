"""A list of ranks in the report's JSON, bounded by what the input holds, not by a number it states.

A world is stated as a number (a 35-byte group map may say ``"world_size": 1048576``), and the ranks that left no
dump are counted from it: written one by one, 1,048,572 of them printed 60.5 MB. So a list of ranks is written in
full up to :data:`RANKS_IN_FULL` ranks (every list a job of that size makes, as before), and past that as
``{"count": n, "runs": [[first, last], ...]}``: one pair per run of consecutive ranks, and the runs of ranks
missing from a world are bounded by the dumps that are there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nemo_rl_shim.one_line.rank_ranges import rank_runs

__all__ = ["RANKS_IN_FULL", "ranks_json"]

#: Lists of at most this many ranks are written rank by rank.
RANKS_IN_FULL = 4096


def ranks_json(ranks: Sequence[int] | Iterable[int]) -> list[int] | dict[str, Any]:
    """``ranks`` as the JSON writes them (see the module docstring)."""
    if isinstance(ranks, range) and ranks.step == 1 and len(ranks) > RANKS_IN_FULL:
        return {"count": len(ranks), "runs": [[ranks.start, ranks[-1]]]}
    listed = list(ranks)
    if len(listed) <= RANKS_IN_FULL:
        return listed
    return {"count": len(listed), "runs": [list(run) for run in rank_runs(listed)]}
