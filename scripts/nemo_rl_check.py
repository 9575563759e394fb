"""Check the NeMo RL pull request (``nemo_rl_shim/upstream/``) as NeMo RL's CI would see it, on this CPU machine.

The judged environment is NeMo RL's own: a CPython 3.13 venv with the packages of NeMo RL's
``uv.lock`` that its tests import (versions read from that lock), the Automodel commit NeMo RL
pins as its submodule (installed with ``--no-deps``), and NeMo RL's source on ``PYTHONPATH``
(NeMo RL cannot be pip-installed here: its git-URL dependencies are out of reach). This project
is NOT installed there, and the check proves it (``import nemo_rl_shim`` must fail). The venv is
built once under ``--work`` and reused while its packages match. NeMo RL and Automodel come from
git directories, never committed here. Each step is bounded in time:

1. ``series``: three trees cloned from NeMo RL at ``--rev``: unpatched, tests-only (the series'
   test commit alone, ``git am``) and patched (the whole series, ``git am``). Every commit must be
   signed off, the series must add no requirement (``pyproject.toml`` and ``uv.lock`` unchanged),
   and at most 80 lines of code (not blank, not comments) under ``nemo_rl/``.
2. ``env``: the environment above.
3. ``driver``: ``scripts/nemo_rl_driver.py`` on the unpatched and patched trees: NeMo RL's
   ``MasterConfig`` with true, "forty-five", 0.5, nan, inf, 0, -5, 1e308, 10081, a misspelled key,
   45, "45" (what ``${oc.env:...}`` gives) and null for the policy, teacher and value sections, and
   ``Policy`` for the reward model section, the v1 DTensor worker, Megatron and a Megatron teacher.
   Then this project's own keys: every one in ``<section>.nemo_rl_shim`` must pass ``MasterConfig`` on
   both trees unchanged and reach the config ``Policy`` hands the DTensor v2 worker; patched must refuse
   one in its old place inside ``automodel_cfg``.
4. ``tests``: NeMo RL's own tests as its CI runs them, each lane in ONE pytest process, unpatched and
   patched: ``tests/unit/models/automodel/`` with ``--automodel-only`` (its first file leaves a Gloo
   default group behind), ``test_config_validation.py`` with ``models/policy/test_policy_validation.py``,
   and ``test_config_v2.py``. Every test that passes unpatched must pass patched; every new test must
   pass in its lane, and fail at an assertion on the tests-only tree (guards of kept behaviour pass
   there); the GPU tests must be skipped with their reason, the two-GPU CPU-offload test and its
   CPU twin must be among the new tests, and no GPU-gated test may configure CPU offload on one rank
   (NeMo RL's ``setup_distributed`` refuses it).
5. ``ranks``: NeMo RL's ``setup_distributed`` for real on 4 CPU ranks (tp 2), CPU offload off and
   on, unpatched and patched, NCCL stood in by Gloo (``scripts/nemo_rl_rank.py``); then the
   worker's replica group, then every process group torch holds, read on every backend. Then the
   weight download of Automodel's ``from_pretrained``: the group it makes must read the value when made.
6. ``save``: NVIDIA-NeMo/RL#3624 scaled down on 4 CPU ranks: Automodel's consolidation barrier on
   the default group, with rank 0 writing longer than torch's (scaled) default timeout.
7. ``preflight``: ``nemo-rl-shim preflight --setup nemo-rl`` (NeMo RL's own ``setup_distributed``, the
   worker's later groups, every group torch holds audited) on 4 CPU ranks (tp 2), CPU offload on and
   off, each tree on ``PYTHONPATH``: unpatched must exit 1 naming the groups left at torch's default,
   patched 0. Then, reported and not judged, NeMo RL's SGLang colocated config on both trees (its refit
   groups are made after set-up). Run from a SEPARATE venv layered on the NeMo RL one (a ``.pth``
   points at its site-packages), so the judged environment stays without this project.
8. ``bump``: the pin bump rehearsed (nemo-automodel 0.7.0): every blocker of
   ``import nemo_rl.models.automodel.setup``, unpatched and patched; the pin is put back.

Prints the summary (``--json`` writes it). Exits 0 only when every expectation holds, 1 when one
does not; a step that cannot run is a failure, never a pass.

    python3 scripts/nemo_rl_check.py --rl-git /work/.mirror/NVIDIA-NeMo+RL/repo \\
        --automodel-git /work/.mirror/NVIDIA-NeMo+Automodel/repo --work /tmp/nemo-rl-check
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERIES = sorted((ROOT / "nemo_rl_shim" / "upstream").glob("0*.patch"))
RANK_SCRIPT = ROOT / "scripts" / "nemo_rl_rank.py"
DRIVER_SCRIPT = ROOT / "scripts" / "nemo_rl_driver.py"
AUTOMODEL_TESTS = "tests/unit/models/automodel/"
SETUP_TESTS = "tests/unit/models/automodel/test_automodel_setup.py"
DRIVER_TESTS = ("tests/unit/test_config_validation.py", "tests/unit/models/policy/test_policy_validation.py")
#: What NeMo RL's tests import, by uv.lock name (the lock gives the version).
PACKAGES = [
    "torch",
    "transformers",
    "ray",
    "hydra-core",
    "omegaconf",
    "pytest",
    "pytest-timeout",
    "pytest-asyncio",
    "mlflow",
    "swanlab",
    "wandb",
    "tensorboard",
    "matplotlib",
    "prometheus-client",
    "datasets",
    "torchdata",
    "tensordict",
    "math-verify",
    "accelerate",
    "rich",
    "colored",
    "numpy",
    "pyyaml",
    "safetensors",
    "torchvision",
    "plotly",
    "sympy",
    "tiktoken",
    "sentencepiece",
    "pyzmq",
    "nvidia-ml-py",
    "blobfile",
    "soundfile",
    "torchao",
    "megatron-fsdp",
    "mistral-common",
    "pybind11",
    "einops",
    "pydantic",
]
#: The most lines of code (not blank, not comments) the series may add under ``nemo_rl/``.
CODE_LINES_MAX = 80
#: Marks a venv this script built, with what it holds; a match lets a later run reuse it.
ENV_MARKER = ".nemo-rl-check.json"
#: The NeMo RL tests run on each tree: (lane, trees, pytest selection). The first two are run as NeMo RL's CI
#: runs them, every file of a lane in ONE pytest process (``L0_Unit_Tests_Automodel.sh`` runs all of ``unit/``
#: so), so a test meets whatever earlier files left behind: ``test_automodel_checkpoint.py``, collected first,
#: leaves a Gloo default group. The last two select the new tests on the tree with the test commit alone.
LANES = (
    ("automodel lane", ("unpatched", "patched"), (AUTOMODEL_TESTS, "--automodel-only")),
    ("driver lane", ("unpatched", "patched"), DRIVER_TESTS),
    ("config v2", ("unpatched", "patched"), ("tests/unit/test_config_v2.py",)),
    ("new set-up tests", ("tests-only",), (SETUP_TESTS, "--automodel-only", "-k", "timeout")),
    ("new driver tests", ("tests-only",), (*DRIVER_TESTS, "-k", "distributed_timeout")),
)
#: The one-process lanes where the new tests must pass, and the tests-only lane that selects them there.
NEW_TESTS_IN = {"automodel lane": "new set-up tests", "driver lane": "new driver tests"}
#: New tests of behaviour the change must keep, which therefore pass on unpatched NeMo RL as well: null keeps
#: torch's defaults, and good values are accepted.
GUARDS = ("null_keeps_torch_default", "test_distributed_timeout_accepted_at_the_driver")
#: The GPU tests (their names end so): present, and skipped on this machine with their reason, the number found.
GPU_TESTS = ("_two_gpus", "_one_gpu")
GPU_SKIP = re.compile(r"needs [12] GPUs?\b.*found 0$")
#: The two-GPU CPU-offload test and its CPU twin (the same body on two CPU ranks, which CI runs).
TWO_GPU_TEST, CPU_TWIN = "test_cpu_offload_timeout_on_every_mesh_axis_two_gpus", "_two_cpu_ranks"
#: The helper every GPU-gated set-up test calls: (tmp_path, world_size, on_gpu, cpu_offload, minutes).
RANKS_HELPER, GPU_MARKS = "run_timeout_ranks", ("NEEDS_ONE_GPU", "NEEDS_TWO_GPUS")
#: A new test's failure on unpatched NeMo RL must be its own assertion, not an import or a missing name.
ASSERTION_FAILURES = ("AssertionError", "assert ", "Failed: DID NOT RAISE")
#: #3624 scaled down: torch's 30 min Gloo default x SAVE_SCALE, a 40 min save, a 60 min knob. 1/60, so that the
#: knob is a whole number of minutes (1), as the key takes.
SAVE_SCALE, SAVE_SECONDS, SAVE_KNOB_MINUTES = 1 / 60, 40 * 60 / 60, 60 // 60
#: The preflight step's command: NeMo RL's own set-up on 4 ranks, then every group torch holds audited.
PREFLIGHT_ARGS = ("preflight", "--setup", "nemo-rl", "--timeout-minutes", "45", "--nproc", "4", "--tp", "2")
#: Its exit code on each tree: NeMo RL as it is leaves every group at torch's default (1); the series, none (0).
PREFLIGHT_EXPECTED = {"unpatched": 1, "patched": 0}
#: Reported, not judged: NeMo RL's SGLang colocated config, whose refit groups (``_ensure_ipc_topology``) are made
#: after set-up, two engines of 2 ranks.
PREFLIGHT_SGLANG = ("--config", "examples/configs/grpo_math_1B_sglang.yaml", "policy.generation.sglang_cfg.tp_size=2")
#: The bump rehearsal: nemo-automodel 0.7.0 and the transformers it pins.
BUMP_AUTOMODEL, BUMP_TRANSFORMERS = "0.7.0", "5.18.0"
IDENTITY = ("-c", "user.name=nemo-rl-check", "-c", "user.email=nemo-rl-check@localhost")


def run(cmd: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """``subprocess.run`` bounded by ``timeout``; returns (rc, output, seconds), rc 124 on timeout."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return done.returncode, done.stdout + done.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[timed out after {timeout:g} s]", time.monotonic() - start


def log(message: str) -> None:
    print(f"[nemo_rl_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def git(*args: str, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


# --- 1. the series ------------------------------------------------------------------------------


def clone_tree(args: argparse.Namespace, dest: Path, patches: list[Path]) -> list[str]:
    """NeMo RL at ``--rev`` in ``dest``, with ``patches`` applied by ``git am``; returns the new commits."""
    if dest.exists():
        shutil.rmtree(dest)
    git("clone", "--quiet", "--shared", "--no-checkout", str(args.rl_git), str(dest))
    git("checkout", "--quiet", "--detach", args.rev, cwd=dest)
    if patches:
        git(*IDENTITY, "am", "--quiet", *map(str, patches), cwd=dest)
    return git("log", "--format=%H", f"{args.rev}..HEAD", cwd=dest).split()


def _dependencies(pyproject: Path) -> dict[str, Any]:
    data = tomllib.loads(pyproject.read_text())
    project = data.get("project", {})
    return {
        "dependencies": project.get("dependencies"),
        "optional-dependencies": project.get("optional-dependencies"),
        "dependency-groups": data.get("dependency-groups"),
        "tool.uv": data.get("tool", {}).get("uv"),
    }


def patch_files(patch: Path) -> list[str]:
    """The files a patch touches, as ``git apply --numstat`` reads them."""
    return [line.split("\t")[2] for line in git("apply", "--numstat", str(patch)).splitlines()]


def series_step(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    # The test commit: the one patch that touches tests only
    test_patches = [p for p in SERIES if all(f.startswith("tests/") for f in patch_files(p))]
    commits = {
        "unpatched": clone_tree(args, work / "unpatched", []),
        "tests-only": clone_tree(args, work / "tests-only", test_patches),
        "patched": clone_tree(args, work / "patched", SERIES),
    }
    patched = work / "patched"
    signed, subjects = {}, []
    for commit in commits["patched"]:
        message = git("log", "-1", "--format=%an <%ae>%n%s%n%b", commit, cwd=patched)
        author, subject = message.splitlines()[:2]
        subjects.append(subject)
        signed[subject] = f"Signed-off-by: {author}" in message
        if not signed[subject]:
            problems.append(f"commit {subject!r} has no Signed-off-by of its author ({author})")
    if len(commits["patched"]) != len(SERIES):
        problems.append(f"git am made {len(commits['patched'])} commits of {len(SERIES)} patches")
    if len(test_patches) != 1 or len(commits["tests-only"]) != 1:
        problems.append(f"the series needs exactly one test commit, found {[p.name for p in test_patches]}")
    changed = git("diff", "--name-only", f"{args.rev}..HEAD", cwd=patched).split()
    same_lock = (work / "unpatched" / "uv.lock").read_bytes() == (patched / "uv.lock").read_bytes()
    same_deps = _dependencies(work / "unpatched" / "pyproject.toml") == _dependencies(patched / "pyproject.toml")
    if not same_lock or not same_deps or "pyproject.toml" in changed or "uv.lock" in changed:
        problems.append("the series changes NeMo RL's requirements (pyproject.toml or uv.lock)")
    diff = git("diff", "--unified=0", f"{args.rev}..HEAD", "--", "nemo_rl/", cwd=patched).splitlines()
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    code_added = sum(1 for line in added if line and not line.startswith("#"))
    if code_added > CODE_LINES_MAX:
        problems.append(f"the series adds {code_added} lines of code under nemo_rl/, more than {CODE_LINES_MAX}")
    result = {
        "patches": [p.name for p in SERIES],
        "git am on": args.rev,
        "commits": subjects,
        "signed off": signed,
        "tests-only commits": len(commits["tests-only"]),
        "files changed": changed,
        "lines added under nemo_rl/": len(added),
        "of them code (not blank, not comments)": code_added,
        "pyproject.toml and uv.lock unchanged": same_lock and same_deps and "pyproject.toml" not in changed,
    }
    return result, problems


# --- 2. NeMo RL's environment ---------------------------------------------------------------------


def lock_versions(lock: Path) -> dict[str, str]:
    versions: dict[str, list[str]] = {}
    for package in tomllib.loads(lock.read_text())["package"]:
        if "version" in package:  # a workspace or git source may have none
            versions.setdefault(package["name"], []).append(package["version"])
    # The newest a lock holds; transformers is taken from Automodel's own pin instead (env_step).
    return {
        name: max(found, key=lambda v: [int(x) if x.isdigit() else 0 for x in re.split(r"[.+]", v)])
        for name, found in versions.items()
    }


def automodel_commit(args: argparse.Namespace, work: Path) -> str:
    if args.automodel_rev:
        return args.automodel_rev
    line = git("ls-tree", "HEAD", "3rdparty/Automodel-workspace/Automodel", cwd=work / "unpatched").split()
    return line[2]


def export_automodel(args: argparse.Namespace, work: Path, commit: str) -> Path:
    source = work / "automodel"
    if (source / ".commit").is_file() and (source / ".commit").read_text() == commit:
        return source
    if source.exists():
        shutil.rmtree(source)
    source.mkdir()
    archive = subprocess.run(
        ["git", f"--git-dir={args.automodel_git}", "archive", commit], capture_output=True, check=True, timeout=300
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True, timeout=300)
    (source / ".commit").write_text(commit)
    return source


def automodel_transformers(source: Path) -> str:
    """The ``transformers==`` that the Automodel at ``source`` pins (NeMo RL's range allows it)."""
    for requirement in tomllib.loads((source / "pyproject.toml").read_text())["project"]["dependencies"]:
        if requirement.replace(" ", "").startswith("transformers=="):
            return requirement.split("==")[1]
    raise RuntimeError(f"{source}/pyproject.toml pins no transformers==")


def uv_pip(python: Path, *specs: str, timeout: float = 1800) -> None:
    rc, out, _ = run(["uv", "pip", "install", "--python", str(python), *specs], timeout=timeout)
    if rc != 0:
        raise RuntimeError(f"uv pip install {' '.join(specs)} failed ({rc}):\n{out[-3000:]}")


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def absent_from(env: Path, *modules: str) -> dict[str, bool]:
    """Whether each module fails to import in ``env`` (this project must not be there).

    Run from ``env`` itself: ``python -c`` puts the working directory first on ``sys.path``, and
    this project's checkout would lend its packages to a run started there.
    """
    found = {}
    for module in modules:
        rc, _, _ = run([str(python_of(env)), "-c", f"import {module}"], timeout=300, env=clean_env(), cwd=env)
        found[module] = rc != 0
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that could point a child at this project."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS")}
    env.update(extra)
    return env


def env_step(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], list[str]]:
    env, start = work / "env", time.monotonic()
    commit = automodel_commit(args, work)
    source = export_automodel(args, work, commit)
    versions = {**lock_versions(work / "unpatched" / "uv.lock"), "transformers": automodel_transformers(source)}
    specs = [f"{name}=={versions[name].split('+')[0]}" if name in versions else name for name in PACKAGES]
    specs = [s.replace("ray==", "ray[default]==") for s in specs]
    wanted = {"python": args.python, "specs": specs, "automodel_commit": commit}
    marker = env / ENV_MARKER
    reused = marker.is_file() and json.loads(marker.read_text()) == wanted and python_of(env).exists()
    if not reused:
        log(f"building NeMo RL's environment in {env}")
        if not python_of(env).exists():
            rc, out, _ = run(["uv", "venv", "--python", args.python, str(env)], timeout=300)
            if rc != 0:
                raise RuntimeError(f"uv venv failed: {out[-2000:]}")
        marker.unlink(missing_ok=True)
        uv_pip(python_of(env), *specs)
        uv_pip(python_of(env), "--no-deps", "--reinstall-package", "nemo-automodel", str(source))
        marker.write_text(json.dumps(wanted))
    # An older run of this script installed this project here; the judged environment must not have it.
    run(["uv", "pip", "uninstall", "--python", str(python_of(env)), "nemo-rl-shim"], timeout=300)
    absent = absent_from(env, "nemo_rl_shim", "automodel_patch")
    problems = [f"`import {m}` works in NeMo RL's environment" for m, gone in absent.items() if not gone]
    result = {
        "path": str(env),
        "reused": reused,
        "python": args.python,
        "automodel_commit": commit,
        "torch": versions.get("torch"),
        "transformers": versions["transformers"],
        "this project absent (import fails)": absent,
        "seconds": round(time.monotonic() - start, 1),
    }
    return result, problems


# --- 3. the driver --------------------------------------------------------------------------------

_SECTION_OF = {"grpo policy": "policy", "distillation teacher": "teacher", "ppo value": "value"}
_BAD = ("True", "'forty-five'", "0.5", "nan", "inf", "0", "-5", "1e+308", "10081")
#: Accepted, as validated: whole minutes, and the string ``${oc.env:...}`` gives read as a number.
_GOOD = (("45", "accepted: 45"), ("'45'", "accepted: 45"), ("None", "accepted: None"))
_MISSPELLED = "distributed_timeout_minute: 45"


def driver_verdict(patched: dict[str, Any]) -> list[str]:
    """Patched NeMo RL refuses the bad values and a misspelled key naming the section, takes whole minutes, "45" and
    null, and refuses a set value where it is not read, naming the section the Policy was built from."""
    problems = []
    for label, outcomes in patched["master_config"].items():
        key = f"{_SECTION_OF[label]}.automodel_cfg.distributed_timeout_minutes"
        for value in _BAD:
            if not (outcomes[value].startswith("refused: ValidationError") and key in outcomes[value]):
                problems.append(f"MasterConfig, {label}, {value}: {outcomes[value]}")
        for value, expected in _GOOD:
            if outcomes[value] != expected:
                problems.append(f"MasterConfig, {label}, {value}: {outcomes[value]}, expected {expected}")
        typo = outcomes.get(_MISSPELLED, "missing")
        if not (typo.startswith("refused: ValidationError") and f"{key[:-1]} | Extra inputs" in typo):
            problems.append(f"MasterConfig, {label}, {_MISSPELLED}: {typo}")
    for label, refusal, key in (
        ("v1 DTensor worker, 45", "refused: ValueError", "policy.automodel_cfg.distributed_timeout_minutes is 45,"),
        ("Megatron, 45", "refused: ValueError", "policy.automodel_cfg.distributed_timeout_minutes is 45,"),
        ("Megatron teacher, 45", "refused: ValueError", "teacher.automodel_cfg.distributed_timeout_minutes is 45,"),
        # Not typed by MasterConfig: Policy checks it through the same type, before any worker, naming the section
        ("env.reward_model, true", "refused: ValueError", "env.reward_model.automodel_cfg is invalid"),
    ):
        outcome = patched["policy"].get(label, "missing")
        if not (outcome.startswith(refusal) and key in outcome):
            problems.append(f"Policy, {label}: {outcome}")
    return problems


def _driver_module() -> Any:
    """``scripts/nemo_rl_driver.py`` as a module (standard library only at import): its cases' labels and values."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nemo_rl_driver", DRIVER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shim_keys_verdict(results: dict[str, Any]) -> list[str]:
    """This project's keys in ``<section>.nemo_rl_shim`` pass NeMo RL's ``MasterConfig`` on both trees, unchanged, and
    reach the config ``Policy`` hands its DTensor v2 worker; patched NeMo RL refuses one in its old place inside
    ``automodel_cfg``, naming it. The driver's block holds every key the shim reads (``SHIM_CFG_KEYS``)."""
    if str(ROOT) not in sys.path:  # run as python3 scripts/nemo_rl_check.py; nemo_rl_shim.config is stdlib-only
        sys.path.insert(0, str(ROOT))
    from nemo_rl_shim.config import SHIM_CFG_KEYS

    driver = _driver_module()
    problems = []
    if set(driver.SHIM_BLOCK) != set(SHIM_CFG_KEYS):
        have = sorted(driver.SHIM_BLOCK)
        problems.append(f"the driver's nemo_rl_shim block has {have}; the shim reads {list(SHIM_CFG_KEYS)}")
    kept = f"accepted: {driver.SHIM_BLOCK!r}"
    to_worker = f"accepted: {{'worker': 'DTensorPolicyWorkerV2', 'nemo_rl_shim': {driver.SHIM_BLOCK!r}}}"
    for tree in ("unpatched", "patched"):
        if tree not in results:
            problems.append(f"nemo_rl_shim block: no driver results on {tree}")
            continue
        for label, section in _SECTION_OF.items():
            outcome = results[tree].get("shim_keys", {}).get(label, {}).get(driver.SHIM_BESIDE, "missing")
            if outcome != kept:
                problems.append(f"MasterConfig on {tree}, {label}, {driver.SHIM_BESIDE}: {outcome}")
            if tree == "patched":
                old = results[tree].get("shim_keys", {}).get(label, {}).get(driver.SHIM_OLD_PLACE, "missing")
                refusal = f"{section}.automodel_cfg.patch_automodel | Extra inputs are not permitted"
                if not (old.startswith("refused: ValidationError") and refusal in old):
                    problems.append(f"MasterConfig on {tree}, {label}, {driver.SHIM_OLD_PLACE}: {old}")
        worker = results[tree].get("policy", {}).get(driver.SHIM_TO_WORKER, "missing")
        if worker != to_worker:
            problems.append(f"Policy on {tree}, {driver.SHIM_TO_WORKER}: {worker}")
    return problems


def driver_step(work: Path) -> tuple[dict[str, Any], list[str]]:
    results, problems = {}, []
    for tree in ("unpatched", "patched"):
        out = work / f"driver-{tree}.json"
        out.unlink(missing_ok=True)
        rc, text, seconds = run(
            [str(python_of(work / "env")), str(DRIVER_SCRIPT), "--configs", "examples/configs", "--out", str(out)],
            cwd=work / tree,
            env=clean_env(PYTHONPATH=str(work / tree), HF_HOME=str(work / "hf")),
            timeout=900,
        )
        if rc != 0 or not out.exists():
            problems.append(f"driver check on {tree} exited {rc}: {text.strip().splitlines()[-1:]}")
            continue
        results[tree] = {**json.loads(out.read_text()), "seconds": round(seconds, 1)}
    if "patched" in results:
        problems += driver_verdict(results["patched"])
    problems += shim_keys_verdict(results)
    return results, problems


# --- 4. NeMo RL's tests -----------------------------------------------------------------------------


def junit_results(path: Path, tree: Path | None = None) -> dict[str, dict[str, str]]:
    """Each test's outcome (passed/failed/error/skipped) and failure message, from pytest's junit XML.

    A test parametrized by a path names its tree; with ``tree`` given, that prefix is dropped, so the
    same test has the same id on every tree.
    """
    if not path.exists():
        return {}
    results = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if tree is not None:
            test_id = test_id.replace(f"{tree}/", "")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").strip()
        results[test_id] = {"outcome": outcome, "message": message[:300]}
    return results


def pytest(work: Path, tree: str, label: str, selection: tuple[str, ...], timeout: float) -> dict[str, Any]:
    # Short and private: Ray's socket paths under it must stay within AF_UNIX's 107 bytes.
    raytmp = Path(tempfile.mkdtemp(prefix="nrlray"))
    # RAY_ADDRESS=local: NeMo RL's init_ray() calls ray.init(address="auto"), which attaches to ANY Ray head
    # it finds among this machine's processes (another session's, another job's) and keeps using it while it
    # lives. "local" makes that call start a private head instead (no dashboard).
    junit = work / f"junit-{label}.xml"
    junit.unlink(missing_ok=True)
    env = clean_env(
        RAY_ADDRESS="local",
        RAY_TMPDIR=str(raytmp),
        PYTHONPATH=str(work / tree),
        HF_HOME=str(work / "hf"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    cmd = [str(python_of(work / "env")), "-m", "pytest", *selection, "--maxfail=100000", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={junit}"]
    log(f"pytest {label}: {' '.join(selection)}")
    rc, out, seconds = run(cmd, cwd=work / tree, env=env, timeout=timeout)
    if "failed to start" in out and not re.search(r"\d+ passed", out):  # the Ray head, not a test: once more
        log(f"pytest {label}: the Ray head did not start; again")
        rc, out, seconds = run(cmd, cwd=work / tree, env=env, timeout=timeout)
    shutil.rmtree(raytmp, ignore_errors=True)
    (work / f"pytest-{label}.log").write_text(out)
    summary = next(
        (line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error|deselected)", line)), ""
    )
    tests = junit_results(junit, work / tree)
    counts: dict[str, int] = {}
    for result in tests.values():
        counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
    return {"rc": rc, "seconds": round(seconds, 1), "counts": counts, "summary": summary.strip("= "), "tests": tests}


def tests_step(work: Path, timeout: float) -> tuple[dict[str, Any], list[str]]:
    results: dict[str, Any] = {}
    for lane, trees, selection in LANES:
        for tree in trees:
            label = f"{tree}-{lane.replace(' ', '-')}"
            results[f"{tree}: {lane}"] = pytest(work, tree, label, selection, timeout)
    verdict, problems = tests_verdict(results)
    # No GPU-gated test may run a configuration NeMo RL's own code refuses (read from the patched tree's file)
    problems += offload_on_one_rank((work / "patched" / SETUP_TESTS).read_text())
    return {**results, "new tests": verdict}, problems


def _test_name(test_id: str) -> str:
    """``test_x`` of ``module.Class::test_x[param]``."""
    return test_id.rsplit("::", 1)[-1].split("[", 1)[0]


def offload_on_one_rank(source: str) -> list[str]:
    """The GPU-gated tests in ``source`` (Python, or the added lines of a patch dedented) that would run a
    configuration NeMo RL refuses: CPU offload on one rank. Each GPU-gated test (``GPU_MARKS``) must call
    ``RANKS_HELPER`` with a literal world size and CPU offload, so that this can be read; none may pass 1 and True."""
    problems, gated = [], 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        marks = {ast.unparse(d) for d in node.decorator_list} & set(GPU_MARKS)
        if not marks:
            continue
        gated += 1
        calls = [
            c for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == RANKS_HELPER
        ]  # fmt: skip
        if not calls:
            problems.append(f"GPU-gated test {node.name} does not call {RANKS_HELPER}: its ranks cannot be read")
        for call in calls:
            literal = len(call.args) >= 4 and all(isinstance(a, ast.Constant) for a in call.args[1:4])
            if not literal:
                problems.append(f"{node.name}: {RANKS_HELPER}'s world size and CPU offload are not literals")
            elif call.args[1].value == 1 and call.args[3].value is True:
                problems.append(f"{node.name} ({', '.join(sorted(marks))}) configures CPU offload on one rank")
    if not gated:
        problems.append(f"no GPU-gated test ({', '.join(GPU_MARKS)}) found")
    return problems


def tests_verdict(results: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    new: dict[str, dict[str, str]] = {}
    for lane, trees, _ in LANES:
        if "unpatched" not in trees:
            continue
        before, after = results[f"unpatched: {lane}"]["tests"], results[f"patched: {lane}"]["tests"]
        passed_before = {t for t, r in before.items() if r["outcome"] == "passed"}
        if not passed_before:
            problems.append(f"unpatched {lane}: nothing passed ({results[f'unpatched: {lane}']['summary']})")
        lost = sorted(t for t in passed_before if after.get(t, {}).get("outcome") != "passed")
        if lost:
            problems.append(f"{lane}: {len(lost)} tests pass unpatched but not patched: {lost[:5]}")
        if lane not in NEW_TESTS_IN:
            continue
        tests_only = results[f"tests-only: {NEW_TESTS_IN[lane]}"]["tests"]
        for test_id in sorted(set(after) - set(before)):
            result = after[test_id]
            only = tests_only.get(test_id, {"outcome": "not collected", "message": ""})
            new[test_id] = {"patched": result["outcome"], "tests-only": only["outcome"], "message": only["message"]}
            if _test_name(test_id).endswith(GPU_TESTS):
                new[test_id]["message"] = result["message"]
                if result["outcome"] != "skipped" or not GPU_SKIP.search(result["message"]):
                    problems.append(f"GPU test {test_id}: {result['outcome']} ({result['message']}), expected a skip")
                continue
            if result["outcome"] != "passed":
                problems.append(f"new test {test_id}: {result['outcome']} in the {lane} ({result['message']})")
            if any(guard in test_id for guard in GUARDS):
                if only["outcome"] != "passed":
                    problems.append(f"guard {test_id} on unpatched NeMo RL: {only['outcome']} ({only['message']})")
            elif only["outcome"] != "failed" or not only["message"].startswith(ASSERTION_FAILURES):
                problems.append(f"new test {test_id} on unpatched NeMo RL: {only['outcome']} ({only['message']})")
    names = {_test_name(t) for t in new}
    if TWO_GPU_TEST not in names:
        problems.append(f"no two-GPU CPU-offload test ({TWO_GPU_TEST}) among the new tests")
    if not any(n.endswith(CPU_TWIN) and not any(g in n for g in GUARDS) for n in names):
        problems.append(f"no CPU twin of the two-GPU test (*{CPU_TWIN}) among the new tests")
    if len(new) < 5:
        problems.append(f"{len(new)} new tests, need at least 5")
    return {"count": len(new), "tests": new}, problems


# --- 5 and 6. 4 CPU ranks ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ranks_run(work: Path, tree: str, label: str, rank_args: list[str], timeout: float) -> dict[str, Any]:
    """4 processes of ``scripts/nemo_rl_rank.py`` on ``tree``; every one killed at ``timeout``."""
    out = work / f"ranks-{label}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    port, world = free_port(), 4
    procs = []
    start = time.monotonic()
    for rank in range(world):
        env = clean_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=str(work / tree),
        )
        cmd = [str(python_of(work / "env")), str(RANK_SCRIPT), "--out", str(out), *rank_args]
        handle = (out / f"rank{rank}.log").open("w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT), handle))
    deadline = start + timeout
    for proc, handle in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        handle.close()
    reports = []
    for rank in range(world):
        path = out / f"rank{rank}.json"
        reports.append(
            json.loads(path.read_text()) if path.exists() else {"rank": rank, "error": "no report (timed out?)"}
        )
    return {"seconds": round(time.monotonic() - start, 1), "reports": reports}


def group_label(desc: str) -> str:
    """torch's group description, as Automodel's enum names leave it (``mesh_MeshAxisName.TP``), made short."""
    return re.sub(r"MeshAxisName\.(\w+)", lambda m: m.group(1).lower(), desc)


def groups_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group description: its members on every rank, backend, timeouts, checks."""
    rows: dict[str, dict[str, Any]] = {}
    for report in result["reports"]:
        for group in report.get("groups", []):
            row = rows.setdefault(
                group_label(group["desc"]),
                {"members": [], "backend": group["backend"], "timeout_min": {}, "objects": set(), "allreduce": 0},
            )
            if group["ranks"] not in row["members"]:
                row["members"].append(group["ranks"])
            for device, minutes in group["timeout_min"].items():
                row["timeout_min"].setdefault(device, set()).add(round(minutes, 4))
            row["objects"].add(group["distinct_backends"])
            row["allreduce"] += bool(group["allreduce_cpu"])
    return [
        {
            "group": name,
            "members": row["members"],
            "backend": row["backend"],
            "timeout_min": {d: sorted(v) for d, v in sorted(row["timeout_min"].items())},
            "backend objects": sorted(row["objects"]),
            "CPU all-reduce ok on": row["allreduce"],
        }
        for name, row in rows.items()
    ]


def ranks_summary(result: dict[str, Any]) -> dict[str, Any]:
    """One 4-rank run, summarised: errors, how many groups each rank holds, the replica group, the table."""
    return {
        "seconds": result["seconds"],
        "errors": [f"rank {r['rank']}: {r['error']}" for r in result["reports"] if "error" in r],
        "groups per rank": [len(r.get("groups", [])) for r in result["reports"]],
        "replica group": sorted({group_label(r.get("replica_desc", "?")) for r in result["reports"]}),
        "full_tensor ok on": sum(bool(r.get("full_tensor_ok")) for r in result["reports"]),
        "table": groups_table(result),
    }


def ranks_verdict(label: str, tree: str, offload: bool, summary: dict[str, Any], minutes: float) -> list[str]:
    """Patched: every group on every rank reads ``minutes`` on every backend. Unpatched: some group must not."""
    table = summary["table"]
    wrong = [row["group"] for row in table if any(v != [round(minutes, 4)] for v in row["timeout_min"].values())]
    if tree == "unpatched":  # if every group already read the value, the check could not tell the change apart
        return [f"{label}: every group already reads {minutes:g} min unpatched"] if table and not wrong else []
    problems = [f"{label}: {e}" for e in summary["errors"]]
    if not table or wrong:
        problems.append(f"{label}: groups without {minutes:g} min on every backend: {wrong or 'no groups read'}")
    replica = summary["replica group"]
    if "?" in replica or any(r not in {row["group"] for row in table} for r in replica):
        problems.append(f"{label}: the replica group {replica} is not among the groups read")
    objects = 2 if offload else 1
    if any(row["backend objects"] != [objects] for row in table):
        problems.append(f"{label}: a group does not have {objects} backend object(s) per rank")
    if any(row["CPU all-reduce ok on"] != sum(len(m) for m in row["members"]) for row in table):
        problems.append(f"{label}: a CPU all-reduce failed")
    if summary["full_tensor ok on"] != 4:
        problems.append(f"{label}: full_tensor() of a dp-sharded CPU DTensor failed")
    return problems


def pretrained_verdict(label: str, tree: str, ranks: list[dict[str, Any]], minutes: float) -> list[str]:
    """Patched: the group Automodel makes in from_pretrained reads ``minutes`` when made; unpatched: Gloo's 30."""
    expected = minutes if tree == "patched" else 30.0
    problems = [f"{label}: rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    for r in ranks:
        made = r.get("made in from_pretrained") or []
        if not made:
            problems.append(f"{label}: rank {r['rank']} made no group in from_pretrained")
        wrong = [g for g in made if set(g["timeout_min"].values()) != {expected}]
        if wrong:
            problems.append(f"{label}: rank {r['rank']}: {wrong}, expected {expected:g} min")
    return problems


def ranks_step(work: Path, minutes: float) -> tuple[dict[str, Any], list[str]]:
    results: dict[str, Any] = {}
    problems: list[str] = []
    for tree in ("unpatched", "patched"):
        for offload in (False, True):
            label = f"{tree}, cpu_offload {'on' if offload else 'off'}"
            log(f"4 ranks: {label}")
            rank_args = ["--mode", "groups", "--minutes", f"{minutes:g}", "--tp", "2"]
            rank_args += ["--cpu-offload"] if offload else []
            result = ranks_run(work, tree, f"{tree}-offload-{'on' if offload else 'off'}", rank_args, 600)
            results[label] = ranks_summary(result)
            problems += ranks_verdict(label, tree, offload, results[label], minutes)
    for tree in ("unpatched", "patched"):
        label = f"{tree}, from_pretrained's weight download"
        log(f"4 ranks: {label}")
        rank_args = ["--mode", "pretrained", "--minutes", f"{minutes:g}", "--tp", "2", "--save-seconds", "5"]
        result = ranks_run(work, tree, f"{tree}-pretrained", rank_args, 600)
        keys = ("rank", "made in from_pretrained", "download_seconds", "error")
        ranks = [{k: r[k] for k in keys if k in r} for r in result["reports"]]
        results[label] = {"seconds": result["seconds"], "ranks": ranks}
        problems += pretrained_verdict(label, tree, ranks, minutes)
    return results, problems


def save_verdict(label: str, completes: bool, ranks: list[dict[str, Any]]) -> list[str]:
    """With the knob the save completes on every rank; without it, the barrier times out as #3624's does."""
    errors = [r["error"] for r in ranks if r.get("error")]
    if errors:
        return [f"#3624 {label}: {errors}"]
    done = [r.get("save") == "completed" for r in ranks]
    if completes and not all(done):
        return [f"#3624 {label}: the save did not complete on every rank: {ranks}"]
    if not completes and (all(done) or not any("Timed out" in (r.get("save") or "") for r in ranks)):
        return [f"#3624 {label}: expected the barrier to time out as #3624 does, got {ranks}"]
    return []


def save_step(work: Path) -> tuple[dict[str, Any], list[str]]:
    """#3624 scaled down: unpatched (the key ignored), patched with null, patched with the knob."""
    runs = (
        ("unpatched, knob 60 min (ignored)", "unpatched", SAVE_KNOB_MINUTES, False),
        ("patched, null", "patched", None, False),
        ("patched, knob 60 min", "patched", SAVE_KNOB_MINUTES, True),
    )
    results: dict[str, Any] = {
        "scale": f"1/{round(1 / SAVE_SCALE)}: torch's 30 min Gloo default -> {30 * 60 * SAVE_SCALE:g} s, "
        f"the save 40 min -> {SAVE_SECONDS:g} s, the knob 60 min -> {SAVE_KNOB_MINUTES:g} min",
    }
    problems: list[str] = []
    for label, tree, knob, completes in runs:
        log(f"#3624: {label}")
        rank_args = ["--mode", "save", "--tp", "2", "--scale", repr(SAVE_SCALE), "--save-seconds", f"{SAVE_SECONDS:g}"]
        rank_args += ["--minutes", "null" if knob is None else f"{knob:g}"]
        result = ranks_run(work, tree, f"save-{tree}-{'null' if knob is None else 'knob'}", rank_args, 600)
        ranks = [
            {
                k: r.get(k)
                for k in ("rank", "default_group_timeout_s", "save", "save_seconds", "error")
                if r.get(k) is not None
            }
            for r in result["reports"]
        ]
        results[label] = {"seconds": result["seconds"], "ranks": ranks}
        problems += save_verdict(label, completes, ranks)
    return results, problems


# --- 7. preflight, in its own layer ----------------------------------------------------------------------


def preflight_layer(args: argparse.Namespace, work: Path) -> Path:
    """A venv that sees NeMo RL's environment through a ``.pth`` and adds this project, leaving that one clean."""
    layer = work / "preflight-env"
    if not python_of(layer).exists():
        rc, out, _ = run(["uv", "venv", "--python", args.python, str(layer)], timeout=300)
        if rc != 0:
            raise RuntimeError(f"uv venv {layer} failed: {out[-2000:]}")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    below = subprocess.run([str(python_of(work / "env")), "-c", purelib], capture_output=True, text=True, check=True)
    above = subprocess.run([str(python_of(layer)), "-c", purelib], capture_output=True, text=True, check=True)
    (Path(above.stdout.strip()) / "_nemo_rl_env.pth").write_text(below.stdout.strip() + "\n")
    uv_pip(python_of(layer), "--no-deps", "--reinstall-package", "nemo-rl-shim", str(args.project))
    return layer


def preflight_verdict(label: str, tree: Path, expected: int, rc: int, output: str) -> list[str]:
    """The exit code ``expected`` of the tree; NeMo RL's own set-up of that tree ran; exit 1 names a group at torch's
    default."""
    problems = []
    if rc != expected:
        problems.append(f"preflight --setup nemo-rl, {label}: exited {rc}, expected {expected}")
    ran = f"set-up: NeMo RL's own setup_distributed ({tree / 'nemo_rl' / 'models' / 'automodel' / 'setup.py'})"
    if not any(line.startswith(ran) for line in output.splitlines()):
        problems.append(f"preflight --setup nemo-rl, {label}: no line {ran!r}: another set-up ran, or none")
    failed = next((line for line in output.splitlines() if line.startswith("preflight: FAILED: ")), "")
    if rc == 1 and "at torch's default" not in failed:
        problems.append(f"preflight --setup nemo-rl, {label}: exit 1 names no group at torch's default: {failed!r}")
    return problems


def _preflight_run(layer: Path, work: Path, tree: str, extra: tuple[str, ...]) -> tuple[int, str, dict[str, Any]]:
    cmd = [str(layer / "bin" / "nemo-rl-shim"), *PREFLIGHT_ARGS, *extra]
    rc, out, seconds = run(cmd, timeout=900, env=clean_env(PYTHONPATH=str(work / tree)), cwd=work / tree)
    lines = out.strip().splitlines()
    said = next((line for line in lines if line.startswith(("preflight: FAILED: ", "OK: "))), None)
    result = {"rc": rc, "seconds": round(seconds, 1), "verdict": said, "output": lines[-40:]}
    return rc, out, result


def preflight_step(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], list[str]]:
    layer = preflight_layer(args, work)
    result: dict[str, Any] = {"layer": str(layer), "command": ["nemo-rl-shim", *PREFLIGHT_ARGS], "runs": {}}
    problems: list[str] = []
    for tree, expected in PREFLIGHT_EXPECTED.items():
        for offload in ("--cpu-offload", "--no-cpu-offload"):
            label = f"{tree}, {offload}"
            log(f"preflight --setup nemo-rl: {label}")
            rc, out, run_result = _preflight_run(layer, work, tree, (offload,))
            result["runs"][label] = {**run_result, "expected": expected}
            problems += preflight_verdict(label, work / tree, expected, rc, out)
    for tree in PREFLIGHT_EXPECTED:
        label = f"{tree}, SGLang colocated (not judged)"
        log(f"preflight --setup nemo-rl: {label}")
        result["runs"][label] = _preflight_run(layer, work, tree, PREFLIGHT_SGLANG)[2]
    return result, problems


# --- 8. the pin bump, rehearsed -----------------------------------------------------------------------

#: Each known blocker of ``nemo_rl.models.automodel.setup`` on 0.7.0: how it shows, and the fix applied
#: in a scratch copy to reach the next one (the bump's own work: not part of the series).
BLOCKERS = (
    (
        "resolve_revision",
        "ImportError: transformers.utils.hub.resolve_revision (nemo-automodel 0.7.0 needs "
        "transformers 5.18.0; NeMo RL pins >=5.5.0,<5.9.0)",
        "raise NeMo RL's transformers range to 0.7.0's pin",
    ),
    (
        "Automodel now exports NeMoAutoModelForTokenClassification",
        "RuntimeError: NeMo RL's tripwire for the NeMoAutoModelForTokenClassification backport",
        "delete the local backport and import it from nemo_automodel",
    ),
    (
        "create_device_mesh",
        "ImportError: mesh_utils.create_device_mesh is gone",
        "build the mesh with MeshContext.build, still without a timeout (the value is already torch's default for "
        "new groups); once the pin includes NVIDIA-NeMo/Automodel#4602, forward timeout_minutes= and drop the "
        "AUTOMODEL-WORKAROUND(mesh-timeout) globals",
    ),
    (
        "MoEParallelizerConfig",
        "ImportError: MoEParallelizerConfig moved to nemo_automodel.components.distributed.config",
        "import it from nemo_automodel.components.distributed.config",
    ),
    (
        "deepseek_v3 tokenizer-blocklist",
        "AssertionError: NeMo RL's tripwire in nemo_rl/models/policy/__init__.py: its deepseek_v3 tokenizer-blocklist "
        "patch is for transformers <5.12",
        "check the upstream fix and delete _patch_transformers_tokenizer_class_set (NVIDIA-NeMo/RL#2764)",
    ),
)


def _scratch_fix(setup: Path, key: str) -> None:
    text = setup.read_text()
    if key.startswith("Automodel now exports"):
        text = re.sub(
            r"try:\n    from nemo_automodel import NeMoAutoModelForTokenClassification\n.*?\n\n\n",
            "from nemo_automodel import NeMoAutoModelForTokenClassification\n\n\n",
            text,
            count=1,
            flags=re.S,
        )
    elif key == "create_device_mesh":
        text = text.replace(
            "from nemo_automodel.components.distributed.mesh_utils import create_device_mesh\n",
            "create_device_mesh = None  # scratch: the bump builds with MeshContext.build\n",
        )
    elif key == "MoEParallelizerConfig":
        text = text.replace(
            "from nemo_automodel.components.moe.config import MoEParallelizerConfig",
            "from nemo_automodel.components.distributed.config import MoEParallelizerConfig",
        )
    elif key == "deepseek_v3 tokenizer-blocklist":
        policy = setup.parents[1] / "policy" / "__init__.py"
        policy.write_text(policy.read_text().replace("\n_patch_transformers_tokenizer_class_set()\n", "\n"))
    setup.write_text(text)


def bump_blockers(work: Path, tree: str) -> list[dict[str, str]]:
    scratch = work / f"bump-{tree}"
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(work / tree / "nemo_rl", scratch / "nemo_rl")
    setup = scratch / "nemo_rl" / "models" / "automodel" / "setup.py"
    found: list[dict[str, str]] = []
    env = clean_env(PYTHONPATH=str(scratch))
    for _ in range(len(BLOCKERS) + 2):
        rc, out, _ = run(
            [str(python_of(work / "env")), "-c", "import nemo_rl.models.automodel.setup"], env=env, timeout=300
        )
        if rc == 0:
            return found
        last = [line for line in out.splitlines() if re.match(r"^\w+(Error|Exception)\b", line)]
        error = last[-1] if last else out.strip().splitlines()[-1]
        known = next((b for b in BLOCKERS if b[0] in error), None)
        if known is None or any(f["key"] == known[0] for f in found):
            found.append({"key": "unknown", "error": error, "fix": "unknown: the rehearsal stops here"})
            return found
        found.append({"key": known[0], "error": error, "what": known[1], "fix": known[2]})
        if known[0] == "resolve_revision":
            uv_pip(python_of(work / "env"), f"transformers=={BUMP_TRANSFORMERS}")  # with its deps: tokenizers 0.23
        else:
            _scratch_fix(setup, known[0])
    found.append({"key": "unknown", "error": "too many blockers", "fix": "unknown"})
    return found


def bump_step(work: Path) -> tuple[dict[str, Any], list[str]]:
    env, pin = python_of(work / "env"), automodel_transformers(work / "automodel")
    marker = work / "env" / ENV_MARKER
    saved = marker.read_text() if marker.exists() else None
    marker.unlink(missing_ok=True)  # the environment is not the pin's until it is put back
    result: dict[str, Any] = {}
    try:
        for tree in ("unpatched", "patched"):
            uv_pip(env, "--no-deps", f"nemo-automodel=={BUMP_AUTOMODEL}")
            # With its dependencies: the previous pass left 5.18.0's tokenizers, which 5.5.0 refuses.
            uv_pip(env, f"transformers=={pin}")
            result[tree] = bump_blockers(work, tree)
    finally:  # the pin back, for any later step and run
        uv_pip(env, f"transformers=={pin}")
        uv_pip(env, "--no-deps", "--reinstall-package", "nemo-automodel", str(work / "automodel"))
        if saved:
            marker.write_text(saved)
    before = [b["key"] for b in result["unpatched"]]
    after = [b["key"] for b in result["patched"]]
    problems = (
        [f"the series changes the bump's blockers: {before} unpatched, {after} patched"] if after != before else []
    )
    return result, problems


# --- the summary as markdown (the PR description's tables) ----------------------------------------


def _cell(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]


def render_markdown(summary: dict[str, Any]) -> str:
    """The figures of a run, as the tables the PR description quotes."""
    out: list[str] = []
    driver = summary.get("driver", {})
    if "patched" in driver and "unpatched" in driver:
        rows = []
        for kind in ("master_config", "policy", "shim_keys"):
            for label, outcomes in driver["patched"].get(kind, {}).items():
                cases = outcomes.items() if isinstance(outcomes, dict) else [("", outcomes)]
                for value, outcome in cases:
                    before = driver["unpatched"][kind][label]
                    before = before[value] if isinstance(before, dict) else before
                    rows.append([label, value, f"`{before[:60]}`", f"`{outcome.split(' [type=')[0][:170]}`"])
        out += ["### The driver", "", *_table(["section", "value", "unpatched", "patched"], rows), ""]
    tests = summary.get("tests", {})
    if tests:
        rows = []
        for lane, _, selection in LANES:
            cells = [f"`{' '.join(selection)}`"]
            for tree in ("unpatched", "tests-only", "patched"):
                result = tests.get(f"{tree}: {lane}")
                counts = ", ".join(f"{n} {k}" for k, n in sorted(result["counts"].items())) if result else "-"
                cells.append(f"{counts or 'none collected'} ({result['seconds']:g} s)" if result else "-")
            rows.append(cells)
        out += ["### NeMo RL's tests", "", *_table(["selection", "unpatched", "tests only", "patched"], rows), ""]
        new = tests.get("new tests", {}).get("tests", {})
        rows = [
            [f"`{t.split('::', 1)[1]}`", r["patched"], r["tests-only"], f"`{r['message'][:90]}`"]
            for t, r in new.items()
        ]
        out += ["### The new tests", "", *_table(["test", "patched (lane)", "tests only", "message"], rows), ""]
    for label, result in summary.get("ranks", {}).items():
        if "ranks" in result:  # from_pretrained's weight download
            rows = [
                [r["rank"], "; ".join(f"{g['desc']} at {g['at_s']:g} s: " + ", ".join(f"{d} {m:g}" for d, m in
                 g["timeout_min"].items()) for g in r.get("made in from_pretrained", [])) or r.get("error", "-"),
                 r.get("download_seconds", "-")]
                for r in result["ranks"]
            ]  # fmt: skip
            out += [f"### 4 ranks, {label} ({result['seconds']:g} s)", ""]
            out += [*_table(["rank", "group made, when, timeout (min)", "download (s)"], rows), ""]
            continue
        out += [f"### 4 ranks, {label} ({result['seconds']:g} s)", ""]
        out += [f"Groups per rank: {result['groups per rank']}; replica group: {result['replica group']};"]
        out += [f"`full_tensor()` ok on {result['full_tensor ok on']} of 4; errors: {result['errors'] or 'none'}", ""]
        rows = [
            [f"`{r['group']}`", " ".join(map(str, r["members"])), f"`{r['backend']}`",
             ", ".join(f"{d} {'/'.join(f'{m:g}' for m in v)}" for d, v in r["timeout_min"].items()),
             "/".join(map(str, r["backend objects"])), r["CPU all-reduce ok on"]]
            for r in result["table"]
        ]  # fmt: skip
        out += _table(["group", "members", "backend", "timeout (min)", "backend objects", "CPU all-reduce ok"], rows)
        out += [""]
    runs = summary.get("preflight", {}).get("runs", {})
    if runs:
        rows = [
            [label, r["rc"], r.get("expected", "not judged"), f"`{r['verdict'] or '-'}`", f"{r['seconds']:g} s"]
            for label, r in runs.items()
        ]
        out += ["### `preflight --setup nemo-rl`, 4 ranks, tp 2, 45 min", ""]
        out += [*_table(["tree, run", "exit", "expected", "what it says", "wall"], rows), ""]
    save = summary.get("save", {})
    if save:
        out += ["### NVIDIA-NeMo/RL#3624, scaled down", "", save["scale"], ""]
        for label, result in save.items():
            if label == "scale":
                continue
            rows = [
                [r["rank"], r.get("default_group_timeout_s", "-"), r.get("save_seconds", "-"),
                 f"`{r.get('save') or r.get('error')}`"]
                for r in result["ranks"]
            ]  # fmt: skip
            out += [f"**{label}** ({result['seconds']:g} s)", ""]
            out += [*_table(["rank", "default group's timeout (s)", "save (s)", "outcome"], rows), ""]
    return "\n".join(out)


# --- driver -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-git", type=Path, help="NeMo RL's git directory or a checkout of it")
    parser.add_argument("--rev", default="7ea279abf", help="the NeMo RL commit the series is against")
    parser.add_argument("--automodel-git", type=Path, help="Automodel's git directory")
    parser.add_argument("--automodel-rev", help="the Automodel commit (default: NeMo RL's submodule pin)")
    parser.add_argument(
        "--python",
        default=str(
            Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions" / "3.13.0" / "bin" / "python3.13"
        ),
    )
    parser.add_argument("--project", type=Path, default=ROOT, help="the nemo-rl-shim checkout preflight installs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nemo-rl-check"), help="outside this project; reused")
    parser.add_argument("--steps", default="driver,tests,ranks,save,preflight,bump", help="series and env always run")
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--pytest-timeout", type=float, default=1200)
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--markdown", type=Path, help="write the figures as markdown tables here")
    parser.add_argument("--render", type=Path, help="only render --markdown from this summary JSON")
    args = parser.parse_args(argv)
    if not args.render and not (args.rl_git and args.automodel_git):
        parser.error("--rl-git and --automodel-git are required (unless --render)")
    if ROOT in args.work.resolve().parents or args.work.resolve() == ROOT:
        parser.error(f"--work must be outside this project, got {args.work}")
    unknown = set(args.steps.split(",")) - {"driver", "tests", "ranks", "save", "preflight", "bump", ""}
    if unknown:
        parser.error(f"--steps: unknown step(s) {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        text = render_markdown(json.loads(args.render.read_text()))
        args.markdown.write_text(text) if args.markdown else print(text)
        return 0
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    steps = set(args.steps.split(","))
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    problems: list[str] = []
    start = time.monotonic()

    def step(name: str, call: Any) -> None:
        log(name)
        began = time.monotonic()
        try:
            result, found = call()
        except Exception as e:  # a step that cannot run is a failure, never a pass
            result, found = {"error": f"{type(e).__name__}: {e}"}, [f"{name}: could not run: {type(e).__name__}: {e}"]
        summary[name] = result
        summary.setdefault("step seconds", {})[name] = round(time.monotonic() - began, 1)
        problems.extend(found)

    step("series", lambda: series_step(args, work))
    step("env", lambda: env_step(args, work))
    if "error" not in summary["series"] and "error" not in summary["env"]:
        if "driver" in steps:
            step("driver", lambda: driver_step(work))
        if "tests" in steps:
            step("tests", lambda: tests_step(work, args.pytest_timeout))
        if "ranks" in steps:
            step("ranks", lambda: ranks_step(work, args.minutes))
        if "save" in steps:
            step("save", lambda: save_step(work))
        if "preflight" in steps:
            step("preflight", lambda: preflight_step(args, work))
        if "bump" in steps:
            step("bump", lambda: bump_step(work))
        after = absent_from(work / "env", "nemo_rl_shim")
        summary["this project still absent from NeMo RL's environment"] = after["nemo_rl_shim"]
        if not after["nemo_rl_shim"]:
            problems.append("a step left this project importable in NeMo RL's environment")
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary["problems"] = problems
    text = json.dumps(summary, indent=1, default=sorted)
    if args.json:
        args.json.write_text(text)
    if args.markdown:
        args.markdown.write_text(render_markdown(summary))
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
