"""The pin bump, rehearsed: a copy of this project relocked onto a fixed nemo-automodel, used as a new user would.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): this rehearses the day that workaround goes.

The release that carries NVIDIA-NeMo/Automodel#4602 is not out, so the fixture wheel
``0.7.0+fixed.getbackendconfig`` stands in for it (:mod:`tests.harness.fixture_wheels`: the real
0.7.0 wheel whose override learns the default group from ``get_backend_config()``, the
style that made the old probe raise). A temporary copy of the project points the
``automodel`` extra at that wheel (``[tool.uv.sources]``), runs ``uv lock`` and
``uv sync --locked --extra automodel`` into its own ``.venv``, and then, with that
environment, as a user would (the three started together):

* ``nemo-rl-shim status``: keep-cpu-backend not needed (the CPU half is kept natively),
  cpu-mesh-timeout still needed, and its sample decision for a GPU run with CPU offload,
  ``decide(45, cpu_offload=True, cpu_mesh=False)``, is FORWARD, natively;
* the copy's own tests: keep-cpu-backend's tripwire fails and prints its removal steps,
  cpu-mesh-timeout's passes, and the native variant of the GPU test is no longer gated on
  the pin, only on the device count (one pytest run);
* ``nemo-rl-shim preflight --timeout-minutes 45``: exit 0, every group at 45 min, because
  the CPU-mesh workaround still applies.

The rehearsal's wall time is printed and recorded (``record_property``), not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.at_once import run_at_once
from tests.harness.fixture_wheels import fixture_version, fixture_wheel
from tests.harness.paths import REPO_ROOT
from tests.harness.releases import ReleaseUnavailable
from tests.harness.skips import unavailable

__all__: list[str] = []

pytestmark = [pytest.mark.releases, pytest.mark.multiprocess]

STYLE = "getbackendconfig"
#: A bound on each step (the relock, the sync, the checks). The sync writes every package's bytecode (about 30 s of
#: CPU alone): 204 s alone in a run of the suite, past 420 s with two suites and more work at a load of 50 on 2 cores.
STEP_TIMEOUT_S = 900
KEEP, CPU_MESH = "keep-cpu-backend", "cpu-mesh-timeout"
TIMEOUT = 45.0
#: Variables of this run that must not leak into the copy's own environment.
_FOREIGN = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        unavailable("the pin-bump rehearsal relocks a copy with uv, and no uv was found (UV unset, none on PATH)")
    return found


def _copy_project(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _point_the_extra_at(project: Path, wheel: Path) -> None:
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    assert "[tool.uv.sources]" not in text, "the rehearsal expects to add the only [tool.uv.sources] table"
    pyproject.write_text(
        text + f'\n[tool.uv.sources]\nnemo-automodel = [{{ path = "{wheel}", extra = "automodel" }}]\n'
    )


class _Copy:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        self.python = str(root / ".venv" / "bin" / "python")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=self.root, env=self.env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False
        )


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> dict[str, Any]:
    uv = _uv()
    try:
        wheel = fixture_wheel(STYLE)
    except ReleaseUnavailable as e:
        unavailable(f"the fixture wheel needs nemo-automodel 0.7.0 from the index: {e}")
    start = time.monotonic()
    copy = _Copy(_copy_project(tmp_path_factory.mktemp("pin-bump")))
    _point_the_extra_at(copy.root, wheel)
    facts: dict[str, Any] = {"wheel": str(wheel)}
    for step, args in (("lock", (uv, "lock")), ("sync", (uv, "sync", "--locked", "--extra", "automodel"))):
        done = copy.run(*args)
        if done.returncode != 0:
            unavailable(f"`uv {step}` of the copy failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    facts["locked"] = (copy.root / "uv.lock").read_text()
    facts["relock_s"] = time.monotonic() - start
    python = copy.python
    tests = ["tests/automodel_patch/test_tripwire.py", "tests/test_gpu.py"]
    # The three checks of the relocked copy are independent: started together, they share their imports' wait.
    facts.update(
        run_at_once(
            {
                "status": ([python, "-m", "nemo_rl_shim", "status", "--json"], copy.env),
                "tests": ([python, "-m", "pytest", "-n", "0", "-rfs", "-p", "no:cacheprovider", *tests], copy.env),
                "preflight": ([python, "-m", "nemo_rl_shim", "preflight", "--timeout-minutes", "45"], copy.env),
            },
            timeout_s=STEP_TIMEOUT_S,
            cwd=copy.root,
        )
    )
    facts["wall_s"] = time.monotonic() - start
    return facts


def test_the_copy_is_locked_and_synced_onto_the_fixed_wheel(rehearsal) -> None:
    version = fixture_version(STYLE)
    assert f'name = "nemo-automodel"\nversion = "{version}"' in rehearsal["locked"]
    status = json.loads(rehearsal["status"].stdout)
    assert status["nemo_automodel"] == version


def test_status_says_the_cpu_half_is_kept_natively(rehearsal) -> None:
    done = rehearsal["status"]
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads(done.stdout)
    verdicts = {w["name"]: w["verdict"] for w in status["workarounds"]}
    assert verdicts == {KEEP: "not_needed", CPU_MESH: "needed"}


def test_keep_cpu_backend_tripwire_fails_with_its_removal_steps(rehearsal) -> None:
    done = rehearsal["tests"]
    assert done.returncode == 1, done.stdout[-3000:]
    assert "FAILED tests/automodel_patch/test_tripwire.py::test_keep_cpu_backend_is_still_needed" in done.stdout
    assert "1 failed, 1 passed, 3 skipped" in done.stdout, done.stdout[-1000:]
    assert "now satisfies the removal condition of the keep-cpu-backend workaround" in done.stdout
    assert 'grep -rn "AUTOMODEL-WORKAROUND(keep-cpu-backend)" .' in done.stdout
    assert "automodel_patch/keep-cpu-backend.patch: the source patch for forks: delete the file" in done.stdout


def test_decide_forwards_natively_under_cpu_offload(rehearsal) -> None:
    """``decide(45, cpu_offload=True, cpu_mesh=False)``, as status computed it in the copy's environment."""
    (on_gpu,) = [d for d in json.loads(rehearsal["status"].stdout)["decisions"] if d["run"] == "GPUs, CPU offload"]
    assert (on_gpu["cpu_offload"], on_gpu["default_backend"]) == (True, "cuda:nccl,cpu:gloo")
    assert (on_gpu["action"], on_gpu["applies"], on_gpu["warning"]) == ("forward", [], None)
    assert on_gpu["reason"] == "the installed Automodel keeps the CPU half natively"


def test_the_native_gpu_variant_is_gated_only_on_the_device_count(rehearsal) -> None:
    done = rehearsal["tests"]
    reasons = sorted(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("SKIPPED"))
    # pytest folds equal reasons: "[2]" is both two-GPU variants, native included, skipped on the count alone.
    assert [line for line in done.stdout.splitlines() if line.startswith("SKIPPED [2] tests/test_gpu.py")], reasons
    assert reasons == ["Need 1 CUDA device, got 0", "Need 2 CUDA devices, got 0"], reasons


def test_preflight_exits_0_with_every_group_at_45_minutes(rehearsal, record_property) -> None:
    done = rehearsal["preflight"]
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "decision: patch_and_forward: on a CPU (gloo) mesh" in text  # cpu-mesh-timeout still applies
    table = text[text.index("\ngroup ") + 1 : text.index("(ranks '0 | 1'")]
    rows = [line for line in table.splitlines()[1:] if line.strip()]
    assert len(rows) >= 9 and all(" 45 min " in row for row in rows), table
    assert "OK: every group torch holds carries the configured timeout on every backend; collectives work" in text
    record_property("rehearsal_wall_s", round(rehearsal["wall_s"], 1))
    print(f"\npin-bump rehearsal: {rehearsal['wall_s']:.1f} s (relock and sync {rehearsal['relock_s']:.1f} s)\n{text}")
