"""Rank function for tests/timeouts/test_learned_timeouts.py: a run that learns its timeouts, on real Gloo ranks.

One run through the real ``setup_distributed`` (tp 2 on 4 ranks: mesh axes and flattened axes),
in the order a training worker would go, reading every group torch holds
(``distributed_c10d._world.pg_map``) at each point. Returns JSON: timeouts in seconds, read from
each group's backends, and what each collective did.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.process_groups.registry import backend_timeouts
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import learned_timeouts, set_timeouts
from nemo_rl_shim.timeouts.learned_run import Learner
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["every_group", "learn_and_stall", "section"]

#: Bound on a rank's wait, through the store, for the stalled rank's peers to report.
_STORE_WAIT_S = 120


def section(params: dict[str, Any]) -> dict[str, Any]:
    """A ``policy`` section with ``learned_timeouts`` (``params``: startup, factor, min_steps, floor)."""
    learned = {"factor": params["factor"], "min_steps": params["min_steps"], "floor_minutes": params["floor"]}
    return {
        "automodel_cfg": {"distributed_timeout_minutes": params["startup"]},
        "nemo_rl_shim": {"learned_timeouts": learned},
        "dtensor_cfg": {"tensor_parallel_size": 2},
    }


def every_group(later: set[int]) -> list[dict[str, Any]]:
    """Every group torch holds in this process, with each backend's timeout in seconds; ``later``: ids of the
    groups made after set-up."""
    return [
        {
            "ranks": dist.get_process_group_ranks(group),
            "desc": getattr(group, "group_desc", ""),
            "made_after_setup": id(group) in later,
            "timeouts_s": {device: t.total_seconds() for device, t in backend_timeouts(group).items()},
        }
        for group in list(dist.distributed_c10d._world.pg_map)
    ]


def _work(seconds: float, group: ProcessGroup | None = None) -> float:
    """A step's body: compute (a sleep), then an all-reduce every rank joins; its duration on this rank."""
    start = time.monotonic()
    time.sleep(seconds)
    dist.all_reduce(torch.ones(1), group=group)
    return time.monotonic() - start


@contextmanager
def _timed(times: list[float]) -> Iterator[None]:
    start = time.monotonic()
    yield
    times.append(time.monotonic() - start)


def _steps(learner: Learner, durations: list[float], out: dict[str, list[float]]) -> None:
    for seconds in durations:
        with _timed(out["outer"]), learner.step():
            out["inner"].append(_work(seconds))


def _slow_phase(learner: Learner, seconds: float, *, peers_wait_inside: bool) -> dict[str, Any]:
    """Rank 0 works ``seconds`` inside ``phase("checkpoint")`` (a consolidated save); the others wait for it inside
    the phase (a barrier) or leave the body at once and wait in the learner's own exit."""
    times: list[float] = []
    with _timed(times), learner.phase("checkpoint"):
        inside_s = backend_timeouts(dist.group.WORLD)["cpu"].total_seconds()
        if dist.get_rank() == 0:
            time.sleep(seconds)
        if peers_wait_inside:
            dist.barrier()
    return {"inside_s": inside_s, "took_s": times[0], "completed": True}


def _stalled_step(learner: Learner, stall_s: float) -> dict[str, Any]:
    """The last rank stalls inside a step and never joins; the others' all-reduce must raise.

    The stalled rank waits (at most ``stall_s``) in the default group's store, not in a collective, until
    every peer has caught its error; then it says it is done, and the peers (rank 0 holds the store) wait
    for that before they return.
    """
    store = dist.distributed_c10d._get_default_store()
    rank, stalled = dist.get_rank(), dist.get_world_size() - 1
    in_force_s = backend_timeouts(dist.group.WORLD)["cpu"].total_seconds()  # read from the group itself
    if rank == stalled:
        with learner.step():
            store.wait([f"peer {r} caught it" for r in range(stalled)], datetime.timedelta(seconds=stall_s))
        store.set("stalled rank done", "1")
        return {"stalled": True, "in_force_s": in_force_s}
    start = time.monotonic()
    try:
        with learner.step():
            dist.all_reduce(torch.ones(1))
    except RuntimeError as error:
        outcome = {"outcome": "raised", "seconds": time.monotonic() - start, "error": str(error)[:300]}
    else:
        outcome = {"outcome": "completed", "seconds": time.monotonic() - start}
    store.set(f"peer {rank} caught it", "1")
    store.wait(["stalled rank done"], datetime.timedelta(seconds=_STORE_WAIT_S))
    rank_0_leaves_last("past the wait", _STORE_WAIT_S, expected=stalled)
    return {"stalled": False, "in_force_s": in_force_s, **outcome, "steps_after": learner.steps}


def _learn(run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The first ``min_steps`` steps: the first one longer (the start-up step)."""
    learner, times = run["learner"], {"inner": [], "outer": []}
    _steps(learner, [params["first_s"]] + [params["step_s"]] * (params["min_steps"] - 1), times)
    run["later"] |= {id(g) for g in dist.distributed_c10d._world.pg_map if id(g) not in run["at_setup"]}
    out = {"minutes": learner.minutes, "steps": learner.steps, "times": times, "phases": learner.phases}
    return {"learned": {**out, "groups": every_group(run["later"])}}


def _raise_alone(run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """``min_steps`` more steps; rank 0's second one is longer after the collective (its peers do not wait for it)."""
    learner, raised = run["learner"], {}
    for index in range(params["min_steps"]):
        with learner.step():
            _work(params["step_s"])
            if index == 1 and dist.get_rank() == 0:
                time.sleep(params["long_step_s"])
        if index == 1:
            raised = {"in_force_s": learner.in_force_minutes * 60, "agreed_minutes": learner.minutes}
    agreed = {"minutes": learner.minutes, "in_force_s": learner.in_force_minutes * 60}
    return {"raised_alone": raised, "agreed_again": {**agreed, "groups": every_group(run["later"])}}


def _phases(run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A group made now, then the slow phase twice, ``phase_extra_s`` longer than the steady value."""
    learner = run["learner"]
    run["later"].add(id(dist.new_group(list(range(dist.get_world_size())))))
    phase_s = learner.minutes * 60 + params["phase_extra_s"]
    phases = []
    for peers_wait_inside in (True, False):
        phase = _slow_phase(learner, phase_s, peers_wait_inside=peers_wait_inside)
        phase["groups_after"] = every_group(run["later"])
        phase["learned_minutes"] = learner.phases.get("checkpoint")
        phases.append(phase)
    return {"phase_s": phase_s, "phases": phases}


def _resume(run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Save the state, put every group back at the start-up value (a fresh process), load it into a new learner."""
    saved = run["learner"].state_dict()
    set_timeouts(run["context"], datetime.timedelta(minutes=params["startup"]))
    before_load = every_group(run["later"])
    resumed = run["learner"] = learned_timeouts(run["context"])
    resumed.load_state_dict(json.loads(json.dumps(saved)))
    out = {"minutes": resumed.minutes, "phases": resumed.phases, "state": resumed.state_dict()}
    out["groups"] = every_group(run["later"])
    _steps(resumed, [params["step_s"]], {"inner": [], "outer": []})  # its first step: the phase "first_step"
    out["after_first_step"] = {"steps": resumed.steps, "in_force_s": resumed.in_force_minutes * 60}
    return {"state": saved, "before_load": before_load, "resumed": out}


def _stall(run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    stall = _stalled_step(run["learner"], params["stall_s"])
    return {"stall": {**stall, "timeout_s": run["learner"].minutes * 60}}


STAGES = (_learn, _raise_alone, _phases, _resume, _stall)


def learn_and_stall(params: dict[str, Any]) -> dict[str, Any]:
    """Set up, learn, raise one rank, run a slow phase twice, save and load the state, then stall one rank.

    ``params``: the ``section`` keys, ``first_s`` (the first step's compute), ``step_s``,
    ``long_step_s`` (rank 0's step 6), ``phase_extra_s`` (the phase's length above the steady value),
    ``stall_s`` (the longest the stalled rank waits for its peers to catch it). A stage whose collective
    raises (a timeout cut a rank short) ends the run: ``failed`` names it, and what came before is kept.
    """
    context = setup_distributed(section(params), RuntimeConfig())
    out: dict[str, Any] = {"rank": dist.get_rank(), "startup": every_group(set())}
    run: dict[str, Any] = {"context": context, "at_setup": {id(g) for g in dist.distributed_c10d._world.pg_map}}
    run["later"] = {id(dist.new_group(list(range(dist.get_world_size()))))}  # as a library makes one after set-up
    run["learner"] = learned_timeouts(context)
    out["minutes_before"] = run["learner"].minutes
    for stage in STAGES:
        try:
            found = stage(run, params)
        except RuntimeError as error:
            out["failed"] = {"stage": stage.__name__, "error": str(error)[:400]}
            return out
        out.update(found)
    return out
