"""What the workaround probes share: call an override the way Automodel does, and read its answer.

An override maps each mesh axis to ``(backend, options)``, to a backend string alone,
or to options alone (torch's ``DeviceMesh`` accepts all three; a missing backend means
the default group's). The probes judge that answer against the default group the call
ran under (:mod:`automodel_patch._simulated_group`).
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch.distributed.distributed_c10d import BackendConfig

from automodel_patch._simulated_group import SimulationUnavailable, simulated_default_group
from automodel_patch._target import OVERRIDE_NAME
from automodel_patch._verdict import Detection, Verdict

__all__ = [
    "EXPECTED_PARAMETERS",
    "ONE_MINUTE",
    "PROBE_AXES",
    "Unreadable",
    "axis_problems",
    "call_under",
    "first_line",
    "has_override_signature",
    "judge_override",
]

PROBE_AXES = ("dp_shard", "tp")
EXPECTED_PARAMETERS = ("axes", "device_type", "timeout_minutes")
ONE_MINUTE = datetime.timedelta(minutes=1)


class Unreadable(ValueError):
    """The function answered with something the probe cannot judge."""


def has_override_signature(function: Callable[..., Any] | None) -> bool:
    """Whether ``function`` takes ``(axes, *, device_type, timeout_minutes)``, as 0.5.0 ... 0.7.0 do."""
    if function is None:
        return False
    try:
        return tuple(inspect.signature(function).parameters) == EXPECTED_PARAMETERS
    except (TypeError, ValueError):
        return False


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".strip()


def call_under(backend: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` while a one-rank group reporting ``backend`` is the default group."""
    with simulated_default_group(backend):
        return function(*args, **kwargs)


def _split(config: Any) -> tuple[str | None, Any]:
    if isinstance(config, tuple) and len(config) == 2:
        backend, options = config
    elif isinstance(config, str):
        backend, options = config, None
    else:
        backend, options = None, config
    if backend is not None and not isinstance(backend, str):
        raise Unreadable(f"backend {backend!r} is not a string")
    return backend, options


def axis_problems(
    override: Any, axes: tuple[str, ...], *, default_backend: str, minutes: datetime.timedelta
) -> list[str]:
    """What is wrong with ``override`` for ``axes`` under ``default_backend``: [] when every axis keeps
    every device of the default group and carries ``minutes`` as its timeout.

    Raises :class:`Unreadable` for an answer that is neither None nor a mapping of axes.
    """
    if override is None:
        return ["returns no override, so the mesh sub-groups do not get the timeout"]
    if not isinstance(override, Mapping):
        raise Unreadable(f"returned {type(override).__name__}, not a mapping of axes")
    wanted = set(BackendConfig(default_backend).get_device_backend_map())
    problems = []
    for axis in axes:
        if axis not in override or override[axis] is None:
            problems.append(f"gives axis {axis!r} no override, so it does not get the timeout")
            continue
        backend, options = _split(override[axis])
        if backend is not None:
            kept = set(BackendConfig(backend).get_device_backend_map())
            if not wanted <= kept:
                lost = ",".join(sorted(wanted - kept))
                problems.append(f"builds axis {axis!r} as {backend!r}, dropping the {lost} half of {default_backend!r}")
        timeout = getattr(options, "_timeout", None)
        if timeout != minutes:
            problems.append(f"gives axis {axis!r} timeout {timeout}, not the requested {minutes}")
    return problems


def judge_override(
    slug: str,
    functions: Mapping[str, Any],
    *,
    backend: str,
    device_type: str,
    fixed: str,
    more: Callable[[], list[str]] = list,
) -> Detection:
    """A workaround's verdict: call the genuine override for ``device_type`` under a ``backend`` default group.

    NEEDED with the first problem :func:`axis_problems` (and ``more``) find; NOT_NEEDED with
    ``fixed``; ABSENT without a probe-able override; UNKNOWN, with the reason, when the world
    cannot be simulated or the call (or its answer) defeats the probe. Never raises.
    """
    override = functions.get(OVERRIDE_NAME)
    if not has_override_signature(override):
        return Detection(slug, Verdict.ABSENT, f"no {OVERRIDE_NAME}(axes, *, device_type, timeout_minutes) to probe")
    call = f"{OVERRIDE_NAME}(device_type={device_type!r}, timeout_minutes=1) under a {backend!r} default group"
    try:
        answer = call_under(backend, override, PROBE_AXES, device_type=device_type, timeout_minutes=1)
        problems = [
            f"{call} {p}" for p in axis_problems(answer, PROBE_AXES, default_backend=backend, minutes=ONE_MINUTE)
        ]
        problems += more()
    except SimulationUnavailable as e:
        return Detection(slug, Verdict.UNKNOWN, str(e))
    except Exception as e:  # the function (or its answer) defeats the probe: say so
        return Detection(slug, Verdict.UNKNOWN, f"{call} raised {first_line(e)}")
    if problems:
        return Detection(slug, Verdict.NEEDED, problems[0])
    return Detection(slug, Verdict.NOT_NEEDED, f"{call} {fixed}")
