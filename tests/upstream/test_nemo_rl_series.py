"""The NeMo RL pull request in ``nemo_rl_shim/upstream/``, checked offline.

NeMo RL's source is not committed here and CI cannot fetch it, so this checks what it can
without it: the series is ``git format-patch`` output that ``git mailinfo`` reads, four commits
in order on one base, each by the neutral placeholder author and signed off by it (the README
gives the command that re-signs them); each touches the files its subject names;
no patch touches NeMo RL's requirements or imports this project; the knob's code passes ``timeout=``
to ``init_process_group`` and makes the value torch's default for new groups before the first one,
under the ``AUTOMODEL-WORKAROUND`` tag with its removal condition, and never hands it to Automodel;
the config type is in NeMo RL's idiom; at most 80 lines of code under ``nemo_rl/``; the config hunks
add the same three lines to example configs and their reference snapshots; the test commit only adds,
with the two-GPU CPU-offload test, its CPU twin sharing its body, and no GPU-gated test with CPU
offload on one rank. The
series itself runs inside NeMo RL, on NeMo RL's own tests, its driver and 4 CPU ranks, by
``scripts/nemo_rl_check.py`` (figures in ``distributed-timeout.md``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

UPSTREAM = REPO_ROOT / "nemo_rl_shim" / "upstream"
SERIES = sorted(UPSTREAM.glob("0*.patch"))
BASE = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
GIT_TIMEOUT_S = 60
SETUP = "nemo_rl/models/automodel/setup.py"
#: patch number -> the files it touches, beyond the example configs and reference snapshots of 0003.
TOUCHES = {
    1: {
        "nemo_rl/models/policy/__init__.py",
        "nemo_rl/models/policy/lm_policy.py",
        "nemo_rl/models/value/config.py",
        "nemo_rl/models/value/lm_value.py",
    },
    2: {SETUP},
    3: {"docs/design-docs/training-backends.md"},
    4: {
        "tests/unit/models/automodel/test_automodel_setup.py",
        "tests/unit/models/policy/test_policy_validation.py",
        "tests/unit/test_config_validation.py",
    },
}
CONFIG_LINES = (
    "# DTensor v2 worker only: timeout of its process groups, in whole minutes (at most a week); null keeps torch's "
    "defaults",
    "automodel_cfg:",
    "distributed_timeout_minutes: null",
)
#: The neutral placeholder every commit carries until the submitter re-signs (the README's command).
PLACEHOLDER = "Your Name <you@example.com>"
#: The most lines the series may add under ``nemo_rl/``, not counting blank lines and comments.
CODE_LINES_MAX = 80


def _mailinfo(patch: Path, tmp_path: Path) -> tuple[str, str]:
    """(header, message) of one format-patch mail, as ``git am`` reads it."""
    done = subprocess.run(
        ["git", "mailinfo", str(tmp_path / "msg"), str(tmp_path / "diff")],
        stdin=patch.open("rb"), capture_output=True, timeout=GIT_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{patch.name}: git mailinfo: {done.stderr.decode()}"
    return done.stdout.decode(), (tmp_path / "msg").read_text()


def _numstat(patch: Path) -> dict[str, tuple[int, int]]:
    done = subprocess.run(
        ["git", "apply", "--numstat", str(patch)], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{patch.name} is not a diff git can read: {done.stderr.strip()}"
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    return {path: (int(added), int(removed)) for added, removed, path in rows}


def _added(*patches: Path) -> list[str]:
    return [
        line[1:]
        for patch in patches
        for line in patch.read_text().split("\n---\n", 1)[1].splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


def test_series_is_format_patch_output_in_order_on_one_base(tmp_path: Path) -> None:
    assert [p.name[:5] for p in SERIES] == ["0001-", "0002-", "0003-", "0004-"], [p.name for p in SERIES]
    for number, patch in enumerate(SERIES, start=1):
        first = patch.read_text().splitlines()[0]
        assert re.fullmatch(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001", first), f"{patch.name}: {first}"
        assert re.search(rf"^Subject: \[PATCH {number}/4\] \w+\(automodel\): ", patch.read_text(), re.M), patch.name
        header, _ = _mailinfo(patch, tmp_path)
        assert re.search(r"^Subject: \w+\(automodel\): \S", header, re.M), header
    assert f"base-commit: {BASE}" in SERIES[0].read_text()


@pytest.mark.parametrize("patch", SERIES, ids=lambda p: p.name[:4])
def test_each_commit_is_signed_off_by_the_placeholder_author(patch: Path, tmp_path: Path) -> None:
    header, message = _mailinfo(patch, tmp_path)
    author = re.search(r"^Author: (.*)\nEmail: (.*)$", header, re.M)
    assert author, header
    assert f"{author[1]} <{author[2]}>" == PLACEHOLDER, header
    assert f"Signed-off-by: {PLACEHOLDER}" in message.splitlines(), message


def test_readme_gives_the_one_command_that_re_signs_the_series() -> None:
    readme = (UPSTREAM / "README.md").read_text()
    drop_placeholder = 'git log -1 --format=%B | sed "/^Signed-off-by: Your Name </d"'
    resign = f"{drop_placeholder} | git commit -q --amend --reset-author --signoff -F -"
    command = f"git rebase --exec '{resign}' HEAD~4"
    assert command in readme


@pytest.mark.parametrize("number", sorted(TOUCHES))
def test_patch_touches_the_files_it_should(number: int) -> None:
    touched = set(_numstat(SERIES[number - 1]))
    if number == 3:
        touched = {p for p in touched if not p.startswith(("examples/configs/", "tests/unit/reference_configs/"))}
    assert touched == TOUCHES[number]


def test_series_adds_no_requirement_and_imports_nothing_of_this_project() -> None:
    touched = {path for patch in SERIES for path in _numstat(patch)}
    assert not touched & {"pyproject.toml", "uv.lock", "setup.py", "requirements.txt"}, touched
    added = "\n".join(_added(*SERIES))
    assert not re.search(r"nemo_rl_shim|nemo-rl-shim|automodel_patch", added)


def _code(lines: list[str]) -> list[str]:
    """The lines that are neither blank nor comments."""
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def test_the_knob_is_passed_to_init_process_group_and_is_torch_s_default_for_new_groups() -> None:
    patch = SERIES[1].read_text()
    setting = "c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout"
    assert f"+        {setting}\n" in patch
    # timeout= passed explicitly, only when set: with null, init_process_group is called exactly as before
    assert '+        timeout_kwargs["timeout"] = timeout\n' in patch
    assert "+    torch.distributed.init_process_group(backend=backend, **timeout_kwargs)\n" in patch
    assert patch.index(setting) < patch.index("init_process_group(backend=backend, **timeout_kwargs)")
    code = "\n".join(_code(_added(SERIES[1])))
    # No walk over every group, no setter, no replica group forced: new groups take the default
    assert "pg_map" not in code and "_set_pg_timeout" not in code and "_flatten" not in code
    # Automodel never gets the timeout: no MeshContext.build call, create_device_mesh's call unchanged
    assert "MeshContext" not in code and "timeout_minutes=" not in code and "create_device_mesh" not in code


def test_the_globals_carry_nemo_rl_s_workaround_tag_and_its_removal_condition() -> None:
    comments = " ".join(line.strip().lstrip("#").strip() for line in _added(SERIES[1]) if line.strip().startswith("#"))
    tag = (
        "AUTOMODEL-WORKAROUND(mesh-timeout): TEMPORARY. Remove when the automodel pin includes "
        "NVIDIA-NeMo/Automodel#4602; then forward timeout_minutes= to MeshContext.build instead."
    )
    assert tag in comments
    assert "stay set for the life of this worker process" in comments
    assert "NVIDIA-NeMo/Automodel#4601" in comments
    # The tag sits right above the globals it marks
    added = _added(SERIES[1])
    tagged = next(i for i, line in enumerate(added) if "AUTOMODEL-WORKAROUND(mesh-timeout)" in line)
    setting = next(i for i, line in enumerate(added) if "c10d.default_pg_timeout =" in line)
    assert 0 < setting - tagged <= 12 and all(line.strip().startswith("#") for line in added[tagged : setting - 1])


def test_config_type_is_in_nemo_rl_s_idiom() -> None:
    added = "\n".join(_added(SERIES[0]))
    # extra="forbid", as VllmNixlRefitConfig: a misspelled key is refused, not ignored
    assert 'class AutomodelConfig(BaseModel, extra="forbid", title="automodel_cfg"):' in added
    # An int, as Megatron's distributed_timeout_minutes and Automodel's timeout_minutes; not strict, as NeMo RL's
    # other fields, so ${oc.env:...}'s "45" is read; booleans refused, which pydantic's lax int would read as 1
    assert "Annotated[int, BeforeValidator(_not_a_bool), Field(gt=0, le=7 * 24 * 60)]" in added
    assert "strict" not in "\n".join(_code(_added(SERIES[0]))) and "allow_inf_nan" not in added
    assert "automodel_cfg: NotRequired[AutomodelConfig]" in added


def test_policy_names_the_section_it_is_built_from() -> None:
    added = "\n".join(_added(SERIES[0]))
    assert 'f"{section}.automodel_cfg.distributed_timeout_minutes is {timeout_minutes}, "' in added
    assert '"reward_model_policy": "env.reward_model"' in added and 'f"teachers[' in added
    assert '"policy.automodel_cfg.distributed_timeout_minutes is' not in added


def test_at_most_80_lines_of_code_under_nemo_rl() -> None:
    code = [
        line
        for patch in SERIES
        for hunk in re.split(r"^diff --git ", patch.read_text().split("\n---\n", 1)[1], flags=re.M)[1:]
        if hunk.startswith("a/nemo_rl/")
        for line in hunk.splitlines()
        if line.startswith("+")
        and not line.startswith("+++")
        and line[1:].strip()
        and not line[1:].strip().startswith("#")
    ]
    assert 10 < len(code) <= CODE_LINES_MAX, len(code)


def test_config_patch_adds_the_key_to_examples_and_their_snapshots() -> None:
    stats = _numstat(SERIES[2])
    examples = {p for p in stats if p.startswith("examples/configs/")}
    snapshots = {p for p in stats if p.startswith("tests/unit/reference_configs/")}
    assert len(examples) >= 5 and len(snapshots) >= 4, stats
    assert all(removed == 0 for path, (_, removed) in stats.items() if path in examples | snapshots), stats
    patch = SERIES[2].read_text()
    config_added = [
        line[1:].strip()
        for hunk in re.split(r"^diff --git ", patch, flags=re.M)[1:]
        if hunk.split()[0].endswith(".yaml")
        for line in hunk.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    blocks = len(config_added) // len(CONFIG_LINES)
    assert config_added == list(CONFIG_LINES) * blocks, config_added
    assert blocks >= 5, f"only {blocks} automodel_cfg blocks added"


def test_test_commit_only_adds_tests() -> None:
    stats = _numstat(SERIES[3])
    assert all(removed == 0 for _, removed in stats.values()), f"the test commit removes lines: {stats}"
    added = _added(SERIES[3])
    new_tests = [line for line in added if re.match(r"\s*def test_\w*timeout", line)]
    assert len(new_tests) >= 5, new_tests


def _setup_test_hunks() -> list[str]:
    """The added lines of each hunk of the set-up test file in the test commit, dedented."""
    patch = SERIES[3].read_text()
    body = re.split(r"^diff --git ", patch, flags=re.M)
    setup = next(part for part in body if part.startswith("a/tests/unit/models/automodel/test_automodel_setup.py"))
    hunks = re.split(r"^@@ .* @@.*$", setup, flags=re.M)[1:]
    return [
        textwrap.dedent("\n".join(line[1:] for line in hunk.splitlines() if line.startswith("+"))) for hunk in hunks
    ]


def test_the_two_gpu_cpu_offload_test_and_its_cpu_twin_share_one_body() -> None:
    functions = {
        node.name: node
        for hunk in _setup_test_hunks()
        for node in ast.walk(ast.parse(hunk))
        if isinstance(node, ast.FunctionDef)
    }
    gpu = functions["test_cpu_offload_timeout_on_every_mesh_axis_two_gpus"]
    twin = functions["test_cpu_offload_timeout_on_every_mesh_axis_two_cpu_ranks"]
    assert [ast.unparse(d) for d in gpu.decorator_list] == ["NEEDS_TWO_GPUS"]
    assert twin.decorator_list == []  # CI runs it

    def calls(node: ast.FunctionDef) -> list[str]:
        return [ast.unparse(c) for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]

    # The same body: two ranks with CPU offload and 45 min, on GPUs and on CPU ranks; the same checks after it
    assert calls(gpu) == [
        "run_timeout_ranks(tmp_path, 2, True, True, 45)",
        "assert_every_axis(reports, 45, 45, {'cuda', 'cpu'})",
    ]
    assert calls(twin) == [
        "run_timeout_ranks(tmp_path, 2, False, True, 45)",
        "assert_every_axis(reports, 45, 45, {'cuda', 'cpu'})",
    ]
    # The body sets up through NeMo RL's own setup_distributed, ranks meeting in a FileStore (no port), bounded
    body = "\n".join(_setup_test_hunks())
    assert "context = setup_distributed(config, runtime_config)" in body
    assert "dist.FileStore(store_path, world_size)" in body and "MASTER_PORT" not in body
    assert "RANKS_BOUND_S = 600" in body and "process.kill()" in body
    # ... and checks every mesh axis, both halves, all-reduces and full_tensor() of a CPU-offloaded parameter
    for check in (
        'mesh["dp"]',
        "full_tensor()",
        "torch.distributed.all_reduce(tensor, group=group)",
        "_flatten_mapping",
    ):
        assert check in body, check
    assert (
        'NEEDS_TWO_GPUS = pytest.mark.skipif(\n    _GPUS < 2, reason=f"needs 2 GPUs for two NCCL ranks, found {_GPUS}"'
        in body
    )


def test_no_gpu_gated_test_configures_cpu_offload_on_one_rank() -> None:
    check = _load_check()
    found = [problem for hunk in _setup_test_hunks() for problem in check.offload_on_one_rank(hunk)]
    # Hunks without a GPU-gated test say so; no other problem may appear
    assert [p for p in found if not p.startswith("no GPU-gated test")] == [], found
    assert len([p for p in found if p.startswith("no GPU-gated test")]) == len(_setup_test_hunks()) - 1, found


def _load_check() -> Any:
    spec = importlib.util.spec_from_file_location("nemo_rl_check_series", REPO_ROOT / "scripts" / "nemo_rl_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
