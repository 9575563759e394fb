"""A group is its rank set: where one name labels several rank sets across a run's dumps, each is its own group.

A process group's name is a label, not an identity. Older ``split_group`` gave every color's group the same
counter name (rank 0's ``{0, 1}`` and rank 2's ``{2, 3}`` both ``"5"``: each process knows only its own group);
torch 2.11 and later hash the ranks into the name. ``group_desc`` (``mesh_tp``) is shared by every TP group, and is
never an identity here. Two dumps that give one name to two *disjoint* rank sets name two groups of one run: the
report keys each by its name and its members (:func:`distinguish_groups`), and names it ``5 (ranks 2-3)``. Two sets
that share a rank cannot be one run's (:mod:`.run_split` keeps them apart; the analysis refuses them if they meet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from nemo_rl_shim.hang_report.records import Entry, GroupKey, RankDump
from nemo_rl_shim.one_line.rank_ranges import format_ranks

__all__ = ["distinguish_groups", "shared_names"]


def shared_names(dumps: Mapping[int, RankDump]) -> dict[tuple[str, Sequence[int]], str]:
    """``{(name, members): the name the report gives it}`` for every name a record gives to several rank sets."""
    sets: dict[str, list[Sequence[int]]] = {}
    for dump in dumps.values():
        for name, facts in dump.groups.items():
            if facts.stated and facts.ranks not in sets.setdefault(name, []):
                sets[name].append(facts.ranks)
    return {
        (name, ranks): f"{name} (ranks {format_ranks(ranks)})"
        for name, found in sets.items()
        if len(found) > 1
        for ranks in found
    }


def _key(key: GroupKey, names: Mapping[str, str]) -> GroupKey:
    return (names.get(key[0], key[0]), key[1])


def _renamed(dump: RankDump, names: Mapping[str, str]) -> RankDump:
    """``dump`` with its groups renamed (``names``: old -> new); its entries are renamed in place."""
    entries: list[Entry | None] = [*dump.last.values(), *dump.pending_p2p, *dump.p2p_last.values(), dump.latest]
    for entry in entries:
        if entry is not None and entry.group in names:
            entry.group = names[entry.group]
    return dataclasses.replace(
        dump,
        groups={names.get(name, name): facts for name, facts in dump.groups.items()},
        last={_key(key, names): entry for key, entry in dump.last.items()},
        signatures={_key(key, names): value for key, value in dump.signatures.items()},
        p2p_last={(_key(key, names), op, peer): e for (key, op, peer), e in dump.p2p_last.items()},
        p2p_count={(_key(key, names), op, peer): n for (key, op, peer), n in dump.p2p_count.items()},
        calls={_key(key, names): calls for key, calls in dump.calls.items()},
        gaps={_key(key, names): gaps for key, gaps in dump.gaps.items()},
        spans={_key(key, names): span for key, span in dump.spans.items()},
    )


def distinguish_groups(dumps: Mapping[int, RankDump]) -> dict[int, RankDump]:
    """The dumps, each group that shares its name with another rank set renamed ``name (ranks ...)`` (see the module
    docstring); a dump with no such group is returned as it is."""
    shared = shared_names(dumps)
    if not shared:
        return dict(dumps)
    out = {}
    for rank, dump in dumps.items():
        names = {
            name: shared[(name, facts.ranks)]
            for name, facts in dump.groups.items()
            if facts.stated and (name, facts.ranks) in shared
        }
        out[rank] = _renamed(dump, names) if names else dump
    return out
