"""What ``automodel_patch`` and ``decide`` make of every Automodel release, computed once per test session.

Several modules (the release matrix, the decision table, the source patch) read the facts of
the same releases. :func:`facts_for` computes them once per session and keeps the JSON in a
folder every pytest-xdist worker of the session shares, under a file lock.

One spawned process imports the releases in turn (:func:`tests.ranks.release.release_facts_in_turn`):
torch is imported once, and before each release every ``nemo_automodel`` module is dropped
from ``sys.modules`` and that release's folder goes first on ``sys.path``. Importing torch and
its distributed packages is most of a process's start (about 8 s here); a release's own
modules then import in about 0.1 s. ``test_releases.py`` checks that the facts of a release
imported late in that process equal those of a fresh process of its own.

A release is named by its version (``"0.7.0"``), a fixture version
(``"0.7.0+fixed.getbackend"``, :mod:`tests.harness.fixture_wheels`), or ``"<version>+sourcepatch"``
for that release with ``automodel_patch/keep-cpu-backend.patch`` applied to a copy.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import automodel_patch
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from tests.harness.fixture_wheels import STYLES, fixture_version
from tests.harness.paths import REPO_ROOT
from tests.harness.releases import ALL_RELEASES, FIXED_FUNCTION_RELEASES, release_dir
from tests.ranks.patch import patched_release_copy

__all__ = ["SOURCE_PATCH_SUFFIX", "STANDARD", "facts_for", "fresh_process_facts", "source_root"]

SOURCE_PATCH_SUFFIX = "+sourcepatch"
SPAWN_TIMEOUT_S = 300
#: Every release the suite reads, computed together on the first request.
STANDARD = (
    *ALL_RELEASES,
    *(fixture_version(style) for style in STYLES),
    *(f"{v}{SOURCE_PATCH_SUFFIX}" for v in FIXED_FUNCTION_RELEASES),
)


def source_root(name: str, work: Path) -> Path:
    """The folder whose sources stand for ``name`` (building a source-patched copy under ``work`` if asked)."""
    if name.endswith(SOURCE_PATCH_SUFFIX):
        version = name.removesuffix(SOURCE_PATCH_SUFFIX)
        copy = work / f"sourcepatch-{version}"
        if not copy.exists():
            patched_release_copy(release_dir(version), copy, automodel_patch.SOURCE_PATCH)
        return copy
    return release_dir(name)


def _spawn(target: str, params: dict[str, Any], first_on_path: Path | None = None) -> Any:
    path = (str(first_on_path) if first_on_path else None, str(REPO_ROOT), os.environ.get("PYTHONPATH"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    (result,) = spawn_ranks(target, params, world_size=1, timeout_s=SPAWN_TIMEOUT_S, env=env)
    return result.result


def facts_for(name: str, shared: Path) -> dict[str, Any]:
    """The facts of release ``name``, computed at most once per session (``shared``: the session's folder)."""
    shared.mkdir(parents=True, exist_ok=True)
    cached = shared / f"{name}.json"
    with open(shared / "facts.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cached.exists():
            names = [n for n in (*STANDARD, name) if not (shared / f"{n}.json").exists()]
            roots = {n: str(source_root(n, shared)) for n in dict.fromkeys(names)}
            computed = _spawn("tests.ranks.release:release_facts_in_turn", {"roots": roots})
            for done, facts in computed.items():
                (shared / f"{done}.json").write_text(json.dumps({"root": roots[done], **facts}))
    return json.loads(cached.read_text())


def fresh_process_facts(name: str, shared: Path) -> dict[str, Any]:
    """The facts of ``name`` from a process of its own, for comparison with :func:`facts_for`'s."""
    root = source_root(name, shared)
    return {"root": str(root), **_spawn("tests.ranks.release:release_facts", {}, first_on_path=root)}
