"""#43's property, from outside: folders that are not one run's dumps, or whose files are not their ranks', never
read as "every rank agrees".

Each example takes a healthy NCCL-format set (:mod:`tests.harness.nccl_scenarios`: ``healthy``, batched p2p on
every rank; ``wrapped_healthy``, sub-groups and 20-entry buffers, two of them wrapped; ``coalesced_healthy``,
coalesced collectives alone), which reads exit 0 as it is, and applies one to three changes drawn by Hypothesis
(each at most once: two swaps of a pair undo each other)
(:mod:`tests.harness.run_mixes`):

* **two runs**: some ranks' files from the same set written as another run would: a day later under another torch
  and NCCL, three minutes later under the same, or a week earlier;
* **link** (hard or symbolic), **copy**, **swap** of two ranks' files; a swap only between ranks whose dumps say who
  they are (a p2p name, or a group only one of them is in): where nothing in two dumps names their rank, a swap is
  no reader's to see, and changes nothing of what the report says of a healthy run;
* **out-of-group peer** in a p2p name; **gap**: a collective number taken out of one rank's buffer; **trailing
  bytes** after a pickle; **stray**: a rank's file renamed (an Arabic-Indic digit, a leading zero).

The command (``hang_report.main``, as ``hang-report --json`` runs it) must never exit 0; exit 2 is one line on
stderr that names a file of the folder or the folder, and comes wherever a change is one that refuses (a link, a
copy, a detectable swap, an out-of-group peer, trailing bytes); exit 1 otherwise, with a kind one of the changes
makes: ``no_dump`` or ``never_came`` (a rank whose file is another run's or a stray), ``cannot_tell`` (a gap; a run
not proved one, or a folder of several).

CI runs :data:`CI_EXAMPLES` examples, derandomized (the same every run, about 20 s here);
``NEMO_RL_SHIM_RUNS_EXAMPLES=N`` runs N (the longer run in ``benchmarks/README.md``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nemo_rl_shim.cli import hang_report as hang_report_command
from nemo_rl_shim.hang_report.folder import is_rank_text
from tests.harness import run_mixes
from tests.harness.nccl_scenarios import build
from tests.harness.run_mixes import DAY_NS, PREFIX

#: Examples per CI run (each reads a folder of 4 dumps through forked readers).
CI_EXAMPLES = int(os.environ.get("NEMO_RL_SHIM_RUNS_EXAMPLES", "60"))
SOURCES = ("healthy", "wrapped_healthy", "coalesced_healthy")
#: The other runs drawn: (name, time shift, dump format, NCCL version).
OTHER_RUNS = (
    ("a day later, another torch", DAY_NS, "2.11", "2.28.9"),
    ("three minutes later", 180 * 10**9, None, None),
    ("a week earlier", -7 * DAY_NS, None, None),
)
#: Changes that refuse the folder (exit 2), and the kinds each other change may give (exit 1).
REFUSING = {"link", "symlink", "copy", "swap", "peer", "trailing"}
KINDS = {"two runs": {"no_dump", "never_came", "cannot_tell"}, "gap": {"cannot_tell"},
         "stray": {"no_dump", "never_came"}}  # fmt: skip


class Sources(dict):
    """``{set: {file name: bytes}}``, and the other runs of each set, shown short where Hypothesis prints."""

    def __repr__(self) -> str:
        return f"<{len(self)} source sets>"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Sources:
    base = tmp_path_factory.mktemp("runs-sources")
    found = Sources()
    for name in SOURCES:
        found[name] = {p.name: p.read_bytes() for p in sorted(build(name, base / name).iterdir())}
        for index, (_, shift, version, nccl) in enumerate(OTHER_RUNS):
            folder = run_mixes.other_run(name, base / f"{name}-{index}", shift, version, nccl)
            found[(name, index)] = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    return found


@dataclass
class Applied:
    """The changes made to a folder, in words, and which of them refuse."""

    words: list[str] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    refusing: bool = False


def _present(folder: Path) -> list[int]:
    """The ranks whose files are there under a rank's name."""
    return sorted(int(p.name[len(PREFIX) :]) for p in folder.iterdir() if is_rank_text(p.name[len(PREFIX) :]))


def _says_who(folder: Path, a: int, b: int) -> bool:
    """Whether the dumps of ``a`` and ``b`` name their ranks: a p2p name in both, or groups that differ."""
    if run_mixes.p2p_names(folder, a) and run_mixes.p2p_names(folder, b):
        return True
    groups = [json.dumps(sorted(run_mixes.load_pg_config(folder, r))) for r in (a, b)]
    return groups[0] != groups[1]


def _change(data: st.DataObject, kind: str, folder: Path, source: str, sources: Sources, applied: Applied) -> None:
    ranks = _present(folder)
    if len(ranks) < 2:
        return
    pick = lambda label: data.draw(st.sampled_from(ranks), label=label)  # noqa: E731 - a short local helper
    if kind == "two runs":
        index = data.draw(st.integers(0, len(OTHER_RUNS) - 1), label="other run")
        moved = data.draw(st.lists(st.sampled_from(ranks), min_size=1, max_size=len(ranks) - 1, unique=True))
        for rank in moved:
            (folder / f"{PREFIX}{rank}").unlink()
            (folder / f"{PREFIX}{rank}").write_bytes(sources[(source, index)][f"{PREFIX}{rank}"])
        applied.words.append(f"ranks {sorted(moved)} from a run {OTHER_RUNS[index][0]}")
    elif kind in ("link", "symlink", "copy", "swap"):
        a = pick("from")
        b = data.draw(st.sampled_from([r for r in ranks if r != a]), label="to")
        if kind == "swap" and not _says_who(folder, a, b):
            return
        if kind == "swap":
            run_mixes.swap(folder, a, b)
        elif kind == "copy":
            run_mixes.copy(folder, a, b)
        else:
            run_mixes.link(folder, a, b, symbolic=kind == "symlink")
        applied.words.append(f"{kind} {a} -> {b}")
    elif kind == "peer":
        rank = pick("rank")
        if not run_mixes.p2p_names(folder, rank):
            return
        index = data.draw(st.integers(0, 63), label="op")
        applied.words.append(f"rank {rank}: {run_mixes.peer_outside(folder, rank, index, peer=9)}")
    elif kind == "gap":
        rank = pick("rank")
        numbers = run_mixes.interior_numbers(folder, rank)
        if not numbers:
            return
        group = data.draw(st.sampled_from(sorted(numbers)), label="group")
        number = data.draw(st.sampled_from(numbers[group]), label="number")
        run_mixes.drop_collective(folder, rank, group, number)
        applied.words.append(f"rank {rank}: no #{number} on group {group}")
    elif kind == "trailing":
        rank = pick("rank")
        tail = data.draw(st.sampled_from([b"\x80\x02K\x01.", b"x" * 20_000, b"\n"]), label="tail")
        run_mixes.append(folder, rank, tail)
        applied.words.append(f"rank {rank}: {len(tail)} bytes after the pickle")
    elif kind == "stray":
        rank = pick("rank")
        text = data.draw(st.sampled_from(["\u0663", "0" + str(rank), f"{rank}.bak"]), label="name")
        run_mixes.rename(folder, rank, text)
        applied.words.append(f"rank {rank} renamed {text!r}")
    else:
        raise AssertionError(kind)
    applied.refusing |= kind in REFUSING
    applied.kinds |= KINDS.get(kind, set())


CHANGES = ["two runs", "link", "symlink", "copy", "swap", "peer", "gap", "trailing", "stray"]
#: The order changes are made in: a stray first (the others act on the files left), then another run's files and a
#: gap (each replaces a file whole: made later, it could undo a link or a copy), then the refusing ones.
ORDER = ["stray", "two runs", "gap", "link", "symlink", "copy", "swap", "peer", "trailing"]


def _check(code: int, text: str, folder: Path, applied: Applied) -> None:
    said = f"{'; '.join(applied.words)}: exit {code}: {text[:700]}"
    assert code != 0, f"exit 0: {said}"
    payload = json.loads(text)
    if code == 2:
        line = payload["line"]
        assert "\n" not in line and line.startswith("hang-report: ") and str(folder) in line, said
        assert "a defect of hang-report" not in line, said
        return
    assert code == 1 and not applied.refusing, f"a refusing change read as exit {code}: {said}"
    assert payload["kind"]["name"] in applied.kinds, said


@settings(
    max_examples=CI_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples every CI run; NEMO_RL_SHIM_RUNS_EXAMPLES reaches further
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_folder_that_is_not_one_runs_never_reads_as_agreeing(sources, data) -> None:
    source = data.draw(st.sampled_from(SOURCES), label="source")
    # each change at most once: two swaps of one pair undo each other
    kinds = data.draw(st.sets(st.sampled_from(CHANGES), min_size=1, max_size=3), label="changes")
    folder = Path(tempfile.mkdtemp(prefix="runs-"))
    try:
        for name, content in sources[source].items():
            (folder / name).write_bytes(content)
        applied = Applied()
        for kind in sorted(kinds, key=ORDER.index):  # those that replace files before those that refuse
            _change(data, kind, folder, source, sources, applied)
        if not applied.words:
            return  # nothing this set allows was drawn: it is the set as it is, read in test_the_sources_agree
        code, text = hang_report_command.main(str(folder), as_json=True)
        _check(code, text, folder, applied)
        event(f"exit {code}")  # --hypothesis-show-statistics: how the examples ended
        for kind in kinds:
            event(f"change: {kind}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_sources_agree(sources) -> None:
    """The oracle's other half: each set, unchanged, reads exit 0, and so does each other run written alone."""
    for name, files in sources.items():
        with tempfile.TemporaryDirectory() as folder:
            for file, content in files.items():
                Path(folder, file).write_bytes(content)
            code, text = hang_report_command.main(folder)
        assert code == 0, (name, text.splitlines()[0])
