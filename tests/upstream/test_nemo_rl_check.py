"""``scripts/nemo_rl_check.py``'s verdicts, on hand-made results: none says "holds" when it does not.

The script itself needs NeMo RL's source and a 3.13 environment, which CI has not; its verdicts are
pure functions of the results it gathers, so they are checked here on results made by hand: the
shapes the script writes, with one thing wrong at a time.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

_SPEC = importlib.util.spec_from_file_location("nemo_rl_check", REPO_ROOT / "scripts" / "nemo_rl_check.py")
assert _SPEC is not None and _SPEC.loader is not None
check = importlib.util.module_from_spec(_SPEC)
sys.modules["nemo_rl_check"] = check
_SPEC.loader.exec_module(check)

SETUP = "tests.unit.models.automodel.test_automodel_setup.TestSetupDistributed"


def _lane(tests: dict[str, tuple[str, str]]) -> dict[str, Any]:
    return {"tests": {t: {"outcome": o, "message": m} for t, (o, m) in tests.items()}}


GPU = f"{SETUP}::test_timeout_without_cpu_offload_one_gpu"
TWO_GPUS = f"{SETUP}::test_cpu_offload_timeout_on_every_mesh_axis_two_gpus"
TWIN = f"{SETUP}::test_cpu_offload_timeout_on_every_mesh_axis_two_cpu_ranks"
GUARD = f"{SETUP}::test_cpu_offload_timeout_null_keeps_torch_default_two_cpu_ranks"
GPU_SKIPPED = ("skipped", "needs 1 GPU, found 0")
TWO_GPUS_SKIPPED = ("skipped", "needs 2 GPUs for two NCCL ranks, found 0")


def _results() -> dict[str, Any]:
    """NeMo RL's lanes as a run that holds writes them: 5 new tests and the CPU twin that fail unpatched, a guard,
    the two GPU tests."""
    old = {f"{SETUP}::test_old_{i}": ("passed", "") for i in range(3)}
    new = {f"{SETUP}::test_timeout_{i}": ("passed", "") for i in range(5)}
    new[TWIN] = ("passed", "")
    new_in_lane = {**new, GUARD: ("passed", ""), GPU: GPU_SKIPPED, TWO_GPUS: TWO_GPUS_SKIPPED}
    tests_only = {t: ("failed", "AssertionError: assert 30.0 == 45") for t in new}
    tests_only.update({GUARD: ("passed", ""), GPU: GPU_SKIPPED, TWO_GPUS: TWO_GPUS_SKIPPED})
    results = {}
    for lane, trees, _ in check.LANES:
        for tree in trees:
            if tree == "tests-only":
                tests = tests_only if lane == "new set-up tests" else {}
            else:
                tests = {**old, **new_in_lane} if tree == "patched" and lane == "automodel lane" else old
            results[f"{tree}: {lane}"] = _lane(tests)
    return results


def _set(results: dict[str, Any], lane: str, test: str, outcome: str, message: str = "") -> None:
    results[lane]["tests"][test] = {"outcome": outcome, "message": message}


def test_a_run_that_holds_has_no_problem() -> None:
    verdict, problems = check.tests_verdict(_results())
    assert problems == []
    assert verdict["count"] == 9
    assert verdict["tests"][GPU] == {"patched": "skipped", "tests-only": "skipped", "message": GPU_SKIPPED[1]}


@pytest.mark.parametrize(
    "outcome,message",
    [
        ("passed", ""),
        ("error", "ImportError: cannot import name 'AutomodelConfig'"),
        ("failed", "AttributeError: 'dict' object has no attribute 'distributed_timeout_minutes'"),
        ("not collected", ""),
    ],
)
def test_a_new_test_must_fail_unpatched_at_its_assertion(outcome: str, message: str) -> None:
    results = _results()
    if outcome == "not collected":
        del results["tests-only: new set-up tests"]["tests"][f"{SETUP}::test_timeout_0"]
    else:
        _set(results, "tests-only: new set-up tests", f"{SETUP}::test_timeout_0", outcome, message)
    _, problems = check.tests_verdict(results)
    assert [p for p in problems if "test_timeout_0 on unpatched NeMo RL" in p], problems


def test_a_test_that_passed_unpatched_must_pass_patched_in_the_same_one_process_lane() -> None:
    results = _results()
    _set(results, "patched: automodel lane", f"{SETUP}::test_old_1", "failed", "ValueError: default group twice")
    _, problems = check.tests_verdict(results)
    assert problems == [f"automodel lane: 1 tests pass unpatched but not patched: ['{SETUP}::test_old_1']"]


def test_a_new_test_must_pass_in_its_one_process_lane() -> None:
    results = _results()
    message = "ValueError: trying to initialize the default process group twice!"
    _set(results, "patched: automodel lane", f"{SETUP}::test_timeout_2", "failed", message)
    _, problems = check.tests_verdict(results)
    assert problems == [f"new test {SETUP}::test_timeout_2: failed in the automodel lane ({message})"]


def test_a_guard_must_pass_unpatched_and_the_gpu_test_must_skip_with_its_reason() -> None:
    results = _results()
    _set(results, "tests-only: new set-up tests", GUARD, "failed", "AssertionError")
    _, problems = check.tests_verdict(results)
    assert problems == [f"guard {GUARD} on unpatched NeMo RL: failed (AssertionError)"]
    for outcome, message in (("passed", ""), ("skipped", "no reason")):
        results = _results()
        _set(results, "patched: automodel lane", GPU, outcome, message)
        _, problems = check.tests_verdict(results)
        assert problems == [f"GPU test {GPU}: {outcome} ({message}), expected a skip"]


def test_there_must_be_the_two_gpu_test_its_cpu_twin_and_five_new_tests() -> None:
    results = _results()
    for lane in ("patched: automodel lane", "tests-only: new set-up tests"):
        for test in (TWO_GPUS, TWIN, *(f"{SETUP}::test_timeout_{i}" for i in (2, 3, 4))):
            del results[lane]["tests"][test]
    _, problems = check.tests_verdict(results)
    assert problems == [
        f"no two-GPU CPU-offload test ({check.TWO_GPU_TEST}) among the new tests",
        f"no CPU twin of the two-GPU test (*{check.CPU_TWIN}) among the new tests",
        "4 new tests, need at least 5",
    ]
    # The guard (null keeps torch's default) is not the twin: it cannot bite
    results = _results()
    for lane in ("patched: automodel lane", "tests-only: new set-up tests"):
        del results[lane]["tests"][TWIN]
    _, problems = check.tests_verdict(results)
    assert problems == [f"no CPU twin of the two-GPU test (*{check.CPU_TWIN}) among the new tests"]


def test_the_cpu_twin_must_bite_and_a_gpu_test_must_skip_saying_how_many_it_found() -> None:
    results = _results()
    _set(results, "tests-only: new set-up tests", TWIN, "passed")
    _, problems = check.tests_verdict(results)
    assert problems == [f"new test {TWIN} on unpatched NeMo RL: passed ()"]
    results = _results()
    _set(results, "patched: automodel lane", TWO_GPUS, "skipped", "needs 2 GPUs")  # no count of what was found
    _, problems = check.tests_verdict(results)
    assert problems == [f"GPU test {TWO_GPUS}: skipped (needs 2 GPUs), expected a skip"]


ONE_RANK_OFFLOAD = """
@NEEDS_ONE_GPU
def test_x(self, tmp_path):
    reports = run_timeout_ranks(tmp_path, 1, True, {offload}, 45)

@NEEDS_TWO_GPUS
def test_y(self, tmp_path):
    reports = run_timeout_ranks(tmp_path, {world}, True, True, 45)

def test_cpu(self, tmp_path):
    reports = run_timeout_ranks(tmp_path, 1, False, True, 45)
"""


def test_no_gpu_gated_test_may_configure_cpu_offload_on_one_rank() -> None:
    assert check.offload_on_one_rank(ONE_RANK_OFFLOAD.format(offload=False, world=2)) == []
    assert check.offload_on_one_rank(ONE_RANK_OFFLOAD.format(offload=True, world=2)) == [
        "test_x (NEEDS_ONE_GPU) configures CPU offload on one rank"
    ]
    assert check.offload_on_one_rank(ONE_RANK_OFFLOAD.format(offload=False, world=1)) == [
        "test_y (NEEDS_TWO_GPUS) configures CPU offload on one rank"
    ]
    # A world size it cannot read is a problem, not a pass; and so is a GPU-gated test it cannot follow
    assert check.offload_on_one_rank(ONE_RANK_OFFLOAD.format(offload=False, world="n")) == [
        "test_y: run_timeout_ranks's world size and CPU offload are not literals"
    ]
    other = "@NEEDS_ONE_GPU\ndef test_z():\n    setup_distributed(config, runtime_config)\n"
    assert check.offload_on_one_rank(other) == [
        "GPU-gated test test_z does not call run_timeout_ranks: its ranks cannot be read"
    ]
    assert check.offload_on_one_rank("def test_cpu():\n    pass\n") == [
        "no GPU-gated test (NEEDS_ONE_GPU, NEEDS_TWO_GPUS) found"
    ]


def test_pretrained_verdict_needs_the_value_when_each_group_is_made() -> None:
    def ranks(minutes: float) -> list[dict[str, Any]]:
        made = [{"desc": "undefined", "timeout_min": {"cpu": minutes, "cuda": minutes}, "at_s": 5.0}]
        return [{"rank": r, "made in from_pretrained": made} for r in range(4)]

    assert check.pretrained_verdict("p", "patched", ranks(45.0), 45.0) == []
    assert check.pretrained_verdict("u", "unpatched", ranks(30.0), 45.0) == []
    assert len(check.pretrained_verdict("p", "patched", ranks(30.0), 45.0)) == 4
    assert len(check.pretrained_verdict("u", "unpatched", ranks(45.0), 45.0)) == 4
    no_group = [{"rank": 0, "made in from_pretrained": []}]
    assert check.pretrained_verdict("p", "patched", no_group, 45.0) == ["p: rank 0 made no group in from_pretrained"]


def _ranks(minutes: float, offload: bool) -> dict[str, Any]:
    """4 ranks of tp 2 as nemo_rl_rank.py reports them: default, tp and the replica group."""
    groups = {
        "default_pg": [[0, 1, 2, 3]] * 4,
        "mesh_MeshAxisName.TP": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "mesh_cp_tp": [[0, 1], [0, 1], [2, 3], [2, 3]],
    }
    reports = []
    for rank in range(4):
        reports.append(
            {
                "rank": rank,
                "replica_desc": "mesh_cp_tp",
                "full_tensor_ok": True,
                "groups": [
                    {
                        "desc": desc,
                        "ranks": members[rank],
                        "backend": "cuda:nccl_standin,cpu:gloo" if offload else "cpu:gloo,cuda:gloo",
                        "timeout_min": {"cpu": minutes, "cuda": minutes},
                        "distinct_backends": 2 if offload else 1,
                        "allreduce_cpu": True,
                    }
                    for desc, members in groups.items()
                ],
            }
        )
    return {"seconds": 1.0, "reports": reports}


@pytest.mark.parametrize("offload", [False, True])
def test_ranks_verdict_holds_only_when_every_backend_of_every_group_reads_the_value(offload: bool) -> None:
    result = _ranks(45.0, offload)
    summary = check.ranks_summary(result)
    assert [row["group"] for row in summary["table"]] == ["default_pg", "mesh_tp", "mesh_cp_tp"]
    assert check.ranks_verdict("patched", "patched", offload, summary, 45.0) == []
    # One backend of one group on one rank at torch's default: found, and named
    wrong = copy.deepcopy(result)
    wrong["reports"][3]["groups"][2]["timeout_min"]["cuda"] = 30.0
    problems = check.ranks_verdict("patched", "patched", offload, check.ranks_summary(wrong), 45.0)
    assert problems == ["patched: groups without 45 min on every backend: ['mesh_cp_tp']"]
    # The composite must keep two backend objects; a plain group, one
    assert check.ranks_verdict("patched", "patched", not offload, summary, 45.0)


def test_ranks_verdict_needs_the_replica_group_and_an_unpatched_tree_that_differs() -> None:
    result = _ranks(45.0, False)
    for report in result["reports"]:
        report["groups"] = [g for g in report["groups"] if g["desc"] != "mesh_cp_tp"]
    problems = check.ranks_verdict("patched", "patched", False, check.ranks_summary(result), 45.0)
    assert any("replica group" in p for p in problems), problems
    # Unpatched reading the value everywhere means the check cannot tell the change apart
    assert check.ranks_verdict("unpatched", "unpatched", False, check.ranks_summary(_ranks(45.0, False)), 45.0)
    assert check.ranks_verdict("unpatched", "unpatched", False, check.ranks_summary(_ranks(30.0, False)), 45.0) == []


def test_save_verdict() -> None:
    timed_out = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv"
    failed = [{"rank": 0, "save": "RuntimeError: Connection closed by peer"}] + [
        {"rank": r, "save": timed_out} for r in (1, 2, 3)
    ]
    completed = [{"rank": r, "save": "completed"} for r in range(4)]
    assert check.save_verdict("unpatched", False, failed) == []
    assert check.save_verdict("knob", True, completed) == []
    assert check.save_verdict("knob", True, failed)
    assert check.save_verdict("unpatched", False, completed)
    assert check.save_verdict("knob", True, [*completed[:3], {"rank": 3, "error": "no report (timed out?)"}])


def _driver(refused: str = "refused: ValidationError: {key} | Input should be greater than 0 ...") -> dict[str, Any]:
    outcomes = {}
    for label, section in (("grpo policy", "policy"), ("distillation teacher", "teacher"), ("ppo value", "value")):
        key = f"{section}.automodel_cfg.distributed_timeout_minutes"
        outcomes[label] = {value: refused.format(key=key) for value in check._BAD}
        outcomes[label].update(dict(check._GOOD))
        typo = f"refused: ValidationError: {key[:-1]} | Extra inputs are not permitted [type=extra_forbidden, ..."
        outcomes[label][check._MISSPELLED] = typo
    policy = {
        "v1 DTensor worker, 45": "refused: ValueError: policy.automodel_cfg.distributed_timeout_minutes is 45, ...",
        "Megatron, 45": "refused: ValueError: policy.automodel_cfg.distributed_timeout_minutes is 45, ...",
        "Megatron teacher, 45": "refused: ValueError: teacher.automodel_cfg.distributed_timeout_minutes is 45, ...",
        "env.reward_model, true": "refused: ValueError: env.reward_model.automodel_cfg is invalid: 1 validation ...",
    }
    return {"master_config": outcomes, "policy": policy}


def test_driver_verdict() -> None:
    assert check.driver_verdict(_driver()) == []
    coerced = _driver()
    coerced["master_config"]["distillation teacher"]["True"] = "accepted: 1"
    assert check.driver_verdict(coerced) == ["MasterConfig, distillation teacher, True: accepted: 1"]
    wrong_section = _driver("refused: ValidationError: policy.automodel_cfg.distributed_timeout_minutes | ...")
    assert len(check.driver_verdict(wrong_section)) == 2 * len(check._BAD)  # teacher and value name the wrong section
    overflow = _driver()
    overflow["master_config"]["grpo policy"]["1e+308"] = "accepted: 1e+308"
    assert check.driver_verdict(overflow) == ["MasterConfig, grpo policy, 1e+308: accepted: 1e+308"]
    strict = _driver()  # ${oc.env:...} gives "45": refusing it is refusing NeMo RL's own interpolation
    strict["master_config"]["ppo value"]["'45'"] = "refused: ValidationError: value.automodel_cfg... | Input should be"
    assert len(check.driver_verdict(strict)) == 1
    ignored_typo = _driver()
    ignored_typo["master_config"]["grpo policy"][check._MISSPELLED] = "accepted: '<dropped>'"
    assert check.driver_verdict(ignored_typo) == [
        f"MasterConfig, grpo policy, {check._MISSPELLED}: accepted: '<dropped>'"
    ]
    ignored = _driver()
    ignored["policy"]["Megatron, 45"] = "accepted: 'Policy'"
    assert check.driver_verdict(ignored) == ["Policy, Megatron, 45: accepted: 'Policy'"]
    teacher_as_policy = _driver()
    teacher_as_policy["policy"]["Megatron teacher, 45"] = teacher_as_policy["policy"]["Megatron, 45"]
    assert len(check.driver_verdict(teacher_as_policy)) == 1


def test_junit_results(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="a.T" name="test_ok" />'
        '<testcase classname="a.T" name="test_bad"><failure message="AssertionError: x">tb</failure></testcase>'
        '<testcase classname="a.T" name="test_err"><error message="ImportError: y">tb</error></testcase>'
        '<testcase classname="a.T" name="test_skip"><skipped message="Need 2 GPUs, got 0" /></testcase>'
        "</testsuite></testsuites>"
    )
    assert check.junit_results(xml) == {
        "a.T::test_ok": {"outcome": "passed", "message": ""},
        "a.T::test_bad": {"outcome": "failed", "message": "AssertionError: x"},
        "a.T::test_err": {"outcome": "error", "message": "ImportError: y"},
        "a.T::test_skip": {"outcome": "skipped", "message": "Need 2 GPUs, got 0"},
    }
    assert check.junit_results(tmp_path / "missing.xml") == {}
    # A path parameter names its tree; the ids agree across trees once it is dropped
    xml.write_text(
        f'<testsuites><testsuite><testcase classname="t" name="test_x[{tmp_path}/examples/a.yaml]" />'
        "</testsuite></testsuites>"
    )
    assert list(check.junit_results(xml, tmp_path)) == ["t::test_x[examples/a.yaml]"]


def _preflight_output(tree: Path, failed: str | None) -> str:
    setup = tree / "nemo_rl" / "models" / "automodel" / "setup.py"
    lines = ["preflight: 4 ranks (spawn), policy section", f"set-up: NeMo RL's own setup_distributed ({setup}); ..."]
    return "\n".join([*lines, *([f"preflight: FAILED: {failed}"] if failed else [])])


def test_preflight_verdict_wants_1_naming_groups_at_torch_s_default_unpatched_and_0_patched() -> None:
    unpatched, patched = Path("/w/unpatched"), Path("/w/patched")
    named = "10 groups at torch's default, not the configured timeout: default, pp (+10 more problems)"
    assert check.preflight_verdict("unpatched", unpatched, 1, 1, _preflight_output(unpatched, named)) == []
    assert check.preflight_verdict("patched", patched, 0, 0, _preflight_output(patched, None)) == []
    # The series passing where NeMo RL as it is should fail, or failing where it should pass: found
    assert check.preflight_verdict("unpatched", unpatched, 1, 0, _preflight_output(unpatched, None)) == [
        "preflight --setup nemo-rl, unpatched: exited 0, expected 1"
    ]
    assert check.preflight_verdict("patched", patched, 0, 1, _preflight_output(patched, named))
    # Exit 1 for another reason (a rank that failed) says nothing about the timeouts
    crashed = check.preflight_verdict("unpatched", unpatched, 1, 1, _preflight_output(unpatched, "rank failed: boom"))
    assert crashed == [
        "preflight --setup nemo-rl, unpatched: exit 1 names no group at torch's default: "
        "'preflight: FAILED: rank failed: boom'"
    ]
    # The other tree's set-up (or the shim's) ran: not a check of this tree
    assert check.preflight_verdict("patched", patched, 0, 0, _preflight_output(unpatched, None))


def test_the_preflight_runs_render_as_one_table() -> None:
    runs = {
        "unpatched, --cpu-offload": {"rc": 1, "expected": 1, "seconds": 36.0, "verdict": "preflight: FAILED: a | b"},
        "patched, SGLang colocated (not judged)": {"rc": 1, "seconds": 60.0, "verdict": None},
    }
    text = check.render_markdown({"preflight": {"runs": runs}})
    assert "| unpatched, --cpu-offload | 1 | 1 | `preflight: FAILED: a \\| b` | 36 s |" in text.splitlines(), text
    assert "| patched, SGLang colocated (not judged) | 1 | not judged | `-` | 60 s |" in text.splitlines(), text


# --- this project's own keys, in their block beside automodel_cfg ---------------------------------------------------

_DRIVER_SPEC = importlib.util.spec_from_file_location("nemo_rl_driver", REPO_ROOT / "scripts" / "nemo_rl_driver.py")
assert _DRIVER_SPEC is not None and _DRIVER_SPEC.loader is not None
driver = importlib.util.module_from_spec(_DRIVER_SPEC)
_DRIVER_SPEC.loader.exec_module(driver)
REAL_DRIVER = REPO_ROOT / "tests" / "upstream" / "fixtures" / "nemo_rl_driver"


def _shim_results() -> dict[str, Any]:
    kept = f"accepted: {driver.SHIM_BLOCK!r}"
    to_worker = f"accepted: {{'worker': 'DTensorPolicyWorkerV2', 'nemo_rl_shim': {driver.SHIM_BLOCK!r}}}"
    results: dict[str, Any] = {}
    for tree in ("unpatched", "patched"):
        shim_keys = {}
        for label, section in check._SECTION_OF.items():
            old = "accepted: '<dropped>'"
            if tree == "patched":
                old = (
                    f"refused: ValidationError: {section}.automodel_cfg.patch_automodel | Extra inputs are not "
                    "permitted [type=extra_forbidden, input_value=True, input_type=bool]"
                )
            shim_keys[label] = {driver.SHIM_BESIDE: kept, driver.SHIM_OLD_PLACE: old}
        results[tree] = {"shim_keys": shim_keys, "policy": {driver.SHIM_TO_WORKER: to_worker}}
    return results


def test_shim_keys_verdict_holds_on_the_shapes_the_driver_writes_and_each_fault_is_named() -> None:
    assert check.shim_keys_verdict(_shim_results()) == []
    dropped = _shim_results()  # a TypedDict that drops extra keys: the worker would never see the block
    dropped["patched"]["shim_keys"]["ppo value"][driver.SHIM_BESIDE] = "accepted: '<dropped>'"
    assert check.shim_keys_verdict(dropped) == [
        f"MasterConfig on patched, ppo value, {driver.SHIM_BESIDE}: accepted: '<dropped>'"
    ]
    refused = _shim_results()  # a PolicyConfig made extra="forbid" upstream
    refused["unpatched"]["shim_keys"]["grpo policy"][driver.SHIM_BESIDE] = "refused: ValidationError: policy..."
    assert len(check.shim_keys_verdict(refused)) == 1
    let_through = _shim_results()  # the old place accepted by patched NeMo RL: its AutomodelConfig is not forbidding
    let_through["patched"]["shim_keys"]["distillation teacher"][driver.SHIM_OLD_PLACE] = "accepted: '<dropped>'"
    assert check.shim_keys_verdict(let_through) == [
        f"MasterConfig on patched, distillation teacher, {driver.SHIM_OLD_PLACE}: accepted: '<dropped>'"
    ]
    wrong_key = _shim_results()  # refused, but for another key than the one moved
    wrong_key["patched"]["shim_keys"]["grpo policy"][driver.SHIM_OLD_PLACE] = (
        "refused: ValidationError: policy.automodel_cfg.distributed_timeout_minutes | Input should be ..."
    )
    assert len(check.shim_keys_verdict(wrong_key)) == 1
    no_worker = _shim_results()
    no_worker["patched"]["policy"][driver.SHIM_TO_WORKER] = "accepted: {'worker': 'DTensorPolicyWorkerV2', ...}"
    assert len(check.shim_keys_verdict(no_worker)) == 1
    missing = _shim_results()
    del missing["unpatched"]
    assert check.shim_keys_verdict(missing) == ["nemo_rl_shim block: no driver results on unpatched"]


def test_shim_keys_verdict_names_a_shim_key_the_driver_does_not_send(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_rl_shim import config as cfg

    monkeypatch.setattr(cfg, "SHIM_CFG_KEYS", (*cfg.SHIM_CFG_KEYS, "a_new_key"))
    (problem,) = check.shim_keys_verdict(_shim_results())
    assert problem.startswith("the driver's nemo_rl_shim block has ") and "a_new_key" in problem, problem


def test_the_driver_s_shim_block_passes_the_shim_s_own_checks(tmp_path: Path) -> None:
    """The block NeMo RL is shown is one the shim itself takes: every key known, every value accepted."""
    from nemo_rl_shim import config as cfg

    block = copy.deepcopy(driver.SHIM_BLOCK)
    block["flight_recorder"]["dump_dir"] = str(tmp_path)  # checked writable: not the driver's /tmp path
    section = {"automodel_cfg": {"distributed_timeout_minutes": 45}, "nemo_rl_shim": block}
    knobs = cfg.knobs({"policy": section})
    assert set(knobs) == {"distributed_timeout_minutes", *cfg.SHIM_CFG_KEYS}
    assert cfg.distributed_timeout_minutes_after_init(knobs) == 10.0
    assert cfg.patch_automodel(knobs) is True
    assert cfg.flight_recorder(knobs) == cfg.FlightRecorderSettings(tmp_path, 2000)
    assert cfg.learned_timeouts(knobs) is None


def test_real_nemo_rl_takes_the_shim_s_block_and_refuses_the_old_place() -> None:
    """The driver's output on real NeMo RL 7ea279abf, unpatched and with the series (how made: the fixture's
    README): both verdicts hold on it."""
    import json

    results = {tree: json.loads((REAL_DRIVER / f"driver-{tree}.json").read_text()) for tree in ("unpatched", "patched")}
    assert check.shim_keys_verdict(results) == []
    assert check.driver_verdict(results["patched"]) == []
    to_worker = results["patched"]["policy"][driver.SHIM_TO_WORKER]
    assert to_worker.startswith("accepted: {'worker': 'DTensorPolicyWorkerV2'"), to_worker
