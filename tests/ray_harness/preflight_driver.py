"""``nemo-rl-shim`` as a Ray driver that records, just before it disconnects, what its run left in the cluster.

Run by :mod:`tests.ray_harness.scenarios` as
``python -m tests.ray_harness.preflight_driver RECORD_JSON preflight --ray ...``.
Once a driver disconnects, Ray itself ends the job's actors and removes its placement
groups, so a leak check made afterwards cannot tell whether the command cleaned up. This
wraps ``ray.shutdown``: before the real call, it lists through Ray's state API the actors
and placement groups of this run (their names start with the run's tag, which is also the
driver's namespace) and writes them, with their states, to ``RECORD_JSON``. Nothing else
of the command changes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main", "this_runs_leftovers"]


def this_runs_leftovers() -> dict[str, Any]:
    """This driver's run (its namespace) as Ray's state API lists it now: actors and placement groups, with states."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    context = ray.get_runtime_context()
    tag = context.namespace
    # The connected head's address, not Ray's "auto": that scans this machine's processes, and finds every other
    # suite's (or job's) head too ("Found multiple active Ray instances"), whatever network namespace they live in.
    where = {"address": context.gcs_address, "limit": 10_000}
    actors = [a for a in list_actors(**where) if (a.name or "").startswith(tag)]
    groups = [g for g in list_placement_groups(**where) if (g.name or "").startswith(tag)]
    return {
        "tag": tag,
        "actors": [{"name": a.name, "state": a.state} for a in actors],
        "placement_groups": [{"name": g.name, "state": g.state} for g in groups],
    }


def _recording_before(shutdown: Callable[..., Any], record: Path) -> Callable[..., Any]:
    def shutdown_after_recording(*args: Any, **kwargs: Any) -> Any:
        try:
            seen: dict[str, Any] = this_runs_leftovers()
        except Exception as e:  # written to the record, so the test names it
            seen = {"error": f"{type(e).__name__}: {e}"}
        record.write_text(json.dumps(seen))
        return shutdown(*args, **kwargs)

    return shutdown_after_recording


def main(argv: list[str]) -> int:
    import ray

    from nemo_rl_shim.cli import main as command

    record, *args = argv
    ray.shutdown = _recording_before(ray.shutdown, Path(record))
    return command(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
