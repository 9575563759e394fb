"""Rank functions for tests/process_groups/test_setting.py: ``set_mesh_timeouts`` on meshes built by a real release.

Each rank joins the launcher's world on Gloo, builds meshes the way the release on
``PYTHONPATH`` builds them without a timeout (``create_device_mesh`` on 0.3.0/0.4.0,
``MeshContext.build`` without ``timeout_minutes`` on later ones), reads every group's
timeout straight from its backends, calls :func:`nemo_rl_shim.process_groups.setting.set_mesh_timeouts`,
and reads again. The last layout checks the value by a collective that times out on a
peer that never joins. Nothing here asserts.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import re
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from tests.ranks.meet import rank_0_leaves_last

__all__ = [
    "CUDA_STAND_IN",
    "after_build",
    "build_without_timeout",
    "composite_after_build",
    "composite_half_skipped",
]

_DIST = "nemo_automodel.components.distributed"
#: A backend registered for CUDA that is Gloo underneath: stands in for NCCL (which cannot start without a GPU)
#: so that the default group has two distinct halves, as CPU offload's ``"cuda:nccl,cpu:gloo"`` has.
CUDA_STAND_IN = "ncclstandin"
#: Bound on a rank's wait, through the store, for its peers to leave the stalled collective.
_STORE_WAIT_S = 120


def build_without_timeout(layout: dict[str, Any], backend: str = "gloo") -> tuple[Any, Any, str]:
    """The release's own mesh build, without a timeout; which builder ran.

    ``backend`` is ``FSDP2Config.backend`` where the release has it (0.3.0 and 0.4.0 pick the mesh
    device by it); later releases pick the device themselves.
    """
    mesh_utils = importlib.import_module(f"{_DIST}.mesh_utils")
    fsdp2_cls = importlib.import_module(f"{_DIST}.config").FSDP2Config
    has_backend = "backend" in {f.name for f in dataclasses.fields(fsdp2_cls)}
    fsdp2 = fsdp2_cls(backend=backend) if has_backend else fsdp2_cls()
    sizes = {"tp_size": layout.get("tp", 1), "cp_size": layout.get("cp", 1), "ep_size": layout.get("ep", 1)}
    if hasattr(mesh_utils, "create_device_mesh"):  # 0.3.0 / 0.4.0 (NeMo RL's pin)
        device_mesh, moe_mesh = mesh_utils.create_device_mesh(
            fsdp2, dp_replicate_size=layout.get("dp_replicate", 1), pp_size=1, world_size=dist.get_world_size(), **sizes
        )
        return device_mesh, moe_mesh, "create_device_mesh"
    mesh = importlib.import_module(f"{_DIST}.mesh")
    parallelism = mesh.ParallelismSizes(dp_replicate_size=layout.get("dp_replicate", 1), pp_size=1, **sizes)
    context = mesh.MeshContext.build(fsdp2, parallelism, world_size=dist.get_world_size())
    return context.device_mesh, context.moe_mesh, "MeshContext.build"


def _raw(meshes: Any) -> dict[str, dict[str, Any]]:
    """Per group (enumerated by ``tests.ranks.timeouts.mesh_groups``): backend names and timeouts in seconds."""
    from tests.ranks.timeouts import mesh_groups

    out = {}
    for name, group in mesh_groups(meshes).items():
        backends = {}
        for device in ("cpu", "cuda"):
            try:
                backend = group._get_backend(torch.device(device))
            except RuntimeError:
                continue
            backends[device] = {"name": backend.name(), "seconds": backend.options._timeout.total_seconds()}
        name = re.sub(r"MeshAxisName\.(\w+)", lambda m: m.group(1).lower(), name)  # str() of 0.4.0's enum
        out[name] = {
            "ranks": dist.get_process_group_ranks(group),
            "is_default": group is dist.group.WORLD,
            "backends": backends,
        }
    return out


def _stalled(group: Any, stalled: bool) -> dict[str, Any]:
    """All-reduce on ``group`` unless this rank is the one that never joins; the outcome as this rank saw it."""
    if stalled:
        return {"outcome": "skipped"}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=group)
    except Exception as error:
        return {"outcome": "raised", "error": str(error)[:300], "seconds": time.monotonic() - start}
    return {"outcome": "completed", "seconds": time.monotonic() - start}


def after_build(params: dict[str, Any]) -> dict[str, Any]:
    """params: ``minutes``, ``layouts`` (``[{"name", "tp", "cp", "ep", "dp_replicate"}]``), and ``stall``
    (``{"layout", "group", "minutes"}``: on that layout, the group's last rank never joins an all-reduce)."""
    import automodel_patch
    from nemo_rl_shim.process_groups.setting import set_mesh_timeouts

    dist.init_process_group("gloo")
    out: dict[str, Any] = {"version": str(automodel_patch.installed_version()), "layouts": []}
    for layout in params["layouts"]:
        device_mesh, moe_mesh, builder = build_without_timeout(layout)
        meshes = SimpleNamespace(device_mesh=device_mesh, moe_mesh=moe_mesh)
        before = _raw(meshes)
        returned = set_mesh_timeouts(device_mesh, moe_mesh, params["minutes"])
        out["layouts"].append(
            {"name": layout["name"], "builder": builder, "before": before, "returned": returned, "after": _raw(meshes)}
        )
        dist.barrier()
    stall = params["stall"]
    (layout,) = [entry for entry in params["layouts"] if entry["name"] == stall["layout"]]
    device_mesh, moe_mesh, _ = build_without_timeout({**layout})
    set_mesh_timeouts(device_mesh, moe_mesh, stall["minutes"])
    group = device_mesh.get_group(stall["group"])
    ranks = dist.get_process_group_ranks(group)
    out["stall"] = {"ranks": ranks, **_stalled(group, stalled=dist.get_rank() == ranks[-1])}
    store = dist.distributed_c10d._get_default_store()
    store.set(f"left the stall {dist.get_rank()}", "1")
    store.wait([f"left the stall {r}" for r in range(dist.get_world_size())], datetime.timedelta(seconds=_STORE_WAIT_S))
    rank_0_leaves_last("past the wait", _STORE_WAIT_S)
    dist.destroy_process_group()
    return out


def _gloo_stand_in(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def composite_after_build(params: dict[str, Any]) -> dict[str, Any]:
    """CPU offload's default group shape, ``"cpu:gloo,cuda:<stand-in>"``, then the release's build and
    ``set_mesh_timeouts``: per group, its backend string and whether its two halves are distinct objects,
    before and after. params: ``layout``, ``minutes``."""
    from nemo_rl_shim.process_groups.setting import set_mesh_timeouts

    if CUDA_STAND_IN not in dist.Backend.backend_list:
        dist.Backend.register_backend(CUDA_STAND_IN, _gloo_stand_in, devices=["cuda"])
    dist.init_process_group(f"cpu:gloo,cuda:{CUDA_STAND_IN}")
    device_mesh, moe_mesh, builder = build_without_timeout(params["layout"])
    meshes = SimpleNamespace(device_mesh=device_mesh, moe_mesh=moe_mesh)

    def halves() -> dict[str, Any]:
        from tests.ranks.timeouts import mesh_groups

        out = {}
        for name, group in mesh_groups(meshes).items():
            name = re.sub(r"MeshAxisName\.(\w+)", lambda m: m.group(1).lower(), name)
            cpu, cuda = group._get_backend(torch.device("cpu")), group._get_backend(torch.device("cuda"))
            out[name] = {
                "backend": str(dist.get_backend_config(group)),
                "distinct_halves": cpu is not cuda,
                "seconds": {"cpu": cpu.options._timeout.total_seconds(), "cuda": cuda.options._timeout.total_seconds()},
            }
        return out

    before = halves()
    returned = set_mesh_timeouts(device_mesh, moe_mesh, params["minutes"])
    out = {"builder": builder, "before": before, "returned": returned, "after": halves()}
    dist.barrier()
    dist.destroy_process_group()
    return out


def composite_half_skipped(params: dict[str, Any]) -> dict[str, Any]:
    """``set_mesh_timeouts`` on a two-half group whose setter reaches the CPU half only: what it raises.

    The default group is ``"cpu:gloo,cuda:<stand-in>"`` (two distinct backend objects); a 1-D world-sized
    mesh reuses it. The setter is replaced by one that sets the CPU half alone, as a setter that skipped a
    half would. params: ``minutes``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from nemo_rl_shim.process_groups import setting

    if CUDA_STAND_IN not in dist.Backend.backend_list:
        dist.Backend.register_backend(CUDA_STAND_IN, _gloo_stand_in, devices=["cuda"])
    dist.init_process_group(f"cpu:gloo,cuda:{CUDA_STAND_IN}")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    group = mesh.get_group("tp")
    cpu, cuda = group._get_backend(torch.device("cpu")), group._get_backend(torch.device("cuda"))
    setting.set_group_timeout = lambda timeout, g: g._get_backend(torch.device("cpu"))._set_default_timeout(timeout)
    try:
        setting.set_mesh_timeouts(mesh, None, params["minutes"])
        raised = None
    except RuntimeError as error:
        raised = str(error)
    out = {
        "reuses_default_group": group is dist.group.WORLD,
        "distinct_halves": cpu is not cuda,
        "seconds": {"cpu": cpu.options._timeout.total_seconds(), "cuda": cuda.options._timeout.total_seconds()},
        "raised": raised,
    }
    dist.destroy_process_group()
    return out
