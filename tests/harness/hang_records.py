"""Typed records built by hand for the hang report's rule tests: an entry, a rank's dump, a group, a finding.

The rule tests (``tests/hang_report/test_*_rules.py``) call one module's functions with inputs built for the
rule they pin, not with dumps written and read back: each builder fills only what the rule reads, with defaults that
say "an NCCL recorder that marks completion, an op still in flight".
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nemo_rl_shim.hang_report.analysis import Finding, GroupState
from nemo_rl_shim.hang_report.records import Entry, RankDump, Recorder

__all__ = ["GLOO", "NCCL", "dump", "entry", "group", "p2p", "stall"]

#: A recorder that marks an op completed once it finished (NCCL's); one that never does (Gloo's).
NCCL = Recorder(wrapped=False, oldest_ns=0, tracks_completion=True)
GLOO = Recorder(wrapped=False, oldest_ns=0, tracks_completion=False)


def entry(group: str = "1", seq: int = 1, op: str = "all_reduce", state: str = "scheduled", lib: str = "nccl",
          **more) -> Entry:  # fmt: skip
    """One op of one rank: unfinished (``scheduled``) unless ``state`` says ``completed``."""
    fields = {"sizes": "[[4]]", "created_ns": 1_000, "completed_ns": None, "timeout_ms": 600_000, "pg_id": group}
    return Entry(group=group, seq=seq, op=op, state=state, lib=lib, **{**fields, **more})


def dump(rank: int, latest: Entry | None = None, recorder: Recorder = NCCL, lib: str = "nccl", **more) -> RankDump:
    """One rank's dump: its newest entry (what it was in when it dumped) and its recorder's facts."""
    fields = {
        "path": Path(f"/dumps/nccl_trace_rank_{rank}"), "version": "2.10", "n_entries": 1, "groups": {}, "last": {},
        "signatures": {}, "sig_table": [], "pending_p2p": [], "p2p_last": {}, "p2p_count": {},
    }  # fmt: skip
    return RankDump(rank=rank, latest=latest, recorders={lib: recorder}, **{**fields, **more})


def group(name: str, ranks: Iterable[int], backend: str = "nccl", entries: dict[int, Entry] | None = None,
          axes: Iterable[str] = (), **more) -> GroupState:  # fmt: skip
    """A process group whose members a record states, numbered by ``backend``'s recorder."""
    return GroupState(name, tuple(ranks), list(axes), backend=backend, entries=dict(entries or {}), **more)


def stall(state: GroupState, behind: Iterable[int], waiting: Iterable[int], seq: int = 1, op: str = "all_reduce",
          created_ns: int = 1_000) -> Finding:  # fmt: skip
    """``behind`` did not enter ``op`` #``seq`` of the group, in which ``waiting`` wait."""
    return Finding("stall", state, list(behind), seq, op, list(waiting), None, created_ns)


def p2p(state: GroupState, culprit: int, waiting: Iterable[int], op: str = "send", seq: int = 1,
        created_ns: int = 1_000) -> Finding:  # fmt: skip
    """``culprit`` did not post its ``op`` (``send``: the waiting ranks wait in a recv from it)."""
    return Finding("p2p", state, [culprit], seq, op, list(waiting), None, created_ns, f"did not {op}")
