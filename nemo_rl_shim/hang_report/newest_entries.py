"""Reading a dump's newest entries without unpickling the others: its head and its tail, for the quick first line.

Unpickling every dump of 8,192 ranks (2,000 entries each, 7.9 GB) takes about a minute of one core; the first line
needs, per rank, the groups it is in and its newest entries. This reader takes both from the two ends of the file:

* **Only what torch writes.** Protocol 2 (and 3): every memo slot numbered by its ``BINPUT`` (torch's pickler, and
  Python's below protocol 4). The top level is torch's dict, ``entries`` a list of dicts. Anything else (protocol 4's
  frames and implicit memo, an opcode outside plain data) gives None: the dump is then read in full, as before.
* **The head.** The first :data:`HEAD_BYTES` (more where the groups' ranks take more), to the end of the entries'
  first :data:`HEAD_ENTRIES` entries: found by the byte patterns of the key ``entries`` and of an entry's start
  (checked by unpickling them), else walked opcode by opcode, building nothing. Those bytes, closed by
  ``APPENDS SETITEMS STOP``, are unpickled by the plain-data unpickler (:mod:`.safe_pickle`): the top level before
  ``entries`` (``version``, ``pg_config``, ``pg_status``), the first entries, and the memo they filled (every
  string the later entries refer to: the keys, the group names, the op names, the frames).
* **The tail.** The last bytes, where an entry starts as the second one did (``EMPTY_DICT``, its memo slot,
  ``MARK``, its first key as a memo reference), are unpickled from the ``count``-th last such start to the end of
  the file, after a prefix that opens the top-level dict and the entries list, with the head's memo: the newest
  ``count`` entries and the keys after ``entries`` (the shim's ``rank`` and ``nemo_rl_shim``). A start that is not
  one (the bytes inside a string) fails to unpickle, or gives something that is not entries: the next earlier start
  is tried. A reference to a slot the head did not fill (a string first written in the middle: a group first used
  late) reads the head on to the entry that fills it; where none of it works, None (read in full).

Untrusted like every dump: the file opened as a regular file in the folder (:func:`.untrusted_file.read_parts`),
read at its two ends only, unpickled by the plain-data unpickler (no code runs), and the result reduced by
:func:`.dump_format.reduce_dump`, which checks every field it reads. A crafted file can make the window say other than
the whole file would (a fake entry start inside a string that then unpickles): the full reading that follows the
quick first line reads every object and stands.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.dump_format import reduce_dump, top_level_problem
from nemo_rl_shim.hang_report.records import RankDump, Recorder
from nemo_rl_shim.hang_report.safe_pickle import PlainUnpickler
from nemo_rl_shim.untrusted.files import UntrustedFileError, read_parts

__all__ = ["HEAD_BYTES", "HEAD_ENTRIES", "HEAD_TRIES", "TAIL_BYTES_PER_ENTRY", "Window", "read_window"]

#: Bytes read from the head at first (grown, up to a few times, where the entries start further in).
HEAD_BYTES = 1 << 16
#: Entries unpickled from the head: their memo slots hold what the later entries refer to.
HEAD_ENTRIES = 2
#: Tail bytes read per entry wanted (torch's entries with three frames take about 600 bytes).
TAIL_BYTES_PER_ENTRY = 1024
#: Earlier entry starts tried when one does not unpickle to entries.
STARTS_TRIED = 4
#: Longer heads read, where the tail refers to memo slots filled later than the first entries (each to the entry
#: that fills the slot named).
HEAD_TRIES = 4

# opcodes of protocols 2 and 3 that plain data uses: fixed argument sizes, and those with a length before the data
_FIXED = {
    ord("("): 0, ord("."): 0, ord("0"): 0, ord("1"): 0, ord("2"): 0, ord("N"): 0, ord("}"): 0, ord("]"): 0,
    ord(")"): 0, ord("t"): 0, 0x85: 0, 0x86: 0, 0x87: 0, ord("a"): 0, ord("e"): 0, ord("s"): 0, ord("u"): 0,
    0x88: 0, 0x89: 0, ord("J"): 4, ord("K"): 1, ord("M"): 2, ord("G"): 8, ord("h"): 1, ord("j"): 4,
    ord("q"): 1, ord("r"): 4, 0x80: 1,
}  # fmt: skip
_LEN4 = {ord("X"), ord("T"), ord("B"), 0x8B}
_LEN1 = {ord("U"), ord("C"), 0x8A}
_MARK, _APPENDS, _SETITEMS, _TUPLE, _POP_MARK = ord("("), ord("e"), ord("u"), ord("t"), ord("1")
_EMPTY_DICT, _EMPTY_LIST = ord("}"), ord("]")
_BINUNICODE, _BINPUT, _LONG_BINPUT, _BINGET, _LONG_BINGET = ord("X"), ord("q"), ord("r"), ord("h"), ord("j")
_ENTRIES = b"entries"
#: What opens the top-level dict and the entries list before a tail's bytes.
_OPEN = b"\x80\x02}(X\x07\x00\x00\x00entries]("


@dataclass(frozen=True)
class _Head:
    """Where the head's walk ended: the end of its last entry, the start of the first, and how an entry starts."""

    cut: int
    first_entry: int
    key_op: bytes  # the second entry's first key: a memo reference (BINGET or LONG_BINGET with its slot)
    entries: int  # entries walked


@dataclass(frozen=True)
class Window:
    """A dump's newest entries, reduced (:class:`~.records.RankDump`, its recorders marked as reaching back only to
    the window), and how many entries the window holds; ``whole``: it holds every entry (a small dump)."""

    dump: RankDump
    entries: int
    whole: bool


def _op_end(data: bytes, pos: int) -> int:
    """Where the opcode at ``pos`` ends (its argument or data included); -1 where it is not one of plain protocol
    2/3 data, or the bytes end inside it."""
    op, size = data[pos], len(data)
    if op in _LEN4:
        end = pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "little") if pos + 5 <= size else size + 1
    elif op in _LEN1:
        end = pos + 2 + data[pos + 1] if pos + 2 <= size else size + 1
    elif op in _FIXED:
        end = pos + 1 + _FIXED[op]
    else:
        return -1
    return end if end <= size else -1


def _walk(data: bytes, wanted: int, slot: int = -1) -> _Head | None:
    """The head walked opcode by opcode (nothing built) to the end of an entry: the ``wanted``-th, or the first after
    memo slot ``slot`` was filled. None where it is not plain protocol 2/3 data, or ends before (the caller reads
    more)."""
    if len(data) < 2 or data[0] != 0x80 or data[1] not in (2, 3):
        return None
    pos, depth = 2, 0
    strings: dict[int, bytes] = {}  # memo slot -> a string's bytes (to find the key "entries" however written)
    text: bytes | None = None  # the string the last opcode pushed
    in_list, entry_start, first_entry, entries, key_op, filled = 0, -1, -1, 0, b"", -1
    first_key = False  # the opcode after an entry's MARK is its first key
    while pos < len(data):
        op, start, pos = data[pos], pos, _op_end(data, pos)
        if pos < 0:
            return None
        if first_key:
            first_key = False
            if entries == 1 and not key_op:
                if op not in (_BINGET, _LONG_BINGET):
                    return None
                key_op = data[start:pos]
        if op in (_BINPUT, _LONG_BINPUT):
            index = int.from_bytes(data[start + 1 : pos], "little")
            filled = max(filled, index)
            if text is not None:
                strings[index] = text
            continue  # a memo slot changes nothing of what came before it
        if op == _MARK:
            depth += 1
            first_key = in_list > 0 and depth == in_list + 1 and entry_start >= 0
            in_list = depth if in_list == -1 else in_list
        elif op in (_APPENDS, _TUPLE, _POP_MARK):
            depth -= 1
            if in_list > 0 and depth < in_list:
                return None  # the entries ended inside the head: a small dump, read in full
        elif op == _SETITEMS:
            depth -= 1
            if in_list > 0 and depth == in_list and entry_start >= 0:
                entries, entry_start = entries + 1, -1
                if entries >= wanted and key_op and filled >= slot:
                    return _Head(pos, first_entry, key_op, entries)
        elif op == _EMPTY_LIST and depth == 1 and text == _ENTRIES and not in_list:
            in_list = -1  # the entries list: its MARK comes next (after a memo slot, maybe)
        elif op == _EMPTY_DICT and in_list > 0 and depth == in_list:
            entry_start = start
            first_entry = start if first_entry < 0 else first_entry
        if op == _BINUNICODE:
            text = data[start + 5 : pos]
        elif op in (_BINGET, _LONG_BINGET):
            text = strings.get(int.from_bytes(data[start + 1 : pos], "little"))
        else:
            text = None
    return None


_PUT = rb"(?:q[\x00-\xff]|r[\x00-\xff]{4})?"
_ENTRIES_OPEN = re.compile(rb"X\x07\x00\x00\x00entries" + _PUT + rb"\]" + _PUT + rb"\(")
_ENTRY_OPEN = re.compile(rb"\}" + _PUT + rb"\(")


def _found(data: bytes, wanted: int) -> _Head | None:
    """Where the head ends, found without walking it: the key ``entries`` and its list opening, the first entry's
    first key (a string and its memo slot, or a reference to one), then the ``wanted``-th next entry's start, where
    an entry starts as the second does. A guess the unpickling checks (:func:`_head`): a match inside a string
    fails it, and the walk (:func:`_walk`) is tried instead."""
    opened = _ENTRIES_OPEN.search(data)
    entry = _ENTRY_OPEN.match(data, opened.end()) if opened else None
    if entry is None:
        return None
    key = entry.end()
    if key >= len(data) or data[key] not in (_BINUNICODE, _BINGET, _LONG_BINGET):
        return None
    end = _op_end(data, key)
    if end < 0:
        return None
    if data[key] != _BINUNICODE:
        key_op = data[key:end]
    elif end < len(data) and data[end] in (_BINPUT, _LONG_BINPUT) and _op_end(data, end) > 0:
        slot = int.from_bytes(data[end + 1 : _op_end(data, end)], "little")
        key_op = bytes([_BINGET, slot]) if slot < 256 else bytes([_LONG_BINGET]) + slot.to_bytes(4, "little")
    else:
        return None
    starts = re.compile(_ENTRY_OPEN.pattern + re.escape(key_op)).finditer(data, end)
    cut = next((m.start() for index, m in enumerate(starts, 1) if index == wanted), -1)
    return _Head(cut, opened.end(), key_op, wanted) if cut > 0 else None


def _unpickle(data: bytes, memo_of: PlainUnpickler | None = None) -> tuple[Any, PlainUnpickler]:
    """Plain data only (no code runs), starting from a copy of ``memo_of``'s memo; the reader, which holds the memo
    it ends with. (The memo is copied from another unpickler's memo: assigning a dict to ``Unpickler.memo`` leaves it
    empty in CPython 3.11 to 3.13.)"""
    reader = PlainUnpickler(io.BytesIO(data))
    if memo_of is not None:
        reader.memo = memo_of.memo
    return reader.load(), reader


def _head(
    path: Path, root: Path | None, wanted: int, slot: int = -1
) -> tuple[int, _Head, dict[str, Any], PlainUnpickler] | None:
    """The file's size, where its head's walk ended (``wanted`` entries, and memo slot ``slot`` filled), the top level
    it unpickled (with its first entries), and the memo; None where it cannot be read so."""
    length = HEAD_BYTES
    for _ in range(8):
        size, (data,) = read_parts(path, [(0, length)], what="dump", root=root)
        guess = _found(data, wanted) if slot < 0 else None
        for walked in (guess, None):
            walked = walked or _walk(data, wanted, slot)
            if walked is None:
                break
            try:
                top, memo = _unpickle(data[: walked.cut] + b"eu.")
            except Exception:  # not a pickle after all, or a guess inside a string
                top = None
            if isinstance(top, dict) and top_level_problem(top) is None and len(top["entries"]) == walked.entries:
                return size, walked, top, memo
            if walked is not guess:
                return None  # walked, and still not: read in full, which says what is wrong
        if length >= size:
            return None
        length *= 4
    return None


def _starts(tail: bytes, key_op: bytes) -> list[int]:
    pattern = re.compile(rb"\}(?:q[\x00-\xff]|r[\x00-\xff]{4})?\(" + re.escape(key_op))
    return [m.start() for m in pattern.finditer(tail)]


def _entries_like(found: Any, keys: frozenset[str]) -> list[dict[str, Any]] | None:
    entries = found.get("entries") if isinstance(found, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    if not all(type(e) is dict and keys <= e.keys() for e in entries):
        return None
    return entries


_MISSING_SLOT = re.compile(r"Memo value not found at index (\d+)")


def _tail(
    path: Path, root: Path | None, size: int, head: _Head, memo: PlainUnpickler, count: int, keys: frozenset[str]
) -> tuple[dict[str, Any], bool] | int | None:
    """The newest ``count`` entries (fewer where the file holds fewer) and the keys after them; whether the window
    reaches the first entry. A memo slot the head did not fill (a string first written in the middle): its number,
    for a longer head. None where no start unpickles to entries (read in full)."""
    length = min(size, max(count * TAIL_BYTES_PER_ENTRY, 4096))
    _, (tail,) = read_parts(path, [(-length, length)], what="dump", root=root)
    offset = size - len(tail)
    starts = [s for s in _starts(tail, head.key_op) if offset + s >= head.cut]
    if not starts:
        return None
    picked, missing = max(0, len(starts) - count), None
    for index in range(picked, max(-1, picked - STARTS_TRIED), -1):
        try:
            found, _ = _unpickle(_OPEN + tail[starts[index] :], memo)
        except Exception as e:  # a start inside a string, or a slot the head did not fill
            slot = _MISSING_SLOT.search(str(e))
            missing = int(slot[1]) if slot and missing is None else missing
            continue
        if _entries_like(found, keys) is not None:
            return found, offset + starts[index] == head.cut  # right after the head's entries: every entry
    return missing


def read_window(path: Path, rank: int, count: int, sidecar: dict[str, Any] | None, root: Path | None) -> Window | None:
    """The newest ``count`` entries of the dump at ``path``, reduced; None where it cannot be read so (then it is read
    in full). :class:`DumpError` where what was read is malformed, as the full reading says it."""
    try:
        slot = -1
        for _ in range(HEAD_TRIES):
            head = _head(path, root, HEAD_ENTRIES, slot)
            if head is None:
                return None
            size, walked, top, memo = head
            keys = frozenset(top["entries"][-1]) if top["entries"] else frozenset()
            found = _tail(path, root, size, walked, memo, count, keys)
            if not isinstance(found, int) or found <= slot:
                break
            slot = found  # read the head on, to where that slot is filled
        if found is None or isinstance(found, int):
            return None
    except UntrustedFileError:
        return None  # the full reading says why, naming the file
    tail, whole = found
    raw = {key: value for key, value in top.items() if key != "entries"}
    raw.update(tail)
    if whole:
        raw["entries"] = [*top["entries"], *tail["entries"]]
    dump = reduce_dump(raw, size, path, rank, sidecar)
    if not whole:
        dump = _as_window(dump, tail["entries"])
    return Window(dump, len(raw["entries"]), whole)


def _as_window(dump: RankDump, entries: list[dict[str, Any]]) -> RankDump:
    """The dump's recorders reach back only to the window's oldest entry: a rank without a group's entry there has
    not shown that it did not enter (it is out of reach, not behind)."""
    created = [e.get("time_created_ns") for e in entries if type(e.get("time_created_ns")) is int]
    oldest = min(created) if created else None
    recorders = {
        lib: Recorder(wrapped=True, oldest_ns=oldest, tracks_completion=found.tracks_completion)
        for lib, found in dump.recorders.items()
    }
    return replace(dump, recorders=recorders, window_oldest_ns=oldest if oldest is not None else 0)
