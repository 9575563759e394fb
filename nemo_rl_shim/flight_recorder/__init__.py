"""torch's Flight Recorder, switched on from ``nemo_rl_shim.flight_recorder``; a dump, and a stack, when a rank hangs.

Owns:

* :mod:`.recorder`: switching torch's recorder on (``configure``), the group map beside each dump
  (``record_groups``, ``refresh_sidecar``), the dump on a timeout and on request (``dump_on_timeout``, ``dump_now``,
  ``request_peer_dumps``);
* :mod:`.groups`: what that map holds: the run's groups by mesh axis at set-up (``group_map``), and every group
  torch holds on the rank when a dump or the map is written, later ones included;
* :mod:`.stack_watchdog`: a rank's Python stack, written without the GIL by faulthandler's C watchdog when
  it stays in a block too long (``stack_watch`` and ``dump_on_timeout`` arm it);
* :mod:`.names`: the file names, keys and torch's variable names that a reader of the files needs.

May import: torch, :mod:`nemo_rl_shim.config`, :mod:`nemo_rl_shim.process_groups`. :mod:`.names` and
:mod:`.stack_watchdog` import no torch, and neither does this ``__init__``: it exports lazily (PEP 562), so
``nemo-rl-shim hang-report``, which reads only :mod:`.names`, runs where torch is not installed.
``from nemo_rl_shim.flight_recorder import dump_on_timeout`` imports :mod:`.recorder` (and torch) then.
"""

from __future__ import annotations

from nemo_rl_shim._lazy import lazy_exports

TYPE_CHECKING = False  # typing's own constant, without importing typing (~10 ms at every start)

if TYPE_CHECKING:
    from nemo_rl_shim.flight_recorder.groups import group_map
    from nemo_rl_shim.flight_recorder.names import (
        DUMP_FILE_NAME,
        ENV_PAIRS,
        PG_STATUS_KEY,
        SIDECAR_NAME,
        TORCH_DEFAULT_PREFIX,
    )
    from nemo_rl_shim.flight_recorder.recorder import (
        PEER_DUMP_WAIT_S,
        STACK_GRACE_S,
        configure,
        dump_now,
        dump_on_timeout,
        dump_path,
        is_enabled,
        record_groups,
        refresh_sidecar,
        request_peer_dumps,
        stack_watch,
    )

__all__ = [
    "DUMP_FILE_NAME",
    "ENV_PAIRS",
    "PEER_DUMP_WAIT_S",
    "PG_STATUS_KEY",
    "SIDECAR_NAME",
    "STACK_GRACE_S",
    "TORCH_DEFAULT_PREFIX",
    "configure",
    "dump_now",
    "dump_on_timeout",
    "dump_path",
    "group_map",
    "is_enabled",
    "record_groups",
    "refresh_sidecar",
    "request_peer_dumps",
    "stack_watch",
]

__getattr__, __dir__ = lazy_exports(__name__, __all__, (".names", ".recorder", ".groups"))
