"""Rank functions for tests/hang_report/test_hang_report_torch_gloo.py: torch's own recorder, Gloo ranks, no shim.

A user who switches the recorder on by hand (``TORCH_FR_BUFFER_SIZE``, ``TORCH_FR_DUMP_TEMP_FILE``)
and calls ``init_process_group`` and ``new_group`` directly, without ``setup_distributed``: each rank
makes one fault happen and then writes torch's own dump with
``torch._C._distributed_c10d._dump_fr_trace_file(rank)`` (``<TORCH_FR_DUMP_TEMP_FILE><rank>``; where a
torch lacks it, the bytes of ``_dump_fr_trace()`` to the same name). Nothing of the shim is in these
files: no ``rank`` key, no group map, Gloo's ``pg_config`` as torch keeps it.

Ranks meet at the end through a ``TCPStore`` of their own (a timed-out Gloo group stays broken), so
that rank 0, which serves it, leaves last. A rank that "never enters" sleeps in Python past its
peers' timeout, then dumps: the state it was in.
"""

from __future__ import annotations

import datetime
import inspect
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.ranks.meet import rank_0_leaves_last

__all__ = ["SCENARIOS", "run_scenario"]

_MEET_S = 120
#: Every group's timeout while it connects: Gloo's full mesh of 4 ranks took more than a 3 s scenario timeout with
#: two suites on 2 cores, and a rank failed before the scenario began. Each group gets the scenario's own, short,
#: timeout as soon as it is connected (:func:`_connected`), before its first collective.
_CONNECT_S = 120


def _timeout(params: dict[str, Any]) -> datetime.timedelta:
    return datetime.timedelta(seconds=params["timeout_s"])


def _connected(group: Any, params: dict[str, Any]) -> Any:
    """``group``, now connected, at the scenario's timeout (torch's setter reaches every backend of it); a group this
    rank is not in is returned as it is."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return group
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout  # set_timeout: torch 2.15
    setter(_timeout(params), group)
    return group


def _try(run: Callable[[], Any]) -> str:
    try:
        run()
    except RuntimeError as error:  # Gloo's timeouts and a closed peer are RuntimeErrors
        lines = str(error).strip().splitlines()
        return f"raised: {lines[0][:200] if lines else type(error).__name__}"
    return "completed"


def _new_group(ranks: list[int], params: dict[str, Any], desc: str | None = None) -> Any:
    """``new_group``, with ``group_desc`` where this torch takes one (torch then writes it in every entry)."""
    extra = {"group_desc": desc} if desc and "group_desc" in inspect.signature(dist.new_group).parameters else {}
    return _connected(dist.new_group(ranks, timeout=datetime.timedelta(seconds=_CONNECT_S), **extra), params)


def _stay_out(params: dict[str, Any], what: str = "never entered") -> str:
    """The stalled rank's part: stay out of the op until its peers' timeout and the grace have passed."""
    time.sleep(params["timeout_s"] + params["grace_s"])
    return what


def _sub_group_stall(params: dict[str, Any]) -> dict[str, Any]:
    """Groups {0, 1} and {2, 3} (described as ``tp``); rank 3 never enters the third all_reduce on {2, 3}."""
    rank = dist.get_rank()
    low = _new_group([0, 1], params, "tp")
    high = _new_group([2, 3], params, "tp")
    mine = low if rank < 2 else high
    out = {}
    for step in range(3):
        if rank == 3 and step == 2:
            out[f"step{step}"] = _stay_out(params)
            continue
        out[f"step{step}"] = _try(lambda: dist.all_reduce(torch.ones(4), group=mine))
    return out


def _mismatch(params: dict[str, Any]) -> dict[str, Any]:
    """Four ranks; in the second broadcast rank 2 passes 8 elements where the others pass 4 (Gloo completes it)."""
    del params
    out = {"step0": _try(lambda: dist.broadcast(torch.ones(4), src=0))}
    size = 8 if dist.get_rank() == 2 else 4
    out["step1"] = _try(lambda: dist.broadcast(torch.ones(size), src=0))
    return out


def _p2p_stall(params: dict[str, Any]) -> dict[str, Any]:
    """A pipeline 0 -> 1 -> 2 -> 3 of plain send/recv, 3 rounds; in the last, rank 2 never sends to rank 3."""
    rank, out = dist.get_rank(), {}
    for step in range(3):
        tensor = torch.ones(4)
        results = []
        if rank > 0:
            results.append(_try(lambda t=tensor: dist.recv(t, src=rank - 1)))
        if rank < 3:
            if rank == 2 and step == 2:
                results.append(_stay_out(params, "never sent"))
            else:
                results.append(_try(lambda t=tensor: dist.send(t, dst=rank + 1)))
        out[f"step{step}"] = "; ".join(results)
    return out


def _batched_p2p_stall(params: dict[str, Any]) -> dict[str, Any]:
    """A ring (ring attention's shape): batch_isend_irecv to the next rank and from the previous, 3 rounds;
    in the last, rank 2 never posts its batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for step in range(3):
        if rank == 2 and step == 2:
            out[f"step{step}"] = _stay_out(params)
            continue
        send, recv = torch.ones(4), torch.zeros(4)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]

        def run(ops: list[Any] = ops) -> None:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        out[f"step{step}"] = _try(run)
    return out


def _dead_rank(params: dict[str, Any]) -> dict[str, Any]:
    """tp {0, 1}, {2, 3} and dp {0, 2}, {1, 3}; rank 1 dies before the second tp all_reduce: rank 0 fails
    in it and never reaches the dp all_reduce, in which rank 2 then waits on it (the cascade)."""
    rank = dist.get_rank()
    tp = [_new_group(r, params, "tp") for r in ([0, 1], [2, 3])][rank // 2]
    dp = [_new_group(r, params, "dp") for r in ([0, 2], [1, 3])][rank % 2]
    out = {"tp0": _try(lambda: dist.all_reduce(torch.ones(4), group=tp))}
    out["dp0"] = _try(lambda: dist.all_reduce(torch.ones(4), group=dp))
    if rank == 1:
        os._exit(17)
    out["tp1"] = _try(lambda: dist.all_reduce(torch.ones(4), group=tp))
    if out["tp1"] == "completed":
        out["dp1"] = _try(lambda: dist.all_reduce(torch.ones(4), group=dp))
    return out


def _healthy(params: dict[str, Any]) -> dict[str, Any]:
    """Every rank through the same collectives and p2p; then ranks 0-1 run ``extra`` more all_reduces on their
    tp group, past the buffer size: the default group's entries wrap out of their buffers, not of ranks 2-3's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = [_new_group(r, params, "tp") for r in ([0, 1], [2, 3])][rank // 2]
    for _ in range(params.get("rounds", 3)):
        dist.all_reduce(torch.ones(4), group=tp)
        dist.all_reduce(torch.ones(4))
        send, recv = torch.ones(4), torch.zeros(4)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for _ in range(params.get("extra", 0) if rank < 2 else 0):
        dist.all_reduce(torch.ones(4), group=tp)
    return {"rounds": params.get("rounds", 3)}


def _crossed(params: dict[str, Any]) -> dict[str, Any]:
    """Every rank waits inside a collective, and no rank is idle: two groups of all four ranks, ``a`` and ``b``; the
    even ranks all_reduce on ``a`` then on ``b``, the odd ranks on ``b`` then on ``a``. Each waits for the other half
    in its first, times out, goes on to its second, and waits there again: every group ends with every rank at #1,
    each collective timed out (Gloo retires it, and counts it completed in ``pg_status``, as one that finished).

    After each, every rank waits on the store until all four are out of it: the ranks' timeouts end apart (CI saw
    it), and the half that left its first early would otherwise find the other half still waiting in the same group,
    and the second all_reduce would complete there; a rank that left its second early and ended would close the
    connections its peers still waited on."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()

    def all_out(what: str) -> None:
        store.set(f"crossed_{what}_{rank}", "1")
        store.wait([f"crossed_{what}_{r}" for r in range(world)], datetime.timedelta(seconds=_MEET_S))

    a, b = _new_group([0, 1, 2, 3], params, "a"), _new_group([0, 1, 2, 3], params, "b")
    first, second = (a, b) if rank % 2 == 0 else (b, a)
    out = {"first": _try(lambda: dist.all_reduce(torch.ones(4), group=first))}
    all_out("first")
    out["second"] = _try(lambda: dist.all_reduce(torch.ones(4), group=second))
    all_out("second")
    out["retired_after_s"] = _until_retired(_RETIRE_S)
    return out


#: How long a rank waits for Gloo's worker to retire the work whose exception it already saw (G-RETIRE in
#: docs/recorder-semantics.md: the worker retires it after ``execute`` returns, so the user thread can dump first;
#: CI caught one such dump on 2026-12-04).
_RETIRE_S = 20.0


def _until_retired(limit_s: float) -> float | None:
    """Seconds until every entry of this rank's recorder is retired, polled every 10 ms; None past ``limit_s``."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace()).get("entries", [])
        if all(e.get("retired") for e in entries):
            return round(time.monotonic() - start, 3)
        time.sleep(0.01)
    return None


SCENARIOS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "crossed": _crossed,
    "sub_group_stall": _sub_group_stall,
    "mismatch": _mismatch,
    "p2p_stall": _p2p_stall,
    "batched_p2p_stall": _batched_p2p_stall,
    "dead_rank": _dead_rank,
    "healthy": _healthy,
}


def _dump(rank: int) -> str:
    c10d = torch._C._distributed_c10d
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    if hasattr(c10d, "_dump_fr_trace_file"):  # torch 2.15; before it, the same bytes written here
        c10d._dump_fr_trace_file(rank)
    else:
        Path(f"{prefix}{rank}").write_bytes(c10d._dump_fr_trace())
    return f"{prefix}{rank}"


def _meeting_store(rank: int, world: int) -> Any:
    """A store of the ranks' own, served by rank 0 on a port it bound itself (port 0: no other process can take it
    between a pick and the bind), told to its peers through the default group's store."""
    rendezvous = dist.distributed_c10d._get_default_store()
    timeout = datetime.timedelta(seconds=_MEET_S)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=timeout, wait_for_workers=False)
        rendezvous.set("torch_fr_meet_port", str(store.port))
        return store
    port = int(rendezvous.get("torch_fr_meet_port"))
    return dist.TCPStore("127.0.0.1", port, world, False, timeout=timeout)


def run_scenario(params: dict[str, Any]) -> dict[str, Any]:
    """Init the default group (Gloo, ``timeout_s`` once connected), run ``params["scenario"]``, dump, meet, return
    what happened."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=_CONNECT_S))
    store = _meeting_store(rank, world)
    _connected(dist.group.WORLD, params)
    out: dict[str, Any] = {"rank": rank, "torch": torch.__version__}
    out.update(SCENARIOS[params["scenario"]](params))
    out["dump"] = _dump(rank)
    alive = world - (1 if params["scenario"] == "dead_rank" else 0)
    rank_0_leaves_last("done", _MEET_S, expected=alive, store=store)
    return out
