"""Preflight's runner inside an existing launcher's world: this process is one rank of a torchrun or srun world.

:func:`detect_launcher` reads the launcher's variables; :class:`JoinRunner` runs this rank's
checks, then gathers every rank's result on every rank (one verdict, one exit code; each crosses
as JSON), bounded by a :func:`~nemo_rl_shim.cli.preflight.stuck.watchdog` at ``--timeout-s``. The
world is the launcher's: preflight does not size it. Rank 0 alone reports (:attr:`JoinRunner.reports`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.cli.preflight.options import PreflightOptions
from nemo_rl_shim.cli.preflight.rank_checks import check_rank
from nemo_rl_shim.cli.preflight.results import RankFailed, RankOutcome, outcome_from_json
from nemo_rl_shim.cli.preflight.runner import Capacity, Progress, RankPlan, RankRun, Runner, rank_env
from nemo_rl_shim.cli.preflight.stuck import past_deadline, watchdog

__all__ = ["JoinRunner", "Launcher", "detect_launcher"]


@dataclass(frozen=True)
class Launcher:
    """An existing launcher's world that this process joins."""

    name: str  # "torchrun" (any RANK/WORLD_SIZE launcher) or "slurm"
    rank: int
    world_size: int
    local_rank: int


def detect_launcher(environ: Mapping[str, str] | None = None) -> Launcher | None:
    """The launcher world this process belongs to, or None when preflight should spawn its own ranks.

    torchrun-style: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (``LOCAL_RANK``
    optional). Slurm ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``MASTER_ADDR``,
    ``MASTER_PORT`` (``SLURM_LOCALID`` optional).
    """
    env = os.environ if environ is None else environ
    if not ("MASTER_ADDR" in env and "MASTER_PORT" in env):
        return None
    if "RANK" in env and "WORLD_SIZE" in env:
        return Launcher("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        local = int(env.get("SLURM_LOCALID", "0"))
        return Launcher("slurm", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), local)
    return None


class JoinRunner(Runner):
    """This process as rank ``launcher.rank`` of the launcher's world; rank 0 reports for every rank.

    ``last_words``: given to the watchdog of the reporting rank (see :func:`~.stuck.watchdog`).
    """

    joined = True

    def __init__(self, launcher: Launcher, last_words: Callable[[str], None] | None = None) -> None:
        self.launcher = launcher
        self.reports = launcher.rank == 0
        self.last_words = last_words if self.reports else None

    def capacity(self, options: PreflightOptions) -> Capacity:
        return Capacity(world=self.launcher.world_size)

    def plan(self, ranks: int | None) -> RankPlan:
        return RankPlan(self.launcher.world_size, "launcher")

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        launcher = self.launcher
        os.environ.update(rank_env(launcher.rank, launcher.world_size, launcher.local_rank))
        if launcher.rank == 0:
            progress(f"joining the {launcher.name} world of {launcher.world_size} ranks...")
        line = past_deadline([launcher.rank], options.timeout_s, whole_s=options.timeout_whole_s)
        timer = watchdog(options.timeout_s, line, self.last_words)
        try:
            gathered = self._check_and_gather(options)
        finally:
            timer.cancel()
        return RankRun(launcher.name, launcher.world_size, gathered)

    def _check_and_gather(self, options: PreflightOptions) -> tuple[RankOutcome, ...]:
        import torch.distributed as dist

        rank = self.launcher.rank
        try:
            result: RankOutcome = check_rank(options.rank_params())
        except Exception:
            result = RankFailed(rank, traceback.format_exc())
        if not dist.is_initialized():
            return (result,)
        gathered: list[Any] = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(gathered, result.to_json())  # every rank gets every row: one verdict, one exit code
        except RuntimeError as e:  # a peer stalled or died, and the default group timed out on it
            why = f"did not report: the gather timed out or failed ({type(e).__name__})"
            gathered = [result.to_json() if r == rank else RankFailed(r, why).to_json() for r in range(len(gathered))]
        finally:
            dist.destroy_process_group()
        return tuple(outcome_from_json(data, r) for r, data in enumerate(gathered))
