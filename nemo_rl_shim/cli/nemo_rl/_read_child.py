"""The child process of :mod:`.bounded_read`: read one recipe under its own CPU and memory limits, say each phase.

Started as ``python -c`` with the request (``path``, ``overrides``, ``sys_path``) on its first line of input. Every
line it writes to standard output is one JSON object: ``{"phase": ...}`` as each phase starts, then one of
``{"config": ...}`` (:func:`~.bounded_read.encode`), ``{"error": "one line"}`` or ``{"out_of": "cpu" | "memory"}``.

The CPU budget of a phase is an ``ITIMER_PROF`` timer whose handler raises :class:`_OutOfCpu` (a ``BaseException``,
so that no ``except Exception`` in OmegaConf or ANTLR takes it for an error of the config); ``RLIMIT_CPU`` a little
above it is the backstop where the handler does not get to run (a long call in C), and ``RLIMIT_AS`` bounds memory.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nemo_rl_shim.cli.nemo_rl.bounded_read import LOAD_CPU_S, READ_MEMORY_BYTES, encode, resolve_cpu_s
from nemo_rl_shim.cli.nemo_rl.recipe import RecipeError, RecipeReading, load_recipe_config, resolve
from nemo_rl_shim.one_line.exception import first_line

__all__ = ["main"]

#: CPU seconds past a phase's budget at which ``RLIMIT_CPU`` ends the process, if the timer's handler did not run.
_BACKSTOP_S = 3


class _OutOfCpu(BaseException):
    """The phase's CPU budget ran out."""


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _expire(signum: int, frame: Any) -> None:
    raise _OutOfCpu


@contextmanager
def _cpu_budget(seconds: float) -> Iterator[None]:
    """Inside the block, at most ``seconds`` of this process's CPU (user and system)."""
    signal.signal(signal.SIGPROF, _expire)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    backstop = int(time.process_time() + seconds) + _BACKSTOP_S
    if hard != resource.RLIM_INFINITY:
        backstop = min(backstop, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (backstop, hard))
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _address_space() -> int:
    """This process's address space now, in bytes (0 where ``/proc`` cannot say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _limit_memory() -> None:
    """:data:`READ_MEMORY_BYTES` on top of what the interpreter already holds (an environment whose start-up imports
    more, a ``.pth`` that loads a large library, must not read as a recipe that needed memory)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + READ_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _read(path: str, overrides: list[str], reading: RecipeReading) -> dict[str, Any]:
    """The reading, phase by phase; what to send back."""
    _say({"phase": "loading"})
    with _cpu_budget(LOAD_CPU_S):
        config = load_recipe_config(path, overrides, reading)
    seconds = resolve_cpu_s(reading.bytes)
    _say({"phase": "resolving", "cpu_s": seconds, "bytes": reading.bytes})
    with _cpu_budget(seconds):
        resolved = resolve(config, path)
    del config
    _say({"phase": "sending"})
    try:
        return {"config": encode(resolved)}
    except ValueError as e:
        return {"error": f"{path}: {e}: refused"}


def main(request: dict[str, Any]) -> None:
    """Read ``request["path"]`` with ``request["overrides"]`` and say how it ended (see the module docstring)."""
    path = str(request["path"])
    reading = RecipeReading()
    answer: dict[str, Any]
    try:
        _limit_memory()
        answer = _read(path, [str(o) for o in request.get("overrides", [])], reading)
    except RecipeError as e:
        answer = {"error": str(e)}
    except _OutOfCpu:
        answer = {"out_of": "cpu", "step": reading.step}
    except MemoryError:
        answer = {"out_of": "memory", "step": reading.step}
    except RecursionError:
        answer = {"error": f"{path}: nested too deep to read: refused"}
    except Exception as e:  # OmegaConf's or YAML's own error outside the reader's wording: one line, the file named
        answer = {"error": f"{path}: cannot be read: {first_line(e)}"}
    _say(answer)
    os._exit(0)  # nothing to finalize: the answer is written
