"""The release cache on a shared machine: suites that unpack one wheel at the same time all get it whole.

Two fresh-clone suites at once once failed here: both unpacked the same fixture wheel into one folder, and
``zipfile`` raised ``FileExistsError`` in ``os.makedirs`` for a folder the other had just made
(``tests/setup/test_decision.py``, ``scripts/stress_suite.sh`` on a cold cache). Each now unpacks privately and
renames the whole folder into place (:func:`tests.harness.releases.extract_sources`).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.harness import releases
from tests.harness.releases import extract_sources

__all__: list[str] = []

#: Enough processes and folders that unpacking in place, as before, collides (it did in 5 of 5 tries here).
PROCESSES, FOLDERS = 8, 60
JOIN_S = 120


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(FOLDERS):
            archive.writestr(f"nemo_automodel/components/distributed/d{i}/e{i}/m.py", f"X = {i}\n")
        archive.writestr("nemo_automodel/README.md", "not a module: left out\n")
    return path


def _unpack(wheel: str, target: str, start: multiprocessing.synchronize.Event, out: str) -> None:
    start.wait(JOIN_S)
    try:
        extract_sources(Path(wheel), Path(target))
        Path(out).write_text("ok")
    except Exception as e:  # reported to the test, which names it
        Path(out).write_text(f"{type(e).__name__}: {e}")


def _complete(target: Path) -> bool:
    modules = sorted(p.relative_to(target).as_posix() for p in target.rglob("*.py"))
    wanted = sorted(f"nemo_automodel/components/distributed/d{i}/e{i}/m.py" for i in range(FOLDERS))
    return (target / ".complete").exists() and modules == wanted


def test_processes_unpacking_one_wheel_at_once_all_get_it_whole(tmp_path: Path) -> None:
    wheel, target = _wheel(tmp_path / "w.whl"), tmp_path / "cache" / "src"
    context = multiprocessing.get_context("fork")
    start = context.Event()
    outs = [tmp_path / f"out{i}" for i in range(PROCESSES)]
    procs = [context.Process(target=_unpack, args=(str(wheel), str(target), start, str(o))) for o in outs]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(JOIN_S)
        if proc.is_alive():
            proc.kill()
    assert [o.read_text() if o.exists() else "no result" for o in outs] == ["ok"] * PROCESSES
    assert _complete(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["src"], "a private folder was left behind"


def test_an_incomplete_folder_of_an_older_unpacking_is_replaced(tmp_path: Path) -> None:
    wheel, target = _wheel(tmp_path / "w.whl"), tmp_path / "src"
    (target / "nemo_automodel").mkdir(parents=True)
    (target / "nemo_automodel" / "half.py").write_text("")
    assert extract_sources(wheel, target) == target
    assert _complete(target)


def test_the_loser_of_the_rename_keeps_the_winners_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel, target = _wheel(tmp_path / "w.whl"), tmp_path / "src"

    def another_process_won(private: str | Path, into: str | Path) -> None:
        shutil.copytree(private, into)  # the winner's whole copy, already in place
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(releases.os, "rename", another_process_won)
    assert extract_sources(wheel, target) == target
    assert _complete(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "w.whl"]


def test_a_rename_that_keeps_failing_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel, target = _wheel(tmp_path / "w.whl"), tmp_path / "src"

    def refused(private: str | Path, into: str | Path) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(releases.os, "rename", refused)
    with pytest.raises(OSError, match="could not put the sources"):
        extract_sources(wheel, target)
    assert not target.exists()
    assert os.listdir(tmp_path) == ["w.whl"]
