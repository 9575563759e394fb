"""The ``nemo-rl-shim`` command: ``status`` (with and without nemo-automodel) and argument handling.

``status`` runs in a subprocess: a fresh interpreter has applied nothing, so
"active" versus "would be applied" is what a user sees, whatever other tests
did in this process.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
import torch
from packaging.version import Version

import automodel_patch
from nemo_rl_shim.cli import build_parser, main
from nemo_rl_shim.cli.status import render_status
from nemo_rl_shim.timeouts import TIMEOUT_API
from tests.harness.paths import REPO_ROOT

pytestmark = pytest.mark.every_lane

STATUS_TIMEOUT_S = 180


def _status(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_shim", "status", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STATUS_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def status_json() -> dict:
    done = _status("--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def hidden_automodel(tmp_path_factory) -> str:
    """A folder that, first on PYTHONPATH, makes ``import nemo_automodel`` fail as if it were not installed.

    This is the boundary simulated: a machine without the ``automodel`` extra. The stub
    package raises the very error a missing package raises (``ModuleNotFoundError`` naming
    ``nemo_automodel``), while torch and the rest of the environment stay real.
    """
    root = tmp_path_factory.mktemp("no_automodel")
    (root / "nemo_automodel").mkdir()
    (root / "nemo_automodel" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'nemo_automodel'\", name='nemo_automodel')\n"
    )
    return str(root)


KEEP, CPU_MESH = "keep-cpu-backend", "cpu-mesh-timeout"
RUNS = ["GPUs, CPU offload", "GPUs, no CPU offload", "no CUDA device"]


def test_status_json_versions_support_workarounds_and_decisions(status_json):
    s = status_json
    assert Version(s["torch"]) == Version(Version(str(torch.__version__)).public)
    assert s["python"] == platform.python_version()
    assert Version(s["nemo_automodel"]) == automodel_patch.installed_version()
    assert (s["nemo_automodel_installed"], s["nemo_automodel_import_error"]) == (True, None)
    assert (s["supported"], s["problem"]) == (True, None)
    assert s["tested_pair"] is True, s["tested_pairs"]
    assert [w["name"] for w in s["workarounds"]] == [KEEP, CPU_MESH]
    for w in s["workarounds"]:
        workaround = automodel_patch.workaround(w["name"])
        assert (w["verdict"], w["active"]) == ("needed", False)  # the locked 0.7.0, in a fresh process
        assert (w["removal_condition"], w["tripwire"]) == (workaround.removal_condition, workaround.tripwire)
        assert w["symptom"] == workaround.symptom
    assert [d["run"] for d in s["decisions"]] == RUNS
    on_gpu, nccl, cpu = s["decisions"]
    assert (on_gpu["default_backend"], on_gpu["action"], on_gpu["applies"]) == (
        "cuda:nccl,cpu:gloo", "patch_and_forward", [KEEP]
    )  # fmt: skip
    assert on_gpu["reason"] == "CPU offload is on and the installed Automodel drops the CPU half"
    assert (nccl["default_backend"], nccl["action"], nccl["applies"]) == ("nccl", "forward", [])
    assert (cpu["default_backend"], cpu["action"], cpu["applies"]) == ("gloo", "patch_and_forward", [CPU_MESH])
    assert [d["this_machine"] for d in s["decisions"]] == [False, False, True]  # no CUDA device here
    assert [w["would_apply_for"] for w in s["workarounds"]] == [[RUNS[0]], [RUNS[2]]]
    assert s["timeout_api"] == TIMEOUT_API


def test_status_text_says_what_would_be_applied_and_when_to_remove_it(status_json):
    text = render_status(status_json)
    assert f"nemo-automodel: {status_json['nemo_automodel']}" in text
    assert f", Python {platform.python_version()}" in text.splitlines()[0]
    assert "inside the tested matrix" in text
    assert f"workaround {KEEP}: needed; setup_distributed would apply it for: GPUs, CPU offload" in text
    assert f"workaround {CPU_MESH}: needed; setup_distributed would apply it for: no CUDA device" in text
    assert "(45 min, GPUs, CPU offload: cuda:nccl,cpu:gloo): patch_and_forward" in text
    assert "(45 min, no CUDA device: gloo, this machine): patch_and_forward" in text
    for slug in (KEEP, CPU_MESH):
        assert f"remove when {automodel_patch.workaround(slug).removal_condition}" in text
        assert f"without it: {automodel_patch.workaround(slug).symptom}" in text
    assert f"timeout API: {TIMEOUT_API}" in text


def test_status_without_the_automodel_extra_still_reports_torch(hidden_automodel):
    done = _status(pythonpath=hidden_automodel)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"torch: {Version(str(torch.__version__)).public}")
    assert "nemo-automodel: not installed (uv sync --extra automodel)" in lines
    assert "pair: n/a without nemo-automodel" in lines
    assert f"timeout API: {TIMEOUT_API}" in lines
    assert "setup_distributed (45 min): n/a, it needs a nemo-automodel that imports here" in lines


def test_status_json_without_the_automodel_extra(hidden_automodel):
    done = _status("--json", pythonpath=hidden_automodel)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout)
    assert (s["nemo_automodel"], s["nemo_automodel_installed"], s["decisions"]) == (None, False, None)
    assert (s["supported"], s["tested_pair"]) == (True, False)
    assert [w["active"] for w in s["workarounds"]] == [False, False]


def test_preflight_help_lists_flags_and_hides_fault_injection(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["preflight", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--config", "--role", "--timeout-minutes-after-init", "--cpu-offload", "--no-cpu-offload", "--tp",
                 "--cp", "--ep", "--dp-replicate", "--nproc", "--timeout-s", "--json", "--no-patch"):  # fmt: skip
        assert flag in text
    assert "--stall" not in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "1"], "preflight: --nproc must be at least 2, got 1"),
        (["--timeout-minutes", "0"], "preflight: policy.automodel_cfg.distributed_timeout_minutes must be a positive"),
        (["--config", "/nonexistent/grpo.yaml"], "preflight: /nonexistent/grpo.yaml: no such file"),
    ],
)
def test_preflight_bad_input_exits_2_with_one_line_before_starting_ranks(argv, message, capsys):
    assert main(["preflight", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(message), captured.err


def test_bad_flag_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "--tp", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer, got 0" in capsys.readouterr().err
