"""Can this torch and this nemo-automodel run together, and was the pair tested?

:func:`check` decides by behaviour, never by comparing versions: Automodel's mesh
modules must import, and a release whose ``MeshContext.build`` takes ``timeout_minutes``
needs torch's ``init_device_mesh(backend_override=)`` (torch 2.9 and later). A failed
check is one line that names both versions; ``setup_distributed`` raises it as
:class:`UnsupportedVersions` before any process group exists, and ``status`` prints it.

:data:`TESTED_PAIRS` records the CI lanes (``.ci/run``); it informs reports, it decides nothing.
"""

from __future__ import annotations

import importlib
import inspect
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from packaging.version import Version

from automodel_patch._target import MESH_MODULE, MESH_UTILS_MODULE
from nemo_rl_shim.one_line.exception import first_line

__all__ = [
    "TESTED_PAIRS",
    "AutomodelImport",
    "Support",
    "UnsupportedVersions",
    "check",
    "import_automodel",
    "require_supported",
]

#: (torch major.minor, nemo-automodel release) pairs that a CI lane runs the multi-process tests on.
TESTED_PAIRS: tuple[tuple[str, str], ...] = (
    ("2.15", "0.7.0"),
    ("2.11", "0.7.0"),
    ("2.10", "0.7.0"),
    ("2.9", "0.5.0"),
)
_MESH_MODULES = (MESH_UTILS_MODULE, MESH_MODULE)


class UnsupportedVersions(RuntimeError):
    """This torch and nemo-automodel cannot run the Automodel path together; the message says why."""


@dataclass(frozen=True)
class AutomodelImport:
    """Whether nemo-automodel is installed, and whether its mesh modules import."""

    installed: bool
    version: str | None
    error: str | None = None

    @property
    def importable(self) -> bool:
        return self.installed and self.error is None


def _distribution_version() -> str | None:
    try:
        return metadata.version("nemo-automodel")
    except metadata.PackageNotFoundError:
        return None


def _version() -> str | None:
    import automodel_patch  # the package's own __version__ (its top level imports where its mesh code may not)

    version = automodel_patch.installed_version()
    return str(version) if version is not None else _distribution_version()


def import_automodel() -> AutomodelImport:
    """Import Automodel's mesh modules; report "not installed" only when the package itself is missing."""
    for name in _MESH_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == "nemo_automodel":
                return AutomodelImport(False, None)
            return AutomodelImport(True, _version(), first_line(e))
        except Exception as e:  # an installed release that does not import on this torch
            return AutomodelImport(True, _version(), first_line(e))
    return AutomodelImport(True, _version())


def _torch_version() -> str:
    return str(Version(str(torch.__version__)).public)


def _minor(version: str) -> str:
    return ".".join(str(part) for part in Version(version).release[:2])


def _public(version: str | None) -> str | None:
    return None if version is None else Version(version).base_version


@dataclass(frozen=True)
class Support:
    """The verdict on the installed pair, as data (``status --json``) and as one line."""

    torch: str
    python: str
    automodel: AutomodelImport
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def tested(self) -> bool:
        """Whether (torch major.minor, Automodel release) is a CI lane's pair."""
        release = _public(self.automodel.version)
        return release is not None and (_minor(self.torch), release) in TESTED_PAIRS

    def to_dict(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "python": self.python,
            "nemo_automodel": self.automodel.version,
            "nemo_automodel_installed": self.automodel.installed,
            "nemo_automodel_import_error": self.automodel.error,
            "supported": self.ok,
            "problem": self.problem,
            "tested_pair": self.tested,
        }


def _needs_backend_override() -> str | None:
    from torch.distributed.device_mesh import init_device_mesh

    import automodel_patch

    if not automodel_patch.build_accepts_timeout():
        return None  # 0.3.0 / 0.4.0 pass no per-axis options at all
    if "backend_override" in inspect.signature(init_device_mesh).parameters:
        return None
    return "its MeshContext.build passes init_device_mesh(backend_override=), which this torch lacks (added in 2.9)"


def check() -> Support:
    """The installed pair's verdict; imports Automodel's mesh modules (not at ``import nemo_rl_shim``)."""
    automodel = import_automodel()
    torch_version, python = _torch_version(), platform.python_version()
    problem = None
    if automodel.installed and automodel.error is not None:
        problem = f"its distributed package fails to import ({automodel.error})"
    elif automodel.installed:
        problem = _needs_backend_override()
    if problem is not None:
        problem = f"nemo-automodel {automodel.version} does not work with torch {torch_version}: {problem}"
    return Support(torch_version, python, automodel, problem)


def require_supported() -> Support:
    """:func:`check`, raising :class:`UnsupportedVersions` with its one line when the pair cannot run."""
    support = check()
    if support.problem is not None:
        raise UnsupportedVersions(support.problem)
    if not support.automodel.installed:
        raise UnsupportedVersions(
            f"nemo-automodel is not installed (torch {support.torch}): setup_distributed needs it "
            "(uv sync --extra automodel)"
        )
    return support
