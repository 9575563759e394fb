"""Check the NeMo RL pull request (``nemo_rl_shim/upstream/``) inside NeMo RL itself, on this CPU machine.

Builds NeMo RL's test environment outside this project: a CPython 3.13 venv with the packages of
NeMo RL's ``uv.lock`` that its tests import (versions read from that lock), the Automodel commit
NeMo RL pins as its submodule (installed with ``--no-deps``), NeMo RL's source on ``PYTHONPATH``
(NeMo RL cannot be pip-installed here: its git-URL dependencies are out of reach), and this
project, installed from its own checkout root. NeMo RL and Automodel are fetched (git bare
directories or a NeMo RL checkout), never committed. Then, each step bounded in time:

1. ``tests``: NeMo RL's own tests on three trees made from the same commit: unpatched, unpatched
   with only the series' new test file (``0004``), and patched (the whole series, ``git apply``):
   the whole set-up file (``-m "not hf_gated"``), its automodel lane (``--automodel-only``), the
   reference configs (``test_config_v2.py -k reference``) and the new tests.
2. ``ranks``: NeMo RL's ``setup_distributed``, called for real on 4 CPU ranks (tp 2), CPU offload
   off and on, unpatched and patched, with only NCCL's name swapped for Gloo
   (``scripts/nemo_rl_rank.py`` says how); every group's timeout read back on every rank.
3. ``preflight``: ``nemo-rl-shim preflight`` in that environment.
4. ``bump``: the pin bump rehearsed: nemo-automodel 0.7.0 with transformers 5.5.0, then 5.18.0;
   every import or check that stops ``nemo_rl.models.automodel.setup``, each with its fix applied
   in a scratch copy to find the next, unpatched and patched. The environment's pin is put back.

Prints one summary (and ``--json`` writes it). Exits 0 only when every expectation holds: the
tests that pass unpatched still pass patched, every new test fails on unpatched NeMo RL and passes
patched, every group on every rank reads the timeout on every backend, and the series adds nothing
to the bump's list. A step that cannot run is a failure, never a pass.

    python3 scripts/nemo_rl_check.py --rl-git /work/.mirror/NVIDIA-NeMo+RL/repo \\
        --automodel-git /work/.mirror/NVIDIA-NeMo+Automodel/repo --work /tmp/nemo-rl-check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERIES = sorted((ROOT / "nemo_rl_shim" / "upstream").glob("0*.patch"))
TEST_PATCH = next((p for p in SERIES if p.name.startswith("0004")), None)
NEW_TESTS = "tests/unit/models/automodel/test_automodel_distributed_timeout.py"
SETUP_TESTS = "tests/unit/models/automodel/test_automodel_setup.py"
RANK_SCRIPT = ROOT / "scripts" / "nemo_rl_rank.py"
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
]
#: The bump rehearsal: nemo-automodel 0.7.0 and the transformers it pins.
BUMP_AUTOMODEL, BUMP_TRANSFORMERS = "0.7.0", "5.18.0"


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


# --- the environment ---------------------------------------------------------------------------


def lock_versions(lock: Path) -> dict[str, str]:
    versions: dict[str, list[str]] = {}
    for package in tomllib.loads(lock.read_text())["package"]:
        if "version" in package:  # a workspace or git source may have none
            versions.setdefault(package["name"], []).append(package["version"])
    # The newest a lock holds; transformers is taken from Automodel's own pin instead (build_env).
    return {
        name: max(found, key=lambda v: [int(x) if x.isdigit() else 0 for x in re.split(r"[.+]", v)])
        for name, found in versions.items()
    }


def export_tree(args: argparse.Namespace, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if args.rl_checkout:
        shutil.copytree(args.rl_checkout, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "3rdparty"))
        return
    archive = subprocess.run(
        [
            "git",
            f"--git-dir={args.rl_git}",
            "archive",
            args.rev,
            "nemo_rl",
            "tests",
            "examples",
            "pyproject.toml",
            "uv.lock",
        ],
        capture_output=True,
        check=True,
        timeout=300,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=300)


def automodel_commit(args: argparse.Namespace) -> str:
    if args.automodel_rev:
        return args.automodel_rev
    line = subprocess.run(
        ["git", f"--git-dir={args.rl_git}", "ls-tree", args.rev, "3rdparty/Automodel-workspace/Automodel"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return line[2]


def uv_pip(env: Path, *specs: str, timeout: float = 1200) -> None:
    rc, out, _ = run(["uv", "pip", "install", "--python", str(env / "bin" / "python"), *specs], timeout=timeout)
    if rc != 0:
        raise RuntimeError(f"uv pip install {' '.join(specs)} failed ({rc}):\n{out[-3000:]}")


def export_automodel(args: argparse.Namespace, work: Path) -> tuple[str, Path]:
    commit, source = automodel_commit(args), work / "automodel"
    if source.exists():
        shutil.rmtree(source)
    source.mkdir()
    archive = subprocess.run(
        ["git", f"--git-dir={args.automodel_git}", "archive", commit], capture_output=True, check=True, timeout=300
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True, timeout=300)
    return commit, source


def automodel_transformers(source: Path) -> str:
    """The ``transformers==`` that the Automodel at ``source`` pins (NeMo RL's range allows it)."""
    for requirement in tomllib.loads((source / "pyproject.toml").read_text())["project"]["dependencies"]:
        if requirement.replace(" ", "").startswith("transformers=="):
            return requirement.split("==")[1]
    raise RuntimeError(f"{source}/pyproject.toml pins no transformers==")


def build_env(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = work / "env"
    start = time.monotonic()
    if not (env / "bin" / "python").exists():
        run(["uv", "venv", "--python", args.python, str(env)], timeout=300)
    commit, source = export_automodel(args, work)
    versions = {**lock_versions(work / "unpatched" / "uv.lock"), "transformers": automodel_transformers(source)}
    specs = [f"{name}=={versions[name].split('+')[0]}" if name in versions else name for name in PACKAGES]
    uv_pip(env, *[s.replace("ray==", "ray[default]==") for s in specs])
    uv_pip(env, "--no-deps", "--reinstall-package", "nemo-automodel", str(source))
    uv_pip(env, "--no-deps", "--reinstall-package", "nemo-rl-shim", str(args.project))
    return {
        "python": args.python,
        "automodel_commit": commit,
        "seconds": round(time.monotonic() - start, 1),
        "transformers": versions["transformers"],
        "torch": versions.get("torch"),
    }


def apply_series(tree: Path, patches: list[Path]) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True, timeout=60)
    for patch in patches:
        done = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{patch.name} does not apply: {done.stderr.strip()}")


# --- NeMo RL's tests -----------------------------------------------------------------------------

_COUNT = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")


def pytest(work: Path, tree: Path, label: str, *selection: str, timeout: float) -> dict[str, Any]:
    # Short and private: Ray's socket paths under it must stay within AF_UNIX's 107 bytes.
    raytmp = Path(tempfile.mkdtemp(prefix="nrlray"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=str(raytmp), PYTHONPATH=str(tree), HF_HOME=str(work / "hf"), PYTHONDONTWRITEBYTECODE="1")
    # The Ray head's dashboard modules get 30 s to start; on a loaded 2-core machine they took longer
    # and every test of the session errored at set-up. A bound on the machine, not on the tests.
    env.setdefault("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "300")
    cmd = [
        str(work / "env" / "bin" / "python"),
        "-m",
        "pytest",
        *selection,
        "--maxfail=100000",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    log(f"pytest {label}: {' '.join(selection)}")
    rc, out, seconds = run(cmd, cwd=tree, env=env, timeout=timeout)
    if "failed to start" in out and not re.search(r"\d+ passed", out):  # the Ray head, not a test: once more
        log(f"pytest {label}: the Ray head did not start; again")
        rc, out, seconds = run(cmd, cwd=tree, env=env, timeout=timeout)
    shutil.rmtree(raytmp, ignore_errors=True)
    (work / f"pytest-{label}.log").write_text(out)
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    counts = {kind.rstrip("s") if kind == "errors" else kind: int(n) for n, kind in _COUNT.findall(summary)}
    return {"rc": rc, "seconds": round(seconds, 1), "counts": counts, "summary": summary.strip("= ")}


def tests_step(work: Path, timeout: float) -> dict[str, Any]:
    lanes = {
        "setup file": (SETUP_TESTS, "-m", "not hf_gated"),
        "automodel lane": (SETUP_TESTS, "--automodel-only"),
        "reference configs": ("tests/unit/test_config_v2.py", "-k", "reference"),
    }
    results: dict[str, Any] = {}
    for tree in ("unpatched", "patched"):
        for name, selection in lanes.items():
            results[f"{tree}: {name}"] = pytest(
                work, work / tree, f"{tree}-{name.split()[0]}", *selection, timeout=timeout
            )
    results["tests only: new tests"] = pytest(
        work, work / "tests-only", "tests-only", NEW_TESTS, "--automodel-only", timeout=timeout
    )
    results["patched: new tests"] = pytest(
        work, work / "patched", "patched-new", NEW_TESTS, "--automodel-only", timeout=timeout
    )
    results["patched: lane with new tests"] = pytest(
        work, work / "patched", "patched-lane-new", SETUP_TESTS, NEW_TESTS, "--automodel-only", timeout=timeout
    )
    return results


def tests_verdict(results: dict[str, Any]) -> list[str]:
    problems = []
    for name in ("setup file", "automodel lane", "reference configs"):
        before, after = results[f"unpatched: {name}"]["counts"], results[f"patched: {name}"]["counts"]
        if not before.get("passed"):
            problems.append(f"unpatched {name}: nothing passed ({results[f'unpatched: {name}']['summary']})")
        if after.get("passed", 0) != before.get("passed", 0) or after.get("failed") or after.get("error"):
            problems.append(f"{name}: {before} unpatched, {after} patched")
    only, new = results["tests only: new tests"]["counts"], results["patched: new tests"]["counts"]
    if only.get("passed"):
        problems.append(f"new tests on unpatched NeMo RL: {only.get('passed')} passed, none should")
    if new.get("failed") or new.get("error") or new.get("passed", 0) < 5:
        problems.append(f"new tests patched: {new}, need at least 5 passed and none failed")
    return problems


# --- 4 CPU ranks -------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ranks_run(work: Path, tree: Path, cpu_offload: bool, minutes: float, timeout: float) -> dict[str, Any]:
    out = work / f"ranks-{tree.name}-{'offload' if cpu_offload else 'no-offload'}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    port, world = free_port(), 4
    procs = []
    start = time.monotonic()
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(tree),
        }
        cmd = [
            str(work / "env" / "bin" / "python"),
            str(RANK_SCRIPT),
            "--minutes",
            str(minutes),
            "--tp",
            "2",
            "--out",
            str(out),
            *(["--cpu-offload"] if cpu_offload else []),
        ]
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


def ranks_table(result: dict[str, Any], minutes: float) -> tuple[list[str], list[str]]:
    lines, problems = [], []
    for report in result["reports"]:
        rank = report["rank"]
        if "error" in report:
            problems.append(f"rank {rank}: {report['error']}")
            continue
        for name, group in report["groups"].items():
            timeouts = " ".join(f"{d}={m:g}" for d, m in sorted(group["timeout_min"].items()))
            ok = all(abs(m - minutes) < 1e-6 for m in group["timeout_min"].values())
            lines.append(
                f"| {rank} | {name} | {group['ranks']} | {group['backend']} | {timeouts} | "
                f"{'yes' if group['allreduce_cpu'] else 'NO'} |"
            )
            if not ok:
                problems.append(f"rank {rank} group {name}: {timeouts} min, expected {minutes:g}")
            if not group["allreduce_cpu"]:
                problems.append(f"rank {rank} group {name}: CPU all-reduce gave a wrong sum")
        if not report.get("full_tensor_ok"):
            problems.append(f"rank {rank}: full_tensor() of a dp-sharded CPU DTensor failed")
    return lines, problems


# --- the pin bump, rehearsed ---------------------------------------------------------------------

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
        "build the mesh with MeshContext.build (the series' _build_mesh_with_timeout path already does)",
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


def bump_blockers(work: Path, tree: Path, label: str) -> list[dict[str, str]]:
    scratch = work / f"bump-{label}"
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(tree / "nemo_rl", scratch / "nemo_rl")
    setup = scratch / "nemo_rl" / "models" / "automodel" / "setup.py"
    found: list[dict[str, str]] = []
    env = {**os.environ, "PYTHONPATH": str(scratch)}
    for _ in range(len(BLOCKERS) + 2):
        rc, out, _ = run(
            [str(work / "env" / "bin" / "python"), "-c", "import nemo_rl.models.automodel.setup"], env=env, timeout=300
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
            uv_pip(work / "env", f"transformers=={BUMP_TRANSFORMERS}")  # with its deps: tokenizers 0.23
        else:
            _scratch_fix(setup, known[0])
    found.append({"key": "unknown", "error": "too many blockers", "fix": "unknown"})
    return found


def bump_step(work: Path) -> dict[str, Any]:
    env = work / "env"
    result: dict[str, Any] = {}
    try:
        for label in ("unpatched", "patched"):
            uv_pip(env, "--no-deps", f"nemo-automodel=={BUMP_AUTOMODEL}")
            # With its dependencies: the previous pass left 5.18.0's tokenizers 0.23.3, which 5.5.0 refuses.
            uv_pip(env, f"transformers=={automodel_transformers(work / 'automodel')}")
            result[label] = bump_blockers(work, work / label, label)
    finally:  # the pin back, for any later step
        uv_pip(env, f"transformers=={automodel_transformers(work / 'automodel')}")
        uv_pip(env, "--no-deps", "--reinstall-package", "nemo-automodel", str(work / "automodel"))
    return result


# --- driver -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rl-git", type=Path, help="NeMo RL's git directory (a bare mirror)")
    source.add_argument(
        "--rl-checkout", type=Path, help="a NeMo RL checkout at --rev (its submodule pin is read from --automodel-rev)"
    )
    parser.add_argument("--rev", default="7ea279abf", help="the NeMo RL commit the series is against")
    parser.add_argument("--automodel-git", type=Path, required=True, help="Automodel's git directory")
    parser.add_argument("--automodel-rev", help="the Automodel commit (default: NeMo RL's submodule pin)")
    parser.add_argument(
        "--python",
        default=str(
            Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions" / "3.13.0" / "bin" / "python3.13"
        ),
    )
    parser.add_argument("--project", type=Path, default=ROOT, help="the nemo-rl-shim checkout to install")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nemo-rl-check"), help="outside this project")
    parser.add_argument("--steps", default="tests,ranks,preflight,bump")
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--pytest-timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, help="write the summary here")
    args = parser.parse_args(argv)
    if args.rl_checkout and not args.automodel_rev:
        parser.error("--rl-checkout needs --automodel-rev (NeMo RL's 3rdparty/Automodel-workspace/Automodel commit)")
    if ROOT in args.work.resolve().parents or args.work.resolve() == ROOT:
        parser.error(f"--work must be outside this project, got {args.work}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    steps = set(args.steps.split(","))
    summary: dict[str, Any] = {"series": [p.name for p in SERIES]}
    problems: list[str] = []
    log("trees: unpatched, tests-only, patched")
    for tree in ("unpatched", "tests-only", "patched"):
        export_tree(args, work / tree)
    apply_series(work / "tests-only", [TEST_PATCH])
    apply_series(work / "patched", SERIES)
    log("environment")
    summary["environment"] = build_env(args, work)
    if "tests" in steps:
        summary["tests"] = tests_step(work, args.pytest_timeout)
        problems += tests_verdict(summary["tests"])
    if "ranks" in steps:
        summary["ranks"] = {}
        for tree in ("unpatched", "patched"):
            for offload in (False, True):
                label = f"{tree}, cpu_offload {'on' if offload else 'off'}"
                log(f"4 ranks: {label}")
                result = ranks_run(work, work / tree, offload, args.minutes, timeout=300)
                lines, rank_problems = ranks_table(result, args.minutes)
                summary["ranks"][label] = {"seconds": result["seconds"], "table": lines, "problems": rank_problems}
                if tree == "patched":
                    problems += [f"{label}: {p}" for p in rank_problems]
    if "preflight" in steps:
        rc, out, seconds = run(
            [
                str(work / "env" / "bin" / "nemo-rl-shim"),
                "preflight",
                "--timeout-minutes",
                f"{args.minutes:g}",
                "--nproc",
                "4",
                "--tp",
                "2",
            ],
            timeout=600,
        )
        summary["preflight"] = {"rc": rc, "seconds": round(seconds, 1), "output": out.strip().splitlines()[-40:]}
        if rc != 0:
            problems.append(f"preflight exited {rc}")
    if "bump" in steps:
        summary["bump"] = bump_step(work)
        before = [b["key"] for b in summary["bump"]["unpatched"]]
        after = [b["key"] for b in summary["bump"]["patched"]]
        if after != before:
            problems.append(f"the series changes the bump's blockers: {before} unpatched, {after} patched")
    summary["problems"] = problems
    text = json.dumps(summary, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
