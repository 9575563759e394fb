"""``nemo-rl-shim preflight --ray`` against a real local Ray head: passing, stalled, and nothing left behind.

The head, the CLI runs and the leak check run in one process tree inside a private network
namespace (:mod:`tests.ray_scenarios`, started with ``unshare --net``): loopback only, as
the workplace requires, and no port clash with anything outside. Bounded: the whole tree is
killed at :data:`SCENARIOS_TIMEOUT_S`, and every process of the head is ended afterwards,
failure included. They are found by that network namespace, which each of them holds and
no other process does: Ray's agents and client server start their own sessions and carry
nothing of the head's temp dir on their command lines, so neither the process group nor
the command line finds them all. A test fails if one is left.

Measured figures (wall time of the passing run, time to report the stall) are printed and
recorded with ``record_property``; nothing is asserted against a clock except the bound
the command itself enforces (``--timeout-s``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_shim.cli._rank_checks import SKIPPED
from nemo_rl_shim.cli.ray_preflight import FAILURE_GRACE_S
from tests.conftest import unavailable
from tests.ray_scenarios import PASS_TIMEOUT_S, STALL_TIMEOUT_S

__all__: list[str] = []

pytestmark = [pytest.mark.multiprocess, pytest.mark.ray]

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS_TIMEOUT_S = 480
TIMEOUT_MINUTES = 45.0
#: How long the clean-up keeps killing what is left in the head's network namespace.
CLEANUP_S = 30.0


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


def _network_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie (which holds no namespace)
        return None


def _pinned_namespace(process: subprocess.Popen) -> tuple[str | None, int | None]:
    """The private network namespace ``unshare --net`` made for ``process``, and a descriptor that holds it.

    While the descriptor is open the namespace cannot be freed, so its name cannot pass to a
    namespace made later (say, by another Ray test on the same machine) while the clean-up
    still goes by it. ``(None, None)`` if ``process`` never entered one within 30 s.
    """
    ours = _network_namespace(os.getpid())
    end = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < end:
        try:
            pin = os.open(f"/proc/{process.pid}/ns/net", os.O_RDONLY)
        except OSError:
            pin = None
        if pin is not None:
            name = os.readlink(f"/proc/self/fd/{pin}")  # the namespace the descriptor holds: "net:[inode]"
            if name != ours:
                return name, pin
            os.close(pin)
        time.sleep(0.01)
    return None, None


def _processes_in(namespace: str) -> dict[int, str]:
    """``{pid: command line}`` of every live process in the network namespace ``namespace``."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _network_namespace(int(entry.name)) == namespace:
            try:
                found[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def _end_ray_processes(namespace: str | None, temp_dir: str) -> dict[int, str]:
    """Kill every process in the head's network namespace until none is left (bounded); return those it found."""
    if namespace is None:  # the namespace was never seen: the command line is all there is to go by
        subprocess.run(["pkill", "-KILL", "-f", temp_dir], capture_output=True, timeout=30, check=False)
        return {}
    found: dict[int, str] = {}
    end = time.monotonic() + CLEANUP_S
    while (alive := _processes_in(namespace)) and time.monotonic() < end:
        found.update(alive)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.1)
    return found


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
    namespace, pin = _pinned_namespace(process)
    try:
        output, _ = process.communicate(timeout=SCENARIOS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Ray scenarios did not finish within {SCENARIOS_TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        ended = _end_ray_processes(namespace, temp_dir)
        left = _processes_in(namespace) if namespace else None
        if pin is not None:
            os.close(pin)
    facts = json.loads(out.read_text()) if out.exists() else {"error": f"no result; output:\n{output[-4000:]}"}
    facts["clean_up"] = {
        "namespace": namespace,
        "ended": sorted(ended.values()),
        "left": sorted(left.values()) if left is not None else None,
    }
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert "error" not in facts, facts["error"]
    assert facts["loopback_up"]["returncode"] == 0, facts["loopback_up"]
    for failure in facts.get("head_failures", []):  # a try that failed before the head came up (ray_scenarios)
        print(f"\nray start --head failed on port {failure['port']} after {failure['wall_s']} s:\n{failure['stderr']}")
    head = facts["head"]
    assert head["returncode"] == 0, f"ray start --head: {head}; stderr ends:\n{head.get('stderr', '')[-3000:]}"
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


def _failure_line(run: dict[str, Any]) -> str:
    assert run["returncode"] == 1, run["stderr"]
    failed = [line for line in run["stderr"].splitlines() if "FAILED" in line]
    assert len(failed) == 1, run["stderr"]
    return failed[0]


def test_a_stalled_actor_is_named_in_one_line_within_the_bound(scenarios, record_property) -> None:
    """Rank 0 waits in a collective at the 45-minute timeout: ``--timeout-s`` ends the run, naming both phases."""
    run = scenarios["stalled"]
    line = _failure_line(run)
    actor = r"\(actor nemo-rl-shim-preflight-[0-9a-f]{8}-rank%d on node 127\.0\.0\.1\)"
    expected = (
        rf"preflight: FAILED: ranks 0, 1 did not finish within {STALL_TIMEOUT_S} s \(--timeout-s\): "
        rf"rank 0 {actor % 0} was in all_reduce on group default; "
        rf"rank 1 {actor % 1} was in stalling 3600 s after set-up \(fault injection\)"
    )
    assert re.fullmatch(expected, line), line
    assert run["report"]["timed_out"] is True and run["report"]["ok"] is False
    record_property("stall_report_s", run["wall_s"])
    print(f"\nstalled actor reported after {run['wall_s']} s (--timeout-s {STALL_TIMEOUT_S})")


def test_a_peer_that_gives_up_ends_the_run_before_its_bound(scenarios, record_property) -> None:
    """Rank 0's collective times out (12 s): it skips the rest, and the run ends 10 s later, not at ``--timeout-s``."""
    run = scenarios["gave_up"]
    line = _failure_line(run)
    expected = (
        f"rank 1 did not finish: still running {FAILURE_GRACE_S:g} s after rank 0 gave up on its peers "
        "(its cpu all_reduce on group default timed out): rank 1 (actor nemo-rl-shim-preflight-"
    )
    assert expected in line, line
    assert "was in stalling 3600 s after set-up (fault injection)" in line, line
    assert run["report"]["timed_out"] is False and run["report"]["ok"] is False
    (rank_0,) = [r for r in run["report"]["ranks"] if r["rank"] == 0]
    outcomes = [row["cpu_all_reduce"] for row in rank_0["rows"]]
    assert outcomes[0].startswith("failed: RuntimeError") and set(outcomes[1:]) == {SKIPPED}, outcomes
    record_property("gave_up_report_s", run["wall_s"])
    print(f"\nstalled actor reported after {run['wall_s']} s (--timeout-s {PASS_TIMEOUT_S} not reached)")


def test_a_stalled_actor_is_named_by_the_flight_recorder_dumps(scenarios) -> None:
    """Both actors wrote their dumps on their node (one node here); the driver read them after the run."""
    hang = scenarios["gave_up"]["report"]["hang_report"]
    assert hang["line"].startswith("rank 1 did not enter all_reduce #"), hang
    assert "on default" in hang["line"] and "in which rank 0 waited" in hang["line"], hang["line"]
    assert "written by the Ray actors on their node (127.0.0.1)" in hang["summary"], hang["summary"]
    assert sorted(hang["dumps"]) == ["0", "1"] or sorted(hang["dumps"]) == [0, 1], hang["dumps"]
    assert scenarios["gave_up"]["stderr"].rstrip().splitlines()[-1] == f"preflight: {hang['summary']}"


def test_a_world_larger_than_the_cluster_is_refused_before_placing_actors(scenarios) -> None:
    run = scenarios["too_large"]
    assert run["returncode"] == 2, run["stderr"]
    lines = [line for line in run["stderr"].splitlines() if line.startswith("preflight: the config asks")]
    assert lines == [
        "preflight: the config asks for 16 training ranks, from --world 16; the Ray cluster can place 2 ranks (no GPU "
        "in the Ray cluster: 2 CPU bundles (gloo), strategy PACK): check that layout with --dry-run, or run on a Ray "
        "cluster with 16 GPUs (--world N or --nproc N checks N ranks here instead)"
    ], run["stderr"]
    seen = run["before_disconnect"]
    assert seen is not None and (seen["actors"], seen["placement_groups"]) == ([], []), seen


@pytest.mark.parametrize("run", ["passing", "stalled", "gave_up"])
def test_no_actor_or_placement_group_is_left_when_the_driver_disconnects(scenarios, run: str) -> None:
    """Seen by the command's own driver just before it disconnects (after that, Ray would end them itself).

    Measured: a clean-up that skips removing the placement group on the failure path fails here
    (the group is still CREATED). One that skips ``ray.kill`` but removes the group passes, and
    rightly: Ray kills the actors placed in a group when the group is removed.
    """
    seen = scenarios[run]["before_disconnect"]
    assert seen is not None, f"the {run} run's driver recorded nothing before disconnecting: {scenarios[run]}"
    assert "error" not in seen, seen["error"]
    assert len(seen["actors"]) == 2, seen  # two actors: both created, both gone
    assert {a["state"] for a in seen["actors"]} == {"DEAD"}, seen["actors"]
    assert len(seen["placement_groups"]) == 1, seen
    assert {g["state"] for g in seen["placement_groups"]} == {"REMOVED"}, seen["placement_groups"]


def test_no_process_of_the_head_outlives_the_clean_up(scenarios, record_property) -> None:
    clean_up = scenarios["clean_up"]
    assert clean_up["namespace"] is not None, "the head's network namespace was never seen: nothing to clean up by"
    assert clean_up["ended"], "the clean-up found no process of the head in its namespace; it would miss them all"
    assert clean_up["left"] == [], f"processes of the head outlived the clean-up: {clean_up['left']}"
    record_property("head_processes_ended", len(clean_up["ended"]))
    names = "; ".join(command[:100] for command in clean_up["ended"])
    print(f"\nclean-up ended {len(clean_up['ended'])} processes of the head: {names}")
