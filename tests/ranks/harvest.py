"""Rank side of ``tests/scripts/gpu_harvest.py``: one scenario's completed ops, then an all_reduce that cannot finish,
and the rank's end as soon as its Flight Recorder dump is complete.

**On a GPU** (NCCL, one rank, one GPU): the all_reduce is queued behind ``torch.cuda._sleep`` on the stream, so it
cannot finish before the group's short timeout. torch's NCCL watchdog times it out and writes the dump itself
(``TORCH_NCCL_DUMP_ON_TIMEOUT``, under ``TORCH_FR_DUMP_TEMP_FILE``). Meanwhile the rank's main thread, free since an
NCCL collective is queued without blocking the CPU, polls for the dump file and ends the process (``os._exit``) as
soon as the file holds a whole pickle (:func:`dump_complete`): it never waits for the sleep to end, nor for the
watchdog's abort. (On the lent H200, 2026-11, the rank outlived its 6 s watchdog's dump by over a minute: the held
collective finished when the GPU's 30 s sleep ended, then the watchdog aborted the process; 82 s a run.)

**On CPU** (the rehearsal, Gloo): Gloo cannot hold a collective behind a device (a one-rank Gloo collective
completes at once, on the CPU), so a second rank, the partner, stands in for the busy GPU: it runs the same completed
ops, then never enters the all_reduce. Rank 0's all_reduce times out (Gloo raises in the waiting thread; Gloo has no
dump on timeout), and rank 0 then writes its dump with torch's own function (:func:`write_own_dump`), standing in for
NCCL's watchdog, honouring ``TORCH_INCLUDE_ONLY_ACTIVE`` as NCCL's dump does. The partner writes its dump after its
last op. Rank 0 ends by the same poll as on a GPU.

The truth of a scenario (which op did not finish, on which group) is read from torch by the rank right after it
issued that op (:func:`newest_record`: the newest record of this process's own recorder, before anything could
finish or time out), never from the dump file the report reads. The rank writes it, and its timings, to
``params["facts"]`` (JSON); ``tests/scripts/gpu_harvest.py`` turns them into ``truth.json``.

Scenarios (:data:`SCENARIOS`): what runs before the held all_reduce (:data:`BEFORE`), where it is held (the world,
a ``split_group`` sub-group, a ``new_group``), and the environment torch reads (timing, only-active dumps). Nothing
here asserts: the driver and the fixture tests judge.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import pickletools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "BEFORE",
    "HELD_GROUP_DESC",
    "SCENARIOS",
    "CannotOnGloo",
    "Scenario",
    "dump_complete",
    "harvest_rank",
    "newest_record",
    "write_own_dump",
]

#: Every group's timeout while it connects and runs the completed ops; the held op gets the scenario's short one.
CONNECT_S = 120.0
#: How often the rank looks for its dump file.
POLL_S = 0.05
#: The description given to the sub-group a scenario holds its all_reduce on (torch writes it in every record).
HELD_GROUP_DESC = {"split_group": "harvest_split", "new_group": "harvest_new"}
_ELEMENTS = 1024


@dataclass
class _Rank:
    """What a scenario's ops need: this rank, its world, the device its tensors live on."""

    rank: int
    world: int
    device: torch.device
    ops: list[str] = field(default_factory=list)

    def ones(self, n: int = _ELEMENTS) -> torch.Tensor:
        return torch.ones(n, device=self.device)

    def done(self, what: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.ops.append(what)


def _collectives(r: _Rank) -> None:
    """Two all_reduces on the world."""
    for _ in range(2):
        dist.all_reduce(r.ones())
    r.done("all_reduce x2")


def _batch(r: _Rank) -> None:
    """A ``batch_isend_irecv`` that completes: a ring (on one rank, a send and a receive to itself)."""
    ops = [
        dist.P2POp(dist.isend, r.ones(), (r.rank + 1) % r.world),
        dist.P2POp(dist.irecv, torch.zeros(_ELEMENTS, device=r.device), (r.rank - 1) % r.world),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    r.done("batch_isend_irecv (isend, irecv)")


def _coalesced(r: _Rank) -> None:
    """An all_reduce, a coalesced batch of three all_reduces (``_coalescing_manager``: on NCCL with its device, as
    torch's own NCCL coalescing tests call it, so ProcessGroupNCCL's ``startCoalescing``/``endCoalescing`` batch them;
    Gloo implements no ``startCoalescing``, so there without a device: one ``allreduce_coalesced``), and a
    reduce-scatter as FSDP2's ``foreach_reduce`` issues it (``reduce_scatter_tensor`` of a flat gradient on a side
    stream that waits on the current one; ``ReduceOp.AVG`` on NCCL, as ``_get_gradient_divide_factors`` picks for fp32
    with more than one rank; SUM on Gloo, which has no AVG)."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    dist.all_reduce(r.ones())
    tensors = [r.ones(256) for _ in range(3)]
    with _coalescing_manager(device=r.device if r.device.type == "cuda" else None, async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    r.done("all_reduce, _coalescing_manager(all_reduce x3)")
    flat, out = r.ones(256 * r.world), torch.zeros(256, device=r.device)
    if r.device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dist.reduce_scatter_tensor(output=out, input=flat, op=dist.ReduceOp.AVG)
        torch.cuda.current_stream().wait_stream(stream)
    else:
        dist.reduce_scatter_tensor(output=out, input=flat, op=dist.ReduceOp.SUM)
    r.done("reduce_scatter_tensor (FSDP2's foreach_reduce)")


#: The completed ops a scenario can run before the held all_reduce, by name.
BEFORE: dict[str, Callable[[_Rank], None]] = {"collectives": _collectives, "batch": _batch, "coalesced": _coalesced}


@dataclass(frozen=True)
class Scenario:
    """One harvest: ``before`` (names in :data:`BEFORE`), then an all_reduce held on ``held_on`` (``"world"``,
    ``"split_group"``, ``"new_group"``), under ``env`` (what torch reads). ``backend``: the name given to
    ``init_process_group`` on a GPU (torch 2.15's ``"nccl"`` is NCCL2, ``"nccl-legacy"`` the stock one);
    ``needs_nccl2``: runs only where torch has NCCL2. ``gloo_cannot``: what the Gloo rehearsal cannot show of it
    (every rehearsal stands a partner rank in for the busy GPU); ``gloo_runs``: whether the rehearsal runs it."""

    name: str
    what: str
    before: tuple[str, ...]
    held_on: str = "world"
    env: Mapping[str, str] = field(default_factory=dict)
    backend: str = "nccl"
    needs_nccl2: bool = False
    gloo_cannot: str = ""
    gloo_runs: bool = True


_NO_P2P = "Gloo's recorder writes no record for send/recv, so the completed batch is not in its dumps"
_TIMING = "TORCH_NCCL_ENABLE_TIMING is NCCL's: Gloo's dumps are the same with it on"
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "held_after_batch",
            "two all_reduces and a batch_isend_irecv complete, then an all_reduce is held (the 2026-11 H200 run's "
            "shape); timing off",
            ("collectives", "batch"),
            gloo_cannot=_NO_P2P,
        ),
        Scenario(
            "held_after_batch_timing",
            "as held_after_batch, with TORCH_NCCL_ENABLE_TIMING=1 (records get 'started' and their start times)",
            ("collectives", "batch"),
            env={"TORCH_NCCL_ENABLE_TIMING": "1"},
            gloo_cannot=f"{_NO_P2P}; {_TIMING}",
        ),
        Scenario(
            "held_after_coalesced",
            "an all_reduce, a coalesced batch of all_reduces (_coalescing_manager) and an FSDP2-style "
            "reduce_scatter_tensor complete, then an all_reduce is held",
            ("coalesced",),
        ),
        Scenario(
            "held_only_active",
            "as held_after_batch, dumped with TORCH_INCLUDE_ONLY_ACTIVE=1 (completed records dropped)",
            ("collectives", "batch"),
            env={"TORCH_INCLUDE_ONLY_ACTIVE": "1"},
            gloo_cannot=_NO_P2P,
        ),
        Scenario(
            "held_on_split_group",
            "all_reduces complete on the world and on a split_group sub-group, then an all_reduce is held on the "
            "sub-group",
            ("collectives",),
            held_on="split_group",
            gloo_cannot="torch 2.11 splits only a default group bound to an accelerator (device_id); the rank tries",
        ),
        Scenario(
            "held_on_new_group",
            "all_reduces complete on the world and on a new_group, then an all_reduce is held on the new group",
            ("collectives",),
            held_on="new_group",
        ),
        Scenario(
            "held_after_batch_nccl2",
            "as held_after_batch on torch 2.15's plain 'nccl' (NCCL2, recorded by its FlightRecorderHook)",
            ("collectives", "batch"),
            backend="nccl",
            needs_nccl2=True,
            gloo_cannot="NCCL2 is NCCL's",
            gloo_runs=False,
        ),
        Scenario(
            "held_after_batch_nccl_legacy",
            "as held_after_batch on torch 2.15's 'nccl-legacy' (the stock ProcessGroupNCCL)",
            ("collectives", "batch"),
            backend="nccl-legacy",
            needs_nccl2=True,
            gloo_cannot="nccl-legacy is NCCL's",
            gloo_runs=False,
        ),
    )
}


def _set_timeout(group: Any, timeout: datetime.timedelta) -> None:
    """``group``'s timeout on every backend (``set_timeout`` from torch 2.15, ``_set_pg_timeout`` before)."""
    setter = getattr(dist, "set_timeout", None)
    if setter is not None:
        setter(timeout, group)
    else:
        dist.distributed_c10d._set_pg_timeout(timeout, group)


def _held_group(held_on: str, r: _Rank) -> Any:
    """The group the all_reduce is held on, made as ``held_on`` says, with one all_reduce completed on it."""
    if held_on == "world":
        return dist.group.WORLD
    ranks = list(range(r.world))
    connect = datetime.timedelta(seconds=CONNECT_S)
    desc = HELD_GROUP_DESC[held_on]
    if held_on == "split_group":
        try:
            group = dist.split_group(split_ranks=[ranks], timeout=connect, group_desc=desc)
        except RuntimeError as error:  # torch before 2.15: "No device associated with the default pg" (Gloo)
            if r.device.type == "cuda":
                raise
            raise CannotOnGloo(f"split_group: {str(error).strip().splitlines()[0][:200]}") from error
    else:
        group = dist.new_group(ranks, timeout=connect, group_desc=desc)
    dist.all_reduce(r.ones(), group=group)
    r.done(f"all_reduce on the {held_on} group")
    return group


class CannotOnGloo(RuntimeError):
    """What this torch's Gloo cannot do of a scenario (found by trying it): the rehearsal skips the scenario."""


def _recorder_of(group: Any, device: torch.device) -> tuple[str, str]:
    """The class and name of ``group``'s backend on ``device``: the name picks its recorder (torch 2.15)."""
    backend = group._get_backend(device)
    return type(backend).__name__, str(backend.name())


def own_trace(recorder: str) -> dict[str, Any]:
    """This process's own Flight Recorder, as torch dumps it (every record, no stacks): the recorder of the backend
    named ``recorder`` (torch 2.15 keeps one per backend), the NCCL one or the generic one before it."""
    c10d = torch._C._distributed_c10d
    kwargs = {"includeCollectives": True, "includeStackTraces": False, "onlyActive": False}
    nccl = c10d._dump_nccl_trace if recorder.startswith("nccl") and hasattr(c10d, "_dump_nccl_trace") else None
    try:
        trace = pickle.loads(c10d._dump_fr_trace(**kwargs, backend=recorder))  # this process's own bytes, from torch
    except TypeError:  # before torch 2.15: one recorder for NCCL, one for the rest
        trace = pickle.loads((nccl or c10d._dump_fr_trace)(**kwargs))
    if not trace.get("entries") and nccl is not None:  # torch 2.15's stock NCCL: still its own recorder
        trace = pickle.loads(nccl(**kwargs))
    return trace


def newest_record(recorder: str) -> dict[str, Any]:
    """The newest record of this process's recorder ``recorder``, with the fields a truth names."""
    entries = own_trace(recorder).get("entries") or []
    if not entries:
        return {}
    last = entries[-1]
    keys = ("profiling_name", "collective_seq_id", "p2p_seq_id", "op_id", "process_group", "state", "is_p2p")
    return {key: last.get(key) for key in keys}


def write_own_dump(rank: int) -> Path:
    """The Gloo rehearsal's stand-in for NCCL's dump on timeout: this process's recorder, every field torch dumps,
    written to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (only active records where ``TORCH_INCLUDE_ONLY_ACTIVE=1``)."""
    c10d = torch._C._distributed_c10d
    only_active = os.environ.get("TORCH_INCLUDE_ONLY_ACTIVE") == "1"
    path = Path(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}")
    path.write_bytes(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=only_active))
    return path


def dump_complete(path: Path) -> int | None:
    """The size of ``path`` when it holds one whole pickle (parsed opcode by opcode to its STOP, nothing run), else
    None: torch writes the dump in place, so a file that exists may still be growing."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data:
        return None
    try:
        for opcode, _, _ in pickletools.genops(data):
            if opcode.name == "STOP":
                return len(data)
    except Exception:  # truncated: still being written
        return None
    return None


def _wait_for_dump(path: Path, bound_s: float, t0: float) -> tuple[int | None, float]:
    """The dump's size once whole (None after ``bound_s``), and when it was seen whole, in seconds since ``t0``."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        size = dump_complete(path)
        if size is not None:
            return size, time.monotonic() - t0
        time.sleep(POLL_S)
    return None, time.monotonic() - t0


def _write_facts(params: Mapping[str, Any], facts: Mapping[str, Any]) -> None:
    tmp = Path(f"{params['facts']}.tmp")
    tmp.write_text(json.dumps(facts, default=str))
    tmp.replace(params["facts"])


def _init(params: Mapping[str, Any], device: torch.device) -> None:
    connect = datetime.timedelta(seconds=CONNECT_S)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # device_id: an eager NCCL communicator, which split_group needs (torch 2.11 splits only a bound group)
        dist.init_process_group(params["backend"], timeout=connect, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=connect)


def _hold(r: _Rank, group: Any, params: Mapping[str, Any]) -> Any:
    """Issue the all_reduce that cannot finish on ``group``: behind a GPU sleep, or (Gloo) with the partner away."""
    _set_timeout(group, datetime.timedelta(seconds=params["timeout_s"]))
    held = r.ones()
    if r.device.type == "cuda":
        khz = getattr(torch.cuda.get_device_properties(r.device), "clock_rate", 0) or 2_000_000  # H200: ~1.98 GHz
        torch.cuda._sleep(int(params["hold_s"] * khz * 1000))  # the all_reduce below waits behind it on the stream
    return dist.all_reduce(held, group=group, async_op=True)


def _partner(r: _Rank, params: Mapping[str, Any]) -> dict[str, Any]:
    """The Gloo rehearsal's rank 1: its dump now (its state is final), then it stays in the world until rank 0's
    all_reduce has timed out, so that rank 0 times out rather than losing its peer."""
    write_own_dump(r.rank)
    store = dist.distributed_c10d._get_default_store()
    store.wait(["harvest_held_over"], datetime.timedelta(seconds=params["bound_s"]))
    store.add("harvest_partner_out", 1)
    return {"rank": r.rank, "ops": r.ops}


def _end(params: Mapping[str, Any], facts: dict[str, Any], size: int | None, seen_s: float, device: Any) -> None:
    """Rank 0's end: its facts, then ``os._exit`` at once (exit 3 when no whole dump came within the bound).

    On a GPU, ``gpu_busy_at_dump``: the stream still held the sleep when the dump was seen whole, so the held op
    had not run yet (False: the sleep ended first, and the dump may show the op finished: raise ``--hold-s``).
    ``exit_epoch``: when the process asked to end, for the harvest to measure how long its end took."""
    facts.update(dump_bytes=size, dump_complete_s=round(seen_s, 3) if size is not None else None)
    if device.type == "cuda":
        facts["gpu_busy_at_dump"] = not torch.cuda.current_stream(device).query()
    facts["ended_s"] = round(time.monotonic() - params["_t0"], 3)
    facts["exit_epoch"] = time.time()
    _write_facts(params, facts)
    os._exit(0 if size is not None else 3)


def _gloo_times_out(work: Any, r: _Rank, facts: dict[str, Any]) -> None:
    """The Gloo rehearsal's rank 0: its held all_reduce raises at the timeout; it tells the partner, then writes its
    dump (the stand-in for NCCL's dump on timeout)."""
    try:
        work.wait()
        facts["held_outcome"] = "completed (it should not have)"
    except RuntimeError as error:
        lines = str(error).strip().splitlines()
        facts["held_outcome"] = f"raised: {lines[0][:200] if lines else type(error).__name__}"
    dist.distributed_c10d._get_default_store().set("harvest_held_over", "1")
    write_own_dump(r.rank)


def _partner_gone(r: _Rank, bound_s: float) -> None:
    """Rank 0 serves the store: it leaves once the partner is out of its last store call (or after ``bound_s``)."""
    store = dist.distributed_c10d._get_default_store()
    end = time.monotonic() + bound_s
    while int(store.add("harvest_partner_out", 0)) < r.world - 1 and time.monotonic() < end:
        time.sleep(POLL_S)


def harvest_rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank of one scenario (see the module docstring). Rank 0 never returns: it ends the process at its dump."""
    params = {**params, "_t0": time.monotonic()}
    scenario = SCENARIOS[params["scenario"]]
    device = torch.device("cuda", 0) if params["device"] == "cuda" else torch.device("cpu")
    _init(params, device)
    r = _Rank(dist.get_rank(), dist.get_world_size(), device)
    for name in scenario.before:
        BEFORE[name](r)
    try:
        group = _held_group(scenario.held_on, r)
    except CannotOnGloo as cannot:
        if r.rank == 0:
            _write_facts(params, {"cannot": str(cannot)})
        return {"rank": r.rank, "cannot": str(cannot)}
    if r.rank != 0:
        return _partner(r, params)
    backend_class, recorder = _recorder_of(group, device)
    work = _hold(r, group, params)
    issued = time.monotonic() - params["_t0"]
    facts: dict[str, Any] = {
        "held": newest_record(recorder),
        "group": {"name": str(group.group_name), "desc": str(group.group_desc), "ranks": list(range(r.world))},
        "backend_class": backend_class,
        "recorder": recorder,
        "completed_before": r.ops,
        "issued_s": round(issued, 3),
    }
    _write_facts(params, facts)
    dump = Path(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{r.rank}")
    if device.type != "cuda":
        _gloo_times_out(work, r, facts)
    size, seen_s = _wait_for_dump(dump, params["bound_s"], params["_t0"])
    if device.type != "cuda":
        _partner_gone(r, params["bound_s"])
    _end(params, facts, size, seen_s, device)
    return facts  # not reached: _end ends the process
