"""The cpu-mesh-timeout layer: the override for a CPU (gloo) mesh, and the MoE companion.

# AUTOMODEL-WORKAROUND(cpu-mesh-timeout): these tests go with the workaround.

The override is called under a simulated plain-gloo default group
(:func:`automodel_patch._simulated_group.simulated_default_group`); real Gloo groups built with it
are in ``test_mesh_cpu.py``, ``test_setup_distributed.py`` and ``test_fault.py``.
"""

from __future__ import annotations

import datetime
import warnings
from types import ModuleType
from typing import Any

import pytest
import torch.distributed as dist

import automodel_patch
from automodel_patch import _fallback
from automodel_patch._simulated_group import simulated_default_group
from automodel_patch._target import OVERRIDE_NAME
from automodel_patch.cpu_mesh_timeout import UNFLATTEN_NAME

__all__: list[str] = []

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

pytestmark = pytest.mark.usefixtures("mesh_utils")  # no workaround in force before or after each test


def test_genuine_0_7_0_gives_a_cpu_mesh_no_override(mesh_utils: ModuleType) -> None:
    with simulated_default_group("gloo"):
        assert getattr(mesh_utils, OVERRIDE_NAME)(AXES, device_type="cpu", timeout_minutes=45) is None


@pytest.mark.parametrize("via", ["function", "installed layer"])
def test_override_gives_every_axis_gloo_and_the_timeout(mesh_utils: ModuleType, via: str) -> None:
    if via == "installed layer":
        automodel_patch.apply("cpu-mesh-timeout")
        override_fn = getattr(mesh_utils, OVERRIDE_NAME)
    else:
        override_fn = automodel_patch.keep_all_backends_override
    with simulated_default_group("gloo"):
        override = override_fn(AXES, device_type="cpu", timeout_minutes=0.5)
    assert set(override) == set(AXES)
    for axis, (backend, options) in override.items():
        assert backend == "gloo", f"axis {axis}: backend {backend!r}"
        assert not isinstance(options, dist.ProcessGroupNCCL.Options)
        assert options._timeout == datetime.timedelta(seconds=30)


def test_layer_hands_cuda_meshes_to_what_lies_below(mesh_utils: ModuleType) -> None:
    """cpu-mesh-timeout alone leaves a CUDA mesh to 0.7.0's own code (bare "nccl", the other workaround's bug)."""
    automodel_patch.apply("cpu-mesh-timeout")
    with simulated_default_group("cuda:nccl,cpu:gloo"):
        override = getattr(mesh_utils, OVERRIDE_NAME)(AXES, device_type="cuda", timeout_minutes=45)
    assert {backend for backend, _ in override.values()} == {"nccl"}


class _FlatMesh:
    """The flattened mesh ``_unflatten_compat`` receives: what the companion hands to ``_unflatten``, recorded.

    A real one needs a process group per axis (``test_mesh_cpu.py`` builds those); here the
    question is only which override the companion passes.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.calls: list[dict[str, Any]] = []

    def _unflatten(self, axis: int, sizes: tuple[int, ...], names: tuple[str, ...], **kwargs: Any) -> str:
        self.calls.append({"sizes": sizes, "names": names, **kwargs})
        return "mesh"


def test_moe_companion_passes_the_timeout_for_a_cpu_mesh(mesh_utils: ModuleType) -> None:
    automodel_patch.apply("cpu-mesh-timeout")
    flat = _FlatMesh("cpu")
    with simulated_default_group("gloo"):
        getattr(mesh_utils, UNFLATTEN_NAME)(flat, 0, (2, 2), ("ep_shard", "ep"), timeout_minutes=45)
    (call,) = flat.calls
    override = call["backend_override"]
    assert set(override) == {"ep_shard", "ep"}
    assert {options._timeout for _, options in override.values()} == {datetime.timedelta(minutes=45)}


def test_moe_companion_drops_world_sized_axes_so_they_reuse_the_default_group(mesh_utils: ModuleType) -> None:
    """An axis spanning the world whose default group already has the timeout reuses it; a differing timeout does not.

    The one-rank probe world's default group carries 1 minute, and an axis of size 1 spans it.
    """
    automodel_patch.apply("cpu-mesh-timeout")
    flat = _FlatMesh("cpu")
    with simulated_default_group("gloo"):
        getattr(mesh_utils, UNFLATTEN_NAME)(flat, 0, (1, 2), ("ep_shard", "ep"), timeout_minutes=1)
        getattr(mesh_utils, UNFLATTEN_NAME)(flat, 0, (1, 2), ("ep_shard", "ep"), timeout_minutes=45)
    same, other = flat.calls
    assert set(same["backend_override"]) == {"ep"}
    assert set(other["backend_override"]) == {"ep_shard", "ep"}


def test_moe_companion_leaves_cuda_and_no_timeout_to_upstream(mesh_utils: ModuleType) -> None:
    automodel_patch.apply("cpu-mesh-timeout")
    flat = _FlatMesh("cpu")
    with simulated_default_group("gloo"):
        getattr(mesh_utils, UNFLATTEN_NAME)(flat, 0, (2, 2), ("ep_shard", "ep"), timeout_minutes=None)
    assert flat.calls == [{"sizes": (2, 2), "names": ("ep_shard", "ep")}]


# --------------------------------------------------------------------------- where c10d cannot answer


def _fallbacks(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, automodel_patch.WorkaroundFallbackWarning)]


def test_layer_without_a_default_group_gives_automodels_answer_and_warns_once(
    mesh_utils: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Automodel's own unit-test world (is_initialized() True, no default group): its answer, None, and one warning."""
    monkeypatch.setattr(_fallback, "_warned", set())
    automodel_patch.apply("cpu-mesh-timeout")
    assert dist.group.WORLD is None, "a default group exists in the test process"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answers = [getattr(mesh_utils, OVERRIDE_NAME)(AXES, device_type="cpu", timeout_minutes=30) for _ in range(3)]
    assert answers == [None] * 3
    (message,) = _fallbacks(caught)
    assert "workaround cpu-mesh-timeout" in message and "no default process group" in message, message


def test_moe_companion_gives_automodels_unflatten_when_the_world_size_is_unreadable(
    mesh_utils: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fallback, "_warned", set())
    automodel_patch.apply("cpu-mesh-timeout")
    flat = _FlatMesh("cpu")
    with simulated_default_group("gloo"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: "two")
        getattr(mesh_utils, UNFLATTEN_NAME)(flat, 0, (1, 2), ("ep_shard", "ep"), timeout_minutes=45)
    assert flat.calls == [{"sizes": (1, 2), "names": ("ep_shard", "ep")}], "0.7.0's own unflatten: no override on CPU"
    (message,) = _fallbacks(caught)
    assert "workaround cpu-mesh-timeout" in message and UNFLATTEN_NAME in message and "'two'" in message, message
