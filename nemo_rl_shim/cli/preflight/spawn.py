"""Preflight's local runner: start N local ranks as processes, bounded in time, and collect every rank's result.

:class:`SpawnRunner` is the runner (one rank per CUDA device when there are at least two,
else two CPU ranks); :func:`spawn_ranks` is what it and the multi-rank tests use. Each rank runs
``python -m nemo_rl_shim.cli.preflight._rank MODULE:FUNCTION`` with the standard launcher
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), calls ``FUNCTION(params)`` and writes its JSON result, or its
traceback, to a file. A rank that fails or a run past its deadline ends every
rank: nothing is left hanging. So does a rank that finishes but says it gave up on its
peers (``gave_up``: a collective timed out on a stalled peer): the ranks still running
get the grace (:class:`~nemo_rl_shim.cli.preflight.stuck.Grace`), then are killed and named
(``RankResult.killed_because``).

How many: one rank per CUDA device, or CPU ranks up to what this machine's memory holds
(:func:`cpu_rank_limit`: the available memory over :data:`RANK_MEMORY_MIB`, a CPU rank's measured
peak); ``--nproc`` above either is refused before any rank starts.

Forked ranks (:mod:`nemo_rl_shim.cli.preflight._fork_server`, opt-in with
``NEMO_RL_SHIM_FORK_RANKS=1``): the test suite turns it on (``tests/conftest.py``): on a
2-core machine it is CPU-bound on importing torch and nemo-automodel. Off by default: the
server's start-up comes on top of ``--timeout-s``, and a server whose caller is killed keeps
the caller's standard streams until it notices, which a caller reading them to the end waits
for. A spawn whose extra environment sets ``PYTHON*`` variables (a shadowed nemo-automodel,
say), which must take effect at import, always gets a fresh interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.preflight import rank_checks
from nemo_rl_shim.cli.preflight._fork_server import fork_context, start_rank
from nemo_rl_shim.cli.preflight.options import PreflightOptions
from nemo_rl_shim.cli.preflight.rendezvous import PORT_FILE_ENV
from nemo_rl_shim.cli.preflight.results import RankFailed, RankOutcome, gave_up_on_peers, outcome_from_json
from nemo_rl_shim.cli.preflight.runner import (
    PROGRESS_EVERY_S,
    Capacity,
    Progress,
    RankLimit,
    RankPlan,
    RankRun,
    Runner,
    available_memory_mib,
    plan_ranks,
    rank_env,
)
from nemo_rl_shim.cli.preflight.stuck import Grace

__all__ = [
    "RANK_MEMORY_MIB",
    "RANK_TARGET",
    "RankResult",
    "RanksFailed",
    "SpawnRunner",
    "cpu_rank_limit",
    "free_port",
    "launcher_env",
    "spawn_ranks",
]

#: Where :func:`free_port` picks: below Linux's default ephemeral range (32768-60999), and above most services.
LISTEN_PORTS = range(20000, 32768)
_PORT_PICKS = 64
#: What every spawned preflight rank runs (JSON in, JSON out: :func:`~.rank_checks.check_rank_json`).
RANK_TARGET = f"{rank_checks.__name__}:{rank_checks.check_rank_json.__name__}"
#: Memory one spawned CPU rank needs: its peak resident set, measured at 848 MiB (torch 2.15, nemo-automodel
#: 0.7.0, a fresh interpreter per rank, 2 and 4 ranks; 402 MiB of it private, the rest shared libraries).
RANK_MEMORY_MIB = 850


@dataclass
class RankResult:
    """One rank's outcome: its JSON result, or the error that ended it."""

    rank: int
    returncode: int | None
    result: Any = None
    error: str | None = None
    timed_out: bool = False
    output: str = ""
    #: Why the launcher killed this rank before the deadline: ``"still running 15 s after rank 0 failed"``.
    killed_because: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None and not self.timed_out


class RanksFailed(RuntimeError):
    """Raised by :func:`spawn_ranks` with ``check=True``; ``results`` holds every rank's outcome."""

    def __init__(self, results: list[RankResult]) -> None:
        self.results = results
        lines = []
        for r in results:
            if r.ok:
                continue
            what = "timed out" if r.timed_out else f"exit {r.returncode}"
            detail = (r.error or r.output or "").strip().splitlines()[-12:]
            lines.append(f"rank {r.rank} {what}:\n    " + "\n    ".join(detail))
        super().__init__("\n".join(lines) or "ranks failed")


def _ephemeral_ports() -> range:
    """The kernel's ephemeral range (``ip_local_port_range``): where ``bind(0)`` and every outgoing connection (Gloo
    opens many) take their ports."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default
    return range(low, high + 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (default the loopback interface; ``""`` for every interface), for a listener
    that binds it a moment later.

    Picked at random from :data:`LISTEN_PORTS`, outside the kernel's ephemeral range, so that no ``bind(0)`` and no
    outgoing connection (of this machine's other work, or of Gloo's own full mesh) can take it in between: only an
    explicit bind to the same number can, and a caller that meets it retries (:func:`spawn_ranks`). Where the
    ephemeral range covers them all, a port the kernel picks, as before.
    """
    ephemeral = _ephemeral_ports()
    candidates = [port for port in LISTEN_PORTS if port not in ephemeral]
    for port in random.SystemRandom().sample(candidates, min(_PORT_PICKS, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # taken now
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def launcher_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The standard launcher variables (as torchrun sets them) for one local rank of a loopback world."""
    return {
        **rank_env(rank, world_size, rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _rank_env(rank: int, world_size: int, port_file: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The launcher's variables, with the port left to rank 0 (:mod:`~.rendezvous`): ``MASTER_PORT`` is set in the
    rank, from ``port_file``, before its target runs."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(launcher_env(rank, world_size, 0))
    env[PORT_FILE_ENV] = str(port_file)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def cpu_rank_limit(available_mib: int | None) -> RankLimit:
    """How many CPU ranks fit in ``available_mib`` at :data:`RANK_MEMORY_MIB` each, in words for the refusal."""
    if available_mib is None:  # cannot tell: no limit of our own (the run is still bounded by --timeout-s)
        return RankLimit(2**31 - 1, "what this machine can hold (its free memory could not be read)")
    ranks = available_mib // RANK_MEMORY_MIB
    return RankLimit(
        ranks,
        f"what this machine can hold: {ranks} CPU ranks ({available_mib} MiB of memory available, "
        f"about {RANK_MEMORY_MIB} MiB a rank)",
    )


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()


def _trigger(codes: list[int | None], gave_up: Callable[[int], str | None], grace: Grace) -> None:
    """Start ``grace`` if a rank has failed or given up; a failed rank comes before one that gave up."""
    for rank, code in enumerate(codes):
        if code not in (None, 0):
            grace.start(f"rank {rank} failed (exit {code})")
            return
    for rank, code in enumerate(codes):
        why = gave_up(rank) if code == 0 else None
        if why:
            grace.start(f"rank {rank} gave up on its peers ({why})")
            return


def _wait(
    processes: list[Any],
    timeout_s: float,
    on_tick: Callable[[float], None] | None,
    gave_up: Callable[[int], str | None] = lambda rank: None,
    grace: Grace | None = None,
) -> tuple[bool, dict[int, str]]:
    """Wait for every process; end them all on the deadline, or when the grace after a rank that failed or gave up
    on its peers is over. Returns whether the deadline hit, and why each rank killed before it was killed.

    ``grace`` (a fresh :class:`~nemo_rl_shim.cli.preflight.stuck.Grace` by default) keeps the time, deadline
    included.
    """
    grace = grace or Grace()
    start = grace.clock()
    gave_up = functools.cache(gave_up)  # a finished rank's result does not change: read it once
    while True:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            return False, {}
        if not grace.started:
            _trigger(codes, gave_up, grace)
        now = grace.clock()
        if now - start > timeout_s:
            _kill(processes)
            return True, {}
        if grace.over():
            killed = {rank: grace.why or "" for rank, code in enumerate(codes) if code is None}
            _kill(processes)
            return False, killed
        if on_tick is not None:
            on_tick(now - start)
        time.sleep(0.05)


def _spawn_once(
    target: str,
    params: Any,
    world_size: int,
    timeout_s: float,
    env: Mapping[str, str] | None,
    on_tick: Callable[[float], None] | None,
    fork: bool | None = None,
    gave_up: Callable[[Any], str | None] | None = None,
) -> list[RankResult]:
    with tempfile.TemporaryDirectory(prefix="nemo-rl-shim-ranks-") as tmp:
        out = Path(tmp)
        (out / "params.json").write_text(json.dumps(params))
        processes, logs = [], []
        context = fork_context(env) if fork is not False else None
        for rank in range(world_size):
            log = open(out / f"rank{rank}.log", "w+b")  # noqa: SIM115 - closed below
            logs.append(log)
            argv = [target, str(out / "params.json"), str(out / f"rank{rank}.json")]
            processes.append(start_rank(context, argv, _rank_env(rank, world_size, out / "port", env), log))

        def rank_gave_up(rank: int) -> str | None:
            result = out / f"rank{rank}.json"
            if gave_up is None or not result.exists():
                return None
            return gave_up(json.loads(result.read_text()).get("result"))

        try:
            timed_out, killed = _wait(processes, timeout_s, on_tick, rank_gave_up)
        finally:
            _kill(processes)
        results = []
        for rank, (process, log) in enumerate(zip(processes, logs, strict=True)):
            log.seek(0)
            output = log.read().decode(errors="replace")[-20000:]
            log.close()
            result = RankResult(
                rank,
                process.returncode,
                timed_out=timed_out and process.returncode != 0,
                output=output,
                killed_because=killed.get(rank),
            )
            path = out / f"rank{rank}.json"
            if path.exists():
                payload = json.loads(path.read_text())
                result.result, result.error = payload.get("result"), payload.get("error")
            elif result.killed_because is not None:
                result.error = f"rank {rank} killed: {result.killed_because}"
            elif process.returncode != 0 and not result.timed_out:
                result.error = f"rank {rank} exited {process.returncode} before reporting"
            results.append(result)
    return results


def spawn_ranks(
    target: str,
    params: Any = None,
    *,
    world_size: int = 2,
    timeout_s: float = 180.0,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    on_tick: Callable[[float], None] | None = None,
    fork: bool | None = None,
    gave_up: Callable[[Any], str | None] | None = None,
) -> list[RankResult]:
    """Run ``target`` (``"module:function"``) on ``world_size`` local ranks; return every rank's result.

    ``fork``: fork the ranks from the preloaded server (see the module docstring); None follows
    ``NEMO_RL_SHIM_FORK_RANKS``, False always starts fresh interpreters.
    ``gave_up``: given the result of a rank that finished while others still run, what it gave
    up waiting on (a collective that timed out on a stalled peer), or None: the others then get
    the grace (:class:`~nemo_rl_shim.cli.preflight.stuck.Grace`) to finish, as after a failure, and are killed.

    ``params`` must be JSON-serializable; so must the function's return value.
    ``env`` adds environment variables (``PYTHONPATH`` to shadow a package, say).
    Every rank is killed at ``timeout_s``. With ``check`` (default), any failed
    or timed-out rank raises :class:`RanksFailed` naming each rank's error.

    The rendezvous port is rank 0's to bind (:mod:`~.rendezvous`): no other process, and no other world, can take
    it between a pick and a bind.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    results = _spawn_once(target, params, world_size, timeout_s, env, on_tick, fork, gave_up)
    if check and not all(r.ok for r in results):
        raise RanksFailed(results)
    return results


class SpawnRunner(Runner):
    """Preflight's ranks as local processes (:func:`spawn_ranks`). ``available_mib``: the memory CPU ranks may
    take (default: what this machine has available now)."""

    def __init__(self, available_mib: int | None = None) -> None:
        import torch

        self.cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.cpu_limit = cpu_rank_limit(available_mib if available_mib is not None else available_memory_mib())

    def capacity(self, options: PreflightOptions) -> Capacity:
        room = self.plan(None)
        note = self._note(room)
        here = f"this machine can run {room.world_size} {room.device.upper()} ranks" + (f" ({note})" if note else "")
        return Capacity(gpus=self.cuda_devices, here=here)

    def plan(self, ranks: int | None) -> RankPlan:
        return plan_ranks(ranks, RankLimit(self.cuda_devices, f"the {self.cuda_devices} CUDA devices"), self.cpu_limit)

    def _note(self, plan: RankPlan) -> str | None:
        if plan.device == "cuda":
            return None
        if self.cuda_devices == 1:
            return f"1 CUDA device found, a CUDA run needs 2: running {plan.world_size} CPU ranks (gloo)"
        return "no CUDA device: CPU ranks on gloo"

    def run(self, options: PreflightOptions, ranks: RankPlan, progress: Progress) -> RankRun:
        progress(f"starting {ranks.world_size} {ranks.device.upper()} ranks (importing Automodel takes ~10 s)...")
        last = [0.0]

        def on_tick(elapsed: float) -> None:
            if elapsed - last[0] >= PROGRESS_EVERY_S:
                last[0] = elapsed
                progress(f"waiting... {elapsed:.0f} s")

        results = spawn_ranks(
            RANK_TARGET, options.rank_params().to_json(), world_size=ranks.world_size, timeout_s=options.timeout_s,
            env=ranks.env, check=False, on_tick=on_tick, gave_up=gave_up_on_peers,
        )  # fmt: skip
        outcomes = tuple(_outcome(r) for r in results)
        timed_out = any(r.timed_out for r in results)
        return RankRun("spawn", ranks.world_size, outcomes, self._note(ranks), timed_out)


def _outcome(result: RankResult) -> RankOutcome:
    """A spawned rank's typed result: what its check sent, or its failure."""
    if result.ok:
        return outcome_from_json(result.result, result.rank)
    error = result.error or ("timed out" if result.timed_out else f"exit {result.returncode}")
    return RankFailed(
        result.rank, error, timed_out=result.timed_out, killed_because=result.killed_because,
        output=result.output[-4000:],
    )  # fmt: skip
