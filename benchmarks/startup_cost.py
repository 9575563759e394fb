"""What the shim costs at start-up, imports excluded.

Three figures, each against its target:

* ``setup_distributed`` against the same mesh built by calling Automodel
  directly (``init_process_group`` + ``MeshContext.build(FSDP2Config,
  ParallelismSizes, world_size, timeout_minutes)``), both with the same timeout,
  on 2 and 4 gloo ranks. Target: ratio of medians <= 1.05. Two pairs:

  - no fix: ``patch_automodel: false`` and CPU offload off, so the shim decides
    ``FORWARD`` and patches nothing (on a CPU mesh it would otherwise apply the
    fix, since 0.7.0 gives CPU sub-groups no timeout), against plain 0.7.0;
  - fix: CPU offload on, ``PATCH_AND_FORWARD``, the fix applied inside the timed
    call, against the direct build with the fix applied beforehand.
* ``automodel_patch.detect()`` of both workarounds: first call with Automodel already
  imported, and the cached second call. Target: first call <= 50 ms.
* ``import nemo_rl_shim`` in a fresh process: must not import nemo_automodel,
  and must add <= 0.1 s to ``import torch``.

Method: one set of 4 rank processes imports everything first, then times runs.
Each run creates the default group (``env://`` on a fresh port chosen by rank
0), builds the meshes, and is torn down (``destroy_process_group``) before the
next; a 2-rank phase runs on ranks 0-1 while ranks 2-3 wait. Modes alternate
(ABAB, then BABA) after one discarded warm-up run each. A run's time is the
slowest rank's, from a common start (a store barrier outside every group).
Re-initialising on the same port also works, but a fresh port per run rules
out a rank meeting a store that a peer has not closed yet.

Each run is also split, by thin timing wrappers around the real
``init_process_group`` and ``MeshContext.build`` (identical in every mode),
into rendezvous, mesh build and the caller's own work (the rest: the shim's
validation, decision, fix and bookkeeping; for the direct build, the configs).
The rendezvous swings from ~20 ms to ~500 ms between runs of the same call
when the CPU is oversubscribed, which swamps a ~1 ms difference end to end;
so next to the end-to-end ratio the "own work" ratio is reported:
(direct median + shim rest median - direct rest median) / direct median, the
rest's median taken over every (run, rank).

Run: ``uv run python benchmarks/startup_cost.py``; writes ``benchmarks/results/startup_cost.json``.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    ROOT,
    RankSync,
    build_directly,
    environment,
    median,
    print_table,
    run_ranks,
    set_rank_env,
    write_results,
)

__all__ = ["PHASES", "import_cost", "main", "rank_worker"]

TIMEOUT_MINUTES = 2.0
RUNS_PER_MODE = 61
PATCHED_RUNS_PER_MODE = 31
IMPORT_RUNS = 5
LAUNCHED_RANKS = 4
SPAWN_TIMEOUT_S = 600.0
RATIO_TARGET = 1.05
DETECTION_TARGET_S = 0.050
IMPORT_TARGET_S = 0.1

#: (name, world size, dtensor_cfg) of each measured layout.
PHASES: list[tuple[str, int, dict[str, int]]] = [
    ("dp2", 2, {}),
    ("dp4", 4, {}),
]

_IMPORT_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import nemo_rl_shim
t2 = time.perf_counter()
loaded = sorted(m for m in sys.modules if m == "nemo_automodel" or m.startswith("nemo_automodel."))
print(json.dumps({"import_torch_s": t1 - t0, "import_shim_after_torch_s": t2 - t1, "nemo_automodel_modules": loaded}))
"""


# ----------------------------------------------------------------------------- rank side


def _section(dtensor_cfg: dict[str, int], *, patch: bool) -> dict[str, Any]:
    return {
        "automodel_cfg": {"distributed_timeout_minutes": TIMEOUT_MINUTES},
        "nemo_rl_shim": {"patch_automodel": patch},
        "dtensor_cfg": dict(dtensor_cfg),
    }


def _mesh_facts(device_mesh: Any, moe_mesh: Any) -> dict[str, Any]:
    """Each named group's size, backends and timeouts (s), and how many distinct groups there are."""
    import torch.distributed as dist

    from nemo_rl_shim.process_groups.registry import backend_timeouts, group_backends, named_groups

    groups = named_groups(device_mesh, moe_mesh)
    return {
        "groups": {
            name: {
                "size": dist.get_world_size(group),
                "backends": group_backends(group),
                "timeouts_s": {d: t.total_seconds() for d, t in backend_timeouts(group).items()},
                "is_default": group is dist.group.WORLD,
            }
            for name, group in groups.items()
        },
        "distinct_groups": len({id(g) for g in groups.values()}),
    }


def _detect_all() -> dict[str, str]:
    import automodel_patch

    return {w.slug: automodel_patch.detect(w.slug).verdict.value for w in automodel_patch.WORKAROUNDS}


def _detection_cost() -> dict[str, Any]:
    """First and second ``detect()`` of every workaround (Automodel imported beforehand), and the uncached probes."""
    from automodel_patch import _workaround

    t0 = time.perf_counter()
    first_answer = _detect_all()
    t1 = time.perf_counter()
    _detect_all()
    t2 = time.perf_counter()
    uncached = []
    for _ in range(20):
        _workaround._cached_detect.cache_clear()
        start = time.perf_counter()
        _detect_all()
        uncached.append(time.perf_counter() - start)
    return {
        "answer": first_answer,
        "first_call_s": t1 - t0,
        "cached_call_s": t2 - t1,
        "uncached_probe_median_s": median(uncached),
    }


class _Clock:
    """Time spent inside ``torch.distributed.init_process_group`` and ``MeshContext.build``, whoever calls them.

    Installed as thin wrappers around the real functions, identically for every
    mode, so each run splits into rendezvous, mesh build, and the caller's own
    work (the rest): the part the shim adds is in the rest.
    """

    def __init__(self) -> None:
        import torch.distributed as dist
        from nemo_automodel.components.distributed import mesh as am_mesh

        self.spent = {"init": 0.0, "build": 0.0}
        dist.init_process_group = self._timed(dist.init_process_group, "init")
        am_mesh.MeshContext.build = staticmethod(self._timed(am_mesh.MeshContext.build, "build"))

    def _timed(self, function: Any, key: str) -> Any:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[key] += time.perf_counter() - start

        return timed

    def reset(self) -> None:
        self.spent = dict.fromkeys(self.spent, 0.0)


def _run_mode(mode: str, world: int, dtensor_cfg: dict[str, int]) -> tuple[float, Any, Any]:
    """One timed start-up in ``mode``; returns (seconds, device_mesh, moe_mesh). The default group exists after."""
    import datetime

    import torch.distributed as dist

    import automodel_patch
    from nemo_rl_shim import RuntimeConfig, setup_distributed

    if mode == "direct_patched":
        automodel_patch.apply()  # the fix is in place before the clock starts: this is "Automodel + fix"
    elif mode == "shim_patched":
        automodel_patch.revert()  # setup_distributed applies it inside the timed call
    start = time.perf_counter()
    if mode in ("direct", "direct_patched"):
        dist.init_process_group(backend="gloo", timeout=datetime.timedelta(minutes=TIMEOUT_MINUTES))
        built = build_directly(
            world,
            tp=dtensor_cfg.get("tensor_parallel_size", 1),
            cp=dtensor_cfg.get("context_parallel_size", 1),
            ep=dtensor_cfg.get("expert_parallel_size", 1),
            dp_replicate=dtensor_cfg.get("dp_replicate_size", 1),
            timeout_minutes=TIMEOUT_MINUTES,
        )
        elapsed = time.perf_counter() - start
        return elapsed, built.device_mesh, built.moe_mesh
    patched = mode == "shim_patched"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # patch_automodel false on a CPU mesh warns that sub-groups keep 30 min
        context = setup_distributed(_section(dtensor_cfg, patch=patched), RuntimeConfig(cpu_offload=patched))
    elapsed = time.perf_counter() - start
    expected = "patch_and_forward" if patched else "forward"
    if context.decision.action.value != expected:
        raise RuntimeError(f"{mode}: expected decision {expected}, got {context.decision.action.value}")
    return elapsed, context.device_mesh, context.moe_mesh


def _schedule(first: str, second: str, runs: int) -> list[str]:
    """Warm-up of each, then ABAB... for half the runs and BABA... for the rest."""
    order = [first, second]
    for i in range(runs):
        order += [first, second] if i < runs // 2 else [second, first]
    return order


def rank_worker(params: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: import everything, measure detection, then time every phase's runs. Rank 0 returns all."""
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401 - setup_distributed imports it lazily: import it untimed
    from nemo_automodel.components.distributed import config, mesh, mesh_utils  # noqa: F401

    import automodel_patch
    import nemo_rl_shim  # noqa: F401

    sync = RankSync()
    rank = sync.rank
    for turn in range(sync.world_size):  # one rank at a time: the others' imports must not share the CPU
        sync.barrier(f"detection/{turn}")
        if turn == rank:
            sync.put(f"detection/{rank}", _detection_cost())
    clock = _Clock()
    gc.freeze()  # the imports' objects: never collected, and no longer scanned by the per-run gc.collect()
    phases = []
    for name, world, dtensor_cfg in params["phases"]:
        runs: dict[str, list[dict[str, float]]] = {}
        facts: dict[str, Any] = {}
        schedule = _schedule("direct", "shim", params["runs"]) + _schedule(
            "direct_patched", "shim_patched", params["patched_runs"]
        )
        seen: set[str] = set()
        for i, mode in enumerate(schedule):
            key = f"{name}/{i}"
            port = sync.port(key)
            if rank < world:
                set_rank_env(rank, world, port)
                gc.collect()  # the previous run's groups and meshes go now, not inside the next timed run
                sync.barrier(f"{key}/start", world)
                clock.reset()
                elapsed, device_mesh, moe_mesh = _run_mode(mode, world, dtensor_cfg)
                spent = dict(clock.spent)
                if mode not in facts:
                    facts[mode] = _mesh_facts(device_mesh, moe_mesh)
                dist.barrier()
                dist.destroy_process_group()
                sync.put(f"{key}/{rank}", {"total": elapsed, **spent, "rest": elapsed - sum(spent.values())})
            sync.barrier(f"{key}/end")
            if rank == 0:
                per_rank = [sync.get(f"{key}/{r}") for r in range(world)]
                if mode in seen:  # the first run of each mode is the warm-up
                    # total, init, build: the slowest rank (the run is over when the last rank has its mesh);
                    # rest (the caller's own work, per process): every rank's value is kept
                    run = {part: max(r[part] for r in per_rank) for part in ("total", "init", "build")}
                    runs.setdefault(mode, []).append({**run, "rest_per_rank": [r["rest"] for r in per_rank]})
                seen.add(mode)
        automodel_patch.revert()
        phases.append({"name": name, "world_size": world, "dtensor_cfg": dtensor_cfg, "runs": runs, "facts": facts})
    if rank != 0:
        return None
    return {
        "detection_per_rank": [sync.get(f"detection/{r}") for r in range(sync.world_size)],
        "phases": phases,
    }


# ----------------------------------------------------------------------------- driver side


def import_cost(runs: int = IMPORT_RUNS) -> dict[str, Any]:
    """``import torch`` then ``import nemo_rl_shim`` in ``runs`` fresh processes, timed inside each."""
    samples = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    added = median(s["import_shim_after_torch_s"] for s in samples)
    loaded = sorted({m for s in samples for m in s["nemo_automodel_modules"]})
    return {
        "samples": samples,
        "import_torch_median_s": median(s["import_torch_s"] for s in samples),
        "import_shim_added_median_s": added,
        "nemo_automodel_imported": bool(loaded),
        "nemo_automodel_modules": loaded,
        "target_added_s": IMPORT_TARGET_S,
        "met": added <= IMPORT_TARGET_S and not loaded,
    }


def _summarise_phase(phase: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode and part; the ratios, end to end and from the callers' own work."""
    runs = phase["runs"]
    med = {
        mode: {
            **{part: median(r[part] for r in values) for part in ("total", "init", "build")},
            "rest": median(x for r in values for x in r["rest_per_rank"]),  # over every (run, rank)
        }
        for mode, values in runs.items()
    }

    def ratios(shim: str, direct: str) -> dict[str, float]:
        end_to_end = med[shim]["total"] / med[direct]["total"]
        added = med[shim]["rest"] - med[direct]["rest"]
        paired = median(s["total"] - d["total"] for s, d in zip(runs[shim], runs[direct], strict=True))
        return {
            "end_to_end": end_to_end,
            "own_work_added_s": added,
            "own_work": (med[direct]["total"] + added) / med[direct]["total"],
            "paired_total_delta_median_s": paired,
        }

    main_ratio = ratios("shim", "direct")
    facts = phase["facts"]
    return {
        **phase,
        "median_s": med,
        "ratio_shim_over_direct": main_ratio,
        "ratio_shim_patched_over_direct_patched": ratios("shim_patched", "direct_patched"),
        "same_groups_shim_vs_direct": facts["shim"] == facts["direct"],
        "same_groups_shim_patched_vs_direct_patched": facts["shim_patched"] == facts["direct_patched"],
        "met_end_to_end": main_ratio["end_to_end"] <= RATIO_TARGET,
        "met_own_work": main_ratio["own_work"] <= RATIO_TARGET,
    }


def main() -> dict[str, Any]:
    """Measure, print the tables, write ``benchmarks/results/startup_cost.json``."""
    started = time.perf_counter()
    env_before = environment()
    imports = import_cost()
    params = {"phases": PHASES, "runs": RUNS_PER_MODE, "patched_runs": PATCHED_RUNS_PER_MODE}
    results, spawn_wall = run_ranks(
        "benchmarks.startup_cost:rank_worker", params, world_size=LAUNCHED_RANKS, timeout_s=SPAWN_TIMEOUT_S
    )
    measured = results[0]
    phases = [_summarise_phase(p) for p in measured["phases"]]
    detection = measured["detection_per_rank"]
    first = [d["first_call_s"] for d in detection]
    detection_summary = {
        "per_rank": detection,
        "first_call_median_s": median(first),
        "first_call_max_s": max(first),
        "cached_call_median_s": median(d["cached_call_s"] for d in detection),
        "uncached_probe_median_s": median(d["uncached_probe_median_s"] for d in detection),
        "target_first_call_s": DETECTION_TARGET_S,
        "met": max(first) <= DETECTION_TARGET_S,
    }

    ms = 1000.0
    rows = []
    for p in phases:
        for shim, direct, ratio in (
            ("shim", "direct", "ratio_shim_over_direct"),
            ("shim_patched", "direct_patched", "ratio_shim_patched_over_direct_patched"),
        ):
            r = p[ratio]
            rows.append(
                [
                    p["name"],
                    p["world_size"],
                    "fix" if shim == "shim_patched" else "no fix",
                    f"{p['median_s'][direct]['total'] * ms:.1f}",
                    f"{p['median_s'][shim]['total'] * ms:.1f}",
                    f"{r['end_to_end']:.3f}",
                    f"{r['paired_total_delta_median_s'] * ms:+.1f}",
                    f"{p['median_s'][direct]['init'] * ms:.1f} / {p['median_s'][shim]['init'] * ms:.1f}",
                    f"{p['median_s'][direct]['build'] * ms:.1f} / {p['median_s'][shim]['build'] * ms:.1f}",
                    f"{p['median_s'][direct]['rest'] * ms:.2f} / {p['median_s'][shim]['rest'] * ms:.2f}",
                    f"{r['own_work']:.3f}",
                ]
            )
    print_table(
        f"setup_distributed vs direct init_process_group + MeshContext.build (gloo, timeout {TIMEOUT_MINUTES:g} min; "
        f"medians of {RUNS_PER_MODE} runs, {PATCHED_RUNS_PER_MODE} with the fix; slowest rank per run)",
        [
            "layout",
            "ranks",
            "fork fix",
            "direct ms",
            "shim ms",
            "ratio",
            "paired delta ms",
            "init ms d/s",
            "build ms d/s",
            "own work ms d/s",
            "ratio (own work)",
        ],
        rows,
    )
    print_table(
        "Same groups built (size, backends, timeouts of every named group)",
        ["layout", "shim == direct", "shim+fix == direct+fix", "distinct groups: direct", "direct+fix"],
        [
            [
                p["name"],
                p["same_groups_shim_vs_direct"],
                p["same_groups_shim_patched_vs_direct_patched"],
                p["facts"]["direct"]["distinct_groups"],
                p["facts"]["direct_patched"]["distinct_groups"],
            ]
            for p in phases
        ],
    )
    print_table(
        f"Detection: detect() of both workarounds with Automodel imported ({len(detection)} fresh rank processes)",
        ["first call ms (median / max)", "cached ms", "uncached probe ms", "target", "met"],
        [
            [
                f"{detection_summary['first_call_median_s'] * ms:.2f} / "
                f"{detection_summary['first_call_max_s'] * ms:.2f}",
                f"{detection_summary['cached_call_median_s'] * ms:.4f}",
                f"{detection_summary['uncached_probe_median_s'] * ms:.2f}",
                f"<= {DETECTION_TARGET_S * ms:.0f} ms first call",
                "yes" if detection_summary["met"] else "NO",
            ]
        ],
    )
    print_table(
        f"import nemo_rl_shim after import torch ({IMPORT_RUNS} fresh processes, medians)",
        ["import torch s", "added by nemo_rl_shim s", "nemo_automodel imported", "target", "met"],
        [
            [
                f"{imports['import_torch_median_s']:.2f}",
                f"{imports['import_shim_added_median_s']:.3f}",
                imports["nemo_automodel_imported"],
                f"<= {IMPORT_TARGET_S} s, no nemo_automodel",
                "yes" if imports["met"] else "NO",
            ]
        ],
    )
    total = time.perf_counter() - started
    data = {
        "benchmark": "startup_cost",
        "environment_before": env_before,
        "environment_after": environment(),
        "timeout_minutes": TIMEOUT_MINUTES,
        "runs_per_mode": RUNS_PER_MODE,
        "patched_runs_per_mode": PATCHED_RUNS_PER_MODE,
        "ratio_target": RATIO_TARGET,
        "phases": phases,
        "detection": detection_summary,
        "imports": imports,
        "spawn_wall_s": spawn_wall,
        "total_wall_s": total,
        "all_met": all(p["met_end_to_end"] and p["met_own_work"] for p in phases)
        and detection_summary["met"]
        and imports["met"],
    }
    path = write_results("startup_cost", data)
    print(f"\nwrote {path.relative_to(ROOT)} in {total:.0f} s (rank processes: {spawn_wall:.0f} s)")
    return data


if __name__ == "__main__":
    main()
