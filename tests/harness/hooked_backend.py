"""A CPU stand-in for torch 2.15's NCCL2 on the Flight Recorder's side: a backend torch records through its hook.

In torch 2.15 plain ``"nccl"`` builds ``ProcessGroupNCCL2``, which keeps no trace itself: ``distributed_c10d``'s
``_maybe_attach_flight_recorder`` attaches a ``FlightRecorderHook`` to each group whose backends do not record
natively, and the hook records each op into a recorder named after the backend (``Backend::getBackendName()``,
``"nccl2"``). NCCL cannot start here; any other backend that does not record natively takes the same path.
``HookedGloo`` (made by :func:`register`) is one: a Python ``Backend`` named :data:`NAME` that runs Gloo
underneath (Gloo's own recorder sees its inner group as unnamed, ``''``). What differs from NCCL2:
it has no completion or abort hooks (every entry stays ``scheduled``; nothing dumps on an abort), which
:func:`rank` reports as facts rather than assumes.

:func:`rank` is a rank of ``tests/hang_report/test_hang_report_nccl2.py``: the shim's
:func:`~nemo_rl_shim.flight_recorder.
configure` first, then a Gloo default group and a :data:`NAME` sub-group over both ranks; three all-reduces on
it, and a fourth that rank 1 never enters. Both ranks then :func:`~nemo_rl_shim.flight_recorder.dump_now`.
"""

from __future__ import annotations

import datetime
import pickle
import time
from pathlib import Path
from typing import Any

__all__ = ["NAME", "rank", "register"]

NAME = "hookedgloo"
#: How long the ranks may take to connect (the default group, and the hooked group before its own short timeout).
CONNECT_S = 120


def _classes() -> tuple[type, type]:
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend

    class _Work(dist.Work):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def wait(self, timeout: Any = None) -> bool:
            return self.inner.wait()

        def is_completed(self) -> bool:
            return self.inner.is_completed()

        def is_success(self) -> bool:
            return self.inner.is_success()

    class HookedGloo(Backend):
        """Gloo underneath, a name torch does not know: recorded by torch's FlightRecorderHook, as NCCL2 is."""

        def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
            super().__init__(rank, size)
            # connected at CONNECT_S, then the group's own timeout: with two suites on 2 cores, 3 s was too short
            # for the ranks to connect at all
            self.inner = dist.ProcessGroupGloo(store, rank, size, max(timeout, datetime.timedelta(seconds=CONNECT_S)))
            self.inner._set_default_timeout(timeout)

        def getBackendName(self) -> str:  # the C++ method the hook asks, by its C++ name
            return NAME

        def allreduce(self, tensors: Any, opts: Any) -> Any:
            return _Work(self.inner.allreduce(tensors, opts))

        def barrier(self, opts: Any) -> Any:
            return _Work(self.inner.barrier(opts))

    return HookedGloo, _Work


def register() -> None:
    """Register :data:`NAME` (once per process)."""
    import torch.distributed as dist

    if NAME.upper() in dist.Backend._plugins:
        return
    backend_class, _ = _classes()

    def create(opts: Any, _options: Any) -> Any:
        return backend_class(opts.store, opts.group_rank, opts.group_size, opts.timeout)

    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu"])


def rank(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: configure the recorder, make the groups, three all-reduces on the hooked group, then the fourth
    (rank 1 stays out of it), and dump."""
    import torch
    import torch.distributed as dist

    from nemo_rl_shim.config import FlightRecorderSettings
    from nemo_rl_shim.flight_recorder import recorder as flight_recorder

    applied = flight_recorder.configure(
        FlightRecorderSettings(dump_dir=Path(params["dump_dir"]), buffer_size=params["buffer_size"])
    )
    register()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=CONNECT_S))  # the hooked group's is short
    hooked = dist.new_group(backend=NAME, timeout=datetime.timedelta(seconds=params["timeout_s"]))
    hooks = dist.distributed_c10d._world.pg_flight_recorder_hooks
    tensor = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(tensor, group=hooked)
    outcome = "entered"
    if dist.get_rank() == 1:
        time.sleep(params["timeout_s"] + 2)  # stays out until rank 0's all-reduce has timed out
        outcome = "stayed out"
    else:
        try:
            dist.all_reduce(tensor, group=hooked)
        except RuntimeError as error:
            outcome = f"raised: {str(error).splitlines()[0][:200]}"
    path = flight_recorder.dump_now(f"rank {dist.get_rank()}: {outcome}")
    recorder = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(backend=NAME))
    facts = {
        "applied": applied,
        "outcome": outcome,
        "hooked": hooked in hooks and dist.group.WORLD not in hooks,
        "hooked_backends": flight_recorder._hooked_backends(),
        "recorder_entries": len(recorder["entries"]),
        "recorder_states": sorted({e["state"] for e in recorder["entries"]}),
        "supports_abort_hooks": hooked._get_backend(torch.device("cpu")).supports_abort_hooks,
        "dump": str(path),
    }
    dist.barrier()
    dist.destroy_process_group()
    return facts
