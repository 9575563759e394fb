"""Rank function for tests/flight_recorder/test_p2p_log.py: the shim's log of Gloo's sends and receives, on three
real Gloo ranks (no set-up: ``p2p_log.install`` alone, as ``record_groups`` calls it).

In order, each step's ranks meeting on the store after it (never a collective, which Gloo's recorder would number):

1. on ``pair`` (``new_group([1, 2])``), rank 2 sends to rank 1 (group ranks 1 -> 0), rank 1 receiving each: one
   ``send``/``recv`` with tag 7; three calls of the group's own methods, with every argument named, with the tag
   alone named, and with the tensors alone positional; one with numpy's ints for the peer and the tag (torch takes
   any index); then :data:`MANY` plain ones, more than the log keeps;
2. ``batch_isend_irecv`` between ranks 0 and 1 on the default group (a send and a receive each way), waited on;
3. rank 1 ``irecv`` from rank 0 on the default group, which rank 0 does not send yet: its work stays pending;
4. every rank takes :func:`p2p_log.snapshot` (``while_pending``); rank 0 then sends, rank 1 waits for it, and takes
   another (``after``): the op done;
5. :func:`p2p_log.uninstall`: torch's own methods again.

Every warning the log gives is counted (``warnings``): none is expected.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from typing import Any

import numpy
import torch
import torch.distributed as dist

from nemo_rl_shim.flight_recorder import p2p_log
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["MANY", "run"]

_WAIT_S = 60
#: Plain sends on ``pair``: with the others, more than the log keeps (``p2p_log.KEEP``).
MANY = 300


def _meet(store: Any, what: str, world: int) -> None:
    """Every rank past ``what`` (on the store: no collective), within :data:`_WAIT_S`."""
    store.add(what, 1)
    end = time.monotonic() + _WAIT_S
    while int(store.add(what, 0)) < world:
        if time.monotonic() > end:
            raise TimeoutError(f"not every rank reached {what!r} within {_WAIT_S} s")
        time.sleep(0.01)


def _on_pair(rank: int, pair: Any) -> None:
    if rank == 2:
        dist.send(torch.ones(1), dst=1, group=pair, tag=7)
        pair.send(tensors=[torch.ones(1)], dstRank=0, tag=0).wait()
        pair.send([torch.ones(1)], 0, tag=0).wait()
        pair.send([torch.ones(1)], numpy.int64(0), numpy.int64(0)).wait()
        pair.send([torch.ones(1)], dstRank=0, tag=0).wait()
        for _ in range(MANY):
            dist.send(torch.ones(1), dst=1, group=pair)
    elif rank == 1:
        dist.recv(torch.zeros(1), src=2, group=pair, tag=7)
        pair.recv(tensors=[torch.zeros(1)], srcRank=1, tag=0).wait()
        pair.recv([torch.zeros(1)], 1, tag=0).wait()
        pair.recv([torch.zeros(1)], numpy.int64(1), numpy.int64(0)).wait()
        pair.recv([torch.zeros(1)], srcRank=1, tag=0).wait()
        for _ in range(MANY):
            dist.recv(torch.zeros(1), src=2, group=pair)


def run(params: dict[str, Any]) -> dict[str, Any]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=_WAIT_S))
    store = dist.distributed_c10d._get_default_store()
    from torch._C._distributed_c10d import ProcessGroup

    torch_send = ProcessGroup.send
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out: dict[str, Any] = {"installed": p2p_log.install(), "wrapped": ProcessGroup.send is not torch_send}
        pair = dist.new_group([1, 2])
        out["names"] = {"default": dist.group.WORLD.group_name, "pair": pair.group_name if rank in (1, 2) else None}
        _on_pair(rank, pair)
        _meet(store, "pair", world)
        if rank in (0, 1):
            peer = 1 - rank
            ops = [dist.P2POp(dist.isend, torch.ones(4), peer), dist.P2POp(dist.irecv, torch.zeros(4), peer)]
            for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
                work.wait()
        _meet(store, "batch", world)
        pending = dist.irecv(torch.zeros(3), src=0) if rank == 1 else None
        _meet(store, "posted", world)
        out["while_pending"] = p2p_log.snapshot()
        _meet(store, "snapshot", world)
        if rank == 0:
            dist.send(torch.ones(3), dst=1)
        if pending is not None:
            pending.wait()
        out["after"] = p2p_log.snapshot()
        p2p_log.uninstall()
    out["warnings"] = [str(w.message) for w in caught]
    out["restored"] = ProcessGroup.send is torch_send and p2p_log.snapshot() is None
    rank_0_leaves_last("done", _WAIT_S, expected=world)
    return out
