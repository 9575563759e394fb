"""NeMo RL side of the Automodel timeout fix.

``policy.automodel_cfg.distributed_timeout_minutes`` (and ``value.automodel_cfg``
for PPO) reaches ``init_process_group`` and every DeviceMesh sub-group, without
breaking FSDP2 CPU offload's Gloo half. Importing this package does not import
nemo-automodel; that happens on the first ``setup_distributed`` or detection.

This package is the library a training worker imports. The ``nemo-rl-shim`` command lives
in :mod:`nemo_rl_shim.cli`, which imports the library and is never imported by it.
"""

from __future__ import annotations

from nemo_rl_shim.config import (
    AutomodelConfig,
    automodel_cfg,
    distributed_timeout_minutes,
    distributed_timeout_minutes_after_init,
    patch_automodel,
)
from nemo_rl_shim.decision import Action, Decision, WorkaroundState, decide
from nemo_rl_shim.distributed_setup import DistributedContext, RuntimeConfig, check_layout, setup_distributed
from nemo_rl_shim.process_group import backend_for, init_process_group
from nemo_rl_shim.support import UnsupportedVersions

__all__ = [
    "Action",
    "AutomodelConfig",
    "Decision",
    "DistributedContext",
    "RuntimeConfig",
    "UnsupportedVersions",
    "WorkaroundState",
    "automodel_cfg",
    "backend_for",
    "check_layout",
    "decide",
    "distributed_timeout_minutes",
    "distributed_timeout_minutes_after_init",
    "init_process_group",
    "patch_automodel",
    "setup_distributed",
]
