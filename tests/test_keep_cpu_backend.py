"""The keep-cpu-backend layer's override, called as Automodel's mesh code calls it.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): these tests go with the workaround.

The boundary this machine lacks is NCCL: the default group a CPU-offload run has
(``"cuda:nccl,cpu:gloo"``) or a GPU run without offload (``"nccl"``) is simulated with
:func:`automodel_patch._world.simulated_default_group`, which every c10d query sees.
The override only computes options; nothing here runs a collective. Real groups built
from these options are in ``test_gpu.py`` (GPUs) and ``test_mesh_cpu.py`` (Gloo).
"""

from __future__ import annotations

import datetime
from types import ModuleType

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

import automodel_patch
from automodel_patch._target import OVERRIDE_NAME
from automodel_patch._world import simulated_default_group

__all__: list[str] = []

COMPOSITE = "cuda:nccl,cpu:gloo"
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

pytestmark = pytest.mark.usefixtures("mesh_utils")  # no workaround in force before or after each test


def _device_map(backend: str) -> dict[str, str]:
    return BackendConfig(backend).get_device_backend_map()


def test_genuine_0_7_0_override_drops_the_cpu_half(mesh_utils: ModuleType) -> None:
    """The bug: under a composite default group, 0.7.0 asks for bare "nccl" on every axis."""
    genuine = getattr(mesh_utils, OVERRIDE_NAME)
    with simulated_default_group(COMPOSITE):
        override = genuine(AXES, device_type="cuda", timeout_minutes=45)
    assert set(override) == set(AXES)
    for axis, (backend, _options) in override.items():
        assert backend == "nccl", f"0.7.0 gave axis {axis} backend {backend!r}; expected the buggy 'nccl'"
        assert "cpu" not in _device_map(backend)


@pytest.mark.parametrize("via", ["function", "installed layer"])
def test_override_keeps_composite_backend_with_timeout(mesh_utils: ModuleType, via: str) -> None:
    if via == "installed layer":
        automodel_patch.apply("keep-cpu-backend")
        override_fn = getattr(mesh_utils, OVERRIDE_NAME)
    else:
        override_fn = automodel_patch.keep_all_backends_override
    with simulated_default_group(COMPOSITE):
        override = override_fn(AXES, device_type="cuda", timeout_minutes=45)
    assert set(override) == set(AXES)
    for axis, (backend, options) in override.items():
        assert backend == COMPOSITE, f"axis {axis}: backend {backend!r}"
        assert isinstance(options, dist.ProcessGroupNCCL.Options), f"axis {axis}: options {type(options).__name__}"
        assert options._timeout == datetime.timedelta(minutes=45)
        assert _device_map(backend) == {"cuda": "nccl", "cpu": "gloo"}


def test_override_nccl_only_stays_nccl() -> None:
    with simulated_default_group("nccl"):
        override = automodel_patch.keep_all_backends_override(AXES, device_type="cuda", timeout_minutes=20)
    for axis, (backend, options) in override.items():
        assert backend == "nccl", f"axis {axis}: backend {backend!r}"
        assert isinstance(options, dist.ProcessGroupNCCL.Options)
        assert options._timeout == datetime.timedelta(minutes=20)


def test_layer_hands_cpu_meshes_to_what_lies_below(mesh_utils: ModuleType) -> None:
    """keep-cpu-backend alone changes nothing for a CPU mesh: that call reaches 0.7.0's own code (None)."""
    automodel_patch.apply("keep-cpu-backend")
    with simulated_default_group("gloo"):
        assert getattr(mesh_utils, OVERRIDE_NAME)(AXES, device_type="cpu", timeout_minutes=45) is None


@pytest.mark.parametrize("reported", [COMPOSITE, "nccl", "gloo"])
def test_override_without_timeout_is_none(reported: str) -> None:
    with simulated_default_group(reported):
        assert automodel_patch.keep_all_backends_override(AXES, device_type="cuda", timeout_minutes=None) is None
