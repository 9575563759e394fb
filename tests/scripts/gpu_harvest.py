"""Harvest real NCCL Flight Recorder dumps, each beside the truth of what did not finish: test fixtures for the report.

Run by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_harvest OUT`` on a GPU machine; ``--rehearse`` runs
the same scenarios on Gloo, on any machine (CI runs it: ``tests/gpu_check/``). Exit 0 when every scenario that ran
left a whole dump and its ``truth.json``, 1 when one did not, 2 on bad input (no CUDA device without ``--rehearse``).

Per scenario (``tests/ranks/harvest.py``: :data:`~tests.ranks.harvest.SCENARIOS`), one fresh rank on the GPU (two
Gloo ranks in the rehearsal, the second standing in for the busy GPU): completed ops, then an all_reduce that cannot
finish, timed out a few seconds in by NCCL's watchdog, which writes the dump; the rank ends as soon as the dump is
whole. Torch's recorder is switched on by its own variables alone (``TORCH_FR_BUFFER_SIZE``,
``TORCH_NCCL_DUMP_ON_TIMEOUT``, ``TORCH_FR_DUMP_TEMP_FILE``; no shim), so the files are torch's own, under torch's
own name (``nccl_trace_rank_<rank>``).

Layout: ``OUT/<torch version>/<scenario>/`` holds the dump(s) and ``truth.json`` (the op that did not finish, its
group, the kind, and the first line the report must start with); ``OUT/<torch version>/README.md`` says where and how
they were made, and ``OUT/<torch version>/harvest.json`` holds the run's summary. Commit a GPU run's folder as
``tests/fixtures/real_nccl/<torch version>/`` (``docs/testing.md``); never a rehearsal's (its truth says so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DUMP_PREFIX", "TRUTH", "ScenarioRun", "expected_first_line", "main", "plan", "truth_of"]

#: torch's own dump-file name, before the rank.
DUMP_PREFIX = "nccl_trace_rank_"
#: The truth beside each scenario's dumps.
TRUTH = "truth.json"
SUMMARY = "harvest.json"
#: A kind's words at the start of the report's first line (``nemo-rl-shim hang-report``'s kinds).
KIND_WORDS = {"all_entered_none_finished": "all entered, none finished", "never_came": "never came"}
_RANK_TARGET = "tests.ranks.harvest:harvest_rank"
_GIT_BOUND_S = 10


@dataclass
class ScenarioRun:
    """One scenario's outcome: ``harvested``, ``failed`` (no whole dump, or no truth) or ``skipped`` (``why``)."""

    name: str
    outcome: str
    why: str = ""
    wall_s: float = 0.0
    truth: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        rank = (self.truth or {}).get("rank", {})
        return {
            "scenario": self.name,
            "outcome": self.outcome,
            "why": self.why,
            "wall_s": round(self.wall_s, 1),
            "dump_after_issue_s": rank.get("dump_after_issue_s"),
            "exit_to_reaped_s": rank.get("exit_to_reaped_s"),
            "first_line": (self.truth or {}).get("first_line"),
        }


def _machine(rehearse: bool) -> dict[str, Any]:
    import torch

    cuda = not rehearse and torch.cuda.is_available() and torch.cuda.device_count() > 0
    nccl = None
    if cuda:
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    return {
        "torch": torch.__version__,
        "nccl": nccl,
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
    }


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=_GIT_BOUND_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _has_nccl2() -> bool:
    import torch.distributed.distributed_c10d as c10d

    return hasattr(c10d, "_create_nccl2_process_group")  # torch 2.15: plain "nccl" is NCCL2


def plan(names: list[str] | None, rehearse: bool) -> list[tuple[str, str]]:
    """``(scenario, why it is skipped or "")`` for each scenario asked for (default: all), in order."""
    import torch

    from tests.ranks.harvest import SCENARIOS

    nccl2 = _has_nccl2()
    out = []
    for name in names or list(SCENARIOS):
        scenario = SCENARIOS[name]
        why = ""
        if rehearse and not scenario.gloo_runs:
            why = f"the Gloo rehearsal cannot run it: {scenario.gloo_cannot}"
        elif scenario.needs_nccl2 and not nccl2:
            why = f"torch {torch.__version__} has no NCCL2 (torch 2.15's plain 'nccl'): 'nccl' is the stock backend"
        out.append((name, why))
    return out


def _label(desc: str) -> str:
    """How the report names a group from torch's description: ``default_pg`` is ``default``."""
    return "default" if desc == "default_pg" else desc


def expected_first_line(held: dict[str, Any], group: dict[str, Any], world_size: int) -> tuple[str, str, int]:
    """The kind, the start of the first line the report must give, and the culprit rank, from the held op as torch
    recorded it when it was issued: on one GPU every member entered and none finished; in the Gloo rehearsal rank 1
    (the partner standing in for the busy GPU) never entered."""
    op = str(held.get("profiling_name", "?")).split(":", 1)[-1]
    where = f"{op} #{held.get('collective_seq_id')} on {_label(str(group.get('desc', '')))}"
    if world_size == 1:
        kind = "all_entered_none_finished"
        return kind, f"{KIND_WORDS[kind]}: rank 0 did not finish {where}", 0
    kind = "never_came"
    return kind, f"{KIND_WORDS[kind]}: rank 1 did not enter {where}", 1


def truth_of(
    name: str, facts: dict[str, Any], machine: dict[str, Any], env: dict[str, str], world: int, rehearse: bool
) -> dict[str, Any]:
    """The ``truth.json`` of one scenario, from the rank's facts (torch's record of the op at the moment it was
    issued) and the machine's."""
    from tests.ranks.harvest import SCENARIOS

    scenario = SCENARIOS[name]
    held, group = facts.get("held") or {}, facts.get("group") or {}
    kind, first_line, culprit = expected_first_line(held, group, world)
    issued, seen = facts.get("issued_s"), facts.get("dump_complete_s")
    return {
        "scenario": name,
        "what": scenario.what,
        "made_by": "python -m tests.scripts.gpu_harvest" + (" --rehearse" if rehearse else ""),
        "rehearsal": rehearse,
        "real_nccl": not rehearse,
        "backend": "gloo" if rehearse else scenario.backend,
        "backend_class": facts.get("backend_class"),
        "recorder": facts.get("recorder"),
        "torch": machine["torch"],
        "nccl": machine["nccl"],
        "device": machine["device"],
        "world_size": world,
        "env": {k: v for k, v in sorted(env.items()) if k.startswith("TORCH_") and not k.endswith("_TEMP_FILE")},
        "completed_before": facts.get("completed_before"),
        "unfinished": {"rank": 0, "record": held, "group": group},
        "culprit": {"rank": culprit, "how": "entered, did not finish" if world == 1 else "never entered"},
        "kind": kind,
        "first_line": first_line,
        "compare": "the report's first line starts with first_line",
        "gloo_cannot": scenario.gloo_cannot if rehearse else "",
        "rank": {
            "issued_s": issued,
            "dump_complete_s": seen,
            "dump_after_issue_s": round(seen - issued, 3) if seen is not None and issued is not None else None,
            "ended_s": facts.get("ended_s"),
            "dump_bytes": facts.get("dump_bytes"),
            "held_outcome": facts.get("held_outcome"),
        },
    }


def _env(folder: Path, scenario_env: dict[str, str]) -> dict[str, str]:
    prefix = str(folder / DUMP_PREFIX)
    return {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        **scenario_env,
    }


def _whole_dumps(folder: Path, world: int) -> list[str]:
    from tests.ranks.harvest import dump_complete

    return [f"{DUMP_PREFIX}{r}" for r in range(world) if dump_complete(folder / f"{DUMP_PREFIX}{r}") is not None]


def _run_one(name: str, root: Path, args: argparse.Namespace, machine: dict[str, Any]) -> ScenarioRun:
    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
    from tests.ranks.harvest import SCENARIOS

    scenario = SCENARIOS[name]
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    world = 2 if args.rehearse else 1
    facts_path = root / f".{name}.facts.json"
    facts_path.unlink(missing_ok=True)
    env = _env(folder, dict(scenario.env))
    params = {
        "scenario": name, "device": "cpu" if args.rehearse else "cuda", "backend": scenario.backend,
        "timeout_s": args.timeout_s, "hold_s": args.hold_s, "bound_s": args.dump_bound_s, "facts": str(facts_path),
    }  # fmt: skip
    start = time.monotonic()
    results = spawn_ranks(_RANK_TARGET, params, world_size=world, timeout_s=args.rank_bound_s, env=env, check=False)
    wall, reaped = time.monotonic() - start, time.time()
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    facts_path.unlink(missing_ok=True)
    for r in results:
        tail = " | ".join(line for line in r.output.splitlines()[-4:] if line.strip())[-400:]
        print(f"  {name} rank {r.rank}: exit {r.returncode}{' (timed out)' if r.timed_out else ''}; {tail}", flush=True)
    if facts.get("cannot"):  # what this torch's Gloo cannot do, found by trying it in the rank
        shutil.rmtree(folder, ignore_errors=True)
        return ScenarioRun(name, "skipped", f"Gloo on torch {machine['torch']} cannot: {facts['cannot']}", wall)
    dumps = _whole_dumps(folder, world)
    if not facts.get("held") or len(dumps) < world:
        code = results[0].returncode
        why = f"rank 0 exit {code}, {len(dumps)} of {world} whole dumps, facts {'read' if facts else 'missing'}"
        return ScenarioRun(name, "failed", why, wall)
    if facts.get("gpu_busy_at_dump") is False:
        why = f"the GPU's {args.hold_s:g} s sleep ended before the dump was whole: the op may read finished"
        return ScenarioRun(name, "failed", f"{why} (raise --hold-s)", wall)
    truth = truth_of(name, facts, machine, env, world, args.rehearse)
    exit_s = round(reaped - facts["exit_epoch"], 2) if "exit_epoch" in facts else None
    truth["rank"].update(exit=results[0].returncode, wall_s=round(wall, 2), exit_to_reaped_s=exit_s)
    truth["rank"]["gpu_busy_at_dump"] = facts.get("gpu_busy_at_dump")
    truth["dumps"] = dumps
    (folder / TRUTH).write_text(json.dumps(truth, indent=2) + "\n")
    return ScenarioRun(name, "harvested", "", wall, truth)


def _readme(machine: dict[str, Any], runs: list[ScenarioRun], args: argparse.Namespace, argv: list[str]) -> str:
    if args.rehearse:
        title = f"# REHEARSAL on Gloo, torch {machine['torch']}: NOT real NCCL dumps (never commit these)"
        how = (
            "Two Gloo ranks per scenario on CPU: rank 1 stands in for the busy GPU (it runs the completed ops, then "
            "never enters the held all_reduce); rank 0's all_reduce times out and rank 0 writes its dump with torch's "
            "own function, standing in for NCCL's dump on timeout."
        )
    else:
        title = f"# Real NCCL dumps: torch {machine['torch']}, NCCL {machine['nccl']}, {machine['device']}"
        how = (
            "One rank on one GPU per scenario, a fresh process each: completed ops, then an all_reduce queued behind "
            "torch.cuda._sleep, timed out by NCCL's watchdog, which wrote the dump (TORCH_NCCL_DUMP_ON_TIMEOUT); the "
            "rank ended as soon as the dump was whole."
        )
    lines = [
        title,
        "",
        f"Made by `python -m tests.scripts.gpu_harvest {' '.join(argv)}` (`scripts/gpu_check.sh`), "
        f"{machine['date_utc']}, commit {machine['commit'] or 'unknown (no git here)'}.",
        f"Machine: {machine['device']} ({machine['cuda_devices']} CUDA devices), torch {machine['torch']}, "
        f"NCCL {machine['nccl'] or '-'}, {machine['implementation']} {machine['python']}, {machine['platform']}.",
        "",
        how,
        f"Group timeout {args.timeout_s:g} s; GPU sleep {args.hold_s:g} s; each scenario's ranks bounded at "
        f"{args.rank_bound_s:g} s. Torch's recorder on through TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
        "and TORCH_FR_DUMP_TEMP_FILE=<folder>/nccl_trace_rank_ (no shim). Each folder's truth.json: the op that did "
        "not finish as torch recorded it when it was issued (read in the rank, not from the dump), its group, the "
        "kind, and the first line the report must start with.",
        "",
        "| scenario | outcome | rank wall s | dump after issue s | exit to reaped s | first line must start |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        row = run.row()
        outcome = run.outcome + (f": {run.why}" if run.why else "")
        lines.append(
            f"| {run.name} | {outcome} | {row['wall_s']} | {row['dump_after_issue_s']} | {row['exit_to_reaped_s']} | "
            f"{row['first_line'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _table(runs: list[ScenarioRun]) -> str:
    width = max(len(r.name) for r in runs) if runs else 8
    out = [f"{'scenario'.ljust(width)}  {'outcome':9}  {'wall s':>6}  {'dump s':>6}  {'end s':>5}  why / first line"]
    for run in runs:
        row = run.row()
        after = "-" if row["dump_after_issue_s"] is None else f"{row['dump_after_issue_s']:.1f}"
        end = "-" if row["exit_to_reaped_s"] is None else f"{row['exit_to_reaped_s']:.1f}"
        line = f"{run.name.ljust(width)}  {run.outcome:9}  {run.wall_s:6.1f}  {after:>6}  {end:>5}"
        out.append(f"{line}  {run.why or row['first_line']}")
    return "\n".join(out)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    from tests.ranks.harvest import SCENARIOS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write <torch version>/<scenario>/ under")
    parser.add_argument("--rehearse", action="store_true", help="Gloo on CPU: this harvest's logic without a GPU")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="these scenarios (default: all)")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="the held group's timeout (default 3)")
    parser.add_argument("--hold-s", type=float, default=20.0, help="GPU sleep the all_reduce waits behind (default 20)")
    parser.add_argument("--dump-bound-s", type=float, default=30.0, help="rank 0's wait for its dump (default 30)")
    parser.add_argument("--rank-bound-s", type=float, default=90.0, help="each scenario's ranks' bound (default 90)")
    parser.add_argument("--jobs", type=int, default=1, help="scenarios at once (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _arguments(argv)
    import torch

    if not args.rehearse and torch.cuda.device_count() < 1:
        print(f"gpu_harvest: needs a CUDA device, found {torch.cuda.device_count()}; --rehearse runs it on Gloo")
        return 2
    machine = _machine(args.rehearse)
    root = args.out / machine["torch"]
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    planned = plan(args.only, args.rehearse)
    todo = [name for name, why in planned if not why]
    print(f"gpu_harvest: {len(todo)} scenarios into {root} ({'Gloo rehearsal' if args.rehearse else 'NCCL'})")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = dict(zip(todo, pool.map(lambda name: _run_one(name, root, args, machine), todo), strict=True))
    runs = [done[name] if not why else ScenarioRun(name, "skipped", why) for name, why in planned]
    summary = {"machine": machine, "argv": argv, "scenarios": [run.row() for run in runs]}
    (root / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    (root / "README.md").write_text(_readme(machine, runs, args, argv))
    print(_table(runs))
    failed = [run.name for run in runs if run.outcome == "failed"]
    harvested = sum(run.outcome == "harvested" for run in runs)
    print(f"gpu_harvest: {harvested} harvested, {len(failed)} failed, {len(runs) - harvested - len(failed)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
