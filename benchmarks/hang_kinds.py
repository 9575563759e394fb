"""``hang-report``'s kinds at cluster scale: per kind, is the first line's kind and ranks right, and how soon it comes.

The catalogue (:mod:`tests.harness.kind_scenarios`): ten cases, one per kind and variant (never came: stuck in Python,
in a C call holding the GIL, dead; still working; a size mismatch; a skipped collective; a p2p stall; a circular wait
across three groups; all entered, none finished; did not finish), each as NCCL-format dumps of ``dp x 8`` ranks with
2,000 entries a rank (1,000 steps of a tp ``all_reduce`` and a dp ``reduce_scatter``, 24 frames an entry), pickled
as torch pickles them (protocol 2, equal strings written once), at 1,024 and 8,192 ranks. The ranks a case does not
touch share the base's files (hard links): one base per size on disk, a few files per case.

Measured per case, each in a fresh process:

* **the command** as a user runs it (``python -m nemo_rl_shim hang-report DIR``): the wall time from its start to its
  first line on stdout, that line, and, where it is run to its end (``--full-at``), its exit code, its total time and
  whether the full reading corrected the first line (``read in full, the first line is: ...``);
* **right**: the kind, variant and ranks of that first line (the quick read's, reproduced in its own process with the
  same functions, which also gives the peak memory to the first line: the process and its largest reader, max RSS)
  against the case's expected ones;
* once per size, **the unpickling floor**: ``pickle.load`` of every dump, split over as many forked readers as the
  command uses, each dump freed once loaded (``benchmarks/hang_report_scale.py`` keeps them, as the command's readers
  keep what they read; 8,192 unpickled dumps kept need more memory than this machine has).

Targets (#35): at least 95% of the cases right; the first line within 20 s at 8,192 ranks; never exit 0. The machine
is shared: its load average is recorded before and after each size.

Run: ``uv run python benchmarks/hang_kinds.py [--ranks 1024 8192] [--full-at 1024] [--full-cases ...]
[--dumps /tmp/hang-kinds]``;
writes ``benchmarks/results/hang_kinds.json``. The dumps (3.5 GB at 8,192 ranks) are deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_START = time.perf_counter()  # a child's clock starts before its imports, as a user's command does

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, environment, print_table, write_results  # noqa: E402 - after _START

__all__ = ["main", "measure_case"]

ROUNDS = 1000
SIZES = (1024, 8192)
TARGET_RIGHT = 0.95
TARGET_FIRST_S = {8192: 20.0}
#: The command is stopped here (and its first line, if any, kept).
COMMAND_BOUND_S = 1800
HEADINGS = ["kind", "right", "first line s (1,024)", "first line s (8,192)", "peak MB (8,192)", "exit codes"]


def _write_base_part(directory: str, world: int, start: int, step: int) -> None:
    from tests.harness.kind_scenarios import Layout, write_base

    write_base(Path(directory), Layout(world, ROUNDS), range(start, world, step))


def generate_base(directory: Path, world: int) -> dict[str, Any]:
    """The ranks' shared history, written once per size by two processes (skipped where already complete)."""
    done = directory / "complete.json"
    if done.exists():
        return json.loads(done.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_write_base_part, args=(str(directory), world, i, 2)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"writing the base of {world} ranks failed ({worker.exitcode})")
    facts = {
        "ranks": world,
        "entries_per_rank": 2 * ROUNDS,
        "bytes": sum(p.stat().st_size for p in directory.glob("nccl_trace_rank_*")),
        "generate_s": round(time.perf_counter() - start, 1),
    }
    done.write_text(json.dumps(facts))
    return facts


def _child_first(directory: str) -> None:
    """In a fresh process: the quick first line, as the command finds it (``hang_report.quick_first_line``); JSON
    facts."""
    from nemo_rl_shim.hang_report import quick_first_line

    found = quick_first_line(directory)
    first_s = time.perf_counter() - _START
    readers = resource.getrusage(resource.RUSAGE_CHILDREN)
    facts: dict[str, Any] = {"first_s": round(first_s, 2), "peak_mb": _own_peak_mb()}
    facts["peak_reader_mb"] = round(readers.ru_maxrss / 1024, 1)
    if found is not None:
        facts.update(found.to_json())
    print(json.dumps(facts))
    sys.stdout.flush()
    os._exit(0)  # as the command does not: the measure ends at the first line


def _own_peak_mb() -> float | None:
    """This process's peak resident memory since it started (``VmHWM``: ``ru_maxrss`` would keep the peak of the
    process that started it, from before its ``exec``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 1024, 1)


def _child_floor(directory: str) -> None:
    """In a fresh process: ``pickle.load`` of every dump on the command's number of forked readers."""
    import gc

    from nemo_rl_shim.hang_report.folder import find_run
    from nemo_rl_shim.hang_report.loader import reader_count

    paths = [path for _, path in sorted(find_run(Path(directory)).dumps.items())]
    readers = reader_count(len(paths))
    gc.disable()
    start = time.perf_counter()
    children = []
    for share in (paths[i::readers] for i in range(readers)):
        pid = os.fork()
        if pid == 0:
            for path in share:  # each freed once loaded: 8,192 unpickled dumps kept need more than 24 GB
                with open(path, "rb") as handle:
                    pickle.load(handle)
            os._exit(0)
        children.append(pid)
    codes = [os.waitpid(pid, 0)[1] for pid in children]
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": round(wall, 2), "readers": readers, "files": len(paths), "exit_codes": codes,
                      "reader_cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}))  # fmt: skip


def _run_child(kind: str, directory: Path, bound_s: float) -> dict[str, Any]:
    command = [sys.executable, __file__, f"--child-{kind}", str(directory)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=bound_s, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"still running after {bound_s} s (killed)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def run_command(directory: Path, to_the_end: bool, bound_s: float = COMMAND_BOUND_S) -> dict[str, Any]:
    """The command as a user runs it: when its first line comes, and (``to_the_end``) its exit code and total time."""
    command = [sys.executable, "-m", "nemo_rl_shim", "hang-report", str(directory)]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    facts: dict[str, Any] = {}
    try:
        first = process.stdout.readline() if process.stdout else ""
        facts["first_s"] = round(time.perf_counter() - start, 2)
        facts["line"] = first.rstrip("\n")
        if not to_the_end:
            process.kill()
            process.wait(30)
            facts["ran_to_the_end"] = False
            return facts
        rest, err = process.communicate(timeout=max(1.0, bound_s - (time.perf_counter() - start)))
        facts.update(
            ran_to_the_end=True,
            exit_code=process.returncode,
            total_s=round(time.perf_counter() - start, 2),
            corrected=next((line for line in rest.splitlines() if line.startswith("read in full, ")), None),
            stderr=err.strip()[-300:],
        )
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
        facts.update(ran_to_the_end=False, error=f"still running after {bound_s} s (killed)")
    return facts


def measure_case(case: str, world: int, base: Path, root: Path, to_the_end: bool) -> dict[str, Any]:
    from tests.harness.kind_scenarios import EXPECTED, Layout, expected_ranks, write_case

    layout = Layout(world, ROUNDS)
    directory = root / f"ranks{world}" / case
    shutil.rmtree(directory, ignore_errors=True)
    write_case(case, directory, layout, base=base)
    quick = _run_child("first", directory, COMMAND_BOUND_S)
    command = run_command(directory, to_the_end)
    name, variant = EXPECTED[case]
    ranks = list(expected_ranks(case, layout))
    right = (quick.get("kind"), quick.get("variant"), quick.get("ranks")) == (name, variant, ranks)
    right = right and quick.get("line") == command.get("line")  # the command printed that very line first
    shutil.rmtree(directory, ignore_errors=True)
    return {"case": case, "expected": [name, variant, ranks], "right": right, "quick": quick, "command": command}


def _table(results: dict[int, dict[str, Any]]) -> list[list[Any]]:
    from tests.harness.kind_scenarios import CASES

    rows = []
    for case in CASES:
        runs = [results[w]["cases"][case] for w in results if case in results[w]["cases"]]
        first = {w: results[w]["cases"][case]["command"].get("first_s") for w in results if case in results[w]["cases"]}
        peak = results.get(8192, {}).get("cases", {}).get(case, {}).get("quick", {})
        codes = sorted({r["command"]["exit_code"] for r in runs if r["command"].get("ran_to_the_end")})
        rows.append([
            case, f"{sum(r['right'] for r in runs)}/{len(runs)}", first.get(1024, "-"), first.get(8192, "-"),
            f"{peak.get('peak_mb', '-')} / {peak.get('peak_reader_mb', '-')}" if peak else "-",
            ", ".join(map(str, codes)) or "not run to the end",
        ])  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--cases", nargs="+", default=None)
    parser.add_argument("--full-at", type=int, nargs="*", default=[1024], help="sizes whose command runs to its end")
    parser.add_argument("--full-cases", nargs="*", default=None, help="of those, only these cases (default: all)")
    parser.add_argument("--dumps", type=Path, default=Path("/tmp/hang-kinds"))
    parser.add_argument("--keep", action="store_true", help="keep the base dumps")
    parser.add_argument("--merge", action="store_true", help="keep the other sizes of the last run's raw results")
    parser.add_argument("--child-first", dest="child_first")
    parser.add_argument("--child-floor", dest="child_floor")
    args = parser.parse_args(argv)
    if args.child_first:
        _child_first(args.child_first)
    if args.child_floor:
        _child_floor(args.child_floor)
        return 0
    from tests.harness.kind_scenarios import CASES

    cases = args.cases or list(CASES)
    results: dict[int, dict[str, Any]] = {}
    environment_before = environment()
    for world in args.ranks:
        base = args.dumps / f"ranks{world}" / "base"
        facts: dict[str, Any] = {"load_before": list(os.getloadavg()), "base": generate_base(base, world)}
        facts["floor"] = _run_child("floor", base, COMMAND_BOUND_S)
        facts["cases"] = {}
        for case in cases:
            to_the_end = world in args.full_at and (args.full_cases is None or case in args.full_cases)
            facts["cases"][case] = measure_case(case, world, base, args.dumps, to_the_end)
            found = facts["cases"][case]
            print(f"{world} {case}: right={found['right']} first={found['command'].get('first_s')} s "
                  f"{found['command'].get('line', '')[:160]}", flush=True)  # fmt: skip
            partial = args.dumps / "partial.json"  # what was measured so far, should a later case fail
            partial.write_text(json.dumps({**results, world: facts}, indent=1, default=str))
        facts["load_after"] = list(os.getloadavg())
        results[world] = facts
        if not args.keep:
            shutil.rmtree(args.dumps / f"ranks{world}", ignore_errors=True)
    raw = ROOT / "benchmarks" / "results" / "raw" / "hang_kinds.json"
    if args.merge and raw.exists():  # the sizes measured in an earlier run, each with its own load
        earlier = json.loads(raw.read_text()).get("results", {})
        results = {**{int(w): facts for w, facts in earlier.items() if int(w) not in results}, **results}
        results = dict(sorted(results.items()))
    every = [c for r in results.values() for c in r["cases"].values()]
    right = sum(c["right"] for c in every) / max(1, len(every))
    exits = [c["command"]["exit_code"] for c in every if c["command"].get("ran_to_the_end")]
    met = right >= TARGET_RIGHT and 0 not in exits
    for world, limit in TARGET_FIRST_S.items():
        if world in results:
            firsts = [c["command"].get("first_s") or float("inf") for c in results[world]["cases"].values()]
            met = met and max(firsts) <= limit
    summary = {
        "benchmark": "hang_kinds",
        "environment_before": environment_before,
        "environment_after": environment(),
        "right_share": round(right, 3),
        "cases_right": f"{sum(c['right'] for c in every)}/{len(every)}",
        "exit_codes": sorted(set(exits)),
        "meets_targets": met,
        "results": results,
    }
    print_table("hang-report's kinds: first line right, and how soon", HEADINGS, _table(results))
    path = write_results("hang_kinds", summary)
    print(f"right: {summary['cases_right']}; targets met: {met}; {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
