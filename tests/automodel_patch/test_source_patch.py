"""The source patch ``automodel_patch/keep-cpu-backend.patch`` against the real releases.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): these tests go with the source patch.

Each release's cached sources are copied and patched with ``git apply`` (and dry-run with
``patch -p1``); a spawned process then imports the patched copy ahead of the installed
release (:mod:`tests.harness.release_facts`) and must find the CPU half kept with no run-time
patching at all, while the CPU-mesh timeout, which the patch leaves alone as upstream's fix
is expected to, is still applied.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import automodel_patch
from tests.harness.release_facts import SOURCE_PATCH_SUFFIX
from tests.harness.releases import FIXED_FUNCTION_RELEASES, LEGACY_RELEASES, ReleaseUnavailable, release_dir
from tests.harness.skips import unavailable
from tests.ranks.patch import GIT_APPLY_TIMEOUT_S, git_apply

__all__: list[str] = []

pytestmark = pytest.mark.releases

MESH_UTILS = Path("nemo_automodel/components/distributed/mesh_utils.py")
PATCH_BINARY = shutil.which("patch")
NEEDS_PATCH_BINARY = pytest.mark.skipif(
    PATCH_BINARY is None, reason="the `patch` binary is not on PATH (shutil.which('patch') returned None)"
)


def _release(version: str) -> Path:
    try:
        return release_dir(version)
    except ReleaseUnavailable as e:
        unavailable(f"nemo-automodel {version} unavailable: {e}")


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_git_applied_release_keeps_cpu_half_natively(version: str, release_facts) -> None:
    facts = release_facts(f"{version}{SOURCE_PATCH_SUFFIX}")
    patched = Path(facts["root"])
    original = (_release(version) / MESH_UTILS).read_text()
    assert (patched / MESH_UTILS).read_text() != original, "git apply changed nothing"
    assert Path(facts["mesh_utils_file"]).is_relative_to(patched), facts["mesh_utils_file"]
    assert facts["installed_version"] == version
    keep, cpu_mesh = facts["genuine"]["keep-cpu-backend"], facts["genuine"]["cpu-mesh-timeout"]
    assert keep["verdict"] == "not_needed", f"the source-patched {version} still drops the CPU half: {keep}"
    assert cpu_mesh["verdict"] == "needed", cpu_mesh
    assert facts["apply"] == {"keep-cpu-backend": "not_needed", "cpu-mesh-timeout": "applied"}
    assert "keep-cpu-backend" not in facts["active_after"]


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
