"""When a layer cannot read the world it runs in: Automodel's own answer, and one warning that says so.

A layer reads the default process group (its backend string, world size, timeouts) through
c10d. Where c10d cannot answer, the layer must not raise where Automodel's own function
returns: it hands the call to the genuine code below it and warns once per workaround,
place and reason with :class:`WorkaroundFallbackWarning`. Automodel's unit tests build such
a world (``dist.is_initialized()`` patched to True, no default group); a torch whose c10d
queries change shape would be another.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["DefaultGroupUnreadable", "WorkaroundFallbackWarning", "or_genuine"]

T = TypeVar("T")

_lock = threading.Lock()
_warned: set[tuple[str, str, str]] = set()


class WorkaroundFallbackWarning(RuntimeWarning):
    """A workaround's layer gave Automodel's genuine answer because it could not read the default group."""


class DefaultGroupUnreadable(RuntimeError):
    """A c10d query about the default group raised or answered something a layer cannot use."""


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def or_genuine(slugs: str | Iterable[str], where: str, layered: Callable[[], T], genuine: Callable[[], T]) -> T:
    """``layered()``; if it raises, ``genuine()`` (Automodel's own behaviour) after one warning naming why.

    ``slugs`` names the workaround(s) whose layer this is, ``where`` the replaced function.
    Whatever ``genuine()`` raises is Automodel's own behaviour and propagates.
    """
    try:
        return layered()
    except Exception as error:  # any c10d query (or its answer) the layer cannot use: Automodel's answer instead
        names = slugs if isinstance(slugs, str) else ", ".join(slugs)
        reason = _reason(error)
        with _lock:
            first = (names, where, reason) not in _warned
            _warned.add((names, where, reason))
        if first:
            warnings.warn(
                f"automodel_patch: workaround {names} handed {where} to nemo-automodel's own code, which answers "
                f"as if the workaround were absent, because it could not read the default process group: {reason}",
                WorkaroundFallbackWarning,
                stacklevel=3,
            )
        return genuine()
