"""Each hostile input of #33's "Why" ends as the issue says, within 30 s and 1.5 GB, under a 6 GiB address-space cap.

The inputs are :data:`tests.harness.hostile_inputs.CASES` (a FIFO named like each of the run's files, symlinks to
``/dev/zero``, shared references, integers past what Python prints or floats hold, lone surrogates, names that are
not UTF-8, decoys of another run, 100,000 stray dumps, a YAML alias bomb, ``/dev/urandom`` as a config): each runs
as the real command in a fresh interpreter under ``RLIMIT_AS`` (:func:`~tests.harness.hostile_inputs.run_capped`),
and must end with its exit code and one line saying what is wrong, naming the file; never a traceback, never exit 1
for malformed input, nothing unprintable written. The real Gloo ranks' cases (a top rank's dump missing, every rank
waiting) are in ``test_hang_report_torch_gloo.py``; ``benchmarks/hang_report_hostile.py`` prints the figures.
"""

from __future__ import annotations

import pytest

from tests.harness.hostile_inputs import CASES, PEAK_MB, SECONDS, Case, run_capped
from tests.harness.nccl_scenarios import build

pytestmark = [pytest.mark.every_lane]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_hostile_input_ends_as_it_should(tmp_path, case: Case) -> None:
    outcome = run_capped(*case.build(tmp_path))
    said = f"{case.why}: {outcome}"
    assert outcome.code == case.code, said
    assert "Traceback" not in outcome.err and "Traceback" not in outcome.out, said
    for word in case.words:
        assert word in outcome.line, said
    if case.code == 2:
        assert len(outcome.err.strip().splitlines()) == 1, said
    assert "\x1b" not in outcome.out + outcome.err, "an escape sequence from a file name reached the terminal"
    assert 0 < outcome.cpu_s < SECONDS and outcome.peak_mb < PEAK_MB, said


def test_the_cap_is_in_force(tmp_path) -> None:
    """The measuring parent's cap reaches the command: under 8 MiB of address space the interpreter cannot even load
    (no report, a failing exit code); under the 6 GiB cap the same folder reads (exit 1, its stall)."""
    directory = build("sub_group_stall", tmp_path / "dumps")
    starved = run_capped("hang-report", str(directory), cap=8 << 20)
    assert starved.code not in (0, 1, 2) and starved.out == "", starved
    assert run_capped("hang-report", str(directory)).code == 1
