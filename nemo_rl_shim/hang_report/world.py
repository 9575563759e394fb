"""Which ranks the run had: only from records that state them, never from which files are present.

The world is stated by:

* a record listing the default group rank by rank: torch's ``pg_config`` (``default_pg``, which NCCL's dumps hold),
  the shim's group map in a dump or in the sidecar the recorder writes at set-up (``default``);
* the shim's ``world_size`` (in its dumps and sidecars);
* the user: ``hang-report --world N`` (preflight passes the world it ran).

Every statement must agree with every other, and every file name's rank and every group member must fall inside;
anything else is a :class:`DumpError` naming the file. A rank of the world without a dump is then named.

Where nothing states the world (torch's own Gloo dumps: their ``pg_config`` keeps one group under ``''``, with the
wrong ranks), the world is not known (:attr:`World.known` is false): the ranks up to the highest file rank stand in
for it, so that a gap among them is named, but ranks above it may be missing too, and the report says so and how
to give the world (exit 1). A file rank that would leave more ranks missing than :func:`unrecorded_limit` allows
is refused: a file name is the least trusted number of all (``nccl_trace_rank_999999999`` beside
``nccl_trace_rank_0`` must not make a world of a billion ranks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.hang_report.bounds import MAX_WORLD
from nemo_rl_shim.hang_report.records import DumpError, RankDump
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["GIVE_THE_WORLD", "World", "stated_world", "unrecorded_limit", "world_of"]

#: Where no record lists the world, at most this many ranks (or as many as there are dumps) may be missing.
UNRECORDED_MISSING = 4096
#: How a user gives the world where no record states it.
GIVE_THE_WORLD = "give the world with --world N"


@dataclass(frozen=True)
class World:
    """The run's ranks: ``0 .. size - 1``. ``known``: a record (or the user) states it, and ``source`` says which;
    else ``size`` is only the highest file rank + 1, and ranks above it may be missing too."""

    size: int
    source: str
    known: bool


def unrecorded_limit(dumps: int) -> int:
    """How many ranks may be missing where no record lists the world."""
    return max(dumps, UNRECORDED_MISSING)


def _bounds(ranks: Sequence[int]) -> tuple[int, int]:
    """The lowest and the highest rank: a ``range`` (a mesh axis's group, the default group) at once, not by walking
    it (thousands of dumps list the default group's thousands of ranks)."""
    if isinstance(ranks, range) and ranks.step > 0:
        return ranks.start, ranks[-1]
    return min(ranks), max(ranks)


def _statements(dump: RankDump) -> Iterable[tuple[int, str]]:
    listed = dump.default_ranks
    if listed is not None and len(listed):
        if _bounds(listed) != (0, len(listed) - 1):  # distinct, so 0 .. n-1 exactly
            raise DumpError(
                f"{shown_path(dump.path)}: its default group lists ranks {format_ranks(listed)}, not 0 to "
                f"{len(listed) - 1}"
            )
        yield len(listed), f"the default group listed in {shown_path(dump.path)}"
    if dump.world_size is not None:  # from the dump, or from its group map: the file it came from is named
        yield dump.world_size, f"the world_size in {shown_path(dump.world_size_from or dump.path)}"


def _sidecar_statements(rank: int, sidecar: Mapping[str, Any]) -> Iterable[tuple[int, str]]:
    name = shown_path(sidecar["path"]) if sidecar.get("path") is not None else f"rank {rank}'s group map"
    for facts in (sidecar.get("groups") or {}).values():
        if facts.stated and (facts.desc == "default_pg" or "default" in facts.axes):
            yield len(facts.ranks), f"the default group listed in {name}"
            break
    if sidecar.get("world_size") is not None:
        yield sidecar["world_size"], f"the world_size in {name}"


def stated_world(
    dumps: Mapping[int, RankDump] = {},
    sidecars: Mapping[int, Mapping[str, Any]] = {},
    given: int | None = None,
) -> World | None:
    """The world every statement agrees on (see the module docstring), or None where nothing states it;
    :class:`DumpError` naming two statements that disagree."""
    found: tuple[int, str] | None = None
    statements: list[Iterable[tuple[int, str]]] = [[(given, "--world")]] if given is not None else []
    statements += [_sidecar_statements(rank, side) for rank, side in sorted(sidecars.items())]
    statements += [_statements(dump) for _, dump in sorted(dumps.items())]
    for each in statements:
        for size, source in each:
            if not 0 < size <= MAX_WORLD:
                raise DumpError(f"{source} states a world of {size:,} ranks: the report reads 1 to {MAX_WORLD:,}")
            if found is None:
                found = (size, source)
            elif size != found[0]:
                raise DumpError(f"the world disagrees: {found[1]} says {found[0]:,} ranks, {source} says {size:,}")
    return World(found[0], found[1], known=True) if found else None


def check_ranks(world: World, ranks: Iterable[int], path_of: Mapping[int, Any]) -> None:
    """Every file rank inside a known world; :class:`DumpError` naming the first file outside it."""
    if not world.known:
        return
    outside = [r for r in ranks if r >= world.size]
    if outside:
        rank = min(outside)
        more = f" (and {len(outside) - 1:,} more files)" if len(outside) > 1 else ""
        raise DumpError(
            f"{shown_path(path_of[rank])}: rank {rank} is outside the world of {world.size} ranks ({world.source})"
            f"{more}"
        )


def _guessed(dumps: Mapping[int, RankDump]) -> World:
    top = max(dumps, default=-1)
    size = top + 1
    if size - len(dumps) > unrecorded_limit(len(dumps)):
        raise DumpError(
            f"{shown_path(dumps[top].path)}: no record states the world (no default group in pg_config or a group "
            f"map, no world_size), and rank {top} would leave {size - len(dumps):,} ranks without a dump; keep one "
            f"run per folder, or {GIVE_THE_WORLD}"
        )
    return World(size, "the highest rank among the file names: no record states the world", known=False)


def world_of(dumps: Mapping[int, RankDump], given: int | None = None) -> World:
    """The world, from the records (and ``given``, the user's ``--world``), checked against every file name and
    group member."""
    world = stated_world(dumps, given=given) or _guessed(dumps)
    check_ranks(world, dumps, {rank: dump.path for rank, dump in dumps.items()})
    for dump in dumps.values():
        for name, facts in dump.groups.items():
            if facts.stated and len(facts.ranks) and _bounds(facts.ranks)[1] >= world.size:
                raise DumpError(
                    f"{shown_path(dump.path)}: group {name!r} lists rank {max(facts.ranks)}, outside the world of "
                    f"{world.size} ranks ({world.source})"
                )
    return world
