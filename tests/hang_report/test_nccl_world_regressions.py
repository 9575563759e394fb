"""Drawn NCCL-format worlds the report once got wrong (#42), one test per kind of mistake, each read in-process.

Each world is drawn by :func:`tests.harness.hang_truth.nccl_worlds.draw` from its seed, read by
:func:`~nemo_rl_shim.hang_report.read_run`, and scored by :func:`tests.harness.hang_truth.score.judge` against the
truth the drawer knows: never wrong again, and right where the rules can tell. The rows of
``docs/recorder-semantics.md`` each rests on are in each test's docstring; the rules themselves are pinned in
``test_coalesced_rules.py`` and ``test_recorder_evidence_rules.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_shim.hang_report import DumpError, read_run
from tests.harness.hang_truth.nccl_worlds import H200_FIRST_LINE, draw, h200
from tests.harness.hang_truth.score import Reported, judge
from tests.harness.hang_truth.truth import Scenario

pytestmark = [pytest.mark.every_lane]


def _scored(scenario: Scenario) -> tuple[str, str]:
    """The score and why, as the benchmark judges the command's outcome (exit 2 for a refused folder)."""
    try:
        report = read_run(scenario.directory)
    except DumpError as e:
        return judge(scenario.truth, Reported(2, {"line": str(e)}, "", 0.0))
    return judge(scenario.truth, Reported(report.exit_code, report.to_json(), "", 0.0))


def _check(seed: int, root: Path, wanted: tuple[str, ...] = ("right",)) -> None:
    scenario = draw(seed, root)
    score, why = _scored(scenario)
    assert score in wanted, f"seed {seed} ({scenario.name}): {score}: {why}"


@pytest.mark.parametrize("seed", [4, 58, 61, 99, 127, 157, 171])
def test_a_batch_is_judged_by_its_closing_record(seed: int, tmp_path: Path) -> None:
    """L-COAL-MEMBERS, L-COAL-CLOSE, L-ONLY-ACTIVE: a completed batch's members (scheduled for ever, or left alone by
    an only-active dump) were read as a pending send; the stall or unfinished collective after them is named."""
    _check(seed, tmp_path)


def test_a_batch_stall_in_an_only_active_dump_is_never_a_wrong_side(tmp_path: Path) -> None:
    """L-ONLY-ACTIVE, C-ONLY-ACTIVE: seed 80 named the ranks waiting in the batch as never came; the culprit's side
    may have completed and been dropped: cannot tell (unclear), never a wrong side."""
    _check(80, tmp_path, ("right", "honest"))


@pytest.mark.parametrize(("form", "only_active"), [("torch", False), ("shim", False), ("torch", True), ("shim", True)])
def test_the_h200_dump_reads_rank_0_did_not_finish_all_reduce_2(form: str, only_active: bool, tmp_path: Path) -> None:
    """#42's H200 dump, with torch's file name and the shim's, full and only-active (L-COAL-CLOSE, L-ONLY-ACTIVE)."""
    scenario = h200(tmp_path, form=form, only_active=only_active)
    report = read_run(scenario.directory)
    assert report.exit_code == 1 and report.kind.body.startswith(H200_FIRST_LINE), report.line
    assert _scored(scenario)[0] == "right"


@pytest.mark.parametrize("seed", [45, 118, 148])
def test_a_split_group_stall_names_its_culprit(seed: int, tmp_path: Path) -> None:
    """N-SPLIT-COUNTER (torch 2.9: every sub-group of a split named alike), C-PG-CONFIG; and L-TIMING-OFF: seed 118's
    culprit, whose only entry reads scheduled, did not finish (was "every rank agrees")."""
    _check(seed, tmp_path)


@pytest.mark.parametrize("seed", [12, 18, 50, 112, 149, 142])
def test_an_only_active_absence_is_cannot_tell_never_a_side(seed: int, tmp_path: Path) -> None:
    """C-ONLY-ACTIVE, L-PG-STATUS, C-PG-ID: an only-active dump that lacks the op its peers are in, and whose pg_status
    cannot say whether it finished it: cannot tell (was "never came", often naming the ranks that finished)."""
    _check(seed, tmp_path, ("right", "honest"))


@pytest.mark.parametrize("seed", [40, 136])
def test_an_only_active_p2p_peer_is_cannot_tell_never_blamed(seed: int, tmp_path: Path) -> None:
    """C-ONLY-ACTIVE: a send may complete before its receive (eagerly) and be dropped: the peer is not blamed."""
    _check(seed, tmp_path, ("right", "honest"))


@pytest.mark.parametrize("seed", [55, 191])
def test_nccl2_p2p_is_never_agreement(seed: int, tmp_path: Path) -> None:
    """H-BATCH-DONE, H-NO-CLOSE: a hung NCCL2 batch reads completed when queued (was exit 0)."""
    _check(seed, tmp_path, ("right", "honest"))


def test_an_unfinished_recv_in_an_only_active_dump_is_never_agreement(tmp_path: Path) -> None:
    """C-STATE, C-ONLY-ACTIVE: seed 182's rank 15 reads its recv started and unretired (was exit 0)."""
    _check(182, tmp_path, ("right", "honest"))


def test_dumps_emptied_by_only_active_are_cannot_tell(tmp_path: Path) -> None:
    """C-PG-STATUS, H-ONLY-ACTIVE: seed 2's 512 dumps hold no entry while their pg_status counts ops: exit 1 cannot
    tell (was exit 2, as for a recorder that recorded nothing)."""
    _check(2, tmp_path, ("right", "honest"))
