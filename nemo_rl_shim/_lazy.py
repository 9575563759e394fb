"""PEP 562 lazy exports: a package's names, each imported from its module on first use.

A package that re-exports from modules that import torch (``nemo_rl_shim``, ``nemo_rl_shim.timeouts``,
``nemo_rl_shim.flight_recorder``) imports none of them itself: :func:`lazy_exports` gives it a module
``__getattr__`` that imports a name's module when the name is first read, and a ``__dir__`` that lists the names.
So ``import nemo_rl_shim`` and the hang report, which reads only the recorder's file names, import no torch.

Standard library only: every room may use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, which exports each name of ``exports[module]`` from ``module``.

    ``module`` is relative to ``package`` (``".phases"``). A name read once is set on the package, so the
    next read is a plain attribute. Any other name raises AttributeError, as a module without it does (so
    ``from package import submodule`` still imports the submodule).
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
