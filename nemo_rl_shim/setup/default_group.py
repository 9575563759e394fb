"""The default process group: which backend, and with which timeout."""

from __future__ import annotations

import datetime
import warnings

import torch
import torch.distributed as dist

__all__ = ["backend_for", "init_process_group"]


def backend_for(*, cpu_offload: bool, cuda_available: bool | None = None) -> str:
    """NeMo RL's backend choice, with a Gloo fallback so the shim runs on CPU.

    ``"cuda:nccl,cpu:gloo"`` with CPU offload (FSDP2 reduces CPU-offloaded
    parameters over Gloo), ``"nccl"`` without, and ``"gloo"`` when the machine
    has no CUDA device.
    """
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"


def init_process_group(*, cpu_offload: bool, timeout_minutes: float | None = None) -> str:
    """Initialize the default group from the launcher's environment; return its backend.

    ``timeout=`` is passed only when a timeout is set, so None keeps torch's
    default (10 min for NCCL, 30 for Gloo). Safe to call twice: the second call
    warns and returns the existing group's backend.
    """
    if dist.is_initialized():
        warnings.warn("torch.distributed is already initialized; keeping the existing default group", stacklevel=2)
        return str(dist.get_backend())
    backend = backend_for(cpu_offload=cpu_offload)
    kwargs = {} if timeout_minutes is None else {"timeout": datetime.timedelta(minutes=timeout_minutes)}
    dist.init_process_group(backend=backend, **kwargs)
    return backend
