"""GPU regression checks: real NCCL + Gloo, real Automodel, real FSDP2 CPU offload.

On a machine without enough CUDA devices every test here is collected and
skipped with the number found. ``scripts/gpu_check.sh`` runs this file on a GPU
machine. Each check is one spawn (:func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`),
so an applied fork fix never leaks into the pytest process.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import automodel_patch
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks

pytestmark = pytest.mark.gpu

CUDA_DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
TIMEOUT_MINUTES = 45.0
SPAWN_TIMEOUT_S = 300
CPU_LOST = "No backend type associated with device type cpu"

NEEDS_TWO_GPUS = pytest.mark.skipif(CUDA_DEVICES < 2, reason=f"Need 2 CUDA devices, got {CUDA_DEVICES}")
NEEDS_ONE_GPU = pytest.mark.skipif(CUDA_DEVICES < 1, reason=f"Need 1 CUDA device, got {CUDA_DEVICES}")


@functools.cache
def native_keeps_cpu_backend() -> bool:
    """Whether the installed Automodel keeps the CPU half by itself (its genuine code; layers applied in this
    process, if any, are looked past). Evaluated only when a test needs it: the skipif below is a string
    condition, read at set-up."""
    return automodel_patch.detect("keep-cpu-backend").verdict is automodel_patch.Verdict.NOT_NEEDED


NEEDS_NATIVE_FIX = pytest.mark.skipif(
    "not native_keeps_cpu_backend()", reason="Automodel pin predates NVIDIA-NeMo/Automodel#4602"
)


def _timeouts_off(groups: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        name: g["timeout_minutes"]
        for name, g in groups.items()
        if set(g["timeout_minutes"]) != {"cpu", "cuda"} or set(g["timeout_minutes"].values()) != {TIMEOUT_MINUTES}
    }


def _reductions_off(groups: dict[str, Any], devices: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {
        name: g["all_reduce"] for name, g in groups.items() if any(g["all_reduce"][d] != g["size"] for d in devices)
    }


@pytest.mark.parametrize(
    "patch",
    [
        # The pin gate first: on any machine the native variant says whether the pin carries the fix.
        pytest.param(False, id="native", marks=[NEEDS_NATIVE_FIX, NEEDS_TWO_GPUS]),
        # AUTOMODEL-WORKAROUND(keep-cpu-backend): the "patched" variant goes with the workaround.
        pytest.param(True, id="patched", marks=NEEDS_TWO_GPUS),
    ],
)
def test_two_gpus_cpu_offload_keeps_timeout_and_cpu_half(patch):
    results = spawn_ranks("tests.ranks.gpu:two_rank_offload", {"patch": patch}, world_size=2, timeout_s=SPAWN_TIMEOUT_S)
    for facts in (r.result for r in results):
        assert facts["default_backend"] == "cuda:nccl,cpu:gloo"
        if patch and not native_keeps_cpu_backend():  # today's pins: the fork fix goes in
            assert (facts["decision"], facts["patch_applied"]) == ("patch_and_forward", True)
        else:  # a pin with NVIDIA-NeMo/Automodel#4602, or the fix turned off where it is not needed
            assert (facts["decision"], facts["patch_applied"]) == ("forward", False)
        groups = facts["groups"]
        assert {"default", "dp_shard", "tp", "dp"} <= set(groups), sorted(groups)
        assert not _timeouts_off(groups), "groups without 45 min on both CPU and CUDA backends"
        assert not _reductions_off(groups, ("cpu", "cuda")), "all_reduce failed or gave a wrong sum"
        offload = facts["offload"]
        assert (offload["local_device"], offload["dp_size"]) == ("cpu", 2)
        assert offload["error"] is None and offload["equal"], offload


@NEEDS_ONE_GPU
def test_one_gpu_mesh_loses_cpu_half_unpatched_and_fork_fix_restores_it():
    (result,) = spawn_ranks("tests.ranks.gpu:one_gpu_mesh", {}, world_size=1, timeout_s=SPAWN_TIMEOUT_S)
    facts = result.result
    assert (facts["default_backend"], facts["world_size"]) == ("cuda:nccl,cpu:gloo", 1)
    unpatched = {name: g for name, g in facts["unpatched"].items() if name != "default"}
    lost = {name: g for name, g in unpatched.items() if "cpu" not in g["backends"]}
    if facts["native_keeps_cpu"]:
        assert not lost, f"keeps_cpu_backend() is True but these axes lost the CPU half: {sorted(lost)}"
        assert facts["apply_status"] == "not_needed"
    else:
        assert lost, f"the unpatched release kept the CPU half on every axis: {unpatched}"
        assert all(CPU_LOST in str(g["all_reduce"]["cpu"]) for g in lost.values()), lost
        assert facts["apply_status"] == "applied"
    for variant in ("patched", "direct"):
        groups = facts[variant]
        assert all("cpu" in g["backends"] and "cuda" in g["backends"] for g in groups.values()), (variant, groups)
        assert not _timeouts_off(groups), (variant, groups)
        assert not _reductions_off(groups, ("cpu", "cuda")), (variant, groups)
