"""A rank waiting in a receive is not named with the sender that never came (:mod:`nemo_rl_shim.hang_report.receivers`).

#42's Gloo p2p worlds: the sender never sends, the receiver waits in ``recv`` for good, both miss the others'
all_reduce; Gloo records no send or recv (G-NO-P2P). The reader named both "never came". Drawn whole: seed 1019 of
``tests/hang_report/test_hang_truth.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.analysis import Analysis
from nemo_rl_shim.hang_report.frames import Frame, frame
from nemo_rl_shim.hang_report.kinds import classify
from nemo_rl_shim.hang_report.receivers import p2p_unseen, receive_frame, senders_only
from nemo_rl_shim.hang_report.stacks import RankStack, StackSample
from tests.harness.hang_records import GLOO, dump, entry, group, stall

pytestmark = [pytest.mark.every_lane]

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
RECV = (frame(C10D, 2658, "recv"), frame("/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83,
        "wrapper"), frame("/job/pipeline.py", 40, "stage"))  # fmt: skip
ASLEEP = (frame("/job/pipeline.py", 12, "load"),)
DEFAULT = group("0", range(3), backend="gloo", axes=["default"], entries={0: entry("0", 2, lib="gloo")})


def _stack(rank: int, frames: tuple[Frame, ...]) -> RankStack:
    sample = StackSample(frames, 10**9)
    return RankStack(rank, Path(f"/d/fr_stack_rank_{rank}.txt"), frames=frames, samples=(sample,), fired=True,
                     what="train step", entered_ns=1, after_s=8.0)  # fmt: skip


def test_a_rank_waiting_in_recv_is_not_named_with_the_sender_that_never_came() -> None:
    stacks = {1: _stack(1, RECV), 2: _stack(2, ASLEEP)}
    finding = stall(DEFAULT, [1, 2], [0], seq=2)
    named, receiving = senders_only(finding, stacks)
    assert (named.ranks, sorted(receiving)) == ([2], [1])
    dumps = {r: dump(r, entry("0", 2 if r == 0 else 1, lib="gloo"), recorder=GLOO, lib="gloo") for r in range(3)}
    kind = classify(Analysis([finding], [DEFAULT], [], dumps, 3), stacks, {})
    assert (kind.name, kind.ranks) == ("never_came", (2,))
    assert "rank 1 waits for a send, not the culprit: rank 1 in recv at pipeline.py:40 in stage" in kind.body
    assert kind.evidence["receiving"] == [1]


def test_where_every_rank_named_is_in_a_receive_none_is_set_apart() -> None:
    """Who should have sent is not among them: the finding stands as it is."""
    finding = stall(DEFAULT, [1, 2], [0], seq=2)
    assert senders_only(finding, {1: _stack(1, RECV), 2: _stack(2, RECV)}) == (finding, {})
    assert senders_only(finding, {2: _stack(2, ASLEEP)}) == (finding, {})  # no receiver, or no stack


def test_a_receive_is_torch_distributed_s_own_frame_not_a_user_function_of_that_name() -> None:
    assert receive_frame(_stack(1, RECV)) == RECV[0]
    assert receive_frame(_stack(1, (frame("/job/queue.py", 3, "recv"),))) is None
    in_all_reduce = (frame(C10D, 2801, "all_reduce"), *RECV)  # the innermost torch frame decides
    assert receive_frame(_stack(1, in_all_reduce)) is None
    unfired = RankStack(1, Path("/d/fr_stack_rank_1.txt"), frames=RECV)
    assert receive_frame(unfired) is None


WAITED = (frame("/job/pipeline.py", 328, "_waits_forever"),)  # work.wait() on a batch's irecv: a C++ call, no frame
ALL_REDUCE = (frame(C10D, 2801, "all_reduce"), frame("/job/train.py", 9, "step"))


def test_two_gloo_ranks_out_in_user_code_cannot_be_told_apart() -> None:
    """G-NO-P2P: a receiver waiting on a batch's irecv from user code looks like the sender asleep: who is to blame
    cannot be told, and the report says so (exit 1) rather than naming both as culprits."""
    finding = stall(DEFAULT, [1, 2], [0], seq=2)
    stacks = {1: _stack(1, WAITED), 2: _stack(2, ASLEEP)}
    assert p2p_unseen(finding, stacks)
    dumps = {r: dump(r, entry("0", 2 if r == 0 else 1, lib="gloo"), recorder=GLOO, lib="gloo") for r in range(3)}
    kind = classify(Analysis([finding], [DEFAULT], [], dumps, 3), stacks, {})
    assert (kind.name, kind.variant, kind.ranks) == ("cannot_tell", "p2p unseen", (1, 2))
    assert kind.line.startswith("cannot tell: ranks 1-2 did not enter all_reduce #2"), kind.line
    assert "records no send/recv" in kind.line


def test_p2p_unseen_needs_gloo_two_ranks_and_every_stack_in_user_code() -> None:
    stacks = {1: _stack(1, WAITED), 2: _stack(2, ASLEEP)}
    assert not p2p_unseen(stall(DEFAULT, [2], [0, 1], seq=2), stacks)  # one rank: it is the one
    nccl = group("0", range(3), backend="nccl", axes=["default"], entries={0: entry("0", 2)})
    assert not p2p_unseen(stall(nccl, [1, 2], [0], seq=2), stacks)  # NCCL records its p2p: the dumps tell
    assert not p2p_unseen(stall(DEFAULT, [1, 2], [0], seq=2), {1: _stack(1, WAITED)})  # rank 2 left no stack
    in_torch = {1: _stack(1, ALL_REDUCE), 2: _stack(2, ASLEEP)}
    assert not p2p_unseen(stall(DEFAULT, [1, 2], [0], seq=2), in_torch)  # rank 1 waits in another collective
    unfired = {1: _stack(1, WAITED), 2: RankStack(2, Path("/d/fr_stack_rank_2.txt"), frames=ASLEEP)}
    assert not p2p_unseen(stall(DEFAULT, [1, 2], [0], seq=2), unfired)  # rank 2's watched block did not run over
