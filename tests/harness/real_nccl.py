"""Harvested Flight Recorder dumps and their truth: find the scenario folders, read each with the real command, and
say whether its first line starts as its ``truth.json`` says.

A scenario folder (``tests/scripts/gpu_harvest.py`` writes them; real ones are committed under
:data:`FIXTURES`, ``<torch version>/<scenario>/``) holds torch's dump files and ``truth.json``. The report is read by
running ``python -m nemo_rl_shim hang-report FOLDER`` in a fresh process, bounded in time: the command a user runs,
whichever module holds the reader. Used by the fixture tests (``tests/gpu_check/``) and, on the GPU machine, by
``python -m tests.scripts.real_nccl_check`` (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.paths import REPO_ROOT

__all__ = ["FIXTURES", "READ_BOUND_S", "Reading", "read_folder", "scenario_folders", "truth_problems"]

#: Where real harvests are committed: ``<torch version>/<scenario>/``.
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "real_nccl"
#: One report's bound (it reads a few small files; about 1 s).
READ_BOUND_S = 60.0
_TRUTH = "truth.json"
_KEYS = ("scenario", "backend", "torch", "world_size", "unfinished", "kind", "first_line", "dumps", "real_nccl")


@dataclass(frozen=True)
class Reading:
    """One folder read by the command: its truth, the command's exit code and first line."""

    folder: Path
    truth: dict[str, Any]
    exit_code: int
    first_line: str

    @property
    def right(self) -> bool:
        """The first line starts as the truth says, and the command found a problem (exit 1)."""
        return self.exit_code == 1 and self.first_line.startswith(self.truth["first_line"])

    def describe(self) -> str:
        verdict = "right" if self.right else "WRONG"
        return (
            f"{verdict}: {self.folder.parent.name}/{self.folder.name}: exit {self.exit_code}, first line "
            f"{self.first_line!r}; truth: {self.truth['first_line']!r}"
        )


def scenario_folders(root: Path) -> list[Path]:
    """Every scenario folder under ``root`` (``<torch version>/<scenario>/truth.json``), sorted."""
    return sorted(path.parent for path in root.glob(f"*/*/{_TRUTH}"))


def truth_problems(folder: Path) -> list[str]:
    """What is wrong with a folder's ``truth.json`` and its dumps: keys missing, dumps it names absent."""
    try:
        truth = json.loads((folder / _TRUTH).read_text())
    except (OSError, ValueError) as error:
        return [f"{folder / _TRUTH}: unreadable ({error})"]
    problems = [f"{folder / _TRUTH}: no {key!r}" for key in _KEYS if key not in truth]
    problems += [f"{folder}: no dump file {name}" for name in truth.get("dumps", []) if not (folder / name).is_file()]
    if not truth.get("dumps"):
        problems.append(f"{folder / _TRUTH}: names no dump")
    return problems


def read_folder(folder: Path, bound_s: float = READ_BOUND_S) -> Reading:
    """``nemo-rl-shim hang-report FOLDER`` in a fresh process; its exit code and first line (stderr's where stdout
    has none: exit 2 prints its one line there)."""
    truth = json.loads((folder / _TRUTH).read_text())
    done = subprocess.run(
        [sys.executable, "-m", "nemo_rl_shim", "hang-report", str(folder)],
        capture_output=True, text=True, timeout=bound_s, check=False, cwd=REPO_ROOT,
    )  # fmt: skip
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return Reading(folder, truth, done.returncode, lines[0] if lines else "")
