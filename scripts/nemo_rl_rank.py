"""One rank of NeMo RL's own ``setup_distributed``, called for real on CPU; started by ``scripts/nemo_rl_check.py``.

Runs in NeMo RL's environment (its source on ``sys.path``), under ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` as a launcher sets them. Writes ``rank<N>.json``: every process
group of both meshes, its ranks, each device's backend and timeout as that backend reports it, and
whether an all-reduce of a CPU tensor on it succeeds.

The one boundary this machine lacks is NCCL (no GPU). Only its name is swapped, at the two places
NeMo RL passes it:

* ``torch.distributed.init_process_group(backend=...)``: ``"nccl"`` becomes ``"gloo"``. Under CPU
  offload, ``"cuda:nccl,cpu:gloo"`` becomes ``"cuda:nccl_standin,cpu:gloo"``, where ``nccl_standin``
  is a Gloo backend registered for the ``cuda`` device. The composite group then keeps two distinct
  backend objects, one per device, as with NCCL, and each half's timeout is read on its own.
  (``"cuda:gloo,cpu:gloo"`` would not do: torch then shares one Gloo object between both devices,
  so a timeout that reached only one half would read as reaching both.)
* ``FSDP2Config(backend="nccl")``: ``"gloo"``, so Automodel builds the mesh on the ``cpu`` device type.

Everything else is real: NeMo RL's code, the pinned Automodel, torch's Gloo, the shim.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["main"]

STANDIN = "nccl_standin"
_FLATTENED = ("dp", "dp_cp", "dp_shard_cp")


def _standin(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _swap_nccl(backend: str) -> str:
    if backend == "nccl":
        return "gloo"
    return backend.replace(":nccl", f":{STANDIN}")


def _install_swaps(setup: Any) -> None:
    dist.Backend.register_backend(STANDIN, _standin, devices=["cuda"])
    real_init, real_fsdp2 = dist.init_process_group, setup.FSDP2Config

    def init_process_group(*args: Any, backend: str, **kwargs: Any) -> None:
        real_init(*args, backend=_swap_nccl(backend), **kwargs)

    def fsdp2_config(**kwargs: Any) -> Any:
        return real_fsdp2(**{**kwargs, "backend": _swap_nccl(kwargs.get("backend", "nccl"))})

    dist.init_process_group = init_process_group
    setup.FSDP2Config = fsdp2_config


def _config(minutes: float | None, cpu_offload: bool, tp: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "dtensor_cfg": {
            "enabled": True,
            "_v2": True,
            "cpu_offload": cpu_offload,
            "tensor_parallel_size": tp,
            "context_parallel_size": 1,
            "expert_parallel_size": 1,
            "sequence_parallel": False,
            "activation_checkpointing": False,
        },
    }
    config["automodel_cfg"] = {"distributed_timeout_minutes": minutes}
    return config


def _runtime_config(setup: Any, cpu_offload: bool) -> Any:
    fields = setup.RuntimeConfig._fields
    values = {name: None for name in fields}
    values.update(dtype=torch.float32, cpu_offload=cpu_offload, enable_seq_packing=False, is_reward_model=False)
    return setup.RuntimeConfig(**values)


def _groups(device_mesh: Any, moe_mesh: Any) -> dict[str, Any]:
    groups = {"default": dist.group.WORLD}
    for name in (*device_mesh.mesh_dim_names, *_FLATTENED):
        groups[name] = device_mesh[name].get_group()
    if moe_mesh is not None:
        for name in moe_mesh.mesh_dim_names:
            groups[f"moe.{name}"] = moe_mesh[name].get_group()
    return groups


def _read(group: Any) -> dict[str, Any]:
    config = dist.get_backend_config(group)
    devices = [part.split(":")[0] for part in config.split(",")] if ":" in config else ["cpu"]
    timeouts, objects = {}, {}
    for device in devices:
        backend = group._get_backend(torch.device(device))
        timeouts[device] = backend.options._timeout.total_seconds() / 60
        objects[device] = id(backend)
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    return {
        "ranks": dist.get_process_group_ranks(group),
        "backend": config,
        "timeout_min": timeouts,
        "distinct_backends": len(set(objects.values())),
        "allreduce_cpu": tensor.item() == group.size(),
    }


def _full_tensor(device_mesh: Any) -> bool:
    """A dp-sharded CPU DTensor's ``full_tensor()``: an all-gather on the dp group's CPU half."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = device_mesh["dp"]
    sharded = distribute_tensor(torch.arange(8.0).reshape(8, 1).repeat(1, 2), mesh, [Shard(0)])
    return bool(torch.equal(sharded.full_tensor(), torch.arange(8.0).reshape(8, 1).repeat(1, 2)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--cpu-offload", action="store_true")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {"rank": rank, "cpu_offload": args.cpu_offload}
    try:
        import nemo_rl.models.automodel.setup as setup

        _install_swaps(setup)
        context = setup.setup_distributed(
            _config(args.minutes, args.cpu_offload, args.tp), _runtime_config(setup, args.cpu_offload)
        )
        report["groups"] = {
            name: _read(group) for name, group in _groups(context.device_mesh, context.moe_mesh).items()
        }
        report["full_tensor_ok"] = _full_tensor(context.device_mesh)
        report["sizes"] = {"dp": context.dp_size, "tp": context.tp_size, "cp": context.cp_size}
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # reported, so the driver names the rank and what failed
        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()
    (args.out / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
