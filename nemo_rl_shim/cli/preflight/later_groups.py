"""The process groups a NeMo RL worker makes after set-up, made here as it makes them, so that preflight checks them.

A group made after ``setup_distributed`` gets torch's default timeout (10 min NCCL, 30 min Gloo) unless
something gives it another: the shim's set-up does, for every group made later
(:mod:`nemo_rl_shim.process_groups.later`); NeMo RL's own set-up gives the timeout only to the groups that exist
when it does. A check of the groups set-up made would miss the rest. NeMo RL's DTensor v2 policy worker
(NeMo RL ``7ea279abf``) makes:

* **the data plane's replica group**: ``DTensorPolicyWorkerV2Impl._get_replica_group`` flattens the
  ``("cp", "tp")`` sub-mesh lazily, on its first ``_fetch`` (every policy worker; NeMo RL's value worker
  has no such method);
* **SGLang's colocated refit groups**: ``nemo_rl.models.policy.utils._ensure_ipc_topology``, on the first
  refit, makes one Gloo group per SGLang engine (engine ``i`` owns ranks ``[i*n, (i+1)*n)``; every rank
  calls ``new_group(ranks, backend="gloo")`` for every engine), when the section's ``generation.backend``
  is ``sglang`` with ``generation.colocated.enabled: true``; ``n`` is
  ``generation.sglang_cfg.sglang_server_config.num_gpus_per_engine``.

:func:`make_later_groups` makes them right after set-up: with NeMo RL's own method and function under
``--setup nemo-rl`` (:mod:`.nemo_rl_setup`), and with the same torch calls under the shim's set-up (NeMo
RL need not be installed there). Automodel's checkpoint groups are not made: they need a model and a
checkpointer.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from nemo_rl_shim.config.integers import positive_int

__all__ = ["make_later_groups", "refit_gpus_per_engine"]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def refit_gpus_per_engine(section: Mapping[str, Any], role: str) -> int | None:
    """The ranks of one SGLang engine when the section's worker makes SGLang's colocated refit groups, else None.

    ``ValueError`` naming the full key when ``num_gpus_per_engine`` is not a positive integer.
    """
    generation = _mapping(section.get("generation"))
    if generation.get("backend") != "sglang" or _mapping(generation.get("colocated")).get("enabled") is not True:
        return None
    server = _mapping(_mapping(generation.get("sglang_cfg")).get("sglang_server_config"))
    key = f"{role}.generation.sglang_cfg.sglang_server_config.num_gpus_per_engine"
    return positive_int(server.get("num_gpus_per_engine"), key)


def _engines(world_size: int, per_engine: int, role: str) -> list[list[int]]:
    if world_size % per_engine:
        key = f"{role}.generation.sglang_cfg.sglang_server_config.num_gpus_per_engine"
        raise ValueError(f"{key} is {per_engine}, which does not divide the {world_size} ranks into SGLang engines")
    return [list(range(start, start + per_engine)) for start in range(0, world_size, per_engine)]


def _replica_group(context: Any, nemo_rl: bool) -> str:
    if nemo_rl:
        from nemo_rl.models.policy.workers.dtensor_policy_worker_v2 import DTensorPolicyWorkerV2Impl

        DTensorPolicyWorkerV2Impl._get_replica_group(types.SimpleNamespace(device_mesh=context.device_mesh))
        return "replica group: (cp, tp) flattened by NeMo RL's DTensorPolicyWorkerV2Impl._get_replica_group"
    context.device_mesh[("cp", "tp")]._flatten()
    return 'replica group: (cp, tp) flattened (device_mesh[("cp", "tp")]._flatten(), as NeMo RL\'s worker does)'


def _refit_groups(section: Mapping[str, Any], role: str, nemo_rl: bool) -> str:
    per_engine = refit_gpus_per_engine(section, role)
    if per_engine is None:
        return f"SGLang refit groups: none ({role}.generation is not SGLang with colocated generation)"
    engines = _engines(dist.get_world_size(), per_engine, role)
    if nemo_rl:
        from nemo_rl.models.policy.utils import _ensure_ipc_topology

        _ensure_ipc_topology(num_engines=len(engines), num_gpus_per_engine=per_engine, worker_state={})
        how = "NeMo RL's _ensure_ipc_topology"
    else:
        for ranks in engines:
            dist.new_group(ranks=ranks, backend="gloo")
        how = 'new_group(ranks, backend="gloo") per engine, as NeMo RL\'s _ensure_ipc_topology does'
    groups, ranks = f"group{'s' * (len(engines) > 1)}", f"rank{'s' * (per_engine > 1)}"
    return f"SGLang refit groups: {len(engines)} Gloo {groups} of {per_engine} {ranks} ({how})"


def make_later_groups(context: Any, section: Mapping[str, Any], role: str, *, nemo_rl: bool) -> tuple[str, ...]:
    """Make the groups the role's NeMo RL worker makes after set-up (see the module docstring); what was made, in words.

    ``context``: the set-up's (the shim's or NeMo RL's ``DistributedContext``: its ``device_mesh`` is read).
    ``nemo_rl``: make them with NeMo RL's own code. Every rank calls it, as every rank of a worker does.
    """
    replica = _replica_group(context, nemo_rl) if role == "policy" else "replica group: none (NeMo RL's value worker)"
    return replica, _refit_groups(section, role, nemo_rl)
