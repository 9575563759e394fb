"""A NeMo RL recipe read in a child process under a CPU, memory and wall budget: the one robust bound on OmegaConf.

OmegaConf resolves ``${a}`` again at each use and keeps no result: a 452-byte recipe whose keys each add the one
before to itself (``l16: ${add:${l15},${l15}}``) makes 2**17 resolutions, and read in the command's own process it
ran 56 s past ``--timeout-s 10``. Its resolution runs in Python, inside OmegaConf and ANTLR, where nothing can count
it from outside; a child process can be stopped whatever it is doing. :func:`read_config` reads a recipe
(:func:`~.recipe.load_recipe_config`, then :func:`~.recipe.resolve`) in a fresh interpreter
(:mod:`._read_child`), which:

* limits its own address space to :data:`READ_MEMORY_BYTES` more than it holds once started;
* loads the files and their ``defaults:`` (under the node, depth and file budgets of :mod:`.recipe`) within
  :data:`LOAD_CPU_S` of CPU;
* resolves the interpolations within :func:`resolve_cpu_s` of CPU: :data:`RESOLVE_CPU_BASE_S`, and
  :data:`RESOLVE_CPU_S_PER_BYTE` for each byte the recipe's files hold (linear in the recipe's bytes; NeMo RL's
  largest, 38 KB over 6 files, resolves in under 0.2 s);
* says which phase it is in, line by line, and sends the config back as JSON (:func:`encode`: a mapping as its
  pairs, so that an ``int`` key stays one).

This process waits at most ``timeout_s`` (the wall bound: what is left of ``--timeout-s``), then ends the child. Every
way it ends is one line naming the file and the rule: a budget passed (``interpolations``, ``defaults``, ``memory``),
:class:`~.recipe.RecipeError`'s own line, or :class:`RecipeTimedOut` with the phase that was running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.nemo_rl.recipe import RecipeError

__all__ = [
    "LOAD_CPU_S",
    "MAX_DEPTH",
    "READ_MEMORY_BYTES",
    "READ_TIMEOUT_S",
    "RESOLVE_CPU_BASE_S",
    "RESOLVE_CPU_S_PER_BYTE",
    "RecipeTimedOut",
    "decode",
    "encode",
    "read_config",
    "resolve_cpu_s",
]

#: CPU seconds for loading the files, their ``defaults:`` and the overrides (NeMo RL's recipes: under 0.2 s; a chain of
#: 31 files holding 48,500 nodes, near the node budget of :mod:`.config_file`, loads in 8.7 s here: merges copy).
LOAD_CPU_S = 10.0
#: CPU seconds every recipe gets for its interpolations, ...
RESOLVE_CPU_BASE_S = 2.0
#: ... and for each byte of its files (0.2 ms a byte: 7.7 s more for NeMo RL's largest recipe, 38 KB).
RESOLVE_CPU_S_PER_BYTE = 0.0002
#: The address space the child may add to what its interpreter holds when the reading starts (``RLIMIT_AS``).
READ_MEMORY_BYTES = 1 << 30
#: How deep a config may nest (the JSON that carries it back is read recursively; NeMo RL's nest about 8 deep).
MAX_DEPTH = 64
#: The wall bound of a read when the caller gives none (preflight's default ``--timeout-s``).
READ_TIMEOUT_S = 300.0

#: What the child runs: the request on its first line of input, this process's import path, then the reading.
_BOOT = (
    "import json, sys; request = json.loads(sys.stdin.readline()); sys.path[:] = request['sys_path']; "
    "from nemo_rl_shim.cli.nemo_rl._read_child import main; main(request)"
)
_PHASES = {
    "starting": "starting",
    "loading": "loading its files and defaults",
    "resolving": "resolving its ${...} interpolations",
    "sending": "sending the config back",
}


class RecipeTimedOut(RecipeError):
    """The wall bound ran out while the child read the recipe; ``phase`` (in words) is what it was doing."""

    def __init__(self, path: str | Path, phase: str, seconds: float) -> None:
        super().__init__(f"{path} was not read within {seconds:.3g} s: still {phase}")
        self.phase = phase
        self.seconds = seconds


def resolve_cpu_s(recipe_bytes: int) -> float:
    """The CPU seconds a recipe of ``recipe_bytes`` (over all its files) gets for its interpolations."""
    return RESOLVE_CPU_BASE_S + RESOLVE_CPU_S_PER_BYTE * recipe_bytes


# --- the config as JSON, both ways --------------------------------------------------------------------------------


def encode(value: Any, depth: int = 0) -> Any:
    """A resolved config as JSON: a mapping as ``{"d": [[key, value], ...]}`` (its keys keep their type), a list as a
    list, ``bytes`` as ``{"b": hex}``, a scalar as itself. ``ValueError`` past :data:`MAX_DEPTH` or on another type."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return {"b": value.hex()}
    if value is None or type(value) in (bool, int, float, str):
        return value
    raise ValueError(f"holds a {type(value).__name__}, which a NeMo RL config cannot carry")


def decode(data: Any, depth: int = 0) -> Any:
    """:func:`encode`'s inverse; ``ValueError`` on anything it does not write."""
    if depth > MAX_DEPTH + 1:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    if isinstance(data, list):
        return [decode(v, depth + 1) for v in data]
    if isinstance(data, dict) and set(data) == {"d"} and isinstance(data["d"], list):
        pairs = [(decode(k, depth + 1), decode(v, depth + 1)) for k, v in data["d"]]
        if not all(isinstance(k, str | int | float | bool | bytes) or k is None for k, _ in pairs):
            raise ValueError("a mapping key that is not a scalar")
        return dict(pairs)
    if isinstance(data, dict) and set(data) == {"b"} and isinstance(data["b"], str):
        return bytes.fromhex(data["b"])
    if data is None or type(data) in (bool, int, float, str):
        return data
    raise ValueError(f"unexpected {type(data).__name__}")


# --- this process's side ------------------------------------------------------------------------------------------


def _messages(out: bytes) -> list[dict[str, Any]]:
    found = []
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue  # something the reading printed: not ours
        if isinstance(message, dict):
            found.append(message)
    return found


def _phase(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return next((m for m in reversed(messages) if "phase" in m), {"phase": "starting"})


def _out_of(path: str, resource: str, phase: dict[str, Any], step: str = "") -> str:
    words = _PHASES.get(str(phase.get("phase")), "reading it")
    if phase.get("phase") == "loading" and step:
        words += f" ({step}"
        # NeMo RL's merge_with_override reads override_config[key]: the top-level values of the file merged in
        words += ", which resolves its top-level ${...} interpolations)" if step.startswith("merging") else ")"
    if resource == "memory":
        return f"{path}: {words} needed more than {READ_MEMORY_BYTES >> 20:,} MiB of memory: refused"
    if phase.get("phase") == "resolving":
        return (
            f"{path}: {words} took more than {float(phase['cpu_s']):.1f} s of CPU, the budget for its "
            f"{int(phase['bytes']):,} bytes ({RESOLVE_CPU_BASE_S:g} s + {RESOLVE_CPU_S_PER_BYTE * 1e3:g} ms a byte; "
            "NeMo RL's recipes take under 0.2 s; an interpolation that uses the one before twice doubles the work "
            "at every level): refused"
        )
    return f"{path}: {words} took more than {LOAD_CPU_S:g} s of CPU (NeMo RL's recipes take under 0.2 s): refused"


def _answer(path: str, out: bytes, err: bytes, code: int) -> dict[str, Any]:
    """The config the child sent, or :class:`RecipeError` with the one line its end calls for."""
    messages = _messages(out)
    last = messages[-1] if messages else {}
    if "config" in last:
        try:
            config = decode(last["config"])
        except (ValueError, TypeError) as e:
            raise RecipeError(f"{path}: the config read back is not one: {e}") from None
        if not isinstance(config, dict):
            raise RecipeError(f"{path}: must hold a mapping at the top level, got a {type(config).__name__}")
        return {str(k): v for k, v in config.items()}
    if "error" in last:
        raise RecipeError(str(last["error"]))
    phase = _phase(messages)
    if "out_of" in last:
        raise RecipeError(_out_of(path, str(last["out_of"]), phase, str(last.get("step") or "")))
    if code == -signal.SIGXCPU:  # the CPU limit's backstop: the budget's own signal was not handled in time
        raise RecipeError(_out_of(path, "cpu", phase))
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["nothing on stderr"]
    how = f"signal {-code}" if code < 0 else f"exit {code}"
    words = _PHASES.get(str(phase.get("phase")), "reading it")
    raise RecipeError(f"{path}: the process reading it ended ({how}) while {words}: {tail[0][:200]}")


def _read_in_child(path: str, overrides: Sequence[str], timeout_s: float) -> dict[str, Any]:
    request = json.dumps({"path": path, "overrides": list(overrides), "sys_path": list(sys.path)}) + "\n"
    process = subprocess.Popen(
        [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        out, err = process.communicate(request.encode(), timeout=max(timeout_s, 0.0))
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        phase = _phase(_messages(out))
        raise RecipeTimedOut(path, _PHASES.get(str(phase.get("phase")), "reading it"), timeout_s) from None
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return _answer(path, out, err, process.returncode)


def read_config(
    path: str | Path | None, overrides: Sequence[str] = (), *, timeout_s: float = READ_TIMEOUT_S
) -> dict[str, Any] | None:
    """The config NeMo RL would train with (:func:`~.recipe.load_recipe`), read in a bounded child process (see the
    module docstring) within ``timeout_s`` of wall time; None without ``path`` (and then ``overrides`` are refused).

    Raises :class:`~.recipe.RecipeError` (a ``ValueError``; one line naming the file and the rule), and
    :class:`RecipeTimedOut` when ``timeout_s`` ran out first.
    """
    if path is None:
        if overrides:
            raise ValueError(f"config overrides need --config PATH, got {' '.join(overrides)!r}")
        return None
    if not sys.executable:  # an embedded interpreter that cannot start another: read here, unbounded in time
        from nemo_rl_shim.cli.nemo_rl.recipe import load_recipe

        return load_recipe(path, overrides)
    return _read_in_child(str(path), overrides, timeout_s)
