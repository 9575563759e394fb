"""Stands in for NeMo RL's ``nemo_rl.models.automodel.setup`` (``7ea279abf``): its names that preflight uses.

Why: CI has no copy of NeMo RL (see ``nemo_rl/__init__.py``). What it keeps of NeMo RL's ``setup_distributed``
is what it does with process groups: ``torch.distributed.init_process_group`` with NeMo RL's backend string
(``"nccl"``, or ``"cuda:nccl,cpu:gloo"`` under CPU offload), looked up on ``torch.distributed`` at call time as
NeMo RL does; ``FSDP2Config(backend="nccl")``, whose backend gives the mesh its device type, as Automodel's mesh
code does; the ``dtensor_cfg`` keys it reads with ``[]``; its refusal of CPU offload on one rank
(``NotImplementedError``, raised after the default group exists, as NeMo RL's "Handle world_size=1 + cpu_offload"
does); and a ``(dp, cp, tp)`` device mesh (NeMo RL's has more axes: the shape does not matter to preflight, every
group torch holds is audited).

NeMo RL as it is passes no timeout: every group keeps torch's default. With ``NEMO_RL_STAND_IN_SERIES=applied``
it does what the series' ``setup_distributed`` does (``nemo_rl_shim/upstream/0001`` and ``0002``): it refuses an
``automodel_cfg`` key other than ``distributed_timeout_minutes`` (the series' ``AutomodelConfig`` is
``extra="forbid"``), makes the value torch's default for new groups (``default_pg_timeout`` and
``default_pg_nccl_timeout``) and passes it to ``init_process_group`` as ``timeout=``; every group made later in the
process, the worker's replica group included, then gets it when it is made.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import init_device_mesh

__all__ = ["DistributedContext", "FSDP2Config", "RuntimeConfig", "setup_distributed"]


class RuntimeConfig(NamedTuple):
    """NeMo RL's ``RuntimeConfig``: the fields preflight fills (NeMo RL's has more, all filled with None)."""

    model_class: Any
    dtype: Any
    cpu_offload: bool
    enable_seq_packing: bool
    is_reward_model: bool


@dataclass
class FSDP2Config:
    """Automodel's ``FSDP2Config``: the backend the mesh is built for."""

    backend: str = "nccl"


class DistributedContext(NamedTuple):
    """NeMo RL's ``DistributedContext``, in its order."""

    device_mesh: Any
    moe_mesh: Any
    fsdp2_config: FSDP2Config
    moe_config: Any
    dp_size: int
    tp_size: int
    cp_size: int


def _series_timeout(config: dict[str, Any]) -> datetime.timedelta | None:
    if os.environ.get("NEMO_RL_STAND_IN_SERIES") != "applied":
        return None
    automodel = config.get("automodel_cfg") or {}
    extra = sorted(set(automodel) - {"distributed_timeout_minutes"})
    if extra:  # the series' AutomodelConfig is extra="forbid"
        raise ValueError(f"automodel_cfg: extra inputs are not permitted: {extra}")
    minutes = automodel.get("distributed_timeout_minutes")
    return None if minutes is None else datetime.timedelta(minutes=minutes)


def setup_distributed(config: dict[str, Any], runtime_config: RuntimeConfig) -> Any:
    """The default group and a device mesh, as the module docstring says."""
    timeout = _series_timeout(config)
    backend = "nccl" if not runtime_config.cpu_offload else "cuda:nccl,cpu:gloo"
    if timeout is None:
        torch.distributed.init_process_group(backend=backend)
    else:
        c10d = torch.distributed.distributed_c10d
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
        torch.distributed.init_process_group(backend=backend, timeout=timeout)
    world_size = torch.distributed.get_world_size()
    dtensor = config["dtensor_cfg"]
    tp, cp = dtensor.get("tensor_parallel_size", 1), dtensor.get("context_parallel_size", 1)
    _ = dtensor["sequence_parallel"], dtensor["activation_checkpointing"]  # read with [], as NeMo RL does
    fsdp2_config = FSDP2Config(backend="nccl")
    if world_size == 1 and runtime_config.cpu_offload:  # NeMo RL's words, from its setup_distributed
        raise NotImplementedError(
            "CPUOffload doesn't work on single GPU for AutoModel. "
            "If you need this feature, please file an issue on https://github.com/NVIDIA-NeMo/Automodel."
        )
    device_type = "cuda" if fsdp2_config.backend == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (world_size // (tp * cp), cp, tp), mesh_dim_names=("dp", "cp", "tp"))
    return DistributedContext(mesh, None, fsdp2_config, None, mesh["dp"].size(), tp, cp)
