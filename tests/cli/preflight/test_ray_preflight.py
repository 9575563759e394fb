"""``nemo-rl-shim preflight --ray`` against a real local Ray head: passing, stalled, and nothing left behind.

The head, the CLI runs and the leak check run in one process tree inside a private network
namespace (:mod:`tests.ray_harness.scenarios`, started with ``unshare --net``): loopback only, as
the workplace requires, and no port clash with anything outside. The tree starts before the
suite's workers when the run allows it, so that its head comes up on an idle machine
(:mod:`tests.ray_harness.tree`, which says why). Bounded: the whole tree is killed at
:data:`tests.ray_harness.tree.SCENARIOS_TIMEOUT_S` from its start, and every process of the head is
ended afterwards by its network namespace, failure included. A test fails if one is left.

Measured figures (wall time of the passing run, time to report the stall) are printed and
recorded with ``record_property``; nothing is asserted against a clock except the bound
the command itself enforces (``--timeout-s``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from nemo_rl_shim.cli.preflight.rank_checks import SKIPPED
from nemo_rl_shim.cli.preflight.stuck import FAILURE_GRACE_S
from tests.harness.skips import unavailable
from tests.ray_harness import tree as ray_tree
from tests.ray_harness.scenarios import LOADED_STALL_TIMEOUT_S, PASS_TIMEOUT_S, STALL_TIMEOUT_S

__all__: list[str] = []

pytestmark = [pytest.mark.multiprocess, pytest.mark.ray]

TIMEOUT_MINUTES = 45.0


@pytest.fixture(scope="module")
def scenarios() -> dict[str, Any]:
    """What the Ray scenarios saw: from the tree that the pytest process started before the workers, or one
    started here (:mod:`tests.ray_harness.tree`). Every process of its head is ended either way, failure included."""
    pytest.importorskip("ray", reason="the ray extra is not installed (uv sync --extra ray)")
    tree, started = ray_tree.started_early(), None
    if tree is None:
        wrapper, why_not = ray_tree.namespace_wrapper()
        if wrapper is None:
            unavailable(why_not)
        started = ray_tree.start(wrapper)
        tree = started.tree
    try:
        facts = ray_tree.collect(tree)
    finally:
        if started is not None:
            started.release()
    assert "error" not in facts, facts["error"]
    assert facts["loopback_up"]["returncode"] == 0, facts["loopback_up"]
    for failure in facts.get("head_failures", []):  # a try that failed before the head came up (ray_scenarios)
        print(f"\nray start --head failed on port {failure['port']} after {failure['wall_s']} s:\n{failure['stderr']}")
    head = facts["head"]
    assert head["returncode"] == 0, f"ray start --head: {head}; stderr ends:\n{head.get('stderr', '')[-3000:]}"
    where = "before the suite's workers" if started is None else "by this test"
    print(f"\nray start --head, started {where}: up in {head['wall_s']} s")
    return facts


def test_two_cpu_actors_pass_with_every_group_at_the_timeout(scenarios, record_property) -> None:
    run = scenarios["passing"]
    assert run["returncode"] == 0, run["stderr"]
    report = run["report"]
    assert (report["ok"], report["launcher"], report["world_size"]) == (True, "ray", 2)
    assert report["note"] == "no GPU in the Ray cluster: 2 CPU bundles (gloo), strategy PACK"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    nodes = {r["node"]["node_id"] for r in report["ranks"]}
    assert len(nodes) == 1 and {r["node"]["node_ip"] for r in report["ranks"]} == {"127.0.0.1"}
    for rank in report["ranks"]:
        assert {"default", "dp_shard", "tp", "dp"} <= {row["group"] for row in rank["rows"]}
        for row in rank["rows"]:
            assert set(row["timeout_minutes"].values()) == {TIMEOUT_MINUTES}, row
            assert row["cpu_all_reduce"] == "ok", row
        assert rank["offload"]["ok"], rank["offload"]
    record_property("ray_preflight_wall_s", run["wall_s"])
    print(f"\nRay preflight, 2 CPU actors: exit 0 in {run['wall_s']} s (report wall {report['wall_s']} s)")


def _failure_line(run: dict[str, Any]) -> str:
    assert run["returncode"] == 1, run["stderr"]
    failed = [line for line in run["stderr"].splitlines() if "FAILED" in line]
    assert len(failed) == 1, run["stderr"]
    return failed[0]


def test_a_stalled_actor_is_named_in_one_line_within_the_bound(scenarios, record_property) -> None:
    """Rank 0 waits in a collective at the 45-minute timeout: ``--timeout-s`` ends the run, naming both phases.

    The run is made at :data:`STALL_TIMEOUT_S`, and again at :data:`LOADED_STALL_TIMEOUT_S` only where an actor's
    set-up outlasted the first bound (each try's line is printed); the second bound is the last word.
    """
    run = scenarios["stalled"]
    for earlier in run["earlier_tries"]:  # made again only because an actor was not yet in its phase
        first = _failure_line(earlier)
        print(f"\nthe stalled run at {earlier['bound_s']} s ended before set-up did: {first}")
        assert not ("was in all_reduce on group" in first and "was in stalling 3600 s" in first), first
    assert run["bound_s"] == (LOADED_STALL_TIMEOUT_S if run["earlier_tries"] else STALL_TIMEOUT_S), run["bound_s"]
    line = _failure_line(run)
    actor = r"\(actor nemo-rl-shim-preflight-[0-9a-f]{8}-rank%d on node 127\.0\.0\.1\)"
    expected = (
        # --timeout-s bounds the whole command (#46): the ranks had what reading and the imports left of it
        rf"preflight: FAILED: ranks 0-1 did not finish within ([0-9.]+) s \(what --timeout-s {run['bound_s']} left "
        r"for the ranks\): "
        rf"rank 0 {actor % 0} was in all_reduce on group default for (\d+) s; "
        rf"rank 1 {actor % 1} was in stalling 3600 s after set-up \(fault injection\) for (\d+) s"
    )
    stuck = {r["rank"]: r for r in run["report"]["ranks"]}
    stacks = "\n".join(f"rank {rank}: {r.get('stack')}" for rank, r in stuck.items())
    found = re.fullmatch(expected, line)
    assert found, f"{line}\nwhere each rank was:\n{stacks}\nthe run's stderr:\n{run['stderr']}"
    # Each rank has been in its phase since its set-up ended, inside the run: at most the run's wall time (the
    # bound, and the moments the report took to be read after it: 302 s at a load of 41 on 2 cores).
    assert 0 < float(found[1]) <= run["bound_s"], line
    waited, stalled = (int(found[i]) for i in (2, 3))
    assert 0 <= waited <= math.ceil(run["wall_s"]) and 0 <= stalled <= math.ceil(run["wall_s"]), (line, run["wall_s"])
    assert round(stuck[0]["phase_s"]) == waited and round(stuck[1]["phase_s"]) == stalled, stacks
    # Where: rank 1 in the fault injection's sleep, rank 0 inside its all_reduce (innermost frames, innermost last).
    assert re.fullmatch(r"nemo_rl_shim/cli/preflight/rank_checks\.py:\d+ in check_rank", stuck[1]["stack"][-1]), stacks
    assert any(" in _group_row" in frame for frame in stuck[0]["stack"]), stacks
    assert "check_rank" not in stuck[0]["stack"][-1], stacks
    assert run["report"]["timed_out"] is True and run["report"]["ok"] is False
    record_property("stall_report_s", run["wall_s"])
    print(f"\nstalled actor reported after {run['wall_s']} s (--timeout-s {run['bound_s']})")


def test_a_peer_that_gives_up_ends_the_run_before_its_bound(scenarios, record_property) -> None:
    """Rank 0's collective times out (12 s): it skips the rest, and the run ends 10 s later, not at ``--timeout-s``."""
    run = scenarios["gave_up"]
    line = _failure_line(run)
    expected = (
        f"rank 1 did not finish: still running {FAILURE_GRACE_S:g} s after rank 0 gave up on its peers "
        "(its cpu all_reduce on group default timed out): rank 1 (actor nemo-rl-shim-preflight-"
    )
    assert expected in line, line
    assert re.search(r"was in stalling 3600 s after set-up \(fault injection\) for \d+ s$", line), line
    assert run["report"]["timed_out"] is False and run["report"]["ok"] is False
    (rank_0,) = [r for r in run["report"]["ranks"] if r["rank"] == 0]
    outcomes = [row["cpu_all_reduce"] for row in rank_0["rows"]]
    assert outcomes[0].startswith("failed: RuntimeError") and set(outcomes[1:]) == {SKIPPED}, outcomes
    record_property("gave_up_report_s", run["wall_s"])
    print(f"\nstalled actor reported after {run['wall_s']} s (--timeout-s {PASS_TIMEOUT_S} not reached)")


def test_a_stalled_actor_is_named_by_the_flight_recorder_dumps(scenarios) -> None:
    """Both actors wrote their dumps on their node (one node here); the driver read them after the run."""
    hang = scenarios["gave_up"]["report"]["hang_report"]
    assert hang["kind"]["name"] == "never_came" and hang["kind"]["ranks"] == [1], hang["kind"]
    assert hang["line"].partition(": ")[2].startswith("rank 1 did not enter all_reduce #"), hang
    assert "on default" in hang["line"] and "in which rank 0 waited" in hang["line"], hang["line"]
    assert "written by the Ray actors on their node (127.0.0.1)" in hang["summary"], hang["summary"]
    assert sorted(hang["dumps"]) == ["0", "1"] or sorted(hang["dumps"]) == [0, 1], hang["dumps"]
    assert scenarios["gave_up"]["stderr"].rstrip().splitlines()[-1] == f"preflight: {hang['summary']}"


def test_a_world_larger_than_the_cluster_is_refused_before_placing_actors(scenarios) -> None:
    run = scenarios["too_large"]
    assert run["returncode"] == 2, run["stderr"]
    lines = [line for line in run["stderr"].splitlines() if line.startswith("preflight: the config asks")]
    assert lines == [
        "preflight: the config asks for 16 training ranks, from --world 16; the Ray cluster can place 2 ranks (no GPU "
        "in the Ray cluster: 2 CPU bundles (gloo), strategy PACK): check that layout with --dry-run, or run on a Ray "
        "cluster with 16 GPUs (--world N or --nproc N checks N ranks here instead)"
    ], run["stderr"]
    seen = run["before_disconnect"]
    assert seen is not None and (seen["actors"], seen["placement_groups"]) == ([], []), seen


@pytest.mark.parametrize("run", ["passing", "stalled", "gave_up"])
def test_no_actor_or_placement_group_is_left_when_the_driver_disconnects(scenarios, run: str) -> None:
    """Seen by the command's own driver just before it disconnects (after that, Ray would end them itself).

    Measured: a clean-up that skips removing the placement group on the failure path fails here
    (the group is still CREATED). One that skips ``ray.kill`` but removes the group passes, and
    rightly: Ray kills the actors placed in a group when the group is removed.
    """
    for outcome in [scenarios[run], *scenarios[run].get("earlier_tries", [])]:
        seen = outcome["before_disconnect"]
        assert seen is not None, f"the {run} run's driver recorded nothing before disconnecting: {outcome}"
        assert "error" not in seen, seen["error"]
        assert len(seen["actors"]) == 2, seen  # two actors: both created, both gone
        assert {a["state"] for a in seen["actors"]} == {"DEAD"}, seen["actors"]
        assert len(seen["placement_groups"]) == 1, seen
        assert {g["state"] for g in seen["placement_groups"]} == {"REMOVED"}, seen["placement_groups"]


def test_no_process_of_the_head_outlives_the_clean_up(scenarios, record_property) -> None:
    clean_up = scenarios["clean_up"]
    assert clean_up["namespace"] is not None, "the head's network namespace was never seen: nothing to clean up by"
    assert clean_up["ended"], "the clean-up found no process of the head in its namespace; it would miss them all"
    assert clean_up["left"] == [], f"processes of the head outlived the clean-up: {clean_up['left']}"
    record_property("head_processes_ended", len(clean_up["ended"]))
    names = "; ".join(command[:100] for command in clean_up["ended"])
    print(f"\nclean-up ended {len(clean_up['ended'])} processes of the head: {names}")
