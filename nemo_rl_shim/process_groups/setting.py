"""Setting a process group's timeout, and reading it back: the one setter every timeout change goes through.

* :func:`set_group_timeout` is torch's setter (``torch.distributed.set_timeout`` from torch 2.15,
  ``_set_pg_timeout`` before: :data:`TIMEOUT_API`); it reaches every backend of a group.
  :func:`set_backend_timeouts` gives each backend its own value where the halves differ.
* :data:`RESOLUTION` and :func:`same_timeout`: c10d keeps whole milliseconds, so two values closer than one
  are one value.
* :func:`set_mesh_timeouts` gives every group of a built mesh the timeout, and proves it by reading each one back.

For Automodel pins whose mesh builder takes no timeout (NeMo RL's pin 24b47e856, releases
0.3.0 and 0.4.0: ``create_device_mesh`` has no ``timeout_minutes`` and ``MeshContext`` no
``build``), every sub-group comes out of the build with torch's default (10 min NCCL, 30 min
Gloo): sub-groups do not inherit the default group's timeout. :func:`set_mesh_timeouts`,
called right after the build on every rank, puts the timeout on each of them::

    device_mesh, moe_mesh = mesh_utils.create_device_mesh(...)
    set_mesh_timeouts(device_mesh, moe_mesh, minutes)

"Every group" is each mesh axis, each flattened axis (``dp``, ``dp_cp``, ``dp_shard_cp``), each
MoE mesh axis, and the default group where an axis is world-sized and reuses it; on each group
every backend, the CPU (Gloo) and CUDA (NCCL) halves of a composite one alike. No barrier: every
rank runs the same set-up, so no rank lowers a timeout under a peer's wait.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.config.settings import minutes_timedelta
from nemo_rl_shim.process_groups.registry import backend_timeouts, distinct_groups, group_backends, named_groups

__all__ = [
    "RESOLUTION",
    "TIMEOUT_API",
    "mesh_groups",
    "same_timeout",
    "set_backend_timeouts",
    "set_group_timeout",
    "set_mesh_timeouts",
]

# Gate: torch 2.15 added the public torch.distributed.set_timeout (reaches every backend of a
# group). Delete the fallback once the torch floor in pyproject.toml is 2.15 or newer.
if hasattr(dist, "set_timeout"):
    TIMEOUT_API = "torch.distributed.set_timeout"
    set_group_timeout = dist.set_timeout
else:  # torch < 2.15: what NeMo RL's torch 2.11 uses (the py3.13-torch-2.11, torch-2.10 and torch-2.9 CI lanes run it)
    TIMEOUT_API = "torch.distributed.distributed_c10d._set_pg_timeout"
    set_group_timeout = dist.distributed_c10d._set_pg_timeout

#: c10d keeps a timeout in whole milliseconds: two timeouts closer than this are the same value.
RESOLUTION = datetime.timedelta(milliseconds=1)


def same_timeout(a: datetime.timedelta, b: datetime.timedelta) -> bool:
    """Whether ``a`` and ``b`` are one value to c10d (closer than :data:`RESOLUTION`)."""
    return abs(a - b) < RESOLUTION


def set_backend_timeouts(group: ProcessGroup, timeouts: Mapping[str, datetime.timedelta]) -> None:
    """Give each backend of ``group`` its value from ``{device type: timeout}`` (one value: torch's setter)."""
    values = set(timeouts.values())
    if len(values) == 1:
        set_group_timeout(values.pop(), group)
        return
    for device, timeout in timeouts.items():  # halves that differ: each its own
        backend = group._get_backend(torch.device(device))
        setter = getattr(backend, "set_timeout", None) or backend._set_default_timeout
        setter(timeout)


def mesh_groups(device_mesh: Any, moe_mesh: Any = None) -> dict[str, ProcessGroup]:
    """Each distinct group of the two meshes, by its first name; ``"default"`` only where an axis reuses it."""
    on_a_mesh = {id(group) for name, group in named_groups(device_mesh, moe_mesh).items() if name != "default"}
    return {name: group for name, group in distinct_groups(device_mesh, moe_mesh).items() if id(group) in on_a_mesh}


def _minutes(timeout: datetime.timedelta) -> float:
    return timeout.total_seconds() / 60


def _read_back(name: str, group: ProcessGroup, wanted: datetime.timedelta) -> dict[str, float]:
    read = backend_timeouts(group)
    if not read:
        raise RuntimeError(f"group {name!r} has no backend to read a timeout from")
    for device, timeout in read.items():
        if abs(timeout - wanted) >= RESOLUTION:
            backend = group_backends(group)[device]
            raise RuntimeError(
                f"group {name!r}: its {device} backend ({backend}) reads {_minutes(timeout):g} min after "
                f"setting {_minutes(wanted):g} min; the timeout did not reach it"
            )
    return {device: _minutes(timeout) for device, timeout in read.items()}


def set_mesh_timeouts(device_mesh: Any, moe_mesh: Any, minutes: float) -> dict[str, dict[str, float]]:
    """Set ``minutes`` on every backend of every group of ``device_mesh`` and ``moe_mesh``; return the read-back.

    ``moe_mesh`` may be None. Returns ``{group name: {device type: minutes}}`` as read from each
    backend itself after setting (``{"tp": {"cpu": 0.2, "cuda": 0.2}}``). Raises ValueError for a
    ``minutes`` that is not a positive number, and RuntimeError naming the group, the backend and
    the value read when a backend does not take the timeout (one without a setter, such as MPI or
    UCC: torch warns and leaves it).
    """
    wanted = minutes_timedelta(minutes, "set_mesh_timeouts minutes")
    groups = mesh_groups(device_mesh, moe_mesh)
    for group in groups.values():
        set_group_timeout(wanted, group)
    return {name: _read_back(name, group, wanted) for name, group in groups.items()}
