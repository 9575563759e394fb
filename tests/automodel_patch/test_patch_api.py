"""The run-time layers' API, in this process, against the installed nemo-automodel (0.7.0).

``apply`` / ``revert`` / ``is_applied`` / ``active`` / ``get_original`` / ``patched_names``:
what each does to the installed Automodel's ``mesh_utils``, one workaround at a time and
together, from one thread or sixteen. Everything is real: the installed Automodel's
``mesh_utils`` and its genuine functions; the probes build their own one-rank world
(:mod:`automodel_patch._simulated_group`, tested at the end). Every test leaves ``mesh_utils`` reverted.
"""

from __future__ import annotations

import datetime
import threading
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

import automodel_patch
from automodel_patch import MARKER, Verdict
from automodel_patch._simulated_group import simulated_default_group
from automodel_patch._target import OVERRIDE_NAME

__all__: list[str] = []

KEEP, CPU_MESH = "keep-cpu-backend", "cpu-mesh-timeout"
#: Names ``apply()`` replaces in 0.7.0's mesh_utils, and which workarounds each carries.
LAYERS_070 = {
    "_nccl_backend_override": (KEEP, CPU_MESH),
    "init_device_mesh": (KEEP, CPU_MESH),
    "_unflatten_compat": (CPU_MESH,),
}
THREADS = 16
THREAD_JOIN_S = 120.0

pytestmark = pytest.mark.usefixtures("mesh_utils")  # no workaround in force before or after each test


def _originals(module: ModuleType) -> dict[str, Any]:
    return {name: getattr(module, name) for name in LAYERS_070}


def test_installed_release_is_the_locked_0_7_0() -> None:
    version = automodel_patch.installed_version()
    assert version is not None and version.release[:2] == (0, 7), f"expected nemo-automodel 0.7.x, got {version}"
    assert automodel_patch.build_accepts_timeout()
    assert [w.slug for w in automodel_patch.WORKAROUNDS] == [KEEP, CPU_MESH]
    assert {automodel_patch.detect(slug).verdict for slug in (KEEP, CPU_MESH)} == {Verdict.NEEDED}


def test_apply_then_already_applied(mesh_utils: ModuleType) -> None:
    assert not automodel_patch.is_applied()
    report = automodel_patch.apply()
    assert report.to_dict() == {KEEP: "applied", CPU_MESH: "applied"}
    assert report.applied == (KEEP, CPU_MESH)
    assert {slug: d.verdict for slug, d in report.detections.items()} == {
        KEEP: Verdict.NEEDED,
        CPU_MESH: Verdict.NEEDED,
    }
    assert automodel_patch.active() == (KEEP, CPU_MESH)
    assert automodel_patch.is_applied(KEEP) and automodel_patch.is_applied(CPU_MESH)
    again = automodel_patch.apply()
    assert again.to_dict() == {KEEP: "already_applied", CPU_MESH: "already_applied"}
    assert again.applied == ()
    assert set(automodel_patch.patched_names()) == set(LAYERS_070)


@pytest.mark.parametrize(("slug", "names"), [(KEEP, {OVERRIDE_NAME, "init_device_mesh"}), (CPU_MESH, set(LAYERS_070))])
def test_apply_one_workaround_replaces_only_its_names(mesh_utils: ModuleType, slug: str, names: set[str]) -> None:
    before = _originals(mesh_utils)
    assert automodel_patch.apply(slug).to_dict() == {slug: "applied"}
    assert automodel_patch.active() == (slug,)
    assert set(automodel_patch.patched_names()) == names
    for name, original in before.items():
        replaced = getattr(mesh_utils, name) is not original
        assert replaced == (name in names), name
        if replaced:
            assert getattr(getattr(mesh_utils, name), MARKER) == (slug,)


def test_reverting_one_leaves_the_other_layer_working(mesh_utils: ModuleType) -> None:
    automodel_patch.apply()
    assert automodel_patch.revert(KEEP) is True
    assert automodel_patch.active() == (CPU_MESH,)
    assert automodel_patch.detect(KEEP, installed=True).verdict is Verdict.NEEDED
    assert automodel_patch.detect(CPU_MESH, installed=True).verdict is Verdict.NOT_NEEDED
    assert automodel_patch.revert(KEEP) is False, "reverting a workaround that is not in force changes nothing"
    assert automodel_patch.revert(CPU_MESH) is True
    assert automodel_patch.active() == ()


def test_unknown_slug_is_a_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown workaround 'keep-cpu'; known: keep-cpu-backend, cpu-mesh-timeout"):
        automodel_patch.apply("keep-cpu")


def test_revert_restores_the_exact_originals(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    automodel_patch.apply()
    for name in LAYERS_070:
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
    for name in LAYERS_070:
        assert automodel_patch.get_original(name) is before[name]
    assert automodel_patch.get_original("no_such_name") is None


def test_replacements_carry_marker_and_original(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    automodel_patch.apply()
    for name, slugs in LAYERS_070.items():
        replacement = getattr(mesh_utils, name)
        assert getattr(replacement, MARKER, None) == slugs, f"mesh_utils.{name} carries {getattr(replacement, MARKER)}"
        assert replacement.__original__ is before[name]


def test_concurrent_apply_patches_once(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    start = threading.Barrier(THREADS)
    reports: list[dict[str, str]] = []
    errors: list[BaseException] = []
    record = threading.Lock()

    def worker() -> None:
        try:
            start.wait()
            report = automodel_patch.apply().to_dict()
        except BaseException as error:  # reported below
            with record:
                errors.append(error)
            return
        with record:
            reports.append(report)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_JOIN_S)
    assert not any(t.is_alive() for t in threads), f"apply() threads still running after {THREAD_JOIN_S} s"
    assert not errors, f"apply() raised in threads: {errors!r}"
    applied = {KEEP: "applied", CPU_MESH: "applied"}
    assert reports.count(applied) == 1, f"expected exactly one call to apply both among {THREADS}, got {reports}"
    assert reports.count({KEEP: "already_applied", CPU_MESH: "already_applied"}) == THREADS - 1, reports
    for name in LAYERS_070:
        assert automodel_patch.get_original(name) is before[name], f"original of {name} was overwritten"
        assert getattr(mesh_utils, name).__original__ is before[name]


def test_apply_revert_apply_keeps_the_true_original(mesh_utils: ModuleType) -> None:
    before = _originals(mesh_utils)
    automodel_patch.apply()
    first = {name: getattr(mesh_utils, name) for name in LAYERS_070}
    assert automodel_patch.revert()
    assert automodel_patch.apply().applied == (KEEP, CPU_MESH)
    for name in LAYERS_070:
        assert automodel_patch.get_original(name) is before[name], f"original of {name} is not the true original"
        assert automodel_patch.get_original(name) is not first[name], f"a replacement of {name} became its original"
    assert automodel_patch.revert()
    for name, original in before.items():
        assert getattr(mesh_utils, name) is original


def test_detection_follows_apply_and_revert() -> None:
    for slug in (KEEP, CPU_MESH):
        assert automodel_patch.detect(slug, installed=True).verdict is Verdict.NEEDED
    automodel_patch.apply()
    for slug in (KEEP, CPU_MESH):
        assert automodel_patch.detect(slug, installed=True).verdict is Verdict.NOT_NEEDED
        assert automodel_patch.detect(slug).verdict is Verdict.NEEDED, "the genuine verdict must ignore the layers"
    automodel_patch.revert()
    for slug in (KEEP, CPU_MESH):
        assert automodel_patch.detect(slug, installed=True).verdict is Verdict.NEEDED


def test_a_probe_that_fails_is_unknown_never_an_exception(mesh_utils: ModuleType) -> None:
    """A function that defeats the probe: the verdict is UNKNOWN with the reason; nothing raises."""

    def raising_override(axes, *, device_type, timeout_minutes):
        raise RuntimeError("needs a GPU to answer")

    workaround = automodel_patch.workaround(KEEP)
    detection = workaround.detect({OVERRIDE_NAME: raising_override})
    assert detection.verdict is Verdict.UNKNOWN
    assert detection.reason.endswith("raised RuntimeError: needs a GPU to answer"), detection.reason


# ----------------------------------------------------------------- the probe's world


def test_simulated_default_group_answers_every_query_and_leaves_nothing_behind() -> None:
    assert not dist.is_initialized()
    world = dist.distributed_c10d._world
    sizes = (len(world.pg_map), len(world.pg_backend_config), len(world.pg_names))
    with simulated_default_group("cuda:nccl,cpu:gloo") as group:
        assert dist.is_initialized()
        assert dist.group.WORLD is group and dist.distributed_c10d._get_default_group() is group
        assert dist.get_backend() == dist.get_backend_config() == "cuda:nccl,cpu:gloo"
        assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
        assert {device.type for device in group._device_types} == {"cuda", "cpu"}
        assert group._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(minutes=1)
    assert not dist.is_initialized()
    assert (len(world.pg_map), len(world.pg_backend_config), len(world.pg_names)) == sizes


def test_simulated_default_group_sets_a_real_default_group_aside_and_restores_it() -> None:
    """A probe after ``init_process_group``: the real group is put back exactly, and still works."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        real = dist.group.WORLD
        with simulated_default_group("gloo") as probe:
            assert dist.group.WORLD is probe is not real
        assert dist.group.WORLD is real
        assert dist.get_backend() == "gloo"
        ones = torch.ones(1)
        dist.all_reduce(ones)
        assert ones.item() == 1.0
        assert automodel_patch.apply(CPU_MESH).to_dict() == {CPU_MESH: "applied"}  # probes with a real group up
        assert dist.group.WORLD is real
    finally:
        dist.destroy_process_group()
