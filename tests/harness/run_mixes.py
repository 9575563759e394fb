"""Folders that are not one run's dumps, or whose files are not their ranks', built from the healthy NCCL-format
sets (:mod:`tests.harness.nccl_scenarios`), as restarts, shared ``/tmp`` folders and copying dumps off nodes make
them (#43). Each change works on a folder of ``nccl_trace_rank_<rank>`` files, in place:

* :func:`other_run` writes the same scenario as another run would have: later (or earlier) by ``shift_ns``, under
  another torch dump format and NCCL version where asked; :func:`mix_runs` puts its files in for some ranks;
* :func:`link` (a hard link or a symlink), :func:`copy` and :func:`swap` make one rank's file another's;
* :func:`peer_outside` names a peer outside its group in a p2p op; :func:`drop_collective` takes one collective
  number out of a rank's buffer (a gap); :func:`append` writes bytes after the pickle's end;
* :func:`rename` gives a rank's file another name (an Arabic-Indic digit, a leading zero).

These are our own builders, not torch's code: each changes what torch wrote the way the named layout would.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.harness.nccl_scenarios import build

__all__ = [
    "DAY_NS",
    "PREFIX",
    "append",
    "copy",
    "drop_collective",
    "interior_numbers",
    "link",
    "load_pg_config",
    "mix_runs",
    "other_run",
    "p2p_names",
    "peer_outside",
    "rename",
    "swap",
]

PREFIX = "nccl_trace_rank_"
DAY_NS = 86_400 * 10**9
_TIMES = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


def _path(folder: Path, rank: int) -> Path:
    return folder / f"{PREFIX}{rank}"


def _load(path: Path) -> dict[str, Any]:
    return pickle.loads(path.read_bytes())


def _save(path: Path, raw: dict[str, Any]) -> None:
    path.unlink(missing_ok=True)  # a hard link stays the other file's
    path.write_bytes(pickle.dumps(raw))


def other_run(scenario: str, folder: Path, shift_ns: int, version: str | None = None, nccl: str | None = None) -> Path:
    """``scenario`` written into ``folder`` as another run would have left it: every time moved by ``shift_ns``,
    and, where given, another dump format ``version`` and NCCL version."""
    build(scenario, folder)
    for path in sorted(folder.glob(f"{PREFIX}*")):
        raw = _load(path)
        for entry in raw["entries"]:
            for key in _TIMES:
                if entry.get(key) is not None:
                    entry[key] += shift_ns
        raw["version"] = version or raw["version"]
        raw["comm_lib_version"] = nccl or raw["comm_lib_version"]
        _save(path, raw)
    return folder


def mix_runs(folder: Path, other: Path, ranks: Iterable[int]) -> None:
    """Put ``other``'s files of ``ranks`` in ``folder`` (in place of its own, where it has them)."""
    for rank in ranks:
        source = _path(other, rank)
        if source.exists():
            _path(folder, rank).unlink(missing_ok=True)
            shutil.copyfile(source, _path(folder, rank))


def link(folder: Path, source: int, target: int, symbolic: bool = False) -> None:
    """``target``'s file made a link to ``source``'s."""
    _path(folder, target).unlink(missing_ok=True)
    if symbolic:
        os.symlink(_path(folder, source).name, _path(folder, target))
    else:
        os.link(_path(folder, source), _path(folder, target))


def copy(folder: Path, source: int, target: int) -> None:
    """``target``'s file a copy of ``source``'s."""
    data = _path(folder, source).read_bytes()  # before the target goes: the source may be a link to it
    _path(folder, target).unlink(missing_ok=True)
    _path(folder, target).write_bytes(data)


def swap(folder: Path, a: int, b: int) -> None:
    """The files of ranks ``a`` and ``b`` swapped."""
    first, second = _path(folder, a).read_bytes(), _path(folder, b).read_bytes()
    _path(folder, a).write_bytes(second)
    _path(folder, b).write_bytes(first)


def p2p_names(folder: Path, rank: int) -> list[str]:
    """The profiling names of ``rank``'s send and recv entries."""
    return [
        e["profiling_name"]
        for e in _load(_path(folder, rank))["entries"]
        if e["profiling_name"].partition(":")[2].startswith(("send ", "recv "))
    ]


def load_pg_config(folder: Path, rank: int) -> list[tuple[str, str]]:
    """``rank``'s ``pg_config`` as ``[(group name, its ranks' text)]``."""
    return [(name, facts["ranks"]) for name, facts in _load(_path(folder, rank))["pg_config"].items()]


def peer_outside(folder: Path, rank: int, index: int = 0, peer: int = 9) -> str:
    """``rank``'s ``index``-th send or recv made to name group rank ``peer`` (outside a group of fewer ranks); its new
    name."""
    path = _path(folder, rank)
    raw = _load(path)
    ops = [e for e in raw["entries"] if e["profiling_name"].partition(":")[2].startswith(("send ", "recv "))]
    entry = ops[index % len(ops)]
    lib, _, rest = entry["profiling_name"].partition(":")
    op, _, sides = rest.partition(" ")
    arrow = "->" if op == "send" else "<-"
    entry["profiling_name"] = f"{lib}:{op} {sides.partition(arrow)[0]}{arrow}{peer}"
    _save(path, raw)
    return entry["profiling_name"]


def interior_numbers(folder: Path, rank: int) -> dict[str, list[int]]:
    """Per group, the collective numbers of ``rank``'s buffer strictly between its first and last."""
    found: dict[str, set[int]] = {}
    for entry in _load(_path(folder, rank))["entries"]:
        if not entry.get("is_p2p") and entry["collective_seq_id"]:
            found.setdefault(entry["process_group"][0], set()).add(entry["collective_seq_id"])
    return {group: sorted(numbers)[1:-1] for group, numbers in found.items() if len(numbers) > 2}


def drop_collective(folder: Path, rank: int, group: str, number: int) -> None:
    """Every entry of ``rank``'s collective ``number`` on ``group`` taken out (a coalesced one's ops and closer too)."""
    path = _path(folder, rank)
    raw = _load(path)
    raw["entries"] = [
        e
        for e in raw["entries"]
        if e.get("is_p2p") or e["process_group"][0] != group or e["collective_seq_id"] != number
    ]
    _save(path, raw)


def append(folder: Path, rank: int, data: bytes) -> None:
    """``data`` written after the end of ``rank``'s pickle."""
    path = _path(folder, rank)
    content = path.read_bytes()
    path.unlink()
    path.write_bytes(content + data)


def rename(folder: Path, rank: int, text: str) -> Path:
    """``rank``'s file renamed to the prefix and ``text`` (an Arabic-Indic digit, a leading zero); its new path."""
    target = folder / f"{PREFIX}{text}"
    _path(folder, rank).rename(target)
    return target
