"""Every group torch holds follows the phases; groups with their own timeout keep it; teardown restores torch's.

Two parts:

* one module-scoped world of 4 real Gloo ranks through the real ``setup_distributed`` (one spawn;
  :func:`tests.ranks.later.phases`): the groups a NeMo RL worker makes after set-up are audited
  at start-up (2 min), after the first step (1 min), inside ``extended_timeout`` (3 min) and after it;
  then a new world after ``destroy_process_group``, and a run without a timeout;
* one Gloo rank in this process (``init_process_group`` on a ``HashStore``), for the rules one by one.

The audit itself (:mod:`nemo_rl_shim.audit`) is tested in tests/audit/test_audit.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from nemo_rl_shim.audit import GroupsAudit, TimeoutSource
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.process_groups import later, registry, setting
from nemo_rl_shim.process_groups.registry import backend_timeouts
from nemo_rl_shim.setup.distributed import DistributedContext
from nemo_rl_shim.timeouts import after_first_step, current_timeouts, extended_timeout, run_groups
from tests.harness.one_rank import by_name, one_rank_world, readings

pytestmark = [pytest.mark.every_lane]

#: Values that are read back, never waited out, and each group connects within its own: a minute and more. With
#: 12 s, 3 s and 7 s, a group's members, 4 ranks beside another suite at a load of 60, did not all connect in time.
STARTUP_MIN, STEADY_MIN, RAISED_MIN, OWN_S = 2.0, 1.0, 3.0, 90.0
STARTUP_S, STEADY_S, RAISED_S = 120.0, 60.0, 180.0
GLOO_DEFAULT_S = 30 * 60.0
WORLD_SIZE = 4
SPAWN_TIMEOUT_S = 300
#: The ranks run on CPU with gloo, also on a machine with GPUs.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
#: Groups made with a timeout of their own, and that value in seconds.
OWN = {"own": OWN_S, "own_at_steady": STEADY_S}
S = datetime.timedelta


# --- 4 ranks, the real set-up, every phase ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    params = {"startup": STARTUP_MIN, "steady": STEADY_MIN, "raised": RAISED_MIN, "own_s": OWN_S}
    results = spawn_ranks(
        "tests.ranks.later:phases", params, world_size=WORLD_SIZE, timeout_s=SPAWN_TIMEOUT_S, env=CPU_ONLY
    )
    return [r.result for r in results]


def _audit(rank: dict[str, Any], phase: str) -> GroupsAudit:
    return GroupsAudit.from_json(rank[phase])


def _off(audit: GroupsAudit, own_names: dict[str, float], seconds: float) -> dict[str, Any]:
    """Groups that do not read ``seconds`` from the configured value on every backend (own groups: their own value)."""
    off = {}
    for group in audit.groups:
        if group.group_name in own_names:
            wanted = {b.device: (own_names[group.group_name], TimeoutSource.OWN) for b in group.backends}
        else:
            wanted = {b.device: (seconds, TimeoutSource.CONFIGURED) for b in group.backends}
        if not group.backends or readings(group) != wanted:
            off[group.label] = readings(group)
    return off


def _own(rank: dict[str, Any]) -> dict[str, float]:
    return {rank["names"][name]: seconds for name, seconds in OWN.items()}


@pytest.mark.multiprocess
def test_later_groups_are_in_torchs_registry_and_work(ranks) -> None:
    for rank in ranks:
        names = rank["names"]
        startup = by_name(_audit(rank, "startup"))
        made_before_the_first_step = {n for n in names if n not in ("after_first_step", "inside_extended")}
        made_before_the_first_step.discard("inside_failed_phase")
        assert {names[n] for n in made_before_the_first_step} <= set(startup), (names, sorted(startup))
        assert startup[names["replica"]].ranks in ((0, 1), (2, 3)), startup[names["replica"]]
        assert set(rank["startup_sums"].values()) == {2.0, 4.0}, rank["startup_sums"]
        assert rank["extended_sums"] == {"replica": 2.0, "inside": 4.0}
        assert rank["every_group"] is True


@pytest.mark.multiprocess
def test_every_group_reads_the_start_up_value_on_every_backend(ranks) -> None:
    for rank in ranks:
        audit = _audit(rank, "startup")
        assert audit.configured_s == STARTUP_S
        assert len(audit.groups) >= 10, [g.label for g in audit.groups]
        assert _off(audit, _own(rank), STARTUP_S) == {}


@pytest.mark.multiprocess
def test_every_group_reads_the_steady_value_after_the_first_step(ranks) -> None:
    for rank in ranks:
        audit = _audit(rank, "steady")
        assert audit.configured_s == STEADY_S
        assert rank["names"]["after_first_step"] in by_name(audit)
        assert _off(audit, _own(rank), STEADY_S) == {}


@pytest.mark.multiprocess
def test_every_group_reads_the_phases_value_inside_extended_timeout(ranks) -> None:
    for rank in ranks:
        audit = _audit(rank, "extended")
        assert rank["names"]["inside_extended"] in by_name(audit)
        assert _off(audit, _own(rank), RAISED_S) == {}


@pytest.mark.multiprocess
@pytest.mark.parametrize("phase", ["after_extended", "after_error"])
def test_every_group_reads_the_steady_value_after_the_phase(ranks, phase: str) -> None:
    """Groups made inside the phase too: they leave it at the value in force outside."""
    for rank in ranks:
        audit = _audit(rank, phase)
        made_inside = "inside_extended" if phase == "after_extended" else "inside_failed_phase"
        assert rank["names"][made_inside] in by_name(audit)
        assert _off(audit, _own(rank), STEADY_S) == {}


@pytest.mark.multiprocess
def test_destroy_process_group_gives_the_next_world_torchs_defaults(ranks) -> None:
    for rank in ranks:
        assert rank["hook_is_torchs"] is True
        assert rank["following_after_destroy"] is False
        audit = _audit(rank, "torch_world")
        assert audit.configured_s is None
        assert len(audit.groups) == 3
        assert {readings(g)["cpu"] for g in audit.groups} == {(GLOO_DEFAULT_S, TimeoutSource.TORCH_DEFAULT)}


@pytest.mark.multiprocess
def test_without_a_configured_timeout_nothing_changes(ranks) -> None:
    for rank in ranks:
        assert rank["unconfigured_following"] is False
        audit = _audit(rank, "unconfigured")
        assert audit.configured_s is None
        assert len(audit.groups) >= 4, [g.label for g in audit.groups]
        readings = {(b.timeout_s, b.source) for g in audit.groups for b in g.backends}
        assert readings == {(GLOO_DEFAULT_S, TimeoutSource.TORCH_DEFAULT)}


# --- one Gloo rank in this process: the rules one by one ----------------------------------------------------


@pytest.fixture
def world() -> Iterator[DistributedContext]:
    """A one-rank Gloo world at the start-up value; torn down (and torch's function back) after."""
    with one_rank_world(S(seconds=STARTUP_S), STEADY_MIN) as context:
        yield context


def _seconds(group: Any) -> set[float]:
    return {timeout.total_seconds() for timeout in backend_timeouts(group).values()}


def test_a_group_made_later_gets_the_followed_value(world) -> None:
    before = dist.new_group(backend="gloo")  # made before following: torch's default, then moved by follow()
    assert _seconds(before) == {GLOO_DEFAULT_S}
    assert later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    assert _seconds(before) == {STARTUP_S}
    assert _seconds(dist.new_group()) == {STARTUP_S}
    assert _seconds(dist.new_group(backend="gloo")) == {STARTUP_S}


@pytest.mark.parametrize("milliseconds", [4001, 4002, 4054, 4055, 4_123, 2_700_001])
def test_a_group_made_later_reads_the_followed_value_to_the_millisecond(world, milliseconds: int) -> None:
    """A learned value such as 4.055 s: torch 2.15 truncates a new group's timeout through a float (4.054 s
    without :data:`~nemo_rl_shim.process_groups.later.CREATION_SLACK`), and the group would no longer follow."""
    followed = S(milliseconds=milliseconds)
    later.follow(followed, {"default": dist.group.WORLD})
    made = dist.new_group()
    assert set(backend_timeouts(made).values()) == {followed}
    assert set(later.group_sources(made).values()) == {later.TimeoutSource.CONFIGURED}
    assert after_first_step(world) is True  # it follows the steady value like every other group
    assert _seconds(made) == {STEADY_S}


def test_own_timeouts_are_kept_through_every_phase(world) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    own = dist.new_group(timeout=S(seconds=OWN_S))
    own_at_steady = dist.new_group(timeout=S(seconds=STEADY_S))
    follower = dist.new_group()
    assert after_first_step(world) is True
    assert (_seconds(follower), _seconds(own), _seconds(own_at_steady)) == ({STEADY_S}, {OWN_S}, {STEADY_S})
    with extended_timeout(world, RAISED_MIN):
        assert (_seconds(follower), _seconds(own), _seconds(own_at_steady)) == ({RAISED_S}, {OWN_S}, {STEADY_S})
    assert (_seconds(follower), _seconds(own), _seconds(own_at_steady)) == ({STEADY_S}, {OWN_S}, {STEADY_S})


def test_a_group_given_its_own_value_later_keeps_it(world) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    group = dist.new_group()
    setting.set_group_timeout(S(seconds=OWN_S), group)
    after_first_step(world)
    assert _seconds(group) == {OWN_S}
    assert registry.group_key(group) not in run_groups(world)


def test_a_group_one_millisecond_off_the_followed_value_keeps_its_own(world) -> None:
    """c10d keeps whole milliseconds: 1 ms off is a value of the group's own, not the followed one."""
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    group = dist.new_group()
    setting.set_group_timeout(S(seconds=STARTUP_S, milliseconds=1), group)
    assert set(later.group_sources(group).values()) == {later.TimeoutSource.OWN}
    after_first_step(world)
    assert _seconds(group) == {STARTUP_S + 0.001}


def test_run_groups_and_current_timeouts_cover_every_follower(world) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    follower, own = dist.new_group(), dist.new_group(timeout=S(seconds=OWN_S))
    assert list(run_groups(world)) == ["default", registry.group_key(follower)]
    assert registry.group_key(own) not in current_timeouts(world)
    assert current_timeouts(world)[registry.group_key(follower)] == {
        "cpu": S(seconds=STARTUP_S),
        "cuda": S(seconds=STARTUP_S),
    }


def test_a_group_made_in_a_failed_phase_leaves_it_at_the_value_outside(world) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    made: list[Any] = []
    with pytest.raises(RuntimeError, match="body"), extended_timeout(world, RAISED_MIN):
        made.append(dist.new_group())
        assert _seconds(made[0]) == {RAISED_S}
        raise RuntimeError("body")
    assert _seconds(made[0]) == {STARTUP_S}
    assert later.following() == S(seconds=STARTUP_S)


def test_restore_torch_defaults_undoes_following(world) -> None:
    torchs = c10d._get_default_timeout
    later.follow(S(seconds=STARTUP_S))
    assert c10d._get_default_timeout is not torchs and later.stand_in_installed()
    later.restore_torch_defaults()
    later.restore_torch_defaults()  # twice is harmless
    assert c10d._get_default_timeout is torchs and not later.stand_in_installed()
    assert later.following() is None
    assert _seconds(dist.new_group()) == {GLOO_DEFAULT_S}


def test_destroy_process_group_ends_following() -> None:
    torchs = c10d._get_default_timeout
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        later.follow(S(seconds=STARTUP_S))
        dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert c10d._get_default_timeout is torchs  # torch's own again, put back by its first call
        assert later.following() is None
        assert _seconds(dist.group.WORLD) == _seconds(dist.new_group()) == {GLOO_DEFAULT_S}
    finally:
        dist.destroy_process_group()
        later.restore_torch_defaults()


def test_a_detection_probe_pauses_following_and_does_not_end_it(world) -> None:
    """automodel_patch's probes make a one-rank group the default group for one call, and put the run's back."""
    from automodel_patch._simulated_group import simulated_default_group

    later.follow(S(seconds=STARTUP_S))
    with simulated_default_group("gloo"):
        assert later.following() is None
        assert c10d._get_default_timeout("gloo") == S(seconds=GLOO_DEFAULT_S)
    assert later.following() == S(seconds=STARTUP_S)
    assert _seconds(dist.new_group()) == {STARTUP_S}


def test_without_following_the_phases_move_only_the_run_groups(world) -> None:
    other = dist.new_group()
    assert list(run_groups(world)) == ["default"]
    assert after_first_step(world) is True
    assert _seconds(dist.group.WORLD) == {STEADY_S}
    assert _seconds(other) == _seconds(dist.new_group()) == {GLOO_DEFAULT_S}
    assert after_first_step(world._replace(timeout_minutes_after_init=None)) is False


def test_follow_without_a_default_group_warns_and_does_nothing() -> None:
    with pytest.warns(RuntimeWarning, match="no default process group exists"):
        assert later.follow(S(seconds=STARTUP_S)) is False
    assert later.following() is None
