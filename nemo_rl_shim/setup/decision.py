"""What happens to the configured timeout on the installed Automodel, and why.

Decided by feature detection (``MeshContext.build``'s signature and each workaround's
behavioural probe, :func:`automodel_patch.detect`), never by a version comparison.
:func:`decide` has no side effects; ``setup_distributed`` carries it out.

Which workaround matters follows the default group the run will have: the one whose
``default_backends`` holds it (``"cuda:nccl,cpu:gloo"`` with GPUs and CPU offload, ``"gloo"``
on a machine without CUDA; with ``"nccl"`` alone none does, NCCL-only sub-groups lose
nothing). What each one means for the run (what is lost without it, what "fixed" means,
whether the timeout may still be forwarded without it) is the workaround's own words
(:class:`automodel_patch.Workaround`): this module holds no slug, so deleting a workaround
by its removal steps leaves every message here true.

On a pin whose mesh build takes no timeout (``MeshContext.build`` without ``timeout_minutes``:
NeMo RL's pin 24b47e856, 0.3.0, 0.4.0) every sub-group gets the timeout right after the build
(:func:`nemo_rl_shim.process_groups.setting.set_mesh_timeouts`, read back). Only the default group gets
it where that is impossible: a default group with a backend that has no timeout setter
(torch's setters reach NCCL and Gloo; MPI, UCC and custom backends keep their own).

A probe that cannot judge the installed code ("unknown") is handled on purpose: with
``patch_automodel`` on, the workaround is applied (its layer is correct whatever the genuine
code does); with it off, a timeout that might break the run is not forwarded. Either
way one warning says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import automodel_patch
from automodel_patch import Verdict, Workaround
from nemo_rl_shim.config.settings import full_key
from nemo_rl_shim.setup.default_group import backend_for

__all__ = ["TIMEOUT_SETTABLE_BACKENDS", "Action", "Decision", "WorkaroundState", "decide"]

#: Backends whose timeout torch can change after the group exists (``_set_pg_timeout`` on 2.9-2.14
#: reaches only NCCL and Gloo; 2.15's ``set_timeout`` also reaches its two NCCL backends by their own
#: names, ``"nccl-legacy"`` and ``"nccl2"`` (plain ``"nccl"`` is ``ProcessGroupNCCL2`` there), and warns
#: and leaves any other, such as MPI or UCC).
TIMEOUT_SETTABLE_BACKENDS = frozenset({"nccl", "nccl-legacy", "nccl2", "gloo"})


class Action(enum.StrEnum):
    """How the timeout reaches the process groups."""

    #: No timeout configured: torch's defaults everywhere.
    NO_TIMEOUT = "no_timeout"
    #: Default group and every mesh sub-group get the timeout.
    FORWARD = "forward"
    #: Apply the workaround(s) in ``Decision.patches`` first, then forward.
    PATCH_AND_FORWARD = "patch_and_forward"
    #: The pin has no ``MeshContext.build(timeout_minutes=)``: the mesh is built without it, and every
    #: sub-group gets the timeout right after the build (set on each backend and read back).
    SET_AFTER_BUILD = "set_after_build"
    #: The pin has no ``MeshContext.build(timeout_minutes=)`` and a backend of the default group has no
    #: timeout setter: default group only.
    DEFAULT_GROUP_ONLY = "default_group_only"
    #: Forwarding without a needed workaround would break the run: default group only.
    NOT_FORWARDED = "not_forwarded"


@dataclass(frozen=True)
class WorkaroundState:
    """One workaround as this decision sees it."""

    slug: str
    #: It matters for the run's default group.
    relevant: bool
    #: The probe's verdict on Automodel's genuine code.
    verdict: Verdict
    reason: str
    #: Already in force in this process.
    active: bool
    #: ``setup_distributed`` applies it.
    apply: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "verdict": self.verdict.value}


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    ``forward_minutes`` is what goes to ``MeshContext.build(timeout_minutes=)``;
    ``every_group`` whether every process group is meant to carry the timeout (False where only
    the default group, or none, is); ``warning`` is set when something is not as configured or
    could not be judged.
    """

    action: Action
    timeout_minutes: float | None
    cpu_offload: bool
    reason: str
    warning: str | None = None
    default_backend: str | None = None
    workarounds: tuple[WorkaroundState, ...] = field(default=())
    every_group: bool = False

    @property
    def forward_minutes(self) -> float | None:
        return self.timeout_minutes if self.action in (Action.FORWARD, Action.PATCH_AND_FORWARD) else None

    @property
    def set_after_build(self) -> bool:
        """Whether ``setup_distributed`` gives every sub-group the timeout after a build that takes none."""
        return self.action is Action.SET_AFTER_BUILD

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


def _states(backend: str) -> list[tuple[Workaround, WorkaroundState]]:
    states = []
    for w in automodel_patch.WORKAROUNDS:
        detection = automodel_patch.detect(w.slug)
        state = WorkaroundState(
            w.slug,
            backend in w.default_backends,
            detection.verdict,
            detection.reason,
            automodel_patch.is_applied(w.slug),
        )
        states.append((w, state))
    return states


def _with_apply(states: list[WorkaroundState], slug: str) -> tuple[WorkaroundState, ...]:
    return tuple(WorkaroundState(**{**s.__dict__, "apply": True}) if s.slug == slug else s for s in states)


def _halves(backend: str) -> set[str]:
    """The backend names of a default-group backend string: ``"cuda:nccl,cpu:gloo"`` -> {nccl, gloo}."""
    return {part.rpartition(":")[2].strip().lower() for part in backend.split(",") if part.strip()}


def _no_workaround_concerns(backend: str, cpu_offload: bool) -> str:
    if _halves(backend) == {"nccl"}:
        off = "" if cpu_offload else "CPU offload is off: "
        return f"{off}the default group is {backend}, so NCCL-only sub-groups lose nothing"
    return f"no workaround concerns a {backend} default group: the timeout goes to MeshContext.build as is"


def _without_build_timeout(timeout_minutes: float, backend: str, make: Any, states: Any) -> Decision:
    version = automodel_patch.installed_version()
    no_build = f"nemo-automodel {version} has no MeshContext.build(timeout_minutes=)"
    unsettable = sorted(_halves(backend) - TIMEOUT_SETTABLE_BACKENDS)
    if unsettable:
        return make(
            Action.DEFAULT_GROUP_ONLY,
            f"{no_build}, and the default group's {', '.join(unsettable)} backend has no timeout setter",
            f"{no_build} and torch cannot change the timeout of a {', '.join(unsettable)} backend after the build: "
            f"only the default group gets {timeout_minutes:g} min; sub-groups keep the backend's own default.",
            states,
        )
    reason = f"{no_build}: every sub-group gets the timeout right after the build"
    return make(Action.SET_AFTER_BUILD, reason, states=states, every_group=True)


def _needed(
    timeout_minutes: float, w: Workaround, relevant: WorkaroundState, patch_automodel: bool, where: str
) -> tuple[Action, str, str | None, bool]:
    """(action, reason, warning, apply) where ``w`` matters and the installed code does not do its job."""
    if relevant.verdict is Verdict.NEEDED:
        problem = w.problem
    elif relevant.verdict is Verdict.UNKNOWN:
        problem = f"detection cannot judge the installed Automodel for {w.slug} ({relevant.reason})"
    else:
        problem = f"the installed Automodel has nothing the {w.slug} workaround can replace ({relevant.reason})"
    if patch_automodel and relevant.verdict in (Verdict.NEEDED, Verdict.UNKNOWN):
        warning = None
        if relevant.verdict is Verdict.UNKNOWN:
            warning = (
                f"{problem}: applying the {w.slug} workaround, whose layer is correct whatever the installed code does"
            )
        return Action.PATCH_AND_FORWARD, problem, warning, True
    why = f"the {w.slug} workaround cannot apply"
    if not patch_automodel:
        why = f"{full_key(where, 'patch_automodel')} is false"
    if w.forward_without_it:
        warning = f"{why}: {w.without_it}; the {timeout_minutes:g} min timeout may reach the default group only."
        return Action.FORWARD, f"{problem}, and {why}", warning, False
    warning = f"{why} and {w.without_it}: the {timeout_minutes:g} min timeout reaches the default group only."
    return Action.NOT_FORWARDED, f"{problem}, and {why}", warning, False


def decide(
    timeout_minutes: float | None,
    *,
    cpu_offload: bool,
    patch_automodel: bool = True,
    where: str = "policy",
    default_backend: str | None = None,
) -> Decision:
    """Decide how ``timeout_minutes`` (already validated) reaches the process groups.

    ``where`` is the role's section (``policy``), named in the reasons and warnings (:func:`full_key`).
    ``default_backend`` is the default group's backend string the run will have (default:
    :func:`~nemo_rl_shim.setup.default_group.backend_for` on this machine: ``"gloo"`` without CUDA).
    See the module docstring for which workaround matters where.
    """
    backend = default_backend if default_backend is not None else backend_for(cpu_offload=cpu_offload)

    def make(action: Action, reason: str, warning: str | None = None, states: Any = (), every_group: bool = False):
        return Decision(action, timeout_minutes, cpu_offload, reason, warning, backend, tuple(states), every_group)

    if timeout_minutes is None:
        unset = full_key(where, "distributed_timeout_minutes")
        return make(Action.NO_TIMEOUT, f"{unset} is unset: torch's defaults apply")
    units = _states(backend)
    states = [state for _, state in units]
    if not automodel_patch.build_accepts_timeout():
        return _without_build_timeout(timeout_minutes, backend, make, states)
    relevant = next(((w, s) for w, s in units if s.relevant), None)
    if relevant is None:
        return make(Action.FORWARD, _no_workaround_concerns(backend, cpu_offload), states=states, every_group=True)
    w, state = relevant
    if state.active:
        return make(
            Action.FORWARD, f"{w.fixed} after the fork fix ({w.slug} is in force)", states=states, every_group=True
        )
    if state.verdict is Verdict.NOT_NEEDED:
        return make(Action.FORWARD, f"{w.fixed} natively", states=states, every_group=True)
    action, reason, warning, apply = _needed(timeout_minutes, w, state, patch_automodel, where)
    if apply:
        return make(action, reason, warning, _with_apply(states, w.slug), every_group=True)
    return make(action, reason, warning, states)
