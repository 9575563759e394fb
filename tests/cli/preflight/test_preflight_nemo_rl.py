"""``preflight --setup nemo-rl``: NeMo RL's own set-up on every rank, the groups its worker makes later, every group
torch holds audited; and what it refuses.

This project's CI has no copy of NeMo RL, so ``tests/stand_in_nemo_rl`` stands in for the three NeMo RL modules the
command calls (``nemo_rl.models.automodel.setup``, the policy worker's ``_get_replica_group``, SGLang refit's
``_ensure_ipc_topology``); its ``setup.py`` calls ``init_process_group`` without the timeout, as NeMo RL
``7ea279abf`` does, or, with ``NEMO_RL_STAND_IN_SERIES=applied``, with it and on every group, as the NeMo RL series
does. What is real: the command, its ranks (2 processes on Gloo), the swap of NCCL for Gloo, torch's groups and
their timeouts, the audit. The same command on NeMo RL's own code, unpatched and patched, is the preflight step of
``scripts/nemo_rl_check.py``.

Two commands run at once (a module fixture, each bounded in time): the series applied, with CPU offload (exit 0);
NeMo RL as it is, with an SGLang colocated config whose refit groups are made after set-up (exit 1, naming every
group left at torch's default). The refusals run in this process and start no rank.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_rl_shim.cli import main
from nemo_rl_shim.cli.preflight.report import COLUMNS
from tests.harness.at_once import Finished, run_at_once
from tests.harness.paths import REPO_ROOT

STAND_IN = REPO_ROOT / "tests" / "stand_in_nemo_rl"
RUN_TIMEOUT_S = 300  # each command: 2 ranks forked from a server that imported torch and Automodel once
SGLANG_YAML = """\
policy:
  dtensor_cfg: {_v2: true, cpu_offload: false}
  automodel_cfg: {distributed_timeout_minutes: 45}
  generation:
    backend: sglang
    colocated: {enabled: true}
    sglang_cfg: {sglang_server_config: {num_gpus_per_engine: 1}}
"""
SETUP_FILE = STAND_IN / "nemo_rl" / "models" / "automodel" / "setup.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.pop("MASTER_PORT", None)
    env.pop("NEMO_RL_STAND_IN_SERIES", None)
    path = os.pathsep.join(p for p in (str(STAND_IN), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    config = tmp_path_factory.mktemp("nemo_rl_setup") / "sglang.yaml"
    config.write_text(SGLANG_YAML)
    command = [sys.executable, "-m", "nemo_rl_shim", "preflight", "--setup", "nemo-rl"]
    commands = {
        "series": (command, _env(NEMO_RL_STAND_IN_SERIES="applied")),
        "as_is": ([*command, "--config", str(config), "--json"], _env()),
    }
    return run_at_once(commands, timeout_s=RUN_TIMEOUT_S, cwd=REPO_ROOT)


def _table(stdout: str) -> dict[str, dict[str, str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("group "))
    edges = [lines[start].index(name) for name in COLUMNS]
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("("):
            break
        cells = [line[a:b].strip() for a, b in zip(edges, [*edges[1:], None], strict=True)]
        rows[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return rows


@pytest.mark.multiprocess
def test_with_the_series_nemo_rl_s_own_set_up_passes_on_every_group_and_says_what_stood_in(runs):
    done = runs["series"]
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert f"set-up: NeMo RL's own setup_distributed ({SETUP_FILE}); " in next(
        line for line in lines if line.startswith("set-up: ")
    ), done.stdout
    assert "no CUDA device: NCCL stood in by Gloo, as scripts/nemo_rl_rank.py does" in done.stdout
    assert "default group: cuda:nccl_standin,cpu:gloo on cpu; CPU offload on" in lines  # the stand-in's half, named
    assert "decision:" not in done.stdout  # the shim's set-up did not run
    assert (
        "made after set-up, as a NeMo RL worker makes them: replica group: (cp, tp) flattened by NeMo RL's "
        "DTensorPolicyWorkerV2Impl._get_replica_group; SGLang refit groups: none (policy.generation is not SGLang "
        "with colocated generation)"
    ) in lines
    rows = _table(done.stdout)
    assert set(rows) == {"default", "dp", "cp", "tp", "cp_tp"}, rows
    assert {name: row["timeout"] for name, row in rows.items() if row["timeout"] != "45 min"} == {}
    assert {row["cpu all_reduce"] for row in rows.values()} == {"ok"}
    assert "full_tensor() (4, 4): ok on every rank" in done.stdout
    assert "OK: every group torch holds carries the configured timeout on every backend; collectives work" in lines


@pytest.mark.multiprocess
def test_as_it_is_every_group_at_torch_s_default_is_named_the_refit_groups_made_later_included(runs):
    done = runs["as_is"]
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["setup"], report["decision"]) == ("nemo-rl", None)
    first = report["ranks"][0]
    assert first["later_groups"][1] == "SGLang refit groups: 2 Gloo groups of 1 rank (NeMo RL's _ensure_ipc_topology)"
    refit = [row for rank in report["ranks"] for row in rank["rows"] if row["group"] == "unnamed undefined"]
    assert [(row["ranks"], row["named"], row["sources"]) for row in refit] == [
        ([rank], False, {"cpu": "torch_default", "cuda": "torch_default"}) for rank in (0, 1)
    ], refit
    names = "default, cp, tp, cp_tp, unnamed undefined"  # dp is the default group (world-sized), named once
    assert report["problems"][0] == f"5 groups at torch's default, not the configured timeout: {names}"
    assert (
        "group unnamed undefined: cpu:gloo,cuda:gloo at torch's default 30 min, configured 45 min (group_desc "
        "undefined, group ranks 0 | 1) (ranks 0-1)"
    ) in report["problems"], report["problems"]
    failed = [line for line in done.stderr.splitlines() if "FAILED" in line]
    assert failed == [f"preflight: FAILED: {report['problems'][0]} (+5 more problems)"], done.stderr[-3000:]


# --- refused before any rank starts ----------------------------------------------------------------------------


@pytest.fixture
def stand_in_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in on ``sys.path`` for this test; every ``nemo_rl`` module it imported gone after."""
    before = {name for name in sys.modules if name.split(".")[0] == "nemo_rl"}
    monkeypatch.syspath_prepend(str(STAND_IN))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "nemo_rl" and name not in before]:
        del sys.modules[name]


def _refused(capfd: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["preflight", *argv, "--json"])
    out, err = capfd.readouterr()
    report = json.loads(out)
    assert (code, report["ok"], report["exit_code"]) == (2, False, 2), (out, err[-2000:])
    assert err.strip().splitlines()[-1] == f"preflight: {report['problem']}"
    return report["problem"]


def test_where_nemo_rl_is_not_importable_the_nemo_rl_set_up_is_refused_in_one_line(capfd):
    if importlib.util.find_spec("nemo_rl") is not None:
        pytest.skip(f"NeMo RL is importable here ({importlib.util.find_spec('nemo_rl').origin}): nothing to refuse")
    assert _refused(capfd, "--setup", "nemo-rl") == (
        "--setup nemo-rl runs NeMo RL's own set-up, and NeMo RL is not importable here (ModuleNotFoundError: No "
        "module named 'nemo_rl'): run preflight in NeMo RL's environment, or put a NeMo RL checkout on PYTHONPATH"
    )


def test_the_nemo_rl_set_up_is_refused_with_a_dry_run_and_with_keys_only_the_shim_reads(capfd, stand_in_importable):
    assert _refused(capfd, "--setup", "nemo-rl", "--dry-run") == (
        "--setup nemo-rl runs NeMo RL's own set-up on real ranks; --dry-run plays the shim's on torch's fake backend: "
        "choose one"
    )
    assert _refused(capfd, "--setup", "nemo-rl", "--timeout-minutes-after-init", "10") == (
        "policy.nemo_rl_shim.distributed_timeout_minutes_after_init is 10.0, but --setup nemo-rl runs NeMo RL's own "
        "set-up, which reads only distributed_timeout_minutes: remove the key (or its flag), or check the shim's "
        "set-up (--setup shim)"
    )


def test_a_bad_number_of_ranks_per_sglang_engine_is_refused_naming_the_key(capfd, tmp_path: Path):
    config = tmp_path / "sglang.yaml"
    config.write_text(SGLANG_YAML.replace("num_gpus_per_engine: 1", "num_gpus_per_engine: 0"))
    assert _refused(capfd, "--config", str(config)) == (
        "policy.generation.sglang_cfg.sglang_server_config.num_gpus_per_engine must be a positive integer, got 0"
    )
