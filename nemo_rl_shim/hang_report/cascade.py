"""A cascade followed to its root: ranks that wait on ranks that are themselves held in another op.

A hang spreads. Once the ranks of one group are stuck (one never came, one did not finish, none finished), their
peers in every other group reach the next collective they share with them and wait there: FSDP2's next
reduce-scatter on the dp group waits on the tp group that hangs. The analysis finds both: a stall on the dp group
that names the stuck rank as "did not enter", and the incident on its own group. The rank named in the dp stall did
not fail to come: it is held in the incident's op (each rank issues its collectives in program order, so a rank
blocked in one does not reach the next).

**The rule** (:func:`root_of`). Start at the finding to act on. While it is a wait (a stall or a point-to-point
finding), and *every* rank it names is held in another finding, move to the finding that holds them (the first, in
the analysis's order, where they are held in several); stop at a finding whose ranks are not all held, or that was
seen already (a circle is :mod:`.cycles`'s, looked for before). A rank is held in a finding where:

* it entered that finding's op and did not finish it (a ``not finished`` finding names it: it did not finish what
  its peers finished, every member entered and none finished, or both sides of a send posted and neither finished),
  and stopped there: no op of its created later finished (one that did says the rank went on past it);
* or it waits in that finding's op and is still blocked in it (a stall, a missing dump or a point-to-point finding
  lists it among its waiting ranks; for a collective, :func:`.cycles.blocked_in`: its newest op, or unfinished on a
  recorder that marks completion);
* or it entered a collective that no member is known to have finished (``unconfirmed``), that op is its newest, and
  its NCCL recorder's ``pg_status`` does not count it as ended (``last_completed_collective`` below its number:
  ``docs/recorder-semantics.md`` L-PG-STATUS, H-PG-STATUS). The root is then what cannot be told, never a rank
  guessed. Where the dump has no status for the group, or the recorder is Gloo's (:data:`_STATUS_OF_NCCL`), the rank
  is not held (the walk stops, as before);
* or it waits in an op whose finding is ``unclear`` (someone waits there and no buffer reaches back to tell who kept
  it) and is still blocked in it: the root is then unclear, never a rank guessed;
* or it is a member of a ``hidden`` finding's group whose part in that op its recorder hides (NCCL2 records a
  batch's ops completed when queued, and no closing record: H-BATCH-DONE, H-NO-CLOSE; an only-active dump drops
  what may have been a completed entry: C-ONLY-ACTIVE), not known to wait there, and it finished nothing created
  after it: whether it is held there cannot be told, and the root is what cannot be told.

A rank named by the wait and held nowhere else stops the walk: it may well never have come, and naming it is the
answer. But where such ranks are all named by a point-to-point finding that holds another of the wait's ranks, the
walk moves to that finding (:func:`_p2p_naming`): the wait's ranks are a receiver (or sender) and the peer that did
not post its side, and the point-to-point finding says which is which (on Gloo, from the shim's log:
:mod:`.shim_p2p`). The walk's steps are kept (:func:`chain_of`), so that the line can say who waits on the root.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nemo_rl_shim.hang_report.analysis import HIDDEN, Finding, pg_status_counts_done
from nemo_rl_shim.hang_report.cycles import blocked_in
from nemo_rl_shim.hang_report.records import Entry, RankDump

__all__ = ["WAITS", "chain_of", "held_in", "root_of"]

_PAIR = "send/recv"  # the op of a finding on a send and its receive (:mod:`.analysis`)
#: The recorders whose ``pg_status`` a held rank is judged by: legacy NCCL's (L-PG-STATUS) and NCCL2's hook's
#: (H-PG-STATUS: it counts ``op_id``\s, which run ahead of the collective's number, so the comparison can only say
#: "not ended" of an op that ended: "cannot tell", never a rank named). Gloo's is left out: it counts ``op_id``\s too,
#: a collective that timed out as ended (G-RETIRE, G-PG-STATUS), and its dumps are judged as before.
_STATUS_OF_NCCL = ("nccl", "nccl2")
#: Finding kinds that are a wait on the ranks they name: the ones a cascade is followed from.
WAITS = ("stall", "p2p")


def _holds(finding: Finding, rank: int, dumps: Mapping[int, RankDump]) -> bool:
    """Whether ``rank`` is held in ``finding``'s op (see the module docstring)."""
    if finding.kind == "not finished":
        return rank in finding.ranks and _stopped_at(dumps.get(rank), _its_op(finding, rank, dumps.get(rank)))
    if finding.kind == "unconfirmed":  # its newest op, which its recorder's status does not count as ended
        entry, dump = finding.group.entries.get(rank), dumps.get(rank)
        if rank not in finding.ranks or entry is None or dump is None or entry.lib not in _STATUS_OF_NCCL:
            return False
        return blocked_in(dumps, rank, finding.group, finding.seq) and pg_status_counts_done(dump, entry) is False
    if finding.kind == HIDDEN:  # H-BATCH-DONE, C-ONLY-ACTIVE: the recorder hides whether it is held there
        return _hidden_from(dumps.get(rank), rank, finding)
    if rank not in finding.waiting:
        return False
    if finding.kind == "unclear":  # it waits in that op, and no buffer tells who kept it there
        return blocked_in(dumps, rank, finding.group, finding.seq)
    if finding.kind == "p2p":
        return True  # it waits in its unfinished send or recv
    if finding.kind in ("stall", "missing"):
        return blocked_in(dumps, rank, finding.group, finding.seq)
    return False


def _hidden_from(dump: RankDump | None, rank: int, finding: Finding) -> bool:
    """Whether ``rank``'s part in a ``hidden`` finding's op is what its recorder hides: a member of the group that is
    not among the ranks known to wait there (NCCL2's batch read completed when queued, H-BATCH-DONE; an only-active
    dump that dropped what may have been a completed entry, C-ONLY-ACTIVE), and that finished no op created after
    it (one that did went on past it)."""
    if dump is None or rank not in finding.group.ranks or rank in finding.waiting:
        return False
    later = (e for e in (dump.latest, *dump.last.values(), *dump.p2p_last.values()) if e is not None)
    return not any(e.created_ns > finding.created_ns and dump.finished(e) for e in later)


def _its_op(finding: Finding, rank: int, dump: RankDump | None) -> Entry | None:
    """``rank``'s own entry of an unfinished finding: the group's collective; for a send and its receive, its newest
    unfinished p2p op on the group."""
    if finding.op != _PAIR:
        return finding.group.entries.get(rank)
    pending = [e for e in (dump.pending_p2p if dump else ()) if e.key == finding.group.key]
    return max(pending, key=lambda e: e.created_ns, default=None)


def _stopped_at(dump: RankDump | None, entry: Entry | None) -> bool:
    """Whether ``dump``'s rank stopped at ``entry``: no op of its created later finished (an op left unfinished,
    that a later op of the same rank finished after, does not hold it: the rank went on)."""
    if dump is None or entry is None:
        return False
    later = (e for e in (dump.latest, *dump.last.values(), *dump.p2p_last.values()) if e is not None)
    return not any(e.created_ns > entry.created_ns and dump.finished(e) for e in later)


def held_in(
    rank: int, findings: Sequence[Finding], dumps: Mapping[int, RankDump], but: Finding | None = None
) -> Finding | None:
    """The first finding (other than ``but``) whose op holds ``rank``, or None. From a point-to-point finding, a
    ``hidden`` one holds no rank: the p2p finding rests on a send or receive its recorder shows unfinished, which
    outside a batch NCCL2 records as it is (H-BATCH-DONE is about batched ops), so what a batch hides does not
    overrule it."""
    direct = but is not None and but.kind == "p2p"
    return next(
        (f for f in findings if f is not but and not (direct and f.kind == HIDDEN) and _holds(f, rank, dumps)), None
    )


def chain_of(first: Finding, findings: Sequence[Finding], dumps: Mapping[int, RankDump]) -> list[Finding]:
    """The findings from ``first`` to the root of its cascade: ``[first]`` where it is no cascade."""
    chain = [first]
    order = {id(f): i for i, f in enumerate(findings)}
    while chain[-1].kind in WAITS and chain[-1].ranks:
        holders = [held_in(r, findings, dumps, but=chain[-1]) for r in chain[-1].ranks]
        unheld = [r for r, h in zip(chain[-1].ranks, holders, strict=True) if h is None]
        if unheld:
            following = _p2p_naming(unheld, holders)
            if following is None:
                break
        else:
            following = min((h for h in holders if h is not None), key=lambda h: order[id(h)])
        if any(following is seen for seen in chain):
            break
        chain.append(following)
    return chain


def _p2p_naming(unheld: Sequence[int], holders: Sequence[Finding | None]) -> Finding | None:
    """A point-to-point finding that holds a rank of the wait and names every rank of it held nowhere, or None: the
    wait's ranks are then that finding's waiter and the peer that did not post its side."""
    return next((h for h in holders if h is not None and h.kind == "p2p" and set(unheld) <= set(h.ranks)), None)


def root_of(first: Finding, findings: Sequence[Finding], dumps: Mapping[int, RankDump]) -> Finding:
    """The root of ``first``'s cascade (``first`` itself where its ranks are not all held elsewhere)."""
    return chain_of(first, findings, dumps)[-1]
