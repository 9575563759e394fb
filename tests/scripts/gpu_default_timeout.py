"""The NeMo RL pull request's GPU tests, without NeMo RL: the two-GPU CPU-offload body, or the one-rank path.

Run by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_default_timeout``. Not a pytest file: it needs CUDA
and NCCL (``--cpu`` excepted). NeMo RL's source is not on the GPU machine, so the ranks
(:mod:`tests.ranks.offload_timeout`) write out the pull request's mechanism (``nemo_rl_shim/upstream/0002-*``) and
check what its set-up tests (``0004-*``) check after ``setup_distributed``. Which one runs depends on the GPUs found,
and the first line says which:

* two GPUs or more: ``test_cpu_offload_timeout_on_every_mesh_axis_two_gpus``'s body on two ranks, CPU offload on
  (``"cuda:nccl,cpu:gloo"``): both halves of the default group and of every mesh axis read 45 min, all-reduce on
  CPU and CUDA, and a CPU-offloaded parameter sharded on ``dp`` comes back whole through ``full_tensor()``;
* one GPU: ``test_timeout_without_cpu_offload_one_gpu``'s path, one rank, CPU offload off (``"nccl"``), which is
  what NeMo RL accepts on one rank (it refuses CPU offload there); the two-GPU body does NOT run, and the line
  says so;
* ``--cpu``: the two-GPU body on two CPU ranks, Gloo standing in for NCCL (the NeMo RL test's CPU twin); CI runs it.

Exit 0 when every check holds, 1 when one does not, 2 without a CUDA device (and no ``--cpu``). Each rank is
bounded at ``RANK_BOUND_S`` and started fresh.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["MINUTES", "RANK_BOUND_S", "main", "plan"]

MINUTES = 45.0
RANK_BOUND_S = 240.0


def plan(gpus: int, cpu: bool) -> tuple[dict[str, object], int, str] | None:
    """(the ranks' params, how many ranks, the line saying which path runs) for ``gpus`` GPUs, or None for none."""
    if cpu:
        params = {"device": "cpu", "cpu_offload": True, "minutes": MINUTES}
        return params, 2, "ran: the two-GPU CPU-offload body on 2 CPU ranks, Gloo standing in for NCCL (--cpu)"
    if gpus >= 2:
        params = {"device": "cuda", "cpu_offload": True, "minutes": MINUTES}
        return params, 2, f"ran: the two-GPU CPU-offload body on 2 ranks, cuda:nccl,cpu:gloo (found {gpus} GPUs)"
    if gpus == 1:
        params = {"device": "cuda", "cpu_offload": False, "minutes": MINUTES}
        said = "ran: the one-rank path NeMo RL accepts, nccl, CPU offload off (found 1 GPU); "
        return params, 1, said + "the two-GPU CPU-offload body did NOT run: it needs 2 GPUs"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the two-GPU body on two CPU ranks, Gloo for NCCL")
    args = parser.parse_args(argv)
    import torch

    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
    from tests.ranks.offload_timeout import problems

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen = plan(gpus, args.cpu)
    if chosen is None:
        print(f"gpu_default_timeout: needs 1 CUDA device, found {gpus}; nothing ran")
        return 2
    params, nproc, said = chosen
    print(f"gpu_default_timeout: {said}")
    start = time.monotonic()
    results = spawn_ranks(
        "tests.ranks.offload_timeout:rank", params, world_size=nproc, timeout_s=RANK_BOUND_S, check=False
    )
    found = [f"rank {r.rank}: no result (exit {r.returncode}): {(r.error or '')[-300:]}" for r in results if not r.ok]
    reports = [r.result for r in results if r.ok]
    found += problems(reports, MINUTES, bool(params["cpu_offload"]), nproc)
    for report in reports:
        print(f"rank {report['rank']}: {json.dumps(report, sort_keys=True)}")
    print(f"ranks ended after {time.monotonic() - start:.1f} s")
    for problem in found:
        print(f"gpu_default_timeout: {problem}")
    print(f"gpu_default_timeout: {'FAILED' if found else 'OK'} ({nproc} rank(s), {MINUTES:g} min)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
