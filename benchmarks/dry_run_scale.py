"""What ``preflight --dry-run`` costs as the world grows: wall time, peak memory, groups recorded.

Each world is measured in a fresh interpreter (``--one``), so its peak memory is its own:
the dry run of :mod:`nemo_rl_shim.cli.preflight.dry_run`, through the real set-up path (the decision,
the keep-cpu-backend layer, Automodel's ``MeshContext.build``) on torch's fake backend, for
a CPU-offload config at 45 minutes with ``patch_automodel: true``. Wall time excludes the
imports (torch, Automodel: measured apart and reported). Peak memory is the process's
maximum resident set (``resource.getrusage``), imports included; the RSS before the dry run
is reported beside it. Groups recorded: the process groups each checked rank created (its
NCCL communicators in the real run), summed over the checked ranks; ``new_group`` calls: per
rank (every rank calls ``new_group`` for every group of the world: torch's rule).

Layouts: tensor 8, context 2, expert 8 (MoE) from 64 ranks up; 8 ranks take tensor 2, context
2, expert 2. Up to 64 ranks every rank is checked; above, the sample that covers every group
shape (rank 0, the last rank, and the second and last position on each axis), which is the same
8 ranks for every world of this layout, so time per checked rank shows the growth in the world.

Run: ``uv run --extra automodel python benchmarks/dry_run_scale.py [--worlds 8,64,...]``; writes
``benchmarks/results/dry_run_scale.json`` (summary) and ``benchmarks/results/raw/dry_run_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, environment, print_table, write_results

__all__ = ["WORLDS", "layout", "main", "measure_one"]

WORLDS = (8, 64, 512, 1024, 8192, 65536)
TIMEOUT_MINUTES = 45.0
#: Per world, a bound on its interpreter; 65,536 ranks is the one that may need minutes.
CHILD_TIMEOUT_S = 900


def layout(world: int) -> dict[str, int]:
    """Parallel sizes for ``world``: tp 8, cp 2, ep 8 from 64 ranks; tp 2, cp 2, ep 2 below."""
    return {"tp": 8, "cp": 2, "ep": 8} if world >= 64 else {"tp": 2, "cp": 2, "ep": 2}


def _rss_mb() -> float:
    """Current resident set of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_one(world: int) -> dict[str, Any]:
    """Dry-run ``world`` in this process; the figures of the module docstring."""
    start = time.perf_counter()
    import dataclasses

    import nemo_automodel.components.distributed.mesh_utils  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401  (the set-up's imports, timed apart)

    from nemo_rl_shim.cli.preflight import build_options, run_preflight

    imports_s = time.perf_counter() - start
    sizes = layout(world)
    options = build_options(overrides={"timeout_minutes": TIMEOUT_MINUTES, "cpu_offload": True, **sizes})
    options = dataclasses.replace(options, dry_run=True, world_size=world, world_source=f"--world {world}")
    rss_before = _rss_mb()
    start = time.perf_counter()
    report = run_preflight(options)
    wall_s = time.perf_counter() - start
    ranks = [r.dry_run for r in report.ranks if getattr(r, "dry_run", None) is not None]
    return {
        "world": world,
        "layout": sizes,
        "ok": report.ok,
        "problem": report.problem,
        "checked_ranks": len(report.ranks),
        "wall_s": round(wall_s, 2),
        "s_per_checked_rank": round(wall_s / len(report.ranks), 3),
        "imports_s": round(imports_s, 1),
        "rss_before_mb": round(rss_before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "groups_recorded": sum(r.process_groups for r in ranks),
        "groups_per_rank": sorted({r.process_groups for r in ranks}),
        "new_group_calls_per_rank": max((r.new_group_calls for r in ranks), default=0),
    }


def _child(world: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(world)], capture_output=True, text=True, env=env,
            timeout=CHILD_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"world": world, "error": f"did not finish within {CHILD_TIMEOUT_S} s"}
    if done.returncode != 0:
        return {"world": world, "error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="comma-separated world sizes")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one world, JSON on stdout
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0
    before = environment()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        rows.append(_child(world))
        print(json.dumps(rows[-1]), flush=True)
    headers = ("world", "layout", "checked", "wall s", "s/rank", "peak RSS MB", "groups", "per rank", "new_group/rank")
    print_table(
        "preflight --dry-run, CPU offload, 45 min, patch on (wall excludes imports)",
        headers,
        [
            (
                r["world"], " ".join(f"{k}{v}" for k, v in r["layout"].items()), r["checked_ranks"], r["wall_s"],
                r["s_per_checked_rank"], r["peak_rss_mb"], r["groups_recorded"], r["groups_per_rank"],
                r["new_group_calls_per_rank"],
            ) if "error" not in r else (r["world"], "", "", r["error"], "", "", "", "", "")
            for r in rows
        ],
    )  # fmt: skip
    path = write_results("dry_run_scale", {"environment": {"before": before, "after": environment()}, "results": rows})
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0 if all("error" not in r and r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
