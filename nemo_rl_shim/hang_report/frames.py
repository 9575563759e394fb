"""A line of Python stack, and the one rule for which lines are the user's: for the stack files and the dumps alike.

:class:`Frame` is one ``file:line in function``. Two readers make them: :mod:`.stacks` from faulthandler's
text, and :mod:`.dump_format` from each dump entry's ``frames`` (torch's Flight Recorder keeps the Python stack
where each collective was called, innermost first, as ``{"name", "filename", "line"}``, on Gloo, NCCL and hooked
backends alike). Both keep the innermost frame outside torch, this shim and the standard library
(:func:`is_runtime_frame`, :func:`user_frame`), and make each distinct frame once (:func:`frame`): the ranks of
a job share most of their frames, so a thousand ranks hold a few dozen objects, not a thousand copies.

Two frames are at the same place (:func:`same_place`) when their file's last component, line and function agree:
ranks whose checkouts lie at other paths on other nodes still call from one place.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.one_line.printable import clean

__all__ = [
    "MAX_FILE_CHARS",
    "MAX_FUNCTION_CHARS",
    "Frame",
    "by_place",
    "frame",
    "is_runtime_frame",
    "same_place",
    "shared",
    "user_frame",
]

#: A frame's file is kept to its last this many characters, its function to its first this many (hostile input).
MAX_FILE_CHARS = 300
MAX_FUNCTION_CHARS = 120
#: Paths of frames that are not the user's: torch (and its C10d bindings), this shim, the standard library; a path
#: may be relative (``torch/distributed/...``, as a frame symbolized from a source checkout reads).
_RUNTIME = re.compile(
    r"(?:^|[/\\])(?:torch|nemo_rl_shim)[/\\]"
    r"|[/\\]lib[/\\]python3(?:\.\d+)?t?[/\\](?!(?:site|dist)-packages[/\\])"
    r"|^<frozen "
)
_BASENAME = re.compile(r"[^/\\]*$")


@dataclass(frozen=True, slots=True)
class Frame:
    """One line of a stack: ``File "...", line N in function``."""

    file: str
    line: int | None
    function: str

    @property
    def where(self) -> str:
        """``/job/train.py:57 in load_batch``."""
        return f"{self.file}:{'?' if self.line is None else self.line} in {self.function}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}


#: Frames already made: one object per distinct frame (bounded, for hostile files).
_MADE: dict[tuple[str, int | None, str], Frame] = {}
_MADE_MAX = 100_000


def frame(file: str, line: int | None, function: str) -> Frame:
    """The one :class:`Frame` for ``file:line in function`` (text bounded to :data:`MAX_FILE_CHARS` and
    :data:`MAX_FUNCTION_CHARS`, made printable (:func:`~.printable.clean`), interned)."""
    key = (file[-MAX_FILE_CHARS:], line, function[:MAX_FUNCTION_CHARS])
    made = _MADE.get(key)
    if made is None:
        shown_file, shown_function = (
            clean(key[0], limit=4 * MAX_FILE_CHARS),
            clean(key[2], limit=4 * MAX_FUNCTION_CHARS),
        )
        made = Frame(sys.intern(shown_file), line, sys.intern(shown_function))
        if len(_MADE) < _MADE_MAX:
            _MADE[key] = made
    return made


#: Frames made in other processes (the readers), each kept once: bounded, for hostile files.
_SHARED: dict[Frame, Frame] = {}


def shared(found: Frame) -> Frame:
    """The one object in this process for ``found``, a frame a reader process made: equal frames, one object."""
    made = _SHARED.get(found)
    if made is None:
        made = found
        if len(_SHARED) < _MADE_MAX:
            _SHARED[found] = found
    return made


def is_runtime_frame(found: Frame) -> bool:
    """A frame of torch, of this shim or of the standard library (threading included): not the user's code."""
    return bool(_RUNTIME.search(found.file))


def user_frame(frames: Iterable[Frame]) -> Frame | None:
    """The innermost frame of ``frames`` (innermost first) that :func:`is_runtime_frame` keeps; None if none is."""
    return next((f for f in frames if not is_runtime_frame(f)), None)


def _place(found: Frame) -> tuple[int | None, str, str]:
    match = _BASENAME.search(found.file)
    return found.line, found.function, match.group(0) if match else found.file


def same_place(a: Frame | None, b: Frame | None) -> bool:
    """Whether two frames are one place in the code: the file's last component, the line and the function agree."""
    if a is None or b is None:
        return a is b
    return _place(a) == _place(b)


def by_place(ranks: Iterable[int], frames: Mapping[int, Frame | None]) -> list[tuple[Frame, list[int]]]:
    """``ranks`` that have a frame in ``frames``, grouped by :func:`same_place` (each group shown by its first
    rank's frame), the fewest first (the outliers), then by rank."""
    groups: dict[tuple[int | None, str, str], tuple[Frame, list[int]]] = {}
    for rank in ranks:
        found = frames.get(rank)
        if found is not None:
            groups.setdefault(_place(found), (found, []))[1].append(rank)
    return sorted(groups.values(), key=lambda item: (len(item[1]), item[1][0]))
