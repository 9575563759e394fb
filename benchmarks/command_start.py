"""How long ``nemo-rl-shim hang-report`` takes to start, against a bare Python start, before and after #34.

Four commands, each a fresh process, on the same interpreter:

* the floor: ``python -c pass``;
* ``python -c "import nemo_rl_shim"``;
* ``nemo-rl-shim hang-report --help``: the command's start, argument parsing included, nothing read;
* ``nemo-rl-shim hang-report DIR`` on a small folder: 4 ranks' NCCL-format dumps of a sub-group stall
  (:func:`tests.harness.nccl_scenarios.build`, ``sub_group_stall``; exit 1, naming rank 3), as a user runs it.

Each is run for two checkouts of the library: this one, and ``--before`` (a git ref, default
:data:`DEFAULT_BEFORE`, the commit before the rooms; checked out into a temporary worktree), put first on
``PYTHONPATH`` so that the console script's ``import nemo_rl_shim`` takes it. Runs alternate between the
checkouts and the commands (ABAB), :data:`RUNS` of each after one discarded warm-up. Reported per command:
the median wall time, the median CPU time of the child (user + system, ``resource.getrusage``; less sensitive
to the shared machine's load than the wall time), each over the floor's, and, from one more run under
``PYTHONPROFILEIMPORTTIME=1`` (``-X importtime``), how many modules it imported and whether torch was among them.

Target: after, no torch module imported by ``import nemo_rl_shim`` nor by ``hang-report DIR``, and
``import nemo_rl_shim`` within :data:`CPU_TARGET` x the floor's CPU time.

Run: ``uv run python benchmarks/command_start.py [--before REF]``; writes ``benchmarks/results/command_start.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, environment, median, print_table, write_results

__all__ = ["COMMANDS", "main", "measure"]

RUNS = 15
BOUND_S = 120.0
CPU_TARGET = 2.0
#: The commit before the rooms (#34): the library as it was, every export imported eagerly.
DEFAULT_BEFORE = "8f6e3f4"
#: The console script, beside this interpreter (what ``uv sync`` installs).
SCRIPT = str(Path(sys.executable).with_name("nemo-rl-shim"))
#: name -> the command (``{dir}``: the dump folder).
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import nemo_rl_shim": [sys.executable, "-c", "import nemo_rl_shim"],
    "hang-report --help": [SCRIPT, "hang-report", "--help"],
    "hang-report DIR": [SCRIPT, "hang-report", "{dir}"],
}


def _env(source: Path, *, importtime: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(source), env.get("PYTHONPATH", "")) if p)
    if importtime:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    return env


def _argv(name: str, directory: Path) -> list[str]:
    return [part.format(dir=directory) for part in COMMANDS[name]]


def _once(name: str, source: Path, directory: Path) -> dict[str, float]:
    """One run: wall and CPU seconds of the child (its exit code checked: 0, or 1 for the stall's report)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        _argv(name, directory), env=_env(source), cwd=source, capture_output=True, timeout=BOUND_S, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    expected = 1 if name == "hang-report DIR" else 0
    if done.returncode != expected:
        raise RuntimeError(f"{name} ({source}) exited {done.returncode}: {done.stderr.decode()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def _imports(name: str, source: Path, directory: Path) -> dict[str, Any]:
    """The modules one run imports (``-X importtime``): how many, and how many of torch's."""
    argv, env = _argv(name, directory), _env(source, importtime=True)
    done = subprocess.run(argv, env=env, cwd=source, capture_output=True, text=True, timeout=BOUND_S, check=False)
    modules = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = [m for m in modules if m and m != "imported package"]
    torch = [m for m in modules if m == "torch" or m.startswith("torch.")]
    return {"modules": len(modules), "torch_modules": len(torch)}


def measure(sources: dict[str, Path], directory: Path, runs: int = RUNS) -> dict[str, Any]:
    """``{checkout: {command: facts}}``, the runs alternating between checkouts and commands."""
    samples: dict[str, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in COMMANDS} for c in sources}
    order = list(sources.items())
    for run in range(runs + 1):
        for checkout, source in order if run % 2 == 0 else order[::-1]:
            for name in COMMANDS if run % 2 == 0 else list(COMMANDS)[::-1]:
                sample = _once(name, source, directory)
                if run:  # the first round warms the page cache
                    samples[checkout][name].append(sample)
    results: dict[str, Any] = {}
    for checkout, source in sources.items():
        floor = samples[checkout]["python -c pass"]
        floor_wall, floor_cpu = median(s["wall_s"] for s in floor), median(s["cpu_s"] for s in floor)
        results[checkout] = {}
        for name, rows in samples[checkout].items():
            wall, cpu = median(s["wall_s"] for s in rows), median(s["cpu_s"] for s in rows)
            results[checkout][name] = {
                "median_wall_s": round(wall, 3),
                "median_cpu_s": round(cpu, 3),
                "wall_over_floor": round(wall / floor_wall, 2),
                "cpu_over_floor": round(cpu / floor_cpu, 2),
                **_imports(name, source, directory),
                "runs": rows,
            }
    return results


def _scenario(directory: Path) -> Path:
    from tests.harness.nccl_scenarios import build

    return build("sub_group_stall", directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git ref of the library to compare with")
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args(argv)
    env_before = environment()
    with tempfile.TemporaryDirectory(prefix="command-start-") as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=ROOT, check=True, timeout=120)
        try:
            directory = _scenario(Path(tmp) / "dumps")
            results = measure({"before": old, "after": ROOT}, directory, args.runs)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False, timeout=120)
            shutil.rmtree(old, ignore_errors=True)
    rows = [
        [name, *(f"{results[c][name]['median_wall_s']:.3f} ({results[c][name]['wall_over_floor']}x)" for c in results),
         *(f"{results[c][name]['median_cpu_s']:.3f} ({results[c][name]['cpu_over_floor']}x)" for c in results),
         *(f"{results[c][name]['modules']} / {results[c][name]['torch_modules']}" for c in results)]
        for name in COMMANDS
    ]  # fmt: skip
    print_table(
        f"command start, median of {args.runs} fresh processes (x: over python -c pass)",
        ["command", "wall before", "wall after", "CPU before", "CPU after", "modules / torch's before", "after"],
        rows,
    )
    after = results["after"]
    met = (
        after["import nemo_rl_shim"]["cpu_over_floor"] <= CPU_TARGET
        and after["hang-report DIR"]["torch_modules"] == 0
        and after["import nemo_rl_shim"]["torch_modules"] == 0
    )
    path = write_results(
        "command_start",
        {"benchmark": "command_start", "before": args.before, "environment_before": env_before,
         "environment_after": environment(), "runs": args.runs, "cpu_target": CPU_TARGET, "meets_target": met,
         "results": results},
    )  # fmt: skip
    print(f"\nwrote {path}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
