"""``nemo-rl-shim status``: what the installed packages do with the timeout, as data and as text.

:func:`gather_status` returns a JSON-able dict; :func:`render_status` turns it into the
text the command prints. Nothing here starts a process group or applies a workaround: the
verdicts are :func:`automodel_patch.detect`'s and the decisions :func:`nemo_rl_shim.decide`'s
(pure), for a sample timeout, under each default group a run can have. Works without the
``automodel`` extra, and with an Automodel that does not import on this torch (the import
error is shown).
"""

from __future__ import annotations

from typing import Any

import torch

import automodel_patch
from nemo_rl_shim.process_groups.setting import TIMEOUT_API
from nemo_rl_shim.setup.decision import decide
from nemo_rl_shim.setup.default_group import backend_for
from nemo_rl_shim.setup.support import TESTED_PAIRS, check

__all__ = ["INSTALL_HINT", "SAMPLE_TIMEOUT_MINUTES", "gather_status", "render_status"]

#: The timeout the sample decisions are made for.
SAMPLE_TIMEOUT_MINUTES = 45.0
INSTALL_HINT = "uv sync --extra automodel"
#: The default groups a run can have: (label, cpu_offload, CUDA devices).
RUNS = (
    ("GPUs, CPU offload", True, True),
    ("GPUs, no CPU offload", False, True),
    ("no CUDA device", False, False),
)
_VERDICT_TEXT = {
    "needed": "needed",
    "not_needed": "not needed (the installed Automodel behaves natively)",
    "unknown": "unknown (detection cannot judge this release)",
    "absent": "n/a (nothing to replace in this release)",
}


def _decisions(timeout_minutes: float) -> list[dict[str, Any]]:
    here_cuda = torch.cuda.is_available()
    decisions = []
    for label, cpu_offload, cuda in RUNS:
        backend = backend_for(cpu_offload=cpu_offload, cuda_available=cuda)
        decision = decide(timeout_minutes, cpu_offload=cpu_offload, default_backend=backend)
        decisions.append(
            {
                "run": label,
                "this_machine": cuda == here_cuda,
                "cpu_offload": cpu_offload,
                "default_backend": decision.default_backend,
                "action": decision.action.value,
                "reason": decision.reason,
                "warning": decision.warning,
                "applies": list(decision.patches),
                "every_group": decision.every_group,
            }
        )
    return decisions


def _workarounds(decisions: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    rows = []
    for w in automodel_patch.WORKAROUNDS:
        detection = automodel_patch.detect(w.slug) if decisions is not None else None
        rows.append(
            {
                "name": w.slug,
                "verdict": detection.verdict.value if detection else None,
                "reason": detection.reason if detection else None,
                "active": automodel_patch.is_applied(w.slug) if decisions is not None else False,
                "would_apply_for": [d["run"] for d in decisions or [] if w.slug in d["applies"]],
                "symptom": w.symptom,
                "removal_condition": w.removal_condition,
                "tripwire": w.tripwire,
            }
        )
    return rows


def gather_status(sample_timeout_minutes: float = SAMPLE_TIMEOUT_MINUTES) -> dict[str, Any]:
    """Versions and their support, each workaround's verdict, sample decisions and the timeout API, as data."""
    support = check()
    usable = support.automodel.importable and support.ok
    decisions = _decisions(sample_timeout_minutes) if usable else None
    return {
        **support.to_dict(),
        "tested_pairs": [f"torch {t} x nemo-automodel {a}" for t, a in TESTED_PAIRS],
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "build_accepts_timeout": automodel_patch.build_accepts_timeout() if usable else None,
        "sample_timeout_minutes": sample_timeout_minutes,
        "decisions": decisions,
        "workarounds": _workarounds(decisions),
        "timeout_api": TIMEOUT_API,
    }


def _automodel_line(status: dict[str, Any]) -> str:
    if not status["nemo_automodel_installed"]:
        return f"nemo-automodel: not installed ({INSTALL_HINT})"
    version = status["nemo_automodel"] or "installed (version unknown)"
    if status["nemo_automodel_import_error"]:
        return f"nemo-automodel: {version}, installed but does not import: {status['nemo_automodel_import_error']}"
    return f"nemo-automodel: {version}"


def _pair_line(status: dict[str, Any]) -> str:
    if status["problem"]:
        return f"unsupported: {status['problem']}"
    if not status["nemo_automodel_installed"]:
        return "pair: n/a without nemo-automodel"
    tested = "inside the tested matrix" if status["tested_pair"] else "outside the tested matrix (docs/support.md)"
    return f"pair: torch {status['torch']} x nemo-automodel {status['nemo_automodel']}: {tested}"


def _decision_lines(status: dict[str, Any]) -> list[str]:
    minutes = f"{status['sample_timeout_minutes']:g}"
    if status["decisions"] is None:
        return [f"setup_distributed ({minutes} min): n/a, it needs a nemo-automodel that imports here"]
    lines = []
    if status["build_accepts_timeout"] is False:
        lines.append(
            "MeshContext.build(timeout_minutes=): absent; setup_distributed sets the timeout on every sub-group "
            "right after the build and reads it back (nemo_rl_shim.process_groups.setting.set_mesh_timeouts)"
        )
    for d in status["decisions"]:
        here = ", this machine" if d["this_machine"] else ""
        lines.append(f"setup_distributed ({minutes} min, {d['run']}: {d['default_backend']}{here}): {d['action']}")
        lines.append(f"    {d['reason']}")
        if d["warning"]:
            lines.append(f"    warning: {d['warning']}")
    return lines


def _workaround_lines(status: dict[str, Any]) -> list[str]:
    lines = []
    for w in status["workarounds"]:
        if status["decisions"] is None:
            state = "n/a (nemo-automodel not usable here)"
        elif w["active"]:
            state = "active in this process"
        else:
            state = _VERDICT_TEXT[w["verdict"]]
            if w["would_apply_for"]:
                state += f"; setup_distributed would apply it for: {', '.join(w['would_apply_for'])}"
        lines.append(f"workaround {w['name']}: {state}")
        lines.append(f"    without it: {w['symptom']}")
        if w["reason"]:
            lines.append(f"    detection: {w['reason']}")
        lines.append(f"    remove when {w['removal_condition']}")
    return lines


def render_status(status: dict[str, Any]) -> str:
    """The text ``nemo-rl-shim status`` prints for :func:`gather_status`'s dict."""
    lines = [
        f"torch: {status['torch']} ({status['cuda_devices']} CUDA devices), Python {status['python']}",
        _automodel_line(status),
        _pair_line(status),
        *_workaround_lines(status),
        *_decision_lines(status),
        f"timeout API: {status['timeout_api']}",
    ]
    return "\n".join(lines)
