"""The NeMo RL pull request in ``nemo_rl_shim/upstream/``, checked offline.

NeMo RL's source is not committed here and CI cannot fetch it, so this checks what it can
without it: the four patches are well-formed git diffs, in order, each touching the files its
description names; the test patch applies on its own to an empty tree (it only adds a file);
every config hunk adds the same three lines, to example configs and to their reference
snapshots alike; and the names the series imports from this project exist, with the
validation messages its tests expect. The series itself is run inside NeMo RL, on NeMo RL's
own tests and on 4 CPU ranks, by ``scripts/nemo_rl_check.py`` (figures in the PR description).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest

import nemo_rl_shim
from nemo_rl_shim.config import distributed_timeout_minutes

__all__: list[str] = []

UPSTREAM = Path(nemo_rl_shim.__file__).with_name("upstream")
SERIES = sorted(UPSTREAM.glob("0*.patch"))
GIT_TIMEOUT_S = 60
SETUP = "nemo_rl/models/automodel/setup.py"
#: patch number -> the files it touches.
TOUCHES = {
    1: {
        "nemo_rl/models/policy/__init__.py",
        "nemo_rl/models/value/config.py",
        "nemo_rl/models/value/workers/dtensor_value_worker_v2.py",
        "pyproject.toml",
        SETUP,
    },
    2: {SETUP},
    4: {"tests/unit/models/automodel/test_automodel_distributed_timeout.py"},
}
CONFIG_LINES = (
    "# Automodel path (dtensor_cfg._v2): timeout of the default and every mesh sub-group, in minutes; "
    "null keeps torch's defaults",
    "automodel_cfg:",
    "distributed_timeout_minutes: null",
)


def _numstat(patch: Path) -> dict[str, tuple[int, int]]:
    done = subprocess.run(
        ["git", "apply", "--numstat", str(patch)], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{patch.name} is not a diff git can read: {done.stderr.strip()}"
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    return {path: (int(added), int(removed)) for added, removed, path in rows}


def _added_lines(patch: Path) -> list[str]:
    return [line[1:] for line in patch.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]


def test_series_is_four_patches_in_order() -> None:
    assert [p.name[:4] for p in SERIES] == ["0001", "0002", "0003", "0004"], [p.name for p in SERIES]
    for patch in SERIES:
        assert "7ea279abf" in patch.read_text().split("diff --git", 1)[0], f"{patch.name} names no base commit"


@pytest.mark.parametrize("number", sorted(TOUCHES))
def test_patch_touches_the_files_it_should(number: int) -> None:
    assert set(_numstat(SERIES[number - 1])) == TOUCHES[number]


def test_config_patch_adds_the_key_to_examples_and_their_snapshots() -> None:
    stats = _numstat(SERIES[2])
    examples = {p for p in stats if p.startswith("examples/configs/")}
    snapshots = {p for p in stats if p.startswith("tests/unit/reference_configs/")}
    assert len(examples) >= 4 and len(snapshots) >= 4, stats
    assert set(stats) == examples | snapshots, f"0003 touches more than configs: {sorted(set(stats) - examples)}"
    assert all(removed == 0 for _, removed in stats.values()), stats
    added = [line.strip() for line in _added_lines(SERIES[2])]
    blocks = len(added) // len(CONFIG_LINES)
    assert added == list(CONFIG_LINES) * blocks, added
    assert blocks >= 5, f"only {blocks} automodel_cfg blocks added"


def test_test_patch_applies_alone_to_an_empty_tree(tmp_path: Path) -> None:
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    done = subprocess.run(
        ["git", "apply", str(SERIES[3])], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=GIT_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    test_file = tmp_path / next(iter(TOUCHES[4]))
    text = test_file.read_text()
    assert text.count("@pytest.mark.automodel") >= 3, "the new tests must be in NeMo RL's automodel lane"
    compile(text, str(test_file), "exec")


def test_names_the_series_imports_from_this_project_exist() -> None:
    added = "\n".join(_added_lines(SERIES[0]) + _added_lines(SERIES[1]))
    imported = re.findall(r"from (nemo_rl_shim[.\w]*) import \(?\s*(\w+)", added)
    imported += [("automodel_patch", name) for name in re.findall(r"automodel_patch\.(\w+)\(", added)]
    assert {module for module, _ in imported} >= {"nemo_rl_shim.config", "nemo_rl_shim.mesh_timeouts"}, imported
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"the series imports {module}.{name}, which is gone"


@pytest.mark.parametrize("value", [0, -5, True, "45"])
def test_messages_the_series_tests_expect(value: object) -> None:
    expected = f"policy.automodel_cfg.distributed_timeout_minutes must be a positive number of minutes, got {value!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
        distributed_timeout_minutes({"distributed_timeout_minutes": value}, "policy.automodel_cfg")
