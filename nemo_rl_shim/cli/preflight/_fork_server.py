"""How :mod:`~nemo_rl_shim.cli.preflight.spawn` starts one rank: a fresh interpreter, or a fork of a preloaded server.

Forked ranks (opt-in, :data:`FORK_RANKS_ENV` ``=1``): each rank is forked from one server
process per caller that has imported torch and nemo-automodel once (:mod:`multiprocessing`'s
forkserver with :data:`PRELOAD`), instead of a fresh interpreter that spends 5-10 s of CPU
importing them. The rank then runs exactly what a fresh process runs
(:func:`nemo_rl_shim.cli.preflight._rank.main`), with its own environment, log and result file.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from automodel_patch._target import MESH_MODULE

__all__ = ["FORK_RANKS_ENV", "PRELOAD", "fork_context", "start_rank"]

#: ``1`` forks ranks from a server that imported :data:`PRELOAD` once (see the module docstring).
FORK_RANKS_ENV = "NEMO_RL_SHIM_FORK_RANKS"
#: What the fork server imports before it forks a rank (a module it cannot import is left out).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", MESH_MODULE)


class _ForkedRank:
    """A rank forked by the fork server, with the part of :class:`subprocess.Popen`'s interface used here."""

    def __init__(self, process: Any) -> None:
        self.process = process

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


def _forked_rank_main(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked rank: this rank's environment, stdin, stdout and stderr, then the rank's own entry point."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.environ.clear()
    os.environ.update(env)
    from nemo_rl_shim.cli.preflight import _rank

    code = _rank.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as a fresh rank does: no interpreter finalization after the result is written


def fork_context(env: Mapping[str, str] | None) -> Any:
    """The fork server's context when ranks are to be forked (:data:`FORK_RANKS_ENV`), else None."""
    if os.environ.get(FORK_RANKS_ENV) != "1" or any(key.startswith("PYTHON") for key in env or {}):
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def start_rank(context: Any, argv: list[str], env: dict[str, str], log: Any) -> Any:
    if context is None:
        return subprocess.Popen(
            [sys.executable, "-m", "nemo_rl_shim.cli.preflight._rank", *argv],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    # The server is started (once per process) with one thread per OpenMP pool, as each rank is.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    try:
        process = context.Process(target=_forked_rank_main, args=(argv, env, log.name), daemon=False)
        process.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return _ForkedRank(process)
