"""``setup_distributed``: NeMo RL's Automodel-path set-up, with the timeout carried through.

Order: validate the config and the layout (no process group yet), check that this torch
and nemo-automodel can run together, decide, apply the workarounds the decision names,
initialize the default group, build the meshes. The result is a NamedTuple whose first
seven fields are NeMo RL's ``DistributedContext``, so a worker can take it as is.
"""

from __future__ import annotations

import datetime
import importlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

import automodel_patch
from automodel_patch._target import CONFIG_MODULE, MESH_MODULE, MESH_UTILS_MODULE, MOE_CONFIG_MODULES
from nemo_rl_shim import config as cfg
from nemo_rl_shim.config.integers import positive_int
from nemo_rl_shim.flight_recorder import recorder
from nemo_rl_shim.process_groups import later
from nemo_rl_shim.process_groups.registry import axis_mesh, backend_timeouts, distinct_groups
from nemo_rl_shim.process_groups.setting import set_group_timeout, set_mesh_timeouts
from nemo_rl_shim.setup.decision import Decision, decide
from nemo_rl_shim.setup.default_group import backend_for, init_process_group
from nemo_rl_shim.setup.support import require_supported

__all__ = [
    "NEMO_RL_FIELDS",
    "DistributedContext",
    "ParallelSizes",
    "RuntimeConfig",
    "check_layout",
    "parallel_sizes",
    "setup_distributed",
]


class RuntimeConfig(NamedTuple):
    """The part of NeMo RL's ``RuntimeConfig`` that ``setup_distributed`` reads."""

    cpu_offload: bool = False
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class ParallelSizes:
    """Requested sizes from ``dtensor_cfg``; dp is inferred from the world size."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp_replicate: int = 1


class DistributedContext(NamedTuple):
    """What ``setup_distributed`` built: NeMo RL's seven fields, in its order, then the shim's own.

    A worker written for NeMo RL's ``DistributedContext`` (``nemo_rl/models/automodel/config.py``)
    unpacks or indexes the first seven exactly as before; ``decision`` and
    ``timeout_minutes_after_init`` follow with defaults.
    """

    device_mesh: Any
    moe_mesh: Any
    fsdp2_config: Any
    moe_config: Any
    dp_size: int
    tp_size: int
    cp_size: int
    decision: Decision | None = None
    timeout_minutes_after_init: float | None = None
    #: Groups whose backends came out of the mesh build without the timeout, and got it right after
    #: (a pin whose build takes no timeout; torch 2.9's DeviceMesh passes none to Gloo sub-groups);
    #: empty where the build gave it.
    timeouts_set_after_build: tuple[str, ...] = ()
    #: ``nemo_rl_shim.learned_timeouts``, validated (None: off), for :func:`nemo_rl_shim.timeouts.learned_timeouts`.
    learned_timeouts: cfg.LearnedTimeoutsSettings | None = None


#: NeMo RL's ``DistributedContext`` fields, in order.
NEMO_RL_FIELDS = ("device_mesh", "moe_mesh", "fsdp2_config", "moe_config", "dp_size", "tp_size", "cp_size")


_SIZE_KEYS = {
    "tp": "tensor_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_parallel_size",
    "dp_replicate": "dp_replicate_size",
}


def parallel_sizes(dtensor_cfg: Mapping[str, Any], where: str = "policy.dtensor_cfg") -> ParallelSizes:
    """Read and check the parallel sizes of ``dtensor_cfg``."""
    sizes = {}
    for field, key in _SIZE_KEYS.items():
        value = dtensor_cfg.get(key, 1)
        sizes[field] = positive_int(value, f"{where}.{key}")
    return ParallelSizes(**sizes)


def _accepted(cls: type, wanted: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in wanted.items() if key in names}


def _fsdp2_config(dtensor_cfg: Mapping[str, Any], runtime_config: RuntimeConfig) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    fsdp2_cls = importlib.import_module(CONFIG_MODULE).FSDP2Config
    wanted = {
        "sequence_parallel": dtensor_cfg.get("sequence_parallel", False),
        "tp_plan": dtensor_cfg.get("custom_parallel_plan"),
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=runtime_config.dtype, reduce_dtype=torch.float32, output_dtype=torch.float32
        ),
        "offload_policy": CPUOffloadPolicy(pin_memory=False) if runtime_config.cpu_offload else None,
        "activation_checkpointing": dtensor_cfg.get("activation_checkpointing", False),
        "defer_fsdp_grad_sync": dtensor_cfg.get("defer_fsdp_grad_sync", True),
        # 0.3.0 and 0.4.0 pick the mesh device from this field.
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
    }
    return fsdp2_cls(**_accepted(fsdp2_cls, wanted))


def _moe_config(dtensor_cfg: Mapping[str, Any]) -> Any:
    options = dtensor_cfg.get("moe_parallelizer") or {}
    for module in MOE_CONFIG_MODULES:
        try:
            moe_cls = getattr(importlib.import_module(module), "MoEParallelizerConfig", None)
        except ImportError:
            continue
        if moe_cls is not None:
            return moe_cls(**options)
    return None


def _build_meshes(fsdp2_config: Any, sizes: ParallelSizes, world_size: int, decision: Decision) -> tuple[Any, Any]:
    if automodel_patch.build_accepts_timeout():
        mesh = importlib.import_module(MESH_MODULE)
        context = mesh.MeshContext.build(
            fsdp2_config,
            mesh.ParallelismSizes(
                dp_replicate_size=sizes.dp_replicate, tp_size=sizes.tp, cp_size=sizes.cp, ep_size=sizes.ep, pp_size=1
            ),
            world_size=world_size,
            timeout_minutes=decision.forward_minutes,
        )
        return context.device_mesh, context.moe_mesh
    # 0.3.0 / 0.4.0: the mesh is built the way that pin supports, without a timeout.
    mesh_utils = importlib.import_module(MESH_UTILS_MODULE)
    return mesh_utils.create_device_mesh(
        fsdp2_config,
        dp_replicate_size=sizes.dp_replicate,
        tp_size=sizes.tp,
        pp_size=1,
        cp_size=sizes.cp,
        ep_size=sizes.ep,
        world_size=world_size,
    )


def _axis_size(device_mesh: Any, name: str) -> int:
    if name in device_mesh.mesh_dim_names:
        # size(dim), not mesh[name].size(): slicing builds a sub-mesh (~2 ms each on torch 2.15)
        return device_mesh.size(device_mesh.mesh_dim_names.index(name))
    return axis_mesh(device_mesh, name).size()  # a flattened axis, on any torch (groups.axis_mesh)


def check_layout(
    sizes: ParallelSizes, world_size: int, *, cpu_offload: bool, where: str = "policy.dtensor_cfg"
) -> None:
    """NeMo RL's own layout checks, with the ``dtensor_cfg`` key and the values in the message.

    * HSDP: ``dp_replicate_size`` must divide ``world_size // (tp * cp * ep)`` (ValueError);
    * CPU offload on a world of one rank is not supported by Automodel (NotImplementedError).
    """
    model_parallel = sizes.tp * sizes.cp * sizes.ep
    dp = world_size // model_parallel
    if dp % sizes.dp_replicate != 0:
        raise ValueError(
            f"{where}.dp_replicate_size must divide the data-parallel size, world size {world_size} // "
            f"(tensor_parallel_size {sizes.tp} * context_parallel_size {sizes.cp} * expert_parallel_size "
            f"{sizes.ep}) = {dp}, got {sizes.dp_replicate}"
        )
    if world_size == 1 and cpu_offload:
        raise NotImplementedError(
            f"{where}.cpu_offload is true on a world of 1 rank: CPUOffload doesn't work on single GPU for "
            "AutoModel. If you need this feature, please file an issue on https://github.com/NVIDIA-NeMo/Automodel."
        )


def _launcher_world_size() -> int | None:
    """``WORLD_SIZE`` as the launcher set it for ``init_process_group``'s env:// rendezvous, if it did."""
    value = os.environ.get("WORLD_SIZE")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _mesh_groups(context: DistributedContext) -> dict[str, Any]:
    """The context's own groups: the default group and each distinct group of its meshes."""
    return distinct_groups(context.device_mesh, context.moe_mesh)


def _lacking(context: DistributedContext, minutes: float) -> tuple[str, ...]:
    """The groups with a backend whose timeout is not ``minutes``."""
    wanted = datetime.timedelta(minutes=minutes)
    return tuple(
        name
        for name, group in _mesh_groups(context).items()
        if any(timeout != wanted for timeout in backend_timeouts(group).values())
    )


def _set_after_build(context: DistributedContext, decision: Decision, minutes: float) -> tuple[str, ...]:
    """Give the timeout to every group and backend the mesh build left without it; return their names.

    A pin whose build takes no timeout (:attr:`Decision.set_after_build`): every group of the meshes
    gets it, read back (:func:`~nemo_rl_shim.process_groups.setting.set_mesh_timeouts`). Otherwise, the gate
    below. Every rank runs the same set-up, so no barrier: nothing is lowered under a peer's wait.
    """
    lacking = _lacking(context, minutes)
    if decision.set_after_build:
        set_mesh_timeouts(context.device_mesh, context.moe_mesh, minutes)
        return lacking
    # Gate: torch 2.9's DeviceMesh hands an override's options but no ``timeout`` to ``new_group``, so
    # Gloo sub-groups (and the Gloo half of composite ones) keep 30 minutes; torch 2.10's passes
    # ``timeout=pg_options._timeout``. Where the build already gave every group the timeout this finds
    # nothing to do. Delete it once the torch floor in pyproject.toml is 2.10 or newer.
    groups = _mesh_groups(context)
    for name in lacking:
        set_group_timeout(datetime.timedelta(minutes=minutes), groups[name])
    return lacking


def setup_distributed(
    config: Mapping[str, Any], runtime_config: RuntimeConfig, *, role: cfg.Role = "policy"
) -> DistributedContext:
    """Initialize torch.distributed and build the device meshes for one model.

    ``config`` is the model's section (``policy``, or ``value`` for PPO's value
    model, named by ``role`` in error messages). Every config value, and the layout
    against the launcher's ``WORLD_SIZE``, is checked before any process group exists;
    so is the torch/nemo-automodel pair (:class:`~nemo_rl_shim.setup.support.UnsupportedVersions`).
    The returned context carries the :class:`~nemo_rl_shim.setup.decision.Decision` that says
    what happened to the timeout. With ``nemo_rl_shim.flight_recorder`` on, torch's recorder
    variables are set before the first group (:mod:`nemo_rl_shim.flight_recorder`) and each rank's
    group map is written beside its dump once the meshes exist. Where every group is meant to carry the
    timeout (:attr:`Decision.every_group`), groups made from then on without a timeout of their own get
    the configured value too, until the world ends (:func:`nemo_rl_shim.process_groups.later.follow`; undone by
    ``destroy_process_group`` or :func:`~nemo_rl_shim.process_groups.later.restore_torch_defaults`). World size 1
    with CPU offload raises ``NotImplementedError``, as in NeMo RL; found only after the rendezvous (no
    ``WORLD_SIZE``), the just-created default group is torn down again first.
    """
    knobs = cfg.knobs({role: config}, role)
    timeout = cfg.distributed_timeout_minutes(knobs, role)
    steady = cfg.distributed_timeout_minutes_after_init(knobs, role)
    patch = cfg.patch_automodel(knobs, role)
    recorder_settings = cfg.flight_recorder(knobs, role)
    learned = cfg.learned_timeouts(knobs, role)
    dtensor_cfg = config.get("dtensor_cfg") or {}
    sizes = parallel_sizes(dtensor_cfg, f"{role}.dtensor_cfg")
    expected_world = _launcher_world_size()
    if expected_world is not None:
        check_layout(sizes, expected_world, cpu_offload=runtime_config.cpu_offload, where=f"{role}.dtensor_cfg")
    if (
        recorder_settings is not None
    ):  # before any group, the probes' included: torch makes its recorder with the first one
        recorder.configure(recorder_settings)
    require_supported()

    backend = backend_for(cpu_offload=runtime_config.cpu_offload)
    decision = decide(
        timeout, cpu_offload=runtime_config.cpu_offload, patch_automodel=patch, where=role, default_backend=backend
    )
    if decision.patches:
        automodel_patch.apply(*decision.patches)
    if decision.warning:
        warnings.warn(decision.warning, RuntimeWarning, stacklevel=2)

    created = not dist.is_initialized()
    init_process_group(cpu_offload=runtime_config.cpu_offload, timeout_minutes=timeout)
    world_size = dist.get_world_size()
    if world_size != expected_world:
        try:
            check_layout(sizes, world_size, cpu_offload=runtime_config.cpu_offload, where=f"{role}.dtensor_cfg")
        except (ValueError, NotImplementedError):
            if created:  # nothing half done: the group this call made goes too (a caller's group stays)
                dist.destroy_process_group()
            raise

    fsdp2_config = _fsdp2_config(dtensor_cfg, runtime_config)
    device_mesh, moe_mesh = _build_meshes(fsdp2_config, sizes, world_size, decision)
    context = DistributedContext(
        device_mesh=device_mesh,
        moe_mesh=moe_mesh,
        fsdp2_config=fsdp2_config,
        moe_config=_moe_config(dtensor_cfg),
        dp_size=_axis_size(device_mesh, "dp"),
        tp_size=_axis_size(device_mesh, "tp"),
        cp_size=_axis_size(device_mesh, "cp"),
        decision=decision,
        timeout_minutes_after_init=steady,
        learned_timeouts=learned,
    )
    if decision.every_group:
        context = context._replace(timeouts_set_after_build=_set_after_build(context, decision, timeout))
        # From here on a group made without a timeout of its own (a lazily flattened axis, a Gloo group,
        # a checkpoint group) gets the configured value, and the phases move it (nemo_rl_shim.process_groups.later).
        later.follow(datetime.timedelta(minutes=timeout), _mesh_groups(context))
    if recorder_settings is not None:
        recorder.record_groups(context)
    return context
