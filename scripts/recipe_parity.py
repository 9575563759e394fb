"""Parity of ``nemo_rl_shim.cli.nemo_rl.recipe.load_recipe`` with NeMo RL's own config loader, on NeMo RL's own configs.

The oracle is NeMo RL's ``nemo_rl/utils/config.py``, loaded by file path (not the ``nemo_rl``
package, which needs torch and more) into a separate interpreter that has only NeMo RL's
OmegaConf and hydra-core, and called as ``examples/run_grpo.py`` calls it::

    register_omegaconf_resolvers(); config = load_config(path)
    config = parse_hydra_overrides(config, overrides)   # when there are overrides
    OmegaConf.to_container(config, resolve=True)

Our loader runs in this interpreter. Every YAML under ``examples/configs`` (recipes included)
is read by both, then a few override cases on real recipes. Compared: ``policy`` and
``value`` ``dtensor_cfg``, ``automodel_cfg`` and ``cluster`` (the figure the issue asks for),
and the whole resolved config. A config the oracle rejects counts as skipped; an override
case both refuse counts as the same. Nothing of NeMo RL is copied here or written anywhere.

Usage (an oracle environment: ``uv venv /tmp/nemorl-oracle && uv pip install -p
/tmp/nemorl-oracle/bin/python omegaconf==2.3.1 hydra-core==1.3.4``, NeMo RL's locked versions)::

    uv run python scripts/recipe_parity.py --nemo-rl /path/to/RL --oracle-python /tmp/nemorl-oracle/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["OVERRIDE_CASES", "main"]

_ORACLE = r"""
import importlib.util, json, sys
from omegaconf import OmegaConf
spec = importlib.util.spec_from_file_location("nemo_rl_config_oracle", sys.argv[1])
nrl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nrl)
nrl.register_omegaconf_resolvers()
out = []
for case in json.load(sys.stdin):
    try:
        config = nrl.load_config(case["path"])
        if case["overrides"]:
            config = nrl.parse_hydra_overrides(config, case["overrides"])
        out.append({"config": json.loads(json.dumps(OmegaConf.to_container(config, resolve=True), default=repr))})
    except BaseException as e:  # RecursionError on a defaults cycle too
        out.append({"error": type(e).__name__ + ": " + (str(e).strip().splitlines() or [""])[0]})
json.dump(out, sys.stdout)
"""

#: (recipe under examples/configs, overrides, what the case shows).
OVERRIDE_CASES: list[tuple[str, list[str], str]] = [
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["policy.dtensor_cfg.cpu_offload=false"], "plain, existing key"),
    (
        "recipes/llm/grpo-deepscaler-1.5b-16K.yaml",
        ["++policy.automodel_cfg.distributed_timeout_minutes=45"],
        "++ add or change",
    ),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["+policy.dtensor_cfg.new_key=1"], "+ new key"),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["~policy.dtensor_cfg.cpu_offload"], "~ delete"),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["policy.dtensor_cfg.no_such_key=1"], "plain, missing key"),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["+policy.dtensor_cfg.cpu_offload=true"], "+ on an existing key"),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["policy.dtensor_cfg.cpu_offload=[1"], "bad syntax"),
    ("recipes/llm/grpo-deepscaler-1.5b-16K.yaml", ["~policy.no_such_key"], "~ of a missing key"),
    (
        "grpo_math_1B.yaml",
        ["cluster.num_nodes=2", "policy.dtensor_cfg.tensor_parallel_size=${cluster.gpus_per_node}"],
        "plain, with an interpolation as the value",
    ),
    (
        "grpo_math_1B.yaml",
        ["policy.generation.colocated.enabled=false", "policy.generation.colocated.resources.gpus_per_node=2"],
        "non-colocated generation",
    ),
    ("sft.yaml", ["policy.dtensor_cfg={tensor_parallel_size: 2, cpu_offload: true}"], "a dict value merges"),
    ("dpo.yaml", ["~policy.dtensor_cfg", "+policy.dtensor_cfg.enabled=true"], "delete then add"),
]

#: The sections the issue's figure compares, per role.
_FIELDS = ("dtensor_cfg", "automodel_cfg")


def _ours(path: Path, overrides: list[str]) -> dict[str, Any]:
    from nemo_rl_shim.cli.nemo_rl.recipe import load_recipe

    try:
        return {"config": json.loads(json.dumps(load_recipe(path, overrides), default=repr))}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _oracle(python: str, config_py: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [python, "-c", _ORACLE, str(config_py)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"the oracle failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _sections(config: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {"cluster": config.get("cluster")}
    for role in ("policy", "value"):
        section = config.get(role)
        if isinstance(section, dict):
            for field in _FIELDS:
                found[f"{role}.{field}"] = section.get(field, "<absent>")
    return found


def _diff(a: Any, b: Any, key: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{key}.{k}" if key else k)
        return out
    return [] if a == b else [f"{key}: NeMo RL {a!r}, ours {b!r}"]


def _world(config: dict[str, Any]) -> str:
    from nemo_rl_shim.cli.nemo_rl.training_world import training_world

    try:
        world = training_world(config)
    except ValueError as e:
        return f"error: {e}"
    return f"{world.size}: {world.source}"


def _configs(root: Path) -> list[Path]:
    return sorted((root / "examples" / "configs").rglob("*.yaml"))


def _compare_files(root: Path, paths: list[Path], oracle: list[dict[str, Any]], verbose: bool) -> dict[str, Any]:
    same_sections, same_whole, skipped, mismatches, worlds = 0, 0, [], [], {}
    for path, theirs in zip(paths, oracle, strict=True):
        name = str(path.relative_to(root))
        ours = _ours(path, [])
        if "error" in theirs:
            skipped.append(f"{name}: NeMo RL: {theirs['error']}; ours: {ours.get('error', 'loaded')}")
            continue
        if "error" in ours:
            mismatches.append(f"{name}: NeMo RL loads it; ours: {ours['error']}")
            continue
        diff = _diff(_sections(theirs["config"]), _sections(ours["config"]))
        same_sections += not diff
        same_whole += theirs["config"] == ours["config"]
        if diff:
            mismatches.append(f"{name}: {'; '.join(diff)}")
        worlds[name] = _world(ours["config"])
        if verbose:
            print(f"{name}: world {worlds[name]}")
    return {
        "configs": len(paths),
        "loaded_by_nemo_rl": len(paths) - len(skipped),
        "same_sections": same_sections,
        "same_whole_config": same_whole,
        "skipped": skipped,
        "mismatches": mismatches,
        "worlds": worlds,
    }


def _compare_overrides(root: Path, oracle: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (name, overrides, what), theirs in zip(OVERRIDE_CASES, oracle, strict=True):
        ours = _ours(root / "examples" / "configs" / name, overrides)
        if "error" in theirs or "error" in ours:
            same = "error" in theirs and "error" in ours
        else:
            same = theirs["config"] == ours["config"]
        rows.append(
            {
                "recipe": name,
                "overrides": overrides,
                "case": what,
                "same": same,
                "nemo_rl": theirs.get("error", "loaded"),
                "ours": ours.get("error", "loaded"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nemo-rl", type=Path, required=True, help="a NeMo RL checkout (examples/, nemo_rl/)")
    parser.add_argument("--oracle-python", required=True, help="a Python with only omegaconf and hydra-core")
    parser.add_argument("--json", type=Path, help="write the full result here")
    parser.add_argument("--verbose", action="store_true", help="print each config's training world")
    args = parser.parse_args(argv)
    root = args.nemo_rl.resolve()
    config_py = root / "nemo_rl" / "utils" / "config.py"
    paths = _configs(root)
    cases = [{"path": str(p), "overrides": []} for p in paths]
    cases += [{"path": str(root / "examples" / "configs" / n), "overrides": o} for n, o, _ in OVERRIDE_CASES]
    start = time.monotonic()
    oracle = _oracle(args.oracle_python, config_py, cases)
    oracle_s = time.monotonic() - start
    start = time.monotonic()
    files = _compare_files(root, paths, oracle[: len(paths)], args.verbose)
    overrides = _compare_overrides(root, oracle[len(paths) :])
    ours_s = time.monotonic() - start
    loaded = files["loaded_by_nemo_rl"]
    print(
        f"{files['same_sections']} of {loaded} configs give the same policy/value dtensor_cfg, automodel_cfg and "
        f"cluster ({files['configs']} YAML files, {len(files['skipped'])} rejected by NeMo RL's own loader); "
        f"{files['same_whole_config']} of {loaded} give the same whole resolved config"
    )
    same = sum(row["same"] for row in overrides)
    print(f"{same} of {len(overrides)} override cases agree (the same config, or both refuse)")
    for row in overrides:
        print(f"  {'same' if row['same'] else 'DIFF'}: {row['case']}: {' '.join(row['overrides'])}: "
              f"NeMo RL {row['nemo_rl']}; ours {row['ours']}")  # fmt: skip
    for line in files["mismatches"]:
        print(f"mismatch: {line}")
    for line in files["skipped"]:
        print(f"skipped: {line}")
    print(f"time: oracle {oracle_s:.1f} s (one process), ours {ours_s:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"files": files, "overrides": overrides}, indent=2))
    return 0 if not files["mismatches"] and same == len(overrides) else 1


if __name__ == "__main__":
    raise SystemExit(main())
