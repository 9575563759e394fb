"""The hang report against drawn Gloo hangs whose truth is known (#42): a fixed sample, none scored wrong.

The sample (:data:`SAMPLE`) is a few seeds per incident of :mod:`tests.harness.hang_truth.gloo_worlds`, worlds of 2 to
4 real Gloo ranks, drawn together once per module and each scored as a user reads the report
(:mod:`tests.harness.hang_truth.score`). A seed today's reader gets wrong is a strict xfail whose reason is its first
line: the reader's fix turns it into a pass, and the strict mark into a failure that says to drop the mark.
``benchmarks/hang_truth.py`` runs the whole seed list.

Beside it, the rules without ranks: the scorer's verdicts, the recipes' invariants (each incident's culprit, circle
and receiver as drawn), and the check that refuses a world that did not run as drawn.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nemo_rl_shim.cli.preflight.spawn import RankResult
from tests.harness.hang_truth import gloo_worlds
from tests.harness.hang_truth.gloo_worlds import INCIDENTS, SEEDS, VARIANTS, WorldFailed, draw, draw_recipe
from tests.harness.hang_truth.score import Reported, Scored, judge, score
from tests.harness.hang_truth.truth import Scenario, Truth

#: Seed -> None, or what today's reader says where it scores the seed wrong (a strict xfail; the first line, less its
#: paths and its fix). ``benchmarks/hang_truth.py`` lists every wrong seed of the whole list.
SAMPLE: dict[int, str | None] = {
    1020: None,  # never came: asleep, 2 ranks (tp)
    1016: None,  # never came: dead, 4 ranks (split_group)
    1012: None,  # never came: a C call holding the GIL, 4 ranks (tp, dp)
    1100: None,  # never came: dead, 2 ranks, on a split_group group made after set-up (its peer's map lists it)
    1009: None,  # still working: writing, 3 ranks (tp)
    1113: None,  # still working: writing, 2 ranks (tp)
    1098: None,  # circular: 2 groups, 3 ranks
    1030: None,  # circular: 3 groups made by split_group after set-up, 3 ranks
    1118: None,  # circular: 3 groups after a completed barrier (Gloo cannot say it finished), 4 ranks (#42)
    1007: None,  # p2p: a batch's irecv, 3 ranks; waited on from the user's line (the shim's log tells)
    1019: None,  # p2p: recv, 3 ranks (its receiver, in torch's recv: the shim's log, and receivers.py without it)
}


class WrongScore(AssertionError):
    """The report scored wrong: the only failure a strict xfail of :data:`SAMPLE` expects."""


def _param(seed: int) -> Any:
    reason = SAMPLE[seed]
    if reason is None:
        return seed
    return pytest.param(seed, marks=pytest.mark.xfail(strict=True, raises=WrongScore, reason=f"today: {reason}"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict[int, tuple[Scenario, Scored] | WorldFailed]:
    """Every seed of the sample drawn at once, each scored as soon as its world has run."""
    root = tmp_path_factory.mktemp("hang-truth")

    def one(seed: int) -> tuple[Scenario, Scored] | WorldFailed:
        try:
            scenario = draw(seed, root)
        except WorldFailed as failed:
            return failed
        return scenario, score(scenario)

    with ThreadPoolExecutor(max_workers=len(SAMPLE)) as pool:
        return dict(zip(SAMPLE, pool.map(one, SAMPLE), strict=True))


@pytest.mark.multiprocess
@pytest.mark.parametrize("seed", [_param(seed) for seed in SAMPLE])
def test_the_report_on_a_drawn_hang_is_not_wrong(sample, seed: int) -> None:
    found = sample[seed]
    assert not isinstance(found, WorldFailed), str(found)
    scenario, scored = found
    if scored.score == "wrong":
        raise WrongScore(f"seed {seed} ({scenario.name}): {scored.why}: {scored.line!r}; truth: {scenario.truth.why}")
    assert scored.score in ("right", "honest"), scored


@pytest.mark.multiprocess
@pytest.mark.parametrize("seed", [1007, 1019])
def test_a_gloo_p2p_stall_names_the_sender_from_the_shims_log(sample, seed: int) -> None:
    """G-NO-P2P: torch's Gloo dumps hold no send or receive; the shim's log (S-P2P-MATCH) says the receiver waits
    on a send its peer never posted. Before the log, seed 1007 (a batch's irecv waited on from the user's line) read
    "cannot tell" (#42)."""
    found = sample[seed]
    assert not isinstance(found, WorldFailed), str(found)
    scenario, scored = found
    assert scored.score == "right" and scored.kind == "p2p_stall", (scored, scenario.truth.why)
    assert scored.ranks == scenario.truth.ranks and "did not send to rank" in scored.line, scored


def test_the_sample_holds_every_incident() -> None:
    assert {draw_recipe(seed)["incident"]["kind"] for seed in SAMPLE} == set(INCIDENTS)
    assert all(draw_recipe(seed)["world"] <= 4 for seed in SAMPLE)


# --- the scorer's rules ---------------------------------------------------------------------------------------------

_TRUTH = Truth(frozenset({"never_came"}), (3,))


def _reported(code: int | None, name: str | None = None, ranks: list[int] | None = None, payload: bool = True) -> Any:
    body = {"line": "the line", "exit_code": code}
    if name is not None:
        body["kind"] = {"name": name, "ranks": ranks or []}
    return Reported(code, body if payload else None, "", 0.1)


@pytest.mark.parametrize(
    ("reported", "verdict"),
    [
        (_reported(1, "never_came", [3]), "right"),
        (_reported(1, "never_came", [2, 3]), "wrong"),  # a waiter blamed too
        (_reported(1, "never_came", []), "wrong"),
        (_reported(1, "still_working", [3]), "wrong"),  # the right rank, the wrong kind
        (_reported(1, "cannot_tell", [0, 1, 2]), "honest"),
        (_reported(1, "unclear", []), "honest"),
        (_reported(0, "agree"), "wrong"),
        (_reported(2), "wrong"),
        (_reported(3, "never_came", [3]), "wrong"),
        (_reported(None, payload=False), "wrong"),  # past its bound
        (_reported(1, payload=False), "wrong"),  # no JSON
    ],
)
def test_the_scorer_calls_right_only_the_truths_kind_and_ranks(reported: Reported, verdict: str) -> None:
    assert judge(_TRUTH, reported)[0] == verdict


def test_where_no_kind_is_right_only_cannot_tell_is_honest() -> None:
    invisible = Truth(frozenset(), (1,))
    assert judge(invisible, _reported(1, "cannot_tell", []))[0] == "honest"
    assert judge(invisible, _reported(1, "p2p_stall", [1]))[0] == "wrong"
    assert "only 'cannot tell' is honest" in judge(invisible, _reported(1, "stayed_in_block", [1]))[1]


# --- the recipes ----------------------------------------------------------------------------------------------------


def test_a_seed_draws_one_recipe_and_the_list_holds_each_incident_and_variant_alike() -> None:
    assert draw_recipe(1234) == draw_recipe(1234)
    assert draw_recipe(1234) != draw_recipe(1238)
    recipes = [draw_recipe(seed) for seed in SEEDS]
    assert len(SEEDS) >= 100
    for kind in INCIDENTS:
        these = [r for r in recipes if r["incident"]["kind"] == kind]
        assert len(these) == len(SEEDS) // len(INCIDENTS), kind
        variants = [r["incident"].get("variant", r["incident"].get("groups")) for r in these]
        assert {variants.count(v) for v in VARIANTS[kind]} <= {len(these) // len(VARIANTS[kind]) + d for d in (0, 1)}
    assert {r["world"] for r in recipes} == set(range(2, 9))
    made_by = {f["made_by"] for r in recipes for f in r["families"].values()}
    assert made_by == {"default", "mesh", "new_group", "split_group"}
    assert {s["op"] for r in recipes for s in r["history"]} == {*gloo_worlds.OPS, "batch_p2p"}
    assert {len(r["history"]) for r in recipes} == {0, 1, 2, 3}


def _blocks_close_a_circle(incident: dict[str, Any]) -> bool:
    """Each block's first group holds the next block, and each member's second group is the previous block's first."""
    blocks, parts, order = incident["blocks"], incident["parts"], incident["order"]
    k = len(blocks)
    for i, block in enumerate(blocks):
        for rank in block:
            first, then = order[str(rank)]
            if first != f"c{i}" or then != f"c{(i - 1) % k}" or not set(blocks[(i + 1) % k]) <= set(parts[first]):
                return False
    return True


@pytest.mark.parametrize("seed", SEEDS)
def test_every_truth_is_the_incident_as_drawn(seed: int) -> None:
    recipe = draw_recipe(seed)
    incident, truth = recipe["incident"], gloo_worlds.truth_of(recipe)
    families = recipe["families"]
    for family in families.values():
        ranks = [r for part in family["parts"] for r in part]
        assert len(ranks) == len(set(ranks)) and set(ranks) <= set(range(recipe["world"])), family
    if incident["kind"] == "circular":
        members = {r for part in incident["parts"].values() for r in part}
        assert set(truth.ranks) == members == {int(r) for r in incident["order"]}
        assert truth.kinds == {"circular_wait"} and _blocks_close_a_circle(incident)
        return
    part = incident["part"]
    assert part in families[incident["family"]]["parts"] and truth.ranks == (incident["culprit"],)
    assert incident["culprit"] in part and truth.group_ranks == tuple(part)
    if incident["kind"] == "p2p":
        assert incident["waiter"] in part and incident["waiter"] not in (0, incident["culprit"])
        assert truth.kinds == {"never_came", "p2p_stall"} and recipe["world"] >= 3
        return
    assert truth.kinds == {incident["kind"]} and len(part) >= 2
    if incident["variant"] in ("gil", "dead"):
        assert incident["culprit"] != 0  # rank 0 serves the store the others dump through


# --- the world's check ----------------------------------------------------------------------------------------------


def _ran_as_drawn(recipe: dict[str, Any]) -> list[RankResult]:
    roles = gloo_worlds._expected_roles(recipe)
    results = []
    for rank in range(recipe["world"]):
        if rank in gloo_worlds._ends(recipe):
            results.append(RankResult(rank, gloo_worlds._ends(recipe)[rank]))
            continue
        members = {name: next(p for p in f["parts"] if rank in p) for name, f in recipe["families"].items()
                   if any(rank in p for p in f["parts"])}  # fmt: skip
        role, outcome = roles[rank]
        incident = {"role": role, **({"outcome": outcome} if outcome else {})}
        out = {"members": members, "synced": True, "timeouts_s": [gloo_worlds.STEADY_S], "incident": incident}
        results.append(RankResult(rank, 0, out))
    return results


def test_a_world_that_did_not_run_as_drawn_is_refused(tmp_path) -> None:
    recipe = draw_recipe(1020)  # never came, asleep: rank 0 the culprit, rank 1 waits
    for rank in range(recipe["world"]):
        (tmp_path / f"fr_trace_rank_{rank}").write_bytes(b"")
    assert gloo_worlds._check(recipe, _ran_as_drawn(recipe), tmp_path) is None
    waiter_finished = _ran_as_drawn(recipe)
    waiter_finished[1].result["incident"]["outcome"] = "completed"
    assert "drawn ('waiter', 'raised')" in gloo_worlds._check(recipe, waiter_finished, tmp_path)
    no_samples = _ran_as_drawn(recipe)
    no_samples[0].result["incident"]["bounded"] = True
    assert "without its samples" in gloo_worlds._check(recipe, no_samples, tmp_path)
    long_timeout = _ran_as_drawn(recipe)
    long_timeout[1].result["timeouts_s"] = [120.0]
    assert "timeouts [120.0] s" in gloo_worlds._check(recipe, long_timeout, tmp_path)
    (tmp_path / "fr_trace_rank_1").unlink()
    assert gloo_worlds._check(recipe, _ran_as_drawn(recipe), tmp_path) == "no dump from ranks [1]"
