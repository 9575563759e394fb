"""Released nemo-automodel wheels and sources, fetched from the package index and cached.

Only what the tested modules need is kept as source: the package ``__init__`` and
version file, ``components/distributed`` and ``shared``. A release is used by putting
its folder first on ``PYTHONPATH`` of a spawned process, where it shadows the installed
(locked) release. The wheel itself is kept too: the fixture wheels of
:mod:`tests.harness.fixture_wheels` are built from it.

Fixture releases (a fixed 0.7.0, see :mod:`tests.harness.fixture_wheels`) are named
``"0.7.0+fixed.<style>"`` and go through the same :func:`release_dir` / :func:`release_env`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tests.harness.paths import REPO_ROOT

__all__ = [
    "ALL_RELEASES",
    "CACHE",
    "FIXED_FUNCTION_RELEASES",
    "LEGACY_RELEASES",
    "ReleaseUnavailable",
    "extract_sources",
    "release_dir",
    "release_env",
    "release_wheel",
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


def release_wheel(version: str) -> Path:
    """The cached wheel of one released version, downloaded on first use."""
    folder = CACHE / "wheels" / version
    found = sorted(folder.glob("nemo_automodel-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nemo-automodel-", dir=folder) as tmp:
        wheel = _download(version, Path(tmp))
        target = folder / wheel.name
        os.replace(wheel, target)
        return target


def extract_sources(wheel: Path, target: Path) -> Path:
    """Unpack the modules the tests import from ``wheel`` into ``target``, once.

    Several suites on one machine share the cache and may unpack the same wheel at the same time (two
    unpacking into one folder race in ``os.makedirs``), so each unpacks into a private folder, marks it
    complete and renames it into place: ``target`` only ever appears whole. The process that loses the
    rename finds the winner's folder, complete, and drops its own. A folder left incomplete by an older,
    in-place unpacking is replaced.
    """
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.endswith(".py") and n.startswith(_KEEP)]
            archive.extractall(private, members=members)
        (private / ".complete").write_text(wheel.name + "\n")
        _rename_into_place(private, target)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return target


def _rename_into_place(private: Path, target: Path) -> None:
    for _ in range(2):
        try:
            os.rename(private, target)
            return
        except OSError:
            if (target / ".complete").exists():  # another process put its complete copy there first
                return
            shutil.rmtree(target, ignore_errors=True)  # an incomplete folder of the older, in-place unpacking
    raise OSError(f"could not put the sources of a release at {target}")


def release_dir(version: str) -> Path:
    """The cached source folder of one release (or fixture release), fetching or building it on first use."""
    if "+fixed." in version:
        from tests.harness.fixture_wheels import fixture_wheel

        wheel = fixture_wheel(version.split("+fixed.", 1)[1])
        return extract_sources(wheel, wheel.parent / "src")
    return extract_sources(release_wheel(version), CACHE / version)


def release_env(version: str) -> dict[str, str]:
    """Environment for a spawned process that must import ``version`` instead of the installed release."""
    parts = [str(release_dir(version)), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}
