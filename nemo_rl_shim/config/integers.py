"""The positive-integer check every size, count and flag goes through: an int of at least 1, read once.

What counts as an int (an ``int`` or a subclass, a numpy integer; never a ``bool``, a ``float``, a ``Decimal`` or a
``Fraction``) is :func:`nemo_rl_shim.config.numbers.plain_int`'s rule; :func:`positive_int` returns that plain value,
which is the one to pass on.
"""

from __future__ import annotations

from nemo_rl_shim.config.numbers import plain_int, shown

__all__ = ["is_positive_int", "positive_int"]


def is_positive_int(value: object) -> bool:
    """Whether ``value`` is an int of at least 1 (``True`` is not: YAML's ``yes`` must not read as 1)."""
    whole = plain_int(value)
    return whole is not None and whole >= 1


def positive_int(value: object, name: str) -> int:
    """``value`` as a plain ``int`` when :func:`is_positive_int`, else
    ``ValueError("{name} must be a positive integer, got ...")``."""
    whole = plain_int(value)
    if whole is None or whole < 1:
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
    return whole
