"""Stands in for NeMo RL's ``nemo_rl.models.policy.utils`` (``7ea279abf``): SGLang's colocated refit groups.

Why: CI has no copy of NeMo RL (see ``nemo_rl/__init__.py``). ``_ensure_ipc_topology`` makes the groups NeMo
RL's does: one Gloo group per SGLang engine (engine ``i`` owns ranks ``[i * n, (i + 1) * n)``), every rank calling
``new_group`` for every engine, with no timeout.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["_ensure_ipc_topology"]


def _ensure_ipc_topology(num_engines: int, num_gpus_per_engine: int, worker_state: dict) -> None:
    if worker_state.get("ready"):
        return
    for engine in range(num_engines):
        ranks = list(range(engine * num_gpus_per_engine, (engine + 1) * num_gpus_per_engine))
        group = dist.new_group(ranks=ranks, backend="gloo")
        if dist.get_rank() in ranks:
            worker_state["gather_group"] = group
    worker_state["ready"] = True
