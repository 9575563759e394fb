"""Stands in for NeMo RL's ``dtensor_policy_worker_v2`` (``7ea279abf``): the worker's replica group.

Why: CI has no copy of NeMo RL (see ``nemo_rl/__init__.py``). ``_get_replica_group`` flattens the ``("cp", "tp")``
sub-mesh when first asked, as NeMo RL's does on its first data-plane fetch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DTensorPolicyWorkerV2Impl"]


class DTensorPolicyWorkerV2Impl:
    """Only the method preflight calls (with ``self.device_mesh`` set)."""

    device_mesh: Any

    def _get_replica_group(self) -> Any:
        return self.device_mesh[("cp", "tp")]._flatten().get_group()
