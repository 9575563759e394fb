"""Groups made after ``setup_distributed`` in every rank's dump and group map, on real Gloo ranks (#42).

A trace entry names its group but not its ranks, and Gloo's ``pg_config`` names no group (G-PG-CONFIG in
docs/recorder-semantics.md): a rank that never used a group made after set-up was not seen as its member, and the
report could not name it. One spawned world (:mod:`tests.ranks.later_groups`, 4 ranks, tp=2): ``later`` (ranks 1-3)
made after set-up, used by ranks 1 and 2 alone, which time out in it; ``late`` (ranks 0 and 3) made after the last
watched block of ranks 0 and 3; and a ``split_group`` where torch splits on CPU. Then, in-process on one Gloo rank:
the merge rules, and the dump path on a registry it cannot read.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.cli.main import main
from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, SIDECAR_NAME, p2p_log
from nemo_rl_shim.flight_recorder import groups as fr_groups
from tests.ranks.later_groups import LATE, LATER, SPLIT

pytestmark = [pytest.mark.every_lane]

WORLD = 4
SPAWN_TIMEOUT_S = 300
STEADY_S = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    dump_dir = tmp_path_factory.mktemp("later_groups")
    params = {"dump_dir": str(dump_dir), "startup": 0.2, "steady": STEADY_S / 60}
    results: list[RankResult] = spawn_ranks(
        "tests.ranks.later_groups:run", params, world_size=WORLD, timeout_s=SPAWN_TIMEOUT_S,
        env={"CUDA_VISIBLE_DEVICES": ""}, check=False,
    )  # fmt: skip
    got = {r.rank: r.result for r in results if isinstance(r.result, dict)}
    missing = [f"rank {r.rank}: {r.error or r.output[-2000:]}" for r in results if r.rank not in got]
    assert len(got) == WORLD, "ranks without a result:\n" + "\n".join(missing)
    return {"dir": dump_dir, "ranks": got}


def _dump(world: dict[str, Any], rank: int) -> dict[str, Any]:
    return pickle.loads((world["dir"] / f"{DUMP_FILE_NAME}{rank}").read_bytes())


def _sidecar(world: dict[str, Any], rank: int) -> dict[str, Any]:
    return json.loads((world["dir"] / SIDECAR_NAME.format(rank=rank)).read_text())


def _name(world: dict[str, Any], key: str, rank: int) -> str:
    made = world["ranks"][rank][key]
    assert made is not None, f"rank {rank} is not in {key}: {world['ranks'][rank]}"
    return made["name"]


def _entry_groups(dump: dict[str, Any]) -> set[str]:
    return {entry["process_group"][0] for entry in dump["entries"]}


# --- the world ran as intended -------------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_the_world_ran_as_drawn(world) -> None:
    ranks = world["ranks"]
    assert {r: (ranks[r]["later"] or {}).get("ranks") for r in ranks} == {0: None, 1: LATER, 2: LATER, 3: LATER}
    assert {r: (ranks[r]["late"] or {}).get("ranks") for r in ranks} == {0: LATE, 1: None, 2: None, 3: LATE}
    assert len({ranks[r]["later"]["name"] for r in LATER}) == 1, "one new_group, one name on every member"
    for r in (1, 2):
        assert ranks[r]["outcome"] == "raised" and ranks[r]["seconds"] >= STEADY_S * 0.9, ranks[r]
    assert all(ranks[r]["dumped"] for r in ranks), ranks
    later = _name(world, "later", 1)
    assert later not in _entry_groups(_dump(world, 3)), "rank 3 ran nothing on the later group"
    assert later in _entry_groups(_dump(world, 1)) and later in _entry_groups(_dump(world, 2))


# --- the dumps: every group held, by the name the entries carry ---------------------------------------------------


@pytest.mark.multiprocess
def test_a_later_group_is_in_every_members_dump_with_its_ranks_even_where_unused(world) -> None:
    later, late = _name(world, "later", 1), _name(world, "late", 0)
    for rank in range(WORLD):
        groups = _dump(world, rank)["nemo_rl_shim"]["groups"]
        if rank in LATER:
            assert groups.get(later, {}).get("ranks") == LATER, (rank, groups)
            assert groups[later]["axes"] == [], "a group made later serves no mesh axis: it is known by its ranks"
        else:
            assert later not in groups or rank in groups[later]["ranks"], (rank, groups)
        if rank in LATE:
            assert groups.get(late, {}).get("ranks") == LATE, (rank, groups)


@pytest.mark.multiprocess
def test_gloos_pg_config_is_filled_with_the_later_groups(world) -> None:
    later = _name(world, "later", 1)
    dump = _dump(world, 3)
    assert "" in dump["nemo_rl_shim"]["torch_pg_config"], "Gloo's own pg_config names no group (G-PG-CONFIG)"
    assert dump["pg_config"][later] == {"name": later, "desc": "undefined", "ranks": str(LATER)}, dump["pg_config"]


@pytest.mark.multiprocess
def test_every_entry_names_a_group_of_the_map_that_holds_its_rank(world) -> None:
    """How entries name a group (``process_group[0]``) is the key of the map, on this lane's torch (N- rows): the
    set-up groups, ``later``, and (where torch splits on CPU) the split's group."""
    for rank in range(WORLD):
        dump = _dump(world, rank)
        groups = dump["nemo_rl_shim"]["groups"]
        for name in _entry_groups(dump):
            assert name in groups and rank in groups[name]["ranks"], (world["ranks"][rank]["torch"], rank, name)


@pytest.mark.multiprocess
def test_set_up_axes_are_kept(world) -> None:
    for rank in range(WORLD):
        groups = _dump(world, rank)["nemo_rl_shim"]["groups"]
        axes = {axis: facts["ranks"] for facts in groups.values() for axis in facts["axes"]}
        assert axes["default"] == list(range(WORLD)), groups
        assert axes["tp"] == ([0, 1] if rank < 2 else [2, 3]), groups


@pytest.mark.multiprocess
def test_a_split_group_is_in_its_members_dumps(world) -> None:
    split = {r: world["ranks"][r]["split"] for r in range(WORLD)}
    refused = {s.get("error") for s in split.values()}
    if refused != {None}:
        pytest.skip(f"torch {world['ranks'][0]['torch']} refused split_group on CPU Gloo: {sorted(map(str, refused))}")
    for rank in range(WORLD):
        made = split[rank]["group"]
        part = next(p for p in SPLIT if rank in p)
        assert made["ranks"] == part, made
        assert _dump(world, rank)["nemo_rl_shim"]["groups"][made["name"]]["ranks"] == part


# --- the group map file: refreshed where the shim runs ------------------------------------------------------------


@pytest.mark.multiprocess
def test_the_group_map_file_is_refreshed_on_entering_a_watched_block(world) -> None:
    later = _name(world, "later", 1)
    for rank in LATER:
        seen = world["ranks"][rank]
        assert later not in seen["at_set_up"]
        assert later not in seen["after_making"], "nothing tells the shim a group was made: no refresh yet"
        assert seen["in_a_block"].get(later) == LATER, seen["in_a_block"]


@pytest.mark.multiprocess
def test_the_group_map_file_is_refreshed_by_a_dump(world) -> None:
    """Ranks 0 and 3 entered no watched block after ``late`` was made; their watcher's dump refreshed the file, as it
    would beside a dump torch's NCCL watchdog wrote."""
    late, later = _name(world, "late", 0), _name(world, "later", 1)
    for rank in LATE:
        side = _sidecar(world, rank)
        assert side["groups"].get(late, {}).get("ranks") == LATE, side
        assert side["written_ns"] >= side["set_up_ns"] > 0, side
        assert world["ranks"][rank]["at_the_end"] == {n: f["ranks"] for n, f in side["groups"].items()}
    assert _sidecar(world, 3)["groups"][later]["ranks"] == LATER


@pytest.mark.multiprocess
def test_the_report_names_the_member_that_never_used_the_group(world, capfd) -> None:
    assert main(["hang-report", "--json", str(world["dir"])]) == 1
    payload = json.loads(capfd.readouterr().out)
    assert payload["kind"]["name"] == "never_came" and payload["kind"]["ranks"] == [3], payload["line"]


# --- one rank in this process: the rules, and a registry that cannot be read ---------------------------------------


def test_merge_keeps_set_up_axes_adds_later_groups_and_lets_torch_win_a_reused_name() -> None:
    set_up = {
        "0": {"axes": ["default"], "ranks": [0, 1], "desc": "default_pg"},
        "1": {"axes": ["tp"], "ranks": [0, 1], "desc": "mesh_tp"},
        "2": {"axes": ["dp"], "ranks": [1], "desc": "mesh_dp"},
    }
    held = {
        "0": {"axes": [], "ranks": [0, 1], "desc": "default_pg"},
        "1": {"axes": [], "ranks": [1, 0], "desc": "undefined"},  # another group under a set-up name
        "9": {"axes": [], "ranks": [1, 0], "desc": "undefined"},
    }
    merged = fr_groups.merged(set_up, held)
    assert merged["0"]["axes"] == ["default"]
    assert merged["1"] == {"axes": [], "ranks": [1, 0], "desc": "undefined"}
    assert merged["2"]["axes"] == ["dp"], "a set-up group torch no longer holds stays: its entries may remain"
    assert merged["9"]["ranks"] == [1, 0], "group-rank order, as torch keeps it"
    assert set_up["1"]["axes"] == ["tp"], "the set-up map is not changed"


@pytest.fixture
def one_rank(tmp_path, monkeypatch) -> Any:
    """One Gloo rank in this process, the recorder on, dumping into ``tmp_path``; the recorder's state put back."""
    import torch.distributed as dist

    from nemo_rl_shim.config.settings import FlightRecorderSettings
    from nemo_rl_shim.flight_recorder import recorder

    saved = {k: getattr(recorder._State, k) for k in ("settings", "groups", "set_up_ns", "sidecar_names")}
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / DUMP_FILE_NAME))
    recorder.configure(FlightRecorderSettings(dump_dir=tmp_path, buffer_size=50), environ={})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "records nothing": torch 2.9 and 2.10 made this process's recorder off
            recorder.record_groups(_NoMesh())
        yield recorder
    finally:
        p2p_log.uninstall()  # record_groups wrapped torch's send and recv for Gloo's log: torch's back for the rest
        dist.destroy_process_group()
        for key, value in saved.items():
            setattr(recorder._State, key, value)


class _NoMesh:
    device_mesh = None
    moe_mesh = None


def test_held_groups_name_each_group_as_torch_does(one_rank) -> None:
    import torch.distributed as dist

    group = dist.new_group([0])
    held = fr_groups.held_groups()
    assert held[str(group.group_name)]["ranks"] == [0]
    assert held[str(dist.group.WORLD.group_name)]["desc"] == "default_pg"


def test_a_registry_that_cannot_be_read_leaves_the_set_up_map_and_raises_nothing(one_rank, monkeypatch, tmp_path):
    def broken() -> Any:
        raise AttributeError("_world has no pg_map in this torch")

    monkeypatch.setattr(fr_groups, "_registry", broken)
    assert fr_groups.held_groups() == {}
    path = one_rank.dump_now("a dump on an odd torch")
    assert path is not None and path.exists()
    assert pickle.loads(path.read_bytes())["nemo_rl_shim"]["groups"] == one_rank._State.groups


def test_a_group_whose_name_cannot_be_read_is_left_out(one_rank, monkeypatch) -> None:
    class Odd:
        @property
        def group_name(self) -> str:
            raise RuntimeError("ProcessGroup name not set")

    odd = Odd()
    monkeypatch.setattr(fr_groups, "_registry", lambda: ([odd], {}, {odd: {0: 0}}))
    assert fr_groups.held_groups() == {}
    monkeypatch.setattr(fr_groups, "_registry", lambda: ([odd], {odd: "7"}, {odd: {3: 0, 1: 1}}))
    assert fr_groups.held_groups()["7"]["ranks"] == [3, 1], "named by torch's Python registry; in group-rank order"


def test_a_sidecar_that_cannot_be_written_warns_once_and_raises_nothing(one_rank, monkeypatch, tmp_path) -> None:
    import torch.distributed as dist

    def refused(path: Path, data: bytes) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(one_rank, "_write_atomically", refused)
    monkeypatch.setattr(one_rank._State, "sidecar_warned", False)
    dist.new_group([0])
    with pytest.warns(RuntimeWarning, match="not refreshed: .*Permission denied"):
        assert one_rank.refresh_sidecar() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with one_rank.stack_watch("a block"):  # refreshes, fails again, quietly
            pass
