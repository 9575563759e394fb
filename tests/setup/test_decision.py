"""The decision table, each row checked against the real release it describes.

Every release's facts come from one spawned process whose ``PYTHONPATH`` puts that
release's sources first (:mod:`tests.harness.release_facts`, shared with ``test_releases.py``):
``decide()`` for {timeout None, 45} x {GPU mesh, CPU mesh} x {cpu_offload} x
{patch_automodel}, before ``apply()`` and after it. Beside 0.3.0 ... 0.7.0 run the fixed
0.7.0 fixture wheels (the pin bump, :mod:`tests.harness.fixture_wheels`) and 0.7.0 with
``keep-cpu-backend.patch`` applied: there the CPU half is kept "natively". The legacy pins
(0.3.0, 0.4.0) also go through ``setup_distributed`` for real on two Gloo ranks, where every
sub-group gets the timeout right after the build.
"""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.setup.decision import Action, Decision
from tests.harness.fixture_wheels import JUDGEABLE_STYLES, fixture_version
from tests.harness.release_facts import SOURCE_PATCH_SUFFIX
from tests.harness.releases import ALL_RELEASES, FIXED_FUNCTION_RELEASES, LEGACY_RELEASES

pytestmark = [pytest.mark.releases, pytest.mark.every_lane]

SPAWN_TIMEOUT_S = 300
TIMEOUT = 45
KEEP, CPU_MESH = "keep-cpu-backend", "cpu-mesh-timeout"
LEGACY_REASON = "has no MeshContext.build(timeout_minutes=): every sub-group gets the timeout right after the build"
#: Default-group backends a legacy pin is decided for in its own process (tests.ranks.set_up.legacy_pin).
LEGACY_BACKENDS = [
    "gloo",
    "nccl",
    "cuda:nccl,cpu:gloo",
    "cuda:nccl-legacy,cpu:gloo",
    "nccl2",
    "mpi",
    "cuda:ucc,cpu:gloo",
]
#: torch's default for Gloo groups, which is all a CPU-only machine builds.
GLOO_DEFAULT_MINUTES = 30.0
LEGACY_SCENARIOS = [
    {"name": "dp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {}},
    {"name": "tp", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {"tensor_parallel_size": 2}},
    # A MoE model: create_device_mesh returns a second mesh (ep_shard, ep), whose groups need the timeout too.
    {"name": "ep", "timeout": TIMEOUT, "cpu_offload": False, "dtensor_cfg": {"expert_parallel_size": 2}},
]
#: Releases whose override keeps the CPU half by itself: the fixed fixtures and the source-patched 0.7.0.
NATIVE = (*(fixture_version(s) for s in JUDGEABLE_STYLES), f"0.7.0{SOURCE_PATCH_SUFFIX}")
UNKNOWN = fixture_version("cudaquery")


def _rows(rows: list[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    picked = [row for row in rows if all(row[key] == value for key, value in where.items())]
    assert picked, f"no row with {where}"
    return picked


@pytest.mark.parametrize("version", (*ALL_RELEASES, *NATIVE, UNKNOWN))
def test_no_timeout_is_no_timeout_everywhere(version: str, release_facts) -> None:
    facts = release_facts(version)
    for row in _rows(facts["decisions_before"], timeout=None) + _rows(facts["decisions_after"], timeout=None):
        assert row["action"] == Action.NO_TIMEOUT.value, row
        assert row["warning"] is None and row["forward_minutes"] is None and row["patches"] == [], row


@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_pin_sets_every_sub_group_after_the_build(version: str, release_facts) -> None:
    """No MeshContext.build(timeout_minutes=): nothing is forwarded, every group gets the timeout after the build."""
    facts = release_facts(version)
    for row in _rows(facts["decisions_before"], timeout=TIMEOUT) + _rows(facts["decisions_after"], timeout=TIMEOUT):
        assert (row["action"], row["warning"], row["every_group"]) == (Action.SET_AFTER_BUILD.value, None, True), row
        assert row["reason"] == f"nemo-automodel {version} {LEGACY_REASON}", row
        assert row["forward_minutes"] is None and row["patches"] == [], row


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_dropping_release_under_cpu_offload_applies_keep_cpu_backend(version: str, release_facts) -> None:
    before = release_facts(version)["decisions_before"]
    (patched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=False, cpu_offload=True, patch_automodel=True)
    assert (patched["action"], patched["patches"]) == (Action.PATCH_AND_FORWARD.value, [KEEP]), patched
    assert patched["reason"] == "CPU offload is on and the installed Automodel drops the CPU half", patched
    assert patched["forward_minutes"] == TIMEOUT and patched["warning"] is None, patched
    assert patched["default_backend"] == "cuda:nccl,cpu:gloo"
    (refused,) = _rows(before, timeout=TIMEOUT, cpu_mesh=False, cpu_offload=True, patch_automodel=False)
    assert (refused["action"], refused["patches"]) == (Action.NOT_FORWARDED.value, []), refused
    assert refused["forward_minutes"] is None, refused
    assert "policy.nemo_rl_shim.patch_automodel is false" in refused["warning"], refused


@pytest.mark.parametrize("version", (*FIXED_FUNCTION_RELEASES, *NATIVE, UNKNOWN))
def test_without_cpu_offload_on_a_gpu_mesh_nothing_is_lost(version: str, release_facts) -> None:
    """NCCL default group, no CPU offload: NCCL-only sub-groups lose nothing, no workaround matters."""
    facts = release_facts(version)
    for row in _rows(facts["decisions_before"], timeout=TIMEOUT, cpu_mesh=False, cpu_offload=False):
        assert (row["action"], row["patches"], row["warning"]) == (Action.FORWARD.value, [], None), row
        assert row["default_backend"] == "nccl" and "CPU offload is off" in row["reason"], row
        assert all(not w["relevant"] for w in row["workarounds"]), row


@pytest.mark.parametrize("version", (*FIXED_FUNCTION_RELEASES, *NATIVE, UNKNOWN))
@pytest.mark.parametrize("cpu_offload", [False, True], ids=["no-offload", "offload"])
def test_cpu_mesh_applies_cpu_mesh_timeout(version: str, cpu_offload: bool, release_facts) -> None:
    """Plain gloo default group: every release here passes no timeout to sub-groups, fixed 0.7.0 included."""
    before = release_facts(version)["decisions_before"]
    (patched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=True, cpu_offload=cpu_offload, patch_automodel=True)
    assert (patched["action"], patched["patches"]) == (Action.PATCH_AND_FORWARD.value, [CPU_MESH]), patched
    assert "CPU (gloo) mesh" in patched["reason"] and patched["warning"] is None, patched
    assert patched["default_backend"] == "gloo"
    (unpatched,) = _rows(before, timeout=TIMEOUT, cpu_mesh=True, cpu_offload=cpu_offload, patch_automodel=False)
    assert (unpatched["action"], unpatched["patches"]) == (Action.FORWARD.value, []), unpatched
    assert unpatched["forward_minutes"] == TIMEOUT, unpatched
    assert "gloo's 30-minute default" in unpatched["warning"], unpatched


@pytest.mark.parametrize("version", FIXED_FUNCTION_RELEASES)
def test_after_apply_every_row_forwards_after_the_fork_fix(version: str, release_facts) -> None:
    facts = release_facts(version)
    assert facts["active_after"] == [KEEP, CPU_MESH]
    for row in _rows(facts["decisions_after"], timeout=TIMEOUT):
        assert (row["action"], row["patches"], row["warning"]) == (Action.FORWARD.value, [], None), row
        assert row["forward_minutes"] == TIMEOUT, row
        relevant = [w for w in row["workarounds"] if w["relevant"]]
        if row["cpu_mesh"] or row["cpu_offload"]:
            assert "after the fork fix" in row["reason"], row
            assert [w["active"] for w in relevant] == [True], row
        else:
            assert relevant == [], row


@pytest.mark.parametrize("version", NATIVE)
@pytest.mark.parametrize("patch", [True, False], ids=["patch", "nopatch"])
def test_fixed_release_keeps_the_cpu_half_natively(version: str, patch: bool, release_facts) -> None:
    """The pin bump: under CPU offload on GPUs the timeout is forwarded with nothing applied, fix allowed or not."""
    facts = release_facts(version)
    for phase in ("decisions_before", "decisions_after"):
        (row,) = _rows(facts[phase], timeout=TIMEOUT, cpu_mesh=False, cpu_offload=True, patch_automodel=patch)
        assert (row["action"], row["patches"], row["warning"]) == (Action.FORWARD.value, [], None), row
        assert row["reason"] == "the installed Automodel keeps the CPU half natively", row
        (keep,) = [w for w in row["workarounds"] if w["slug"] == KEEP]
        assert (keep["relevant"], keep["verdict"], keep["active"]) == (True, "not_needed", False), keep


def test_unknown_detection_applies_the_fix_with_one_warning(release_facts) -> None:
    """``cudaquery`` cannot be judged here: with the fix allowed it is applied (correct either way) and one
    warning says so; with it off, the timeout is not forwarded under CPU offload."""
    before = release_facts(UNKNOWN)["decisions_before"]
    (allowed,) = _rows(before, timeout=TIMEOUT, cpu_mesh=False, cpu_offload=True, patch_automodel=True)
    assert (allowed["action"], allowed["patches"]) == (Action.PATCH_AND_FORWARD.value, [KEEP]), allowed
    assert allowed["warning"].startswith("detection cannot judge the installed Automodel for keep-cpu-backend")
    assert "applying the keep-cpu-backend workaround" in allowed["warning"], allowed
    (refused,) = _rows(before, timeout=TIMEOUT, cpu_mesh=False, cpu_offload=True, patch_automodel=False)
    assert (refused["action"], refused["patches"]) == (Action.NOT_FORWARDED.value, []), refused
    assert "may build mesh sub-groups without the CPU half" in refused["warning"], refused


@pytest.mark.parametrize("action", list(Action))
def test_only_the_set_after_build_action_sets_every_sub_group_after_the_build(action: Action) -> None:
    decision = Decision(action, TIMEOUT, cpu_offload=False, reason="a reason")
    assert decision.set_after_build is (action is Action.SET_AFTER_BUILD)
    forwards = action in (Action.FORWARD, Action.PATCH_AND_FORWARD)
    assert decision.forward_minutes == (TIMEOUT if forwards else None)


@pytest.fixture(scope="module")
def legacy_setup(release_environment):
    """``legacy_setup(version)`` -> both ranks' set-up facts on a legacy pin, spawned once per version."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def run(version: str) -> list[dict[str, Any]]:
        if version not in cache:
            results = spawn_ranks(
                "tests.ranks.set_up:legacy_pin",
                {"scenarios": LEGACY_SCENARIOS, "backends": LEGACY_BACKENDS, "timeout": TIMEOUT},
                world_size=2,
                timeout_s=SPAWN_TIMEOUT_S,
                env=release_environment(version),
            )
            cache[version] = [r.result for r in results]
        return cache[version]

    return run


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_pin_setup_distributed_on_two_gloo_ranks(version: str, legacy_setup) -> None:
    """The mesh is built the legacy way, without a timeout; right after it every group reads the timeout, no warning."""
    for setup in legacy_setup(version):
        assert setup["version"] == version
        assert setup["build_accepts_timeout"] is False
        assert [s["name"] for s in setup["scenarios"]] == [s["name"] for s in LEGACY_SCENARIOS]
        for scenario in setup["scenarios"]:
            name = scenario["name"]
            assert scenario["decision"]["action"] == Action.SET_AFTER_BUILD.value, name
            assert scenario["decision"]["every_group"] is True, name
            assert scenario["mesh_builders"] == {"create_device_mesh": 1}, (name, scenario["mesh_builders"])
            # the set-after-build path, which reads every group back (not the torch 2.9 gate, which does not)
            assert scenario["set_mesh_timeouts_calls"] == 1, (name, scenario["set_mesh_timeouts_calls"])
            assert scenario["runtime_warnings"] == [], (name, scenario["runtime_warnings"])
            groups = scenario["groups"]
            sub_groups = {g: facts for g, facts in groups.items() if not facts["is_default_group"]}
            assert sub_groups, f"{name}: every axis reused the default group; nothing shows the sub-group timeout"
            for group, facts in groups.items():
                assert set(facts["backends"].values()) == {"gloo"}, (name, group, facts)
                assert facts["all_reduce"] == facts["size"], (name, group, facts)
                assert set(facts["timeout_minutes"].values()) == {TIMEOUT}, (name, group, facts)
            # the build left them at Gloo's default: the context names them, each sub-group once
            assert scenario["timeouts_set_after_build"], (name, scenario)
            assert set(scenario["timeouts_set_after_build"]) <= set(sub_groups), (name, scenario)
        (ep,) = [s for s in setup["scenarios"] if s["name"] == "ep"]
        moe = {group for group in ep["groups"] if group.startswith("moe.")}
        assert {"moe.ep", "moe.ep_shard"} <= moe, sorted(ep["groups"])  # the MoE mesh is kept (and timed, above)
        assert ep["groups"]["moe.ep"]["size"] == 2, ep["groups"]["moe.ep"]
        assert {"moe.ep", "moe.ep_shard"} & set(ep["timeouts_set_after_build"]), ep["timeouts_set_after_build"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_pin_default_group_only_where_a_backend_has_no_timeout_setter(version: str, legacy_setup) -> None:
    """Decided in the legacy release's own process for each default-group backend."""
    decisions = legacy_setup(version)[0]["decisions"]
    for backend in ("gloo", "nccl", "cuda:nccl,cpu:gloo", "cuda:nccl-legacy,cpu:gloo", "nccl2"):  # torch 2.15's names
        row = decisions[backend]
        assert (row["action"], row["every_group"], row["warning"]) == (Action.SET_AFTER_BUILD.value, True, None), row
    for backend, unsettable in (("mpi", "mpi"), ("cuda:ucc,cpu:gloo", "ucc")):
        row = decisions[backend]
        assert (row["action"], row["every_group"]) == (Action.DEFAULT_GROUP_ONLY.value, False), row
        assert f"torch cannot change the timeout of a {unsettable} backend after the build" in row["warning"], row
        assert f"only the default group gets {TIMEOUT} min" in row["warning"], row
