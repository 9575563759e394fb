"""What happens to the configured timeout on the installed Automodel, and why.

Decided by feature detection (``MeshContext.build``'s signature and each workaround's
behavioural probe, :func:`automodel_patch.detect`), never by a version comparison.
:func:`decide` has no side effects; ``setup_distributed`` carries it out.

Which workaround matters follows the default group the run will have:

* ``"cuda:nccl,cpu:gloo"`` (GPUs, CPU offload): ``keep-cpu-backend``;
* ``"gloo"`` (no CUDA device): ``cpu-mesh-timeout``;
* ``"nccl"`` (GPUs, no CPU offload): none; NCCL-only sub-groups lose nothing.

A probe that cannot judge the installed code ("unknown") is handled on purpose: with
``patch_automodel`` on, the workaround is applied (its layer is correct whatever the genuine
code does); with it off, a timeout that might break CPU offload is not forwarded. Either
way one warning says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

import automodel_patch
from automodel_patch import Verdict
from nemo_rl_shim.process_group import backend_for

__all__ = ["Action", "Decision", "WorkaroundState", "decide"]


class Action(enum.StrEnum):
    """How the timeout reaches the process groups."""

    #: No timeout configured: torch's defaults everywhere.
    NO_TIMEOUT = "no_timeout"
    #: Default group and every mesh sub-group get the timeout.
    FORWARD = "forward"
    #: Apply the workaround(s) in ``Decision.patches`` first, then forward.
    PATCH_AND_FORWARD = "patch_and_forward"
    #: The pin has no ``MeshContext.build(timeout_minutes=)``: default group only.
    DEFAULT_GROUP_ONLY = "default_group_only"
    #: Forwarding could build sub-groups without the CPU half under CPU offload: default group only.
    NOT_FORWARDED = "not_forwarded"


@dataclass(frozen=True)
class WorkaroundState:
    """One workaround as this decision sees it."""

    slug: str
    #: It matters for the run's default group.
    relevant: bool
    #: The probe's verdict on Automodel's genuine code (``automodel_patch.Verdict`` value).
    verdict: str
    reason: str
    #: Already in force in this process.
    active: bool
    #: ``setup_distributed`` applies it.
    apply: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    ``forward_minutes`` is what goes to ``MeshContext.build(timeout_minutes=)``;
    ``warning`` is set when something is not as configured or could not be judged.
    """

    action: Action
    timeout_minutes: float | None
    cpu_offload: bool
    reason: str
    warning: str | None = None
    default_backend: str | None = None
    workarounds: tuple[WorkaroundState, ...] = field(default=())

    @property
    def forward_minutes(self) -> float | None:
        return self.timeout_minutes if self.action in (Action.FORWARD, Action.PATCH_AND_FORWARD) else None

    @property
    def every_group(self) -> bool:
        """Whether every process group is meant to carry the timeout (False where only the default group is)."""
        if self.forward_minutes is None:
            return False
        return not (self.action is Action.FORWARD and self.warning is not None)  # the CPU-mesh row without the fix

    @property
    def patches(self) -> tuple[str, ...]:
        """Slugs of the workarounds ``setup_distributed`` applies."""
        return tuple(w.slug for w in self.workarounds if w.apply)

    @property
    def apply_patch(self) -> bool:
        return bool(self.patches)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for reports and for results sent between ranks."""
        return {
            "action": self.action.value,
            "reason": self.reason,
            "warning": self.warning,
            "timeout_minutes": self.timeout_minutes,
            "forward_minutes": self.forward_minutes,
            "every_group": self.every_group,
            "default_backend": self.default_backend,
            "apply_patch": self.apply_patch,
            "patches": list(self.patches),
            "workarounds": [w.to_dict() for w in self.workarounds],
        }


#: Per relevant workaround: what the run loses without it, and what "fixed" means.
_PROBLEM = {
    "keep-cpu-backend": "CPU offload is on and the installed Automodel drops the CPU half",
    "cpu-mesh-timeout": "on a CPU (gloo) mesh the installed Automodel passes no timeout to the mesh sub-groups",
}
_FIXED = {
    "keep-cpu-backend": "the installed Automodel keeps the CPU half",
    "cpu-mesh-timeout": "the installed Automodel gives a CPU (gloo) mesh's sub-groups the timeout",
}


def _states(backend: str) -> list[WorkaroundState]:
    states = []
    for w in automodel_patch.WORKAROUNDS:
        detection = automodel_patch.detect(w.slug)
        states.append(
            WorkaroundState(
                w.slug,
                backend in w.default_backends,
                detection.verdict.value,
                detection.reason,
                automodel_patch.is_applied(w.slug),
            )
        )
    return states


def _with_apply(states: list[WorkaroundState], slug: str) -> tuple[WorkaroundState, ...]:
    return tuple(WorkaroundState(**{**s.__dict__, "apply": True}) if s.slug == slug else s for s in states)


def decide(
    timeout_minutes: float | None,
    *,
    cpu_offload: bool,
    patch_automodel: bool = True,
    where: str = "policy.automodel_cfg",
    cpu_mesh: bool | None = None,
) -> Decision:
    """Decide how ``timeout_minutes`` (already validated) reaches the process groups.

    ``cpu_mesh`` (default: no CUDA device here) means the default group is plain ``"gloo"``.
    See the module docstring for which workaround matters where.
    """
    if cpu_mesh is None:
        cpu_mesh = not torch.cuda.is_available()
    backend = backend_for(cpu_offload=cpu_offload, cuda_available=not cpu_mesh)

    def make(action: Action, reason: str, warning: str | None = None, states: Any = ()) -> Decision:
        return Decision(action, timeout_minutes, cpu_offload, reason, warning, backend, tuple(states))

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
    states = _states(backend)
    relevant = next((s for s in states if s.relevant), None)
    if relevant is None:
        reason = "CPU offload is off: the default group is nccl, so NCCL-only sub-groups lose nothing"
        return make(Action.FORWARD, reason, states=states)
    slug, verdict = relevant.slug, Verdict(relevant.verdict)
    if relevant.active:
        return make(Action.FORWARD, f"{_FIXED[slug]} after the fork fix ({slug} is in force)", states=states)
    if verdict is Verdict.NOT_NEEDED:
        return make(Action.FORWARD, f"{_FIXED[slug]} natively", states=states)

    offload_at_risk = slug == "keep-cpu-backend"
    if verdict is Verdict.NEEDED:
        problem = _PROBLEM[slug]
    elif verdict is Verdict.UNKNOWN:
        problem = f"detection cannot judge the installed Automodel for {slug} ({relevant.reason})"
    else:
        problem = f"the installed Automodel has nothing the {slug} workaround can replace ({relevant.reason})"
    if patch_automodel and verdict in (Verdict.NEEDED, Verdict.UNKNOWN):
        unknown = verdict is Verdict.UNKNOWN
        warning = (
            f"{problem}: applying the {slug} workaround, whose layer is correct whatever the installed code does"
            if unknown
            else None
        )
        return make(Action.PATCH_AND_FORWARD, problem, warning, _with_apply(states, slug))
    why = f"{where}.patch_automodel is false" if not patch_automodel else f"the {slug} workaround cannot apply"
    if offload_at_risk:
        return make(
            Action.NOT_FORWARDED,
            f"{problem}, and {why}",
            f"{why} and the installed nemo-automodel may build mesh sub-groups without the CPU half under CPU "
            f"offload: the {timeout_minutes:g} min timeout reaches the default group only.",
            states,
        )
    return make(
        Action.FORWARD,
        f"{problem}, and {why}",
        f"{why}: on this CPU (gloo) mesh the {timeout_minutes:g} min timeout may reach the default group only; "
        "sub-groups keep gloo's 30-minute default.",
        states,
    )
