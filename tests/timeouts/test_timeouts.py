"""Phase timeouts (nemo_rl_shim.timeouts) on two real gloo ranks through the real setup_distributed.

Values are fractions of a minute so that a stall fits a test: start-up 0.2 min
(12 s), steady 0.05 min (3 s), raised 0.3 min (18 s), stall 6 s (above the
steady value, below the start-up one). Each module fixture is one spawn of two
ranks whose JSON result several tests read. No wall-clock assertion: the time a
stall takes to be detected is reported (``record_property``), not asserted; the
spawn timeout bounds every rank.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch

from automodel_patch._simulated_group import simulated_default_group
from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.setup.distributed import DistributedContext
from nemo_rl_shim.timeouts import current_timeouts, extended_timeout
from tests.ranks.timeouts import DISTINCT_BASE_S

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

STARTUP_MIN, STEADY_MIN, RAISED_MIN, OTHER_STEADY_MIN = 0.2, 0.05, 0.3, 0.1
STARTUP_S, STEADY_S, RAISED_S, OTHER_STEADY_S = 12.0, 3.0, 18.0, 6.0
STALL_S = 6.0
RAISED = datetime.timedelta(seconds=RAISED_S)
SPAWN_TIMEOUT_S = 300
WORLD_SIZE = 2


#: The ranks run on CPU with gloo, also on a machine with GPUs (two ranks cannot share one for NCCL).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def _spawn(target: str, params: dict[str, Any]) -> list[RankResult]:
    """Both ranks' results; a rank that exits uncleanly *after* writing its result (Gloo's teardown of a
    timed-out group has been seen to abort) still counts, so one abnormal exit cannot error every test."""
    results = spawn_ranks(
        f"tests.ranks.timeouts:{target}",
        params,
        world_size=WORLD_SIZE,
        timeout_s=SPAWN_TIMEOUT_S,
        env=CPU_ONLY,
        check=False,
    )
    missing = [f"rank {r.rank}: {r.error or r.output[-2000:]}" for r in results if not isinstance(r.result, dict)]
    assert not missing, "ranks without a result:\n" + "\n".join(missing)
    return results


@pytest.fixture(scope="module")
def readings() -> list[dict[str, Any]]:
    """Per rank: timeouts of every group and backend in each phase (one spawn)."""
    params = {
        "startup": STARTUP_MIN,
        "steady": STEADY_MIN,
        "raised": RAISED_MIN,
        "other_steady": OTHER_STEADY_MIN,
    }
    return [r.result for r in _spawn("phase_readings", params)]


@pytest.fixture(scope="module")
def stalls() -> list[RankResult]:
    """Per rank: outcome of a stalled all-reduce at start-up, inside extended_timeout and in steady state."""
    params = {"startup": STARTUP_MIN, "steady": STEADY_MIN, "raised": RAISED_MIN, "stall": STALL_S}
    return _spawn("stall_outcomes", params)


def _off(phase: dict[str, dict[str, float]], expected: float) -> dict[str, dict[str, float]]:
    """Groups with a backend whose timeout is not ``expected`` seconds."""
    return {name: per_device for name, per_device in phase.items() if set(per_device.values()) != {expected}}


# --- every group and every backend, phase by phase -------------------------------------------------


def test_run_groups_covers_default_axes_flattened_and_moe(readings):
    for rank in readings:
        groups = rank["mesh_groups"]
        assert "default" in groups
        assert any(name.startswith("mesh.flat.") for name in groups), f"no flattened axis: {sorted(groups)}"
        assert any(name.startswith("moe.") for name in groups), f"no MoE mesh with ep=2: {sorted(groups)}"
        missed = [name for name, group in groups.items() if not group["in_run_groups"]]
        assert missed == [], f"run_groups misses {missed}; it holds {rank['run_groups']}"


def test_every_backend_is_read(readings):
    for rank in readings:
        for phase in ("startup", "steady", "extended", "after_extended", "after_error"):
            empty = [name for name, per_device in rank[phase].items() if "cpu" not in per_device]
            assert empty == [], f"{phase}: no CPU backend read on {empty}"


def test_startup_value_on_default_group(readings):
    for rank in readings:
        assert rank["startup"]["default"] == {"cpu": STARTUP_S, "cuda": STARTUP_S}


def test_startup_value_on_every_group(readings):
    # On torch 2.9 (the torch-2.9 CI lane) this depends on setup_distributed's post-build timeout pass: a
    # no-op pass fails here there, and only there (torch 2.10+ builds every group with the timeout).
    for rank in readings:
        assert _off(rank["startup"], STARTUP_S) == {}


def test_extended_timeout_restores_each_groups_own_value(readings):
    """Every distinct group got its own value first (10 s, 11 s, ... in run_groups order): the exit must
    bring back each group's own value, on every name it goes by."""
    for rank in readings:
        order = rank["run_groups"]
        assert len(order) > 2, order
        expected = {
            name: {device: float(DISTINCT_BASE_S + order.index(m["run_name"])) for device in rank["distinct"][name]}
            for name, m in rank["mesh_groups"].items()
        }
        assert rank["distinct"] == expected
        assert _off(rank["extended_at_startup"], RAISED_S) == {}
        assert rank["after_extended_at_startup"] == expected


def test_extended_timeout_restores_each_half_when_the_halves_differ() -> None:
    """A group whose CPU and CUDA halves are separate backends with different timeouts (as a GPU run's
    "cuda:nccl,cpu:gloo" default group is): each half gets its own value back.

    One rank, in this process: the composite default group is simulated
    (:func:`automodel_patch._simulated_group.simulated_default_group`; its CUDA half is a second Gloo
    object, NCCL being the boundary this machine lacks). The timeouts are real backend state.
    """
    cpu_s, cuda_s = datetime.timedelta(seconds=5), datetime.timedelta(seconds=8)
    context = DistributedContext(None, None, None, None, 1, 1, 1)
    with simulated_default_group("cuda:nccl,cpu:gloo") as group:
        cpu, cuda = group._get_backend(torch.device("cpu")), group._get_backend(torch.device("cuda"))
        assert cpu is not cuda
        cpu._set_default_timeout(cpu_s)
        cuda._set_default_timeout(cuda_s)
        with extended_timeout(context, RAISED_MIN):
            assert current_timeouts(context) == {"default": {"cpu": RAISED, "cuda": RAISED}}
        assert current_timeouts(context) == {"default": {"cpu": cpu_s, "cuda": cuda_s}}


def test_after_first_step_sets_every_group_and_backend_to_steady(readings):
    for rank in readings:
        assert rank["after_first_step"] is True
        assert _off(rank["steady"], STEADY_S) == {}


def test_extended_timeout_raises_then_restores_steady(readings):
    for rank in readings:
        assert _off(rank["extended"], RAISED_S) == {}
        assert rank["extended_all_reduce"] == WORLD_SIZE
        assert _off(rank["after_extended"], STEADY_S) == {}


def test_extended_timeout_restores_steady_when_body_raises(readings):
    for rank in readings:
        assert _off(rank["extended_before_error"], RAISED_S) == {}
        assert rank["body_error"] == "slow phase failed"
        assert _off(rank["after_error"], STEADY_S) == {}


# --- end to end: the steady value comes from nemo_rl_shim through setup_distributed ----------------


def test_steady_value_comes_from_config_through_setup_distributed(readings):
    for rank in readings:
        assert rank["context_steady_minutes"] == STEADY_MIN
        other = rank["other"]
        assert other["context_steady_minutes"] == OTHER_STEADY_MIN
        assert other["after_first_step"] is True
        assert _off(other["readings"], OTHER_STEADY_S) == {}


def test_after_first_step_without_steady_knob_keeps_startup_value(readings):
    for rank in readings:
        unset = rank["unset"]
        assert unset["context_steady_minutes"] is None
        assert unset["after_first_step"] is False
        assert unset["readings"]["default"] == {"cpu": STARTUP_S, "cuda": STARTUP_S}


# --- a stalled rank, phase by phase ------------------------------------------------------------------


def _phase(result: dict[str, Any], name: str) -> Any:
    """A phase's outcome on one rank; a phase that never ran (the late-rank phase failed and ended the run) is named."""
    assert name in result, f"phase {name!r} did not run: rank {result['rank']} stopped after {result['late_to_steady']}"
    return result[name]


def _healthy(stalls: list[RankResult]) -> dict[str, Any]:
    return next(r.result for r in stalls if not r.result["stalled"])


def test_stall_is_on_a_mesh_axis_group_of_both_ranks(stalls):
    for r in stalls:
        assert r.result["group_ranks"] == list(range(WORLD_SIZE))


def test_stall_survived_during_startup(stalls):
    for r in stalls:
        assert r.result["startup"]["outcome"] == "completed", r.result["startup"]
        assert r.result["startup"]["sum"] == WORLD_SIZE


def test_a_rank_late_to_after_first_step_is_waited_for_under_the_startup_value(stalls, record_property):
    """One rank is still in a slow start-up phase (6 s, twice the steady 3 s) when its peer finishes the first
    step; the first collective under the steady value, right after ``after_first_step``, must still succeed.

    This is what the barrier in ``after_first_step`` is for: without it, the fast rank lowers its
    timeout to 3 s at once and its all-reduce times out waiting for the late rank.
    """
    healthy = _healthy(stalls)
    for r in stalls:
        late = r.result["late_to_steady"]
        assert late["outcome"] == "completed", (
            f"rank {r.rank}: the collective right after after_first_step failed while a peer was "
            f"{STALL_S} s late to it (steady {STEADY_S} s): {late}"
        )
        assert late["sum"] == WORLD_SIZE
    waited = healthy["late_to_steady"]["waited_in_after_first_step_s"]
    record_property("fast_rank_waited_in_after_first_step_s", round(waited, 3))
    print(f"\nthe fast rank waited {waited:.2f} s in after_first_step for a peer {STALL_S} s late")


def test_stall_survived_inside_extended_timeout(stalls):
    for r in stalls:
        extended = _phase(r.result, "extended")
        assert extended["outcome"] == "completed", extended
        assert extended["sum"] == WORLD_SIZE


def test_stall_raises_after_first_step(stalls, record_property):
    healthy = _healthy(stalls)
    assert _phase(healthy, "steady_timeout_s") == STEADY_S
    steady = healthy["steady"]
    assert steady["outcome"] == "raised", steady
    assert steady["is_runtime_error"], steady
    assert f"Timed out waiting {STEADY_S * 1000:.0f}ms" in steady["error"], steady["error"]  # gloo names the timeout
    record_property("seconds_to_error", round(steady["seconds"], 3))
    print(f"\nstalled rank detected after {steady['seconds']:.2f} s (steady {STEADY_S} s, stall {STALL_S} s)")


def test_stalled_rank_sleeps_through_the_steady_timeout_without_entering(stalls):
    (stalled,) = [r for r in stalls if r.result["stalled"]]
    outcome = _phase(stalled.result, "steady")
    assert outcome["outcome"] == "skipped", outcome
    assert outcome["slept_s"] >= STALL_S > STEADY_S, outcome
    assert stalled.returncode == 0, stalled.output[-2000:]
