"""Random worlds of real Gloo ranks, each with one incident whose truth is known: the Gloo half of the generator (#42).

:func:`draw` draws a recipe from a seed (:func:`draw_recipe`, pure), runs it on 2 to 8 real ranks in real processes
(:mod:`tests.ranks.gloo_truth`: the real ``setup_distributed`` with the recorder on), checks that the world ran as
drawn, and returns the :class:`~.truth.Scenario`: the folder of dumps, stacks and counters, and its
:class:`~.truth.Truth` (:func:`truth_of`, from the recipe alone).

**What is drawn** (every choice from ``random.Random(seed)``; the incident's kind and variant from the seed itself,
``seed % 4`` and ``seed // 4``, so that a run of consecutive seeds holds each as often):

* **the layout**: the DeviceMesh of ``setup_distributed`` with ``tp`` > 1 (its ``tp`` and ``dp`` groups), or a
  family of groups made by ``new_group`` (one call per group, by every rank, not covering every rank), or by one
  ``split_group`` call (covering every rank); the default group always;
* **the history**: zero to three ops before the incident, each on one family, by every member of each of its groups:
  ``all_reduce``, ``broadcast``, ``all_gather``, ``barrier``, or ``batch_isend_irecv`` between pairs of a group;
* **the incident**, on one group (of any family that has a group of two or more):

  - ``never_came``: the culprit stays out of the op its group's other members wait in: asleep in Python, in a C call
    that holds the GIL (its dump watcher cannot answer), or dead (``os._exit``);
  - ``still_working``: the culprit stays out, writing a shard (1 MB writes) or computing (a Python loop);
  - ``circular``: two or three groups, made by ``new_group`` or ``split_group``; blocks of one or two ranks, group
    ``i`` = blocks ``i`` and ``i + 1``; each block calls its own group's op first, then the previous one's: every
    member waits on the next block, and the waits close a circle;
  - ``p2p``: a receiver (not rank 0) waits for a send (plain ``recv``, or a ``batch_isend_irecv``) that the
    sender, asleep, never posts; the other ranks (a p2p world has three or more) wait in an all_reduce of the default
    group that neither of the two reaches. Gloo's ``recv`` never times out: the receiver waits until it is ended.

  A broadcast waits on its root alone (Gloo's root sends and is done): the root is the culprit, or in a circle the
  block that calls the group last. For the first two, the other groups of the family run the op too
  (``others_too``) or idle, and the rest of the world idles; every rank not dead dumps (its watcher answers the first
  timed-out rank's request).

**The truth** (:func:`truth_of`): the kind the report must give and the ranks it must name: the culprit for the first
two; the circle's members (every rank of its groups: each waits on the next block) for the third. For a p2p stall,
the sender alone, as ``never_came`` or ``p2p_stall``: torch's Gloo recorder writes no entry for a send, a receive or a
``batch_isend_irecv`` (its dumps here hold none), so the dumps show both the receiver and the sender out of the
all_reduce, and only the stacks tell them apart (the receiver in ``recv``, the sender asleep); naming the receiver
blames a rank that waited. Where an incident's groups were made after ``setup_distributed`` (``new_group``,
``split_group``), ``Truth.why`` says the dumps' group maps do not list them: the shim's map is set-up's, and torch's
Gloo ``pg_config`` names one group, under ``''``; their members show only in the entries of the ranks that used them.

**The world is checked** (:func:`_check`): every rank made the groups the recipe says, ran the history, took the short
timeout on every group it is in, and did its part of the incident (the waiters raised, the other groups completed, the
culprit's stack samples and counters were written before it left); every rank not dead left a dump. A world that did
not run as drawn (a loaded machine: a rank that connected late) is run again once, then :class:`WorldFailed`: it is
never scored.

Bounded: each world's ranks are killed at :data:`WORLD_BOUND_S`; a world takes about 5 to 15 s (the culprit stays
for the short timeout, the stack watch's grace and its samples). Worlds mostly wait: the benchmark and the test draw
several at once, each in a thread of their own.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.flight_recorder.names import DUMP_FILE_NAME
from nemo_rl_shim.flight_recorder.stack_watchdog import stack_path
from tests.harness.hang_truth.truth import Scenario, Truth
from tests.ranks.gloo_truth import STEADY_S

__all__ = [
    "INCIDENTS",
    "OPS",
    "SEEDS",
    "WORLD_BOUND_S",
    "WorldFailed",
    "draw",
    "draw_recipe",
    "truth_of",
]

#: The incidents, in the order seeds take them (``seed % 4``).
INCIDENTS = ("never_came", "still_working", "circular", "p2p")
#: The variants of each incident, in the order its seeds take them (``seed // 4``): the culprit's state, the
#: receiver's op, the circle's number of groups.
VARIANTS: dict[str, tuple[Any, ...]] = {
    "never_came": ("asleep", "gil", "dead"),
    "still_working": ("writing", "computing"),
    "circular": (2, 3),
    "p2p": ("recv", "batched"),
}
OPS = ("all_reduce", "broadcast", "all_gather", "barrier")
#: The fixed seed list of the Gloo family: 120 worlds, 30 per incident.
SEEDS: tuple[int, ...] = tuple(range(1000, 1120))
#: Each world's ranks are killed this long after their start (a world takes 5 to 15 s; room for a loaded machine).
WORLD_BOUND_S = 300.0
#: Runs of a world that did not run as drawn, before :class:`WorldFailed`.
TRIES = 2
_TARGET = "tests.ranks.gloo_truth:run_world"
_CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
_BLOCKS = {"writing": "checkpoint save"}
#: The incidents with a stuck culprit.
_STUCK = ("never_came", "still_working")


class WorldFailed(RuntimeError):
    """A world that did not run as drawn, on every try: never scored. ``reasons``: each try's."""

    def __init__(self, seed: int, reasons: list[str]) -> None:
        self.seed, self.reasons = seed, reasons
        super().__init__(f"seed {seed}: the world did not run as drawn: {' | '.join(reasons)}")


# --- the recipe -----------------------------------------------------------------------------------------------------


def _partition(rng: random.Random, world: int, *, cover: bool) -> list[list[int]]:
    """Disjoint groups of two ranks or more, from shuffled ranks: every rank (a last one alone where ``cover``), or
    a drawn subset of two or more."""
    ranks = list(range(world))
    rng.shuffle(ranks)
    if not cover:
        ranks = ranks[: rng.randint(2, world)]
    parts = []
    while len(ranks) >= 2:
        size = rng.randint(2, len(ranks))
        parts.append(sorted(ranks[:size]))
        ranks = ranks[size:]
    if ranks and cover:
        parts.append(ranks)
    return parts


def _layout(rng: random.Random, world: int) -> tuple[int, dict[str, dict[str, Any]]]:
    """``(tp, families)``: the default group, and the DeviceMesh's ``tp``/``dp``, or a ``new_group`` or ``split_group``
    family."""
    families: dict[str, dict[str, Any]] = {"default": {"made_by": "default", "parts": [list(range(world))]}}
    layout = rng.choice(("mesh", "new_group", "split_group"))
    tp = 1
    if layout == "mesh":
        tp = rng.choice([d for d in range(2, world + 1) if world % d == 0])
        families["tp"] = {"made_by": "mesh", "parts": [list(range(s, s + tp)) for s in range(0, world, tp)]}
        if world // tp > 1:
            families["dp"] = {"made_by": "mesh", "parts": [list(range(i, world, tp)) for i in range(tp)]}
    elif layout == "new_group":
        families["ng"] = {"made_by": "new_group", "parts": _partition(rng, world, cover=False)}
    else:
        families["sg"] = {"made_by": "split_group", "parts": _partition(rng, world, cover=True)}
    return tp, families


def _circle(rng: random.Random, world: int, k: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The circle's ``k`` families (``c0``..) and its incident: blocks of one or two ranks, group ``i`` = blocks ``i``
    and ``i + 1``; each block calls its own group first."""
    sizes = [1] * k
    for i in range(k):
        if sum(sizes) < world and rng.random() < 0.5:
            sizes[i] = 2
    chosen = rng.sample(range(world), sum(sizes))
    blocks, start = [], 0
    for size in sizes:
        blocks.append(sorted(chosen[start : start + size]))
        start += size
    made_by = "new_group" if k == 2 else rng.choice(("new_group", "split_group"))
    parts = {f"c{i}": sorted({*blocks[i], *blocks[(i + 1) % k]}) for i in range(k)}
    families = {name: {"made_by": made_by, "parts": [part]} for name, part in parts.items()}
    order = {str(r): [f"c{i}", f"c{(i - 1) % k}"] for i, block in enumerate(blocks) for r in block}
    # a broadcast's root is in the block that calls the group last: Gloo's root sends and is done, it waits on no one
    src = {f"c{i}": blocks[(i + 1) % k][0] for i in range(k)}
    incident = {"kind": "circular", "groups": k, "blocks": blocks, "parts": parts, "order": order, "src": src}
    return families, incident


def _history(rng: random.Random, families: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    steps = []
    for _ in range(rng.randint(0, 3)):
        family = rng.choice(sorted(families))
        op = rng.choice((*OPS, "batch_p2p"))
        step: dict[str, Any] = {"family": family, "op": op, "size": rng.randint(1, 8)}
        if op == "batch_p2p":
            pairs = []
            for part in families[family]["parts"]:
                shuffled = rng.sample(part, len(part))
                pairs += [sorted(shuffled[i : i + 2]) for i in range(0, len(shuffled) - 1, 2)]
            if not pairs:
                step["op"] = "all_reduce"
            step["pairs"] = pairs
        steps.append(step)
    return steps


def _a_group(rng: random.Random, families: dict[str, dict[str, Any]]) -> tuple[str, list[int]]:
    """A family with a group of two ranks or more, and one such group."""
    eligible = sorted(name for name, f in families.items() if any(len(p) >= 2 for p in f["parts"]))
    family = rng.choice(eligible)
    return family, rng.choice([p for p in families[family]["parts"] if len(p) >= 2])


def _stuck_incident(rng: random.Random, kind: str, variant: str, families: dict[str, dict[str, Any]]) -> dict[str, Any]:
    family, part = _a_group(rng, families)
    # a dead rank, or one ended in its C call, must not be rank 0: it serves the store the others dump through
    culprit = rng.choice([r for r in part if r != 0] if variant in ("gil", "dead") else part)
    others = len(families[family]["parts"]) > 1
    return {
        "kind": kind, "variant": variant, "family": family, "part": part, "culprit": culprit,
        "op": rng.choice(OPS), "size": rng.randint(1, 8), "others_too": others and rng.random() < 0.5,
    }  # fmt: skip


def _p2p_incident(rng: random.Random, variant: str, families: dict[str, dict[str, Any]]) -> dict[str, Any]:
    family, part = _a_group(rng, families)
    # the receiver is ended by its own SIGKILL (Gloo's recv never times out): not rank 0, which serves the store
    waiter = rng.choice([r for r in part if r != 0])
    culprit = rng.choice([r for r in part if r != waiter])
    return {
        "kind": "p2p", "variant": variant, "family": family, "part": part,
        "waiter": waiter, "culprit": culprit, "size": rng.randint(1, 8),
    }  # fmt: skip


def draw_recipe(seed: int) -> dict[str, Any]:
    """The world of ``seed`` (JSON): its size, ``tp``, families, history and incident. Pure: the same seed, the same
    recipe."""
    rng = random.Random(seed)
    kind = INCIDENTS[seed % len(INCIDENTS)]
    variant = VARIANTS[kind][seed // len(INCIDENTS) % len(VARIANTS[kind])]
    # a p2p stall's dumps come from a third rank's timeout; a circle of k groups needs k ranks
    world = rng.randint({"p2p": 3, "circular": variant}.get(kind, 2), 8)
    tp, families = _layout(rng, world)
    if kind == "circular":
        circle, incident = _circle(rng, world, variant)
        families.update(circle)
    history = _history(rng, families)
    if kind in _STUCK:
        incident = _stuck_incident(rng, kind, variant, families)
    elif kind == "p2p":
        incident = _p2p_incident(rng, variant, families)
    incident["block"] = _BLOCKS.get(incident.get("variant", ""), "train step")
    if kind == "circular":
        incident.update(op=rng.choice(OPS), size=rng.randint(1, 8))
    return {"seed": seed, "world": world, "tp": tp, "families": families, "history": history, "incident": incident}


# --- the truth ------------------------------------------------------------------------------------------------------


def _seq(recipe: dict[str, Any], family: str) -> int:
    """The number the incident's collective has on its group: the history's collectives on the family, plus one
    (Gloo records no p2p, and numbers collectives alone)."""
    return 1 + sum(1 for step in recipe["history"] if step["family"] == family and step["op"] != "batch_p2p")


def _unmapped(recipe: dict[str, Any], families: list[str]) -> str:
    """Where the incident's groups were made after ``setup_distributed``, that the dumps' group maps do not list
    them (the shim's map is set-up's; torch's Gloo ``pg_config`` names one group, under ``''``): their members show
    only in the entries of the ranks that used them."""
    later = [f for f in families if recipe["families"][f]["made_by"] in ("new_group", "split_group")]
    return f"; {', '.join(later)} made after set-up, in no group map of the dumps" if later else ""


_SAYS = {
    "asleep": "sleeps in Python",
    "gil": "is in a C call that holds the GIL (no dump: its watcher cannot run)",
    "dead": "died (os._exit, no dump)",
    "writing": "writes its shard",
    "computing": "computes in a Python loop",
}


def truth_of(recipe: dict[str, Any]) -> Truth:
    """What the world of ``recipe`` was: the kinds a right report gives, and the ranks it names."""
    incident = recipe["incident"]
    kind = incident["kind"]
    if kind in _STUCK:
        culprit, part, op = incident["culprit"], incident["part"], incident["op"]
        seq = _seq(recipe, incident["family"])
        waiters = [r for r in part if r != culprit]
        root = f" (from rank {culprit})" if op == "broadcast" else ""
        later = _unmapped(recipe, [incident["family"]])
        why = (
            f"rank {culprit} {_SAYS[incident['variant']]} in its {incident['block']!r} block, out of {op}{root} #{seq} "
            f"on {incident['family']} group {part}, in which ranks {waiters} wait{later}"
        )
        return Truth(frozenset({kind}), (culprit,), op, seq, tuple(part), why)
    if kind == "circular":
        members = sorted({r for part in incident["parts"].values() for r in part})
        chain = ", ".join(f"ranks {b} call {incident['op']} on c{i} first" for i, b in enumerate(incident["blocks"]))
        later = _unmapped(recipe, list(incident["parts"]))
        why = f"a circle of {incident['groups']} groups {incident['parts']}: {chain}; each waits on the next{later}"
        return Truth(frozenset({"circular_wait"}), tuple(members), incident["op"], None, None, why)
    culprit, waiter = incident["culprit"], incident["waiter"]
    what = "a batch_isend_irecv's irecv" if incident["variant"] == "batched" else "a recv"
    others = [r for r in range(recipe["world"]) if r not in (culprit, waiter)]
    why = (
        f"rank {waiter} waits in {what} from rank {culprit}, which never sends (asleep), and ranks {others} wait in an "
        f"all_reduce on the default group that neither reaches. Gloo records no send, recv or batch_isend_irecv, and "
        f"its recv never times out: the dumps show both ranks out of the all_reduce, and only the stacks tell them "
        f"apart (rank {waiter} in recv, rank {culprit} asleep). Right: rank {culprit} alone, as the rank that never "
        f"came or that did not send; naming rank {waiter} blames a rank that waited on it"
    )
    return Truth(frozenset({"never_came", "p2p_stall"}), (culprit,), "send", None, tuple(incident["part"]), why)


# --- running a world ------------------------------------------------------------------------------------------------


def _ends(recipe: dict[str, Any]) -> dict[int, int]:
    """``{rank: exit code}`` of the ranks that end in the incident and never meet: a dead culprit (17), one in a C
    call (``SIGALRM``), a p2p receiver (``SIGKILL``: Gloo's recv never times out)."""
    incident = recipe["incident"]
    if incident["kind"] == "p2p":
        return {incident["waiter"]: -signal.SIGKILL}
    codes = {"dead": 17, "gil": -signal.SIGALRM}
    return {incident["culprit"]: codes[incident["variant"]]} if incident.get("variant") in codes else {}


def _dumpless(recipe: dict[str, Any]) -> set[int]:
    """The ranks that leave no dump: a dead culprit, and one whose dump watcher cannot run (a C call holding the
    GIL)."""
    incident = recipe["incident"]
    return {incident["culprit"]} if incident.get("variant") in ("dead", "gil") else set()


def _expected_roles(recipe: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """``{rank: (role, outcome)}`` each rank that meets must report for the world to have run as drawn."""
    incident, world = recipe["incident"], recipe["world"]
    roles = {r: ("idle", "") for r in range(world)}
    if incident["kind"] == "circular":
        roles.update({int(r): ("member", "raised") for r in incident["order"]})
        return roles
    if incident["kind"] == "p2p":
        roles.update({r: ("other", "raised") for r in range(world)})
        roles[incident["culprit"]] = ("culprit", "released")
        return roles
    for part in recipe["families"][incident["family"]]["parts"]:
        if part == incident["part"]:
            roles.update({r: ("waiter", "raised") for r in part})
        elif incident["others_too"]:
            roles.update({r: ("other part", "completed") for r in part})
    roles[incident["culprit"]] = ("culprit", "released")
    return roles


def _check_rank(recipe: dict[str, Any], result: RankResult, role: tuple[str, str]) -> str | None:
    """What rank ``result.rank`` did otherwise than drawn, or None."""
    rank, ends = result.rank, _ends(recipe)
    if rank in ends:
        code = result.returncode
        return None if code == ends[rank] else f"rank {rank} ended with {code}, not {ends[rank]}"
    out = result.result
    if not isinstance(out, dict):
        return f"rank {rank}: {(result.error or result.output or 'no result').strip()[-300:]}"
    members = {f: sorted(next(p for p in fam["parts"] if rank in p)) for f, fam in recipe["families"].items()
               if any(rank in p for p in fam["parts"])}  # fmt: skip
    if out.get("members") != members:
        return f"rank {rank}: groups {out.get('members')}, drawn {members}"
    if not out.get("synced") or out.get("timeouts_s") != [STEADY_S]:
        return f"rank {rank}: synced {out.get('synced')}, timeouts {out.get('timeouts_s')} s"
    found = out.get("incident") or {}
    if (found.get("role"), found.get("outcome", "")) != role:
        return f"rank {rank}: {found}, drawn {role}"
    if role[0] == "culprit" and found.get("bounded"):
        return f"rank {rank}: left its block without its samples ({found})"
    return None


def _check(recipe: dict[str, Any], results: list[RankResult], dumps: Path) -> str | None:
    """What the world did otherwise than drawn (the first thing), or None."""
    roles = _expected_roles(recipe)
    for result in results:
        problem = _check_rank(recipe, result, roles[result.rank])
        if problem:
            return problem
    dumpless = _dumpless(recipe)
    missing = [r for r in range(recipe["world"]) if r not in dumpless and not (dumps / f"{DUMP_FILE_NAME}{r}").exists()]
    if missing:
        return f"no dump from ranks {missing}"
    for rank in [r for r in _ends(recipe) if recipe["incident"]["variant"] != "dead"]:
        stack = stack_path(dumps, rank)  # a rank ended in the incident (but a dead one) wrote its stack first
        if "Timeout (" not in (stack.read_text(errors="replace") if stack.exists() else ""):
            return f"rank {rank} ended without its stack"
    return None


def _ran(results: list[RankResult], wall_s: float) -> dict[str, Any]:
    """What each rank did, for the scenario's recipe (a wrong score is read with it)."""
    ranks = {}
    for r in results:
        found = r.result.get("incident") if isinstance(r.result, dict) else {"exit": r.returncode}
        ranks[str(r.rank)] = found
    return {"wall_s": round(wall_s, 2), "ranks": ranks}


def _run_once(recipe: dict[str, Any], directory: Path) -> tuple[str | None, dict[str, Any]]:
    shutil.rmtree(directory, ignore_errors=True)
    dumps, work = directory / "dumps", directory / "work"
    dumps.mkdir(parents=True)
    work.mkdir()
    survivors = recipe["world"] - len(_ends(recipe))
    killed = int(recipe["incident"]["kind"] == "p2p")  # the receiver ends itself (SIGKILL)
    params = {"recipe": recipe, "dump_dir": str(dumps), "work_dir": str(work), "survivors": survivors, "killed": killed}
    start = time.monotonic()
    results = spawn_ranks(
        _TARGET, params, world_size=recipe["world"], timeout_s=WORLD_BOUND_S, env=_CPU_ONLY, check=False
    )
    ran = _ran(results, time.monotonic() - start)
    shutil.rmtree(work, ignore_errors=True)  # the shard: not the report's to read
    if any(r.timed_out for r in results):
        return f"killed at {WORLD_BOUND_S:g} s", ran
    return _check(recipe, results, dumps), ran


def draw(seed: int, root: Path) -> Scenario:
    """Run the world of ``seed`` in ``root / "gloo-<seed>"`` and return it with its truth; :class:`WorldFailed` where
    it did not run as drawn on :data:`TRIES` tries."""
    recipe = draw_recipe(seed)
    directory = Path(root) / f"gloo-{seed}"
    reasons = []
    for _ in range(TRIES):
        problem, ran = _run_once(recipe, directory)
        if problem is None:
            incident = recipe["incident"]
            variant = incident.get("variant", f"{incident.get('groups')}groups")
            name = f"gloo-{seed}-{incident['kind']}-{variant}-w{recipe['world']}"
            recipe_ran = {**recipe, "ran": ran, "tries": len(reasons) + 1, "retried_because": reasons}
            return Scenario(name, "gloo", seed, recipe["world"], directory / "dumps", truth_of(recipe), recipe_ran)
        reasons.append(problem)
    raise WorldFailed(seed, reasons)
