"""The plain-data unpickler refuses every callable, whatever module names it, and every persistent id (#33's mutation
audit: its payload tests all used ``builtins``, so a ``find_class`` that refused only that module survived; a
``persistent_load`` that returned the id as data survived; so did a ``RefusedPickle`` that was no
``UnpicklingError``).

Each payload is live: plain ``pickle.loads`` runs it (it writes a marker file, or builds the object), which the test
shows first; then :func:`~nemo_rl_shim.hang_report.safe_pickle.load_plain` must refuse it, naming what it asked
for, and nothing runs.
"""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.safe_pickle import PlainUnpickler, RefusedPickle, load_plain

pytestmark = [pytest.mark.every_lane]


def _global(module: str, name: str, argument: bytes) -> bytes:
    """``module.name(argument)`` as protocol 0's GLOBAL and REDUCE."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n(" + argument + b"tR."


def _stack_global(module: str, name: str, argument: bytes) -> bytes:
    """``module.name(argument)`` as protocol 4's STACK_GLOBAL and REDUCE."""
    text = b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)]) + name.encode()
    return b"\x80\x04" + text + b"\x93(" + argument + b"tR."


def _inst(module: str, name: str, argument: bytes) -> bytes:
    """``module.name(argument)`` as protocol 0's INST."""
    return b"(" + argument + b"i" + module.encode() + b"\n" + name.encode() + b"\n."


def _text(value: str) -> bytes:
    return b"V" + value.encode("raw_unicode_escape") + b"\n"


def _payloads(marker: Path) -> dict[str, tuple[str, str, bytes]]:
    """Callables outside ``builtins`` that a mutant allowing "every other module" would let through, each live."""
    shell = _text(f"touch {marker}")
    return {
        "posix.system": ("posix" if sys.platform != "win32" else "nt", "system", shell),
        "os.system": ("os", "system", shell),
        "subprocess.check_call": ("subprocess", "check_call", b"(" + _text("touch") + _text(str(marker)) + b"l"),
        "collections.OrderedDict": ("collections", "OrderedDict", b""),  # harmless, and still not plain data
        "builtins.exec": ("builtins", "exec", _text(f"open({str(marker)!r}, 'w').close()")),
    }


OPCODES = {"GLOBAL": _global, "STACK_GLOBAL": _stack_global, "INST": _inst}
NAMES = ["posix.system", "os.system", "subprocess.check_call", "collections.OrderedDict", "builtins.exec"]


@pytest.mark.parametrize("opcode", sorted(OPCODES))
@pytest.mark.parametrize("name", NAMES)
def test_every_module_is_refused_by_every_opcode(tmp_path: Path, name: str, opcode: str) -> None:
    marker = tmp_path / "marker"
    module, attribute, argument = _payloads(marker)[name]
    payload = OPCODES[opcode](module, attribute, argument)
    with pytest.raises(RefusedPickle, match=rf"it names {module}\.{attribute}: a dump holds plain data only"):
        load_plain(io.BytesIO(payload))
    assert not marker.exists(), "the refused pickle ran its code"
    built = pickle.loads(payload)  # the payload is live: plain unpickling runs it
    if name == "collections.OrderedDict":
        assert type(built).__name__ == "OrderedDict"
    else:
        assert marker.exists(), f"{name} by {opcode} did not run under plain pickle: the test proves nothing"


class _WithIds(pickle.Pickler):
    """Pickles one object as a persistent id, as torch.save does its storages."""

    def __init__(self, file: io.BytesIO, protocol: int, target: object) -> None:
        super().__init__(file, protocol=protocol)
        self.target = target

    def persistent_id(self, obj: object) -> str | None:
        return "storage-0" if obj is self.target else None


@pytest.mark.parametrize("protocol", [0, 2, 5])  # PERSID (text), BINPERSID
def test_a_persistent_id_is_refused_not_loaded_as_data(protocol: int) -> None:
    target = ["anything"]
    buffer = io.BytesIO()
    _WithIds(buffer, protocol, target).dump({"entries": [target]})
    with pytest.raises(RefusedPickle, match="it holds a persistent id"):
        load_plain(io.BytesIO(buffer.getvalue()))
    with pytest.raises(pickle.UnpicklingError):  # the stock unpickler has no persistent_load: it refuses too
        pickle.loads(buffer.getvalue())


def test_a_refusal_is_an_unpickling_error() -> None:
    """Callers that catch what :mod:`pickle` raises for a bad pickle catch a refusal too."""
    assert issubclass(RefusedPickle, pickle.UnpicklingError)
    try:
        load_plain(io.BytesIO(_global("os", "system", _text("true"))))
    except pickle.UnpicklingError as e:
        assert isinstance(e, RefusedPickle)
    else:
        pytest.fail("not refused")


def test_plain_data_still_loads_through_the_class_itself() -> None:
    """Every protocol's plain types (sets have opcodes of their own from protocol 4; before, pickle names a class)."""
    data = {"entries": [{"a": (1, 2.5, None, True, "s", [[4, 4]])}]}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert PlainUnpickler(io.BytesIO(pickle.dumps(data, protocol=protocol))).load() == data
    with_sets = {**data, "set": {1}, "frozen": frozenset({2}), "bytes": b"x"}
    assert PlainUnpickler(io.BytesIO(pickle.dumps(with_sets, protocol=4))).load() == with_sets
