"""``nemo-rl-shim preflight --ray`` against a real local Ray head: passing, stalled, and nothing left behind.

The head, the CLI runs and the leak check run in one process tree inside a private network
namespace (:mod:`tests.ray_scenarios`, started with ``unshare --net``): loopback only, as
the workplace requires, and no port clash with anything outside. Bounded: the whole tree is
killed at :data:`SCENARIOS_TIMEOUT_S`, and every Ray process (found by the head's unique
temp dir on its command line) is ended afterwards, failure included.

Measured figures (wall time of the passing run, time to report the stall) are printed and
recorded with ``record_property``; nothing is asserted against a clock except the bound
the command itself enforces (``--timeout-s``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unavailable
from tests.ray_scenarios import STALL_TIMEOUT_S

__all__: list[str] = []

pytestmark = [pytest.mark.multiprocess, pytest.mark.ray]

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS_TIMEOUT_S = 480
TIMEOUT_MINUTES = 45.0


def _private_network_namespace() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        unavailable(f"the Ray tests run in a private network namespace and need unshare and ip: unshare={unshare}, "
                    f"ip={shutil.which('ip')}")  # fmt: skip
    probe = subprocess.run([unshare, "--net", "--", "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        unavailable(f"cannot make a private network namespace (unshare --net: {probe.stderr.strip()}): the Ray "
                    "tests keep Ray on loopback only")  # fmt: skip
    return [unshare, "--net", "--"]


def _end_ray_processes(temp_dir: str) -> None:
    subprocess.run(["pkill", "-KILL", "-f", temp_dir], capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def scenarios() -> dict[str, Any]:
    pytest.importorskip("ray", reason="the ray extra is not installed (uv sync --extra ray)")
    wrapper = _private_network_namespace()
    temp_dir = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's socket paths live under it
    out = Path(temp_dir) / "scenarios.json"
    process = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "tests.ray_scenarios", temp_dir, str(out)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=SCENARIOS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Ray scenarios did not finish within {SCENARIOS_TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        _end_ray_processes(temp_dir)
    facts = json.loads(out.read_text()) if out.exists() else {"error": f"no result; output:\n{output[-4000:]}"}
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert "error" not in facts, facts["error"]
    assert facts["loopback_up"]["returncode"] == 0, facts["loopback_up"]
    assert facts["head"]["returncode"] == 0, facts["head"]
    return facts


def test_two_cpu_actors_pass_with_every_group_at_the_timeout(scenarios, record_property) -> None:
    run = scenarios["passing"]
    assert run["returncode"] == 0, run["stderr"]
    report = run["report"]
    assert (report["ok"], report["launcher"], report["world_size"]) == (True, "ray", 2)
    assert report["note"] == "no GPU in the Ray cluster: 2 CPU bundles (gloo), strategy PACK"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    nodes = {r["node"]["node_id"] for r in report["ranks"]}
    assert len(nodes) == 1 and {r["node"]["node_ip"] for r in report["ranks"]} == {"127.0.0.1"}
    for rank in report["ranks"]:
        assert {"default", "dp_shard", "tp", "dp"} <= {row["group"] for row in rank["rows"]}
        for row in rank["rows"]:
            assert set(row["timeout_minutes"].values()) == {TIMEOUT_MINUTES}, row
            assert row["cpu_all_reduce"] == "ok", row
        assert rank["offload"]["ok"], rank["offload"]
    record_property("ray_preflight_wall_s", run["wall_s"])
    print(f"\nRay preflight, 2 CPU actors: exit 0 in {run['wall_s']} s (report wall {report['wall_s']} s)")


def test_a_stalled_actor_is_named_in_one_line_within_the_bound(scenarios, record_property) -> None:
    run = scenarios["stalled"]
    assert run["returncode"] == 1, run["stderr"]
    failed = [line for line in run["stderr"].splitlines() if "FAILED" in line]
    assert len(failed) == 1, run["stderr"]
    line = failed[0]
    assert f"did not finish within {STALL_TIMEOUT_S} s (--timeout-s)" in line, line
    assert "rank 1 (actor nemo-rl-shim-preflight-" in line, line
    assert "was in stalling 3600 s after set-up (fault injection)" in line, line
    assert run["report"]["timed_out"] is True and run["report"]["ok"] is False
    record_property("stall_report_s", run["wall_s"])
    print(f"\nstalled actor reported after {run['wall_s']} s (--timeout-s {STALL_TIMEOUT_S})")


def test_no_actor_or_placement_group_is_left_behind(scenarios) -> None:
    leaks = scenarios["leaks"]
    assert len(leaks["actors"]) == 4, leaks  # two runs, two actors each: all created, all gone
    assert {a["state"] for a in leaks["actors"]} == {"DEAD"}, leaks["actors"]
    assert len(leaks["placement_groups"]) == 2, leaks
    assert {g["state"] for g in leaks["placement_groups"]} == {"REMOVED"}, leaks["placement_groups"]
