"""``hang-report`` on dumps anyone could have written (item 4 of #27): no code runs while loading, memory is
bounded by the data and never by a number in a file name, and every malformed input gets exit 2 with one line
naming the file (``--json``: a JSON object on stdout, on every path), never a traceback or exit 1.

The dumps are NCCL-format (:mod:`tests.harness.nccl_format_dumps`) with one thing wrong each. The code that would
run writes a marker file: the test proves it would run (plain ``pickle.loads`` writes it) and that the report
did not (no marker).
"""

from __future__ import annotations

import copyreg
import json
import math
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.cli.main import main
from tests.harness.nccl_format_dumps import Clock, Group, Rank, write
from tests.harness.paths import REPO_ROOT

PREFIX = "nccl_trace_rank_"


class _Payload:
    """An object whose unpickling writes ``marker``: what a hostile dump would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _healthy(directory: Path, world: int = 2, *, dumped: tuple[int, ...] | None = None) -> dict[int, dict[str, Any]]:
    """``world`` ranks, three all_reduces each on the default group; writes the ranks in ``dumped`` (all)."""
    group, clock = Group("0", "default_pg", tuple(range(world))), Clock()
    ranks = [Rank(r, [group], clock) for r in range(world)]
    for _ in range(3):
        for rank in ranks:
            rank.collective(group)
        clock.settle()
    for rank in ranks:
        if dumped is None or rank.rank in dumped:
            write(directory, rank)
    return {rank.rank: rank.dump() for rank in ranks}


def _run(directory: Path, capfd: pytest.CaptureFixture[str], *, as_json: bool = False) -> tuple[int, str, str]:
    code = main(["hang-report", *(["--json"] if as_json else []), str(directory)])
    out, err = capfd.readouterr()
    return code, out, err


def _assert_one_line(code: int, err: str, path: Path, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]


# --- no code runs ---------------------------------------------------------------------------------------------------


def test_code_in_reduce_alone_does_not_run(tmp_path, capfd) -> None:
    marker = tmp_path / "marker"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    payload = pickle.dumps(_Payload(marker))
    (dumps / f"{PREFIX}0").write_bytes(payload)
    code, _, err = _run(dumps, capfd)
    _assert_one_line(code, err, dumps / f"{PREFIX}0", "refused", "builtins.exec")
    assert not marker.exists(), "loading the dump ran its code"
    pickle.loads(payload)  # the payload is live: plain unpickling runs it
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("where", ["entry", "top level", "frames"])
def test_code_inside_a_valid_dump_does_not_run(tmp_path, capfd, where: str) -> None:
    """As #27 found it: the payload in an otherwise valid dump, which the report read as 'every rank agrees'."""
    marker, dumps = tmp_path / "marker", tmp_path / "dumps"
    raw = _healthy(dumps)[1]
    if where == "entry":
        raw["entries"][1]["extra"] = _Payload(marker)
    elif where == "top level":
        raw["comm_lib_version"] = _Payload(marker)
    else:
        raw["entries"][-1]["frames"] = [_Payload(marker)]
    (dumps / f"{PREFIX}1").write_bytes(pickle.dumps(raw))
    for as_json in (False, True):
        code, out, err = _run(dumps, capfd, as_json=as_json)
        _assert_one_line(code, err, dumps / f"{PREFIX}1", "refused")
        if as_json:
            assert json.loads(out)["exit_code"] == 2 and "refused" in json.loads(out)["line"]
    assert not marker.exists(), "loading the dump ran its code"


def test_an_extension_code_is_refused_while_copyregs_registry_is_not_empty(tmp_path, capfd) -> None:
    """``EXT`` opcodes reach a callable through copyreg's registry (cached per process) without find_class."""
    dumps = tmp_path / "dumps"
    _healthy(dumps)
    assert not copyreg._inverted_registry, "nothing registers pickle extensions in this process"
    copyreg.add_extension("builtins", "exec", 0xBEEF)
    try:
        code, _, err = _run(dumps, capfd)
    finally:
        copyreg.remove_extension("builtins", "exec", 0xBEEF)
    _assert_one_line(code, err, dumps / f"{PREFIX}0", "extension registry")
    assert _run(dumps, capfd)[0] == 0


def test_the_plain_types_torch_writes_still_load(tmp_path) -> None:
    """Every type in a torch dump: what the restricted unpickler must build (tuples, None, floats, bools, bytes)."""
    from nemo_rl_shim.hang_report.dump_format import read_dump

    raw = _healthy(tmp_path)[0]
    raw["entries"][0].update(duration_ms=0.036, time_discovered_started_ns=None, retired=True)
    path = tmp_path / "one"
    path.write_bytes(pickle.dumps(raw, protocol=2))  # torch's own pickler writes protocol 2
    assert read_dump(path) == raw
    raw["entries"][0]["blob"] = b"\x00"
    path.write_bytes(pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL))
    assert read_dump(path) == raw


# --- memory: bounded by the data ------------------------------------------------------------------------------------

_MEASURE = textwrap.dedent(
    """
    import json, resource, sys, tracemalloc
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a cap, so that a regression cannot take the machine
    from nemo_rl_shim import hang_report
    from nemo_rl_shim.cli import hang_report as hang_report_command
    out = {}
    for name in sys.argv[1:]:
        tracemalloc.start()
        try:
            code, text = hang_report_command.main(name, with_torch=False)
        except MemoryError:
            code, text = "MemoryError", ""
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        out[name] = {"code": code, "line": text.splitlines()[0] if text else "", "peak_mb": peak}
        tracemalloc.stop()
    print(json.dumps(out))
    """
)


def test_a_rank_number_in_a_file_name_does_not_size_the_world(tmp_path) -> None:
    """``nccl_trace_rank_0`` and ``nccl_trace_rank_999999999`` (#27: 21.5 GB, killed): exit 2 naming the file, with
    the memory the two small files need. Also where no record lists the world (torch's Gloo dumps: no named
    pg_config): refused, not guessed as a billion ranks. Measured in a child under a 4 GiB address-space cap."""
    base, big, empty, unlisted = (tmp_path / name for name in ("two", "big", "empty", "unlisted"))
    raw = _healthy(base)
    for directory, change in (
        (big, {}),
        (empty, {"entries": []}),  # no entry: no group membership names the rank, only its file
        (unlisted, {"pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}}),  # as Gloo keeps it
    ):
        directory.mkdir()
        for rank, name in ((0, f"{PREFIX}0"), (1, f"{PREFIX}999999999")):
            (directory / name).write_bytes(pickle.dumps({**raw[rank], **change}))
    child = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(base), str(big), str(empty), str(unlisted)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    facts = json.loads(child.stdout.splitlines()[-1])
    assert facts[str(base)]["code"] == 0, facts
    for directory, words in (
        (big, "outside the world of 2 ranks"),
        (empty, "rank 999999999 is outside the world of 2 ranks"),
        (unlisted, "no record states the world"),
    ):
        found = facts[str(directory)]
        assert found["code"] == 2 and f"{PREFIX}999999999" in found["line"] and words in found["line"], found
        assert found["peak_mb"] < facts[str(base)]["peak_mb"] + 16, facts


def test_missing_top_ranks_are_seen(tmp_path, capfd) -> None:
    """A 4-rank world whose ranks 2 and 3 left no dump: the default group torch lists says so."""
    _healthy(tmp_path, world=4, dumped=(0, 1))
    code, out, _ = _run(tmp_path, capfd, as_json=True)
    payload = json.loads(out)
    assert code == 1 and payload["missing_dumps"] == [2, 3] and payload["world_size"] == 4, payload
    assert payload["line"].startswith("never came (dead: no dump): no dump from ranks 2-3"), payload["line"]


def test_missing_top_ranks_are_seen_from_the_shims_sidecar(tmp_path, capfd) -> None:
    """torch's dump without a named pg_config (as Gloo writes it), the world in the shim's group map beside it."""
    raw = _healthy(tmp_path.parent / f"{tmp_path.name}-scratch", world=4)
    for rank in (0, 1):
        dump = dict(raw[rank], pg_config={"": {"name": "", "desc": "", "ranks": "[0, 1]"}})
        (tmp_path / f"{PREFIX}{rank}").write_bytes(pickle.dumps(dump))
        side = {"rank": rank, "world_size": 4, "groups": {"0": {"axes": ["default"], "ranks": [0, 1, 2, 3]}}}
        (tmp_path / f"fr_groups_rank_{rank}.json").write_text(json.dumps(side))
    code, out, _ = _run(tmp_path, capfd, as_json=True)
    assert code == 1 and json.loads(out)["missing_dumps"] == [2, 3], out


def test_world_size_that_disagrees_with_the_listed_world_is_refused(tmp_path, capfd) -> None:
    raw = _healthy(tmp_path)
    raw[1]["nemo_rl_shim"] = {"rank": 1, "world_size": 3, "groups": {}}
    (tmp_path / f"{PREFIX}1").write_bytes(pickle.dumps(raw[1]))
    code, _, err = _run(tmp_path, capfd)
    _assert_one_line(code, err, tmp_path, "the world disagrees", f"the world_size in {tmp_path / PREFIX}1 says 3")
    raw[1]["nemo_rl_shim"]["world_size"] = 999_999_999  # past the largest world the report reads: refused as it is
    (tmp_path / f"{PREFIX}1").write_bytes(pickle.dumps(raw[1]))
    code, _, err = _run(tmp_path, capfd)
    _assert_one_line(code, err, tmp_path / f"{PREFIX}1", "'nemo_rl_shim.world_size' is 999999999 (int), not a world")


# --- malformed dumps: exit 2, one line naming the file --------------------------------------------------------------


def _shared_nest(depth: int) -> list[Any]:
    """A list that holds itself twice per level: ``depth`` levels pickle in a few hundred bytes, print as 2**depth."""
    node: list[Any] = [1]
    for _ in range(depth):
        node = [node, node]
    return node


def _set(entry: str, key: str, value: Any) -> Any:
    def change(raw: dict[str, Any]) -> None:
        raw["entries"][int(entry)][key] = value

    return change


MALFORMED: dict[str, tuple[Any, str]] = {
    "entries that are ints": (lambda raw: raw.update(entries=[1, 2, 3]), "entry 0 is 1 (int), not a dict"),
    "an empty entry": (lambda raw: raw["entries"].insert(1, {}), "entry 1 'process_group' is None (NoneType)"),
    "a NaN sequence number": (_set("2", "collective_seq_id", math.nan), "'collective_seq_id' is nan (float)"),
    "a text sequence number": (_set("0", "collective_seq_id", "3"), "'collective_seq_id' is '3' (str)"),
    "a negative sequence number": (_set("1", "collective_seq_id", -1), "'collective_seq_id' is -1 (int)"),
    "a sequence number past int64": (_set("1", "collective_seq_id", 2**70), "not an int from 0 to 2**63 - 1"),
    "a bool for is_p2p": (_set("0", "is_p2p", 1), "'is_p2p' is 1 (int), not a bool"),
    "a process group that is text": (_set("0", "process_group", "0"), "'process_group' is '0' (str)"),
    "a process group named by a number": (
        _set("0", "process_group", (0, "default_pg")),
        "'process_group' is (0, 'default_pg') (tuple), not (name, description)",
    ),
    "a profiling name that is a number": (_set("0", "profiling_name", 7), "'profiling_name' is 7 (int)"),
    "a state nobody writes": (_set("2", "state", "finished"), "'state' is 'finished' (str)"),
    "sizes that nest 2**60 items": (_set("1", "input_sizes", _shared_nest(60)), "'input_sizes' is"),
    "a creation time that is a float": (_set("2", "time_created_ns", 1.5), "'time_created_ns' is 1.5 (float)"),
    "a dict without entries": (lambda raw: raw.pop("entries"), "no 'entries' list"),
    "entries that are a dict": (lambda raw: raw.update(entries={}), "'entries' is {} (dict)"),
    "a dict of something else": (lambda raw: raw.clear() or raw.update(x=1), "no 'entries' list (keys: 'x')"),
    "pg_config that is a list": (lambda raw: raw.update(pg_config=[1]), "'pg_config' is [1] (list)"),
    "ranks that are not ranks": (
        lambda raw: raw["pg_config"]["0"].update(ranks="[0, 'a']"),
        "pg_config['0'].ranks is \"[0, 'a']\" (str), not a list of distinct ranks",
    ),
    "a rank that is not its file's": (lambda raw: raw.update(rank=0), "the dump says it is rank 0"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_each_malformed_dump_gets_exit_2_and_one_line(tmp_path, capfd, case: str) -> None:
    change, words = MALFORMED[case]
    raw = _healthy(tmp_path)[1]
    change(raw)
    path = tmp_path / f"{PREFIX}1"
    path.write_bytes(pickle.dumps(raw))
    code, _, err = _run(tmp_path, capfd)
    _assert_one_line(code, err, path, words)
    code, out, err = _run(tmp_path, capfd, as_json=True)
    payload = json.loads(out)
    assert code == 2 and payload["exit_code"] == 2 and words in payload["line"] and err.strip() == payload["line"]


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        (f"{PREFIX}1", b"not a pickle", "is not a readable flight-recorder dump"),
        (f"{PREFIX}1", pickle.dumps(_healthy.__doc__)[:-3], "is not a readable flight-recorder dump"),
        (f"{PREFIX}1", pickle.dumps([1, 2]), "torch writes a dict, this is [1, 2] (list)"),
        ("fr_groups_rank_1.json", b"{not json", "is not a readable group map"),
        ("fr_groups_rank_1.json", b'{"world_size": -4}', "'world_size' is -4 (int), not a world of 1 to"),
        ("fr_groups_rank_1.json", b'{"groups": {"0": {"ranks": [0, 0]}}}', "not a list of distinct ranks"),
    ],
)
def test_unreadable_files_get_exit_2_and_one_line(tmp_path, capfd, name: str, content: bytes, words: str) -> None:
    _healthy(tmp_path)
    (tmp_path / name).write_bytes(content)
    _, out, err = _run(tmp_path, capfd, as_json=True)
    assert json.loads(out)["exit_code"] == 2
    assert words in err and str(tmp_path / name) in err and len(err.strip().splitlines()) == 1, err


def test_dumps_that_hold_no_entry_keep_json_valid(tmp_path, capfd) -> None:
    for rank in range(2):
        (tmp_path / f"{PREFIX}{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
    code, out, err = _run(tmp_path, capfd, as_json=True)
    line = json.loads(out)["line"]  # exit 2: one line naming the input, in the JSON too (#43)
    assert code == 2 and line.startswith(f"hang-report: {tmp_path}: its 2 dumps hold no entry"), (out, err)


# --- anything else: seeded random damage, never a traceback ---------------------------------------------------------

_DAMAGE = [None, "x", "", -1, 2**70, math.nan, 1.5, True, [], {}, [[1]], [["a"]], ("a",), (1, 2), {"a": 1}, b"x"]
_SHIM_DAMAGE = [{"0": {"ranks": [0, 5]}}, {"nccl": 3}, {"nccl": {"first_record_id": "a"}}, {"0": {"axes": "tp"}}]


def _damage(raw: dict[str, Any], rng: Any, rank: int) -> str:
    """One random change to a dump: an entry's field, a top-level key, the shim's keys, or a pg_config field."""
    where = rng.random()
    if where < 0.6:
        entry = rng.choice(raw["entries"])
        key = rng.choice(sorted(entry))
        entry[key] = rng.choice(_DAMAGE)
        return f"entry {key}"
    if where < 0.75:
        key = rng.choice(sorted(raw))
        raw[key] = rng.choice(_DAMAGE)
        return f"top-level {key}"
    if where < 0.9:
        shim = {"rank": rank, "world_size": 4, "groups": {"0": {"axes": ["default"], "ranks": [0, 1, 2, 3]}}}
        shim["recorders"] = {"nccl": {"first_record_id": 0, "oldest_ns": 1}}
        key = rng.choice(sorted(shim))
        shim[key] = rng.choice(_DAMAGE + _SHIM_DAMAGE)
        raw["nemo_rl_shim"] = shim
        return f"nemo_rl_shim.{key}"
    key = rng.choice(["ranks", "desc", "name"])
    raw["pg_config"]["0"][key] = rng.choice([*_DAMAGE, "[0, 9999]", "[1, 1]", "[]"])
    return f"pg_config['0'].{key}"


def test_random_damage_never_gives_a_traceback(tmp_path) -> None:
    """120 seeded damaged copies of NCCL-format scenarios (a p2p pipeline, a wrapped buffer, the hook's format):
    each gets exit 0, 1 or 2, and exit 2 is one line naming the folder's file."""
    import random
    import shutil

    from nemo_rl_shim.cli import hang_report as hang_report_command
    from tests.harness.nccl_scenarios import build

    names = ["sub_group_stall", "pipeline_stall", "wrapped_stall", "nccl2_batched_p2p_stall"]
    sources = {name: build(name, tmp_path / "sources" / name) for name in names}
    rng = random.Random(27)
    codes = []
    for case in range(120):
        name = rng.choice(names)
        directory = tmp_path / f"case{case}"
        shutil.copytree(sources[name], directory)
        path = rng.choice(sorted(directory.iterdir()))
        raw = pickle.loads(path.read_bytes())
        what = _damage(raw, rng, int(path.name.rpartition("_")[2]))
        path.write_bytes(pickle.dumps(raw))
        code, text = hang_report_command.main(str(directory), with_torch=False)
        codes.append(code)
        if code == 2 and not text.startswith("cannot tell"):
            assert len(text.splitlines()) == 1 and str(directory) in text, (name, what, text)
        shutil.rmtree(directory)
    assert set(codes) == {1, 2} or set(codes) == {0, 1, 2}, codes
