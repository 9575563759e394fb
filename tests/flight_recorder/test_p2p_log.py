"""The shim's log of Gloo's sends and receives (:mod:`nemo_rl_shim.flight_recorder.p2p_log`), on real Gloo ranks.

torch's Gloo recorder writes no send or receive (G-NO-P2P, docs/recorder-semantics.md): the log is the record the
report reads instead (:mod:`nemo_rl_shim.hang_report.shim_p2p`). One spawned world of three ranks
(:mod:`tests.ranks.p2p_log`): sends and receives on a group of ranks 1-2 (one with tag 7, two through the group's own
methods with named arguments, then more than the log keeps), a ``batch_isend_irecv`` between ranks 0 and 1, and an
``irecv`` rank 0 does not answer until every rank has taken its snapshot. Then, in this process, the fake backend (its
groups are not Gloo's: nothing logged), installing twice, and a caller the log cannot read (the op's result as torch
made it).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist

from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.flight_recorder import p2p_log
from nemo_rl_shim.hang_report import shim_p2p
from tests.ranks.p2p_log import MANY

pytestmark = [pytest.mark.every_lane]

WORLD = 3
SPAWN_TIMEOUT_S = 180
#: What the log keeps, as docs/recorder-semantics.md states it (S-P2P-OPS).
KEPT = 256


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    results: list[RankResult] = spawn_ranks(
        "tests.ranks.p2p_log:run", {}, world_size=WORLD, timeout_s=SPAWN_TIMEOUT_S, env={"CUDA_VISIBLE_DEVICES": ""},
        check=False,
    )  # fmt: skip
    got = {r.rank: r.result for r in results if isinstance(r.result, dict)}
    missing = [f"rank {r.rank}: {r.error or r.output[-2000:]}" for r in results if r.rank not in got]
    assert len(got) == WORLD, "ranks without a result:\n" + "\n".join(missing)
    return got


def _counts(snapshot: dict[str, Any]) -> dict[tuple[str, str, int, int], int]:
    return {(g, op, peer, tag): n for g, op, peer, tag, n in snapshot["counts"]}


def test_install_wraps_torchs_two_methods_and_uninstall_gives_them_back(ranks) -> None:
    assert all(r["installed"] and r["wrapped"] and r["restored"] for r in ranks.values()), ranks
    assert all(r["warnings"] == [] for r in ranks.values()), {k: r["warnings"] for k, r in ranks.items()}


def test_every_send_and_receive_is_counted_per_group_kind_peer_and_tag(ranks) -> None:
    """The batch's isend/irecv, the plain send/recv and the group's own methods called with named arguments alike
    (all end in ``ProcessGroup.send``/``recv``), each toward its peer's rank in the group and under its tag: on
    ``pair`` (ranks 1-2), rank 1 is group rank 0 and rank 2 group rank 1."""
    default, pair = ranks[1]["names"]["default"], ranks[1]["names"]["pair"]
    on_pair = MANY + 4
    assert _counts(ranks[0]["after"]) == {(default, "send", 1, 0): 2, (default, "recv", 1, 0): 1}
    assert _counts(ranks[1]["after"]) == {
        (pair, "recv", 1, 7): 1, (pair, "recv", 1, 0): on_pair, (default, "send", 0, 0): 1, (default, "recv", 0, 0): 2,
    }  # fmt: skip
    assert _counts(ranks[2]["after"]) == {(pair, "send", 0, 7): 1, (pair, "send", 0, 0): on_pair}
    plain = {type(v) for r in ranks.values() for row in r["after"]["counts"] for v in row[2:]}
    assert plain == {int}, plain  # numpy's ints written as ints: the report refuses any other type


def test_the_log_keeps_its_last_ops_and_says_how_many_it_dropped(ranks) -> None:
    """S-P2P-OPS: the last 256 ops, oldest first; the counts keep every op (S-P2P-COUNT)."""
    for rank, noted in ((1, MANY + 5 + 3), (2, MANY + 5)):
        after = ranks[rank]["after"]
        kept, dropped = len(after["ops"]), after["dropped"]
        assert (kept, dropped) == (KEPT, noted - KEPT), rank
        assert after["ops"][-1]["ordinal"] == (2 if rank == 1 else MANY + 4)
    assert len(ranks[0]["after"]["ops"]) == 3 and ranks[0]["after"]["dropped"] == 0


def test_an_op_not_yet_answered_is_not_done_and_its_ordinal_counts_from_the_first(ranks) -> None:
    """Rank 1's irecv from rank 0 is its second receive from rank 0: ordinal 2, not done while rank 0 has not sent;
    done once it has. Every other op completed before the snapshot and reads done."""
    default = ranks[1]["names"]["default"]
    pending = [o for o in ranks[1]["while_pending"]["ops"] if not o["done"]]
    assert [(o["group"], o["op"], o["peer"], o["tag"], o["ordinal"]) for o in pending] == [(default, "recv", 0, 0, 2)]
    assert all(o["done"] for r in ranks.values() for o in r["after"]["ops"]), ranks
    assert all(o["done"] for rank in (0, 2) for o in ranks[rank]["while_pending"]["ops"])
    ordinals = [(o["op"], o["ordinal"]) for o in ranks[1]["after"]["ops"] if o["group"] == default]
    assert sorted(ordinals) == [("recv", 1), ("recv", 2), ("send", 1)], ordinals


def test_the_log_is_in_the_format_the_report_reads(ranks) -> None:
    assert {r["after"]["format"] for r in ranks.values()} == {shim_p2p.FORMAT} == {1}


def test_a_group_whose_backend_is_not_gloos_logs_nothing() -> None:
    """torch's fake backend (one process plays rank 0 of 2): its sends go through the same wrapped method, and are
    not Gloo's, so the log stays empty; the work is torch's, returned as it was."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        assert p2p_log.install()
        work = dist.isend(torch.ones(2), dst=1)
        assert work is not None and type(work).__name__ != "function"
        snapshot = p2p_log.snapshot()
        assert snapshot is not None and snapshot["ops"] == [] and snapshot["counts"] == [], snapshot
    finally:
        p2p_log.uninstall()
        dist.destroy_process_group()


def test_installing_twice_wraps_once_and_uninstall_gives_torchs_methods_back() -> None:
    from torch._C._distributed_c10d import ProcessGroup

    p2p_log.uninstall()  # torch's own methods, whatever a test before this one left in this process
    torch_send, torch_recv = ProcessGroup.send, ProcessGroup.recv
    assert not hasattr(torch_send, "__wrapped__")
    try:
        assert p2p_log.install() and p2p_log.install()
        assert ProcessGroup.send.__wrapped__ is torch_send and ProcessGroup.recv.__wrapped__ is torch_recv
    finally:
        p2p_log.uninstall()
    assert (ProcessGroup.send, ProcessGroup.recv) == (torch_send, torch_recv) and not p2p_log.installed()


def test_an_op_the_log_cannot_read_is_returned_as_torch_made_it_with_one_warning() -> None:
    """The wrapper calls torch's method first; noting the op never fails the caller: a group whose backend cannot be
    asked is not Gloo's (nothing noted, no warning), and a Gloo group whose name cannot be read warns once per
    install."""

    class Unreadable:
        def _get_backend(self, device: Any) -> Any:
            raise RuntimeError("no backend for this device")

    class GlooNamedBadly:
        def _get_backend(self, device: Any) -> Any:
            return type("ProcessGroupGloo", (), {})()

        @property
        def group_name(self) -> str:
            raise RuntimeError("destroyed")

    marker = object()
    wrapped = p2p_log._wrapper("send", lambda self, *args, **kwargs: marker)
    assert p2p_log.install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert wrapped(Unreadable(), [torch.ones(1)], 1, 0) is marker
            assert wrapped(GlooNamedBadly(), [], 1, 0) is marker  # no tensor: nothing to note, the group not asked
            assert p2p_log._wrapper("send", lambda self, *args: None)(GlooNamedBadly(), [torch.ones(1)], 1, 0) is None
            assert p2p_log.snapshot()["ops"] == [] and caught == []
            for _ in range(2):
                assert wrapped(GlooNamedBadly(), [torch.ones(1)], 1, 0) is marker
            assert wrapped(GlooNamedBadly(), [torch.ones(1)], "one", 0) is marker  # not a rank: not noted
        # one warning for the whole install: the first op the log could not read
        assert [str(w.message) for w in caught] == ["a point-to-point op was not logged for the hang report: destroyed"]
        assert p2p_log.snapshot()["ops"] == []
    finally:
        p2p_log.uninstall()
