"""PEP 562 lazy exports: a package's names, each imported from the module that owns it on first use.

A package that re-exports from modules that import torch (``nemo_rl_shim``, ``nemo_rl_shim.timeouts``,
``nemo_rl_shim.flight_recorder``) imports none of them itself: :func:`lazy_exports` gives it a module
``__getattr__`` that imports a name's module when the name is first read, and a ``__dir__`` that lists the names.
So ``import nemo_rl_shim`` and the hang report, which reads only the recorder's file names, import no torch.

Standard library only: every room may use it.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # typing's own constant: importing typing and collections would cost every start ~15 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Sequence[str], owners: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, which exports ``names`` (its ``__all__``) from ``owners``.

    ``owners`` are module names relative to ``package`` (``".phases"``, ``"..process_groups.setting"``); a name
    comes from the first of them whose ``__all__`` lists it, imported then, and not before. A name read once is
    set on the package, so the next read is a plain attribute. Any other name raises AttributeError, as a module
    without it does (so ``from package import submodule`` still imports the submodule).
    """
    exported = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in exported:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        for owner in owners:
            module = importlib.import_module(owner, package)
            if name in getattr(module, "__all__", ()):
                value = getattr(module, name)
                setattr(sys.modules[package], name, value)
                return value
        raise AttributeError(f"module {package!r} exports {name!r}, but none of {list(owners)} has it in __all__")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return __getattr__, __dir__
