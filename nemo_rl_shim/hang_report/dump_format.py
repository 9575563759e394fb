"""torch's Flight Recorder dump format, in one place: reading a dump without running it, checking it, and
reducing it to a :class:`~nemo_rl_shim.hang_report.records.RankDump`.

A dump is the pickle torch writes (``version``, ``pg_config``, ``pg_status``, ``entries``, key for key as
``FlightRecorderDetail.hpp`` writes them): NCCL's watchdog on a timeout, torch 2.15's ``FlightRecorderHook`` when
a hooked backend (``nccl2``) aborts, a user's ``_dump_fr_trace_file``, or
:mod:`nemo_rl_shim.flight_recorder`, which adds ``rank`` and ``nemo_rl_shim`` (world size, group map, reason, dump
time, and, where it joined several recorders, each one's facts).

* **Untrusted.** A regular file inside the folder, at most :func:`dump_cap` bytes
  (:func:`~nemo_rl_shim.untrusted.files.read_untrusted`), unpickled by
  :func:`~nemo_rl_shim.hang_report.safe_pickle.load_plain`: plain data only, no code runs. Every field read is
  checked for its type and range as it is read (numbers in int64's range, ranks below
  :data:`~.bounds.MAX_WORLD`); anything else is a :class:`DumpError` naming the file, the entry and the key. Every
  walk whose length the file controls is charged to the dump's :class:`~.bounds.Budget`, so that shared references
  cannot make the reading more than linear in the bytes. Text is made only from checked values, and every text
  kept passes :func:`~.printable.clean`. This module reads only what the analysis needs; :mod:`.field_checks` checks
  every field of every entry before a healthy verdict.
* **Versions.** Keys are read by presence, not by ``version``: torch 2.9 to 2.15 write ``"2.10"`` or lower; older
  dumps lack ``pg_status``, ``is_p2p``, ``retired`` and ``p2p_seq_id``, and call the number ``seq_id``.
* **Recorders.** Each entry's ``profiling_name`` starts with its recorder's name (``nccl:``, ``gloo:``, ``nccl2:``),
  and each recorder numbers a group's ops by itself: a group is keyed by its name and that name.
  ``FlightRecorderHook`` (torch 2.15's ``nccl2``, and any backend without its own recorder) writes each op of a
  ``batch_isend_irecv`` as its own entry with its own p2p number, and no ``coalesced`` closer. Only a recorder
  other than Gloo's says that an op finished (:attr:`~.records.Recorder.tracks_completion`).
* **Memory.** A dump is reduced as it is read: per group the last collective, a signature (op and sizes) per
  sequence number, and its point-to-point ops (counted per peer, the newest kept, the unfinished ones listed).
* **Where each op was called.** torch keeps, per entry, the Python stack where the op was called (``frames``,
  innermost first, each ``{"name", "filename", "line"}``; one dict per distinct frame, which every entry shares).
  Of an entry the reduction keeps (the last collective, the p2p ops, the newest), only the innermost user frame
  is kept (:func:`~nemo_rl_shim.hang_report.frames.user_frame`: torch, the shim and the standard library
  skipped), and per group the call sites of its last :data:`CALLS_KEPT` collectives among the dump's newest
  entries (``RankDump.calls``): what tells a skipped collective from a size mismatch. No other entry's frames are
  read.
"""

from __future__ import annotations

import array
import gc
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nemo_rl_shim.config.numbers import ascii_int
from nemo_rl_shim.flight_recorder.names import ENV_PAIRS, PG_STATUS_KEY
from nemo_rl_shim.hang_report.bounds import MAX_INT64, MAX_WORLD, Budget, is_count, is_int, is_text
from nemo_rl_shim.hang_report.coalesced import closes_p2p, completed_batch, is_closer, judge_p2p_batches, open_member
from nemo_rl_shim.hang_report.file_identity import fingerprint
from nemo_rl_shim.hang_report.frames import Frame, frame, user_frame
from nemo_rl_shim.hang_report.group_members import (
    default_ranks,
    group_name,
    groups_from_map,
    groups_from_pg_config,
    shim_problem,
)
from nemo_rl_shim.hang_report.recorder_evidence import tracks_completion
from nemo_rl_shim.hang_report.recording_rules import check_p2p_sides, collective_gaps, one_pickle, p2p_sides
from nemo_rl_shim.hang_report.records import DumpError, Entry, GroupFacts, GroupKey, P2PKey, RankDump, Recorder
from nemo_rl_shim.hang_report.run_evidence import gather
from nemo_rl_shim.hang_report.safe_pickle import RefusedPickle, load_plain_bytes
from nemo_rl_shim.hang_report.shim_p2p import read_log
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import clean, shown, shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks
from nemo_rl_shim.untrusted.files import UntrustedFileError, read_untrusted

__all__ = [
    "CALLS_KEPT",
    "COALESCED_OPS_KEPT",
    "DEFAULT_BUFFER",
    "ENTRY_BYTES",
    "RECORDERS",
    "REST_BYTES",
    "dump_cap",
    "load_dump",
    "op_name",
    "pg_status_of",
    "read_dump",
    "reduce_dump",
    "sizes_text",
    "summarize",
    "top_level_problem",
]

_STATES = ("scheduled", "started", "completed")
#: An op's profiling name is short ("nccl:all_reduce", "nccl:send 1->0"): longer is not torch's.
MAX_NAME = 1024
_P2P_OPS = ("send", "recv")
#: Per group, the call sites kept of its last collectives (found among the dump's newest entries, see _recent_calls).
CALLS_KEPT = 8
#: Ops of one coalesced collective joined into its signature by name and sizes; past this many, only their count.
COALESCED_OPS_KEPT = 32
#: torch's default entries per recorder (``TORCH_FR_BUFFER_SIZE`` unset).
DEFAULT_BUFFER = 2000
#: What one entry takes in a pickle at most: its fields, a coalesced op's shapes, its frames (shared dicts).
ENTRY_BYTES = 16 << 10
#: Recorders one dump may join: Gloo's, stock NCCL's, and hooked backends' (torch 2.15's nccl2).
RECORDERS = 4
#: Beside the entries: pg_config and pg_status for every group (a 65,536-rank default group's ranks, as text).
REST_BYTES = 64 << 20
_PG_STATUS_FIELDS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool, not float (NaN), not str


def dump_cap(environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """The largest dump read, in bytes, and how it is derived: :data:`RECORDERS` recorders of the buffer size
    (``TORCH_FR_BUFFER_SIZE`` where this process has it, at least torch's default :data:`DEFAULT_BUFFER`) of
    :data:`ENTRY_BYTES` each, and :data:`REST_BYTES` for the groups."""
    env = os.environ if environ is None else environ
    buffer = DEFAULT_BUFFER
    for name in ENV_PAIRS["buffer_size"]:
        value = env.get(name, "")
        given = ascii_int(value)
        if given is not None and given < 10**9:
            buffer = max(buffer, given)
            break
    cap = RECORDERS * buffer * ENTRY_BYTES + REST_BYTES
    how = f"{RECORDERS} recorders x {buffer:,} entries (TORCH_FR_BUFFER_SIZE, or torch's default) x 16 KiB + 64 MiB"
    return cap, how


# --- reading -------------------------------------------------------------------------------------------------------


def load_dump(path: Path, root: Path | None = None) -> tuple[dict[str, Any], int]:
    """The dump as torch wrote it (plain data only, one pickle and nothing after it, its top level checked) and its
    size in bytes; :class:`DumpError` naming the file. ``root``: the folder it was found in, which a symlink must not
    leave."""
    raw, size, _ = _load(path, root)
    return raw, size


def _load(path: Path, root: Path | None) -> tuple[dict[str, Any], int, tuple[int, int]]:
    """:func:`load_dump`, and the file's fingerprint (:func:`~.file_identity.fingerprint`)."""
    cap, how = dump_cap()
    try:
        data = read_untrusted(path, cap=cap, what="dump", root=root)
    except UntrustedFileError as e:
        raise DumpError(f"{e}{f' (the cap: {how})' if 'more than a dump' in str(e) else ''}") from None
    was_enabled = gc.isenabled()
    gc.disable()  # as torch's loader does: unpickling many small dicts otherwise runs the collector again and again
    # read from the bytes in place (load_plain_bytes: a reader with peek, so the C unpickler reads from a buffer; on
    # a bare BytesIO it calls read() once per opcode: a protocol 2 dump, torch's, unpickled 2.6x slower, #42)
    try:
        raw, end = load_plain_bytes(data)
    except RefusedPickle as e:
        raise DumpError(f"{shown_path(path)} is refused: {e}") from None
    except Exception as e:  # truncated, not a pickle, too deep, too big: one line, exit 2
        raise DumpError(f"{shown_path(path)} is not a readable flight-recorder dump: {first_line(e)}") from None
    finally:
        if was_enabled:
            gc.enable()
    one_pickle(len(data), end, path)
    problem = _top_level_problem(raw)
    if problem:
        raise DumpError(f"{shown_path(path)} is not a flight-recorder dump: {problem}")
    return raw, len(data), fingerprint(data)


def read_dump(path: Path, root: Path | None = None) -> dict[str, Any]:
    """The dump as torch wrote it, plain data only and its top level checked; :class:`DumpError` naming the file."""
    return load_dump(path, root)[0]


def top_level_problem(data: Any) -> str | None:
    """What is wrong with a dump's top level (its keys' types), or None."""
    return _top_level_problem(data)


def _top_level_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"torch writes a dict, this is {shown(data)}"
    entries = data.get("entries")
    if not isinstance(entries, list):
        keys = ", ".join(sorted(shown(k, typed=False) for k in list(data)[:8]))
        return f"no 'entries' list (keys: {keys or 'none'})" if entries is None else f"'entries' is {shown(entries)}"
    for key, kind in (("version", str), ("pg_config", dict), ("pg_status", dict), ("nemo_rl_shim", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"{key!r} is {shown(data[key])}, where torch writes a {kind.__name__}"
    if data.get("version") is not None and not is_text(data["version"]):
        return f"'version' is {shown(data['version'])}, text UTF-8 cannot write"
    if "rank" in data and not (_is_int(data["rank"]) and 0 <= data["rank"] < MAX_WORLD):
        return f"'rank' is {shown(data['rank'])}, not a rank"
    return shim_problem(data.get("nemo_rl_shim") or {})


# --- entries -------------------------------------------------------------------------------------------------------


def op_name(profiling_name: str) -> tuple[str, str, int | None]:
    """``"nccl:send 1->0"`` -> ``("nccl", "send", 0)``; ``"gloo:all_reduce"`` -> ``("gloo", "all_reduce", None)``;
    ``"nccl2:recv 0<-?"`` (a recv from any source) -> ``("nccl2", "recv", None)``."""
    lib, _, rest = profiling_name.partition(":")
    if not rest:
        lib, rest = "", profiling_name
    op, _, where = rest.partition(" ")
    return lib, op, p2p_sides(where)[1]


_BRACKETS = str.maketrans("()", "[]")


def _sizes_ok(sizes: Any, budget: Budget) -> bool:
    """torch's ``input_sizes``: a list of shapes, each a list of ints (checked before any text is made of them, each
    dimension charged to the budget)."""
    if not isinstance(sizes, list | tuple):
        return False
    budget.spend(len(sizes), "'input_sizes'")
    for shape in sizes:
        if not isinstance(shape, list | tuple):
            return False
        budget.spend(len(shape), "'input_sizes'")
        if not all(_is_int(d) and -1 <= d <= MAX_INT64 for d in shape):
            return False
    return True


def sizes_text(sizes: Any) -> str:
    """Checked input sizes as one comparable text, lists or tuples alike: ``((3, 4),)`` and ``[[3, 4]]`` ->
    ``[[3, 4]]``."""
    return str(sizes).translate(_BRACKETS).replace(",]", "]")


@dataclass
class _Reading:
    """One dump being read: its file, its budget, its sequence key, and the frames already made (by the identity of
    torch's frame dict, shared by every entry that holds it; valid while the dump is held)."""

    path: Path
    budget: Budget
    seq_key: str
    seen: dict[int, Frame] = field(default_factory=dict)

    def bad_entry(self, index: int, raw: Any) -> DumpError:
        return DumpError(f"{shown_path(self.path)}: entry {index} {_entry_problem(raw, self)}")


def _is_p2p(raw: Mapping[str, Any], seq_key: str) -> bool:
    """The one p2p rule: ``is_p2p`` where torch writes it (2.4 and later); before, a send or recv, or an op without
    a collective number but with a p2p number."""
    flag = raw.get("is_p2p")
    if flag is not None:
        if type(flag) is not bool:
            raise TypeError("is_p2p")
        return flag
    _, op, _ = op_name(raw["profiling_name"])
    return op in _P2P_OPS or (not raw.get(seq_key) and bool(raw.get("p2p_seq_id")))


def _optional_count(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None or is_count(value):
        return value
    raise ValueError(f"{key!r} is {shown(value)}, not an int from 0 to 2**63 - 1")


def _frame_of(item: Any) -> Frame:
    if type(item) is not dict:
        raise ValueError(f"'frames' holds {shown(item)}, not a frame")
    name, file, line = item.get("name"), item.get("filename"), item.get("line")
    if not is_text(name) or not is_text(file) or not (line is None or (is_count(line) and line < 2**31)):
        raise ValueError(f"'frames' holds {shown(item)}, not a frame (name, filename, line)")
    return frame(file, line, name)


def _frames(items: list[Any] | tuple[Any, ...], reading: _Reading) -> Iterator[Frame]:
    """The entry's frames, innermost first, each read once per dump."""
    reading.budget.spend(len(items), "'frames'")
    seen = reading.seen
    for item in items:
        made = seen.get(id(item))
        if made is None:
            made = seen[id(item)] = _frame_of(item)
        yield made


def _call_site(raw: Mapping[str, Any], reading: _Reading) -> Frame | None:
    """Where the entry's op was called: the innermost user frame of its ``frames`` (None where it has none, or
    only torch's, the shim's and the standard library's); ValueError naming ``'frames'`` where they are not frames."""
    frames = raw.get("frames")
    if frames is None:
        return None
    if type(frames) is not list and type(frames) is not tuple:
        raise ValueError(f"'frames' is {shown(frames)}, not a list of frames")
    return user_frame(_frames(frames, reading))


def _process_group(value: Any) -> tuple[str, str] | None:
    """``(name, description)`` as torch writes it, checked; None where it is not."""
    if (type(value) is not tuple and type(value) is not list) or not 1 <= len(value) <= 2:
        return None
    name, desc = value[0], value[1] if len(value) > 1 else ""
    return (name, desc) if is_text(name) and is_text(desc) else None


def _entry_problem(raw: Any, reading: _Reading) -> str:
    """What is wrong with an entry (the slow, thorough look, once the fast one stumbled; its walks charged to the
    dump's budget too)."""
    seq_key = reading.seq_key
    if not isinstance(raw, dict):
        return f"is {shown(raw)}, not a dict"
    if _process_group(raw.get("process_group")) is None:
        return f"'process_group' is {shown(raw.get('process_group'))}, not (name, description) as text"
    if not is_text(raw.get("profiling_name")):
        return f"'profiling_name' is {shown(raw.get('profiling_name'))}, not text (that UTF-8 can write)"
    if len(raw["profiling_name"]) > MAX_NAME:
        return f"'profiling_name' is {len(raw['profiling_name']):,} characters long, longer than any op's name"
    for key in (seq_key, "p2p_seq_id", "record_id", "time_created_ns", "time_discovered_completed_ns", "timeout_ms"):
        if key in raw and raw[key] is not None and not is_count(raw[key]):
            return f"{key!r} is {shown(raw[key])}, not an int from 0 to 2**63 - 1"
    if seq_key not in raw and "is_p2p" not in raw:
        return f"no {seq_key!r}"
    if raw.get("is_p2p") is not None and not isinstance(raw["is_p2p"], bool):
        return f"'is_p2p' is {shown(raw['is_p2p'])}, not a bool"
    if raw.get("state", "scheduled") not in _STATES:
        return f"'state' is {shown(raw.get('state'))}, not one of {', '.join(_STATES)}"
    sizes = raw.get("input_sizes", [])
    if not _sizes_ok(sizes, reading.budget):
        return f"'input_sizes' is {shown(sizes)}, not a list of shapes"
    pg_id = raw.get("pg_id", "")
    if not (is_count(pg_id) or is_text(pg_id)):
        return f"'pg_id' is {shown(pg_id)}, not an id"
    try:
        _call_site(raw, reading)
    except ValueError as e:
        return str(e)
    return "cannot be read"


def _entry(raw: Mapping[str, Any], reading: _Reading) -> Entry:
    """An entry checked in full (ValueError naming the key) and made typed, with where it was called."""
    name = raw["profiling_name"]
    group = _process_group(raw["process_group"])
    if not is_text(name) or len(name) > MAX_NAME or group is None:
        raise ValueError("'profiling_name' or 'process_group'")
    lib, op, peer = op_name(name)
    me = p2p_sides(name.partition(" ")[2])[0] if op in _P2P_OPS else None
    p2p_seq, coll_seq = _optional_count(raw, "p2p_seq_id") or 0, _optional_count(raw, reading.seq_key) or 0
    is_p2p = _is_p2p(raw, reading.seq_key)
    sizes = raw.get("input_sizes", ())
    state = raw.get("state", "scheduled")
    if state not in _STATES or not _sizes_ok(sizes, reading.budget):
        raise ValueError("a field is out of its range")
    pg_id = raw.get("pg_id", "")
    if not (is_count(pg_id) or is_text(pg_id)):
        raise ValueError(f"'pg_id' is {shown(pg_id)}, not an id")
    return Entry(
        group=group_name(group[0]),
        seq=p2p_seq if is_p2p else coll_seq,
        op=clean(op, limit=80),
        sizes=sizes_text(sizes) if len(sizes) <= COALESCED_OPS_KEPT else f"{len(sizes)} shapes",
        state=state,
        created_ns=_optional_count(raw, "time_created_ns") or 0,
        completed_ns=_optional_count(raw, "time_discovered_completed_ns"),
        timeout_ms=_optional_count(raw, "timeout_ms"),
        pg_id=clean(str(pg_id), limit=40),
        is_p2p=is_p2p,
        peer=peer,
        me=me,
        lib=clean(lib, limit=40),
        where=_call_site(raw, reading),
        p2p_seq=p2p_seq,
    )


def _checked_entry(reading: _Reading, index: int, raw: Any) -> Entry:
    try:
        return _entry(raw, reading)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        raise reading.bad_entry(index, raw) from None


# --- one pass over the entries -------------------------------------------------------------------------------------


@dataclass
class _Scan:
    """What one pass over a dump's entries keeps: per group the numbers and signatures, the last collective,
    every p2p entry, and the descriptions."""

    seqs: dict[GroupKey, array.array] = field(default_factory=dict)
    sig_ids: dict[GroupKey, array.array] = field(default_factory=dict)
    table: dict[tuple[str, str], int] = field(default_factory=dict)
    by_id: list[tuple[str, str]] = field(default_factory=list)  # the table's keys by id
    last: dict[GroupKey, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    first: dict[GroupKey, int] = field(default_factory=dict)  # the index of the group's first collective
    p2p: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    descs: dict[str, str] = field(default_factory=dict)
    tracks: bool = False
    joined: dict[GroupKey, int] = field(default_factory=dict)  # ops its last number joined (a coalesced batch's)


def _scan(entries: list[Any], reading: _Reading) -> _Scan:
    """One lean pass, every field it reads checked as it reads it: at 2,000 entries a rank and thousands of ranks,
    every step per entry counts. Per group, the last entry's name, sizes and signature are held (a signature's
    text is made only when an entry's name or sizes differ from them), and per group and recorder a slot (its
    numbers, its signature ids, its last entry's index, its last number, and how many ops its last number joined)
    that the pass appends to: no tuple is made and no dict written per entry. An entry whose name is its group's
    last collective's (torch's pickler writes a repeated text once: the same object) is not looked at again for a
    closer's name; the numbers and ids are gathered in lists (appended in C) and made arrays at the end."""
    scan = _Scan()
    at: dict[str, list[Any]] = {}  # group -> [name, sizes, signature id, slot, cost, name ends "coalesced"]
    slots: dict[GroupKey, list[Any]] = {}
    p2p_entries, seq_key = scan.p2p, reading.seq_key
    tracks = False
    for index, raw in enumerate(entries):
        try:
            pg = raw["process_group"]
            name = raw["profiling_name"]
            kind = type(pg)
            if kind is not tuple and kind is not list:
                raise TypeError
            group = pg[0]
            if type(group) is not str or type(name) is not str:
                raise TypeError
            if not tracks and raw.get("state") != "scheduled":
                tracks = True
            flag = raw.get("is_p2p")  # _is_p2p's first step, inline: this loop runs for every entry
            if flag is not False:
                if flag is True or (flag is None and _is_p2p(raw, seq_key)):
                    p2p_entries.append((index, raw))
                    continue
                if flag is not None:
                    raise TypeError
            last = at.get(group)
            same = last is not None and last[0] is name
            if (
                (not same or last[5])
                and name[-9:] == "coalesced"
                and is_closer(name, raw.get("input_sizes"))
                and closes_p2p(entries, index)
            ):
                p2p_entries.append((index, raw))  # L-COAL-CLOSE: a p2p batch's closer is no collective
                continue
            seq = raw[seq_key]
            if type(seq) is not int or seq > MAX_INT64 or seq < 0:
                raise TypeError
        except (KeyError, TypeError, IndexError, AttributeError):
            raise reading.bad_entry(index, raw) from None
        if not seq:
            continue
        sizes = raw.get("input_sizes")
        if last is not None and last[4] and last[1] is not sizes:  # comparing long sizes costs their length
            reading.budget.spend(last[4], "'input_sizes'")
        if (not same and (last is None or last[0] != name)) or last[1] != sizes:
            last = at[group] = _signature(scan, slots, index, raw, reading)
        slot = last[3]
        if slot[3] == seq:  # one op of a coalesced collective: they share its number
            _coalesce(scan, slot, index, name, sizes)
            continue
        slot[0].append(seq)
        slot[1].append(last[2])
        slot[2], slot[3], slot[4] = index, seq, 1
    scan.tracks = tracks
    for key, (seqs, ids, last_index, _, joined, first_index) in slots.items():
        scan.seqs[key], scan.sig_ids[key] = array.array("q", seqs), array.array("q", ids)
        scan.last[key], scan.first[key], scan.joined[key] = (last_index, entries[last_index]), first_index, joined
    for index, raw in p2p_entries:
        pg = _process_group(raw["process_group"])
        if pg is None:
            raise reading.bad_entry(index, raw)
        scan.descs.setdefault(group_name(pg[0]), clean(pg[1]))
    return scan


def _signature(
    scan: _Scan, slots: dict[GroupKey, list[Any]], index: int, raw: dict[str, Any], reading: _Reading
) -> list[Any]:
    """A collective whose name or sizes differ from its group's last one: its sizes and description checked, its
    signature's id, and its group and recorder's slot (made, with the group's description, at the first)."""
    name, sizes, pg = raw["profiling_name"], raw.get("input_sizes"), _process_group(raw["process_group"])
    if pg is None or len(name) > MAX_NAME or not is_text(name) or not _sizes_ok(sizes, reading.budget):
        raise reading.bad_entry(index, raw)
    key = (group_name(pg[0]), clean(op_name(name)[0], limit=40))
    slot = slots.get(key)
    if slot is None:
        slot = slots[key] = [[], [], index, -1, 0, index]
        scan.descs.setdefault(key[0], clean(pg[1]))
    text = sizes_text(sizes) if len(sizes) <= COALESCED_OPS_KEPT else f"{len(sizes)} shapes"
    weight = len(sizes) + sum(len(shape) for shape in sizes)
    # [name, sizes, signature id, slot, what comparing another entry's sizes with these costs, where it is felt,
    # whether the name may be a closer's]
    cost = weight if weight > 16 else 0
    return [name, sizes, _sig_id(scan, (clean(name, limit=120), text)), slot, cost, name[-9:] == "coalesced"]


def _sig_id(scan: _Scan, signature: tuple[str, str]) -> int:
    found = scan.table.get(signature)
    if found is None:
        found = scan.table[signature] = len(scan.by_id)
        scan.by_id.append(signature)
    return found


def _coalesce(scan: _Scan, slot: list[Any], index: int, name: str, sizes: Any) -> None:
    """A further entry under the group's last number: the closer (``..._coalesced``, which carries the state)
    or one more op of the coalesced collective, joined into its signature (by name and sizes up to
    :data:`COALESCED_OPS_KEPT` ops, then by their count: a signature stays bounded)."""
    if name.endswith("coalesced"):
        slot[2] = index
        return
    slot[4] += 1
    ids = slot[1]
    first = scan.by_id[ids[-1]]
    if slot[4] <= COALESCED_OPS_KEPT:
        joined = (f"{first[0]}+{clean(name, limit=120)}", f"{first[1]}; {sizes_text(sizes)}")
    else:
        head = first[0].partition(" (+")[0]
        joined = (f"{head} (+{slot[4] - COALESCED_OPS_KEPT} more ops)", first[1])
    ids[-1] = _sig_id(scan, joined)


@dataclass
class _P2P:
    """A dump's point-to-point ops: the unfinished ones, the newest and the count per (group, kind, peer)."""

    pending: list[Entry]
    newest: dict[P2PKey, Entry]
    count: dict[P2PKey, int]


def _p2p(ops: list[Entry], only_active: bool) -> _P2P:
    """Each batch judged by its closer (:mod:`.coalesced`: ``L-COAL-CLOSE``, ``L-ONLY-ACTIVE``; a batch still open
    is not pending). Ops are counted in buffer order: the k-th send toward a peer meets that peer's k-th receive."""
    closers = [e for e in ops if e.op.endswith("coalesced")]  # is_p2p False as torch writes it; True is read too
    batches = judge_p2p_batches([e for e in ops if not e.op.endswith("coalesced")], closers, only_active=only_active)
    found = _P2P([], {}, {})
    for e in batches.ops:
        if open_member(e, batches.open_batches):
            continue
        if e.op in _P2P_OPS:
            key = (e.key, e.op, e.peer)
            e.ordinal = found.count[key] = found.count.get(key, 0) + 1
            found.newest[key] = e
        if not e.done:
            found.pending.append(e)
    return found


def _recorder_facts(entries: list[Any], scan: _Scan, reading: _Reading) -> dict[str, Recorder]:
    """The one recorder of a dump torch wrote: from its first entry (``record_id`` past 0: its buffer wrapped)."""
    first = entries[0]
    record_id, oldest = first.get("record_id") or 0, first.get("time_created_ns")
    if not is_count(record_id) or not (oldest is None or is_count(oldest)):
        raise reading.bad_entry(0, first)
    lib = clean(op_name(first["profiling_name"])[0], limit=40)
    tracks = tracks_completion(lib, scan.tracks)
    return {lib: Recorder(wrapped=record_id > 0, oldest_ns=oldest, tracks_completion=tracks)}


def _recorders(raw: Mapping[str, Any], entries: list[Any], scan: _Scan, reading: _Reading) -> dict[str, Recorder]:
    """Each recorder's buffer: from the shim's own account where it joined several, else from the first entry.
    Gloo's recorder never tracks completion (see :class:`~.records.Recorder`)."""
    stated = (raw.get("nemo_rl_shim") or {}).get("recorders")
    if not entries:
        return {}
    if not stated:
        return _recorder_facts(entries, scan, reading)
    tracking = {op_name(e["profiling_name"])[0] for e in entries if e.get("state") != "scheduled"}
    found = {}
    for lib, facts in stated.items():
        facts = facts if isinstance(facts, dict) else {}
        record_id, oldest = facts.get("first_record_id"), facts.get("oldest_ns")
        if not isinstance(lib, str) or not is_count(record_id) or not (oldest is None or is_count(oldest)):
            raise DumpError(
                f"{shown_path(reading.path)}: nemo_rl_shim.recorders[{shown(lib, typed=False)}] is {shown(facts)}, "
                "not a recorder's facts"
            )
        name = clean(lib, limit=40)
        tracks = tracks_completion(lib, lib in tracking)
        found[name] = Recorder(wrapped=record_id > 0, oldest_ns=oldest, tracks_completion=tracks)
    return found


def _recent_calls(
    entries: list[Any], last: Mapping[GroupKey, Entry], reading: _Reading
) -> dict[GroupKey, dict[int, Frame | None]]:
    """Per group, where its last collectives were called: the last one (``last``), and up to :data:`CALLS_KEPT`
    found among the dump's newest entries (twice that many per group, from the end: a look back bounded by the
    groups, not by the buffer). The entries' other fields were checked by :func:`_scan`."""
    calls = {key: {entry.seq: entry.where} for key, entry in last.items()}
    open_keys = set(calls)
    seq_key = reading.seq_key
    stop = max(0, len(entries) - 2 * CALLS_KEPT * len(calls))
    for index in range(len(entries) - 1, stop - 1, -1):
        if not open_keys:
            break
        raw = entries[index]
        flag = raw.get("is_p2p")
        if flag is True or (flag is None and _is_p2p(raw, seq_key)) or not raw[seq_key]:
            continue
        if is_closer(raw["profiling_name"], raw.get("input_sizes")):
            continue  # L-COAL-CLOSE: a closer's numbers are the batch's, its frames the batch's call
        key = (group_name(raw["process_group"][0]), clean(op_name(raw["profiling_name"])[0], limit=40))
        kept = calls.get(key)
        if kept is None or key not in open_keys or raw[seq_key] in kept:
            continue
        if len(kept) >= CALLS_KEPT:
            open_keys.discard(key)
            continue
        try:
            kept[raw[seq_key]] = _call_site(raw, reading)
        except ValueError:
            raise reading.bad_entry(index, raw) from None
    return calls


# --- one dump ------------------------------------------------------------------------------------------------------


def _members(
    raw: Mapping[str, Any], rank: int, sidecar: Mapping[str, Any], reading: _Reading, entry_groups: dict[str, str]
) -> tuple[dict[str, GroupFacts], range | tuple[int, ...] | None]:
    """Each group's members as a record lists them (the shim's map, in the dump or else the sidecar; torch's
    ``pg_config``); a group known only from the entries is this rank alone, not stated. The default group's members
    as a record lists them (never from the entries). A rank whose entries place it in a group its own record lists
    without it is refused; so is a rank whose records list one group as two rank sets (its group map and torch's
    ``pg_config``: one process has one group under a name)."""
    path = reading.path
    shim = raw.get("nemo_rl_shim") or {}
    if shim.get("groups"):
        groups = groups_from_map(shim["groups"], f"{shown_path(path)}: nemo_rl_shim.groups", reading.budget)
        where = "nemo_rl_shim.groups"
    else:  # checked as it was read (read_sidecar)
        groups = dict(sidecar.get("groups") or {})
        where = shown_path(sidecar["path"]) if sidecar.get("path") is not None else "its group map"
    without: dict[str, GroupFacts] = {}
    for name, facts in groups_from_pg_config(raw.get("pg_config") or {}, rank, path, reading.budget, without).items():
        known = groups.setdefault(name, facts)
        if known.stated and known.ranks != facts.ranks and set(known.ranks) != set(facts.ranks):
            raise DumpError(
                f"{shown_path(path)}: {where} lists process group {name!r} as ranks {format_ranks(known.ranks)}, its "
                f"pg_config as ranks {format_ranks(facts.ranks)}: one rank has one group under a name"
            )
    listed = default_ranks(groups)
    for name, desc in entry_groups.items():
        facts = groups.get(name) or without.get(name)
        if facts is None:
            groups[name] = GroupFacts((rank,), stated=False, desc=desc)
        elif rank not in facts.ranks:
            raise DumpError(
                f"{shown_path(path)}: its entries place rank {rank} in process group {name!r}, which its own record "
                f"lists as ranks {format_ranks(facts.ranks)}"
            )
        elif desc and not facts.desc:
            groups[name] = replace(facts, desc=desc)
    return groups, listed


def _rank(raw: Mapping[str, Any], name_rank: int, sidecar: Mapping[str, Any], path: Path) -> int:
    """The rank the file name gives, checked against the one the dump states."""
    for stated in (raw.get("rank"), (raw.get("nemo_rl_shim") or {}).get("rank"), sidecar.get("rank")):
        if stated is not None and stated != name_rank:
            raise DumpError(
                f"{shown_path(path)}: the dump says it is rank {shown(stated)}, its file name says rank {name_rank}"
            )
    return name_rank


def _pg_status(raw: Mapping[str, Any], budget: Budget) -> dict[str, dict[str, int]]:
    """``pg_status``, reduced to its counters that are ints (a hint, never evidence: see the analysis)."""
    found: dict[str, dict[str, int]] = {}
    for key, status in (raw.get("pg_status") or {}).items():
        budget.spend(1, "pg_status")
        if isinstance(key, str | int) and isinstance(status, dict):
            counters = {k: status[k] for k in _PG_STATUS_FIELDS if is_int(status.get(k))}
            found[clean(str(key), limit=80)] = counters
    return found


def summarize(
    path: Path,
    name_rank: int,
    sidecar: Mapping[str, Any] | None = None,
    keep: list | None = None,
    root: Path | None = None,
) -> RankDump:
    """Read one dump and reduce it (see the module docstring); its entries are not kept (``keep``: a list to
    hold the raw dump instead of freeing it, for a reader process that ends without freeing). ``root``: the folder
    the dump was found in, which a symlink must not leave."""
    raw, size, found = _load(path, root)
    if keep is not None:
        keep.append(raw)
    dump = reduce_dump(raw, size, path, name_rank, sidecar)
    dump.fingerprint = found
    return dump


def reduce_dump(
    raw: dict[str, Any], size: int, path: Path, name_rank: int, sidecar: Mapping[str, Any] | None = None
) -> RankDump:
    """A dump already read (``raw``, from a file of ``size`` bytes, its top level checked) reduced: what
    :func:`summarize` does once it has read the file. The quick read (:mod:`.newest_entries`) hands it a window of the
    newest entries."""
    side = sidecar or {}
    shim = raw.get("nemo_rl_shim") or {}
    rank = _rank(raw, name_rank, side, path)
    if shim.get("world_size") and side.get("world_size") and shim["world_size"] != side["world_size"]:
        raise DumpError(
            f"{shown_path(path)}: world_size {shim['world_size']}, where its group map says {side['world_size']}"
        )
    entries = raw["entries"]
    if _may_repeat(entries) and len(set(map(id, entries))) != len(entries):
        raise DumpError(f"{shown_path(path)}: {_repeated(entries)}")
    seq_key = "seq_id" if entries and isinstance(entries[0], dict) and "seq_id" in entries[0] else "collective_seq_id"
    reading = _Reading(path, Budget.for_bytes(path, size), seq_key)
    scan = _scan(entries, reading)
    p2p_ops = [_checked_entry(reading, index, item) for index, item in scan.p2p]
    entry_groups = dict(scan.descs)
    groups, default = _members(raw, rank, side, reading, entry_groups)
    last = {key: _checked_entry(reading, index, item) for key, (index, item) in scan.last.items()}
    newest = _checked_entry(reading, len(entries) - 1, entries[-1]) if entries else None
    check_p2p_sides(path, rank, groups, p2p_ops)
    version = raw.get("version", "")
    recorders = _recorders(raw, entries, scan, reading)
    world = len(default) if default is not None and len(default) else shim.get("world_size") or side.get("world_size")
    spans = {key: collective_gaps(seqs) for key, seqs in scan.seqs.items() if len(seqs)}
    evidence = gather(raw, seq_key, groups, scan.first, recorders, world)
    p2p = _p2p(p2p_ops, evidence.only_active)
    logged = read_log(shim, path, reading.budget) if isinstance(shim, dict) else None
    if logged is not None:  # S-P2P-OPS: what Gloo's recorder does not write (G-NO-P2P); keyed as its entries would be
        p2p.pending += logged.pending
        p2p.newest.update(logged.newest)
        p2p.count.update(logged.count)
    completed_batch(last, scan.joined, only_active=evidence.only_active)
    gaps = {key: missing for key, (missing, _) in spans.items() if missing} if not evidence.only_active else {}
    world_from = path if shim.get("world_size") else side.get("path") if side.get("world_size") else None
    return RankDump(
        rank=rank,
        path=path,
        version=clean(version if isinstance(version, str) else "", limit=40),
        n_entries=len(entries),
        groups=groups,
        last=last,
        signatures={key: (scan.seqs[key], scan.sig_ids[key]) for key in scan.seqs},
        sig_table=list(scan.by_id),
        pending_p2p=p2p.pending,
        p2p_last=p2p.newest,
        p2p_count=p2p.count,
        latest=newest,
        recorders=recorders,
        calls=_recent_calls(entries, last, reading),
        pg_status=_pg_status(raw, reading.budget),
        world_size=shim.get("world_size") or side.get("world_size"),
        default_ranks=default,
        reason=clean(shim["reason"], limit=500) if shim.get("reason") else None,
        dump_time_ns=shim.get("dump_time_ns"),
        writer="nemo_rl_shim" if shim else "torch",
        backend=",".join(sorted({e.lib for e in [*last.values(), *p2p.newest.values(), *p2p.pending]} - {""})),
        world_size_from=world_from,
        comm_lib_version=evidence.comm_lib,
        evidence=evidence,
        gaps=gaps,
        spans={key: span for key, (_, span) in spans.items()},
        p2p_logged=logged is not None,
    )


#: What ``sys.getrefcount`` gives, read as :func:`_may_repeat` reads it, for an object held by one list alone (CPython).
_ONE_HOLDER = max(map(sys.getrefcount, [object()])) if hasattr(sys, "getrefcount") else None


def _may_repeat(entries: list[Any]) -> bool:
    """Whether an entry may be held twice by the list (a pickle's shared reference). Where every entry is held by
    this list alone (CPython's reference counts, read in one pass in C), none is: a dump torch wrote, unpickled
    and its unpickler gone, holds each entry once. Else (or without reference counts) the ids are compared."""
    return _ONE_HOLDER is None or max(map(sys.getrefcount, entries), default=0) > _ONE_HOLDER


def _repeated(entries: list[Any]) -> str:
    """Where an entry is an earlier one again (a pickle's shared reference): torch writes each entry once."""
    first: dict[int, int] = {}
    for index, entry in enumerate(entries):
        if id(entry) in first:
            return f"entry {index} is entry {first[id(entry)]} again (a shared reference): torch writes each entry once"
        first[id(entry)] = index
    return "an entry is repeated"


def pg_status_of(dump: RankDump, entry: Entry) -> Any:
    """What ``pg_status`` holds for ``entry``'s group: keyed by ``pg_id`` as torch writes it, or by recorder and
    ``pg_id`` where the shim joined several recorders (their ids overlap)."""
    status = dump.pg_status.get(PG_STATUS_KEY.format(backend=entry.lib, pg_id=entry.pg_id))
    return status if status is not None else dump.pg_status.get(entry.pg_id)
