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

__all__ = ["PlainUnpickler", "RefusedPickle", "load_plain"]


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
