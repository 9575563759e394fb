"""The one interface of preflight's four runners: what a runner can hold, and running the checks on it.

A runner (:mod:`~nemo_rl_shim.cli.preflight.spawn`, :mod:`~nemo_rl_shim.cli.preflight.join`,
:mod:`~nemo_rl_shim.cli.preflight.ray_actors`, :mod:`~nemo_rl_shim.cli.preflight.dry_run`) is a
context manager (entered once per run, so one that holds a connection can close it) with:

* :meth:`Runner.capacity`: what it can hold (:class:`Capacity`): GPUs for one rank each, or a
  world that is already set (a launcher's, a dry run's training world);
* :meth:`Runner.plan`: the ranks it starts for a number of ranks (``None``: its default);
* :meth:`Runner.run`: run :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank` on those
  ranks and return the rank rows with the runner's own notes (:class:`RankRun`).

:func:`nemo_rl_shim.cli.preflight.run.run_preflight` sizes the world, assembles the report and
finds the problems, once, for all four. Every rank gets the same launcher variables
(:func:`rank_env`), as torchrun sets them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from nemo_rl_shim.cli.preflight.options import MIN_RANKS, PreflightOptions

__all__ = ["PROGRESS_EVERY_S", "Capacity", "Progress", "RankPlan", "RankRun", "Runner", "plan_ranks", "rank_env"]

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


@dataclass
class RankRun:
    """What a runner returns: every rank's result (or failure) and the runner's own notes."""

    launcher: str
    world_size: int
    ranks: list[dict[str, Any]]
    #: One line under the heading (``"no CUDA device: CPU ranks on gloo"``).
    note: str | None = None
    timed_out: bool = False
    #: What the runner itself found (an actor that died, a placement that failed); empty: read from the rows.
    problems: list[str] = field(default_factory=list)
    #: Lines under the heading, and keys of the JSON report, that only this runner has.
    details: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Where preflight's ranks run; see the module docstring. Subclasses implement the three methods."""

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


def plan_ranks(nproc: int | None, gpus: int, gpus_named: str) -> RankPlan:
    """One rank per GPU when there are at least :data:`MIN_RANKS`, else ``nproc`` (default 2) CPU ranks.

    ``nproc`` is validated by :func:`~nemo_rl_shim.cli.preflight.options.build_options` (at least
    :data:`MIN_RANKS`); more ranks than GPUs raises ``ValueError``: NCCL needs one GPU per rank.
    ``gpus_named`` says where the GPUs are (``"the 4 CUDA devices"``). CPU ranks see no CUDA device.
    """
    if gpus >= MIN_RANKS:
        if nproc is not None and nproc > gpus:
            raise ValueError(f"--nproc {nproc} exceeds {gpus_named}: NCCL needs one per rank")
        return RankPlan(nproc or gpus, "cuda")
    return RankPlan(nproc or MIN_RANKS, "cpu", {"CUDA_VISIBLE_DEVICES": ""})


def rank_env(rank: int, world_size: int, local_rank: int) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` of one rank, as torchrun sets them."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)}
