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
}
#: seed -> where the root cannot be told: the rank waited on is in a collective no recorder says finished.
HONEST = {
    169: "legacy 2.9, no entry of the incident's ranks marked finished: cannot tell, was 'never came: rank 0'",
}


@pytest.mark.parametrize("seed", list(SEEDS), ids=[f"{s}: {why}" for s, why in SEEDS.items()])
def test_a_cascade_names_its_root_not_the_rank_the_free_ranks_wait_on(tmp_path, seed: int) -> None:
    scenario = draw(seed, tmp_path)
    assert recipe(seed).cascade
    kind = read_run(scenario.directory).kind
    assert kind.name in scenario.truth.kinds and set(kind.ranks) == set(scenario.truth.ranks), kind.line
    assert kind.evidence["cascade"][0]["op"] == "_reduce_scatter_base", kind.evidence
    assert " wait on it in _reduce_scatter_base #" in kind.line or " waits on it in _reduce_scatter_base #" in kind.line


@pytest.mark.parametrize("seed", list(HONEST), ids=[f"{s}: {why}" for s, why in HONEST.items()])
def test_a_cascade_into_a_collective_no_recorder_says_finished_cannot_tell(tmp_path, seed: int) -> None:
    scenario = draw(seed, tmp_path)
    kind = read_run(scenario.directory).kind
    assert kind.name in CANNOT_TELL and kind.ranks != (0,), kind.line
    assert kind.line.startswith("cannot tell whether ranks 0-3 finished all_reduce #1 on tp"), kind.line
