"""A release detection cannot judge, seen from the command line and the tripwire.

``0.7.0+fixed.cudaquery`` (:mod:`tests.harness.fixture_wheels`) keeps the CPU half, but asks for the
current CUDA device while it builds its options, which raises on a machine without a GPU: the
keep-cpu-backend probe cannot judge it here. Its sources go first on ``PYTHONPATH`` of a fresh
process, which runs ``nemo-rl-shim status`` and the tripwires as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.harness.fixture_wheels import fixture_version
from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

pytestmark = pytest.mark.releases

RELEASE = fixture_version("cudaquery")
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def under_unknown(release_environment) -> dict[str, Any]:
    env = {**os.environ, **release_environment(RELEASE)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
            check=False,
        )  # fmt: skip

    return {
        "status": run("-m", "nemo_rl_shim", "status", "--json"),
        "tripwire": run(
            "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/automodel_patch/test_tripwire.py"
        ),
    }


def test_status_shows_unknown_with_the_reason_and_the_safe_decision(under_unknown) -> None:
    done = under_unknown["status"]
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads(done.stdout)
    assert status["nemo_automodel"] == RELEASE
    (keep,) = [w for w in status["workarounds"] if w["name"] == "keep-cpu-backend"]
    assert keep["verdict"] == "unknown"
    assert "raised RuntimeError" in keep["reason"], keep["reason"]
    (on_gpu,) = [d for d in status["decisions"] if d["run"] == "GPUs, CPU offload"]
    assert (on_gpu["action"], on_gpu["applies"]) == ("patch_and_forward", ["keep-cpu-backend"])
    assert on_gpu["warning"].startswith("detection cannot judge the installed Automodel for keep-cpu-backend")


def test_the_tripwire_says_cannot_probe_check_by_hand(under_unknown) -> None:
    done = under_unknown["tripwire"]
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-1500:]
    assert "cannot probe this release; check by hand: the keep-cpu-backend probe says unknown" in done.stdout
    assert "raised RuntimeError" in done.stdout
