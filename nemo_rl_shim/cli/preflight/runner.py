"""The one interface of preflight's four runners: what a runner can hold, and running the checks on it.

A runner (:mod:`~nemo_rl_shim.cli.preflight.spawn`, :mod:`~nemo_rl_shim.cli.preflight.join`,
:mod:`~nemo_rl_shim.cli.preflight.ray_actors`, :mod:`~nemo_rl_shim.cli.preflight.dry_run`) is a
context manager (entered once per run, so one that holds a connection can close it) with:

* :meth:`Runner.capacity`: what it can hold (:class:`Capacity`): GPUs for one rank each, or a
  world that is already set (a launcher's, a dry run's training world);
* :meth:`Runner.plan`: the ranks it starts for a number of ranks (``None``: its default);
* :meth:`Runner.run`: run :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank` on those
  ranks and return every rank's typed result (:mod:`~nemo_rl_shim.cli.preflight.results`) with the
  runner's own notes (:class:`RankRun`);
* :attr:`Runner.reports`: whether this process prints the report. It is the one place that decides
  it: every runner's one process does, except in a launcher's world, where rank 0 alone does
  (:attr:`Runner.joined`: this process is a rank of that world, and ends at once after it).

:func:`nemo_rl_shim.cli.preflight.run.run_preflight` sizes the world, assembles the report and
finds the problems, once, for all four. Every rank gets the same launcher variables
(:func:`rank_env`), as torchrun sets them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from nemo_rl_shim.cli.preflight.options import MIN_RANKS, PreflightOptions
from nemo_rl_shim.cli.preflight.results import RankOutcome

__all__ = [
    "PROGRESS_EVERY_S",
    "Capacity",
    "Progress",
    "RankLimit",
    "RankPlan",
    "RankRun",
    "Runner",
    "available_memory_mib",
    "plan_ranks",
    "rank_env",
]

#: How often a runner that waits says it is still waiting.
PROGRESS_EVERY_S = 10.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Capacity:
    """What a runner can hold: ``gpus`` (one rank each), or ``world`` when its world is already set."""

    gpus: int = 0
    #: A world the runner cannot change (a torchrun/srun world, a dry run's); None: sized by preflight.
    world: int | None = None
    #: Where the ranks would run, in words, for a world that does not fit (``"this machine can run 2 CPU ranks"``).
    here: str = ""


@dataclass(frozen=True)
class RankPlan:
    """How many ranks, on which device (``"cuda"``, ``"cpu"``, ``"fake"``; ``"launcher"``: as it placed them), with
    which extra environment."""

    world_size: int
    device: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RankLimit:
    """How many ranks of one kind a runner can start, and where, in words, for the line that refuses more
    (``RankLimit(4, "the 4 CUDA devices")``)."""

    ranks: int
    named: str


@dataclass(frozen=True)
class RankRun:
    """What a runner returns: every rank's result (checked or failed) and the runner's own notes."""

    launcher: str
    world_size: int
    ranks: tuple[RankOutcome, ...]
    #: One line under the heading (``"no CUDA device: CPU ranks on gloo"``).
    note: str | None = None
    timed_out: bool = False
    #: What the runner itself found (an actor that died, a placement that failed); empty: read from the rows.
    problems: tuple[str, ...] = ()
    #: Lines under the heading, and keys of the JSON report, that only this runner has.
    details: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Where preflight's ranks run; see the module docstring. Subclasses implement the three methods."""

    #: This process prints the report (see the module docstring).
    reports: bool = True
    #: This process is a rank of a launcher's world: it ends at once after the report.
    joined: bool = False

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        return None

    def capacity(self, options: PreflightOptions) -> Capacity:
        raise NotImplementedError

    def plan(self, ranks: int | None) -> RankPlan:
        raise NotImplementedError

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        raise NotImplementedError


def plan_ranks(nproc: int | None, gpus: RankLimit, cpus: RankLimit) -> RankPlan:
    """One rank per GPU when there are at least :data:`MIN_RANKS`, else ``nproc`` (default 2) CPU ranks.

    ``nproc`` is validated by :func:`~nemo_rl_shim.cli.preflight.options.build_options` (at least
    :data:`MIN_RANKS`). More ranks than ``gpus`` raises ``ValueError`` (NCCL needs one GPU per rank),
    and so do more CPU ranks than ``cpus`` can hold, naming the number and the limit, before any
    rank starts. CPU ranks see no CUDA device.
    """
    if gpus.ranks >= MIN_RANKS:
        if nproc is not None and nproc > gpus.ranks:
            raise ValueError(f"--nproc {nproc} exceeds {gpus.named}: NCCL needs one per rank")
        return RankPlan(nproc or gpus.ranks, "cuda")
    if nproc is not None and nproc > cpus.ranks:
        raise ValueError(f"--nproc {nproc} exceeds {cpus.named}")
    return RankPlan(nproc or MIN_RANKS, "cpu", {"CUDA_VISIBLE_DEVICES": ""})


def rank_env(rank: int, world_size: int, local_rank: int) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` of one rank, as torchrun sets them."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)}


def available_memory_mib(meminfo: str = "/proc/meminfo") -> int | None:
    """The memory this machine can still give (``MemAvailable``), in MiB; None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (OSError, ValueError, AttributeError):
        return None
