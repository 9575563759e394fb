"""A stalled rank on a sub-group with a short timeout: the waiting rank raises instead of hanging.

Two real Gloo ranks build the real 0.7.0 mesh after ``apply()``, with a 3 s
timeout (0.05 min) for the mesh and a 5 min default group, so the world-sized
``dp_shard`` axis gets its own two-rank group carrying 3 s. Rank 1 sleeps and
never enters the ``dp_shard`` collective; rank 0's all_reduce must raise
RuntimeError. The spawn's time limit bounds the test; the measured detection
time is reported, not asserted against an upper bound (no timed tests).
"""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_shim.cli.preflight.spawn import spawn_ranks

__all__: list[str] = []

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

WORLD_SIZE = 2
SPAWN_TIMEOUT_S = 300
DEFAULT_MINUTES = 5
TIMEOUT_MINUTES = 0.05  # 3 s
TIMEOUT_S = TIMEOUT_MINUTES * 60
STALLED_RANK = 1
STALL_S = TIMEOUT_S + 7  # longer than the timeout; then it leaves without touching the broken group


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    results = spawn_ranks(
        "tests.ranks.patch:fault_on_sub_group",
        {
            "default_minutes": DEFAULT_MINUTES,
            "timeout_minutes": TIMEOUT_MINUTES,
            "stalled_rank": STALLED_RANK,
            "stall_s": STALL_S,
        },
        world_size=WORLD_SIZE,
        timeout_s=SPAWN_TIMEOUT_S,
        check=False,  # a rank may exit uncleanly after writing its result (teardown of the timed-out group)
    )
    missing = [f"rank {r.rank}: {r.error or r.output[-2000:]}" for r in results if not isinstance(r.result, dict)]
    assert not missing, "ranks without a result:\n" + "\n".join(missing)
    return {r.result["role"]: r.result for r in results}


def test_sub_group_is_real_and_carries_the_short_timeout(reports: dict[str, dict[str, Any]]) -> None:
    for report in reports.values():
        assert report["apply"] == "applied"
        assert report["group_size"] == WORLD_SIZE
        assert not report["is_default_group"], "dp_shard reused the default group; the fault would hit the wrong group"
        assert report["timeout_s"]["cpu"] == pytest.approx(TIMEOUT_S)


def test_waiting_rank_raises_after_the_timeout(reports: dict[str, dict[str, Any]]) -> None:
    waiting = reports["waiting"]
    print(f"sub-group timeout {TIMEOUT_S:.1f} s detected after {waiting.get('detection_s')} s")  # shown with -s / -rP
    assert waiting["raised"] == "RuntimeError", f"all_reduce on the stalled sub-group did not raise: {waiting}"
    assert "Timed out" in waiting["message"], waiting["message"]
    assert waiting["detection_s"] >= TIMEOUT_S, f"raised after {waiting['detection_s']:.3f} s, before the timeout"


def test_stalled_rank_sleeps_through_the_timeout_and_leaves_over_the_default_group(
    reports: dict[str, dict[str, Any]],
) -> None:
    stalled = reports["stalled"]
    assert stalled["rank"] == STALLED_RANK
    assert stalled["entered_sub_group_collective"] is False
    assert stalled["slept_s"] >= STALL_S > TIMEOUT_S, stalled
    # Both ranks met on the default group afterwards: only the sub-group was broken by the time-out.
    assert stalled["left_through_default_group"] is True
    assert reports["waiting"]["left_through_default_group"] is True
