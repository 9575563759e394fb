"""Which ranks a process group has, as a record lists them: torch's ``pg_config``, the shim's group map (in a dump, or
in the sidecar the recorder writes at set-up), each read as untrusted input.

A group's members come only from such records (:class:`~.records.GroupFacts` with ``stated``), never from which
files are present. torch lists a group's ranks as text (``"[0, 1, 2]"``) in ``pg_config``; the shim lists them as a
JSON list. Either is checked rank by rank: distinct ints from 0 to :data:`~.bounds.MAX_WORLD` - 1, kept as a
``range`` where they step evenly (a mesh axis's group: compared at once), else as a tuple, in group-rank order.
Every list walked is charged to the dump's :class:`~.bounds.Budget` where one is given (a pickle can share one list
among many groups; a JSON sidecar cannot).
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.bounds import MAX_WORLD, Budget, is_count, is_text
from nemo_rl_shim.hang_report.records import DumpError, GroupFacts
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import clean, shown, shown_path
from nemo_rl_shim.one_line.rank_ranges import format_ranks
from nemo_rl_shim.untrusted.files import UntrustedFileError, read_untrusted

__all__ = [
    "SIDECAR_CAP",
    "compact_ranks",
    "default_ranks",
    "group_name",
    "groups_from_map",
    "groups_from_pg_config",
    "read_sidecar",
    "shim_problem",
]

#: A group map is at most this large (a 65,536-rank world's map, every group listed, is a few MiB).
SIDECAR_CAP = 16 << 20


def group_name(name: str) -> str:
    """A group's name as the report keeps and prints it (one line, bounded): the same for every record."""
    return clean(name, limit=120)


def compact_ranks(ranks: Iterable[int]) -> range | tuple[int, ...]:
    """``ranks`` as a ``range`` where they step evenly, else as a tuple; order kept (torch lists a group's ranks in
    group-rank order)."""
    ranks = tuple(ranks)
    if len(ranks) > 1 and (step := ranks[1] - ranks[0]) > 0:
        candidate = range(ranks[0], ranks[-1] + 1, step)
        if len(candidate) == len(ranks) and tuple(candidate) == ranks:
            return candidate
    return ranks


def _checked_ranks(ranks: Any) -> range | tuple[int, ...] | None:
    if not isinstance(ranks, list | tuple) or not all(is_count(r) and r < MAX_WORLD for r in ranks):
        return None
    return compact_ranks(ranks) if len(set(ranks)) == len(ranks) else None


@functools.lru_cache(maxsize=4096)
def _ranks_of_text(text: str) -> range | tuple[int, ...] | None:
    """torch writes a group's ranks as ``"[0, 1, 2]"``: JSON, read in C, then checked; cached, since every rank's
    dump lists the same groups (the default group's thousand ranks in each)."""
    try:
        ranks = json.loads(text)
    except Exception:
        try:
            ranks = ast.literal_eval(text)  # literals only: no code runs (a tuple's text, "(0, 1)")
        except Exception:  # not a literal, nested too deep, an int of too many digits
            return None
    return _checked_ranks(ranks)


def _rank_list(value: Any, where: str, budget: Budget | None) -> range | tuple[int, ...]:
    """Checked ranks: a list (or torch's text of one) of distinct ints from 0 to MAX_WORLD - 1."""
    if budget is not None:
        budget.spend(len(value) if isinstance(value, str | list | tuple) else 1, where)
    ranks = _ranks_of_text(value) if isinstance(value, str) else _checked_ranks(value)
    if ranks is None:
        raise DumpError(f"{where} is {shown(value)}, not a list of distinct ranks from 0 to {MAX_WORLD - 1:,}")
    return ranks


def groups_from_map(groups: Any, where: str, budget: Budget | None = None) -> dict[str, GroupFacts]:
    """The shim's group map (``{name: {"axes", "ranks", "desc"}}``), checked; every group's members stated."""
    if not isinstance(groups, dict):
        raise DumpError(f"{where} is {shown(groups)}, not a group map")
    found = {}
    for name, facts in groups.items():
        key = f"{where}[{shown(name, typed=False)}]"
        if not is_text(name) or not isinstance(facts, dict):
            raise DumpError(f"{key} is {shown(facts)}, not a group's facts (named by text)")
        axes = facts.get("axes") or []
        if budget is not None:
            budget.spend(1 + (len(axes) if isinstance(axes, list) else 0), key)
        if not isinstance(axes, list) or not all(is_text(a) for a in axes):
            raise DumpError(f"{key}.axes is {shown(axes)}, not a list of axis names")
        desc = facts.get("desc") or ""
        if not is_text(desc):
            raise DumpError(f"{key}.desc is {shown(desc)}, not text")
        ranks = _rank_list(facts.get("ranks") or [], f"{key}.ranks", budget)
        axes_kept = tuple(dict.fromkeys(clean(a, limit=40) for a in axes[:16]))
        found[group_name(name)] = GroupFacts(ranks, stated=bool(ranks), axes=axes_kept, desc=clean(desc))
    return found


def groups_from_pg_config(
    pg_config: Mapping[Any, Any],
    rank: int,
    path: Path,
    budget: Budget,
    without: dict[str, GroupFacts] | None = None,
) -> dict[str, GroupFacts]:
    """torch's ``pg_config``, where a group is named and this rank is among its ranks (Gloo's ``''`` never is); a
    default group (``default_pg``) without this rank is refused: the dump places its own rank outside its world.
    ``without``: filled with the groups it lists without this rank (a rank's own entries may not name them)."""
    groups = {}
    for name, facts in pg_config.items():
        budget.spend(1, f"{shown_path(path)}: pg_config")
        if not name or not isinstance(name, str):
            continue
        if not is_text(name):
            raise DumpError(f"{shown_path(path)}: pg_config has {shown(name)}, not a group's name as text")
        key = f"{shown_path(path)}: pg_config[{shown(name, typed=False)}]"
        if not isinstance(facts, dict):
            raise DumpError(f"{key} is {shown(facts)}, not a group's config")
        desc = facts.get("desc", "")
        if not is_text(desc):
            raise DumpError(f"{key}.desc is {shown(desc)}, not text")
        ranks = _rank_list(facts.get("ranks", "[]"), f"{key}.ranks", budget)
        if len(ranks) > 64:  # membership in a long tuple costs its length: charged
            budget.spend(len(ranks), f"{key}.ranks")
        if rank in ranks:
            groups[group_name(name)] = GroupFacts(ranks, stated=True, desc=clean(desc))
        elif without is not None:
            without[group_name(name)] = GroupFacts(ranks, stated=True, desc=clean(desc))
        if rank not in ranks and desc == "default_pg" and ranks:  # the default group is the world: every rank is in it
            raise DumpError(
                f"{shown_path(path)}: rank {rank} is outside the world of {len(ranks):,} ranks (the default group its "
                f"own pg_config lists, ranks {format_ranks(ranks)})"
            )
    return groups


def default_ranks(groups: Mapping[str, GroupFacts]) -> range | tuple[int, ...] | None:
    """The default group's members, where a record lists them (torch's ``default_pg``, the shim's ``default``)."""
    for facts in groups.values():
        if facts.stated and (facts.desc == "default_pg" or "default" in facts.axes):
            return tuple(facts.ranks) if not isinstance(facts.ranks, range) else facts.ranks
    return None


def shim_problem(shim: Mapping[str, Any]) -> str | None:
    """What is wrong with the shim's own keys (in a dump's ``nemo_rl_shim``, or a sidecar), or None."""
    size = shim.get("world_size")
    if size is not None and not (type(size) is int and 0 < size <= MAX_WORLD):
        return f"'nemo_rl_shim.world_size' is {shown(size)}, not a world of 1 to {MAX_WORLD:,} ranks"
    rank = shim.get("rank")
    if rank is not None and not (type(rank) is int and 0 <= rank < MAX_WORLD):
        return f"'nemo_rl_shim.rank' is {shown(rank)}, not a rank"
    for key in ("reason", "writer"):
        if shim.get(key) is not None and not is_text(shim[key]):
            return f"'nemo_rl_shim.{key}' is {shown(shim[key])}, not text"
    for key in ("dump_time_ns", "set_up_ns"):
        if shim.get(key) is not None and not is_count(shim[key]):
            return f"'nemo_rl_shim.{key}' is {shown(shim[key])}, not a time in ns"
    for key in ("groups", "recorders"):
        if shim.get(key) is not None and not isinstance(shim[key], dict):
            return f"'nemo_rl_shim.{key}' is {shown(shim[key])}, not a dict"
    return None


def read_sidecar(path: Path, root: Path | None = None) -> dict[str, Any]:
    """A group map the shim writes beside each dump (JSON, at most :data:`SIDECAR_CAP` bytes, a regular file inside
    ``root``): ``{"rank", "world_size", "groups": {name: GroupFacts}}``; :class:`DumpError` naming the file."""
    try:
        text = read_untrusted(path, cap=SIDECAR_CAP, what="group map", root=root).decode("utf-8")
        data = json.loads(text)
    except UntrustedFileError as e:
        raise DumpError(str(e)) from None
    except Exception as e:  # not UTF-8, not JSON, nested too deep, an int of too many digits
        raise DumpError(f"{shown_path(path)} is not a readable group map: {first_line(e)}") from None
    problem = shim_problem(data) if isinstance(data, dict) else f"a group map is a JSON object, this is {shown(data)}"
    if problem:
        raise DumpError(f"{shown_path(path)} is not a group map: {problem.replace('nemo_rl_shim.', '')}")
    groups = groups_from_map(data.get("groups") or {}, f"{shown_path(path)}: groups")
    return {"rank": data.get("rank"), "world_size": data.get("world_size"), "groups": groups, "path": path}
