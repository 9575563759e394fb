"""The rules the cost benchmark and the loader's scheduling rest on (#42 item 5).

* ``benchmarks/hang_report_scale.py`` judges the report's first line by its kind, variant and ranks and by the facts
  the line must name (:func:`~benchmarks.hang_report_scale.first_line_wrong`), not by how the line starts: since the
  kinds, the line starts with the kind's label, and the old check was false for every run.
* The loader hands its readers chunks that shrink as the files run out (:func:`~.loader.chunk_sizes`): every file in
  exactly one chunk, in order, none larger than ``CHUNK`` and none below ``MIN_CHUNK`` but the last, so that no reader
  starts a full chunk while the others have nothing left.
"""

from __future__ import annotations

import pytest

from benchmarks.hang_report_scale import EXPECTED_KIND, first_line_wrong
from nemo_rl_shim.hang_report import loader

_LINE = (
    "never came (stuck in Python): rank 517 did not enter all_reduce #1001 on tp, ranks 512-519: at "
    '/job/nemo_rl/data/loader.py:57 in load_batch (its stack, 605.0 s into "train step"); ranks 512-516, 518-519 '
    "waited 600.0 s in it at /job/nemo_rl/models/policy/dtensor_policy_worker.py:640 in train; fix: what rank 517 "
    "waits for at loader.py:57 in load_batch"
)
_KIND = {"name": "never_came", "variant": "python", "label": "never came (stuck in Python)", "ranks": [517]}


def test_the_right_line_and_kind_pass() -> None:
    assert first_line_wrong({"line": _LINE, "kind": _KIND}, 1024) == []
    assert first_line_wrong({"line": _LINE, "kind": _KIND}, 8192) == []  # the culprit is 517 in both worlds


@pytest.mark.parametrize(
    ("kind", "line", "found"),
    [
        ({**_KIND, "variant": "unplaced", "label": "never came"}, _LINE.replace(" (stuck in Python)", ""), "kind"),
        ({**_KIND, "name": "circular_wait"}, _LINE, "kind"),
        ({**_KIND, "ranks": [517, 518]}, _LINE, "ranks"),
        ({**_KIND, "ranks": [516]}, _LINE, "ranks"),
        (_KIND, _LINE.partition(": ")[2], "label"),  # the old check's expectation: no label
        (_KIND, _LINE.replace("#1001", "#1000"), "lacks"),
        (_KIND, _LINE.replace("ranks 512-519", "ranks 512-518"), "lacks"),
        (_KIND, _LINE.replace("loader.py:57 in load_batch (its", "grpo.py:1210 in grpo_train (its"), "lacks"),
        (_KIND, _LINE.replace("ranks 512-516, 518-519 waited", "ranks 512-516 waited"), "lacks"),
        (_KIND, _LINE.replace("worker.py:640", "worker.py:652"), "lacks"),
    ],
)
def test_each_wrong_fact_is_named(kind: dict, line: str, found: str) -> None:
    wrong = first_line_wrong({"line": line, "kind": kind}, 1024)
    assert len(wrong) >= 1 and any(found in reason for reason in wrong), wrong


def test_a_missing_report_is_wrong() -> None:
    """A report that did not run (its child failed) has no line and no kind: never right."""
    wrong = first_line_wrong({"ran": False, "error": "exit 1"}, 1024)
    assert any("kind None/None" in reason for reason in wrong) and len(wrong) >= 4
    assert EXPECTED_KIND == ("never_came", "python")


@pytest.mark.parametrize("count", [1, 7, 8, 9, 63, 64, 65, 255, 1023, 8191, 65535])
@pytest.mark.parametrize("readers", [1, 2, 8])
def test_chunks_cover_every_file_once_and_shrink_to_the_end(count: int, readers: int) -> None:
    sizes = loader.chunk_sizes(count, readers)
    assert sum(sizes) == count and all(size > 0 for size in sizes)
    assert max(sizes) <= loader.CHUNK
    assert all(size >= min(loader.MIN_CHUNK, count) for size in sizes[:-1])
    assert sizes == sorted(sizes, reverse=True)  # never a larger chunk after a smaller one
    if count >= 4 * readers * loader.CHUNK:  # the last chunk a reader starts: small beside a full one
        assert sizes[-1] <= loader.MIN_CHUNK and sizes[0] == loader.CHUNK


def test_the_readers_get_every_job_once_with_shrinking_chunks(tmp_path) -> None:
    """``run_readers`` yields every job's result exactly once, over the chunks :func:`chunk_sizes` gives."""
    jobs = [loader.Job(tmp_path / f"f{i}", i, None, tmp_path) for i in range(150)]
    got = list(loader.run_readers(lambda job, keep: job.rank, jobs, 2))
    assert sorted(got) == list(range(150)) and len(got) == 150
    assert len(loader.chunk_sizes(150, 2)) > 150 // loader.CHUNK + 1  # more, smaller chunks than a fixed split
