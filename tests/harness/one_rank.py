"""One Gloo rank in this process (``init_process_group`` on a ``HashStore``), and an audit read group by group.

What tests/process_groups/test_later.py (the rules one by one) and tests/audit/test_audit.py share.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from nemo_rl_shim.audit import GroupAudit, GroupsAudit, TimeoutSource
from nemo_rl_shim.process_groups import later
from nemo_rl_shim.setup.distributed import DistributedContext

__all__ = ["by_name", "one_rank_world", "readings"]


@contextmanager
def one_rank_world(timeout: datetime.timedelta, steady_minutes: float | None = None) -> Iterator[DistributedContext]:
    """A one-rank Gloo world at ``timeout``, as a context without meshes; torn down, torch's function back, after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    try:
        yield DistributedContext(None, None, None, None, 1, 1, 1, timeout_minutes_after_init=steady_minutes)
    finally:
        dist.destroy_process_group()
        later.restore_torch_defaults()


def by_name(audit: GroupsAudit) -> dict[str, GroupAudit]:
    """An audit's groups by group name."""
    return {group.group_name: group for group in audit.groups}


def readings(group: GroupAudit) -> dict[str, tuple[float | None, TimeoutSource]]:
    """``{device: (timeout in seconds, where it came from)}`` of an audited group."""
    return {b.device: (b.timeout_s, b.source) for b in group.backends}
