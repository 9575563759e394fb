"""The NCCL-format world drawer of #42 (``tests/harness/hang_truth/nccl_worlds.py``) follows the recording rules.

One test per row id of ``docs/recorder-semantics.md`` that the drawer draws: the dumps it writes respect the row.
Rows it does not draw (Gloo's, which the real-Gloo drawer covers, and those about torch's own machinery) are
listed with the reason, and a test checks that every row of the document is one or the other. Then: seeds are
deterministic, the draws cover the space, and the truth follows from the rules (not from the reader).
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hang_truth.nccl_recorder import PENDING, RulesRank
from tests.harness.hang_truth.nccl_worlds import (
    CANNOT_TELL,
    INCIDENTS,
    PREFIXES,
    SEEDS,
    draw,
    h200,
    play,
    recipe,
)
from tests.harness.nccl_format_dumps import Clock, Group
from tests.harness.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "recorder-semantics.md"
ENTRY_KEYS = [
    "frames", "record_id", "pg_id", "process_group", "thread_name", "thread_id", "collective_seq_id", "p2p_seq_id",
    "op_id", "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
    "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms", "is_p2p",
]  # fmt: skip
G4 = Group("0", "default_pg", (0, 1, 2, 3))
#: Small seeds of every kind, found once from :func:`recipe` (the test below checks they still are what they say).
SMALL = [s for s in SEEDS[:80] if recipe(s).world <= 16]


def dumps(directory: Path) -> dict[int, dict[str, Any]]:
    """Every dump in ``directory`` by rank (either file name)."""
    found = {}
    for path in directory.iterdir():
        match = re.fullmatch(r"(?:nccl|fr)_trace_rank_(\d+)", path.name)
        if match:
            found[int(match.group(1))] = pickle.loads(path.read_bytes())
    return found


def one(lib: str = "nccl", timing: bool = False, only_active: bool = False, groups: Any = (G4,)) -> RulesRank:
    return RulesRank(0, list(groups), Clock(), timing=timing, lib=lib, only_active=only_active)


def named(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["profiling_name"].split(":", 1)[1].split(" ")[0] == name]


def drawn(tmp_path: Path, want: Callable[[Any], bool]) -> tuple[Any, dict[int, dict[str, Any]]]:
    """The first small seed whose recipe satisfies ``want``, drawn; and its dumps."""
    for seed in SMALL:
        if want(recipe(seed)):
            scenario = draw(seed, tmp_path)
            return scenario, dumps(scenario.directory)
    pytest.fail(f"no seed among the {len(SMALL)} small ones has the recipe this test needs")


# --- C: every recorder --------------------------------------------------------------------------------------------


def c_keys(tmp_path: Path) -> None:
    for lib in ("nccl", "nccl2"):
        rank = one(lib)
        rank.collective(G4)
        assert set(rank.dump()) == {"version", "pg_config", "comm_lib_version", "pg_status", "entries"}
        assert rank.dump()["version"] == "2.10"


def c_entry(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.timing is False)
    for dump in found.values():
        for entry in dump["entries"]:
            assert list(entry) == ENTRY_KEYS


def c_state(tmp_path: Path) -> None:
    for seed in SMALL[:20]:
        for dump in dumps(draw(seed, tmp_path).directory).values():
            for e in dump["entries"]:
                want = (
                    "completed" if e["time_discovered_completed_ns"] is not None
                    else "started" if e["time_discovered_started_ns"] is not None else "scheduled"
                )  # fmt: skip
                assert e["state"] == want, (seed, e)


def c_discover(tmp_path: Path) -> None:
    rank = one(timing=True)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    members = rank.dump()["entries"][:2]
    assert [(e["time_discovered_started_ns"], e["time_discovered_completed_ns"]) for e in members] == [(None, None)] * 2


def c_retired(tmp_path: Path) -> None:
    rank = one()
    rank.collective(G4)
    rank.batch(G4, [("send", 1)])
    rank.collective(G4, state=PENDING)
    assert [e["retired"] for e in rank.dump()["entries"]] == [True, False, True, False]


def c_only_active(tmp_path: Path) -> None:
    rank = one(only_active=True)
    rank.collective(G4)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    kept = rank.dump()["entries"]
    assert [e["profiling_name"] for e in kept] == ["nccl:send 0->1", "nccl:recv 0<-3"]
    assert all(e["time_discovered_completed_ns"] is None for e in kept)


def c_only_active_var(tmp_path: Path) -> None:
    made = [recipe(s) for s in SEEDS]
    assert not [r.seed for r in made if r.version == "2.9" and r.only_active]
    assert any(r.only_active for r in made)


def c_ring(tmp_path: Path) -> None:
    rank = one()
    for _ in range(3):
        rank.collective(G4)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    kept = rank.dump(buffer=3)["entries"]
    assert [e["record_id"] for e in kept] == [3, 4, 5]
    assert kept[-1]["profiling_name"] == "nccl:coalesced"  # the closer comes after every member


def c_record_id(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: not r.only_active and r.rounds >= 2)
    for dump in found.values():
        assert [e["record_id"] for e in dump["entries"]] == list(range(len(dump["entries"])))


def c_pg_config(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.layout == "mesh")
    for rank, dump in found.items():
        for name, facts in dump["pg_config"].items():
            assert facts["name"] == name and rank in json.loads(facts["ranks"])


def c_pg_status(tmp_path: Path) -> None:
    rank = one(groups=(G4, Group("1", "mesh_tp", (0, 1))))
    rank.collective(G4)
    status = rank.dump()["pg_status"]
    assert list(status) == ["0"]  # group "1" recorded nothing: no row
    assert set(status["0"]) == {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}


def c_pg_id(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.layout == "mesh" and not r.only_active and r.rounds)
    for dump in found.values():
        names = list(dump["pg_config"])
        for e in dump["entries"]:
            assert names[e["pg_id"]] == e["process_group"][0]


def c_file(tmp_path: Path) -> None:
    for form in ("torch", "shim"):
        scenario, _ = drawn(tmp_path / form, lambda r, f=form: r.form == f and r.incident == "no_dump")
        files = {p.name for p in scenario.directory.iterdir()}
        culprit = scenario.recipe["culprit"]
        assert f"{PREFIXES[form]}{culprit}" not in files
        assert f"{PREFIXES[form]}{(culprit + 1) % scenario.world_size}" in files
        assert (f"fr_groups_rank_{culprit}.json" in files) == (form == "shim")  # the shim wrote it at set-up


def c_p2p_names(tmp_path: Path) -> None:
    sub = Group("3", "mesh_tp", (4, 5, 6, 7))
    for lib in ("nccl", "nccl2"):
        rank = RulesRank(5, [sub], Clock(), lib=lib)
        rank.send(sub, 6)
        rank.recv(sub, 4)
        assert [e["profiling_name"] for e in rank.dump()["entries"]] == [f"{lib}:send 1->2", f"{lib}:recv 1<-0"]


# --- L: legacy NCCL -----------------------------------------------------------------------------------------------


def l_coll(tmp_path: Path) -> None:
    rank = one()
    rank.send(G4, 1)
    rank.collective(G4)
    coll = rank.dump()["entries"][-1]
    assert (coll["collective_seq_id"], coll["p2p_seq_id"], coll["op_id"], coll["is_p2p"]) == (1, 1, 2, False)


def l_p2p(tmp_path: Path) -> None:
    rank = one()
    rank.collective(G4)
    rank.send(G4, 1)
    send = rank.dump()["entries"][-1]
    assert (send["collective_seq_id"], send["p2p_seq_id"], send["op_id"], send["is_p2p"]) == (1, 1, 2, True)
    assert send["input_sizes"] == send["output_sizes"] == [[4]]


def l_coal_members(tmp_path: Path) -> None:
    rank = one(timing=True)
    rank.collective(G4)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    rank.batch(G4, [("send", 1), ("recv", 3)], state=PENDING)
    entries = rank.dump()["entries"]
    members = [e for e in entries if e["profiling_name"] != "nccl:coalesced"][1:]
    numbers = [(e["p2p_seq_id"], e["op_id"], e["collective_seq_id"]) for e in members]
    assert numbers == [(1, 2, 1), (1, 3, 1), (2, 4, 1), (2, 5, 1)]
    assert {(e["state"], e["retired"], e["is_p2p"]) for e in members} == {("scheduled", False, True)}
    rank = one()
    rank.coalesced(G4, ["broadcast", "broadcast"])
    assert [e["collective_seq_id"] for e in rank.dump()["entries"]] == [1, 1, 1]


def l_coal_close(tmp_path: Path) -> None:
    rank = one()
    rank.collective(G4)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    closer = rank.dump()["entries"][-1]
    assert closer["profiling_name"] == "nccl:coalesced"
    assert (closer["input_sizes"], closer["output_sizes"], closer["input_dtypes"]) == ([], [], [])
    assert (closer["is_p2p"], closer["op_id"], closer["p2p_seq_id"], closer["collective_seq_id"]) == (False, 3, 1, 1)
    assert (closer["state"], closer["retired"]) == ("completed", True)


def l_coal_empty(tmp_path: Path) -> None:
    rank = one()
    rank.batch(G4, [])
    assert rank.dump()["entries"] == []


def l_coal_fast(tmp_path: Path) -> None:
    rank = one()
    rank.fast_coalesced(G4, [[4], [8]], device=True)
    inner, closer = rank.dump()["entries"]
    assert inner["profiling_name"] == "nccl:allreduce_coalesced" and inner["input_sizes"] == [[4], [8]]
    assert (closer["collective_seq_id"], closer["op_id"]) == (inner["collective_seq_id"], inner["op_id"]) == (1, 1)
    alone = one()
    alone.fast_coalesced(G4, [[4], [8]], device=False)
    assert [e["profiling_name"] for e in alone.dump()["entries"]] == ["nccl:allreduce_coalesced"]


def l_fsdp2(tmp_path: Path) -> None:
    scenario, found = drawn(tmp_path, lambda r: r.layout == "mesh" and r.rounds and not r.only_active)
    dp = scenario.world_size // scenario.recipe["tp"]
    some = [e for d in found.values() for e in named(d["entries"], "_reduce_scatter_base")]
    assert some and all(e["input_sizes"] == [[e["output_sizes"][0][0] * dp]] for e in some)


def l_timing_off(tmp_path: Path) -> None:
    rank = one(timing=False)
    rank.collective(G4)
    rank.collective(G4, state=PENDING)
    dump = rank.dump()
    assert [e["state"] for e in dump["entries"]] == ["completed", "scheduled"]
    assert all(e["time_discovered_started_ns"] is None and "duration_ms" not in e for e in dump["entries"])
    assert dump["pg_status"]["0"]["last_started_collective"] == -1


def l_timing_on(tmp_path: Path) -> None:
    rank = one(timing=True)
    rank.collective(G4)
    rank.collective(G4, state=PENDING)
    dump = rank.dump()
    done, waiting = dump["entries"]
    assert (done["state"], waiting["state"]) == ("completed", "started")
    assert "duration_ms" in done and done["time_discovered_started_ns"] is not None
    assert dump["pg_status"]["0"]["last_started_collective"] == 2


def l_pg_status(tmp_path: Path) -> None:
    found = dumps(h200(tmp_path, form="torch").directory)
    assert found[0]["pg_status"]["0"] == {
        "last_enqueued_collective": 2,
        "last_started_collective": -1,
        "last_completed_collective": 1,  # the batch's work: its p2p number
    }


def l_retire(tmp_path: Path) -> None:
    rank = one(timing=True)
    rank.collective(G4, state=PENDING)
    assert rank.dump()["entries"][0]["retired"] is False


def l_only_active(tmp_path: Path) -> None:
    found = dumps(h200(tmp_path, form="torch", only_active=True).directory)
    names = [(e["profiling_name"], e["collective_seq_id"]) for e in found[0]["entries"]]
    assert names == [("nccl:send 0->0", 1), ("nccl:recv 0<-0", 1), ("nccl:all_reduce", 2)]


def l_name(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.layout == "pairs" and r.rounds and not r.only_active)
    for dump in found.values():
        for e in dump["entries"]:
            name, desc = e["process_group"]
            assert dump["pg_config"][name]["desc"] == desc


# --- H: NCCL2's hook ----------------------------------------------------------------------------------------------


def h_names(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.recorder == "nccl2" and r.rounds)
    assert {e["profiling_name"].split(":")[0] for d in found.values() for e in d["entries"]} == {"nccl2"}


def h_seq(tmp_path: Path) -> None:
    rank = one("nccl2")
    rank.collective(G4)
    rank.batch(G4, [("send", 1), ("recv", 3)])
    entries = rank.dump()["entries"]
    assert [(e["op_id"], e["collective_seq_id"], e["p2p_seq_id"]) for e in entries] == [(0, 1, 0), (1, 1, 1), (2, 1, 2)]


def h_no_close(tmp_path: Path) -> None:
    _, found = drawn(tmp_path, lambda r: r.recorder == "nccl2" and r.p2p_history)
    assert not [e for d in found.values() for e in named(d["entries"], "coalesced")]


def h_batch_done(tmp_path: Path) -> None:
    rank = one("nccl2")
    rank.batch(G4, [("send", 1), ("recv", 3)], state=PENDING)  # the batch hangs; the hook cannot tell
    for e in rank.dump()["entries"]:
        assert (e["state"], e["retired"]) == ("completed", True)
        assert e["time_discovered_completed_ns"] == e["time_created_ns"]


def h_state(tmp_path: Path) -> None:
    rank = one("nccl2")
    rank.collective(G4)
    rank.collective(G4, state=PENDING)
    done, waiting = rank.dump()["entries"]
    assert done["time_discovered_started_ns"] == done["time_discovered_completed_ns"] is not None
    assert (waiting["state"], waiting["retired"], waiting["time_discovered_started_ns"]) == ("scheduled", False, None)
    assert "duration_ms" not in done


def h_timing(tmp_path: Path) -> None:
    rank = one("nccl2", timing=True)
    rank.collective(G4, state=PENDING)
    assert rank.dump()["entries"][0]["state"] == "scheduled"


def h_pg_status(tmp_path: Path) -> None:
    rank = one("nccl2")
    rank.collective(G4)
    rank.send(G4, 1)
    rank.collective(G4, state=PENDING)
    assert rank.dump()["pg_status"]["0"] == {
        "last_enqueued_collective": 2,
        "last_started_collective": -1,
        "last_completed_collective": 1,
    }


def h_only_active(tmp_path: Path) -> None:
    rank = one("nccl2", only_active=True)
    rank.batch(G4, [("send", 1), ("recv", 3)], state=PENDING)
    assert rank.dump()["entries"] == []


def h_pg_config(tmp_path: Path) -> None:
    rank = one("nccl2")
    rank.collective(G4)
    assert rank.dump()["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}


# --- N: group names -----------------------------------------------------------------------------------------------


def _tp_names(tmp_path: Path, naming: str) -> dict[tuple[int, ...], set[str]]:
    _, found = drawn(tmp_path, lambda r: r.layout == "mesh" and r.naming == naming and r.world // r.tp > 1)
    names: dict[tuple[int, ...], set[str]] = {}
    for dump in found.values():
        for name, facts in dump["pg_config"].items():
            if facts["desc"] == "mesh_tp":
                names.setdefault(tuple(json.loads(facts["ranks"])), set()).add(name)
    return names


def n_new_group(tmp_path: Path) -> None:
    names = _tp_names(tmp_path, "new_group")
    assert all(len(n) == 1 for n in names.values())  # one name per group on all its ranks
    assert len({next(iter(n)) for n in names.values()}) == len(names) > 1  # and different groups, different names


def n_split_counter(tmp_path: Path) -> None:
    names = _tp_names(tmp_path, "split_counter")
    assert len(names) > 1 and {frozenset(n) for n in names.values()} == {frozenset({"2"})}


def n_split_hash(tmp_path: Path) -> None:
    names = _tp_names(tmp_path, "split_hash")
    flat = [next(iter(n)) for n in names.values()]
    assert len(set(flat)) == len(flat) > 1 and all(re.fullmatch(r"[0-9a-f]{40}", n) for n in flat)


def n_desc(tmp_path: Path) -> None:
    descs = set()
    for want in ("mesh", "pairs"):
        _, found = drawn(tmp_path / want, lambda r, w=want: r.layout == w)
        descs |= {f["desc"] for d in found.values() for f in d["pg_config"].values()}
    assert descs == {"default_pg", "mesh_dp", "mesh_tp", "undefined"}


def n_mesh(tmp_path: Path) -> None:
    made = [recipe(s) for s in SEEDS]
    assert {r.naming for r in made if r.layout != "mesh"} == {"new_group"}
    assert {r.naming for r in made if r.version == "2.9" and r.layout == "mesh"} <= {"new_group", "split_counter"}
    assert {r.naming for r in made if r.version != "2.9"} <= {"new_group", "split_hash"}


ROWS: dict[str, Callable[[Path], None]] = {
    "C-KEYS": c_keys, "C-ENTRY": c_entry, "C-STATE": c_state, "C-DISCOVER": c_discover, "C-RETIRED": c_retired,
    "C-ONLY-ACTIVE": c_only_active, "C-ONLY-ACTIVE-VAR": c_only_active_var, "C-RING": c_ring,
    "C-RECORD-ID": c_record_id, "C-PG-CONFIG": c_pg_config, "C-PG-STATUS": c_pg_status, "C-PG-ID": c_pg_id,
    "C-FILE": c_file, "C-P2P-NAMES": c_p2p_names,
    "L-COLL": l_coll, "L-P2P": l_p2p, "L-COAL-MEMBERS": l_coal_members, "L-COAL-CLOSE": l_coal_close,
    "L-COAL-EMPTY": l_coal_empty, "L-COAL-FAST": l_coal_fast, "L-FSDP2": l_fsdp2, "L-TIMING-OFF": l_timing_off,
    "L-TIMING-ON": l_timing_on, "L-PG-STATUS": l_pg_status, "L-RETIRE": l_retire, "L-ONLY-ACTIVE": l_only_active,
    "L-NAME": l_name,
    "H-NAMES": h_names, "H-SEQ": h_seq, "H-NO-CLOSE": h_no_close, "H-BATCH-DONE": h_batch_done, "H-STATE": h_state,
    "H-TIMING": h_timing, "H-PG-STATUS": h_pg_status, "H-ONLY-ACTIVE": h_only_active, "H-PG-CONFIG": h_pg_config,
    "N-NEW-GROUP": n_new_group, "N-SPLIT-COUNTER": n_split_counter, "N-SPLIT-HASH": n_split_hash, "N-DESC": n_desc,
    "N-MESH": n_mesh,
}  # fmt: skip
#: Rows of the document this drawer does not draw, and why.
NOT_DRAWN = {
    "H-ATTACH": "which backend records is torch's choice at group creation; every NCCL2 world here is recorded by it",
    "H-DUMP": "when and where the hook dumps: the drawer writes the dump it would write",
    "N-COUNTER-2.15": "no world here makes a group after a split_group",
    "N-SPLIT-CPU": "about which torch splits on CPU; the drawn worlds are NCCL's",
    **{g: "Gloo's recorder: the real-Gloo drawer of #42 covers it" for g in (
        "G-ENQ", "G-NO-P2P", "G-STATE", "G-RETIRE", "G-PG-STATUS", "G-PG-CONFIG", "G-ONLY-ACTIVE", "G-DUMP",
    )},
}  # fmt: skip


@pytest.mark.parametrize("row", sorted(ROWS))
def test_the_drawer_respects_the_row(row: str, tmp_path: Path) -> None:
    ROWS[row](tmp_path)


def test_every_row_of_the_document_is_tested_or_said_not_drawn() -> None:
    ids = set(re.findall(r"^\| ([CLHGN]-[A-Z0-9.-]+) \|", DOC.read_text(), flags=re.M))
    assert ids, f"no row ids found in {DOC}"
    assert ids == set(ROWS) | set(NOT_DRAWN), (sorted(ids - set(ROWS) - set(NOT_DRAWN)), sorted(set(ROWS) - ids))


# --- seeds, coverage, truth ---------------------------------------------------------------------------------------


def test_a_seed_draws_the_same_world_every_time(tmp_path: Path) -> None:
    for seed in SMALL[:6]:
        first, second = draw(seed, tmp_path / "a"), draw(seed, tmp_path / "b")
        assert first.truth == second.truth and first.recipe == second.recipe
        files = sorted(p.name for p in first.directory.iterdir())
        assert files == sorted(p.name for p in second.directory.iterdir())
        for name in files:
            assert (first.directory / name).read_bytes() == (second.directory / name).read_bytes(), (seed, name)


def test_the_fixed_seeds_cover_what_the_drawer_draws() -> None:
    made = [recipe(s) for s in SEEDS]
    assert len(SEEDS) >= 200 and len(set(SEEDS)) == len(SEEDS)
    for field, values in {
        "incident": set(INCIDENTS),
        "recorder": {"legacy", "nccl2"},
        "layout": {"default", "mesh", "pairs"},
        "naming": {"new_group", "split_counter", "split_hash"},
        "version": {"2.9", "2.10", "2.11", "2.15"},
        "form": {"torch", "shim"},
        "coll_batch": {"none", "slow", "fast", "fast_nodevice"},
        "timing": {True, False},
        "only_active": {True, False},
        "cascade": {True, False},
        "p2p_history": {True, False},
    }.items():
        assert {getattr(r, field) for r in made} == values, field
    worlds = [r.world for r in made]
    assert min(worlds) == 8 and max(worlds) == 1024 and sum(w <= 32 for w in worlds) > len(worlds) / 2


def test_a_hung_nccl2_batch_can_only_be_told_as_cannot_tell(tmp_path: Path) -> None:
    seeds = [s for s in SEEDS if recipe(s).recorder == "nccl2" and recipe(s).incident == "p2p_batch"]
    assert seeds
    for seed in seeds[:3]:
        r = recipe(seed)
        if r.world > 64:
            continue
        scenario = draw(seed, tmp_path)
        assert scenario.truth.kinds == CANNOT_TELL and "H-BATCH-DONE" in scenario.truth.why
        pending = [e for d in dumps(scenario.directory).values() for e in d["entries"] if e["state"] != "completed"]
        assert all(e["profiling_name"].split(":")[1].split(" ")[0] not in ("send", "recv") for e in pending)


def test_only_active_truths_need_the_evidence_the_rules_give(tmp_path: Path) -> None:
    """An only-active world's truth names a culprit for a missing entry only where pg_status can say (L-PG-STATUS)."""
    told = {"stops_earlier": "never_came", "did_not_finish": "did_not_finish", "p2p_plain": "p2p_stall"}
    for seed in SEEDS:
        r = recipe(seed)
        if not r.only_active or r.incident not in told or r.world > 32:
            continue
        truth = play(r, tmp_path / str(seed))
        evidence = r.incident != "p2p_plain" and r.recorder == "legacy" and not r.p2p_history
        evidence = evidence or (r.incident == "stops_earlier" and r.rounds == 0)  # C-PG-STATUS: recorded nothing
        if not evidence:
            assert truth.kinds == CANNOT_TELL, seed
        else:
            assert truth.kinds in (CANNOT_TELL, frozenset({told[r.incident]})), seed


def test_the_h200_dump_is_the_table_of_the_document(tmp_path: Path) -> None:
    scenario = h200(tmp_path, form="shim")
    entries = dumps(scenario.directory)[0]["entries"]
    got = [(e["profiling_name"], e["state"], e["retired"], e["collective_seq_id"], e["p2p_seq_id"], e["op_id"],
            e["is_p2p"]) for e in entries]  # fmt: skip
    assert got == [
        ("nccl:all_reduce", "completed", True, 1, 0, 1, False),
        ("nccl:send 0->0", "scheduled", False, 1, 1, 2, True),
        ("nccl:recv 0<-0", "scheduled", False, 1, 1, 3, True),
        ("nccl:coalesced", "completed", True, 1, 1, 3, False),
        ("nccl:all_reduce", "scheduled", False, 2, 1, 4, False),
    ]
    assert (scenario.directory / "fr_trace_rank_0").exists() and (scenario.directory / "fr_groups_rank_0.json").exists()
    assert scenario.truth.kinds == {"did_not_finish"} and scenario.truth.ranks == (0,)
