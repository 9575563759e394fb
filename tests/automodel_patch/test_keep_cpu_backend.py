"""The keep-cpu-backend layer's override, called as Automodel's mesh code calls it.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): these tests go with the workaround.

The boundary this machine lacks is NCCL: the default group a CPU-offload run has
(``"cuda:nccl,cpu:gloo"``) or a GPU run without offload (``"nccl"``) is simulated with
:func:`automodel_patch._simulated_group.simulated_default_group`, which every c10d query sees.
The override only computes options; nothing here runs a collective. Real groups built
from these options are in ``test_gpu.py`` (GPUs) and ``test_mesh_cpu.py`` (Gloo).
"""

from __future__ import annotations

import datetime
import warnings
from types import ModuleType
from unittest import mock

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

import automodel_patch
from automodel_patch import _fallback, _override
from automodel_patch._simulated_group import simulated_default_group
from automodel_patch._target import OVERRIDE_NAME

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


# --------------------------------------------------------------------------- where c10d cannot answer


def _facts(override: dict | None) -> dict | None:
    """An override as comparable data: backend string and timeout per axis."""
    if override is None:
        return None
    return {axis: (backend, options._timeout) for axis, (backend, options) in override.items()}


@pytest.fixture
def fallback_warnings(monkeypatch: pytest.MonkeyPatch):
    """A fresh record of fallback warnings, so "once" is measured within the test."""
    monkeypatch.setattr(_fallback, "_warned", set())


@pytest.fixture
def automodel_test_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The world Automodel's own mesh unit tests stand up: is_initialized() True, a world size, no default group."""
    assert dist.group.WORLD is None, "a default group exists in the test process"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 8)


def _layered_and_genuine(mesh_utils: ModuleType, slug: str, call) -> tuple:
    automodel_patch.apply(slug)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layered = [call(getattr(mesh_utils, OVERRIDE_NAME)) for _ in range(3)]
    genuine = call(automodel_patch.get_original(OVERRIDE_NAME))
    fallbacks = [w for w in caught if issubclass(w.category, automodel_patch.WorkaroundFallbackWarning)]
    return layered, genuine, fallbacks


@pytest.mark.usefixtures("fallback_warnings", "automodel_test_world")
def test_layer_without_a_default_group_gives_automodels_answer_and_warns_once(mesh_utils: ModuleType) -> None:
    """Where Automodel's function returns, the layer returns the same (upstream's fix does too), and says why once."""
    layered, genuine, fallbacks = _layered_and_genuine(
        mesh_utils, "keep-cpu-backend", lambda fn: _facts(fn(AXES, device_type="cuda", timeout_minutes=30))
    )
    assert genuine == {axis: ("nccl", datetime.timedelta(minutes=30)) for axis in AXES}
    assert layered == [genuine] * 3
    (warning,) = fallbacks
    message = str(warning.message)
    assert "workaround keep-cpu-backend" in message and OVERRIDE_NAME in message, message
    assert "no default process group" in message, message


@pytest.mark.usefixtures("fallback_warnings")
@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (RuntimeError("c10d query failed"), "RuntimeError: c10d query failed"),
        (42, "answered 42 (int), not a backend string"),
        ("cuda:nccl:cpu", "which is not a backend string"),
        ("", "names no backend for some device"),
    ],
    ids=["raises", "not-a-string", "malformed", "empty"],
)
def test_layer_gives_automodels_answer_when_c10d_answers_nothing_usable(
    mesh_utils: ModuleType, monkeypatch: pytest.MonkeyPatch, answer: object, reason: str
) -> None:
    def get_backend(group=None):
        if isinstance(answer, Exception):
            raise answer
        return answer

    with simulated_default_group(COMPOSITE):
        monkeypatch.setattr(dist, "get_backend", get_backend)
        layered, genuine, fallbacks = _layered_and_genuine(
            mesh_utils, "keep-cpu-backend", lambda fn: _facts(fn(AXES, device_type="cuda", timeout_minutes=30))
        )
    assert layered == [genuine] * 3
    assert {backend for backend, _ in genuine.values()} == {"nccl"}
    (warning,) = fallbacks
    assert "workaround keep-cpu-backend" in str(warning.message) and reason in str(warning.message), warning.message


def _flattened(device_type: str, source_size: int):
    """0.7.0's ``_register_flattened_axes`` on mocks, as Automodel's own tests call it; returns the override passed."""
    source = mock.Mock(size=mock.Mock(return_value=source_size))
    device_mesh = mock.MagicMock(device_type=device_type, _flatten_mapping={})
    device_mesh.__getitem__.return_value = source
    return source, device_mesh


def _automodel_scenario(mesh_utils: ModuleType, name: str) -> object:
    """One of the four 0.7.0 mesh-test scenarios the first fork fix raised in (measured on Automodel's suite)."""
    if name.startswith("flattened"):
        source, device_mesh = _flattened("cuda", 8 if name == "flattened-world-axis" else 4)
        mesh_utils._register_flattened_axes(device_mesh, {"dp_cp": ("dp_shard", "cp")}, timeout_minutes=30)
        config = source._flatten.call_args.kwargs["backend_override"]
        return _facts({"dp_cp": config} if config is not None else None)
    flat_mesh = mock.Mock(device_type="cuda")
    device_mesh = mock.MagicMock(device_type="cuda")
    device_mesh.__getitem__.return_value._flatten.return_value = flat_mesh
    sizes = {"moe-ep": (4, 32), "moe-world-size-ep": (1, 8)}[name]
    mesh_utils._create_moe_mesh(device_mesh, ep_shard_size=sizes[0], ep_size=sizes[1], timeout_minutes=30)
    return _facts(flat_mesh._unflatten.call_args.kwargs["backend_override"])


@pytest.mark.usefixtures("fallback_warnings", "automodel_test_world")
@pytest.mark.parametrize("scenario", ["flattened-axis", "flattened-world-axis", "moe-ep", "moe-world-size-ep"])
def test_automodel_mesh_test_scenarios_pass_with_the_layer_as_without(mesh_utils: ModuleType, scenario: str) -> None:
    genuine = _automodel_scenario(mesh_utils, scenario)
    automodel_patch.apply("keep-cpu-backend")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", automodel_patch.WorkaroundFallbackWarning)
        layered = _automodel_scenario(mesh_utils, scenario)
    assert layered == genuine
    assert genuine is None or {backend for backend, _ in genuine.values()} == {"nccl"}


@pytest.mark.usefixtures("fallback_warnings", "automodel_test_world")
def test_world_axis_reuse_passes_overrides_on_unchanged_when_c10d_cannot_say() -> None:
    calls: list[dict] = []
    wrapped = _override.make_init_device_mesh(lambda *args, **kwargs: calls.append(kwargs), ("keep-cpu-backend",))
    override = {"dp_shard": ("nccl", None), "tp": ("nccl", None)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped("cuda", (8, 1), mesh_dim_names=("dp_shard", "tp"), backend_override=dict(override))
    assert calls == [{"mesh_dim_names": ("dp_shard", "tp"), "backend_override": override}]
    (warning,) = [w for w in caught if issubclass(w.category, automodel_patch.WorkaroundFallbackWarning)]
    assert "keep-cpu-backend" in str(warning.message) and "init_device_mesh" in str(warning.message)
