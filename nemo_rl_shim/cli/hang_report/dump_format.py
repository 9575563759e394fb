"""torch's Flight Recorder dump format, in one place: reading a dump without running it, checking it, and
reducing it to a :class:`~nemo_rl_shim.cli.hang_report.records.RankDump`.

A dump is the pickle torch writes (``version``, ``pg_config``, ``pg_status``, ``entries``, key for key as
``FlightRecorderDetail.hpp`` writes them): NCCL's watchdog on a timeout, torch 2.15's ``FlightRecorderHook`` when
a hooked backend (``nccl2``) aborts, a user's ``_dump_fr_trace_file``, or
:mod:`nemo_rl_shim.flight_recorder`, which adds ``rank`` and ``nemo_rl_shim`` (world size, group map, reason, dump
time, and, where it joined several recorders, each one's facts).

* **Untrusted.** Read by :func:`~nemo_rl_shim.cli.hang_report.safe_pickle.load_plain`: plain data only, no code
  runs. Every field read is checked for its type as it is read; anything else is a :class:`DumpError` naming the
  file, the entry and the key. Text is made only from checked values (a nested list that shares itself can hold
  2**100 items in a few hundred bytes: its ``str`` would never end).
* **Versions.** Keys are read by presence, not by ``version``: torch 2.9 to 2.15 write ``"2.10"`` or lower; older
  dumps lack ``pg_status``, ``is_p2p``, ``retired`` and ``p2p_seq_id``, and call the number ``seq_id``.
* **Recorders.** Each entry's ``profiling_name`` starts with its recorder's name (``nccl:``, ``gloo:``, ``nccl2:``),
  and each recorder numbers a group's ops by itself: a group is keyed by its name and that name.
  ``FlightRecorderHook`` (torch 2.15's ``nccl2``, and any backend without its own recorder) writes each op of a
  ``batch_isend_irecv`` as its own entry with its own p2p number, and no ``coalesced`` closer.
* **Memory.** A dump is reduced as it is read: per group the last collective, a signature (op and sizes) per
  sequence number, and its point-to-point ops (counted per peer, the newest kept, the unfinished ones listed).
* **Where each op was called.** torch keeps, per entry, the Python stack where the op was called (``frames``,
  innermost first, each ``{"name", "filename", "line"}``; one dict per distinct frame, which every entry shares).
  Of an entry the reduction keeps (the last collective, the p2p ops, the newest), only the innermost user frame
  is kept (:func:`~nemo_rl_shim.cli.hang_report.frames.user_frame`: torch, the shim and the standard library
  skipped), and per group the call sites of its last :data:`CALLS_KEPT` collectives among the dump's newest
  entries (``RankDump.calls``): what tells a skipped collective from a size mismatch. No other entry's frames are
  read.
"""

from __future__ import annotations

import array
import ast
import functools
import gc
import json
import reprlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.hang_report.frames import Frame, frame, user_frame
from nemo_rl_shim.cli.hang_report.records import DumpError, Entry, GroupKey, P2PKey, RankDump, Recorder
from nemo_rl_shim.cli.hang_report.safe_pickle import RefusedPickle, load_plain
from nemo_rl_shim.flight_recorder.names import PG_STATUS_KEY
from nemo_rl_shim.one_line.exception import first_line

__all__ = [
    "CALLS_KEPT",
    "compact_ranks",
    "groups_from_map",
    "op_name",
    "pg_status_of",
    "read_dump",
    "read_sidecar",
    "sizes_text",
    "summarize",
]

_STATES = ("scheduled", "started", "completed")
#: torch's numbers are size_t; above this one an int64 array cannot hold them.
_MAX_SEQ = 2**63 - 1
_P2P_OPS = ("send", "recv")
#: Per group, the call sites kept of its last collectives (found among the dump's newest entries, see _recent_calls).
CALLS_KEPT = 8
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 2, 40, 40, 4, 4


def _shown(value: Any) -> str:
    """A value as one short line, whatever it holds (bounded: never walks a shared nested list in full)."""
    return f"{_SHOW.repr(value)} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool, not float (NaN), not str


# --- reading -------------------------------------------------------------------------------------------------------


def read_dump(path: Path) -> dict[str, Any]:
    """The dump as torch wrote it, plain data only and its top level checked; :class:`DumpError` naming the file."""
    was_enabled = gc.isenabled()
    gc.disable()  # as torch's loader does: unpickling many small dicts otherwise runs the collector again and again
    try:
        with open(path, "rb") as handle:
            data = load_plain(handle)
    except RefusedPickle as e:
        raise DumpError(f"{path} is refused: {e}") from None
    except Exception as e:  # truncated, not a pickle, too deep, too big: one line, exit 2
        raise DumpError(f"{path} is not a readable flight-recorder dump: {first_line(e)}") from None
    finally:
        if was_enabled:
            gc.enable()
    problem = _top_level_problem(data)
    if problem:
        raise DumpError(f"{path} is not a flight-recorder dump: {problem}")
    return data


def _top_level_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"torch writes a dict, this is {_shown(data)}"
    entries = data.get("entries")
    if not isinstance(entries, list):
        keys = ", ".join(sorted(repr(k)[:40] for k in list(data)[:8]))
        return f"no 'entries' list (keys: {keys or 'none'})" if entries is None else f"'entries' is {_shown(entries)}"
    for key, kind in (("version", str), ("pg_config", dict), ("pg_status", dict), ("nemo_rl_shim", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"{key!r} is {_shown(data[key])}, where torch writes a {kind.__name__}"
    if "rank" in data and not (_is_int(data["rank"]) and data["rank"] >= 0):
        return f"'rank' is {_shown(data['rank'])}, not a rank"
    return _shim_problem(data.get("nemo_rl_shim") or {})


def _shim_problem(shim: Mapping[str, Any]) -> str | None:
    size = shim.get("world_size")
    if size is not None and not (_is_int(size) and size > 0):
        return f"'nemo_rl_shim.world_size' is {_shown(size)}, not a positive int"
    for key in ("reason", "writer"):
        if shim.get(key) is not None and not isinstance(shim[key], str):
            return f"'nemo_rl_shim.{key}' is {_shown(shim[key])}, not text"
    if shim.get("dump_time_ns") is not None and not _is_int(shim["dump_time_ns"]):
        return f"'nemo_rl_shim.dump_time_ns' is {_shown(shim['dump_time_ns'])}, not an int"
    for key in ("groups", "recorders"):
        if shim.get(key) is not None and not isinstance(shim[key], dict):
            return f"'nemo_rl_shim.{key}' is {_shown(shim[key])}, not a dict"
    return None


def read_sidecar(path: Path) -> dict[str, Any]:
    """A group map the shim writes beside each dump (JSON); :class:`DumpError` naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except Exception as e:  # unreadable, not JSON, too deep
        raise DumpError(f"{path} is not a readable group map: {first_line(e)}") from None
    problem = _shim_problem(data) if isinstance(data, dict) else f"a group map is a JSON object, this is {_shown(data)}"
    if problem is None and "rank" in data and not (_is_int(data["rank"]) and data["rank"] >= 0):
        problem = f"'rank' is {_shown(data['rank'])}, not a rank"
    if problem:
        raise DumpError(f"{path} is not a group map: {problem.replace('nemo_rl_shim.', '')}")
    return {**data, "groups": groups_from_map(data.get("groups") or {}, f"{path}: groups")}


# --- ranks and groups ----------------------------------------------------------------------------------------------


def compact_ranks(ranks: Iterable[int]) -> range | tuple[int, ...]:
    """``ranks`` as a ``range`` where they step evenly (a mesh axis's group: compared at once), else as a tuple;
    order kept (torch lists a group's ranks in group-rank order)."""
    ranks = tuple(ranks)
    if len(ranks) > 1 and (step := ranks[1] - ranks[0]) > 0:
        candidate = range(ranks[0], ranks[-1] + 1, step)
        if len(candidate) == len(ranks) and tuple(candidate) == ranks:
            return candidate
    return ranks


def _rank_list(value: Any, where: str) -> range | tuple[int, ...]:
    """Checked ranks: a list (or torch's text of one, ``"[0, 1]"``) of distinct non-negative ints."""
    ranks = _ranks_of_text(value) if isinstance(value, str) else _checked_ranks(value)
    if ranks is None:
        raise DumpError(f"{where} is {_shown(value)}, not a list of distinct ranks")
    return ranks


def _checked_ranks(ranks: Any) -> range | tuple[int, ...] | None:
    checked = isinstance(ranks, list | tuple) and all(_is_int(r) and r >= 0 for r in ranks)
    return compact_ranks(ranks) if checked and len(set(ranks)) == len(ranks) else None


@functools.lru_cache(maxsize=4096)
def _ranks_of_text(text: str) -> range | tuple[int, ...] | None:
    """torch writes a group's ranks as ``"[0, 1, 2]"``: JSON, read in C, then checked; cached, since every rank's
    dump lists the same groups (the default group's thousand ranks in each)."""
    try:
        ranks = json.loads(text)
    except Exception:
        try:
            ranks = ast.literal_eval(text)  # literals only: no code runs
        except Exception:
            return None
    return _checked_ranks(ranks)


def groups_from_map(groups: Any, where: str) -> dict[str, dict[str, Any]]:
    """The shim's group map (``{name: {"axes", "ranks", "desc"}}``), checked."""
    if not isinstance(groups, dict):
        raise DumpError(f"{where} is {_shown(groups)}, not a group map")
    found = {}
    for name, facts in groups.items():
        if not isinstance(name, str) or not isinstance(facts, dict):
            raise DumpError(f"{where}[{name!r:.40}] is {_shown(facts)}, not a group's facts")
        axes = facts.get("axes") or []
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise DumpError(f"{where}[{name!r:.40}].axes is {_shown(axes)}, not a list of axis names")
        ranks = _rank_list(facts.get("ranks") or [], f"{where}[{name!r:.40}].ranks")
        found[name] = {"axes": list(axes), "ranks": ranks, "desc": str(facts.get("desc") or "")[:200]}
    return found


def _groups_from_pg_config(pg_config: Mapping[Any, Any], rank: int, path: Path) -> dict[str, dict[str, Any]]:
    """torch's ``pg_config``, where a group is named and this rank is among its ranks (Gloo's ``''`` never is)."""
    groups = {}
    for name, facts in pg_config.items():
        if not name or not isinstance(name, str):
            continue
        if not isinstance(facts, dict):
            raise DumpError(f"{path}: pg_config[{name!r:.40}] is {_shown(facts)}, not a group's config")
        ranks = _rank_list(facts.get("ranks", "[]"), f"{path}: pg_config[{name!r:.40}].ranks")
        if rank in ranks:
            desc = facts.get("desc", "")
            groups[name] = {"axes": [], "ranks": ranks, "desc": desc[:200] if isinstance(desc, str) else ""}
    return groups


def _default_ranks(groups: Mapping[str, Mapping[str, Any]]) -> range | tuple[int, ...] | None:
    """The default group's members, where a record lists them (torch's ``default_pg``, the shim's ``default``)."""
    for facts in groups.values():
        if facts.get("desc") == "default_pg" or "default" in facts.get("axes", ()):
            return facts["ranks"]
    return None


# --- entries -------------------------------------------------------------------------------------------------------


def op_name(profiling_name: str) -> tuple[str, str, int | None]:
    """``"nccl:send 1->0"`` -> ``("nccl", "send", 0)``; ``"gloo:all_reduce"`` -> ``("gloo", "all_reduce", None)``;
    ``"nccl2:recv 0<-?"`` (a recv from any source) -> ``("nccl2", "recv", None)``."""
    lib, _, rest = profiling_name.partition(":")
    if not rest:
        lib, rest = "", profiling_name
    op, _, where = rest.partition(" ")
    peer = None
    for arrow in ("->", "<-"):
        if arrow in where:
            with_peer = where.split(arrow, 1)[1]
            peer = int(with_peer) if with_peer.isdigit() and len(with_peer) < 12 else None
    return lib, op, peer


_BRACKETS = str.maketrans("()", "[]")


def _sizes_ok(sizes: Any) -> bool:
    """torch's ``input_sizes``: a list of shapes, each a list of ints (checked before any text is made of them)."""
    return isinstance(sizes, list | tuple) and all(
        isinstance(shape, list | tuple) and all(_is_int(d) for d in shape) for shape in sizes
    )


def sizes_text(sizes: Any) -> str:
    """Checked input sizes as one comparable text, lists or tuples alike: ``((3, 4),)`` and ``[[3, 4]]`` ->
    ``[[3, 4]]``."""
    return str(sizes).translate(_BRACKETS).replace(",]", "]")


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


def _optional_int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None or _is_int(value):
        return value
    raise ValueError(f"{key!r} is {_shown(value)}, not an int")


#: A dump's frames already read, by the identity of torch's frame dict (shared by every entry that holds it);
#: valid while the dump is held.
_Seen = dict[int, Frame]


def _frame_of(item: Any) -> Frame:
    if type(item) is not dict:
        raise ValueError(f"'frames' holds {_shown(item)}, not a frame")
    name, file, line = item.get("name"), item.get("filename"), item.get("line")
    if type(name) is not str or type(file) is not str or not (line is None or _is_int(line)):
        raise ValueError(f"'frames' holds {_shown(item)}, not a frame (name, filename, line)")
    return frame(file, line, name)


def _frames(items: list[Any] | tuple[Any, ...], seen: _Seen) -> Iterator[Frame]:
    """The entry's frames, innermost first, each read once per dump."""
    for item in items:
        made = seen.get(id(item))
        if made is None:
            made = seen[id(item)] = _frame_of(item)
        yield made


def _call_site(raw: Mapping[str, Any], seen: _Seen) -> Frame | None:
    """Where the entry's op was called: the innermost user frame of its ``frames`` (None where it has none, or
    only torch's, the shim's and the standard library's); ValueError naming ``'frames'`` where they are not frames."""
    frames = raw.get("frames")
    if frames is None:
        return None
    if type(frames) is not list and type(frames) is not tuple:
        raise ValueError(f"'frames' is {_shown(frames)}, not a list of frames")
    return user_frame(_frames(frames, seen))


def _entry_problem(raw: Any, seq_key: str) -> str:
    """What is wrong with an entry (the slow, thorough look, once the fast one stumbled)."""
    if not isinstance(raw, dict):
        return f"is {_shown(raw)}, not a dict"
    group = raw.get("process_group")
    if not (isinstance(group, tuple | list) and group and all(isinstance(g, str) for g in group)):
        return f"'process_group' is {_shown(group)}, not (name, description)"
    if not isinstance(raw.get("profiling_name"), str):
        return f"'profiling_name' is {_shown(raw.get('profiling_name'))}, not text"
    for key in (seq_key, "p2p_seq_id", "record_id"):
        if key in raw and raw[key] is not None and not (_is_int(raw[key]) and 0 <= raw[key] <= _MAX_SEQ):
            return f"{key!r} is {_shown(raw[key])}, not an int from 0 to 2**63 - 1"
    if seq_key not in raw and "is_p2p" not in raw:
        return f"no {seq_key!r}"
    if raw.get("is_p2p") is not None and not isinstance(raw["is_p2p"], bool):
        return f"'is_p2p' is {_shown(raw['is_p2p'])}, not a bool"
    if raw.get("state", "scheduled") not in _STATES:
        return f"'state' is {_shown(raw.get('state'))}, not one of {', '.join(_STATES)}"
    for key in ("time_created_ns", "time_discovered_completed_ns", "timeout_ms"):
        if raw.get(key) is not None and not _is_int(raw[key]):
            return f"{key!r} is {_shown(raw[key])}, not an int"
    if not _sizes_ok(raw.get("input_sizes", [])):
        return f"'input_sizes' is {_shown(raw.get('input_sizes'))}, not a list of shapes"
    if not isinstance(raw.get("pg_id", ""), int | str):
        return f"'pg_id' is {_shown(raw.get('pg_id'))}, not an id"
    try:
        _call_site(raw, {})
    except ValueError as e:
        return str(e)
    return "cannot be read"


def _bad_entry(path: Path, index: int, raw: Any, seq_key: str) -> DumpError:
    return DumpError(f"{path}: entry {index} {_entry_problem(raw, seq_key)}")


def _entry(raw: Mapping[str, Any], seq_key: str, seen: _Seen) -> Entry:
    """An entry checked in full (ValueError naming the key) and made typed, with where it was called."""
    name = raw["profiling_name"]
    if not isinstance(name, str):
        raise ValueError(f"'profiling_name' is {_shown(name)}, not text")
    lib, op, peer = op_name(name)
    p2p_seq, coll_seq = _optional_int(raw, "p2p_seq_id") or 0, _optional_int(raw, seq_key) or 0
    is_p2p = _is_p2p(raw, seq_key)
    sizes = raw.get("input_sizes", ())
    state = raw.get("state", "scheduled")
    if state not in _STATES or not _sizes_ok(sizes) or min(p2p_seq, coll_seq) < 0:
        raise ValueError("a field is out of its range")
    pg_id = raw.get("pg_id", "")
    if not isinstance(pg_id, int | str):
        raise ValueError(f"'pg_id' is {_shown(pg_id)}, not an id")
    return Entry(
        group=raw["process_group"][0],
        seq=p2p_seq if is_p2p else coll_seq,
        op=op,
        sizes=sizes_text(sizes),
        state=state,
        created_ns=_optional_int(raw, "time_created_ns") or 0,
        completed_ns=_optional_int(raw, "time_discovered_completed_ns"),
        timeout_ms=_optional_int(raw, "timeout_ms"),
        pg_id=str(pg_id)[:40],
        is_p2p=is_p2p,
        peer=peer,
        lib=lib,
        where=_call_site(raw, seen),
    )


def _checked_entry(path: Path, index: int, raw: Any, seq_key: str, seen: _Seen) -> Entry:
    try:
        return _entry(raw, seq_key, seen)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        raise _bad_entry(path, index, raw, seq_key) from None


# --- one pass over the entries -------------------------------------------------------------------------------------


@dataclass
class _Scan:
    """What one pass over a dump's entries keeps: per group the numbers and signatures, the last collective,
    every p2p entry, and the descriptions."""

    seqs: dict[GroupKey, array.array] = field(default_factory=dict)
    sig_ids: dict[GroupKey, array.array] = field(default_factory=dict)
    table: dict[tuple[str, str], int] = field(default_factory=dict)
    last: dict[GroupKey, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    p2p: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    descs: dict[str, str] = field(default_factory=dict)
    tracks: bool = False


def _scan(entries: list[Any], path: Path, seq_key: str) -> _Scan:
    """One lean pass, every field it reads checked as it reads it: at 2,000 entries a rank and thousands of ranks,
    every step per entry counts. Per group, the last entry's name, sizes and signature are held (a signature's
    text is made only when an entry's name or sizes differ from them), and per group and recorder a slot (its
    numbers, its signature ids, its last entry's index and its last number) that the pass appends to: no tuple
    is made and no dict written per entry."""
    scan = _Scan()
    at: dict[str, list[Any]] = {}  # group -> [name, sizes, signature id, slot] of its last collective
    # (group, recorder) -> [numbers, signature ids, index of its last entry, its last number]
    slots: dict[GroupKey, list[Any]] = {}
    table, p2p_entries, max_seq = scan.table, scan.p2p, _MAX_SEQ
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
            seq = raw[seq_key]
            if type(seq) is not int or seq > max_seq or seq < 0:
                raise TypeError
        except (KeyError, TypeError, IndexError, AttributeError):
            raise _bad_entry(path, index, raw, seq_key) from None
        if not seq:
            continue
        sizes = raw.get("input_sizes")
        last = at.get(group)
        if last is None or last[0] != name or last[1] != sizes:
            last = at[group] = _signature(scan, slots, index, raw, path, seq_key)
        slot = last[3]
        if slot[3] == seq:  # one op of a coalesced collective: they share its number
            _coalesce(table, slot, index, name, sizes)
            continue
        slot[0].append(seq)
        slot[1].append(last[2])
        slot[2] = index
        slot[3] = seq
    scan.tracks = tracks
    for key, (seqs, ids, last_index, _) in slots.items():
        scan.seqs[key], scan.sig_ids[key], scan.last[key] = seqs, ids, (last_index, entries[last_index])
    for _, raw in p2p_entries:
        pg = raw["process_group"]
        scan.descs.setdefault(pg[0], pg[1] if len(pg) > 1 else "")
    return scan


def _signature(
    scan: _Scan, slots: dict[GroupKey, list[Any]], index: int, raw: dict[str, Any], path: Path, seq_key: str
) -> list[Any]:
    """A collective whose name or sizes differ from its group's last one: its sizes checked, its signature's id,
    and its group and recorder's slot (made, with the group's description, at the first)."""
    name, sizes, pg = raw["profiling_name"], raw.get("input_sizes"), raw["process_group"]
    if not _sizes_ok(sizes):
        raise _bad_entry(path, index, raw, seq_key)
    key = (pg[0], op_name(name)[0])
    slot = slots.get(key)
    if slot is None:
        slot = slots[key] = [array.array("q"), array.array("q"), index, -1]
        scan.descs.setdefault(pg[0], pg[1] if len(pg) > 1 else "")
    return [name, sizes, scan.table.setdefault((name, sizes_text(sizes)), len(scan.table)), slot]


def _coalesce(table: dict[tuple[str, str], int], slot: list[Any], index: int, name: str, sizes: Any) -> None:
    """A further entry under the group's last number: the closer (``..._coalesced``, which carries the state)
    or one more op of the coalesced collective, joined into its signature."""
    if name.endswith("coalesced"):
        slot[2] = index
        return
    ids = slot[1]
    first = next(k for k, i in table.items() if i == ids[-1])
    ids[-1] = table.setdefault((f"{first[0]}+{name}", f"{first[1]}; {sizes_text(sizes)}"), len(table))


@dataclass
class _P2P:
    """A dump's point-to-point ops: the unfinished ones, the newest and the count per (group, kind, peer)."""

    pending: list[Entry]
    newest: dict[P2PKey, Entry]
    count: dict[P2PKey, int]


def _p2p(ops: list[Entry]) -> _P2P:
    """Legacy NCCL writes a batch's ops 'scheduled' and its ``coalesced`` entry (same group and p2p number) with
    the batch's state: each op takes it. Ops are counted in buffer order: the k-th send toward a peer meets that
    peer's k-th receive."""
    closers = {(e.key, e.seq): e for e in ops if e.op.endswith("coalesced")}
    found = _P2P([], {}, {})
    for e in ops:
        if e.op.endswith("coalesced"):
            continue
        closer = closers.get((e.key, e.seq))
        if closer is not None:
            e.batched, e.state, e.completed_ns = True, closer.state, closer.completed_ns
        if e.op in _P2P_OPS:
            key = (e.key, e.op, e.peer)
            e.ordinal = found.count[key] = found.count.get(key, 0) + 1
            found.newest[key] = e
        if not e.done:
            found.pending.append(e)
    return found


def _recorders(raw: Mapping[str, Any], entries: list[Any], scan: _Scan, path: Path) -> dict[str, Recorder]:
    """Each recorder's buffer: from the shim's own account where it joined several, else from the first entry."""
    stated = (raw.get("nemo_rl_shim") or {}).get("recorders")
    if not entries:
        return {}
    if not stated:
        first = entries[0]
        record_id, oldest = first.get("record_id") or 0, first.get("time_created_ns")
        if not _is_int(record_id) or not (oldest is None or _is_int(oldest)):
            raise _bad_entry(path, 0, first, "collective_seq_id")
        lib = op_name(first["profiling_name"])[0]
        return {lib: Recorder(wrapped=record_id > 0, oldest_ns=oldest, tracks_completion=scan.tracks)}
    tracking = {op_name(e["profiling_name"])[0] for e in entries if e.get("state") != "scheduled"}
    found = {}
    for lib, facts in stated.items():
        facts = facts if isinstance(facts, dict) else {}
        record_id, oldest = facts.get("first_record_id"), facts.get("oldest_ns")
        if not isinstance(lib, str) or not _is_int(record_id) or not (oldest is None or _is_int(oldest)):
            raise DumpError(f"{path}: nemo_rl_shim.recorders[{lib!r:.40}] is {_shown(facts)}, not a recorder's facts")
        found[lib] = Recorder(wrapped=record_id > 0, oldest_ns=oldest, tracks_completion=lib in tracking)
    return found


def _recent_calls(
    entries: list[Any], last: Mapping[GroupKey, Entry], path: Path, seq_key: str, seen: _Seen
) -> dict[GroupKey, dict[int, Frame | None]]:
    """Per group, where its last collectives were called: the last one (``last``), and up to :data:`CALLS_KEPT`
    found among the dump's newest entries (twice that many per group, from the end: a look back bounded by the
    groups, not by the buffer). The entries' other fields were checked by :func:`_scan`."""
    calls = {key: {entry.seq: entry.where} for key, entry in last.items()}
    open_keys = set(calls)
    stop = max(0, len(entries) - 2 * CALLS_KEPT * len(calls))
    for index in range(len(entries) - 1, stop - 1, -1):
        if not open_keys:
            break
        raw = entries[index]
        flag = raw.get("is_p2p")
        if flag is True or (flag is None and _is_p2p(raw, seq_key)) or not raw[seq_key]:
            continue
        key = (raw["process_group"][0], op_name(raw["profiling_name"])[0])
        kept = calls.get(key)
        if kept is None or key not in open_keys or raw[seq_key] in kept:
            continue
        if len(kept) >= CALLS_KEPT:
            open_keys.discard(key)
            continue
        try:
            kept[raw[seq_key]] = _call_site(raw, seen)
        except ValueError:
            raise _bad_entry(path, index, raw, seq_key) from None
    return calls


# --- one dump ------------------------------------------------------------------------------------------------------


def _members(
    raw: Mapping[str, Any], rank: int, sidecar: Mapping[str, Any], path: Path, scan: _Scan, p2p_groups: set[str]
) -> tuple[dict[str, dict[str, Any]], range | tuple[int, ...] | None]:
    """Each group's members (the shim's map, in the dump or else the sidecar; torch's ``pg_config``; then the
    entries), and the default group's members as a record lists them (never from the entries alone)."""
    shim = raw.get("nemo_rl_shim") or {}
    if shim.get("groups"):
        groups = groups_from_map(shim["groups"], f"{path}: nemo_rl_shim.process_groups.registry")
    else:  # checked as it was read (read_sidecar); copied, since the entries add members below
        groups = {name: dict(facts) for name, facts in (sidecar.get("groups") or {}).items()}
    for name, facts in _groups_from_pg_config(raw.get("pg_config") or {}, rank, path).items():
        groups.setdefault(name, facts)
    listed = _default_ranks(groups)
    for name in {*scan.descs, *p2p_groups}:
        facts = groups.setdefault(name, {"axes": [], "ranks": (), "desc": ""})
        if rank not in facts["ranks"]:
            facts["ranks"] = tuple(sorted([*facts["ranks"], rank]))
    for name, desc in scan.descs.items():
        if not groups[name].get("desc"):
            groups[name]["desc"] = str(desc)[:200]
    return groups, listed


def _rank(raw: Mapping[str, Any], name_rank: int, sidecar: Mapping[str, Any], path: Path) -> int:
    """The rank the file name gives, checked against the one the dump states."""
    for stated in (raw.get("rank"), (raw.get("nemo_rl_shim") or {}).get("rank"), sidecar.get("rank")):
        if stated is not None and stated != name_rank:
            raise DumpError(f"{path}: the dump says it is rank {_shown(stated)}, its file name says rank {name_rank}")
    return name_rank


def summarize(
    path: Path, name_rank: int, sidecar: Mapping[str, Any] | None = None, keep: list | None = None
) -> RankDump:
    """Read one dump and reduce it (see the module docstring); its entries are not kept (``keep``: a list to
    hold the raw dump instead of freeing it, for a reader process that ends without freeing)."""
    raw = read_dump(path)
    if keep is not None:
        keep.append(raw)
    side = sidecar or {}
    shim = raw.get("nemo_rl_shim") or {}
    rank = _rank(raw, name_rank, side, path)
    entries = raw["entries"]
    seq_key = "seq_id" if entries and isinstance(entries[0], dict) and "seq_id" in entries[0] else "collective_seq_id"
    scan = _scan(entries, path, seq_key)
    seen: _Seen = {}
    p2p = _p2p([_checked_entry(path, index, item, seq_key, seen) for index, item in scan.p2p])
    groups, default_ranks = _members(raw, rank, side, path, scan, {key[0][0] for key in p2p.count})
    last = {key: _checked_entry(path, index, item, seq_key, seen) for key, (index, item) in scan.last.items()}
    world_size = shim.get("world_size") or side.get("world_size")
    newest = _checked_entry(path, len(entries) - 1, entries[-1], seq_key, seen) if entries else None
    return RankDump(
        rank=rank,
        path=path,
        version=str(raw.get("version", ""))[:40],
        n_entries=len(entries),
        groups=groups,
        last=last,
        signatures={key: (scan.seqs[key], scan.sig_ids[key]) for key in scan.seqs},
        sig_table=sorted(scan.table, key=scan.table.__getitem__),
        pending_p2p=p2p.pending,
        p2p_last=p2p.newest,
        p2p_count=p2p.count,
        latest=newest,
        recorders=_recorders(raw, entries, scan, path),
        calls=_recent_calls(entries, last, path, seq_key, seen),
        pg_status=dict(raw.get("pg_status") or {}),
        world_size=world_size,
        default_ranks=default_ranks,
        reason=shim.get("reason"),
        dump_time_ns=shim.get("dump_time_ns"),
        writer="nemo_rl_shim" if shim else "torch",
        backend=",".join(sorted({e.lib for e in [*last.values(), *p2p.newest.values(), *p2p.pending]} - {""})),
    )


def pg_status_of(dump: RankDump, entry: Entry) -> Any:
    """What ``pg_status`` holds for ``entry``'s group: keyed by ``pg_id`` as torch writes it, or by recorder and
    ``pg_id`` where the shim joined several recorders (their ids overlap)."""
    status = dump.pg_status.get(PG_STATUS_KEY.format(backend=entry.lib, pg_id=entry.pg_id))
    return status if status is not None else dump.pg_status.get(entry.pg_id)
