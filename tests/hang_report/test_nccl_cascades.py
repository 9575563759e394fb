"""Cascades drawn whole: the NCCL-format seeds of #42's category A that the reader got wrong, one per kind of root.

Each seed (``tests/harness/hang_truth/nccl_worlds.py``) has the free ranks wait in the next dp reduce-scatter (or,
with tp pairs, the default group's) on a rank of the group where the incident is. The reader named that rank
"never came" there; :mod:`nemo_rl_shim.hang_report.cascade` follows it into the incident. The rule, on findings
built for it: ``tests/hang_report/test_cascade_rules.py``.
"""

from __future__ import annotations

import pytest

from nemo_rl_shim.hang_report.report import read_run
from tests.harness.hang_truth.nccl_worlds import CANNOT_TELL, draw, recipe

#: seed -> the root it has: all_entered (8 ranks, legacy 2.9) was "never came: rank 0 ... on dp", and so on.
SEEDS = {
    1: "into a collective none finished, NCCL2",
    14: "into one rank that did not finish, NCCL2",
    121: "into one rank that did not finish, legacy 2.15, timing on",
    139: "into one rank that did not finish, legacy 2.11",
    155: "into a collective none finished, through the default group (tp pairs), legacy 2.11",
    175: "into a collective none finished, through the default group (tp pairs), legacy 2.10",
    187: "into a collective none finished, past a batch's members left scheduled (L-COAL-MEMBERS), legacy 2.10",
    169: "into a collective none finished, legacy 2.9: none marked finished, pg_status says none ended (L-PG-STATUS)",
}


@pytest.mark.parametrize("seed", list(SEEDS), ids=[f"{s}: {why}" for s, why in SEEDS.items()])
def test_a_cascade_names_its_root_not_the_rank_the_free_ranks_wait_on(tmp_path, seed: int) -> None:
    scenario = draw(seed, tmp_path)
    assert recipe(seed).cascade
    kind = read_run(scenario.directory).kind
    assert kind.name in scenario.truth.kinds and set(kind.ranks) == set(scenario.truth.ranks), kind.line
    assert kind.evidence["cascade"][0]["op"] == "_reduce_scatter_base", kind.evidence
    assert " wait on it in _reduce_scatter_base #" in kind.line or " waits on it in _reduce_scatter_base #" in kind.line


#: seed -> why its root cannot be told: the rank waited on is one whose part its recorder hides (or keeps unclear).
HIDDEN_ROOTS = {
    59: "only-active, two members: the rank waited on waits where no buffer tells who kept it (unclear)",
    126: "only-active: the rank waited on may have sent, eagerly, and dropped the record",
    156: "NCCL2: the rank waited on is in a batch recorded completed when queued (H-BATCH-DONE)",
    163: "only-active: the rank waited on may have finished tp's all_reduce, or never posted it",
}


@pytest.mark.parametrize("seed", list(HIDDEN_ROOTS), ids=[f"{s}: {why}" for s, why in HIDDEN_ROOTS.items()])
def test_a_cascade_into_what_the_recorder_hides_cannot_tell(tmp_path, seed: int) -> None:
    """Each was "never came: rank N did not enter _reduce_scatter_base ... on dp", a rank the rules cannot blame."""
    scenario = draw(seed, tmp_path)
    report = read_run(scenario.directory)
    assert report.exit_code == 1 and report.kind.name in CANNOT_TELL, report.line
    assert scenario.truth.kinds == CANNOT_TELL
