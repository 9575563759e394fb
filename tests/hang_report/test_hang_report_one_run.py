"""#43: "every rank agrees" only where the folder is provably one run and each file provably its rank's.

Each case of the issue, on folders built from the healthy NCCL-format sets (:mod:`tests.harness.run_mixes`), then
each rule on its own, named for the rule: one run proved (:mod:`.run_split`), each file its rank's
(:mod:`.file_identity`, :mod:`.folder`, the p2p names of :mod:`.recording_rules`), internally consistent or refused
(:mod:`.recording_rules`), and the contract (exit 2 one line naming the input; ``--json`` bounded by the input; a
figure's source is its file). The property test over mixes of all of these is ``test_hang_report_runs_property.py``.
"""

from __future__ import annotations

import array
import json
import pickle
from pathlib import Path

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.flight_recorder.names import HEADER, STACK_FILE_NAME
from nemo_rl_shim.hang_report.file_identity import ENDS, fingerprint, same_bytes
from nemo_rl_shim.hang_report.recording_rules import GAPS_KEPT, collective_gaps
from nemo_rl_shim.hang_report.run_split import MIN_RUN_GAP_NS
from tests.harness import run_mixes
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write
from tests.harness.nccl_scenarios import DEFAULT4, EXPECTED, build
from tests.harness.run_mixes import DAY_NS, PREFIX


def _run(folder: Path, capfd, *args: str) -> tuple[int, str, str]:
    code = main(["hang-report", str(folder), *args])
    out, err = capfd.readouterr()
    return code, out, err


def _json(folder: Path, capfd, *args: str) -> tuple[int, dict]:
    code, out, _ = _run(folder, capfd, "--json", *args)
    return code, json.loads(out)


def _one_line(err: str, *words: str) -> str:
    """The one line of an exit 2 on stderr, holding ``words``."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hang-report: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _healthy(folder: Path) -> Path:
    return build("healthy", folder)


def _live_stall(folder: Path, rank_3_dumps: bool = False) -> Path:
    """Four ranks, three all_reduces done; ranks 0-2 enter #4 and wait; rank 3 left no dump (dead)."""
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4], clock, timing=True) for r in range(4)]
    for step in range(4):
        for rank in ranks:
            if not (step == 3 and rank.rank == 3):
                rank.collective(DEFAULT4, state="started" if step == 3 else "completed")
        clock.settle()
    for rank in ranks if rank_3_dumps else ranks[:3]:
        write(folder, rank)
    return folder


def _older_run(folder: Path, rounds: int, shift_ns: int) -> Path:
    """A run of four ranks, ``rounds`` all_reduces all completed, ``shift_ns`` before the default clock."""
    clock = Clock(now_ns=Clock().now_ns + shift_ns)
    ranks = [Rank(r, [DEFAULT4], clock, timing=True) for r in range(4)]
    for _ in range(rounds):
        for rank in ranks:
            rank.collective(DEFAULT4)
        clock.settle()
    for rank in ranks:
        write(folder, rank)
    return folder


# --- the cases ----------------------------------------------------------------------------------------------


def test_dumps_of_another_torch_and_nccl_are_another_run(tmp_path: Path, capfd) -> None:
    """Ranks 0-1 from one run, ranks 2-3 from a run a day later under another torch and NCCL: two runs, named; the
    report is on the newer, in which ranks 0-1 left no dump; never exit 0."""
    folder = _healthy(tmp_path / "folder")
    later = run_mixes.other_run("healthy", tmp_path / "later", DAY_NS, version="2.11", nccl="2.28.9")
    run_mixes.mix_runs(folder, later, (2, 3))
    code, payload = _json(folder, capfd)
    assert code == 1 and payload["runs"]["count"] == 2 and payload["runs"]["reported"] == 2, payload["line"]
    assert payload["missing_dumps"] == [0, 1] and payload["kind"]["name"] in ("no_dump", "never_came"), payload["line"]
    aside = payload["runs"]["runs"][0]
    assert aside["files"] == 2 and "dump format version is 2.10, where the run's is 2.11" in aside["set_aside"], aside
    code, text, _ = _run(folder, capfd)
    assert code == 1 and "runs (2 in the folder; this report is on run 2):" in text, text
    assert "run 1: 2 dumps (ranks 0-1)" in text and "run 2: 2 dumps (ranks 2-3)" in text, text


def test_a_stale_dump_never_stands_in_for_a_missing_rank(tmp_path: Path, capfd) -> None:
    """A week-old run's rank-3 dump beside a live stall in which rank 3 left none: set aside, and the report says
    what it says without it: rank 3 left no dump."""
    alone = _live_stall(tmp_path / "alone")
    code, without = _json(alone, capfd)
    folder = _live_stall(tmp_path / "folder")
    old = _older_run(tmp_path / "old", rounds=4, shift_ns=-7 * DAY_NS)
    run_mixes.mix_runs(folder, old, (3,))
    code_with, payload = _json(folder, capfd)
    assert code == code_with == 1 and payload["missing_dumps"] == [3] == without["missing_dumps"], payload["line"]
    assert payload["line"].startswith(without["line"]), (payload["line"], without["line"])
    assert payload["line"].startswith("never came (dead: no dump): no dump from rank 3: ranks 0-2 were last in "
                                      "all_reduce #4"), payload["line"]  # fmt: skip
    assert "set aside: run 1 (nccl_trace_rank_3)" in payload["line"], payload["line"]
    assert "did not finish" not in payload["line"] and payload["runs"]["runs"][0]["ranks"] == "3", payload["runs"]


def test_runs_of_different_lengths_are_not_merged(tmp_path: Path, capfd) -> None:
    """Ranks 0-1 from a run stuck in all_reduce #5, ranks 2-3 from a run a day later whose #5 completed: two runs;
    neither says ranks 2-3 waited in #5."""
    first = _live_stall(tmp_path / "first", rank_3_dumps=True)
    later = _older_run(tmp_path / "later", rounds=5, shift_ns=DAY_NS)
    run_mixes.mix_runs(first, later, (2, 3))
    code, payload = _json(first, capfd)
    assert code == 1 and payload["runs"]["count"] == 2 and "waited" not in payload["line"], payload["line"]


def test_a_directory_named_like_a_dump_is_exit_2_by_its_kind(tmp_path: Path, capfd) -> None:
    folder = _healthy(tmp_path / "folder")
    (folder / f"{PREFIX}3").unlink()
    (folder / f"{PREFIX}3").mkdir()
    code, out, err = _run(folder, capfd)
    assert code == 2 and not out
    _one_line(err, f"{folder / PREFIX}3 is a directory, not a regular file")


def test_dumps_with_no_entry_are_exit_2_one_line(tmp_path: Path, capfd) -> None:
    """A recorder that recorded nothing (Gloo's p2p, TORCH_FR_BUFFER_SIZE=0): no entry, no pg_status row
    (C-PG-STATUS: a group shows there once it recorded)."""
    folder = _healthy(tmp_path / "folder")
    for rank in range(4):
        path = folder / f"{PREFIX}{rank}"
        raw = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps({**raw, "entries": [], "pg_status": {}}))
    code, out, err = _run(folder, capfd)
    assert code == 2 and not out
    _one_line(err, f"{folder}: its 4 dumps hold no entry to compare")


def test_dumps_with_no_entry_whose_pg_status_counts_ops_are_cannot_tell(tmp_path: Path, capfd) -> None:
    """C-PG-STATUS, C-ONLY-ACTIVE, H-ONLY-ACTIVE: no entry, yet pg_status counts recorded ops: only-active dumps
    dropped them, and a hung NCCL2 batch leaves nothing: exit 1, cannot tell, naming what is missing."""
    folder = _healthy(tmp_path / "folder")
    for rank in range(4):
        path = folder / f"{PREFIX}{rank}"
        raw = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps({**raw, "entries": []}))
    code, out, _ = _run(folder, capfd)
    assert code == 1 and out.startswith("cannot tell: the 4 dumps hold no entry, yet rank 0's pg_status counts"), out


def test_json_is_bounded_by_the_input_not_by_a_world_it_states(tmp_path: Path, capfd) -> None:
    """A 34-byte group map stating a world of 1,048,576 ranks (no default group in the dumps): the missing ranks are
    one run of ranks in the JSON, not a million numbers (60.5 MB before #43)."""
    folder = _healthy(tmp_path / "folder")
    for path in folder.glob(f"{PREFIX}*"):
        raw = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps({**raw, "pg_config": {}}))
    (folder / "fr_groups_rank_0.json").write_text('{"world_size": 1048576, "rank": 0}')
    inputs = sum(p.stat().st_size for p in folder.iterdir())
    code, out, _ = _run(folder, capfd, "--json")
    payload = json.loads(out)
    assert code == 1 and payload["missing_dumps"] == {"count": 1_048_572, "runs": [[4, 1_048_575]]}, out[:500]
    assert len(out) < 4 * inputs, (len(out), inputs)


def test_a_figure_names_the_file_it_came_from(tmp_path: Path, capfd) -> None:
    """The world size from a group map is credited to the group map, not to the dump beside it."""
    folder = _healthy(tmp_path / "folder")
    for path in folder.glob(f"{PREFIX}*"):
        raw = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps({**raw, "pg_config": {}}))
    (folder / "fr_groups_rank_0.json").write_text('{"world_size": 4, "rank": 0}')
    code, payload = _json(folder, capfd)
    assert code == 0 and payload["world_from"] == f"the world_size in {folder / 'fr_groups_rank_0.json'}", payload


# --- one run, proved ------------------------------------------------------------------------------------------------


def test_a_clean_run_is_one_run(tmp_path: Path, capfd) -> None:
    folder = _healthy(tmp_path / "folder")
    code, payload = _json(folder, capfd)
    assert code == 0 and payload["line"] == EXPECTED["healthy"][1] + (
        f" of a world of 4 (the default group listed in {folder / PREFIX}0), every group's last collective finished"
    ), payload["line"]
    assert payload["runs"]["count"] == 1 and payload["strays"] == [], payload["runs"]


def test_a_restart_minutes_later_is_another_run(tmp_path: Path, capfd) -> None:
    """Same torch, NCCL and groups, three minutes apart (closer than :data:`MIN_RUN_GAP_NS`): the collectives tell
    them apart: ranks 2-3 finished #3 minutes before ranks 0-1 entered #1 of theirs."""
    assert MIN_RUN_GAP_NS > 3 * 60 * 10**9
    folder = _healthy(tmp_path / "folder")
    later = run_mixes.other_run("healthy", tmp_path / "later", 3 * 60 * 10**9)
    run_mixes.mix_runs(folder, later, (0, 1))
    code, payload = _json(folder, capfd)
    assert code == 1 and payload["runs"]["count"] == 2, payload["line"]
    aside = payload["runs"]["runs"][0]["set_aside"]
    assert "it finished #3 on process group '0' (ranks 0-3) 3.0 min before rank 1 entered #1" in aside, aside


def test_a_larger_worlds_dumps_are_set_aside_and_only_a_named_run_agrees(tmp_path: Path, capfd) -> None:
    """A run of 8 ranks wrote here a day before a run of 4 (a restart on fewer nodes): its ranks 4-7 are another
    run's. The newer run is complete and agrees, but the folder holds two runs: exit 1 unless ``--run`` names it."""
    folder = _healthy(tmp_path / "folder")
    default8 = Group("0", "default_pg", tuple(range(8)))
    clock = Clock(now_ns=Clock().now_ns - DAY_NS)
    ranks = [Rank(r, [default8], clock) for r in range(8)]
    for _ in range(2):
        for rank in ranks:
            rank.collective(default8)
        clock.settle()
    for rank in ranks[4:]:
        write(folder, rank)
    code, payload = _json(folder, capfd)
    assert code == 1 and payload["kind"]["name"] == "cannot_tell" and payload["kind"]["variant"] == "several runs"
    assert "name it with --run 2" in payload["line"] and payload["runs"]["count"] == 2, payload["line"]
    assert "it states a world of 8 ranks, where the run's is 4" in payload["runs"]["runs"][0]["set_aside"]
    code, payload = _json(folder, capfd, "--run", "2")
    assert code == 0 and payload["line"].startswith("every rank agrees: 4 dumps"), payload["line"]
    code, payload = _json(folder, capfd, "--run", "1")
    assert code == 1 and payload["missing_dumps"] == [0, 1, 2, 3], payload["line"]
    code, out, err = _run(folder, capfd, "--run", "3")
    assert code == 2 and not out
    _one_line(err, "--run 3: ", "holds 2 runs of dumps")


def test_one_name_for_two_disjoint_rank_sets_is_two_groups_of_one_run(tmp_path: Path, capfd) -> None:
    """Older ``split_group`` gave every color's group one counter name: tp {0, 1} and tp {2, 3} both "1". One run;
    two groups; rank 3 never enters #3 of its own."""
    tp = [Group("1", "mesh_tp", (0, 1)), Group("1", "mesh_tp", (2, 3))]
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4, tp[r // 2]], clock, timing=True) for r in range(4)]
    for step in range(3):
        for rank in ranks:
            if not (step == 2 and rank.rank == 3):
                rank.collective(tp[rank.rank // 2], state="started" if step == 2 and rank.rank == 2 else "completed")
        clock.settle()
    for rank in ranks:
        write(tmp_path, rank)
    code, payload = _json(tmp_path, capfd)
    assert code == 1 and payload["runs"]["count"] == 1, payload["line"]
    assert payload["line"].startswith(
        "never came: rank 3 did not enter all_reduce #3 on tp, ranks 2-3, in which rank 2 waited 600.0 s"
    ), payload["line"]
    names = sorted(g["name"] for g in payload["groups"] if g["axes"] == ["tp"])
    assert names == ["1 (ranks 0-1)", "1 (ranks 2-3)"], names


def test_one_name_for_two_overlapping_rank_sets_is_not_one_run(tmp_path: Path, capfd) -> None:
    """Ranks 0-1 list group "1" as {0, 1}, ranks 2-3 as {1, 2, 3}: rank 1 cannot be in both: two runs."""
    one, other = Group("1", "mesh_tp", (0, 1)), Group("1", "mesh_tp", (1, 2, 3))
    clock = Clock()
    for r in range(4):
        rank = Rank(r, [DEFAULT4, one if r < 2 else other], clock)
        rank.collective(DEFAULT4)
        write(tmp_path, rank)
    code, payload = _json(tmp_path, capfd)
    assert code == 1 and payload["runs"]["count"] == 2, payload["line"]
    aside = payload["runs"]["runs"][0]["set_aside"]
    assert "it lists process group '1' as ranks 0-1, where" in aside and "lists it as ranks 1-3" in aside, aside


def test_a_rank_listing_one_group_as_two_rank_sets_is_refused(tmp_path: Path, capfd) -> None:
    folder = _healthy(tmp_path / "folder")
    path = folder / f"{PREFIX}1"
    raw = pickle.loads(path.read_bytes())
    raw["nemo_rl_shim"] = {"groups": {"0": {"ranks": [0, 1], "desc": "default_pg"}}}
    path.write_bytes(pickle.dumps(raw))
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, "nemo_rl_shim.groups lists process group '0' as ranks 0-1, its pg_config as ranks 0-3")


def test_a_dump_whose_own_default_group_lacks_its_rank_is_refused(tmp_path: Path, capfd) -> None:
    """A rank outside the world its own record states (rank 3's file holding a 2-rank world's dump)."""
    folder = _healthy(tmp_path / "folder")
    default2 = Group("0", "default_pg", (0, 1))
    rank = Rank(0, [default2], Clock())
    rank.collective(default2)
    (folder / f"{PREFIX}3").write_bytes(pickle.dumps(rank.dump()))
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{PREFIX}3: rank 3 is outside the world of 2 ranks (the default group its own pg_config lists")


# --- each file is its rank's ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("symbolic", [False, True], ids=["hard link", "symlink"])
def test_two_rank_names_of_one_file_are_refused(tmp_path: Path, capfd, symbolic: bool) -> None:
    folder = _healthy(tmp_path / "folder")
    run_mixes.link(folder, 0, 3, symbolic=symbolic)
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{folder / PREFIX}0 and {folder / PREFIX}3 are one file", "rank 0's dump cannot also be rank 3's")


def test_a_copy_under_another_ranks_name_is_refused(tmp_path: Path, capfd) -> None:
    """Coalesced collectives on the default group only: nothing in the dump names its rank, but its bytes are rank
    0's."""
    folder = build("coalesced_healthy", tmp_path / "folder")
    run_mixes.copy(folder, 0, 2)
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{folder / PREFIX}0 and {folder / PREFIX}2 hold the same", "rank 0's dump cannot also be rank 2's")


def test_files_that_differ_only_in_their_middle_are_not_copies(tmp_path: Path) -> None:
    """The fingerprint reads a file's ends: two files alike there are compared in full before any is refused."""
    ends = b"e" * ENDS
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(ends + b"1" * 100 + ends)
    b.write_bytes(ends + b"2" * 100 + ends)
    prints = {0: (a, fingerprint(a.read_bytes())), 1: (b, fingerprint(b.read_bytes()))}
    assert prints[0][1] == prints[1][1]
    same_bytes(prints)
    b.write_bytes(a.read_bytes())
    with pytest.raises(hang_report.DumpError, match="hold the same"):
        same_bytes(prints)


def test_a_p2p_name_that_says_another_rank_wrote_the_file_is_refused(tmp_path: Path, capfd) -> None:
    """The files of ranks 2 and 3 swapped: rank 3's file holds ``send 2->3``."""
    folder = _healthy(tmp_path / "folder")
    run_mixes.swap(folder, 2, 3)
    assert "nccl:send 2->3" in run_mixes.p2p_names(folder, 3)
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{PREFIX}2: its nccl:send 3->0 #1 on process group '0', ranks 0-3 was written by rank 3, its file "
                   "name says rank 2")  # fmt: skip


def test_p2p_names_are_group_ranks(tmp_path: Path, capfd) -> None:
    """On pp {1, 3}, rank 3's ``recv 1<-0`` names group ranks: its writer is member 1, global rank 3. Read so."""
    folder = build("sub_group_p2p", tmp_path / "folder")
    assert "nccl:recv 1<-0" in run_mixes.p2p_names(folder, 3)
    code, out, _ = _run(folder, capfd)
    assert code == 1 and out.startswith(EXPECTED["sub_group_p2p"][1]), out


@pytest.mark.parametrize("text", ["\u0663", "03", "3.bak"], ids=["arabic-indic digit", "leading zero", "suffix"])
def test_a_rank_in_a_file_name_is_ascii_digits(tmp_path: Path, capfd, text: str) -> None:
    """Rank 3's file renamed: it is not a dump (a stray, named, never read), and rank 3 left no dump."""
    folder = _healthy(tmp_path / "folder")
    stray = run_mixes.rename(folder, 3, text)
    code, payload = _json(folder, capfd)
    assert code == 1 and payload["missing_dumps"] == [3] and payload["strays"] == [str(stray)], payload["line"]
    assert f"not dumps, not read: {PREFIX}{text}" in payload["line"], payload["line"]


def test_a_stack_file_that_says_another_rank_is_refused(tmp_path: Path, capfd) -> None:
    folder = _healthy(tmp_path / "folder")
    header = {"format": 1, "rank": 2, "pid": 7, "what": "train step", "after_s": 8.0}
    (folder / STACK_FILE_NAME.format(rank=1)).write_text(HEADER + json.dumps(header) + "\n")
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, "fr_stack_rank_1.txt: its header says rank 2 wrote it, its file name says rank 1")


# --- internally consistent, or refused ------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [pickle.dumps({"x": 1}), b"x" * 20_000], ids=["second pickle", "20 KB of text"])
def test_bytes_after_the_pickle_are_refused(tmp_path: Path, capfd, tail: bytes) -> None:
    folder = _healthy(tmp_path / "folder")
    run_mixes.append(folder, 1, tail)
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{PREFIX}1: {len(tail):,} bytes follow the pickle's end", "torch writes one pickle per file")


def test_a_p2p_peer_outside_its_group_is_refused(tmp_path: Path, capfd) -> None:
    folder = _healthy(tmp_path / "folder")
    assert run_mixes.peer_outside(folder, 3, peer=9) == "nccl:send 3->9"
    code, _, err = _run(folder, capfd)
    assert code == 2
    _one_line(err, f"{PREFIX}3: its nccl:send 3->9 #1 names its peer's group rank 9, outside process group '0'")


def test_a_collective_missing_from_one_ranks_buffer_is_a_gap(tmp_path: Path, capfd) -> None:
    """Rank 3 holds all_reduce #1 and #3, not #2, in a buffer that never wrapped; ranks 0-2 hold #2: cannot tell."""
    folder = _healthy(tmp_path / "folder")
    run_mixes.drop_collective(folder, 3, "0", 2)
    code, payload = _json(folder, capfd)
    assert code == 1 and payload["kind"]["name"] == "cannot_tell" and payload["kind"]["variant"] == "gap"
    assert payload["line"].startswith(
        "cannot tell what rank 3's dump says of default, ranks 0-3: it holds #1 to #3 but not #2, which ranks 0-2 "
        "recorded"
    ), payload["line"]


def test_a_number_every_rank_skips_is_no_gap(tmp_path: Path, capfd) -> None:
    """torch burns a number on every rank alike (an empty coalescing region; an op under CUDA graph capture): #2
    missing from every buffer is no gap."""
    folder = _healthy(tmp_path / "folder")
    for rank in range(4):
        run_mixes.drop_collective(folder, rank, "0", 2)
    code, out, _ = _run(folder, capfd)
    assert code == 0 and out.startswith(EXPECTED["healthy"][1]), out


def test_an_only_active_dump_is_not_read_for_gaps(tmp_path: Path, capfd) -> None:
    """``TORCH_INCLUDE_ONLY_ACTIVE=1`` drops completed records: a dump with none completed has gaps by design."""
    folder = _live_stall(tmp_path / "folder", rank_3_dumps=True)
    for rank in range(4):
        path = folder / f"{PREFIX}{rank}"
        raw = pickle.loads(path.read_bytes())
        raw["entries"] = [e for e in raw["entries"] if e["state"] != "completed"]
        path.write_bytes(pickle.dumps(raw))
    code, payload = _json(folder, capfd)
    assert code == 1 and all(f["kind"] != "gap" for f in payload["findings"]), payload["findings"]


def test_collective_numbers_allow_repeats_wraps_and_disorder() -> None:
    """Coalesced ops repeat a number; a wrapped buffer starts anywhere; torch 2.15's hook may record out of order."""
    numbers = array.array("q", [7, 8, 8, 10, 9, 11])
    assert collective_gaps(numbers) == ((), (7, 11))
    assert collective_gaps(array.array("q", [5, 7])) == ((6,), (5, 7))
    assert collective_gaps(array.array("q", [1, 1, 3])) == ((2,), (1, 3)), "a repeat does not hide a gap"
    many = collective_gaps(array.array("q", [1, 100]))[0]
    assert len(many) == GAPS_KEPT and many[0] == 2


def test_the_rules_read_nothing_from_a_wrapped_buffers_start(tmp_path: Path, capfd) -> None:
    """The wrapped sets keep no number below their oldest: each still agrees, whatever its first number."""
    for name in ("wrapped_healthy", "wrapped_by_one"):
        code, out, _ = _run(build(name, tmp_path / name), capfd)
        assert code == 0 and out.startswith(EXPECTED[name][1]), (name, out)


def test_the_report_api_takes_the_run(tmp_path: Path) -> None:
    folder = _live_stall(tmp_path / "folder")
    run_mixes.mix_runs(folder, _older_run(tmp_path / "old", rounds=4, shift_ns=-7 * DAY_NS), (3,))
    report = hang_report.read_run(folder, run=1)
    assert report.chosen is not None and report.chosen.number == 1 and sorted(report.dumps) == [3]
    assert [run.number for run in report.runs] == [1, 2] and report.missing == [0, 1, 2]
