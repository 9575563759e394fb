"""The corrected backend override, and the companion that lets world-sized axes reuse the default group.

Upstream ``_nccl_backend_override`` (nemo-automodel 0.5.0 to 0.7.0) returns
``("nccl", options)`` for every mesh axis when a timeout is requested. With a
``"cuda:nccl,cpu:gloo"`` default group (FSDP2 CPU offload) that drops the Gloo
half from every sub-group. :func:`keep_all_backends_override` keeps the default
group's whole backend string and puts the requested timeout on each half.

torch's ``DeviceMesh`` (2.10 and later) turns an override ``(backend, options)`` into
``new_group(backend=backend, pg_options=options, timeout=options._timeout)``; torch 2.9
passes no ``timeout``, which ``setup_distributed`` makes up for after the build.
``new_group`` then builds one backend per device of the backend string and
hands each the same ``timeout``; NCCL additionally insists that ``pg_options``
is a ``ProcessGroupNCCL.Options`` and Gloo ignores it. So a composite string
plus NCCL options gives both halves the timeout, and a Gloo-only string takes
plain ``Backend.Options``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

from automodel_patch._fallback import DefaultGroupUnreadable, or_genuine

__all__ = [
    "backend_options",
    "default_backend",
    "default_group_timeouts",
    "keep_all_backends_override",
    "layered_override",
    "make_init_device_mesh",
    "reuses_default_group",
    "without_reusable",
]

BackendOverride = dict[str, tuple[str, Any]]


def _device_map(backend: object, source: str) -> dict[str, str]:
    if not isinstance(backend, str):
        raise DefaultGroupUnreadable(f"{source} answered {backend!r} ({type(backend).__name__}), not a backend string")
    try:
        devices = BackendConfig(backend).get_device_backend_map()
    except Exception as e:
        raise DefaultGroupUnreadable(f"{source} answered {backend!r}, which is not a backend string: {e}") from e
    if not backend or not all(devices.values()):
        raise DefaultGroupUnreadable(f"{source} answered {backend!r}, which names no backend for some device")
    return devices


def _default_group() -> Any:
    world = dist.group.WORLD
    if world is None:
        raise DefaultGroupUnreadable(
            "torch.distributed reports itself initialized (dist.is_initialized() is True) but has no default "
            "process group (dist.group.WORLD is None)"
        )
    return world


def default_backend(device_type: str) -> str:
    """The default group's backend string, e.g. ``"cuda:nccl,cpu:gloo"``.

    Before any group exists, the backend torch would pick for ``device_type``. Raises
    :class:`DefaultGroupUnreadable` when c10d says it is initialized but cannot name a
    usable backend string (no default group, or an answer that is not a backend string).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return "nccl" if device_type == "cuda" else "gloo"
    backend = dist.get_backend(_default_group())
    _device_map(backend, "dist.get_backend(default group)")
    return str(backend)


def backend_options(backend: str, timeout: datetime.timedelta) -> Any:
    """Options carrying ``timeout`` that every half of ``backend`` accepts."""
    halves = set(BackendConfig(backend).get_device_backend_map().values())
    if "nccl" in halves:
        options = dist.ProcessGroupNCCL.Options()
    else:
        options = torch._C._distributed_c10d.Backend.Options(backend, timeout)
    options._timeout = timeout
    return options


def keep_all_backends_override(
    axes: tuple[str, ...],
    *,
    device_type: str,
    timeout_minutes: float | None,
) -> BackendOverride | None:
    """Per-axis overrides that keep every backend of the default group.

    Drop-in for Automodel's ``_nccl_backend_override`` (same signature).

    * No timeout: no override, as upstream; sub-groups inherit the default
      group's backend string and torch's default timeouts.
    * ``"cuda:nccl,cpu:gloo"``: that string on every axis, timeout on both halves.
    * ``"nccl"``: ``"nccl"`` on every axis, exactly as upstream.
    * ``"gloo"`` (a CPU mesh): ``"gloo"`` on every axis, so the timeout reaches
      the sub-groups too; upstream returns no override there.
    """
    if timeout_minutes is None:
        return None
    timeout = datetime.timedelta(minutes=timeout_minutes)
    backend = default_backend(device_type)
    return {axis: (backend, backend_options(backend, timeout)) for axis in axes}


def default_group_timeouts() -> dict[str, datetime.timedelta]:
    """Timeout of each device backend of the default group, keyed by device type.

    Raises :class:`DefaultGroupUnreadable` when a backend's timeout is not a ``timedelta``.
    """
    group = _default_group()
    devices = _device_map(dist.get_backend(group), "dist.get_backend(default group)")
    timeouts = {device: group._get_backend(torch.device(device)).options._timeout for device in devices}
    for device, timeout in timeouts.items():
        if not isinstance(timeout, datetime.timedelta):
            raise DefaultGroupUnreadable(f"the default group's {device} backend reports timeout {timeout!r}")
    return timeouts


def reuses_default_group(size: int, config: tuple[str, Any] | None) -> bool:
    """Whether an axis of ``size`` ranks may reuse the default group instead of ``config``.

    True when the axis spans the world and the override asks for nothing the
    default group lacks: same backend string, same timeout on every half.
    Raises :class:`DefaultGroupUnreadable` when c10d cannot answer that.
    """
    if config is None or not dist.is_initialized():
        return False
    _default_group()
    world_size = dist.get_world_size()
    if not isinstance(world_size, int) or world_size < 1:
        raise DefaultGroupUnreadable(f"dist.get_world_size() answered {world_size!r}, not a positive int")
    if size != world_size:
        return False
    backend, options = config
    if backend not in (None, default_backend("cuda")):
        return False
    timeout = getattr(options, "_timeout", None)
    return timeout is None or all(t == timeout for t in default_group_timeouts().values())


def without_reusable(override: Mapping[str, Any] | None, sizes: Mapping[str, int]) -> BackendOverride | None:
    if not override:
        return None
    kept = {axis: cfg for axis, cfg in override.items() if not reuses_default_group(sizes[axis], cfg)}
    return kept or None


def make_init_device_mesh(init_device_mesh: Callable[..., Any], slugs: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Wrap torch's ``init_device_mesh`` so world-sized axes reuse the default group.

    torch reuses the default group for a world-sized axis only when that axis
    has no override. Upstream (and the corrected override) give every axis one,
    so without this a world-sized ``dp_shard`` gets a second, identical
    communicator. The wrapper drops the override of such an axis when the
    default group already has the requested backend and timeout. When c10d
    cannot say (``slugs``: the workarounds this wrapper serves, named in the
    warning), every override is passed on unchanged, as without the wrapper.
    """

    def init_device_mesh_reusing_default_group(
        device_type: str,
        mesh_shape: Sequence[int],
        *,
        mesh_dim_names: Sequence[str] | None = None,
        backend_override: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if backend_override and mesh_dim_names:
            given = backend_override
            backend_override = or_genuine(
                slugs,
                "init_device_mesh",
                lambda: _without_reusable_named(given, mesh_dim_names, mesh_shape),
                lambda: given,
            )
        return init_device_mesh(
            device_type,
            mesh_shape,
            mesh_dim_names=mesh_dim_names,
            backend_override=backend_override,
            **kwargs,
        )

    init_device_mesh_reusing_default_group.__wrapped__ = init_device_mesh  # type: ignore[attr-defined]
    return init_device_mesh_reusing_default_group


def _without_reusable_named(
    override: Mapping[str, Any], names: Sequence[str], shape: Sequence[int]
) -> BackendOverride | None:
    sizes = dict(zip(names, shape, strict=True))
    # Keys that name no axis are kept: torch rejects them itself, exactly as without the wrapper.
    extra = {key: cfg for key, cfg in override.items() if key not in sizes}
    kept = without_reusable({axis: cfg for axis, cfg in override.items() if axis in sizes}, sizes) or {}
    return {**kept, **extra} or None


def layered_override(
    slug: str, where: str, below: Callable[..., Any], applies: Callable[[str], bool]
) -> Callable[..., Any]:
    """``below`` (the override under this layer) with :func:`keep_all_backends_override` put in where ``applies``.

    ``applies(device_type)`` says which meshes the workaround ``slug`` corrects, when a timeout is
    set; everything else goes to ``below``, and so does any mesh whose default group cannot be
    read (:func:`~automodel_patch._fallback.or_genuine` warns once and gives Automodel's answer).
    """

    def override(axes, *, device_type, timeout_minutes):
        def genuine() -> Any:
            return below(axes, device_type=device_type, timeout_minutes=timeout_minutes)

        if timeout_minutes is not None and applies(device_type):
            return or_genuine(
                slug,
                where,
                lambda: keep_all_backends_override(axes, device_type=device_type, timeout_minutes=timeout_minutes),
                genuine,
            )
        return genuine()

    override.__doc__ = keep_all_backends_override.__doc__
    return override
