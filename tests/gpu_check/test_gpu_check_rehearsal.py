"""``scripts/gpu_check.sh --rehearse``: the one prepared GPU run, every step rehearsed on CPU (Gloo for NCCL).

Two runs at once (a module fixture, each bounded): a full rehearsal, whose wheel folder holds one wheel that fits
this interpreter and one whose ``Requires-Python`` does not (so its wheels step fails, and every later step must still
run), with a harvest of two scenarios at a 2 s timeout (the harvest of every scenario is read on every lane by
``test_real_nccl_fixtures.py``); and a run whose budget is spent after its first step (every step must still be in
the table, said not run). Checked: the table (every step, in order, how each ended, its seconds), the layout the
device tool brings back (at most 8 files of 16 MiB, no deeper than 2 folders, plain names), the harvested folders in
the tarball, and the facts. Not on every lane: the full rehearsal starts some ten interpreters (about 2 minutes of
CPU); what depends on the torch release (the harvest, the one-GPU preflight) runs on every lane in its own tests.
"""

from __future__ import annotations

import json
import os
import platform
import string
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.harness.at_once import Finished, run_at_once
from tests.harness.paths import REPO_ROOT
from tests.harness.tiny_wheel import build_wheel

pytestmark = [pytest.mark.multiprocess]

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"
RUN_BOUND_S = 900  # the script's own budget is 450 s; here it takes about 2 minutes
STEPS = [
    "facts",
    "wheels",
    "status",
    "pytest -m gpu",
    "harvest",
    "hang-report on the harvest",
    "preflight",
    "default-timeout",
    "two-rank: gpu_mesh_timeouts",
    "two-rank: gpu_flight_recorder --nproc 2",
    "two-rank: gpu_flight_recorder --nproc 2 --torch-only",
    "total",
]
HARVESTED = ("held_after_batch", "held_on_new_group")
SPENT_BUDGET_S = 10  # the least a step may start with (MIN_STEP_S): only the first step starts, whatever its speed
OUT_FILES = {"facts.json", "gpu_check.log", "harvest.tar.gz", "steps.tsv", "table.txt"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return {**env, "PYTHON": sys.executable, **extra}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("gpu_check")
    wheels = base / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "fits_here", ">=3.8")
    build_wheel(wheels, "from_the_future", ">=9")
    full, spent = base / "full", base / "spent"
    harvest = f"--only {' '.join(HARVESTED)} --timeout-s 2"
    commands = {
        "full": (["bash", str(SCRIPT), "--rehearse", str(full), str(wheels)], _env(GPU_CHECK_HARVEST_ARGS=harvest)),
        "spent": (["bash", str(SCRIPT), "--rehearse", str(spent)], _env(GPU_CHECK_BUDGET_S=str(SPENT_BUDGET_S))),
    }
    finished = run_at_once(commands, timeout_s=RUN_BOUND_S, cwd=REPO_ROOT)
    return {"full": (finished["full"], full), "spent": (finished["spent"], spent)}


def _steps(out: Path) -> dict[str, tuple[str, int]]:
    lines = (out / "steps.tsv").read_text().splitlines()
    assert lines[0] == "step\tresult\tseconds", lines[0]
    rows = [line.split("\t") for line in lines[1:]]
    return {name: (result, int(seconds)) for name, result, seconds in rows}


def _finished(run: Finished) -> None:
    assert not run.timed_out, f"still running at {RUN_BOUND_S} s:\n{run.stdout[-3000:]}"


def test_every_step_runs_past_a_failed_one_and_the_table_says_how_each_ended(runs) -> None:
    run, out = runs["full"]
    _finished(run)
    steps = _steps(out)
    assert list(steps) == STEPS, list(steps)
    assert steps["wheels"][0] == "FAILED (exit 1)", steps["wheels"]
    assert "wheels: REFUSED: 1 of 2 do not fit" in run.stdout and "Requires-Python >=9" in run.stdout
    for name in STEPS[2:8]:
        assert steps[name][0] == "ok", (name, steps[name], run.stdout[-4000:])
    for name in STEPS[8:11]:
        assert steps[name] == ("skipped (0 CUDA device(s), needs 2)", 0), (name, steps[name])
    assert steps["total"][0].startswith("FAILED") and run.returncode == 1, (steps["total"], run.returncode)
    assert steps["total"][1] >= sum(seconds for name, (_, seconds) in steps.items() if name != "total")
    table = (out / "table.txt").read_text().splitlines()
    assert table[0].split() == ["step", "result", "seconds"], table[0]
    assert [line.split()[0] for line in table[1:]] == [name.split()[0] for name in STEPS], table
    assert run.stdout.rstrip().splitlines()[-len(STEPS) - 2 :][0].split() == ["step", "result", "seconds"]


def test_the_out_dir_fits_what_the_device_tool_brings_back(runs) -> None:
    run, out = runs["full"]
    _finished(run)
    files = [path for path in out.rglob("*") if path.is_file()]
    assert {path.name for path in files} == OUT_FILES and all(path.parent == out for path in files), files
    assert all(path.stat().st_size <= 16 * 2**20 for path in files)
    assert all(set(path.name) <= set(string.ascii_letters + string.digits + "._-") for path in files), files
    assert "layout: 5 files, 0 deeper than 2 folders, 0 over 16 MiB, 0 with other characters in the name: fits" in (
        run.stdout
    )


def test_the_harvest_travels_as_one_tarball_of_scenario_folders_with_their_truth(runs, tmp_path) -> None:
    run, out = runs["full"]
    _finished(run)
    with tarfile.open(out / "harvest.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    import torch

    assert root.name == torch.__version__
    assert sorted(path.name for path in root.iterdir()) == sorted([*HARVESTED, "README.md", "harvest.json"])
    for name in HARVESTED:
        truth = json.loads((root / name / "truth.json").read_text())
        assert truth["rehearsal"] is True and truth["scenario"] == name, truth
        assert sorted(truth["dumps"]) == ["nccl_trace_rank_0", "nccl_trace_rank_1"], truth["dumps"]
        assert all((root / name / dump).stat().st_size > 0 for dump in truth["dumps"])
    assert "real_nccl_check: 2 of 2 read right" in run.stdout, run.stdout[-3000:]


def test_the_facts_are_this_interpreters(runs) -> None:
    run, out = runs["full"]
    _finished(run)
    facts = json.loads((out / "facts.json").read_text())
    import torch

    assert (facts["python"], facts["torch"], facts["cuda_devices"]) == (platform.python_version(), torch.__version__, 0)
    assert facts["python_tag"] == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert facts["missing"] == [], facts  # this environment has every project the run imports


def test_a_spent_budget_still_lists_every_step_and_fails(runs) -> None:
    run, out = runs["spent"]
    _finished(run)
    steps = _steps(out)
    assert list(steps) == STEPS, list(steps)
    spent = f"not run (the {SPENT_BUDGET_S} s budget was spent)"
    not_run = [name for name, (result, _) in steps.items() if result == spent]
    assert not_run and not_run == [name for name in STEPS[1:8] if name in not_run], steps
    assert steps["status"][0] == spent and steps["preflight"][0] == spent, steps
    assert run.returncode == 1 and steps["total"][0].startswith("FAILED"), (run.returncode, steps["total"])
    assert steps["total"][1] <= SPENT_BUDGET_S + 15, steps["total"]  # the budget, timeout's grace, the packing
