"""How many process groups Automodel 0.7.0's mesh build creates, with and without the fork fix, against the minimum.

Counted: every ``new_group`` call made while ``MeshContext.build`` runs, with
the backend string, ranks and timeout it receives. Every rank calls
``new_group`` for every sub-group of the world (torch's rule), so rank 0's
list is the world's list of groups; the other ranks' lists are checked equal.

Default groups (each initialised with the same timeout the mesh is built with):

* ``gloo``: a real CPU run, nothing simulated.
* ``cuda:nccl,cpu:gloo`` and ``nccl``: a GPU run, which this machine cannot
  host. Simulated boundary, and only that: ``torch.distributed.get_backend``
  *reports* the backend string, ``torch.cuda.is_available``/``is_initialized``
  say True (so Automodel picks a ``"cuda"`` mesh and torch does not try to
  select a device), and ``new_group`` records the call it receives, then
  creates a Gloo group of the same ranks and timeout instead of an NCCL one.
  The default group itself is a real ``"cpu:gloo,cuda:gloo"`` group, so the
  fix reads real per-device timeouts from it.
* ``gloo, other timeout``: default group 2x the mesh timeout, to show that a
  world-sized axis gets its own group when the timeouts differ.

Minimum: for each axis the meshes expose (5 mesh dims, 3 flattened axes, and
with MoE the flattened helper and the 2 MoE dims), one group per distinct rank
set; an axis whose one rank set is the whole world reuses the default group
(0). Singletons count: torch's DeviceMesh needs a group object per dim on
every rank, so a size-1 axis is a group per rank. Computed from the mesh shape
alone (no torch), so it is independent of what Automodel does. For
information, the floor if axes with identical rank sets shared a group.

Run: ``uv run python benchmarks/process_groups.py``; writes ``benchmarks/results/process_groups.json``.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    ROOT,
    RankSync,
    build_directly,
    environment,
    print_table,
    run_ranks,
    set_rank_env,
    write_results,
)

__all__ = ["LAYOUTS", "SCENARIOS", "main", "minimum_groups", "rank_worker"]

TIMEOUT_MINUTES = 2.0
LAUNCHED_RANKS = 4
SPAWN_TIMEOUT_S = 600.0

#: (name, world size, dtensor_cfg sizes)
LAYOUTS: list[tuple[str, int, dict[str, int]]] = [
    ("dp", 2, {}),
    ("tp2", 2, {"tp": 2}),
    ("cp2", 2, {"cp": 2}),
    ("ep2", 2, {"ep": 2}),
    ("dp_rep2_x_dp_shard2", 4, {"dp_replicate": 2}),
    ("ep2_on_4", 4, {"ep": 2}),
]

#: name -> (real default-group backend, reported backend or None, default-group timeout / mesh timeout)
SCENARIOS: dict[str, tuple[str, str | None, float]] = {
    "gloo": ("gloo", None, 1.0),
    "cuda:nccl,cpu:gloo": ("cpu:gloo,cuda:gloo", "cuda:nccl,cpu:gloo", 1.0),
    "nccl": ("cpu:gloo,cuda:gloo", "nccl", 1.0),
    "gloo, other timeout": ("gloo", None, 2.0),
}

_ROOT_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
_FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


# ----------------------------------------------------------------------------- the minimum, from the shape


def _shape(world: int, sizes: dict[str, int]) -> dict[str, int]:
    tp, cp, ep, dp_replicate = (sizes.get(k, 1) for k in ("tp", "cp", "ep", "dp_replicate"))
    dp = world // (tp * cp)
    return {"pp": 1, "dp_replicate": dp_replicate, "dp_shard": dp // dp_replicate, "cp": cp, "tp": tp, "ep": ep}


def _rank_sets(dims: dict[str, int], axes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Rank sets of the axis spanning ``axes`` of a row-major mesh with dims ``dims`` (name -> size)."""
    names = list(dims)
    strides = {name: 1 for name in names}
    for i in range(len(names) - 2, -1, -1):
        strides[names[i]] = strides[names[i + 1]] * dims[names[i + 1]]
    others = [n for n in names if n not in axes]
    sets = []
    for fixed in itertools.product(*(range(dims[n]) for n in others)):
        base = sum(strides[n] * c for n, c in zip(others, fixed, strict=True))
        members = itertools.product(*(range(dims[n]) for n in axes))
        sets.append(tuple(sorted(base + sum(strides[n] * c for n, c in zip(axes, m, strict=True)) for m in members)))
    return sets


def minimum_groups(world: int, sizes: dict[str, int], *, default_timeout_matches: bool = True) -> dict[str, Any]:
    """The minimum number of new groups the meshes of this layout need (see the module docstring).

    With ``default_timeout_matches=False`` the default group cannot stand in
    for a world-sized axis (it has another timeout): each such axis needs one.
    """
    shape = _shape(world, sizes)
    root = {name: shape[name] for name in _ROOT_AXES}
    axes: dict[str, list[tuple[int, ...]]] = {name: _rank_sets(root, (name,)) for name in _ROOT_AXES}
    axes.update({name: _rank_sets(root, parts) for name, parts in _FLATTENED.items()})
    ep = shape["ep"]
    if ep > 1:
        non_pp = world // shape["pp"]
        ep_shard = non_pp // ep if ep < non_pp else 1
        axes["_".join(_ROOT_AXES[1:])] = _rank_sets(root, _ROOT_AXES[1:])  # torch names it so
        moe = {"pp": shape["pp"], "ep_shard": ep_shard, "ep": ep}
        axes["ep_shard"] = _rank_sets(moe, ("ep_shard",))
        axes["ep"] = _rank_sets(moe, ("ep",))
    everyone = tuple(range(world))
    reusable = [everyone] if default_timeout_matches else []
    per_axis = {
        name: {
            "size": len(sets[0]),
            "rank_sets": [list(s) for s in sets],
            "reuses_default": sets == reusable,
            "new_groups": 0 if sets == reusable else len(sets),
        }
        for name, sets in axes.items()
    }
    distinct = {s for sets in axes.values() for s in sets if [s] != reusable}
    return {
        "total": sum(a["new_groups"] for a in per_axis.values()),
        "per_axis": per_axis,
        "floor_if_axes_shared_groups": len(distinct),
    }


# ----------------------------------------------------------------------------- rank side


def _axis(desc: str | None) -> str:
    """``"mesh_MeshAxisName.DP_SHARD"`` -> ``"dp_shard"``."""
    return (desc or "?").removeprefix("mesh_").replace("MeshAxisName.", "").lower()


@contextmanager
def _recording(calls: list[dict[str, Any]], reported: str | None) -> Iterator[None]:
    """Record each ``new_group`` call; with ``reported`` set, simulate the GPU boundary (module docstring)."""
    import importlib
    import inspect
    from unittest import mock

    import torch
    import torch.distributed as dist

    device_mesh = importlib.import_module("torch.distributed.device_mesh")
    real = dist.distributed_c10d.new_group
    signature = inspect.signature(real)

    def new_group(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        timeout = a["timeout"]
        calls.append(
            {
                "axis": _axis(a["group_desc"]),
                "ranks": sorted(a["ranks"] or []),
                "backend": None if a["backend"] is None else str(a["backend"]),
                "timeout_s": None if timeout is None else timeout.total_seconds(),
            }
        )
        if reported is not None:  # boundary: a Gloo group of the same ranks and timeout instead of NCCL
            a["backend"], a["pg_options"] = "gloo", None
        group = real(*bound.args, **bound.kwargs)
        if dist.get_rank() in calls[-1]["ranks"]:  # read back what the group really got
            calls[-1]["read_back_timeout_s"] = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        return group

    patches = [mock.patch.object(device_mesh, "new_group", new_group), mock.patch.object(dist, "new_group", new_group)]
    if reported is not None:
        patches += [
            mock.patch.object(dist, "get_backend", return_value=reported),
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "is_initialized", return_value=True),
        ]
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def _build(world: int, sizes: dict[str, int], reported: str | None) -> dict[str, Any]:
    """Build the meshes once with ``MeshContext.build``; the calls, and which axes reuse the default group."""
    import torch.distributed as dist

    from nemo_rl_shim.process_groups.registry import named_groups

    calls: list[dict[str, Any]] = []
    with _recording(calls, reported):
        built = build_directly(world, **sizes, timeout_minutes=TIMEOUT_MINUTES)
        groups = named_groups(built.device_mesh, built.moe_mesh)
        reuses = {
            name.removeprefix("moe."): group is dist.group.WORLD for name, group in groups.items() if name != "default"
        }
    return {"calls": calls, "axis_reuses_default": reuses, "mesh_device_type": built.device_mesh.device_type}


def _requested(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls as every rank makes them (the read-back timeout exists only where the rank is a member)."""
    return [{k: v for k, v in call.items() if k != "read_back_timeout_s"} for call in calls]


def rank_worker(params: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: for each scenario and world size, one default group; each layout built upstream, then fixed."""
    import datetime

    import torch.distributed as dist
    from nemo_automodel.components.distributed import config, mesh, mesh_utils  # noqa: F401

    import automodel_patch

    sync = RankSync()
    rank = sync.rank
    out: dict[str, Any] = {}
    for scenario, (real_backend, reported, factor) in params["scenarios"].items():
        for world in sorted({w for _, w, _ in params["layouts"]}):
            key = f"{scenario}/{world}"
            port = sync.port(key)
            if rank < world:
                set_rank_env(rank, world, port)
                timeout = datetime.timedelta(minutes=TIMEOUT_MINUTES * factor)
                dist.init_process_group(backend=real_backend, timeout=timeout)
                for name, layout_world, sizes in params["layouts"]:
                    if layout_world != world:
                        continue
                    variants = {}
                    for variant in ("upstream", "fixed"):
                        status = automodel_patch.apply().to_dict() if variant == "fixed" else None
                        variants[variant] = {"apply": status, **_build(world, sizes, reported)}
                    automodel_patch.revert()
                    sync.put(f"{key}/{name}/{rank}", variants)
                dist.barrier()
                dist.destroy_process_group()
            sync.barrier(f"{key}/end")
            if rank == 0:
                for name, layout_world, _ in params["layouts"]:
                    if layout_world != world:
                        continue
                    per_rank = [sync.get(f"{key}/{name}/{r}") for r in range(world)]
                    same = all(
                        _requested(per_rank[r][v]["calls"]) == _requested(per_rank[0][v]["calls"])
                        for r in range(world)
                        for v in per_rank[0]
                    )
                    out.setdefault(scenario, {})[name] = {**per_rank[0], "same_calls_on_every_rank": same}
    return out if rank == 0 else None


# ----------------------------------------------------------------------------- driver side


def _summarise(scenario: str, name: str, world: int, sizes: dict[str, int], measured: dict[str, Any]) -> dict[str, Any]:
    real_backend, reported, factor = SCENARIOS[scenario]
    default_backend = reported or real_backend
    minimum = minimum_groups(world, sizes, default_timeout_matches=factor == 1.0)
    needed = Counter(
        (axis, tuple(s)) for axis, a in minimum["per_axis"].items() if not a["reuses_default"] for s in a["rank_sets"]
    )
    everyone = list(range(world))
    summary: dict[str, Any] = {"world_size": world, "sizes": sizes, "minimum": minimum, "variants": {}}
    for variant, data in measured.items():
        if variant == "same_calls_on_every_rank":
            continue
        calls = data["calls"]
        made = Counter((c["axis"], tuple(c["ranks"])) for c in calls)
        beyond = made - needed
        world_axes = [
            axis
            for axis, a in minimum["per_axis"].items()
            if a["size"] == world and axis in data["axis_reuses_default"]
        ]
        summary["variants"][variant] = {
            **data,
            "count": len(calls),
            "backends": dict(Counter(c["backend"] or f"(default: {default_backend})" for c in calls)),
            "timeouts_s": dict(Counter(str(c["timeout_s"]) for c in calls)),
            "beyond_minimum": [{"axis": a, "ranks": list(r), "times": n} for (a, r), n in beyond.items()],
            "world_sized_new_groups": sum(1 for c in calls if c["ranks"] == everyone),
            "world_axes_reusing_default": {axis: data["axis_reuses_default"][axis] for axis in world_axes},
            "gloo_groups": sum(1 for c in calls if "gloo" in (c["backend"] or default_backend)),
            "read_back_timeouts_s_rank0": sorted(
                {c["read_back_timeout_s"] for c in calls if "read_back_timeout_s" in c}
            ),
            "world_axes_on_default_group": [axis for axis, reused in data["axis_reuses_default"].items() if reused],
        }
    summary["same_calls_on_every_rank"] = measured["same_calls_on_every_rank"]
    fixed = summary["variants"]["fixed"]
    summary["targets"] = {
        "fix_creates_nothing_beyond_minimum": not fixed["beyond_minimum"],
        "fix_world_axes_reuse_default": (
            all(fixed["world_axes_reusing_default"].values()) and fixed["world_sized_new_groups"] == 0
            if factor == 1.0
            else None  # timeouts differ: a world-sized axis must get its own group
        ),
        "fix_no_gloo_on_nccl_default": fixed["gloo_groups"] == 0 if reported == "nccl" else None,
    }
    # Not a target, a fact: world-sized axes left on the default group although its timeout differs.
    summary["world_axes_on_default_despite_other_timeout"] = (
        [a for a, reused in fixed["world_axes_reusing_default"].items() if reused] if factor != 1.0 else None
    )
    return summary


def main() -> dict[str, Any]:
    """Count, print the tables, write ``benchmarks/results/process_groups.json``."""
    started = time.perf_counter()
    env_before = environment()
    params = {"scenarios": SCENARIOS, "layouts": LAYOUTS}
    results, spawn_wall = run_ranks(
        "benchmarks.process_groups:rank_worker", params, world_size=LAUNCHED_RANKS, timeout_s=SPAWN_TIMEOUT_S
    )
    measured = results[0]
    layouts = {name: (world, sizes) for name, world, sizes in LAYOUTS}
    summary = {
        scenario: {name: _summarise(scenario, name, *layouts[name], data) for name, data in per_layout.items()}
        for scenario, per_layout in measured.items()
    }

    def yes(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    for scenario, per_layout in summary.items():
        rows = []
        for name, s in per_layout.items():
            up, fx = s["variants"]["upstream"], s["variants"]["fixed"]
            rows.append(
                [
                    name,
                    s["world_size"],
                    s["minimum"]["total"],
                    s["minimum"]["floor_if_axes_shared_groups"],
                    up["count"],
                    ", ".join(f"{b} x{n}" for b, n in up["backends"].items()) or "-",
                    ", ".join(f"{t} s x{n}" for t, n in up["timeouts_s"].items()) or "-",
                    fx["count"],
                    ", ".join(f"{b} x{n}" for b, n in fx["backends"].items()) or "-",
                    ", ".join(f"{t} s x{n}" for t, n in fx["timeouts_s"].items()) or "-",
                    f"{up['world_sized_new_groups']}/{fx['world_sized_new_groups']}",
                    "/".join(",".join(f"{t:g}" for t in v["read_back_timeouts_s_rank0"]) or "-" for v in (up, fx)),
                    yes(s["targets"]["fix_creates_nothing_beyond_minimum"]),
                ]
            )
        real_backend, reported, factor = SCENARIOS[scenario]
        note = f" (reported; real default group {real_backend})" if reported else ""
        print_table(
            f"Default group {scenario}{note}, timeout {TIMEOUT_MINUTES * factor:g} min; "
            f"mesh built with timeout_minutes={TIMEOUT_MINUTES:g}: new_group calls",
            [
                "layout",
                "ranks",
                "minimum",
                "floor*",
                "0.7.0",
                "0.7.0 backends",
                "0.7.0 timeouts",
                "fixed",
                "fixed backends",
                "fixed timeouts",
                "world-sized new 0.7.0/fixed",
                "read back s 0.7.0/fixed",
                "fixed <= min",
            ],
            rows,
        )
    print("\n  * floor: distinct rank sets over all axes (if axes with identical rank sets shared one group)")
    print("  timeouts: what new_group received ('None': torch's default for the backend, Gloo 30 min);")
    print("  read back: timeouts of rank 0's new groups, read from the groups (simulated GPU rows: the Gloo stand-ins)")

    targets = {
        "fix_creates_nothing_beyond_minimum": all(
            s["targets"]["fix_creates_nothing_beyond_minimum"] for p in summary.values() for s in p.values()
        ),
        "fix_world_axes_reuse_default_when_timeouts_equal": all(
            s["targets"]["fix_world_axes_reuse_default"]
            for p in summary.values()
            for s in p.values()
            if s["targets"]["fix_world_axes_reuse_default"] is not None
        ),
        "fix_no_gloo_groups_on_nccl_default": all(
            s["targets"]["fix_no_gloo_on_nccl_default"] for s in summary["nccl"].values()
        ),
        "same_calls_on_every_rank": all(s["same_calls_on_every_rank"] for p in summary.values() for s in p.values()),
    }
    nccl_counts = {
        name: (s["variants"]["upstream"]["count"], s["variants"]["fixed"]["count"])
        for name, s in summary["nccl"].items()
    }
    print_table(
        "Targets",
        ["target", "met"],
        [[name, yes(value)] for name, value in targets.items()]
        + [
            ["nccl default: new groups 0.7.0 -> fixed", "; ".join(f"{n} {a}->{b}" for n, (a, b) in nccl_counts.items())]
        ],
    )
    other = {
        name: s["world_axes_on_default_despite_other_timeout"] for name, s in summary["gloo, other timeout"].items()
    }
    print_table(
        "Default group with another timeout (4 min vs 2): world-sized axes still on the default group (fixed)",
        ["layout", "axes"],
        [[name, ", ".join(axes) or "none"] for name, axes in other.items()],
    )
    total = time.perf_counter() - started
    data = {
        "benchmark": "process_groups",
        "environment_before": env_before,
        "environment_after": environment(),
        "timeout_minutes": TIMEOUT_MINUTES,
        "scenarios": {
            k: {"real_backend": v[0], "reported_backend": v[1], "default_timeout_factor": v[2]}
            for k, v in SCENARIOS.items()
        },
        "results": summary,
        "targets": targets,
        "world_axes_on_default_despite_other_timeout": other,
        "spawn_wall_s": spawn_wall,
        "total_wall_s": total,
        "all_met": all(targets.values()),
    }
    path = write_results("process_groups", data)
    print(f"\nwrote {path.relative_to(ROOT)} in {total:.0f} s (rank processes: {spawn_wall:.0f} s)")
    return data


if __name__ == "__main__":
    main()
