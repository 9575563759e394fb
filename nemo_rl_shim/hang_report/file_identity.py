"""Each file is its rank's: two rank files that are one file, or one file's copies, cannot both be real dumps.

torch's ``DebugInfoWriter`` (``torch/csrc/distributed/c10d/FlightRecorder.cpp`` and ``FlightRecorder.hpp``, 2.4 to
2.15; ``NCCLUtils.cpp`` before) writes one file per process, named ``c10::str(prefix, rank)`` from the process's own
global rank, through a fresh ``std::ofstream`` (it truncates what was there): two ranks never share a file, and two
live ranks' dumps never hold the same bytes (each records its own ranks, times and p2p names). So:

* **One inode, one rank** (:func:`same_inode`): a hard link or a symlink that makes two rank names one file
  (``ln nccl_trace_rank_0 nccl_trace_rank_3``) is refused before anything is read, naming both;
* **One content, one rank** (:func:`same_bytes`): two rank files whose bytes are equal (``cp`` of one rank's dump
  under another rank's name) are refused, naming both. Each reader hands back its file's size and a CRC-32 of its
  ends with the reduced dump (:func:`fingerprint`, from the bytes it read anyway); where two agree, the two files
  are compared byte for byte here, so a fingerprint shared by two different files never refuses them. Dumps with
  no entry are left out: ranks of one group with nothing recorded (``TORCH_FR_BUFFER_SIZE=0``, an only-active dump
  with nothing active) write the same bytes.

The message is one line naming both files (exit 2). Standard library only.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path

from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["ENDS", "fingerprint", "same_bytes", "same_inode"]

#: Bytes compared at a time where two files' fingerprints agree.
_CHUNK = 1 << 20


#: Bytes of each end of a file its fingerprint reads (a dump's head holds its groups and first entries, its tail its
#: newest entries: what two ranks' dumps differ in).
ENDS = 64 << 10


def fingerprint(data: bytes) -> tuple[int, int]:
    """``(size, CRC-32 of its first and last :data:`ENDS` bytes)``: equal for equal bytes, and a filter only (files
    whose fingerprints agree are compared in full), so it reads the ends alone."""
    view = memoryview(data)
    if len(view) <= 2 * ENDS:
        return len(data), zlib.crc32(view)
    return len(data), zlib.crc32(view[-ENDS:], zlib.crc32(view[:ENDS]))


def same_inode(paths: Mapping[int, Path]) -> None:
    """:class:`DumpError` naming two rank files that are one file (a hard link, or a symlink to another rank's
    file); a file that cannot be looked at is left to its reading, which names why."""
    seen: dict[tuple[int, int], tuple[int, Path]] = {}
    for rank, path in sorted(paths.items()):
        try:
            found = os.stat(path)
        except OSError:
            continue
        key = (found.st_dev, found.st_ino)
        if key in seen:
            other, first = seen[key]
            raise DumpError(
                f"{shown_path(first)} and {shown_path(path)} are one file (the same inode: a link): rank {other}'s "
                f"dump cannot also be rank {rank}'s; torch writes one file per rank"
            )
        seen[key] = (rank, path)


def _equal(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (read a chunk at a time; a file that cannot be read is not equal)."""
    try:
        with open(a, "rb") as first, open(b, "rb") as second:
            while True:
                x, y = first.read(_CHUNK), second.read(_CHUNK)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def same_bytes(prints: Mapping[int, tuple[Path, tuple[int, int] | None]]) -> None:
    """:class:`DumpError` naming two rank files with the same bytes, from ``{rank: (path, fingerprint)}``: files whose
    fingerprints agree are compared in full."""
    seen: dict[tuple[int, int], list[tuple[int, Path]]] = {}
    for rank, (path, found) in sorted(prints.items()):
        if found is None:
            continue
        for other, first in seen.get(found, []):
            if _equal(first, path):
                raise DumpError(
                    f"{shown_path(first)} and {shown_path(path)} hold the same {found[0]:,} bytes: rank {other}'s dump "
                    f"cannot also be rank {rank}'s (a copy under another rank's name); torch writes each rank's own"
                )
        seen.setdefault(found, []).append((rank, path))
