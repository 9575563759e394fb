"""The parts of the GPU run, each on its own: a dump known whole, the truth's first line, the harvest's plan, a fixture
read right or wrong, the wheels' fit, and ``scripts/gpu_wheels.sh`` (its choice of Python and versions, and, where the
package index is reachable, a real download)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.harness.paths import REPO_ROOT
from tests.harness.real_nccl import Reading, truth_problems
from tests.harness.skips import unavailable
from tests.harness.tiny_wheel import build_wheel
from tests.ranks.harvest import SCENARIOS, dump_complete
from tests.scripts import gpu_facts, gpu_harvest, wheel_tags

pytestmark = [pytest.mark.every_lane]

WHEELS_SCRIPT = REPO_ROOT / "scripts" / "gpu_wheels.sh"
UV = os.environ.get("NEMO_RL_SHIM_UV", "uv").split()


# --- the harvest ------------------------------------------------------------------------------------------------------


def test_a_dump_is_whole_only_once_its_pickle_reaches_its_stop(tmp_path) -> None:
    data = pickle.dumps({"version": "2.10", "entries": [{"profiling_name": "nccl:all_reduce"}] * 50}, protocol=2)
    path = tmp_path / "nccl_trace_rank_0"
    assert dump_complete(path) is None  # not there yet
    path.write_bytes(b"")
    assert dump_complete(path) is None  # created, nothing written
    for cut in (1, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        assert dump_complete(path) is None, cut  # still being written
    path.write_bytes(data)
    assert dump_complete(path) == len(data)
    path.write_bytes(b"not a pickle at all")
    assert dump_complete(path) is None


def test_the_first_line_a_truth_asks_for() -> None:
    held = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 2}
    one = gpu_harvest.expected_first_line(held, {"desc": "default_pg"}, 1)
    assert one == ("all_entered_none_finished", "all entered, none finished: rank 0 did not finish all_reduce #2 on "
                   "default", 0)  # fmt: skip
    two = gpu_harvest.expected_first_line({**held, "profiling_name": "gloo:all_reduce"}, {"desc": "harvest_new"}, 2)
    assert two == ("never_came", "never came: rank 1 did not enter all_reduce #2 on harvest_new", 1)


def test_the_plan_skips_what_cannot_run_here_and_says_why(monkeypatch) -> None:
    monkeypatch.setattr(gpu_harvest, "_has_nccl2", lambda: False)
    plan = dict(gpu_harvest.plan(None, rehearse=False))
    assert list(plan) == list(SCENARIOS)
    assert "has no NCCL2" in plan["held_after_batch_nccl2"] and "has no NCCL2" in plan["held_after_batch_nccl_legacy"]
    assert all(not why for name, why in plan.items() if not SCENARIOS[name].needs_nccl2), plan
    monkeypatch.setattr(gpu_harvest, "_has_nccl2", lambda: True)
    assert all(not why for why in dict(gpu_harvest.plan(None, rehearse=False)).values())
    rehearsed = dict(gpu_harvest.plan(["held_after_batch", "held_after_batch_nccl2"], rehearse=True))
    assert rehearsed == {"held_after_batch": "", "held_after_batch_nccl2": "the Gloo rehearsal cannot run it: NCCL2 "
                         "is NCCL's"}  # fmt: skip


def _fixture(folder: Path, first_line: str = "all entered, none finished: rank 0 did not finish all_reduce #2") -> Path:
    folder.mkdir(parents=True)
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": []}))
    truth = {
        "scenario": folder.name, "backend": "nccl", "torch": folder.parent.name, "world_size": 1, "unfinished": {},
        "kind": "all_entered_none_finished", "first_line": first_line, "dumps": ["nccl_trace_rank_0"],
        "real_nccl": True,
    }  # fmt: skip
    (folder / "truth.json").write_text(json.dumps(truth))
    return folder


def test_a_reading_is_right_only_with_a_found_problem_and_the_truths_start(tmp_path) -> None:
    folder = _fixture(tmp_path / "2.11.0+cu130" / "held_after_batch")
    truth = json.loads((folder / "truth.json").read_text())
    line = truth["first_line"] + " on default, ranks 0: every member entered it, none finished"
    assert Reading(folder, truth, 1, line).right
    assert not Reading(folder, truth, 0, line).right  # "every rank agrees" on a hang is wrong whatever it says
    assert not Reading(folder, truth, 2, line).right
    wrong = "all entered, none finished: ranks 0 did not finish the send #1 of rank 0 and its match on rank 0"
    assert not Reading(folder, truth, 1, wrong).right
    assert "WRONG" in Reading(folder, truth, 1, wrong).describe()


def test_a_truth_that_names_a_missing_dump_or_lacks_a_key_is_refused(tmp_path) -> None:
    folder = _fixture(tmp_path / "2.11.0+cu130" / "held_after_batch")
    assert truth_problems(folder) == []
    (folder / "nccl_trace_rank_0").unlink()
    assert truth_problems(folder) == [f"{folder}: no dump file nccl_trace_rank_0"]
    truth = json.loads((folder / "truth.json").read_text())
    del truth["first_line"]
    (folder / "truth.json").write_text(json.dumps(truth))
    assert f"{folder / 'truth.json'}: no 'first_line'" in truth_problems(folder)


# --- the wheels -------------------------------------------------------------------------------------------------------


def test_a_wheel_fits_by_its_tags_and_its_requires_python(tmp_path) -> None:
    names = ["pure-1.0-py3-none-any.whl", "ext-2.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    for name in names:
        (tmp_path / name).write_bytes(b"")  # the tags are in the name; a name alone has no Requires-Python to read
    fit = wheel_tags.check(tmp_path.glob("*.whl"), "3.12")
    assert fit.ok, fit.line()
    misfit = wheel_tags.check(tmp_path.glob("*.whl"), "3.11")
    assert misfit.misfits == ("ext-2.0-cp312-cp312-manylinux_2_28_x86_64.whl (cp312-cp312-manylinux_2_28_x86_64)",)
    assert misfit.line().startswith("wheels: REFUSED: 1 of 2 do not fit CPython 3.11 on x86-64 Linux")
    build_wheel(tmp_path, "late", ">=3.13")
    late = wheel_tags.check([tmp_path / "late-1.0-py3-none-any.whl"], "3.12")
    assert late.misfits == ("late-1.0-py3-none-any.whl (Requires-Python >=3.13)",), late
    assert wheel_tags.check([tmp_path / "late-1.0-py3-none-any.whl"], "3.13").ok
    (tmp_path / "pure-1.1-py3-none-any.whl").write_bytes(b"")
    twice = wheel_tags.check(tmp_path.glob("pure-*.whl"), "3.12")
    assert twice.twice == ("pure",) and "more than one version of pure" in twice.line()


def test_the_wheel_check_exits_0_1_or_2(tmp_path, capsys) -> None:
    assert wheel_tags.main([str(tmp_path)]) == 2  # no wheel
    build_wheel(tmp_path, "here", f">={sys.version_info.major}.{sys.version_info.minor}")
    assert wheel_tags.main([str(tmp_path)]) == 0
    assert "(this interpreter)" in capsys.readouterr().out
    build_wheel(tmp_path, "never", ">=9")
    assert wheel_tags.main([str(tmp_path)]) == 1
    (tmp_path / "not-a-wheel.whl").write_bytes(b"")
    assert wheel_tags.main([str(tmp_path)]) == 2


def test_the_facts_name_what_the_run_needs_and_lacks(tmp_path) -> None:
    assert gpu_facts.main([str(tmp_path / "facts.json")]) == 0
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["python_tag"] == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert facts["missing"] == [] and set(gpu_facts.NEEDED.values()) <= set(facts["present"]), facts


def _wheels_script(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(UV[0]) is None and UV[0] == "uv":
        unavailable("scripts/gpu_wheels.sh needs uv, and no uv is on PATH")
    return subprocess.run(
        ["bash", str(WHEELS_SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, check=False
    )


def _locked(project: str) -> set[str]:
    lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
    return {package["version"] for package in lock["package"] if package["name"] == project}


def test_gpu_wheels_takes_the_measured_python_and_uv_locks_versions(tmp_path) -> None:
    done = _wheels_script("--dry-run", "--dest", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "CPython 3.12 (the default: CPython 3.12.3 measured on the lent H200" in done.stdout, done.stdout
    assert "--python-version 3.12" in done.stdout and "nemo-automodel==0.7.0 megatron-fsdp==0.5.0" in done.stdout
    assert "0.7.0" in _locked("nemo-automodel") and "0.5.0" in _locked("megatron-fsdp")
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"python": "3.13.1", "missing": ["megatron-fsdp"]}))
    measured = _wheels_script("--dry-run", "--facts", str(facts), "--dest", str(tmp_path))
    assert measured.returncode == 0, measured.stderr
    assert "CPython 3.13 (measured on the GPU machine" in measured.stdout and "nemo-automodel" not in measured.stdout
    refused = _wheels_script("--dry-run", "--facts", str(facts), "--python", "3.12")
    assert refused.returncode == 2, refused.stdout
    assert "refused: --python 3.12, but" in refused.stderr and "measured CPython 3.13" in refused.stderr
    unknown = _wheels_script("--dry-run", "--also", "no-such-project-here")
    assert unknown.returncode == 2 and "uv.lock pins no no-such-project-here" in unknown.stderr, unknown.stderr
    facts.write_text(json.dumps({"python": "3.12.3", "missing": []}))
    nothing = _wheels_script("--facts", str(facts), "--dest", str(tmp_path / "none"))
    assert nothing.returncode == 0 and "no wheels to bring" in nothing.stdout, nothing.stdout


@pytest.mark.releases
def test_gpu_wheels_downloads_exactly_the_wheels_that_fit_the_gpu_python(tmp_path) -> None:
    dest = tmp_path / "whl"
    dest.mkdir()
    (dest / "stale-0.1-py3-none-any.whl").write_bytes(b"")  # a wheel left from before: removed
    done = _wheels_script("--dest", str(dest))
    if done.returncode != 0 and "pip download" not in done.stdout and not list(dest.glob("nemo*")):
        unavailable(f"the package index is out of reach: {done.stderr.strip().splitlines()[-1:]}")
    assert done.returncode == 0, (done.stdout, done.stderr)
    names = sorted(path.name for path in dest.glob("*.whl"))
    assert names == ["megatron_fsdp-0.5.0-py3-none-any.whl", "nemo_automodel-0.7.0-py3-none-any.whl"], names
    assert "wheels: all 2 fit CPython 3.12 on x86-64 Linux" in done.stdout, done.stdout
