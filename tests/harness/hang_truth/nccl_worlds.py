"""NCCL-format worlds drawn from the recording rules of ``docs/recorder-semantics.md``, each with its truth (#42).

:func:`draw` turns a seed into a :class:`Recipe` (the world, its groups, the recorder, a history, one incident)
and writes every rank's dump into one folder, through :class:`~.nccl_recorder.RulesRank`. The truth follows from the
incident the drawer made and from the rules alone, never from what the reader says: where a recorder cannot show
the incident (a hung NCCL2 batch, ``H-BATCH-DONE``), or an only-active dump cannot tell a finished op from one never
posted (``C-ONLY-ACTIVE``, ``L-PG-STATUS``), the only right answer is "cannot tell": ``Truth.kinds`` is then
:data:`CANNOT_TELL` and ``why`` names the row.

What is drawn:

* the world: 8 to 1,024 ranks (most of them small); a layout: the default group alone, a DeviceMesh of dp x tp
  groups (``mesh_dp``/``mesh_tp``) named by ``new_group``'s counter (``N-MESH``), ``split_group``'s shared counter
  name (``N-SPLIT-COUNTER``, torch 2.9) or its hashes (``N-SPLIT-HASH``), or tp pairs from plain ``new_group``
  (``"undefined"``, ``N-DESC``);
* the recorder: legacy NCCL (torch 2.9, 2.10, 2.11, or 2.15's ``nccl-legacy``), timing on or off, or NCCL2's hook
  (2.15); an only-active dump where the version makes one (``C-ONLY-ACTIVE-VAR``); torch's file names or the shim's
  (with its group maps, ``C-FILE``);
* zero to three steps of history, all completed: a tp all_reduce, FSDP2's reduce-scatter (``L-FSDP2``), and
  maybe a ``batch_isend_irecv`` ring (``L-COAL-MEMBERS``, ``L-COAL-CLOSE``, ``H-BATCH-DONE``) and a
  ``_coalescing_manager`` batch (slow path, or the ``all_reduce`` fast path with or without a device,
  ``L-COAL-FAST``);
* one incident on the culprit's tp group (the default group in the default layout): a rank that never comes (no
  dump, or a dump that stops earlier), a rank that did not finish what its peers finished, all entered and none
  finished, a mismatch, a p2p stall (plain sends, or a batch); and maybe its cascade, the free ranks waiting in
  the next dp collective for those that never reach it.

:data:`SEEDS` is the fixed list the benchmark scores; :func:`h200` builds the dump the H200 wrote (#42).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME, SIDECAR_NAME
from tests.harness.hang_truth.nccl_recorder import PENDING, RulesRank
from tests.harness.hang_truth.truth import Scenario, Truth
from tests.harness.nccl_format_dumps import Clock, Group, write

__all__ = [
    "CANNOT_TELL",
    "H200_FIRST_LINE",
    "INCIDENTS",
    "PREFIXES",
    "SEEDS",
    "Recipe",
    "draw",
    "h200",
    "play",
    "recipe",
]

#: The seeds the benchmark scores, fixed: a scenario is replayed from its seed alone.
SEEDS: tuple[int, ...] = tuple(range(200))
INCIDENTS = ("no_dump", "stops_earlier", "did_not_finish", "all_entered", "mismatch", "p2p_plain", "p2p_batch")
#: What an honest report says where the dumps cannot show the incident (the scorer's honest kinds, ``truth.py``).
CANNOT_TELL = frozenset({"cannot_tell", "unclear"})
#: The dump file names: torch's default, and the one the shim sets (``C-FILE``).
PREFIXES = {"torch": "nccl_trace_rank_", "shim": DUMP_FILE_NAME}
#: How the report's first line about the H200 dump must start, after its kind (#42).
H200_FIRST_LINE = "rank 0 did not finish all_reduce #2"

_WORLDS = ((8, 30), (16, 25), (32, 15), (64, 10), (128, 8), (256, 6), (512, 3), (1024, 3))
_LEGACY_VERSIONS = ("2.9", "2.10", "2.11", "2.15")


@dataclass(frozen=True)
class Recipe:
    """Everything a seed decides; a scenario is replayed from it (``Scenario.recipe`` holds it as JSON)."""

    seed: int
    world: int
    tp: int
    layout: str  # "default", "mesh", "pairs"
    naming: str  # "new_group", "split_counter", "split_hash"
    recorder: str  # "legacy", "nccl2"
    version: str  # torch's release whose rules apply (the dump's "version" is "2.10" in every one: C-KEYS)
    timing: bool  # TORCH_NCCL_ENABLE_TIMING (legacy only: H-TIMING)
    only_active: bool  # TORCH_INCLUDE_ONLY_ACTIVE=1
    form: str  # "torch" or "shim": file names, and the shim's group maps
    rounds: int
    p2p_history: bool  # a batch_isend_irecv ring on the incident's group each step
    coll_batch: str  # "none", "slow", "fast", "fast_nodevice": a _coalescing_manager batch each step
    incident: str
    culprit: int
    cascade: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recipe(seed: int) -> Recipe:
    """The recipe of ``seed`` (``random.Random(seed)``: the same on every machine and Python)."""
    rng = random.Random(seed)
    world = rng.choices([w for w, _ in _WORLDS], weights=[n for _, n in _WORLDS])[0]
    recorder = rng.choices(("legacy", "nccl2"), weights=(7, 3))[0]
    version = rng.choice(_LEGACY_VERSIONS) if recorder == "legacy" else "2.15"
    layout = rng.choices(("default", "mesh", "pairs"), weights=(2, 7, 1))[0]
    naming = "new_group"
    if layout == "mesh" and rng.random() < 0.5:  # N-MESH: split_group where the default group has a bound device
        naming = "split_counter" if version == "2.9" else "split_hash"
    tp = rng.choice([t for t in (2, 4, 8) if t < world]) if layout != "default" else world
    only_active = version != "2.9" and rng.random() < 0.3  # C-ONLY-ACTIVE-VAR: 2.9's watchdog dumps everything
    incident = rng.choice(INCIDENTS)
    culprit = rng.randrange(world)  # any rank: its tp group (or the default group) is the incident's
    rounds = rng.randint(0, 3)
    return Recipe(
        seed=seed,
        world=world,
        tp=tp,
        layout=layout,
        naming=naming,
        recorder=recorder,
        version=version,
        timing=recorder == "legacy" and rng.random() < 0.5,
        only_active=only_active,
        form=rng.choice(("torch", "shim")),
        rounds=rounds,
        p2p_history=rounds > 0 and rng.random() < 0.4,
        coll_batch=rng.choice(("none", "none", "slow", "fast", "fast_nodevice")) if rounds else "none",
        incident=incident,
        culprit=culprit,
        cascade=layout != "default" and rng.random() < 0.5,
    )


def draw(seed: int, root: Path) -> Scenario:
    """Write the world of ``seed`` into ``root/nccl-<seed>`` and return it with its truth."""
    made = recipe(seed)
    directory = root / f"nccl-{seed}"
    truth = play(made, directory)
    return Scenario(f"nccl-{seed}-{made.incident}", "nccl", seed, made.world, directory, truth, made.to_json())


# --- the groups -----------------------------------------------------------------------------------------------------


def _incident_group(layout: str, world: int, tp: int, rank: int) -> tuple[int, ...]:
    if layout == "default":
        return tuple(range(world))
    start = rank // tp * tp
    return tuple(range(start, start + tp))


def _hashed(ranks: tuple[int, ...], salt: int) -> str:
    """``N-SPLIT-HASH``: torch's ``_hash_ranks_to_str``: SHA-1 of the ranks and a salt."""
    return hashlib.sha1(f"{'_'.join(map(str, ranks))}_{salt}".encode(), usedforsecurity=False).hexdigest()


class _Layout:
    """Each rank's groups, named as torch names them for the recipe (the ``N-`` rows)."""

    def __init__(self, r: Recipe) -> None:
        self.r = r
        self.default = Group("0", "default_pg", tuple(range(r.world)))
        self.dp_count = r.world // r.tp
        self._made: dict[tuple[str, tuple[int, ...]], Group] = {}

    def _group(self, name: str, desc: str, ranks: tuple[int, ...]) -> Group:
        return self._made.setdefault((name, ranks), Group(name, desc, ranks))

    def inner(self, rank: int) -> Group:
        """The incident's kind of group: tp (``mesh_tp`` or plain pairs), or the default group."""
        r = self.r
        if r.layout == "default":
            return self.default
        ranks = _incident_group(r.layout, r.world, r.tp, rank)
        index = rank // r.tp
        if r.layout == "pairs":  # new_group([...]) per pair, no desc: counter names after the default group's
            return self._group(str(1 + index), "undefined", ranks)
        return self._group(self._name(1, index, ranks), "mesh_tp", ranks)

    def outer(self, rank: int) -> Group | None:
        """FSDP2's group: the dp group of a mesh, the default group beside pairs, none in the default layout."""
        r = self.r
        if r.layout == "default":
            return None
        if r.layout == "pairs":
            return self.default
        ranks = tuple(range(rank % r.tp, r.world, r.tp))
        return self._group(self._name(0, rank % r.tp, ranks), "mesh_dp", ranks)

    def _name(self, dim: int, index: int, ranks: tuple[int, ...]) -> str:
        """A mesh group's name: dim 0 (dp) is made before dim 1 (tp) (``N-MESH``)."""
        naming = self.r.naming
        if naming == "split_counter":  # N-SPLIT-COUNTER: one counter value per split, shared by its sub-groups
            return str(1 + dim)
        if naming == "split_hash":  # N-SPLIT-HASH: the salt is the count of groups before this split
            return _hashed(ranks, 1 + dim)
        # N-NEW-GROUP: one counter value per sub-group, dp's first (tp of them), then tp's
        return str(1 + index) if dim == 0 else str(1 + self.r.tp + index)

    def groups(self, rank: int) -> list[Group]:
        """The rank's groups in the order its process made them (``C-PG-ID``)."""
        found = [self.default]
        outer = self.outer(rank)
        if outer is not None and outer is not self.default:
            found.append(outer)
        inner = self.inner(rank)
        if inner is not self.default:
            found.append(inner)
        return found


# --- playing the world ----------------------------------------------------------------------------------------------


def _ring(group: Group, rank: int) -> tuple[int, int]:
    """``(next, previous)`` of ``rank`` on ``group``'s ring."""
    at = group.ranks.index(rank)
    return group.ranks[(at + 1) % len(group.ranks)], group.ranks[(at - 1) % len(group.ranks)]


class _Play:
    """One world being played: its ranks, their clock, what each incident leaves."""

    def __init__(self, r: Recipe) -> None:
        self.r = r
        self.layout = _Layout(r)
        self.clock = Clock()
        lib = "nccl" if r.recorder == "legacy" else "nccl2"
        self.ranks = [
            RulesRank(n, self.layout.groups(n), self.clock, timing=r.timing, lib=lib, only_active=r.only_active)
            for n in range(r.world)
        ]
        self.group = self.layout.inner(r.culprit)
        self.stuck: set[int] = set()  # ranks that never reach the next step: the cascade waits on them

    def history(self) -> None:
        r = self.r
        for _ in range(r.rounds):
            for rank in self.ranks:
                rank.collective(self.layout.inner(rank.rank))
            for rank in self.ranks:
                outer = self.layout.outer(rank.rank)
                if outer is not None:  # L-FSDP2: reduce_scatter_tensor, n times the output in
                    n = len(outer.ranks)
                    rank.collective(outer, "_reduce_scatter_base", sizes=((64 * n,),), out=((64,),))
            if r.p2p_history:
                for rank in self.ranks:
                    inner = self.layout.inner(rank.rank)
                    after, before = _ring(inner, rank.rank)
                    rank.batch(inner, [("send", after), ("recv", before)])
            self._coll_batch()
            self.clock.settle()

    def _coll_batch(self) -> None:
        kind = self.r.coll_batch
        if kind == "none":
            return
        for rank in self.ranks:
            group = self.layout.outer(rank.rank) or self.layout.inner(rank.rank)
            if kind == "slow":
                rank.coalesced(group, ["broadcast", "broadcast"])
            else:
                rank.fast_coalesced(group, [[4], [8]], device=kind == "fast")

    def incident(self) -> None:
        """The incident on the culprit's group, and the same step, finished, on every other inner group."""
        kind, c, g = self.r.incident, self.r.culprit, self.group
        _INCIDENTS[kind](self, g, c)
        for other in {self.layout.inner(n) for n in range(self.r.world)} - {g}:
            _MIRROR[kind](self, other)
        self.clock.settle()
        if self.r.cascade:
            self._cascade()

    def _cascade(self) -> None:
        """Every free rank enters the next FSDP2 reduce-scatter; those of a group with a stuck member wait in it."""
        seen: set[Group] = set()
        for n in range(self.r.world):
            outer = self.layout.outer(n)
            if outer is None or outer in seen:
                continue
            seen.add(outer)
            blocked = any(m in self.stuck for m in outer.ranks)
            for m in outer.ranks:
                if m not in self.stuck:
                    k = len(outer.ranks)
                    self.ranks[m].collective(
                        outer, "_reduce_scatter_base", sizes=((64 * k,),), out=((64,),),
                        state=PENDING if blocked else "completed",
                    )  # fmt: skip
        self.clock.settle()


def _never_came(play: _Play, g: Group, c: int) -> None:
    """The peers enter the next collective and wait; the culprit never does (``no_dump``, ``stops_earlier``)."""
    for m in g.ranks:
        if m != c:
            play.ranks[m].collective(g, state=PENDING)
    play.stuck.update(g.ranks)


def _did_not_finish(play: _Play, g: Group, c: int) -> None:
    play.ranks[c].collective(g, state=PENDING)
    for m in g.ranks:
        if m != c:
            play.ranks[m].collective(g)
    play.stuck.add(c)


def _all_entered(play: _Play, g: Group, c: int) -> None:
    for m in g.ranks:
        play.ranks[m].collective(g, state=PENDING)
    play.stuck.update(g.ranks)


def _mismatch(play: _Play, g: Group, c: int) -> None:
    for m in g.ranks:
        play.ranks[m].collective(g, sizes=((8,),) if m == c else ((4,),), state=PENDING)
    play.stuck.update(g.ranks)


def _p2p_plain(play: _Play, g: Group, c: int) -> None:
    """A ring of plain sends and recvs; the culprit receives and never sends: its next rank waits in its recv."""
    after_c, _ = _ring(g, c)
    for m in g.ranks:
        after, before = _ring(g, m)
        if m != c:
            play.ranks[m].send(g, after)
        play.ranks[m].recv(g, before, state=PENDING if before == c else "completed")
    play.stuck.update({c, after_c})


def _p2p_batch(play: _Play, g: Group, c: int) -> None:
    """A ``batch_isend_irecv`` ring; the culprit never posts its batch: its neighbours' batches cannot finish."""
    after_c, before_c = _ring(g, c)
    for m in g.ranks:
        if m == c:
            continue
        after, before = _ring(g, m)
        play.ranks[m].batch(
            g, [("send", after), ("recv", before)], state=PENDING if c in (after, before) else "completed"
        )
    play.stuck.update({c, after_c, before_c})


def _mirror_collective(play: _Play, g: Group) -> None:
    for m in g.ranks:
        play.ranks[m].collective(g)


def _mirror_plain(play: _Play, g: Group) -> None:
    for m in g.ranks:
        after, before = _ring(g, m)
        play.ranks[m].send(g, after)
        play.ranks[m].recv(g, before)


def _mirror_batch(play: _Play, g: Group) -> None:
    for m in g.ranks:
        after, before = _ring(g, m)
        play.ranks[m].batch(g, [("send", after), ("recv", before)])


_INCIDENTS: dict[str, Callable[[_Play, Group, int], None]] = {
    "no_dump": _never_came,
    "stops_earlier": _never_came,
    "did_not_finish": _did_not_finish,
    "all_entered": _all_entered,
    "mismatch": _mismatch,
    "p2p_plain": _p2p_plain,
    "p2p_batch": _p2p_batch,
}
_MIRROR: dict[str, Callable[[_Play, Group], None]] = {
    "p2p_plain": _mirror_plain,
    "p2p_batch": _mirror_batch,
    **{k: _mirror_collective for k in INCIDENTS if not k.startswith("p2p")},
}


# --- the truth ------------------------------------------------------------------------------------------------------


def _absent_means_unposted(play: _Play, rank: int) -> bool:
    """Whether an op of the incident's group missing from ``rank``'s dump was never posted (rather than completed
    and dropped): always in a full dump; in an only-active one (``C-ONLY-ACTIVE``) only where ``pg_status`` can say
    (``L-PG-STATUS``): the group ran no p2p work, and an entry of it survives on ``rank`` to tie its ``pg_id``
    (``C-PG-ID``). NCCL2's ``pg_status`` counts ``op_id``\\s: judged the same way (``H-PG-STATUS``). A rank that
    recorded nothing at all dropped nothing: its dump has no ``pg_status`` row (``C-PG-STATUS``)."""
    r = play.r
    if not r.only_active:
        return True
    if not play.ranks[rank].entries:  # C-PG-STATUS: a rank that recorded nothing has no pg_status row, drops nothing
        return True
    if r.p2p_history or r.recorder != "legacy":
        return False
    g = play.group
    return any(
        e["process_group"][0] == g.name and e["time_discovered_completed_ns"] is None for e in play.ranks[rank].entries
    )


#: Why an only-active dump with an entry missing on one side cannot be told (the two-member case makes it plain).
_MIRRORED = (
    "only-active (C-ONLY-ACTIVE): a missing entry is a completed op or one never posted, and pg_status cannot say "
    "which (L-PG-STATUS, C-PG-ID); with two members, 'B never came' and 'B finished, A did not' leave the same dumps"
)


def _truth(play: _Play) -> Truth:
    r, g, c = play.r, play.group, play.r.culprit
    members = g.ranks
    peers = [m for m in members if m != c]
    seq = play.ranks[peers[0] if peers else c]._coll.get(g.name, 0)
    where = {"op": "all_reduce", "seq": seq, "group_ranks": members}
    cannot = {"kinds": CANNOT_TELL, "ranks": ()}
    kind = r.incident
    if kind == "no_dump":
        why = "no dump from the culprit while its peers wait: dead, or hung before its dump; it is the one to name"
        return Truth(frozenset({"never_came", "no_dump"}), (c,), why=why, **where)
    if kind == "stops_earlier":
        if _absent_means_unposted(play, c):
            return Truth(frozenset({"never_came"}), (c,), why="its dump stops before the op its peers wait in", **where)
        return Truth(why=_MIRRORED, **cannot, **where)
    if kind == "did_not_finish":
        if all(_absent_means_unposted(play, p) for p in peers):
            return Truth(frozenset({"did_not_finish"}), (c,), why="its peers finished the op, it did not", **where)
        return Truth(why=_MIRRORED, **cannot, **where)
    if kind == "all_entered":
        return Truth(frozenset({"all_entered_none_finished"}), members, why="every member posted it", **where)
    if kind == "mismatch":
        culprits = members if len(members) == 2 else (c,)
        return Truth(frozenset({"mismatch"}), culprits, why="its sizes differ (two members: a tie)", **where)
    where = {"op": "send", "seq": None, "group_ranks": members}
    if kind == "p2p_plain":
        if not r.only_active:
            return Truth(frozenset({"p2p_stall"}), (c,), why="it never posted its send; its next rank waits", **where)
        why = "only-active (C-ONLY-ACTIVE): a send may have completed before its recv (eagerly) and been dropped"
        return Truth(why=why, **cannot, **where)
    if r.recorder == "legacy":  # p2p_batch: L-ONLY-ACTIVE keeps a completed batch's members, so absent = unposted
        return Truth(frozenset({"p2p_stall"}), (c,), why="it never posted its batch (L-COAL-CLOSE)", **where)
    why = "NCCL2 records a batch's ops completed when queued and no closer (H-BATCH-DONE, H-NO-CLOSE)"
    return Truth(why=why, **cannot, **where)


def play(r: Recipe, directory: Path) -> Truth:
    """Play recipe ``r`` and write its dumps (and the shim's group maps) into ``directory``; its truth."""
    p = _Play(r)
    p.history()
    p.incident()
    prefix = PREFIXES[r.form]
    directory.mkdir(parents=True, exist_ok=True)
    for rank in p.ranks:
        if not (r.incident == "no_dump" and rank.rank == r.culprit):
            write(directory, rank, prefix=prefix)
        if r.form == "shim":
            _sidecar(directory, rank, r.world)
    return _truth(p)


def _sidecar(directory: Path, rank: RulesRank, world: int) -> None:
    """The group map the shim writes at set-up (``nemo_rl_shim.flight_recorder.recorder.record_groups``)."""
    axes = {"default_pg": "default", "mesh_dp": "dp", "mesh_tp": "tp", "undefined": "tp"}
    groups = {
        g.name: {"axes": [axes[g.desc]], "ranks": list(g.ranks), "desc": g.desc, "backends": {"cuda": "nccl"}}
        for g in rank.groups
    }
    facts = {"rank": rank.rank, "world_size": world, "groups": groups, "set_up_ns": 1_796_000_000_000_000_000}
    (directory / SIDECAR_NAME.format(rank=rank.rank)).write_text(json.dumps(facts))


# --- the H200 dump --------------------------------------------------------------------------------------------------


def h200(directory: Path, *, form: str = "torch", only_active: bool = False) -> Scenario:
    """The dump the H200 wrote (#42), by the rules (the table in ``docs/recorder-semantics.md``): one rank, legacy
    NCCL, timing off; all_reduce #1 completed, a completed ``batch_isend_irecv`` of a send and a recv to itself,
    all_reduce #2 posted and not finished when the watchdog fired. ``form``: torch's file name or the shim's."""
    group = Group("0", "default_pg", (0,))
    clock = Clock()
    rank = RulesRank(0, [group], clock, only_active=only_active)
    rank.collective(group)
    clock.settle()
    rank.batch(group, [("send", 0), ("recv", 0)])
    clock.settle()
    rank.collective(group, state=PENDING)
    directory.mkdir(parents=True, exist_ok=True)
    write(directory, rank, prefix=PREFIXES[form])
    if form == "shim":
        _sidecar(directory, rank, 1)
    why = (
        "all_reduce #2 never finished on the only rank; the batch before it finished (its closer completed, or, "
        "only-active, its members stand without a closer: L-COAL-CLOSE, L-ONLY-ACTIVE)"
    )
    truth = Truth(frozenset({"did_not_finish"}), (0,), op="all_reduce", seq=2, group_ranks=(0,), why=why)
    name = f"h200-{form}" + ("-only-active" if only_active else "")
    recipe_json = {"h200": True, "form": form, "only_active": only_active}
    return Scenario(name, "nccl", -1, 1, directory, truth, recipe_json)
