"""``nemo-rl-shim preflight --ray`` on a real local Ray head, inside a private network namespace.

Run as ``unshare --net -- python -m tests.ray_harness.scenarios TEMP_DIR OUT_JSON`` (:mod:`.tree`), before
the suite's workers start when the run selects ``tests/cli/preflight/test_ray_preflight.py``; that test reads
``OUT_JSON``.
The namespace has loopback only, so the head, its workers and the torch.distributed ranks
all live on 127.0.0.1 and nothing can reach another host (outside it, Ray would pick this
machine's non-loopback address). Every process of this head lives in that namespace and
in no other; the test ends them all by it afterwards.

On one head (six CPUs), three runs, each by its own driver: the stalled one beside the other two, which run
one after the other (at most four actors set up at once, not six: on 2 cores, beside the suite's start-up
and a second suite, six at once left both stalled ranks in ``setup_distributed`` at 150 s in CI):

1. ``passing``: ``preflight --ray 127.0.0.1:PORT --json``: two CPU actors, every group at the timeout;
2. ``stalled``: the same with rank 1 stalled for an hour (``--stall-rank 1 --stall-s 3600``):
   rank 0 waits in its first collective (45 min) until ``--timeout-s`` of :data:`STALL_TIMEOUT_S`
   ends the run: one line naming the stalled actor and its phase, exit 1. Where either actor had not
   yet reached its phase at that bound (its set-up still running: a loaded machine), the run is made
   again with :data:`LOADED_STALL_TIMEOUT_S`, and the first try is kept for the test to print;
3. ``gave_up``: the same stall with a 12 s collective timeout and the Flight Recorder on
   (``--flight-recorder``): rank 0's collective times out and it gives up on its peers, so the
   run ends 10 s later, long before its ``--timeout-s``, naming the stalled actor, and ends
   with hang-report's line;

then:

4. ``too_large``: ``--world 16`` on this head of 2 CPU bundles: refused before any actor is placed, exit 2;
5. the leak check, for each run, made by its own driver through Ray's state API just
   before it disconnects (:mod:`tests.ray_harness.preflight_driver`): after that, Ray would end the
   job's actors and remove its placement groups itself, and hide a leak.

Writes what it saw to ``OUT_JSON``; asserts nothing (the test does).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.ray_harness.tree import HEAD_DONE

__all__ = ["HEAD_PORT", "LOADED_STALL_TIMEOUT_S", "PASS_TIMEOUT_S", "STALL_TIMEOUT_S", "main"]

HEAD_PORT = 6379  # the namespace is private: no other process can hold it
HEAD_ATTEMPTS = 2
#: The stalled run's bound, which the run always reaches. At 300 s it was the default lane's critical path (317 s
#: of pytest; the Ray file ended 92 s after every other file; 237 s at 120). The actors' start and set-up fit in it
#: when the machine is not overloaded (set-up ended 17 s into the run, under the full suite); the stall (1 h)
#: does not.
STALL_TIMEOUT_S = 120
#: The bound of the second try, made only when an actor's set-up had not ended at :data:`STALL_TIMEOUT_S`:
#: CI saw both ranks still in setup_distributed at 90 s once, and at 150 s with six actors setting up at once.
LOADED_STALL_TIMEOUT_S = 300
#: Where each rank is once both reached their phase: rank 0 in a collective, rank 1 in the fault injection.
_STALLED_PHASE = "stalling 3600 s after set-up (fault injection)"
#: The passing run's bound, and the gave-up run's (which must end long before it): ample for two actors
#: to import, set up and check, under load.
PASS_TIMEOUT_S = 300
_RUN_TIMEOUT_S = PASS_TIMEOUT_S + 90  # beyond either --timeout-s and the clean-up after it
#: Ray waits 60 s by default for its dashboard (which the state API behind the leak check needs); under
#: the suite's start-up load on 2 cores it took longer once in CI (``ray start`` exited 1 after 70 s).
_DASHBOARD_STARTUP_TIMEOUT_S = 180
_HEAD_TIMEOUT_S = _DASHBOARD_STARTUP_TIMEOUT_S + 60


def _run(args: list[str], timeout: float) -> dict[str, Any]:
    start = time.monotonic()
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        return {"returncode": None, "timed_out": True, "wall_s": time.monotonic() - start, "stderr": str(e)}
    return {
        "returncode": done.returncode,
        "timed_out": False,
        "wall_s": round(time.monotonic() - start, 2),
        "stdout": done.stdout,
        "stderr": done.stderr[-6000:],
    }


def _preflight(address: str, record: Path, *extra: str) -> dict[str, Any]:
    """The command, run by a driver that records its run's actors and placement groups before disconnecting."""
    driver = [sys.executable, "-m", "tests.ray_harness.preflight_driver", str(record)]
    outcome = _run([*driver, "preflight", "--ray", address, "--json", *extra], _RUN_TIMEOUT_S)
    outcome["before_disconnect"] = json.loads(record.read_text()) if record.exists() else None
    try:
        outcome["report"] = json.loads(outcome.get("stdout") or "null")
    except json.JSONDecodeError as e:
        outcome["report"] = None
        outcome["json_error"] = str(e)
    return outcome


def _both_reached_their_phase(outcome: dict[str, Any]) -> bool:
    """Whether the stalled run ended with rank 1 in the fault injection and rank 0 past its set-up."""
    ranks = {r.get("rank"): r for r in (outcome.get("report") or {}).get("ranks", []) if isinstance(r, dict)}
    waiting = str((ranks.get(0) or {}).get("phase") or "")
    return (ranks.get(1) or {}).get("phase") == _STALLED_PHASE and waiting.startswith("all_reduce")


def _stalled(address: str, temp_dir: str, stall: list[str]) -> dict[str, Any]:
    """The stalled run at :data:`STALL_TIMEOUT_S`; again at :data:`LOADED_STALL_TIMEOUT_S` where set-up outlasted it."""
    tries = []
    for bound in (STALL_TIMEOUT_S, LOADED_STALL_TIMEOUT_S):
        outcome = _preflight(address, Path(temp_dir, f"stalled-{bound}.json"), *stall, "--timeout-s", str(bound))
        outcome["bound_s"] = bound
        tries.append(outcome)
        if _both_reached_their_phase(outcome):
            break
    return {**tries[-1], "earlier_tries": tries[:-1]}


def _end_the_others_in_this_namespace() -> int:
    """SIGKILL every process in this network namespace but this one and its ancestors: a failed head's."""
    own = os.readlink("/proc/self/ns/net")
    keep, pid = set(), os.getpid()
    while pid > 1:  # this process and its ancestors (the unshare wrapper among them)
        keep.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    ended = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        try:
            if os.readlink(entry / "ns" / "net") == own:
                os.kill(int(entry.name), signal.SIGKILL)
                ended += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass  # gone already, or not ours to see
    return ended


def _start_head(ray: str, temp_dir: str, facts: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``ray start --head``, tried up to :data:`HEAD_ATTEMPTS` times, each on a fresh port.

    Ray waits a fixed 30 s for its raylet to register with the GCS (``ray/_private/node.py``, not
    configurable). On 2 cores, at the suite's start-up peak, it once missed that and ``ray start``
    exited 1 after 99 s. A failed head's processes are ended before the next try; each failure's
    stderr is kept in ``facts["head_failures"]`` for the test to print.
    """
    for attempt in range(HEAD_ATTEMPTS):
        port = HEAD_PORT + attempt
        head = [ray, "start", "--head", f"--port={port}", "--num-cpus=6", "--num-gpus=0", "--include-dashboard=true",
                "--dashboard-host=127.0.0.1", "--disable-usage-stats", f"--temp-dir={temp_dir}"]  # fmt: skip
        outcome = _run(head, _HEAD_TIMEOUT_S)
        if outcome["returncode"] == 0:
            break
        ended = _end_the_others_in_this_namespace()
        failure = {
            "port": port,
            "wall_s": outcome["wall_s"],
            "ended": ended,
            "stderr": outcome.get("stderr", "")[-1500:],
        }
        facts.setdefault("head_failures", []).append(failure)
    return outcome, f"127.0.0.1:{port}"


def main(temp_dir: str, out_path: str) -> int:
    up = _run(["ip", "link", "set", "lo", "up"], 30)
    facts: dict[str, Any] = {"loopback_up": up}
    ray = str(Path(sys.executable).with_name("ray"))
    try:
        facts["head"], address = _start_head(ray, temp_dir, facts)
        Path(temp_dir, HEAD_DONE).touch()  # the pytest process waits for this before it starts the workers
        if facts["head"]["returncode"] == 0:
            stall = ["--stall-rank", "1", "--stall-s", "3600"]
            # A 12 s collective timeout and the Flight Recorder on: rank 0's collective times out, it gives up
            # on its peers, and the run ends with hang-report's line (tests/cli/preflight/test_ray_preflight.py).
            fr = ["--timeout-minutes", "0.2", "--flight-recorder", str(Path(temp_dir, "flight-recorder"))]
            runs = {
                "passing": ["--timeout-s", str(PASS_TIMEOUT_S)],
                "gave_up": [*stall, *fr, "--timeout-s", str(PASS_TIMEOUT_S)],
            }

            def one_after_the_other(*names: str) -> dict[str, Any]:
                return {name: _preflight(address, Path(temp_dir, f"{name}.json"), *runs[name]) for name in names}

            with ThreadPoolExecutor(max_workers=2) as pool:
                queues = [
                    pool.submit(lambda: {"stalled": _stalled(address, temp_dir, stall)}),
                    pool.submit(one_after_the_other, "passing", "gave_up"),
                ]
                for queue in queues:
                    facts.update(queue.result())
            facts["too_large"] = _preflight(address, Path(temp_dir, "too_large.json"), "--world", "16")
    except Exception as e:  # written to the result, so the test names it
        facts["error"] = f"{type(e).__name__}: {e}"
    written = Path(f"{out_path}.part")
    written.write_text(json.dumps(facts, default=str))
    written.replace(out_path)
    return 0


if __name__ == "__main__":
    # Token authentication, as Ray 2.60 starts a head by default: one token for this head and every client
    # of it, in the environment (nothing is written to ~/.ray).
    # And as ray.sub does: no `uv run` runtime env for the workers (this runs under `uv run pytest` in CI).
    os.environ.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
        RAY_DASHBOARD_STARTUP_TIMEOUT_S=str(_DASHBOARD_STARTUP_TIMEOUT_S),
    )
    sys.exit(main(*sys.argv[1:]))
