"""The group map a dump and its sidecar carry: every process group this rank is in, by the name its trace entries use.

A trace entry names its group by ``process_group[0]``, the group's name (``ProcessGroup.group_name``; the same string
``distributed_c10d._world.pg_names`` holds); it does not list the group's ranks. Gloo's ``pg_config`` does not either
(``docs/recorder-semantics.md``, G-PG-CONFIG), and legacy NCCL's holds a group only once it ran an op. So a rank that
never used a group says nothing of its membership unless the shim writes it down, and that rank is the one a hang
report looks for. Hence two maps, ``{name: {"axes", "ranks", "desc", "backends"}}``:

* :func:`group_map`, at set-up: the run's own groups, each with the mesh axes it serves (``default``, ``tp``, ...);
* :func:`every_group`, whenever a dump or a sidecar is written: every group torch holds on this rank now
  (``_world.pg_map``; a rank outside a group holds nothing for it), made before set-up or after (``new_group``,
  ``split_group``, a flattened mesh axis), with the set-up map's axes kept where the name still names the same ranks.
  A group made later has no axis (``"axes": []``): it is known by its ranks; its name is a label
  (N-SPLIT-COUNTER, N-SPLIT-HASH).

Reading is feature-detected and never raises: a group torch is tearing down, or a torch without one of these
attributes, leaves that group out (or the map as set-up left it), never the dump undone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from nemo_rl_shim.process_groups.registry import group_backends, named_groups

__all__ = ["every_group", "group_map", "held_groups", "held_names", "merged"]


def group_map(device_mesh: Any, moe_mesh: Any = None) -> dict[str, dict[str, Any]]:
    """``{process-group name: {"axes": [...], "ranks": [...], "desc": ..., "backends": {...}}}`` for this rank.

    The name is the one torch writes in each trace entry (``process_group[0]``); the axes are the
    names :func:`nemo_rl_shim.process_groups.registry.named_groups` gives that group (``default``, ``dp_shard``, ...).
    """
    found: dict[str, dict[str, Any]] = {}
    for axis, group in named_groups(device_mesh, moe_mesh).items():
        name = str(group.group_name)
        if name not in found:
            found[name] = {
                "axes": [],
                "ranks": dist.get_process_group_ranks(group),
                "desc": str(getattr(group, "group_desc", "")),
                "backends": group_backends(group),
            }
        found[name]["axes"].append(axis)
    return found


def _name(group: Any, names: Mapping[Any, Any]) -> str | None:
    """The name the group's trace entries carry: ``group.group_name`` (the backend's own name, which the recorders
    write), else torch's Python registry's; None where neither can be read."""
    with contextlib.suppress(Exception):  # "ProcessGroup name not set", a group without backends
        return str(group.group_name)
    name = names.get(group)
    return None if name is None else str(name)


def _ranks(group: Any, group_ranks: Mapping[Any, Any]) -> list[int] | None:
    """The group's global ranks in group-rank order (``pg_group_ranks``: ``{global rank: group rank}``)."""
    mapping = group_ranks.get(group)
    if not isinstance(mapping, Mapping) or not mapping:
        return None
    ranks = sorted(mapping, key=lambda rank: mapping[rank])
    return [int(rank) for rank in ranks] if all(isinstance(r, int) for r in ranks) else None


def _describe(
    group: Any, names: Mapping[Any, Any], group_ranks: Mapping[Any, Any]
) -> tuple[str, dict[str, Any]] | None:
    name, ranks = _name(group, names), _ranks(group, group_ranks)
    if name is None or ranks is None:
        return None
    backends: dict[str, str] = {}
    with contextlib.suppress(Exception):  # a backend torch is tearing down
        backends = group_backends(group)
    desc = getattr(group, "group_desc", "")  # torch 2.3 and later; every lane has it
    return name, {"axes": [], "ranks": ranks, "desc": str(desc or ""), "backends": backends}


def _registry() -> tuple[list[Any], Mapping[Any, Any], Mapping[Any, Any]]:
    world = c10d._world
    return list(world.pg_map), getattr(world, "pg_names", {}), getattr(world, "pg_group_ranks", {})


def held_groups() -> dict[str, dict[str, Any]]:
    """Every group torch holds on this rank (``_world.pg_map``, in the order they were made), described as
    :func:`group_map` describes one, without axes; ``{}`` where torch's registry cannot be read.

    Where two held groups carry one name (one rank cannot run ops on both under it), the first made keeps it, as
    torch's ``pg_config`` keeps the first (C-PG-CONFIG).
    """
    try:
        groups, names, group_ranks = _registry()
    except Exception:  # a torch whose registry is shaped otherwise: the set-up map stands alone
        return {}
    found: dict[str, dict[str, Any]] = {}
    for group in groups:
        with contextlib.suppress(Exception):
            described = _describe(group, names, group_ranks)
            if described is not None:
                found.setdefault(*described)
    return found


def held_names() -> tuple[str, ...]:
    """The names of the groups torch holds now, cheaply: what tells whether a sidecar written earlier is stale."""
    try:
        return tuple(str(name) for name in list(getattr(c10d._world, "pg_names", {}).values()))
    except Exception:
        return ()


def merged(set_up: Mapping[str, Mapping[str, Any]], held: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The set-up map with every held group added: a held group under a set-up name with the same ranks keeps the
    set-up entry (its axes); under a set-up name with other ranks it replaces it (a name is a label; torch holds that
    group now); a set-up group torch no longer holds stays (its entries may still be in the buffer)."""
    found = {name: {**facts, "axes": list(facts.get("axes") or [])} for name, facts in set_up.items()}
    for name, facts in held.items():
        kept = found.get(name)
        if kept is None or list(kept.get("ranks") or []) != list(facts["ranks"]):
            found[name] = {**facts, "axes": []}
    return found


def every_group(set_up: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`merged` of the set-up map and :func:`held_groups`: what a dump and a sidecar written now carry."""
    return merged(set_up, held_groups())
