"""Put the corrected override in place, take it out again, and say which is in force.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): TEMPORARY. Remove when the automodel pin
# includes NVIDIA-NeMo/Automodel#4602.

Symptom: with FSDP2 CPU offload and a distributed timeout, ``DTensor.full_tensor()``
    on a CPU-offloaded parameter fails with ``No backend type associated with
    device type cpu`` (first hit in NeMo RL's ``prepare_refit_info()``).
Cause: ``nemo_automodel.components.distributed.mesh_utils._nccl_backend_override``
    (0.5.0 to 0.7.0) builds every mesh sub-group as ``"nccl"``, dropping the
    ``cpu:gloo`` half of the ``"cuda:nccl,cpu:gloo"`` default group.
Fix: replace it with :func:`automodel_patch._override.keep_all_backends_override`,
    plus two companions in the same module: world-sized axes reuse the default
    group, and a CPU mesh's MoE axes get the timeout too.
Removal: when the pinned nemo-automodel includes NVIDIA-NeMo/Automodel#4602;
    ``apply()`` then already returns ``NOT_NEEDED``.
Tripwire: ``tests/test_tripwire.py::test_locked_automodel_still_drops_cpu_half``.
"""

from __future__ import annotations

import enum
import threading
import warnings
from collections.abc import Callable
from typing import Any

from automodel_patch import _detect, _override, _target

__all__ = ["MARKER", "ApplyStatus", "apply", "get_original", "is_applied", "patched_names", "revert"]

MARKER = "__automodel_workaround__"
WORKAROUND = "keep-cpu-backend"
REMOVAL_CONDITION = "the automodel pin includes NVIDIA-NeMo/Automodel#4602"


class ApplyStatus(enum.StrEnum):
    """What :func:`apply` did."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    NOT_NEEDED = "not_needed"
    UNSUPPORTED = "unsupported"


_MISSING = object()  # sentinel: "attribute was absent", distinct from None
_lock = threading.RLock()
_originals: dict[str, Any] = {}
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _mark(function: Callable[..., Any], original: Any) -> Callable[..., Any]:
    setattr(function, MARKER, WORKAROUND)
    function.__original__ = original  # type: ignore[attr-defined]
    return function


def is_applied() -> bool:
    """Whether the installed ``_nccl_backend_override`` is this package's replacement."""
    module = _target.load_mesh_utils()
    return getattr(getattr(module, _target.OVERRIDE_NAME, None), MARKER, None) == WORKAROUND


def get_original(name: str = _target.OVERRIDE_NAME) -> Any:
    """The attribute of ``mesh_utils`` that :func:`apply` replaced, or None if none was."""
    value = _originals.get(name, _MISSING)
    return None if value is _MISSING else value


def patched_names() -> tuple[str, ...]:
    """Names in Automodel's ``mesh_utils`` currently replaced by :func:`apply`."""
    return tuple(_originals)


def _replacements(module: Any) -> dict[str, Callable[..., Any]]:
    original = getattr(module, _target.OVERRIDE_NAME)

    def keep_all_backends_override(axes, *, device_type, timeout_minutes):
        return _override.keep_all_backends_override(axes, device_type=device_type, timeout_minutes=timeout_minutes)

    keep_all_backends_override.__doc__ = _override.keep_all_backends_override.__doc__
    replacements = {_target.OVERRIDE_NAME: _mark(keep_all_backends_override, original)}
    if hasattr(module, "init_device_mesh"):
        wrapped = _override.make_init_device_mesh(module.init_device_mesh)
        replacements["init_device_mesh"] = _mark(wrapped, module.init_device_mesh)
    unflatten = getattr(module, "_unflatten_compat", None)
    if unflatten is not None and (wrapped := _override.make_unflatten_compat(unflatten, module)) is not None:
        replacements["_unflatten_compat"] = _mark(wrapped, unflatten)
    return replacements


def apply() -> ApplyStatus:
    """Put the corrected override in place if the installed Automodel needs it.

    Idempotent and thread-safe. Decides by behaviour (:func:`keeps_cpu_backend`),
    never by version. ``UNSUPPORTED`` (Automodel missing, the function absent or
    with another signature, as on 0.3.0 and 0.4.0) warns once and changes nothing.
    """
    with _lock:
        if is_applied():
            return ApplyStatus.ALREADY_APPLIED
        module = _target.load_mesh_utils()
        function = getattr(module, _target.OVERRIDE_NAME, None)
        if not _detect.has_supported_signature(function):
            version = _target.installed_version()
            _warn_once(
                "unsupported",
                f"automodel_patch: cannot apply the keep-cpu-backend fix: nemo-automodel {version} has no "
                f"{_target.OVERRIDE_NAME}(axes, *, device_type, timeout_minutes); nothing was changed.",
            )
            return ApplyStatus.UNSUPPORTED
        if _detect.keeps_cpu_backend():
            return ApplyStatus.NOT_NEEDED
        for name, replacement in _replacements(module).items():
            _originals.setdefault(name, getattr(module, name, _MISSING))
            setattr(module, name, replacement)
        return ApplyStatus.APPLIED


def revert() -> bool:
    """Restore every original that :func:`apply` replaced. Returns whether anything was restored."""
    with _lock:
        if not _originals:
            return False
        module = _target.load_mesh_utils()
        for name, original in _originals.items():
            if original is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, original)
        _originals.clear()
        return True
