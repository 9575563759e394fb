"""The NCCL-format scenarios of #22, each written as a folder of dumps (:mod:`tests.harness.nccl_format_dumps`).

Each builder plays every rank's ops in the order they happen on one :class:`~tests.harness.nccl_format_dumps.Clock`
and writes the dumps torch's watchdog would leave; :data:`EXPECTED` holds the first line each must give.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.harness.nccl_format_dumps import Clock, Group, Rank, write

__all__ = ["EXPECTED", "SCENARIOS", "build"]

DEFAULT4 = Group("0", "default_pg", (0, 1, 2, 3))


def _ranks(n: int, groups_of: Callable[[int], list[Group]], timing: bool = False) -> tuple[Clock, list[Rank]]:
    clock = Clock()
    return clock, [Rank(r, groups_of(r), clock, timing=timing) for r in range(n)]


def _write_all(directory: Path, ranks: list[Rank], buffer: int | None = None, skip: tuple[int, ...] = ()) -> None:
    for rank in ranks:
        if rank.rank not in skip:
            write(directory, rank, buffer=buffer)


def sub_group_stall(directory: Path) -> None:
    """tp groups {0, 1}, {2, 3} (DeviceMesh's ``mesh_tp``), timing on; rank 3 never enters tp all_reduce #3."""
    tp = [Group("1", "mesh_tp", (0, 1)), Group("2", "mesh_tp", (2, 3))]
    clock, ranks = _ranks(4, lambda r: [DEFAULT4, tp[r // 2]], timing=True)
    for step in range(3):
        for rank in ranks:
            if rank.rank == 3 and step == 2:
                continue
            rank.collective(tp[rank.rank // 2], state="started" if rank.rank == 2 and step == 2 else "completed")
        clock.settle()
    _write_all(directory, ranks)


def p2p_stall(directory: Path) -> None:
    """A pipeline 0 -> 1 -> 2 -> 3 of plain send/recv, 3 rounds; in the last, rank 2 never sends to rank 3."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for step in range(3):
        for src in range(3):
            if src == 2 and step == 2:
                ranks[3].recv(DEFAULT4, 2, state="scheduled")
                continue
            ranks[src].send(DEFAULT4, src + 1)
            ranks[src + 1].recv(DEFAULT4, src)
        clock.settle()
    _write_all(directory, ranks)


def batched_p2p_stall(directory: Path) -> None:
    """A ring of batch_isend_irecv (ring attention's shape), 3 rounds; in the last, rank 2 never posts its batch."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for step in range(3):
        for rank in ranks:
            r = rank.rank
            if step == 2 and r == 2:
                continue
            stuck = step == 2 and r in (1, 3)  # rank 1 sends to 2, rank 3 receives from 2
            rank.batch(
                DEFAULT4, [("send", (r + 1) % 4), ("recv", (r - 1) % 4)], state="scheduled" if stuck else "completed"
            )
        clock.settle()
    _write_all(directory, ranks)


def unfinished_after_p2p(directory: Path) -> None:
    """Two all_reduces, pipeline p2p traffic on the same group, then all_reduce #3 that every rank entered and none
    finished; NCCL's ``last_completed_collective`` counts the p2p work too, and reads past #3."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4], timing=True)
    for _ in range(2):
        for rank in ranks:
            rank.collective(DEFAULT4)
        clock.settle()
    for _ in range(9):  # ranks 1 and 2: 18 p2p ops each, and their counters read 20
        for src in range(3):
            ranks[src].send(DEFAULT4, src + 1)
            ranks[src + 1].recv(DEFAULT4, src)
        clock.settle()
    for rank in ranks:
        rank.collective(DEFAULT4, state="started")
    _write_all(directory, ranks)


def _wrapping(stall: bool) -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        """The default group's 5 all_reduces are out of ranks 0-1's 20-entry buffers (their p2p traffic pushed
        them out), still in ranks 2-3's. With ``stall``, rank 3 then never enters tp all_reduce #2 on {2, 3}."""
        pp = [Group("1", "mesh_pp", (0, 1)), Group("2", "mesh_pp", (2, 3))]
        tp = [Group("3", "mesh_tp", (0, 1)), Group("4", "mesh_tp", (2, 3))]
        clock, ranks = _ranks(4, lambda r: [DEFAULT4, pp[r // 2], tp[r // 2]])
        for _ in range(5):
            for rank in ranks:
                rank.collective(DEFAULT4)
            clock.settle()
        for rounds, pair in ((30, (0, 1)), (3, (2, 3))):
            for _ in range(rounds):
                ranks[pair[0]].send(pp[pair[0] // 2], pair[1])
                ranks[pair[1]].recv(pp[pair[0] // 2], pair[0])
                clock.settle()
        for step in range(2):
            for rank in ranks:
                if stall and step == 1 and rank.rank == 3:
                    continue
                rank.collective(
                    tp[rank.rank // 2], state="scheduled" if stall and step == 1 and rank.rank == 2 else "completed"
                )
            clock.settle()
        _write_all(directory, ranks, buffer=20)

    return build


def dead_rank_cascade(directory: Path) -> None:
    """16 ranks, tp 4 x dp 4; rank 11 dies before tp all_reduce #3 (no dump): ranks 8-10 wait in it, and never reach
    dp all_reduce #3, in which their dp peers then wait on them."""
    tp = [Group(str(1 + i), "mesh_tp", tuple(range(4 * i, 4 * i + 4))) for i in range(4)]
    dp = [Group(str(5 + j), "mesh_dp", tuple(range(j, 16, 4))) for j in range(4)]
    default = Group("0", "default_pg", tuple(range(16)))
    clock, ranks = _ranks(16, lambda r: [default, tp[r // 4], dp[r % 4]], timing=True)
    for step in range(3):
        for rank in ranks:
            if step == 2 and rank.rank == 11:
                continue
            rank.collective(
                tp[rank.rank // 4], state="started" if step == 2 and rank.rank in (8, 9, 10) else "completed"
            )
        for rank in ranks:
            if step == 2 and rank.rank in (8, 9, 10, 11):
                continue
            rank.collective(dp[rank.rank % 4], state="started" if step == 2 else "completed")
        clock.settle()
    _write_all(directory, ranks, skip=(11,))


def mismatch(directory: Path) -> None:
    """Four ranks; at collective #2 rank 2 calls all_gather where the others call all_reduce."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for rank in ranks:
        rank.collective(DEFAULT4)
    clock.settle()
    for rank in ranks:
        rank.collective(DEFAULT4, op="all_gather" if rank.rank == 2 else "all_reduce", state="scheduled")
    _write_all(directory, ranks)


def healthy(directory: Path) -> None:
    """Collectives and batched p2p on every rank, all completed."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for _ in range(3):
        for rank in ranks:
            rank.collective(DEFAULT4)
        clock.settle()
        for rank in ranks:
            rank.batch(DEFAULT4, [("send", (rank.rank + 1) % 4), ("recv", (rank.rank - 1) % 4)])
        clock.settle()
    _write_all(directory, ranks)


def per_node(directory: Path) -> None:
    """The sub-group stall, its dumps gathered per node: ``node0/`` ranks 0-1, ``node1/`` ranks 2-3."""
    flat = directory / ".flat"
    sub_group_stall(flat)
    for path in sorted(flat.iterdir()):
        rank = int(path.name.rsplit("_", 1)[1])
        target = directory / f"node{rank // 2}"
        target.mkdir(parents=True, exist_ok=True)
        path.rename(target / path.name)
    flat.rmdir()


def _stage_ops(rank: int, stages: int) -> list[tuple[str, int]]:
    """A pipeline stage's exchange: receive from the stage before, send to the one after."""
    return ([("recv", rank - 1)] if rank > 0 else []) + ([("send", rank + 1)] if rank < stages - 1 else [])


def pipeline_stall(directory: Path) -> None:
    """#27's pipeline: 4 stages exchange activations by batch_isend_irecv, 3 rounds. In the last the middle stage
    (rank 2) stops before its exchange and issues nothing: rank 1's batch stays 'started' (its receive from rank 0
    was met, its send has no receiver), rank 3 waits in its receive. Rank 0's batch completed before rank 1 posted
    (NCCL sends a small message eagerly): the old rule, "finished before this op was posted", blamed rank 0."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4], timing=True)
    for step in range(3):
        last = step == 2
        ranks[0].batch(DEFAULT4, _stage_ops(0, 4))
        if last:
            clock.settle()
        for rank in ranks[1:]:
            if not (last and rank.rank == 2):
                rank.batch(DEFAULT4, _stage_ops(rank.rank, 4), state="started" if last else "completed")
        clock.settle()
    _write_all(directory, ranks)


PP = [Group("1", "mesh_pp", (0, 2)), Group("2", "mesh_pp", (1, 3))]


def sub_group_p2p(directory: Path) -> None:
    """Two pipelines on sub-groups whose group ranks are not the global ones: pp {0, 2} and pp {1, 3}, 3 rounds of
    send/recv. In the last, rank 1 never sends to rank 3 (rank 3 waits), and on {0, 2} both sides posted and
    neither finished (their link, not a rank, is stuck)."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4, PP[r % 2]], timing=True)
    for step in range(3):
        last = step == 2
        for src, dst in ((0, 2), (1, 3)):
            if last and src == 1:
                ranks[3].recv(PP[1], 1, state="started")
                continue
            ranks[src].send(PP[src], dst, state="started" if last else "completed")
            ranks[dst].recv(PP[src], src, state="started" if last else "completed")
        clock.settle()
    _write_all(directory, ranks)


DEFAULT2 = Group("0", "default_pg", (0, 1))


def p2p_both_pending_wrapped(directory: Path) -> None:
    """Rank 0 sends to rank 1, 30 rounds, 20-entry buffers (both wrapped: the counts are not whole); in the last
    both posted and neither finished. Rank 0's buffer holds older finished sends to rank 1 and the newer pending
    one: the newest decides."""
    clock, ranks = _ranks(2, lambda r: [DEFAULT2], timing=True)
    for step in range(30):
        state = "started" if step == 29 else "completed"
        ranks[0].send(DEFAULT2, 1, state=state)
        ranks[1].recv(DEFAULT2, 0, state=state)
        clock.settle()
    _write_all(directory, ranks, buffer=20)


def p2p_unclear(directory: Path) -> None:
    """Rank 3 waits in its third receive from rank 2; rank 2 then ran 30 collectives with ranks 0-1 (group
    {0, 1, 2}), and its 20-entry buffer no longer reaches back to its sends: nobody can be blamed."""
    trio = Group("1", "mesh_dp", (0, 1, 2))
    clock, ranks = _ranks(4, lambda r: [DEFAULT4, trio] if r < 3 else [DEFAULT4], timing=True)
    for _ in range(2):
        ranks[2].send(DEFAULT4, 3)
        ranks[3].recv(DEFAULT4, 2)
        clock.settle()
    ranks[3].recv(DEFAULT4, 2, state="started")
    for _ in range(30):
        for rank in ranks[:3]:
            rank.collective(trio)
        clock.settle()
    _write_all(directory, ranks, buffer=20)


def cascade_order(directory: Path) -> None:
    """16 ranks, tp 4 x dp 4; rank 11 (it has a dump: stuck elsewhere) never enters tp all_reduce #3, in which ranks
    8-10 wait, so they never reach dp all_reduce #3, in which their dp peers wait. The peers entered theirs before
    ranks 8-10 entered tp #3: by time alone, a victim would come first."""
    tp = [Group(str(1 + i), "mesh_tp", tuple(range(4 * i, 4 * i + 4))) for i in range(4)]
    dp = [Group(str(5 + j), "mesh_dp", tuple(range(j, 16, 4))) for j in range(4)]
    default = Group("0", "default_pg", tuple(range(16)))
    clock, ranks = _ranks(16, lambda r: [default, tp[r // 4], dp[r % 4]], timing=True)
    for step in range(3):
        last = step == 2
        for rank in ranks:
            if not (last and rank.rank in (8, 9, 10, 11)):
                rank.collective(tp[rank.rank // 4])
        for rank in ranks:
            if not (last and rank.rank in (8, 9, 10, 11)):
                rank.collective(dp[rank.rank % 4], state="started" if last else "completed")
        clock.settle()
    for rank in ranks[8:11]:
        rank.collective(tp[2], state="started")
    _write_all(directory, ranks)


def mismatch_tie(directory: Path) -> None:
    """Four ranks; at all_reduce #2 ranks 0-1 reduce 4 elements and ranks 2-3 reduce 8: two against two."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for rank in ranks:
        rank.collective(DEFAULT4)
    clock.settle()
    for rank in ranks:
        rank.collective(DEFAULT4, sizes=((4,),) if rank.rank < 2 else ((8,),), state="scheduled")
    _write_all(directory, ranks)


TP2 = [Group("1", "mesh_tp", (0, 1)), Group("2", "mesh_tp", (2, 3))]
TRIO = Group("3", "mesh_dp", (0, 1, 3))


def behind_unwrapped(directory: Path) -> None:
    """Rank 2 enters tp all_reduce #1 on {2, 3}; rank 3 never does, and has since run two collectives with ranks 0-1.
    Its buffer did not wrap: it holds every op it made, so it is behind, not out of reach."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4, TP2[r // 2], TRIO] if r != 2 else [DEFAULT4, TP2[1]])
    ranks[2].collective(TP2[1], state="scheduled")
    for _ in range(2):
        for r in (0, 1, 3):
            ranks[r].collective(TRIO)
        clock.settle()
    _write_all(directory, ranks)


def wrapped_by_one(directory: Path) -> None:
    """Ranks 2 and 3 finish tp all_reduce #1 on {2, 3}; rank 3 then runs 20 collectives with ranks 0-1 and keeps 20
    entries of its 21 (its oldest's record_id is 1): tp #1 is out of its reach, and every rank agrees."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4, TP2[r // 2], TRIO] if r != 2 else [DEFAULT4, TP2[1]])
    for r in (2, 3):
        ranks[r].collective(TP2[1])
    clock.settle()
    for _ in range(20):
        for r in (0, 1, 3):
            ranks[r].collective(TRIO)
        clock.settle()
    for rank in ranks:
        write(directory, rank, buffer=20 if rank.rank == 3 else None)


def coalesced_healthy(directory: Path) -> None:
    """Two coalesced collectives on every rank: each op's own entry stays 'scheduled', the closer completed."""
    clock, ranks = _ranks(4, lambda r: [DEFAULT4])
    for _ in range(2):
        for rank in ranks:
            rank.coalesced(DEFAULT4, ["all_reduce", "all_reduce"])
        clock.settle()
    _write_all(directory, ranks)


def nccl2_sub_group_stall(directory: Path) -> None:
    """:func:`sub_group_stall` as torch 2.15's hook records NCCL2 (``nccl2:`` names; no 'started' state: the hook
    keeps no events)."""
    tp = [Group("1", "mesh_tp", (0, 1)), Group("2", "mesh_tp", (2, 3))]
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4, tp[r // 2]], clock, lib="nccl2") for r in range(4)]
    for step in range(3):
        for rank in ranks:
            if not (rank.rank == 3 and step == 2):
                rank.collective(tp[rank.rank // 2], state="scheduled" if rank.rank == 2 and step == 2 else "completed")
        clock.settle()
    _write_all(directory, ranks)


def nccl2_batched_p2p_stall(directory: Path) -> None:
    """:func:`batched_p2p_stall` as the hook records a batch: each op its own entry and p2p number, no closer, each
    retired on its own completion. In the last round rank 2 posts nothing: rank 1's send to it and rank 3's receive
    from it stay 'scheduled', their other halves completed."""
    clock = Clock()
    ranks = [Rank(r, [DEFAULT4], clock, lib="nccl2") for r in range(4)]
    for step in range(3):
        for rank in ranks:
            r = rank.rank
            if step == 2 and r == 2:
                continue
            nxt, prev = (r + 1) % 4, (r - 1) % 4
            rank.send(DEFAULT4, nxt, state="scheduled" if step == 2 and nxt == 2 else "completed")
            rank.recv(DEFAULT4, prev, state="scheduled" if step == 2 and prev == 2 else "completed")
        clock.settle()
    _write_all(directory, ranks)


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "sub_group_stall": sub_group_stall,
    "p2p_stall": p2p_stall,
    "batched_p2p_stall": batched_p2p_stall,
    "unfinished_after_p2p": unfinished_after_p2p,
    "wrapped_healthy": _wrapping(stall=False),
    "wrapped_stall": _wrapping(stall=True),
    "dead_rank_cascade": dead_rank_cascade,
    "mismatch": mismatch,
    "healthy": healthy,
    "per_node": per_node,
    "pipeline_stall": pipeline_stall,
    "sub_group_p2p": sub_group_p2p,
    "p2p_both_pending_wrapped": p2p_both_pending_wrapped,
    "p2p_unclear": p2p_unclear,
    "cascade_order": cascade_order,
    "mismatch_tie": mismatch_tie,
    "behind_unwrapped": behind_unwrapped,
    "wrapped_by_one": wrapped_by_one,
    "coalesced_healthy": coalesced_healthy,
    "nccl2_sub_group_stall": nccl2_sub_group_stall,
    "nccl2_batched_p2p_stall": nccl2_batched_p2p_stall,
}

#: scenario -> (exit code, the start of the first line: the kind, then who and where)
EXPECTED: dict[str, tuple[int, str]] = {
    "sub_group_stall": (
        1,
        "never came: rank 3 did not enter all_reduce #3 on tp, ranks 2-3, in which rank 2 waited 600.0 s",
    ),
    "p2p_stall": (1, "p2p stall: rank 2 did not send to rank 3, which waited in its recv #3 on default, ranks 0-3"),
    "batched_p2p_stall": (
        1,
        "p2p stall: rank 2 did not receive from rank 1, which waited in its send #3 of a batch_isend_irecv; did not "
        "send to rank 3, which waited in its recv #3 of a batch_isend_irecv on default, ranks 0-3",
    ),
    "unfinished_after_p2p": (
        1,
        "all entered, none finished: ranks 0-3 did not finish all_reduce #3 on default, ranks 0-3: every member "
        "entered it, none finished",
    ),
    "wrapped_healthy": (0, "every rank agrees: 4 dumps"),
    "wrapped_stall": (
        1,
        "never came: rank 3 did not enter all_reduce #2 on tp, ranks 2-3, in which rank 2 waited 600.0 s",
    ),
    "dead_rank_cascade": (
        1,
        "never came (dead: no dump): no dump from rank 11: ranks 8-10 were last in all_reduce #3 on tp, ranks 8-11",
    ),
    "mismatch": (
        1,
        "mismatch (op): rank 2 differs on all_reduce #2 on default, ranks 0-3: op all_gather (rank 2) where ranks "
        "0-1, 3 have all_reduce",
    ),
    "healthy": (0, "every rank agrees: 4 dumps"),
    "per_node": (1, "never came: rank 3 did not enter all_reduce #3 on tp, ranks 2-3, in which rank 2 waited 600.0 s"),
    "pipeline_stall": (
        1,
        "p2p stall: rank 2 did not receive from rank 1, which waited in its send #3 of a batch_isend_irecv; did not "
        "send to rank 3, which waited in its recv #3 of a batch_isend_irecv on default, ranks 0-3",
    ),
    "sub_group_p2p": (1, "p2p stall: rank 1 did not send to rank 3, which waited in its recv #3 on pp, ranks 1, 3"),
    "p2p_both_pending_wrapped": (
        1,
        "all entered, none finished: ranks 0-1 did not finish the send #30 of rank 0 and its match on rank 1: both "
        "posted, neither finished on default, ranks 0-1",
    ),
    "p2p_unclear": (
        1,
        "unclear: rank 3 waited in its recv #3 from rank 2 on default, ranks 0-3, and rank 2's buffer does not reach "
        "back to it: cannot tell whether rank 2 sent",
    ),
    "cascade_order": (1, "never came: rank 11 did not enter all_reduce #3 on "),
    "mismatch_tie": (
        1,
        "mismatch (sizes): ranks 0-3 disagree on all_reduce #2 on default, ranks 0-3: input sizes rank 0: [[4]]; rank"
        " 1: [[4]]; rank 2: [[8]]; rank 3: [[8]]",
    ),
    "behind_unwrapped": (
        1,
        "never came: rank 3 did not enter all_reduce #1 on tp, ranks 2-3, in which rank 2 waited 600.0 s",
    ),
    "wrapped_by_one": (0, "every rank agrees: 4 dumps"),
    "coalesced_healthy": (0, "every rank agrees: 4 dumps"),
    "nccl2_sub_group_stall": (
        1,
        "never came: rank 3 did not enter all_reduce #3 on tp, ranks 2-3, in which rank 2 waited 600.0 s",
    ),
    "nccl2_batched_p2p_stall": (
        1,
        "p2p stall: rank 2 did not receive from rank 1, which waited in its send #5; did not send to rank 3, which "
        "waited in its recv #6 on default, ranks 0-3",
    ),
}


def build(name: str, directory: Path) -> Path:
    """Write scenario ``name`` into ``directory``; returns it."""
    SCENARIOS[name](directory)
    return directory
