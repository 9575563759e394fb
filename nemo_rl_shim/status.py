"""``nemo-rl-shim status``: what the installed packages do with the timeout, as data and as text.

:func:`gather_status` returns a JSON-able dict; :func:`render_status` turns it
into the text the command prints. Nothing here starts a process group or
applies the fork fix: the decisions are :func:`nemo_rl_shim.decide`'s (pure),
for a sample timeout. Works without the ``automodel`` extra: nemo-automodel is
then reported as not installed and everything that needs it as n/a.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from packaging.version import Version

import automodel_patch
from nemo_rl_shim.decision import decide
from nemo_rl_shim.process_group import backend_for
from nemo_rl_shim.timeouts import TIMEOUT_API

__all__ = ["INSTALL_HINT", "SAMPLE_TIMEOUT_MINUTES", "automodel_importable", "gather_status", "render_status"]

#: The timeout the sample decisions are made for.
SAMPLE_TIMEOUT_MINUTES = 45.0
INSTALL_HINT = "uv sync --extra automodel"


_MESH_UTILS = "nemo_automodel.components.distributed.mesh_utils"


def automodel_importable() -> bool:
    """Whether nemo-automodel's mesh code imports; installed metadata alone is not enough."""
    try:
        importlib.import_module(_MESH_UTILS)
    except ImportError:
        return False
    return True


def _cpu_half() -> str:
    if not automodel_patch.is_supported():
        return "unsupported (no _nccl_backend_override(axes, *, device_type, timeout_minutes) to probe)"
    if not automodel_patch.keeps_cpu_backend():
        return "no (drops it)"
    return "after the fork fix" if automodel_patch.is_applied() else "natively"


def _decisions(timeout_minutes: float) -> dict[str, dict[str, Any]]:
    decisions = {}
    for label, cpu_offload in (("cpu_offload_on", True), ("cpu_offload_off", False)):
        decision = decide(timeout_minutes, cpu_offload=cpu_offload, patch_automodel=True)
        decisions[label] = {
            "action": decision.action.value,
            "reason": decision.reason,
            "warning": decision.warning,
            "applies_fork_fix": decision.apply_patch,
            "default_backend": backend_for(cpu_offload=cpu_offload),
        }
    return decisions


def _workaround(decisions: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    applied = automodel_patch.is_applied() if decisions is not None else False
    would_apply_for = [label for label, d in (decisions or {}).items() if d["applies_fork_fix"]]
    return {
        "name": automodel_patch.WORKAROUND,
        "removal_condition": automodel_patch.REMOVAL_CONDITION,
        "active": applied,
        "patched_names": list(automodel_patch.patched_names()),
        "would_apply_for": would_apply_for,
    }


def gather_status(sample_timeout_minutes: float = SAMPLE_TIMEOUT_MINUTES) -> dict[str, Any]:
    """Versions, the CPU-half verdict, sample decisions, the workaround and the timeout API, as data."""
    importable = automodel_importable()
    version = automodel_patch.installed_version() if importable else None
    decisions = _decisions(sample_timeout_minutes) if importable else None
    return {
        "torch": str(Version(str(torch.__version__))),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "nemo_automodel": str(version) if importable and version is not None else None,
        "nemo_automodel_installed": importable,
        "build_accepts_timeout": automodel_patch.build_accepts_timeout() if importable else None,
        "keeps_cpu_half": _cpu_half() if importable else None,
        "sample_timeout_minutes": sample_timeout_minutes,
        "decisions": decisions,
        "workaround": _workaround(decisions),
        "timeout_api": TIMEOUT_API,
    }


def _decision_lines(status: dict[str, Any]) -> list[str]:
    minutes = f"{status['sample_timeout_minutes']:g}"
    if status["decisions"] is None:
        return [f"setup_distributed ({minutes} min): n/a, it needs nemo-automodel"]
    lines = []
    for label, d in status["decisions"].items():
        offload = "on" if label == "cpu_offload_on" else "off"
        lines.append(f"setup_distributed ({minutes} min, CPU offload {offload}, {d['default_backend']}): {d['action']}")
        lines.append(f"    {d['reason']}")
        if d["warning"]:
            lines.append(f"    warning: {d['warning']}")
    return lines


def _workaround_lines(status: dict[str, Any]) -> list[str]:
    w = status["workaround"]
    if status["decisions"] is None:
        state = "n/a (nemo-automodel not installed)"
    elif w["active"]:
        state = f"active in this process: {', '.join(w['patched_names']) or 'replaced override'}"
    elif w["would_apply_for"]:
        which = " and ".join(label.replace("_", " ").replace("cpu", "CPU") for label in w["would_apply_for"])
        state = f"not applied in this process; setup_distributed would apply it with {which}"
    else:
        state = "not applied, and not needed by the installed Automodel"
    return [f"workaround {w['name']}: {state}", f"    remove when {w['removal_condition']}"]


def render_status(status: dict[str, Any]) -> str:
    """The text ``nemo-rl-shim status`` prints for :func:`gather_status`'s dict."""
    if status["nemo_automodel_installed"]:
        automodel = status["nemo_automodel"] or "installed (version unknown)"
        cpu_half = status["keeps_cpu_half"]
    else:
        automodel = f"not installed ({INSTALL_HINT})"
        cpu_half = "n/a"
    lines = [
        f"torch: {status['torch']} ({status['cuda_devices']} CUDA devices)",
        f"nemo-automodel: {automodel}",
        f"keeps the CPU half of cuda:nccl,cpu:gloo under a timeout: {cpu_half}",
        *_decision_lines(status),
        *_workaround_lines(status),
        f"timeout API: {status['timeout_api']}",
    ]
    return "\n".join(lines)
