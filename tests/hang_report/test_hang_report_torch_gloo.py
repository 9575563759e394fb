"""``hang-report`` on the dumps torch's own recorder writes on real Gloo ranks, with none of the shim in them.

Six 4-rank worlds, each once per module (:mod:`tests.ranks.torch_fr`): ``init_process_group`` and
``new_group`` called directly, ``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE`` set by hand, each
rank's dump written by torch (``_dump_fr_trace_file``) under torch's default name ``nccl_trace_rank_``.
What torch writes there, observed and asserted below: Gloo keeps every entry ``scheduled``, its
``pg_config`` holds one group under ``''`` with the wrong ranks, and it records no send/recv at all; torch 2.15's
``_dump_fr_trace_file`` leaves out where each collective was called (``frames``), and then no place is said.
"""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from tests.harness.hostile_inputs import PEAK_MB, SECONDS, run_capped
from tests.ranks import torch_fr

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

TIMEOUT_S, GRACE_S = 3, 3
SPAWN_TIMEOUT_S = 240
BUFFER = 50
PREFIX = "nccl_trace_rank_"


def _world(tmp_path_factory: pytest.TempPathFactory, scenario: str, **extra: Any) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp(scenario)
    params = {"scenario": scenario, "timeout_s": TIMEOUT_S, "grace_s": GRACE_S, **extra}
    env = {
        "TORCH_FR_BUFFER_SIZE": str(BUFFER),
        "TORCH_FR_DUMP_TEMP_FILE": str(directory / PREFIX),
        "CUDA_VISIBLE_DEVICES": "",
    }
    results = spawn_ranks(
        "tests.ranks.torch_fr:run_scenario", params, world_size=4, timeout_s=SPAWN_TIMEOUT_S, env=env, check=False
    )
    return {"dir": directory, "results": {r.rank: r.result for r in results}, "errors": [r.error for r in results]}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, dict[str, Any]]:
    scenarios = {
        "sub_group_stall": {},
        "mismatch": {},
        "p2p_stall": {},
        "batched_p2p_stall": {},
        "dead_rank": {},
        "healthy": {"rounds": 3, "extra": BUFFER + 10},
        "crossed": {},
    }
    return {name: _world(tmp_path_factory, name, **extra) for name, extra in scenarios.items()}


def _dumps(world: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(p.name[len(PREFIX) :]): pickle.loads(p.read_bytes()) for p in world["dir"].glob(f"{PREFIX}*")}


def _called_at(world: dict[str, Any], rank: int, call: str) -> str:
    """`` at <torch_fr.py>:<line> in <lambda>``, where ``rank``'s dump carries torch's ``frames``; else empty.

    torch 2.15's ``_dump_fr_trace_file(rank)`` leaves stack traces out unless asked (``includeStackTraces``
    defaults to False there, True in ``_dump_fr_trace``, which the ranks write on an older torch): without
    frames, the line places no one.
    """
    entries = _dumps(world)[rank]["entries"]
    if not any(e.get("frames") for e in entries):
        return ""
    with open(torch_fr.__file__, encoding="utf-8") as handle:
        line = next(number for number, text in enumerate(handle, 1) if call in text)
    return f" at {torch_fr.__file__}:{line} in <lambda>"


def _report(directory: Path, *, with_torch: bool = False) -> hang_report.HangReport:
    return hang_report.read_run(directory, with_torch=with_torch)


def _recorded(world: dict[str, Any]) -> None:
    """Skip, with the numbers, where this torch's Gloo recorder wrote no collective (torch before 2.11)."""
    import torch

    counts = [len(d["entries"]) for _, d in sorted(_dumps(world).items())]
    if not any(counts):
        pytest.skip(f"torch {torch.__version__}'s Gloo recorder recorded no collective: entries per dump {counts}")


def test_the_worlds_ran_as_intended(worlds) -> None:
    for name, world in worlds.items():
        failed = {rank: world["errors"][rank] for rank, result in world["results"].items() if result is None}
        expected = {1} if name == "dead_rank" else set()
        assert set(failed) == expected, (name, failed)
    stall = worlds["sub_group_stall"]["results"]
    assert stall[3]["step2"] == "never entered" and stall[2]["step2"].startswith("raised: "), stall
    assert "Timed out" in stall[2]["step2"]
    assert worlds["p2p_stall"]["results"][3]["step2"].startswith("raised: "), worlds["p2p_stall"]["results"]
    assert worlds["batched_p2p_stall"]["results"][3]["step2"].startswith("raised: ")
    assert worlds["dead_rank"]["results"][1] is None and sorted(_dumps(worlds["dead_rank"])) == [0, 2, 3]
    crossed = worlds["crossed"]["results"]
    # Both raised (timed out, or a peer's timeout closed the group under it): no half met the other in its second
    both = ("first", "second")
    assert all(crossed.get(r) and all(crossed[r][k].startswith("raised: ") for k in both) for r in range(4)), (
        crossed,
        worlds["crossed"]["errors"],
    )
    # Each rank dumped once Gloo's worker had retired its timed-out work (G-RETIRE; torch_fr._until_retired)
    assert all(crossed[r]["retired_after_s"] is not None for r in range(4)), crossed
    for name in ("sub_group_stall", "mismatch", "p2p_stall", "batched_p2p_stall", "healthy", "crossed"):
        assert sorted(_dumps(worlds[name])) == [0, 1, 2, 3], (name, worlds[name]["errors"])


def test_what_torch_writes_on_gloo(worlds) -> None:
    """What the reading rests on: no shim keys, every entry 'scheduled', pg_config under '' with the wrong ranks."""
    _recorded(worlds["sub_group_stall"])
    dumps = _dumps(worlds["sub_group_stall"])
    for rank, dump in dumps.items():
        assert "nemo_rl_shim" not in dump and "rank" not in dump, sorted(dump)
        assert {e["state"] for e in dump["entries"]} == {"scheduled"}, rank
        assert list(dump["pg_config"]) == [""], dump["pg_config"]
    assert {dump["pg_config"][""]["ranks"] for dump in dumps.values()} != {"[2, 3]"}, "rank 3's own group is not it"
    assert all(e["profiling_name"] == "gloo:all_reduce" for e in dumps[2]["entries"])


def test_a_sub_group_stall_names_the_rank_op_and_group(worlds) -> None:
    _recorded(worlds["sub_group_stall"])
    report = _report(worlds["sub_group_stall"]["dir"])
    first = report.findings[0]
    assert (first.kind, first.ranks, first.waiting, first.op, first.seq) == ("stall", [3], [2], "all_reduce", 3)
    assert first.group.ranks == (2, 3) and not first.group.members_stated, "torch's Gloo dumps list no group's members"
    label = "tp, seen ranks 2-3" if first.group.desc == "tp" else f"process group {first.group.name}, seen ranks 2-3"
    at = _called_at(worlds["sub_group_stall"], 2, "lambda: dist.all_reduce(torch.ones(4), group=mine)")
    assert (
        report.kind.body
        == f"rank 3 did not enter all_reduce #3 on {label}, in which rank 2 waited {TIMEOUT_S:.1f} s{at}"
    )
    assert (report.kind.name, report.kind.ranks) == ("never_came", (3,)), report.line
    assert report.exit_code == hang_report.EXIT_FOUND


def test_gloo_marking_the_timed_out_collective_finished_changes_nothing(worlds, tmp_path) -> None:
    """As #22 observed it on another run: rank 2's timed-out all_reduce #3 ``retired`` and counted completed in
    ``pg_status``; the entry's state ('scheduled') decides, and rank 3 is still the one named."""
    _recorded(worlds["sub_group_stall"])
    directory = tmp_path / "dumps"
    shutil.copytree(worlds["sub_group_stall"]["dir"], directory)
    path = directory / f"{PREFIX}2"
    dump = pickle.loads(path.read_bytes())
    dump["entries"][-1]["retired"] = True
    for status in dump["pg_status"].values():
        status["last_completed_collective"] = status["last_enqueued_collective"]
    path.write_bytes(pickle.dumps(dump))
    before = _report(worlds["sub_group_stall"]["dir"]).line
    assert _report(directory).line == before


def test_torch_analyzer_fails_on_gloos_pg_config_in_one_line(worlds) -> None:
    _recorded(worlds["sub_group_stall"])
    report = _report(worlds["sub_group_stall"]["dir"], with_torch=True)
    facts = report.torch
    last = hang_report.render(report).splitlines()[-1]
    if facts["outcome"] == "absent":
        assert last.endswith(facts["error"]) and facts["error"].startswith("not in this torch"), facts
        return
    assert facts["outcome"] == "failed" and facts["error"].startswith("KeyError: "), facts
    assert last == f"torch {facts['torch']} analyzer: did not run: {facts['error']}"
    assert report.kind.body.startswith("rank 3 did not enter"), "the first line does not depend on it"


def test_a_mismatch_names_the_odd_one_out(worlds) -> None:
    _recorded(worlds["mismatch"])
    report = _report(worlds["mismatch"]["dir"])
    assert report.line == (
        "mismatch (sizes): rank 2 differs on broadcast #2 on default, seen ranks 0-3: input sizes [[8]] (rank 2) "
        "where ranks 0-1, 3 have [[4]]; fix: the sizes rank 2 passes to broadcast #2"
    )
    assert report.exit_code == hang_report.EXIT_FOUND


@pytest.mark.parametrize("name", ["p2p_stall", "batched_p2p_stall"])
def test_p2p_on_gloo_cannot_be_told_and_does_not_exit_0(worlds, name: str, capfd) -> None:
    """torch's Gloo recorder records no send/recv: the dumps hold nothing, and the report says it cannot tell."""
    dumps = _dumps(worlds[name])
    if any(d["entries"] for d in dumps.values()):  # a torch whose Gloo records p2p: then rank 2 must be named
        report = _report(worlds[name]["dir"])
        assert report.findings and report.findings[0].ranks == [2], hang_report.render(report)
        return
    assert main(["hang-report", str(worlds[name]["dir"])]) == 2
    err = capfd.readouterr().err  # exit 2 is one line naming the input (#43)
    assert err.startswith(f"hang-report: {worlds[name]['dir']}: its 4 dumps hold no entry"), err
    assert err.count("\n") == 1, err


def test_a_dead_rank_is_named_before_the_rank_waiting_on_it(worlds) -> None:
    _recorded(worlds["dead_rank"])
    report = _report(worlds["dead_rank"]["dir"])
    assert report.missing == [1]
    assert report.line.startswith("no dump from rank 1: "), hang_report.render(report)
    stalls = [f for f in report.findings if f.kind == "stall"]
    assert [(f.ranks, f.waiting) for f in stalls] == [([0], [2])], [f.line() for f in report.findings]


def test_a_wrapped_buffer_is_out_of_reach_and_gloo_alone_never_reads_healthy(worlds) -> None:
    """Ranks 0-1's buffers wrapped past the default group's collectives: out of reach, not behind. And a healthy
    run's Gloo dumps still do not exit 0: no record states the world, and Gloo's recorder never says a collective
    finished (it retires one that timed out alike); with the world given, only the latter is left."""
    _recorded(worlds["healthy"])
    dumps = _dumps(worlds["healthy"])
    assert all(len(d["entries"]) == BUFFER for r, d in dumps.items() if r < 2)
    assert all(d["entries"][0]["record_id"] > 0 for r, d in dumps.items() if r < 2), "ranks 0-1 wrapped"
    report = _report(worlds["healthy"]["dir"])
    default = next(g for g in report.groups if g.desc == "default_pg")
    assert default.ranks == (2, 3) and not default.members_stated, "without the world, only the ranks its entries show"
    assert [f.kind for f in report.findings][:2] == ["world unknown", "unconfirmed"], hang_report.render(report)
    assert report.exit_code == hang_report.EXIT_FOUND and report.line.startswith(
        "cannot tell whether every rank dumped"
    )
    assert report.line.endswith("give the world with --world N"), report.line
    given = hang_report.read_run(worlds["healthy"]["dir"], world=4)
    default = next(g for g in given.groups if g.desc == "default_pg")
    assert default.out_of_reach == [0, 1] and default.last[2] == default.last[3] == 3, default
    assert {f.kind for f in given.findings} == {"unconfirmed"} and given.exit_code == hang_report.EXIT_FOUND
    assert given.line.startswith("cannot tell whether ranks 2-3 finished all_reduce #3 on default, ranks 0-3: "), (
        given.line
    )


# --- #33: never "every rank agrees" while a rank is missing or a collective is unfinished -------------------------


def _without(world: dict[str, Any], tmp_path: Path, rank: int) -> Path:
    directory = tmp_path / "dumps"
    shutil.copytree(world["dir"], directory)
    (directory / f"{PREFIX}{rank}").unlink()
    return directory


@pytest.mark.parametrize("name", ["healthy", "sub_group_stall"])
def test_the_top_ranks_dump_missing_is_never_every_rank_agrees(worlds, tmp_path, name: str) -> None:
    """#33: rank 3's dump removed (a healthy rank, or the one that hung): main read the rest as 'every rank agrees:
    3 dumps'. torch's Gloo dumps state no world: exit 1 saying rank 3 and above may be missing and how to give the
    world; the group rank 3 shared shows only the rank seen, never 'all at #N'; given the world, rank 3 is named.
    Run as the command under the 6 GiB cap."""
    _recorded(worlds[name])
    directory = _without(worlds[name], tmp_path, 3)
    outcome = run_capped("hang-report", str(directory))
    assert outcome.code == 1 and 0 < outcome.cpu_s < SECONDS and outcome.peak_mb < PEAK_MB, outcome
    if name == "healthy":
        assert outcome.line.startswith("cannot tell whether every rank dumped: no record states the world"), outcome
        assert "ranks above 2 may have left no dump" in outcome.line and outcome.line.endswith("--world N")
    assert "all at #" not in outcome.out and "every rank agrees" not in outcome.out, outcome.out
    report = _report(directory)
    tp = next(g for g in report.groups if 2 in g.ranks and g.desc == "tp")
    assert tp.ranks == (2,) and not tp.members_stated, tp
    given = run_capped("hang-report", "--world", "4", str(directory))
    named = re.match(r"(?:never came \([^)]*\): )?no dump from rank 3\b", given.line)
    assert given.code == 1 and named, given


def test_every_rank_waiting_in_a_collective_is_never_every_rank_agrees(worlds) -> None:
    """#33: every rank timed out inside an all_reduce, none idle (:func:`tests.ranks.torch_fr._crossed`): every
    group at #1 on every rank, each collective retired and counted completed by Gloo. main read 'every rank agrees';
    now exit 1: Gloo's recorder never says a collective finished."""
    _recorded(worlds["crossed"])
    dumps = _dumps(worlds["crossed"])
    unlike = [(r, e.get("op_id"), e["retired"], e["state"]) for r, d in dumps.items() for e in d["entries"]]
    assert all(retired and state == "scheduled" for _, _, retired, state in unlike), unlike
    assert {d["pg_status"]["1"]["last_completed_collective"] for d in dumps.values()} == {1}, "Gloo counts it done"
    outcome = run_capped("hang-report", "--world", "4", str(worlds["crossed"]["dir"]))
    assert outcome.code == 1 and 0 < outcome.cpu_s < SECONDS and outcome.peak_mb < PEAK_MB, outcome
    report = hang_report.read_run(worlds["crossed"]["dir"], world=4)
    assert {(f.kind, tuple(f.ranks)) for f in report.findings} == {("unconfirmed", (0, 1, 2, 3))}
    assert len(report.findings) == 2 and {f.group.desc for f in report.findings} == {"a", "b"}
    assert outcome.line == report.line and report.line.startswith(
        "cannot tell whether ranks 0-3 finished all_reduce #1"
    )
