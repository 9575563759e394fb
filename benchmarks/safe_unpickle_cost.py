"""What reading dumps as untrusted input costs: the plain-data unpickler and the checks, against ``pickle.load``.

On the same files (the layout of ``hang_report_scale.py``: NCCL-format dumps of 2,000 entries, three stack frames
each), in this process, each file's bytes already in memory:

* ``pickle.load``: the floor (what the command did before #27, and runs code);
* :func:`~nemo_rl_shim.hang_report.safe_pickle.load_plain`: the C unpickler with ``find_class`` refusing
  every name;
* :func:`~nemo_rl_shim.hang_report.dump_format.summarize`: reading, checking every field it reads, and
  reducing one dump (what each reader process does per file).

Each the median of :data:`REPEATS` passes over every file, in CPU seconds of this process (the machine is shared:
wall time follows its load), the ways interleaved. Run: ``uv run python benchmarks/safe_unpickle_cost.py
[--ranks 64]``; writes ``benchmarks/results/safe_unpickle_cost.json``.
"""

from __future__ import annotations

import argparse
import gc
import io
import pickle
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import environment, median, print_table, write_results

__all__ = ["main", "measure"]

REPEATS = 9


def _pass(files: dict[Path, bytes], read: Any) -> float:
    gc.disable()
    try:
        start = time.process_time()
        for path, data in files.items():
            read(path, data)
        return time.process_time() - start
    finally:
        gc.enable()


def measure(directory: Path) -> dict[str, Any]:
    """CPU seconds per pass over every dump in ``directory``, each way of reading it, and its ratio to the floor."""
    from nemo_rl_shim.hang_report import dump_format
    from nemo_rl_shim.hang_report.safe_pickle import load_plain

    paths = sorted(directory.glob("nccl_trace_rank_*"), key=lambda p: int(p.name.rpartition("_")[2]))
    files = {path: path.read_bytes() for path in paths}
    ways = {
        "pickle.load": lambda _path, data: pickle.load(io.BytesIO(data)),
        "load_plain": lambda _path, data: load_plain(io.BytesIO(data)),
        "summarize": lambda path, _data: dump_format.summarize(path, int(path.name.rpartition("_")[2])),
    }
    runs: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for repeat in range(REPEATS):  # interleaved, each pass in turn first: the machine's load drifts
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            runs[name].append(_pass(files, ways[name]))
    seconds = {name: round(median(values), 3) for name, values in runs.items()}
    floor = seconds["pickle.load"]
    return {
        "files": len(files),
        "bytes": sum(len(d) for d in files.values()),
        "cpu_seconds_per_pass": seconds,
        "ratio_to_pickle_load": {name: round(value / floor, 3) for name, value in seconds.items()},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--dumps", type=Path, default=Path("/tmp/hang-report-scale"))
    args = parser.parse_args(argv)
    from benchmarks.hang_report_scale import generate

    directory = args.dumps / str(args.ranks)
    before = environment()
    dumps = generate(directory, args.ranks)
    facts = measure(directory)
    ratios = facts["ratio_to_pickle_load"]
    rows = [(name, f"{s:.3f}", f"{ratios[name]:.2f}x") for name, s in facts["cpu_seconds_per_pass"].items()]
    print_table("reading untrusted dumps", ["way", f"CPU s per pass ({facts['files']} dumps)", "vs pickle.load"], rows)
    write_results(
        "safe_unpickle_cost",
        {"benchmark": "safe_unpickle_cost", "environment_before": before, "dumps": dumps, **facts,
         "environment_after": environment()},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
