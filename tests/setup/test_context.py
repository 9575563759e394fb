"""``setup_distributed``'s result as NeMo RL's ``DistributedContext``, and NeMo RL's own layout checks.

NeMo RL's ``DistributedContext`` (``nemo_rl/models/automodel/config.py`` at NVIDIA-NeMo/RL
commit 7ea279abfbeb698b092856d0dab61e7cf39bc909, 2026-08-22) is a NamedTuple of these
seven fields, in this order. Its ``setup_distributed`` (``nemo_rl/models/automodel/setup.py``,
same commit) raises ``ValueError`` when ``dp_replicate_size`` does not divide
``world_size // (tp * cp * ep)`` and ``NotImplementedError`` for CPU offload on one GPU.
The shim's checks give the same kinds of error, naming the ``dtensor_cfg`` key and the
values, and run before any process group exists when the launcher has set ``WORLD_SIZE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim import DistributedContext, RuntimeConfig, check_layout, setup_distributed
from nemo_rl_shim.setup.distributed import NEMO_RL_FIELDS, ParallelSizes

__all__: list[str] = []

pytestmark = pytest.mark.every_lane

#: Written down from NeMo RL (see the module docstring), not read from the shim.
NEMO_RL_DISTRIBUTED_CONTEXT = ("device_mesh", "moe_mesh", "fsdp2_config", "moe_config", "dp_size", "tp_size", "cp_size")
#: The shim's own fields, after NeMo RL's, each with a default.
SHIM_FIELDS = ("decision", "timeout_minutes_after_init", "timeouts_set_after_build", "learned_timeouts")


def test_first_fields_are_nemo_rls_in_its_order() -> None:
    assert DistributedContext._fields[: len(NEMO_RL_DISTRIBUTED_CONTEXT)] == NEMO_RL_DISTRIBUTED_CONTEXT
    assert NEMO_RL_FIELDS == NEMO_RL_DISTRIBUTED_CONTEXT
    assert DistributedContext._fields[len(NEMO_RL_DISTRIBUTED_CONTEXT) :] == SHIM_FIELDS


def test_a_worker_written_for_nemo_rl_takes_it_as_is() -> None:
    """Built from NeMo RL's seven values alone, unpacked and indexed the way NeMo RL code does."""
    context = DistributedContext("mesh", None, "fsdp2", "moe", 4, 2, 1)
    device_mesh, moe_mesh, fsdp2_config, moe_config, dp_size, tp_size, cp_size, *extra = context
    assert (device_mesh, moe_mesh, fsdp2_config, moe_config, dp_size, tp_size, cp_size) == context[:7]
    assert (context.dp_size, context[4], extra) == (4, 4, [None, None, (), None])
    assert isinstance(context, tuple)
    assert context._replace(tp_size=8).tp_size == 8


def test_hsdp_divisibility_counts_ep_in_the_divisor() -> None:
    # world 16, tp 2, cp 1, ep 2: dp = 16 // 4 = 4, so dp_replicate 3 does not divide it; without ep it would be 8.
    with pytest.raises(ValueError) as raised:
        check_layout(ParallelSizes(tp=2, cp=1, ep=2, dp_replicate=3), 16, cpu_offload=False)
    assert str(raised.value) == (
        "policy.dtensor_cfg.dp_replicate_size must divide the data-parallel size, world size 16 // "
        "(tensor_parallel_size 2 * context_parallel_size 1 * expert_parallel_size 2) = 4, got 3"
    )
    check_layout(ParallelSizes(tp=2, cp=1, ep=2, dp_replicate=2), 16, cpu_offload=False)  # 4 % 2 == 0: fine


def test_cpu_offload_on_one_rank_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match=r"^value\.dtensor_cfg\.cpu_offload is true on a world of 1 rank"):
        check_layout(ParallelSizes(), 1, cpu_offload=True, where="value.dtensor_cfg")
    check_layout(ParallelSizes(), 1, cpu_offload=False)
    check_layout(ParallelSizes(), 2, cpu_offload=True)


@pytest.fixture
def launcher_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The launcher variables of rank 0 of a 16-rank world (the boundary: no such world is started)."""
    assert not dist.is_initialized()
    for key, value in {"RANK": "0", "WORLD_SIZE": "16", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setitem(os.environ, key, value)
    yield
    assert not dist.is_initialized(), "a layout error left a process group behind"


def _section(**dtensor_cfg: Any) -> dict[str, Any]:
    return {"automodel_cfg": {"distributed_timeout_minutes": 45}, "dtensor_cfg": dtensor_cfg}


@pytest.mark.parametrize("role", ["policy", "value"])
def test_setup_distributed_rejects_a_bad_hsdp_layout_before_any_group(role: str, launcher_world: None) -> None:
    section = _section(tensor_parallel_size=2, expert_parallel_size=2, dp_replicate_size=3)
    with pytest.raises(ValueError, match=rf"^{role}\.dtensor_cfg\.dp_replicate_size must divide .* = 4, got 3$"):
        setup_distributed(section, RuntimeConfig(), role=role)
