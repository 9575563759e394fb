"""Rank-side functions for the set-up and decision tests, run by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`.

Each function receives JSON params, does the real work in its own process (real
torch.distributed on Gloo, the Automodel release that ``PYTHONPATH`` selects)
and returns JSON-able facts for the test to assert on. Nothing here asserts.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

from automodel_patch._target import MESH_MODULE, MESH_UTILS_MODULE
from nemo_rl_shim.config import blocks

__all__ = ["UNSET", "layouts", "legacy_pin", "single_rank_cpu_offload", "unsupported_pair"]

#: ``timeout`` value meaning "leave distributed_timeout_minutes out of automodel_cfg".
UNSET = "unset"


def _section(timeout: Any, dtensor_cfg: dict[str, Any], patch_automodel: bool = True) -> dict[str, Any]:
    """A NeMo RL policy (or value) section with this timeout and these parallel sizes."""
    knobs = {} if timeout == UNSET else {"distributed_timeout_minutes": timeout}
    if not patch_automodel:
        knobs["patch_automodel"] = False
    return {**blocks(knobs), "dtensor_cfg": {"enabled": True, **dtensor_cfg}}


def _group_facts(ctx: Any) -> dict[str, dict[str, Any]]:
    """Size, backends, per-backend timeout (minutes, read from the group) and an all_reduce of ones, per group."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.process_groups import registry

    facts = {}
    for name, group in registry.named_groups(ctx.device_mesh, ctx.moe_mesh).items():
        ones = torch.ones(1)
        dist.all_reduce(ones, group=group)
        facts[name] = {
            "size": dist.get_world_size(group),
            "is_default_group": group is dist.group.WORLD or group == dist.distributed_c10d._get_default_group(),
            "backends": registry.group_backends(group),
            "timeout_minutes": {
                device: timeout.total_seconds() / 60 for device, timeout in registry.backend_timeouts(group).items()
            },
            "all_reduce": ones.item(),
        }
    return facts


def _count_mesh_builders() -> dict[str, Any]:
    """Count calls of whichever mesh builder ``setup_distributed`` can use; the real builder still runs.

    ``functools.wraps`` keeps each signature visible: ``setup_distributed``
    detects ``MeshContext.build(timeout_minutes=)`` from it.
    """
    calls: dict[str, Any] = {}
    mesh = importlib.import_module(MESH_MODULE)
    context_cls = getattr(mesh, "MeshContext", None)
    if context_cls is not None and hasattr(context_cls, "build"):
        original_build = context_cls.build.__func__

        @functools.wraps(original_build)
        def build(cls: Any, *args: Any, **kwargs: Any) -> Any:
            calls["MeshContext.build"] = calls.get("MeshContext.build", 0) + 1
            calls["timeout_minutes"] = kwargs.get("timeout_minutes")
            return original_build(cls, *args, **kwargs)

        context_cls.build = classmethod(build)
    mesh_utils = importlib.import_module(MESH_UTILS_MODULE)
    original_create = getattr(mesh_utils, "create_device_mesh", None)
    if original_create is not None:

        @functools.wraps(original_create)
        def create_device_mesh(*args: Any, **kwargs: Any) -> Any:
            calls["create_device_mesh"] = calls.get("create_device_mesh", 0) + 1
            return original_create(*args, **kwargs)

        mesh_utils.create_device_mesh = create_device_mesh
    return calls


def _count_read_back_passes() -> dict[str, int]:
    """Count ``setup_distributed``'s calls of ``set_mesh_timeouts`` (the post-build pass that reads every group
    back); the real function still runs."""
    from nemo_rl_shim.setup import distributed

    calls = {"set_mesh_timeouts": 0}
    original = distributed.set_mesh_timeouts

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls["set_mesh_timeouts"] += 1
        return original(*args, **kwargs)

    distributed.set_mesh_timeouts = counted
    return calls


def layouts(params: dict[str, Any]) -> dict[str, Any]:
    """Run ``setup_distributed`` once per scenario, read every group, then tear the default group down.

    params: ``scenarios`` (list of ``{"name", "timeout", "cpu_offload", "dtensor_cfg"[, "patch_automodel"]}``,
    ``timeout`` a number, None or ``"unset"``). Each scenario after the first
    rendezvouses on a fresh port (:func:`tests.ranks.fresh_group.move_to_fresh_port`).
    """
    import torch.distributed as dist

    import automodel_patch
    from nemo_rl_shim import RuntimeConfig, setup_distributed
    from tests.ranks.fresh_group import device_mesh_facts, forget_meshes, move_to_fresh_port

    mesh_builders = _count_mesh_builders()
    read_back_passes = _count_read_back_passes()
    out = []
    mesh_facts = None
    for scenario in params["scenarios"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ctx = setup_distributed(
                _section(scenario["timeout"], scenario.get("dtensor_cfg", {}), scenario.get("patch_automodel", True)),
                RuntimeConfig(cpu_offload=scenario["cpu_offload"]),
                role=scenario.get("role", "policy"),
            )
        if mesh_facts is None:
            mesh_facts = device_mesh_facts()
        out.append(
            {
                "name": scenario["name"],
                "decision": ctx.decision.to_dict() if ctx.decision is not None else None,
                "timeouts_set_after_build": list(getattr(ctx, "timeouts_set_after_build", ())),
                "sizes": {"dp": ctx.dp_size, "tp": ctx.tp_size, "cp": ctx.cp_size},
                "mesh_dim_names": [str(getattr(n, "value", n)) for n in ctx.device_mesh.mesh_dim_names],
                "groups": _group_facts(ctx),
                "runtime_warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
                "patch_applied": automodel_patch.is_applied(),
                "active": list(automodel_patch.active()),
                "context_fields": list(type(ctx)._fields),
                "mesh_builders": dict(mesh_builders),
                "set_mesh_timeouts_calls": read_back_passes["set_mesh_timeouts"],
            }
        )
        mesh_builders.clear()
        read_back_passes["set_mesh_timeouts"] = 0
        del ctx
        move_to_fresh_port()  # a collective: no rank tears the store down while a peer still uses it
        dist.destroy_process_group()
        forget_meshes()
    return {
        "version": str(automodel_patch.installed_version()),
        "build_accepts_timeout": automodel_patch.build_accepts_timeout(),
        "device_mesh": mesh_facts,
        "scenarios": out,
    }


def legacy_pin(params: dict[str, Any]) -> dict[str, Any]:
    """On a pin without ``MeshContext.build(timeout_minutes=)``: real set-ups (see :func:`layouts`), and the
    decision for ``timeout`` under each default-group backend of ``backends``."""
    from nemo_rl_shim.setup.decision import decide

    decisions = {
        backend: decide(params["timeout"], cpu_offload="cpu:" in backend, default_backend=backend).to_dict()
        for backend in params.get("backends", [])
    }
    return {**layouts(params), "decisions": decisions}


def single_rank_cpu_offload(params: dict[str, Any]) -> dict[str, Any]:
    """World size 1 with CPU offload: what ``setup_distributed`` raises, and whether a process group remains.

    Twice: with the launcher's ``WORLD_SIZE`` (checked before any group exists), and on a
    group the caller made, without ``WORLD_SIZE`` (checked after; the caller's group stays).
    """
    import os

    import torch.distributed as dist

    from nemo_rl_shim import RuntimeConfig, setup_distributed

    def attempt() -> dict[str, Any] | None:
        try:
            setup_distributed(_section(params["timeout"], {}), RuntimeConfig(cpu_offload=True))
        except NotImplementedError as e:
            return {"type": type(e).__name__, "message": str(e)}
        return None

    before_any_group = {"raised": attempt(), "initialized_after": dist.is_initialized()}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    caller_group = dist.group.WORLD
    del os.environ["WORLD_SIZE"]
    on_callers_group = {"raised": attempt(), "callers_group_kept": dist.group.WORLD is caller_group}
    dist.destroy_process_group()
    return {"before_any_group": before_any_group, "on_callers_group": on_callers_group}


def unsupported_pair(params: dict[str, Any]) -> dict[str, Any]:
    """``setup_distributed`` where nemo-automodel cannot run on this torch: what it raises, and any group left."""
    import torch.distributed as dist

    from nemo_rl_shim import RuntimeConfig, UnsupportedVersions, setup_distributed

    try:
        setup_distributed(_section(45, {}), RuntimeConfig())
    except UnsupportedVersions as e:
        raised = {"type": type(e).__name__, "message": str(e)}
    else:
        raised = None
    return {"raised": raised, "initialized_after": dist.is_initialized()}
