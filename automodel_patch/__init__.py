"""Workarounds for nemo-automodel's mesh timeouts, each applied only where detection says it is needed.

Public API:

* :data:`WORKAROUNDS` - every workaround, one unit each (slug, probe, layer, removal steps).
* :func:`detect` - behavioural verdict on the installed Automodel for one workaround.
* :func:`apply` / :func:`revert` / :func:`is_applied` / :func:`active` - the run-time layers.
* :data:`SOURCE_PATCH` - a unified diff for forks of 0.5.0 ... 0.7.0; AUTOMODEL-WORKAROUND(keep-cpu-backend)
"""

from __future__ import annotations

from pathlib import Path

from automodel_patch import _apply
from automodel_patch._apply import (
    MARKER,
    ApplyReport,
    ApplyStatus,
    active,
    apply,
    detect,
    get_original,
    is_applied,
    patched_names,
    revert,
)
from automodel_patch._fallback import WorkaroundFallbackWarning
from automodel_patch._override import keep_all_backends_override
from automodel_patch._target import build_accepts_timeout, installed_version
from automodel_patch._verdict import Detection, Verdict
from automodel_patch._workaround import Workaround
from automodel_patch.cpu_mesh_timeout import WORKAROUND as CPU_MESH_TIMEOUT  # AUTOMODEL-WORKAROUND(cpu-mesh-timeout)
from automodel_patch.keep_cpu_backend import WORKAROUND as KEEP_CPU_BACKEND  # AUTOMODEL-WORKAROUND(keep-cpu-backend)

__all__ = [
    "MARKER",
    "SOURCE_PATCH",  # AUTOMODEL-WORKAROUND(keep-cpu-backend)
    "WORKAROUNDS",
    "ApplyReport",
    "ApplyStatus",
    "Detection",
    "Verdict",
    "Workaround",
    "WorkaroundFallbackWarning",
    "active",
    "apply",
    "build_accepts_timeout",
    "detect",
    "get_original",
    "installed_version",
    "is_applied",
    "keep_all_backends_override",
    "patched_names",
    "revert",
    "workaround",
]

#: Every workaround, in the order their layers stack (the first is nearest Automodel's own code).
WORKAROUNDS: tuple[Workaround, ...] = (
    KEEP_CPU_BACKEND,  # AUTOMODEL-WORKAROUND(keep-cpu-backend)
    CPU_MESH_TIMEOUT,  # AUTOMODEL-WORKAROUND(cpu-mesh-timeout)
)
_apply._register(WORKAROUNDS)

SOURCE_PATCH = Path(__file__).with_name("keep-cpu-backend.patch")  # AUTOMODEL-WORKAROUND(keep-cpu-backend)


def workaround(slug: str) -> Workaround:
    """The workaround named ``slug``; ValueError naming the known ones otherwise."""
    return _apply._workaround(slug)
