"""``tests/scripts/gpu_default_timeout.py`` (the NeMo RL pull request's GPU tests without NeMo RL), on CPU.

On a GPU machine it runs the two-GPU CPU-offload body (two GPUs or more) or the one-rank path NeMo RL accepts (one
GPU, CPU offload off), and says which. Here ``--cpu`` runs the two-GPU body on two CPU ranks, Gloo standing in for
NCCL, as the NeMo RL test's CPU twin does; its verdict is checked on reports with one thing wrong at a time.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.harness.paths import REPO_ROOT
from tests.ranks.offload_timeout import MESH_AXES, problems
from tests.scripts.gpu_default_timeout import plan

__all__: list[str] = []

BOUND_S = 600


def test_the_two_gpu_body_runs_on_two_cpu_ranks_and_every_axis_reads_the_value() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.scripts.gpu_default_timeout", "--cpu"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=BOUND_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("gpu_default_timeout: ran: the two-GPU CPU-offload body on 2 CPU ranks"), lines[0]
    assert lines[-1] == "gpu_default_timeout: OK (2 rank(s), 45 min)"
    reports = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("rank ")]
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert set(report["axes"]) == {"default", *MESH_AXES}
        halves = [h for axis in report["axes"].values() for h in axis.values()]
        assert {h["timeout_min"] for h in halves} == {45.0} and len(halves) == 2 * (1 + len(MESH_AXES))
        assert report["param"] == {"device": "cpu", "sharded_on_dp": True, "local_rows": 4, "full_tensor_whole": True}


@pytest.mark.parametrize(
    "gpus,cpu,ranks,offload,said",
    [
        (0, False, None, None, None),
        (1, False, 1, False, "the one-rank path NeMo RL accepts, nccl, CPU offload off (found 1 GPU); the two-GPU"),
        (2, False, 2, True, "the two-GPU CPU-offload body on 2 ranks, cuda:nccl,cpu:gloo (found 2 GPUs)"),
        (8, False, 2, True, "the two-GPU CPU-offload body on 2 ranks, cuda:nccl,cpu:gloo (found 8 GPUs)"),
        (0, True, 2, True, "the two-GPU CPU-offload body on 2 CPU ranks"),
    ],
)
def test_which_path_runs_is_said_and_one_rank_never_has_cpu_offload(
    gpus: int, cpu: bool, ranks: int | None, offload: bool | None, said: str | None
) -> None:
    chosen = plan(gpus, cpu)
    if ranks is None:
        assert chosen is None
        return
    assert chosen is not None
    params, nproc, line = chosen
    assert (nproc, params["cpu_offload"], params["device"]) == (ranks, offload, "cpu" if cpu else "cuda")
    assert line.startswith(f"ran: {said}"), line
    assert not (nproc == 1 and params["cpu_offload"])  # NeMo RL refuses CPU offload on one rank


def _reports(minutes: float = 45.0) -> list[dict[str, Any]]:
    def half(obj: int, size: int) -> dict[str, Any]:
        return {"backend": "X", "object": obj, "timeout_min": minutes, "all_reduce": float(size), "size": size}

    axes = {name: {"cuda": half(1, 2), "cpu": half(2, 2)} for name in ("default", *MESH_AXES)}
    param = {"device": "cpu", "sharded_on_dp": True, "local_rows": 4, "full_tensor_whole": True}
    return [{"rank": r, "axes": copy.deepcopy(axes), "param": dict(param)} for r in range(2)]


def test_the_verdict_finds_each_thing_wrong() -> None:
    assert problems(_reports(), 45.0, True, 2) == []
    assert problems(_reports(30.0), 45.0, True, 2)  # torch's default everywhere
    wrong = _reports()
    wrong[1]["axes"]["dp_shard_cp"]["cpu"]["timeout_min"] = 30.0
    assert problems(wrong, 45.0, True, 2) == ["rank 1 dp_shard_cp cpu (X): 30 min, not 45"]
    wrong = _reports()
    del wrong[0]["axes"]["tp"]["cpu"]  # the Gloo half dropped, as Automodel#4601 drops it
    assert problems(wrong, 45.0, True, 2)[0] == "rank 0 tp: halves ['cuda'], expected ['cpu', 'cuda']"
    wrong = _reports()
    wrong[0]["axes"]["dp"]["cpu"]["object"] = 1  # one object shared by both halves
    assert problems(wrong, 45.0, True, 2) == ["rank 0 dp: one backend object for both halves"]
    wrong = _reports()
    del wrong[1]["axes"]["pp"]
    assert problems(wrong, 45.0, True, 2) == ["rank 1: no group read for ['pp']"]
    wrong = _reports()
    wrong[0]["param"]["full_tensor_whole"] = False
    assert len(problems(wrong, 45.0, True, 2)) == 1
    wrong = _reports()
    wrong[0]["param"]["device"] = "cuda"
    assert problems(wrong, 45.0, True, 2) == ["rank 0: the parameter is on cuda, not offloaded to the CPU"]
    wrong = _reports()
    wrong[0]["axes"]["cp"]["cuda"]["all_reduce"] = 1.0
    assert problems(wrong, 45.0, True, 2) == ["rank 0 cp cuda: all-reduce gave 1.0, not 2"]
    assert problems(_reports()[:1], 45.0, True, 2) == ["1 reports of 2 ranks"]
