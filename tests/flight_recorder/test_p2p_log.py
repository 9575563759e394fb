"""The shim's log of Gloo's sends and receives (:mod:`nemo_rl_shim.flight_recorder.p2p_log`), on real Gloo ranks.

torch's Gloo recorder writes no send or receive (G-NO-P2P, docs/recorder-semantics.md): the log is the record the
report reads instead (:mod:`nemo_rl_shim.hang_report.shim_p2p`). One spawned world of three ranks
(:mod:`tests.ranks.p2p_log`): a ``batch_isend_irecv`` between ranks 0 and 1, a ``send``/``recv`` on a group of ranks
1-2, and an ``irecv`` rank 0 does not answer until every rank has taken its snapshot. Then, in this process, the
fake backend (its groups are not Gloo's: nothing logged) and a caller the log cannot read (the op's result as torch
made it).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from nemo_rl_shim.cli.preflight.spawn import RankResult, spawn_ranks
from nemo_rl_shim.flight_recorder import p2p_log

pytestmark = [pytest.mark.every_lane]

WORLD = 3
SPAWN_TIMEOUT_S = 180


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


def _counts(snapshot: dict[str, Any]) -> dict[tuple[str, str, int], int]:
    """The counts of tag 0 (every op of the world uses torch's default tag)."""
    assert all(tag == 0 for _, _, _, tag, _ in snapshot["counts"]), snapshot["counts"]
    return {(g, op, peer): n for g, op, peer, _, n in snapshot["counts"]}


def test_install_wraps_torchs_two_methods_and_uninstall_gives_them_back(ranks) -> None:
    assert all(r["installed"] and r["wrapped"] and r["restored"] for r in ranks.values()), ranks


def test_every_send_and_receive_is_counted_per_group_kind_and_peer_in_the_group(ranks) -> None:
    """The batch's isend/irecv and the plain send/recv alike (both end in ``ProcessGroup.send``/``recv``), each toward
    its peer's rank in the group: on ``pair`` (ranks 1-2), rank 1 is group rank 0 and rank 2 group rank 1."""
    default, pair = ranks[1]["names"]["default"], ranks[1]["names"]["pair"]
    assert _counts(ranks[0]["after"]) == {(default, "send", 1): 2, (default, "recv", 1): 1}
    assert _counts(ranks[1]["after"]) == {(default, "send", 0): 1, (default, "recv", 0): 2, (pair, "recv", 1): 1}
    assert _counts(ranks[2]["after"]) == {(pair, "send", 0): 1}


def test_an_op_not_yet_answered_is_not_done_and_its_ordinal_counts_from_the_first(ranks) -> None:
    """Rank 1's irecv from rank 0 is its second receive from rank 0: ordinal 2, not done while rank 0 has not sent;
    done once it has. Every other op completed before the snapshot and reads done."""
    default = ranks[1]["names"]["default"]
    pending = [o for o in ranks[1]["while_pending"]["ops"] if not o["done"]]
    assert [(o["group"], o["op"], o["peer"], o["ordinal"]) for o in pending] == [(default, "recv", 0, 2)]
    assert all(o["done"] for r in ranks.values() for o in r["after"]["ops"]), ranks
    assert all(o["done"] for rank in (0, 2) for o in ranks[rank]["while_pending"]["ops"])
    ordinals = [(o["op"], o["ordinal"]) for o in ranks[1]["after"]["ops"] if o["group"] == default]
    assert sorted(ordinals) == [("recv", 1), ("recv", 2), ("send", 1)], ordinals
    assert all(r["after"]["format"] == p2p_log.FORMAT and r["after"]["dropped"] == 0 for r in ranks.values())


def test_a_group_whose_backend_is_not_gloos_logs_nothing(tmp_path) -> None:
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


def test_an_op_the_log_cannot_read_is_returned_as_torch_made_it_with_one_warning() -> None:
    """The wrapper calls torch's method first; noting the op never fails the caller: a group whose backend cannot be
    asked is not Gloo's (nothing noted, no warning), and a group name that cannot be read warns once."""

    class Unreadable:
        def _get_backend(self, device: Any) -> Any:
            raise RuntimeError("no backend for this device")

    marker = object()
    wrapped = p2p_log._wrapper("send", lambda self, *args, **kwargs: marker)
    assert p2p_log.install()
    try:
        assert wrapped(Unreadable(), [torch.ones(1)], 1, 0) is marker
        assert p2p_log.snapshot()["ops"] == []

        class GlooNamedBadly:
            def _get_backend(self, device: Any) -> Any:
                return type("ProcessGroupGloo", (), {})()

            @property
            def group_name(self) -> str:
                raise RuntimeError("destroyed")

        p2p_log._Log.warned = False
        with pytest.warns(RuntimeWarning, match="was not logged for the hang report: destroyed"):
            assert wrapped(GlooNamedBadly(), [torch.ones(1)], 1, 0) is marker
        assert p2p_log.snapshot()["ops"] == []
    finally:
        p2p_log.uninstall()
