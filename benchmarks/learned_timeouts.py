"""What learned timeouts cost and what they buy, on 4 real Gloo ranks through the real ``setup_distributed``.

Three parts, each its own spawn of 4 ranks (tp 2: 9 process groups per rank), each writing
``results/learned_timeouts_<part>.json``:

1. **cost**: the learner's own cost per step. Steps of one all-reduce (16 float32), with
   ``learner.step()`` around them and with nothing (the floor), alternating in blocks of 250, 2,000 of
   each after 100 warm-up all-reduces. The learner's own time of a step is the step's time outside its
   body (``with`` included), the same measure as the floor's; the cost is the difference of the two
   means, over the steps that do not change the timeout (the agreements every ``min_steps`` steps are
   counted in). Default settings (factor 5, ``min_steps`` 8, floor 1 min), so the value changes once,
   at the first agreement. Also timed: ``set_timeouts`` on every group, what a step that changes the
   timeout adds. Target: at most 1% of a 1 s step, 10 ms.
2. **false**: 20 healthy runs (a fresh learner each, the groups put back at the 1-minute start-up
   value), each of 32 steps whose compute is drawn from 30 to 90 ms (3x; the same draw on every rank,
   each rank 0 to 10% faster at random) then an all-reduce, and a checkpoint phase after steps 8, 16
   and 24 drawn from 20x that range (0.6 to 1.8 s) then a barrier. Floor 1 ms, factor 5, ``min_steps``
   8: the learned values, not the floor, are what the steps run under. A false timeout is any
   collective that raises. Also recorded: the highest fraction of its timeout any step or phase used.
3. **detect**: steps of 1 s (compute, then an all-reduce); after ``min_steps`` (8) steps the last
   rank stalls inside its next step and never joins; the others' all-reduce must raise. The time from
   entering it to the error is the detection time. Measured for real with the floor at 1 s (the value
   learned from the steps, about 5 s, 3 repeats) and with the default floor of 1 minute (1 repeat);
   each repeat on a fresh default group (a Gloo group that timed out stays broken). A hand-set 10
   minutes and the 45-minute start-up value are not waited for: their figures are the value plus the
   overshoot measured here (detection minus timeout), which ``hang_detection_phases.py`` also found
   constant (3.003 s at 3 s, 20.004 s at 20 s).

Run: ``uv run python benchmarks/learned_timeouts.py [--only cost|false|detect]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import RankSync, environment, print_table, run_ranks, set_rank_env, write_results

__all__ = ["cost", "detect", "false_timeouts", "main"]

WORLD = 4
STEP_BLOCK, BLOCKS, WARM_UP = 250, 8, 100
SET_CALLS = 200
TARGET_S = 0.01  # 1% of a 1 s step


def _section(startup_min: float, **learned: Any) -> dict[str, Any]:
    return {
        "automodel_cfg": {"distributed_timeout_minutes": startup_min},
        "nemo_rl_shim": {"learned_timeouts": learned},
        "dtensor_cfg": {"tensor_parallel_size": 2},
    }


# ----------------------------------------------------------------------------- rank side: cost


def _timed_step(learner: Any, mode: str, tensor: Any) -> dict[str, Any]:
    import torch.distributed as dist

    before, steps = learner.in_force_minutes, learner.steps
    start = time.perf_counter()
    with learner.step() if mode == "learner" else nullcontext():
        body_start = time.perf_counter()
        dist.all_reduce(tensor)
        body = time.perf_counter() - body_start
    whole = time.perf_counter() - start
    agreed = mode == "learner" and (steps == 0 or learner.steps % learner.settings.min_steps == 0)
    changed = learner.in_force_minutes != before
    return {"mode": mode, "own": whole - body, "whole": whole, "changed": changed, "agreed": agreed}


def cost(params: dict[str, Any]) -> dict[str, Any]:
    """Rank function: alternate blocks of bare and learner steps; then time ``set_timeouts`` on every group."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
    from nemo_rl_shim.timeouts import learned_timeouts, set_timeouts

    context = setup_distributed(_section(45.0), RuntimeConfig())
    learner = learned_timeouts(context)
    tensor = torch.ones(16)
    for _ in range(WARM_UP):
        dist.all_reduce(tensor)
    rows = []
    for block in range(BLOCKS):
        for mode in ("bare", "learner") if block % 2 == 0 else ("learner", "bare"):
            rows.extend(_timed_step(learner, mode, tensor) for _ in range(STEP_BLOCK))
    groups = len(dist.distributed_c10d._world.pg_map)
    values = [datetime.timedelta(minutes=1), datetime.timedelta(minutes=2)]
    samples = []
    for index in range(SET_CALLS):
        start = time.perf_counter()
        set_timeouts(context, values[index % 2], barrier=False)
        samples.append(time.perf_counter() - start)
    return {"rank": dist.get_rank(), "rows": rows, "groups": groups, "set_s": samples, "minutes": learner.minutes}


# ----------------------------------------------------------------------------- rank side: false timeouts


def _one_run(context: Any, params: dict[str, Any], draws: random.Random, own: random.Random) -> dict[str, Any]:
    """One healthy run under a fresh learner; the highest fraction of its timeout each kind of work used."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.timeouts import learned_timeouts

    learner = learned_timeouts(context)
    lo, hi = params["step_s"]
    worst = {"step": 0.0, "phase": 0.0}
    for step in range(1, params["steps"] + 1):
        compute = draws.uniform(lo, hi)
        start = time.monotonic()
        with learner.step():
            in_force = learner.in_force_minutes * 60
            time.sleep(compute * own.uniform(0.9, 1.0))
            dist.all_reduce(torch.ones(1))
        worst["step"] = max(worst["step"], (time.monotonic() - start) / in_force)
        if step in params["phase_after"]:
            compute = draws.uniform(lo * params["phase_x"], hi * params["phase_x"])
            start = time.monotonic()
            with learner.phase("checkpoint"):
                in_force = learner.in_force_minutes * 60
                time.sleep(compute * own.uniform(0.9, 1.0))
                dist.barrier()
            worst["phase"] = max(worst["phase"], (time.monotonic() - start) / in_force)
    return {
        "worst": worst,
        "steady_s": learner.minutes * 60,
        "phases_s": {k: v * 60 for k, v in learner.phases.items()},
    }


def false_timeouts(params: dict[str, Any]) -> dict[str, Any]:
    """Rank function: ``runs`` healthy runs, each with a fresh learner; stops at the first collective that raises."""
    import torch.distributed as dist

    from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
    from nemo_rl_shim.timeouts import set_timeouts

    context = setup_distributed(_section(params["startup_min"], floor_minutes=params["floor_min"]), RuntimeConfig())
    draws, own = random.Random(params["seed"]), random.Random(1000 + dist.get_rank())
    runs, failure = [], None
    started = time.monotonic()
    for run in range(params["runs"]):
        set_timeouts(context, datetime.timedelta(minutes=params["startup_min"]))  # a new run starts at start-up
        try:
            runs.append(_one_run(context, params, draws, own))
        except RuntimeError as error:
            failure = {"run": run, "error": str(error)[:300]}
            break
    return {"rank": dist.get_rank(), "runs": runs, "failure": failure, "wall_s": time.monotonic() - started}


# ----------------------------------------------------------------------------- rank side: detection


def _stall_once(sync: RankSync, key: str, learner: Any, step_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    stalled = sync.world_size - 1
    timeout_s = learner.in_force_minutes * 60
    if sync.rank == stalled:
        with learner.step():  # stuck in its step: never reaches the all-reduce, until every peer caught it
            sync.store.wait([f"caught/{key}/{r}" for r in range(stalled)], datetime.timedelta(seconds=600))
        return {"stalled": True, "timeout_s": timeout_s}
    start = time.monotonic()
    try:
        with learner.step():
            time.sleep(step_s)
            entered = time.monotonic()
            dist.all_reduce(torch.ones(1))
    except RuntimeError as error:
        row = {"detect_s": time.monotonic() - entered, "from_step_start_s": time.monotonic() - start}
        row["error"] = str(error)[:200]
    else:
        row = {"detect_s": None}
    sync.store.set(f"caught/{key}/{sync.rank}", "1")
    return {"stalled": False, "timeout_s": timeout_s, **row}


def detect(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank function: per configuration and repeat, a fresh default group learns, then the last rank stalls."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
    from nemo_rl_shim.timeouts import learned_timeouts

    sync = RankSync(timeout_s=900)
    rows = []
    for config in params["configs"]:
        for repeat in range(config["repeats"]):
            key = f"{config['name']}/{repeat}"
            set_rank_env(sync.rank, sync.world_size, sync.port(key))
            section = _section(params["startup_min"], floor_minutes=config["floor_min"], min_steps=params["min_steps"])
            learner = learned_timeouts(setup_distributed(section, RuntimeConfig()))
            for _ in range(params["min_steps"]):
                with learner.step():
                    time.sleep(params["step_s"])
                    dist.all_reduce(torch.ones(1))
            row = _stall_once(sync, key, learner, params["step_s"])
            rows.append({"configuration": config["name"], "repeat": repeat, "rank": sync.rank, **row})
            dist.destroy_process_group()
            sync.barrier(f"done/{key}")
    return rows


# ----------------------------------------------------------------------------- driver


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _cost_summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    per_rank = []
    for rank in ranks:
        rows = rank["rows"]
        bare = [r["own"] for r in rows if r["mode"] == "bare"]
        kept = [r for r in rows if r["mode"] == "learner" and not r["changed"]]
        agreed = [r["own"] for r in kept if r["agreed"]]
        ordinary = [r["own"] for r in kept if not r["agreed"]]
        changed = [r["own"] for r in rows if r["mode"] == "learner" and r["changed"]]
        whole_bare = _mean([r["whole"] for r in rows if r["mode"] == "bare"])
        per_rank.append(
            {
                "own_cost_s": _mean([r["own"] for r in kept]) - _mean(bare),
                "ordinary_median_s": statistics.median(ordinary) - statistics.median(bare),
                "agreement_mean_s": _mean(agreed) - _mean(bare),
                "agreements": len(agreed),
                "changed_steps": len(changed),
                "changed_mean_s": _mean(changed) - _mean(bare),
                "step_delta_s": _mean([r["whole"] for r in kept]) - whole_bare,
                "bare_step_s": whole_bare,
                "set_timeouts_median_s": statistics.median(rank["set_s"]),
            }
        )
    keys = per_rank[0].keys()
    worst = {k: max(r[k] for r in per_rank) for k in keys}
    return {
        "worst_rank": worst,
        "per_rank": per_rank,
        "groups_per_rank": ranks[0]["groups"],
        "steps_per_mode": STEP_BLOCK * BLOCKS,
        "learned_minutes": ranks[0]["minutes"],
        "target_s": TARGET_S,
        "met": worst["own_cost_s"] <= TARGET_S,
    }


def _false_summary(ranks: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    failures = [r["failure"] for r in ranks if r["failure"]]
    runs = [run for r in ranks for run in r["runs"]]
    return {
        "runs_completed": min(len(r["runs"]) for r in ranks),
        "runs_planned": params["runs"],
        "false_timeouts": len({f["run"] for f in failures}),
        "failures": failures,
        "worst_step_fraction": round(max(run["worst"]["step"] for run in runs), 3),
        "worst_phase_fraction": round(max(run["worst"]["phase"] for run in runs), 3),
        "steady_s": [round(min(run["steady_s"] for run in runs), 3), round(max(run["steady_s"] for run in runs), 3)],
        "checkpoint_s": [
            round(min(run["phases_s"]["checkpoint"] for run in runs), 3),
            round(max(run["phases_s"]["checkpoint"] for run in runs), 3),
        ],
        "wall_s": round(max(r["wall_s"] for r in ranks), 1),
        "params": params,
    }


def _detect_summary(rows: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    peers = [r for r in rows if not r["stalled"]]
    if any(r["detect_s"] is None for r in peers):
        raise RuntimeError(f"a stall was not detected: {peers}")
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["configuration"] for r in peers):
        mine = [r for r in peers if r["configuration"] == name]
        out[name] = {
            "timeout_s": sorted({round(r["timeout_s"], 3) for r in mine}),
            "detect_s": [round(r["detect_s"], 3) for r in mine],
            "median_s": round(statistics.median(r["detect_s"] for r in mine), 3),
            "overshoot_s": round(statistics.median(r["detect_s"] - r["timeout_s"] for r in mine), 3),
        }
    overshoot = statistics.median(r["detect_s"] - r["timeout_s"] for r in peers)
    out["derived"] = {
        "how": "not waited for: the configured value plus the median overshoot measured above",
        "overshoot_s": round(overshoot, 3),
        "hand_set_10_min_s": round(600 + overshoot, 3),
        "startup_45_min_s": round(2700 + overshoot, 3),
    }
    out["params"] = params
    return out


def _run_cost() -> dict[str, Any]:
    ranks, wall = run_ranks("benchmarks.learned_timeouts:cost", {}, world_size=WORLD, timeout_s=600)
    summary = {"benchmark": "learned_timeouts_cost", **_cost_summary(ranks), "wall_s": round(wall, 1)}
    worst = summary["worst_rank"]
    groups = summary["groups_per_rank"]
    rows = [
        ["own cost per step, mean (changing steps excluded)", f"{worst['own_cost_s'] * 1e6:.1f} us"],
        ["as a share of a 1 s step", f"{worst['own_cost_s'] * 100:.4f} %"],
        ["ordinary step, median", f"{worst['ordinary_median_s'] * 1e6:.1f} us"],
        [f"agreement step ({worst['agreements']}), mean", f"{worst['agreement_mean_s'] * 1e6:.1f} us"],
        [f"steps that changed the timeout ({worst['changed_steps']}), mean", f"{worst['changed_mean_s'] * 1e3:.2f} ms"],
        [f"set_timeouts on {groups} groups, median", f"{worst['set_timeouts_median_s'] * 1e6:.0f} us"],
        ["whole step, learner minus floor", f"{worst['step_delta_s'] * 1e6:.1f} us"],
        ["whole step, floor", f"{worst['bare_step_s'] * 1e3:.2f} ms"],
    ]
    title = f"learner's own cost per step, {WORLD} Gloo ranks, {summary['steps_per_mode']} steps per mode (worst rank)"
    print_table(title, ["measure", "value"], rows)
    return summary


def _run_false(runs: int) -> dict[str, Any]:
    params = {
        "runs": runs,
        "steps": 32,
        "step_s": [0.03, 0.09],
        "phase_x": 20,
        "phase_after": [8, 16, 24],
        "startup_min": 1.0,
        "floor_min": 1 / 60_000,
        "seed": 28,
    }
    ranks, wall = run_ranks("benchmarks.learned_timeouts:false_timeouts", params, world_size=WORLD, timeout_s=900)
    summary = {"benchmark": "learned_timeouts_false", **_false_summary(ranks, params), "spawn_wall_s": round(wall, 1)}
    headers = ["runs completed", "false timeouts", "steady (s)", "checkpoint (s)", "worst step", "worst phase"]
    row = [summary[k] for k in ("runs_completed", "false_timeouts", "steady_s", "checkpoint_s")]
    row += [summary["worst_step_fraction"], summary["worst_phase_fraction"]]
    print_table(
        f"false timeouts over {runs} healthy runs, {WORLD} Gloo ranks (worst: share of the timeout)", headers, [row]
    )
    return summary


def _run_detect() -> dict[str, Any]:
    params = {
        "step_s": 1.0,
        "min_steps": 8,
        "startup_min": 45.0,
        "configs": [
            {"name": "learned, floor 1 s", "floor_min": 1 / 60, "repeats": 3},
            {"name": "learned, default floor 1 min", "floor_min": 1.0, "repeats": 1},
        ],
    }
    rows, wall = run_ranks("benchmarks.learned_timeouts:detect", params, world_size=WORLD, timeout_s=900)
    summary = {"benchmark": "learned_timeouts_detect", **_detect_summary([r for rs in rows for r in rs], params)}
    summary["wall_s"] = round(wall, 1)
    derived = summary["derived"]
    measured = {name: f for name, f in summary.items() if isinstance(f, dict) and "median_s" in f}
    table = [[name, f["timeout_s"], f["median_s"], "measured"] for name, f in measured.items()]
    table += [["hand-set 10 min", [600.0], derived["hand_set_10_min_s"], "derived"]]
    table += [["start-up 45 min", [2700.0], derived["startup_45_min_s"], "derived"]]
    title = f"stall detection after learning, steps of 1 s, {WORLD} Gloo ranks"
    print_table(title, ["timeout", "value (s)", "detected after (s)", "how"], table)
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the parts, print their tables, write ``results/learned_timeouts_<part>.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("cost", "false", "detect"), help="run one part (default: all three)")
    parser.add_argument("--runs", type=int, default=20, help="healthy runs in the false-timeout part (default 20)")
    args = parser.parse_args(argv)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # Gloo on CPU, also where GPUs exist
    parts = {"cost": _run_cost, "false": lambda: _run_false(args.runs), "detect": _run_detect}
    results = {}
    for name, part in parts.items():
        if args.only in (None, name):
            before = os.getloadavg()
            results[name] = {**part(), "environment": environment(), "load_before_1_5_15": list(before)}
            rerun = f"benchmarks/learned_timeouts.py --only {name}"
            print(f"wrote {write_results(f'learned_timeouts_{name}', results[name], rerun=rerun)}")
    return results


if __name__ == "__main__":
    main()
