"""Put the workarounds the installed Automodel needs in place, take them out, and say which are in force.

Each workaround (:mod:`automodel_patch.keep_cpu_backend`, :mod:`automodel_patch.cpu_mesh_timeout`)
is a *layer*: a replacement of ``mesh_utils._nccl_backend_override`` (and companions) that
handles its own case and hands every other call to what lies below it. The active layers
are stacked, in :data:`WORKAROUNDS` order, over Automodel's genuine functions; when any is
active, torch's ``init_device_mesh`` (as ``mesh_utils`` sees it) is wrapped so that a
world-sized axis reuses the default group instead of building an identical communicator.

Conventions (gevent's monkey-patching state, NeMo RL's AUTOMODEL-WORKAROUND): originals are
saved once with ``setdefault`` and a sentinel for "attribute was missing"; every replacement
carries a marker attribute naming the workarounds in it and ``__original__``; applying twice
does nothing; :func:`revert` restores exactly what was there.
"""

from __future__ import annotations

import enum
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from automodel_patch import _override, _target
from automodel_patch._verdict import Detection, Verdict
from automodel_patch._workaround import Workaround

__all__ = [
    "MARKER",
    "ApplyReport",
    "ApplyStatus",
    "active",
    "apply",
    "detect",
    "get_original",
    "is_applied",
    "patched_names",
    "revert",
]

MARKER = "__automodel_workaround__"
_REUSE_NAME = "init_device_mesh"


class ApplyStatus(enum.StrEnum):
    """What :func:`apply` did for one workaround."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    NOT_NEEDED = "not_needed"
    UNSUPPORTED = "unsupported"


class ApplyReport(Mapping[str, ApplyStatus]):
    """``{slug: ApplyStatus}`` for each workaround :func:`apply` was asked about, with its detection."""

    def __init__(self, statuses: dict[str, ApplyStatus], detections: dict[str, Detection]) -> None:
        self._statuses = statuses
        self.detections = detections

    def __getitem__(self, slug: str) -> ApplyStatus:
        return self._statuses[slug]

    def __iter__(self) -> Iterator[str]:
        return iter(self._statuses)

    def __len__(self) -> int:
        return len(self._statuses)

    @property
    def applied(self) -> tuple[str, ...]:
        """Slugs put in place by this call."""
        return tuple(slug for slug, status in self._statuses.items() if status is ApplyStatus.APPLIED)

    def to_dict(self) -> dict[str, str]:
        return {slug: status.value for slug, status in self._statuses.items()}

    def __repr__(self) -> str:
        return f"ApplyReport({self.to_dict()})"


_MISSING = object()  # sentinel: "attribute was absent", distinct from None
_lock = threading.RLock()
_originals: dict[str, Any] = {}
_active: list[str] = []
_warned: set[str] = set()
_registry: tuple[Workaround, ...] = ()


def _register(workarounds: tuple[Workaround, ...]) -> None:
    global _registry
    _registry = workarounds


def _workaround(slug: str) -> Workaround:
    for workaround in _registry:
        if workaround.slug == slug:
            return workaround
    known = ", ".join(w.slug for w in _registry)
    raise ValueError(f"unknown workaround {slug!r}; known: {known}")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _genuine(module: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Automodel's own attributes: the saved originals where a layer replaced them."""
    genuine = {}
    for name in names:
        value = _originals.get(name, getattr(module, name, _MISSING)) if module is not None else _MISSING
        if value is not _MISSING:
            genuine[name] = value
    return genuine


def detect(slug: str, *, installed: bool = False) -> Detection:
    """The verdict on Automodel's genuine functions (``installed=True``: on what is installed now,
    layers included, i.e. "does it work after the fork fix"). Never raises."""
    workaround = _workaround(slug)
    module = _target.load_mesh_utils()
    if module is None:
        return Detection(slug, Verdict.ABSENT, "nemo-automodel's mesh_utils cannot be imported")
    if installed:
        functions = {name: getattr(module, name) for name in workaround.names if hasattr(module, name)}
    else:
        functions = _genuine(module, workaround.names)
    return workaround.detect(functions)


def _mark(function: Callable[..., Any], slugs: tuple[str, ...], original: Any) -> Callable[..., Any]:
    setattr(function, MARKER, slugs)
    function.__original__ = original  # type: ignore[attr-defined]
    return function


def _install(module: Any, slugs: list[str]) -> None:
    """Stack the layers of ``slugs`` over the genuine functions; restore everything when empty."""
    names = {name for w in _registry for name in w.names} | {_REUSE_NAME}
    for name in names:
        if hasattr(module, name) or name in _originals:
            _originals.setdefault(name, getattr(module, name, _MISSING))
    genuine = {name: value for name, value in _originals.items() if value is not _MISSING}
    current: dict[str, Any] = dict(genuine)
    touched: dict[str, list[str]] = {}
    for workaround in _registry:
        if workaround.slug in slugs:
            for name, function in workaround.layer(module, current).items():
                current[name] = function
                touched.setdefault(name, []).append(workaround.slug)
    if slugs and _REUSE_NAME in genuine:
        current[_REUSE_NAME] = _override.make_init_device_mesh(genuine[_REUSE_NAME], tuple(slugs))
        touched[_REUSE_NAME] = list(slugs)
    for name, original in _originals.items():
        if name in touched:
            setattr(module, name, _mark(current[name], tuple(touched[name]), original))
        elif original is _MISSING:
            if hasattr(module, name):
                delattr(module, name)
        else:
            setattr(module, name, original)
    if not slugs:
        _originals.clear()


def active() -> tuple[str, ...]:
    """Slugs of the workarounds in force in this process, in registry order."""
    module = _target.load_mesh_utils()
    installed = getattr(getattr(module, _target.OVERRIDE_NAME, None), MARKER, ()) if module is not None else ()
    return tuple(w.slug for w in _registry if w.slug in installed and w.slug in _active)


def is_applied(slug: str | None = None) -> bool:
    """Whether ``slug`` (default: any workaround) is in force in this process."""
    slugs = active()
    return bool(slugs) if slug is None else slug in slugs


def get_original(name: str = _target.OVERRIDE_NAME) -> Any:
    """The attribute of ``mesh_utils`` that a layer replaced, or None if none was."""
    value = _originals.get(name, _MISSING)
    return None if value is _MISSING else value


def patched_names() -> tuple[str, ...]:
    """Names in Automodel's ``mesh_utils`` currently replaced by a workaround."""
    module = _target.load_mesh_utils()
    return tuple(name for name in _originals if getattr(getattr(module, name, None), MARKER, None))


def _apply_one(workaround: Workaround) -> tuple[ApplyStatus, Detection]:
    detection = detect(workaround.slug)
    if workaround.slug in _active:
        return ApplyStatus.ALREADY_APPLIED, detection
    if detection.verdict is Verdict.ABSENT:
        return ApplyStatus.UNSUPPORTED, detection
    if detection.verdict is Verdict.NOT_NEEDED:
        return ApplyStatus.NOT_NEEDED, detection
    # NEEDED, or UNKNOWN: the layer is known-good whatever the genuine code does, so it goes in.
    _active.append(workaround.slug)
    return ApplyStatus.APPLIED, detection


def apply(*slugs: str) -> ApplyReport:
    """Put in place the named workarounds (default: all) that the installed Automodel still needs.

    Idempotent and thread-safe; decides by behaviour (each workaround's probe), never by
    version. Per workaround: ``APPLIED`` (needed, or the probe could not judge: the layer
    is correct either way), ``ALREADY_APPLIED``, ``NOT_NEEDED`` (the genuine code already
    behaves), ``UNSUPPORTED`` (nothing to replace, as on 0.3.0 and 0.4.0: warns once,
    changes nothing). Never raises for an unusable Automodel.
    """
    with _lock:
        chosen = [_workaround(slug) for slug in slugs] if slugs else list(_registry)
        module = _target.load_mesh_utils()
        statuses: dict[str, ApplyStatus] = {}
        detections: dict[str, Detection] = {}
        for workaround in chosen:
            statuses[workaround.slug], detections[workaround.slug] = _apply_one(workaround)
        unsupported = [slug for slug, status in statuses.items() if status is ApplyStatus.UNSUPPORTED]
        if unsupported:
            reason, version = detections[unsupported[0]].reason, _target.installed_version()
            _warn_once(
                f"unsupported:{version}:{reason}",
                f"automodel_patch: cannot apply {', '.join(unsupported)}: nemo-automodel "
                f"{version} has {reason}; nothing was changed.",
            )
        if any(status is ApplyStatus.APPLIED for status in statuses.values()):
            _install(module, list(_active))
        return ApplyReport(statuses, detections)


def revert(*slugs: str) -> bool:
    """Take the named workarounds (default: all) out; the others stay. Returns whether anything changed."""
    with _lock:
        chosen = {_workaround(slug).slug for slug in slugs} if slugs else set(_active)
        removed = [slug for slug in _active if slug in chosen]
        if not removed:
            return False
        _active[:] = [slug for slug in _active if slug not in chosen]
        _install(_target.load_mesh_utils(), list(_active))
        return True
