"""Which ranks the run had (:mod:`nemo_rl_shim.hang_report.world`): each rule on dumps and group maps built for it.

Only a record that states the world makes it known; every statement agrees; every file rank and group member lies
inside; where nothing states it, the file names stand in, within an allowance. Whole folders: tests/hang_report/
test_hang_report_reading.py and test_hang_report_torch_gloo.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.bounds import MAX_WORLD
from nemo_rl_shim.hang_report.records import DumpError, GroupFacts
from nemo_rl_shim.hang_report.world import (
    UNRECORDED_MISSING,
    World,
    check_ranks,
    stated_world,
    unrecorded_limit,
    world_of,
)
from tests.harness.hang_records import dump

pytestmark = [pytest.mark.every_lane]


def _dumps(ranks, **more) -> dict:
    return {r: dump(r, **more) for r in ranks}


def _sidecar(groups: dict[str, GroupFacts], **more) -> dict:
    return {"groups": groups, **more}


# --- what states the world ------------------------------------------------------------------------------------------


def test_a_default_group_listed_rank_by_rank_states_the_world() -> None:
    found = stated_world(_dumps([0], default_ranks=range(4)))
    assert found == World(4, "the default group listed in /dumps/nccl_trace_rank_0", known=True)
    assert stated_world(_dumps([0], default_ranks=(0, 1, 2))) == World(
        3, "the default group listed in /dumps/nccl_trace_rank_0", known=True
    )  # fmt: skip
    assert stated_world(_dumps([0], default_ranks=())) is None  # an empty list states nothing


def test_a_default_group_listed_in_any_order_states_the_world() -> None:
    for listed in (range(3, -1, -1), (2, 0, 3, 1)):
        assert stated_world(_dumps([0], default_ranks=listed)).size == 4  # type: ignore[union-attr]
    backwards = {0: dump(0, world_size=4, groups={"1": GroupFacts(range(4, -1, -2), stated=True)})}
    with pytest.raises(DumpError, match="lists rank 4, outside"):
        world_of(backwards)


def test_a_group_map_without_groups_states_the_world_by_its_size_alone() -> None:
    assert stated_world(sidecars={3: {"world_size": 6}}) == World(6, "the world_size in rank 3's group map", True)
    assert stated_world(sidecars={3: {"groups": None}}) is None


def test_a_default_group_that_is_not_0_to_n_minus_1_is_refused() -> None:
    for listed in ((1, 2, 3), (0, 1, 3), range(1, 5)):
        with pytest.raises(DumpError, match=r"its default group lists ranks .*, not 0 to "):
            stated_world(_dumps([0], default_ranks=listed))


def test_a_world_size_states_the_world() -> None:
    assert stated_world(_dumps([0], world_size=8)) == World(8, "the world_size in /dumps/nccl_trace_rank_0", True)
    assert stated_world(_dumps([0])) is None


def test_a_group_map_states_the_world_only_for_a_default_group_it_lists() -> None:
    """A group map's default group counts where the map lists its members; one known only from the rank's own
    entries (``stated`` false: the rank alone) would make a world of one."""
    seen_only = _sidecar({"0": GroupFacts((0,), stated=False, desc="default_pg")})
    assert stated_world(sidecars={0: seen_only}) is None
    listed = _sidecar({"0": GroupFacts(range(4), stated=True, desc="default_pg")})
    assert stated_world(sidecars={2: listed}) == World(4, "the default group listed in rank 2's group map", True)
    by_axis = _sidecar({"7": GroupFacts(range(6), stated=True, axes=("default",))}, path=Path("/d/map_2.json"))
    assert stated_world(sidecars={2: by_axis}) == World(6, "the default group listed in /d/map_2.json", True)
    other = _sidecar({"7": GroupFacts(range(2), stated=True, axes=("tp",), desc="mesh_tp")})
    assert stated_world(sidecars={2: other}) is None
    sized = _sidecar({}, world_size=5)
    assert stated_world(sidecars={2: sized}) == World(5, "the world_size in rank 2's group map", True)


def test_a_group_map_with_two_default_groups_states_the_world_once() -> None:
    two = _sidecar({"0": GroupFacts(range(4), True, desc="default_pg"), "9": GroupFacts(range(2), True, ("default",))})
    assert stated_world(sidecars={0: two}).size == 4  # type: ignore[union-attr]


def test_the_users_world_comes_first_and_every_statement_must_agree() -> None:
    assert stated_world(given=4) == World(4, "--world", True)
    assert stated_world(_dumps([0], world_size=4), given=4) == World(4, "--world", True)
    with pytest.raises(DumpError, match=r"^the world disagrees: --world says 4 ranks, the world_size in .* says 8$"):
        stated_world(_dumps([0], world_size=8), given=4)
    with pytest.raises(DumpError, match=r"the default group listed in .* says 4 ranks, the world_size in .* says 5"):
        stated_world(_dumps([0], default_ranks=range(4), world_size=5))
    with pytest.raises(DumpError, match=r"rank 1's group map says 3 ranks, the world_size in .*rank_0 says 5"):
        stated_world(_dumps([0], world_size=5), sidecars={1: _sidecar({}, world_size=3)})


def test_a_world_of_no_rank_or_more_than_the_report_reads_is_refused() -> None:
    assert stated_world(given=1) == World(1, "--world", True)
    assert stated_world(given=MAX_WORLD).size == MAX_WORLD  # type: ignore[union-attr]
    for size in (0, -1, MAX_WORLD + 1):
        with pytest.raises(DumpError, match=f"--world states a world of {size:,} ranks: the report reads 1 to "):
            stated_world(given=size)


# --- ranks inside the world -----------------------------------------------------------------------------------------


def test_a_file_rank_equal_to_the_world_size_is_outside_it() -> None:
    world = World(4, "--world", True)
    check_ranks(world, [0, 3], {})
    with pytest.raises(DumpError, match=r"^d/4: rank 4 is outside the world of 4 ranks \(--world\)$"):
        check_ranks(world, [0, 4], {4: "d/4"})
    with pytest.raises(DumpError, match=r"^d/5: rank 5 is outside .* \(and 1 more files\)$"):
        check_ranks(world, [9, 5], {5: "d/5", 9: "d/9"})
    check_ranks(World(4, "guess", known=False), [0, 99], {})  # a guessed world checks nothing


def test_a_group_member_equal_to_the_world_size_is_outside_it() -> None:
    inside = {0: dump(0, world_size=4, groups={"1": GroupFacts((0, 3), stated=True)})}
    assert world_of(inside).size == 4
    outside = {0: dump(0, world_size=4, groups={"1": GroupFacts((2, 4), stated=True)})}
    with pytest.raises(DumpError, match=r"group '1' lists rank 4, outside the world of 4 ranks"):
        world_of(outside)
    seen = {0: dump(0, world_size=4, groups={"1": GroupFacts((9,), stated=False)})}  # only its entries: not listed
    assert world_of(seen).size == 4
    empty = {0: dump(0, world_size=4, groups={"1": GroupFacts((), stated=True)})}
    assert world_of(empty).size == 4
    wide = {0: dump(0, world_size=4, groups={"1": GroupFacts(range(0, 8, 2), stated=True)})}
    with pytest.raises(DumpError, match="lists rank 6, outside"):
        world_of(wide)


# --- where nothing states it ----------------------------------------------------------------------------------------


def test_without_a_statement_the_highest_file_rank_stands_in_and_says_so() -> None:
    found = world_of(_dumps([0, 2]))
    assert found == World(3, "the highest rank among the file names: no record states the world", known=False)
    assert world_of(_dumps([0, 2]), given=5) == World(5, "--world", True)


def test_the_missing_ranks_allowed_without_a_statement_are_as_many_as_the_dumps_or_4096() -> None:
    assert (unrecorded_limit(10), unrecorded_limit(UNRECORDED_MISSING + 5)) == (UNRECORDED_MISSING, 4101)
    assert UNRECORDED_MISSING == 4096
    at_limit = _dumps([0, UNRECORDED_MISSING + 1])  # ranks 1 .. 4096 missing: 4096
    assert world_of(at_limit).size == UNRECORDED_MISSING + 2
    with pytest.raises(DumpError, match=r"rank 4098 would leave 4,097 ranks without a dump; keep one run per folder"):
        world_of(_dumps([0, UNRECORDED_MISSING + 2]))


def test_as_many_missing_ranks_as_dumps_are_allowed_past_4096() -> None:
    many = 5000
    ranks = [*range(many), 2 * many + 1]  # 5,001 dumps, 5,001 missing: as many as the dumps
    assert world_of(_dumps(ranks)).size == 2 * many + 2
    with pytest.raises(DumpError, match="would leave 5,002 ranks"):
        world_of(_dumps([*range(many), 2 * many + 2]))


def test_no_dump_at_all_is_a_world_of_none() -> None:
    assert world_of({}) == World(0, "the highest rank among the file names: no record states the world", False)
