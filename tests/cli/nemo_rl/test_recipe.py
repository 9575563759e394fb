"""Reading a NeMo RL config as NeMo RL reads it (``nemo_rl_shim.cli.nemo_rl.recipe``): one feature per case.

Every config tree is written here (``tmp_path``); none of NeMo RL's files is used. The
loader's parity with NeMo RL's own on NeMo RL's configs is ``scripts/recipe_parity.py``'s job.
Error paths go through the real command: exit 2 and one line on stderr, before any rank starts.
In-process, no ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from nemo_rl_shim.cli import main
from nemo_rl_shim.cli.nemo_rl.recipe import RESOLVERS, RecipeError, load_recipe, register_resolvers
from nemo_rl_shim.cli.preflight.options import build_options

__all__: list[str] = []


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> YAML text) under ``root``; returns the first one's path."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / next(iter(files))


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``preflight`` with ``argv``; it must exit 2 with one line on stderr and nothing on stdout."""
    assert main(["preflight", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err.strip()


# --- defaults: -------------------------------------------------------------------------------


def test_defaults_as_one_file_name(tmp_path: Path) -> None:
    child = _tree(
        tmp_path, {"child.yaml": "defaults: parent.yaml\nb: child\n", "parent.yaml": "a: parent\nb: parent\n"}
    )
    assert load_recipe(child) == {"a": "parent", "b": "child"}


def test_defaults_as_a_list_later_parent_wins(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {"child.yaml": "defaults: [one.yaml, two.yaml]\n", "one.yaml": "a: one\nb: one\n", "two.yaml": "b: two\n"},
    )
    assert load_recipe(child) == {"a": "one", "b": "two"}


def test_the_file_itself_wins_over_its_parents(tmp_path: Path) -> None:
    child = _tree(tmp_path, {"child.yaml": "defaults: [p.yaml]\nx: {k: child}\n", "p.yaml": "x: {k: p, j: p}\n"})
    assert load_recipe(child) == {"x": {"k": "child", "j": "p"}}


def test_each_defaults_entry_is_relative_to_the_file_that_names_it(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {
            "recipes/llm/child.yaml": "defaults: ../../base/parent.yaml\nc: 3\n",
            "base/parent.yaml": "defaults: grand.yaml\nb: 2\n",  # base/grand.yaml, not recipes/llm/grand.yaml
            "base/grand.yaml": "a: 1\n",
        },
    )
    assert load_recipe(child) == {"a": 1, "b": 2, "c": 3}


def test_an_absolute_defaults_path_is_kept(tmp_path: Path) -> None:
    parent = _tree(tmp_path / "elsewhere", {"parent.yaml": "a: 1\n"})
    child = _tree(tmp_path / "here", {"child.yaml": f"defaults: {parent}\nb: 2\n"})
    assert load_recipe(child) == {"a": 1, "b": 2}


def test_nested_defaults_load_depth_first(tmp_path: Path) -> None:
    # Order: grand (through one), one, two, child. two comes after grand, so two's k wins over grand's.
    child = _tree(
        tmp_path,
        {
            "child.yaml": "defaults: [one.yaml, two.yaml]\n",
            "one.yaml": "defaults: grand.yaml\nfrom_one: 1\n",
            "grand.yaml": "k: grand\nj: grand\n",
            "two.yaml": "k: two\n",
        },
    )
    assert load_recipe(child) == {"k": "two", "j": "grand", "from_one": 1}


# --- _override_ ------------------------------------------------------------------------------


def test_override_marker_replaces_a_top_level_section(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {
            "child.yaml": "defaults: parent.yaml\ndata:\n  _override_: true\n  c: 3\nkept: {y: 2}\n",
            "parent.yaml": "data: {a: 1, b: 2}\nkept: {x: 1}\n",
        },
    )
    assert load_recipe(child) == {"data": {"c": 3}, "kept": {"x": 1, "y": 2}}


def test_nested_override_marker_is_merged_like_any_key_as_in_nemo_rl(tmp_path: Path) -> None:
    # NeMo RL's merge_with_override looks at top-level keys only; a nested marker merges and stays.
    child = _tree(
        tmp_path,
        {
            "child.yaml": "defaults: parent.yaml\npolicy:\n  data:\n    _override_: true\n    c: 3\n",
            "parent.yaml": "policy: {data: {a: 1}}\n",
        },
    )
    assert load_recipe(child) == {"policy": {"data": {"a": 1, "c": 3, "_override_": True}}}


def test_a_mandatory_value_left_unfilled_stays_as_nemo_rl_leaves_it(tmp_path: Path) -> None:
    child = _tree(tmp_path, {"child.yaml": "defaults: p.yaml\nb: ???\n", "p.yaml": "a: ???\nb: 1\n"})
    assert load_recipe(child) == {"a": "???", "b": 1}


# --- interpolation and resolvers -------------------------------------------------------------


def test_interpolation_resolves_against_the_merged_config(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {"child.yaml": "defaults: parent.yaml\nbase: 43\n", "parent.yaml": "base: 42\nderived: {value: '${base}'}\n"},
    )
    assert load_recipe(child) == {"base": 43, "derived": {"value": 43}}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("${add:2,3}", 5), ("${mul:${n},4}", 24), ("${div:${n},4}", 1.5), ("${max:${n},9}", 9)],
    ids=["add", "mul", "div", "max"],
)
def test_each_nemo_rl_resolver(tmp_path: Path, expression: str, expected: float) -> None:
    config = _tree(tmp_path, {"c.yaml": f"n: 6\nv: '{expression}'\n"})
    assert load_recipe(config)["v"] == expected


def test_a_resolver_the_user_registered_is_kept(tmp_path: Path) -> None:
    config = _tree(tmp_path, {"c.yaml": "v: '${max:1,2}'\n"})
    OmegaConf.clear_resolver("max")
    OmegaConf.register_new_resolver("max", lambda a, b: "user's max")
    try:
        register_resolvers()
        assert load_recipe(config)["v"] == "user's max"
    finally:
        OmegaConf.clear_resolver("max")
        OmegaConf.register_new_resolver("max", RESOLVERS["max"])


# --- overrides -------------------------------------------------------------------------------

_BASE = (
    "policy:\n  dtensor_cfg:\n    cpu_offload: false\n    tensor_parallel_size: 1\n"
    "  n: 4\n  m: '${mul:${policy.n},2}'\n"
)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("policy.n=8", {"n": 8, "m": 16}),  # plain: an existing key, interpolations follow
        ("+policy.added=1", {"added": 1}),
        ("++policy.n=2", {"n": 2, "m": 4}),
        ("++policy.new=x", {"new": "x"}),
        ("policy.dtensor_cfg={cpu_offload: true}", {"dtensor_cfg": {"cpu_offload": True, "tensor_parallel_size": 1}}),
        ("policy.dtensor_cfg.tensor_parallel_size=${policy.n}", {"dtensor_cfg": {"tensor_parallel_size": 4}}),
    ],
    ids=["plain", "add", "force-add-existing", "force-add-new", "dict-merges", "interpolation-value"],
)
def test_each_override_form(tmp_path: Path, override: str, expected: dict) -> None:
    policy = load_recipe(_tree(tmp_path, {"c.yaml": _BASE}), [override])["policy"]
    for key, value in expected.items():
        if isinstance(value, dict):
            assert {k: policy[key][k] for k in value} == value, policy
        else:
            assert policy[key] == value, policy


def test_delete_override_and_delete_with_a_matching_value(tmp_path: Path) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    assert "tensor_parallel_size" not in load_recipe(config, ["~policy.dtensor_cfg.tensor_parallel_size"])["policy"]
    assert "n" not in load_recipe(config, ["~policy.n=4", "policy.m=1"])["policy"]


def test_overrides_apply_in_order(tmp_path: Path) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    assert load_recipe(config, ["policy.n=1", "policy.n=7"])["policy"]["n"] == 7


# --- errors, through the command -------------------------------------------------------------


def test_plain_override_of_a_missing_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    line = _cli_error(capsys, "--config", str(config), "policy.dtensor_cfg.cpu_ofload=true")
    assert line == (
        "preflight: override 'policy.dtensor_cfg.cpu_ofload=true': policy.dtensor_cfg.cpu_ofload is not in the "
        "config, and NeMo RL refuses to set a missing key: add it with '+policy.dtensor_cfg.cpu_ofload=true'"
    )


def test_add_override_of_an_existing_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    line = _cli_error(capsys, "--config", str(config), "+policy.n=5")
    assert line.startswith("preflight: override '+policy.n=5': policy.n is already set (4)"), line


def test_delete_of_a_missing_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    line = _cli_error(capsys, "--config", str(config), "~policy.nope")
    assert line == "preflight: override '~policy.nope': cannot delete policy.nope: it is not in the config (or is null)"


def test_delete_with_a_value_that_does_not_match_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    line = _cli_error(capsys, "--config", str(config), "~policy.n=5")
    assert line == "preflight: override '~policy.n=5': cannot delete policy.n: its value is 4, not 5"


@pytest.mark.parametrize("override", ["policy.n=[1", "policy.n", "=3"])
def test_bad_override_syntax_is_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str) -> None:
    config = _tree(tmp_path, {"c.yaml": _BASE})
    line = _cli_error(capsys, "--config", str(config), override)
    assert line.startswith(f"preflight: override '{override}': "), line


def test_missing_parent_names_the_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _tree(
        tmp_path, {"a.yaml": "defaults: b.yaml\n", "b.yaml": "defaults: [ok.yaml, missing.yaml]\n", "ok.yaml": ""}
    )
    line = _cli_error(capsys, "--config", str(a))
    assert line == f"preflight: {a} -> {tmp_path / 'b.yaml'} -> {tmp_path / 'missing.yaml'}: no such file"


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli_error(capsys, "--config", str(tmp_path / "no.yaml")) == f"preflight: {tmp_path / 'no.yaml'}: no such file"
    )


def test_cycle_in_defaults_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _tree(
        tmp_path,
        {"a.yaml": "defaults: b.yaml\n", "b.yaml": "defaults: [ok.yaml, sub/c.yaml]\n", "ok.yaml": "",
         "sub/c.yaml": "defaults: ../b.yaml\n"},
    )  # fmt: skip
    line = _cli_error(capsys, "--config", str(a))
    b, c, back = tmp_path / "b.yaml", tmp_path / "sub" / "c.yaml", tmp_path / "sub" / "../b.yaml"
    assert line == f"preflight: cycle in defaults: {b} -> {c} -> {back}"


def test_a_file_named_twice_is_not_a_cycle(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {"child.yaml": "defaults: [one.yaml, two.yaml]\n", "one.yaml": "defaults: common.yaml\n",
         "two.yaml": "defaults: common.yaml\n", "common.yaml": "a: 1\n"},
    )  # fmt: skip
    assert load_recipe(child) == {"a": 1}


def test_unresolvable_interpolation_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tree(tmp_path, {"c.yaml": "policy:\n  dtensor_cfg:\n    tensor_parallel_size: '${cluster.gpus}'\n"})
    line = _cli_error(capsys, "--config", str(config))
    assert line == (
        f"preflight: {config}: cannot resolve policy.dtensor_cfg.tensor_parallel_size: "
        "Interpolation key 'cluster.gpus' not found"
    )


def test_unknown_resolver_names_the_key(tmp_path: Path) -> None:
    config = _tree(tmp_path, {"c.yaml": "v: '${pow:2,3}'\n"})
    with pytest.raises(RecipeError, match=r"cannot resolve v: Unsupported interpolation type pow"):
        load_recipe(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaults: 3\n", "defaults must be a file name or a list of file names, got 3"),
        ("- a\n- b\n", "must hold a mapping at the top level, got a ListConfig"),
        ("a: [\n", "not a valid YAML config"),
    ],
    ids=["defaults-not-a-name", "not-a-mapping", "bad-yaml"],
)
def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    config = _tree(tmp_path, {"c.yaml": text})
    line = _cli_error(capsys, "--config", str(config))
    assert line.startswith(f"preflight: {config}: {message}"), line


def test_overrides_without_a_config_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli_error(capsys, "policy.n=1") == "preflight: config overrides need --config PATH, got 'policy.n=1'"


# --- the seed case: a CPU-offload recipe reaches the options ---------------------------------


def test_a_child_recipe_inherits_cpu_offload_and_overrides_reach_the_options(tmp_path: Path) -> None:
    child = _tree(
        tmp_path,
        {
            "recipes/llm/child-16K.yaml": "defaults: parent-8K.yaml\npolicy:\n  max_total_sequence_length: 16384\n",
            "recipes/llm/parent-8K.yaml": "defaults: ../../base.yaml\npolicy:\n  dtensor_cfg:\n    cpu_offload: true\n",
            "base.yaml": "policy:\n  max_total_sequence_length: 8192\n  dtensor_cfg:\n    cpu_offload: false\n"
            "    tensor_parallel_size: 1\n",
        },
    )
    options = build_options(str(child))
    assert options.cpu_offload is True
    assert options.section["dtensor_cfg"] == {"cpu_offload": True, "tensor_parallel_size": 1}
    assert options.section["max_total_sequence_length"] == 16384
    overridden = build_options(
        str(child),
        recipe_overrides=[
            "policy.dtensor_cfg.cpu_offload=false",
            "++policy.automodel_cfg.distributed_timeout_minutes=45",
        ],
    )
    assert (overridden.cpu_offload, overridden.timeout_minutes) == (False, 45.0)


def test_flags_apply_after_the_recipe_overrides(tmp_path: Path) -> None:
    config = _tree(tmp_path, {"c.yaml": "policy:\n  dtensor_cfg: {cpu_offload: false}\n"})
    options = build_options(
        str(config), overrides={"cpu_offload": True}, recipe_overrides=["policy.dtensor_cfg.cpu_offload=false"]
    )
    assert options.cpu_offload is True


@pytest.mark.parametrize(
    ("dtensor", "expected"),
    [
        ({"_v2": True}, None),
        ({}, "policy.dtensor_cfg._v2 is unset: NeMo RL runs its v1 DTensor worker"),
        ({"_v2": False}, "policy.dtensor_cfg._v2 is False: NeMo RL runs its v1 DTensor worker"),
        ({"enabled": False}, "policy.dtensor_cfg.enabled is false: NeMo RL runs this role on Megatron"),
    ],
    ids=["v2", "v2-unset", "v2-false", "megatron"],
)
def test_a_config_off_the_automodel_path_gets_a_note(tmp_path: Path, dtensor: dict, expected: str | None) -> None:
    config = {"policy": {"dtensor_cfg": {"cpu_offload": True, **dtensor}, "automodel_cfg": {}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    note = build_options(str(path), world=2).worker_note
    assert (note is None) if expected is None else (note is not None and note.startswith(expected)), note
    assert build_options(None).worker_note is None  # the embedded default is the Automodel path
