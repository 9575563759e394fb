"""Locate the installed Automodel modules that the workarounds touch.

Nothing here imports nemo-automodel at module import time: the modules are
loaded on first use, so ``import automodel_patch`` stays cheap and works when
the ``automodel`` extra is not installed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from packaging.version import InvalidVersion, Version

__all__ = [
    "CONFIG_MODULE",
    "DISTRIBUTED_PACKAGE",
    "MESH_MODULE",
    "MESH_UTILS_MODULE",
    "MOE_CONFIG_MODULES",
    "OVERRIDE_NAME",
    "build_accepts_timeout",
    "installed_version",
    "load_mesh",
    "load_mesh_utils",
    "takes_timeout",
]

#: Automodel's distributed package and the modules of it the shim reads, in one place.
DISTRIBUTED_PACKAGE = "nemo_automodel.components.distributed"
MESH_UTILS_MODULE = f"{DISTRIBUTED_PACKAGE}.mesh_utils"
MESH_MODULE = f"{DISTRIBUTED_PACKAGE}.mesh"
CONFIG_MODULE = f"{DISTRIBUTED_PACKAGE}.config"
#: Where ``MoEParallelizerConfig`` lives: ``distributed.config`` from 0.7.0, ``moe.config`` before.
MOE_CONFIG_MODULES = (CONFIG_MODULE, "nemo_automodel.components.moe.config")
OVERRIDE_NAME = "_nccl_backend_override"
_GIT_SHA = re.compile(r"[0-9a-f]{7,40}")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # missing, or a release that does not import on this torch: nothing to probe
        return None


def load_mesh_utils() -> ModuleType | None:
    """Return Automodel's ``mesh_utils`` module, or None when it cannot be imported."""
    return _load(MESH_UTILS_MODULE)


def load_mesh() -> ModuleType | None:
    """Return Automodel's ``mesh`` module, or None when it cannot be imported."""
    return _load(MESH_MODULE)


def build_accepts_timeout() -> bool:
    """Whether the installed ``MeshContext.build`` takes ``timeout_minutes``.

    Signature probe, not a version check: 0.3.0 and 0.4.0 have no ``build``;
    0.5.0 and later take the keyword.
    """
    build = getattr(getattr(load_mesh(), "MeshContext", None), "build", None)
    if build is None:
        return False
    return takes_timeout(getattr(build, "__func__", build))


def takes_timeout(function: Callable[..., Any] | None) -> bool:
    """Whether ``function`` takes a ``timeout_minutes`` keyword: the one signature probe of every gate.

    ``None``, or a callable whose signature cannot be read, takes none; the probe never raises.
    """
    if function is None:
        return False
    try:
        return _signature_takes_timeout(function)
    except (TypeError, ValueError):
        return False


@functools.cache
def _signature_takes_timeout(function: Callable[..., Any]) -> bool:
    # Keyed on the function object: inspect.signature costs ~0.1 ms and sits on every set-up.
    return "timeout_minutes" in inspect.signature(function).parameters


def installed_version() -> Version | None:
    """The installed nemo-automodel version, for reports only: never a decision input."""
    package = _load("nemo_automodel")
    text = getattr(package, "__version__", None)
    if text is None:
        try:
            from importlib.metadata import PackageNotFoundError, version

            text = version("nemo-automodel")
        except PackageNotFoundError:
            return None
    return _public_version(str(text))


@functools.cache
def _public_version(text: str) -> Version | None:
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    # package_info appends "+<short sha>" of whatever git checkout encloses the installed files
    # (here: this project's own repository, since .venv lives in it): drop that, keep real local labels.
    if version.local is not None and _GIT_SHA.fullmatch(version.local):
        return Version(version.public)
    return version
