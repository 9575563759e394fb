"""Rank functions for tests/process_groups/test_later.py: every group torch holds, through the phases, on Gloo ranks.

:func:`phases` runs the real ``setup_distributed`` with the installed Automodel, makes the groups a
NeMo RL worker makes after set-up (the lazily flattened ``("cp", "tp")`` replica group, plain and
Gloo ``new_group``\\ s as for SGLang refit, Automodel's checkpoint groups) and groups with timeouts of
their own, then audits every group at each phase. Returns JSON: each phase's audit
(:meth:`nemo_rl_shim.audit.GroupsAudit.to_json`) and the ``group_name`` of each group it made.
Nothing here asserts.
"""

from __future__ import annotations

import datetime
import importlib
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from nemo_rl_shim.audit import audit_groups
from nemo_rl_shim.config import blocks
from nemo_rl_shim.process_groups import later
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step, extended_timeout
from tests.ranks.fresh_group import forget_meshes, move_to_fresh_port

__all__ = ["SIZES", "phases"]

#: 4 ranks: tp 2, dp 2. The ("cp", "tp") flattened axis has 2 ranks: a group of its own, not the default one.
SIZES = {"tensor_parallel_size": 2}
_CHECKPOINT = "nemo_automodel.components.checkpoint.checkpointing"


class _BodyFailed(Exception):
    """Raised inside ``extended_timeout`` to take its exception path."""


def _section(startup: float | None, steady: float | None) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    if startup is not None:
        knobs["distributed_timeout_minutes"] = startup
    if steady is not None:
        knobs["distributed_timeout_minutes_after_init"] = steady
    return {**blocks(knobs), "dtensor_cfg": dict(SIZES)}


def _replica_group(context: Any) -> ProcessGroup:
    """NeMo RL's ``DTensorPolicyWorkerV2._get_replica_group``: the ("cp", "tp") sub-mesh flattened, lazily."""
    return context.device_mesh[("cp", "tp")]._flatten().get_group()


def _checkpoint_groups(replica: ProcessGroup) -> tuple[dict[str, ProcessGroup], str]:
    """Automodel's checkpoint Gloo groups, made by its own function where the installed release has it."""
    try:
        make = getattr(importlib.import_module(_CHECKPOINT), "_new_gloo_process_group", None)
        why = "it has no _new_gloo_process_group"
    except ImportError as error:  # the torch-2.9 lane: 0.5.0's checkpointing imports a torchao that needs torch 2.10
        make, why = None, f"it does not import here ({type(error).__name__}: {str(error)[:120]})"
    if make is None:  # the same call Automodel's checkpointer makes
        return {"checkpoint": dist.new_group(backend="gloo")}, f"new_group(backend='gloo'), as {_CHECKPOINT}: {why}"
    return {"checkpoint": make(None), "checkpoint_replica": make(replica)}, f"{_CHECKPOINT}._new_gloo_process_group"


def _refit_groups() -> dict[str, ProcessGroup]:
    """NeMo RL's SGLang refit groups (``_ensure_ipc_topology``): every rank makes each engine's Gloo group."""
    made = {}
    for start in (0, 2):
        group = dist.new_group(ranks=[start, start + 1], backend="gloo")
        if dist.get_rank() in (start, start + 1):
            made["refit"] = group
    return made


def _all_reduce(groups: dict[str, ProcessGroup]) -> dict[str, float]:
    """One all-reduce of ones on each group: the groups work with the values they were given."""
    sums = {}
    for name, group in groups.items():
        ones = torch.ones(1)
        dist.all_reduce(ones, group=group)
        sums[name] = ones.item()
    return sums


def _later_groups(context: Any, params: dict[str, Any]) -> tuple[dict[str, ProcessGroup], str]:
    replica = _replica_group(context)
    checkpoint, how = _checkpoint_groups(replica)
    made = {"replica": replica, "plain": dist.new_group(), **_refit_groups(), **checkpoint}
    own = datetime.timedelta(seconds=params["own_s"])
    made["own"] = dist.new_group(backend="gloo", timeout=own)
    # Its own value equals the steady one: still its own, so extended_timeout must not raise it.
    made["own_at_steady"] = dist.new_group(timeout=datetime.timedelta(minutes=params["steady"]))
    return made, how


def _configured_phases(params: dict[str, Any]) -> dict[str, Any]:
    context = setup_distributed(_section(params["startup"], params["steady"]), RuntimeConfig())
    made, how = _later_groups(context, params)
    out: dict[str, Any] = {"checkpoint_groups_by": how, "every_group": context.decision.every_group}
    out["startup"] = audit_groups(context).to_json()
    out["startup_sums"] = _all_reduce(made)
    after_first_step(context)
    made["after_first_step"] = dist.new_group(backend="gloo")
    out["steady"] = audit_groups(context).to_json()
    with extended_timeout(context, params["raised"]):
        made["inside_extended"] = dist.new_group()
        out["extended"] = audit_groups(context).to_json()
        out["extended_sums"] = _all_reduce({"replica": made["replica"], "inside": made["inside_extended"]})
    out["after_extended"] = audit_groups(context).to_json()
    try:
        with extended_timeout(context, params["raised"]):
            made["inside_failed_phase"] = dist.new_group(backend="gloo")
            raise _BodyFailed("slow phase failed")
    except _BodyFailed:
        pass
    out["after_error"] = audit_groups(context).to_json()
    dist.barrier()  # realign the ranks (the exception path restored without a barrier)
    out["names"] = {name: group.group_name for name, group in made.items()}
    return out


def _torch_defaults_after_teardown() -> dict[str, Any]:
    """``destroy_process_group`` ends following: a new world, made without a timeout, reads torch's defaults."""
    move_to_fresh_port()
    dist.destroy_process_group()
    forget_meshes()
    dist.init_process_group("gloo")  # torch asks for its default: the stand-in finds its world gone
    out: dict[str, Any] = {
        "hook_is_torchs": not later.stand_in_installed(),
        "following_after_destroy": later.following() is not None,
    }
    dist.new_group(backend="gloo")
    dist.new_group()
    out["torch_world"] = audit_groups().to_json()
    return out


def _unconfigured() -> dict[str, Any]:
    """No timeout configured: ``setup_distributed`` changes nothing for groups made later."""
    move_to_fresh_port()
    dist.destroy_process_group()
    forget_meshes()
    context = setup_distributed(_section(None, None), RuntimeConfig())
    _replica_group(context)
    dist.new_group(backend="gloo")
    return {"unconfigured_following": later.following() is not None, "unconfigured": audit_groups().to_json()}


def phases(params: dict[str, Any]) -> dict[str, Any]:
    """Audits of every group at start-up, in steady state, inside and after ``extended_timeout`` (normal exit and
    exception), then after teardown and in a run without a timeout.

    ``params``: ``startup``, ``steady``, ``raised`` (minutes) and ``own_s`` (seconds, a group's own timeout).
    """
    out = _configured_phases(params)
    out.update(_torch_defaults_after_teardown())
    out.update(_unconfigured())
    dist.barrier()  # no rank tears the store down while a peer still reads through it
    return out
