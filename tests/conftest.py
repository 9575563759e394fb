"""Shared fixtures (released Automodel sources and their facts), and the order files are handed out in.

Nothing imports this file: what tests share lives in ``tests/harness/`` (skips, paths, releases,
fixture wheels, commands at once), ``tests/ranks/`` (rank-side code) and ``tests/ray_harness/``.

Order: pytest-xdist hands files out in collected order (``--no-loadscope-reorder`` in
pyproject.toml: by default it reorders files by their number of tests, which leaves few-test,
long-waiting files for last). Files go longest first, by the durations this suite recorded for
each file on its last run in this checkout that did not pick tests by ``-k`` or node id (setup,
call and teardown of every test, module fixtures included; kept in pytest's cache under
:data:`DURATIONS_KEY`). Files not timed yet (every file, in a fresh checkout) follow the timed ones in the
order of their file names, whatever room they are in (the order they had when every test file sat at the top of
``tests/``: the rooms, #34, left CI's fresh-checkout schedule as it was), and the Ray test goes last (its tree
runs from the start, in the background).
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.releases import ReleaseUnavailable, release_env
from tests.harness.skips import unavailable
from tests.ray_harness import tree as ray_tree

# Ranks started by spawn_ranks are forked from a server that imported torch and nemo-automodel once
# (nemo_rl_shim.cli.preflight.spawn): the suite is CPU-bound on those imports on 2 cores. Each rank is still its
# own process with its own environment and real Gloo groups. tests/cli/preflight/test_preflight.py runs the command
# with this unset, so the command's default (a fresh interpreter per rank) stays tested too.
os.environ.setdefault("NEMO_RL_SHIM_FORK_RANKS", "1")
#: Where each file's duration on the last run is kept, in pytest's cache: ``{file name: seconds}``.
DURATIONS_KEY = "nemo_rl_shim/file_durations_s"
_durations_now: defaultdict[str, float] = defaultdict(float)

_RAY_FILE = Path(__file__).parent / "cli" / "preflight" / "test_ray_preflight.py"
_EARLY_RAY_TREE = pytest.StashKey["ray_tree.Started"]()


def _starts_the_ray_tree_early(config: pytest.Config) -> bool:
    """The pytest process of a run that selects the Ray test by path alone: no -k, no -m, not --collect-only."""
    if os.environ.get("PYTEST_XDIST_WORKER") or importlib.util.find_spec("ray") is None:
        return False
    if config.option.keyword or config.option.markexpr or config.option.collectonly:
        return False  # the Ray test may be deselected: its fixture starts the tree if it runs
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path == _RAY_FILE or path in _RAY_FILE.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    """Start the Ray scenarios' tree and wait for its head before the xdist workers exist (ray_harness.tree)."""
    if not _starts_the_ray_tree_early(config):
        return
    wrapper, _ = ray_tree.namespace_wrapper()
    if wrapper is None:
        return  # the test's fixture says why, as a skip (or a failure under CI)
    started = ray_tree.start(wrapper)
    config.stash[_EARLY_RAY_TREE] = started
    ray_tree.publish(started.tree)
    ray_tree.wait_for_head(started.tree)


def pytest_unconfigure(config: pytest.Config) -> None:
    started = config.stash.get(_EARLY_RAY_TREE, None)
    if started is not None:  # the test has collected it already, unless it was not run
        started.release()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    last_run = cache.get(DURATIONS_KEY, {}) if cache is not None else {}

    def rank(item: pytest.Item) -> tuple[bool, float, str]:
        name = item.path.name
        return name == _RAY_FILE.name, -float(last_run.get(name, 0.0)), name

    items.sort(key=rank)  # stable: within a file the collected order stays


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations_now[Path(report.nodeid.split("::")[0]).name] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The pytest process (not an xdist worker) records this run's durations per file for the next run's order."""
    cache = getattr(session.config, "cache", None)
    if os.environ.get("PYTEST_XDIST_WORKER") or cache is None or not _durations_now:
        return
    if session.config.option.keyword or any("::" in arg for arg in session.config.args):
        return  # a run of some tests of a file says nothing of the whole file's duration
    recorded = {**cache.get(DURATIONS_KEY, {}), **{name: round(s, 1) for name, s in _durations_now.items()}}
    cache.set(DURATIONS_KEY, recorded)


@pytest.fixture(scope="session")
def release_environment():
    """``release_environment(version)`` -> env for a spawned process, or :func:`unavailable` naming why not."""

    def get(version: str) -> dict[str, str]:
        try:
            return release_env(version)
        except ReleaseUnavailable as e:
            unavailable(f"nemo-automodel {version} unavailable: {e}")

    return get


@pytest.fixture(scope="session")
def release_facts(tmp_path_factory):
    """``release_facts(name)`` -> :func:`.harness.release_facts.facts_for`, shared by every xdist worker of the session;
    ``release_facts(name, fresh_process=True)`` -> the same facts from a process of that release's own."""
    from tests.harness.release_facts import facts_for, fresh_process_facts

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "release-facts"

    def get(name: str, *, fresh_process: bool = False) -> dict:
        try:
            facts = fresh_process_facts(name, shared) if fresh_process else facts_for(name, shared)
        except ReleaseUnavailable as e:
            unavailable(f"nemo-automodel {name} unavailable: {e}")
        if facts.get("import_error"):
            import torch

            pytest.skip(f"nemo-automodel {name} does not import on torch {torch.__version__}: {facts['import_error']}")
        return facts

    return get


@pytest.fixture
def mesh_utils() -> Iterator[ModuleType]:
    """The installed Automodel's ``mesh_utils``, with no workaround in force before or after the test."""
    import automodel_patch
    from automodel_patch._target import load_mesh_utils

    automodel_patch.revert()
    module = load_mesh_utils()
    if module is None:
        pytest.fail(
            "nemo_automodel.components.distributed.mesh_utils cannot be imported; the automodel extra is locked"
        )
    yield module
    automodel_patch.revert()
    assert automodel_patch.active() == (), "revert() left a workaround in place"
