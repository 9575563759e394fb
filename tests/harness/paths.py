"""Where the repository is, for tests that run its commands or read its files."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

#: The repository's root: the directory holding ``pyproject.toml``.
REPO_ROOT = Path(__file__).resolve().parents[2]
