"""Reading a folder of Flight Recorder dumps, one per rank, into what the analysis needs of each.

A dump is the pickle torch writes (``version``, ``pg_config``, ``pg_status``, ``entries``, key for key
as ``FlightRecorderDetail.hpp`` writes them): NCCL's watchdog on a timeout, a user's
``_dump_fr_trace_file`` on Gloo, or :mod:`nemo_rl_shim.flight_recorder`, which adds ``rank`` and
``nemo_rl_shim`` (world size, group map, reason, dump time). The group map also comes from the
sidecars written at set-up (:data:`~nemo_rl_shim.flight_recorder.SIDECAR_NAME`).

* **Where.** The folder and every subfolder (dumps gathered per node), as torch's own loader walks
  them. The file names: the shim's (:data:`~nemo_rl_shim.flight_recorder.DUMP_FILE_NAME`), the prefix
  in ``TORCH_FR_DUMP_TEMP_FILE`` (or its older name), torch's default (``nccl_trace_rank_``), or the
  one prefix that every ``<prefix><rank>`` file shares.
* **Formats.** Keys are read by presence, not by the ``version`` field alone: torch 2.9 to 2.15 write
  ``"2.10"`` or lower; older dumps lack ``pg_status``, ``is_p2p``, ``retired`` and the ``p2p_seq_id``.
  The versions found are kept per rank; mixed versions are read alike.
* **Memory.** A dump is reduced to a :class:`RankDump` as it is read, and its entries dropped: per
  process group the last collective it entered, a signature (op and sizes) per sequence number,
  and its unfinished point-to-point ops. Many dumps are read by forked processes, a chunk of files each,
  which end without freeing what they read (freeing costs a third of reading).
* **Groups.** Members come from the shim's map and sidecars, torch's ``pg_config`` where it names a
  group this rank is in (Gloo's keeps one group under ``''`` with the wrong ranks: never trusted),
  and the entries (a rank that recorded a group's op is its member).
"""

from __future__ import annotations

import array
import ast
import functools
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.error_line import first_line
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, ENV_PAIRS, SIDECAR_NAME, TORCH_DEFAULT_PREFIX

__all__ = ["DumpError", "Entry", "RankDump", "dump_prefixes", "find_dumps", "load_dumps", "read_raw", "summarize"]

_DUMP_NAME = re.compile(r"^(?P<prefix>[^.].*?)(?P<rank>\d+)$")
_SIDECAR = re.compile("^" + re.escape(SIDECAR_NAME).replace(re.escape("{rank}"), r"(?P<rank>\d+)") + "$")
#: Below this many files one process reads them all; above, a pool of up to :data:`MAX_READERS` does.
PARALLEL_FROM = 32
MAX_READERS = 8
#: Files per reader process.
CHUNK = 64
MIN_CHUNK = 16
_DONE = "completed"
_P2P_OPS = ("send", "recv")


class DumpError(ValueError):
    """A folder or file that cannot be read as rank dumps; the message is the one line to print."""


@dataclass(slots=True)
class Entry:
    """One collective or point-to-point op of one rank, as the analysis needs it."""

    group: str
    seq: int  # collective_seq_id; for p2p, p2p_seq_id
    op: str  # "all_reduce", "send", "recv", "coalesced", ...
    sizes: str  # input sizes as text (sizes_text)
    state: str  # "scheduled", "started", "completed"
    created_ns: int
    completed_ns: int | None
    timeout_ms: int | None
    pg_id: str
    is_p2p: bool = False
    peer: int | None = None  # p2p: the peer's rank in the group, as torch names it ("send 1->0": 0)
    batched: bool = False  # p2p: one op of a batch_isend_irecv (its state is its nccl:coalesced entry's)

    @property
    def done(self) -> bool:
        """Whether the entry itself says it finished: its state, or a completion time."""
        return self.state == _DONE or self.completed_ns is not None


@dataclass
class RankDump:
    """One rank's dump, reduced: groups, the last collective per group, signatures, unfinished p2p ops."""

    rank: int
    path: Path
    version: str
    n_entries: int
    groups: dict[str, dict[str, Any]]
    last: dict[str, Entry]  # group -> the collective with the highest sequence number
    signatures: dict[str, tuple[array.array, array.array]]  # group -> (numbers, signature ids); dropped once merged
    sig_table: list[tuple[str, str]]  # signature id -> (profiling name, sizes text)
    pending_p2p: list[Entry]
    p2p_last: dict[tuple[str, str, int | None], Entry]  # (group, "send"/"recv", peer) -> the newest such op
    latest: Entry | None  # the newest entry: what the rank was in, or did last, when it dumped
    oldest_ns: int | None  # the oldest entry's creation time: how far back the buffer reaches
    wrapped: bool  # the oldest entry is not the recorder's first (record_id > 0): older ones were overwritten
    tracks_completion: bool  # NCCL marks entries completed; Gloo leaves every one 'scheduled'
    pg_status: dict[str, Any] = field(default_factory=dict)
    world_size: int | None = None
    reason: str | None = None
    dump_time_ns: int | None = None
    writer: str = "torch"
    backend: str = ""  # "nccl", "gloo", ... from the op names


def _version(raw: Mapping[str, Any]) -> str:
    return str(raw.get("version", ""))


def _op_name(profiling_name: str) -> tuple[str, str, int | None]:
    """``"nccl:send 1->0"`` -> ``("nccl", "send", 0)``; ``"gloo:all_reduce"`` -> ``("gloo", "all_reduce", None)``."""
    backend, _, rest = profiling_name.partition(":")
    if not rest:
        backend, rest = "", profiling_name
    op, _, where = rest.partition(" ")
    peer = None
    for arrow in ("->", "<-"):
        if arrow in where:
            with_peer = where.split(arrow, 1)[1]
            peer = int(with_peer) if with_peer.isdigit() else None
    return backend, op, peer


_BRACKETS = str.maketrans("()", "[]")


def sizes_text(sizes: Any) -> str:
    """Input sizes as one comparable text, lists or tuples alike: ``((3, 4),)`` and ``[[3, 4]]`` -> ``[[3, 4]]``."""
    return str(sizes).translate(_BRACKETS).replace(",]", "]")


def _entry(raw: Mapping[str, Any]) -> tuple[str, Entry]:
    backend, op, peer = _op_name(str(raw.get("profiling_name", "?")))
    group = raw.get("process_group") or ("",)
    p2p_seq = int(raw.get("p2p_seq_id") or 0)
    coll_seq = int(raw.get("collective_seq_id", raw.get("seq_id", 0)) or 0)
    # torch before 2.4 has no is_p2p: a send or recv, or a coalesced op without a collective number, is p2p
    is_p2p = bool(raw["is_p2p"]) if "is_p2p" in raw else (op in ("send", "recv") or (coll_seq == 0 and p2p_seq > 0))
    entry = Entry(
        group=str(group[0]),
        seq=p2p_seq if is_p2p else coll_seq,
        op=op,
        sizes=sizes_text(raw.get("input_sizes", ())),
        state=str(raw.get("state", "scheduled")),
        created_ns=int(raw.get("time_created_ns") or 0),
        completed_ns=raw.get("time_discovered_completed_ns"),
        timeout_ms=raw.get("timeout_ms"),
        pg_id=str(raw.get("pg_id", "")),
        is_p2p=is_p2p,
        peer=peer,
    )
    return backend, entry


def _resolve_batches(p2p: list[Entry]) -> list[Entry]:
    """Per-op entries of a batch stay 'scheduled'; the batch's ``coalesced`` entry (same group and p2p
    number) carries its state. Returns the unfinished ops, each with the state of its batch."""
    closers = {(e.group, e.seq): e for e in p2p if e.op.endswith("coalesced")}
    pending = []
    for e in p2p:
        if e.op.endswith("coalesced"):
            continue
        closer = closers.get((e.group, e.seq))
        if closer is not None:
            e.batched, e.state, e.completed_ns = True, closer.state, closer.completed_ns
        if not e.done:
            pending.append(e)
    return pending


def compact_ranks(ranks: Iterable[int]) -> range | tuple[int, ...]:
    """``ranks`` as a ``range`` where they step evenly (a mesh axis's group: pickled in a few bytes, compared at
    once), else as a tuple; order kept (torch lists a group's ranks in group-rank order)."""
    ranks = tuple(ranks)
    if len(ranks) > 1 and (step := ranks[1] - ranks[0]) > 0:
        candidate = range(ranks[0], ranks[-1] + 1, step)
        if len(candidate) == len(ranks) and tuple(candidate) == ranks:
            return candidate
    return ranks


@functools.lru_cache(maxsize=4096)
def _parse_ranks(text: str) -> range | tuple[int, ...] | None:
    """torch writes a group's ranks as ``"[0, 1, 2]"``: JSON, read in C; a cache, since every rank lists the same."""
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
    try:
        return compact_ranks(int(r) for r in value)
    except (TypeError, ValueError):
        return None


def _groups_from_pg_config(pg_config: Mapping[str, Any], rank: int) -> dict[str, dict[str, Any]]:
    """torch's ``pg_config``, where a group is named and this rank is among its ranks (Gloo's ``''`` never is)."""
    groups = {}
    for name, facts in pg_config.items():
        if not name or not isinstance(facts, Mapping):
            continue
        ranks = facts.get("ranks", "[]")
        ranks = _parse_ranks(ranks) if isinstance(ranks, str) else compact_ranks(ranks)
        if ranks is not None and rank in ranks:
            groups[str(name)] = {"axes": [], "ranks": ranks, "desc": str(facts.get("desc", ""))}
    return groups


def read_raw(path: Path) -> dict[str, Any]:
    """The pickle as torch wrote it; :class:`DumpError` naming the file when it is not a dump."""
    was_enabled = gc.isenabled()
    gc.disable()  # as torch's loader does: unpickling many small dicts otherwise runs the collector again and again
    try:
        with open(path, "rb") as handle:
            data = pickle.load(handle)
    except Exception as e:  # truncated, not a pickle, a pickle of something else: one line, exit 2
        raise DumpError(f"{path} is not a readable flight-recorder dump: {first_line(e)}") from e
    finally:
        if was_enabled:
            gc.enable()
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise DumpError(f"{path} is not a flight-recorder dump: no 'entries' list (got {type(data).__name__})")
    return data


@dataclass
class _Scan:
    """What one pass over a dump's entries keeps: per group the numbers and signatures, the last collective,
    every p2p entry, and the descriptions."""

    seqs: dict[str, array.array] = field(default_factory=dict)
    sig_ids: dict[str, array.array] = field(default_factory=dict)
    table: dict[tuple[str, str], int] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)
    p2p: list[dict[str, Any]] = field(default_factory=list)
    descs: dict[str, str] = field(default_factory=dict)
    tracks: bool = False


def _is_p2p(raw: Mapping[str, Any]) -> bool:
    """torch before 2.4 writes no ``is_p2p``: a send or recv, or an op without a collective number, is p2p."""
    _, op, _ = _op_name(str(raw.get("profiling_name", "")))
    return op in _P2P_OPS or (not raw.get("collective_seq_id", raw.get("seq_id")) and bool(raw.get("p2p_seq_id")))


def _scan(entries: list[dict[str, Any]]) -> _Scan:
    """One lean pass: at 2,000 entries a rank and thousands of ranks, every step per entry counts (a signature's
    text is made only when an entry's name or sizes differ from the group's previous entry)."""
    scan = _Scan()
    seq_key = "collective_seq_id" if not entries or "collective_seq_id" in entries[0] else "seq_id"
    previous: dict[str, tuple[Any, Any, int]] = {}  # group -> (name, sizes, signature id) of its last entry
    table, all_seqs, all_ids, last, p2p_entries = scan.table, scan.seqs, scan.sig_ids, scan.last, scan.p2p
    tracks = False
    for raw in entries:
        group = raw["process_group"][0]
        if not tracks and raw.get("state") != "scheduled":
            tracks = True
        p2p = raw.get("is_p2p")
        if p2p or (p2p is None and _is_p2p(raw)):
            p2p_entries.append(raw)
            continue
        seq = raw.get(seq_key) or 0
        if seq <= 0:
            continue
        name, sizes = raw["profiling_name"], raw.get("input_sizes")
        seqs = all_seqs.get(group)
        if seqs is None:
            pg = raw["process_group"]
            seqs = all_seqs[group] = array.array("q")
            all_ids[group] = array.array("q")
            scan.descs[group] = pg[1] if len(pg) > 1 else ""
        before = previous.get(group)
        if before is not None and before[0] == name and before[1] == sizes:
            sig = before[2]
        else:
            sig = table.setdefault((name, sizes_text(sizes)), len(table))
            previous[group] = (name, sizes, sig)
        if seqs and seqs[-1] == seq:  # one op of a coalesced collective: they share its number
            _coalesce(scan, group, raw, name, sizes)
            continue
        seqs.append(seq)
        all_ids[group].append(sig)
        last[group] = raw
    scan.tracks = tracks
    for raw in p2p_entries:
        pg = raw["process_group"]
        scan.descs.setdefault(pg[0], pg[1] if len(pg) > 1 else "")
    return scan


def _coalesce(scan: _Scan, group: str, raw: dict[str, Any], name: str, sizes: Any) -> None:
    """A further entry under the group's last number: the closer (``..._coalesced``, which carries the state)
    or one more op of the coalesced collective, joined into its signature."""
    if name.endswith("coalesced"):
        scan.last[group] = raw
        return
    ids = scan.sig_ids[group]
    first = next(k for k, i in scan.table.items() if i == ids[-1])
    ids[-1] = scan.table.setdefault((f"{first[0]}+{name}", f"{first[1]}; {sizes_text(sizes)}"), len(scan.table))


def summarize(
    path: Path, name_rank: int, sidecar: Mapping[str, Any] | None = None, keep: list | None = None
) -> RankDump:
    """Read one dump and reduce it (see the module docstring); its entries are not kept (``keep``: a list to
    hold the raw dump instead of freeing it, for a reader process that ends without freeing)."""
    raw = read_raw(path)
    if keep is not None:
        keep.append(raw)
    shim = raw.get("nemo_rl_shim") or {}
    rank = int(raw.get("rank", name_rank))
    side = sidecar or {}
    entries = raw.get("entries") or []
    scan = _scan(entries)
    p2p = [_entry(item)[1] for item in scan.p2p]
    groups = shim.get("groups") or side.get("groups") or {}
    groups = {str(k): {**v, "ranks": compact_ranks(v.get("ranks") or ())} for k, v in groups.items()}
    for name, facts in _groups_from_pg_config(raw.get("pg_config") or {}, rank).items():
        groups.setdefault(name, facts)
    for name in {*scan.seqs, *(e.group for e in p2p)}:
        facts = groups.setdefault(name, {"axes": [], "ranks": (), "desc": ""})
        if rank not in facts["ranks"]:
            facts["ranks"] = tuple(sorted([*facts["ranks"], rank]))
    for name, desc in scan.descs.items():
        if name in groups and not groups[name].get("desc"):
            groups[name]["desc"] = str(desc)
    first, newest = (entries[0], entries[-1]) if entries else ({}, None)
    return RankDump(
        rank=rank,
        path=path,
        version=_version(raw),
        n_entries=len(entries),
        groups=groups,
        last={group: _entry(item)[1] for group, item in scan.last.items()},
        signatures={group: (scan.seqs[group], scan.sig_ids[group]) for group in scan.seqs},
        sig_table=sorted(scan.table, key=scan.table.__getitem__),
        pending_p2p=_resolve_batches(p2p),
        p2p_last={(e.group, e.op, e.peer): e for e in sorted(p2p, key=lambda e: e.created_ns) if e.op in _P2P_OPS},
        latest=_entry(newest)[1] if newest is not None else None,
        oldest_ns=int(first.get("time_created_ns") or 0) if entries else None,
        wrapped=int(first.get("record_id", 0) or 0) > 0,
        tracks_completion=scan.tracks,
        pg_status=dict(raw.get("pg_status") or {}),
        world_size=shim.get("world_size") or side.get("world_size"),
        reason=shim.get("reason"),
        dump_time_ns=shim.get("dump_time_ns"),
        writer="nemo_rl_shim" if shim else "torch",
        backend=",".join(
            sorted({_op_name(str(e.get("profiling_name", "")))[0] for e in [*scan.last.values(), *scan.p2p]} - {""})
        ),
    )


def dump_prefixes(environ: Mapping[str, str] | None = None) -> list[str]:
    """Dump-file prefixes, the first found wins: the shim's, ``TORCH_FR_DUMP_TEMP_FILE``'s, torch's default."""
    env = os.environ if environ is None else environ
    named = [Path(env[name]).name for name in ENV_PAIRS["dump_file"] if env.get(name)]
    return list(dict.fromkeys([DUMP_FILE_NAME, *named, Path(TORCH_DEFAULT_PREFIX).name]))


def _walk(directory: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return files


def _choose_prefix(names: Iterable[str], directory: Path, environ: Mapping[str, str] | None) -> str:
    found = {m["prefix"] for name in names if (m := _DUMP_NAME.match(name)) and not _SIDECAR.match(name)}
    for prefix in dump_prefixes(environ):
        if prefix in found:
            return prefix
    if not found:
        raise DumpError(f"{directory} holds no flight-recorder dumps (files named <prefix><rank>)")
    if len(found) > 1:
        raise DumpError(
            f"{directory} holds dumps under several prefixes ({', '.join(sorted(found))}); keep one run per folder"
        )
    return next(iter(found))


def find_dumps(
    directory: str | Path, environ: Mapping[str, str] | None = None
) -> tuple[dict[int, Path], dict[int, dict[str, Any]]]:
    """``({rank by file name: dump path}, {rank: sidecar})`` in ``directory`` and its subfolders."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{directory} is not a directory")
    files = _walk(directory)
    sidecars: dict[int, dict[str, Any]] = {}
    for path in files:
        if m := _SIDECAR.match(path.name):
            try:
                sidecars[int(m["rank"])] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise DumpError(f"{path} is not a readable group map: {first_line(e)}") from e
    prefix = _choose_prefix((p.name for p in files), directory, environ)
    dumps: dict[int, Path] = {}
    for path in files:
        m = _DUMP_NAME.match(path.name)
        if not m or m["prefix"] != prefix:
            continue
        rank = int(m["rank"])
        if rank in dumps:
            raise DumpError(f"rank {rank} has two dumps, {dumps[rank]} and {path}: keep one run per folder")
        dumps[rank] = path
    return dumps, sidecars


def _readers(count: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_READERS, count // PARALLEL_FROM))


def _read_chunk(jobs: list[tuple[Path, int, dict[str, Any] | None]], conn: Any) -> None:
    """A reader process: summarize ``jobs``, send them, and end without freeing what it read (freeing a dump's
    hundred thousand small objects costs a third of reading it)."""
    gc.disable()
    kept: list[Any] = []
    try:
        conn.send(("ok", [summarize(*job, keep=kept) for job in jobs]))
    except DumpError as e:
        conn.send(("error", str(e)))
    except BaseException as e:  # any other failure still reaches the parent as one line
        conn.send(("error", f"reading {jobs[0][0].parent}: {first_line(e)}"))
    finally:
        conn.close()
        os._exit(0)


def _read_in_processes(jobs: list[tuple[Path, int, dict[str, Any] | None]], readers: int) -> Iterator[RankDump]:
    """Chunks of up to :data:`CHUNK` files, each read by a forked process, ``readers`` at a time, as they end."""
    # fork: the readers need nothing but this module, already imported (a fresh interpreter would import torch)
    context = multiprocessing.get_context("fork")
    size = max(MIN_CHUNK, min(CHUNK, len(jobs) // (readers * 4)))
    chunks = deque(jobs[i : i + size] for i in range(0, len(jobs), size))
    running: dict[Any, Any] = {}
    try:
        while chunks or running:
            while chunks and len(running) < readers:
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_read_chunk, args=(chunks.popleft(), send), daemon=True)
                process.start()
                send.close()
                running[receive] = process
            for conn in multiprocessing.connection.wait(list(running)):
                process = running.pop(conn)
                try:
                    status, payload = conn.recv()
                except EOFError:
                    raise DumpError(f"a reader process ended with {process.exitcode} before sending") from None
                finally:
                    conn.close()
                    process.join()
                if status != "ok":
                    raise DumpError(payload)
                yield from payload
    finally:
        for process in running.values():
            process.kill()


def load_dumps(directory: str | Path, environ: Mapping[str, str] | None = None) -> Iterator[RankDump]:
    """Every rank's dump in ``directory`` (and subfolders), reduced, as each is read; :class:`DumpError` when
    the folder or a file cannot be read. Many files are read by forked processes, a chunk each."""
    paths, sidecars = find_dumps(directory, environ)
    jobs = [(path, rank, sidecars.get(rank)) for rank, path in sorted(paths.items())]
    readers = _readers(len(jobs))
    if readers == 1:
        yield from (summarize(*job) for job in jobs)
        return
    yield from _read_in_processes(jobs, readers)
