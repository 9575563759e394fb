"""``nemo-rl-shim preflight --ray`` on a real local Ray head, inside a private network namespace.

Run by ``tests/test_ray_preflight.py`` as ``unshare --net -- python -m tests.ray_scenarios TEMP_DIR OUT_JSON``.
The namespace has loopback only, so the head, its workers and the torch.distributed ranks
all live on 127.0.0.1 and nothing can reach another host (outside it, Ray would pick this
machine's non-loopback address). Every Ray process carries ``TEMP_DIR`` (the head's
``--temp-dir``) on its command line; the test ends them all by it afterwards.

On one head (four CPUs), two runs side by side, then the leak check:

1. ``preflight --ray 127.0.0.1:PORT --json``: two CPU actors, every group at the timeout;
2. the same with rank 1 stalled for an hour (``--stall-rank 1 --stall-s 3600``) and
   ``--timeout-s`` of :data:`STALL_TIMEOUT_S`: one line naming the stalled actor, exit 1;
3. after both: the leak check, through Ray's state API: actors still alive and placement
   groups not removed, among those the two runs created.

Writes what it saw to ``OUT_JSON``; asserts nothing (the test does).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["HEAD_PORT", "STALL_TIMEOUT_S", "main"]

HEAD_PORT = 6379  # the namespace is private: no other process can hold it
STALL_TIMEOUT_S = 45  # the actors' set-up (~10-20 s on two busy cores) fits; the stall (1 h) does not
_RUN_TIMEOUT_S = 240
_HEAD_TIMEOUT_S = 120


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


def _preflights(address: str, runs: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The named preflight runs, side by side on the same head (each bounded), and what each printed."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        command = [sys.executable, "-m", "nemo_rl_shim", "preflight", "--ray", address, "--json"]
        futures = {name: pool.submit(_run, [*command, *extra], _RUN_TIMEOUT_S) for name, extra in runs.items()}
        outcomes = {name: future.result() for name, future in futures.items()}
    for outcome in outcomes.values():
        try:
            outcome["report"] = json.loads(outcome.get("stdout") or "null")
        except json.JSONDecodeError as e:
            outcome["report"] = None
            outcome["json_error"] = str(e)
    return outcomes


def _leaks(address: str) -> dict[str, Any]:
    import ray
    from ray.util.state import list_actors, list_placement_groups

    ray.init(address=address, log_to_driver=False)
    try:
        actors = [a for a in list_actors(limit=10_000) if (a.name or "").startswith("nemo-rl-shim-preflight-")]
        groups = [
            g for g in list_placement_groups(limit=10_000) if (g.name or "").startswith("nemo-rl-shim-preflight-")
        ]
        return {
            "actors": [{"name": a.name, "state": a.state} for a in actors],
            "placement_groups": [{"name": g.name, "state": g.state} for g in groups],
        }
    finally:
        ray.shutdown()


def main(temp_dir: str, out_path: str) -> int:
    up = _run(["ip", "link", "set", "lo", "up"], 30)
    facts: dict[str, Any] = {"loopback_up": up}
    address = f"127.0.0.1:{HEAD_PORT}"
    ray = str(Path(sys.executable).with_name("ray"))
    head = [ray, "start", "--head", f"--port={HEAD_PORT}", "--num-cpus=4", "--num-gpus=0", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", "--disable-usage-stats", f"--temp-dir={temp_dir}"]  # fmt: skip
    try:
        facts["head"] = _run(head, _HEAD_TIMEOUT_S)
        if facts["head"]["returncode"] == 0:
            stall = ["--stall-rank", "1", "--stall-s", "3600", "--timeout-s", str(STALL_TIMEOUT_S)]
            facts.update(_preflights(address, {"passing": [], "stalled": stall}))
            facts["leaks"] = _leaks(address)
    except Exception as e:  # written to the result, so the test names it
        facts["error"] = f"{type(e).__name__}: {e}"
    Path(out_path).write_text(json.dumps(facts, default=str))
    return 0


if __name__ == "__main__":
    # Token authentication, as Ray 2.60 starts a head by default: one token for this head and every client
    # of it, in the environment (nothing is written to ~/.ray).
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0")
    sys.exit(main(*sys.argv[1:]))
