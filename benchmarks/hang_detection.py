"""How long after a rank stalls the other ranks get an error, on every mesh axis.

The real start-up path: ``setup_distributed`` with
``distributed_timeout_minutes = 0.05`` (3 s) and CPU offload on, which on this
CPU-only machine decides ``PATCH_AND_FORWARD``: the fork fix gives every Gloo
sub-group the timeout (unpatched 0.7.0 gives CPU sub-groups none, i.e. Gloo's
30 min; see ``process_groups.py``). The default group has the same 3 s, so a
world-sized axis reuses it and is measured as the default group.

Two 4-rank layouts together give every axis more than one rank:
``dp_replicate=2 x dp_shard=2`` with ``ep=2`` (dp_replicate, dp_shard, dp,
dp_shard_cp, dp_cp, ep_shard, ep) and ``cp=2 x tp=2`` (cp, tp, dp_shard_cp,
dp_cp). ``pp`` is always 1 in the shim (a size-1 axis cannot wait on a peer).

Stall: rank 0, a member of one group of every axis, stops taking part (it
waits outside every process group). Every other rank enters one
``all_reduce`` on each distinct group it shares with rank 0, all at once, one
thread per group, and times it until the error. A Gloo group that timed out
stays broken, so each group gets exactly one collective; the next layout
starts from a fresh default group (``destroy_process_group``, new port).
Target: error within timeout + 2 s on every axis.

Run: ``uv run python benchmarks/hang_detection.py``; writes ``benchmarks/results/hang_detection.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, RankSync, environment, print_table, run_ranks, set_rank_env, write_results

__all__ = ["LAYOUTS", "main", "rank_worker"]

TIMEOUT_S = 3.0
MARGIN_S = 2.0
STALLED_RANK = 0
LAUNCHED_RANKS = 4
SPAWN_TIMEOUT_S = 600.0
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "ep_shard", "ep")

#: (name, dtensor_cfg) on 4 ranks
LAYOUTS: list[tuple[str, dict[str, int]]] = [
    ("dp_rep2_x_dp_shard2_ep2", {"dp_replicate_size": 2, "expert_parallel_size": 2}),
    ("cp2_x_tp2", {"context_parallel_size": 2, "tensor_parallel_size": 2}),
]


# ----------------------------------------------------------------------------- rank side


def _stalled_all_reduce(group: Any) -> dict[str, Any]:
    """One ``all_reduce`` on ``group`` that rank 0 never joins: seconds until it raised, and the error."""
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1), group=group)
    except Exception as e:  # the error is the measurement
        elapsed = time.perf_counter() - start
        first_line = str(e).splitlines()[0] if str(e) else ""
        message = first_line.split("] ", 1)[-1]  # drop gloo's "[/path/file.cc:123]" prefix
        return {"elapsed_s": elapsed, "error": f"{type(e).__name__}: {message}"}
    return {"elapsed_s": time.perf_counter() - start, "error": None}


def _measure_layout(sync: RankSync, name: str, dtensor_cfg: dict[str, int]) -> dict[str, Any]:
    """Set up, stall rank 0, time every other rank's collectives; returns this rank's view."""
    import threading

    import torch.distributed as dist

    from nemo_rl_shim import RuntimeConfig, setup_distributed
    from nemo_rl_shim.process_groups.registry import backend_timeouts, named_groups

    rank = sync.rank
    set_rank_env(rank, sync.world_size, sync.port(name))
    sync.barrier(f"{name}/ready")  # arrive together: the rendezvous itself runs under the 3 s timeout
    section = {
        "automodel_cfg": {"distributed_timeout_minutes": TIMEOUT_S / 60},
        "dtensor_cfg": dict(dtensor_cfg),
    }
    context = setup_distributed(section, RuntimeConfig(cpu_offload=True))
    by_group: dict[int, dict[str, Any]] = {}
    for axis, group in named_groups(context.device_mesh, context.moe_mesh).items():
        entry = by_group.setdefault(id(group), {"group": group, "axes": []})
        entry["axes"].append(axis.removeprefix("moe."))
    view: dict[str, Any] = {"decision": context.decision.action.value, "groups": []}
    for entry in by_group.values():
        group = entry["group"]
        ranks = dist.get_process_group_ranks(group)
        view["groups"].append(
            {
                "axes": entry["axes"],
                "ranks": ranks,
                "timeouts_s": {d: t.total_seconds() for d, t in backend_timeouts(group).items()},
                "with_stalled_rank": STALLED_RANK in ranks and len(ranks) > 1,
            }
        )
    sync.barrier(f"{name}/built")
    if rank != STALLED_RANK:
        results: list[dict[str, Any] | None] = [None] * len(by_group)
        threads = []
        for i, (entry, facts) in enumerate(zip(by_group.values(), view["groups"], strict=True)):
            if facts["with_stalled_rank"]:
                thread = threading.Thread(
                    target=lambda i=i, g=entry["group"]: results.__setitem__(i, _stalled_all_reduce(g))
                )
                threads.append(thread)
                thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for facts, result in zip(view["groups"], results, strict=True):
            facts["stall"] = result
    sync.barrier(f"{name}/measured")  # rank 0 has waited here, outside every group, all along
    dist.destroy_process_group()
    sync.barrier(f"{name}/destroyed")
    return view


def rank_worker(params: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: import, then measure each layout in turn. Rank 0 returns every rank's view."""
    from nemo_automodel.components.distributed import config, mesh, mesh_utils  # noqa: F401

    import nemo_rl_shim  # noqa: F401

    sync = RankSync()
    for name, dtensor_cfg in params["layouts"]:
        sync.put(f"{name}/{sync.rank}", _measure_layout(sync, name, dtensor_cfg))
    sync.barrier("done")
    if sync.rank != 0:
        return None
    return {name: [sync.get(f"{name}/{r}") for r in range(sync.world_size)] for name, _ in params["layouts"]}


# ----------------------------------------------------------------------------- driver side


def _per_axis(views: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each axis: the group's ranks and timeout, and the slowest rank's time to the error."""
    axes: dict[str, dict[str, Any]] = {}
    for rank, view in enumerate(views):
        for facts in view["groups"]:
            for axis in facts["axes"]:
                entry = axes.setdefault(
                    axis,
                    {
                        "shared_with": [a for a in facts["axes"] if a != axis],
                        "size": len(facts["ranks"]),
                        "timeouts_s": facts["timeouts_s"],
                        "samples": [],
                    },
                )
                stall = facts.get("stall")
                if stall is not None:
                    entry["samples"].append({"rank": rank, "ranks": facts["ranks"], **stall})
    for entry in axes.values():
        samples = entry["samples"]
        if samples:
            entry["slowest_s"] = max(s["elapsed_s"] for s in samples)
            entry["all_raised"] = all(s["error"] for s in samples)
            entry["error"] = samples[0]["error"]
            entry["met"] = entry["all_raised"] and entry["slowest_s"] <= TIMEOUT_S + MARGIN_S
    return axes


def main() -> dict[str, Any]:
    """Measure, print the table, write ``benchmarks/results/hang_detection.json``."""
    started = time.perf_counter()
    env_before = environment()
    results, spawn_wall = run_ranks(
        "benchmarks.hang_detection:rank_worker",
        {"layouts": LAYOUTS},
        world_size=LAUNCHED_RANKS,
        timeout_s=SPAWN_TIMEOUT_S,
    )
    measured = results[0]
    layouts = {name: {"decision": views[0]["decision"], "axes": _per_axis(views)} for name, views in measured.items()}

    rows = []
    covered: dict[str, bool] = {}
    for name, layout in layouts.items():
        done: set[str] = set()
        for axis, entry in sorted(layout["axes"].items(), key=lambda kv: (kv[0] != "default", kv[0])):
            if entry["size"] < 2 or axis in done:
                continue
            done.update([axis, *entry["shared_with"]])
            measured_here = "slowest_s" in entry
            if measured_here:
                for a in (axis, *entry["shared_with"]):
                    covered[a] = covered.get(a, True) and entry["met"]
            rows.append(
                [
                    name,
                    " = ".join([axis, *entry["shared_with"]]),
                    entry["size"],
                    ",".join(f"{d}:{t:g}" for d, t in entry["timeouts_s"].items()),
                    len(entry["samples"]),
                    f"{entry['slowest_s']:.2f}" if measured_here else "-",
                    f"{entry['slowest_s'] - TIMEOUT_S:+.2f}" if measured_here else "-",
                    ("yes" if entry["met"] else "NO") if measured_here else "-",
                    entry.get("error") or "-",
                ]
            )
    print_table(
        f"Time to error with rank {STALLED_RANK} stalled; timeout {TIMEOUT_S:g} s on every group "
        f"(setup_distributed, CPU offload on: fork fix applied); target <= {TIMEOUT_S + MARGIN_S:g} s. "
        "One row per group; '=' joins the axes that share it",
        ["layout", "axes (one group)", "size", "timeout s", "ranks timed", "slowest s", "over timeout", "met", "error"],
        rows,
    )
    missing = [a for a in AXES if a not in covered and a != "pp"]
    print(f"\n  axes with more than one rank measured: {', '.join(sorted(covered))}")
    print(f"  not measured: pp (always 1 in the shim){'; ' + ', '.join(missing) if missing else ''}")
    total = time.perf_counter() - started
    data = {
        "benchmark": "hang_detection",
        "environment_before": env_before,
        "environment_after": environment(),
        "timeout_s": TIMEOUT_S,
        "target_s": TIMEOUT_S + MARGIN_S,
        "stalled_rank": STALLED_RANK,
        "layouts": layouts,
        "per_axis_met": covered,
        "axes_not_measured": ["pp", *missing],
        "spawn_wall_s": spawn_wall,
        "total_wall_s": total,
        "all_met": bool(covered) and all(covered.values()) and not missing,
    }
    path = write_results("hang_detection", data)
    print(f"\nwrote {path.relative_to(ROOT)} in {total:.0f} s (rank processes: {spawn_wall:.0f} s)")
    return data


if __name__ == "__main__":
    main()
