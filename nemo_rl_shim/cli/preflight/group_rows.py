"""Which process groups a rank checks, and the :class:`~.results.GroupRow` read from each.

The seam: :func:`groups_to_check` is the one place that says which groups a rank lists, and it lists
every process group torch holds in this process (:func:`nemo_rl_shim.process_groups.registry.all_groups`, torch's
registry): first the groups the training code names, under those names (the default group, each mesh
axis, each flattened axis, each MoE axis: :func:`nemo_rl_shim.process_groups.registry.named_groups`), then every other
group (a plain ``new_group``, a library's own group) as ``unnamed <group_desc>`` (``unnamed undefined``:
torch's description of a ``new_group`` made without one). Every runner (spawn, torchrun/srun, Ray, the
dry run) gets its rows from :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank`, which builds each
with :func:`row_of` from the group and its entry in the audit (:func:`nemo_rl_shim.audit.audit_groups`):
its ranks, backends, each backend's timeout and where that came from (configured, the group's own,
torch's default, or unreadable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.audit import BackendTimeout, GroupAudit, GroupsAudit
from nemo_rl_shim.cli.preflight.results import GroupRow
from nemo_rl_shim.process_groups.registry import all_groups, named_groups

__all__ = ["audit_of", "groups_to_check", "row_of", "with_steady_timeouts"]


def _unique(name: str, taken: Mapping[str, Any]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name} ({n})" in taken:
        n += 1
    return f"{name} ({n})"


def groups_to_check(context: Any) -> dict[str, ProcessGroup]:
    """Every process group torch holds, by name, in table order: see the module docstring (the seam).

    ``context``: the set-up's (the shim's or NeMo RL's ``DistributedContext``: its ``device_mesh`` and
    ``moe_mesh`` name the groups). A name that several groups would share gets ``" (2)"``, ``" (3)"``.
    """
    groups = named_groups(getattr(context, "device_mesh", None), getattr(context, "moe_mesh", None))
    listed = {id(group) for group in groups.values()}
    for group in all_groups():
        if id(group) not in listed:
            groups[_unique(f"unnamed {getattr(group, 'group_desc', 'undefined')}", groups)] = group
            listed.add(id(group))
    return groups


def audit_of(audit: GroupsAudit) -> dict[str, GroupAudit]:
    """The audit's groups by torch's ``group_name`` (unique among a rank's groups)."""
    return {group.group_name: group for group in audit.groups}


def _minutes(backend: BackendTimeout) -> float | None:
    return None if backend.timeout_s is None else backend.timeout_s / 60


def row_of(
    name: str, group: ProcessGroup, earlier: Mapping[str, Any], audited: GroupAudit, cpu_all_reduce: str,
    cuda_all_reduce: str,
) -> GroupRow:  # fmt: skip
    """The row of ``group``: what the audit read of it (``audited``), and the two all-reduce outcomes.

    ``earlier``: the rows already read on this rank, ``{name: group}``; the first of them that is
    this very group object is the row's ``same_as``.
    """
    same_as = next((other for other, seen in earlier.items() if seen is group), None)
    return GroupRow(
        group=name,
        ranks=audited.ranks,
        backends={b.device: b.backend for b in audited.backends},
        timeout_minutes={b.device: _minutes(b) for b in audited.backends},
        cpu_all_reduce=cpu_all_reduce,
        cuda_all_reduce=cuda_all_reduce,
        is_default=group is dist.group.WORLD,
        same_as=same_as,
        named=bool(audited.axes),
        desc=audited.group_desc,
        group_name=audited.group_name,
        sources={b.device: b.source.value for b in audited.backends},
    )


def with_steady_timeouts(rows: tuple[GroupRow, ...], steady: GroupsAudit) -> tuple[GroupRow, ...]:
    """``rows`` with each group read again from ``steady``, the audit after ``after_first_step`` applied the
    steady value (and judged against it)."""
    by_name = audit_of(steady)
    return tuple(
        replace(
            row,
            timeout_minutes_after_init={b.device: _minutes(b) for b in by_name[row.group_name].backends},
            sources_after_init={b.device: b.source.value for b in by_name[row.group_name].backends},
        )
        for row in rows
    )
