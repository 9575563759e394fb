"""Rank function for tests/harness/hang_truth/gloo_worlds.py: one drawn world, its history and its incident, on real
Gloo ranks with the recorder on.

Every rank runs the same recipe (JSON, drawn by the parent; its keys are :mod:`tests.harness.hang_truth.gloo_worlds`'s):

1. **Set-up.** The real ``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on, the start-up timeout at
   :data:`CONNECT_MIN` (the groups connect and the history runs at it: docs/testing.md, "On a shared machine"), and
   ``tensor_parallel_size`` from the recipe (the DeviceMesh's ``tp`` and ``dp`` groups).
2. **Families.** A family is a set of disjoint groups: ``default``; ``tp`` and ``dp`` of the DeviceMesh; ``ng``, made
   by one ``new_group`` per part (every rank makes every part, in one order); ``sg``, made by one ``split_group``;
   and a circular wait's groups ``c0``..``c2``, one part each, made by ``new_group`` or ``split_group``. A rank in a
   part of a family uses its part; a rank in none skips what the family does.
3. **History.** Zero to three ops, each on one family, run by every rank of each part: ``all_reduce``,
   ``broadcast``, ``all_gather``, ``barrier``, and ``batch_p2p`` (``batch_isend_irecv`` between pairs of a part).
4. **The short timeout.** Every rank meets in the default store (not a collective: the recorder does not see it),
   then takes the steady :data:`STEADY_S` on every group (``set_timeouts`` without its barrier), and checks it.
5. **The incident**, inside ``dump_on_timeout`` as a training loop wraps its step: a rank that never comes (asleep in
   Python, in a C call that holds the GIL, or dead), a rank still working (writing or computing), a circular wait,
   or a p2p stall (the receiver waits; the sender stays asleep; the others wait in an all_reduce). A rank asleep or
   working stays in its block until its stack watch has written its samples and the helper its counters
   (:class:`_Release`), then leaves it with an exception (its stack kept, as a rank the launcher killed would leave
   it); a rank in a C call is ended by ``SIGALRM`` once its first stack is written (no Python code runs while it
   holds the GIL, and a rank that came back to Python would answer the dump request it could not answer while
   stuck); the p2p receiver, in a wait Gloo never times out, is ended by ``SIGKILL`` once its samples are written.
6. **The meet.** Every rank still alive waits in the store until all are out of the scenario, and rank 0, which
   serves the store, leaves last.

The result (JSON) says what each step did, for the parent to check that the world ran as drawn.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim.config import blocks
from nemo_rl_shim.flight_recorder import recorder as flight_recorder
from nemo_rl_shim.flight_recorder.names import SAMPLE_MARK
from nemo_rl_shim.flight_recorder.stack_watchdog import SAMPLES, progress_path, stack_path
from nemo_rl_shim.process_groups.registry import backend_timeouts, named_groups
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import set_timeouts
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["CONNECT_MIN", "STEADY_S", "run_world"]

#: The start-up timeout: the ranks connect, make their groups and run the history at it.
CONNECT_MIN = 2.0
#: The incident's timeout, taken on every group once every rank is at the incident.
STEADY_S = 3.0
_MEET_S = 90
#: The store key a rank that ends itself adds to just before it does.
_KILLED = "gloo_truth/killed"
#: How long a rank asleep or working waits for its samples past its block's deadline before it leaves anyway.
_RELEASE_BOUND_S = 40.0
#: How long a rank in a C call holding the GIL stays, past its block's deadline (its first stack comes then).
_GIL_STAY_S = 4.0
_CHUNK = b"\0" * (1 << 20)
_SHARD_CHUNKS = 8
#: Between two 1 MB writes: a shard written at about 100 MB/s, as a disk takes it, not a core spent on the page cache.
_WRITE_PAUSE_S = 0.01


class _Released(Exception):
    """Ends a stuck rank's block once its stack and counters are written (not a RuntimeError: no dump, no request)."""


def _section(params: dict[str, Any]) -> dict[str, Any]:
    recorder = {"enabled": True, "dump_dir": params["dump_dir"], "buffer_size": 200}
    knobs = {"distributed_timeout_minutes": CONNECT_MIN, "flight_recorder": recorder}
    return {**blocks(knobs), "dtensor_cfg": {"tensor_parallel_size": params["recipe"]["tp"]}}


# --- the families ---------------------------------------------------------------------------------------------------


def _my_part(parts: list[list[int]], rank: int) -> list[int] | None:
    return next((part for part in parts if rank in part), None)


def _make_families(recipe: dict[str, Any], context: Any, rank: int) -> dict[str, Any]:
    """``{family: this rank's group, or None}``, made in the recipe's order (every rank makes every group)."""
    mesh = named_groups(context.device_mesh, context.moe_mesh)
    groups: dict[str, Any] = {}
    for name, family in recipe["families"].items():
        made_by, parts = family["made_by"], family["parts"]
        mine = _my_part(parts, rank)
        if made_by == "default":
            groups[name] = dist.group.WORLD
        elif made_by == "mesh":
            groups[name] = mesh[name] if mine is not None else None
        elif made_by == "new_group":
            made = [dist.new_group(part) for part in parts]
            groups[name] = made[parts.index(mine)] if mine is not None else None
        elif made_by == "split_group":
            group = dist.split_group(split_ranks=parts)
            groups[name] = group if mine is not None else None
        else:
            raise ValueError(f"a family is made by default, mesh, new_group or split_group, got {made_by!r}")
    return groups


def _members(group: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


# --- ops ------------------------------------------------------------------------------------------------------------


def _collective(op: str, size: int, group: Any, part: list[int], src: int | None = None) -> None:
    """``op`` on ``group`` (this rank's ``part``); a broadcast from ``src`` (default the part's first rank): Gloo's
    root sends and is done, so only the ranks that receive from a missing root wait."""
    tensor = torch.ones(size)
    if op == "all_reduce":
        dist.all_reduce(tensor, group=group)
    elif op == "broadcast":
        dist.broadcast(tensor, src=part[0] if src is None else src, group=group)
    elif op == "all_gather":
        dist.all_gather([torch.zeros(size) for _ in part], tensor, group=group)
    elif op == "barrier":
        dist.barrier(group=group)
    else:
        raise ValueError(f"a collective is all_reduce, broadcast, all_gather or barrier, got {op!r}")


def _batch_p2p(size: int, group: Any, part: list[int], rank: int, pairs: list[list[int]]) -> None:
    """``batch_isend_irecv`` with this rank's pair in ``pairs`` (a send and a receive each way); none, nothing."""
    pair = next((p for p in pairs if rank in p), None)
    if pair is None:
        return
    peer = pair[1] if pair[0] == rank else pair[0]
    ops = [
        dist.P2POp(dist.isend, torch.ones(size), peer, group=group),
        dist.P2POp(dist.irecv, torch.zeros(size), peer, group=group),
    ]
    for work in dist.batch_isend_irecv(ops if rank < peer else ops[::-1]):
        work.wait()


def _history(recipe: dict[str, Any], groups: dict[str, Any], rank: int) -> None:
    for step in recipe["history"]:
        group = groups[step["family"]]
        if group is None:
            continue
        part = _my_part(recipe["families"][step["family"]]["parts"], rank)
        assert part is not None
        if step["op"] == "batch_p2p":
            _batch_p2p(step["size"], group, part, rank, step["pairs"])
        else:
            _collective(step["op"], step["size"], group, part)


# --- the stuck rank: asleep, writing, computing, in a C call, dead ---------------------------------------------------


class _Release(threading.Thread):
    """Sets ``done`` once this rank's stack file holds :data:`SAMPLES` samples and its counters file as many lines,
    or :data:`_RELEASE_BOUND_S` past the block's deadline (``bounded``)."""

    def __init__(self, dump_dir: str, rank: int, deadline: float) -> None:
        super().__init__(name="gloo-truth-release", daemon=True)
        self.stack, self.progress = stack_path(dump_dir, rank), progress_path(dump_dir, rank)
        self.deadline = deadline
        self.done = threading.Event()
        self.found = (0, 0)
        self.bounded = False

    def _count(self) -> tuple[int, int]:
        try:
            text = self.stack.read_text(errors="replace")
        except OSError:
            return 0, 0
        samples = ("Timeout (" in text) + text.count(SAMPLE_MARK)
        try:
            counters = len(self.progress.read_text(errors="replace").splitlines())
        except OSError:
            counters = 0
        return samples, counters

    def run(self) -> None:
        while True:
            self.found = self._count()
            if min(self.found) >= SAMPLES:
                break
            if time.monotonic() > self.deadline + _RELEASE_BOUND_S:
                self.bounded = True
                break
            time.sleep(0.2)
        self.done.set()


def _asleep(released: threading.Event) -> None:
    while not released.is_set():
        time.sleep(0.05)  # the stall: asleep


def _write_shard(released: threading.Event, path: Path) -> None:
    with open(path, "wb") as shard:
        while not released.is_set():
            for _ in range(_SHARD_CHUNKS):
                shard.write(_CHUNK)  # the stall: writing
                time.sleep(_WRITE_PAUSE_S)
            shard.seek(0)


def _mix(value: int) -> int:
    for i in range(20_000):
        value = (value * 31 + i) % 1_000_003  # the stall: computing
    return value


def _fold(value: int) -> int:
    for i in range(20_000):
        value = (value ^ (value << 1) ^ i) & 0xFFFFF
    return value


def _compute(released: threading.Event) -> None:
    value = 1
    while not released.is_set():
        value = _fold(_mix(value))


def _in_a_c_call(stay_s: float) -> None:
    """Hold the GIL in libc's ``sleep``; ``SIGALRM`` (its default action ends the process) ends it at ``stay_s``."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, round(stay_s)))
    libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL through the call
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(600)  # the stall: gil


def _stuck(variant: str, params: dict[str, Any], rank: int, what: str) -> dict[str, Any]:
    """The culprit's block: it never reaches the op (or the send) its peers wait in."""
    deadline = time.monotonic() + flight_recorder._current_timeout_s() + flight_recorder.STACK_GRACE_S
    release = _Release(params["dump_dir"], rank, deadline)
    out: dict[str, Any] = {"role": "culprit", "variant": variant}
    try:
        with flight_recorder.dump_on_timeout(what):
            if variant == "dead":
                os._exit(17)
            if variant == "gil":
                _in_a_c_call(deadline - time.monotonic() + _GIL_STAY_S)
            release.start()
            if variant == "writing":
                _write_shard(release.done, Path(params["work_dir"]) / "shard.bin")
            elif variant == "computing":
                _compute(release.done)
            else:
                _asleep(release.done)
            raise _Released
    except _Released:
        out.update(outcome="released", samples=release.found[0], counters=release.found[1], bounded=release.bounded)
    return out


# --- the incident ---------------------------------------------------------------------------------------------------


def _raised(what: str, run: Any) -> dict[str, Any]:
    """Run ``run`` in ``dump_on_timeout(what)``: ``completed``, or ``raised`` with the error's first line."""
    start = time.monotonic()
    try:
        with flight_recorder.dump_on_timeout(what):
            run()
    except RuntimeError as error:
        lines = str(error).strip().splitlines()
        return {"outcome": "raised", "error": (lines[0] if lines else type(error).__name__)[:300],
                "seconds": round(time.monotonic() - start, 2)}  # fmt: skip
    return {"outcome": "completed", "seconds": round(time.monotonic() - start, 2)}


def _absent(incident: dict[str, Any], params: dict[str, Any], groups: dict[str, Any], rank: int) -> dict[str, Any]:
    """A rank that never comes, or one still working: its part's other members wait in the op; the other parts of the
    family run it (where ``others_too``); everyone else idles."""
    family = params["recipe"]["families"][incident["family"]]
    part, what, op, size = _my_part(family["parts"], rank), incident["block"], incident["op"], incident["size"]
    if rank == incident["culprit"]:
        return _stuck(incident["variant"], params, rank, what)
    group = groups[incident["family"]]
    if part is None or (part != incident["part"] and not incident["others_too"]):
        return {"role": "idle"}
    role = "waiter" if part == incident["part"] else "other part"
    src = incident["culprit"] if part == incident["part"] else None  # a broadcast waits on its root
    return {"role": role, **_raised(what, lambda: _collective(op, size, group, part, src))}


def _circular(incident: dict[str, Any], groups: dict[str, Any], rank: int) -> dict[str, Any]:
    """Each member calls the op on its first group, then on its second: the waits close a circle."""
    order = incident["order"].get(str(rank))
    if order is None:
        return {"role": "idle"}

    def run() -> None:
        for name in order:
            _collective(incident["op"], incident["size"], groups[name], incident["parts"][name], incident["src"][name])

    return {"role": "member", **_raised(incident["block"], run)}


def _waits_forever(incident: dict[str, Any], params: dict[str, Any], group: Any, rank: int) -> dict[str, Any]:
    """The receiver: Gloo's ``recv`` (and a batch's ``irecv``, waited on) has no timeout, so it waits until the
    launcher ends it; here its own thread does (``SIGKILL``), once its stack watch has written its samples."""
    culprit, size = incident["culprit"], incident["size"]
    deadline = time.monotonic() + flight_recorder._current_timeout_s() + flight_recorder.STACK_GRACE_S
    release = _Release(params["dump_dir"], rank, deadline)
    release.start()
    store = dist.distributed_c10d._get_default_store()

    def end() -> None:
        release.done.wait()
        store.add(_KILLED, 1)  # the sender waits for it: gone first, it would close the receiver's recv with an error
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=end, daemon=True).start()
    with flight_recorder.dump_on_timeout(incident["block"]):
        if incident["variant"] == "batched":
            ops = [dist.P2POp(dist.irecv, torch.zeros(size), culprit, group=group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()  # the wait: batched
        else:
            dist.recv(torch.zeros(size), src=culprit, group=group)  # the wait: recv
    return {"role": "waiter", "outcome": "received"}  # never: the send never comes


def _p2p(incident: dict[str, Any], params: dict[str, Any], groups: dict[str, Any], rank: int) -> dict[str, Any]:
    """The receiver waits for a send (alone, or in a ``batch_isend_irecv``) that the sender, asleep, never posts; the
    others wait in an all_reduce of the default group that neither of the two reaches, and time out."""
    if rank == incident["culprit"]:
        return _stuck("asleep", params, rank, incident["block"])
    if rank == incident["waiter"]:
        return _waits_forever(incident, params, groups[incident["family"]], rank)
    world = list(range(dist.get_world_size()))
    run = lambda: _collective("all_reduce", incident["size"], dist.group.WORLD, world)  # noqa: E731 - one line
    return {"role": "other", **_raised(incident["block"], run)}


def _incident(params: dict[str, Any], groups: dict[str, Any], rank: int) -> dict[str, Any]:
    incident = params["recipe"]["incident"]
    if incident["kind"] in ("never_came", "still_working"):
        return _absent(incident, params, groups, rank)
    if incident["kind"] == "circular":
        return _circular(incident, groups, rank)
    return _p2p(incident, params, groups, rank)


# --- the world ------------------------------------------------------------------------------------------------------


def _wait_until(store: Any, key: str, expected: int, timeout_s: float) -> bool:
    """Whether the counter ``key`` of ``store`` reached ``expected`` within ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < expected:
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _store_barrier(store: Any, key: str, expected: int, timeout_s: float) -> bool:
    store.add(key, 1)
    return _wait_until(store, key, expected, timeout_s)


def run_world(params: dict[str, Any]) -> dict[str, Any]:
    """Set up, make the families, run the history, take the short timeout, run the incident, meet; say what each
    step did."""
    recipe = params["recipe"]
    context = setup_distributed(_section(params), RuntimeConfig())
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    groups = _make_families(recipe, context, rank)
    out: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
    out["members"] = {name: _members(group) for name, group in groups.items() if group is not None}
    _history(recipe, groups, rank)
    out["history"] = "done"
    out["synced"] = _store_barrier(store, "gloo_truth/incident", world, CONNECT_MIN * 60)
    set_timeouts(context, datetime.timedelta(seconds=STEADY_S), barrier=False)
    mine = {name: group for name, group in groups.items() if group is not None}
    out["timeouts_s"] = sorted({t.total_seconds() for g in mine.values() for t in backend_timeouts(g).values()})
    out["incident"] = _incident(params, groups, rank)
    _store_barrier(store, "gloo_truth/out", params["survivors"], _MEET_S)
    _wait_until(store, _KILLED, params["killed"], _MEET_S)  # a rank that ends itself is gone before anyone leaves
    rank_0_leaves_last("gloo_truth/left", _MEET_S, expected=params["survivors"], store=store)
    return out
