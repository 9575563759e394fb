"""The upstream pull requests in ``automodel_patch/upstream/``, checked offline against the released wheels.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): its entries in APPLIES, the drift test and its checks below go with it.
# AUTOMODEL-WORKAROUND(cpu-mesh-timeout): its entries in APPLIES and its checks below go with it.

CI cannot reach GitHub and Automodel's files are not committed here, so each PR is checked on
what the package index has: its ``mesh_utils.py`` hunks must apply (``git apply --check``) to the
released 0.5.0, 0.6.0 and 0.7.0 sources where :data:`APPLIES` says so; the keep-cpu-backend PR
must carry exactly the change of the fork patch (``automodel_patch/keep-cpu-backend.patch``);
and one spawned two-rank Gloo world imports 0.7.0 with both PRs' ``mesh_utils.py`` changes and
no run-time layer, and must find what the PRs promise. Their tests were run on an Automodel
checkout (the figures are in each PR's description); they are not run here.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import automodel_patch
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from tests.harness.releases import FIXED_FUNCTION_RELEASES, ReleaseUnavailable, release_dir
from tests.harness.skips import unavailable
from tests.ranks.patch import git_apply, source_patched_env

__all__: list[str] = []

pytestmark = pytest.mark.releases

UPSTREAM = Path(automodel_patch.__file__).with_name("upstream")
BASE_COMMIT = "36044ad3d139363fb6c73c24af2e7c6b65ec52f6"
MESH_UTILS = "nemo_automodel/components/distributed/mesh_utils.py"
#: slug -> release -> whether the PR's mesh_utils.py hunks apply to that release's file.
APPLIES = {
    "keep-cpu-backend": {"0.5.0": True, "0.6.0": True, "0.7.0": True},
    # 0.5.0's _unflatten_compat takes no timeout at all (no MoE timeout plumbing to extend to CPU).
    "cpu-mesh-timeout": {"0.5.0": False, "0.6.0": True, "0.7.0": True},
}
WORLD_SIZE = 2
DEFAULT_MINUTES = 45
GLOO_DEFAULT_MINUTES = 30
SPAWN_TIMEOUT_S = 300
_FILE = re.compile(r"^--- a/(\S+)\n\+\+\+ b/\S+\n", re.M)
#: git's header of the next file (``diff --git``, ``index``), left at the end of a file's section.
_NEXT_GIT_HEADER = re.compile(r"^diff --git .*\n(?:(?:index|new file mode|deleted file mode) .*\n)*\Z", re.M)


def _file_diffs(text: str) -> dict[str, str]:
    """``{path: "--- a/path ... hunks"}`` of a unified diff (git's or plain), headers and comments dropped."""
    starts = list(_FILE.finditer(text))
    diffs = {}
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        body = text[match.start() : following.start() if following else len(text)]
        diffs[match.group(1)] = _NEXT_GIT_HEADER.sub("", body)
    return diffs


def _changed_lines(diff: str) -> list[str]:
    """The added and removed lines of every hunk, in order: the change itself, without context or line numbers."""
    lines = diff.splitlines()[2:]
    return [line for line in lines if line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- "))]


def _mesh_utils_diff(slug: str) -> str:
    return _file_diffs((UPSTREAM / f"{slug}.patch").read_text())[MESH_UTILS]


def _release(version: str) -> Path:
    try:
        return release_dir(version)
    except ReleaseUnavailable as e:
        unavailable(f"nemo-automodel {version} unavailable: {e}")


@pytest.mark.parametrize("slug", list(APPLIES))
def test_each_pr_has_a_description_and_names_its_base(slug: str) -> None:
    patch = (UPSTREAM / f"{slug}.patch").read_text()
    description = (UPSTREAM / f"{slug}.md").read_text()
    assert BASE_COMMIT in patch.split("diff --git", 1)[0], f"{slug}.patch does not name its base commit"
    assert set(_file_diffs(patch)) == {MESH_UTILS, "tests/unit_tests/distributed/test_mesh_utils.py"}
    for section in ("## Problem", "## Fix", "## Test plan"):
        assert section in description, f"{slug}.md has no {section!r} section"


def test_fork_patch_carries_the_upstream_change() -> None:
    """One fix in one place: the fork patch for 0.5.0 to 0.7.0 changes mesh_utils.py exactly as the PR does."""
    fork = _file_diffs(automodel_patch.SOURCE_PATCH.read_text())
    assert set(fork) == {MESH_UTILS}, f"the fork patch touches {sorted(fork)}"
    upstream, forked = _changed_lines(_mesh_utils_diff("keep-cpu-backend")), _changed_lines(fork[MESH_UTILS])
    assert upstream, "the upstream keep-cpu-backend.patch changes nothing in mesh_utils.py"
    assert forked == upstream, (
        "automodel_patch/keep-cpu-backend.patch and automodel_patch/upstream/keep-cpu-backend.patch drifted apart:\n"
        + "\n".join(f"fork: {a!r}\nPR:   {b!r}" for a, b in zip(forked, upstream, strict=False) if a != b)
        + f"\n(fork {len(forked)} changed lines, PR {len(upstream)})"
    )


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
@pytest.mark.parametrize("slug", list(APPLIES))
def test_mesh_utils_hunks_apply_to_release(slug: str, version: str, tmp_path: Path) -> None:
    patch = tmp_path / f"{slug}-mesh_utils.patch"
    patch.write_text(_mesh_utils_diff(slug))
    root = tmp_path / version
    shutil.copytree(_release(version), root)
    done = git_apply(root, patch, "--check")
    if APPLIES[slug][version]:
        assert done.returncode == 0, f"{slug}'s mesh_utils.py hunks do not apply to {version}: {done.stderr.strip()}"
    else:
        assert done.returncode != 0 and "patch does not apply" in done.stderr, (slug, version, done.stderr)


@pytest.fixture(scope="module")
def upstream_world(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every rank's facts from 0.7.0 with both PRs' mesh_utils.py changes (one spawn of two Gloo ranks)."""
    root = tmp_path_factory.mktemp("upstream") / "0.7.0"
    shutil.copytree(_release("0.7.0"), root)
    for slug in APPLIES:
        patch = root.parent / f"{slug}.patch"
        patch.write_text(_mesh_utils_diff(slug))
        done = git_apply(root, patch)
        assert done.returncode == 0, f"git apply {slug} on 0.7.0 failed: {done.stderr.strip()}"
    scenario = {"name": "native", "patched": False, "ep_size": 2, "timeout_minutes": DEFAULT_MINUTES}
    results = spawn_ranks(
        "tests.ranks.patch:upstream_patched_facts",
        {"default_minutes": DEFAULT_MINUTES, "scenarios": [scenario]},
        world_size=WORLD_SIZE,
        timeout_s=SPAWN_TIMEOUT_S,
        env=source_patched_env(root),
    )
    return [r.result for r in results]


@pytest.mark.multiprocess
def test_keep_cpu_backend_pr_never_raises_and_keeps_the_default_groups_backend(upstream_world) -> None:
    one_minute = {"backend": "nccl", "timeout_s": 60.0}
    for report in upstream_world:
        # Automodel's own unit tests' world: initialized as far as is_initialized() says, no default group.
        assert report["no_default_group"] == {"raised": None, "override": {"dp_shard": one_minute, "tp": one_minute}}
        # On a real default group the backend string is that group's (a GPU run's "cuda:nccl,cpu:gloo" is in
        # test_gpu.py); this machine's default group is plain gloo.
        assert report["default_group_backend"] == report["backend"] == "gloo"
        assert report["cuda_axes_on_real_group"] == {
            axis: {**one_minute, "backend": "gloo"} for axis in ("dp_shard", "tp")
        }


@pytest.mark.multiprocess
def test_cpu_mesh_timeout_pr_gives_every_sub_group_the_timeout(upstream_world) -> None:
    dropped = [r["device_mesh"]["read_back_s"] for r in upstream_world if not r["device_mesh"]["passes_timeout"]]
    if dropped:
        pytest.skip(
            f"torch {torch.__version__}'s DeviceMesh passes no timeout to a Gloo sub-group (measured: a 7 s "
            f"override read back as {dropped[0]:g} s), so no override can reach one; the PR says so"
        )
    for report in upstream_world:
        built = report["scenarios"]["native"]
        assert built["apply"] is None and not built["is_applied"], "a run-time layer was in force"
        groups = built["groups"]
        size_one = sorted(name for name, facts in groups.items() if facts["size"] == 1)
        assert size_one == ["cp", "dp_replicate", "moe.ep_shard", "pp", "tp"], size_one
        for name, facts in groups.items():
            assert facts["backends"].get("cpu") == "gloo", (name, facts)
            assert facts["timeout_s"]["cpu"] == DEFAULT_MINUTES * 60, (
                f"{name}: {facts['timeout_s']['cpu'] / 60:g} min, expected {DEFAULT_MINUTES} "
                f"(genuine 0.7.0 leaves sub-groups at gloo's {GLOO_DEFAULT_MINUTES})"
            )
            assert facts["all_reduce"] == facts["size"], (name, facts)
