"""The positive-integer check every size, count and flag goes through: an ``int`` of at least 1, and not a ``bool``."""

from __future__ import annotations

__all__ = ["is_positive_int", "positive_int"]


def is_positive_int(value: object) -> bool:
    """Whether ``value`` is an ``int`` of at least 1 (``True`` is not: YAML's ``yes`` must not read as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(value: object, name: str) -> int:
    """``value`` when :func:`is_positive_int`, else ``ValueError("{name} must be a positive integer, got ...")``."""
    if not is_positive_int(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    assert isinstance(value, int)
    return value
