"""Property-based fuzzing of the hang report (#33, item 6): structural mutations of real dumps, read by the command.

The sources: torch's own Gloo dumps from real ranks (:mod:`tests.ranks.torch_fr`: a healthy run and a sub-group
stall, 4 ranks each) and NCCL-format dumps (:mod:`tests.harness.nccl_scenarios`: healthy ones, stalls, a wrapped
buffer, coalesced collectives, torch 2.15's hook format). Each example takes one set and applies one mutation, drawn
by Hypothesis from what the set holds:

* a key dropped (an entry's, the top level's, a ``pg_config`` group's);
* a type swapped (a value replaced by one of a type torch never writes there);
* an integer made huge (2**63, 10**400, 10**5000) or negative (below -1 for ``pg_status``'s counters, whose -1 is
  "none yet": ``pg_status`` is a hint, never evidence, so a counter within its range changes no verdict);
* a shared reference (an entry that is another again; sizes that repeat one long shape; a description of shared
  nested lists);
* deep nesting (a value wrapped in hundreds of lists);
* a lone surrogate in a text;
* a file truncated, or removed.

The command (:func:`nemo_rl_shim.hang_report.main`, as ``hang-report`` runs it: its readers forked and bounded)
must end with exit 0, 1 or 2, never a traceback nor the line of its own defect; exit 2 is one line naming a file of
the folder or the folder; each example within :data:`EXAMPLE_S`, the readers within :data:`PEAK_MB`; and exit 0 only
for a set that is unmodified and healthy (every mutation here changes the data: none may read as healthy).

CI runs :data:`CI_EXAMPLES` examples (under 60 s here); ``NEMO_RL_SHIM_FUZZ_EXAMPLES=N`` runs N (the longer run in
``benchmarks/README.md``).
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_shim.cli import hang_report as hang_report_command
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from tests.harness.nccl_scenarios import build

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

#: Examples per CI run (each reads a folder of 4 dumps through forked readers: about 0.17 s here, 35 s in all).
CI_EXAMPLES = int(os.environ.get("NEMO_RL_SHIM_FUZZ_EXAMPLES", "200"))
#: Each example ends within this (generous: the machine is shared).
EXAMPLE_S = 30.0
#: The reader processes' peak resident memory, at most.
PEAK_MB = 1536.0
PREFIX = "nccl_trace_rank_"
NCCL_SOURCES = ["healthy", "wrapped_healthy", "coalesced_healthy", "sub_group_stall", "p2p_stall",
                "nccl2_batched_p2p_stall", "mismatch"]  # fmt: skip
HEALTHY = {"nccl:healthy", "nccl:wrapped_healthy", "nccl:coalesced_healthy"}
#: What torch writes under each entry key: a value of any other type is a swap torch never makes.
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "record_id": (int,), "pg_id": (int, str), "process_group": (tuple, list), "thread_name": (str,),
    "thread_id": (str,), "collective_seq_id": (int,), "p2p_seq_id": (int,), "op_id": (int,),
    "profiling_name": (str,), "time_created_ns": (int,), "input_sizes": (list,), "input_dtypes": (list,),
    "output_sizes": (list,), "output_dtypes": (list,), "state": (str,), "time_discovered_started_ns": (int, type(None)),
    "time_discovered_completed_ns": (int, type(None)), "retired": (bool,), "timeout_ms": (int,), "is_p2p": (bool,),
    "frames": (list,),
}  # fmt: skip
COUNTS = ["record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns", "timeout_ms"]
TEXTS = ["profiling_name", "thread_name", "thread_id", "state"]
SWAPS: list[Any] = [None, "x", 7, 2.5, math.nan, True, b"raw", [], {}, [["a"]], ("t",), {"k": 1}]
HUGE = [2**63, 10**400, 10**5000, -1, -(2**70)]
#: pg_status's counters run from -1 (none yet): these lie outside.
OUTSIDE_COUNTERS = [2**63, 10**400, 10**5000, -2, -(2**70)]
#: A group's ranks as torch's text, broken: repeated, past int64, not a list, not text, nested past Python's parser.
PG_CONFIG_RANKS = [7, None, "[0, 0]", "[0, 1e400]", "[0, " + "9" * 5000 + "]", "[1, 2", "x\ud800", "[" * 10_000]


def _gloo(base: Path, scenario: str, timeout_s: int, **extra: Any) -> Path:
    """Real Gloo ranks' dumps of ``scenario`` (``timeout_s``: the groups' timeout; a healthy run's is long, so that a
    loaded machine cannot make its collectives time out)."""
    directory = base / scenario
    directory.mkdir(parents=True)
    params = {"scenario": scenario, "timeout_s": timeout_s, "grace_s": 3, **extra}
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(directory / PREFIX), "CUDA_VISIBLE_DEVICES": "", "TORCH_FR_BUFFER_SIZE": "50"}
    spawn_ranks("tests.ranks.torch_fr:run_scenario", params, world_size=4, timeout_s=240, env=env, check=False)
    return directory


class Sources(dict):
    """The source sets (a dict), shown short where Hypothesis prints a failing example's arguments."""

    def __repr__(self) -> str:
        return f"<{len(self)} source sets: {', '.join(sorted(self))}>"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Sources:
    """Every source set: ``{"gloo:healthy": {file name: bytes}, "nccl:sub_group_stall": ..., ...}``."""
    base = tmp_path_factory.mktemp("fuzz-sources")
    folders = {f"nccl:{name}": build(name, base / "nccl" / name) for name in NCCL_SOURCES}
    folders["gloo:healthy"] = _gloo(base / "gloo", "healthy", 60, rounds=3)
    folders["gloo:sub_group_stall"] = _gloo(base / "gloo", "sub_group_stall", 3)
    found = Sources(
        {name: {p.name: p.read_bytes() for p in sorted(folder.iterdir())} for name, folder in folders.items()}
    )
    assert all(len(files) == 4 for files in found.values()), {k: sorted(v) for k, v in found.items()}
    return found


def test_the_unmodified_sets_read_as_they_are(sources) -> None:
    """The oracle's other half: each healthy NCCL-format set reads exit 0, unmodified; torch's Gloo sets never do."""
    for name, files in sources.items():
        with tempfile.TemporaryDirectory() as folder:
            for file, data in files.items():
                Path(folder, file).write_bytes(data)
            code, text = hang_report_command.main(folder)
        assert code == (0 if name in HEALTHY else 1), (name, text.splitlines()[0])


# --- mutations ------------------------------------------------------------------------------------------------------


def _shared_nest(depth: int) -> list[Any]:
    node: list[Any] = ["x"]
    for _ in range(depth):
        node = [node, node]
    return node


def _nested(value: Any, depth: int) -> list[Any]:
    for _ in range(depth):
        value = [value]
    return value


def _entry_mutation(data: st.DataObject, raw: dict[str, Any]) -> str:
    entries = raw["entries"]
    index = data.draw(st.integers(0, len(entries) - 1), label="entry")
    entry = entries[index]
    kind = data.draw(st.sampled_from(["drop", "swap", "int", "share", "deep", "surrogate", "frame"]), label="kind")
    keys = sorted(k for k in entry if k in ENTRY_TYPES)
    if kind == "drop":
        key = data.draw(st.sampled_from(keys), label="key")
        del entry[key]
    elif kind == "swap":
        key = data.draw(st.sampled_from(keys), label="key")
        entry[key] = data.draw(st.sampled_from([v for v in SWAPS if not isinstance(v, ENTRY_TYPES[key])]), label="v")
    elif kind == "int":
        key = data.draw(st.sampled_from([k for k in COUNTS if k in entry]), label="key")
        entry[key] = data.draw(st.sampled_from(HUGE), label="value")
    elif kind == "share":
        how = data.draw(st.sampled_from(["entry", "sizes", "desc"]), label="share")
        if how == "entry" and len(entries) > 1:
            other = data.draw(st.integers(0, len(entries) - 1).filter(lambda i: i != index), label="other")
            entries[index] = entries[other]
        elif how in ("entry", "sizes"):
            entry["input_sizes"] = [[1] * 5_000] * 5_000
        else:
            entry["process_group"] = (entry["process_group"][0], _shared_nest(50))
        key = how
    elif kind == "deep":
        key = data.draw(st.sampled_from(keys), label="key")
        entry[key] = _nested(entry[key], data.draw(st.integers(2, 400), label="depth"))
    elif kind == "surrogate":
        key = data.draw(st.sampled_from([k for k in TEXTS if k in entry] + ["process_group"]), label="key")
        if key == "process_group":
            entry[key] = (entry[key][0], entry[key][1] + "\ud800")
        else:
            entry[key] = entry[key] + "\udcff"
    else:  # a frame: its name swapped, or a surrogate in it
        if not entry.get("frames"):
            entry["frames"] = 3
            return f"entry {index} frames given an int"
        frame = dict(entry["frames"][0])
        frame["name"] = data.draw(st.sampled_from([5, None, "f\ud800", ["f"]]), label="name")
        entry["frames"] = [frame, *entry["frames"][1:]]
        key = "frames"
    return f"entry {index} {key}: {kind}"


def _top_mutation(data: st.DataObject, raw: dict[str, Any]) -> str:
    kind = data.draw(st.sampled_from(["drop", "swap", "pg_config", "pg_status"]), label="top")
    if kind == "drop":
        key = data.draw(st.sampled_from(sorted(raw)), label="key")
        del raw[key]
    elif kind == "swap":
        key = data.draw(st.sampled_from(sorted(raw)), label="key")
        raw[key] = data.draw(st.sampled_from([v for v in SWAPS if type(v) is not type(raw[key])]), label="value")
    elif kind == "pg_config":
        name = data.draw(st.sampled_from(sorted(raw["pg_config"])), label="group")
        field = data.draw(st.sampled_from(["name", "desc", "ranks"]), label="field")
        values = PG_CONFIG_RANKS if field == "ranks" else [7, None, ["a"], "x\ud800"]
        raw["pg_config"][name][field] = data.draw(st.sampled_from(values), label="value")
        key = f"pg_config[{name!r}].{field}"
    else:
        if not raw.get("pg_status"):
            raw["pg_status"] = []
            return "pg_status made a list"
        pg = data.draw(st.sampled_from(sorted(raw["pg_status"])), label="pg")
        field = data.draw(st.sampled_from(sorted(raw["pg_status"][pg])), label="field")
        # -1 is a counter's own "none yet", and pg_status is never evidence: outside its range, then
        raw["pg_status"][pg][field] = data.draw(st.sampled_from([*OUTSIDE_COUNTERS, "\ud800", None, 2.5]), label="v")
        key = f"pg_status[{pg!r}].{field}"
    return f"top {key}: {kind}"


def _mutate(data: st.DataObject, files: dict[str, bytes]) -> tuple[dict[str, bytes], str]:
    """One mutation of one file of ``files`` (see the module docstring); the new files and what was done."""
    files = dict(files)
    name = data.draw(st.sampled_from(sorted(files)), label="file")
    kind = data.draw(st.sampled_from(["entry", "entry", "entry", "top", "truncate", "remove"]), label="where")
    if kind == "truncate":
        files[name] = files[name][: data.draw(st.integers(0, len(files[name]) - 1), label="at")]
        return files, f"{name} truncated"
    if kind == "remove":
        del files[name]
        return files, f"{name} removed"
    raw = pickle.loads(files[name])
    what = _entry_mutation(data, raw) if kind == "entry" and raw["entries"] else _top_mutation(data, raw)
    files[name] = pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL)
    return files, f"{name}: {what}"


# --- the property ---------------------------------------------------------------------------------------------------


def _check(code: int, text: str, folder: Path, what: str, seconds: float) -> None:
    said = f"{what}: exit {code}: {text[:600]}"
    assert code in (0, 1, 2), said
    assert code != 0, f"exit 0 on a modified set: {said}"
    assert "Traceback" not in text and "a defect of hang-report" not in text, said
    if code == 2:
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hang-report: "), said
        assert str(folder) in lines[0] or "cannot tell" in lines[0], said
    assert seconds < EXAMPLE_S, said


@settings(
    max_examples=CI_EXAMPLES,
    deadline=None,
    database=None,  # nothing written beside the sources
    derandomize=True,  # the same examples every CI run; NEMO_RL_SHIM_FUZZ_EXAMPLES reaches further
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_mutation_ends_in_a_defined_exit(sources, data) -> None:
    source = data.draw(st.sampled_from(sorted(sources)), label="source")
    files, what = _mutate(data, sources[source])
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        for name, content in files.items():
            (folder / name).write_bytes(content)
        start = time.monotonic()
        code, text = hang_report_command.main(str(folder))
        _check(code, text, folder, f"{source}, {what}", time.monotonic() - start)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_readers_stayed_within_their_memory(sources) -> None:
    """After the fuzzing in this process: no reader it forked peaked past PEAK_MB (ru_maxrss of its children)."""
    del sources
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak < PEAK_MB, f"a reader peaked at {peak:.0f} MB"
