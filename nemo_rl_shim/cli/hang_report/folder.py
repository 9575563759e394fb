"""Which files of a folder are one run's: its dumps, the group maps written at set-up, the stack files; and the
rule that keeps one run per report.

The folder and every subfolder are walked (hidden ones skipped; symlinked folders are not followed), once. A file
is one of the run's by its name alone: ``<prefix><rank>`` (a dump: the shim's
:data:`~nemo_rl_shim.flight_recorder.names.DUMP_FILE_NAME`, the prefix in ``TORCH_FR_DUMP_TEMP_FILE``, torch's
``nccl_trace_rank_``, or any other), :data:`~nemo_rl_shim.flight_recorder.names.SIDECAR_NAME` (a group map) and
:data:`~nemo_rl_shim.flight_recorder.names.STACK_FILE_NAME` (a stack). Nothing is opened here; every file is read
later as a regular file that may not leave the folder (:mod:`nemo_rl_shim.cli.untrusted_file`).

**One run per report** (:func:`find_run`):

* **One prefix.** Dumps under several prefixes are refused, each named with where it lies, unless one of them is the
  prefix ``TORCH_FR_DUMP_TEMP_FILE`` (or its older name) gives in this process: then that one is read, and
  :attr:`RunFiles.rule` says so (the report's first line ends with it), with the others left unread.
* **One layout.** A run's files lie in one folder, or in one folder per node, all at one depth below the folder
  given. Files of the run at another depth (a copy of another run in a subfolder beside the real one) are refused,
  naming both folders.
* **One file per rank.** A rank with two dumps, two group maps or two stack files is refused, naming both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nemo_rl_shim.cli.hang_report.records import DumpError
from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME, ENV_PAIRS, SIDECAR_NAME, STACK_FILE_NAME
from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["RANK_DIGITS", "RunFiles", "dump_prefixes", "find_run", "stack_files", "walk"]

#: A rank in a file name has at most this many digits (an int of more is not a rank, and ``int()`` of thousands of
#: digits is refused by Python itself).
RANK_DIGITS = 18
_DUMP = re.compile(r"(?P<prefix>[^.].*?)(?P<rank>[0-9]+)")  # ASCII digits: int() also reads "٣" as 3
_SIDECAR = re.compile(re.escape(SIDECAR_NAME).replace(re.escape("{rank}"), r"(?P<rank>[0-9]{1,18})"))
_STACK = re.compile(re.escape(STACK_FILE_NAME).replace(re.escape("{rank}"), r"(?P<rank>[0-9]{1,9})"))


@dataclass
class RunFiles:
    """One run's files in a folder (see the module docstring): by rank, as their names give it."""

    directory: Path  # as given
    root: Path  # the folder, resolved: what a symlink must not leave
    prefix: str  # the dumps' file-name prefix
    dumps: dict[int, Path] = field(default_factory=dict)
    sidecars: dict[int, Path] = field(default_factory=dict)
    stacks: dict[int, Path] = field(default_factory=dict)
    rule: str = ""  # how the prefix was chosen, where the folder held several: said on the first line
    left: dict[str, list[Path]] = field(default_factory=dict)  # the prefixes not read (where a rule chose) -> files


def dump_prefixes(environ: Mapping[str, str] | None = None) -> list[str]:
    """The prefixes that name this process's dumps, the first found wins: ``TORCH_FR_DUMP_TEMP_FILE``'s (or its
    older name's), then the shim's own."""
    env = os.environ if environ is None else environ
    named = [Path(env[name]).name for name in ENV_PAIRS["dump_file"] if env.get(name)]
    return list(dict.fromkeys([*named, DUMP_FILE_NAME]))


def walk(directory: Path) -> list[Path]:
    """Every file under ``directory``, hidden files and folders skipped, symlinked folders not followed; sorted."""
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return files


def _rank_of(text: str, path: Path) -> int:
    if len(text) > RANK_DIGITS:
        raise DumpError(f"{shown_path(path)}: its name ends in a number of {len(text):,} digits, not a rank")
    return int(text)


def _add(found: dict[int, Path], rank: int, path: Path, what: str) -> None:
    if rank in found:
        raise DumpError(
            f"rank {rank} has two {what}, {shown_path(found[rank])} and {shown_path(path)}: keep one run per folder"
        )
    found[rank] = path


def stack_files(files: list[Path]) -> dict[int, Path]:
    """``{rank: stack file}`` among ``files``, by their exact name; a rank with two is refused."""
    found: dict[int, Path] = {}
    for path in files:
        if m := _STACK.fullmatch(path.name):
            _add(found, int(m["rank"]), path, "stack files")
    return found


def _where(paths: list[Path], directory: Path) -> str:
    folders = sorted({shown_path(p.parent.relative_to(directory)) or "." for p in paths})
    return ", ".join(folders[:3]) + (f" and {len(folders) - 3} more folders" if len(folders) > 3 else "")


def _choose(candidates: dict[str, list[Path]], directory: Path, environ: Mapping[str, str] | None) -> tuple[str, str]:
    """The prefix to read, and the rule that chose it where there were several (empty where there was one)."""
    if not candidates:
        raise DumpError(f"{shown_path(directory)} holds no flight-recorder dumps (files named <prefix><rank>)")
    if len(candidates) == 1:
        return next(iter(candidates)), ""
    for prefix in dump_prefixes(environ)[:-1]:  # the environment's, not the shim's default: a rule the user set
        if prefix in candidates:
            return prefix, f"read {prefix}<rank>, the prefix TORCH_FR_DUMP_TEMP_FILE names"
    runs = "; ".join(
        f"{shown_path(prefix)}<rank> ({len(paths)} in {_where(paths, directory)})"
        for prefix, paths in candidates.items()
    )
    raise DumpError(
        f"{shown_path(directory)} holds dumps of several runs: {runs}; keep one run per folder, or name the run's "
        "prefix in TORCH_FR_DUMP_TEMP_FILE"
    )


def _depth(path: Path, directory: Path) -> int:
    return len(path.relative_to(directory).parts) - 1


def _one_layout(run: RunFiles) -> None:
    """Every file of the run at one depth below the folder (one folder, or one per node)."""
    files = [*run.dumps.values(), *run.sidecars.values(), *run.stacks.values()]
    depths: dict[int, Path] = {}
    for path in files:
        depths.setdefault(_depth(path, run.directory), path)
    if len(depths) > 1:
        (_, a), (_, b) = sorted(depths.items())[:2]
        raise DumpError(
            f"{shown_path(run.directory)} holds one run's files at several depths ({shown_path(a)} and "
            f"{shown_path(b)}): a run's files lie in one folder, or in one folder per node; keep one run per folder"
        )


def find_run(directory: str | Path, environ: Mapping[str, str] | None = None) -> RunFiles:
    """One run's files in ``directory`` (see the module docstring); :class:`DumpError` where it is not one run."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{shown_path(directory)} is not a directory")
    files = walk(directory)
    candidates: dict[str, list[Path]] = {}
    sidecars: dict[int, Path] = {}
    for path in files:
        if m := _SIDECAR.fullmatch(path.name):
            _add(sidecars, int(m["rank"]), path, "group maps")
        elif m := _DUMP.fullmatch(path.name):
            candidates.setdefault(m["prefix"], []).append(path)
    prefix, rule = _choose(candidates, directory, environ)
    run = RunFiles(directory, Path(os.path.realpath(directory)), prefix, rule=rule, sidecars=sidecars)
    run.left = {p: paths for p, paths in candidates.items() if p != prefix}
    for path in candidates[prefix]:
        _add(run.dumps, _rank_of(path.name[len(prefix) :], path), path, "dumps")
    run.stacks = stack_files(files)
    _one_layout(run)
    return run
