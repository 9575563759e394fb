"""What a drawn hang scenario really was: the typed seam between the drawers and the scorer.

A drawer writes one folder of dumps and returns a :class:`Scenario`. It knows the truth because it made the incident:
which kind of failure, and which ranks a right report names. The scorer reads only the command's ``--json`` output,
so a scenario is judged as a user would judge the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["FAMILIES", "SCORES", "Family", "Scenario", "Score", "Truth"]

#: ``gloo``: real Gloo ranks in real processes wrote the dumps; ``nccl``: NCCL-format dumps built from the recording
#: rules of ``docs/recorder-semantics.md``.
Family = Literal["gloo", "nccl"]
FAMILIES: tuple[Family, ...] = ("gloo", "nccl")
#: ``right``: the kind is one of the truth's and the ranks named are the truth's; ``honest``: exit 1 and a kind that
#: says it cannot tell (``cannot_tell``, ``unclear``), naming what is missing; ``wrong``: anything else (exit 0, exit 2
#: on a readable run, a wrong kind, a wrong culprit).
Score = Literal["right", "honest", "wrong"]
SCORES: tuple[Score, ...] = ("right", "honest", "wrong")


@dataclass(frozen=True)
class Truth:
    """The incident as the drawer made it.

    ``kinds`` are the report's kind names (``Kind.name``, e.g. ``did_not_finish``, ``never_came``, ``circular_wait``,
    ``p2p_stall``, ``still_working``) that are right for it: more than one only where the dumps cannot separate them
    by torch's own recording rules, each such case said in ``why``. ``ranks`` are the ranks a right report blames (the
    cycle's members for a circular wait; empty where no rank is blamed). ``op``, ``seq`` and ``group_ranks`` say where
    the incident is, for the reader of a wrong score.
    """

    kinds: frozenset[str]
    ranks: tuple[int, ...]
    op: str | None = None
    seq: int | None = None
    group_ranks: tuple[int, ...] | None = None
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kinds": sorted(self.kinds),
            "ranks": list(self.ranks),
            "op": self.op,
            "seq": self.seq,
            "group_ranks": None if self.group_ranks is None else list(self.group_ranks),
            "why": self.why,
        }


@dataclass(frozen=True)
class Scenario:
    """One drawn world: its folder of dumps, its truth, and what was drawn (``recipe``) so a wrong score is replayed."""

    name: str
    family: Family
    seed: int
    world_size: int
    directory: Path
    truth: Truth
    recipe: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "seed": self.seed,
            "world_size": self.world_size,
            "directory": str(self.directory),
            "truth": self.truth.to_json(),
            "recipe": self.recipe,
        }
