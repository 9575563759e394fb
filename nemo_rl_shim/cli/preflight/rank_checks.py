"""The per-rank half of ``nemo-rl-shim preflight``: real set-up, then one row of facts per process group.

:func:`check_rank` runs on every rank: spawned by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`,
under torchrun / srun, in a Ray actor (:mod:`nemo_rl_shim.cli.preflight.ray_actors`), or played by the dry
run. It calls the real set-up: the shim's :func:`~nemo_rl_shim.setup.distributed.setup_distributed`, or
with ``--setup nemo-rl`` NeMo RL's own (:mod:`~nemo_rl_shim.cli.preflight.nemo_rl_setup`). Then it makes
the groups a NeMo RL worker makes after set-up, as the worker makes them
(:mod:`~nemo_rl_shim.cli.preflight.later_groups`), audits every process group torch holds
(:func:`nemo_rl_shim.audit.audit_groups`, against the section's configured timeout), and for each group
the listing gives (:func:`~nemo_rl_shim.cli.preflight.group_rows.groups_to_check`, the seam: every group)
records its ranks, backend per device, timeout per backend and where that came from, and runs a CPU and
a CUDA all-reduce on it. With CPU offload it also shards a parameter with FSDP2's ``CPUOffloadPolicy`` on
the ``dp`` mesh and rebuilds it with ``full_tensor()``. Failures are recorded, not raised, so the parent
can name them; the rank leaves its process groups up (the caller tears them down after gathering).

It takes a :class:`~nemo_rl_shim.cli.preflight.results.RankParams` and returns a
:class:`~nemo_rl_shim.cli.preflight.results.RankChecked`; :func:`check_rank_json` is the same across a
process or a Ray actor (JSON in, JSON out).

Once a collective times out or loses its peer, the rank gives up on its peers: the
collectives left, the ``full_tensor()`` check and the steady-timeout barrier would each
wait as long again on the same stalled rank, so they are reported as :data:`SKIPPED`,
and the result's ``gave_up`` names the collective that failed (a spawning parent then
ends the run, :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim import config as cfg
from nemo_rl_shim.audit import GroupAudit, audit_groups
from nemo_rl_shim.cli.preflight.group_rows import audit_of, groups_to_check, row_of, with_steady_timeouts
from nemo_rl_shim.cli.preflight.later_groups import make_later_groups
from nemo_rl_shim.cli.preflight.results import NEMO_RL_SETUP, GroupRow, OffloadCheck, RankChecked, RankParams
from nemo_rl_shim.flight_recorder.recorder import dump_on_timeout
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.process_groups.registry import axis_mesh, group_backends
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts.phases import after_first_step

__all__ = ["NOT_RUN", "OFFLOAD_METHOD", "SKIPPED", "check_rank", "check_rank_json"]

OFFLOAD_METHOD = "fully_shard(mesh=dp, offload_policy=CPUOffloadPolicy(pin_memory=False)) on an nn.Linear"
#: What a dry run reports for a collective: its groups are on torch's fake backend.
NOT_RUN = "not run (dry run)"
#: What a collective reports once an earlier one on this rank timed out or lost its peer.
SKIPPED = "skipped (an earlier collective timed out)"
#: Words of an error that says a peer stalled or died: Gloo's "Timed out waiting 12000ms for recv
#: operation", "Connection closed by peer"; NCCL's watchdog "collective operation timeout".
_PEER_LOST = ("timed out", "timeout", "closed by peer", "connection reset")


def _all_reduce(group: Any, device: torch.device) -> str:
    """Sum of (rank + 1) over ``group`` on ``device``: ``"ok"`` or ``"failed: ..."``."""
    ranks = dist.get_process_group_ranks(group)
    value = torch.full((1,), float(dist.get_rank() + 1), device=device)
    try:
        with dump_on_timeout(f"preflight {device.type} all_reduce on ranks {ranks}"):  # recorder on: dump, ask peers
            dist.all_reduce(value, group=group)
    except Exception as e:  # the failure is the finding: report it to the parent
        return f"failed: {first_line(e)}"
    expected = float(sum(rank + 1 for rank in ranks))
    return "ok" if value.item() == expected else f"failed: sum {value.item():g}, expected {expected:g}"


def _cpu_all_reduce(group: Any, backends: Mapping[str, str], cpu_offload: bool) -> str:
    # Without CPU offload an NCCL-only group is correct and a CPU collective on it is not
    # expected to work; under CPU offload the attempt is the regression check itself.
    if "cpu" not in backends and not cpu_offload:
        return "n/a (no CPU backend)"
    return _all_reduce(group, torch.device("cpu"))


def _cuda_all_reduce(group: Any, backends: Mapping[str, str]) -> str:
    if not torch.cuda.is_available():
        return "n/a (no CUDA device)"
    if "cuda" not in backends:
        return "failed: no CUDA backend on the group"
    return _all_reduce(group, torch.device("cuda", torch.cuda.current_device()))


def _lost_a_peer(row: GroupRow) -> str | None:
    """``"its cpu all_reduce on group default timed out"`` when the row's collective timed out or lost its peer."""
    for kind, outcome in (("cpu", row.cpu_all_reduce), ("cuda", row.cuda_all_reduce)):
        lowered = outcome.lower()
        if lowered.startswith("failed") and any(word in lowered for word in _PEER_LOST):
            how = "timed out" if "time" in lowered else "lost its peer"
            return f"its {kind} all_reduce on group {row.group} {how}"
    return None


def _group_row(
    name: str, group: Any, earlier: Mapping[str, Any], audited: GroupAudit, params: RankParams, skip: bool
) -> GroupRow:
    """The row of one group, with its collectives run (or not run in a dry run, or skipped after a lost peer)."""
    if skip:
        cpu = cuda = SKIPPED
    elif params.dry_run:
        cpu = cuda = NOT_RUN
    else:
        backends = group_backends(group)
        cpu, cuda = _cpu_all_reduce(group, backends, params.cpu_offload), _cuda_all_reduce(group, backends)
    return row_of(name, group, earlier, audited, cpu, cuda)


def _offload_check(device_mesh: Any) -> OffloadCheck:
    """Shard a CPU-offloaded parameter on the dp mesh and rebuild it with ``full_tensor()``."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    dp = axis_mesh(device_mesh, "dp")
    mesh_ranks = tuple(dp.mesh.flatten().tolist())
    torch.manual_seed(0)  # same reference weight on every rank
    module = torch.nn.Linear(4, 2 * dp.size(), bias=False)
    reference = module.weight.detach().clone()
    local = None
    try:
        fully_shard(module, mesh=dp, offload_policy=CPUOffloadPolicy(pin_memory=False))
        local = module.weight.to_local()
        full = module.weight.full_tensor()
    except Exception as e:  # "No backend type associated with device type cpu" is the regression
        return OffloadCheck(
            OFFLOAD_METHOD, mesh_ranks=mesh_ranks, ok=False, error=first_line(e),
            local_device=None if local is None else str(local.device),
            local_shape=None if local is None else tuple(local.shape),
        )  # fmt: skip
    ok = bool(torch.equal(full.cpu(), reference))
    return OffloadCheck(
        OFFLOAD_METHOD, mesh_ranks=mesh_ranks, ok=ok, local_device=str(local.device), local_shape=tuple(local.shape),
        full_shape=tuple(full.shape), error=None if ok else "full_tensor() differs from the unsharded weight",
    )  # fmt: skip


def _cuda_device() -> int:
    """The CUDA device of this rank: ``LOCAL_RANK`` among the visible devices, or the only one visible.

    Under torchrun every rank sees every GPU of its node; a Ray actor sees only the GPU of
    its bundle, while NeMo RL still sets ``LOCAL_RANK`` to the bundle index.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return local_rank if local_rank < torch.cuda.device_count() else 0


def _configured(params: RankParams) -> tuple[datetime.timedelta | None, datetime.timedelta | None]:
    """The section's start-up and steady-state timeouts (validated before any rank started), or None."""
    knobs = cfg.knobs({params.role: params.section}, params.role)  # type: ignore[dict-item]
    startup = cfg.distributed_timeout_minutes(knobs, params.role)
    steady = cfg.distributed_timeout_minutes_after_init(knobs, params.role)
    return (
        None if startup is None else datetime.timedelta(minutes=startup),
        None if steady is None else datetime.timedelta(minutes=steady),
    )


def _set_up(params: RankParams) -> tuple[Any, str | None]:
    """The set-up ``params`` ask for, run on this rank: its context, and (NeMo RL's) what ran, in words."""
    if params.setup == NEMO_RL_SETUP:
        from nemo_rl_shim.cli.preflight.nemo_rl_setup import set_up

        return set_up(params.section, params.role, params.cpu_offload)
    runtime = RuntimeConfig(cpu_offload=params.cpu_offload)
    return setup_distributed(dict(params.section), runtime, role=params.role), None  # type: ignore[arg-type]


def check_rank(params: RankParams, phase: Callable[[str], None] | None = None) -> RankChecked:
    """Set up this rank for real and return its facts; see the module docstring.

    ``phase`` is told what the rank is doing as it goes, so a runner that gives up on a stuck rank
    can say where it was. ``params.stall_rank`` (fault injection) sleeps ``params.stall_s`` after set-up.
    """
    phase = phase or (lambda what: None)
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available() and not params.dry_run:
        torch.cuda.set_device(_cuda_device())
    phase("setup_distributed")
    # The decision's warning is in the report; recorded here so it is not printed once per rank.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        context, set_up = _set_up(params)
    phase("the groups a worker makes after set-up")
    later = make_later_groups(context, params.section, params.role, nemo_rl=params.setup == NEMO_RL_SETUP)
    if params.stall_rank == rank:
        phase(f"stalling {params.stall_s:g} s after set-up (fault injection)")
        print(f"rank {rank}: stalling {params.stall_s:g} s after set-up (fault injection)", flush=True)
        time.sleep(params.stall_s)
    startup, steady = _configured(params)
    groups = groups_to_check(context)
    audited = audit_of(audit_groups(context, configured=startup))
    rows: list[GroupRow] = []
    seen: dict[str, Any] = {}
    gave_up = None
    for name, group in groups.items():
        phase(f"all_reduce on group {name}")
        rows.append(_group_row(name, group, seen, audited[str(group.group_name)], params, skip=gave_up is not None))
        seen[name] = group
        gave_up = gave_up or _lost_a_peer(rows[-1])
    offload = None
    if params.cpu_offload and not params.dry_run:
        phase("full_tensor() of a CPU-offloaded parameter")
        skipped = OffloadCheck(OFFLOAD_METHOD, skipped=SKIPPED)
        offload = _offload_check(context.device_mesh) if gave_up is None else skipped
    phase("after_first_step")
    checked = tuple(rows)
    if gave_up is None and set_up is None and after_first_step(context):
        checked = with_steady_timeouts(checked, audit_groups(context, configured=steady))
    phase("done")
    decision = getattr(context, "decision", None)
    return RankChecked(
        rank=rank,
        host=socket.gethostname(),
        world_size=dist.get_world_size(),
        default_backend=str(dist.get_backend()),
        device="cuda" if torch.cuda.is_available() else "cpu",
        decision=None if decision is None else decision.to_dict(),
        timeout_minutes_after_init=getattr(context, "timeout_minutes_after_init", None),
        rows=checked,
        offload=offload,
        gave_up=gave_up,
        warnings=tuple(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)),
        set_up=set_up,
        later_groups=later,
    )


def check_rank_json(params: dict[str, Any]) -> dict[str, Any]:
    """:func:`check_rank` across a process or a Ray actor: :class:`RankParams` JSON in, its result as JSON out."""
    return check_rank(RankParams.from_json(params)).to_json()
