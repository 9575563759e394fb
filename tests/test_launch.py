"""The local rank launcher: a rendezvous port taken between picking it and binding it costs a retry, not a run.

Real ranks on gloo. The one thing arranged is the race itself: the port picker's first answer
is a port this test holds bound (as Gloo's own ephemeral sockets sometimes do), and only the
picker is replaced, for that one call.
"""

from __future__ import annotations

import socket

import pytest

from nemo_rl_shim.cli import launch

__all__: list[str] = []

pytestmark = pytest.mark.multiprocess


def test_a_taken_rendezvous_port_is_retried_on_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        picks = [taken.getsockname()[1]]
        real_free_port = launch.free_port

        def picker() -> int:
            picks.append(real_free_port())
            return picks[-2] if len(picks) == 2 else picks[-1]

        monkeypatch.setattr(launch, "free_port", picker)
        results = launch.spawn_ranks("tests.worlds:rendezvous", {}, world_size=2, timeout_s=180)
    assert [r.result["sum"] for r in results] == [2.0, 2.0]
    assert {r.result["port"] for r in results} == {picks[-1]} != {picks[0]}, picks
    assert len(picks) == 3, f"expected one lost port, then one retry: {picks}"


def test_a_real_failure_is_not_retried() -> None:
    results = launch.spawn_ranks("tests.worlds:no_such_function", {}, world_size=1, timeout_s=60, check=False)
    (result,) = results
    assert not result.ok and "AttributeError" in result.error
