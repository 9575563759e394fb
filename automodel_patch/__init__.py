"""Fork fix for nemo-automodel: keep the CPU (Gloo) half of a composite backend in mesh sub-groups.

Public API:

* :func:`keeps_cpu_backend` - behavioural detection of the installed Automodel.
* :func:`apply` / :func:`revert` / :func:`is_applied` - the run-time patch.
* :data:`SOURCE_PATCH` - a unified diff for forks of 0.5.0, 0.6.0 and 0.7.0.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): TEMPORARY. Remove when the automodel pin
# includes NVIDIA-NeMo/Automodel#4602.
"""

from __future__ import annotations

from pathlib import Path

from automodel_patch._apply import (
    REMOVAL_CONDITION,
    WORKAROUND,
    ApplyStatus,
    apply,
    get_original,
    is_applied,
    patched_names,
    revert,
)
from automodel_patch._detect import is_supported, keeps_cpu_backend, reaches_cpu_mesh
from automodel_patch._override import keep_all_backends_override
from automodel_patch._target import build_accepts_timeout, installed_version

__all__ = [
    "REMOVAL_CONDITION",
    "SOURCE_PATCH",
    "WORKAROUND",
    "ApplyStatus",
    "apply",
    "build_accepts_timeout",
    "get_original",
    "installed_version",
    "is_applied",
    "is_supported",
    "keep_all_backends_override",
    "keeps_cpu_backend",
    "patched_names",
    "reaches_cpu_mesh",
    "revert",
]

SOURCE_PATCH = Path(__file__).with_name("keep-cpu-backend.patch")
