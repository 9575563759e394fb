"""The NCCL path of the Flight Recorder on a GPU machine: torch dumps on a timeout by itself, hang-report reads it.

Run by ``scripts/gpu_check.sh`` with two GPUs or more, as ``python -m tests.scripts.gpu_flight_recorder --nproc 2``
(with the shim, and ``--torch-only``; bounded; exit 0 when the report names what it should, 1 otherwise). On one
GPU the harvest (``tests/scripts/gpu_harvest.py``) takes its place: the same held all_reduce, the rank ending at its
dump, and the dump kept as a fixture. Not a pytest file: it needs CUDA and NCCL.

* One GPU (NCCL cannot put two ranks on one device): a one-rank NCCL world through the real
  ``setup_distributed`` with ``nemo_rl_shim.flight_recorder`` on and a 0.1 min (6 s) timeout. An
  all-reduce is queued behind ``torch.cuda._sleep`` (about 30 s of GPU clock) on the same stream, so
  it cannot finish before the timeout: NCCL's watchdog times it out, and with
  ``TORCH_NCCL_DUMP_ON_TIMEOUT`` (set by the shim) torch writes the dump itself, then aborts the rank.
  Expected first line (after its kind, ``all entered, none finished: ``): ``rank 0 did not finish all_reduce #N on
  default, ranks 0: every member entered it, none finished``.
* Two GPUs or more (``--nproc 2``): rank 1 never enters an all-reduce (it sleeps in Python); rank 0's
  watchdog times out, dumps, and signals rank 1's to dump. Expected (after its kind, ``never came...: ``): ``rank 1
  did not enter all_reduce``.
* ``--torch-only``: the same faults without the shim, as a user who switches the recorder on by hand:
  ``init_process_group`` directly, ``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT`` and
  ``TORCH_FR_DUMP_TEMP_FILE=<dir>/nccl_trace_rank_`` (torch's default name) set in the ranks' environment:
  no sidecar, no group map; the report must name the same rank from torch's dumps alone.
* ``--backend nccl|nccl-legacy`` (torch 2.15): plain ``"nccl"`` is ``ProcessGroupNCCL2``, recorded by torch's
  ``FlightRecorderHook`` (a recorder named ``nccl2``, dumped by the hook when the backend aborts);
  ``nccl-legacy`` the stock ``ProcessGroupNCCL``, which records and dumps itself. Under the shim (which builds
  ``"nccl"`` strings) ``nccl-legacy`` is chosen by ``TORCH_DIST_USE_NCCL2=0``; ``--torch-only`` passes the name
  itself. Each rank reports which backend class it got and, before the stuck all-reduce, probes what its
  recorder writes for a ``batch_isend_irecv`` that completes (a self-exchange, on one GPU): whether each op's entry
  reads completed, and whether a ``coalesced`` entry closes the batch. Those states decide how hang-report judges a
  stuck batch; they are printed, not judged (nobody has seen them on NCCL2 yet).

NOT YET RUN ON A GPU for ``--backend``: written where none was available (#27).
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

    from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed

    section = {
        "automodel_cfg": {"distributed_timeout_minutes": TIMEOUT_MIN},
        "nemo_rl_shim": {"flight_recorder": {"enabled": True, "dump_dir": params["dump_dir"]}},
        "dtensor_cfg": {},
    }
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    setup_distributed(section, RuntimeConfig(cpu_offload=False))
    return _stuck_all_reduce()


def torch_only_rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank without the shim: NCCL straight from torch, the recorder on through the environment alone."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(params["backend"], timeout=datetime.timedelta(minutes=TIMEOUT_MIN))
    return _stuck_all_reduce()


def _backend_facts() -> dict[str, Any]:
    """Which NCCL this rank got, and what its recorder writes for a batch_isend_irecv that completes (one rank: a
    self-exchange; more: a ring), as ``{"class", "name", "batch": [[profiling name, state, p2p_seq_id], ...]}``."""
    import pickle

    import torch
    import torch.distributed as dist

    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    facts: dict[str, Any] = {"class": type(backend).__name__, "name": backend.name()}
    rank, world = dist.get_rank(), dist.get_world_size()
    send, receive = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, receive, (rank - 1) % world)]
    try:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        torch.cuda.synchronize()
    except Exception as error:  # a probe: what it cannot do is a fact too, and the check goes on
        facts["batch_error"] = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    time.sleep(1.0)  # the watchdog (or the hook's completion) marks entries completed on its own thread
    c10d = torch._C._distributed_c10d
    try:
        trace = pickle.loads(c10d._dump_fr_trace(backend=facts["name"]))
    except TypeError:  # before torch 2.15: one recorder for stock NCCL
        trace = {"entries": []}
    if not trace.get("entries") and hasattr(c10d, "_dump_nccl_trace"):
        trace = pickle.loads(c10d._dump_nccl_trace())
    facts["batch"] = [
        [e["profiling_name"], e["state"], e.get("p2p_seq_id")] for e in trace.get("entries", []) if e.get("is_p2p")
    ]
    return facts


def _stuck_all_reduce() -> dict[str, Any]:
    """One good all-reduce, then one that cannot finish: rank 1 never enters it, or (one rank) it waits behind
    ``torch.cuda._sleep`` on the stream."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1024, device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    facts = _backend_facts()
    print(f"BACKEND_FACTS rank {dist.get_rank()}: {facts}", flush=True)  # the rank is usually aborted: print now
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
    parser.add_argument(
        "--backend", choices=("nccl", "nccl-legacy"), default="nccl", help="torch 2.15: NCCL2 (nccl) or the stock one"
    )
    args = parser.parse_args(argv)
    import torch

    from nemo_rl_shim import hang_report
    from nemo_rl_shim.cli import hang_report as hang_report_command
    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
    from nemo_rl_shim.flight_recorder import TORCH_DEFAULT_PREFIX

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print(f"gpu_flight_recorder: needs a CUDA device, found {gpus}", file=sys.stderr)
        return 2
    nproc = args.nproc or (2 if gpus >= 2 else 1)
    with tempfile.TemporaryDirectory(prefix="nemo-rl-shim-fr-nccl-") as tmp:
        start = time.monotonic()
        target = "tests.scripts.gpu_flight_recorder:rank"
        env = {"TORCH_DIST_USE_NCCL2": "0"} if args.backend == "nccl-legacy" else {}
        if args.torch_only:
            target = "tests.scripts.gpu_flight_recorder:torch_only_rank"
            env = {
                "TORCH_FR_BUFFER_SIZE": "2000",
                "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                "TORCH_FR_DUMP_TEMP_FILE": str(Path(tmp) / Path(TORCH_DEFAULT_PREFIX).name),
            }
        params = {"dump_dir": tmp, "backend": args.backend}
        results = spawn_ranks(target, params, world_size=nproc, timeout_s=RANK_BOUND_S, env=env, check=False)
        wall = time.monotonic() - start
        for r in results:
            tail = " | ".join(line for line in r.output.splitlines()[-6:] if line.strip())[-600:]
            print(f"rank {r.rank}: exit {r.returncode}, result {r.result}, error {(r.error or '')[-300:]!r}; {tail}")
        print(f"ranks ended after {wall:.1f} s; files: {sorted(p.name for p in Path(tmp).iterdir())}")
        code, text = hang_report_command.main(tmp)
        print(text)
        report = hang_report.read_run(tmp) if code != hang_report.EXIT_UNREADABLE else None
    if report is None:
        return 1
    writers = {d.rank: d.writer for d in report.dumps.values()}
    recorded = {d.rank: d.backend for d in report.dumps.values()}
    print(f"dump writers: {writers} (torch: written by NCCL's watchdog, or NCCL2's hook, on the timeout)")
    print(f"recorders in the dumps: {recorded}")
    expected = "rank 0 did not finish all_reduce #" if nproc == 1 else "rank 1 did not enter all_reduce #"
    import torch.distributed.distributed_c10d as c10d

    nccl2 = hasattr(c10d, "_create_nccl2_process_group")  # torch 2.15: plain "nccl" is NCCL2, recorded as nccl2
    wanted_recorder = "nccl2" if args.backend == "nccl" and nccl2 else "nccl"
    ok = report.kind.body.startswith(expected) and "torch" in writers.values()
    ok = ok and all(wanted_recorder in b.split(",") for b in recorded.values() if b)
    if args.torch_only:  # torch's dumps alone: every one written by torch, no group map beside them
        ok = ok and set(writers.values()) == {"torch"}
    mode = ("torch-only" if args.torch_only else "shim") + f", {args.backend}"
    print(
        f"gpu_flight_recorder ({mode}): {'OK' if ok else 'FAILED'}: expected a first line starting {expected!r} "
        f"from {wanted_recorder}'s recorder"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
