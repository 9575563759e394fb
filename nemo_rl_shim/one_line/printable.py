"""Text from a file anyone may have written, made safe to print: one line, bounded, always encodable.

A config's path, a dump's group names, descriptions, op names and frames, a stack file's lines and the file names
themselves come from a shared folder. Printed as they are, a lone surrogate (``"\\ud800"``, which no UTF-8 writer
can produce) or a file name that is not UTF-8 (Python reads it as surrogates, ``"\\udcff"``) stops the report with
``UnicodeEncodeError``, and a newline inside a name breaks the one-line rule. :func:`clean` is applied where such
text enters a typed record; :func:`encodable` is the last guard on everything the command prints.
"""

from __future__ import annotations

import os
import reprlib
from typing import Any

__all__ = ["MAX_TEXT", "clean", "encodable", "shown", "shown_path"]

#: Text kept of one value by default (a group name, an op name): the rest is cut, and the cut said.
MAX_TEXT = 200


def _escape(char: str) -> str:
    if char == "\n":
        return "\\n"
    if char == "\t":
        return "\\t"
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` with every character that is not printable (control characters, lone surrogates, other
    separators) written as its escape (``\\n``, ``\\x1b``, ``\\udcff``), cut to ``limit`` characters
    (``...(+N)`` says how many more there were)."""
    more = len(text) - limit
    if more > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    return f"{text}...(+{more})" if more > 0 else text


class _Repr(reprlib.Repr):
    """``reprlib`` bounded for hostile values: an int of more digits than ``repr`` will write is said by its size."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<an int of {x.bit_length():,} bits>"
        return super().repr_int(x, level)


_SHOW = _Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 2, 40, 40, 4, 4
_SHOW.maxtuple = _SHOW.maxset = _SHOW.maxfrozenset = _SHOW.maxdeque = _SHOW.maxarray = 4


def shown(value: Any, typed: bool = True) -> str:
    """A value read from a file as one short printable line with its type: ``'3' (str)``, ``[[1, [...]], ...] (list)``
    (bounded: never walks a shared nested list in full, never writes a huge int's digits); ``typed=False``: without
    the type (a key: ``'0'``)."""
    try:
        text = _SHOW.repr(value)
    except Exception:  # a value whose repr fails (none of the plain types should): its type still says enough
        text = "<unprintable>"
    return f"{clean(text, limit=400)} ({type(value).__name__})" if typed else clean(text, limit=400)


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as one printable line (a name that is not UTF-8 shows its bytes' escapes)."""
    return clean(os.fspath(path), limit=4096)


def encodable(text: str) -> str:
    """``text`` that UTF-8 can always write: any surrogate left is written as its escape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
