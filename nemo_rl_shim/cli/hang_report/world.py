"""Which ranks the run had: from the dumps' own records, checked against the file names.

A file name is the least trusted number of all: ``nccl_trace_rank_999999999`` beside ``nccl_trace_rank_0``
must not make a world of a billion ranks (that took 21.5 GB before it was killed). The world is the
default group as a record lists it, rank by rank: torch's ``pg_config`` (``default_pg``), the shim's group
map in the dump or in its sidecar. A list costs its length in the file, so the memory spent on the world is
bounded by the data. The shim's ``world_size`` must agree with it, every file name's rank and every group's
member must fall inside it; anything else is a :class:`DumpError` naming the file.

Where no record lists the world (torch's own Gloo dumps: their ``pg_config`` keeps one group under ``''``), the
highest file rank stands in for it, missing top ranks cannot be seen (:attr:`World.recorded` is false), and a
file rank that would make more ranks missing than :func:`unrecorded_limit` allows is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nemo_rl_shim.cli.hang_report.records import DumpError, RankDump
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["World", "unrecorded_limit", "world_of"]

#: Where no record lists the world, at most this many ranks (or as many as there are dumps) may be missing.
UNRECORDED_MISSING = 4096


@dataclass(frozen=True)
class World:
    """The run's ranks: ``0 .. size - 1``; ``source`` says which record gave it."""

    size: int
    source: str
    recorded: bool  # listed by a record (else guessed from the file names: missing top ranks cannot be seen)


def unrecorded_limit(dumps: int) -> int:
    """How many ranks may be missing where no record lists the world."""
    return max(dumps, UNRECORDED_MISSING)


def _listed(dumps: Mapping[int, RankDump]) -> World | None:
    found: RankDump | None = None
    for dump in dumps.values():
        ranks = dump.default_ranks
        if ranks is None or not len(ranks):
            continue
        if min(ranks) != 0 or max(ranks) != len(ranks) - 1:  # distinct, so 0 .. n-1 exactly
            listed = format_ranks(ranks)
            raise DumpError(f"{dump.path}: its default group lists ranks {listed}, not 0 to {len(ranks) - 1}")
        if found is not None and len(ranks) != len(found.default_ranks or ()):
            raise DumpError(
                f"the dumps disagree on the world: {found.path} lists {len(found.default_ranks or ())} ranks in the "
                f"default group, {dump.path} lists {len(ranks)}"
            )
        found = found or dump
    if found is None:
        return None
    return World(len(found.default_ranks or ()), f"the default group listed in {found.path.name}", recorded=True)


def _guessed(dumps: Mapping[int, RankDump]) -> World:
    top = max(dumps, default=-1)
    claimed = max((d.world_size or 0 for d in dumps.values()), default=0)
    size = max(top + 1, claimed)
    if size - len(dumps) > unrecorded_limit(len(dumps)):
        culprit = dumps[top].path if top + 1 >= claimed else next(d.path for d in dumps.values() if d.world_size)
        raise DumpError(
            f"{culprit}: no dump lists the world (no default group in pg_config or a group map), and a world of "
            f"{size} ranks would leave {size - len(dumps)} of them without a dump; keep one run per folder"
        )
    if claimed:
        return World(size, "the world_size the dumps state (no record lists its ranks)", recorded=False)
    return World(size, "the highest rank among the file names (no record lists the world)", recorded=False)


def world_of(dumps: Mapping[int, RankDump]) -> World:
    """The world, from the records, checked against every file name, ``world_size`` and group member."""
    world = _listed(dumps) or _guessed(dumps)
    for dump in dumps.values():
        if dump.rank >= world.size:
            outside = f"rank {dump.rank} is outside the world of {world.size} ranks"
            raise DumpError(f"{dump.path}: {outside} ({world.source})")
        if world.recorded and dump.world_size is not None and dump.world_size != world.size:
            raise DumpError(f"{dump.path}: world_size {dump.world_size} where {world.source} has {world.size} ranks")
        for name, facts in dump.groups.items():
            ranks = facts["ranks"]
            if len(ranks) and max(ranks) >= world.size:
                raise DumpError(
                    f"{dump.path}: group {name[:40]!r} lists rank {max(ranks)}, outside the world of {world.size} "
                    f"ranks ({world.source})"
                )
    return world
