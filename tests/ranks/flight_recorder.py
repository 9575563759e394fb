"""Rank functions for tests/flight_recorder/test_flight_recorder.py: real stalls with the recorder on, Gloo ranks.

Each function runs on every rank started by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`, goes
through the real ``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on, makes one fault
happen, and returns what it saw; the dumps land in ``params["dump_dir"]``. The stalled rank never
enters the collective and sleeps in Python: its dump comes from the shim's watcher thread, asked
through the store by the rank that timed out. Ranks meet at the end through the default group's
store, not a process group (a timed-out Gloo group stays broken).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim import flight_recorder
from nemo_rl_shim.config import blocks
from nemo_rl_shim.process_groups.registry import named_groups
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["SCENARIOS", "run_scenario"]

_STORE_WAIT_S = 60
_DUMP_WAIT_S = 20
#: How long rank 0 of ``answered`` waits for every watcher (tests/flight_recorder/test_flight_recorder.py's bound).
ANSWER_WAIT_S = 20.0


def _section(params: dict[str, Any]) -> dict[str, Any]:
    knobs = {
        "distributed_timeout_minutes": params["startup"],
        "flight_recorder": {"enabled": True, "dump_dir": params["dump_dir"], "buffer_size": 200},
    }
    if params.get("steady") is not None:
        knobs["distributed_timeout_minutes_after_init"] = params["steady"]
    return {**blocks(knobs), "dtensor_cfg": {"tensor_parallel_size": params.get("tp", 1)}}


def _wait_for_own_dump(timeout_s: float = _DUMP_WAIT_S) -> bool:
    path = flight_recorder.dump_path(dist.get_rank())
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def _collective(what: str, run: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        with flight_recorder.dump_on_timeout(what):
            run()
    except RuntimeError as error:
        return {"outcome": "raised", "error": str(error)[:300], "seconds": time.monotonic() - start}
    return {"outcome": "completed", "seconds": time.monotonic() - start}


def _stall_then_wait(stall_s: float) -> dict[str, Any]:
    """The stalled rank: sleep (the watcher dumps when asked), then report whether the dump came."""
    time.sleep(stall_s)
    return {"outcome": "stalled", "dumped": _wait_for_own_dump()}


def _sub_groups(context: Any, stalled: int, stall_s: float) -> dict[str, Any]:
    """Four ranks, tp=2. On tp group [0, 1]: a broadcast with mismatched sizes, then both dump (``dump_now``).
    On tp group [2, 3]: rank 3 (``stalled``) never enters an all-reduce, rank 2 times out in it.

    Gloo completes the mismatched broadcast without an error (the receiver gets the first elements
    only), so nothing times out there; the dumps are the ones a training loop would take itself.
    """
    groups = named_groups(context.device_mesh, context.moe_mesh)
    for group in {id(g): g for g in groups.values()}.values():  # warm-up: one collective on every group
        dist.all_reduce(torch.ones(2), group=group)
    after_first_step(context)  # every group to the steady 3 s
    tp = groups["tp"]
    rank = dist.get_rank()
    out: dict[str, Any] = {"tp_ranks": dist.get_process_group_ranks(tp), "tp_is_default": tp is dist.group.WORLD}
    if rank in (0, 1):
        size = 8 if rank == 1 else 4
        out.update(_collective("mismatched broadcast", lambda: dist.broadcast(torch.ones(size), src=0, group=tp)))
        out["dump"] = str(flight_recorder.dump_now("after the mismatched broadcast"))
    elif rank == stalled:
        time.sleep(stall_s)
        out["outcome"] = "stalled"
    else:
        out.update(_collective("tp all_reduce", lambda: dist.all_reduce(torch.ones(2), group=tp)))
    out["dumped"] = _wait_for_own_dump()
    return out


def _phase_change(context: Any, stalled: int, stall_s: float) -> dict[str, Any]:
    """Rank ``stalled`` stalls through the barrier of ``after_first_step``; its peer times out in it."""
    dist.all_reduce(torch.ones(2))
    if dist.get_rank() == stalled:
        return _stall_then_wait(stall_s)
    return _collective("after_first_step", lambda: after_first_step(context))


def _dead_rank(context: Any, stalled: int, stall_s: float) -> dict[str, Any]:
    """Rank ``stalled`` dies (``os._exit``) before the collective; its peer's all-reduce fails or times out."""
    del stall_s
    after_first_step(context)  # every group to the steady 3 s
    dist.all_reduce(torch.ones(2))
    if dist.get_rank() == stalled:
        os._exit(17)
    return _collective("all_reduce with a dead peer", lambda: dist.all_reduce(torch.ones(2)))


def _answered(context: Any, stalled: int, stall_s: float) -> dict[str, Any]:
    """Rank 0 asks every rank's watcher to dump (nothing stalled) and times the answers; the others wait for
    their own dump (their watcher's)."""
    del context, stalled, stall_s
    dist.barrier()  # every watcher is running (record_groups started it in setup_distributed)
    if dist.get_rank() != 0:
        return {"dumped": _wait_for_own_dump()}
    start = time.monotonic()
    answered = flight_recorder.request_peer_dumps("the test asks", wait_s=ANSWER_WAIT_S)
    return {"answered": answered, "seconds": time.monotonic() - start, "dumped": _wait_for_own_dump()}


SCENARIOS = {"sub_groups": _sub_groups, "phase_change": _phase_change, "dead_rank": _dead_rank, "answered": _answered}


def run_scenario(params: dict[str, Any]) -> dict[str, Any]:
    """Set up with the recorder on, run ``params["scenario"]``, meet through the store, return the facts."""
    context = setup_distributed(_section(params), RuntimeConfig())
    stalled = dist.get_world_size() - 1
    out = {"rank": dist.get_rank(), "stalled": dist.get_rank() == stalled, "env": _recorder_env()}
    out.update(SCENARIOS[params["scenario"]](context, stalled, params["stall_s"]))
    if params["scenario"] != "dead_rank":  # nobody to meet
        rank_0_leaves_last(f"done/{params['scenario']}", _STORE_WAIT_S)
    return out


def _recorder_env() -> dict[str, str]:
    names = [name for pair in flight_recorder.ENV_PAIRS.values() for name in pair]
    return {name: os.environ[name] for name in names if name in os.environ}
