"""The local rank launcher: how a run ends, and where its ranks meet (a port rank 0 binds itself).

Real ranks (real processes; on gloo where they meet).
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from nemo_rl_shim.cli.preflight import rendezvous, spawn
from nemo_rl_shim.cli.preflight.results import gave_up_on_peers
from nemo_rl_shim.cli.preflight.stuck import FAILURE_GRACE_S

__all__: list[str] = []

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

RENDEZVOUS = "tests.ranks.fresh_group:rendezvous"


def test_rank_0_binds_the_rendezvous_port_and_two_worlds_at_once_each_meet_on_their_own() -> None:
    """Each world's rank 0 binds a port the kernel picks before its peers learn it: no world can take another's."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        worlds = list(pool.map(lambda n: spawn.spawn_ranks(RENDEZVOUS, {}, world_size=n, timeout_s=180), (2, 3)))
    ports = [{r.result["port"] for r in results} for results in worlds]
    assert [len(p) for p in ports] == [1, 1] and ports[0] != ports[1], ports
    assert [[r.result["sum"] for r in results] for results in worlds] == [[2.0, 2.0], [3.0, 3.0, 3.0]]
    assert all(port in spawn._ephemeral_ports() for (port,) in ports), ports  # the kernel's pick, not free_port's


def test_a_rank_told_no_port_file_keeps_the_launchers_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rendezvous.PORT_FILE_ENV, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert rendezvous.take_rendezvous_port() is None
    assert os.environ["MASTER_PORT"] == "29500"


def test_a_picked_port_is_free_and_outside_the_kernels_ephemeral_range() -> None:
    """No bind(0) and no outgoing connection (Gloo's full mesh, the machine's other work) can take it before use."""
    ephemeral = spawn._ephemeral_ports()
    picks = {spawn.free_port() for _ in range(20)}
    assert not any(port in ephemeral for port in picks), (picks, ephemeral)
    assert picks <= set(spawn.LISTEN_PORTS) and len(picks) > 1, picks  # at random: two suites rarely pick alike
    for port in picks:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_where_the_ephemeral_range_covers_every_listen_port_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn, "_ephemeral_ports", lambda: range(1, 65536))
    port = spawn.free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_a_real_failure_is_not_retried() -> None:
    results = spawn.spawn_ranks("tests.ranks.fresh_group:no_such_function", {}, world_size=1, timeout_s=60, check=False)
    (result,) = results
    assert not result.ok and "AttributeError" in result.error


def test_a_rank_that_gave_up_on_its_peers_ends_the_run_after_the_grace() -> None:
    """Rank 0 finishes but says a collective timed out on its peers: rank 1 gets 15 s, then is killed and named."""
    params = {"stall_rank": 1, "result": {"gave_up": "its cpu all_reduce on group default timed out"}}
    results = spawn.spawn_ranks(
        "tests.ranks.fresh_group:stall_or_report",
        params,
        world_size=2,
        timeout_s=600,
        check=False,
        gave_up=gave_up_on_peers,
    )
    assert results[0].ok and not results[1].ok and not results[1].timed_out
    why = (
        f"still running {FAILURE_GRACE_S:g} s after rank 0 gave up on its peers "
        "(its cpu all_reduce on group default timed out)"
    )
    assert (results[1].killed_because, results[1].error) == (why, f"rank 1 killed: {why}")


def test_a_rank_that_finishes_cleanly_does_not_end_the_others_the_deadline_does() -> None:
    """A finished rank that gave up on nothing is no reason to stop: the deadline (20 s, past the 15 s grace) is."""
    params = {"stall_rank": 1, "result": {"gave_up": None}}
    results = spawn.spawn_ranks(
        "tests.ranks.fresh_group:stall_or_report",
        params,
        world_size=2,
        timeout_s=20,
        check=False,
        gave_up=gave_up_on_peers,
    )
    assert [(r.ok, r.timed_out, r.killed_because) for r in results] == [(True, False, None), (False, True, None)]
    assert results[1].error is None  # no result file, no error of its own: it ran out of time
