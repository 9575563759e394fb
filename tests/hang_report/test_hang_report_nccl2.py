"""torch 2.15's NCCL (#27 item 6), as far as a CPU can take it: plain ``"nccl"`` is ``ProcessGroupNCCL2`` (recorded by
torch's ``FlightRecorderHook`` into a recorder of its own, ``nccl2``), ``"nccl-legacy"`` (or
``TORCH_DIST_USE_NCCL2=0``) the stock backend that records itself. NCCL cannot start here: the GPU half runs in
``scripts/gpu_check.sh`` (``tests/scripts/gpu_flight_recorder.py --backend nccl|nccl-legacy``).

Here, for real: which creator each name resolves to and which one torch records through its hook; Automodel
0.7.0's ``ProcessGroupNCCL.Options`` override handed to NCCL2's creator (its constructor, the GPU boundary,
stands in); the shim's recorder settings and ``dump_now`` on a backend torch records through that hook
(:mod:`tests.harness.hooked_backend`, Gloo underneath, in real processes), read by ``hang-report``; and the
reader on dumps in the hook's format (``nccl2:`` names, a batch's ops apart) and on a dump the shim joined from
two recorders that number the same group apart.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from nemo_rl_shim import hang_report
from nemo_rl_shim.cli.preflight.spawn import spawn_ranks
from nemo_rl_shim.flight_recorder import recorder as flight_recorder
from nemo_rl_shim.hang_report.dump_format import pg_status_of
from tests.harness import hooked_backend
from tests.harness.nccl_format_dumps import Clock, Group, Rank
from tests.harness.nccl_scenarios import DEFAULT4, EXPECTED, build

pytestmark = [
    pytest.mark.skipif(
        not hasattr(c10d, "_create_nccl2_process_group"),
        reason=f"torch {torch.__version__} has no NCCL2 backend (it came with torch 2.15)",
    )
]

_REGISTRATION = textwrap.dedent(
    """
    import json
    from torch.distributed import distributed_c10d as c10d
    c10d.Backend._ensure_backend_registered("nccl")
    c10d.Backend._ensure_backend_registered("nccl-legacy")
    plugins = c10d.Backend._plugins
    print(json.dumps({
        "nccl": plugins["NCCL"].creator_fn.__name__,
        "nccl-legacy": plugins["NCCL-LEGACY"].creator_fn.__name__,
        "self_recording": sorted(c10d._FR_SELF_RECORDING_BACKENDS),
    }))
    """
)


@pytest.mark.parametrize(("use_nccl2", "creator"), [(None, "nccl2"), ("0", "nccl")])
def test_which_backend_nccl_builds_and_which_torch_records_through_its_hook(use_nccl2: str | None, creator: str):
    """In a fresh interpreter: "nccl" resolves (when first used) to NCCL2, recorded through the hook, or with
    TORCH_DIST_USE_NCCL2=0 to the stock backend, which records itself; "nccl-legacy" is always the stock one."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DIST_USE_NCCL2"}
    if use_nccl2 is not None:
        env["TORCH_DIST_USE_NCCL2"] = use_nccl2
    # A bound for a hang, not a speed: beside another suite (load 80 on 2 cores) this import of torch took over 120 s
    child = subprocess.run(
        [sys.executable, "-c", _REGISTRATION], env=env, capture_output=True, text=True, timeout=600, check=True
    )
    facts = json.loads(child.stdout.splitlines()[-1])
    assert facts["nccl"] == f"_create_{creator}_process_group", facts
    assert facts["nccl-legacy"] == "_create_nccl_process_group", facts
    assert ("nccl" in facts["self_recording"]) is (creator == "nccl"), facts
    assert "nccl-legacy" in facts["self_recording"] and "gloo" in facts["self_recording"], facts


def test_automodels_nccl_options_override_reaches_nccl2(monkeypatch) -> None:
    """Automodel 0.7.0 hands each mesh axis ``("nccl", ProcessGroupNCCL.Options)`` with ``_timeout`` set; DeviceMesh
    passes that ``_timeout`` on as the group's timeout. NCCL2's creator takes the same Options type and sets the
    group's timeout on it: the object and the minutes reach ProcessGroupNCCL2's constructor (stood in for)."""
    from nemo_automodel.components.distributed.mesh_utils import _nccl_backend_override

    backend, options = _nccl_backend_override(("dp",), device_type="cuda", timeout_minutes=45)["dp"]
    assert backend == "nccl" and isinstance(options, c10d.ProcessGroupNCCL.Options)
    built: dict[str, Any] = {}

    def constructor(store: Any, group_rank: int, group_size: int, pg_options: Any, device: Any) -> str:
        built.update(options=pg_options, timeout=pg_options._timeout, names=pg_options.group_name)
        return "ProcessGroupNCCL2"

    monkeypatch.setattr(c10d, "ProcessGroupNCCL2", constructor)
    monkeypatch.setattr(c10d, "is_nccl_available", lambda: True)
    monkeypatch.setattr(c10d, "_nccl2_device", lambda opts: torch.device("cuda", 0))
    opts = c10d._DistributedBackendOptions()
    opts.store, opts.group_rank, opts.group_size = dist.HashStore(), 0, 2
    opts.timeout, opts.group_id, opts.global_ranks_in_group = options._timeout, "7", [0, 1]  # as DeviceMesh passes it
    assert c10d._create_nccl2_process_group(opts, options) == "ProcessGroupNCCL2"
    assert built["options"] is options and built["timeout"] == datetime.timedelta(minutes=45), built


@pytest.fixture(scope="module")
def hooked_world(tmp_path_factory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("hooked")
    params = {"dump_dir": str(directory), "buffer_size": 3, "timeout_s": 3}
    results = spawn_ranks(
        "tests.harness.hooked_backend:rank", params, world_size=2, timeout_s=180, env={"CUDA_VISIBLE_DEVICES": ""}
    )
    return {"dir": directory, "results": {r.rank: r.result for r in results}}


@pytest.mark.multiprocess
def test_configure_reaches_a_hooked_backends_recorder(hooked_world) -> None:
    """TORCH_FR_BUFFER_SIZE, set by configure before any group, sizes the recorder torch's hook makes for the
    backend: 3 entries kept of rank 0's 4 all-reduces. The hook marks nothing completed on a backend without
    completion hooks (NCCL2 has them), and such a backend cannot run the hook's dump on abort (NCCL2 can)."""
    facts = hooked_world["results"]
    assert facts[0]["applied"]["TORCH_FR_BUFFER_SIZE"] == "3", facts[0]
    assert facts[0]["outcome"].startswith("raised: ") and facts[1]["outcome"] == "stayed out", facts
    for rank in (0, 1):
        assert facts[rank]["hooked"] and facts[rank]["hooked_backends"] == [hooked_backend.NAME], facts[rank]
        assert facts[rank]["recorder_entries"] == 3 and facts[rank]["recorder_states"] == ["scheduled"], facts[rank]
        assert facts[rank]["supports_abort_hooks"] is False


@pytest.mark.multiprocess
def test_dump_now_writes_the_hooked_recorder_and_hang_report_reads_it(hooked_world) -> None:
    """dump_now joins the default (Gloo) recorder and the hooked one; hang-report names rank 1 on the hooked group."""
    directory = hooked_world["dir"]
    raw = pickle.loads((directory / f"{flight_recorder.DUMP_FILE_NAME}0").read_bytes())
    names = {e["profiling_name"] for e in raw["entries"]}
    assert f"{hooked_backend.NAME}:all_reduce" in names, names
    report = hang_report.read_run(directory, with_torch=False)
    first = report.findings[0]
    assert (first.kind, first.ranks, first.waiting, first.seq) == ("stall", [1], [0], 4), report.line
    assert first.group.backend == hooked_backend.NAME and first.group.ranks == (0, 1)
    assert report.dumps[0].recorder(hooked_backend.NAME).wrapped, "3 kept of 4: its buffer wrapped"


# --- the reader on the hook's format and on joined recorders --------------------------------------------------------


@pytest.mark.parametrize("name", ["nccl2_sub_group_stall", "nccl2_batched_p2p_stall"])
def test_dumps_in_the_hooks_format_name_the_culprit(tmp_path, name: str) -> None:
    report = hang_report.read_run(build(name, tmp_path / name), with_torch=False)
    code, start = EXPECTED[name]
    assert report.exit_code == code and report.line.startswith(start), hang_report.render(report)
    assert {d.backend for d in report.dumps.values()} == {"nccl2"}
    assert all(d.recorder("nccl2").tracks_completion for d in report.dumps.values())  # retired on completion


def test_a_dump_joined_from_two_recorders_keeps_each_ones_numbering(tmp_path) -> None:
    """A cpu:gloo,cuda:nccl group: its Gloo half and its NCCL half number their ops apart, and only NCCL marks
    them completed. dump_now's join of the two (as on a GPU rank) reads as two groups: rank 1 did not enter the
    NCCL half's all_reduce #3; the Gloo half's 'scheduled' entries are not unfinished collectives, but not known to
    have finished either (Gloo's recorder never says): they come after, as what cannot be told."""
    group, clock = Group("0", "default_pg", (0, 1)), Clock()
    gloo = [Rank(r, [group], clock, lib="gloo") for r in range(2)]
    nccl = [Rank(r, [group], clock) for r in range(2)]
    for step in range(3):
        for r in range(2):
            gloo[r].collective(group, state="scheduled")  # Gloo leaves every entry scheduled
            if not (step == 2 and r == 1):
                nccl[r].collective(group, state="started" if step == 2 else "completed")
        clock.settle()
    for r in range(2):
        trace, facts = flight_recorder._join([("gloo", gloo[r].dump()), ("nccl", nccl[r].dump())])
        assert facts is not None and set(trace["pg_status"]) == {"gloo/0", "nccl/0"}, trace["pg_status"]
        trace.update(rank=r, nemo_rl_shim={"rank": r, "world_size": 2, "recorders": facts})
        (tmp_path / f"{flight_recorder.DUMP_FILE_NAME}{r}").write_bytes(pickle.dumps(trace))
    report = hang_report.read_run(tmp_path, with_torch=False)
    found = [(f.kind, f.ranks, f.group.backend) for f in report.findings]
    assert found == [("stall", [1], "nccl"), ("unconfirmed", [0, 1], "gloo")], report.line
    assert report.line.startswith(
        "never came: rank 1 did not enter all_reduce #3 on default, ranks 0-1 (its nccl half), in which"
    )
    halves = {g.backend: g for g in report.groups}
    assert set(halves) == {"gloo", "nccl"} and halves["gloo"].last == {0: 3, 1: 3}
    assert not report.dumps[0].recorder("gloo").tracks_completion and report.dumps[0].recorder("nccl").tracks_completion
    waiting = report.findings[0].group.entries[0]
    assert pg_status_of(report.dumps[0], waiting)["last_completed_collective"] == 2, "the NCCL half's, not Gloo's 0"


def test_join_keeps_one_recorders_dump_as_torch_wrote_it() -> None:
    one = Rank(0, [DEFAULT4], Clock(), lib="nccl2")
    one.collective(DEFAULT4)
    dump = one.dump()
    empty = {"version": "2.10", "entries": [], "pg_config": {"": {"name": "", "desc": "", "ranks": "[0]"}}}
    trace, facts = flight_recorder._join([("gloo", empty), ("nccl2", dump)])
    assert facts is None and trace["entries"] == dump["entries"] and trace["pg_status"] == dump["pg_status"]
    assert set(trace["pg_config"]) == {"", "0"}
