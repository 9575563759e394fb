"""The end of a rank function: rank 0, which serves the store, leaves last.

A rank that returns ends its process, and rank 0's process holds the default group's ``TCPStore`` server.
A peer still in a store call when it goes reads ``Connection reset by peer`` (seen with two suites on 2 cores).
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

__all__ = ["rank_0_leaves_last"]


def rank_0_leaves_last(key: str, timeout_s: float, *, expected: int | None = None, store: Any = None) -> None:
    """Every rank reports under ``key`` (on ``store``, by default the default group's); rank 0 then waits, at most
    ``timeout_s``, until ``expected`` ranks (by default the whole world) have, and only then returns."""
    store = dist.distributed_c10d._get_default_store() if store is None else store
    expected = dist.get_world_size() if expected is None else expected
    store.add(key, 1)
    end = time.monotonic() + timeout_s
    while dist.get_rank() == 0 and int(store.add(key, 0)) < expected and time.monotonic() < end:
        time.sleep(0.05)
