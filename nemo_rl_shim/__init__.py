"""NeMo RL side of the Automodel timeout fix.

``policy.automodel_cfg.distributed_timeout_minutes`` (and ``value.automodel_cfg``
for PPO) reaches ``init_process_group`` and every DeviceMesh sub-group, without
breaking FSDP2 CPU offload's Gloo half. This package's own keys sit beside it, in
``policy.nemo_rl_shim`` (``value.nemo_rl_shim``).

This package is the library a training worker imports. The ``nemo-rl-shim`` command lives
in :mod:`nemo_rl_shim.cli`, which imports the library and is never imported by it.

Rooms, each named for what it owns (its ``__init__`` says what it may import), lowest first:

* :mod:`.config`: the ``automodel_cfg`` knob, the ``nemo_rl_shim`` block, and their checks (no torch);
* :mod:`.one_line`: what every one-line report is made of: an exception's first line, a list of ranks (no torch);
* :mod:`.process_groups`: every group torch holds, the value a group made later gets, setting a timeout and
  reading it back;
* :mod:`.flight_recorder`: torch's recorder switched on, the dumps, the stack watchdog;
* :mod:`.setup`: the default group, the decision, the supported pairs, ``setup_distributed``;
* :mod:`.timeouts` (the phases, the learned timeouts) and :mod:`.audit` (every group, and where its timeout
  came from), which take ``setup_distributed``'s result.

Importing this package imports no torch and no nemo-automodel: the names below are exported lazily
(PEP 562), each imported from its room on first use. nemo-automodel is imported on the first
``setup_distributed`` or detection.
"""

from __future__ import annotations

from nemo_rl_shim._lazy import lazy_exports

TYPE_CHECKING = False  # typing's own constant, without importing typing (~10 ms at every start)

if TYPE_CHECKING:
    from nemo_rl_shim.config.settings import (
        AutomodelConfig,
        ShimConfig,
        automodel_cfg,
        distributed_timeout_minutes,
        distributed_timeout_minutes_after_init,
        knobs,
        patch_automodel,
        shim_cfg,
    )
    from nemo_rl_shim.setup.decision import Action, Decision, WorkaroundState, decide
    from nemo_rl_shim.setup.default_group import backend_for, init_process_group
    from nemo_rl_shim.setup.distributed import DistributedContext, RuntimeConfig, check_layout, setup_distributed
    from nemo_rl_shim.setup.support import UnsupportedVersions

__all__ = [
    "Action",
    "AutomodelConfig",
    "Decision",
    "DistributedContext",
    "RuntimeConfig",
    "ShimConfig",
    "UnsupportedVersions",
    "WorkaroundState",
    "automodel_cfg",
    "backend_for",
    "check_layout",
    "decide",
    "distributed_timeout_minutes",
    "distributed_timeout_minutes_after_init",
    "init_process_group",
    "knobs",
    "patch_automodel",
    "setup_distributed",
    "shim_cfg",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    __all__,
    (".config.settings", ".setup.support", ".setup.default_group", ".setup.decision", ".setup.distributed"),
)
