"""torch's fake backend, dressed as the real run's groups: one process plays one rank of a large world.

:func:`fake_backend` is entered once per dry run; :meth:`FakeBackend.rank` once per checked rank.
Inside, the real set-up path (``setup_distributed``: validation, layout checks, the decision,
the workaround layers, Automodel's ``MeshContext.build``) runs unchanged. What stands in for
the boundary this machine lacks (GPUs, NCCL, a rendezvous) is, narrowly:

* **The rendezvous.** ``torch.distributed.init_process_group`` gets an in-memory
  ``FakeStore`` and this rank's ``rank`` / ``world_size``: no network, no peers.
* **The backends.** Every group, the default one and each ``new_group``, goes through
  torch's own ``_new_process_group_helper`` as always (the world's maps, names, ranks and tags
  are torch's), but built on torch's ``fake`` backend, which runs no communication. The
  backend string the real run asks for (``"cuda:nccl,cpu:gloo"``, ``"nccl"``) is recorded,
  with the timeout torch's helper would give each of its halves (its ``timeout`` argument:
  torch copies it into NCCL's options and gives it to Gloo, in every version from 2.9 to 2.15),
  and put back in the world's maps, so ``dist.get_backend(group)`` answers as in the real run.
* **The group object.** The helper builds groups through ``distributed_c10d.ProcessGroup``;
  here that name is :class:`_RecordedGroup`, a ``ProcessGroup`` subclass whose
  ``_get_backend(device)`` returns a :class:`_Half` (``name()`` ``"nccl"`` / ``"gloo"``,
  ``options._timeout``, the timeout setters, and the class of the backend it stands for, so
  torch's own ``isinstance`` checks in ``_set_pg_timeout`` accept it). The shim's readers
  (:func:`nemo_rl_shim.process_groups.registry.group_backends`, ``backend_timeouts``) and its timeout setters
  then see what the real run would have.
* **CUDA.** ``torch.cuda.is_available`` answers True (the real run has GPUs), so the
  decision, Automodel's ``_mesh_device_type`` and ``DeviceMesh`` take the CUDA path;
  ``is_initialized`` answers True and ``set_device`` does nothing, so ``DeviceMesh`` does not
  try to pick a device.

Everything is put back when the block ends: the patched names, the environment, the
default group (destroyed after each rank), and torch's backend registry (the ``fake``
backend is registered for the block only; ``Backend._plugins``, ``backend_list``,
``backend_capability``, ``backend_type_map``, ``default_device_backend_map`` are restored
to exactly what they were).
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.distributed_c10d import BackendConfig

import automodel_patch
from automodel_patch._target import MESH_MODULE, MESH_UTILS_MODULE
from nemo_rl_shim.cli.preflight.results import CreatedGroup
from nemo_rl_shim.cli.preflight.runner import rank_env

__all__ = ["GPUS_PER_NODE", "FakeBackend", "GroupRecord", "fake_backend"]

FAKE = "fake"
#: What ``torch.cuda.device_count`` answers: one node's GPUs, as ``DeviceMesh`` would see them.
GPUS_PER_NODE = 8
_REAL_CLASSES = {"nccl": "ProcessGroupNCCL", "gloo": "ProcessGroupGloo"}


_MILLISECOND = datetime.timedelta(milliseconds=1)


def _whole_milliseconds(timeout: datetime.timedelta) -> datetime.timedelta:
    """``timeout`` as c10d keeps it: whole milliseconds (a ``std::chrono::milliseconds``), the rest dropped."""
    return (timeout // _MILLISECOND) * _MILLISECOND


class _Options:
    """A backend's options as the shim reads them: ``_timeout``, in whole milliseconds as c10d keeps it."""

    def __init__(self, timeout: datetime.timedelta) -> None:
        self._timeout = _whole_milliseconds(timeout)


class _Half:
    """One backend of a recorded group (``"nccl"`` or ``"gloo"``): its name and its timeout.

    Reports the class of the backend it stands for (``__class__``), as ``unittest.mock``'s
    ``spec`` does, so torch's ``_set_pg_timeout`` (2.9 to 2.14) sets its timeout as it would the
    real one's; anything else is answered by the fake backend under it.
    """

    def __init__(self, name: str, timeout: datetime.timedelta, fake: Any) -> None:
        self._name = name
        self.options = _Options(timeout)
        self._fake = fake

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        real = getattr(dist, _REAL_CLASSES.get(self._name, ""), None)
        return real if isinstance(real, type) else _Half

    def name(self) -> str:
        return self._name

    def _set_default_timeout(self, timeout: datetime.timedelta) -> None:
        self.options._timeout = _whole_milliseconds(timeout)

    set_timeout = _set_default_timeout

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._fake, attribute)


class _RecordedGroup(dist.ProcessGroup):
    """A ``ProcessGroup`` built on the fake backend that answers as the real run's group would.

    Made by torch's ``_new_process_group_helper`` (through ``distributed_c10d.ProcessGroup``);
    :func:`_record` gives it its halves right after.
    """

    def __init__(self, store: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)  # the (rank, size) constructor is the one a Python subclass may use
        self.halves: dict[str, _Half] = {}

    def _get_backend(self, device: Any) -> Any:
        kind = torch.device(device).type
        if kind not in self.halves:
            if not self.halves:  # not labelled (yet): the fake backend itself
                return super()._get_backend(torch.device(device))
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self.halves[kind]

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device(kind) for kind in self.halves] or super()._device_types

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        for half in set(self.halves.values()):
            half._set_default_timeout(timeout)


@dataclass
class GroupRecord:
    """A process group this rank created: what the real run would have built."""

    ranks: list[int]
    backend: str
    timeout: datetime.timedelta
    desc: str | None
    group: _RecordedGroup

    def read(self) -> CreatedGroup:
        """The group as it is now: each backend's name and timeout."""
        halves = self.group.halves
        return CreatedGroup(
            desc=self.desc,
            ranks=tuple(self.ranks),
            backend=self.backend,
            backends={device: half.name() for device, half in halves.items()},
            timeout_minutes={device: half.options._timeout.total_seconds() / 60 for device, half in halves.items()},
        )


@dataclass
class FakeBackend:
    """The dry run's world: its size, the rank being played, and the groups that rank created."""

    world_size: int
    rank_now: int = 0
    records: list[GroupRecord] = field(default_factory=list)
    new_group_calls: int = 0

    @contextmanager
    def rank(self, rank: int, local_rank: int) -> Iterator[list[GroupRecord]]:
        """Play ``rank`` as a fresh process would: its launcher environment; after it, no group it made
        is left, and a workaround layer its set-up applied is taken out again (each real rank decides
        for itself, so the next one must not find it in force)."""
        self.rank_now, self.records, self.new_group_calls = rank, [], 0
        env = rank_env(rank, self.world_size, local_rank)
        layers_before = set(automodel_patch.active())
        with _environ(env), _fresh_mesh_resources():
            try:
                yield self.records
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()
                applied = [slug for slug in automodel_patch.active() if slug not in layers_before]
                if applied:
                    automodel_patch.revert(*applied)


@contextmanager
def _fresh_mesh_resources() -> Iterator[None]:
    """``DeviceMesh``'s process-wide cache (``device_mesh._mesh_resources``), new for one rank, as a new
    process has it: on torch 2.9 a flattened mesh is cached by a key that does not hold the rank, so the
    next rank would get the previous rank's (destroyed) group."""
    from torch.distributed import device_mesh

    saved = getattr(device_mesh, "_mesh_resources", None)
    if saved is None:
        yield
        return
    device_mesh._mesh_resources = type(saved)()
    try:
        yield
    finally:
        device_mesh._mesh_resources = saved


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` set for the block; after it, the whole environment as it was (the set-up may set
    variables of its own before its first group, as the flight recorder's settings)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        for key in [key for key in os.environ if key not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def _registry_state() -> dict[str, Any]:
    backend = dist.Backend
    state = {
        name: getattr(backend, name).copy()
        for name in ("_plugins", "backend_list", "backend_capability", "backend_type_map", "default_device_backend_map")
        if hasattr(backend, name)
    }
    state["FAKE"] = backend.__dict__.get("FAKE", _MISSING)
    return state


_MISSING = object()


def _restore_registry(state: dict[str, Any]) -> None:
    backend = dist.Backend
    for name, saved in state.items():
        if name == "FAKE":
            continue
        current = getattr(backend, name)
        current.clear()
        current.update(saved) if isinstance(current, dict) else current.extend(saved)
    if state["FAKE"] is _MISSING:
        if "FAKE" in backend.__dict__:
            delattr(backend, "FAKE")
    else:
        backend.FAKE = state["FAKE"]


@contextmanager
def _fake_backend_registered() -> Iterator[Any]:
    """torch's ``fake`` backend, registered for the block only; the registry is restored exactly after."""
    state = _registry_state()
    try:
        from torch.testing._internal.distributed import fake_pg  # registers "fake" on first import

        if FAKE.upper() not in dist.Backend._plugins:  # imported earlier and unregistered since
            dist.Backend.register_backend(
                FAKE, fake_pg._create_fake_pg, extended_api=True, devices=["cpu", "cuda", "hpu", "xpu"]
            )
        yield fake_pg.FakeStore
    finally:
        _restore_registry(state)


@contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, saved)


def _record(world: FakeBackend, helper: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``_new_process_group_helper`` on the fake backend, recording what the real run asks for."""

    signature = inspect.signature(helper)

    def helper_on_fake_backend(group_size: int, group_rank: Any, global_ranks: list[int], *args: Any,
                               **kwargs: Any) -> Any:  # fmt: skip
        is_default = not global_ranks
        world.new_group_calls += not is_default
        if not is_default and world.rank_now not in global_ranks:  # not a member: torch returns NON_GROUP_MEMBER
            return helper(group_size, group_rank, global_ranks, *args, **kwargs)
        call = signature.bind(group_size, group_rank, global_ranks, *args, **kwargs)
        wanted, timeout = str(call.arguments["backend"]), call.arguments.get("timeout")
        desc = call.arguments.get("group_desc")
        call.arguments["backend"], call.arguments["backend_options"] = FAKE, None
        group, store = helper(*call.args, **call.kwargs)
        devices = BackendConfig(wanted).get_device_backend_map()
        by_name: dict[str, _Half] = {}
        for device, name in devices.items():
            if name not in by_name:  # one backend object per backend name, as torch's helper makes
                by_name[name] = _Half(name, timeout, super(_RecordedGroup, group)._get_backend(torch.device(device)))
            group.halves[device] = by_name[name]
        c10d._world.pg_map[group] = (wanted, store)
        c10d._world.pg_backend_config[group] = str(BackendConfig(wanted))
        ranks = list(global_ranks) or list(range(world.world_size))
        world.records.append(GroupRecord(ranks, wanted, timeout, desc, group))
        return group, store

    return helper_on_fake_backend


def _init_on_fake_store(world: FakeBackend, init: Callable[..., Any], store_type: type) -> Callable[..., Any]:
    def init_process_group_without_rendezvous(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("init_method", None)
        kwargs.update(store=store_type(), rank=world.rank_now, world_size=world.world_size)
        return init(backend, *args, **kwargs)

    return init_process_group_without_rendezvous


def _import_set_up_modules() -> None:
    """Import what the set-up imports, before the registry is saved: importing torch's FSDP and DTensor
    registers the ``fake`` backend (torch 2.15), and that side effect belongs to the process, not to the
    dry run, so it must be there before and after alike."""
    import torch.distributed.fsdp
    import torch.distributed.tensor  # noqa: F401

    for module in (MESH_MODULE, MESH_UTILS_MODULE):
        with suppress(Exception):  # not installed, or not on this torch: the set-up says so itself
            importlib.import_module(module)


@contextmanager
def fake_backend(world_size: int) -> Iterator[FakeBackend]:
    """Enter the dry run's world of ``world_size`` ranks; see the module docstring for what stands in.

    Refuses (RuntimeError) when a default group already exists: the dry run must not touch it.
    """
    if dist.is_initialized():
        raise RuntimeError("a dry run needs a process without a default group; torch.distributed is initialized")
    _import_set_up_modules()
    world = FakeBackend(world_size)
    with ExitStack() as stack:
        store_type = stack.enter_context(_fake_backend_registered())
        for name, value in (
            ("is_available", lambda: True),
            ("is_initialized", lambda: True),
            ("device_count", lambda: GPUS_PER_NODE),
            ("set_device", lambda device: None),
            ("current_device", lambda: 0),
        ):
            stack.enter_context(_patched(torch.cuda, name, value))
        stack.enter_context(_patched(c10d, "ProcessGroup", _RecordedGroup))
        stack.enter_context(_patched(c10d, "_new_process_group_helper", _record(world, c10d._new_process_group_helper)))
        stack.enter_context(
            _patched(dist, "init_process_group", _init_on_fake_store(world, dist.init_process_group, store_type))
        )
        try:
            yield world
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
