"""Flight Recorder dumps from real stalls on real Gloo ranks, and ``nemo-rl-shim hang-report`` on them.

Three spawned worlds, each once per module (:mod:`tests.ranks.flight_recorder`), through the real
``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on. Start-up timeout 0.2 min (12 s: the
rendezvous runs under it, and ranks importing Automodel on busy cores arrive seconds apart), steady
0.05 min (3 s), set by ``after_first_step`` before the fault where the fault is not the phase change:

* ``sub_groups``, 4 ranks, tp=2: on tp group [2, 3] rank 3 never enters an all-reduce and rank 2
  times out in it; on tp group [0, 1] a broadcast with mismatched sizes (Gloo completes it without
  an error), after which both ranks dump themselves;
* ``phase_change``, 2 ranks: rank 1 stalls through the barrier of ``after_first_step``;
* ``dead_rank``, 2 ranks: rank 1 exits before an all-reduce and leaves no dump;
* ``answered``, 2 ranks: nothing stalls; rank 0 asks every watcher to dump and times their answers.

The report is then read in this process from those dumps (copied, so that tests can delete or
corrupt files): its first line, exit codes, a corrupt file, a missing dump, a bad directory, and
what torch's own analyzer made of the dumps.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, SIDECAR_NAME
from tests.ranks.flight_recorder import ANSWER_WAIT_S

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

STARTUP_MIN, STEADY_MIN = 0.2, 0.05
STARTUP_S, STEADY_S = STARTUP_MIN * 60, STEADY_MIN * 60
STALL_S = STARTUP_S + 3  # the stalled rank sleeps through its peer's timeout, and its watcher dumps meanwhile
SPAWN_TIMEOUT_S = 300
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def _world(tmp_path_factory: pytest.TempPathFactory, scenario: str, world_size: int, **extra: Any) -> dict[str, Any]:
    dump_dir = tmp_path_factory.mktemp(scenario)
    params = {
        "scenario": scenario,
        "dump_dir": str(dump_dir),
        "startup": STARTUP_MIN,
        "steady": STEADY_MIN,
        "stall_s": STALL_S,
        **extra,
    }
    results = spawn_ranks(
        "tests.ranks.flight_recorder:run_scenario",
        params,
        world_size=world_size,
        timeout_s=SPAWN_TIMEOUT_S,
        env=CPU_ONLY,
        check=False,  # the dead rank fails on purpose; a rank may exit uncleanly after writing its result
    )
    return {"dir": dump_dir, "results": results}


def _results(world: dict[str, Any], expect: int) -> dict[int, dict[str, Any]]:
    results: list[RankResult] = world["results"]
    got = {r.rank: r.result for r in results if isinstance(r.result, dict)}
    missing = [f"rank {r.rank}: {r.error or r.output[-2000:]}" for r in results if r.rank not in got]
    assert len(got) == expect, "ranks without a result:\n" + "\n".join(missing)
    return got


@pytest.fixture(scope="module")
def sub_groups(tmp_path_factory) -> dict[str, Any]:
    return _world(tmp_path_factory, "sub_groups", 4, tp=2)


@pytest.fixture(scope="module")
def phase_change(tmp_path_factory) -> dict[str, Any]:
    return _world(tmp_path_factory, "phase_change", 2)


@pytest.fixture(scope="module")
def dead_rank(tmp_path_factory) -> dict[str, Any]:
    return _world(tmp_path_factory, "dead_rank", 2)


@pytest.fixture(scope="module")
def answered(tmp_path_factory) -> dict[str, Any]:
    return _world(tmp_path_factory, "answered", 2)


def _copy(world: dict[str, Any], tmp_path: Path) -> Path:
    target = tmp_path / "dumps"
    shutil.copytree(world["dir"], target)
    return target


def _finding(report: hang_report.HangReport, kind: str) -> Any:
    found = [f for f in report.findings if f.kind == kind]
    assert found, f"no {kind} finding; the report says:\n{hang_report.render(report)}"
    return found[0]


# --- the worlds ran as intended -------------------------------------------------------------------------------------


def test_every_rank_but_the_dead_one_dumped(sub_groups, phase_change, dead_rank) -> None:
    assert sorted(p.name for p in sub_groups["dir"].glob(f"{DUMP_FILE_NAME}*")) == [
        f"{DUMP_FILE_NAME}{r}" for r in range(4)
    ]
    assert sorted(p.name for p in phase_change["dir"].glob(f"{DUMP_FILE_NAME}*")) == [
        f"{DUMP_FILE_NAME}{r}" for r in range(2)
    ]
    assert [p.name for p in dead_rank["dir"].glob(f"{DUMP_FILE_NAME}*")] == [f"{DUMP_FILE_NAME}0"]
    for world, size in ((sub_groups, 4), (phase_change, 2), (dead_rank, 2)):
        sidecars = sorted(p.name for p in world["dir"].glob("fr_groups_rank_*.json"))
        assert sidecars == sorted(SIDECAR_NAME.format(rank=r) for r in range(size))


def test_sub_group_world_used_real_sub_groups(sub_groups) -> None:
    results = _results(sub_groups, 4)
    assert {r: results[r]["tp_ranks"] for r in results} == {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    assert not any(r["tp_is_default"] for r in results.values())
    assert results[2]["outcome"] == "raised" and "Timed out" in results[2]["error"], results[2]
    assert results[3]["outcome"] == "stalled" and results[3]["dumped"], results[3]
    assert results[0]["outcome"] == results[1]["outcome"] == "completed", "Gloo completes a mismatched broadcast"


def test_the_stalled_rank_dumped_because_its_peer_asked(sub_groups, phase_change) -> None:
    for world, stalled, asker in ((sub_groups, 3, 2), (phase_change, 1, 0)):
        dump = pickle.loads((world["dir"] / f"{DUMP_FILE_NAME}{stalled}").read_bytes())
        assert dump["rank"] == stalled
        assert dump["nemo_rl_shim"]["reason"].startswith(f"rank {asker} asked: "), dump["nemo_rl_shim"]["reason"]


def test_every_watcher_answers_the_rank_that_asked(answered) -> None:
    """Rank 0 asks (``request_peer_dumps``) with nothing stalled: both watchers, its own and rank 1's, dump and
    answer well before the wait's bound (a watcher that dumps but does not answer costs the asker the full wait)."""
    results = _results(answered, 2)
    asked = results[0]
    assert asked["answered"] == 2, asked
    assert asked["seconds"] < ANSWER_WAIT_S / 2, asked
    assert results[1]["dumped"], results[1]
    dump = pickle.loads((answered["dir"] / f"{DUMP_FILE_NAME}1").read_bytes())
    assert dump["nemo_rl_shim"]["reason"] == "rank 0 asked: the test asks", dump["nemo_rl_shim"]["reason"]


def test_dumps_are_torchs_format_plus_rank_and_group_map(sub_groups) -> None:
    dump = pickle.loads((sub_groups["dir"] / f"{DUMP_FILE_NAME}2").read_bytes())
    assert {"version", "pg_config", "entries"} <= set(dump), sorted(dump)
    shim = dump["nemo_rl_shim"]
    assert shim["rank"] == 2 and shim["world_size"] == 4
    axes = {name: facts["axes"] for name, facts in shim["groups"].items()}
    tp_name = next(name for name, a in axes.items() if "tp" in a)
    assert shim["groups"][tp_name]["ranks"] == [2, 3]
    assert any(e["process_group"][0] == tp_name for e in dump["entries"]), "no entry of the tp group"
    assert tp_name in dump["pg_config"], "pg_config is keyed by the group names the entries carry"
    # with the recorder's buffer set, torch records Gloo's collectives: its own pg_config then holds one group under ''
    assert dump["entries"], "the recorder recorded nothing"
    torch_pg_config = shim["torch_pg_config"]
    assert isinstance(torch_pg_config, dict) and "" in torch_pg_config, torch_pg_config


# --- the report's first line names the rank ------------------------------------------------------------------------


def test_stall_on_a_sub_group_names_rank_op_axis_and_wait(sub_groups) -> None:
    report = hang_report.read_run(sub_groups["dir"])
    stall = _finding(report, "stall")
    assert stall.ranks == [3] and stall.waiting == [2]
    assert stall.group.axes[0] == "tp" and stall.group.ranks == (2, 3)
    assert stall.op == "all_reduce"
    assert stall.waited_s is not None and stall.waited_s >= STEADY_S
    assert stall.line().startswith(f"rank 3 did not enter all_reduce #{stall.seq} on tp, ranks 2-3, in which rank 2")
    assert report.exit_code == hang_report.EXIT_FOUND


def test_mismatched_sizes_are_named_first(sub_groups) -> None:
    report = hang_report.read_run(sub_groups["dir"])
    mismatch = _finding(report, "mismatch")
    assert mismatch.op == "broadcast" and mismatch.group.ranks == (0, 1)
    assert mismatch.detail == "input sizes rank 0: [[4]]; rank 1: [[8]]"
    assert report.kind.body == mismatch.line(), "a mismatch goes first: what follows it may be its consequence"
    assert report.line.startswith(
        f"mismatch (sizes): ranks 0-1 disagree on broadcast #{mismatch.seq} on tp, ranks 0-1: input sizes"
    ), report.line


def test_stall_in_the_phase_change_barrier(phase_change) -> None:
    results = _results(phase_change, 2)
    assert results[0]["outcome"] == "raised", results[0]
    report = hang_report.read_run(phase_change["dir"])
    assert report.kind.body.startswith("rank 1 did not enter barrier #"), report.line
    assert report.kind.name == "never_came", report.line
    assert "on default" in report.line and "ranks 0-1, in which rank 0 waited" in report.line
    reason = report.dumps[0].reason or ""
    assert reason.startswith("the barrier before setting timeouts: RuntimeError"), reason


def test_a_dead_rank_is_named_by_its_missing_dump(dead_rank) -> None:
    report = hang_report.read_run(dead_rank["dir"])
    assert report.missing == [1]
    assert report.line.startswith("never came (dead: no dump): no dump from rank 1: rank 0 was last in all_reduce #")
    assert report.exit_code == hang_report.EXIT_FOUND


def test_gloo_dumps_that_agree_still_do_not_exit_0(phase_change, tmp_path) -> None:
    """Rank 0's dump read alone, with the timed-out barrier cut from it: nothing left to disagree on, yet Gloo's
    recorder never says a collective finished (it retires one that timed out alike), so no healthy verdict (#33)."""
    directory = _copy(phase_change, tmp_path)
    (directory / f"{DUMP_FILE_NAME}1").unlink()
    (directory / SIDECAR_NAME.format(rank=1)).unlink()
    dump = pickle.loads((directory / f"{DUMP_FILE_NAME}0").read_bytes())
    dump["entries"] = [e for e in dump["entries"] if "barrier" not in e["profiling_name"]]
    dump["nemo_rl_shim"]["world_size"] = 1
    dump["nemo_rl_shim"]["groups"] = {
        name: {**facts, "ranks": [0]} for name, facts in dump["nemo_rl_shim"]["groups"].items()
    }
    dump["pg_config"] = {name: {**facts, "ranks": "[0]"} for name, facts in dump["pg_config"].items()}
    (directory / f"{DUMP_FILE_NAME}0").write_bytes(pickle.dumps(dump))
    sidecar = directory / SIDECAR_NAME.format(rank=0)
    facts = json.loads(sidecar.read_text())
    facts["world_size"], facts["groups"] = 1, dump["nemo_rl_shim"]["groups"]
    sidecar.write_text(json.dumps(facts))
    report = hang_report.read_run(directory)
    assert report.missing == [] and {f.kind for f in report.findings} == {"unconfirmed"}, hang_report.render(report)
    assert report.exit_code == hang_report.EXIT_FOUND
    assert report.line.startswith("cannot tell whether rank 0 finished "), report.line
    assert "Gloo's recorder does not say" in report.line


# --- the command: exit codes, missing and unreadable dumps ----------------------------------------------------------


def test_command_prints_the_line_first_and_exits_1(sub_groups, capfd) -> None:
    assert main(["hang-report", str(sub_groups["dir"])]) == 1
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("mismatch (sizes): ranks 0-1 disagree on broadcast"), out[:3]
    assert "  tp: 2 groups of 2, disagreeing" in out, out
    assert any(line.startswith("    tp, ranks 2-3 (process group") for line in out), out
    assert out[-1] == "torch's analyzer: not run (--torch-analyzer runs it)", out[-1]
    # asked for, the analyzer line says what it did on these very dumps: ran, or why not
    assert main(["hang-report", "--torch-analyzer", str(sub_groups["dir"])]) == 1
    out = capfd.readouterr().out.splitlines()
    facts = hang_report.read_run(sub_groups["dir"], with_torch=True).torch
    assert facts["outcome"] in ("ran", "failed", "absent"), facts
    expected = (
        f"torch {facts['torch']} analyzer: ran, matched {facts['collectives']} collectives, flagged "
        if facts["ran"]
        else f"torch {facts['torch']} analyzer: did not run: {facts['error']}"
    )
    assert out[-1].startswith(expected), (out[-1], facts)


def test_command_json(phase_change, capfd) -> None:
    assert main(["hang-report", "--json", str(phase_change["dir"])]) == 1
    payload = json.loads(capfd.readouterr().out)
    assert payload["exit_code"] == 1 and payload["findings"][0]["kind"] == "stall"
    assert payload["findings"][0]["ranks"] == [1] and payload["findings"][0]["op"] == "barrier"
    assert payload["findings"][0]["line"] in payload["line"] and payload["kind"]["name"] == "never_came", payload[
        "line"
    ]
    assert payload["kind"]["ranks"] == [1]


def test_missing_dumps_are_named(sub_groups, tmp_path) -> None:
    directory = _copy(sub_groups, tmp_path)
    for rank in (1, 3):
        (directory / f"{DUMP_FILE_NAME}{rank}").unlink()
    report = hang_report.read_run(directory)
    assert report.missing == [1, 3]
    assert "no dump from ranks 1, 3" in hang_report.render(report)
    assert report.exit_code == hang_report.EXIT_FOUND


def test_a_corrupt_dump_is_one_line_and_exit_2(sub_groups, tmp_path, capfd) -> None:
    directory = _copy(sub_groups, tmp_path)
    path = directory / f"{DUMP_FILE_NAME}2"
    path.write_bytes(path.read_bytes()[:100])  # truncated mid-write
    assert main(["hang-report", str(directory)]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hang-report: {path} is not a readable flight-recorder dump"), lines


@pytest.mark.parametrize("case", ["empty", "missing", "a-file"])
def test_a_bad_directory_is_one_line_and_exit_2(case: str, tmp_path, capfd) -> None:
    target = tmp_path / "dumps"
    if case == "empty":
        target.mkdir()
    elif case == "a-file":
        target.write_text("not a directory")
    assert main(["hang-report", str(target)]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hang-report: {target} "), lines


# --- torch's own analyzer on the same dumps -------------------------------------------------------------------------


def test_torch_analyzer_on_the_dumps_as_written_and_as_gloo_left_them(sub_groups, tmp_path, record_property) -> None:
    """torch's analyzer on the dumps as written (pg_config keyed by group name) and on Gloo's own pg_config (one
    group under an empty name); what it did is printed and recorded (``record_property``), per lane."""
    import torch

    written = hang_report.torch_analyzer.run(hang_report.read_run(sub_groups["dir"]).dumps)
    directory = _copy(sub_groups, tmp_path)
    for path in directory.glob(f"{DUMP_FILE_NAME}*"):
        dump = pickle.loads(path.read_bytes())
        dump["pg_config"] = dump["nemo_rl_shim"]["torch_pg_config"]
        path.write_bytes(pickle.dumps(dump))
    raw = hang_report.torch_analyzer.run(hang_report.read_run(directory).dumps)
    record_property("torch_analyzer", json.dumps({"as_written": written, "gloo_raw": raw}, default=str))
    print(f"\ntorch {torch.__version__} analyzer: as written {written}\n  on Gloo's own pg_config {raw}")
    try:
        import torch.distributed.flight_recorder.components.builder
    except ImportError:
        assert not written["ran"] and written["error"].startswith("not in this torch"), written
        return
    # torch 2.15 matches every collective and flags what the shim flags; torch 2.10 and 2.11 stop at the first
    # entry: their analyzer accepts only "nccl:" and "xccl:" op names ("name formatting error? gloo != ...").
    assert written["ran"] or "gloo" in written["error"], written
    assert not raw["ran"], raw
    if written["ran"]:
        assert raw["error"].startswith("KeyError"), raw
        assert any("SIZE_OR_SYNTAX_MISMATCH" in (c["mismatch"] or "") for c in written["flagged"]), written


def test_a_torch_written_nccl_dump_of_one_rank_reads_as_not_finished(phase_change, tmp_path) -> None:
    """The shape scripts/gpu_check.sh meets on one GPU (NCCL is the boundary this machine lacks): torch's watchdog
    wrote the dump (no ``nemo_rl_shim`` key; the group map from the sidecar), entries carry 'nccl:' names and
    their state, and the one rank's last all-reduce started but never completed."""
    directory = tmp_path / "nccl"
    directory.mkdir()
    dump = pickle.loads((phase_change["dir"] / f"{DUMP_FILE_NAME}0").read_bytes())
    groups = {"0": {"axes": ["default"], "ranks": [0], "desc": "default_pg"}}
    entries = [e for e in dump["entries"] if e["process_group"][0] == "0" and "all_reduce" in e["profiling_name"]]
    entries = [{**e, "profiling_name": "nccl:all_reduce", "state": "completed"} for e in entries]
    entries.append({**entries[-1], "collective_seq_id": entries[-1]["collective_seq_id"] + 1, "state": "started"})
    torch_dump = {"version": dump["version"], "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}}}
    (directory / f"{DUMP_FILE_NAME}0").write_bytes(pickle.dumps({**torch_dump, "entries": entries}))
    sidecar = {"rank": 0, "world_size": 1, "groups": groups}
    (directory / SIDECAR_NAME.format(rank=0)).write_text(json.dumps(sidecar))
    report = hang_report.read_run(directory)
    assert report.dumps[0].writer == "torch"
    seq = entries[-1]["collective_seq_id"]
    expected = f"rank 0 did not finish all_reduce #{seq} on default, ranks 0: every member entered it, none finished"
    assert report.line.startswith(f"did not finish: {expected}"), report.line  # a group of one: its rank
    assert report.exit_code == hang_report.EXIT_FOUND
