"""The kind of each hang, who, where and what to do: the catalogue's NCCL-format cases at 16 ranks, and each rule.

The cases (:mod:`tests.harness.kind_scenarios`) are the ones ``benchmarks/hang_kinds.py`` measures at 1,024 and 8,192
ranks; here each must give its kind, variant and ranks, exit 1, and a first line of at most 400 characters that
starts with the kind and ends with what to do. Real Gloo ranks of the kinds: tests/hang_report/test_hang_kinds.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.hang_report.analysis import Finding, GroupState
from nemo_rl_shim.hang_report.cycles import find_cycle
from nemo_rl_shim.hang_report.kinds import LABELS, MAX_LINE_CHARS, fit_line
from nemo_rl_shim.hang_report.suggest import longer_timeout
from tests.harness.kind_scenarios import CASES, EXPECTED, Layout, culprit, expected_ranks, write_case
from tests.harness.nccl_scenarios import build

pytestmark = [pytest.mark.every_lane]

LAYOUT = Layout(world=16, rounds=3)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Path]:
    found = {}
    for case in CASES:
        found[case] = tmp_path_factory.mktemp(case)
        write_case(case, found[case], LAYOUT)
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_gives_its_kind_and_ranks_and_exits_1(cases, case: str) -> None:
    report = hang_report.read_run(cases[case])
    kind = report.kind
    assert (kind.name, kind.variant) == EXPECTED[case], report.line
    assert kind.ranks == expected_ranks(case, LAYOUT), report.line
    assert report.exit_code == hang_report.EXIT_FOUND
    assert len(report.line) <= MAX_LINE_CHARS and report.line.startswith(f"{LABELS[EXPECTED[case]]}: "), report.line
    if kind.suggestion is not None:
        assert report.line.endswith(kind.suggestion.text), report.line
    if case.startswith("never_came") or case in ("still_working", "mismatch", "did_not_finish"):
        # where the culprit's peers wait, not an earlier collective they finished with it (a missing dump is named
        # in both of its groups: the one whose peers still wait goes first)
        assert " all_reduce #4 on tp, ranks 8-11" in report.line, report.line


def test_still_working_names_the_phase_how_long_and_the_timeout_that_would_have_held(cases) -> None:
    report = hang_report.read_run(cases["still_working"])
    c = culprit(LAYOUT.world)
    assert f"rank {c} did not enter all_reduce #4 on tp" in report.line
    assert '607.0 s into "checkpoint save"; working: stack moved; CPU +1.8 s in 2.0 s; 351.0 MB written' in report.line
    suggestion = report.kind.suggestion
    assert suggestion is not None
    assert (suggestion.api, suggestion.minutes, suggestion.phase) == ("extended_timeout", 51, "checkpoint save")
    assert report.line.endswith('fix: extended_timeout(ctx, 51) around "checkpoint save" (5 x 607 s), or '
                                'learner.phase("checkpoint save")'), report.line  # fmt: skip


def test_the_same_rank_asleep_never_came(cases) -> None:
    report = hang_report.read_run(cases["never_came_python"])
    assert '(its stack, 607.0 s into "train step"; not working in 3 samples)' in report.line, report.line
    assert report.line.endswith(f"fix: what rank {culprit(LAYOUT.world)} waits for at loader.py:57 in load_batch")


def test_one_sample_is_said_not_judged(cases, tmp_path: Path) -> None:
    """The culprit's counters file gone and its stack cut to the watchdog's one sample: never "working"."""
    directory = cases["still_working"]
    c = culprit(LAYOUT.world)
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / f"fr_progress_rank_{c}.jsonl").unlink()
    stack = tmp_path / f"fr_stack_rank_{c}.txt"
    stack.write_text(stack.read_text().split("nemo-rl-shim sample ")[0])
    report = hang_report.read_run(tmp_path)
    assert (report.kind.name, report.kind.variant) == ("never_came", "python"), report.line
    assert "progress could not be judged: one sample" in report.line, report.line


def test_a_cycle_of_two_groups_is_a_circular_wait_and_a_cascade_is_not(tmp_path: Path) -> None:
    """An ordering inversion: rank 0 waits in g1 for rank 1, which waits in g2 for rank 0. A dead rank's cascade and
    a rank stuck elsewhere (#22's scenarios) have no cycle."""
    from tests.harness.nccl_format_dumps import Clock, Group, Rank, write

    g1, g2 = Group("1", "undefined", (0, 1)), Group("2", "undefined", (0, 1))
    world = Group("0", "default_pg", (0, 1))
    clock = Clock()
    ranks = [Rank(r, [world, g1, g2], clock) for r in range(2)]
    ranks[0].collective(g1, state="scheduled")
    ranks[1].collective(g2, state="scheduled")
    for rank in ranks:
        write(tmp_path / "inversion", rank)
    report = hang_report.read_run(tmp_path / "inversion")
    assert (report.kind.name, report.kind.ranks) == ("circular_wait", (0, 1)), report.line
    assert report.kind.body == (
        "rank 0 waits in all_reduce #1 on process group 1, ranks 0-1 for rank 1, which waits in all_reduce #1 on "
        "process group 2, ranks 0-1 for rank 0"
    )
    for name in ("dead_rank_cascade", "cascade_order", "sub_group_stall"):
        report = hang_report.read_run(build(name, tmp_path / name))
        assert find_cycle(report.findings, report.dumps) is None, name
        assert report.kind.name != "circular_wait", report.line


def test_a_waiter_that_went_on_past_the_op_is_not_in_a_cycle(tmp_path: Path) -> None:
    """The waits of a cycle count only ranks still blocked in the op: a rank whose newest op is later is not."""
    from tests.harness.nccl_format_dumps import Clock, Group, Rank, write

    g1, g2, g3 = Group("1", "undefined", (0, 1)), Group("2", "undefined", (0, 1)), Group("3", "undefined", (0, 1))
    world = Group("0", "default_pg", (0, 1))
    clock = Clock()
    ranks = [Rank(r, [world, g1, g2, g3], clock) for r in range(2)]
    ranks[0].collective(g1, state="scheduled")
    ranks[1].collective(g2, state="scheduled")
    ranks[0].collective(g3, state="scheduled")  # rank 0 then went on to g3 (NCCL's calls return at once)
    ranks[1].collective(g3, state="scheduled")
    clock.settle()
    for rank in ranks:
        rank.entries[-2]["state"] = "completed"  # NCCL says both finished the op they were said to wait in
        write(tmp_path, rank)
    report = hang_report.read_run(tmp_path)
    assert find_cycle(report.findings, report.dumps) is None, [f.line() for f in report.findings]


def test_json_carries_the_kind_its_ranks_evidence_and_suggestion(cases, capfd) -> None:
    assert main(["hang-report", "--json", str(cases["still_working"])]) == 1
    payload = json.loads(capfd.readouterr().out)
    kind, c = payload["kind"], str(culprit(LAYOUT.world))
    assert (kind["name"], kind["ranks"], kind["label"]) == ("still_working", [int(c)], "still working")
    progress = kind["evidence"]["progress"][c]
    assert (progress["verdict"], progress["stack_samples"], progress["counter_samples"]) == ("working", 3, 3)
    assert progress["written_bytes"] == 351_000_000 and progress["cpu_s"] == pytest.approx(1.8)
    assert kind["suggestion"]["minutes"] == 51 and kind["suggestion"]["api"] == "extended_timeout"
    assert payload["progress"][c] == progress
    assert main(["hang-report", "--json", str(cases["circular_wait"])]) == 1
    cycle = json.loads(capfd.readouterr().out)["kind"]["evidence"]["cycle"]
    assert cycle["ranks"] == list(expected_ranks("circular_wait", LAYOUT))
    assert [(s["waiting"], s["on"]) for s in cycle["steps"]] == [
        ([0, 1, 2, 3], [8, 9, 10, 11]), ([8, 9, 10, 11], [12, 13, 14, 15]), ([12, 13, 14, 15], [0, 1, 2, 3])
    ]  # fmt: skip


def test_the_text_says_what_each_stacks_samples_show(cases) -> None:
    text = hang_report.render(hang_report.read_run(cases["still_working"]))
    assert (
        f'  rank {culprit(LAYOUT.world)}, 607.0 s into "checkpoint save" (3 samples; working: stack moved; '
        "CPU +1.8 s in 2.0 s; 351.0 MB written):"
    ) in text.splitlines(), text


def test_the_timeout_suggested_follows_the_learners_rule() -> None:
    assert longer_timeout("checkpoint save", 2400.0).minutes == 200  # 5 x 40 min
    assert longer_timeout("refit", 3.0).minutes == 1, "the learner's floor: a minute"
    assert longer_timeout("refit", 61.0).minutes == 6  # 5 x 61 s = 5.08 min, up
    start = longer_timeout("first_step", 300.0)
    assert (start.api, start.minutes) == ("distributed_timeout_minutes", 25)
    assert start.text == "fix: distributed_timeout_minutes: 25 (5 x 300 s) for the start-up, or learned_timeouts"


def test_a_long_line_keeps_its_kind_and_action_within_400_characters() -> None:
    body = "rank 3 did not enter all_reduce #6: at /" + "deep/" * 120 + "train.py:57 in step (its stack)"
    line = fit_line("never came (stuck in Python)", body, "fix: what rank 3 waits for at train.py:57 in step")
    assert line == (
        "never came (stuck in Python): rank 3 did not enter all_reduce #6: at train.py:57 in step (its stack); "
        "fix: what rank 3 waits for at train.py:57 in step"
    )
    slow = (
        "rank 517 did not enter all_reduce #1001 on tp (also cp), ranks 512-519: at /a/ckpt.py:88 in write (its stack, "
    )
    slow += (
        '607.0 s into "checkpoint save"; working: stack moved; CPU +1.8 s in 2.0 s); ranks 512-516 waited ' + "w" * 175
    )
    fitted = fit_line("still working", slow, "fix: extended_timeout(ctx, 51)")
    assert len(fitted) <= MAX_LINE_CHARS and "…" not in fitted, fitted
    assert 'at ckpt.py:88 in write (607.0 s into "checkpoint save"; stack moved; CPU +1.8 s in 2.0 s)' in fitted
    assert "on tp, ranks 512-519" in fitted, "the group's other axes go before any of its words"
    huge = fit_line("mismatch (sizes)", "x" * 5000, "fix: the sizes")
    assert len(huge) == MAX_LINE_CHARS and huge.startswith("mismatch (sizes): x") and huge.endswith("; fix: the sizes")
    assert "…" in huge


def test_a_finding_of_every_kind_has_a_label() -> None:
    """Every kind the classifier can give has its words (a KeyError would be a crash at the first line)."""
    group = GroupState("0", (0, 1), ["default"])
    from nemo_rl_shim.hang_report.kinds import _of_finding

    for kind, waiting, op in [("stall", [0], "all_reduce"), ("p2p", [0], "send"), ("not finished", [], "all_reduce"),
                              ("not finished", [0], "all_reduce"), ("not finished", [], "send/recv"),
                              ("unclear", [0], "recv"), ("missing", [], ""), ("missing", [0], "all_reduce"),
                              ("mismatch", [], "all_reduce")]:  # fmt: skip
        finding = Finding(kind, group, [1], 3, op, waiting, None, 0, "op x (rank 1) where rank 0 has y")
        found = _of_finding(finding, {}, {})
        assert found.label and len(found.line) <= MAX_LINE_CHARS, (kind, found)


def test_a_rank_without_a_dump_is_placed_by_its_stack(tmp_path: Path) -> None:
    """No dump: dead without a stack; a C call holding the GIL with one outside torch.distributed; waiting in another
    collective with one inside it (alive, its dump not written)."""
    from nemo_rl_shim.flight_recorder.names import HEADER
    from nemo_rl_shim.hang_report.kinds import _of_finding
    from nemo_rl_shim.hang_report.stacks import parse_stack

    group = GroupState("0", (0, 1, 2, 3), ["default"])
    finding = Finding("missing", group, [3], 6, "all_reduce", [0, 1, 2], 3.0, 0)
    header = HEADER + json.dumps({"rank": 3, "pid": 1, "thread": "0x01", "what": "train step", "after_s": 8.0})
    torch_frame = (
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 1 in barrier\n'
    )
    inside = header + "\nTimeout (0:00:08)!\nThread 0x01 (most recent call first):\n" + torch_frame
    inside += '  File "/job/train.py", line 9 in step\n'
    outside = (
        header + '\nTimeout (0:00:08)!\nThread 0x01 (most recent call first):\n  File "/job/c.py", line 4 in pack\n'
    )
    kinds = {}
    for name, text in (("dead", None), ("gil", outside), ("elsewhere", inside)):
        stacks = {} if text is None else {3: parse_stack(text, 3, tmp_path / "s")}
        found = _of_finding(finding, stacks, {})
        kinds[name] = (found.name, found.variant)
    assert kinds == {n: ("never_came", n) for n in ("dead", "gil", "elsewhere")}, kinds


@pytest.mark.parametrize("case", list(CASES))
def test_a_case_on_the_base_is_the_case_written_whole(cases, case: str, tmp_path: Path) -> None:
    """benchmarks/hang_kinds.py writes a case as the base's files (linked) and the ranks it touches: the same files."""
    from tests.harness.kind_scenarios import touched, write_base

    write_base(tmp_path / "base", LAYOUT)
    write_case(case, tmp_path / "linked", LAYOUT, base=tmp_path / "base")
    whole = sorted(p.name for p in cases[case].iterdir())
    assert sorted(p.name for p in (tmp_path / "linked").iterdir()) == whole
    for name in whole:
        assert (tmp_path / "linked" / name).read_bytes() == (cases[case] / name).read_bytes(), name
    assert 0 < len(touched(case, LAYOUT)) <= 12, "a case touches the culprit's tp group, or the ring's three"
