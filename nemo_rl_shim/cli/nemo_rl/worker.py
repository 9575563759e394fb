"""Which NeMo RL worker runs a role, and so whether the Automodel path this command checks is the one it takes.

NeMo RL picks the worker from ``dtensor_cfg`` (``nemo_rl/models/policy/lm_policy.py`` at 7ea279abf):
``enabled: false`` runs the role on Megatron, and ``_v2`` unset or false runs the v1 DTensor
worker, which builds its meshes without Automodel's ``MeshContext``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["worker_note"]


def worker_note(section: Mapping[str, Any], role: str) -> str | None:
    """Why this config's ``role`` would not run on the Automodel path this command checks, or None.

    On Megatron or on the v1 DTensor worker (see the module docstring), the knob
    ``automodel_cfg.distributed_timeout_minutes`` does not reach that run, so the report says so.
    """
    dtensor = section.get("dtensor_cfg") or {}
    if dtensor.get("enabled") is False:
        return (
            f"{role}.dtensor_cfg.enabled is false: NeMo RL runs this role on Megatron (its timeout is "
            f"{role}.megatron_cfg.distributed_timeout_minutes); this check covers the Automodel path"
        )
    if dtensor.get("_v2") is not True:
        return (
            f"{role}.dtensor_cfg._v2 is {dtensor.get('_v2', 'unset')!s}: NeMo RL runs its v1 DTensor worker, which "
            f"does not build Automodel's meshes; this check covers the Automodel path ({role}.dtensor_cfg._v2=true)"
        )
    return None
