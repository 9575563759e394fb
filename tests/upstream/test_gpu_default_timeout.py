"""``tests/scripts/gpu_default_timeout.py`` (``scripts/gpu_check.sh``'s step for the NeMo RL pull request), on CPU.

On a GPU it checks both halves of ``"cuda:nccl,cpu:gloo"``; here ``--cpu`` runs the same logic on Gloo, on this
project's torch: the value made torch's default for new groups reaches the default group, a mesh sub-group and a
later group, with ``TORCH_DISTRIBUTED_DEBUG`` off and at ``DETAIL`` (wrapped backends).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

BOUND_S = 600


def test_the_default_for_new_groups_reaches_every_group_with_and_without_detail() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.scripts.gpu_default_timeout", "--cpu"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=BOUND_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["TORCH_DISTRIBUTED_DEBUG=OFF", "TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    for line, wrapped in zip(lines, (False, True), strict=True):
        timeouts = json.loads(line.split(" ok ", 1)[1])["timeouts"]
        assert {"default_pg cpu", "mesh_tp cpu", "later cpu"} <= {" ".join(k.split()[:2]) for k in timeouts}
        assert set(timeouts.values()) == {45.0}, timeouts
        assert all(("_ProcessGroupWrapper" in key) == wrapped for key in timeouts), timeouts


def test_a_group_at_torch_s_default_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's verdict, not its setting: a read-back that differs from 45 min fails (exit 1)."""
    from tests.scripts import gpu_default_timeout as script

    read = {"timeouts": {"default_pg cpu X": 45.0, "mesh_tp cpu X": 30.0}}
    monkeypatch.setattr(script, "_child", lambda on_gpu, debug: read)
    assert script.main(["--cpu"]) == 1
    # and one that reads 45 everywhere but lacks the mesh sub-group fails too
    read = {"timeouts": {"default_pg cpu X": 45.0, "later cpu X": 45.0}}
    assert script.main(["--cpu"]) == 1
