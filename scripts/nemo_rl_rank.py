"""One rank of NeMo RL's own ``setup_distributed``, called for real on CPU; started by ``scripts/nemo_rl_check.py``.

Runs in NeMo RL's environment (its source on ``sys.path``, this project not installed), under
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` as a launcher sets them. Writes
``rank<N>.json``. Three modes:

* ``groups``: set-up, then the worker's replica group made as the worker makes it after set-up
  (``DTensorPolicyWorkerV2Impl._get_replica_group``, NeMo RL's own method), then EVERY process
  group torch holds (``distributed_c10d._world.pg_map``): its description, ranks, each device's
  backend and timeout as that backend reports it, how many distinct backend objects it has, and
  whether an all-reduce of a CPU tensor on it succeeds.
* ``pretrained``: set-up, then the weight download of Automodel's ``from_pretrained`` at the pin
  (``_download_model_weights``), whose ``FirstRankPerNode`` makes a Gloo group while rank 0 loads; each
  group is read the moment the real code makes it. Only the download (the network) is a sleep.
* ``save`` (NVIDIA-NeMo/RL#3624, scaled down): torch's default timeout is scaled by ``--scale``
  (30 min becomes ``30 * scale`` minutes), then set-up, then Automodel's own
  ``consolidate_safetensors_files_on_every_rank`` at the pin, whose last step is ``dist.barrier()``
  on the default group. Its file work is replaced by a sleep of ``--save-seconds`` on rank 0 (the
  one rank that owns the only output file), standing in for the 35-45 min NFS write: the other
  ranks wait in that barrier. Reports, per rank, whether the save completed and how long it took.

The one boundary this machine lacks is NCCL (no GPU). Only its name is swapped, at the two places
NeMo RL passes it:

* ``torch.distributed.init_process_group(backend=...)``: ``"nccl"`` becomes ``"gloo"``. Under CPU
  offload, ``"cuda:nccl,cpu:gloo"`` becomes ``"cuda:nccl_standin,cpu:gloo"``, where ``nccl_standin``
  is a Gloo backend registered for the ``cuda`` device. The composite group then keeps two distinct
  backend objects, one per device, as with NCCL, and each half's timeout is read on its own.
  (``"cuda:gloo,cpu:gloo"`` would not do: torch then shares one Gloo object between both devices,
  so a timeout that reached only one half would read as reaching both.)
* ``FSDP2Config(backend="nccl")``: ``"gloo"``, so Automodel builds the mesh on the ``cpu`` device type.

Everything else is real: NeMo RL's code, the pinned Automodel, torch's Gloo.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["main"]

STANDIN = "nccl_standin"


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
    return {
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
        "automodel_cfg": {"distributed_timeout_minutes": minutes},
    }


def _runtime_config(setup: Any, cpu_offload: bool) -> Any:
    values = {name: None for name in setup.RuntimeConfig._fields}
    values.update(dtype=torch.float32, cpu_offload=cpu_offload, enable_seq_packing=False, is_reward_model=False)
    return setup.RuntimeConfig(**values)


def _timeouts(group: Any) -> dict[str, float]:
    """Each backend's timeout in minutes, as the backend reports it."""
    return {d.type: group._get_backend(d).options._timeout.total_seconds() / 60 for d in group._device_types}


def _read(group: Any) -> dict[str, Any]:
    """One group as its backends report it, and a CPU all-reduce on it."""
    config = dist.get_backend_config(group)
    timeouts = _timeouts(group)
    # Held while their ids are taken: pybind11 gives one C++ backend one Python object only while it lives
    backends = {d.type: group._get_backend(d) for d in group._device_types}
    objects = {device: id(backend) for device, backend in backends.items()}
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    return {
        "desc": group.group_desc,
        "ranks": dist.get_process_group_ranks(group),
        "backend": config,
        "timeout_min": timeouts,
        "distinct_backends": len(set(objects.values())),
        "allreduce_cpu": tensor.item() == group.size(),
    }


def _full_tensor(device_mesh: Any) -> bool:
    """A dp-sharded CPU DTensor's ``full_tensor()``: an all-gather on the dp group's CPU half."""
    from torch.distributed.tensor import Shard, distribute_tensor

    expected = torch.arange(8.0).reshape(8, 1).repeat(1, 2)
    sharded = distribute_tensor(expected.clone(), device_mesh["dp"], [Shard(0)])
    return bool(torch.equal(sharded.full_tensor(), expected))


def _groups_mode(setup: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    context = setup.setup_distributed(
        _config(args.minutes, args.cpu_offload, args.tp), _runtime_config(setup, args.cpu_offload)
    )
    # The worker's replica group, made by NeMo RL's own method after set-up, as the data plane does.
    from nemo_rl.models.policy.workers.dtensor_policy_worker_v2 import DTensorPolicyWorkerV2Impl

    replica = DTensorPolicyWorkerV2Impl._get_replica_group(types.SimpleNamespace(device_mesh=context.device_mesh))
    report["replica_desc"] = replica.group_desc
    report["groups"] = [_read(group) for group in list(dist.distributed_c10d._world.pg_map)]
    report["full_tensor_ok"] = _full_tensor(context.device_mesh)
    report["sizes"] = {"dp": context.dp_size, "tp": context.tp_size, "cp": context.cp_size}


def _pretrained_mode(setup: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Set-up, then the weight download of Automodel's ``from_pretrained`` (``_download_model_weights``).

    Its ``FirstRankPerNode`` makes a Gloo group (``_barrier_with_timeout``) while rank 0 downloads; the real
    function makes it, and each group is read the moment it is made. The download itself (the network) is
    a sleep of ``--save-seconds`` on rank 0; the other ranks then read their cache (no sleep).
    """
    from nemo_automodel._transformers import model_init
    from nemo_automodel.components.distributed import utils as dist_utils

    setup.setup_distributed(_config(args.minutes, args.cpu_offload, args.tp), _runtime_config(setup, args.cpu_offload))
    made: list[dict[str, Any]] = []
    real_create = dist_utils._create_gloo_group

    def create_gloo_group() -> Any:
        group = real_create()
        at_s = round(time.monotonic() - start, 2)
        made.append({"desc": group.group_desc, "timeout_min": _timeouts(group), "at_s": at_s})
        return group

    def download(name: str, **kwargs: Any) -> None:
        time.sleep(args.save_seconds if dist.get_rank() == 0 else 0)

    dist_utils._create_gloo_group = create_gloo_group
    model_init.snapshot_download = download
    start = time.monotonic()
    model_init._download_model_weights(None, "nvidia/stand-in-model")
    report["made in from_pretrained"] = made
    report["download_seconds"] = round(time.monotonic() - start, 2)


def _save_mode(setup: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    from nemo_automodel.components.checkpoint._backports import consolidate_hf_safetensors as consolidate

    # torch's defaults, scaled: init_process_group reads this when no timeout is given.
    default = dist.distributed_c10d.default_pg_timeout
    dist.distributed_c10d.default_pg_timeout = datetime.timedelta(seconds=default.total_seconds() * args.scale)
    setup.setup_distributed(_config(args.minutes, True, args.tp), _runtime_config(setup, True))
    report["default_group_timeout_s"] = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.seconds

    def write_slowly(**kwargs: Any) -> None:  # rank 0's file work: the slow NFS write, scaled
        time.sleep(args.save_seconds)

    consolidate._consolidate_safetensors_files = write_slowly
    consolidate._write_overall_metadata_file_from_shards = lambda *a, **k: None
    dist.barrier()  # the ranks start the save together
    start = time.monotonic()
    try:
        # One output file (index 0), so rank 0 does all the writing; then dist.barrier() on the default group.
        consolidate.consolidate_safetensors_files_on_every_rank("in", "out", {"model.weight": 0})
        report["save"] = "completed"
    except Exception as e:  # the failure #3624 reports: the barrier times out while rank 0 still writes
        report["save"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    report["save_seconds"] = round(time.monotonic() - start, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("groups", "save", "pretrained"), default="groups")
    parser.add_argument("--minutes", type=lambda v: None if v == "null" else float(v), default=45.0)
    parser.add_argument("--cpu-offload", action="store_true")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1 / 120, help="save mode: torch's default timeout x this")
    parser.add_argument("--save-seconds", type=float, default=20.0, help="save mode: rank 0's write")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {"rank": rank, "mode": args.mode, "cpu_offload": args.cpu_offload or args.mode == "save"}
    try:
        import nemo_rl.models.automodel.setup as setup

        _install_swaps(setup)
        if args.mode == "groups":
            _groups_mode(setup, args, report)
            dist.barrier()
        elif args.mode == "pretrained":
            _pretrained_mode(setup, args, report)
            dist.barrier()
        else:
            _save_mode(setup, args, report)
    except Exception as e:  # reported, so the driver names the rank and what failed
        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()
    (args.out / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    if dist.is_initialized() and args.mode != "save" and "error" not in report:
        dist.destroy_process_group()
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
