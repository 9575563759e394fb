"""``setup_distributed`` end to end: two real Gloo ranks, the installed nemo-automodel (0.7.0).

One spawn runs every scenario in order, each on a fresh MASTER_PORT, tearing
the default group down in between. The order matters: the fork fix, once
applied by the first scenario that forwards a timeout with the fix allowed,
stays applied in that process, as in a real run. Timeouts are read from the process groups themselves
(``nemo_rl_shim.process_groups.registry``) and every group passes an all_reduce.

On a CPU-only machine every group is Gloo, whatever ``cpu_offload`` says, and
upstream 0.7.0 passes no timeout to a Gloo mesh's sub-groups; so the fork fix is
applied with or without CPU offload (``decide(cpu_mesh=True)``).
"""

from __future__ import annotations

from typing import Any

import pytest

import automodel_patch
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.setup.decision import Action
from nemo_rl_shim.setup.distributed import NEMO_RL_FIELDS
from tests.ranks.set_up import UNSET
from tests.setup.test_context import SHIM_FIELDS

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

SPAWN_TIMEOUT_S = 600
TIMEOUT = 45.0
#: torch's default for Gloo groups (every group on a CPU-only machine).
GLOO_DEFAULT_MINUTES = 30.0

TP2 = {"tensor_parallel_size": 2}
CP2 = {"context_parallel_size": 2}
EP2 = {"expert_parallel_size": 2}

#: Run in this order in one process. Names are "<timeout>-<layout>[-offload|-nopatch]".
SCENARIOS = [
    {"name": "unset-dp", "timeout": UNSET, "cpu_offload": False, "dtensor_cfg": {}},
    {"name": "null-tp", "timeout": None, "cpu_offload": False, "dtensor_cfg": TP2},
    {"name": "null-cp-offload", "timeout": None, "cpu_offload": True, "dtensor_cfg": CP2},
    # Before the fork fix is applied anywhere in the process, with it turned off:
    {"name": "45-dp-nopatch", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {}, "patch_automodel": False},
    {"name": "45-tp-nopatch", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": TP2, "patch_automodel": False},
    # The first scenario with a timeout and the fix allowed applies it; the rest find it applied:
    {"name": "45-dp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {}},
    {"name": "45-tp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": TP2},
    {"name": "45-cp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": CP2},
    {"name": "45-dp-offload", "timeout": TIMEOUT, "cpu_offload": True, "dtensor_cfg": {}},
    {"name": "45-tp-offload", "timeout": TIMEOUT, "cpu_offload": True, "dtensor_cfg": TP2},
    {"name": "45-cp-offload", "timeout": TIMEOUT, "cpu_offload": True, "dtensor_cfg": CP2},
    {"name": "45-ep-offload", "timeout": TIMEOUT, "cpu_offload": True, "dtensor_cfg": EP2},
]
DEFAULTS = ["unset-dp", "null-tp", "null-cp-offload"]
UNPATCHED = ["45-dp-nopatch", "45-tp-nopatch"]
FORWARDED = ["45-dp", "45-tp", "45-cp", "45-dp-offload", "45-tp-offload", "45-cp-offload", "45-ep-offload"]
#: Layouts whose named axis must span both ranks.
SPANNING_AXIS = {"dp": "dp_shard", "tp": "tp", "cp": "cp", "ep": "moe.ep"}


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    """Every scenario, once, on two ranks; both ranks' facts."""
    params = {"scenarios": SCENARIOS}
    results = spawn_ranks("tests.ranks.set_up:layouts", params, world_size=2, timeout_s=SPAWN_TIMEOUT_S)
    return {"ranks": [r.result for r in results]}


def _scenario(run: dict[str, Any], name: str, rank: int = 0) -> dict[str, Any]:
    (found,) = [s for s in run["ranks"][rank]["scenarios"] if s["name"] == name]
    return found


def _layout(name: str) -> str:
    return name.split("-")[1]


def test_every_scenario_ran_on_the_installed_release(run: dict[str, Any]) -> None:
    for facts in run["ranks"]:
        assert facts["version"] == str(automodel_patch.installed_version())
        assert facts["build_accepts_timeout"] is True
        assert [s["name"] for s in facts["scenarios"]] == [s["name"] for s in SCENARIOS]
        for scenario in facts["scenarios"]:
            assert scenario["context_fields"] == [*NEMO_RL_FIELDS, *SHIM_FIELDS]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_every_group_reduces_over_its_size(run: dict[str, Any], name: str, rank: int) -> None:
    scenario = _scenario(run, name, rank)
    groups = scenario["groups"]
    assert groups["default"]["size"] == 2
    spanning = SPANNING_AXIS[_layout(name)]
    assert groups[spanning]["size"] == 2, (spanning, groups[spanning])
    for group, facts in groups.items():
        assert facts["all_reduce"] == facts["size"], (name, group, facts)


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_sizes_follow_dtensor_cfg(run: dict[str, Any], name: str) -> None:
    sizes = _scenario(run, name)["sizes"]
    layout = _layout(name)
    expected = {"dp": 2 if layout in ("dp", "ep") else 1, "tp": 2 if layout == "tp" else 1}
    expected["cp"] = 2 if layout == "cp" else 1
    assert sizes == expected


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", DEFAULTS)
def test_null_or_unset_keeps_torch_defaults_on_every_group(run: dict[str, Any], name: str, rank: int) -> None:
    scenario = _scenario(run, name, rank)
    assert scenario["decision"]["action"] == Action.NO_TIMEOUT.value
    assert scenario["decision"]["forward_minutes"] is None
    assert scenario["runtime_warnings"] == []
    assert scenario["mesh_builders"] == {"MeshContext.build": 1, "timeout_minutes": None}
    for group, facts in scenario["groups"].items():
        assert facts["timeout_minutes"]["cpu"] == GLOO_DEFAULT_MINUTES, (name, group, facts)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", FORWARDED)
def test_timeout_reaches_every_group_on_its_cpu_backend(run: dict[str, Any], name: str, rank: int) -> None:
    scenario = _scenario(run, name, rank)
    assert scenario["patch_applied"] is True
    assert scenario["mesh_builders"] == {"MeshContext.build": 1, "timeout_minutes": TIMEOUT}
    assert scenario["set_mesh_timeouts_calls"] == 0  # the build took the timeout: no set-after-build pass
    groups = scenario["groups"]
    flattened = {"dp", "dp_cp", "dp_shard_cp"} & set(groups)
    assert flattened, f"{name}: no flattened axis found among {sorted(groups)}"
    if _layout(name) == "ep":
        assert any(group.startswith("moe.") for group in groups), sorted(groups)
    # World-sized axes reuse the default group itself (no second, identical communicator) where torch
    # does so at all; the groups created for the other axes are the real test of the timeout.
    created = [group for group, facts in groups.items() if not facts["is_default_group"]]
    assert created, f"{name}: every axis reused the default group"
    mesh = run["ranks"][rank]["device_mesh"]
    for group, facts in groups.items():
        if mesh["reuses_default_group"]:
            assert facts["is_default_group"] == (facts["size"] == 2), (name, group, facts)
        assert facts["backends"]["cpu"] == "gloo", (name, group, facts)
        assert facts["timeout_minutes"]["cpu"] == TIMEOUT, (name, group, facts)
    # Where the build gave every group the timeout, nothing was left to set afterwards (so the layers,
    # not the post-build pass, did the work); where torch drops it (2.9, measured), the pass set exactly
    # the groups the build made.
    # Only the torch-2.9 CI lane kills a no-op post-build pass (distributed_setup._set_missing_timeouts):
    # on torch 2.10 and later the build already sets every group, so there is nothing for the pass to do.
    # Measured: with the pass made a no-op, this test fails for every forwarded scenario on the torch-2.9
    # lane (sub-groups at Gloo's 30 min) and passes on the default lane. Do not drop that lane as redundant.
    fixed = scenario["timeouts_set_after_build"]
    if mesh["passes_timeout"]:
        assert fixed == [], (name, fixed)
    else:
        assert fixed and "default" not in fixed, (name, fixed)


def test_first_forwarding_scenario_applies_the_fix_and_later_ones_find_it(run: dict[str, Any]) -> None:
    """On a CPU (gloo) mesh upstream passes no timeout to sub-groups, so the fix applies with or without offload."""
    first = _scenario(run, FORWARDED[0])["decision"]
    assert first["action"] == Action.PATCH_AND_FORWARD.value, first
    assert first["patches"] == ["cpu-mesh-timeout"], first
    assert _scenario(run, FORWARDED[0])["active"] == ["cpu-mesh-timeout"]
    assert "CPU (gloo) mesh" in first["reason"], first
    assert first["warning"] is None and first["forward_minutes"] == TIMEOUT
    for name in FORWARDED[1:]:
        decision = _scenario(run, name)["decision"]
        assert decision["action"] == Action.FORWARD.value, (name, decision)
        assert "after the fork fix" in decision["reason"], (name, decision)


@pytest.mark.parametrize("name", UNPATCHED)
def test_with_the_fix_turned_off_sub_groups_keep_gloos_default(run: dict[str, Any], name: str) -> None:
    """``patch_automodel: false`` on a CPU mesh: forwarded to 0.7.0 as is, with one warning.

    Its ``_nccl_backend_override`` returns None unless the mesh device is
    "cuda", so the size-1 axes it creates keep Gloo's 30 min; the default group
    and the world-sized axes reusing it get 45. (On GPUs those axes are NCCL and
    get the timeout; tests/test_gpu.py.)
    """
    scenario = _scenario(run, name)
    assert scenario["decision"]["action"] == Action.FORWARD.value
    assert "patch_automodel is false" in scenario["decision"]["reason"]
    assert len(scenario["runtime_warnings"]) == 1
    assert "gloo's 30-minute default" in scenario["runtime_warnings"][0]
    assert scenario["patch_applied"] is False
    assert scenario["mesh_builders"] == {"MeshContext.build": 1, "timeout_minutes": TIMEOUT}
    assert scenario["decision"]["every_group"] is False
    assert scenario["timeouts_set_after_build"] == []  # no promise for sub-groups here, so no post-build pass
    groups = scenario["groups"]
    for group, facts in groups.items():
        expected = TIMEOUT if facts["is_default_group"] else GLOO_DEFAULT_MINUTES
        assert facts["timeout_minutes"]["cpu"] == expected, (name, group, facts)
        if run["ranks"][0]["device_mesh"]["reuses_default_group"]:
            assert facts["is_default_group"] == (facts["size"] == 2), (name, group, facts)


def test_single_rank_with_cpu_offload_raises_and_leaves_no_group() -> None:
    (result,) = spawn_ranks("tests.ranks.set_up:single_rank_cpu_offload", {"timeout": TIMEOUT}, world_size=1)
    facts = result.result
    for case in ("before_any_group", "on_callers_group"):
        raised = facts[case]["raised"]
        assert raised is not None, f"{case}: setup_distributed accepted CPU offload on one rank"
        assert raised["type"] == "NotImplementedError"
        assert raised["message"].startswith("policy.dtensor_cfg.cpu_offload is true on a world of 1 rank"), raised
        assert "CPUOffload doesn't work on single GPU" in raised["message"]
    assert facts["before_any_group"]["initialized_after"] is False
    assert facts["on_callers_group"]["callers_group_kept"] is True
