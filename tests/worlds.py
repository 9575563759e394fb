"""Helpers for rank-side test code that tears a default group down and builds another in the same process."""

from __future__ import annotations

import os

import torch.distributed as dist

from nemo_rl_shim.cli.launch import free_port

__all__ = ["move_to_fresh_port"]


def move_to_fresh_port() -> int:
    """Agree on a fresh ``MASTER_PORT`` for the next default group, over the current one; call on every rank.

    Call it before ``destroy_process_group``. Re-using the old port can hang (a
    rank meets the store that a peer has not closed yet), and ports picked long
    in advance can be taken meanwhile by the ephemeral sockets Gloo opens: rank 0
    picks one now, and every rank learns it over the group that still exists.
    """
    port = [free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    os.environ["MASTER_PORT"] = str(port[0])
    return int(port[0])
