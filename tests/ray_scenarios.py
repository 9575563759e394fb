"""``nemo-rl-shim preflight --ray`` on a real local Ray head, inside a private network namespace.

Run by ``tests/test_ray_preflight.py`` as ``unshare --net -- python -m tests.ray_scenarios TEMP_DIR OUT_JSON``.
The namespace has loopback only, so the head, its workers and the torch.distributed ranks
all live on 127.0.0.1 and nothing can reach another host (outside it, Ray would pick this
machine's non-loopback address). Every process of this head lives in that namespace and
in no other; the test ends them all by it afterwards.

On one head (four CPUs), in order:

1. ``preflight --ray 127.0.0.1:PORT --json``: two CPU actors, every group at the timeout;
2. the same with rank 1 stalled for an hour (``--stall-rank 1 --stall-s 3600``) and
   ``--timeout-s`` of :data:`STALL_TIMEOUT_S`: one line naming the stalled actor, exit 1; with the
   Flight Recorder on (``--flight-recorder``, a 12 s timeout), ending with hang-report's line;
3. ``--world 16`` on this head of 2 CPU bundles: refused before any actor is placed, exit 2;
4. the leak check, for each run, made by its own driver through Ray's state API just
   before it disconnects (:mod:`tests.ray_preflight_driver`): after that, Ray would end the
   job's actors and remove its placement groups itself, and hide a leak.

Writes what it saw to ``OUT_JSON``; asserts nothing (the test does).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["HEAD_PORT", "PASS_TIMEOUT_S", "STALL_TIMEOUT_S", "main"]

HEAD_PORT = 6379  # the namespace is private: no other process can hold it
#: The actors' start and set-up fit (about 10 s alone, up to ~40 s while the rest of the suite loads both
#: cores); the stall (1 h) does not.
STALL_TIMEOUT_S = 60
#: The passing run's bound: ample for two actors to import, set up and check, under load.
PASS_TIMEOUT_S = 150
_RUN_TIMEOUT_S = 240  # beyond either --timeout-s and the clean-up after it
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


def _preflight(address: str, record: Path, *extra: str) -> dict[str, Any]:
    """The command, run by a driver that records its run's actors and placement groups before disconnecting."""
    driver = [sys.executable, "-m", "tests.ray_preflight_driver", str(record)]
    outcome = _run([*driver, "preflight", "--ray", address, "--json", *extra], _RUN_TIMEOUT_S)
    outcome["before_disconnect"] = json.loads(record.read_text()) if record.exists() else None
    try:
        outcome["report"] = json.loads(outcome.get("stdout") or "null")
    except json.JSONDecodeError as e:
        outcome["report"] = None
        outcome["json_error"] = str(e)
    return outcome


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
            # With the Flight Recorder on and a 12 s timeout: rank 0's collective times out, and the run ends
            # with hang-report's line (tests/test_ray_preflight.py).
            stall += ["--timeout-minutes", "0.2", "--flight-recorder", str(Path(temp_dir, "flight-recorder"))]
            facts["passing"] = _preflight(address, Path(temp_dir, "passing.json"), "--timeout-s", str(PASS_TIMEOUT_S))
            facts["stalled"] = _preflight(address, Path(temp_dir, "stalled.json"), *stall)
            facts["too_large"] = _preflight(address, Path(temp_dir, "too_large.json"), "--world", "16")
    except Exception as e:  # written to the result, so the test names it
        facts["error"] = f"{type(e).__name__}: {e}"
    Path(out_path).write_text(json.dumps(facts, default=str))
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
    )
    sys.exit(main(*sys.argv[1:]))
