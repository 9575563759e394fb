"""Unpickling a file anyone may have written: plain data only, and no code runs.

A pickle runs code only through a callable it names: ``GLOBAL``/``STACK_GLOBAL`` (and ``INST``,
``EXT1``-``EXT4``) look one up by module and name, through :meth:`pickle.Unpickler.find_class`, and
``REDUCE``, ``NEWOBJ``, ``OBJ`` and ``BUILD`` can only call what such a lookup put on the stack.
:class:`PlainUnpickler` is the C unpickler with ``find_class`` refusing every name, so it builds
only what the opcodes build by themselves: ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``list``, ``tuple`` and ``dict`` (the types torch's Flight Recorder dumps hold: ``pickle``
of the dict ``FlightRecorderDetail.hpp`` builds, 2.9 to 2.15, NCCL, Gloo and hooked backends alike),
and also ``set``, ``frozenset`` and ``bytearray`` (harmless data; the reader's checks refuse them
where a dump's fields are read). Persistent ids and out-of-band buffers are refused too.

The refusal costs nothing per object: ``find_class`` is called once per name, and torch's dumps
name none. ``copyreg``'s extension registry is the one other way to a callable (``EXT*`` opcodes,
cached per process once loaded): :func:`load_plain` refuses to run while that registry is not
empty (nothing in torch or here registers one).
"""

from __future__ import annotations

import copyreg
import pickle
from typing import IO, Any

__all__ = ["PlainUnpickler", "RefusedPickle", "load_plain", "load_plain_bytes"]


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asks for something beyond plain data: a class or function by name, or a persistent id."""


class PlainUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` (the C one) that builds plain data only; :class:`RefusedPickle` on anything else."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"it names {module[:80]}.{name[:80]}: a dump holds plain data only, and is not loaded")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("it holds a persistent id: a dump holds plain data only, and is not loaded")


def load_plain(handle: IO[bytes]) -> Any:
    """The plain data pickled in ``handle``; :class:`RefusedPickle` where it would name a callable.

    Other failures (a truncated file, not a pickle) raise what :mod:`pickle` raises.
    """
    if copyreg._inverted_registry:  # an EXT code could reach a callable cached without find_class
        raise RefusedPickle("copyreg's extension registry is not empty in this process: refusing to unpickle")
    return PlainUnpickler(handle).load()


class _Bytes:
    """Bytes read as a file without copying them: ``peek`` hands the C unpickler all that is left (a view), so it
    reads from it as from a buffer, and ``read`` moves on (a view too). A ``BytesIO`` has no ``peek`` (the unpickler
    then calls ``read`` once per opcode); a ``BufferedReader`` over one copies the bytes twice."""

    __slots__ = ("at", "data", "view")

    def __init__(self, data: bytes) -> None:
        self.data, self.view, self.at = data, memoryview(data), 0

    def peek(self, size: int = 0) -> memoryview:
        return self.view[self.at :]

    def read(self, size: int = -1) -> memoryview:
        start = self.at
        self.at = len(self.view) if size is None or size < 0 else min(len(self.view), start + size)
        return self.view[start : self.at]

    def readinto(self, buffer: Any) -> int:
        part = self.read(len(buffer))
        buffer[: len(part)] = part
        return len(part)

    def readline(self) -> memoryview:
        end = self.data.find(b"\n", self.at)
        return self.read(-1 if end < 0 else end + 1 - self.at)


def load_plain_bytes(data: bytes) -> tuple[Any, int]:
    """:func:`load_plain` of the pickle at the start of ``data``, and the offset where it ended."""
    handle = _Bytes(data)
    return load_plain(handle), handle.at
