"""Behavioural detection: does an override function keep the CPU half?

The probe calls the function the way Automodel's mesh code does, while the
default group *reports* the composite backend ``"cuda:nccl,cpu:gloo"``. That
report is the one boundary simulated: no process group and no GPU exist
here, so ``torch.distributed.is_initialized`` and ``get_backend`` answer as a
CPU-offload run's default group would, for the duration of one call.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

from automodel_patch import _target

__all__ = [
    "COMPOSITE_BACKEND",
    "has_supported_signature",
    "is_supported",
    "keeps_cpu_backend",
    "override_keeps_cpu_backend",
    "override_reaches_cpu_mesh",
    "reaches_cpu_mesh",
]

COMPOSITE_BACKEND = "cuda:nccl,cpu:gloo"
_PROBE_AXES = ("dp_shard", "tp")
_EXPECTED_PARAMETERS = ("axes", "device_type", "timeout_minutes")
_ONE_MINUTE = datetime.timedelta(minutes=1)
_probe_lock = threading.Lock()


def has_supported_signature(function: Callable[..., Any] | None) -> bool:
    """Whether ``function`` takes ``(axes, *, device_type, timeout_minutes)``."""
    if function is None:
        return False
    return tuple(inspect.signature(function).parameters) == _EXPECTED_PARAMETERS


@contextmanager
def _composite_default_group() -> Iterator[None]:
    with (
        _probe_lock,
        mock.patch.object(dist, "is_initialized", return_value=True),
        mock.patch.object(dist, "get_backend", return_value=COMPOSITE_BACKEND),
    ):
        yield


def _keeps_cpu(config: Any) -> bool:
    backend = config[0] if isinstance(config, tuple) else config
    if not isinstance(backend, str):  # options only, or (None, options): default backend kept
        return True
    return "cpu" in BackendConfig(backend).get_device_backend_map()


@contextmanager
def _gloo_default_group() -> Iterator[None]:
    with (
        _probe_lock,
        mock.patch.object(dist, "is_initialized", return_value=True),
        mock.patch.object(dist, "get_backend", return_value="gloo"),
    ):
        yield


def override_reaches_cpu_mesh(function: Callable[..., Any]) -> bool:
    """Call ``function`` for a CPU mesh under a reported ``"gloo"`` default group.

    True when it overrides every axis with options carrying the requested
    timeout, so the sub-groups of a CPU-only run get it. Upstream returns None
    for any non-CUDA mesh, leaving them at gloo's 30-minute default.
    """
    with _gloo_default_group():
        override = function(_PROBE_AXES, device_type="cpu", timeout_minutes=1)
    if not override or set(override) != set(_PROBE_AXES):
        return False
    return all(getattr(options, "_timeout", None) == _ONE_MINUTE for _, options in override.values())


def override_keeps_cpu_backend(function: Callable[..., Any]) -> bool:
    """Call ``function`` under a reported composite default group and inspect its answer.

    True when every axis it overrides still has a CPU backend (or it overrides nothing).
    """
    with _composite_default_group():
        override = function(_PROBE_AXES, device_type="cuda", timeout_minutes=1)
    return all(_keeps_cpu(config) for config in (override or {}).values())


@functools.cache
def _cached_probe(function: Callable[..., Any]) -> bool:
    # Keyed on the function object: a patch or revert swaps it and so re-probes.
    return override_keeps_cpu_backend(function)


@functools.cache
def _cached_cpu_mesh_probe(function: Callable[..., Any]) -> bool:
    return override_reaches_cpu_mesh(function)


def reaches_cpu_mesh() -> bool:
    """Whether the *installed* override gives the sub-groups of a CPU (gloo) mesh the timeout.

    Matters only where the default group is plain ``"gloo"`` (no GPU): there
    upstream forwards the timeout to the default group alone. Cached like
    :func:`keeps_cpu_backend`; False when the function is absent.
    """
    if not is_supported():
        return False
    return _cached_cpu_mesh_probe(getattr(_target.load_mesh_utils(), _target.OVERRIDE_NAME))


def is_supported() -> bool:
    """Whether the installed Automodel has the override this package can probe and replace."""
    return has_supported_signature(getattr(_target.load_mesh_utils(), _target.OVERRIDE_NAME, None))


def keeps_cpu_backend() -> bool:
    """Whether the *installed* Automodel keeps the CPU half under a timeout.

    Calls the installed ``_nccl_backend_override`` (patched or not) where the
    default group reports ``"cuda:nccl,cpu:gloo"``. Needs no process group and
    no GPU. Cached per function object, so repeated calls cost a dict lookup.
    Returns False when Automodel is missing or the function is absent or has
    another signature (0.3.0, 0.4.0): then nothing keeps the CPU half for it.
    """
    if not is_supported():
        return False
    return _cached_probe(getattr(_target.load_mesh_utils(), _target.OVERRIDE_NAME))
