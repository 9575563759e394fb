"""Rank functions for tests/hang_report/test_hang_kinds_progress.py: a slow rank still working, the same rank
asleep, and a circular wait across three groups, on real Gloo ranks with the recorder on.

Every rank goes through the real ``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on (start-up
timeout as the test gives it, 1 min; then 0.05 min, 3 s, once ``after_first_step`` has run after a first step that
all-reduces).

* ``still_writing`` (4 ranks): every rank enters ``dump_on_timeout("checkpoint save")``; rank 3 writes its shard
  there (a loop over 1 MB writes, overwriting one 8 MB file, until it is killed), the others wait in a barrier,
  which times out after 3 s. Rank 3's stack watch samples it 3 times (the timeout plus ``STACK_GRACE_S``, then a
  second apart), and its helper process reads its counters each time.
* ``asleep`` (4 ranks): the same, but rank 3 sleeps in the block instead of writing.
* ``circular`` (6 ranks): three groups, ``g1`` = ranks 0-3, ``g2`` = ranks 2-5, ``g3`` = ranks 4-5 and 0-1, made by
  every rank in one order, each used once by all its members (so each rank's dump lists the groups it is in). Then
  ranks 0-1 all-reduce on ``g1``, ranks 2-3 on ``g2`` and ranks 4-5 on ``g3``, each before the other group it is
  in: each waits on ranks that wait in the next group, and every rank times out.

The stuck rank of the first two stays (:data:`STUCK_S`) until the test kills it. The ranks that return meet through
the default store: each stays until all are out of the scenario, and rank 0, which serves it, leaves last.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim.config import blocks
from nemo_rl_shim.flight_recorder import recorder as flight_recorder
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["CIRCLE", "SLOW", "STUCK_S", "WORLDS", "line_of", "run_world"]

#: World size per scenario.
WORLDS = {"still_writing": 4, "asleep": 4, "circular": 6}
#: The slow rank of the first two.
SLOW = 3
#: How long the slow rank stays unless killed (the test kills it long before).
STUCK_S = 120
#: The circular wait's groups (their members), and the order in which each pair of ranks uses them at the hang.
CIRCLE = {"g1": [0, 1, 2, 3], "g2": [2, 3, 4, 5], "g3": [4, 5, 0, 1]}
_FIRST = {0: "g1", 1: "g1", 2: "g2", 3: "g2", 4: "g3", 5: "g3"}
_MEET_S = 60
#: Each circular group's timeout while it connects and warms up (then the scenario's own, 3 s).
_CONNECT_S = 120
_CHUNK = b"\0" * (1 << 20)
_SHARD_CHUNKS = 8


def _section(params: dict[str, Any]) -> dict[str, Any]:
    recorder = {"enabled": True, "dump_dir": params["dump_dir"], "buffer_size": 200}
    knobs = {
        "distributed_timeout_minutes": params["startup"],
        "distributed_timeout_minutes_after_init": params["steady"],
        "flight_recorder": recorder,
    }
    return {**blocks(knobs), "dtensor_cfg": {"tensor_parallel_size": 1}}


def _write_shard(path: Path) -> None:
    with open(path, "wb") as shard:
        end = time.monotonic() + STUCK_S
        while time.monotonic() < end:
            for _ in range(_SHARD_CHUNKS):
                shard.write(_CHUNK)  # the write: still_writing
            shard.seek(0)


def _sleep_in_checkpoint() -> None:
    time.sleep(STUCK_S)  # the sleep: asleep


def line_of(mark: str) -> int:
    """The line of this file whose comment is ``# the <mark>``."""
    with open(__file__, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.rstrip().endswith(f"  # the {mark}"):
                return number
    raise LookupError(f"no line of {__file__} is marked {mark!r}")


def _meet(expected: int) -> None:
    """Every rank that returns waits until all ``expected`` are out of the scenario, then rank 0 leaves last: a rank
    that left at once closed its connections while a peer still waited on it, which then read "Connection closed by
    peer" instead of its own timeout (the circular world, two suites on 2 cores)."""
    store = dist.distributed_c10d._get_default_store()
    store.add("done", 1)
    end = time.monotonic() + _MEET_S
    while int(store.add("done", 0)) < expected and time.monotonic() < end:
        time.sleep(0.05)
    rank_0_leaves_last("left", _MEET_S, expected=expected, store=store)


def _slow_rank(kind: str, rank: int, dump_dir: str) -> None:
    """The checkpoint block: rank 3 writes (or sleeps) there, the others wait for it in a barrier."""
    with flight_recorder.dump_on_timeout("checkpoint save"):
        if rank != SLOW:
            dist.barrier()  # the barrier: the peers wait
        elif kind == "still_writing":
            _write_shard(Path(dump_dir) / "shard.bin")
        else:
            _sleep_in_checkpoint()


def _circular(rank: int, timeout: datetime.timedelta) -> None:
    """Make the three groups (every rank, one order), use each once, then each pair of ranks in its own order.

    The groups connect and warm up at :data:`_CONNECT_S`, and take the scenario's short ``timeout`` only then: at a
    load of 40 on 2 cores a member reached a warm-up more than 3 s after its peers, and the rank failed before the
    circular wait began.
    """
    connect = datetime.timedelta(seconds=_CONNECT_S)
    groups = {name: dist.new_group(members, timeout=connect) for name, members in CIRCLE.items()}
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout  # set_timeout: torch 2.15
    for name, members in CIRCLE.items():
        if rank in members:
            dist.all_reduce(torch.ones(2), group=groups[name])  # the warm-up: every member once
            setter(timeout, groups[name])
    first = _FIRST[rank]
    then = next(name for name, members in CIRCLE.items() if rank in members and name != first)
    with flight_recorder.dump_on_timeout("exchange"):
        dist.all_reduce(torch.ones(4), group=groups[first])  # the wait: each in its first group
        dist.all_reduce(torch.ones(4), group=groups[then])


def run_world(params: dict[str, Any]) -> dict[str, Any]:
    """Set up with the recorder on, run a first step, then the scenario of ``params["kind"]``; meet, and say what
    happened."""
    kind = params["kind"]
    context = setup_distributed(_section(params), RuntimeConfig())
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
    with flight_recorder.dump_on_timeout("train step"):
        dist.all_reduce(torch.ones(4))
    after_first_step(context)
    out["timeout_s"] = flight_recorder._current_timeout_s()
    try:
        if kind == "circular":
            _circular(rank, datetime.timedelta(seconds=out["timeout_s"]))
        else:
            _slow_rank(kind, rank, params["dump_dir"])
    except RuntimeError as error:
        lines = str(error).strip().splitlines()
        out["error"] = lines[0][:300] if lines else type(error).__name__
    _meet(WORLDS[kind] - (0 if kind == "circular" else 1))
    return out
