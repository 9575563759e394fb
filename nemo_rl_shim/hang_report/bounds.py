"""What a dump may hold, and what reading one may cost: the numbers' ranges and a budget of expanded items.

A pickle is a program that builds a graph: a reference (``BINGET``, two bytes) can repeat a list of a thousand
items, and a list of references to lists that refer to each other holds 2**60 items in a few hundred bytes. The
reader walks only what it needs, and every walk whose length a file controls (a shape's dimensions, an entry's
frames, a group's ranks) is charged to the dump's :class:`Budget`: :data:`ITEMS_PER_BYTE` items for each byte of
the file, plus :data:`BASE_ITEMS`. An honest dump never comes near it (each item it holds costs it at least one
byte); a dump that expands past it is refused, naming the file and what expanded. Time and memory are then linear
in the bytes read. (What the unpickler itself could be made to do, such as hashing a dict key of nested shared
tuples, is bounded by the reader processes' limits: :mod:`.loader`.)

Numbers: every integer a dump gives is checked against the range torch's own type has (``size_t`` and ``int64``
fields: :data:`MAX_INT64`), and a rank against :data:`MAX_WORLD`; nothing is converted to a float before it is.
Text: torch writes UTF-8, so a string with a lone surrogate (which UTF-8 cannot hold) is not torch's (:func:`is_text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["BASE_ITEMS", "ITEMS_PER_BYTE", "MAX_INT64", "MAX_WORLD", "Budget", "is_count", "is_int", "is_text"]

#: torch's sequence numbers, times and ids are ``size_t`` or ``int64``: above this an int64 cannot hold them.
MAX_INT64 = 2**63 - 1
#: The largest world the report reads (ranks 0 to ``MAX_WORLD - 1``): a world stated as a number (``world_size``,
#: ``--world``) costs up to this many ranks' worth of memory, whatever the file's size.
MAX_WORLD = 1 << 20
#: A dump's reading may expand this many items per byte of the file ...
ITEMS_PER_BYTE = 4
#: ... plus this many.
BASE_ITEMS = 100_000


def is_int(value: Any) -> bool:
    """An int (not a bool) in int64's range: what torch writes for a number."""
    return type(value) is int and -MAX_INT64 - 1 <= value <= MAX_INT64


def is_count(value: Any) -> bool:
    """A non-negative int in int64's range: a sequence number, an id, a time in ns, a timeout in ms."""
    return type(value) is int and 0 <= value <= MAX_INT64


def is_text(value: Any) -> bool:
    """A str that UTF-8 can write (no lone surrogate): what torch writes for text."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Budget:
    """The items one dump's reading may still expand (see the module docstring)."""

    path: Path
    left: int

    @classmethod
    def for_bytes(cls, path: Path, size: int) -> Budget:
        return cls(path, ITEMS_PER_BYTE * size + BASE_ITEMS)

    def spend(self, count: int, what: str) -> None:
        """Charge ``count`` items read for ``what``; :class:`DumpError` naming the file once the budget is spent."""
        self.left -= count
        if self.left < 0:
            raise DumpError(
                f"{shown_path(self.path)}: {what} expands past {ITEMS_PER_BYTE} items per byte of the file "
                "(shared references repeat one object many times): refused"
            )
