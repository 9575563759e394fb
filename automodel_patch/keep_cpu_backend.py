"""Workaround ``keep-cpu-backend``: mesh sub-groups keep the CPU (Gloo) half of a composite default group.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): TEMPORARY. Remove when the automodel pin
# includes NVIDIA-NeMo/Automodel#4602.

Symptom: with FSDP2 CPU offload and a distributed timeout, ``DTensor.full_tensor()`` on a
    CPU-offloaded parameter fails with ``No backend type associated with device type cpu``
    (first hit in NeMo RL's ``prepare_refit_info()``).
Cause: ``mesh_utils._nccl_backend_override`` (nemo-automodel 0.5.0 to 0.7.0) builds every
    mesh sub-group as ``"nccl"``, dropping the ``cpu:gloo`` half of the
    ``"cuda:nccl,cpu:gloo"`` default group that CPU offload needs.
Fix: a layer over the override that, for a CUDA mesh, keeps the default group's whole
    backend string and puts the timeout on each half
    (:func:`automodel_patch._override.keep_all_backends_override`).
Removal: when the automodel pin includes NVIDIA-NeMo/Automodel#4602, which the probe sees
    as: under a ``"cuda:nccl,cpu:gloo"`` default group the genuine override keeps both
    halves on every axis, with the requested timeout.
Tripwire: ``tests/automodel_patch/test_tripwire.py::test_keep_cpu_backend_is_still_needed``.
Upstream PR: ``automodel_patch/upstream/keep-cpu-backend.patch`` (description beside it); the fork
    patch ``automodel_patch/keep-cpu-backend.patch`` carries the same ``mesh_utils.py`` change.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from automodel_patch import _override, _probe
from automodel_patch._target import OVERRIDE_NAME
from automodel_patch._verdict import Detection
from automodel_patch._workaround import Functions, Workaround

__all__ = ["COMPOSITE_BACKEND", "WORKAROUND"]

SLUG = "keep-cpu-backend"
COMPOSITE_BACKEND = "cuda:nccl,cpu:gloo"


def probe(functions: Functions) -> Detection:
    """Call the genuine override for a CUDA mesh under a simulated composite default group."""
    return _probe.judge_override(
        SLUG,
        functions,
        backend=COMPOSITE_BACKEND,
        device_type="cuda",
        fixed="keeps both halves with the timeout on every axis",
    )


def layer(mesh_utils: ModuleType, current: Mapping[str, Any]) -> dict[str, Any]:
    """The override for CUDA meshes; every other call goes to what is installed below.

    Where c10d cannot name the default group's backend (Automodel's own unit tests patch
    ``dist.is_initialized`` to True with no default group), the call goes below too,
    with one :class:`~automodel_patch._fallback.WorkaroundFallbackWarning`: the answer
    is then Automodel's, as the upstream fix's is in that world.
    """
    below = current[OVERRIDE_NAME]

    return {OVERRIDE_NAME: _override.layered_override(SLUG, OVERRIDE_NAME, below, lambda device: device == "cuda")}


WORKAROUND = Workaround(
    slug=SLUG,
    symptom="with CPU offload and a timeout, mesh sub-groups lose the cpu:gloo half and full_tensor() fails",
    problem="CPU offload is on and the installed Automodel drops the CPU half",
    fixed="the installed Automodel keeps the CPU half",
    without_it="the installed nemo-automodel may build mesh sub-groups without the CPU half under CPU offload",
    forward_without_it=False,
    removal_condition=(
        "the automodel pin includes NVIDIA-NeMo/Automodel#4602 (under a cuda:nccl,cpu:gloo default group its "
        "_nccl_backend_override keeps both halves, with the timeout, on every axis)"
    ),
    tripwire="tests/automodel_patch/test_tripwire.py::test_keep_cpu_backend_is_still_needed",
    places={
        "automodel_patch/keep_cpu_backend.py": "the workaround itself: delete the file",
        "automodel_patch/__init__.py": "its entry in WORKAROUNDS, its import and SOURCE_PATCH: delete the tagged lines",
        "automodel_patch/keep-cpu-backend.patch": "the source patch for forks: delete the file",
        "automodel_patch/upstream/keep-cpu-backend.patch": "the upstream PR (merged by now): delete the file",
        "automodel_patch/upstream/keep-cpu-backend.md": "the upstream PR's description: delete the file",
        "tests/automodel_patch/test_upstream_patches.py": "its entries, the drift test, its real-world checks: delete",
        "tests/automodel_patch/test_keep_cpu_backend.py": "its unit tests: delete the file",
        "tests/automodel_patch/test_source_patch.py": "the source patch's tests: delete the file",
        "tests/automodel_patch/test_releases.py": "the keep-cpu-backend expectations of the release matrix: delete",
        "tests/test_gpu.py": "the 'patched' variant of the two-GPU test: delete it, keep the native one",
        "tests/automodel_patch/test_tripwire.py": "test_keep_cpu_backend_is_still_needed: delete it",
        "README.md": "its row in 'When the pin moves': delete it",
        "tests/automodel_patch/test_pin_bump.py": "the rehearsal of this bump: aim it at the next fix, or delete it",
    },
    default_backends=frozenset({COMPOSITE_BACKEND}),
    names=(OVERRIDE_NAME,),
    probe=probe,
    layer=layer,
)
