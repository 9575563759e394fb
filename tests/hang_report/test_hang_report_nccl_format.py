"""``hang-report`` on dumps in the format torch's NCCL watchdog writes (NCCL cannot start here without a GPU: the
dumps are built to torch's schema by :mod:`tests.harness.nccl_format_dumps`; the real NCCL path runs in
``scripts/gpu_check.sh``).

Every scenario of #22 (:mod:`tests.harness.nccl_scenarios`): the first line names the culprit ranks, the op and the
group, with the exit code; then what each rule rests on, checked on its own: a batch's ops take their
``nccl:coalesced`` entry's state, ``pg_status`` never overrides an entry, a wrapped buffer's silence is out of
reach, the dead rank goes before its waiting peers, per-node folders, the prefix in
``TORCH_FR_DUMP_TEMP_FILE``, older dump formats, and what the preflight wait and torch's analyzer do.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from pathlib import Path

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, TORCH_DEFAULT_PREFIX
from nemo_rl_shim.hang_report import loader
from nemo_rl_shim.hang_report.kinds import MAX_LINE_CHARS
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write
from tests.harness.nccl_scenarios import DEFAULT4, EXPECTED, SCENARIOS, build


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("nccl-format")
    return {name: build(name, base / name) for name in SCENARIOS}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_case_names_the_culprit_first(scenarios, name: str, capfd) -> None:
    code, start = EXPECTED[name]
    assert main(["hang-report", str(scenarios[name])]) == code
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith(start), "\n".join(out)


def test_the_table_covers_every_case_of_the_issue() -> None:
    assert sorted(SCENARIOS) == sorted(EXPECTED)
    assert {code for code, _ in EXPECTED.values()} == {0, 1}


def _report(directory: Path) -> hang_report.HangReport:
    return hang_report.read_run(directory, with_torch=False)


def test_a_batchs_ops_take_the_state_of_its_coalesced_entry(scenarios) -> None:
    dumps = {d.rank: d for d in loader.load_dumps(scenarios["batched_p2p_stall"])}
    raw = pickle.loads((scenarios["batched_p2p_stall"] / f"{Path(TORCH_DEFAULT_PREFIX).name}1").read_bytes())
    ops = [e for e in raw["entries"] if e["p2p_seq_id"] == 3]
    assert [e["profiling_name"] for e in ops] == ["nccl:send 1->2", "nccl:recv 1<-0", "nccl:coalesced"]
    assert [e["state"] for e in ops] == ["scheduled", "scheduled", "scheduled"]
    pending = dumps[1].pending_p2p
    assert {(e.op, e.peer, e.seq, e.batched) for e in pending} == {("send", 2, 3, True), ("recv", 0, 3, True)}
    # rank 0's batch of the same round completed: its ops read as done, though each op's own entry says scheduled
    assert dumps[0].pending_p2p == []
    assert dumps[0].p2p_last[(("0", "nccl"), "send", 1)].done


def test_pg_status_is_a_hint_never_an_override(scenarios) -> None:
    directory = scenarios["unfinished_after_p2p"]
    counters = [pickle.loads((directory / f"nccl_trace_rank_{r}").read_bytes())["pg_status"]["0"] for r in range(4)]
    assert [c["last_completed_collective"] for c in counters] == [11, 20, 20, 11], counters
    report = _report(directory)
    finding = report.findings[0]
    assert finding.kind == "not finished" and finding.seq == 3 and finding.ranks == [0, 1, 2, 3]
    hints = report.to_json()["findings"][0]["pg_status_counts_done"]
    assert hints == {0: True, 1: True, 2: True, 3: True}, "the hint is kept, and says the opposite of the entries"


@pytest.mark.parametrize(("completed", "counts"), [(3, True), (2, False), (4, True)])
def test_pg_status_hint_counts_a_collective_done_from_its_own_number_on(tmp_path, completed: int, counts: bool) -> None:
    """The comparison at its edge: ``last_completed_collective`` equal to the entry's number counts it done."""
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4], clock) for r in range(4)]
    for _ in range(2):
        for rank in ranks:
            rank.collective(DEFAULT4)
        clock.settle()
    for rank in ranks:
        rank.collective(DEFAULT4, state="scheduled" if rank.rank == 3 else "completed")
    for rank in ranks:
        dump = rank.dump()
        dump["pg_status"]["0"]["last_completed_collective"] = completed
        (tmp_path / f"nccl_trace_rank_{rank.rank}").write_bytes(pickle.dumps(dump))
    report = _report(tmp_path)
    payload = report.to_json()["findings"][0]
    assert payload["kind"] == "not finished" and payload["ranks"] == [3] and payload["seq"] == 3, payload
    assert payload["pg_status_counts_done"][3] is counts, payload


def test_a_wrapped_buffer_is_out_of_reach_not_behind(scenarios) -> None:
    report = _report(scenarios["wrapped_healthy"])
    default = next(g for g in report.groups if g.name == "0")
    assert default.out_of_reach == [0, 1] and {r: default.last[r] for r in range(4)} == {0: 0, 1: 0, 2: 5, 3: 5}
    assert all(report.dumps[r].wrapped for r in (0, 1)) and not any(report.dumps[r].wrapped for r in (2, 3))
    assert report.exit_code == hang_report.EXIT_AGREE
    stalled = _report(scenarios["wrapped_stall"])
    assert [f.ranks for f in stalled.findings] == [[3]], [f.line() for f in stalled.findings]


def test_the_dead_rank_goes_before_the_peers_that_wait_on_it(scenarios) -> None:
    report = _report(scenarios["dead_rank_cascade"])
    assert report.missing == [11]
    kinds = [(f.kind, f.ranks) for f in report.findings]
    assert kinds[0] == ("missing", [11])
    victims = [f for f in report.findings if f.kind == "stall"]
    assert sorted(r for f in victims for r in f.ranks) == [8, 9, 10], kinds
    assert all(report.findings.index(f) > 0 for f in victims)


def test_per_node_folders_are_read(scenarios) -> None:
    report = _report(scenarios["per_node"])
    assert sorted(str(d.path.relative_to(scenarios["per_node"])) for d in report.dumps.values()) == [
        "node0/nccl_trace_rank_0", "node0/nccl_trace_rank_1", "node1/nccl_trace_rank_2", "node1/nccl_trace_rank_3",
    ]  # fmt: skip


def test_the_same_rank_in_two_node_folders_is_refused(scenarios, tmp_path, capfd) -> None:
    for node in ("a", "b"):
        (tmp_path / node).mkdir()
        source = scenarios["healthy"] / "nccl_trace_rank_0"
        (tmp_path / node / source.name).write_bytes(source.read_bytes())
    assert main(["hang-report", str(tmp_path)]) == 2
    assert "rank 0 has two dumps" in capfd.readouterr().err


def test_the_prefix_in_torch_fr_dump_temp_file_is_read_first(scenarios, tmp_path, monkeypatch) -> None:
    """Dumps under the user's prefix, beside other files that end in digits: the prefix in effect decides."""
    for path in scenarios["sub_group_stall"].iterdir():
        (tmp_path / path.name.replace("nccl_trace_rank_", "job7_rank")).write_bytes(path.read_bytes())
    (tmp_path / "checkpoint_step_100").write_text("not a dump")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/scratch/fr/job7_rank")
    report = _report(tmp_path)
    assert sorted(report.dumps) == [0, 1, 2, 3] and report.findings[0].ranks == [3]
    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE")
    with pytest.raises(hang_report.DumpError, match=r"holds dumps of several runs: checkpoint_step_<rank> \(1 in \.\)"):
        _report(tmp_path)
    assert loader.dump_prefixes({})[0] == DUMP_FILE_NAME


def test_older_formats_are_read_by_their_keys(scenarios, tmp_path) -> None:
    """torch before 2.4: no ``is_p2p``, ``p2p_seq_id``, ``retired`` or ``pg_status``, and ``seq_id`` for the number.
    Ranks 0 and 3 in the old format; all four say the old version (one job runs one torch: a run whose dumps say two
    versions is two runs, :mod:`.run_split`)."""
    for path in scenarios["sub_group_stall"].iterdir():
        dump = pickle.loads(path.read_bytes())
        dump["version"] = "2.3"
        if path.name.endswith(("_0", "_3")):
            dump.pop("pg_status")
            for entry in dump["entries"]:
                entry["seq_id"] = entry.pop("collective_seq_id")
                for key in ("is_p2p", "p2p_seq_id", "retired"):
                    entry.pop(key)
        (tmp_path / path.name).write_bytes(pickle.dumps(dump))
    report = _report(tmp_path)
    assert report.line.startswith(EXPECTED["sub_group_stall"][1]), report.line
    assert {d.rank: d.version for d in report.dumps.values()} == dict.fromkeys(range(4), "2.3")


def test_details_stay_readable_and_json_keeps_every_rank(tmp_path) -> None:
    """128 tp groups of 8, one rank behind: the text groups them by shape; --json lists every rank."""
    world, tp = 1024, 8
    default = Group("0", "default_pg", tuple(range(world)))
    for rank in range(world):
        group = Group(str(1 + rank // tp), "mesh_tp", tuple(range(rank // tp * tp, rank // tp * tp + tp)))
        recorder = Rank(rank, [default, group], Clock(Clock().now_ns + rank), frames=False)  # each its own clock
        for _ in range(3 if rank != 517 else 2):
            recorder.collective(group)
        write(tmp_path, recorder)
    report = _report(tmp_path)
    text = hang_report.render(report)
    assert report.line.startswith("never came: rank 517 did not enter all_reduce #3 on tp, ranks 512-519"), report.line
    assert "  tp: 128 groups of 8, all at #3 but one" in text.splitlines(), text
    first, *details = text.splitlines()
    assert len(first) <= MAX_LINE_CHARS and max(len(line) for line in details) < 200, text
    payload = report.to_json()
    tp_groups = [g for g in payload["groups"] if g["axes"] == ["tp"]]
    assert len(tp_groups) == 128 and sum(len(g["ranks"]) for g in tp_groups) == world
    assert len(payload["dumps"]) == world


def test_dumps_without_entries_cannot_tell(tmp_path, capfd) -> None:
    for rank in range(2):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
    assert main(["hang-report", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"hang-report: {tmp_path}: its 2 dumps hold no entry") and err.count("\n") == 1, err


def test_preflight_waits_for_the_last_ranks_dump(scenarios, tmp_path) -> None:
    """The last rank's dump lands 1 s late: the summary waits for it rather than calling it missing."""
    source = scenarios["healthy"]
    for rank in range(3):
        (tmp_path / f"{DUMP_FILE_NAME}{rank}").write_bytes((source / f"nccl_trace_rank_{rank}").read_bytes())

    def late() -> None:
        time.sleep(1.0)
        (tmp_path / f"{DUMP_FILE_NAME}3").write_bytes((source / "nccl_trace_rank_3").read_bytes())

    writer = threading.Thread(target=late)
    writer.start()
    start = time.monotonic()
    summary = hang_report.preflight_summary(tmp_path, 4, wait_s=10)
    writer.join()
    assert summary["missing_dumps"] == [], summary["summary"]
    assert summary["summary"].endswith(
        "every rank agrees: 4 dumps of a world of 4 (--world), every group's last collective finished"
    ), summary["summary"]
    assert time.monotonic() - start < 9, "it waited out the bound: the last dump was not seen"


def test_torch_analyzer_says_what_it_did_in_one_line(scenarios) -> None:
    """On NCCL-format dumps torch's analyzer runs (flagging the stall) or, with coalesced p2p and no tabulate,
    fails in one line; the shim's first line is the same either way."""
    ran = hang_report.read_run(scenarios["sub_group_stall"], with_torch=True)
    assert ran.torch["outcome"] in ("ran", "failed", "absent"), ran.torch
    line = hang_report.render(ran).splitlines()[-1]
    if ran.torch["outcome"] == "ran":
        assert line.startswith(f"torch {ran.torch['torch']} analyzer: ran, matched "), line
        assert ran.torch["flagged"], "torch's analyzer flags the collective rank 3 did not enter"
    else:
        assert line == f"torch {ran.torch['torch']} analyzer: did not run: {ran.torch['error']}"
    batched = hang_report.read_run(scenarios["batched_p2p_stall"], with_torch=True)
    assert batched.line.startswith(EXPECTED["batched_p2p_stall"][1])
    last = hang_report.render(batched).splitlines()[-1]
    assert last.startswith(f"torch {batched.torch['torch']} analyzer: ") and "\n" not in batched.torch.get("error", "")
    try:
        import tabulate  # noqa: F401
    except ImportError:
        if batched.torch["outcome"] == "failed":
            assert batched.torch["error"].endswith("(tabulate is not installed)"), batched.torch
    skipped = hang_report.read_run(scenarios["healthy"], with_torch=False)
    assert hang_report.render(skipped).splitlines()[-1].endswith("(--torch-analyzer runs it)")


def test_json_first_line_and_exit_agree(scenarios, capfd) -> None:
    assert main(["hang-report", "--json", str(scenarios["p2p_stall"])]) == 1
    payload = json.loads(capfd.readouterr().out)
    assert payload["line"].startswith(f"p2p stall: {payload['findings'][0]['line']}; fix: ")
    assert payload["findings"][0]["kind"] == "p2p"
    assert payload["findings"][0]["ranks"] == [2] and payload["findings"][0]["waiting"] == [3]
    kind = payload["kind"]
    assert (kind["name"], kind["ranks"], kind["evidence"]["waiting"]) == ("p2p_stall", [2], [3]), kind
    assert payload["line"].endswith(kind["suggestion"]["text"])


# --- the survivors of #27's mutation audit: each rule on its own ----------------------------------------------------


def _kinds(report: hang_report.HangReport) -> list[tuple[str, list[int], list[int]]]:
    return [(f.kind, f.ranks, f.waiting) for f in report.findings]


def test_the_pipeline_stall_blames_the_middle_stage_not_rank_0(scenarios) -> None:
    """#27's "Why": rank 0's batch completed (before rank 1 posted), rank 1's stays started only because its send
    half has no receiver. The counts say rank 0 sent rank 1 its third message; rank 2 posted two of three."""
    report = _report(scenarios["pipeline_stall"])
    assert _kinds(report) == [("p2p", [2], [1, 3])], [f.line() for f in report.findings]
    dumps = report.dumps
    assert dumps[0].pending_p2p == [] and {(e.op, e.peer) for e in dumps[1].pending_p2p} == {("recv", 0), ("send", 2)}
    assert dumps[0].p2p_count[(("0", "nccl"), "send", 1)] == 3 and dumps[2].p2p_count[(("0", "nccl"), "recv", 1)] == 2


def test_a_p2p_stall_on_a_sub_group_maps_group_ranks_to_global_ones(scenarios) -> None:
    """pp {1, 3}: rank 3 is group rank 1, its peer rank 1 is group rank 0 (a global 0 would be another rank); on
    pp {0, 2} both sides posted and are pending: neither is blamed, the pair is named unfinished."""
    report = _report(scenarios["sub_group_p2p"])
    assert _kinds(report) == [("p2p", [1], [3]), ("not finished", [0, 2], [])], [f.line() for f in report.findings]
    assert report.findings[0].group.ranks == (1, 3) and report.findings[1].group.ranks == (0, 2)


def test_both_sides_pending_blames_neither_and_the_newest_op_decides(scenarios) -> None:
    """Wrapped buffers (the counts are not whole): rank 0's buffer holds finished sends to rank 1 and, newest, the
    pending one; rank 1 waits in the matching receive. Both posted: neither is blamed."""
    report = _report(scenarios["p2p_both_pending_wrapped"])
    assert all(report.dumps[r].wrapped for r in (0, 1))
    assert report.dumps[0].p2p_last[(("0", "nccl"), "send", 1)].state == "started"
    assert _kinds(report) == [("not finished", [0, 1], [])], [f.line() for f in report.findings]


def test_a_peers_wrapped_buffer_that_cannot_tell_blames_nobody(scenarios) -> None:
    report = _report(scenarios["p2p_unclear"])
    assert report.dumps[2].wrapped and not report.dumps[3].wrapped
    assert _kinds(report) == [("unclear", [], [3])], [f.line() for f in report.findings]
    assert report.exit_code == hang_report.EXIT_FOUND, "someone waits: never 'every rank agrees'"


def test_the_culprit_comes_before_its_waiting_peers_in_a_cascade(scenarios) -> None:
    """The dp peers entered dp #3 before ranks 8-10 entered tp #3: by time alone a victim would come first."""
    report = _report(scenarios["cascade_order"])
    culprits = [f for f in report.findings if f.ranks == [11]]
    victims = [f for f in report.findings if f.ranks and f.ranks[0] in (8, 9, 10)]
    assert len(culprits) == 2 and len(victims) == 3, [f.line() for f in report.findings]
    assert min(v.created_ns for v in victims) < min(c.created_ns for c in culprits), "the victims waited first"
    assert report.findings[:2] == culprits, [f.line() for f in report.findings]


def test_a_two_against_two_mismatch_names_every_rank(scenarios) -> None:
    report = _report(scenarios["mismatch_tie"])
    assert report.findings[0].kind == "mismatch" and report.findings[0].ranks == [0, 1, 2, 3]


def test_a_silent_rank_whose_buffer_did_not_wrap_is_behind(scenarios) -> None:
    """Rank 3's oldest entry is newer than tp #1, but its buffer holds every op it made: it did not enter."""
    report = _report(scenarios["behind_unwrapped"])
    tp = next(g for g in report.groups if g.ranks == (2, 3))
    assert not report.dumps[3].wrapped and report.dumps[3].recorder("nccl").oldest_ns > tp.entries[2].created_ns
    assert tp.out_of_reach == [] and report.findings[0].ranks == [3]


def test_a_buffer_wrapped_by_one_entry_is_wrapped(scenarios) -> None:
    """The oldest entry's record_id is exactly 1 (one entry overwritten): rank 3 is out of reach of tp #1."""
    raw = pickle.loads((scenarios["wrapped_by_one"] / "nccl_trace_rank_3").read_bytes())
    assert raw["entries"][0]["record_id"] == 1
    report = _report(scenarios["wrapped_by_one"])
    assert report.dumps[3].wrapped and not report.dumps[2].wrapped
    tp = next(g for g in report.groups if g.ranks == (2, 3))
    assert tp.out_of_reach == [3] and report.exit_code == hang_report.EXIT_AGREE


def test_a_coalesced_collective_reads_as_its_closer(scenarios) -> None:
    """Each op of a coalesced collective stays 'scheduled'; its closer completed: the collective finished."""
    raw = pickle.loads((scenarios["coalesced_healthy"] / "nccl_trace_rank_0").read_bytes())
    assert [e["state"] for e in raw["entries"][:3]] == ["scheduled", "scheduled", "completed"]
    report = _report(scenarios["coalesced_healthy"])
    assert report.exit_code == hang_report.EXIT_AGREE and report.dumps[0].last[("0", "nccl")].op == "coalesced"


def test_a_coalesced_collective_is_one_number_whose_signature_joins_its_ops(scenarios) -> None:
    """Its two ops and its closer share one collective number: the rank's signatures hold that number once, with
    the ops' names and sizes joined (what a rank whose second op differs is compared on)."""
    dump = next(d for d in loader.load_dumps(scenarios["coalesced_healthy"]) if d.rank == 0)
    numbers, ids = dump.signatures[("0", "nccl")]
    assert list(numbers) == [1, 2]
    assert {dump.sig_table[i] for i in ids} == {("nccl:all_reduce+nccl:all_reduce", "[[4]]; [[4]]")}


def test_the_prefix_in_effect_wins_over_torchs_default_beside_it(scenarios, tmp_path, monkeypatch) -> None:
    """A folder with this run's dumps under TORCH_FR_DUMP_TEMP_FILE's prefix and another run's under torch's
    default name: the prefix in effect is read."""
    for path in scenarios["sub_group_stall"].iterdir():
        (tmp_path / path.name.replace("nccl_trace_rank_", "job7_rank")).write_bytes(path.read_bytes())
    for path in scenarios["healthy"].iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/scratch/fr/job7_rank")
    report = _report(tmp_path)
    assert {d.path.name for d in report.dumps.values()} == {f"job7_rank{r}" for r in range(4)}
    assert report.findings[0].ranks == [3]


def test_a_collective_waited_in_beyond_a_wrapped_buffers_reach_is_unclear_never_agreed(tmp_path) -> None:
    """Ranks 2-3 wait in all_reduce #3 on {0-3}; ranks 0-1 then ran 30 collectives on {0, 1} and their 20-entry
    buffers no longer reach #3: nobody is named, and the report does not say every rank agrees."""
    pair = Group("1", "mesh_dp", (0, 1))
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4, pair] if r < 2 else [DEFAULT4], clock, timing=True) for r in range(4)]
    for step in range(3):
        for rank in ranks:
            rank.collective(DEFAULT4, state="started" if step == 2 and rank.rank >= 2 else "completed")
        clock.settle()
    for _ in range(30):
        for rank in ranks[:2]:
            rank.collective(pair)
        clock.settle()
    for rank in ranks:
        write(tmp_path, rank, buffer=20)
    report = _report(tmp_path)
    default = next(g for g in report.groups if g.name == "0")
    assert default.out_of_reach == [0, 1]
    assert _kinds(report) == [("unclear", [], [2, 3])], [f.line() for f in report.findings]
    assert report.line.startswith(
        "unclear: ranks 2-3 waited in all_reduce #3 on default, ranks 0-3, and the buffers of"
    )
    assert report.exit_code == hang_report.EXIT_FOUND
