"""Remove each workaround as its removal steps say, and the library still describes the run truthfully.

For each registered workaround: a copy of ``automodel_patch`` and ``nemo_rl_shim`` in which its
places inside those packages are done as listed (a file "delete the file" is deleted; elsewhere
the lines carrying its tag go, as ``automodel_patch/__init__.py``'s "delete the tagged lines" says).
The copy's library then runs on the installed nemo-automodel 0.7.0, where both workarounds are
still needed, in a fresh interpreter (:mod:`tests.scripts.removal_facts`). Nothing may name the removed
workaround, and no run whose default group it concerned may be told something false about it: a
CPU-offload run without ``keep-cpu-backend`` must not read "CPU offload is off: the default group
is nccl". The other workaround's decisions stay exactly as in the full project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import automodel_patch
from automodel_patch import Workaround
from tests.harness.releases import REPO_ROOT

__all__: list[str] = []

STEP_TIMEOUT_S = 180
_PACKAGES = ("automodel_patch", "nemo_rl_shim")


def _remove(workaround: Workaround, copy: Path) -> list[str]:
    """Do ``workaround``'s steps that fall inside the two packages; return what was done."""
    done = []
    for place, what in sorted(workaround.places.items()):
        if not place.startswith(tuple(f"{p}/" for p in _PACKAGES)):
            continue  # tests, README, upstream PRs: not part of what a run imports
        path = copy / place
        if "delete the file" in what:
            path.unlink()
            done.append(f"deleted {place}")
        else:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if workaround.tag not in line]
            assert len(kept) < len(lines), f"{place}: no line carries {workaround.tag}"
            path.write_text("".join(kept), encoding="utf-8")
            done.append(f"{place}: {len(lines) - len(kept)} tagged lines deleted")
    return done


def _library_facts(pythonpath: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(REPO_ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.scripts.removal_facts"],
        capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=env, cwd=pythonpath, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def full() -> dict[str, Any]:
    return _library_facts(REPO_ROOT)


@pytest.fixture(scope="module")
def removed(tmp_path_factory):
    cache: dict[str, tuple[list[str], dict[str, Any]]] = {}

    def get(workaround: Workaround) -> tuple[list[str], dict[str, Any]]:
        if workaround.slug not in cache:
            copy = tmp_path_factory.mktemp(f"without-{workaround.slug}")
            for package in _PACKAGES:
                shutil.copytree(REPO_ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
            done = _remove(workaround, copy)
            facts = _library_facts(copy)
            assert Path(facts["automodel_patch_file"]).is_relative_to(copy), facts["automodel_patch_file"]
            cache[workaround.slug] = (done, facts)
        return cache[workaround.slug]

    return get


def _texts(facts: dict[str, Any]) -> str:
    return json.dumps(facts["decisions"]) + json.dumps(facts["status"]) + facts["status_text"]


@pytest.mark.parametrize("workaround", automodel_patch.WORKAROUNDS, ids=lambda w: w.slug)
def test_after_removal_nothing_names_it_and_its_runs_are_told_the_truth(workaround: Workaround, full, removed) -> None:
    done, facts = removed(workaround)
    assert any(step.startswith("deleted automodel_patch/") for step in done), done
    others = [w.slug for w in automodel_patch.WORKAROUNDS if w is not workaround]
    assert facts["registered"] == others, (done, facts["registered"])
    assert workaround.slug not in _texts(facts)
    for text in (workaround.problem, workaround.fixed, workaround.without_it):
        assert text not in _texts(facts), text
    for row, before in zip(facts["decisions"], full["decisions"], strict=True):
        assert (row["run"], row["patch_automodel"]) == (before["run"], before["patch_automodel"])
        concerned = row["default_backend"] in workaround.default_backends
        if not concerned:  # the other runs: decided exactly as before, less the removed workaround's state
            kept = [state for state in before["workarounds"] if state["slug"] != workaround.slug]
            assert row == {**before, "workarounds": kept}, (row, before)
            continue
        # Nothing is patched any more, and nothing false is said about the run's default group (today's
        # code falls through to "CPU offload is off: the default group is nccl" for a CPU-offload run).
        assert (row["action"], row["patches"], row["warning"]) == ("forward", [], None), row
        assert row["every_group"] is True, row
        assert row["reason"] == (
            f"no workaround concerns a {row['default_backend']} default group: the timeout goes to MeshContext.build "
            "as is"
        ), row
