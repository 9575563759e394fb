"""torch's Flight Recorder, switched on from ``nemo_rl_shim.flight_recorder``, and a dump when a collective times out.

With the recorder on, every rank keeps its last ``buffer_size`` collectives (group, op, sizes,
sequence number, when it entered) and writes them to ``<dump_dir>/fr_trace_rank_<rank>`` when a
collective times out. ``nemo-rl-shim hang-report DIR`` reads every rank's file and names the rank
that did not join.

* :func:`configure` sets torch's variables before ``init_process_group`` (``setup_distributed``
  calls it), never one the user set: ``TORCH_FR_BUFFER_SIZE``, ``TORCH_FR_DUMP_TEMP_FILE`` and
  ``TORCH_NCCL_DUMP_ON_TIMEOUT`` (and the older names torch 2.9-2.11 also read,
  ``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; torch 2.15 also reads
  ``TORCH_FR_DUMP_ON_TIMEOUT``). A variable of a pair that the user set keeps the pair as it is.
  Off (the default) sets nothing: torch's own default stands (torch 2.11 and later record 2,000
  entries per rank anyway, Gloo's included; torch 2.9 and 2.10 record nothing), and nothing dumps.
* Under NCCL, torch writes the dump itself on a timeout, to the same file name: stock NCCL's watchdog, or in
  torch 2.15 (plain ``"nccl"`` is ``ProcessGroupNCCL2``) the ``FlightRecorderHook`` torch attaches to each group,
  when the backend aborts. :func:`dump_now` writes every recorder of the rank (see its docstring).
* Under Gloo torch writes nothing. The shim dumps where it runs collectives (the barrier
  before changing timeouts in :mod:`nemo_rl_shim.timeouts`; preflight's checks) through
  :func:`dump_on_timeout`, which a training loop can use the same way. The rank that caught the
  error also asks its peers, through the default group's store, to dump too: each rank runs a
  small watcher thread (:func:`record_groups` starts it) that dumps when asked, so a rank stuck
  outside any collective still leaves its file.
* **Where a rank is.** :func:`dump_on_timeout` also watches its block (:func:`stack_watch` does only
  that): a rank still inside it once the default group's timeout plus :data:`STACK_GRACE_S` have passed
  writes every thread's Python stack to ``fr_stack_rank_<rank>.txt`` beside its dump, through
  faulthandler's C watchdog (:mod:`nemo_rl_shim.flight_recorder.stack_watchdog`), which needs no GIL: a rank stuck in a
  C call that holds it, whose watcher thread cannot dump, still says where it is.
* Each dump is torch's own format (the pickle ``_dump_fr_trace`` returns, as NCCL's watchdog
  writes it), with two keys added: ``rank`` and ``nemo_rl_shim`` (the world size, the reason,
  the dump time, and the map from process-group name, as it appears in the trace entries, to the
  ranks of that group and the mesh axes it serves: every group torch holds on the rank when it dumps, those
  made after set-up included, :mod:`nemo_rl_shim.flight_recorder.groups`). Where Gloo leaves ``pg_config`` keyed
  by an empty name, it is filled from the same map, so that torch's own analyzer can match the groups. Beside each
  dump, ``fr_groups_rank_<rank>.json`` holds the same map, for NCCL dumps that torch writes without it: written at
  set-up, and rewritten where the shim runs once torch holds other groups (:func:`refresh_sidecar`: on entering a
  watched block, and at every :func:`dump_now`).
* **Gloo's sends and receives.** torch's Gloo recorder writes none (G-NO-P2P in ``docs/recorder-semantics.md``):
  where the world has a Gloo backend, :func:`record_groups` starts the shim's log of them
  (:mod:`nemo_rl_shim.flight_recorder.p2p_log`), and each dump carries it under ``nemo_rl_shim["p2p"]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from nemo_rl_shim.config.settings import FlightRecorderSettings
from nemo_rl_shim.flight_recorder import p2p_log, stack_watchdog
from nemo_rl_shim.flight_recorder.groups import every_group, group_map, held_names
from nemo_rl_shim.flight_recorder.names import (
    DUMP_FILE_NAME,
    ENV_PAIRS,
    PG_STATUS_KEY,
    SIDECAR_NAME,
    TORCH_DEFAULT_PREFIX,
)
from nemo_rl_shim.process_groups.registry import backend_timeouts, group_backends

__all__ = [
    "PEER_DUMP_WAIT_S",
    "STACK_GRACE_S",
    "configure",
    "dump_now",
    "dump_on_timeout",
    "dump_path",
    "is_enabled",
    "record_groups",
    "refresh_sidecar",
    "request_peer_dumps",
    "stack_watch",
]

#: The default store key through which the first rank to time out asks every rank to dump.
_SIGNAL_KEY = "nemo_rl_shim/flight_recorder/dump"
_ANSWER_KEY = "nemo_rl_shim/flight_recorder/dumped"
_POLL_S = 0.5
#: How long the rank that asked waits for every rank's watcher to answer.
PEER_DUMP_WAIT_S = 5.0
#: How long past the default group's timeout a rank stays in a watched block before it writes its stack: peers
#: that waited in a collective since the block began time out at the timeout and leave before it. Short, since
#: a launcher ends the remaining ranks within seconds of the first failure (see docs/flight-recorder.md).
STACK_GRACE_S = 5.0


class _State:
    settings: FlightRecorderSettings | None = None
    groups: ClassVar[dict[str, dict[str, Any]]] = {}
    generation = 0
    lock = threading.Lock()
    dump_lock = threading.Lock()  # held by dump_now: the watcher thread and the main thread may dump at once
    stack_warned = False
    set_up_ns = 0
    #: The names of the groups torch held when the sidecar was last written (None: not written in this set-up).
    sidecar_names: tuple[str, ...] | None = None
    sidecar_warned = False


def is_enabled() -> bool:
    """Whether :func:`configure` switched the recorder on in this process."""
    return _State.settings is not None


def configure(settings: FlightRecorderSettings, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set torch's recorder variables for ``settings`` where the user set neither name; return what was set.

    Call before the first process group exists: torch reads the buffer size when it makes a recorder. Who reads
    what (torch 2.15's sources):

    * the buffer size, every recorder when it is made (``FlightRecorder``'s constructor: ``TORCH_FR_BUFFER_SIZE``,
      then ``TORCH_NCCL_TRACE_BUFFER_SIZE``): Gloo's at its first group, stock NCCL's at its first, and each hooked
      backend's (``nccl2``) when torch attaches the hook to a group, which it does only where the size is above 0
      (``_maybe_attach_flight_recorder``);
    * the dump on a timeout: stock NCCL reads ``TORCH_NCCL_DUMP_ON_TIMEOUT``; the hook ``TORCH_FR_DUMP_ON_TIMEOUT``,
      then ``TORCH_NCCL_DUMP_ON_TIMEOUT``, and dumps by default (it is on even where this function is not called);
    * the file, one writer per process for both (``DebugInfoWriter``): ``TORCH_FR_DUMP_TEMP_FILE``, then
      ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, ``<prefix><rank>``.

    So the three names set here (the first of each pair) reach stock NCCL, NCCL2 and Gloo alike. Where the user
    set ``TORCH_FR_DUMP_ON_TIMEOUT`` alone, its value is copied to ``TORCH_NCCL_DUMP_ON_TIMEOUT``, the only name
    stock NCCL reads: both backends then do what the user chose.
    """
    env = os.environ if environ is None else environ
    wanted = {
        "buffer_size": str(settings.buffer_size),
        "dump_file": str(Path(settings.dump_dir) / DUMP_FILE_NAME),
        "dump_on_timeout": "1",
    }
    applied = {}
    for what, names in ENV_PAIRS.items():
        if not any(name in env for name in names):
            env[names[0]] = applied[names[0]] = wanted[what]
    nccl_name, fr_name = ENV_PAIRS["dump_on_timeout"]
    if fr_name in env and nccl_name not in env:  # the user's choice, under the one name stock NCCL reads
        env[nccl_name] = applied[nccl_name] = env[fr_name]
    _State.settings = settings
    return applied


def dump_path(rank: int, environ: Mapping[str, str] | None = None) -> Path:
    """Where rank ``rank``'s dump goes: the dump-file prefix in effect (the user's, the shim's, or torch's) + rank."""
    env = os.environ if environ is None else environ
    prefix = next((env[name] for name in ENV_PAIRS["dump_file"] if env.get(name)), TORCH_DEFAULT_PREFIX)
    return Path(f"{prefix}{rank}")


def record_groups(context: Any) -> None:
    """Remember this rank's group map, write it beside the dump, clear a stale dump, and start the dump watcher.

    ``setup_distributed`` calls it once the meshes exist. Does nothing while the recorder is off.
    """
    if _State.settings is None:
        return
    rank = dist.get_rank()
    with _State.lock:
        _State.groups = group_map(context.device_mesh, context.moe_mesh)
        _State.generation += 1
        generation = _State.generation
    gloo = "gloo" in group_backends(dist.group.WORLD).values()
    # Gloo's groups enter the recorder as they are made (NCCL's only with their first collective): none there
    # means torch made its recorder, with no buffer, before configure() set the size.
    if gloo and not pickle.loads(torch._C._distributed_c10d._dump_fr_trace()).get("pg_config"):
        warnings.warn(
            "the Flight Recorder records nothing in this process: torch made it before TORCH_FR_BUFFER_SIZE was set "
            "(a process group existed before setup_distributed); set TORCH_FR_BUFFER_SIZE before the process starts",
            RuntimeWarning,
            stacklevel=3,
        )
    path = dump_path(rank)
    path.unlink(missing_ok=True)  # a dump from an earlier run must not be read as this one's
    stack_watchdog.forget(stack_watchdog.stack_path(path.parent, rank))  # nor a stack
    _State.set_up_ns = time.time_ns()
    with _State.lock:
        _write_sidecar(rank, every_group(_State.groups), held_names())
    if gloo:
        p2p_log.install()  # G-NO-P2P: Gloo's recorder writes no send or recv; the dump carries the shim's log
        threading.Thread(target=_watch, args=(generation,), name="nemo-rl-shim-fr-watcher", daemon=True).start()


def _write_sidecar(rank: int, groups: Mapping[str, Any], names: tuple[str, ...]) -> None:
    """Write ``fr_groups_rank_<rank>.json`` beside the dump (under ``_State.lock``); remember what it holds."""
    facts = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "groups": groups,
        "set_up_ns": _State.set_up_ns,
        "written_ns": time.time_ns(),
    }
    _write_atomically(dump_path(rank).parent / SIDECAR_NAME.format(rank=rank), json.dumps(facts, indent=1).encode())
    _State.sidecar_names = names


def refresh_sidecar(*, force: bool = False) -> bool:
    """Rewrite this rank's ``fr_groups_rank_<rank>.json`` with every group torch holds now, where a group was made
    (or destroyed) since it was last written, or always with ``force``; return whether it was written.

    Torch's own NCCL dumps do not list a group that this rank never ran an op on; the report reads its members from
    this file. The shim cannot see a group being made, so it refreshes the file where it runs: on entering
    :func:`dump_on_timeout` or :func:`stack_watch` (a comparison of the group names torch holds, a write only when
    they changed), and in :func:`dump_now`. Call it after making groups outside those, before collectives that may
    hang on them. Never raises (a warning, once, where the file cannot be written); does nothing while the recorder
    is off or before ``setup_distributed``.
    """
    if _State.settings is None or _State.set_up_ns == 0 or not dist.is_initialized():
        return False
    try:
        names = held_names()
        with _State.lock:
            if not force and names == _State.sidecar_names:
                return False
            _write_sidecar(dist.get_rank(), every_group(_State.groups), names)
        return True
    except Exception as e:  # a help to the report: it must never fail the code it runs in
        if not _State.sidecar_warned:
            _State.sidecar_warned = True
            warnings.warn(f"the group map beside the dump was not refreshed: {e}", RuntimeWarning, stacklevel=3)
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: written under a name of this process and thread, then moved there.
    Two writers of one path (a rank's watcher thread and its main thread, dumping at once: hang_truth seed 1002 of
    #42) each move a whole file; one partial name shared by both interleaved their bytes (one pickle, then the tail of
    the longer one) or moved the other's file away under it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


#: Backends that record into a Flight Recorder of their own, which :func:`_recorders` reads by its own call: Gloo
#: (the default recorder) and stock NCCL (``"nccl"`` before torch 2.15, ``"nccl-legacy"`` in 2.15). Every other
#: backend (torch 2.15's plain ``"nccl"``, whose backend is named ``nccl2``) is recorded by torch's
#: ``FlightRecorderHook`` into a recorder named after the backend.
_NATIVELY_RECORDED = frozenset({"gloo", "nccl"})


def _hooked_backends() -> list[str]:
    """The recorders torch 2.15's ``FlightRecorderHook`` fills in this process: one per backend of this process's
    groups that does not record natively, named as the hook names it (the backend's name, ``:`` made ``_``)."""
    names = set()
    for group in list(dist.distributed_c10d._world.pg_map):
        with contextlib.suppress(Exception):  # a group torch is tearing down
            names |= set(group_backends(group).values())
    return sorted(name.replace(":", "_") for name in names - _NATIVELY_RECORDED)


def _recorders() -> list[tuple[str, dict[str, Any]]]:
    """Each of this rank's recorders as torch dumps it: ``[(its name, its dump)]``, the default (Gloo's) first."""
    c10d = torch._C._distributed_c10d
    found = [("gloo", pickle.loads(c10d._dump_fr_trace()))]
    if torch.cuda.is_available() and hasattr(c10d, "_dump_nccl_trace"):
        with contextlib.suppress(Exception):  # no NCCL group, or a build without NCCL
            found.append(("nccl", pickle.loads(c10d._dump_nccl_trace())))
    for name in _hooked_backends():
        try:  # torch 2.15: one recorder per hooked backend (_dump_fr_trace(backend=)); before, no such recorder
            found.append((name, pickle.loads(c10d._dump_fr_trace(backend=name))))
        except TypeError:
            break
    return found


def _join(recorders: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One dump in torch's format from several recorders, and each one's facts (None where one alone holds entries:
    then the dump is that recorder's, as torch would have written it, its ``pg_config`` joined with the others').

    Each recorder numbers its entries (``record_id``), its groups' ops and its ``pg_id`` s by itself: the entries are
    joined in time order (each keeps its ``profiling_name``, ``<recorder>:<op>``, so the reader tells them apart),
    ``pg_status`` is keyed by :data:`PG_STATUS_KEY`, and each recorder's buffer facts (its oldest entry's
    ``record_id`` and time) are returned, since the joined entries no longer show where each buffer starts.
    """
    holding = [(name, trace) for name, trace in recorders if trace.get("entries")]
    config: dict[str, Any] = {}
    for _, trace in recorders:
        config.update(trace.get("pg_config") or {})
    if len(holding) <= 1:
        trace = dict((holding or recorders)[0][1])
        return {**trace, "pg_config": config}, None
    trace = dict(holding[0][1])
    entries = [entry for _, t in holding for entry in t["entries"]]
    trace["entries"] = sorted(entries, key=lambda e: e.get("time_created_ns") or 0)
    trace["pg_config"] = config
    trace["pg_status"] = {
        PG_STATUS_KEY.format(backend=name, pg_id=pg_id): status
        for name, t in holding
        for pg_id, status in (t.get("pg_status") or {}).items()
    }
    facts = {
        name: {
            "first_record_id": t["entries"][0].get("record_id", 0),
            "oldest_ns": t["entries"][0].get("time_created_ns"),
            "entries": len(t["entries"]),
        }
        for name, t in holding
    }
    return trace, facts


def _repair_pg_config(trace: dict[str, Any], groups: Mapping[str, Mapping[str, Any]]) -> None:
    """Gloo's ``pg_config`` holds one group under an empty name; key it by each group's name instead."""
    config = trace.get("pg_config") or {}
    if groups and (not config or "" in config):
        trace["pg_config"] = {
            name: {"name": name, "desc": facts["desc"], "ranks": str(facts["ranks"])} for name, facts in groups.items()
        }


def dump_now(reason: str, *, overwrite: bool = True) -> Path | None:
    """Write this rank's dump now (torch's pickle, plus ``rank`` and ``nemo_rl_shim``); return its path.

    Every recorder of this rank goes in: Gloo's, stock NCCL's (``nccl-legacy`` in torch 2.15), and in torch 2.15
    each hooked backend's (``nccl2``, plain ``"nccl"``'s backend), joined by :func:`_join`. Its group map is every
    group torch holds now, and the sidecar is rewritten with it first, even where the dump itself is not written.

    None when the recorder is off, or when ``overwrite`` is false and the file exists (torch's own
    NCCL dump, or an earlier timeout's: the first one is the telling one).
    """
    if _State.settings is None or not dist.is_initialized():
        return None
    with _State.dump_lock:  # one dump at a time in a process: "the first one stands" holds between its threads
        return _dump_now(reason, overwrite)


def _dump_now(reason: str, overwrite: bool) -> Path | None:
    rank = dist.get_rank()
    path = dump_path(rank)
    refresh_sidecar(force=True)  # for torch's own dump too, which this one does not overwrite
    if not overwrite and path.exists():
        return None
    groups = every_group(_State.groups)
    trace, recorders = _join(_recorders())
    as_torch_wrote_it = trace.get("pg_config")
    _repair_pg_config(trace, groups)
    trace["rank"] = rank
    trace["nemo_rl_shim"] = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "reason": reason,
        "dump_time_ns": time.time_ns(),
        "groups": groups,
        "writer": "nemo_rl_shim",
        "torch_pg_config": as_torch_wrote_it,  # before the repair, for comparing torch's analyzer on both
    }
    if recorders:
        trace["nemo_rl_shim"]["recorders"] = recorders
    p2p = p2p_log.snapshot()
    if p2p is not None:
        trace["nemo_rl_shim"]["p2p"] = p2p
    _write_atomically(path, pickle.dumps(trace))
    return path


def request_peer_dumps(reason: str, wait_s: float = PEER_DUMP_WAIT_S) -> int:
    """Ask every rank's watcher, through the default store, to dump now; return how many have.

    The first request stands. Its maker waits up to ``wait_s`` for every rank's watcher to answer,
    so that it does not end (rank 0 serves the store) before the others have read the request; a
    dead rank never answers, and costs the full wait.
    """
    if _State.settings is None or not dist.is_initialized():
        return 0
    try:  # a broken store must not hide the error being reported
        store = dist.distributed_c10d._get_default_store()
        request = json.dumps({"rank": dist.get_rank(), "reason": reason})
        stored = store.compare_set(_SIGNAL_KEY, "", request)
        if (stored.decode() if isinstance(stored, bytes) else stored) != request:
            return 0  # another rank asked first, and waits
        end = time.monotonic() + wait_s
        while (answered := int(store.add(_ANSWER_KEY, 0))) < dist.get_world_size() and time.monotonic() < end:
            time.sleep(0.1)
        return answered
    except Exception:
        return 0


def _watch(generation: int) -> None:
    """Dump when a peer asks (see :func:`request_peer_dumps`); end with the group or a newer set-up."""
    while _State.generation == generation and dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            if store.check([_SIGNAL_KEY]):
                asked = json.loads(store.get(_SIGNAL_KEY))
                dump_now(f"rank {asked['rank']} asked: {asked['reason']}", overwrite=False)
                store.add(_ANSWER_KEY, 1)
                return
        except Exception:  # the store went with the group (rank 0 ended): nothing left to watch
            return
        time.sleep(_POLL_S)


def _current_timeout_s() -> float:
    """The default group's timeout in seconds (its longest backend's); torch's default where it cannot be read."""
    try:
        return max(t.total_seconds() for t in backend_timeouts(dist.group.WORLD).values())
    except Exception:  # a backend without readable options: torch's own default for the group stands
        return dist.default_pg_timeout.total_seconds()


def _arm_stack(what: str, grace_s: float) -> int | None:
    """Arm this rank's stack watch for a block (None while the recorder is off or no group exists)."""
    if _State.settings is None or not dist.is_initialized():
        return None
    refresh_sidecar()  # a group made since the last block: torch's NCCL dumps need its members from the sidecar
    rank = dist.get_rank()
    path = stack_watchdog.stack_path(dump_path(rank).parent, rank)
    try:
        return stack_watchdog.arm(path, rank, what, _current_timeout_s() + grace_s)
    except OSError as e:  # a help to the report: it must never fail the step it watches
        if not _State.stack_warned:
            _State.stack_warned = True
            warnings.warn(f"no stack watch: {path} cannot be written ({e})", RuntimeWarning, stacklevel=4)
        return None


@contextlib.contextmanager
def stack_watch(what: str, *, grace_s: float = STACK_GRACE_S) -> Iterator[None]:
    """This rank's Python stack, written without the GIL to ``fr_stack_rank_<rank>.txt`` beside its dump, once
    the block has run longer than the default group's timeout plus ``grace_s``; leaving the block disarms it.

    The part of :func:`dump_on_timeout` that says where a rank is, for code that wants it alone. Does nothing
    while the recorder is off. See :mod:`nemo_rl_shim.flight_recorder.stack_watchdog`.
    """
    token = _arm_stack(what, grace_s)
    try:
        yield
    except BaseException:
        stack_watchdog.disarm(token, failed=True)
        raise
    stack_watchdog.disarm(token, failed=False)


@contextlib.contextmanager
def dump_on_timeout(what: str, *, stack_grace_s: float = STACK_GRACE_S) -> Iterator[None]:
    """Around collectives: on a torch.distributed error (a timeout, a peer gone), dump this rank, ask the
    others to dump, and re-raise. ``what`` names the place in the dump's reason.

    It also watches the block (:func:`stack_watch`): a rank still inside it after the default group's
    timeout plus ``stack_grace_s`` writes its Python stack, without the GIL, to ``fr_stack_rank_<rank>.txt``
    beside its dump, so that the report can say where a rank that never reached the collective is.

    Usage in a training loop::

        with dump_on_timeout("train step"):
            loss = train_step(batch)

    Does nothing while the recorder is off. Under NCCL torch dumps on a timeout by itself; an existing
    dump of this rank is never overwritten here.
    """
    token = _arm_stack(what, stack_grace_s)
    try:
        yield
    except RuntimeError as error:  # DistBackendError and Gloo's timeouts are RuntimeErrors
        stack_watchdog.disarm(token, failed=True)  # first: the waits below must not count as time in the block
        if _State.settings is not None:
            lines = str(error).strip().splitlines()
            reason = f"{what}: {type(error).__name__}: {lines[0] if lines else ''}"[:500]
            dump_now(reason, overwrite=False)
            request_peer_dumps(reason)
        raise
    except BaseException:
        stack_watchdog.disarm(token, failed=True)
        raise
    stack_watchdog.disarm(token, failed=False)
