"""``preflight --setup nemo-rl``: NeMo RL's own ``setup_distributed`` on this rank, where NeMo RL is importable.

The shim's set-up is what a worker that uses this project runs; NeMo RL's own
``nemo_rl.models.automodel.setup.setup_distributed`` is what NeMo RL's DTensor v2 worker runs without it
(as it is, or with the NeMo RL pull request of ``nemo_rl_shim/upstream/`` applied). This module calls
the latter, with the role's section as NeMo RL's worker passes it, and nothing of the shim's machinery:
no workaround layer, no following of later groups, no flight recorder. The checks that follow
(:func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank`) are the same, and the configured value
they judge every group against is the section's ``automodel_cfg.distributed_timeout_minutes``.

On a machine without a CUDA device NCCL cannot start. Only its name is swapped, at the two places
NeMo RL passes it, as ``scripts/nemo_rl_rank.py`` does (:func:`nccl_stood_in_by_gloo`):

* ``torch.distributed.init_process_group(backend=...)``: ``"nccl"`` becomes ``"gloo"``, and
  ``"cuda:nccl,cpu:gloo"`` (CPU offload) becomes ``"cuda:nccl_standin,cpu:gloo"``, where
  ``nccl_standin`` is a Gloo backend registered for the ``cuda`` device: the default group keeps one
  backend object per device, as with NCCL;
* ``FSDP2Config(backend="nccl")``: ``"gloo"``, so Automodel builds the mesh on the ``cpu`` device type.

Everything else is NeMo RL's code, its Automodel and torch. The report says which set-up ran, from
which file, and what stood in (:attr:`~nemo_rl_shim.cli.preflight.results.RankChecked.set_up`).
"""

from __future__ import annotations

import copy
import datetime
import importlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SETUP_MODULE", "STANDIN", "STOOD_IN", "nccl_stood_in_by_gloo", "nemo_rl_missing", "set_up"]

#: NeMo RL's set-up module.
SETUP_MODULE = "nemo_rl.models.automodel.setup"
#: The Gloo backend registered for the ``cuda`` device that stands in for NCCL's half of ``"cuda:nccl,cpu:gloo"``.
STANDIN = "nccl_standin"
#: What the report says when NCCL was stood in by Gloo.
STOOD_IN = (
    'no CUDA device: NCCL stood in by Gloo, as scripts/nemo_rl_rank.py does (init_process_group "nccl" -> "gloo", '
    '"cuda:nccl,cpu:gloo" -> "cuda:nccl_standin,cpu:gloo"; FSDP2Config(backend="nccl") -> "gloo")'
)
#: The ``dtensor_cfg`` keys NeMo RL's ``setup_distributed`` reads with ``[]``, and the value given where the section
#: lacks them (NeMo RL's example configs set both to false).
_REQUIRED_DTENSOR_KEYS = {"sequence_parallel": False, "activation_checkpointing": False}


#: What the child of :func:`nemo_rl_missing` runs: this process's import path, then ``find_spec`` of the set-up
#: module (which imports its parent packages), every way out of it said as one JSON line.
_FIND = """
import importlib.util, json, sys
sys.path[:] = json.loads(sys.argv[1])
try:
    found = importlib.util.find_spec(sys.argv[2]) is not None
    why = "no module " + sys.argv[2]
except BaseException as e:  # SystemExit and KeyboardInterrupt too: the import's failure, said
    text = (str(e).strip().splitlines() or [""])[0]
    found, why = False, type(e).__name__ + (": " + text if text else "")
print(json.dumps({"found": found, "why": why}), flush=True)
"""
_NOT_IMPORTABLE = (
    "--setup nemo-rl runs NeMo RL's own set-up, and NeMo RL is not importable here ({why}): run preflight in NeMo "
    "RL's environment, or put a NeMo RL checkout on PYTHONPATH"
)


def nemo_rl_missing(timeout_s: float = 60.0) -> str | None:
    """None where NeMo RL's set-up module can be found; else the one line that refuses ``--setup nemo-rl``.

    Finds the module without running it, in a child process of this interpreter and import path, within
    ``timeout_s``: its parent packages are imported there, so that one that raises ``SystemExit``, ends its process
    or hangs is that import's failure, said in the line, and not this process's end. An import error inside the
    module itself, such as a missing dependency, is every rank's failure instead, with its message.
    """
    command = [sys.executable, "-c", _FIND, json.dumps(sys.path), SETUP_MODULE]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=max(timeout_s, 0.0), stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired:
        why = f"importing nemo_rl and its packages did not finish within {timeout_s:.3g} s, what --timeout-s left"
        return _NOT_IMPORTABLE.format(why=why)
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        tail = (done.stderr.strip().splitlines() or ["nothing on stderr"])[-1][:200]
        return _NOT_IMPORTABLE.format(why=f"importing nemo_rl ended its process ({how}): {tail}")
    if answer.get("found") is True:
        return None
    return _NOT_IMPORTABLE.format(why=str(answer.get("why"))[:300])


def _swap_nccl(backend: str) -> str:
    if backend == "nccl":
        return "gloo"
    return backend.replace(":nccl", f":{STANDIN}")


def _standin(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


@contextmanager
def nccl_stood_in_by_gloo(setup: Any) -> Iterator[None]:
    """Inside the block, NeMo RL's NCCL is Gloo (see the module docstring); after it, both names are put back."""
    if STANDIN.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(STANDIN, _standin, devices=["cuda"])
    real_init, real_fsdp2 = dist.init_process_group, setup.FSDP2Config

    def init_process_group(*args: Any, backend: str, **kwargs: Any) -> None:
        real_init(*args, backend=_swap_nccl(backend), **kwargs)

    def fsdp2_config(**kwargs: Any) -> Any:
        return real_fsdp2(**{**kwargs, "backend": _swap_nccl(kwargs.get("backend", "nccl"))})

    dist.init_process_group, setup.FSDP2Config = init_process_group, fsdp2_config
    try:
        yield
    finally:
        dist.init_process_group, setup.FSDP2Config = real_init, real_fsdp2


#: The one ``automodel_cfg`` key NeMo RL reads. Its ``AutomodelConfig`` forbids any other (``extra="forbid"``); the
#: shim's own keys live beside it in ``nemo_rl_shim`` (:func:`nemo_rl_shim.config.shim_cfg`), which NeMo RL's set-up
#: gets untouched, as a NeMo RL worker gets it. Keeping only this key is a guard: the config check before it
#: already refuses anything else here.
NEMO_RL_AUTOMODEL_KEYS = ("distributed_timeout_minutes",)


def _config(section: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The section as NeMo RL's worker passes it, and the ``dtensor_cfg`` keys it lacked that were given defaults."""
    config = copy.deepcopy(dict(section))
    if "automodel_cfg" in config:
        automodel = config["automodel_cfg"] or {}
        config["automodel_cfg"] = {key: automodel[key] for key in NEMO_RL_AUTOMODEL_KEYS if key in automodel}
    dtensor = config["dtensor_cfg"] = dict(config.get("dtensor_cfg") or {})
    filled = [key for key in _REQUIRED_DTENSOR_KEYS if key not in dtensor]
    for key in filled:
        dtensor[key] = _REQUIRED_DTENSOR_KEYS[key]
    return config, filled


def _runtime_config(setup: Any, cpu_offload: bool) -> Any:
    """NeMo RL's ``RuntimeConfig``: what ``setup_distributed`` reads (``dtype``, ``cpu_offload``), the rest unset."""
    values: dict[str, Any] = dict.fromkeys(setup.RuntimeConfig._fields)
    values.update(dtype=torch.float32, cpu_offload=cpu_offload, enable_seq_packing=False, is_reward_model=False)
    return setup.RuntimeConfig(**{key: value for key, value in values.items() if key in setup.RuntimeConfig._fields})


def set_up(section: Mapping[str, Any], role: str, cpu_offload: bool) -> tuple[Any, str]:
    """Run NeMo RL's own ``setup_distributed`` on this rank; its ``DistributedContext``, and what ran, in words.

    Under the launcher's variables, as NeMo RL's worker runs it, with the section's ``automodel_cfg`` as NeMo RL
    reads it (:data:`NEMO_RL_AUTOMODEL_KEYS`).
    """
    setup = importlib.import_module(SETUP_MODULE)
    config, filled = _config(section)
    words = [f"NeMo RL's own setup_distributed ({setup.__file__})"]
    if filled:
        words.append(f"{role}.dtensor_cfg lacks {' and '.join(filled)}: false, as NeMo RL's example configs")
    runtime = _runtime_config(setup, cpu_offload)
    if torch.cuda.is_available():
        return setup.setup_distributed(config, runtime), "; ".join(words)
    with nccl_stood_in_by_gloo(setup):
        context = setup.setup_distributed(config, runtime)
    return context, "; ".join([*words, STOOD_IN])
