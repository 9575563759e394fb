"""The report on harvested dumps: every committed real NCCL fixture, and the Gloo rehearsal of the harvest, each read by
``nemo-rl-shim hang-report`` against its ``truth.json`` (``tests/harness/real_nccl.py``).

* **Committed fixtures** (``tests/fixtures/real_nccl/<torch version>/<scenario>/``): each folder is one test. None is
  committed yet (no GPU was lent since the harvest was written): the test then skips, saying it found 0 folders; it
  never passes on nothing. A committed folder whose truth is a rehearsal's is refused.
* **The rehearsal** (a module fixture runs ``python -m tests.scripts.gpu_harvest --rehearse`` once, on Gloo): every
  scenario the Gloo rehearsal can express is harvested on this run, and read; what Gloo cannot express is skipped,
  and the harvest says why (``Scenario.gloo_cannot``; split_group on torch 2.11's Gloo is found by trying it).

Where today's reader is wrong on a dump, that case is ``xfail(strict=True)`` with the first line it gives, so that the
fix of the reader flips it: :data:`KNOWN_WRONG`. On the Gloo rehearsal today's reader reads every scenario right (the
shape it misreads on a GPU, a completed ``batch_isend_irecv`` read as unfinished, cannot be shown on Gloo, whose
recorder writes no send/recv record), so the table is empty; a GPU harvest committed with a misread dump adds its
line here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.paths import REPO_ROOT
from tests.harness.real_nccl import FIXTURES, read_folder, scenario_folders, truth_problems
from tests.ranks.harvest import SCENARIOS

pytestmark = [pytest.mark.every_lane]

#: ``"<torch version>/<scenario>"`` (or ``"rehearsal/<scenario>"``) -> the first line today's reader gives, where it
#: is wrong: the case is xfail(strict), so the reader's fix must flip it. Empty today (see the module docstring).
KNOWN_WRONG: dict[str, str] = {}
HARVEST_BOUND_S = 600  # every scenario's two Gloo ranks, each bounded by the harvest itself; ~20-60 s here
COMMITTED = scenario_folders(FIXTURES)


def _known_wrong(key: str) -> list[pytest.MarkDecorator]:
    if key not in KNOWN_WRONG:
        return []
    return [pytest.mark.xfail(strict=True, reason=f"today's reader gives: {KNOWN_WRONG[key]}")]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Gloo rehearsal of the whole harvest: its exit, output, and folder (``<torch version>/``)."""
    out = tmp_path_factory.mktemp("harvest")
    done = subprocess.run(
        [sys.executable, "-m", "tests.scripts.gpu_harvest", str(out), "--rehearse", "--timeout-s", "2"],
        capture_output=True, text=True, timeout=HARVEST_BOUND_S, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    (root,) = [path for path in out.iterdir() if path.is_dir()]
    summary = json.loads((root / "harvest.json").read_text())
    return {"done": done, "root": root, "rows": {row["scenario"]: row for row in summary["scenarios"]}}


# --- the rehearsal ----------------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_the_rehearsal_harvests_what_gloo_can_express_and_says_what_it_cannot(rehearsal) -> None:
    done, rows = rehearsal["done"], rehearsal["rows"]
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert list(rows) == list(SCENARIOS), rows
    for name, row in rows.items():
        scenario = SCENARIOS[name]
        if not scenario.gloo_runs:
            assert row["outcome"] == "skipped" and scenario.gloo_cannot in row["why"], row
        elif scenario.held_on == "split_group" and row["outcome"] == "skipped":  # torch 2.11's Gloo: found by trying
            assert "cannot: split_group: " in row["why"], row
        else:
            assert row["outcome"] == "harvested", row
            assert row["dump_after_issue_s"] is not None and row["dump_after_issue_s"] >= 2.0, row  # the 2 s timeout
    readme = (rehearsal["root"] / "README.md").read_text()
    assert readme.startswith("# REHEARSAL on Gloo") and "never commit" in readme, readme[:200]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", [pytest.param(n, marks=_known_wrong(f"rehearsal/{n}")) for n in SCENARIOS])
def test_the_report_reads_each_rehearsed_dump_as_its_truth_says(rehearsal, name: str) -> None:
    row = rehearsal["rows"][name]
    if row["outcome"] == "skipped":
        pytest.skip(f"not harvested on Gloo here: {row['why']}")
    folder = rehearsal["root"] / name
    assert not truth_problems(folder), truth_problems(folder)
    truth = json.loads((folder / "truth.json").read_text())
    assert (truth["rehearsal"], truth["real_nccl"], truth["backend"], truth["world_size"]) == (True, False, "gloo", 2)
    assert truth["culprit"] == {"rank": 1, "how": "never entered"}, truth["culprit"]
    rank = truth["rank"]  # rank 0 ended at its dump: its own exit, seconds after the dump was whole
    assert rank["exit"] == 0 and rank["dump_complete_s"] is not None, rank
    assert rank["ended_s"] - rank["dump_complete_s"] < 10 and rank["exit_to_reaped_s"] < 30, rank
    reading = read_folder(folder)
    assert reading.right, reading.describe()


# --- the committed real NCCL fixtures ---------------------------------------------------------------------------------


def _committed() -> list[Any]:
    if not COMMITTED:
        reason = (
            f"0 real NCCL fixture folders committed under {FIXTURES.relative_to(REPO_ROOT)} (<torch version>/"
            "<scenario>/truth.json): no GPU run has harvested yet, so no real dump is read here; the Gloo rehearsal's "
            "harvest is read instead"
        )
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none-committed")]
    return [
        pytest.param(folder, marks=_known_wrong(f"{folder.parent.name}/{folder.name}"), id=f"{folder.parent.name}/"
                     f"{folder.name}")
        for folder in COMMITTED
    ]  # fmt: skip


def _check_committed(folder: Path) -> None:
    assert not truth_problems(folder), truth_problems(folder)
    truth = json.loads((folder / "truth.json").read_text())
    assert truth["real_nccl"] is True and truth["rehearsal"] is False, f"{folder}: a rehearsal's harvest, committed"
    assert truth["backend"].startswith("nccl") and truth["device"] != "cpu", truth
    assert truth["torch"] == folder.parent.name, (truth["torch"], folder)
    assert (folder.parent / "README.md").is_file(), f"{folder.parent}: no README saying where and how it was made"
    reading = read_folder(folder)
    assert reading.right, reading.describe()


@pytest.mark.parametrize("folder", _committed())
def test_each_committed_real_dump_reads_as_its_truth_says(folder: Path) -> None:
    _check_committed(folder)


@pytest.mark.multiprocess
def test_a_rehearsal_committed_as_a_fixture_is_refused(rehearsal, tmp_path) -> None:
    """The committed check refuses a Gloo harvest copied in as if it were real: its truth says it is a rehearsal."""
    name = next(n for n, row in rehearsal["rows"].items() if row["outcome"] == "harvested")
    committed = tmp_path / rehearsal["root"].name / name
    shutil.copytree(rehearsal["root"] / name, committed)
    shutil.copy(rehearsal["root"] / "README.md", committed.parent / "README.md")
    with pytest.raises(AssertionError, match="a rehearsal's harvest, committed"):
        _check_committed(committed)
