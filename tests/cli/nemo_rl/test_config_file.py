"""``preflight --config`` reads its YAML bounded (#33, #46): a regular file under a size cap, UTF-8 (an error names
the file and the byte), its nodes counted as they are composed and its aliases before anything is built (a 540-byte
bomb refused in milliseconds), each rule refused in its own true words.

In-process through :func:`~nemo_rl_shim.cli.nemo_rl.recipe.load_recipe`, and through the real command where the
message must reach the user as one line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from nemo_rl_shim.cli import main
from nemo_rl_shim.cli.nemo_rl.config_file import (
    CONFIG_CAP,
    MAX_RECIPE_NODES,
    NodeBudget,
    expanded_nodes,
    load_yaml,
)
from nemo_rl_shim.cli.nemo_rl.recipe import RecipeError, load_recipe
from tests.harness.hostile_inputs import alias_bomb

pytestmark = [pytest.mark.every_lane]


def test_an_alias_bomb_is_refused_in_milliseconds(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb())
    assert len(config.read_bytes()) == 540
    (tmp_path / "ok.yaml").write_text("a: 1\n")
    assert load_recipe(tmp_path / "ok.yaml") == {"a": 1}  # OmegaConf imported: not timed below
    start = time.perf_counter()
    with pytest.raises(RecipeError, match=r"bomb.yaml: its aliases expand to more than 50,000 nodes: refused"):
        load_recipe(config)
    assert time.perf_counter() - start < 1.0, "refused in milliseconds (1 s allows a loaded machine)"


def test_aliases_within_the_limit_still_load(tmp_path: Path) -> None:
    """Anchors and aliases are YAML: a config that repeats a section by alias loads as OmegaConf loads it."""
    config = tmp_path / "c.yaml"
    config.write_text("base: &base {lr: 0.1, steps: 3}\npolicy: *base\n" + alias_bomb(levels=2, width=3))
    assert load_recipe(config) == {
        "base": {"lr": 0.1, "steps": 3},
        "policy": {"lr": 0.1, "steps": 3},
        "a0": ["lolol"] * 3,
        "a1": [["lolol"] * 3] * 3,
    }
    # the root, 5 keys, then each anchor's list: 11, 111, 1111, 11111, 111111 nodes with its aliases expanded
    expected = 1 + 5 + sum(int("1" * (n + 2)) for n in range(5))
    assert expanded_nodes(yaml.compose(alias_bomb(levels=5)), 10**6) == expected


def test_an_alias_inside_itself_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(RecipeError, match=r"c.yaml: an alias contains itself: refused"):
        load_recipe(tmp_path / "c.yaml")


@pytest.mark.parametrize("kind", ["fifo", "urandom", "directory", "too large"])
def test_only_a_regular_file_under_the_cap_is_read(tmp_path: Path, kind: str, capsys) -> None:
    path = tmp_path / "c.yaml"
    if kind == "fifo":
        os.mkfifo(path)
        words = "is a FIFO, not a regular file"
    elif kind == "urandom":
        path.symlink_to("/dev/urandom")
        words = "is a character device, not a regular file"
    elif kind == "directory":
        path.mkdir()
        words = "is a directory, not a regular file"
    else:
        with open(path, "wb") as handle:
            handle.truncate(CONFIG_CAP + 1)
        words = "is 16.0 MiB, more than a config can be (16.0 MiB): not read"
    assert main(["preflight", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"preflight: {path} {words}") and err.count("\n") == 1, err


def test_a_decoding_error_names_the_file_and_the_byte(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(b"policy:\n  x: \xff\xfe\n")
    assert main(["preflight", "--config", str(config)]) == 2
    assert capsys.readouterr().err == f"preflight: {config}: not UTF-8 text (byte 0xff at offset 13)\n"


def test_a_parent_in_defaults_is_read_the_same_way(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "parent.yaml")
    (tmp_path / "child.yaml").write_text("defaults: parent.yaml\n")
    with pytest.raises(RecipeError, match=r"child.yaml -> .*parent.yaml is a FIFO, not a regular file"):
        load_recipe(tmp_path / "child.yaml")


def test_the_limit_is_what_the_docs_say() -> None:
    assert MAX_RECIPE_NODES == 50_000 and CONFIG_CAP == 16 << 20


def test_many_keys_are_refused_as_keys_after_the_budget_not_after_all_of_them(tmp_path: Path) -> None:
    """500,000 keys and no alias: the keys rule, said as such, once 50,000 nodes are composed (not 1,000,000)."""
    config = tmp_path / "keys.yaml"
    config.write_text("big:\n" + "".join(f"  k{i}: {i}\n" for i in range(500_000)))
    start = time.process_time()
    with pytest.raises(ValueError) as raised:
        load_yaml(config)
    message = str(raised.value)
    assert message == (
        f"{config}: holds more than 50,000 YAML nodes (keys, values and lists; NeMo RL's largest recipe has 1,604): "
        "refused"
    )
    assert "alias" not in message
    assert time.process_time() - start < 10.0, "about 1.3 s of CPU here: the rest of the file is never composed"


def test_the_budget_is_the_recipe_s_over_every_file_it_reads(tmp_path: Path) -> None:
    """A file within the budget alone takes the recipe past it after others: said so."""
    (tmp_path / "a.yaml").write_text("".join(f"k{i}: {i}\n" for i in range(100)))
    budget = NodeBudget(limit=250)
    load_yaml(tmp_path / "a.yaml", budget)
    assert budget.used == 201  # the root mapping, 100 keys and 100 values
    with pytest.raises(ValueError, match=r"a.yaml: takes the recipe, with the files read before it, to more than 250"):
        load_yaml(tmp_path / "a.yaml", budget)


def test_aliases_past_the_budget_are_named_as_aliases(tmp_path: Path) -> None:
    """Within the budget as written (21 nodes), past it once the aliases repeat their nodes: the aliases rule."""
    config = tmp_path / "c.yaml"
    config.write_text(alias_bomb(levels=5, width=10))
    with pytest.raises(ValueError, match=r"c.yaml: its aliases expand to more than 1,000 nodes: refused"):
        load_yaml(config, NodeBudget(limit=1_000))
