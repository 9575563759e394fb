"""Each hostile input of #33's "Why", read by the real command under a 6 GiB address-space cap: its exit code, its
wall time and its peak memory, with the code of this checkout and, with ``--before DIR``, another checkout's.

The inputs are :data:`tests.harness.hostile_inputs.CASES` (NCCL-format dumps made hostile) and three sets of
torch's own Gloo dumps from real ranks (:mod:`tests.ranks.torch_fr`, 4 ranks each): a healthy run with rank 3's dump
removed, the sub-group stall with the stalled rank 3's dump removed, and a run in which every rank waits inside a
collective (``crossed``). Each runs through :func:`tests.harness.hostile_inputs.run_capped`: a fresh interpreter
under ``RLIMIT_AS`` = 6 GiB, wall time of the command, peak resident memory of the command and its reader processes
(``RUSAGE_CHILDREN``). Targets (#33): exit as the case says, within 30 s and 1.5 GB.

Run: ``uv run python benchmarks/hang_report_hostile.py [--before DIR]`` (``DIR``: a checkout, e.g. ``git archive
<ref> | tar -x -C DIR``); writes ``benchmarks/results/hang_report_hostile.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import environment, print_table, write_results

__all__ = ["gloo_cases", "main"]

HEADINGS = ["input", "exit (expected)", "s", "peak MB", "line", "before: exit", "before: s", "before: MB"]


def _gloo(base: Path) -> dict[str, Path]:
    """Real Gloo ranks' dumps of three scenarios, under ``base``."""
    from nemo_rl_shim.cli.preflight.spawn import free_port, spawn_ranks

    folders = {}
    # a healthy run's collectives get a long timeout (a loaded machine must not make them time out)
    for scenario, timeout_s, extra in (("healthy", 60, {"rounds": 3}), ("sub_group_stall", 3, {}), ("crossed", 3, {})):
        directory = base / scenario
        directory.mkdir(parents=True)
        params = {"scenario": scenario, "timeout_s": timeout_s, "grace_s": 3, "meet_port": free_port(), **extra}
        env = {"TORCH_FR_DUMP_TEMP_FILE": str(directory / "nccl_trace_rank_"), "CUDA_VISIBLE_DEVICES": ""}
        results = spawn_ranks(
            "tests.ranks.torch_fr:run_scenario", params, world_size=4, timeout_s=300, env=env, check=False
        )
        dumps = sorted(p.name for p in directory.iterdir())
        if len(dumps) != 4:
            raise RuntimeError(f"{scenario}: the ranks left {dumps}; errors {[r.error for r in results]}")
        folders[scenario] = directory
    return folders


def gloo_cases(base: Path) -> list[tuple[str, list[str], int, str]]:
    """``(name, arguments, expected exit, expected start of the line)`` of the real Gloo ranks' cases."""
    folders = _gloo(base)
    (folders["healthy"] / "nccl_trace_rank_3").unlink()
    (folders["sub_group_stall"] / "nccl_trace_rank_3").unlink()
    return [
        ("Gloo: top rank's dump missing (healthy run)", ["hang-report", str(folders["healthy"])], 1,
         "cannot tell whether every rank dumped"),
        ("Gloo: the hung top rank's dump missing", ["hang-report", str(folders["sub_group_stall"])], 1,
         "cannot tell whether every rank dumped"),
        ("Gloo: every rank waits in a collective", ["hang-report", str(folders["crossed"])], 1,
         "cannot tell whether every rank dumped"),
        ("Gloo: the same, --world 4", ["hang-report", "--world", "4", str(folders["crossed"])], 1,
         "cannot tell whether ranks 0-3 finished all_reduce #1"),
    ]  # fmt: skip


def _measure(args: list[str], before: Path | None) -> dict[str, Any]:
    from tests.harness.hostile_inputs import run_capped

    now = run_capped(*args)
    found = {"code": now.code, "seconds": now.seconds, "peak_mb": now.peak_mb, "line": now.line[:300]}
    if before is not None:
        then = run_capped(*args, root=before)
        found["before"] = {"code": then.code, "seconds": then.seconds, "peak_mb": then.peak_mb,
                           "line": (then.line or then.err.strip()[-200:])[:300]}  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    from tests.harness.hostile_inputs import CASES, PEAK_MB, SECONDS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout, measured the same way")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="hang-report-hostile-"))
    results: dict[str, Any] = {}
    try:
        gloo = gloo_cases(base / "gloo")  # first: the ranks start before the machine is busy with the rest
        cases = []
        for index, case in enumerate(CASES):
            folder = base / f"case{index}"
            folder.mkdir()
            cases.append((case.name, case.build(folder), case.code, case.words[0]))
        cases += gloo
        for name, command, code, words in cases:
            found = _measure(command, args.before)
            found["expected"] = code
            found["met"] = found["code"] == code and words in found["line"] and found["seconds"] < SECONDS
            found["met"] = found["met"] and found["peak_mb"] < PEAK_MB
            results[name] = found
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = []
    for name, found in results.items():
        then = found.get("before", {})
        now = [name, f"{found['code']} ({found['expected']})", found["seconds"], found["peak_mb"], found["line"][:70]]
        rows.append([*now, then.get("code", "-"), then.get("seconds", "-"), then.get("peak_mb", "-")])
    print_table("hang-report on hostile inputs, under a 6 GiB address-space cap", HEADINGS, rows)
    path = write_results(
        "hang_report_hostile",
        {"benchmark": "hang_report_hostile", "environment": environment(), "before": str(args.before or ""),
         "targets": {"seconds": SECONDS, "peak_mb": PEAK_MB}, "all_met": all(f["met"] for f in results.values()),
         "results": results},
    )  # fmt: skip
    print(f"\nwrote {path}")
    return 0 if all(f["met"] for f in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
