"""Workaround ``cpu-mesh-timeout``: a CPU (plain ``gloo``) mesh's sub-groups and MoE axes get the timeout.

# AUTOMODEL-WORKAROUND(cpu-mesh-timeout): TEMPORARY. Remove when the installed Automodel
# gives a gloo mesh's sub-groups and MoE axes the requested timeout by itself.

Symptom: on a machine without CUDA (the default group is plain ``"gloo"``) every mesh
    sub-group and MoE axis keeps gloo's 30-minute default whatever
    ``distributed_timeout_minutes`` says; only the default group gets the value.
Cause: ``mesh_utils._nccl_backend_override`` returns None for any non-CUDA mesh, and
    ``_unflatten_compat`` passes a timeout to ``DeviceMesh._unflatten`` only on CUDA
    (nemo-automodel 0.5.0 to 0.7.0; the fix for NVIDIA-NeMo/Automodel#4602 is expected to
    keep that guard). No upstream issue is known; the PR below describes the problem.
Fix: a layer over the override that, for a non-CUDA mesh, overrides every axis with the
    default group's backend and the timeout; and a wrapper of ``_unflatten_compat`` that
    gives a CPU mesh's MoE axes the same (0.6.0 and later; 0.5.0 has no MoE timeout plumbing).
Removal: when the genuine override, called for a CPU mesh under a ``"gloo"`` default group,
    gives every axis the requested timeout, and the genuine ``_unflatten_compat`` passes it
    to a CPU mesh's MoE axes (or no longer exists).
Tripwire: ``tests/automodel_patch/test_tripwire.py::test_cpu_mesh_timeout_is_still_needed``.
Upstream PR: ``automodel_patch/upstream/cpu-mesh-timeout.patch`` (description beside it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from automodel_patch import _override, _probe
from automodel_patch._fallback import or_genuine
from automodel_patch._target import OVERRIDE_NAME, takes_timeout
from automodel_patch._verdict import Detection
from automodel_patch._workaround import Functions, Workaround

__all__ = ["UNFLATTEN_NAME", "WORKAROUND", "make_unflatten_compat"]

SLUG = "cpu-mesh-timeout"
GLOO = "gloo"
UNFLATTEN_NAME = "_unflatten_compat"
#: MoE axes as Automodel's ``_create_moe_mesh`` names them, and sizes no one-rank world can reuse.
_MOE_NAMES = ("ep_shard", "ep")
_MOE_SIZES = (2, 2)


class _RecordingFlatMesh:
    """The flattened mesh ``_unflatten_compat`` receives, reduced to what the probe reads.

    Building a real one needs a process group per axis; the probe only needs to see
    which ``backend_override`` the genuine function would hand to ``DeviceMesh._unflatten``.
    """

    device_type = "cpu"

    def __init__(self) -> None:
        self.backend_override: Any = None

    def _unflatten(self, axis: int, sizes: tuple[int, ...], names: tuple[str, ...], **kwargs: Any) -> str:
        self.backend_override = kwargs.get("backend_override")
        return "unflattened"


def _moe_problems(unflatten: Callable[..., Any] | None) -> list[str]:
    if not takes_timeout(unflatten):
        return []  # no MoE timeout plumbing on any device (0.5.0): nothing this workaround could add
    mesh = _RecordingFlatMesh()
    _probe.call_under(GLOO, unflatten, mesh, 0, _MOE_SIZES, _MOE_NAMES, timeout_minutes=1)
    problems = _probe.axis_problems(mesh.backend_override, _MOE_NAMES, default_backend=GLOO, minutes=_probe.ONE_MINUTE)
    return [f"{UNFLATTEN_NAME} for a CPU mesh's MoE axes {problem}" for problem in problems]


def probe(functions: Functions) -> Detection:
    """Call the genuine override (and ``_unflatten_compat``) for a CPU mesh under a simulated gloo group."""
    return _probe.judge_override(
        SLUG,
        functions,
        backend=GLOO,
        device_type="cpu",
        fixed="gives every axis the timeout, and so do the MoE axes",
        more=lambda: _moe_problems(functions.get(UNFLATTEN_NAME)),
    )


def make_unflatten_compat(unflatten_compat: Callable[..., Any], mesh_utils: ModuleType) -> Callable[..., Any] | None:
    """Wrap ``_unflatten_compat`` so a CPU mesh's MoE sub-groups get the timeout.

    Returns None when the installed function takes no ``timeout_minutes`` (0.5.0),
    which has no timeout plumbing for the MoE mesh at all.
    """
    if not takes_timeout(unflatten_compat):
        return None

    def unflatten_compat_with_cpu_timeout(
        flat_mesh: Any,
        axis: int,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        *,
        timeout_minutes: float | None = None,
    ) -> Any:
        def genuine():
            return unflatten_compat(flat_mesh, axis, sizes, names, timeout_minutes=timeout_minutes)

        if timeout_minutes is not None and flat_mesh.device_type != "cuda" and hasattr(flat_mesh, "_unflatten"):
            override = mesh_utils._nccl_backend_override(
                names, device_type=flat_mesh.device_type, timeout_minutes=timeout_minutes
            )
            override = or_genuine(
                SLUG,
                UNFLATTEN_NAME,
                lambda: _override.without_reusable(override, dict(zip(names, sizes, strict=True))),
                lambda: None,  # c10d cannot say which axes span the world: Automodel's own unflatten
            )
            if override:
                return flat_mesh._unflatten(axis, sizes, names, backend_override=override)
        return genuine()

    unflatten_compat_with_cpu_timeout.__wrapped__ = unflatten_compat  # type: ignore[attr-defined]
    return unflatten_compat_with_cpu_timeout


def layer(mesh_utils: ModuleType, current: Mapping[str, Any]) -> dict[str, Any]:
    """The override for non-CUDA meshes, and the MoE companion where the release has one."""
    below = current[OVERRIDE_NAME]

    cpu_mesh_override = _override.layered_override(SLUG, OVERRIDE_NAME, below, lambda device: device != "cuda")
    replacements: dict[str, Any] = {OVERRIDE_NAME: cpu_mesh_override}
    unflatten = current.get(UNFLATTEN_NAME)
    if unflatten is not None and (wrapped := make_unflatten_compat(unflatten, mesh_utils)) is not None:
        replacements[UNFLATTEN_NAME] = wrapped
    return replacements


WORKAROUND = Workaround(
    slug=SLUG,
    symptom="on a CPU (gloo) mesh, sub-groups and MoE axes keep gloo's 30-minute default",
    problem="on a CPU (gloo) mesh the installed Automodel passes no timeout to the mesh sub-groups",
    fixed="the installed Automodel gives a CPU (gloo) mesh's sub-groups the timeout",
    without_it="on this CPU (gloo) mesh sub-groups keep gloo's 30-minute default",
    forward_without_it=True,
    removal_condition=(
        "the installed Automodel gives a gloo mesh's sub-groups and MoE axes the requested timeout by itself "
        "(its _nccl_backend_override overrides every axis of a CPU mesh with the timeout, and _unflatten_compat "
        "passes it to a CPU mesh's MoE axes)"
    ),
    tripwire="tests/automodel_patch/test_tripwire.py::test_cpu_mesh_timeout_is_still_needed",
    places={
        "automodel_patch/cpu_mesh_timeout.py": "the workaround itself: delete the file",
        "automodel_patch/__init__.py": "its entry in WORKAROUNDS and its import: delete both lines",
        "tests/automodel_patch/test_cpu_mesh_timeout.py": "its unit tests: delete the file",
        "automodel_patch/upstream/cpu-mesh-timeout.patch": "the upstream PR (merged by now): delete the file",
        "automodel_patch/upstream/cpu-mesh-timeout.md": "the upstream PR's description: delete the file",
        "tests/automodel_patch/test_upstream_patches.py": "the cpu-mesh-timeout entries and tests: delete them",
        "tests/automodel_patch/test_releases.py": "the cpu-mesh-timeout expectations of the release matrix: delete",
        "tests/automodel_patch/test_tripwire.py": "test_cpu_mesh_timeout_is_still_needed: delete it",
        "README.md": "its row in 'When the pin moves': delete it",
    },
    default_backends=frozenset({GLOO}),
    names=(OVERRIDE_NAME, UNFLATTEN_NAME),
    probe=probe,
    layer=layer,
)
