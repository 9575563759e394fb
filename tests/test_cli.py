"""The ``nemo-rl-shim`` command: ``status`` (with and without nemo-automodel) and argument handling.

``status`` runs in a subprocess: a fresh interpreter has applied nothing, so
"active" versus "would be applied" is what a user sees, whatever other tests
did in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import automodel_patch
from nemo_rl_shim.cli import build_parser, main
from nemo_rl_shim.status import render_status
from nemo_rl_shim.timeouts import TIMEOUT_API

REPO_ROOT = Path(__file__).resolve().parent.parent
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
    """A folder that, first on PYTHONPATH, makes ``import nemo_automodel`` fail.

    This is the boundary simulated: a machine without the ``automodel`` extra.
    The stub package raises ImportError from its ``__init__``, exactly what
    importing a package that is not installed raises, while torch and the rest
    of the environment stay real.
    """
    root = tmp_path_factory.mktemp("no_automodel")
    (root / "nemo_automodel").mkdir()
    (root / "nemo_automodel" / "__init__.py").write_text(
        'raise ImportError("nemo_automodel is hidden by tests/test_cli.py: the automodel extra is absent")\n'
    )
    return str(root)


def test_status_json_versions_verdict_decisions_workaround_and_timeout_api(status_json):
    s = status_json
    assert Version(s["torch"]) == Version(str(torch.__version__))
    assert Version(s["nemo_automodel"]) == automodel_patch.installed_version()
    assert s["keeps_cpu_half"] == "no (drops it)"  # the locked 0.7.0
    on, off = s["decisions"]["cpu_offload_on"], s["decisions"]["cpu_offload_off"]
    assert (on["action"], on["applies_fork_fix"]) == ("patch_and_forward", True)
    assert on["reason"] == "CPU offload is on and the installed Automodel drops the CPU half"
    # Without CPU offload nothing is lost on a GPU; whether a CPU mesh needs the fix too is decide()'s call.
    assert off["action"] in ("forward", "patch_and_forward") and off["reason"]
    assert off["applies_fork_fix"] == (off["action"] == "patch_and_forward")
    w = s["workaround"]
    assert (w["name"], w["removal_condition"]) == (automodel_patch.WORKAROUND, automodel_patch.REMOVAL_CONDITION)
    assert (w["active"], w["patched_names"]) == (False, [])  # a fresh process has applied nothing
    assert w["would_apply_for"] == [label for label, d in s["decisions"].items() if d["applies_fork_fix"]]
    assert "cpu_offload_on" in w["would_apply_for"]
    assert s["timeout_api"] == TIMEOUT_API


def test_status_text_says_what_would_be_applied_and_when_to_remove_it(status_json):
    text = render_status(status_json)
    assert f"nemo-automodel: {status_json['nemo_automodel']}" in text
    assert "keeps the CPU half of cuda:nccl,cpu:gloo under a timeout: no (drops it)" in text
    assert "CPU offload on, gloo): patch_and_forward" in text
    assert "workaround keep-cpu-backend: not applied in this process; setup_distributed would apply it" in text
    assert f"remove when {automodel_patch.REMOVAL_CONDITION}" in text
    assert f"timeout API: {TIMEOUT_API}" in text


def test_status_without_the_automodel_extra_still_reports_torch(hidden_automodel):
    done = _status(pythonpath=hidden_automodel)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"torch: {Version(str(torch.__version__))}")
    assert "nemo-automodel: not installed (uv sync --extra automodel)" in lines
    assert f"timeout API: {TIMEOUT_API}" in lines
    assert "setup_distributed (45 min): n/a, it needs nemo-automodel" in lines


def test_status_json_without_the_automodel_extra(hidden_automodel):
    done = _status("--json", pythonpath=hidden_automodel)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout)
    assert (s["nemo_automodel"], s["nemo_automodel_installed"], s["decisions"]) == (None, False, None)
    assert s["workaround"]["active"] is False


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
        (["--config", "/nonexistent/grpo.yaml"], "preflight: [Errno 2] No such file or directory"),
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
