"""Five kinds of hang on 4 real Gloo ranks each, and the first line ``hang-report`` gives for each.

Five worlds (:mod:`tests.ranks.hang_kinds`), started together once per module, through the real
``setup_distributed`` with the recorder on and a 3 s steady timeout; every step runs inside
``dump_on_timeout``, which also watches its block. For the two kinds whose rank stays stuck (a Python
sleep; a C call that keeps the GIL), the report is read while that rank is still stuck (its process
checked alive before and after), then the rank is killed (SIGKILL) and the report read again: both times
the first line names the rank, the collective, the group, and the file:line where the rank stalled, then
where its peers called the collective they wait in (their dumps' frames). The other three kinds (a skipped
collective, a size mismatch, a dead process) name the right rank; the skipped collective also says where each
side called its all-reduce #4 (rank 3 its loss one, the others their metric one), which the size mismatch, one
call with other sizes, does not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.main import main
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, STACK_GRACE_S
from nemo_rl_shim.flight_recorder.stack_watchdog import SAMPLE_INTERVAL_S, SAMPLES, stack_path
from nemo_rl_shim.hang_report.counters import counters_for
from nemo_rl_shim.hang_report.stacks import read_stack
from tests.ranks import hang_kinds
from tests.ranks.hang_kinds import KINDS, STUCK, call_line, stall_line

pytestmark = [pytest.mark.multiprocess]

#: Start-up at 1 min: room for 20 ranks (five worlds at once) to connect and run a first step on a loaded machine.
STARTUP_MIN, STEADY_MIN = 1.0, 0.05
STEADY_S = STEADY_MIN * 60
SPAWN_TIMEOUT_S = 480
#: How long the test waits for a stuck rank's stack (the watchdog writes it STEADY_S + STACK_GRACE_S into the step),
#: counted from the spawn: as long as the ranks' own bound. Beside another suite (20 ranks importing torch on 2 cores,
#: load 80) no rank of a world had reached its first step after 150 s.
STACK_WAIT_S = SPAWN_TIMEOUT_S
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
HANG_FILE = hang_kinds.__file__


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for_stuck_rank(directory: Path, rank: int, dumps: list[int], samples: int) -> int:
    """Wait for the stuck rank's stack samples and its helper's counters (and the dumps of ``dumps``); return its pid,
    from the stack's header."""
    end = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < end:
        stack = read_stack(stack_path(directory, rank), rank)
        sampled = len(stack.samples) >= samples and len(counters_for(stack)) >= SAMPLES
        if sampled and stack.pid and all((directory / f"{DUMP_FILE_NAME}{r}").exists() for r in dumps):
            return stack.pid
        time.sleep(0.2)
    found = sorted(p.name for p in directory.iterdir())
    raise AssertionError(f"no stack from rank {rank} in {directory} after {STACK_WAIT_S} s; found {found}")


def _while_stuck(directory: Path, rank: int, kind: str) -> dict[str, Any]:
    """Read the report while the stuck rank is still stuck, then kill it (SIGKILL)."""
    dumps = [r for r in range(4) if r != rank or kind == "python_sleep"]
    # the sampler thread needs the GIL: a rank that holds it leaves the watchdog's sample alone
    pid = _wait_for_stuck_rank(directory, rank, dumps, SAMPLES if kind == "python_sleep" else 1)
    alive_before = _alive(pid)
    report = hang_report.read_run(directory)
    alive_after = _alive(pid)
    os.kill(pid, signal.SIGKILL)
    return {"pid": pid, "alive": alive_before and alive_after, "line": report.line, "exit_code": report.exit_code}


def _kill_stuck(worlds: dict[str, dict[str, Any]]) -> None:
    """Whatever happened: the stuck ranks that wrote their pid (the stack's header, written on arming) end now."""
    for kind in STUCK:
        pid = read_stack(stack_path(worlds[kind]["dir"], KINDS[kind]), KINDS[kind]).pid
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """The five worlds at once (each 4 ranks); the stuck ones read while stuck, then killed. Wall time recorded."""
    start = time.monotonic()
    worlds: dict[str, dict[str, Any]] = {kind: {"dir": tmp_path_factory.mktemp(kind)} for kind in KINDS}
    # an earlier run's stack, which set-up must remove (rank 0 of this world writes none of its own)
    stack_path(worlds["skipped"]["dir"], 0).write_text("Timeout (0:00:08)!\nThread 0x01 (most recent call first):\n")
    with ThreadPoolExecutor(len(KINDS)) as pool:
        futures = {}
        for kind, world in worlds.items():
            params = {"kind": kind, "dump_dir": str(world["dir"]), "startup": STARTUP_MIN, "steady": STEADY_MIN}
            futures[kind] = pool.submit(
                spawn_ranks, "tests.ranks.hang_kinds:run_kind", params,
                world_size=4, timeout_s=SPAWN_TIMEOUT_S, env=CPU_ONLY, check=False,
            )  # fmt: skip
        try:
            for kind in STUCK:
                worlds[kind]["while_stuck"] = _while_stuck(worlds[kind]["dir"], KINDS[kind], kind)
        finally:
            _kill_stuck(worlds)
            for kind, future in futures.items():
                worlds[kind]["results"] = {r.rank: r for r in future.result()}
    for world in worlds.values():
        world["wall_s"] = round(time.monotonic() - start, 1)
    return worlds


def _result(world: dict[str, Any], rank: int) -> dict[str, Any]:
    result = world["results"][rank]
    assert isinstance(result.result, dict), f"rank {rank}: {result.error or result.output[-3000:]}"
    return result.result


#: The default group as the report labels it on this 4-rank, tp=1 mesh.
_DEFAULT = r"default(?: \(also [^)]*\))?, ranks 0-3"
_STALLING = {"python_sleep": "_python_sleep", "gil_c_call": "_c_call_holding_the_gil"}


def _called(what: str) -> str:
    """Where a step calls its ``what`` all-reduce, as the line says it: ``/.../hang_kinds.py:80 in _step`` (the file
    name alone where the line was shortened to its 400 characters)."""
    return rf"(?:{re.escape(HANG_FILE.rpartition('/')[0])}/)?{re.escape(f'hang_kinds.py:{call_line(what)} in _step')}"


_LABEL = {"python_sleep": r"never came \(stuck in Python\)", "gil_c_call": r"never came \(a C call holding the GIL\)"}


def _stall_pattern(kind: str) -> str:
    """The first line of a stuck rank: its kind, where it stalled and how long into its block (the newest sample:
    the watchdog's, plus a second per sample the sampler thread wrote), that its counters show no work, where its
    peers wait, what to do."""
    place = f"hang_kinds.py:{stall_line(kind)} in {_STALLING[kind]}"
    at = rf"(?:{re.escape(HANG_FILE.rpartition('/')[0])}/)?{re.escape(place)}"
    ran = STEADY_S + STACK_GRACE_S + ((SAMPLES - 1) * SAMPLE_INTERVAL_S if kind == "python_sleep" else 0)
    since = re.escape(f'(its stack, {ran:.1f} s into "train step"')
    no_dump = "; no dump from it" if kind == "gil_c_call" else ""
    judged = f"; not working in {SAMPLES} samples"
    waited = rf"ranks 0-2 waited \d+\.\d s in it at {_called('loss')}"
    if kind == "python_sleep":
        fix = rf"fix: what rank 3 waits for at {re.escape(place)}"
    else:
        fix = rf"fix: the C call rank 3 is in at {re.escape(place)} holds the GIL"
    head = rf"^{_LABEL[kind]}: rank 3 did not enter all_reduce #\d+ on {_DEFAULT}"
    return rf"{head}: at {at} {since}{no_dump}{judged}\); {waited}; {fix}$"


def test_the_worlds_ran_as_intended(kinds) -> None:
    for kind in ("python_sleep", "gil_c_call"):
        world = kinds[kind]
        assert world["while_stuck"]["alive"], f"{kind}: rank 3 was not alive while the report was read"
        assert world["results"][3].returncode == -signal.SIGKILL, (kind, world["results"][3])
        errors = []
        for rank in (0, 1, 2):
            result = _result(world, rank)
            errors.append(result["error"])
            assert result["failed_step"] == hang_kinds.HANG_STEP, result
            assert result["timeout_s"] == STEADY_S, result
            # the first peer to time out tears down its Gloo pairs: a peer whose own timer had not fired yet on a
            # loaded machine reads that as its connection closed
            assert "Timed out" in result["error"] or "Connection closed by peer" in result["error"], result
        assert any("Timed out" in error for error in errors), errors
    dumped = {kind: sorted(p.name for p in kinds[kind]["dir"].glob(f"{DUMP_FILE_NAME}*")) for kind in KINDS}
    assert dumped["python_sleep"] == [f"{DUMP_FILE_NAME}{r}" for r in range(4)], "rank 3's watcher dumped when asked"
    assert dumped["gil_c_call"] == [f"{DUMP_FILE_NAME}{r}" for r in range(3)], "rank 3 held the GIL: no dump"
    assert dumped["dead"] == [f"{DUMP_FILE_NAME}{r}" for r in (0, 2, 3)]
    assert kinds["dead"]["results"][1].returncode == 17


def test_only_the_stuck_rank_left_a_stack(kinds) -> None:
    """The peers left their blocks at the timeout, before the grace ended: their stack files are empty."""
    for kind in KINDS:
        report = hang_report.read_run(kinds[kind]["dir"])
        fired = sorted(r for r, s in report.stacks.items() if s.fired)
        facts = {r: s.to_json() for r, s in report.stacks.items()}
        assert fired == ([KINDS[kind]] if kind in STUCK else []), (kind, facts)
    dead = hang_report.read_run(kinds["dead"]["dir"]).stacks[1]
    assert (dead.fired, dead.what) == (False, "train step"), "rank 1 died inside its block: the header alone stays"


@pytest.mark.parametrize("kind", STUCK)
def test_a_stuck_rank_is_named_with_its_file_and_line_while_stuck_and_after_it_is_killed(kinds, kind) -> None:
    world = kinds[kind]
    after = hang_report.read_run(world["dir"])
    pattern = _stall_pattern(kind)
    assert re.match(pattern, world["while_stuck"]["line"]), (world["while_stuck"]["line"], pattern)
    assert after.line == world["while_stuck"]["line"], "killing the rank changes nothing on disk"
    assert world["while_stuck"]["exit_code"] == after.exit_code == hang_report.EXIT_FOUND
    first = after.findings[0]
    assert (first.kind, first.ranks) == (("stall" if kind == "python_sleep" else "missing"), [3])
    assert f"#{first.seq} " in after.line


def test_a_skipped_collective_names_the_rank_that_skipped_and_where_each_side_called(kinds) -> None:
    report = hang_report.read_run(kinds["skipped"]["dir"])
    sizes = r"input sizes \[\[4\]\] \(rank 3\) where ranks 0-2 have \[\[2\]\]"
    called = rf"; called from {_called('loss')} where ranks 0-2 called from {_called('metric')}"
    fix = "; fix: the code path that skips all_reduce on rank 3, or adds one"
    pattern = rf"^skipped collective: rank 3 differs on all_reduce #\d+ on {_DEFAULT}: {sizes}{called}{fix}$"
    assert re.match(pattern, report.line), report.line
    assert (report.kind.name, report.kind.ranks) == ("skipped_collective", (3,))


def test_a_size_mismatch_names_the_odd_rank_and_no_other_place(kinds) -> None:
    """One call with other sizes: every rank called all-reduce #4 from the same line, so no place is said."""
    report = hang_report.read_run(kinds["size_mismatch"]["dir"])
    sizes = r"input sizes \[\[8\]\] \(rank 2\) where ranks 0-1, 3 have \[\[4\]\]"
    fix = r"; fix: the sizes rank 2 passes to all_reduce #\d+"
    assert re.match(
        rf"^mismatch \(sizes\): rank 2 differs on all_reduce #\d+ on {_DEFAULT}: {sizes}{fix}$", report.line
    )
    assert (report.kind.name, report.kind.variant, report.kind.ranks) == ("mismatch", "sizes", (2,))
    first = report.findings[0]
    assert {r: f.where if f else None for r, f in first.called_at.items()} == {
        r: f"{HANG_FILE}:{call_line('loss')} in _step" for r in range(4)
    }, "every rank's call site is known, and the same"


def test_a_dead_process_is_named_by_its_missing_dump(kinds) -> None:
    report = hang_report.read_run(kinds["dead"]["dir"])
    waited = rf"\(waited \d+\.\d s\) at {_called('loss')}"
    fix = r"; fix: rank 1's host: its process ended or hung \(its log, memory, GPU\)"
    head = r"^never came \(dead: no dump\): no dump from rank 1: ranks 0, 2-3 were last in all_reduce #\d+"
    expected = rf"{head} on {_DEFAULT} {waited}{fix}$"
    assert re.match(expected, report.line), report.line
    assert (report.kind.name, report.kind.variant, report.kind.ranks) == ("never_came", "dead", (1,))


def test_the_text_and_json_carry_the_stacks(kinds, capfd) -> None:
    directory = kinds["gil_c_call"]["dir"]
    assert main(["hang-report", str(directory)]) == 1
    out = capfd.readouterr().out.splitlines()
    at = out.index("stacks (where each rank was once its block ran past the timeout and grace):")
    assert out[at + 1].startswith(f'  rank 3, {STEADY_S + STACK_GRACE_S:.1f} s into "train step" ({SAMPLES} samples; ')
    assert out[at + 1].endswith("):") and "not working: no CPU, no I/O of its thread in " in out[at + 1], out[at + 1]
    assert out[at + 2] == f"    {HANG_FILE}:{stall_line('gil_c_call')} in _c_call_holding_the_gil"
    assert main(["hang-report", "--json", str(directory)]) == 1
    payload = json.loads(capfd.readouterr().out)
    stack = payload["stacks"]["3"]
    assert stack["fired"] and stack["user_frame"]["line"] == stall_line("gil_c_call"), stack
    assert stack["frames"][0] == stack["user_frame"], "the C call has no Python frame: the user's line is innermost"
    assert {r: s["fired"] for r, s in payload["stacks"].items()} == {"0": False, "1": False, "2": False, "3": True}
    called = {"file": HANG_FILE, "line": call_line("loss"), "function": "_step"}
    assert payload["findings"][0]["called_at"] == {"0": called, "1": called, "2": called}, payload["findings"][0]
