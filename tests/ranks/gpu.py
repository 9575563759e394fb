"""Rank-side functions for tests/test_gpu.py, run by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`.

Each runs in its own process (so an applied fork fix never leaks into pytest),
does the real work with real NCCL and Gloo, and returns JSON-able facts for the
test to assert on. Nothing here asserts. ``params["device"]`` / ``params["backend"]``
exist only for a dry run of the one-GPU worker on CPU; the tests use the defaults.
"""

from __future__ import annotations

import datetime
import importlib
import os
from typing import Any

import torch
import torch.distributed as dist

from automodel_patch._target import MESH_MODULE, MESH_UTILS_MODULE
from nemo_rl_shim.config import blocks

__all__ = ["one_gpu_mesh", "two_rank_offload"]

TIMEOUT_MINUTES = 45


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _all_reduce_sum(group: Any, device: str) -> float | str:
    """Sum of ones over ``group`` on ``device``: the group size, or the error text."""
    ones = torch.ones(1, device=torch.device(device, torch.cuda.current_device()) if device == "cuda" else device)
    try:
        dist.all_reduce(ones, group=group)
    except Exception as e:  # the failure is the finding
        return _error(e)
    return ones.item()


def _group_facts(device_mesh: Any, moe_mesh: Any, devices: tuple[str, ...]) -> dict[str, Any]:
    from nemo_rl_shim.process_groups.registry import backend_timeouts, group_backends, named_groups

    facts = {}
    for name, group in named_groups(device_mesh, moe_mesh).items():
        facts[name] = {
            "size": dist.get_world_size(group),
            "backends": group_backends(group),
            "timeout_minutes": {d: t.total_seconds() / 60 for d, t in backend_timeouts(group).items()},
            "all_reduce": {device: _all_reduce_sum(group, device) for device in devices},
        }
    return facts


def _offloaded_full_tensor(device_mesh: Any) -> dict[str, Any]:
    """An FSDP2 parameter with CPUOffloadPolicy, sharded on mesh dp, rebuilt with full_tensor()."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from nemo_rl_shim.process_groups.registry import axis_mesh

    dp = axis_mesh(device_mesh, "dp")
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4 * dp.size(), bias=False)
    reference = module.weight.detach().clone()
    fully_shard(module, mesh=dp, offload_policy=CPUOffloadPolicy(pin_memory=False))
    facts: dict[str, Any] = {"dp_size": dp.size(), "local_device": module.weight.to_local().device.type}
    try:
        full = module.weight.full_tensor()
    except Exception as e:  # "No backend type associated with device type cpu" is the regression
        return {**facts, "error": _error(e), "equal": False}
    return {**facts, "error": None, "equal": bool(torch.equal(full.cpu(), reference))}


def two_rank_offload(params: dict[str, Any]) -> dict[str, Any]:
    """Real setup_distributed with CPU offload and a 45-minute timeout on one GPU per rank."""
    import automodel_patch
    from nemo_rl_shim import RuntimeConfig, setup_distributed

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    knobs = {"distributed_timeout_minutes": TIMEOUT_MINUTES, "patch_automodel": params["patch"]}
    context = setup_distributed(
        {**blocks(knobs), "dtensor_cfg": {"cpu_offload": True}}, RuntimeConfig(cpu_offload=True)
    )
    return {
        "default_backend": str(dist.get_backend()),
        "decision": context.decision.action.value,
        "patch_applied": automodel_patch.is_applied("keep-cpu-backend"),
        "groups": _group_facts(context.device_mesh, context.moe_mesh, ("cpu", "cuda")),
        "offload": _offloaded_full_tensor(context.device_mesh),
    }


def _build_mesh(devices: tuple[str, ...]) -> dict[str, Any]:
    """Automodel's real MeshContext.build for a 1-rank mesh; every axis gets the override."""
    dist_pkg = "nemo_automodel.components.distributed"
    mesh = importlib.import_module(MESH_MODULE)
    fsdp2_config = importlib.import_module(f"{dist_pkg}.config").FSDP2Config()
    context = mesh.MeshContext.build(
        fsdp2_config,
        mesh.ParallelismSizes(dp_replicate_size=1, tp_size=1, cp_size=1, ep_size=1, pp_size=1),
        world_size=1,
        timeout_minutes=TIMEOUT_MINUTES,
    )
    return _group_facts(context.device_mesh, context.moe_mesh, devices)


def _direct_override_mesh(device: str, devices: tuple[str, ...]) -> dict[str, Any]:
    """The installed (patched) override handed straight to torch's init_device_mesh.

    Bypasses the fix's world-sized-axis reuse, so each axis is a new sub-group
    built from the override itself: the composite backend with the timeout on both halves.
    """
    from torch.distributed.device_mesh import init_device_mesh

    mesh_utils = importlib.import_module(MESH_UTILS_MODULE)
    axes = ("dp_shard", "tp")
    override = mesh_utils._nccl_backend_override(axes, device_type=device, timeout_minutes=TIMEOUT_MINUTES)
    device_mesh = init_device_mesh(device, (1, 1), mesh_dim_names=axes, backend_override=override)
    return _group_facts(device_mesh, None, devices)


def one_gpu_mesh(params: dict[str, Any]) -> dict[str, Any]:
    """World size 1 on a "cuda:nccl,cpu:gloo" default group: the mesh before and after the fork fix."""
    import automodel_patch

    device = params.get("device", "cuda")
    devices = ("cpu", "cuda") if device == "cuda" else ("cpu",)
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(
        backend=params.get("backend", "cuda:nccl,cpu:gloo"), timeout=datetime.timedelta(minutes=TIMEOUT_MINUTES)
    )
    native = automodel_patch.detect("keep-cpu-backend").verdict.value == "not_needed"
    unpatched = _build_mesh(devices)
    status = automodel_patch.apply("keep-cpu-backend")["keep-cpu-backend"]
    return {
        "default_backend": str(dist.get_backend()),
        "world_size": dist.get_world_size(),
        "native_keeps_cpu": native,
        "unpatched": unpatched,
        "apply_status": status.value,
        "patched": _build_mesh(devices),
        "direct": _direct_override_mesh(device, devices),
    }
