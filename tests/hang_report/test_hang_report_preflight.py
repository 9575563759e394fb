"""``preflight --flight-recorder DIR --stall-rank 1`` ends with hang-report's line naming rank 1 and the collective.

Two real runs of the command at once (one module fixture, so that they share the wait): spawned
local ranks, and ``torchrun`` with two ranks. Rank 1 sleeps an hour after set-up (fault injection);
rank 0's first all-reduce times out after the start-up timeout (0.2 min: the rendezvous runs under
it too, and ranks on busy cores arrive seconds apart), rank 0 dumps, asks rank 1's watcher to
dump, and gives up on its peers (skips the collectives left). Spawned, the run ends 15 s later,
long before ``--timeout-s``; under torchrun, rank 0 reports once its gather times out. Either way
the text report's last line and the last line on stderr are hang-report's.
The Ray run is in tests/ray_harness/scenarios.py.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import pytest

from nemo_rl_shim.cli.preflight.stuck import FAILURE_GRACE_S
from tests.harness.at_once import run_at_once
from tests.harness.paths import REPO_ROOT

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_lane]

#: --timeout-s: set-up of two ranks and the 12 s timeout fit many times over (the ranks are forked from a server
#: that imported torch and Automodel once, tests/conftest.py: about 25 s in all on 2 busy cores). Neither run
#: reaches it: the spawned one ends 15 s after rank 0 gives up, torchrun's when rank 0's gather times out.
TIMEOUT_S = 150
#: The subprocess bound: the run, plus the command's imports and its fork server's (which import torch and
#: Automodel once before the ranks are forked and the run's own bound starts: up to 50 s on a loaded lane),
#: plus the 5 s hang-report wait.
BOUND_S = TIMEOUT_S + 90
STALL = ["--stall-rank", "1", "--stall-s", "3600", "--timeout-minutes", "0.2", "--timeout-s", str(TIMEOUT_S)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return {**env, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    base = tmp_path_factory.mktemp("hang-preflight")
    from nemo_rl_shim.cli.preflight.spawn import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip
    commands = {
        "spawn": [sys.executable, "-m", "nemo_rl_shim", "preflight", *STALL],
        "torchrun": [*torchrun, "-m", "nemo_rl_shim", "preflight", *STALL],
    }
    # Each in its own process group, killed whole at the bound and at the end: a killed command's forked
    # ranks (children of its fork server) and torchrun's ranks go with it (tests/harness/at_once.py).
    ended = run_at_once(
        {name: ([*command, "--flight-recorder", str(base / name)], _env()) for name, command in commands.items()},
        timeout_s=BOUND_S,
        cwd=REPO_ROOT,
    )
    return {
        name: {"rc": run.returncode, "out": run.stdout, "err": run.stderr, "wall_s": run.wall_s, "dir": base / name}
        for name, run in ended.items()
    }


@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_preflight_ends_with_the_hang_report_line(runs, launcher: str, record_property) -> None:
    run = runs[launcher]
    record_property("wall_s", round(run["wall_s"], 1))
    print(f"\n{launcher}: exit {run['rc']} after {run['wall_s']:.1f} s")
    assert run["rc"] != 0, run["out"]
    report = [line for line in run["out"].splitlines() if line.strip()]
    assert report, f"no report on stdout; stderr:\n{run['err'][-3000:]}"
    last = report[-1]
    kind = r"never came(?: \([^)]*\))?"  # placed by its stack, or not: the kind a rank that never came has
    head = rf"hang report \(dumps in {re.escape(str(run['dir']))}\): {kind}: rank 1 did not enter all_reduce #"
    assert re.match(head, last), f"{last}\n--- stderr:\n{run['err'][-3000:]}"
    assert "on default" in last and "ranks 0-1, in which rank 0 waited" in last, last
    err = [line for line in run["err"].splitlines() if line.startswith("preflight: hang report")]
    assert err and err[-1] == f"preflight: {last}", err


def test_rank_1_dumped_while_stalled(runs) -> None:
    import pickle

    for name, run in runs.items():
        dump = pickle.loads((run["dir"] / "fr_trace_rank_1").read_bytes())
        assert dump["nemo_rl_shim"]["reason"].startswith("rank 0 asked: preflight cpu all_reduce"), (name, dump)


def test_the_spawned_run_ends_after_rank_0_gives_up_not_at_timeout_s(runs) -> None:
    """Rank 0 gave up on its peers: one ``FAILED`` line names rank 1 as stuck 15 s later, then the hang line."""
    err = runs["spawn"]["err"]
    failed = [line for line in err.splitlines() if "FAILED" in line]
    assert len(failed) == 1, err[-3000:]
    assert failed[0] == (
        f"preflight: FAILED: rank 1 did not finish: still running {FAILURE_GRACE_S:g} s after rank 0 gave up on its "
        "peers (its cpu all_reduce on group default timed out): a rank is stuck in a collective"
    ), failed[0]
    assert err.rstrip().splitlines()[-1].startswith("preflight: hang report"), err[-3000:]
