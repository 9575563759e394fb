"""How one run's dumps are found and read, rule by rule (#33): each test fails on the mutant it names.

* ``read_dump`` leaves the garbage collector as it found it, on every path.
* ``CALLS_KEPT`` at its boundary, and the look-back over interleaved groups (2 x CALLS_KEPT entries per group, from
  the newest).
* One run per report: several prefixes refused, or chosen by ``TORCH_FR_DUMP_TEMP_FILE`` and said on the first line;
  files of the run at two depths refused; a symlink that stays inside the folder read.
* The world: ``--world`` against the records; an unknown world is exit 1 and says how to give it.
* A healthy verdict checks every field (:mod:`~nemo_rl_shim.hang_report.field_checks`): one not read for a stall is
  refused before exit 0.
* Merging many dumps is linear.
"""

from __future__ import annotations

import dataclasses
import gc
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.hang_report import dump_format
from nemo_rl_shim.hang_report.analysis import analyse
from nemo_rl_shim.hang_report.dump_format import CALLS_KEPT, read_dump, summarize
from nemo_rl_shim.hang_report.records import GroupFacts, RankDump
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write
from tests.harness.nccl_scenarios import build

pytestmark = [pytest.mark.every_lane]

PREFIX = "nccl_trace_rank_"
WORLD = Group("0", "default_pg", (0, 1))


# --- the garbage collector ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"good", b"not a pickle", b"refused"])
@pytest.mark.parametrize("enabled", [True, False])
def test_read_dump_leaves_the_collector_as_it_found_it(tmp_path: Path, content: bytes, enabled: bool) -> None:
    path = tmp_path / f"{PREFIX}0"
    if content == b"good":
        content = pickle.dumps({"version": "2.10", "entries": []})
    elif content == b"refused":
        content = b"cos\nsystem\n(S'true'\ntR."
    path.write_bytes(content)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        try:
            read_dump(path)
        except hang_report.DumpError:
            assert content != pickle.dumps({"version": "2.10", "entries": []})
        assert gc.isenabled() is enabled, f"read_dump left the collector {'off' if enabled else 'on'}"
    finally:
        (gc.enable if was else gc.disable)()


# --- where each group's last collectives were called ----------------------------------------------------------------


def _calls(tmp_path: Path, pattern: list[Group], rounds: int) -> tuple[RankDump, list[dict[str, Any]]]:
    """Rank 0 of two, ``rounds`` times the ops of ``pattern`` (one collective per group named): its dump, summarized,
    and its entries."""
    groups = sorted(set(pattern), key=lambda g: g.name)
    rank = Rank(0, [WORLD, *groups], Clock())
    for _ in range(rounds):
        for group in pattern:
            rank.collective(group)
    path = write(tmp_path, rank)
    return summarize(path, 0), pickle.loads(path.read_bytes())["entries"]


def test_calls_kept_stop_at_their_boundary(tmp_path: Path) -> None:
    """20 collectives on one group: the dump keeps where its newest CALLS_KEPT (8) were called, not 9."""
    one = Group("1", "mesh_tp", (0, 1))
    dump, _ = _calls(tmp_path, [one], 20)
    assert CALLS_KEPT == 8
    assert sorted(dump.calls[("1", "nccl")]) == list(range(13, 21)), dump.calls


@pytest.mark.parametrize("every", [4, 5])
def test_the_look_back_reaches_twice_calls_kept_entries_per_group(tmp_path: Path, every: int) -> None:
    """Two groups interleaved, a's collective every ``every``-th entry: the look back covers the newest
    2 x CALLS_KEPT x 2 groups = 32 entries, and keeps each of a's collectives among them (8 where a is every 4th,
    all of the 32's; fewer where every 5th: the window is not widened to fill them)."""
    a, b = Group("1", "mesh_tp", (0, 1)), Group("2", "mesh_dp", (0, 1))
    dump, entries = _calls(tmp_path, [a, *[b] * (every - 1)], 40)
    window = entries[-2 * CALLS_KEPT * 2 :]
    expected = sorted({e["collective_seq_id"] for e in window if e["process_group"][0] == "1"})
    assert sorted(dump.calls[("1", "nccl")]) == expected[-CALLS_KEPT:], (every, expected)
    assert len(expected) == (8 if every == 4 else 6), "the window holds what the docstring says"
    assert len(dump.calls[("2", "nccl")]) == CALLS_KEPT


# --- one run per report ---------------------------------------------------------------------------------------------


def test_a_prefix_chosen_by_the_environment_is_said_on_the_first_line(tmp_path: Path, monkeypatch, capfd) -> None:
    stall = build("sub_group_stall", tmp_path / "stall")
    build("healthy", tmp_path / "healthy")
    for path in stall.iterdir():
        path.rename(tmp_path / "healthy" / path.name.replace(PREFIX, "job7_rank"))
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/scratch/job7_rank")
    assert main(["hang-report", str(tmp_path / "healthy")]) == 1
    line = capfd.readouterr().out.splitlines()[0]
    assert line.startswith("never came: rank 3 did not enter all_reduce #3")
    assert line.endswith(
        "[read job7_rank<rank>, the prefix TORCH_FR_DUMP_TEMP_FILE names; not read: nccl_trace_rank_<rank>]"
    )
    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE")
    assert main(["hang-report", str(tmp_path / "healthy")]) == 2
    assert "holds dumps of several runs: " in capfd.readouterr().err


def test_a_runs_files_at_two_depths_are_refused(tmp_path: Path, capfd) -> None:
    """The run's dumps in the folder, and a copy of another run's (same prefix, other ranks) a folder down."""
    directory = build("sub_group_stall", tmp_path / "dumps")
    (directory / "old").mkdir()
    (directory / f"{PREFIX}1").rename(directory / "old" / f"{PREFIX}1")
    assert main(["hang-report", str(directory)]) == 2
    err = capfd.readouterr().err
    assert "holds one run's files at several depths" in err and f"old/{PREFIX}1" in err, err


def test_per_node_folders_and_a_symlink_inside_the_folder_read(tmp_path: Path) -> None:
    directory = build("per_node", tmp_path / "dumps")
    moved = directory / "node1" / f"{PREFIX}3"
    (directory / "node1" / "kept").mkdir()
    moved.rename(directory / "node1" / "kept" / "rank3.bin")
    moved.symlink_to(directory / "node1" / "kept" / "rank3.bin")
    report = hang_report.read_run(directory)
    assert sorted(report.dumps) == [0, 1, 2, 3] and report.findings[0].ranks == [3]


def test_a_rank_with_two_stack_files_is_refused(tmp_path: Path, capfd) -> None:
    directory = build("per_node", tmp_path / "dumps")
    for node in ("node0", "node1"):
        (directory / node / "fr_stack_rank_3.txt").write_text("")
    assert main(["hang-report", str(directory)]) == 2
    assert "rank 3 has two stack files" in capfd.readouterr().err


# --- the world ------------------------------------------------------------------------------------------------------


def test_the_world_given_must_agree_with_the_records(tmp_path: Path, capfd) -> None:
    directory = build("healthy", tmp_path / "dumps")
    assert main(["hang-report", "--world", "4", str(directory)]) == 0
    capfd.readouterr()
    assert main(["hang-report", "--world", "8", str(directory)]) == 2
    assert "the world disagrees: --world says 8 ranks, the default group listed in" in capfd.readouterr().err
    assert main(["hang-report", "--world", "2", str(directory)]) == 2
    assert f"{PREFIX}2: rank 2 is outside the world of 2 ranks (--world) (and 1 more files)" in capfd.readouterr().err
    with pytest.raises(SystemExit) as exit_code:
        main(["hang-report", "--world", str(2**21), str(directory)])
    assert exit_code.value.code == 2


def test_without_a_record_of_the_world_missing_top_ranks_are_not_silent(tmp_path: Path) -> None:
    """NCCL-format dumps with Gloo's pg_config (one group under ''): ranks 0-2 dumped, every collective completed.
    Rank 3 may have left no dump: exit 1 saying so, and with --world 4 rank 3 is named."""
    directory = build("healthy", tmp_path / "dumps")
    (directory / f"{PREFIX}3").unlink()
    for path in directory.iterdir():
        raw = pickle.loads(path.read_bytes())
        raw["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
        path.write_bytes(pickle.dumps(raw))
    report = hang_report.read_run(directory)
    assert report.exit_code == 1 and report.findings[0].kind == "world unknown", report.line
    assert "ranks above 2 may have left no dump" in report.line and report.line.endswith("--world N")
    assert all(not g.members_stated for g in report.groups)
    text = hang_report.render(report)
    assert "all at #" not in text, "a group whose members no record lists is never 'all at #N'"
    assert "  default: 1 group of 3 seen, members not recorded: its ranks at #3" in text.splitlines(), text
    given = hang_report.read_run(directory, world=4)
    assert given.missing == [3] and given.exit_code == 1 and given.line.startswith("no dump from rank 3"), given.line


# --- a healthy verdict checks every field ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("thread_name", 7, "'thread_name' is 7 (int), not text"),
        ("input_dtypes", [["Float"]], "'input_dtypes' is [['Float']] (list), not a list of dtype names"),
        ("retired", "yes", "'retired' is 'yes' (str), not a bool"),
        ("time_discovered_completed_ns", None, "'state' is 'completed' where 'time_discovered_completed_ns' is None"),
        ("op_id", -1, "'op_id' is -1 (int), not an int from 0 to 2**63 - 1"),
        ("thread_id", "\udcff", "'thread_id' is '\\udcff' (str), not text"),
    ],
)
def test_a_field_no_stall_reads_is_checked_before_exit_0(tmp_path: Path, key: str, value: Any, words: str) -> None:
    directory = build("healthy", tmp_path / "dumps")
    raw = pickle.loads((directory / f"{PREFIX}2").read_bytes())
    raw["entries"][0][key] = value
    (directory / f"{PREFIX}2").write_bytes(pickle.dumps(raw))
    with pytest.raises(hang_report.DumpError, match=r"nccl_trace_rank_2: entry 0 ") as refused:
        hang_report.read_run(directory)
    assert words in str(refused.value), refused.value
    del raw["entries"][0][key]  # a key dropped from one entry: the others hold it
    (directory / f"{PREFIX}2").write_bytes(pickle.dumps(raw))
    with pytest.raises(hang_report.DumpError, match=rf"entry 0 lacks '{key}'"):
        hang_report.read_run(directory)


def test_a_repeated_entry_is_refused_as_it_is_read(tmp_path: Path) -> None:
    directory = build("sub_group_stall", tmp_path / "dumps")
    raw = pickle.loads((directory / f"{PREFIX}0").read_bytes())
    raw["entries"].append(raw["entries"][0])
    (directory / f"{PREFIX}0").write_bytes(pickle.dumps(raw))
    with pytest.raises(hang_report.DumpError, match="entry 3 is entry 0 again"):
        hang_report.read_run(directory)


# --- merging is linear ----------------------------------------------------------------------------------------------


def _dumps_of(count: int) -> list[RankDump]:
    """``count`` reduced dumps whose default group no record lists (torch's Gloo dumps): each names it alone."""
    base = summarize(write(Path(_dumps_of.folder), Rank(0, [WORLD], Clock())), 0)  # type: ignore[attr-defined]
    return [
        dataclasses.replace(
            base, rank=r, default_ranks=None, groups={"0": GroupFacts((r,), stated=False, desc="default_pg")}
        )
        for r in range(count)
    ]


def test_merging_many_dumps_is_linear(tmp_path: Path) -> None:
    """Merging 4x the dumps costs about 4x (at most 8x here); the quadratic merge it replaces (each dump re-sorting
    the members seen so far) cost 16x. The cost is this process's CPU time (the merge runs here, in one thread),
    the best of 5, the two sizes alternated: wall time at a load of 42 on 2 cores gave 35x for a 15 ms merge."""
    _dumps_of.folder = tmp_path  # type: ignore[attr-defined]
    sets = {"small": _dumps_of(2_000), "large": _dumps_of(8_000)}
    times = dict.fromkeys(sets, float("inf"))
    for _ in range(5):
        for name, dumps in sets.items():
            start = time.process_time()
            analysis = analyse(iter(dumps))
            times[name] = min(times[name], time.process_time() - start)
            assert next(g for g in analysis.groups if g.name == "0").ranks == tuple(range(len(dumps)))
    assert times["large"] / times["small"] < 8, times


def test_dump_format_constants_are_what_the_docs_say() -> None:
    cap, how = dump_format.dump_cap({})
    assert cap == 4 * 2000 * (16 << 10) + (64 << 20) and how.startswith("4 recorders x 2,000 entries")
    assert dump_format.dump_cap({"TORCH_FR_BUFFER_SIZE": "20000"})[0] == 4 * 20000 * (16 << 10) + (64 << 20)


def test_gloo_saying_completed_is_not_evidence(tmp_path: Path) -> None:
    """Gloo's entries marked 'completed' with completion times (as NCCL's would be): still not evidence that they
    finished, since Gloo's recorder retires a collective that timed out as one that finished. Exit 1, unconfirmed;
    the same entries under NCCL's name read healthy."""
    for lib, code in (("gloo", 1), ("nccl", 0)):
        clock, folder = Clock(), tmp_path / lib
        ranks = [Rank(r, [WORLD], clock, lib=lib) for r in range(2)]
        for _ in range(3):
            for rank in ranks:
                rank.collective(WORLD)
            clock.settle()
        for rank in ranks:
            write(folder, rank)
        report = hang_report.read_run(folder)
        assert report.exit_code == code, (lib, report.line)
        if lib == "gloo":
            assert [f.kind for f in report.findings] == ["unconfirmed"], report.line
            assert not report.dumps[0].recorder("gloo").tracks_completion
