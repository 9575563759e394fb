"""A rank that waits in a receive is waiting, not the culprit: on Gloo, the stack says what the dumps cannot.

Gloo's recorder writes no entry for a send or a receive (``docs/recorder-semantics.md`` G-NO-P2P: they do not go
through ``ProcessGroupGloo::enqueue``), and Gloo's ``recv`` has no timeout. When a sender never sends, the receiver
waits in its ``recv`` for good, and both miss the next collective of their peers: the dumps show two ranks that
never came, alike. Their stacks tell them apart: the receiver's innermost ``torch.distributed`` frame is the
receive (``distributed_c10d.recv``, through ``c10d_logger``'s wrapper), the sender's is not.

**The rule** (:func:`senders_only`). Of the ranks a "did not enter" finding names, those whose stack is in a receive
(:func:`receive_frame`: the innermost frame under ``torch/distributed/`` is one of :data:`RECEIVES`) wait for a
send; where a named rank remains that is not in a receive, the finding names those alone, and the receivers are
kept apart (the line says where they wait). Where every named rank is in a receive, nobody is dropped: who should
have sent is not among them, and the finding stands as it is.

What the stack cannot show: a receive whose wait is a C++ call made from the user's code (``work.wait()`` on the
works ``batch_isend_irecv`` or ``irecv`` returned) leaves no ``torch.distributed`` frame, only the user's line; such
a receiver is not told apart (faulthandler writes Python frames only).

**So, on Gloo, several ranks out of one collective cannot be told apart** (:func:`p2p_unseen`). Where a Gloo group's
collective misses two or more ranks, none of them in a receive, and each of them stopped in user code (its stack
written, no ``torch.distributed`` frame), one of them may be waiting on another's ``isend``/``batch_isend_irecv``:
the dumps hold no p2p entry to say so (G-NO-P2P), the stacks show no receive, and a receiver blocked in C++ shows no
CPU and no I/O, as a sleeping sender does. The report then says it cannot tell which of them is to blame, never
naming them all as culprits. A rank in a torch collective, one holding the GIL, or one that left no stack, is told
by the other rules.

Where the shim's recorder ran, its dumps carry its own log of Gloo's sends and receives (:mod:`.shim_p2p`,
``S-P2P-``): the receiver's unfinished receive and the sender's missing send are then a point-to-point finding,
and the cascade (:mod:`.cascade`) follows the collective's wait to it before these rules are asked. They stay for
dumps without the log (torch's own, an older shim's).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from nemo_rl_shim.hang_report.analysis import Finding
from nemo_rl_shim.hang_report.frames import Frame
from nemo_rl_shim.hang_report.stacks import RankStack

__all__ = ["RECEIVES", "p2p_unseen", "receive_frame", "senders_only"]

#: torch.distributed's receiving calls, as faulthandler names their frames (``distributed_c10d.py``): each blocks
#: in the calling thread until the peer's send arrives (torch 2.9 to 2.15).
RECEIVES = frozenset({"recv", "recv_object_list"})
_TORCH_DISTRIBUTED = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def receive_frame(stack: RankStack | None) -> Frame | None:
    """The receive ``stack``'s watched thread waits in (its innermost ``torch.distributed`` frame; ``c10d_logger``'s
    wrapper lies outside it), or None."""
    if stack is None or not stack.fired:
        return None
    inside = next((f for f in stack.frames if _TORCH_DISTRIBUTED.search(f.file)), None)
    return inside if inside is not None and inside.function in RECEIVES else None


def senders_only(finding: Finding, stacks: Mapping[int, RankStack]) -> tuple[Finding, dict[int, Frame]]:
    """``finding`` naming only the ranks not in a receive, and the receivers with where they wait; ``finding``
    itself and ``{}`` where none of its ranks, or all of them, are in a receive."""
    receiving = {r: f for r in finding.ranks if (f := receive_frame(stacks.get(r))) is not None}
    rest = [r for r in finding.ranks if r not in receiving]
    if not receiving or not rest:
        return finding, {}
    return dataclasses.replace(finding, ranks=rest), receiving


def p2p_unseen(finding: Finding, stacks: Mapping[int, RankStack]) -> bool:
    """Whether ``finding``'s ranks could be a sender and its receiver that the dumps cannot tell apart (see the
    module docstring): a Gloo group's collective, two or more ranks named, each with a stack written in user code
    alone (no ``torch.distributed`` frame), none in a receive."""
    if finding.group.backend != "gloo" or len(finding.ranks) < 2:
        return False
    for rank in finding.ranks:
        stack = stacks.get(rank)
        if stack is None or not stack.fired or stack.in_torch_distributed:
            return False
    return True
