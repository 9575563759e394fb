"""A dump file is one writer's bytes, whole: two threads of one rank dumping at once (#42, hang_truth seed 1002).

A rank's watcher thread answers a peer's request to dump while its main thread, whose collective just timed out,
dumps too (``recorder.dump_now`` from both). The two shared one partial file name: one run of the Gloo generator
left a dump of one pickle followed by the other's last 15 bytes (exit 2: "15 bytes follow the pickle's end"), and a
writer could find its partial file moved away by the other (``FileNotFoundError`` in the dump path). Reproduced
here on the file writer itself before the fix: 34 of 200 rounds mixed, and errors in the threads.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nemo_rl_shim.flight_recorder import recorder

pytestmark = [pytest.mark.every_lane]

ROUNDS = 200


def test_two_threads_writing_one_dump_leave_one_of_their_files_whole(tmp_path: Path) -> None:
    path = tmp_path / "fr_trace_rank_0"
    first, second = b"a" * 300_021, b"b" * 300_006  # two dumps 15 bytes apart, as seed 1002's were
    errors: list[BaseException] = []
    mixed = 0
    for _ in range(ROUNDS):
        start = threading.Barrier(2)

        def write(data: bytes, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                recorder._write_atomically(path, data)
            except BaseException as error:  # the test counts every failure of a writer
                errors.append(error)

        threads = [threading.Thread(target=write, args=(data,)) for data in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        mixed += path.read_bytes() not in (first, second)
    assert (mixed, errors) == (0, []), f"{mixed} of {ROUNDS} rounds mixed; writers failed: {errors[:3]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_trace_rank_0"], "a partial file was left"
