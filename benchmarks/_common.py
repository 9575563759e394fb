"""Helpers shared by ``startup_cost.py``, ``process_groups.py`` and ``hang_detection.py``.

Driver side: run the rank function on real local processes
(:func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`), print tables, write JSON under
``benchmarks/results/``. Rank side: :class:`RankSync`, a key-value store that
outlives every process group, so one set of rank processes (paying torch's and
Automodel's import once) can create, use and destroy several default groups in
turn, on 2 or 4 of its ranks, each time on a fresh port.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "ROOT",
    "RankSync",
    "build_directly",
    "environment",
    "median",
    "print_table",
    "run_ranks",
    "set_rank_env",
    "write_results",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"


def median(values: Iterable[float]) -> float:
    """Median of ``values``; raises ``ValueError`` naming the rule when there are none."""
    values = list(values)
    if not values:
        raise ValueError("median needs at least one value, got none")
    return statistics.median(values)


def environment() -> dict[str, Any]:
    """Facts about the machine the figures come from (load matters: helpers share the CPU)."""
    import torch

    try:
        from importlib.metadata import version

        automodel = version("nemo-automodel")
    except Exception:  # reported as None, not needed
        automodel = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nemo_automodel": automodel,
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "load_average_1_5_15": list(os.getloadavg()),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


#: Keys holding per-run and per-call raw data: kept in the raw file only, never in the committed summary.
BULKY_KEYS = frozenset({"runs", "facts", "calls", "samples", "minimum"})


def _summary(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _summary(v) for k, v in value.items() if k not in BULKY_KEYS}
    if isinstance(value, list):
        return [_summary(v) for v in value]
    return value


def write_results(name: str, data: dict[str, Any], *, rerun: str | None = None) -> Path:
    """Write the summary to ``benchmarks/results/<name>.json`` (committed: what the README quotes) and
    everything, per-run samples included, to ``benchmarks/results/raw/<name>.json`` (ignored by git;
    rerun the benchmark, ``rerun`` or ``benchmarks/<name>.py``, to regenerate it). Returns the summary's path."""
    raw = RESULTS_DIR / "raw" / f"{name}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(data, indent=2, default=str) + "\n")
    path = RESULTS_DIR / f"{name}.json"
    command = rerun or f"benchmarks/{name}.py"
    summary = {**_summary(data), "raw": f"{raw.relative_to(ROOT)} (not committed: rerun {command})"}
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return path


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain-text table with a title line."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  " + "  ".join("-" * width for width in widths))


def run_ranks(target: str, params: Any, *, world_size: int, timeout_s: float) -> tuple[list[Any], float]:
    """Run ``target`` on ``world_size`` local ranks; return every rank's result and the wall time.

    The repository root goes first on the ranks' ``PYTHONPATH`` so ``benchmarks.*``
    imports wherever the script was started from. Any failed rank raises
    :class:`nemo_rl_shim.cli.preflight.spawn.RanksFailed` with its traceback.
    """
    from nemo_rl_shim.cli.preflight.spawn import spawn_ranks

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    results = spawn_ranks(target, params, world_size=world_size, timeout_s=timeout_s, env={"PYTHONPATH": path})
    return [r.result for r in results], time.perf_counter() - start


def build_directly(
    world: int, *, tp: int = 1, cp: int = 1, ep: int = 1, dp_replicate: int = 1, timeout_minutes: float
) -> Any:
    """The baseline: Automodel's ``MeshContext.build`` called directly, as a caller without the shim would."""
    from nemo_automodel.components.distributed import config as am_config
    from nemo_automodel.components.distributed import mesh as am_mesh

    return am_mesh.MeshContext.build(
        am_config.FSDP2Config(),
        am_mesh.ParallelismSizes(dp_replicate_size=dp_replicate, tp_size=tp, cp_size=cp, ep_size=ep, pp_size=1),
        world_size=world,
        timeout_minutes=timeout_minutes,
    )


def set_rank_env(rank: int, world_size: int, port: int) -> None:
    """Point ``env://`` rendezvous (what ``setup_distributed`` uses) at ``port`` for ``world_size`` ranks."""
    from nemo_rl_shim.cli.preflight.spawn import launcher_env

    os.environ.update(launcher_env(rank, world_size, port))


class RankSync:
    """Barriers, fresh ports and small values shared by all launched ranks, independent of any process group.

    Lives on the launcher's ``MASTER_PORT``; every default group the benchmark
    creates uses a port rank 0 picks afresh (:meth:`port`), so a new rendezvous
    never meets the store of a group that another rank has not torn down yet.
    """

    def __init__(self, timeout_s: float = 300.0) -> None:
        import datetime

        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.store = dist.TCPStore(
            "127.0.0.1",
            int(os.environ["MASTER_PORT"]),
            self.world_size,
            self.rank == 0,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self.timeout_s = timeout_s

    def barrier(self, key: str, count: int | None = None) -> None:
        """Wait until ``count`` ranks (default: all launched) have reached ``key``.

        Blocks in the store (no polling), so ranks that wait take no CPU from
        the ranks being timed. Raises on the store's timeout.
        """
        count = self.world_size if count is None else count
        if int(self.store.add(f"barrier/{key}", 1)) == count:
            self.store.set(f"barrier/{key}/open", "1")
        self.store.wait([f"barrier/{key}/open"])

    def port(self, key: str) -> int:
        """A free loopback port chosen by rank 0, the same on every rank that asks for ``key``."""
        if self.rank == 0:
            from nemo_rl_shim.cli.preflight.spawn import free_port

            self.store.set(f"port/{key}", str(free_port()))
        return int(self.store.get(f"port/{key}"))

    def put(self, key: str, value: Any) -> None:
        """Publish a JSON-able ``value`` under ``key`` (per rank: include the rank in ``key``)."""
        self.store.set(f"value/{key}", json.dumps(value))

    def get(self, key: str) -> Any:
        """Read a value some rank published with :meth:`put` (waits for it)."""
        return json.loads(self.store.get(f"value/{key}"))
