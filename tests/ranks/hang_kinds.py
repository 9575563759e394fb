"""Rank functions for tests/hang_report/test_hang_kinds.py: five kinds of hang on 4 real Gloo ranks, recorder on.

Every rank goes through the real ``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on (start-up
timeout 0.2 min; 0.05 min, 3 s, once ``after_first_step`` has run after the first step), then runs
:data:`STEPS` training steps, each inside ``flight_recorder.dump_on_timeout("train step")`` (which also
watches the block: a rank still in it after the timeout plus ``STACK_GRACE_S`` writes its stack), each
all-reducing a loss. In step :data:`HANG_STEP` one rank goes wrong, by ``params["kind"]``:

* ``python_sleep``: rank 3 sleeps in Python before its all-reduce (its dump watcher, a Python thread,
  still dumps when asked; the watchdog writes its stack);
* ``gil_c_call``: rank 3 calls libc's ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL: its
  watcher cannot run, so it leaves no dump; faulthandler's C watchdog writes its stack all the same;
* ``skipped``: ranks 0-2 all-reduce a metric (2 elements) that rank 3 skips; rank 3's next all-reduce,
  its loss (4 elements), meets theirs, and every rank times out;
* ``size_mismatch``: rank 2 all-reduces 8 elements where the others all-reduce 4;
* ``dead``: rank 1 exits (``os._exit(17)``) in the middle of the step.

The stuck rank of the first two stays stuck (:data:`STUCK_S`) until the test kills it. The ranks that
return meet through the default store, so that rank 0, which serves it, leaves last.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim.config import blocks
from nemo_rl_shim.flight_recorder import recorder as flight_recorder
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["HANG_STEP", "KINDS", "STEPS", "STUCK", "STUCK_S", "call_line", "run_kind", "stall_line"]

STEPS, HANG_STEP = 4, 2
#: How long a stuck rank stays stuck unless killed (the test kills it long before).
STUCK_S = 120
#: The rank that goes wrong, per kind.
KINDS = {"python_sleep": 3, "gil_c_call": 3, "skipped": 3, "size_mismatch": 2, "dead": 1}
#: The kinds whose rank stays stuck in its step.
STUCK = ("python_sleep", "gil_c_call")
_MEET_S = 60


def _section(params: dict[str, Any]) -> dict[str, Any]:
    recorder = {"enabled": True, "dump_dir": params["dump_dir"], "buffer_size": 200}
    knobs = {
        "distributed_timeout_minutes": params["startup"],
        "distributed_timeout_minutes_after_init": params["steady"],
        "flight_recorder": recorder,
    }
    return {**blocks(knobs), "dtensor_cfg": {"tensor_parallel_size": 1}}


def _python_sleep() -> None:
    time.sleep(STUCK_S)  # the stall: python_sleep


def _c_call_holding_the_gil() -> None:
    libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL through the call
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(STUCK_S)  # the stall: gil_c_call


def _step(kind: str, step: int, rank: int) -> None:
    """One training step: the loss all-reduce, and in :data:`HANG_STEP` the fault of ``kind``."""
    odd = step == HANG_STEP and rank == KINDS[kind]
    if odd and kind == "python_sleep":
        _python_sleep()
    elif odd and kind == "gil_c_call":
        _c_call_holding_the_gil()
    elif odd and kind == "dead":
        os._exit(17)
    if step == HANG_STEP and kind == "skipped" and not odd:
        dist.all_reduce(torch.ones(2))  # the call: metric (rank 3 skips it)
    size = 8 if odd and kind == "size_mismatch" else 4
    dist.all_reduce(torch.ones(size))  # the call: loss


def stall_line(kind: str) -> int:
    """The line of this file where the stuck rank of ``kind`` stalls (marked ``# the stall: <kind>``)."""
    return _marked(f"# the stall: {kind}")


def call_line(what: str) -> int:
    """The line of this file where a step calls its ``what`` all-reduce ("loss", "metric"; marked
    ``# the call: <what>``): where torch's recorder says the collective was called."""
    return _marked(f"# the call: {what}")


def _marked(mark: str) -> int:
    """The first line of code that ends with the comment ``mark`` (up to its end, or an opening parenthesis)."""
    with open(__file__, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            comment = line.partition("  # ")[2].rstrip()
            if comment == mark[2:] or comment.startswith(f"{mark[2:]} ("):
                return number
    raise LookupError(f"no line of {__file__} is marked {mark!r}")


def run_kind(params: dict[str, Any]) -> dict[str, Any]:
    """Set up with the recorder on, run the steps of ``params["kind"]``, meet, and say what happened."""
    kind = params["kind"]
    context = setup_distributed(_section(params), RuntimeConfig())
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "steps_done": 0}
    for step in range(STEPS):
        try:
            with flight_recorder.dump_on_timeout("train step"):
                _step(kind, step, rank)
        except RuntimeError as error:
            lines = str(error).strip().splitlines()
            out.update(failed_step=step, error=lines[0][:300] if lines else type(error).__name__)
            break
        out["steps_done"] = step + 1
        if step == 0:
            after_first_step(context)
    out["timeout_s"] = flight_recorder._current_timeout_s()
    rank_0_leaves_last("done", _MEET_S, expected=4 if kind in ("skipped", "size_mismatch") else 3)
    return out
