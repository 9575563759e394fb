"""The run-time fork fix's API, in this process, against the installed nemo-automodel (0.7.0).

Boundary simulated: this machine has no GPU and no NCCL process group, so the
override checks patch ``torch.distributed.is_initialized`` / ``get_backend`` to
*report* the default group a CPU-offload run has (``"cuda:nccl,cpu:gloo"``,
``"nccl"`` or ``"gloo"``). Everything else is real: the installed Automodel's
``mesh_utils`` and its genuine ``_nccl_backend_override``. Real process groups
are built in ``test_mesh_cpu.py``; every test here leaves ``mesh_utils``
reverted.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any
from unittest import mock

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

import automodel_patch
from automodel_patch import ApplyStatus
from automodel_patch._apply import MARKER, WORKAROUND
from automodel_patch._target import OVERRIDE_NAME, load_mesh_utils

__all__: list[str] = []

COMPOSITE = "cuda:nccl,cpu:gloo"
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: Names ``apply()`` replaces in 0.7.0's mesh_utils.
PATCHED_NAMES_070 = ("_nccl_backend_override", "init_device_mesh", "_unflatten_compat")
THREADS = 16
THREAD_JOIN_S = 120.0


@pytest.fixture(autouse=True)
def mesh_utils() -> Iterator[ModuleType]:
    """The installed ``mesh_utils``, unpatched at the start and reverted at the end of every test."""
    automodel_patch.revert()
    module = load_mesh_utils()
    if module is None:
        pytest.fail(
            "nemo_automodel.components.distributed.mesh_utils cannot be imported; the automodel extra is locked"
        )
    yield module
    automodel_patch.revert()
    assert not automodel_patch.is_applied(), "revert() left the keep-cpu-backend replacement in place"


def _originals(module: ModuleType) -> dict[str, Any]:
    return {name: getattr(module, name) for name in PATCHED_NAMES_070}


@contextmanager
def _reported(backend: str) -> Iterator[None]:
    """Boundary mock: the default group *reports* ``backend``; no process group or GPU exists here."""
    with (
        mock.patch.object(dist, "is_initialized", return_value=True),
        mock.patch.object(dist, "get_backend", return_value=backend),
    ):
        yield


def test_installed_release_is_the_locked_0_7_0() -> None:
    version = automodel_patch.installed_version()
    assert version is not None and version.release[:2] == (0, 7), f"expected nemo-automodel 0.7.x, got {version}"
    assert automodel_patch.is_supported()
    assert automodel_patch.build_accepts_timeout()


def test_apply_then_already_applied(mesh_utils: ModuleType) -> None:
    assert not automodel_patch.is_applied()
    assert automodel_patch.apply() is ApplyStatus.APPLIED
    assert automodel_patch.is_applied()
    assert automodel_patch.apply() is ApplyStatus.ALREADY_APPLIED
    assert automodel_patch.is_applied()
    assert set(automodel_patch.patched_names()) == set(PATCHED_NAMES_070)


def test_revert_restores_the_exact_originals(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    assert automodel_patch.apply() is ApplyStatus.APPLIED
    for name in PATCHED_NAMES_070:
        assert getattr(mesh_utils, name) is not before[name], f"apply() did not replace mesh_utils.{name}"
    assert automodel_patch.revert() is True
    for name, original in before.items():
        assert getattr(mesh_utils, name) is original, f"revert() did not restore the original mesh_utils.{name}"
    assert not automodel_patch.is_applied()
    assert automodel_patch.patched_names() == ()
    assert automodel_patch.revert() is False, "revert() with nothing patched must return False"


def test_get_original(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    assert automodel_patch.get_original() is None, "get_original() before apply() must be None"
    automodel_patch.apply()
    assert automodel_patch.get_original() is before[OVERRIDE_NAME]
    for name in PATCHED_NAMES_070:
        assert automodel_patch.get_original(name) is before[name]
    assert automodel_patch.get_original("no_such_name") is None


def test_replacements_carry_marker_and_original(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    automodel_patch.apply()
    for name in PATCHED_NAMES_070:
        replacement = getattr(mesh_utils, name)
        assert getattr(replacement, MARKER, None) == WORKAROUND, f"mesh_utils.{name} lacks {MARKER}={WORKAROUND!r}"
        assert replacement.__original__ is before[name]


def test_concurrent_apply_patches_once(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    start = threading.Barrier(THREADS)
    statuses: list[ApplyStatus] = []
    errors: list[BaseException] = []
    record = threading.Lock()

    def worker() -> None:
        try:
            start.wait()
            status = automodel_patch.apply()
        except BaseException as error:  # reported below
            with record:
                errors.append(error)
            return
        with record:
            statuses.append(status)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_JOIN_S)
    assert not any(t.is_alive() for t in threads), f"apply() threads still running after {THREAD_JOIN_S} s"
    assert not errors, f"apply() raised in threads: {errors!r}"
    assert statuses.count(ApplyStatus.APPLIED) == 1, f"expected exactly one APPLIED among {THREADS}, got {statuses}"
    assert statuses.count(ApplyStatus.ALREADY_APPLIED) == THREADS - 1, statuses
    for name in PATCHED_NAMES_070:
        assert automodel_patch.get_original(name) is before[name], f"original of {name} was overwritten"
        assert getattr(mesh_utils, name).__original__ is before[name]


def test_apply_revert_apply_keeps_the_true_original(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    assert automodel_patch.apply() is ApplyStatus.APPLIED
    first = {name: getattr(mesh_utils, name) for name in PATCHED_NAMES_070}
    assert automodel_patch.revert()
    assert automodel_patch.apply() is ApplyStatus.APPLIED
    for name in PATCHED_NAMES_070:
        assert automodel_patch.get_original(name) is before[name], f"original of {name} is not the true original"
        assert automodel_patch.get_original(name) is not first[name], f"a replacement of {name} became its original"
    assert automodel_patch.revert()
    for name, original in before.items():
        assert getattr(mesh_utils, name) is original


def test_keeps_cpu_backend_follows_apply_and_revert() -> None:
    assert automodel_patch.keeps_cpu_backend() is False
    automodel_patch.apply()
    assert automodel_patch.keeps_cpu_backend() is True
    automodel_patch.revert()
    assert automodel_patch.keeps_cpu_backend() is False


# ----------------------------------------------------------------- the override, with the reported backend mocked


def _device_map(backend: str) -> dict[str, str]:
    return BackendConfig(backend).get_device_backend_map()


def test_genuine_0_7_0_override_drops_the_cpu_half(mesh_utils: ModuleType) -> None:
    """The bug: under a reported composite default group, 0.7.0 asks for bare "nccl" on every axis."""
    genuine = getattr(mesh_utils, OVERRIDE_NAME)
    automodel_patch.apply()
    assert automodel_patch.get_original() is genuine
    with _reported(COMPOSITE):
        override = genuine(AXES, device_type="cuda", timeout_minutes=45)
    assert set(override) == set(AXES)
    for axis, (backend, _options) in override.items():
        assert backend == "nccl", f"0.7.0 gave axis {axis} backend {backend!r}; expected the buggy 'nccl'"
        assert "cpu" not in _device_map(backend)


@pytest.mark.parametrize("via", ["function", "installed replacement"])
def test_override_keeps_composite_backend_with_timeout(mesh_utils: ModuleType, via: str) -> None:
    if via == "installed replacement":
        automodel_patch.apply()
        override_fn = getattr(mesh_utils, OVERRIDE_NAME)
    else:
        override_fn = automodel_patch.keep_all_backends_override
    with _reported(COMPOSITE):
        override = override_fn(AXES, device_type="cuda", timeout_minutes=45)
    assert set(override) == set(AXES)
    for axis, (backend, options) in override.items():
        assert backend == COMPOSITE, f"axis {axis}: backend {backend!r}"
        assert isinstance(options, dist.ProcessGroupNCCL.Options), f"axis {axis}: options {type(options).__name__}"
        assert options._timeout == datetime.timedelta(minutes=45)
        assert _device_map(backend) == {"cuda": "nccl", "cpu": "gloo"}


def test_override_nccl_only_stays_nccl() -> None:
    with _reported("nccl"):
        override = automodel_patch.keep_all_backends_override(AXES, device_type="cuda", timeout_minutes=20)
    for axis, (backend, options) in override.items():
        assert backend == "nccl", f"axis {axis}: backend {backend!r}"
        assert "gloo" not in backend
        assert isinstance(options, dist.ProcessGroupNCCL.Options)
        assert options._timeout == datetime.timedelta(minutes=20)


def test_override_gloo_gets_timeout() -> None:
    with _reported("gloo"):
        override = automodel_patch.keep_all_backends_override(AXES, device_type="cpu", timeout_minutes=0.5)
    assert set(override) == set(AXES)
    for axis, (backend, options) in override.items():
        assert backend == "gloo", f"axis {axis}: backend {backend!r}"
        assert not isinstance(options, dist.ProcessGroupNCCL.Options)
        assert options._timeout == datetime.timedelta(seconds=30)


@pytest.mark.parametrize("reported", [COMPOSITE, "nccl", "gloo"])
def test_override_without_timeout_is_none(reported: str) -> None:
    with _reported(reported):
        assert automodel_patch.keep_all_backends_override(AXES, device_type="cuda", timeout_minutes=None) is None
