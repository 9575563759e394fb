"""Rank-side functions for the fork-fix tests, run by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`.

Each function receives JSON params, does the real work in its own process (the
Automodel release that ``PYTHONPATH`` puts first, real torch.distributed on
Gloo) and returns JSON-able facts for the test to assert on. Nothing here
asserts. On Gloo the workaround that matters is ``cpu-mesh-timeout``.
:func:`patched_release_copy` prepares a release folder with the source patch
applied; it runs in the test process.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.harness.paths import REPO_ROOT
from tests.ranks.fresh_group import device_mesh_facts

__all__ = [
    "GIT_APPLY_TIMEOUT_S",
    "fault_on_sub_group",
    "git_apply",
    "mesh_timeouts",
    "patched_release_copy",
    "source_patched_env",
    "upstream_patched_facts",
]

#: Bound on one ``git apply`` / ``patch`` run.
GIT_APPLY_TIMEOUT_S = 60
#: The workaround a Gloo (CPU) mesh needs.
CPU_MESH = "cpu-mesh-timeout"


# --------------------------------------------------------------------------- helpers for the test process


def git_apply(root: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``git apply [extra] patch`` in ``root`` as a plain folder (never inside an enclosing repository)."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent))
    return subprocess.run(
        ["git", "apply", *extra, str(patch)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=GIT_APPLY_TIMEOUT_S,
        check=False,
    )


def patched_release_copy(release: Path, dest: Path, patch: Path) -> Path:
    """Copy the release folder ``release`` to ``dest`` and apply ``patch`` there with ``git apply``.

    Raises RuntimeError with git's output when the patch does not apply.
    """
    shutil.copytree(release, dest)
    done = git_apply(dest, patch)
    if done.returncode != 0:
        raise RuntimeError(f"git apply {patch.name} failed in {dest} (exit {done.returncode}): {done.stderr.strip()}")
    return dest


def source_patched_env(patched_root: Path) -> dict[str, str]:
    """Environment for a spawned process that imports the patched copy ahead of the installed release."""
    parts = [str(patched_root), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


# --------------------------------------------------------------------------- rank-side functions


def _group_facts(device_mesh: Any, moe_mesh: Any) -> dict[str, dict[str, Any]]:
    """Size, backends, per-backend timeout (s), default-group identity and an all_reduce of ones per group."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.process_groups import registry

    facts = {}
    for name, group in registry.named_groups(device_mesh, moe_mesh).items():
        ones = torch.ones(1)
        dist.all_reduce(ones, group=group)
        facts[name] = {
            "size": dist.get_world_size(group),
            "is_default_group": group is dist.group.WORLD,
            "backends": registry.group_backends(group),
            "timeout_s": {device: t.total_seconds() for device, t in registry.backend_timeouts(group).items()},
            "all_reduce": ones.item(),
        }
    return facts


def _build(ep_size: int, timeout_minutes: float | None) -> tuple[Any, Any]:
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes

    context = MeshContext.build(
        FSDP2Config(),
        ParallelismSizes(ep_size=ep_size),
        timeout_minutes=timeout_minutes,
    )
    return context.device_mesh, context.moe_mesh


def mesh_timeouts(params: dict[str, Any]) -> dict[str, Any]:
    """Build several real 0.7.0 meshes on one Gloo default group, patched and not, and read every group.

    params: ``default_minutes`` (default group timeout), ``scenarios``: list of
    ``{"name", "patched", "ep_size", "timeout_minutes"}`` (the last for
    ``MeshContext.build``), run in order on the same default group
    (``apply()``/``revert()`` in between).
    """
    import torch.distributed as dist

    import automodel_patch

    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=params["default_minutes"]))
    report: dict[str, Any] = {
        "device_mesh": device_mesh_facts(),
        "backend": str(dist.get_backend()),
        "world_size": dist.get_world_size(),
        "installed_version": str(automodel_patch.installed_version()),
        "scenarios": {},
    }
    for scenario in params["scenarios"]:
        status = automodel_patch.apply(CPU_MESH)[CPU_MESH].value if scenario["patched"] else None
        if not scenario["patched"]:
            automodel_patch.revert()
        device_mesh, moe_mesh = _build(scenario["ep_size"], scenario["timeout_minutes"])
        report["scenarios"][scenario["name"]] = {
            "apply": status,
            "is_applied": automodel_patch.is_applied(CPU_MESH),
            "device_type": device_mesh.device_type,
            "groups": _group_facts(device_mesh, moe_mesh),
        }
    automodel_patch.revert()
    dist.barrier()
    return report


def fault_on_sub_group(params: dict[str, Any]) -> dict[str, Any]:
    """One rank skips a collective on a sub-group with a short timeout; the other reports how it ended.

    params: ``default_minutes`` (default group, longer, so the world-sized
    ``dp_shard`` axis gets its own group), ``timeout_minutes`` (sub-groups),
    ``stalled_rank``, ``stall_s`` (how long the stalled rank sleeps; it never
    touches the sub-group). Both ranks meet on the default group at the end.
    """
    import torch
    import torch.distributed as dist

    import automodel_patch
    from nemo_rl_shim.process_groups import registry
    from nemo_rl_shim.timeouts import set_group_timeout

    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=params["default_minutes"]))
    status = automodel_patch.apply(CPU_MESH)[CPU_MESH].value
    # Gloo connects a new group's ranks under that group's timeout (here 3 s): both ranks must reach the build
    # together, even when the machine is busy, or the connection itself times out.
    dist.barrier()
    device_mesh, _ = _build(1, params["timeout_minutes"])
    group = device_mesh.get_group("dp_shard")
    rank = dist.get_rank()
    wanted = datetime.timedelta(minutes=params["timeout_minutes"])
    # torch 2.9's DeviceMesh gives a Gloo sub-group no timeout (setup_distributed sets it after the build;
    # this worker builds directly): the fault needs a sub-group carrying the short one, so it is set here.
    set_by_worker = registry.backend_timeouts(group)["cpu"] != wanted
    if set_by_worker:
        set_group_timeout(wanted, group)
    report: dict[str, Any] = {
        "rank": rank,
        "timeout_set_by_worker": set_by_worker,
        "apply": status,
        "group_size": dist.get_world_size(group),
        "is_default_group": group is dist.group.WORLD,
        "timeout_s": {device: t.total_seconds() for device, t in registry.backend_timeouts(group).items()},
    }
    if rank == params["stalled_rank"]:
        start = time.monotonic()
        time.sleep(params["stall_s"])
        report["role"] = "stalled"
        report["slept_s"] = time.monotonic() - start
        report["entered_sub_group_collective"] = False
    else:
        report["role"] = "waiting"
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=group)
        except RuntimeError as error:
            report["raised"] = type(error).__name__
            report["message"] = str(error).splitlines()[0][:300]
        else:
            report["raised"] = None
        report["detection_s"] = time.monotonic() - start
    dist.barrier()  # the default group is unaffected: both ranks leave together
    report["left_through_default_group"] = True
    automodel_patch.revert()
    return report


def _override_facts(override: Any) -> Any:
    if override is None:
        return None
    return {axis: {"backend": backend, "timeout_s": options._timeout.total_seconds()} for axis, (backend, options) in
            override.items()}  # fmt: skip


def upstream_patched_facts(params: dict[str, Any]) -> dict[str, Any]:
    """What a release carrying the upstream PRs' ``mesh_utils.py`` changes does, with no run-time layer.

    First, before any group exists, the world Automodel's unit tests stand up: ``dist.is_initialized()``
    says True, no default group. Then :func:`mesh_timeouts` on a real Gloo default group (``params``
    as there, scenarios unpatched), and the override a CUDA mesh would get on that same group.
    """
    from unittest import mock

    import torch.distributed as dist
    from nemo_automodel.components.distributed import mesh_utils

    axes = ("dp_shard", "tp")
    report: dict[str, Any] = {}
    with mock.patch.object(dist, "is_initialized", return_value=True):
        try:
            override = mesh_utils._nccl_backend_override(axes, device_type="cuda", timeout_minutes=1)
            report["no_default_group"] = {"raised": None, "override": _override_facts(override)}
        except Exception as error:  # the finding of NVIDIA-NeMo/Automodel#4601's first fix: report it
            report["no_default_group"] = {"raised": f"{type(error).__name__}: {error}"}
    report.update(mesh_timeouts(params))
    report["cuda_axes_on_real_group"] = _override_facts(
        mesh_utils._nccl_backend_override(axes, device_type="cuda", timeout_minutes=1)
    )
    report["default_group_backend"] = mesh_utils._default_group_backend()
    dist.barrier()
    return report
