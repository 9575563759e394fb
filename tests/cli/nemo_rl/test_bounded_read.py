"""A recipe read in a bounded child process (#46): the same config as in this process, and every end one line.

:func:`~nemo_rl_shim.cli.nemo_rl.bounded_read.read_config` against :func:`~nemo_rl_shim.cli.nemo_rl.recipe.load_recipe`
on the shipped examples (the same dict, int keys and all); then the budget's rules one by one, on real recipes: an
interpolation bomb (the CPU rule), a doubling ``defaults:`` (the file-reads rule), nesting past what comes back, a
wall bound shorter than the read; and each way the child can end, said by :func:`_answer` (memory, the CPU limit's
signal, a crash). CPU time is what the rules are held to: the child's, read from ``RUSAGE_CHILDREN``.
"""

from __future__ import annotations

import json
import math
import resource
import signal
from pathlib import Path

import pytest

from nemo_rl_shim.cli.nemo_rl.bounded_read import (
    RESOLVE_CPU_BASE_S,
    RecipeTimedOut,
    _answer,
    decode,
    encode,
    read_config,
    resolve_cpu_s,
)
from nemo_rl_shim.cli.nemo_rl.recipe import MAX_RECIPE_FILES, RecipeError, load_recipe
from tests.harness.hostile_inputs import interpolation_bomb
from tests.harness.paths import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_child_reads_what_this_process_reads(path: Path) -> None:
    assert EXAMPLES, "no example recipe found"
    assert read_config(path, timeout_s=120) == load_recipe(path)


def test_overrides_and_int_keys_come_back_as_they_were(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("policy: {a: 1}\nby_rank: {0: zero, 1: one}\nratio: .nan\nraw: !!binary aGk=\n")
    read = read_config(config, ["policy.a=2", "+policy.b=${policy.a}"], timeout_s=120)
    assert read is not None
    assert read["policy"] == {"a": 2, "b": 2}
    assert read["by_rank"] == {0: "zero", 1: "one"} and all(type(k) is int for k in read["by_rank"])
    assert math.isnan(read["ratio"]) and read["raw"] == b"hi"


def test_nemo_rl_s_resolvers_are_there_while_a_merge_resolves(tmp_path: Path) -> None:
    """NeMo RL registers ``add`` before it loads, and its merge resolves the top-level values of the file merged in
    (on that file alone: ``${a}`` of a parent is not found there, in NeMo RL as here): a child read without the
    resolvers said ``Unsupported interpolation type add`` (found by the property test)."""
    (tmp_path / "parent.yaml").write_text("a: 1\n")
    (tmp_path / "child.yaml").write_text("defaults: parent.yaml\nb: ${add:1,2}\nc: {d: '${add:${a},2}'}\n")
    expected = {"a": 1, "b": 3, "c": {"d": 3}}
    assert read_config(tmp_path / "child.yaml", timeout_s=120) == expected == load_recipe(tmp_path / "child.yaml")


@pytest.mark.parametrize(
    "value",
    [{1: "a", "1": "b", 2.5: [None, True]}, [[[]]], {"d": [[1, 2]]}, {"b": "00"}, -(10**30), "\ud800"],
    ids=["mixed-keys", "nested", "a-key-named-d", "a-key-named-b", "big-int", "lone-surrogate"],
)
def test_the_codec_round_trips_through_json(value: object) -> None:
    assert decode(json.loads(json.dumps(encode(value)))) == value


@pytest.mark.parametrize("junk", [{"x": 1}, {"d": "pairs"}, {"d": [[[1], 2]]}, {"b": 5}])
def test_the_codec_refuses_what_it_does_not_write(junk: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode(junk)


def test_a_value_a_config_cannot_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="holds a set"):
        encode({"a": {1, 2}})
    deep: list = []
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ValueError, match="nested more than 64 deep"):
        encode(deep)


def test_an_interpolation_bomb_is_refused_by_its_cpu_budget_naming_the_rule(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(interpolation_bomb(20))
    size = len(config.read_bytes())
    before = _child_cpu()
    with pytest.raises(RecipeError) as raised:
        read_config(config, timeout_s=600)
    spent = _child_cpu() - before
    assert not isinstance(raised.value, RecipeTimedOut)
    assert str(raised.value).startswith(
        f"{config}: resolving its ${{...}} interpolations took more than {resolve_cpu_s(size):.1f} s of CPU, the "
        f"budget for its {size:,} bytes"
    ), raised.value
    assert RESOLVE_CPU_BASE_S <= spent < resolve_cpu_s(size) + 6.0, spent  # the budget, and an interpreter's start


def test_a_doubling_defaults_tree_is_refused_by_its_file_reads(tmp_path: Path) -> None:
    """Each file names its parent twice: 2**20 reads. Refused after 64, as the defaults rule."""
    for level in range(20):
        (tmp_path / f"d{level}.yaml").write_text(f"defaults: [d{level + 1}.yaml, d{level + 1}.yaml]\nk{level}: 1\n")
    (tmp_path / "d20.yaml").write_text("leaf: 1\n")
    with pytest.raises(RecipeError, match=rf"the recipe reads more than {MAX_RECIPE_FILES} files through its defaults"):
        read_config(tmp_path / "d0.yaml", timeout_s=120)


def test_nesting_past_what_comes_back_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text("a: " + "[" * 70 + "]" * 70 + "\n")
    with pytest.raises(RecipeError) as raised:
        read_config(config, timeout_s=120)
    assert str(raised.value) == f"{config}: nested more than 64 deep: refused"


def test_a_wall_bound_shorter_than_the_read_ends_the_child_and_says_the_phase(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(interpolation_bomb(24))
    with pytest.raises(RecipeTimedOut) as raised:
        read_config(config, timeout_s=1.0)
    assert str(raised.value).startswith(f"{config} was not read within 1 s: still "), raised.value
    assert raised.value.phase in ("starting", "loading its files and defaults", "resolving its ${...} interpolations")


@pytest.mark.parametrize(
    ("out", "code", "words"),
    [
        ('{"phase": "loading"}\n{"out_of": "cpu"}\n', 0, "loading its files and defaults took more than 10 s of CPU"),
        (
            '{"phase": "loading"}\n{"out_of": "cpu", "step": "merging b.yaml"}\n',
            0,
            "loading its files and defaults (merging b.yaml, which resolves its top-level ${...} interpolations) took "
            "more than 10 s of CPU",
        ),
        (
            '{"phase": "loading"}\n{"phase": "resolving", "cpu_s": 2.1, "bytes": 452}\n{"out_of": "memory"}\n',
            0,
            "resolving its ${...} interpolations needed more than 1,024 MiB of memory: refused",
        ),
        (
            '{"phase": "loading"}\n{"phase": "resolving", "cpu_s": 2.1, "bytes": 452}\n',
            -signal.SIGXCPU,
            "resolving its ${...} interpolations took more than 2.1 s of CPU, the budget for its 452 bytes",
        ),
        ('{"phase": "loading"}\n', -signal.SIGKILL, "the process reading it ended (signal 9) while loading its files"),
        ("not json at all\n", 1, "the process reading it ended (exit 1) while starting: boom"),
        ('{"config": {"d": "pairs"}}\n', 0, "the config read back is not one"),
        ('{"config": [1]}\n', 0, "must hold a mapping at the top level, got a list"),
    ],
)
def test_every_end_of_the_child_is_one_line_naming_the_file(out: str, code: int, words: str) -> None:
    with pytest.raises(RecipeError) as raised:
        _answer("r.yaml", out.encode(), b"Traceback...\nboom\n", code)
    line = str(raised.value)
    assert line.startswith("r.yaml") and words in line and "\n" not in line, line
