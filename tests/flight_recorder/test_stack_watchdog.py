"""The stack watchdog in this process: faulthandler's C watchdog armed per block, one per process, the file's states.

Real faulthandler, real files, short deadlines (0.2 s); no process group (``stack_watchdog`` takes the path and
the rank), but for the set-up's clean-up, on a one-rank Gloo group in this process. The GIL case: a
``ctypes.PyDLL`` call to libc's ``sleep`` keeps the GIL while the watchdog writes. The samples after the first: the
sampler thread writes them, the real helper process writes the counters (``/proc`` of this process).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import multiprocessing
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from nemo_rl_shim.config import FlightRecorderSettings
from nemo_rl_shim.flight_recorder import p2p_log, stack_watchdog
from nemo_rl_shim.flight_recorder import recorder as flight_recorder
from nemo_rl_shim.flight_recorder.names import HEADER
from nemo_rl_shim.flight_recorder.stack_watchdog import arm, armed_blocks, disarm, forget, stack_path
from nemo_rl_shim.hang_report.stacks import read_stack

SHORT_S = 0.2
#: How long the GIL is held past a 0.2 s deadline: the watchdog's C thread must get a core in that time, which
#: took more than the 1 s this was once, with two suites on 2 cores.
GIL_HELD_S = 5


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    """A fresh stack file; whatever a test leaves armed is disarmed, and the process may arm again."""
    target = stack_path(tmp_path, 5)
    yield target
    for _ in armed_blocks():
        disarm(stack_watchdog._State.blocks[-1].token, failed=False)
    forget(target)


def _hold_the_gil(seconds: int) -> None:
    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(seconds)  # the C call that keeps the GIL


def _line_of(marker: str) -> int:
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith(marker))


def test_a_block_past_its_deadline_writes_its_stack_while_holding_the_gil(path: Path) -> None:
    token = arm(path, 5, "train step", SHORT_S)
    started = time.monotonic()
    _hold_the_gil(GIL_HELD_S)
    held = time.monotonic() - started
    disarm(token, failed=True)
    stack = read_stack(path, 5)
    assert held >= GIL_HELD_S
    assert stack.fired and (stack.what, stack.after_s, stack.rank) == ("train step", SHORT_S, 5), stack
    # The watchdog's sample, written during the call (no Python thread could have run). Not the newest: once the
    # GIL is free the sampler thread, long due, writes the next at once, where this thread has gone on (CI saw it
    # inside read_stack).
    first = stack.samples[0]
    assert first.t_ns == stack.entered_ns + round(SHORT_S * 1e9), "the watchdog's own, dated by the deadline"
    assert first.frames[0].function == "_hold_the_gil"
    assert first.frames[0].line == _line_of("# the C call that keeps the GIL")
    assert first.frames[1].function == "test_a_block_past_its_deadline_writes_its_stack_while_holding_the_gil"


def test_leaving_in_time_leaves_an_empty_file(path: Path) -> None:
    token = arm(path, 5, "train step", 30)
    assert path.read_text().startswith(HEADER), "armed: the header alone"
    disarm(token, failed=False)
    time.sleep(SHORT_S)
    assert path.read_bytes() == b""


def test_nested_blocks_share_the_one_watchdog(path: Path) -> None:
    outer = arm(path, 5, "outer", 30)
    inner = arm(path, 5, "inner", SHORT_S)  # earlier deadline: the watchdog moves to it
    assert armed_blocks() == ["outer", "inner"]
    assert read_stack(path, 5).what == "inner"
    disarm(inner, failed=False)
    assert read_stack(path, 5).what == "outer", "back to the outer block's deadline"
    time.sleep(2 * SHORT_S)
    assert not read_stack(path, 5).fired, "the inner block's deadline no longer counts"
    later = arm(path, 5, "later inner", 60)  # a later deadline: the outer block keeps the watchdog
    assert read_stack(path, 5).what == "outer"
    disarm(later, failed=False)
    disarm(outer, failed=False)
    assert path.read_bytes() == b""


def test_arming_in_a_second_folder_keeps_watching_the_first(path: Path, tmp_path: Path) -> None:
    """One stack file a process: a block armed for another folder while one is armed arms nothing, and the first
    folder's file still gets the first block's stack."""
    first = arm(path, 5, "outer", SHORT_S)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert arm(stack_path(elsewhere, 5), 5, "inner", 30) is None
    deadline = time.monotonic() + 60  # the watchdog's thread may wait for a core on a loaded machine
    while not read_stack(path, 5).fired and time.monotonic() < deadline:
        time.sleep(SHORT_S)
    stack = read_stack(path, 5)
    disarm(first, failed=True)
    assert stack.fired and stack.what == "outer", stack
    assert list(elsewhere.iterdir()) == []


def test_leaving_a_block_moves_the_watch_to_the_earliest_deadline_left(path: Path) -> None:
    outer = arm(path, 5, "outer", 60)
    middle = arm(path, 5, "middle", 30)
    inner = arm(path, 5, "inner", SHORT_S)
    disarm(inner, failed=False)
    assert read_stack(path, 5).what == "middle"
    disarm(middle, failed=False)
    assert read_stack(path, 5).what == "outer"
    disarm(outer, failed=False)


def test_a_block_that_failed_before_its_deadline_keeps_nothing_and_arming_goes_on(path: Path) -> None:
    token = arm(path, 5, "train step", 30)
    disarm(token, failed=True)
    assert path.read_bytes() == b""
    assert arm(path, 5, "next step", 30) is not None


def test_a_stack_of_a_block_that_failed_is_kept_and_nothing_more_is_armed(path: Path) -> None:
    token = arm(path, 5, "train step", SHORT_S)
    time.sleep(3 * SHORT_S)
    disarm(token, failed=True)
    kept = path.read_text()
    assert read_stack(path, 5).fired
    assert arm(path, 5, "next step", SHORT_S) is None
    time.sleep(2 * SHORT_S)
    assert path.read_text() == kept


def test_a_stack_of_a_block_that_then_finished_is_dropped(path: Path) -> None:
    token = arm(path, 5, "slow step", SHORT_S)
    time.sleep(3 * SHORT_S)
    assert read_stack(path, 5).fired
    disarm(token, failed=False)
    assert path.read_bytes() == b"", "slow, not stuck: its stack would name a place the rank has left"
    assert arm(path, 5, "next step", 30) is not None


def _arm_in_child(path: str, queue: multiprocessing.Queue) -> None:
    queue.put(arm(Path(path), 6, "child", 30))


def test_a_child_forked_while_armed_arms_nothing(path: Path) -> None:
    """faulthandler's cancel in such a child waits forever for a watchdog thread it does not have."""
    token = arm(path, 5, "parent", 30)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_arm_in_child, args=(str(path.with_name("child.txt")), queue))
    child.start()
    child.join(30)
    disarm(token, failed=False)
    if child.is_alive():
        child.kill()
        pytest.fail("the child hung in faulthandler")
    assert queue.get(timeout=5) is None


def test_forget_removes_a_stale_stack_and_lets_a_sealed_process_arm_again(path: Path) -> None:
    token = arm(path, 5, "train step", SHORT_S)
    time.sleep(3 * SHORT_S)
    disarm(token, failed=True)
    forget(path)
    assert not path.exists()
    assert arm(path, 5, "after set-up", 30) is not None


def test_set_up_removes_the_stack_an_earlier_run_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``record_groups`` (``setup_distributed`` calls it) removes this rank's old stack, as it removes its old dump:
    a rank that then stalls before its first watched block must not be placed by the earlier run's stack."""
    stale = stack_path(tmp_path, 0)
    stale.write_text('Timeout (0:00:08)!\nThread 0x01 (most recent call first):\n  File "old.py", line 1 in f\n')
    assert read_stack(stale, 0).fired
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / flight_recorder.DUMP_FILE_NAME))
    monkeypatch.setattr(flight_recorder._State, "settings", FlightRecorderSettings(tmp_path))
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the recorder's buffer was set before this group
            flight_recorder.record_groups(SimpleNamespace(device_mesh=None, moe_mesh=None))
    finally:
        p2p_log.uninstall()  # record_groups wrapped torch's send and recv for Gloo's log: torch's back for the rest
        dist.destroy_process_group()
    assert not stale.exists()


def test_a_stack_file_that_cannot_be_written_never_fails_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch is a help: a dump folder that became unwritable costs a warning, and the block runs."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the folder should be")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(blocked / flight_recorder.DUMP_FILE_NAME))
    monkeypatch.setattr(flight_recorder._State, "settings", FlightRecorderSettings(tmp_path))
    monkeypatch.setattr(flight_recorder._State, "stack_warned", False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ran = []
    try:
        with pytest.warns(RuntimeWarning, match="no stack watch: .*not-a-folder/fr_stack_rank_0.txt cannot be written"):
            with flight_recorder.dump_on_timeout("train step"):
                ran.append(armed_blocks())
    finally:
        dist.destroy_process_group()
    assert ran == [[]]


# --- more than one sample, and the counters ------------------------------------------------------------------------

#: Samples in these tests, and how far apart: short, and the helper process keeps them apart even when it starts late.
INTERVAL_S = 0.3
COUNTER_WAIT_S = 30


def _counter_lines(path: Path, rank: int) -> list[dict]:
    """The helper's lines written so far for the block in ``path``'s header (whole lines only)."""
    progress = stack_watchdog.progress_path(path.parent, rank)
    text = progress.read_text() if progress.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _counters(path: Path, rank: int, count: int) -> list[dict]:
    """The helper's lines for the block in ``path``'s header, once ``count`` are written (it runs on its own)."""
    end = time.monotonic() + COUNTER_WAIT_S
    lines: list[dict] = []
    while time.monotonic() < end:
        lines = _counter_lines(path, rank)
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    progress = stack_watchdog.progress_path(path.parent, rank)
    raise AssertionError(f"{len(lines)} counter samples in {progress} after {COUNTER_WAIT_S} s, wanted {count}")


def test_a_block_that_stays_is_sampled_three_times_with_counters_from_the_helper(path: Path) -> None:
    token = arm(path, 5, "checkpoint save", SHORT_S, interval_s=INTERVAL_S)
    end = time.monotonic() + COUNTER_WAIT_S
    # The loop that writes the checkpoint, until the sampler and the helper wrote all: the helper reads its
    # counters on its own clock, and once lagged past the sampler's last (load 60), after a loop that stopped there.
    with open(path.with_name("shard.bin"), "wb") as shard:
        while time.monotonic() < end and (
            len(read_stack(path, 5).samples) < stack_watchdog.SAMPLES
            or len(_counter_lines(path, 5)) < stack_watchdog.SAMPLES
        ):
            shard.write(b"\0" * 65536)
            shard.seek(0)
    lines = _counters(path, 5, stack_watchdog.SAMPLES)
    stack = read_stack(path, 5)
    disarm(token, failed=True)
    assert stack.fired and len(stack.samples) == stack_watchdog.SAMPLES == 3, stack.to_json()
    times = [s.t_ns for s in stack.samples]
    assert all(b - a >= INTERVAL_S * 0.9e9 for a, b in itertools.pairwise(times)), times
    here = "test_a_block_that_stays_is_sampled_three_times_with_counters_from_the_helper"
    assert all(here in {f.function for f in s.frames} for s in stack.samples), "each sample is the watched thread's"
    assert [line["sample"] for line in lines] == [0, 1, 2], lines
    taken = [line["t_ns"] for line in lines]
    assert all(b - a >= INTERVAL_S * 0.9e9 for a, b in itertools.pairwise(taken)), "the helper's apart too"
    assert {line["entered_ns"] for line in lines} == {stack.entered_ns}, "the helper's lines name the header's block"
    assert lines[0]["tid"] == stack.tid == threading.get_native_id()
    written = [line["thread"]["io"]["wchar"] for line in lines]
    assert written[-1] - written[0] >= 65536, written


def test_a_block_held_in_a_c_call_keeps_the_gil_gets_one_stack_but_every_counter(path: Path) -> None:
    """The sampler thread needs the GIL and cannot write; the helper is another process and reads the counters."""
    token = arm(path, 5, "train step", SHORT_S, interval_s=INTERVAL_S)
    started_ns = time.time_ns()
    _hold_the_gil(4)  # room for a helper that starts late on a loaded machine: it samples 0.6 s in all
    # the call ends 4 s after it started, at the earliest: what was written before then was written during it
    during_ns = started_ns + 4 * 10**9 - 10**8
    lines = _counters(path, 5, 3)
    stack = read_stack(path, 5)
    disarm(token, failed=True)
    during = [s for s in stack.samples if s.t_ns is not None and s.t_ns < during_ns]
    assert len(during) == 1, f"no Python thread ran during the call: {stack.to_json()['samples']}"
    assert all(line["t_ns"] < during_ns for line in lines[:3]), "the helper read the counters during the call"
    cpu = [line["thread"]["cpu_s"] for line in lines]
    assert cpu[-1] - cpu[0] < 0.1, cpu
    assert {line["thread"]["state"] for line in lines} == {"S"}, "libc's sleep: asleep, holding the GIL"


def test_a_block_that_ends_stops_the_sampling(path: Path) -> None:
    token = arm(path, 5, "slow step", SHORT_S, interval_s=10)
    time.sleep(3 * SHORT_S)
    disarm(token, failed=False)
    assert path.read_bytes() == b""
    time.sleep(2 * SHORT_S)
    assert path.read_bytes() == b"", "no sample after the block ended"


def test_forget_removes_the_counters_too(path: Path) -> None:
    progress = stack_watchdog.progress_path(path.parent, 5)
    progress.write_text('{"sample": 0}\n')
    forget(path)
    assert not progress.exists()
