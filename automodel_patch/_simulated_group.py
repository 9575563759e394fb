"""A default process group that exists for the length of one call: the world detection probes in.

Detection calls the installed Automodel functions the way its mesh code does, under
the default group a run would have (``"cuda:nccl,cpu:gloo"`` with CPU offload, or plain
``"gloo"`` on a CPU-only machine). A fixed override may learn that group in many ways:
``dist.is_initialized()``, ``get_backend()``, ``get_backend_config()``, ``dist.group.WORLD``,
``distributed_c10d._get_default_group()``, the group's registered device backends,
``get_world_size()`` or ``get_rank()``. Every one of them reads c10d's world state
(``distributed_c10d._world``, torch's documented extension point), so that is the level
simulated here: a real ``ProcessGroup`` (rank 0 of 1, on an in-memory ``HashStore``) is
made the default group, with the reported backend string in the world's maps and a real
Gloo backend registered for every device of that string, one backend object per backend
name as ``init_process_group`` does (so the halves of ``"cuda:nccl,cpu:gloo"`` are two
objects, as on a GPU machine, and ``"gloo"`` has one object for both devices).

The one boundary this machine cannot have is NCCL (it will not start without a GPU), so
the CUDA half is a Gloo backend registered under the NCCL backend type: the string every
query returns says ``nccl``, the object behind it is Gloo. The probes run no collective.

Everything is put back in ``finally``, under a lock: the world's maps lose the probe
group's entries, and a default group that existed before (a probe after
``init_process_group``) is restored as it was.
"""

from __future__ import annotations

import datetime
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

__all__ = ["SimulationUnavailable", "simulated_default_group"]

_NAME = "automodel_patch.probe"
_TIMEOUT = datetime.timedelta(minutes=1)
_lock = threading.RLock()


class SimulationUnavailable(RuntimeError):
    """This torch cannot build the probe's default group; the message says why."""


def _backend_type(name: str) -> Any:
    from torch.distributed import ProcessGroup

    return getattr(ProcessGroup.BackendType, name.upper(), ProcessGroup.BackendType.CUSTOM)


def _gloo(store: Any) -> Any:
    """A one-rank Gloo backend on the loopback interface.

    ``ProcessGroupGloo``'s default device resolves the host name (about 10 ms); a rank of
    one needs no network, so it gets the loopback device (about 0.1 ms).
    """
    options_type = getattr(dist.ProcessGroupGloo, "_Options", None)
    if options_type is None:  # a torch without the private options type: the default device
        return dist.ProcessGroupGloo(store, 0, 1, _TIMEOUT)
    options = options_type()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = _TIMEOUT
    return dist.ProcessGroupGloo(store, 0, 1, options)


@functools.cache
def _make_group(backend: str) -> tuple[Any, Any]:
    """A real one-rank ProcessGroup whose devices follow ``backend``; a Gloo object per backend name.

    Made once per backend string and kept: tearing a Gloo backend down joins its threads
    (about 10 ms), so each probe would pay that again. Between probes it is in no map of
    the world, and nothing but the probe ever sees it.
    """
    from torch.distributed import ProcessGroup

    store = dist.HashStore()
    group = ProcessGroup(store, 0, 1)
    devices = BackendConfig(backend).get_device_backend_map()
    objects: dict[str, Any] = {}
    for device, name in devices.items():
        if name not in objects:
            objects[name] = _gloo(dist.PrefixStore(name, store))
        group._register_backend(torch.device(device), _backend_type(name), objects[name])
    group._set_default_backend(_backend_type(next(iter(devices.values()))))
    return group, store


@contextmanager
def simulated_default_group(backend: str) -> Iterator[Any]:
    """Make a one-rank group reporting ``backend`` the default group until the block ends.

    Raises :class:`SimulationUnavailable` (before changing anything) when this torch
    lacks what the simulation needs; the caller turns that into an "unknown" verdict.
    """
    with _lock:
        try:
            world = dist.distributed_c10d._world
            group, store = _make_group(backend)
            for device in group._device_types:  # every probe starts from the same state, whoever came before
                group._get_backend(device)._set_default_timeout(_TIMEOUT)
            maps = (world.pg_map, world.pg_backend_config, world.pg_names, world.pg_group_ranks)
            saved_default = world.default_pg
        except Exception as e:  # any torch that lacks a piece: say so, change nothing
            raise SimulationUnavailable(
                f"cannot simulate a {backend!r} default group on torch {torch.__version__}: {type(e).__name__}: {e}"
            ) from e
        try:
            world.pg_map[group] = (backend, store)
            world.pg_backend_config[group] = backend
            world.pg_names[group] = _NAME
            world.pg_group_ranks[group] = {0: 0}
            world.default_pg = group
            yield group
        finally:
            world.default_pg = saved_default
            for mapping in maps:
                mapping.pop(group, None)
