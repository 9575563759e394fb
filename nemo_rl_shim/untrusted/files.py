"""Reading a file that anyone with access to a shared folder may have written: a regular file, never blocking, never
more than its size, under a cap.

``hang-report`` reads every rank's dump, group map and stack file from a folder the ranks (and anyone else with
access) wrote; ``preflight --config`` reads a YAML file it is handed. :func:`read_untrusted` is the one way both
open them:

* **Regular files only.** The path is looked at (``lstat``) before it is opened, and the open file again
  (``fstat``): a FIFO, a character or block device, a socket or a directory is refused, named by its kind, and a
  FIFO or device is never opened (opening a FIFO blocks until a writer comes; reading ``/dev/zero`` never ends).
  The open itself is non-blocking (``O_NONBLOCK``) and does not follow a symlink swapped in meanwhile
  (``O_NOFOLLOW``).
* **Symlinks.** With a ``root`` (the folder the file was found in), a symlink is followed only where it stays inside
  that folder; one that leaves it (to ``/dev/zero``, to another run's folder) is refused. Without a root (a path the
  user typed), a symlink is followed, and what it points to must still be a regular file.
* **Bounded.** A file larger than ``cap`` bytes is refused before it is read, and at most its size (as ``fstat``
  gave it when it was opened) is read: a file that grows while it is read is read to that size.

Every refusal is a :class:`UntrustedFileError` (a ``ValueError``) whose message is one line naming the file
(:class:`NotRegularFile` where the file is of the wrong kind). The standard library and
:mod:`nemo_rl_shim.one_line.printable` only: the hang report imports it, and imports no torch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["NotRegularFile", "UntrustedFileError", "file_kind", "inside", "read_parts", "read_untrusted"]

#: Bytes asked of ``os.read`` at a time.
_CHUNK = 1 << 20
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
)


class UntrustedFileError(ValueError):
    """A file that is not read: not a regular file, a symlink out of its folder, too large, or unreadable."""


class NotRegularFile(UntrustedFileError):
    """A FIFO, a device, a socket, a directory, or a symlink out of its folder, where a regular file was expected:
    never something a writer of that file leaves by mistake."""


def file_kind(mode: int) -> str:
    """``"a regular file"``, ``"a FIFO"``, ``"a character device"``, ... for an ``st_mode``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (resolved) lies in ``root`` (resolved) or is it."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _size_text(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB" if count >= 2**20 else f"{count:,} bytes"


def _target(path: Path, root: str | os.PathLike[str] | None, what: str) -> str:
    """The path to open: ``path`` itself, or where its symlink points (inside ``root`` where one is given)."""
    try:
        found = os.lstat(path)
    except OSError as e:
        raise UntrustedFileError(f"{shown_path(path)}: cannot read this {what}: {e.strerror or e}") from None
    if not stat.S_ISLNK(found.st_mode):
        return str(path)
    real = os.path.realpath(path)
    if root is not None and not inside(real, root):
        raise NotRegularFile(
            f"{shown_path(path)} is a symlink to {shown_path(real)}, outside {shown_path(root)}: a {what} is read "
            "only from inside the folder"
        )
    return real


def read_untrusted(
    path: str | os.PathLike[str],
    *,
    cap: int,
    what: str = "file",
    root: str | os.PathLike[str] | None = None,
    cut: bool = False,
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``cap`` bytes (see the module docstring); ``what`` names the
    file in messages (``"dump"``, ``"group map"``, ``"config"``); ``root``: the folder it must not leave. ``cut``:
    a larger file is not refused but read to ``cap + 1`` bytes (the caller sees it was longer)."""
    path = Path(path)
    target = _target(path, root, what)
    try:
        found = os.stat(target)
    except OSError as e:
        raise UntrustedFileError(f"{shown_path(path)}: cannot read this {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(found.st_mode):  # refused before it is opened: opening a FIFO or a device has effects
        raise NotRegularFile(
            f"{shown_path(path)} is {file_kind(found.st_mode)}, not a regular file: a {what} is not read from it"
        )
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as e:
        raise UntrustedFileError(f"{shown_path(path)}: cannot open this {what}: {e.strerror or e}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # swapped between the look and the open
            raise NotRegularFile(f"{shown_path(path)} is {file_kind(opened.st_mode)}, not a regular file")
        if opened.st_size > cap and cut:
            return _read_exactly(fd, cap + 1, path, what)
        if opened.st_size > cap:
            raise UntrustedFileError(
                f"{shown_path(path)} is {_size_text(opened.st_size)}, more than a {what} can be "
                f"({_size_text(cap)}): not read"
            )
        return _read_exactly(fd, opened.st_size, path, what)
    finally:
        os.close(fd)


def _read_exactly(fd: int, size: int, path: Path, what: str) -> bytes:
    parts, left = [], size
    while left > 0:
        try:
            part = os.read(fd, min(left, _CHUNK))
        except OSError as e:
            raise UntrustedFileError(f"{shown_path(path)}: cannot read this {what}: {e.strerror or e}") from None
        if not part:  # shrank while read: what was there
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_parts(
    path: str | os.PathLike[str],
    parts: list[tuple[int, int]],
    *,
    what: str = "file",
    root: str | os.PathLike[str] | None = None,
) -> tuple[int, list[bytes]]:
    """The file's size and the bytes of each ``(offset, length)`` of ``parts`` (a negative offset counts from the
    end; each cut to the file), opened as :func:`read_untrusted` opens a file (a regular file, never blocking, not
    out of ``root``): for a reader that needs the head and the tail of a large file, not its middle."""
    path = Path(path)
    target = _target(path, root, what)
    try:
        found = os.stat(target)
    except OSError as e:
        raise UntrustedFileError(f"{shown_path(path)}: cannot read this {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(found.st_mode):
        raise NotRegularFile(
            f"{shown_path(path)} is {file_kind(found.st_mode)}, not a regular file: a {what} is not read from it"
        )
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as e:
        raise UntrustedFileError(f"{shown_path(path)}: cannot open this {what}: {e.strerror or e}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise NotRegularFile(f"{shown_path(path)} is {file_kind(opened.st_mode)}, not a regular file")
        size, read = opened.st_size, []
        for offset, length in parts:
            start = max(0, size + offset if offset < 0 else offset)
            try:
                read.append(os.pread(fd, max(0, min(length, size - start)), start))
            except OSError as e:
                raise UntrustedFileError(f"{shown_path(path)}: cannot read this {what}: {e.strerror or e}") from None
        return size, read
    finally:
        os.close(fd)
