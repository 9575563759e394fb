"""The source patch ``automodel_patch/keep-cpu-backend.patch`` against the real releases.

Each release's cached sources are copied to ``tmp_path`` and patched with
``git apply`` (and dry-run with ``patch -p1``); a spawned process then imports
the patched copy ahead of the installed release and must find the CPU half kept
with no run-time patching at all.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import automodel_patch
from nemo_rl_shim.launch import spawn_ranks
from tests.releases import FIXED_FUNCTION_RELEASES, LEGACY_RELEASES, ReleaseUnavailable, release_dir
from tests.workers_patch import GIT_APPLY_TIMEOUT_S, git_apply, patched_release_copy, source_patched_env

__all__: list[str] = []

pytestmark = pytest.mark.releases

SPAWN_TIMEOUT_S = 300
MESH_UTILS = Path("nemo_automodel/components/distributed/mesh_utils.py")
PATCH_BINARY = shutil.which("patch")
NEEDS_PATCH_BINARY = pytest.mark.skipif(
    PATCH_BINARY is None, reason="the `patch` binary is not on PATH (shutil.which('patch') returned None)"
)


def _release(version: str) -> Path:
    try:
        return release_dir(version)
    except ReleaseUnavailable as e:
        pytest.skip(f"nemo-automodel {version} unavailable: {e}")


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_git_applied_release_keeps_cpu_half_natively(version: str, tmp_path: Path) -> None:
    release = _release(version)
    patched = patched_release_copy(release, tmp_path / version, automodel_patch.SOURCE_PATCH)
    assert (patched / MESH_UTILS).read_text() != (release / MESH_UTILS).read_text(), "git apply changed nothing"

    (result,) = spawn_ranks(
        "tests.workers_patch:patch_report",
        {},
        world_size=1,
        timeout_s=SPAWN_TIMEOUT_S,
        env=source_patched_env(patched),
    )
    report = result.result
    assert Path(report["mesh_utils_file"]).is_relative_to(patched), report["mesh_utils_file"]
    assert report["installed_version"] == version
    assert report["is_supported"] is True
    assert report["keeps_before"] is True, f"the source-patched {version} still drops the CPU half"
    assert report["is_applied_before"] is False
    assert report["apply"] == automodel_patch.ApplyStatus.NOT_NEEDED.value
    assert report["is_applied_after"] is False
    assert report["patched_names"] == []
    assert report["module_unchanged_after_apply"] is True


@NEEDS_PATCH_BINARY
@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_patch_p1_applies_cleanly(version: str, tmp_path: Path) -> None:
    root = tmp_path / version
    shutil.copytree(_release(version), root)
    done = subprocess.run(
        [PATCH_BINARY, "-p1", "--dry-run", "--force", "-i", str(automodel_patch.SOURCE_PATCH)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=GIT_APPLY_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"patch -p1 --dry-run failed on {version} (exit {done.returncode}): {done.stdout}"
    assert f"checking file {MESH_UTILS}" in done.stdout, done.stdout
    # A line offset is fine (0.5.0's function sits 33 lines earlier); fuzz would mean the context differs.
    assert "fuzz" not in done.stdout and "FAILED" not in done.stdout, f"patch needed fuzz on {version}: {done.stdout}"


@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_patch_does_not_apply_to_legacy_release(version: str) -> None:
    done = git_apply(_release(version), automodel_patch.SOURCE_PATCH, "--check")
    assert done.returncode != 0, f"keep-cpu-backend.patch unexpectedly applies to {version}"
    assert "patch does not apply" in done.stderr, done.stderr
