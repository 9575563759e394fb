"""The hostile inputs of #33's "Why" (and #46's recipes), each built in a folder, and the command that reads it run
under a 6 GiB address-space cap, timed and measured.

Each :class:`Case` builds its input under a folder (NCCL-format dumps from :mod:`tests.harness.nccl_scenarios`,
changed the way an attacker or a broken writer would) and says what the command must end with: its exit code and
words of its one line (stderr for exit 2, the first line of stdout otherwise). :func:`run_capped` runs the command
in a fresh interpreter under ``RLIMIT_AS`` = :data:`ADDRESS_SPACE_CAP`, through a small parent that reports the
command's wall time, and the CPU time and peak resident memory of the command and its reader processes
(``RUSAGE_CHILDREN``). ``tests/hang_report/test_hang_report_hostile.py`` asserts each within :data:`SECONDS` of
CPU time (wall time is the machine's: two suites on 2 cores took 60 s of wall for a case of 4 s) and
:data:`PEAK_MB`; ``benchmarks/hang_report_hostile.py``, run alone, prints the table in wall time. The cases that
need real Gloo ranks' dumps are in ``tests/hang_report/test_hang_report_torch_gloo.py``, through the same
:func:`run_capped`.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.nccl_scenarios import build
from tests.harness.paths import REPO_ROOT

__all__ = [
    "ADDRESS_SPACE_CAP",
    "CASES",
    "PEAK_MB",
    "SECONDS",
    "Case",
    "Outcome",
    "alias_bomb",
    "interpolation_bomb",
    "run_capped",
]

#: The address space the command runs under (what a shared login node might allow).
ADDRESS_SPACE_CAP = 6 << 30
#: Each case must end within this (#33's "Done when"; the tests hold the command's CPU time to it), ...
SECONDS = 30.0
#: ... and peak under this much resident memory.
PEAK_MB = 1536.0
PREFIX = "nccl_trace_rank_"
#: How long the parent waits for the command before it kills it: a blocked command ends as ``"timeout"``. Ten times
#: SECONDS: on a loaded machine a case's wall time is many times its CPU time.
KILL_S = 300

_PARENT = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    cap = int(sys.argv[1])
    def capped():  # in the command's process only: this parent stays uncapped, to report what happened
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    start = time.monotonic()
    try:
        done = subprocess.run(sys.argv[3:], capture_output=True, timeout=float(sys.argv[2]), preexec_fn=capped)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", e.stdout or b"", e.stderr or b""
    except OSError as e:  # the cap left too little to start the command at all
        code, out, err = "not started", b"", str(e).encode()
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    print(json.dumps({"code": code, "seconds": round(wall, 3), "cpu_s": round(cpu, 3), "peak_mb": round(peak, 1),
                      "out": out.decode("utf-8", "backslashreplace")[-4000:],
                      "err": err.decode("utf-8", "backslashreplace")[-4000:]}))
    """
)


@dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit code (``"timeout"`` past :data:`KILL_S`), wall seconds, peak resident MB, its
    output, and the CPU seconds of the command and its reader processes."""

    code: int | str
    seconds: float
    peak_mb: float
    out: str
    err: str
    cpu_s: float

    @property
    def line(self) -> str:
        """The line that matters: stderr's for exit 2, else stdout's first."""
        text = self.err if self.code == 2 else self.out
        return text.strip().splitlines()[0] if text.strip() else ""


def run_capped(*args: str, cap: int = ADDRESS_SPACE_CAP, root: Path = REPO_ROOT) -> Outcome:
    """``python -m nemo_rl_shim *args`` in a fresh interpreter under an address-space cap of ``cap`` bytes; ``root``:
    the checkout whose code runs (another one's, to measure it before a change)."""
    command = [sys.executable, "-c", _PARENT, str(cap), str(KILL_S), sys.executable, "-m", "nemo_rl_shim", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=KILL_S + 60, cwd=root, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"the measuring parent failed ({done.returncode}): {done.stderr[-2000:]}")
    return Outcome(**json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass(frozen=True)
class Case:
    """One hostile input: what it is (as #33's "Why" says it), how to build it, and what the command must end with."""

    name: str
    why: str
    build: Callable[[Path], list[str]]  # builds under the folder, returns the command's arguments
    code: int
    words: tuple[str, ...]


def _dumps(directory: Path) -> dict[int, dict[str, Any]]:
    return {int(p.name[len(PREFIX) :]): pickle.loads(p.read_bytes()) for p in directory.glob(f"{PREFIX}*")}


def _write(directory: Path, rank: int, raw: Any) -> None:
    (directory / f"{PREFIX}{rank}").write_bytes(pickle.dumps(raw))


def _stall(base: Path) -> Path:
    return build("sub_group_stall", base / "dumps")


def _healthy(base: Path) -> Path:
    return build("healthy", base / "dumps")


def _changed(scenario: str, change: Callable[[dict[str, Any]], None], rank: int = 1) -> Callable[[Path], list[str]]:
    """The scenario's dumps, with rank ``rank``'s changed by ``change``."""

    def make(base: Path) -> list[str]:
        directory = build(scenario, base / "dumps")
        raw = _dumps(directory)[rank]
        change(raw)
        _write(directory, rank, raw)
        return ["hang-report", str(directory)]

    return make


def _decoys(base: Path) -> list[str]:
    directory = _stall(base)
    build("healthy", base / "decoy")
    (directory / "old").mkdir()
    for path in sorted((base / "decoy").iterdir()):
        path.rename(directory / "old" / path.name.replace(PREFIX, "fr_trace_rank_"))
    return ["hang-report", str(directory)]


def _fifo(name: str) -> Callable[[Path], list[str]]:
    def make(base: Path) -> list[str]:
        directory = _healthy(base)
        (directory / name).unlink(missing_ok=True)
        os.mkfifo(directory / name)
        return ["hang-report", str(directory)]

    return make


def _fifo_config(base: Path) -> list[str]:
    os.mkfifo(base / "config.yaml")
    return ["preflight", "--config", str(base / "config.yaml")]


def _shared_entries(raw: dict[str, Any]) -> None:
    """About 65 KB: ten thousand references to one entry."""
    raw["entries"] = [raw["entries"][-1]] * 10_000


def _shared_shapes(raw: dict[str, Any]) -> None:
    """About 600 KB: every entry's sizes are 1,000 references to one shape of 20,000 dimensions."""
    shape = [1] * 20_000
    sizes = [shape] * 1_000
    for entry in raw["entries"]:
        entry["input_sizes"] = sizes


def _shared_nest(depth: int) -> list[Any]:
    node: list[Any] = ["tp"]
    for _ in range(depth):
        node = [node, node]
    return node


def _deep_desc(base: Path) -> list[str]:
    """Every entry's description a list nested 100,000 deep (pickled by hand: ``pickle`` itself would recurse)."""
    directory = _stall(base)
    raw = _dumps(directory)[1]
    _desc("DEEPDESC")(raw)
    data = pickle.dumps(raw, protocol=4)
    depth = 100_000
    assert data.count(b"\x8c\x08DEEPDESC") == 1, "the description is pickled once, then referred to"
    (directory / f"{PREFIX}1").write_bytes(data.replace(b"\x8c\x08DEEPDESC", b"]" * depth + b"a" * (depth - 1)))
    return ["hang-report", str(directory)]


def _set_all(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        for entry in raw["entries"]:
            entry[key] = value

    return change


def _set_last(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        raw["entries"][-1][key] = value

    return change


def _desc(value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        for entry in raw["entries"]:
            entry["process_group"] = (entry["process_group"][0], value)

    return change


def _frame(raw: dict[str, Any]) -> None:
    raw["entries"][-1]["frames"] = [{"name": "step\udcff", "filename": "/job/train.py", "line": 1}]


def _symlink(name: str, target: str) -> Callable[[Path], list[str]]:
    def make(base: Path) -> list[str]:
        directory = _healthy(base)
        (directory / name).unlink(missing_ok=True)
        (directory / name).symlink_to(target)
        return ["hang-report", str(directory)]

    return make


def _stray_dumps(base: Path) -> list[str]:
    """100,000 files named as dumps of ranks 4 to 100,003 beside a 4-rank run (hard links of one small file)."""
    directory = _healthy(base)
    for rank in range(4, 100_004):
        stray = base / f"stray{rank // 50_000}"  # a file takes at most 65,000 links
        if not stray.exists():
            stray.write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
        os.link(stray, directory / f"{PREFIX}{rank}")
    return ["hang-report", str(directory)]


def alias_bomb(levels: int = 10, width: int = 10) -> str:
    """``levels`` anchors, each a list of ``width`` aliases to the one before: ``width ** levels`` nodes (540 bytes
    as given)."""
    lines = ["a0: &a0 [" + ",".join(['"lolol"'] * width) + "]"]
    lines += [f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * width) + "]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def interpolation_bomb(levels: int = 16) -> str:
    """A recipe whose ``levels`` keys each add the one before to itself (``l2: ${add:${l1},${l1}}``): OmegaConf
    resolves each use again, so 2**levels resolutions (452 bytes as given)."""
    lines = ["policy:", "  automodel_cfg: {distributed_timeout_minutes: 45}", "l0: 1"]
    lines += [f"l{i}: ${{add:${{l{i - 1}}},${{l{i - 1}}}}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _alias_bomb(base: Path) -> list[str]:
    (base / "bomb.yaml").write_text(alias_bomb())
    return ["preflight", "--config", str(base / "bomb.yaml")]


def _interpolation_bomb(base: Path) -> list[str]:
    (base / "bomb.yaml").write_text(interpolation_bomb(16))
    return ["preflight", "--config", str(base / "bomb.yaml"), "--timeout-s", "10"]


def _many_keys(base: Path) -> list[str]:
    (base / "keys.yaml").write_text("big:\n" + "".join(f"  k{i}: {i}\n" for i in range(500_000)))
    return ["preflight", "--config", str(base / "keys.yaml")]


def _deep_defaults(base: Path) -> list[str]:
    for i in range(2000):
        (base / f"c{i}.yaml").write_text(f"defaults: c{i + 1}.yaml\nk{i}: {i}\n" if i < 1999 else "policy: {}\n")
    return ["preflight", "--config", str(base / "c0.yaml")]


def _non_utf8_folder(base: Path) -> list[str]:
    folder = Path(os.fsdecode(bytes(base) + b"/run\xff\x1b[2J"))
    shutil.move(str(_stall(base)), folder)
    return ["hang-report", str(folder)]


def _non_utf8_dump(base: Path) -> list[str]:
    directory = _stall(base)
    (directory / os.fsdecode(b"nccl_trace_rank\xff_1")).write_bytes(b"x")
    return ["hang-report", str(directory)]


def _surrogate_in_group_map(base: Path) -> list[str]:
    directory = _healthy(base)
    (directory / "fr_groups_rank_0.json").write_text('{"rank": 0, "groups": {"\\ud800": {"ranks": [0, 1, 2, 3]}}}')
    return ["hang-report", str(directory)]


BIG = 10**5000  # past Python's 4,300 digits: str() of it raises
HUGE = 10**400  # past any float: dividing it raises OverflowError

CASES: list[Case] = [
    Case("decoys in a subfolder", "healthy decoys under another prefix in a subfolder beside the real, stalled dumps",
         _decoys, 2, ("several runs", "nccl_trace_rank_<rank> (4 in .)", "fr_trace_rank_<rank> (4 in old)")),
    Case("FIFO as a dump", "a FIFO named like a dump", _fifo(f"{PREFIX}1"), 2, ("is a FIFO, not a regular file",)),
    Case("FIFO as a group map", "a FIFO named like a group-map sidecar", _fifo("fr_groups_rank_0.json"), 2,
         ("fr_groups_rank_0.json is a FIFO",)),
    Case("FIFO as a stack file", "a FIFO named like a stack file", _fifo("fr_stack_rank_0.txt"), 2,
         ("fr_stack_rank_0.txt is a FIFO",)),
    Case("FIFO as --config", "a FIFO given to preflight --config", _fifo_config, 2, ("config.yaml is a FIFO",)),
    Case("shared entries", "a 65 KB dump whose entries are references to one shared entry",
         _changed("sub_group_stall", _shared_entries), 2, ("entry 1 is entry 0 again (a shared reference)",)),
    Case("shared shapes", "a 600 KB dump of shared shape lists", _changed("sub_group_stall", _shared_shapes), 2,
         ("'input_sizes' expands past 4 items per byte",)),
    Case("shared nested description", "a group description built of shared nested lists",
         _changed("sub_group_stall", _desc(_shared_nest(60))), 2,
         ("'process_group' is ('1', [[...], [...]]) (tuple)",)),
    Case("group map to /dev/zero", "a sidecar that is a symlink to /dev/zero",
         _symlink("fr_groups_rank_0.json", "/dev/zero"), 2, ("is a symlink to /dev/zero, outside",)),
    Case("dump to /dev/zero", "a dump that is a symlink to /dev/zero", _symlink(f"{PREFIX}1", "/dev/zero"), 2,
         ("is a symlink to /dev/zero, outside",)),
    Case("100,000 stray dumps", "100,000 tiny dumps for ranks beyond the world", _stray_dumps, 2,
         (f"{PREFIX}4: rank 4 is outside the world of 4 ranks", "(and 99,999 more files)")),
    Case("YAML alias bomb", "a 540-byte YAML alias bomb given to preflight --config", _alias_bomb, 2,
         ("its aliases expand to more than 50,000 nodes: refused",)),
    Case("interpolation bomb", "a 452-byte recipe whose 16 keys each add the one before to itself, --timeout-s 10",
         _interpolation_bomb, 2, ("bomb.yaml", "${...} interpolations")),
    Case("500,000 keys", "an 8.8 MB recipe of 500,000 keys and no alias", _many_keys, 2,
         ("keys.yaml: holds more than 50,000 YAML nodes (keys, values and lists",)),
    Case("2,000-file defaults chain", "a defaults: chain of 2,000 files", _deep_defaults, 2,
         ("c32.yaml (33 files): a defaults chain deeper than 32 files",)),
    Case("/dev/urandom as --config", "/dev/urandom as --config",
         lambda base: ["preflight", "--config", "/dev/urandom"], 2, ("/dev/urandom is a character device",)),
    Case("rank of 5,000 digits", "an integer beyond Python's 4,300 digits as a rank",
         _changed("sub_group_stall", lambda raw: raw.update(rank=BIG)), 2, ("'rank' is <an int of 16,610 bits>",)),
    Case("sequence id of 5,000 digits", "an integer beyond Python's 4,300 digits as a sequence id",
         _changed("sub_group_stall", _set_last("collective_seq_id", BIG)), 2,
         ("'collective_seq_id' is <an int of 16,610 bits> (int), not an int from 0 to 2**63 - 1",)),
    Case("p2p sequence id of 5,000 digits", "an integer beyond Python's 4,300 digits as a p2p sequence id",
         _changed("p2p_stall", _set_last("p2p_seq_id", BIG), rank=3), 2, ("'p2p_seq_id' is <an int of 16,610 bits>",)),
    Case("timeout of 10**400", "10**400 as a timeout", _changed("sub_group_stall", _set_last("timeout_ms", HUGE), 2), 2,
         ("'timeout_ms' is <an int of 1,329 bits> (int), not an int from 0 to 2**63 - 1",)),
    Case("time of 10**400", "10**400 as a time", _changed("sub_group_stall", _set_last("time_created_ns", HUGE), 2), 2,
         ("'time_created_ns' is <an int of 1,329 bits>",)),
    Case("dump time of 10**400", "10**400 as the shim's dump time",
         _changed("sub_group_stall", lambda raw: raw.update(nemo_rl_shim={"dump_time_ns": HUGE}), 2), 2,
         ("'nemo_rl_shim.dump_time_ns' is <an int of 1,329 bits> (int), not a time in ns",)),
    Case("surrogate in a description", "a lone surrogate in a description",
         _changed("sub_group_stall", _desc("tp\ud800")), 2, ("'process_group' is ('1', 'tp\\ud800')",)),
    Case("surrogate in an op name", "a lone surrogate in an op name",
         _changed("sub_group_stall", _set_all("profiling_name", "nccl:all_reduce\ud800")), 2,
         ("'profiling_name' is 'nccl:all_reduce\\ud800' (str), not text",)),
    Case("surrogate in a frame", "a lone surrogate in a frame", _changed("sub_group_stall", _frame, 2), 2,
         ("'frames' holds {'filename': '/job/train.py', 'line': 1, 'name': 'step\\udcff'}",)),
    Case("surrogate in a group map", "a lone surrogate in a group map's group name", _surrogate_in_group_map, 2,
         ("fr_groups_rank_0.json: groups['\\ud800'] is",)),
    Case("non-UTF-8 folder name", "a folder name that is not UTF-8 (and holds an escape sequence)", _non_utf8_folder,
         1, ("rank 3 did not enter all_reduce #3 on tp, ranks 2-3",)),
    Case("non-UTF-8 file name", "a file named like a dump whose name is not UTF-8", _non_utf8_dump, 2,
         ("several runs", "nccl_trace_rank\\udcff_<rank>")),
    Case("deeply nested description", "a deeply nested description",
         _deep_desc, 2, ("'process_group' is ('1', [[...]]) (tuple)",)),
]  # fmt: skip
