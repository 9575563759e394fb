"""The decision table, each row checked against the real release it describes.

Every release runs in its own spawned process whose ``PYTHONPATH`` puts that
release's sources ahead of the installed one (``tests.releases``). The worker
computes ``decide()`` for {timeout None, 45} x {GPU mesh, CPU mesh} x {cpu_offload} x {patch_automodel},
applies the fork fix, and computes it again. The "natively keeps the CPU half"
row runs against 0.7.0 with ``automodel_patch/keep-cpu-backend.patch`` applied
to a copy of its sources. The legacy pins (0.3.0, 0.4.0) also go through
``setup_distributed`` for real on two Gloo ranks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import automodel_patch
from nemo_rl_shim.decision import Action
from nemo_rl_shim.launch import spawn_ranks
from tests.releases import ALL_RELEASES, FIXED_FUNCTION_RELEASES, LEGACY_RELEASES, REPO_ROOT, release_dir

pytestmark = pytest.mark.releases

SPAWN_TIMEOUT_S = 300
TIMEOUT = 45
LEGACY_WARNING = "sub-groups keep torch's default"
#: torch's default for Gloo groups, which is all a CPU-only machine builds.
GLOO_DEFAULT_MINUTES = 30.0
LEGACY_SCENARIOS = [
    {"name": "dp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {}},
    {"name": "tp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {"tensor_parallel_size": 2}},
]

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not found on PATH: needed for `git apply`")


def _rank0(results: list[Any]) -> dict[str, Any]:
    return results[0].result


@pytest.fixture(scope="module")
def release_run(release_environment):
    """``release_run(version)`` -> the worker's facts for that release, spawned once per module."""
    cache: dict[str, dict[str, Any]] = {}

    def run(version: str) -> dict[str, Any]:
        if version not in cache:
            env = release_environment(version)
            params: dict[str, Any] = {"timeouts": [None, TIMEOUT]}
            if version in LEGACY_RELEASES:
                params |= {"scenarios": LEGACY_SCENARIOS}
                results = spawn_ranks(
                    "tests.workers_setup:legacy_pin", params, world_size=2, timeout_s=SPAWN_TIMEOUT_S, env=env
                )
                cache[version] = _rank0(results)
            else:
                results = spawn_ranks(
                    "tests.workers_setup:decision_matrix", params, world_size=1, timeout_s=SPAWN_TIMEOUT_S, env=env
                )
                cache[version] = {"matrix": _rank0(results)}
        return cache[version]

    return run


def _rows(rows: list[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    picked = [row for row in rows if all(row[key] == value for key, value in where.items())]
    assert picked, f"no row with {where}"
    return picked


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_runs_against_the_named_release(version: str, release_run) -> None:
    matrix = release_run(version)["matrix"]
    assert matrix["version"] == version
    assert matrix["mesh_utils_file"].startswith(str(release_dir(version))), matrix["mesh_utils_file"]


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_no_timeout_is_no_timeout_everywhere(version: str, release_run) -> None:
    matrix = release_run(version)["matrix"]
    for row in _rows(matrix["before"], timeout=None) + _rows(matrix["after"], timeout=None):
        assert row["action"] == Action.NO_TIMEOUT.value, row
        assert row["warning"] is None and row["forward_minutes"] is None, row


@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_pin_forwards_to_the_default_group_only_with_a_warning(version: str, release_run) -> None:
    matrix = release_run(version)["matrix"]
    assert matrix["apply_status"] == automodel_patch.ApplyStatus.UNSUPPORTED.value
    assert any("cannot apply" in w for w in matrix["apply_warnings"]), matrix["apply_warnings"]
    for row in _rows(matrix["before"], timeout=TIMEOUT) + _rows(matrix["after"], timeout=TIMEOUT):
        assert row["action"] == Action.DEFAULT_GROUP_ONLY.value, row
        assert f"{TIMEOUT} min" in row["warning"] and LEGACY_WARNING in row["warning"], row
        assert row["forward_minutes"] is None, row


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
@pytest.mark.parametrize("cpu_mesh", [False, True], ids=["gpu-mesh", "cpu-mesh"])
def test_dropping_release_before_the_fix_under_cpu_offload(version: str, cpu_mesh: bool, release_run) -> None:
    before = release_run(version)["matrix"]["before"]
    (patched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=cpu_mesh, cpu_offload=True, patch_automodel=True)
    assert patched["action"] == Action.PATCH_AND_FORWARD.value, patched
    assert patched["forward_minutes"] == TIMEOUT and patched["warning"] is None, patched
    (refused,) = _rows(before, timeout=TIMEOUT, cpu_mesh=cpu_mesh, cpu_offload=True, patch_automodel=False)
    assert refused["action"] == Action.NOT_FORWARDED.value, refused
    assert refused["forward_minutes"] is None, refused
    assert "policy.automodel_cfg.patch_automodel is false" in refused["warning"], refused


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_dropping_release_without_cpu_offload_on_a_gpu_mesh_forwards(version: str, release_run) -> None:
    """NCCL default group, no CPU offload: upstream's NCCL-only sub-groups lose nothing."""
    before = release_run(version)["matrix"]["before"]
    for row in _rows(before, timeout=TIMEOUT, cpu_mesh=False, cpu_offload=False):
        assert row["action"] == Action.FORWARD.value, row
        assert "CPU offload is off" in row["reason"] and row["warning"] is None, row
        assert row["forward_minutes"] == TIMEOUT, row


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_dropping_release_without_cpu_offload_on_a_cpu_mesh_patches(version: str, release_run) -> None:
    """Plain gloo default group: upstream passes no timeout to sub-groups, so the fix is applied there too."""
    before = release_run(version)["matrix"]["before"]
    (patched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=True, cpu_offload=False, patch_automodel=True)
    assert patched["action"] == Action.PATCH_AND_FORWARD.value, patched
    assert "CPU (gloo) mesh" in patched["reason"] and patched["warning"] is None, patched
    (unpatched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=True, cpu_offload=False, patch_automodel=False)
    assert unpatched["action"] == Action.FORWARD.value, unpatched
    assert unpatched["forward_minutes"] == TIMEOUT, unpatched
    assert "gloo's 30-minute default" in unpatched["warning"], unpatched


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_dropping_release_after_the_fix_forwards_everywhere(version: str, release_run) -> None:
    matrix = release_run(version)["matrix"]
    assert matrix["apply_status"] == automodel_patch.ApplyStatus.APPLIED.value
    for row in _rows(matrix["after"], timeout=TIMEOUT):
        assert row["action"] == Action.FORWARD.value, row
        assert "after the fork fix" in row["reason"], row
        assert row["forward_minutes"] == TIMEOUT and row["warning"] is None, row


@needs_git
def test_source_patched_release_keeps_the_cpu_half_natively(release_environment, tmp_path: Path) -> None:
    """0.7.0 with keep-cpu-backend.patch applied to its sources: forward, "natively", even under CPU offload."""
    release_environment("0.7.0")  # skips with the reason if the release cannot be fetched
    patched = tmp_path / "automodel-0.7.0-patched"
    shutil.copytree(release_dir("0.7.0"), patched)
    applied = subprocess.run(
        ["git", "apply", str(automodel_patch.SOURCE_PATCH)],
        cwd=patched,
        # Never treat an enclosing repository as the root: its paths would not match the patch's.
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    mesh_utils = patched / "nemo_automodel" / "components" / "distributed" / "mesh_utils.py"
    assert mesh_utils.read_text(encoding="utf-8") != (release_dir("0.7.0") / mesh_utils.relative_to(patched)).read_text(
        encoding="utf-8"
    ), "git apply exited 0 but changed nothing"
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(patched), str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    results = spawn_ranks(
        "tests.workers_setup:decision_matrix",
        {"timeouts": [None, TIMEOUT]},
        world_size=1,
        timeout_s=SPAWN_TIMEOUT_S,
        env=env,
    )
    matrix = _rank0(results)
    assert matrix["version"] == "0.7.0"
    assert matrix["mesh_utils_file"].startswith(str(patched)), matrix["mesh_utils_file"]
    assert matrix["apply_status"] == automodel_patch.ApplyStatus.NOT_NEEDED.value
    for row in _rows(matrix["before"], timeout=TIMEOUT) + _rows(matrix["after"], timeout=TIMEOUT):
        assert row["action"] == Action.FORWARD.value, row
        assert "natively" in row["reason"], row
        assert row["forward_minutes"] == TIMEOUT and row["warning"] is None, row


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_pin_setup_distributed_on_two_gloo_ranks(version: str, release_run) -> None:
    """Default group gets the timeout; the mesh is built the legacy way; one warning; size-1 sub-groups keep 30 min."""
    setup = release_run(version)["setup"]
    assert setup["version"] == version
    assert setup["build_accepts_timeout"] is False
    assert [s["name"] for s in setup["scenarios"]] == [s["name"] for s in LEGACY_SCENARIOS]
    for scenario in setup["scenarios"]:
        name = scenario["name"]
        assert scenario["decision"]["action"] == Action.DEFAULT_GROUP_ONLY.value, name
        assert scenario["mesh_builders"] == {"create_device_mesh": 1}, (name, scenario["mesh_builders"])
        legacy_warnings = [w for w in scenario["runtime_warnings"] if LEGACY_WARNING in w]
        assert len(legacy_warnings) == 1, (name, scenario["runtime_warnings"])
        groups = scenario["groups"]
        assert groups["default"]["timeout_minutes"]["cpu"] == TIMEOUT, (name, groups["default"])
        sub_groups = {g: facts for g, facts in groups.items() if not facts["is_default_group"]}
        assert sub_groups, f"{name}: every axis reused the default group; nothing shows the sub-group timeout"
        for group, facts in groups.items():
            assert facts["backends"]["cpu"] == "gloo", (name, group, facts)
            assert facts["all_reduce"] == facts["size"], (name, group, facts)
            expected = GLOO_DEFAULT_MINUTES if group in sub_groups else TIMEOUT
            assert facts["timeout_minutes"]["cpu"] == expected, (name, group, facts)
            if group in sub_groups:
                assert facts["size"] == 1, (name, group, facts)
