"""Which process groups a rank checks, and the :class:`~.results.GroupRow` read from each.

The seam: :func:`groups_to_check` is the one place that says which groups a rank lists. Every runner
(spawn, torchrun/srun, Ray, the dry run) gets its rows from :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank`,
which takes its groups from a :data:`GroupListing` - this function unless the caller passes another
(the dry run adds the groups its rank created that no name reaches) - and builds every row with
:func:`row_of`. Today the listing is the groups the training code names (the default group, each mesh
axis, each flattened axis, each MoE axis: :func:`nemo_rl_shim.groups.named_groups`). To check every
group torch holds instead, replace the body of :func:`groups_to_check` with that audit; the rows, the
after-init reading, the report and every runner follow unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from nemo_rl_shim.cli.preflight.results import GroupRow
from nemo_rl_shim.groups import backend_timeouts, group_backends, named_groups

__all__ = ["GroupListing", "groups_to_check", "minutes", "row_of", "with_steady_timeouts"]

#: From the set-up's context (:class:`~nemo_rl_shim.distributed_setup.SetupContext`) to ``{row name: group}``.
GroupListing = Callable[[Any], dict[str, Any]]


def groups_to_check(context: Any) -> dict[str, Any]:
    """The groups a rank checks, by name, in table order: see the module docstring (the seam)."""
    return named_groups(context.device_mesh, context.moe_mesh)


def minutes(group: Any) -> dict[str, float]:
    """Each backend's timeout in minutes, read from the group: ``{"cpu": 45.0, "cuda": 45.0}``."""
    return {device: timeout.total_seconds() / 60 for device, timeout in backend_timeouts(group).items()}


def row_of(name: str, group: Any, earlier: Mapping[str, Any], cpu_all_reduce: str, cuda_all_reduce: str) -> GroupRow:
    """The row of ``group``: its ranks, backends and timeouts read from it, and the two all-reduce outcomes.

    ``earlier``: the rows already read on this rank, ``{name: group}``; the first of them that is
    this very group object is the row's ``same_as``.
    """
    same_as = next((other for other, seen in earlier.items() if seen is group), None)
    return GroupRow(
        group=name,
        ranks=tuple(dist.get_process_group_ranks(group)),
        backends=group_backends(group),
        timeout_minutes=minutes(group),
        cpu_all_reduce=cpu_all_reduce,
        cuda_all_reduce=cuda_all_reduce,
        is_default=group is dist.group.WORLD,
        same_as=same_as,
    )


def with_steady_timeouts(rows: tuple[GroupRow, ...], groups: Mapping[str, Any]) -> tuple[GroupRow, ...]:
    """``rows`` with each group's timeouts read again (after ``after_first_step`` applied the steady value)."""
    return tuple(
        replace(row, timeout_minutes_after_init=minutes(group))
        for row, group in zip(rows, groups.values(), strict=True)
    )
