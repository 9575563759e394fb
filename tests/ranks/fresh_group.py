"""Helpers for rank-side test code that tears a default group down and builds another in the same process."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from nemo_rl_shim.cli.preflight.rendezvous import bind_rendezvous

__all__ = ["device_mesh_facts", "forget_meshes", "move_to_fresh_port", "rendezvous", "stall_or_report"]


def move_to_fresh_port() -> int:
    """Agree on a fresh ``MASTER_PORT`` for the next default group, over the current one; call on every rank.

    Call it before ``destroy_process_group``. Re-using the old port can hang (a
    rank meets the store that a peer has not closed yet), and a port picked free
    can be taken before it is bound: rank 0 binds the next world's store now
    (:func:`~nemo_rl_shim.cli.preflight.rendezvous.bind_rendezvous`), and every rank
    learns its port over the group that still exists.
    """
    port = [bind_rendezvous(dist.get_world_size()) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    os.environ["MASTER_PORT"] = str(port[0])
    return int(port[0])


def forget_meshes() -> None:
    """Drop torch 2.9's process-wide record of meshes before a new default group; call after destroying one.

    torch 2.9 keeps flattened and child meshes in ``device_mesh._mesh_resources``, keyed by
    meshes that compare equal across default groups: a second set-up in the same process
    is handed the first one's flattened mesh, whose group was destroyed ("Could not resolve
    the process group"). torch 2.10 keeps them on the root mesh instead, and has nothing here
    to drop. A training worker sets up once per process and never meets this.
    """
    from torch.distributed import device_mesh

    resources = getattr(device_mesh, "_mesh_resources", None)
    for name in ("child_to_root_mapping", "root_to_flatten_mapping", "flatten_name_to_root_dims"):
        mapping = getattr(resources, name, None)
        if isinstance(mapping, dict):
            mapping.clear()


def device_mesh_facts() -> dict[str, Any]:
    """What torch's DeviceMesh does with a backend override, measured on the live default group (call on every rank).

    A (world, 1) mesh whose size-1 axis carries a Gloo override of 7 s: ``passes_timeout``
    is whether that sub-group reads back 7 s (torch 2.10 and later hand ``timeout`` to
    ``new_group``; torch 2.9 does not), ``reuses_default_group`` whether the world-sized axis
    without an override is the default group itself (torch 2.10 and later; 2.9 builds a new one).
    """
    import datetime

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from nemo_rl_shim.process_groups.registry import backend_timeouts

    seven = datetime.timedelta(seconds=7)
    options = torch._C._distributed_c10d.Backend.Options("gloo", seven)
    options._timeout = seven
    mesh = init_device_mesh(
        "cpu",
        (dist.get_world_size(), 1),
        mesh_dim_names=("probe_world", "probe_one"),
        backend_override={"probe_one": ("gloo", options)},
    )
    read_back = backend_timeouts(mesh.get_group("probe_one"))["cpu"]
    return {
        "passes_timeout": read_back == seven,
        "read_back_s": read_back.total_seconds(),
        "reuses_default_group": mesh.get_group("probe_world") is dist.group.WORLD,
    }


def rendezvous(params: dict[str, Any]) -> dict[str, Any]:
    """Join the launcher's world on gloo, all-reduce once, and say where it met (a rank function for spawn tests)."""
    import torch

    dist.init_process_group("gloo")
    ones = torch.ones(1)
    dist.all_reduce(ones)
    return {"rank": dist.get_rank(), "sum": ones.item(), "port": int(os.environ["MASTER_PORT"])}


def stall_or_report(params: dict[str, Any]) -> dict[str, Any]:
    """Rank ``params["stall_rank"]`` sleeps an hour; the others return at once, with ``params["result"]``."""
    import time

    rank = int(os.environ["RANK"])
    if rank == params["stall_rank"]:
        time.sleep(3600)
    return {"rank": rank, **params["result"]}
