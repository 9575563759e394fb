"""On a pin whose mesh build takes no timeout (nemo-automodel 0.4.0, as NeMo RL's pin 24b47e856), the commands
say that every sub-group gets the timeout right after the build, and preflight finds it there.

Each command runs in a fresh interpreter whose ``PYTHONPATH`` puts the 0.4.0 release first
(:func:`tests.harness.releases.release_env`): ``status --json``; ``preflight --dry-run`` on a 16-rank world with
CPU offload (torch's fake backend; the run's ``"cuda:nccl,cpu:gloo"`` halves are recorded); and
``preflight`` on 4 real Gloo ranks with ``--tp 2``. On today's library the last two exit 1: every
sub-group at torch's default, 30 min on both halves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.harness.releases import REPO_ROOT

__all__: list[str] = []

pytestmark = [pytest.mark.releases, pytest.mark.multiprocess]

VERSION = "0.4.0"
TIMEOUT = 45.0
#: A bound on each command: a fresh interpreter compiles the shadowed release's sources (no bytecode is written),
#: and the dry run plays 16 ranks; past 240 s at a load of 50 on 2 cores.
COMMAND_TIMEOUT_S = 480
REASON = (
    f"nemo-automodel {VERSION} has no MeshContext.build(timeout_minutes=): every sub-group gets the timeout right "
    "after the build"
)


def _run(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "nemo_rl_shim", *args, "--json"],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, cwd=REPO_ROOT, env={**os.environ, **env},
        check=False,
    )  # fmt: skip
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"{args}: exit {done.returncode}, no JSON on stdout; stderr: {done.stderr[-3000:]}")
    return done.returncode, report, done.stderr


def test_status_says_every_sub_group_gets_the_timeout_after_the_build(release_environment) -> None:
    code, status, err = _run(release_environment(VERSION), "status")
    assert code == 0, err[-3000:]
    assert (status["nemo_automodel"], status["build_accepts_timeout"]) == (VERSION, False)
    assert [d["default_backend"] for d in status["decisions"]] == ["cuda:nccl,cpu:gloo", "nccl", "gloo"]
    for d in status["decisions"]:
        assert (d["action"], d["every_group"], d["warning"], d["reason"]) == ("set_after_build", True, None, REASON), d


def _check_every_row(report: dict[str, Any], halves: dict[str, str]) -> None:
    assert report["decision"]["action"] == "set_after_build" and report["decision"]["reason"] == REASON
    rows = [row for rank in report["ranks"] for row in rank["rows"]]
    sub_groups = {row["group"] for row in rows if not row["is_default"]}
    assert {"dp_shard", "tp", "dp", "dp_cp", "dp_shard_cp"} <= sub_groups, sub_groups
    for row in rows:
        assert row["backends"] == halves, row
        assert row["timeout_minutes"] == dict.fromkeys(halves, TIMEOUT), row


def test_dry_run_every_group_carries_the_timeout_on_both_halves(release_environment) -> None:
    env = release_environment(VERSION)
    code, report, err = _run(env, "preflight", "--timeout-minutes", "45", "--dry-run", "--world", "16", "--tp", "2")
    assert code == 0, (report.get("problem"), err[-3000:])
    assert report["default_backend"] == "cuda:nccl,cpu:gloo"
    _check_every_row(report, {"cpu": "gloo", "cuda": "nccl"})


def test_preflight_on_four_gloo_ranks_finds_every_group_at_the_timeout(release_environment) -> None:
    env = release_environment(VERSION)
    code, report, err = _run(env, "preflight", "--timeout-minutes", "45", "--tp", "2", "--nproc", "4")
    assert code == 0, (report.get("problem"), err[-3000:])
    assert len(report["ranks"]) == 4
    _check_every_row(report, {"cpu": "gloo", "cuda": "gloo"})  # a plain gloo group serves both devices
