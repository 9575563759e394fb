"""What happens to the configured timeout on the installed Automodel, and why.

Decided by feature detection (``MeshContext.build``'s signature and
:func:`automodel_patch.keeps_cpu_backend`), never by a version comparison.
:func:`decide` has no side effects; ``setup_distributed`` carries it out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

import automodel_patch

__all__ = ["Action", "Decision", "decide"]


class Action(enum.StrEnum):
    """How the timeout reaches the process groups."""

    #: No timeout configured: torch's defaults everywhere.
    NO_TIMEOUT = "no_timeout"
    #: Default group and every mesh sub-group get the timeout.
    FORWARD = "forward"
    #: Apply the fork fix first, then forward.
    PATCH_AND_FORWARD = "patch_and_forward"
    #: The pin has no ``MeshContext.build(timeout_minutes=)``: default group only.
    DEFAULT_GROUP_ONLY = "default_group_only"
    #: Forwarding would build NCCL-only sub-groups under CPU offload: default group only.
    NOT_FORWARDED = "not_forwarded"


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    ``forward_minutes`` is what goes to ``MeshContext.build(timeout_minutes=)``;
    ``warning`` is set when the sub-groups will not get the configured timeout.
    """

    action: Action
    timeout_minutes: float | None
    cpu_offload: bool
    reason: str
    warning: str | None = None

    @property
    def forward_minutes(self) -> float | None:
        return self.timeout_minutes if self.action in (Action.FORWARD, Action.PATCH_AND_FORWARD) else None

    @property
    def apply_patch(self) -> bool:
        return self.action is Action.PATCH_AND_FORWARD

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for reports and for results sent between ranks."""
        return {
            "action": self.action.value,
            "reason": self.reason,
            "warning": self.warning,
            "timeout_minutes": self.timeout_minutes,
            "forward_minutes": self.forward_minutes,
            "apply_patch": self.apply_patch,
        }


def _cpu_half_source() -> str | None:
    """``"natively"``, ``"after the fork fix"``, or None when the installed override drops it."""
    if not automodel_patch.keeps_cpu_backend():
        return None
    return "after the fork fix" if automodel_patch.is_applied() else "natively"


def decide(
    timeout_minutes: float | None,
    *,
    cpu_offload: bool,
    patch_automodel: bool = True,
    where: str = "policy.automodel_cfg",
    cpu_mesh: bool | None = None,
) -> Decision:
    """Decide how ``timeout_minutes`` (already validated) reaches the process groups.

    * no timeout: nothing to forward;
    * pin without ``MeshContext.build(timeout_minutes=)`` (0.3.0, 0.4.0): default group only, with a warning;
    * pin that keeps the CPU half (natively or after the fork fix): forward;
    * pin that drops it, CPU offload off: forward, nothing is lost;
    * pin that drops it, CPU offload on: apply the fork fix and forward; with
      ``patch_automodel: false``, or when the fix cannot apply, do not forward, and warn.

    ``cpu_mesh`` (default: no CUDA device here) means the default group is plain
    ``"gloo"``. Upstream then forwards the timeout to the default group alone, so
    the fork fix is applied there too; with ``patch_automodel: false`` the
    timeout is still forwarded, with a warning that sub-groups keep gloo's default.
    """

    def make(action: Action, reason: str, warning: str | None = None) -> Decision:
        return Decision(action, timeout_minutes, cpu_offload, reason, warning)

    if timeout_minutes is None:
        return make(Action.NO_TIMEOUT, f"{where}.distributed_timeout_minutes is unset: torch's defaults apply")
    if not automodel_patch.build_accepts_timeout():
        version = automodel_patch.installed_version()
        return make(
            Action.DEFAULT_GROUP_ONLY,
            f"nemo-automodel {version} has no MeshContext.build(timeout_minutes=)",
            f"nemo-automodel {version} cannot pass a timeout to its mesh sub-groups: only the default group gets "
            f"{timeout_minutes:g} min; sub-groups keep torch's default (10 min NCCL, 30 min Gloo).",
        )
    if cpu_mesh is None:
        cpu_mesh = not torch.cuda.is_available()
    source = _cpu_half_source()
    drops_cpu_half = cpu_offload and source is None
    misses_cpu_mesh = cpu_mesh and not automodel_patch.reaches_cpu_mesh()
    if not (drops_cpu_half or misses_cpu_mesh):
        if source is not None:
            return make(Action.FORWARD, f"the installed Automodel keeps the CPU half {source}")
        return make(Action.FORWARD, "the installed Automodel drops the CPU half, but CPU offload is off")

    if drops_cpu_half:
        problem = "CPU offload is on and the installed Automodel drops the CPU half"
    else:
        problem = "on a CPU (gloo) mesh the installed Automodel passes no timeout to the mesh sub-groups"
    # The fork fix replaces only an override that drops the CPU half; apply() reports NOT_NEEDED otherwise.
    if patch_automodel and source is None and automodel_patch.is_supported():
        return make(Action.PATCH_AND_FORWARD, problem)

    if not patch_automodel:
        why = f"{where}.patch_automodel is false"
    else:
        why = f"the fork fix cannot apply to nemo-automodel {automodel_patch.installed_version()}"
    if drops_cpu_half:
        return make(
            Action.NOT_FORWARDED,
            f"{problem}, and {why}",
            f"{why} and the installed nemo-automodel would build NCCL-only mesh sub-groups under CPU offload: "
            f"the {timeout_minutes:g} min timeout reaches the default group only.",
        )
    return make(
        Action.FORWARD,
        f"{problem}, and {why}",
        f"{why}: on this CPU (gloo) mesh the {timeout_minutes:g} min timeout reaches the default group only; "
        "sub-groups keep gloo's 30-minute default.",
    )
