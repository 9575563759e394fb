"""Released nemo-automodel sources, fetched from the package index and cached.

Only what the tested modules need is kept: the package ``__init__`` and
version file, ``components/distributed`` and ``shared``. A release is used by
putting its folder first on ``PYTHONPATH`` of a spawned process, where it
shadows the installed (locked) release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = [
    "ALL_RELEASES",
    "FIXED_FUNCTION_RELEASES",
    "LEGACY_RELEASES",
    "ReleaseUnavailable",
    "release_dir",
    "release_env",
]

ALL_RELEASES = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0")
#: Releases without MeshContext.build(timeout_minutes=) or _nccl_backend_override.
LEGACY_RELEASES = ("0.3.0", "0.4.0")
#: Releases whose _nccl_backend_override exists (and drops the CPU half).
FIXED_FUNCTION_RELEASES = ("0.5.0", "0.6.0", "0.7.0")

CACHE = Path(os.environ.get("NEMO_RL_SHIM_RELEASE_CACHE", Path.home() / ".cache" / "nemo-rl-shim" / "automodel"))
_KEEP = (
    "nemo_automodel/__init__.py",
    "nemo_automodel/package_info.py",
    "nemo_automodel/components/__init__.py",
    "nemo_automodel/components/distributed/",
    "nemo_automodel/shared/",
)
_DOWNLOAD_TIMEOUT_S = 300
REPO_ROOT = Path(__file__).resolve().parent.parent


class ReleaseUnavailable(RuntimeError):
    """The release could not be fetched; the message says why."""


def _download(version: str, dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--dest", str(dest), f"nemo-automodel=={version}"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise ReleaseUnavailable(f"pip download of nemo-automodel=={version} took over {_DOWNLOAD_TIMEOUT_S} s") from e
    wheels = sorted(dest.glob("nemo_automodel-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReleaseUnavailable(f"pip download of nemo-automodel=={version} failed (exit {done.returncode}): {last}")
    return wheels[0]


def release_dir(version: str) -> Path:
    """The cached source folder of one release, fetching it on first use."""
    target = CACHE / version
    if (target / ".complete").exists():
        return target
    with tempfile.TemporaryDirectory(prefix="nemo-automodel-") as tmp:
        wheel = _download(version, Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.endswith(".py") and n.startswith(_KEEP)]
            archive.extractall(target, members=members)
    (target / ".complete").write_text(wheel.name + "\n")
    return target


def release_env(version: str) -> dict[str, str]:
    """Environment for a spawned process that must import ``version`` instead of the installed release."""
    parts = [str(release_dir(version)), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}
