"""Which files of a folder are one run's: its dumps, the group maps written at set-up, the stack files; and the
rule that keeps one run per report.

The folder and every subfolder are walked (hidden ones skipped; symlinked folders are not followed), once. A file
is one of the run's by its name alone: ``<prefix><rank>`` (a dump: the shim's
:data:`~nemo_rl_shim.flight_recorder.names.DUMP_FILE_NAME`, the prefix in ``TORCH_FR_DUMP_TEMP_FILE``, torch's
``nccl_trace_rank_``, or any other), :data:`~nemo_rl_shim.flight_recorder.names.SIDECAR_NAME` (a group map) and
:data:`~nemo_rl_shim.flight_recorder.names.STACK_FILE_NAME` (a stack). Nothing is opened here; every file is read
later as a regular file that may not leave the folder (:mod:`nemo_rl_shim.untrusted.files`).

**One run per report** (:func:`find_run`):

* **One prefix.** Dumps under several prefixes are refused, each named with where it lies, unless one of them is the
  prefix ``TORCH_FR_DUMP_TEMP_FILE`` (or its older name) gives in this process: then that one is read, and
  :attr:`RunFiles.rule` says so (the report's first line ends with it), with the others left unread.
* **One layout.** A run's files lie in one folder, or in one folder per node, all at one depth below the folder
  given. Files of the run at another depth (a copy of another run in a subfolder beside the real one) are refused,
  naming both folders.
* **One file per rank.** A rank with two dumps, two group maps or two stack files is refused, naming both; so are
  two rank names that are one file (a hard link, a symlink: :func:`~.file_identity.same_inode`, checked once the
  world the lowest rank's dump states has refused the files outside it, before the others are read).
* **A rank is ASCII digits.** torch names a dump ``c10::str(prefix, rank)`` of its int rank (``DebugInfoWriter``'s
  constructor, ``torch/csrc/distributed/c10d/FlightRecorder.hpp``, 2.4 to 2.15), the shim ``prefix + str(rank)``:
  ASCII digits without a leading zero. A file under the run's prefix whose rest is anything else
  (``nccl_trace_rank_\u0663``, an Arabic-Indic three, which Python's ``int`` would read as 3; ``nccl_trace_rank_03``;
  ``nccl_trace_rank_3.bak``) is not a dump: it is a stray, never read, and named (:attr:`RunFiles.strays`).
* **A dump is a file.** A folder named like a dump of the run (``nccl_trace_rank_3/``) is refused, by its kind, as
  a FIFO or a device named so is when it is opened: it is no rank's dump, and that rank must not read as merely
  missing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME, ENV_PAIRS, SIDECAR_NAME, STACK_FILE_NAME
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["RANK_DIGITS", "RunFiles", "dump_prefixes", "find_run", "is_rank_text", "stack_files", "walk"]

#: A rank in a file name has at most this many digits (a name that ends in more is a stray, not a dump).
RANK_DIGITS = 18
_DUMP = re.compile(r"(?P<prefix>[^.].*?)(?P<rank>[0-9]+)")  # ASCII digits: int() also reads "٣" as 3
#: A name that Python's ``\d`` (any Unicode digit) would read as a dump's: what a stray looks like.
_UNICODE_DUMP = re.compile(r"(?P<prefix>[^.].*?)(?P<rank>\d+)")
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
    strays: list[Path] = field(default_factory=list)  # named like a dump of the run, but not a rank's name: not read


def dump_prefixes(environ: Mapping[str, str] | None = None) -> list[str]:
    """The prefixes that name this process's dumps, the first found wins: ``TORCH_FR_DUMP_TEMP_FILE``'s (or its
    older name's), then the shim's own."""
    env = os.environ if environ is None else environ
    named = [Path(env[name]).name for name in ENV_PAIRS["dump_file"] if env.get(name)]
    return list(dict.fromkeys([*named, DUMP_FILE_NAME]))


def walk(directory: Path) -> list[Path]:
    """Every file under ``directory``, hidden files and folders skipped, symlinked folders not followed; sorted."""
    return _walk(directory)[0]


def _walk(directory: Path) -> tuple[list[Path], list[Path]]:
    """:func:`walk`'s files, and the folders it went into."""
    files, folders = [], []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        folders += [Path(root) / d for d in dirs]
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return files, folders


def is_rank_text(text: str) -> bool:
    """Whether ``text`` is a rank as torch and the shim write one in a file name: ASCII digits, no leading zero."""
    return 0 < len(text) <= RANK_DIGITS and text.isascii() and text.isdigit() and (text == "0" or text[0] != "0")


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
        raise DumpError(
            f"{shown_path(directory)} holds no flight-recorder dumps (files named <prefix><rank>, the rank in ASCII "
            "digits)"
        )
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


def _no_folder_named_like_a_dump(folders: list[Path], prefix: str) -> None:
    """A folder named ``<prefix><rank>`` is no rank's dump: refused, by its kind (as a FIFO named so is)."""
    for folder in folders:
        name = folder.name
        if name.startswith(prefix) and is_rank_text(name[len(prefix) :]):
            raise DumpError(
                f"{shown_path(folder)} is a directory, not a regular file: a dump is not read from it (a folder named "
                f"like rank {int(name[len(prefix) :])}'s dump)"
            )


def _strays(files: list[Path], prefix: str) -> list[Path]:
    """Files under the run's prefix whose rest is not a rank's name (see the module docstring)."""
    return [
        path
        for path in files
        if path.name.startswith(prefix)
        and not is_rank_text(path.name[len(prefix) :])
        and not _SIDECAR.fullmatch(path.name)
        and not _STACK.fullmatch(path.name)
    ]


def find_run(directory: str | Path, environ: Mapping[str, str] | None = None) -> RunFiles:
    """One run's files in ``directory`` (see the module docstring); :class:`DumpError` where it is not one run."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{shown_path(directory)} is not a directory")
    files, folders = _walk(directory)
    candidates: dict[str, list[Path]] = {}
    sidecars: dict[int, Path] = {}
    unread: list[Path] = []
    for path in files:
        if m := _SIDECAR.fullmatch(path.name):
            _add(sidecars, int(m["rank"]), path, "group maps")
        elif (m := _DUMP.fullmatch(path.name)) and is_rank_text(m["rank"]):
            candidates.setdefault(m["prefix"], []).append(path)
        elif _UNICODE_DUMP.fullmatch(path.name) and not _STACK.fullmatch(path.name):
            unread.append(path)
    if not candidates and unread:
        raise DumpError(
            f"{shown_path(directory)} holds no flight-recorder dumps: {shown_path(unread[0])}"
            f"{f' and {len(unread) - 1:,} more files' if len(unread) > 1 else ''} end in a number that is not a "
            "rank's name (ASCII digits, no leading zero)"
        )
    prefix, rule = _choose(candidates, directory, environ)
    _no_folder_named_like_a_dump(folders, prefix)
    run = RunFiles(directory, Path(os.path.realpath(directory)), prefix, rule=rule, sidecars=sidecars)
    run.left = {p: paths for p, paths in candidates.items() if p != prefix}
    for path in candidates[prefix]:
        _add(run.dumps, int(path.name[len(prefix) :]), path, "dumps")  # ASCII digits, at most RANK_DIGITS
    run.strays = _strays(files, prefix)
    run.stacks = stack_files(files)
    _one_layout(run)
    return run
