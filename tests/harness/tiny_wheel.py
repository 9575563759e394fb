"""A minimal pure-Python wheel, made on the spot, for tests of what reads wheels (their tags, ``Requires-Python``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

__all__ = ["build_wheel"]


def build_wheel(folder: Path, project: str, requires_python: str) -> Path:
    """``<project>-1.0-py3-none-any.whl`` in ``folder``: an empty module and its dist-info, with ``requires_python``."""
    path = folder / f"{project}-1.0-py3-none-any.whl"
    info = f"{project}-1.0.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\nRequires-Python: {requires_python}\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{project}.py", "")
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path
