"""``set_mesh_timeouts`` on meshes built without a timeout by a real release, on 4 real Gloo ranks.

nemo-automodel 0.4.0 (a release wheel, NeMo RL's pin has the same ``create_device_mesh``) and
the installed 0.7.0 (``MeshContext.build`` without ``timeout_minutes``) build the meshes; each
group's timeout is read straight from its backends before and after, and a collective on a
sub-group whose last rank never joins must time out at the value set.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.process_groups import setting

SPAWN_TIMEOUT_S = 240
MINUTES = 0.5
#: A short value for the stalled collective, far below MINUTES and torch's 30-minute Gloo default.
STALL_MINUTES = 0.05
GLOO_DEFAULT_S = 30 * 60
LAYOUTS = [
    {"name": "dp"},  # dp_shard spans the world: torch may reuse the default group for it
    {"name": "tp", "tp": 2},
    {"name": "cp-ep", "cp": 2, "ep": 2},  # a MoE mesh (ep_shard 2, ep 2) and world-sized flattened axes
    {"name": "hsdp", "dp_replicate": 2},
]
STALL = {"layout": "tp", "group": "tp", "minutes": STALL_MINUTES}
INSTALLED = "installed"


@pytest.fixture(scope="module")
def ranks(release_environment):
    cache: dict[str, list[dict[str, Any]]] = {}

    def run(version: str) -> list[dict[str, Any]]:
        if version not in cache:
            env = None if version == INSTALLED else release_environment(version)
            params = {"minutes": MINUTES, "layouts": LAYOUTS, "stall": STALL}
            results = spawn_ranks(
                "tests.ranks.mesh_timeouts:after_build", params, world_size=4, timeout_s=SPAWN_TIMEOUT_S, env=env
            )
            cache[version] = [r.result for r in results]
        return cache[version]

    return run


def _expected_name(entry_name: str, facts: dict[str, Any]) -> str:
    """The name ``set_mesh_timeouts`` gives a group that ``tests.ranks.timeouts.mesh_groups`` calls ``entry_name``."""
    if facts["is_default"]:
        return "default"
    label, _, axis = entry_name.rpartition(".")
    return f"moe.{axis}" if label.startswith("moe") else axis


pytestmark = [pytest.mark.every_lane]

VERSIONS = [pytest.param("0.4.0", marks=pytest.mark.releases), INSTALLED]


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", VERSIONS)
def test_every_group_of_the_mesh_gets_the_timeout_and_reads_it_back(version: str, ranks) -> None:
    for rank, result in enumerate(ranks(version)):
        if version != INSTALLED:
            assert result["version"] == version
        assert [layout["name"] for layout in result["layouts"]] == [layout["name"] for layout in LAYOUTS]
        for layout in result["layouts"]:
            where = (version, rank, layout["name"])
            reused = any(f["is_default"] for name, f in layout["after"].items() if name != "default")
            sub_groups = {n: f for n, f in layout["after"].items() if not f["is_default"]}
            assert sub_groups, f"{where}: every axis is the default group; nothing shows a sub-group's timeout"
            for name, facts in layout["before"].items():  # what the build left: torch's Gloo default
                if name in sub_groups:
                    assert {b["seconds"] for b in facts["backends"].values()} == {GLOO_DEFAULT_S}, (where, name, facts)
            for name, facts in layout["after"].items():
                assert {b["name"] for b in facts["backends"].values()} == {"gloo"}, (where, name, facts)
                untouched = {b["seconds"] for b in layout["before"][name]["backends"].values()}
                wanted = {MINUTES * 60} if name != "default" or reused else untouched  # a default off the mesh
                assert {b["seconds"] for b in facts["backends"].values()} == wanted, (where, name, facts)
            named = {_expected_name(n, f) for n, f in layout["after"].items() if n != "default"}
            assert set(layout["returned"]) <= named, (where, layout["returned"], named)
            assert {n for n in named if n != "default"} - set(layout["returned"]) <= _aliases(layout), where
            assert all(set(minutes.values()) == {MINUTES} for minutes in layout["returned"].values()), (where, layout)


def _aliases(layout: dict[str, Any]) -> set[str]:
    """Names of groups another name already stands for (the same ranks and group): reported once."""
    by_ranks: dict[tuple[int, ...], list[str]] = {}
    for name, facts in layout["after"].items():
        if name != "default" and not facts["is_default"]:
            by_ranks.setdefault(tuple(facts["ranks"]), []).append(_expected_name(name, facts))
    return {name for names in by_ranks.values() for name in names[1:]}


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", VERSIONS)
def test_a_sub_group_collective_times_out_at_the_value_set(version: str, ranks) -> None:
    """tp groups {0, 1} and {2, 3}: ranks 1 and 3 never join; 0 and 2 give up after STALL_MINUTES, not 30 min."""
    stalls = {rank: result["stall"] for rank, result in enumerate(ranks(version))}
    assert {rank: tuple(s["ranks"]) for rank, s in stalls.items()} == {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    for rank in (1, 3):
        assert stalls[rank]["outcome"] == "skipped", stalls[rank]
    for rank in (0, 2):
        stall = stalls[rank]
        assert stall["outcome"] == "raised", stall
        assert STALL_MINUTES * 60 * 0.8 <= stall["seconds"] < MINUTES * 60, stall


def test_a_backend_that_does_not_take_the_timeout_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setter that leaves one group alone stands for MPI or UCC, which this machine lacks (torch warns there).

    One real Gloo rank in this process; ``tp`` gets a group of its own through a backend override (a
    world-sized axis without one is the default group). The read-back names the group, the backend and
    the value it read.
    """
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"), backend_override={"tp": "gloo"})
        tp = mesh.get_group("tp")
        assert tp is not dist.group.WORLD
        read = setting.set_mesh_timeouts(mesh, None, 1 / 7)  # 8571.43 ms: c10d keeps 8571 ms
        # torch 2.10 and later reuse the default group for the world-sized dp_shard; torch 2.9 makes its own
        dp_shard = "default" if mesh.get_group("dp_shard") is dist.group.WORLD else "dp_shard"
        assert set(read) == {dp_shard, "tp"}
        seventh = pytest.approx(1 / 7, abs=1e-4)
        assert all(minutes == {"cpu": seventh, "cuda": seventh} for minutes in read.values()), read
        genuine = setting.set_group_timeout
        monkeypatch.setattr(setting, "set_group_timeout", lambda t, g: None if g is tp else genuine(t, g))
        refused = r"group 'tp': its cpu backend \(gloo\) reads 0.14285 min after setting 2 min"
        with pytest.raises(RuntimeError, match=refused):
            setting.set_mesh_timeouts(mesh, None, 2)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_a_half_of_a_composite_group_that_does_not_take_the_timeout_is_named() -> None:
    """Every backend is read back, not only the first: on a ``"cpu:gloo,cuda:nccl"``-shaped group whose CPU half
    takes the value and whose CUDA half keeps its own, ``set_mesh_timeouts`` refuses, naming the CUDA half.

    One spawned rank (``tests.ranks.mesh_timeouts.composite_half_skipped``); the CUDA half is a Gloo backend
    registered for CUDA under another name (NCCL cannot start without a GPU), so it names itself ``gloo``.
    """
    (result,) = spawn_ranks(
        "tests.ranks.mesh_timeouts:composite_half_skipped", {"minutes": 2}, world_size=1, timeout_s=SPAWN_TIMEOUT_S
    )
    facts = result.result
    assert facts["reuses_default_group"] is True and facts["distinct_halves"] is True, facts
    assert facts["seconds"] == {"cpu": 120.0, "cuda": GLOO_DEFAULT_S}, facts
    assert facts["raised"] == (
        "group 'default': its cuda backend (gloo) reads 30 min after setting 2 min; the timeout did not reach it"
    )


def test_flattened_axes_finds_what_torch_flattened() -> None:
    """``registry.flattened_axes`` reads the flattened meshes where this torch records them: the root mesh's
    ``_flatten_mapping`` (torch 2.10 and later), or torch 2.9's ``_mesh_resources.root_to_flatten_mapping``.

    Only the torch-2.9 lane tests the second (nemo-automodel 0.5.0 and later record their own
    ``_flatten_mapping`` there too; a mesh torch alone flattened, as 0.4.0's and NeMo RL's are, has only
    torch's registry). One real Gloo rank in this process.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from nemo_rl_shim.process_groups.registry import axis_mesh, flattened_axes
    from tests.ranks.fresh_group import forget_meshes

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("cp", "tp"))
        flat = mesh[("cp", "tp")]._flatten()
        found = flattened_axes(mesh)
        assert list(found) == ["cp_tp"], found
        assert found["cp_tp"].get_group() is flat.get_group()
        assert axis_mesh(mesh, "cp_tp").get_group() is flat.get_group()
    finally:
        dist.destroy_process_group()
        forget_meshes()


@pytest.mark.parametrize("minutes", [0, -1, float("nan"), "5", None])
def test_bad_minutes_are_refused_before_any_group_is_touched(minutes: Any) -> None:
    with pytest.raises(ValueError, match=r"set_mesh_timeouts minutes must be a positive"):
        setting.set_mesh_timeouts(None, None, minutes)


@pytest.mark.multiprocess
@pytest.mark.releases
def test_on_0_4_0_cpu_offload_sub_groups_keep_both_halves_and_both_get_the_timeout(release_environment) -> None:
    """0.4.0's create_device_mesh passes no backend override: each sub-group is made with the default group's
    backend string, so under CPU offload's two-half default group every sub-group keeps both halves.

    NCCL cannot start without a GPU, so the CUDA half is a Gloo backend registered for CUDA under another
    name (``tests.ranks.mesh_timeouts.CUDA_STAND_IN``): two distinct backend objects per group, as with
    ``"cuda:nccl,cpu:gloo"``; every timeout is read from those objects.
    """
    from tests.ranks.mesh_timeouts import CUDA_STAND_IN

    params = {"layout": {"name": "tp", "tp": 2}, "minutes": MINUTES}
    results = spawn_ranks(
        "tests.ranks.mesh_timeouts:composite_after_build",
        params,
        world_size=4,
        timeout_s=SPAWN_TIMEOUT_S,
        env=release_environment("0.4.0"),
    )
    composite = f"cpu:gloo,cuda:{CUDA_STAND_IN}"
    for rank, facts in enumerate(r.result for r in results):
        assert facts["builder"] == "create_device_mesh", facts["builder"]
        sub_groups = [name for name in facts["before"] if name != "default"]
        assert len(sub_groups) == 8, (
            sub_groups
        )  # pp, dp_replicate, dp_shard, cp, tp and the flattened dp, dp_cp, dp_shard_cp
        for name, group in facts["before"].items():
            assert (group["backend"], group["distinct_halves"]) == (composite, True), (rank, name, group)
            if name != "default":
                assert group["seconds"] == {"cpu": GLOO_DEFAULT_S, "cuda": GLOO_DEFAULT_S}, (rank, name, group)
        for name, group in facts["after"].items():
            if name != "default":
                assert group["seconds"] == {"cpu": MINUTES * 60, "cuda": MINUTES * 60}, (rank, name, group)
        assert all(read == {"cpu": MINUTES, "cuda": MINUTES} for read in facts["returned"].values()), facts
