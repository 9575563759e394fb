"""Every process group torch holds, and every group a run created, by name: what each one is made of.

* :func:`all_groups` and :func:`group_key`: every group in torch's registry (``distributed_c10d._world.pg_map``),
  and the key a group has there (``"undefined:3"``);
* :func:`named_groups`, :func:`distinct_groups`, :func:`flattened_axes`, :func:`axis_mesh`: a run's own groups,
  by the mesh axis each serves (``"default"``, ``"tp"``, ``"dp_cp"``, ``"moe.ep"``);
* :func:`group_backends`, :func:`backend_timeouts`, :func:`backend_readings`: a group's backends and their
  timeouts, read from the backends themselves.

Reads only: nothing here changes a group.
"""

from __future__ import annotations

import datetime
import importlib
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed import distributed_c10d as c10d

__all__ = [
    "all_groups",
    "axis_mesh",
    "backend_readings",
    "backend_timeouts",
    "distinct_groups",
    "flattened_axes",
    "group_backends",
    "group_key",
    "named_groups",
]


def all_groups() -> list[ProcessGroup]:
    """Every process group torch holds in this process (this rank's), in the order they were made."""
    return list(c10d._world.pg_map)


def group_key(group: ProcessGroup) -> str:
    """A group's key among every group torch holds: ``"<group_desc>:<group_name>"`` (``"undefined:3"``)."""
    return f"{getattr(group, 'group_desc', 'undefined')}:{group.group_name}"


def _plain(name: Any) -> str:
    return str(getattr(name, "value", name))  # Automodel's MeshAxisName is a str Enum


def flattened_axes(device_mesh: Any) -> dict[str, Any]:
    """``{name: 1-D mesh}`` of the flattened axes recorded for the root mesh: its ``_flatten_mapping`` (torch 2.10
    and later), and torch 2.9's ``_mesh_resources.root_to_flatten_mapping``.

    Both are read: on torch 2.9 nemo-automodel 0.5.0 keeps a ``_flatten_mapping`` of its own on the root mesh
    with the axes it flattened, while torch records there only; an axis flattened later (NeMo RL's lazily
    flattened ``("cp", "tp")``) is in torch's registry alone.
    """
    root = device_mesh._get_root_mesh() if hasattr(device_mesh, "_get_root_mesh") else device_mesh
    recorded = dict(getattr(root, "_flatten_mapping", None) or {})
    # torch 2.9 keeps them in the mesh registry; gone in torch 2.10 (delete this with the torch 2.9 lane)
    resources = getattr(importlib.import_module("torch.distributed.device_mesh"), "_mesh_resources", None)
    registry = getattr(resources, "root_to_flatten_mapping", None)
    for name, mesh in ((registry or {}).get(root) or {}).items():
        recorded.setdefault(name, mesh)
    return recorded


def axis_mesh(device_mesh: Any, name: str) -> Any:
    """The 1-D mesh of axis ``name``: a mesh dimension, a flattened axis recorded on the root mesh, or (torch 2.9)
    the flattened axis that slicing by name reaches, as NeMo RL reaches it."""
    if name in device_mesh.mesh_dim_names:
        return device_mesh[name]
    flattened = flattened_axes(device_mesh)
    return flattened[name] if name in flattened else device_mesh[name]


def named_groups(device_mesh: Any, moe_mesh: Any = None) -> dict[str, ProcessGroup]:
    """The default group, each mesh axis, each flattened axis, and each MoE mesh axis.

    Names: ``"default"``, the axis name (``"dp_shard"``), the flattened name
    (``"dp_cp"``), and ``"moe.<axis>"``. Flattened meshes are read from the root
    mesh's ``_flatten_mapping``, where Automodel and torch both record them.
    """
    groups: dict[str, ProcessGroup] = {"default": dist.group.WORLD}
    if device_mesh is not None:
        for name in device_mesh.mesh_dim_names:
            groups[_plain(name)] = device_mesh.get_group(name)
        for name, flat in sorted(flattened_axes(device_mesh).items()):
            groups.setdefault(_plain(name), flat.get_group())
    if moe_mesh is not None:
        for name in moe_mesh.mesh_dim_names:
            groups[f"moe.{_plain(name)}"] = moe_mesh.get_group(name)
    return groups


def distinct_groups(device_mesh: Any, moe_mesh: Any = None) -> dict[str, ProcessGroup]:
    """:func:`named_groups`, each group once, by its first name.

    A group reused under several names (the default group standing in for a
    world-sized axis) appears once, as ``"default"``.
    """
    unique: dict[str, ProcessGroup] = {}
    seen: set[int] = set()
    for name, group in named_groups(device_mesh, moe_mesh).items():
        if id(group) not in seen:
            seen.add(id(group))
            unique[name] = group
    return unique


def group_backends(group: ProcessGroup) -> dict[str, str]:
    """``{device type: backend name}`` for every backend registered on ``group``."""
    backends = {}
    for device in ("cpu", "cuda"):
        try:
            backend = group._get_backend(torch.device(device))
        except RuntimeError:  # "No backend type associated with device type ..."
            continue
        backends[device] = backend.name()
    return backends


def backend_timeouts(group: ProcessGroup) -> dict[str, datetime.timedelta]:
    """``{device type: timeout}`` read from each backend of ``group`` itself."""
    return {device: group._get_backend(torch.device(device)).options._timeout for device in group_backends(group)}


def backend_readings(group: ProcessGroup) -> dict[str, tuple[str, datetime.timedelta | None]]:
    """``{device type: (backend name, timeout)}`` for every backend of ``group``; the timeout is None where the
    backend keeps none that can be read (torch's ``fake`` backend has no options).

    :func:`backend_timeouts` for any group torch may hold, where a missing timeout is an answer, not an error.
    """
    readings: dict[str, tuple[str, datetime.timedelta | None]] = {}
    for device, name in group_backends(group).items():
        options = getattr(group._get_backend(torch.device(device)), "options", None)
        timeout = getattr(options, "_timeout", None)
        readings[device] = (name, timeout if isinstance(timeout, datetime.timedelta) else None)
    return readings
