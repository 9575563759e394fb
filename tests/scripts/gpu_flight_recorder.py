"""The NCCL path of the Flight Recorder on a GPU machine: torch dumps on a timeout by itself, hang-report reads it.

Run by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_flight_recorder`` (bounded; exit 0 when the
report names what it should, 1 otherwise). Not a pytest file: it needs CUDA and NCCL.

* One GPU (NCCL cannot put two ranks on one device): a one-rank NCCL world through the real
  ``setup_distributed`` with ``automodel_cfg.flight_recorder`` on and a 0.1 min (6 s) timeout. An
  all-reduce is queued behind ``torch.cuda._sleep`` (about 30 s of GPU clock) on the same stream, so
  it cannot finish before the timeout: NCCL's watchdog times it out, and with
  ``TORCH_NCCL_DUMP_ON_TIMEOUT`` (set by the shim) torch writes the dump itself, then aborts the rank.
  Expected first line: ``rank 0 did not finish all_reduce #N on default, ranks 0: every member entered
  it, none finished``.
* Two GPUs or more (``--nproc 2``): rank 1 never enters an all-reduce (it sleeps in Python); rank 0's
  watchdog times out, dumps, and signals rank 1's to dump. Expected: ``rank 1 did not enter all_reduce``.
* ``--torch-only``: the same faults without the shim, as a user who switches the recorder on by hand:
  ``init_process_group("nccl")`` directly, ``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT`` and
  ``TORCH_FR_DUMP_TEMP_FILE=<dir>/nccl_trace_rank_`` (torch's default name) set in the ranks' environment:
  no sidecar, no group map; the report must name the same rank from torch's dumps alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "rank", "torch_only_rank"]

TIMEOUT_MIN = 0.1  # 6 s
GPU_SLEEP_S = 30.0
RANK_BOUND_S = 150.0


def rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: set up NCCL with the recorder on, one good all-reduce, then the one that cannot finish."""
    import torch

    from nemo_rl_shim.distributed_setup import RuntimeConfig, setup_distributed

    section = {
        "automodel_cfg": {
            "distributed_timeout_minutes": TIMEOUT_MIN,
            "flight_recorder": {"enabled": True, "dump_dir": params["dump_dir"]},
        },
        "dtensor_cfg": {},
    }
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    setup_distributed(section, RuntimeConfig(cpu_offload=False))
    return _stuck_all_reduce()


def torch_only_rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank without the shim: NCCL straight from torch, the recorder on through the environment alone."""
    import datetime

    del params  # the dump folder is in TORCH_FR_DUMP_TEMP_FILE, as a user would set it

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=TIMEOUT_MIN))
    return _stuck_all_reduce()


def _stuck_all_reduce() -> dict[str, Any]:
    """One good all-reduce, then one that cannot finish: rank 1 never enters it, or (one rank) it waits behind
    ``torch.cuda._sleep`` on the stream."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1024, device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    if dist.get_world_size() > 1 and dist.get_rank() == 1:
        time.sleep(GPU_SLEEP_S + 60)  # never enters; killed by the bound, or by the abort of its group
        return {"rank": 1, "outcome": "slept"}
    if dist.get_world_size() == 1:
        khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 2_000_000  # H100/H200: ~1.98 GHz
        torch.cuda._sleep(int(GPU_SLEEP_S * khz * 1000))  # the all-reduce below waits behind this on the stream
    start = time.monotonic()
    try:
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
    except Exception as error:  # usually the watchdog aborts the process before this returns
        return {"rank": dist.get_rank(), "outcome": "raised", "error": str(error)[:300], "s": time.monotonic() - start}
    return {"rank": dist.get_rank(), "outcome": "completed", "s": time.monotonic() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: 2 with two GPUs or more, else 1)")
    parser.add_argument("--torch-only", action="store_true", help="no shim: torch's recorder switched on by hand")
    args = parser.parse_args(argv)
    import torch

    from nemo_rl_shim.cli import hang_report
    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
    from nemo_rl_shim.flight_recorder import TORCH_DEFAULT_PREFIX

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print(f"gpu_flight_recorder: needs a CUDA device, found {gpus}", file=sys.stderr)
        return 2
    nproc = args.nproc or (2 if gpus >= 2 else 1)
    with tempfile.TemporaryDirectory(prefix="nemo-rl-shim-fr-nccl-") as tmp:
        start = time.monotonic()
        target, env = "tests.scripts.gpu_flight_recorder:rank", None
        if args.torch_only:
            target = "tests.scripts.gpu_flight_recorder:torch_only_rank"
            env = {
                "TORCH_FR_BUFFER_SIZE": "2000",
                "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                "TORCH_FR_DUMP_TEMP_FILE": str(Path(tmp) / Path(TORCH_DEFAULT_PREFIX).name),
            }
        results = spawn_ranks(target, {"dump_dir": tmp}, world_size=nproc, timeout_s=RANK_BOUND_S, env=env, check=False)
        wall = time.monotonic() - start
        for r in results:
            tail = " | ".join(line for line in r.output.splitlines()[-6:] if line.strip())[-600:]
            print(f"rank {r.rank}: exit {r.returncode}, result {r.result}, error {(r.error or '')[-300:]!r}; {tail}")
        print(f"ranks ended after {wall:.1f} s; files: {sorted(p.name for p in Path(tmp).iterdir())}")
        code, text = hang_report.main(tmp)
        print(text)
        report = hang_report.build_report(tmp) if code != hang_report.EXIT_UNREADABLE else None
    if report is None:
        return 1
    writers = {d.rank: d.writer for d in report.dumps.values()}
    print(f"dump writers: {writers} (torch: written by NCCL's watchdog on the timeout)")
    expected = "rank 0 did not finish all_reduce #" if nproc == 1 else "rank 1 did not enter all_reduce #"
    ok = report.line.startswith(expected) and "torch" in writers.values()
    if args.torch_only:  # torch's dumps alone: every one written by torch, no group map beside them
        ok = ok and set(writers.values()) == {"torch"}
    mode = "torch-only" if args.torch_only else "shim"
    print(f"gpu_flight_recorder ({mode}): {'OK' if ok else 'FAILED'}: expected a first line starting {expected!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
