"""Shared fixtures: released Automodel sources, and how a missing resource ends a test.

A test that needs something this machine may lack (the package index, a private network
namespace for Ray) calls :func:`unavailable`: a developer offline gets a skip naming what
is missing; CI (``NEMO_RL_SHIM_CI=1``, set by ``.ci/run``) gets a failure, so a green CI
run has really run every test.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from tests import ray_tree
from tests.releases import ReleaseUnavailable, release_env

IN_CI = os.environ.get("NEMO_RL_SHIM_CI") == "1"
# Ranks started by spawn_ranks are forked from a server that imported torch and nemo-automodel once
# (nemo_rl_shim.cli.preflight.spawn): the suite is CPU-bound on those imports on 2 cores. Each rank is still its
# own process with its own environment and real Gloo groups. tests/test_preflight.py runs the command
# with this unset, so the command's default (a fresh interpreter per rank) stays tested too.
os.environ.setdefault("NEMO_RL_SHIM_FORK_RANKS", "1")
#: Files in the order pytest-xdist hands them out (``--no-loadscope-reorder`` in pyproject.toml: by default
#: it reorders files by their number of tests, which left the few-test, long-waiting files below for last).
#: Longest first, by their durations in a default-lane run (seconds, on 2 busy cores, module fixtures
#: included; measured before bytecode was compiled at install, when every file took about twice as long):
#: each of six workers starts with one of the first six and is also handed one of the next six.
LONGEST_FIRST = (
    "test_preflight.py",  # 189
    "test_pin_bump.py",  # 181: a relock and sync of a copy
    "test_hang_report_preflight.py",  # 144: stalled runs
    "test_decision.py",  # 129
    "test_cli.py",  # 103
    "test_mesh_cpu.py",  # 80
    "test_releases.py",  # 73
    "test_flight_recorder.py",  # 71
    "test_fault.py",  # 67
    "test_upstream_patches.py",  # 66
    "test_timeouts.py",  # 64
    "test_dry_run.py",  # 58
    "test_unknown_release.py",  # 46
    "test_setup_distributed.py",  # 36
)


_RAY_FILE = Path(__file__).with_name("test_ray_preflight.py")
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
    """Start the Ray scenarios' tree and wait for its head, before the xdist workers exist (tests/ray_tree.py)."""
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if name == _RAY_FILE.name:  # last: its tree runs from the start, in the background (pytest_configure)
            return len(LONGEST_FIRST) + 1
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a file, and among the rest, the collected order stays


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it under CI."""
    if IN_CI:
        pytest.fail(f"{reason} (NEMO_RL_SHIM_CI=1: CI must run this test, not skip it)", pytrace=False)
    pytest.skip(reason)


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
    """``release_facts(name)`` -> :func:`tests.release_facts.facts_for`, shared by every xdist worker of the session;
    ``release_facts(name, fresh_process=True)`` -> the same facts from a process of that release's own."""
    from tests.release_facts import facts_for, fresh_process_facts

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
