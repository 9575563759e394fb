"""The circular wait's rules (:mod:`nemo_rl_shim.hang_report.cycles`), each on waits built for it.

Which circle is named does not depend on the order of the findings (every order of small cases, Hypothesis for
larger ones); a circle is found wherever the waits hold one (Hypothesis), and only then; who counts as waiting; what
closes a circle. Whole dumps with a circular wait: tests/hang_report/test_hang_report_kinds.py and, on real Gloo
ranks, tests/hang_report/test_hang_kinds_progress.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_shim.hang_report.analysis import Finding
from nemo_rl_shim.hang_report.cycles import Cycle, find_cycle, waits
from tests.harness.hang_records import GLOO, dump, entry, group, p2p, stall

pytestmark = [pytest.mark.every_lane]

#: One wait: (kind, group, waiting ranks, ranks waited on); kind "stall" (a collective) or "p2p" (a recv).
Spec = tuple[str, str, tuple[int, ...], tuple[int, ...]]


def _findings(specs: Sequence[Spec]) -> tuple[list[Finding], dict]:
    """Findings whose waiting ranks are all still blocked: each in its group's collective #1, unfinished on an NCCL
    recorder (a p2p wait needs no entry)."""
    groups: dict[str, object] = {}
    findings = []
    for kind, name, waiting, on in specs:
        state = groups.setdefault(name, group(name, range(8)))
        if kind == "stall":
            for rank in waiting:
                state.entries[rank] = entry(name)
            findings.append(stall(state, on, waiting))
        else:
            findings.append(p2p(state, on[0], waiting))
    return findings, {rank: dump(rank) for rank in range(8)}


def _circle(specs: Sequence[Spec]) -> Cycle | None:
    findings, dumps = _findings(specs)
    return find_cycle(findings, dumps)


def _steps(cycle: Cycle | None) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]] | None:
    return None if cycle is None else [(s.group.name, s.waiting, s.on) for s in cycle.steps]


def _same_in_every_order(specs: Sequence[Spec]) -> Cycle | None:
    """The circle of ``specs``, checked to be the same circle for every order of the findings."""
    findings, dumps = _findings(specs)
    first = find_cycle(findings, dumps)
    for order in itertools.permutations(findings):
        found = find_cycle(list(order), dumps)
        assert _steps(found) == _steps(first), (order, _steps(found), _steps(first))
    return first


# the waits of the issue: 0 -> 1, 1 -> 2, 2 -> 1, 2 -> 0 (2 -> 1 listed first made the greedy walk miss the circle)
FOUR_WAITS: list[Spec] = [("stall", "a", (0,), (1,)), ("stall", "b", (1,), (2,)), ("stall", "c", (2,), (1,)),
                          ("stall", "d", (2,), (0,))]  # fmt: skip


def test_the_circle_is_the_same_for_every_order_of_the_findings() -> None:
    cycle = _same_in_every_order(FOUR_WAITS)
    assert _steps(cycle) == [("a", (0,), (1,)), ("b", (1,), (2,)), ("d", (2,), (0,))]


@pytest.mark.parametrize(
    "specs, expected",
    [
        pytest.param(  # two circles apart: the one through the lowest rank
            [("stall", "c", (2,), (3,)), ("stall", "d", (3,), (2,)), ("stall", "a", (0,), (1,)),
             ("stall", "b", (1,), (0,))],
            [("a", (0,), (1,)), ("b", (1,), (0,))], id="two circles",
        ),
        pytest.param(  # a long circle and a short one through rank 0: the shortest
            [("stall", "a", (0,), (1,)), ("stall", "b", (1,), (2,)), ("stall", "c", (2,), (0,)),
             ("stall", "d", (1,), (0,))],
            [("a", (0,), (1,)), ("d", (1,), (0,))], id="a shortcut",
        ),
        pytest.param(  # two waits of rank 0 close circles of one length: the one first in the waits' order
            [("stall", "b", (0,), (2,)), ("stall", "c", (2,), (0,)), ("stall", "a", (0,), (1,)),
             ("stall", "d", (1,), (0,))],
            [("a", (0,), (1,)), ("d", (1,), (0,))], id="a tie",
        ),
    ],
)  # fmt: skip
def test_which_circle_is_named_where_there_are_several(specs: list[Spec], expected: list) -> None:
    assert _steps(_same_in_every_order(specs)) == expected


def test_a_cascade_is_not_a_cycle_even_when_a_rank_is_visited_twice() -> None:
    """Rank 1 is reached from rank 0 (a cascade: it waits on nobody) before rank 2, which waits on it and on rank 3:
    a visited rank off the search's stack is no way back, and the circle 2 <-> 3 is still found."""
    specs: list[Spec] = [("stall", "a", (0,), (1,)), ("stall", "b", (2,), (1, 3)), ("stall", "c", (3,), (2,))]
    cycle = _same_in_every_order(specs)
    assert cycle is not None and cycle.ranks == [1, 2, 3]
    assert _steps(cycle) == [("b", (2,), (1, 3)), ("c", (3,), (2,))]
    assert _circle(specs[:1] + specs[2:]) is None  # without the wait that closes it, none


def test_waits_are_tried_by_their_lowest_waiting_rank_in_the_circle_then_their_group() -> None:
    """Rank 1 waits with rank 2 in group y2 but is in no circle: its number does not put that wait first."""
    specs: list[Spec] = [("stall", "y2", (1, 2), (3,)), ("stall", "a", (2,), (3,)), ("stall", "z", (3,), (2,))]
    assert _steps(_same_in_every_order(specs)) == [("a", (2,), (3,)), ("z", (3,), (2,))]
    # ranks 0 and 3 (both in the circle) wait together: the wait's lowest rank (0) orders it, not its highest
    specs = [("stall", "a", (0, 3), (1,)), ("stall", "b", (0,), (2,)), ("stall", "c", (1,), (0, 3)),
             ("stall", "d", (2,), (0,))]  # fmt: skip
    assert _steps(_same_in_every_order(specs)) == [("a", (0, 3), (1,)), ("c", (1,), (0, 3))]


def test_the_shortest_circle_of_the_lowest_rank_is_named_whichever_of_its_waits_is_tried_first() -> None:
    specs: list[Spec] = [("stall", "a", (0,), (1,)), ("stall", "b", (1,), (2,)), ("stall", "c", (2,), (0,)),
                         ("stall", "z", (0,), (3,)), ("stall", "y", (3,), (0,))]  # fmt: skip
    assert _steps(_same_in_every_order(specs)) == [("z", (0,), (3,)), ("y", (3,), (0,))]


def test_a_receive_and_a_collective_of_one_group_close_a_circle() -> None:
    """Rank 0 waits in a recv from rank 1 on group g, while rank 1 waits in g's all_reduce for rank 0: one
    communicator, each op behind the other."""
    cycle = _same_in_every_order([("p2p", "g", (0,), (1,)), ("stall", "g", (1,), (0,))])
    assert _steps(cycle) == [("g", (0,), (1,)), ("g", (1,), (0,))]


def test_a_rank_reached_before_its_own_turn_does_not_end_the_search() -> None:
    """Rank 1 waits on rank 4 and is reached from rank 0 first; the search then goes on past it to ranks 2 and 3."""
    specs: list[Spec] = [("stall", "a", (0,), (1,)), ("stall", "b", (1,), (4,)), ("stall", "c", (2,), (3,)),
                         ("stall", "d", (3,), (2,))]  # fmt: skip
    assert _steps(_same_in_every_order(specs)) == [("c", (2,), (3,)), ("d", (3,), (2,))]


def test_a_chain_that_does_not_return_is_not_a_circle() -> None:
    assert _circle([("stall", "a", (0,), (1,)), ("stall", "b", (1,), (2,)), ("stall", "c", (2,), (3,))]) is None
    assert _circle([]) is None


def test_collective_waits_of_one_group_are_no_circle_but_sends_and_receives_are() -> None:
    """Two collectives' waits on each other in one group cannot both hold (the group's waiting ranks are at its
    newest collective, the ranks they wait on behind it); a receive on each side of one group can."""
    assert _circle([("stall", "a", (0,), (1,)), ("stall", "a", (1,), (0,))]) is None
    cycle = _same_in_every_order([("p2p", "a", (0,), (1,)), ("p2p", "a", (1,), (0,))])
    assert _steps(cycle) == [("a", (0,), (1,)), ("a", (1,), (0,))]
    assert cycle is not None and all(step.p2p for step in cycle.steps)
    assert cycle.describe() == (
        "rank 0 waits in recv #1 on process group a, ranks 0-7 for rank 1, which waits in recv #1 on process group a, "
        "ranks 0-7 for rank 0"
    )


def test_a_circle_across_a_receive_and_a_collective() -> None:
    cycle = _same_in_every_order([("p2p", "pp", (0,), (1,)), ("stall", "dp", (1,), (0,))])
    assert _steps(cycle) == [("pp", (0,), (1,)), ("dp", (1,), (0,))]
    assert cycle is not None and [s.op for s in cycle.steps] == ["recv", "all_reduce"]
    assert cycle.to_json()["steps"][0]["p2p"] is True and cycle.to_json()["steps"][1]["p2p"] is False


def test_the_description_names_each_step_and_says_which_for_the_ranks_just_named() -> None:
    cycle = _circle([("stall", "a", (0, 1), (2, 3)), ("stall", "b", (2, 3), (4,)), ("stall", "c", (4,), (0,))])
    assert cycle is not None and cycle.ranks == [0, 1, 2, 3, 4]
    assert cycle.describe() == (
        "ranks 0-1 wait in all_reduce #1 on process group a, ranks 0-7 for ranks 2-3, which wait in all_reduce #1 on "
        "process group b, ranks 0-7 for rank 4, which waits in all_reduce #1 on process group c, ranks 0-7 for rank 0"
    )
    # the next step's waiting ranks are not the ranks just named: they are named again
    cycle = _circle([("stall", "a", (0,), (1, 2)), ("stall", "b", (1,), (0,))])
    assert cycle is not None
    assert cycle.describe() == (
        "rank 0 waits in all_reduce #1 on process group a, ranks 0-7 for ranks 1-2, rank 1 waits in all_reduce #1 on "
        "process group b, ranks 0-7 for rank 0"
    )
    assert cycle.to_json() == {
        "ranks": [0, 1, 2],
        "steps": [
            {"waiting": [0], "group": "a", "label": "process group a, ranks 0-7", "op": "all_reduce", "seq": 1,
             "on": [1, 2], "p2p": False},
            {"waiting": [1], "group": "b", "label": "process group b, ranks 0-7", "op": "all_reduce", "seq": 1,
             "on": [0], "p2p": False},
        ],
    }  # fmt: skip


# --- who counts as waiting --------------------------------------------------------------------------------------


def _inversion(entries: dict[int, object], dumps: dict) -> Cycle | None:
    """Rank 0 waits in g1 #1 for rank 1, which waits in g2 #1 for rank 0; the entries and dumps as given."""
    g1 = group("1", (0, 1), entries={0: entries[0]})
    g2 = group("2", (0, 1), entries={1: entries[1]})
    return find_cycle([stall(g1, [1], [0]), stall(g2, [0], [1])], dumps)


def test_a_rank_counts_as_waiting_in_its_newest_op_whatever_its_recorder() -> None:
    e0, e1 = entry("1"), entry("2")
    assert _inversion({0: e0, 1: e1}, {0: dump(0, e0, GLOO, "nccl"), 1: dump(1, e1, GLOO, "nccl")}) is not None


def test_a_recorder_that_cannot_show_completion_does_not_hold_a_rank_in_an_older_op() -> None:
    """Gloo's recorder leaves every entry 'scheduled': an older op it did not retire is no evidence of a wait."""
    e0, e1, later = entry("1"), entry("2"), entry("9", seq=5)
    gloo = {0: dump(0, later, GLOO, "nccl"), 1: dump(1, later, GLOO, "nccl")}
    assert _inversion({0: e0, 1: e1}, gloo) is None
    nccl = {0: dump(0, later), 1: dump(1, later)}  # NCCL's marks it unfinished: still waiting
    assert _inversion({0: e0, 1: e1}, nccl) is not None
    done = entry("1", state="completed")
    assert _inversion({0: done, 1: e1}, nccl) is None


def test_a_rank_whose_entry_is_at_another_collective_does_not_wait_in_this_one() -> None:
    e0, e1 = entry("1", seq=2), entry("2")
    assert _inversion({0: e0, 1: e1}, {0: dump(0, e0), 1: dump(1, e1)}) is None


def test_a_rank_without_an_entry_or_a_dump_does_not_wait() -> None:
    e0, e1 = entry("1"), entry("2")
    assert _inversion({0: e0, 1: e1}, {1: dump(1, e1)}) is None
    g1, g2 = group("1", (0, 1)), group("2", (0, 1), entries={1: e1})
    assert find_cycle([stall(g1, [1], [0]), stall(g2, [0], [1])], {0: dump(0, e0), 1: dump(1, e1)}) is None


def test_only_stalls_and_p2p_findings_are_waits() -> None:
    findings, dumps = _findings([("stall", "a", (0,), (1,)), ("p2p", "b", (1,), (0,))])
    other = Finding("not finished", findings[0].group, [0], 1, "all_reduce", [1], None, 0)
    empty = Finding("stall", findings[0].group, [], 1, "all_reduce", [0], None, 0)
    gone_on = Finding("stall", findings[0].group, [0], 1, "all_reduce", [5], None, 0)  # rank 5 holds no entry: none
    found = waits([other, *findings, empty, gone_on], dumps)
    assert [(w.waiting, w.on, w.op, w.p2p) for w in found] == [
        ((0,), (1,), "all_reduce", False),
        ((1,), (0,), "recv", True),
    ]


# --- larger cases: Hypothesis ------------------------------------------------------------------------------------


@st.composite
def _wait_sets(draw) -> list[Spec]:
    """Up to 9 waits among 6 ranks: one collective stall per group (as the analysis finds them), receives in any."""
    specs: list[Spec] = []
    for index in range(draw(st.integers(0, 9))):
        ranks = draw(st.permutations(range(6)))
        cut = draw(st.integers(1, 3))
        waiting, on = tuple(sorted(ranks[:cut])), tuple(sorted(ranks[cut : cut + draw(st.integers(1, 2))]))
        if draw(st.booleans()):
            specs.append(("stall", f"g{index}", waiting, on))
        else:
            specs.append(("p2p", draw(st.sampled_from(["pp0", "pp1"])), waiting, on[:1]))
    return specs


def _has_circle(specs: Sequence[Spec]) -> bool:
    """Whether the ranks' waits hold a cycle: peel ranks that wait on no rank left until none is left, or none can."""
    edges = {r: set() for _, _, waiting, on in specs for r in (*waiting, *on)}
    for _, _, waiting, on in specs:
        for rank in waiting:
            edges[rank] |= set(on) - {rank}
    while True:
        free = [r for r, out in edges.items() if not out & edges.keys()]
        if not free:
            return bool(edges)
        for rank in free:
            del edges[rank]


@settings(max_examples=150, deadline=None, derandomize=True)  # the same examples every run: a steady figure
@given(specs=_wait_sets(), data=st.data())
def test_any_order_of_any_waits_names_the_same_circle_and_only_a_true_one(specs: list[Spec], data) -> None:
    findings, dumps = _findings(specs)
    cycle = find_cycle(findings, dumps)
    shuffled = data.draw(st.permutations(findings))
    assert _steps(find_cycle(shuffled, dumps)) == _steps(cycle)
    assert (cycle is not None) == _has_circle(specs)
    if cycle is None:
        return
    steps = cycle.steps
    for here, there in zip(steps, [*steps[1:], steps[0]], strict=True):
        assert set(here.on) & set(there.waiting), steps  # each step waits on the next one's ranks, and it closes
    assert len({s.group.key for s in steps}) >= 2 or any(s.p2p for s in steps)
