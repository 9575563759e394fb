"""``hang-report`` against drawn hangs whose truth is known: right, honest and wrong, per family and incident (#42).

Two families of scenarios (:mod:`tests.harness.hang_truth`), each from a fixed seed list:

* **gloo** (:mod:`tests.harness.hang_truth.gloo_worlds`): worlds of 2 to 8 real Gloo ranks, the recorder on; a
  layout (DeviceMesh, ``new_group``, ``split_group``), a history of zero to three ops, one incident (a rank that never
  comes, a rank still working, a circular wait, a p2p stall). :data:`AT_ONCE` worlds run at a time, each scored as
  soon as it is drawn, its folder then deleted (``--keep`` keeps them). A world that did not run as drawn on two
  tries is counted apart (``void``), never scored.
* **nccl** (``tests.harness.hang_truth.nccl_worlds``, where it exists): NCCL-format dumps built from the recording
  rules of ``docs/recorder-semantics.md``; without it the run says so and scores Gloo alone.

Each scenario is scored as a user reads the report (:mod:`tests.harness.hang_truth.score`: ``python -m nemo_rl_shim
hang-report DIR --json`` in a fresh process): **right** (exit 1, a kind of the truth's, its ranks), **honest**
(exit 1, "cannot tell" or "unclear"), **wrong** (everything else). Targets, for the reader: 0 wrong and at least 95%
right. Printed: a table per family and incident, and each wrong scenario with its seed, truth and first line.

Run: ``uv run python benchmarks/hang_truth.py [--only gloo|nccl] [--gloo-seeds N] [--at-once 4] [--keep DIR]``;
writes ``benchmarks/results/hang_truth.json`` (every scenario's recipe and report in ``results/raw/``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, environment, print_table, write_results

__all__ = ["AT_ONCE", "TARGET_RIGHT", "main", "nccl_drawer", "run_family"]

#: Gloo worlds drawn at a time: they mostly wait (a 3 s timeout, the stack watch's grace and samples).
AT_ONCE = 4
TARGET_RIGHT = 0.95
HEADINGS = ["family", "incident", "scenarios", "right", "honest", "wrong", "void", "right %"]
_NCCL_MODULE = "tests.harness.hang_truth.nccl_worlds"
#: What the results keep of each wrong scenario.
_WRONG_KEYS = ("family", "seed", "name", "incident", "truth", "exit_code", "kind", "ranks", "line", "why")


def nccl_drawer() -> tuple[Callable[[int, Path], Any] | None, Sequence[int], str]:
    """The NCCL family's ``draw`` and seed list, or None and why not."""
    try:
        module = importlib.import_module(_NCCL_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _NCCL_MODULE:
            raise
        return None, (), f"{_NCCL_MODULE} does not exist yet: the Gloo family alone"
    seeds = next((getattr(module, name) for name in ("SEEDS", "NCCL_SEEDS") if hasattr(module, name)), None)
    if seeds is None:
        return None, (), f"{_NCCL_MODULE} has no SEEDS list"
    return module.draw, tuple(seeds), ""


def _incident(scenario: Any) -> str:
    """The incident's kind, from the recipe where it says (``incident.kind``, ``kind``), else the truth's kinds."""
    recipe = scenario.recipe if isinstance(scenario.recipe, dict) else {}
    incident = recipe.get("incident")
    if isinstance(incident, dict) and isinstance(incident.get("kind"), str):
        return incident["kind"]
    if isinstance(recipe.get("kind"), str):
        return recipe["kind"]
    return "/".join(sorted(scenario.truth.kinds)) or "invisible"


def _one(draw: Callable[[int, Path], Any], family: str, seed: int, root: Path, keep: bool) -> dict[str, Any]:
    from tests.harness.hang_truth.score import score

    start = time.perf_counter()
    try:
        scenario = draw(seed, root)
    except Exception as failed:  # a world that did not run as drawn (WorldFailed), or a drawer's defect: not scored
        return {"family": family, "seed": seed, "score": "void", "why": str(failed)}
    drawn = time.perf_counter() - start
    scored = score(scenario)
    if not keep:
        shutil.rmtree(scenario.directory.parent if family == "gloo" else scenario.directory, ignore_errors=True)
    print(f"  {family} {seed}: {scored.score:6} {scenario.name}: {scored.line[:150]}", flush=True)
    return {
        "family": family, "seed": seed, "name": scenario.name, "incident": _incident(scenario),
        "world_size": scenario.world_size, "truth": scenario.truth.to_json(), **scored.to_json(),
        "draw_s": round(drawn, 2), "recipe": scenario.recipe,
    }  # fmt: skip


def run_family(
    family: str, draw: Callable[[int, Path], Any], seeds: Sequence[int], root: Path, *, at_once: int, keep: bool
) -> list[dict[str, Any]]:
    """Draw and score every seed, ``at_once`` at a time; in seed order."""
    with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
        return list(pool.map(lambda seed: _one(draw, family, seed, root, keep), seeds))


def _rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    keys = sorted({(r["family"], r.get("incident", "?")) for r in runs if r["score"] != "void"})
    voids = [r for r in runs if r["score"] == "void"]
    for family in sorted({r["family"] for r in runs}):
        for fam, incident in [k for k in keys if k[0] == family] + [(family, "all")]:
            these = [r for r in runs if r["family"] == fam and (incident == "all" or r.get("incident") == incident)]
            counts = {s: sum(r["score"] == s for r in these) for s in ("right", "honest", "wrong")}
            void = sum(r["family"] == fam for r in voids) if incident == "all" else 0
            scored = sum(counts.values())
            share = f"{100 * counts['right'] / scored:.1f}" if scored else "-"
            rows.append([fam, incident, scored, counts["right"], counts["honest"], counts["wrong"], void, share])
    return rows


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True)  # fmt: skip
    except OSError:
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("gloo", "nccl"), help="one family")
    parser.add_argument("--gloo-seeds", type=int, default=None, help="the first N of the Gloo seed list")
    parser.add_argument("--at-once", type=int, default=AT_ONCE, help="Gloo worlds at a time")
    parser.add_argument("--keep", type=Path, default=None, help="keep every scenario's folder here")
    parser.add_argument("--name", default="hang_truth", help="the results file's name")
    args = parser.parse_args(argv)
    os.environ.setdefault("NEMO_RL_SHIM_FORK_RANKS", "1")  # ranks forked from one server that imported torch once
    from tests.harness.hang_truth import gloo_worlds

    root = args.keep or Path(tempfile.mkdtemp(prefix="hang-truth-"))
    before, commit, start = environment(), _commit(), time.perf_counter()
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    if args.only in (None, "gloo"):
        seeds = gloo_worlds.SEEDS[: args.gloo_seeds]
        print(f"gloo: {len(seeds)} worlds, {args.at_once} at a time", flush=True)
        runs += run_family("gloo", gloo_worlds.draw, seeds, root, at_once=args.at_once, keep=args.keep is not None)
    if args.only in (None, "nccl"):
        draw, seeds, why = nccl_drawer()
        if draw is None:
            notes.append(why)
            print(f"nccl: {why}", flush=True)
        else:
            print(f"nccl: {len(seeds)} scenarios", flush=True)
            runs += run_family("nccl", draw, seeds, root, at_once=1, keep=args.keep is not None)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    rows = _rows(runs)
    print_table(f"hang-report against drawn hangs (commit {commit})", HEADINGS, rows)
    wrong = [r for r in runs if r["score"] == "wrong"]
    voids = [r for r in runs if r["score"] == "void"]
    print(f"\nwrong: {len(wrong)}")
    for r in wrong:
        truth = r["truth"]
        print(f"  {r['family']} seed {r['seed']} ({r['name']}): truth {truth['kinds']} ranks {truth['ranks']}; "
              f"{r['why']}\n    {r['line']}")  # fmt: skip
    for r in voids:
        print(f"  void: {r['why']}")
    scored = [r for r in runs if r["score"] != "void"]
    right = sum(r["score"] == "right" for r in scored)
    data = {
        "benchmark": "hang_truth",
        "commit": commit,
        "environment_before": before,
        "environment_after": environment(),
        "wall_s": round(time.perf_counter() - start, 1),
        "notes": notes,
        "targets": {"wrong": 0, "right_share": TARGET_RIGHT},
        "scenarios": len(scored),
        "void": len(voids),
        "right_share": round(right / len(scored), 4) if scored else None,
        "meets_targets": bool(scored) and not wrong and right / len(scored) >= TARGET_RIGHT,
        "table": [dict(zip(HEADINGS, row, strict=True)) for row in rows],
        "wrong": [{k: r[k] for k in _WRONG_KEYS} for r in wrong],
        "void_seeds": [{"family": r["family"], "seed": r["seed"], "why": r["why"]} for r in voids],
        "runs": runs,
    }
    path = write_results(args.name, data, rerun="benchmarks/hang_truth.py")
    print(f"\nwrote {path.relative_to(ROOT)} ({data['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
