"""For ``tests/scripts/gpu_default_timeout.py``: the NeMo RL pull request's two-GPU test body, without NeMo RL.

NeMo RL's source is not on the GPU machine, so this writes out what its ``setup_distributed`` does with
``automodel_cfg.distributed_timeout_minutes`` set (``nemo_rl_shim/upstream/0002-*``) and what its set-up test
checks after it (``test_cpu_offload_timeout_on_every_mesh_axis_two_gpus``, ``0004-*``):

1. the value made torch's default for new groups (``distributed_c10d.default_pg_timeout`` and
   ``default_pg_nccl_timeout``), then ``init_process_group(backend, timeout=...)``: ``"cuda:nccl,cpu:gloo"`` under
   CPU offload, ``"nccl"`` without;
2. the device mesh as the pinned Automodel's ``create_device_mesh`` builds it, without a timeout: the axes
   ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` (all data parallel on ``dp_shard``), and the flattened
   ``dp``, ``dp_shard_cp`` and ``dp_cp``;
3. on the default group and every axis, each backend read back (its class, its object, ``options._timeout``) and
   used: an all-reduce of a CPU tensor on the Gloo half, of a CUDA tensor on the NCCL half;
4. an FSDP2 parameter sharded on ``dp`` (CPU-offloaded under CPU offload), gathered whole by ``full_tensor()``,
   as NeMo RL's ``prepare_refit_info`` gathers it.

``device="cpu"``: Gloo stands in for NCCL, as in the NeMo RL test's CPU twin: ``"cuda:nccl,cpu:gloo"`` becomes
``"cuda:<stand-in>,cpu:gloo"`` (a Gloo backend registered for the ``cuda`` device, so each half keeps its own
object), the mesh is built on ``cpu``, and the stand-in's own object all-reduces a CPU tensor. Nothing here
asserts: :func:`problems` judges the reports.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from tests.ranks.mesh_timeouts import CUDA_STAND_IN

__all__ = ["MESH_AXES", "ROWS_PER_RANK", "problems", "rank"]

#: The axes the pinned Automodel's ``create_device_mesh`` makes, and those it flattens from them.
MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp")
#: The rows of the sharded parameter each rank holds.
ROWS_PER_RANK = 4
#: The axes Automodel flattens, from which dimensions.
_FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


def _gloo_stand_in(store: Any, group_rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return dist.ProcessGroupGloo(store, group_rank, size, timeout)


def _init(params: dict[str, Any]) -> None:
    """Step 1, the pull request's mechanism: torch's default for new groups, then ``timeout=`` to the default group."""
    on_gpu, offload = params["device"] == "cuda", params["cpu_offload"]
    timeout = datetime.timedelta(minutes=params["minutes"])
    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        backend = "cuda:nccl,cpu:gloo" if offload else "nccl"
    else:
        if CUDA_STAND_IN not in dist.Backend.backend_list:
            dist.Backend.register_backend(CUDA_STAND_IN, _gloo_stand_in, devices=["cuda"])
        backend = f"cuda:{CUDA_STAND_IN},cpu:gloo" if offload else "gloo"
    dist.init_process_group(backend, timeout=timeout)


def _mesh(device: str) -> tuple[Any, dict[str, Any]]:
    """Step 2: the mesh as the pinned ``create_device_mesh`` builds it without a timeout; every axis's mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    mesh = init_device_mesh(device, (1, 1, dist.get_world_size(), 1, 1), mesh_dim_names=names)
    axes = {name: mesh[name] for name in names}
    for flat, dims in _FLATTENED.items():
        axes[flat] = mesh[dims]._flatten(mesh_dim_name=flat)
    return mesh, axes


def _read(group: Any, on_gpu: bool) -> dict[str, Any]:
    """Step 3: each backend of ``group``, read back and used."""
    backends = {d.type: group._get_backend(d) for d in group._device_types}
    read = {}
    for device, backend in backends.items():
        if device == "cuda" and not on_gpu:  # no CUDA: the stand-in's own Gloo object reduces a CPU tensor
            tensor = torch.ones(1)
            backend.allreduce([tensor]).wait()
        else:
            tensor = torch.ones(1, device=device)
            dist.all_reduce(tensor, group=group)
        read[device] = {
            "backend": type(backend).__name__,
            "object": id(backend),  # the backends above are alive, so their ids are distinct
            "timeout_min": backend.options._timeout.total_seconds() / 60,
            "all_reduce": tensor.item(),
            "size": group.size(),
        }
    return read


def _gathered(axis: Any, offload: bool) -> dict[str, Any]:
    """Step 4: a parameter sharded on ``dp`` by FSDP2, CPU-offloaded under CPU offload, gathered by full_tensor()."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    from torch.distributed.tensor import Shard

    rows = ROWS_PER_RANK * axis.size()
    expected = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    module = torch.nn.Linear(2, rows, bias=False)
    with torch.no_grad():
        module.weight.copy_(expected)
    fully_shard(module, mesh=axis, offload_policy=CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy())
    weight = module.weight
    return {
        "device": weight.device.type,
        "sharded_on_dp": weight.placements == (Shard(0),),
        "local_rows": weight.to_local().shape[0],
        "full_tensor_whole": bool(torch.equal(weight.full_tensor().cpu(), expected)),
    }


def rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: ``params`` holds ``device`` (cuda or cpu), ``cpu_offload`` and ``minutes``."""
    on_gpu = params["device"] == "cuda"
    _init(params)
    _, axes = _mesh(params["device"])
    groups = {"default": dist.group.WORLD, **{name: mesh.get_group() for name, mesh in axes.items()}}
    read = {name: _read(group, on_gpu) for name, group in groups.items()}
    report = {"rank": dist.get_rank(), "backend": dist.get_backend(), "axes": read}
    report["param"] = _gathered(axes["dp"], params["cpu_offload"])
    dist.destroy_process_group()
    return report


def problems(reports: list[dict[str, Any]], minutes: float, cpu_offload: bool, world_size: int) -> list[str]:
    """What the NeMo RL test asserts, as a list: each half of every axis at ``minutes`` and reducing over its group
    (two backend objects under CPU offload), the parameter back whole (on the CPU under CPU offload)."""
    found = []
    if len(reports) != world_size:
        found.append(f"{len(reports)} reports of {world_size} ranks")
    halves = {"cuda", "cpu"} if cpu_offload else None
    for report in reports:
        where, axes = f"rank {report['rank']}", report["axes"]
        missing = sorted(set(("default", *MESH_AXES)) - set(axes))
        if missing:
            found.append(f"{where}: no group read for {missing}")
        for name, axis in axes.items():
            if halves is not None and set(axis) != halves:
                found.append(f"{where} {name}: halves {sorted(axis)}, expected {sorted(halves)}")
            if halves is not None and len({h["object"] for h in axis.values()}) != 2:
                found.append(f"{where} {name}: one backend object for both halves")
            for half, h in axis.items():
                if h["timeout_min"] != minutes:
                    found.append(f"{where} {name} {half} ({h['backend']}): {h['timeout_min']:g} min, not {minutes:g}")
                if h["all_reduce"] != h["size"]:
                    found.append(f"{where} {name} {half}: all-reduce gave {h['all_reduce']}, not {h['size']}")
        param = report["param"]
        if not (param["sharded_on_dp"] and param["local_rows"] == ROWS_PER_RANK and param["full_tensor_whole"]):
            found.append(f"{where}: the dp-sharded parameter did not come back whole: {param}")
        if cpu_offload and param["device"] != "cpu":
            found.append(f"{where}: the parameter is on {param['device']}, not offloaded to the CPU")
    return found
