"""The one read of a number: a config value made a plain ``int`` or ``float`` once, and text read as ASCII digits.

A config value is read once, here, and the plain value returned is the one every check sees and the one passed on
to torch. A subclass is read for what it holds (``float.__float__``, ``operator.index``): its own ``__float__``,
``__index__``, ``__le__`` or ``__repr__`` never decide a check, so a ``float`` subclass whose ``__float__`` returns 0
cannot pass as 45 minutes and then reach torch as 0 ms. What each kind of key takes:

=========================================  ==========================================  =====================
given                                      int kind (sizes, counts)                    float kind (minutes,
                                                                                       factors)
=========================================  ==========================================  =====================
``int`` (a subclass too), numpy integer    ``operator.index(x)``                       ``float(operator.index(x))``
``float`` (a subclass too)                 refused (``2.0`` is not a size)             ``float.__float__(x)``
numpy floating (``float32``, ...)          refused                                     ``float(x)``
``bool``, numpy ``bool_``                  refused (YAML's ``yes`` must not read 1)    refused
``Decimal``, ``Fraction``                  refused                                     refused
``str`` (``${oc.env:...}`` gives one)      refused                                     refused
=========================================  ==========================================  =====================

The rule behind the table, with no numpy import: an int kind takes a ``numbers.Integral``; a float kind takes that or
a binary floating-point number (a ``numbers.Real`` that is not a ``numbers.Rational``). ``Decimal`` is no
``numbers.Real`` and ``Fraction`` is a ``Rational`` that is not an ``Integral``: both would be rounded to a binary
float on the way to torch, so neither is taken for either kind; write ``45`` or ``45.0``.

Text (the command line's numbers, a rank in a file name) is read as ASCII digits only: ``int("٨")`` is 8 and
``float("٤٥")`` is 45.0 in Python, and ``"²".isdigit()`` is true though ``int("²")`` fails; none of them is taken.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from typing import Any

__all__ = ["ascii_int", "ascii_number", "plain_float", "plain_int", "shown"]

_ASCII_INT = re.compile(r"[0-9]+", re.ASCII)
#: A decimal number as the command line takes it: an optional sign, ASCII digits, an optional fraction and exponent.
_ASCII_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
#: Text longer than this is no number a command or a file name needs (and ``int()`` of thousands of digits is slow).
_MAX_TEXT = 40


def plain_int(value: Any) -> int | None:
    """``value`` as a plain ``int`` when it is of an int kind (see the module docstring), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    try:
        return operator.index(value)  # an int subclass: its value, without calling its own __index__
    except TypeError:
        return None


def plain_float(value: Any) -> float | None:
    """``value`` as a plain ``float`` when it is of a float kind (see the module docstring), else None.

    An ``int`` beyond a float's range reads as infinity (so it is refused as too large, not as the wrong type).
    """
    if isinstance(value, float):
        return float.__float__(value)  # a float subclass: the value it holds, not what its __float__ says
    whole = plain_int(value)
    if whole is not None:
        try:
            return float(whole)
        except OverflowError:
            return math.inf if whole > 0 else -math.inf
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Rational):
        try:
            return float.__float__(float(value))  # numpy floating: converted once
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def ascii_int(text: str) -> int | None:
    """``text`` as a non-negative int when it is ASCII digits alone (at most 40), else None."""
    if len(text) > _MAX_TEXT or not _ASCII_INT.fullmatch(text):
        return None
    return int(text)


def ascii_number(text: str) -> float | None:
    """``text`` as a float when it is a decimal number in ASCII (``45``, ``-0.5``, ``1e3``), else None; no ``nan``,
    ``inf``, underscores, spaces or other scripts' digits."""
    if len(text) > _MAX_TEXT or not _ASCII_NUMBER.fullmatch(text):
        return None
    return float(text)


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters; an int too long for ``repr`` by its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        bits = int.bit_length(value)
        if bits > 256:
            return f"<an int of {bits:,} bits>"
    try:
        text = repr(value)
    except Exception as e:  # a value whose repr fails: say what it is
        return f"<a {type(value).__name__} whose repr raised {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
