"""Whether a folder of wheels fits an interpreter: each wheel's tags (and ``Requires-Python``), in one line.

``python -m tests.scripts.wheel_tags DIR``: against this interpreter (``scripts/gpu_check.sh`` on the GPU machine,
before it installs them). ``--python 3.12``: against CPython 3.12 on Linux x86-64 (``scripts/gpu_wheels.sh``, after
it downloads them for the GPU machine). Exit 0 when every wheel fits and no project comes twice (two versions of
one stop a ``pip install`` of the folder), 1 when one does not fit or a project comes twice, 2 when the folder holds
no wheel or a name that is not a wheel's.
"""

from __future__ import annotations

import argparse
import email.parser
import platform
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

__all__ = ["LINUX_X86_64", "Fit", "check", "main", "target_tags"]

#: The platforms a wheel for the GPU machine may carry (x86-64 Linux, glibc; pip's list for ``--platform``).
LINUX_X86_64 = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


@dataclass(frozen=True)
class Fit:
    """A folder's wheels against one interpreter: those that do not fit, and projects that come more than once."""

    target: str
    wheels: tuple[str, ...]
    misfits: tuple[str, ...]
    twice: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return bool(self.wheels) and not self.misfits and not self.twice

    def line(self) -> str:
        if not self.wheels:
            return f"wheels: none to check against {self.target}"
        if self.ok:
            return f"wheels: all {len(self.wheels)} fit {self.target}: {', '.join(self.wheels)}"
        parts = []
        if self.misfits:
            misfits = ", ".join(self.misfits)
            parts.append(f"{len(self.misfits)} of {len(self.wheels)} do not fit {self.target}: {misfits}")
        if self.twice:
            parts.append(f"more than one version of {', '.join(self.twice)}")
        return "wheels: REFUSED: " + "; ".join(parts)


def target_tags(python: str | None) -> tuple[str, str, set[Tag]]:
    """The interpreter in words, its version, and the tags it accepts: this one (``None``), or CPython ``"3.12"`` on
    x86-64 Linux."""
    if python is None:
        here = f"{platform.python_implementation()} {platform.python_version()} (this interpreter)"
        return here, platform.python_version(), set(sys_tags())
    major, minor = (int(part) for part in python.split(".")[:2])
    version = (major, minor)
    tags = set(cpython_tags(version, platforms=LINUX_X86_64))
    tags |= set(compatible_tags(version, f"cp{major}{minor}", platforms=LINUX_X86_64))
    return f"CPython {major}.{minor} on x86-64 Linux", f"{major}.{minor}", tags


def requires_python(wheel: Path) -> str | None:
    """The wheel's ``Requires-Python`` (its ``METADATA``, read from the archive; nothing in it is run), or None."""
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            return None
        metadata = email.parser.Parser().parsestr(archive.read(name).decode("utf-8", "replace"), headersonly=True)
    return metadata.get("Requires-Python")


def _outside(wheel: Path, version: str) -> str | None:
    """``Requires-Python`` when ``version`` is outside it; None when inside, absent, or the file is no zip (a name
    alone, as the tests give)."""
    try:
        wanted = requires_python(wheel)
    except (OSError, zipfile.BadZipFile):
        return None
    if not wanted:
        return None
    try:
        return None if SpecifierSet(wanted).contains(version) else f"Requires-Python {wanted}"
    except InvalidSpecifier:
        return f"Requires-Python {wanted!r} cannot be read"


def check(wheels: Iterable[Path], python: str | None = None) -> Fit:
    """Each wheel's file-name tags against the target's (``InvalidWheelFilename`` for a name that is not a wheel's)."""
    target, python_version, accepted = target_tags(python)
    names, misfits, seen, twice = [], [], set(), []
    for path in sorted(wheels):
        project, version, _, tags = parse_wheel_filename(path.name)
        names.append(f"{project} {version}")
        outside = _outside(path, python_version)
        if not tags & accepted:
            misfits.append(f"{path.name} ({', '.join(sorted(str(t) for t in tags))})")
        elif outside:
            misfits.append(f"{path.name} ({outside})")
        if project in seen:
            twice.append(str(project))
        seen.add(project)
    return Fit(target, tuple(names), tuple(misfits), tuple(dict.fromkeys(twice)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python", help="CPython X.Y on x86-64 Linux (default: this interpreter)")
    args = parser.parse_args(argv)
    wheels = sorted(args.folder.glob("*.whl"))
    if not wheels:
        print(f"wheels: none in {args.folder}")
        return 2
    try:
        fit = check(wheels, args.python)
    except (InvalidWheelFilename, ValueError) as error:
        print(f"wheels: {args.folder}: {error}")
        return 2
    print(fit.line())
    return 0 if fit.ok else 1


if __name__ == "__main__":
    sys.exit(main())
