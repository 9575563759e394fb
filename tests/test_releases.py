"""The run-time fork fix against every release 0.3.0 ... 0.7.0, one spawned process per release.

Each release's real sources shadow the installed one on ``PYTHONPATH``
(:func:`tests.releases.release_env`); the worker reports what
``automodel_patch`` detects and does there. No process group is needed: the
detection probe only *reports* a composite default group (see
``automodel_patch._detect``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import automodel_patch
from nemo_rl_shim.launch import spawn_ranks
from tests.releases import FIXED_FUNCTION_RELEASES, LEGACY_RELEASES, ReleaseUnavailable, release_dir
from tests.workers_patch import patched_release_copy, source_patched_env

__all__: list[str] = []

pytestmark = pytest.mark.releases

SPAWN_TIMEOUT_S = 300
WORKER = "tests.workers_patch:patch_report"
#: Names apply() replaces: 0.5.0's _unflatten_compat takes no timeout_minutes, so it is left alone there.
PATCHED_NAMES = {
    "0.5.0": {"_nccl_backend_override", "init_device_mesh"},
    "0.6.0": {"_nccl_backend_override", "init_device_mesh", "_unflatten_compat"},
    "0.7.0": {"_nccl_backend_override", "init_device_mesh", "_unflatten_compat"},
}
#: The release whose source-patched copy gives the NOT_NEEDED row: the locked one.
NOT_NEEDED_RELEASE = "0.7.0"


def _report(env: dict[str, str]) -> dict[str, Any]:
    (result,) = spawn_ranks(WORKER, {}, world_size=1, timeout_s=SPAWN_TIMEOUT_S, env=env)
    return result.result


def _assert_imported_from(report: dict[str, Any], root: Path) -> None:
    assert Path(report["mesh_utils_file"]).is_relative_to(root), (
        f"the worker imported {report['mesh_utils_file']}, not the copy under {root}"
    )


@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_release_is_unsupported(version: str, release_environment) -> None:
    report = _report(release_environment(version))
    _assert_imported_from(report, release_dir(version))
    assert report["installed_version"] == version
    assert report["is_supported"] is False
    assert report["build_accepts_timeout"] is False
    assert report["keeps_before"] is False
    assert report["apply"] == report["apply_again"] == automodel_patch.ApplyStatus.UNSUPPORTED.value
    assert report["is_applied_after"] is False
    assert report["patched_names"] == []
    assert report["module_unchanged_after_apply"] is True, f"apply() changed mesh_utils of {version}"
    assert report["revert"] is False
    messages = [w["message"] for w in report["warnings"]]
    assert len(messages) == 1, f"expected the unsupported warning once for two apply() calls, got {messages}"
    assert report["warnings"][0]["category"] == "RuntimeWarning"
    assert version in messages[0] and "nothing was changed" in messages[0], messages[0]


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_fixed_function_release_is_patched(version: str, release_environment) -> None:
    report = _report(release_environment(version))
    _assert_imported_from(report, release_dir(version))
    assert report["installed_version"] == version
    assert report["is_supported"] is True
    assert report["build_accepts_timeout"] is True
    assert report["keeps_before"] is False, f"{version} unexpectedly keeps the CPU half"
    assert report["is_applied_before"] is False
    assert report["apply"] == automodel_patch.ApplyStatus.APPLIED.value
    assert report["apply_again"] == automodel_patch.ApplyStatus.ALREADY_APPLIED.value
    assert report["is_applied_after"] is True
    assert set(report["patched_names"]) == PATCHED_NAMES[version]
    assert report["keeps_after"] is True
    assert report["revert"] is True
    assert report["revert_again"] is False
    assert report["module_restored_after_revert"] is True
    assert report["keeps_after_revert"] is False
    assert report["warnings"] == []


def test_source_patched_release_is_not_needed(tmp_path: Path) -> None:
    try:
        release = release_dir(NOT_NEEDED_RELEASE)
    except ReleaseUnavailable as e:
        pytest.skip(f"nemo-automodel {NOT_NEEDED_RELEASE} unavailable: {e}")
    patched = patched_release_copy(release, tmp_path / NOT_NEEDED_RELEASE, automodel_patch.SOURCE_PATCH)
    report = _report(source_patched_env(patched))
    _assert_imported_from(report, patched)
    assert report["installed_version"] == NOT_NEEDED_RELEASE
    assert report["keeps_before"] is True
    assert report["apply"] == report["apply_again"] == automodel_patch.ApplyStatus.NOT_NEEDED.value
    assert report["is_applied_after"] is False
    assert report["patched_names"] == []
    assert report["module_unchanged_after_apply"] is True
    assert report["revert"] is False
    assert report["warnings"] == []
