"""The rendezvous port of a local world, bound by its rank 0 before ``init_process_group``, and told to its peers.

A launcher that picks a free port and hands it to its ranks leaves a window, from the pick to rank 0's bind
(seconds: rank 0 imports torch first), in which another process can take the port, or another world's rank 0
can bind it and this world's peers join that world. With two test suites on one machine, both happened.

Here rank 0 binds the store's server on a port the kernel picks, and keeps it. torch's ``env://`` rendezvous
then asks rank 0 for a multi-tenant ``TCPStore`` server on that port, and torch serves it from the one this
process already holds (one server per port in a process). The peers wait for the port in a file the launcher
names (:data:`PORT_FILE_ENV`); rank 0 writes it whole (a rename), once bound.

Imports torch only in :func:`bind_rendezvous`, on rank 0, which imports it next anyway.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["PORT_FILE_ENV", "bind_rendezvous", "take_rendezvous_port"]

#: Where a spawned world's rank 0 writes the port it bound, and its peers read it.
PORT_FILE_ENV = "NEMO_RL_SHIM_RENDEZVOUS_PORT_FILE"
#: The servers this process binds, kept for its lifetime: torch's cache of servers by port holds them weakly.
_HELD: list[Any] = []
_POLL_S = 0.02


def bind_rendezvous(world_size: int, timeout: datetime.timedelta = datetime.timedelta(minutes=30)) -> int:
    """Bind a ``TCPStore`` server on a port the kernel picks, keep it, and return the port: this process's
    ``init_process_group`` on ``env://`` with that ``MASTER_PORT`` and ``RANK=0`` serves the world from it."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timeout, wait_for_workers=False, multi_tenant=True)
    _HELD.append(store)
    return int(store.port)


def _publish(path: Path, port: int) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_text(str(port), encoding="ascii")
    partial.replace(path)


def _wait_for_port(path: Path) -> int:
    """The port rank 0 wrote; the launcher bounds the wait (it ends every rank when rank 0 fails or time runs out)."""
    while True:
        try:
            return int(path.read_text(encoding="ascii"))
        except FileNotFoundError:
            time.sleep(_POLL_S)


def take_rendezvous_port() -> int | None:
    """Set this rank's ``MASTER_PORT`` where the launcher left the port to rank 0 (:data:`PORT_FILE_ENV`): rank 0
    binds it (:func:`bind_rendezvous`) and writes it, the others wait for it. The port, or None where the
    launcher gave the port itself."""
    path = os.environ.pop(PORT_FILE_ENV, None)
    if path is None:
        return None
    if int(os.environ["RANK"]) == 0:
        port = bind_rendezvous(int(os.environ["WORLD_SIZE"]))
        _publish(Path(path), port)
    else:
        port = _wait_for_port(Path(path))
    os.environ["MASTER_PORT"] = str(port)
    return port
