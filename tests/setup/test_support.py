"""An unsupported torch x nemo-automodel pair: one clear line naming both versions, from ``status`` and
``setup_distributed``, never an error from deep inside.

The real case: nemo-automodel 0.7.0's distributed package does not import on torch 2.9
(``cannot import name 'BlockMask'``). Its real sources are put first on ``PYTHONPATH`` of a
fresh process; on a torch that has ``BlockMask`` (2.10 and later) there is no unsupported
pair to show, and the test says so: the torch-2.9 CI lane (``scripts/lane.sh torch-2.9``) runs it.

These two tests are the only ones that fail when ``support.check`` reports an unimportable
Automodel as supported, and they run only on the torch-2.9 lane (measured: with that
mutation, both fail there; the other lanes' torch has ``BlockMask``, so they skip). Dropping
that lane as redundant would leave the check untested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.setup.support import TESTED_PAIRS, AutomodelImport, Support
from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

pytestmark = [pytest.mark.releases, pytest.mark.every_lane]

RELEASE = "0.7.0"
TIMEOUT_S = 180


def _torch_has_what_0_7_0_imports() -> bool:
    """nemo-automodel 0.7.0's distributed package imports ``BlockMask`` from torch's pipelining microbatch module."""
    import torch.distributed.pipelining.microbatch as microbatch

    return hasattr(microbatch, "BlockMask")


@pytest.fixture(scope="module")
def unimportable(release_environment) -> dict[str, str]:
    if _torch_has_what_0_7_0_imports():
        pytest.skip(
            f"torch {torch.__version__} has the BlockMask nemo-automodel {RELEASE} imports: no unsupported pair to "
            "show here (the torch-2.9 CI lane runs this test)"
        )
    return release_environment(RELEASE)


def test_status_names_both_versions_and_the_import_error(unimportable) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nemo_rl_shim", "status", "--json"],
        cwd=REPO_ROOT, env={**os.environ, **unimportable}, capture_output=True, text=True, timeout=TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    status = json.loads(done.stdout)
    torch_version = status["torch"]
    assert (status["nemo_automodel_installed"], status["supported"]) == (True, False)
    assert "cannot import name 'BlockMask'" in status["nemo_automodel_import_error"]
    assert status["problem"].startswith(
        f"nemo-automodel {RELEASE} does not work with torch {torch_version}: its distributed package fails to "
        "import (ImportError: cannot import name 'BlockMask'"
    ), status["problem"]
    assert status["decisions"] is None


def test_setup_distributed_raises_that_line_before_any_group(unimportable) -> None:
    (result,) = spawn_ranks(
        "tests.ranks.set_up:unsupported_pair", {}, world_size=1, timeout_s=TIMEOUT_S, env=unimportable
    )
    facts = result.result
    assert facts is not None, f"the rank reported no result: {result.error or result.output[-3000:]}"
    assert facts["raised"]["type"] == "UnsupportedVersions"
    message = facts["raised"]["message"]
    assert "\n" not in message
    assert message.startswith(f"nemo-automodel {RELEASE} does not work with torch "), message
    assert "cannot import name 'BlockMask'" in message
    assert facts["initialized_after"] is False


def test_a_support_verdict_says_whether_the_pair_is_a_lane() -> None:
    torch_minor, release = TESTED_PAIRS[1]
    tested = Support(f"{torch_minor}.0", "3.11.7", AutomodelImport(True, release), None)
    assert tested.tested and tested.ok
    assert tested.to_dict()["tested_pair"] is True
    untested = Support("2.13.0", "3.11.7", AutomodelImport(True, "0.7.0"), None)
    assert not untested.tested
    local_label = Support(f"{torch_minor}.1", "3.12.1", AutomodelImport(True, f"{release}+fixed.getbackend"), None)
    assert local_label.tested, "a local label on a tested release is that release"
    assert not Support("2.15.0", "3.11.7", AutomodelImport(False, None), None).tested


def test_the_tested_pairs_are_the_ci_lanes() -> None:
    """TESTED_PAIRS (what status reports) and the lane groups in pyproject.toml (what CI runs) agree."""
    import tomllib

    project = tomllib.loads((Path(REPO_ROOT) / "pyproject.toml").read_text())
    groups = project["dependency-groups"]
    lanes = {}
    for name, requirements in groups.items():
        if name.startswith("lane-"):
            pins = dict(r.split("==") for r in requirements)
            lanes[name] = (".".join(pins["torch"].split(".")[:2]), pins.get("nemo-automodel", "0.7.0"))
    lock = tomllib.loads((Path(REPO_ROOT) / "uv.lock").read_text())
    locked = {p["name"]: [] for p in lock["package"]}
    for package in lock["package"]:
        locked[package["name"]].append(Version(package["version"]))
    default_lane = (".".join(map(str, max(locked["torch"]).release[:2])), str(max(locked["nemo-automodel"])))
    assert TESTED_PAIRS[0] == default_lane, (TESTED_PAIRS[0], default_lane)
    assert set(TESTED_PAIRS) == {*lanes.values(), default_lane}, (TESTED_PAIRS, lanes)
