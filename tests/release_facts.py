"""One spawn per Automodel release for the whole test session: what ``automodel_patch`` and ``decide`` make of it.

Several modules (the release matrix, the decision table, the source patch) read the facts
of the same releases. :func:`facts_for` spawns :func:`tests.workers_release.release_facts`
once per release and keeps its JSON in a folder every pytest-xdist worker of the session
shares, under a file lock, so no release is spawned twice.

A release is named by its version (``"0.7.0"``), a fixture version
(``"0.7.0+fixed.getbackend"``, :mod:`tests.fixture_wheels`), or ``"<version>+sourcepatch"``
for that release with ``automodel_patch/keep-cpu-backend.patch`` applied to a copy.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import automodel_patch
from nemo_rl_shim.cli.launch import spawn_ranks
from tests.releases import REPO_ROOT, release_dir
from tests.workers_patch import patched_release_copy

__all__ = ["SOURCE_PATCH_SUFFIX", "facts_for", "source_root"]

SOURCE_PATCH_SUFFIX = "+sourcepatch"
SPAWN_TIMEOUT_S = 300


def source_root(name: str, work: Path) -> Path:
    """The folder whose sources stand for ``name`` (building a source-patched copy under ``work`` if asked)."""
    if name.endswith(SOURCE_PATCH_SUFFIX):
        version = name.removesuffix(SOURCE_PATCH_SUFFIX)
        copy = work / f"sourcepatch-{version}"
        if not copy.exists():
            patched_release_copy(release_dir(version), copy, automodel_patch.SOURCE_PATCH)
        return copy
    return release_dir(name)


def facts_for(name: str, shared: Path) -> dict[str, Any]:
    """The facts of release ``name``, spawned at most once per session (``shared``: the session's folder)."""
    shared.mkdir(parents=True, exist_ok=True)
    cached = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cached.exists():
            root = source_root(name, shared)
            path = (str(root), str(REPO_ROOT), os.environ.get("PYTHONPATH"))
            env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
            (result,) = spawn_ranks(
                "tests.workers_release:release_facts", {}, world_size=1, timeout_s=SPAWN_TIMEOUT_S, env=env
            )
            cached.write_text(json.dumps({"root": str(root), **result.result}))
    return json.loads(cached.read_text())
