"""Time to detect a stalled rank: one long timeout vs phase timeouts.

Two real gloo ranks go through the real ``setup_distributed``. Rank 1 stalls
(never enters the collective); rank 0 enters an all-reduce on the ``dp_shard``
axis group and the time until it raises is the detection time. Configurations:

* ``single``: ``distributed_timeout_minutes`` only (the whole run keeps it);
* ``phases``: the same start-up value plus ``distributed_timeout_minutes_after_init``,
  with :func:`nemo_rl_shim.timeouts.after_first_step` called before the stall
  (the hang happens after the first step, as a hang at step 5,000 would).

Values are in seconds so a run stays short. Repetitions alternate the two
configurations inside one spawn (``destroy_process_group`` and a fresh
``setup_distributed`` between them); the stalled rank is released through a
separate TCPStore once rank 0 has detected it, and each set-up rendezvous on a
fresh port (a default group re-initialized on the port of one that timed out
hangs in its first barrier). Prints a table and writes
``benchmarks/results/hang_detection_phases.json``.

Run: ``uv run python benchmarks/hang_detection_phases.py [--repeats 3]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "measure"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hang_detection_phases.json"
if str(ROOT) not in sys.path:  # run as a script: make nemo_rl_shim importable
    sys.path.insert(0, str(ROOT))


def _section(startup_s: float, steady_s: float | None) -> dict[str, Any]:
    shim = {} if steady_s is None else {"distributed_timeout_minutes_after_init": steady_s / 60}
    return {"automodel_cfg": {"distributed_timeout_minutes": startup_s / 60}, "nemo_rl_shim": shim, "dtensor_cfg": {}}


def measure(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank function: for each repetition and configuration, set up, stall rank 1, time rank 0's error."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.process_groups.registry import backend_timeouts
    from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
    from nemo_rl_shim.timeouts import after_first_step

    ready_s = time.time() - params["launched_at"]  # process start and imports, under this machine's load
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    stalled = world_size - 1
    # Released hang: the stalled rank waits here until rank 0 has detected it.
    store = dist.TCPStore(
        "127.0.0.1", params["store_port"], world_size, is_master=rank == 0, timeout=datetime.timedelta(seconds=120)
    )
    rows = []
    ports = iter(params["master_ports"])
    for repeat in range(params["repeats"]):
        for name, steady_s in (("single", None), ("phases", params["steady_s"])):
            # A fresh rendezvous per set-up: a store left behind by a group that timed out is never reused.
            os.environ["MASTER_PORT"] = str(next(ports))
            setup_start = time.monotonic()
            context = setup_distributed(_section(params["startup_s"], steady_s), RuntimeConfig())
            setup_s = time.monotonic() - setup_start
            if steady_s is not None:
                after_first_step(context)  # the first step is done
            group = context.device_mesh.get_group("dp_shard")
            timeout_s = backend_timeouts(group)["cpu"].total_seconds()
            dist.barrier()
            key = f"detected/{name}/{repeat}"
            row = {"configuration": name, "repeat": repeat, "rank": rank, "timeout_s": timeout_s}
            row.update(setup_s=setup_s, ready_s=ready_s)
            if rank == stalled:
                store.wait([key], datetime.timedelta(seconds=params["startup_s"] * 3 + 30))
            else:
                start = time.monotonic()
                try:
                    dist.all_reduce(torch.ones(1), group=group)
                except RuntimeError as error:
                    row["detect_s"] = time.monotonic() - start
                    row["error"] = str(error)[:200]
                else:
                    row["detect_s"] = None  # not detected: the stalled rank never entered
                store.set(key, "1")
            dist.destroy_process_group()
            rows.append(row)
    return rows


def _summary(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    mine = [row for row in rows if row["configuration"] == name]
    detect = [row["detect_s"] for row in mine]
    if any(value is None for value in detect):
        raise RuntimeError(f"configuration {name!r}: a stall was not detected in {detect}")
    return {
        "timeout_s": mine[0]["timeout_s"],
        "setup_s": [round(row["setup_s"], 3) for row in mine],
        "detect_s": [round(value, 3) for value in detect],
        "median_s": round(statistics.median(detect), 3),
        "min_s": round(min(detect), 3),
        "max_s": round(max(detect), 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print a table, write the JSON results; return them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per configuration (default 3)")
    parser.add_argument("--startup-s", type=float, default=20.0, help="start-up (and single) timeout, seconds")
    parser.add_argument("--steady-s", type=float, default=3.0, help="steady timeout after the first step, seconds")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    args = parser.parse_args(argv)
    if not 0 < args.steady_s <= args.startup_s:
        parser.error(f"--steady-s must be positive and not exceed --startup-s ({args.startup_s}), got {args.steady_s}")

    import torch

    import automodel_patch
    from nemo_rl_shim.cli.preflight.spawn import free_port, spawn_ranks
    from nemo_rl_shim.timeouts import TIMEOUT_API

    params = {
        "repeats": args.repeats,
        "startup_s": args.startup_s,
        "steady_s": args.steady_s,
        "store_port": free_port(),
        "master_ports": [free_port() for _ in range(2 * args.repeats)],
        "launched_at": time.time(),
    }
    budget_s = 180 + args.repeats * (args.startup_s + args.steady_s + 30)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    start = time.monotonic()
    ranks = spawn_ranks(
        "benchmarks.hang_detection_phases:measure",
        params,
        world_size=2,
        timeout_s=budget_s,
        env={"PYTHONPATH": pythonpath, "CUDA_VISIBLE_DEVICES": ""},  # gloo on CPU, also where GPUs exist
    )
    wall_s = time.monotonic() - start
    rows = [row for r in ranks for row in r.result if "detect_s" in row]
    single, phases = _summary(rows, "single"), _summary(rows, "phases")
    results = {
        "benchmark": "hang_detection_phases",
        "what": "seconds from the healthy rank entering an all-reduce to its RuntimeError, one rank stalled",
        "group": "dp_shard mesh axis (2 ranks, gloo, CPU)",
        "single": single,
        "phases": phases,
        "ratio_single_over_phases": round(single["median_s"] / phases["median_s"], 2),
        "repeats": args.repeats,
        "wall_s": round(wall_s, 1),
        # One-time costs, under whatever else loads this machine: process start and imports, then the
        # first setup_distributed (imports Automodel); later set-ups take well under a second.
        "rank_ready_s": round(max(row["ready_s"] for row in rows), 1),
        "first_setup_s": round(max(row["setup_s"] for row in rows), 1),
        "torch": torch.__version__,
        "nemo_automodel": str(automodel_patch.installed_version()),
        "timeout_api": TIMEOUT_API,
        "nproc": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    print(f"{'configuration':<28} {'timeout':>9} {'median':>9} {'min':>8} {'max':>8}")
    for label, figures in (
        (f"single ({args.startup_s:g} s)", single),
        (f"phases ({args.startup_s:g} s -> {args.steady_s:g} s)", phases),
    ):
        print(
            f"{label:<28} {figures['timeout_s']:>8.1f}s {figures['median_s']:>8.2f}s "
            f"{figures['min_s']:>7.2f}s {figures['max_s']:>7.2f}s"
        )
    print(
        f"detection {results['ratio_single_over_phases']}x sooner with phases; "
        f"{args.repeats} repeats, wall {wall_s:.0f} s "
        f"(of which start-up and imports {results['rank_ready_s'] + results['first_setup_s']:.0f} s), "
        f"torch {torch.__version__}, nproc {os.cpu_count()}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
