"""The kind of a hang, each rule of :func:`~nemo_rl_shim.hang_report.kinds.classify` on findings, stacks and
progress built for it (not dumps written and read back).

The catalogue's cases, from dumps: tests/hang_report/test_hang_report_kinds.py; real Gloo ranks:
tests/hang_report/test_hang_kinds.py and test_hang_kinds_progress.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.analysis import Analysis, Finding, GroupState
from nemo_rl_shim.hang_report.frames import Frame, frame
from nemo_rl_shim.hang_report.kinds import MAX_LINE_CHARS, Kind, classify, fit_line
from nemo_rl_shim.hang_report.progress import CANNOT_JUDGE, NOT_WORKING, WORKING, Progress
from nemo_rl_shim.hang_report.stacks import RankStack, StackSample
from nemo_rl_shim.hang_report.suggest import longer_timeout
from nemo_rl_shim.hang_report.world import World
from tests.harness.hang_records import GLOO, dump, entry, group, p2p, stall

pytestmark = [pytest.mark.every_lane]

TP = group("7", range(4), axes=["tp"])
USER = frame("/job/train.py", 57, "load_batch")
IN_TORCH = frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501, "all_reduce")


def _stack(rank: int, *frames: Frame, what: str | None = "train step") -> RankStack:
    frames = frames or (USER,)
    sample = StackSample(frames, 1_000 + 600 * 10**9)
    return RankStack(rank, Path(f"/d/fr_stack_rank_{rank}.txt"), frames=frames, samples=(sample,), fired=True,
                     what=what, entered_ns=1_000, after_s=600.0)  # fmt: skip


def _progress(rank: int, verdict: str = WORKING, ran_s: float | None = 600.0, phase: str | None = "save") -> Progress:
    return Progress(rank, verdict, "stack moved" if verdict == WORKING else "idle", ran_s=ran_s, phase=phase)


def _analysis(findings: list[Finding], missing: tuple[int, ...] = (), entries: int = 1, world: World | None = None,
              ranks: tuple[int, ...] = (0, 1, 2, 3)) -> Analysis:  # fmt: skip
    dumps = {r: dump(r, n_entries=entries) for r in ranks if r not in missing}
    return Analysis(findings, [TP], list(missing), dumps, 4, world)


def _kind(findings: list[Finding], stacks: dict | None = None, progress: dict | None = None, **more) -> Kind:
    return classify(_analysis(findings, **more), stacks or {}, progress or {})


# --- still working: every rank named, working ----------------------------------------------------------------------


def test_still_working_needs_every_rank_named_to_be_working() -> None:
    """One of the two ranks that did not enter working, the other asleep: they never came, not "still working"."""
    stacks = {2: _stack(2), 3: _stack(3)}
    mixed = {2: _progress(2, WORKING), 3: _progress(3, NOT_WORKING)}
    assert _kind([stall(TP, [2, 3], [0, 1], seq=4)], stacks, mixed).name == "never_came"
    without = {2: _progress(2, WORKING)}  # rank 3's progress unknown: not "working"
    assert _kind([stall(TP, [2, 3], [0, 1], seq=4)], stacks, without).name == "never_came"
    working = {2: _progress(2, ran_s=100.0), 3: _progress(3, ran_s=600.0, phase="slowest")}
    kind = _kind([stall(TP, [2, 3], [0, 1], seq=4)], stacks, working)
    assert (kind.name, kind.ranks) == ("still_working", (2, 3))
    assert kind.suggestion == longer_timeout("slowest", 600.0)  # the slowest rank's phase and time


def test_still_working_needs_a_stack_that_placed_the_rank() -> None:
    kind = _kind([stall(TP, [3], [0, 1, 2], seq=4)], {}, {3: _progress(3)})
    assert (kind.name, kind.variant) == ("never_came", "unplaced")


def test_a_rank_working_through_a_groups_first_collective_needs_a_longer_start_up() -> None:
    stacks, working = {3: _stack(3)}, {3: _progress(3, ran_s=300.0, phase=None)}
    first = _kind([stall(TP, [3], [0, 1, 2], seq=1)], stacks, working)
    assert first.suggestion == longer_timeout(None, 300.0, start_up=True)
    later = _kind([stall(TP, [3], [0, 1, 2], seq=2)], stacks, working)
    assert later.suggestion == longer_timeout(None, 300.0)
    send = _kind([p2p(TP, 3, [0], seq=1)], stacks, working)  # a p2p op's first number is no start-up
    assert (send.name, send.suggestion) == ("still_working", longer_timeout(None, 300.0))
    unknown = _kind([stall(TP, [3], [0, 1, 2], seq=2)], stacks, {3: _progress(3, ran_s=None, phase=None)})
    assert unknown.suggestion == longer_timeout(None, 0.0)


# --- never came: where the rank was ---------------------------------------------------------------------------------


def test_never_came_says_where_the_rank_was() -> None:
    asleep = {3: _progress(3, NOT_WORKING)}
    python = _kind([stall(TP, [3], [0, 1, 2], seq=4)], {3: _stack(3)}, asleep)
    assert (python.name, python.variant) == ("never_came", "python")
    assert python.suggestion is not None
    assert python.suggestion.text == "fix: what rank 3 waits for at train.py:57 in load_batch"
    elsewhere = _kind([stall(TP, [3], [0, 1, 2], seq=4)], {3: _stack(3, IN_TORCH, USER)}, asleep)
    assert (elsewhere.name, elsewhere.variant) == ("never_came", "elsewhere")
    assert elsewhere.suggestion is not None
    assert elsewhere.suggestion.text == "fix: the collective rank 3 waits in, at train.py:57 in load_batch"
    no_frame = _kind([stall(TP, [3], [0, 1, 2], seq=4)], {3: _stack(3, IN_TORCH)}, asleep)
    assert no_frame.suggestion is not None
    assert no_frame.suggestion.text == "fix: the collective rank 3 waits in, at distributed_c10d.py:2501 in all_reduce"


def _missing(ranks: list[int], waiting: list[int] | None = None) -> Finding:
    return Finding("missing", TP, ranks, 4, "all_reduce", [0, 1] if waiting is None else waiting, 12.0, 1_000)


def test_a_rank_without_a_dump_is_dead_or_in_a_c_call_that_holds_the_gil() -> None:
    dead = _kind([_missing([3])], missing=(3,))
    assert (dead.name, dead.variant, dead.ranks) == ("never_came", "dead", (3,))
    assert dead.suggestion is not None and dead.suggestion.text.startswith("fix: rank 3's host")
    gil = _kind([_missing([3])], {3: _stack(3)}, missing=(3,))
    assert (gil.name, gil.variant) == ("never_came", "gil")
    assert gil.suggestion is not None
    assert gil.suggestion.text == "fix: the C call rank 3 is in at train.py:57 in load_batch holds the GIL"
    two = _kind([_missing([2, 3])], {2: _stack(2), 3: _stack(3)}, missing=(2, 3))
    assert two.suggestion is not None and two.suggestion.text.startswith("fix: the C call ranks 2-3 are in at ")
    in_torch = _kind([_missing([3])], {3: _stack(3, IN_TORCH)}, missing=(3,))  # its watcher could have run
    assert (in_torch.name, in_torch.variant) == ("never_came", "elsewhere")


def test_a_missing_dump_that_nobody_waits_for_is_no_dump() -> None:
    kind = _kind([_missing([3], waiting=[])], missing=(3,))
    assert (kind.name, kind.ranks) == ("no_dump", (3,))
    assert kind.suggestion is not None
    assert kind.suggestion.text == "fix: rank 3's host: its process, its dump folder, its log"


def test_of_missing_dumps_the_one_whose_peers_still_wait_comes_first() -> None:
    """Rank 3's peers finished g1's all_reduce #4 (rank 3 then entered it) and still wait in g2's: g2 is where it
    stopped."""
    g1 = group("1", range(4), entries={0: entry("1", 4, state="completed"), 1: entry("1", 4, state="completed")})
    g2 = group("2", range(4), entries={0: entry("2", 9), 1: entry("2", 9)})
    finished = Finding("missing", g1, [3], 4, "all_reduce", [0, 1], None, 1_000)
    waiting = Finding("missing", g2, [3], 9, "broadcast", [0, 1], None, 2_000)
    other = Finding("missing", g2, [2], 9, "broadcast", [0, 1], None, 2_000)
    kind = _kind([finished, other, waiting], missing=(2, 3))
    assert kind.evidence["group"] == "2" and kind.evidence["op"] == "broadcast" and kind.ranks == (3,)
    alone = _kind([finished], missing=(3,))
    assert alone.evidence["group"] == "1"
    peers_unknown = Finding("missing", group("1", range(4)), [3], 4, "all_reduce", [0, 1], None, 1_000)
    assert _kind([peers_unknown, waiting], missing=(3,)).evidence["group"] == "1"  # no entry: they may still wait


# --- the other findings -------------------------------------------------------------------------------------------


def _mismatch(ranks: list[int], detail: str, called_at: dict | None = None) -> Finding:
    return Finding("mismatch", TP, ranks, 3, "all_reduce", [], None, 1_000, detail, called_at or {})


def test_a_mismatch_names_the_op_or_the_sizes_or_a_skipped_collective() -> None:
    op = _kind([_mismatch([1], "op broadcast (rank 1) where ranks 0, 2-3 have all_reduce")])
    assert (op.name, op.variant, op.ranks) == ("mismatch", "op", (1,))
    assert op.suggestion is not None and op.suggestion.text == "fix: the op rank 1 passes to all_reduce #3"
    sizes = _kind([_mismatch([1, 2], "input sizes [[8]] (ranks 1-2) where ranks 0, 3 have [[4]]")])
    assert (sizes.name, sizes.variant) == ("mismatch", "sizes")
    assert sizes.suggestion is not None and sizes.suggestion.text == "fix: the sizes ranks 1-2 pass to all_reduce #3"
    here, there = frame("/job/a.py", 1, "f"), frame("/job/b.py", 2, "g")
    places = {0: here, 1: there, 2: here, 3: here}
    skipped = _kind([_mismatch([1], "input sizes [[8]] (rank 1) where ranks 0, 2-3 have [[4]]", places)])
    assert (skipped.name, skipped.variant) == ("skipped_collective", None)
    assert skipped.suggestion is not None
    assert skipped.suggestion.text == "fix: the code path that skips all_reduce on rank 1, or adds one"


def test_a_rank_that_did_not_post_its_side_is_a_p2p_stall() -> None:
    kind = _kind([p2p(TP, 3, [0])])
    assert (kind.name, kind.ranks) == ("p2p_stall", (3,))
    assert kind.suggestion is not None
    assert kind.suggestion.text == "fix: why rank 3 does not post its side (the pipeline's schedule)"


def test_a_send_and_its_receive_both_posted_none_finished_is_the_transport() -> None:
    """Both sides did their part (torch's recorder: each op posted, neither completed): no rank is to blame, and the
    pair (not the whole group) is named."""
    pair = Finding("not finished", TP, [0, 1], 5, "send/recv", [], None, 1_000, "the send #5 of rank 0 and ...")
    kind = _kind([pair])
    assert (kind.name, kind.ranks) == ("all_entered_none_finished", (0, 1))
    assert kind.suggestion is not None
    assert kind.suggestion.text == "check the network and GPUs of ranks 0-3: no rank is to blame"
    waited = Finding("not finished", TP, [0, 1], 5, "send/recv", [2], None, 1_000, "the send #5 of rank 0 and ...")
    assert (_kind([waited]).name, _kind([waited]).ranks) == ("all_entered_none_finished", (0, 1))


def test_a_collective_every_member_entered_and_none_finished_names_the_group() -> None:
    found = Finding("not finished", TP, [0, 1, 2, 3], 5, "all_reduce", [], 30.0, 1_000)
    kind = _kind([found])
    assert (kind.name, kind.ranks) == ("all_entered_none_finished", (0, 1, 2, 3))


def test_a_rank_that_did_not_finish_what_its_peers_finished_is_its_host() -> None:
    kind = _kind([Finding("not finished", TP, [2], 5, "all_reduce", [0, 1, 3], None, 1_000)])
    assert (kind.name, kind.ranks) == ("did_not_finish", (2,))
    assert kind.suggestion is not None and kind.suggestion.text == "check rank 2's host: its GPU and NIC"


def test_someone_waiting_where_no_buffer_tells_on_whom_is_unclear() -> None:
    kind = _kind([Finding("unclear", TP, [], 5, "all_reduce", [0, 1], None, 1_000, "cannot tell whom")])
    assert (kind.name, kind.ranks, kind.body) == ("unclear", (0, 1), "cannot tell whom")


# --- circular waits ------------------------------------------------------------------------------------------------


def _blocked_in(*pairs: tuple[str, int]) -> dict:
    return {rank: dump(rank, entry(name)) for name, rank in pairs}


def test_a_circle_of_collectives_is_a_circular_wait_before_the_stall_it_is_made_of() -> None:
    g1 = group("1", (0, 1), entries={0: entry("1")})
    g2 = group("2", (0, 1), entries={1: entry("2")})
    findings = [stall(g1, [1], [0], created_ns=1), stall(g2, [0], [1], created_ns=2)]
    analysis = Analysis(findings, [g1, g2], [], _blocked_in(("1", 0), ("2", 1)), 2)
    kind = classify(analysis, {}, {})
    assert (kind.name, kind.ranks) == ("circular_wait", (0, 1))
    assert kind.suggestion is not None
    assert kind.suggestion.text == "fix: call these groups' collectives in one order on every rank"
    assert kind.evidence["cycle"]["ranks"] == [0, 1] and kind.evidence["finding"] == "stall"


def test_a_circle_of_sends_and_receives_is_a_circular_wait_not_a_p2p_stall() -> None:
    """Rank 0 receives from rank 1 while rank 1 receives from rank 0: each waits for the other (torch's recv blocks
    until the peer's send is posted); neither is the culprit."""
    pp = group("5", (0, 1))
    findings = [p2p(pp, 1, [0]), p2p(pp, 0, [1])]
    kind = classify(Analysis(findings, [pp], [], {0: dump(0), 1: dump(1)}, 2), {}, {})
    assert (kind.name, kind.ranks) == ("circular_wait", (0, 1))
    assert kind.body == "rank 0 waits in recv #1 on process group 5, ranks 0-1 for rank 1, which waits in recv #1 on " \
        "process group 5, ranks 0-1 for rank 0"  # fmt: skip
    assert kind.suggestion is not None and "batch_isend_irecv" in kind.suggestion.text
    one_way = classify(Analysis(findings[:1], [pp], [], {0: dump(0), 1: dump(1)}, 2), {}, {})
    assert one_way.name == "p2p_stall"


def test_a_circle_after_a_completed_barrier_is_named_whatever_the_order_of_the_findings() -> None:
    """#42: three Gloo ranks did a barrier, then each all_reduced on a pair group, the waits closing a circle. Gloo
    cannot say the barrier finished (G-STATE: every entry reads scheduled): that "cannot tell" is not what comes
    first, and the circle is the same for every order of the findings."""
    pairs = {"a": (0, 1), "b": (1, 2), "c": (0, 2)}
    first_in = {0: "a", 1: "b", 2: "c"}  # each rank waits in its first pair group on the rank that is not there
    states = {n: group(n, r, backend="gloo", entries={m: entry(n, 1, lib="gloo") for m in r if first_in[m] == n})
              for n, r in pairs.items()}  # fmt: skip
    waits = [stall(states[first_in[m]], [o for o in pairs[first_in[m]] if o != m], [m]) for m in range(3)]
    default = group("0", range(3), backend="gloo", axes=["default"])
    barrier = Finding("unconfirmed", default, [0, 1, 2], 3, "barrier", [], None, 500, "Gloo's recorder does not say")
    dumps = {m: dump(m, entry(first_in[m], 1, lib="gloo"), recorder=GLOO, lib="gloo") for m in range(3)}
    seen = set()
    for order in itertools.permutations([barrier, *waits]):
        kind = classify(Analysis(list(order), [default, *states.values()], [], dumps, 3), {}, {})
        assert (kind.name, kind.ranks) == ("circular_wait", (0, 1, 2)), kind.line
        seen.add(kind.body)
    assert len(seen) == 1, seen


def test_a_circle_is_looked_for_only_when_a_wait_comes_first() -> None:
    g1 = group("1", (0, 1), entries={0: entry("1")})
    g2 = group("2", (0, 1), entries={1: entry("2")})
    first = _mismatch([1], "op broadcast (rank 1) where ranks 0, 2-3 have all_reduce")
    findings = [first, stall(g1, [1], [0]), stall(g2, [0], [1])]
    kind = classify(Analysis(findings, [g1, g2], [], _blocked_in(("1", 0), ("2", 1)), 2), {}, {})
    assert kind.name == "mismatch"


# --- nothing found wrong --------------------------------------------------------------------------------------------


def test_a_rank_working_and_one_stuck_in_a_block_is_not_still_working() -> None:
    """No finding, two ranks past their blocks' deadlines: "still working" only where every one of them works."""
    stacks = {0: _stack(0), 1: _stack(1, frame("/job/data.py", 9, "wait"))}
    mixed = _kind([], stacks, {0: _progress(0), 1: _progress(1, NOT_WORKING)})
    assert (mixed.name, mixed.ranks) == ("stayed_in_block", (0, 1))
    assert (
        mixed.suggestion is not None
        and mixed.suggestion.text == "fix: what rank 0 waits for at train.py:57 in load_batch"
    )
    unjudged = _kind([], stacks, {0: _progress(0)})
    assert unjudged.name == "stayed_in_block"
    none = _kind([], stacks, {})
    assert none.name == "stayed_in_block"
    working = _kind([], stacks, {0: _progress(0, ran_s=60.0), 1: _progress(1, ran_s=900.0, phase="load")})
    assert (working.name, working.ranks) == ("still_working", (0, 1))
    assert working.suggestion == longer_timeout("load", 900.0)
    assert working.evidence["progress"][1]["verdict"] == WORKING
    unknown = _kind([], stacks, {0: _progress(0, ran_s=None), 1: _progress(1, ran_s=None, phase=None)})
    assert unknown.suggestion == longer_timeout("save", 0.0)


def test_a_stack_alone_says_whether_the_dumps_agree_or_hold_nothing() -> None:
    stacks = {2: _stack(2)}
    agree = _kind([], stacks, {2: _progress(2, CANNOT_JUDGE)})
    assert agree.body.endswith("; the 4 dumps agree, every group at the same collective")
    empty = _kind([], stacks, {}, entries=0)
    assert empty.body.endswith("; the 4 dumps hold no entry to compare")


def test_a_missing_dump_without_a_finding_is_no_dump() -> None:
    kind = _kind([], missing=(3,))
    assert (kind.name, kind.ranks, kind.body) == ("no_dump", (3,), "no dump from rank 3")
    with_stack = _kind([], {1: _stack(1)}, missing=(2, 3))
    assert with_stack.body.startswith("no dump from ranks 2-3; rank 1 stayed in a watched block")
    assert with_stack.suggestion is not None
    assert with_stack.suggestion.text == "fix: ranks 2-3's host: its process, its dump folder, its log"


def test_dumps_without_an_entry_cannot_tell() -> None:
    kind = _kind([], entries=0)
    assert (kind.name, kind.ranks, kind.suggestion) == ("cannot_tell", (), None)
    assert kind.body.startswith("the 4 dumps hold no entry (torch's Gloo recorder records no send/recv")
    some = classify(Analysis([], [TP], [], {0: dump(0, n_entries=0), 1: dump(1, n_entries=3)}, 2), {}, {})
    assert some.name == "agree"  # one dump with entries is something to compare


def test_what_cannot_be_told_is_said_with_how_many_groups_more_are_alike() -> None:
    def unconfirmed(name: str) -> Finding:
        return Finding("unconfirmed", group(name, range(4)), [0, 1], 2, "all_reduce", [], None, 0, "no word")

    one = _kind([unconfirmed("1")])
    assert (one.name, one.variant, one.ranks) == ("cannot_tell", "unconfirmed", (0, 1))
    assert " (and the same" not in one.body
    two = _kind([unconfirmed("1"), unconfirmed("2")])
    assert two.body.endswith(" (and the same for 1 more group)")
    three = _kind([unconfirmed("1"), unconfirmed("2"), unconfirmed("3")])
    assert three.body.endswith(" (and the same for 2 more groups)")
    world = Finding("world unknown", TP, [], 0, "", [], None, 0, "cannot tell whether every rank dumped")
    mixed = _kind([world, unconfirmed("1")])
    assert (mixed.variant, mixed.body) == ("world unknown", "cannot tell whether every rank dumped")


def test_every_rank_agrees_says_the_world_and_where_it_comes_from() -> None:
    kind = _kind([], world=World(4, "the world_size in d/0", known=True))
    assert (kind.name, kind.ranks, kind.suggestion) == ("agree", (), None)
    assert kind.body == "4 dumps of a world of 4 (the world_size in d/0), every group's last collective finished"
    assert _kind([]).body == "4 dumps of a world of 4 (?), every group's last collective finished"
    assert kind.line.startswith("every rank agrees: 4 dumps")


# --- the line and the evidence --------------------------------------------------------------------------------------


def test_the_evidence_says_the_finding_and_each_named_ranks_progress_and_samples() -> None:
    found = stall(TP, [3], [0, 1, 2], seq=4)
    found.waited_s = 12.34567
    kind = _kind([found], {3: _stack(3), 0: _stack(0)}, {3: _progress(3, NOT_WORKING), 9: _progress(9)})
    assert kind.evidence == {
        "finding": "stall", "group": "7", "op": "all_reduce", "seq": 4, "waiting": [0, 1, 2], "waited_s": 12.346,
        "progress": {3: _progress(3, NOT_WORKING).to_json()}, "samples": {3: 1, 0: 1},
    }  # fmt: skip
    assert _kind([stall(TP, [3], [0], seq=4)]).evidence["waited_s"] is None
    payload = kind.to_json()
    assert (payload["name"], payload["variant"], payload["label"], payload["ranks"]) == (
        "never_came", "python", "never came (stuck in Python)", [3]
    )  # fmt: skip
    assert payload["suggestion"]["text"] == kind.suggestion.text  # type: ignore[union-attr]
    assert _kind([]).to_json()["suggestion"] is None


def test_the_line_puts_a_note_after_what_to_do() -> None:
    kind = _kind([p2p(TP, 3, [0])])
    assert kind.line_with("(read x<rank>)").endswith("(the pipeline's schedule) (read x<rank>)")
    assert _kind([]).line_with("(read x<rank>)").endswith("finished; (read x<rank>)")
    assert _kind([]).line.endswith("every group's last collective finished")


def test_a_line_within_the_bound_is_kept_whole_and_the_label_is_not_said_twice() -> None:
    assert MAX_LINE_CHARS == 400  # docs/flight-recorder.md
    assert fit_line("p2p stall", "rank 3 did not send", "fix: x") == "p2p stall: rank 3 did not send; fix: x"
    assert fit_line("p2p stall", "rank 3 did not send", "") == "p2p stall: rank 3 did not send"
    assert fit_line("no dump", "no dump from rank 3", "fix: y") == "no dump from rank 3; fix: y"
    exact = "x" * (MAX_LINE_CHARS - len("l: ; a"))
    assert fit_line("l", exact, "a") == f"l: {exact}; a"
    assert len(fit_line("l", exact + "y", "a")) == MAX_LINE_CHARS


def test_a_long_line_drops_folders_then_other_axes_then_the_kinds_words_then_its_middle() -> None:
    body = "rank 3 at /a/b/c/train.py:57 in f (its stack, 1 s) on tp (also dp, pp), ranks 0-3; working: moved"
    assert fit_line("k", body, "a", limit=len(f"k: {body}; a")) == f"k: {body}; a"
    no_folders = body.replace("/a/b/c/", "")
    assert fit_line("k", body, "a", limit=len(f"k: {no_folders}; a")) == f"k: {no_folders}; a"
    no_axes = no_folders.replace(" (also dp, pp)", "")
    assert fit_line("k", body, "a", limit=len(f"k: {no_axes}; a")) == f"k: {no_axes}; a"
    no_whose = no_axes.replace("(its stack, ", "(")
    assert fit_line("k", body, "a", limit=len(f"k: {no_whose}; a")) == f"k: {no_whose}; a"
    shortest = no_whose.replace("; working: ", "; ")
    assert fit_line("k", body, "a", limit=len(f"k: {shortest}; a")) == f"k: {shortest}; a"
    cut = fit_line("k", body, "a", limit=len(f"k: {shortest}; a") - 1)
    assert (
        len(cut) == len(f"k: {shortest}; a") - 1 and "…" in cut and cut.startswith("k: rank 3") and cut.endswith("; a")
    )
    room = len(cut) - len("k: ; a") - 1
    assert cut == f"k: {shortest[: room // 2]}…{shortest[len(shortest) - (room - room // 2) :]}; a"
    assert fit_line("label", "body", "action", limit=3) == "lab"


# --- the edges of each rule ---------------------------------------------------------------------------------------


def test_a_stack_file_whose_watchdog_never_fired_places_no_rank() -> None:
    """A header alone (the rank left its block, or had not yet run past its deadline) says nothing of where it was."""
    quiet = {3: RankStack(3, Path("/d/fr_stack_rank_3.txt"), frames=(USER,), fired=False)}
    kind = _kind([stall(TP, [3], [0, 1, 2], seq=4)], quiet, {3: _progress(3)})
    assert (kind.name, kind.variant) == ("never_came", "unplaced")
    assert kind.evidence["samples"] == {}
    assert _kind([], quiet).name == "agree"


def test_a_stack_without_a_frame_is_named_as_its_stack() -> None:
    bare = {3: RankStack(3, Path("/d/fr_stack_rank_3.txt"), fired=True)}
    kind = _kind([stall(TP, [3], [0, 1, 2], seq=4)], bare, {3: _progress(3, NOT_WORKING)})
    assert kind.suggestion is not None and kind.suggestion.text == "fix: what rank 3 waits for at its stack"


def test_only_a_wait_can_be_still_working() -> None:
    """A mismatch or an unfinished collective whose ranks are working is still that: their work is not the fault."""
    stacks, working = {1: _stack(1), 2: _stack(2)}, {1: _progress(1), 2: _progress(2)}
    mismatch = _kind([_mismatch([1], "op broadcast (rank 1) where ranks 0, 2-3 have all_reduce")], stacks, working)
    assert mismatch.name == "mismatch"
    unfinished = _kind([Finding("not finished", TP, [2], 5, "all_reduce", [0, 1, 3], None, 1_000)], stacks, working)
    assert unfinished.name == "did_not_finish"
    missing = _kind([_missing([2])], stacks, working, missing=(2,))
    assert missing.name == "still_working"


def test_the_slowest_working_rank_is_found_where_one_has_no_time() -> None:
    stacks = {2: _stack(2), 3: _stack(3)}
    kind = _kind([stall(TP, [2, 3], [0, 1], seq=4)], stacks, {2: _progress(2, ran_s=None), 3: _progress(3, ran_s=90)})
    assert kind.suggestion == longer_timeout("save", 90.0)
    stayed = _kind([], stacks, {2: _progress(2, ran_s=None), 3: _progress(3, ran_s=90)})
    assert stayed.suggestion == longer_timeout("save", 90.0)


def test_a_collective_none_finished_names_the_whole_group_not_the_ranks_found() -> None:
    found = Finding("not finished", TP, [0, 1], 5, "all_reduce", [], 30.0, 1_000)
    assert _kind([found]).ranks == (0, 1, 2, 3)


def test_a_circle_with_a_receive_in_it_says_how_to_order_sends_and_receives() -> None:
    pp = group("5", (0, 1))
    dp = group("6", (0, 1), entries={1: entry("6")})
    findings = [p2p(pp, 1, [0]), stall(dp, [0], [1])]
    kind = classify(Analysis(findings, [pp, dp], [], {0: dump(0), 1: dump(1, entry("6"))}, 2), {}, {})
    assert kind.name == "circular_wait"
    assert kind.suggestion is not None and kind.suggestion.text == (
        "fix: order these ranks' sends and receives so that one side sends first, or post them together with "
        "batch_isend_irecv"
    )


def test_a_bound_shorter_than_the_label_and_the_action_cuts_the_line_at_the_bound() -> None:
    assert fit_line("l", "x" * 20, "a", limit=5) == "l: …;"
    assert fit_line("l", "x" * 20, "a", limit=7) == "l: …; a"


def _done_peers(name: str, done: tuple[bool, bool] = (True, True)) -> GroupState:
    states = {r: entry(name, 4, state="completed" if d else "scheduled") for r, d in zip((0, 1), done, strict=True)}
    return group(name, range(4), entries=states)


def test_a_missing_dump_defers_only_to_another_of_the_same_ranks_whose_peers_still_wait() -> None:
    """The rule of the first finding is for missing dumps alone: a stall first stays first; a missing dump whose
    peers still wait (one of them is enough) stays first; a missing dump nobody waits for stays first."""
    waiting = Finding("missing", _done_peers("2", (False, False)), [3], 9, "broadcast", [0, 1], None, 2_000)
    finished = Finding("missing", _done_peers("1"), [3], 4, "all_reduce", [0, 1], None, 1_000)
    stalled = Finding("stall", _done_peers("5"), [3], 4, "all_reduce", [0, 1], None, 1_000)
    assert _kind([stalled, waiting], missing=(3,)).evidence["group"] == "5"
    one_waits = Finding("missing", _done_peers("1", (True, False)), [3], 4, "all_reduce", [0, 1], None, 1_000)
    assert _kind([one_waits, waiting], missing=(3,)).evidence["group"] == "1"
    world = Finding("missing", group("", range(4)), [3], 0, "", [], None, 0, "no group map places rank 3")
    assert _kind([world, waiting], missing=(3,)).name == "no_dump"
    other_stall = Finding("stall", _done_peers("6", (False, False)), [3], 4, "all_reduce", [0, 1], None, 1_000)
    assert _kind([finished, other_stall], missing=(3,)).evidence["group"] == "1"  # only a missing dump is its place
