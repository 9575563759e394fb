"""The NeMo RL pull request's one-GPU test, without NeMo RL: torch's default for new groups reaches both halves.

Run by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_default_timeout`` (exit 0 when every group's
every backend reads the value, 1 when one does not, 2 without a CUDA device). Not a pytest file: it needs CUDA
and NCCL. NeMo RL's source is not on the GPU machine, so this repeats what its test
(``test_setup_distributed_timeout_reaches_both_halves_on_one_gpu``, ``nemo_rl_shim/upstream/0004-*``) checks
after ``setup_distributed``, with the mechanism of ``0002-*`` written out:

1. ``distributed_c10d.default_pg_timeout`` and ``default_pg_nccl_timeout`` set to 45 min (torch's default for
   new groups), then a one-rank ``"cuda:nccl,cpu:gloo"`` default group (CPU offload's);
2. a mesh sub-group (``init_device_mesh`` with a backend override, as Automodel's mesh code makes them) and a
   Gloo group made later (as Automodel makes them inside ``from_pretrained``);
3. every backend of every group read back (``options._timeout``).

Each of ``OFF`` and ``DETAIL`` (``TORCH_DISTRIBUTED_DEBUG``, whose wrapped backends torch 2.11's
``_set_pg_timeout`` may not reach) runs in a fresh process. ``--cpu`` runs the same on Gloo: this script's own
logic, on a machine without a GPU (the NCCL half is then not exercised).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["MINUTES", "main", "read_back"]

MINUTES = 45.0
CHILD_BOUND_S = 240


def read_back(on_gpu: bool) -> dict[str, float]:
    """In this process: the default for new groups, the default group, a mesh sub-group, a later group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = datetime.timedelta(minutes=MINUTES)
    backend = "cuda:nccl,cpu:gloo" if on_gpu else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        device = "cuda" if on_gpu else "cpu"
        init_device_mesh(device, (1,), mesh_dim_names=("tp",), backend_override={"tp": backend})
        dist.new_group(backend="gloo", group_desc="later")
        return {
            f"{group.group_desc} {d.type} {type(group._get_backend(d)).__name__}": (
                group._get_backend(d).options._timeout.total_seconds() / 60
            )
            for group in c10d._world.pg_map
            for d in group._device_types
        }
    finally:
        dist.destroy_process_group()


def _child(on_gpu: bool, debug: str) -> dict[str, Any]:
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": debug}
    cmd = [sys.executable, "-m", "tests.scripts.gpu_default_timeout", "--child"] + ([] if on_gpu else ["--cpu"])
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_BOUND_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {CHILD_BOUND_S} s"}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return {"timeouts": json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="Gloo only: this script's logic without a GPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(read_back(not args.cpu)))
        return 0
    if not args.cpu:
        import torch

        if torch.cuda.device_count() < 1:
            print(f"gpu_default_timeout: needs 1 CUDA device, found {torch.cuda.device_count()}")
            return 2
    failed = False
    halves = ("cuda", "cpu") if not args.cpu else ("cpu",)
    for debug in ("OFF", "DETAIL"):
        result = _child(not args.cpu, debug)
        timeouts = result.get("timeouts", {})
        groups = {" ".join(key.split()[:2]) for key in timeouts}
        wanted = {f"{group} {half}" for group in ("default_pg", "mesh_tp") for half in halves}
        ok = "error" not in result and wanted <= groups and set(timeouts.values()) == {MINUTES}
        failed |= not ok
        print(f"TORCH_DISTRIBUTED_DEBUG={debug}: {'ok' if ok else 'FAILED'} {json.dumps(result)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
