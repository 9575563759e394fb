"""The NCCL half of ``set_mesh_timeouts`` on a GPU machine: the timeout set after the build is the one NCCL keeps.

Run by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_mesh_timeouts`` (bounded; exit 0 when every
check holds, 1 when one does not, 2 without two CUDA devices). Not a pytest file: it needs CUDA and NCCL.

Each rank (two, or four with four GPUs or more) joins a ``"cuda:nccl,cpu:gloo"`` default group (CPU
offload's) with torch's default timeout, builds the meshes without a timeout (the installed
nemo-automodel's ``MeshContext.build`` without ``timeout_minutes``, or ``create_device_mesh`` on 0.3.0 /
0.4.0), and calls :func:`nemo_rl_shim.process_groups.setting.set_mesh_timeouts` with 0.2 min (12 s). Checked:
every group reads 0.2 min on both halves; then on one axis (``tp`` with four ranks; ``dp_shard`` with
two, which is the default group itself) the axis' last rank never joins an all-reduce, and each other
rank's all-reduce must fail after about 12 s (``TORCH_NCCL_BLOCKING_WAIT=1`` raises it in the caller),
not after NCCL's 10-minute default.

``--cpu`` runs the same ranks on Gloo with CPU tensors: the script's own logic, checked on a machine
without GPUs (the NCCL half is then not exercised).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

__all__ = ["STALL_MINUTES", "main", "rank"]

STALL_MINUTES = 0.2  # 12 s
RANK_BOUND_S = 180.0
_STORE_WAIT_S = 120


def _stall(group: Any, device: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group)
    if dist.get_rank() == ranks[-1]:
        return {"ranks": ranks, "outcome": "skipped"}
    tensor = torch.ones(1, device=device)
    start = time.monotonic()
    try:
        dist.all_reduce(tensor, group=group)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as error:
        return {"ranks": ranks, "outcome": "raised", "error": str(error)[:300], "s": time.monotonic() - start}
    return {"ranks": ranks, "outcome": "completed", "s": time.monotonic() - start}


def rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: the composite default group, meshes without a timeout, set_mesh_timeouts, the stalled all-reduce."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.process_groups.setting import set_mesh_timeouts
    from tests.ranks.mesh_timeouts import build_without_timeout

    device = params["device"]
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(params["backend"])
    layout = {"name": "tp", "tp": 2} if dist.get_world_size() >= 4 else {"name": "dp"}
    device_mesh, moe_mesh, builder = build_without_timeout(layout, backend="nccl" if device == "cuda" else "gloo")
    read = set_mesh_timeouts(device_mesh, moe_mesh, STALL_MINUTES)
    axis = "tp" if layout["name"] == "tp" else "dp_shard"
    stall = _stall(device_mesh.get_group(axis), device)
    store = dist.distributed_c10d._get_default_store()
    store.set(f"left the stall {dist.get_rank()}", "1")
    store.wait([f"left the stall {r}" for r in range(dist.get_world_size())], datetime.timedelta(seconds=_STORE_WAIT_S))
    return {"rank": dist.get_rank(), "builder": builder, "axis": axis, "read_back": read, "stall": stall}


def _problems(results: list[Any]) -> list[str]:
    problems = []
    for r in results:
        if r.result is None:
            problems.append(f"rank {r.rank}: no result (exit {r.returncode}): {(r.error or '')[-300:]}")
            continue
        for group, minutes in r.result["read_back"].items():
            if set(minutes.values()) != {STALL_MINUTES}:
                problems.append(f"rank {r.rank}: group {group} reads {minutes}, set {STALL_MINUTES:g} min")
        stall = r.result["stall"]
        if stall["outcome"] == "skipped":
            continue
        if stall["outcome"] != "raised" or not STALL_MINUTES * 60 * 0.8 <= stall["s"] < 60:
            problems.append(f"rank {r.rank}: the all-reduce on {r.result['axis']} should fail after ~12 s: {stall}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on Gloo with CPU tensors (the script's logic only)")
    args = parser.parse_args(argv)
    import torch

    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.cpu:
        params, nproc = {"device": "cpu", "backend": "gloo"}, 4
    elif gpus < 2:
        print(f"gpu_mesh_timeouts: Need 2 CUDA devices, got {gpus}", file=sys.stderr)
        return 2
    else:
        params, nproc = {"device": "cuda", "backend": "cuda:nccl,cpu:gloo"}, 4 if gpus >= 4 else 2
    start = time.monotonic()
    results = spawn_ranks(
        "tests.scripts.gpu_mesh_timeouts:rank",
        params,
        world_size=nproc,
        timeout_s=RANK_BOUND_S,
        env={"TORCH_NCCL_BLOCKING_WAIT": "1"},
        check=False,
    )
    for r in results:
        print(f"rank {r.rank}: exit {r.returncode}, result {r.result}, error {(r.error or '')[-300:]!r}")
    problems = _problems(results)
    print(f"ranks ended after {time.monotonic() - start:.1f} s")
    for problem in problems:
        print(f"gpu_mesh_timeouts: {problem}")
    print(f"gpu_mesh_timeouts: {'FAILED' if problems else 'OK'} ({params['backend']}, {nproc} ranks)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
