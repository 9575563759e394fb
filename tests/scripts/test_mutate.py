"""``scripts/mutate.py``, the mutation runner (run outside CI), checked on a toy package: its mutants come from the
syntax tree, and it kills a mutant its tests catch and reports one they miss.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

_SPEC = importlib.util.spec_from_file_location("mutate", REPO_ROOT / "scripts" / "mutate.py")
assert _SPEC is not None and _SPEC.loader is not None
mutate = importlib.util.module_from_spec(_SPEC)
sys.modules["mutate"] = mutate
_SPEC.loader.exec_module(mutate)

TOY = '''"""A toy: a docstring is not mutated."""

LIMIT = 0.10
__all__ = ["at_least_two", "clamp", "kind", "untested"]


def at_least_two(values):
    return len(values) >= 2 and any(v > 0 for v in values if v is not None)


def clamp(x):
    return max(0, x)


def kind(n):
    if n < 0:
        return "negative"
    elif n == 0:
        return f"zero {n > 1}"
    return "positive"


def untested(a, b):
    return a + b
'''
TESTS = """from pkg.toy import at_least_two, clamp, kind


def test_two_positive_values_and_not_one():
    assert at_least_two([1, 2]) and not at_least_two([1]) and not at_least_two([0, 0])


def test_clamp_and_kind():
    assert (clamp(-1), clamp(3), kind(-1), kind(0), kind(5)) == (0, 3, "negative", "zero False", "positive")
"""


SMALL = """def at_least_two(n):
    return n >= 2


def untested(a, b):
    return a + b
"""
SMALL_TESTS = """from pkg.toy import at_least_two


def test_two_and_not_one():
    assert at_least_two(2) and not at_least_two(1)
"""


def _toy(root: Path, source: str = TOY, tests: str = TESTS) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "toy.py").write_text(source)
    (root / "tests" / "test_toy.py").write_text(tests)
    return root


def test_the_mutants_come_from_the_syntax_tree(tmp_path: Path) -> None:
    root = _toy(tmp_path)
    found = {m.key.split("::", 1)[1]: m for m in mutate.mutants_of(root / "pkg" / "toy.py", root, "pkg")}
    for key in (
        "<module>::0.1 -> 0.2", "<module>::0.1 -> 0.05",
        "at_least_two::len(values) >= 2 -> len(values) > 2", "at_least_two::len(values) >= 2 -> len(values) >= 3",
        "at_least_two::any -> all", "at_least_two::v is not None -> True",
        "at_least_two::len(values) >= 2 and any((v > 0 for v in values if v is not None)) -> "
        "any((v > 0 for v in values if v is not None))",
        "clamp::max(0, x) -> x", "clamp::max -> min", "kind::n < 0 -> n <= 0", "kind::n == 0 -> True",
        "kind::n == 0 -> False", "untested::a + b -> a - b",
    ):  # fmt: skip
        assert key in found, (key, sorted(found))
    assert not any("zero" in key or "A toy" in key or "__all__" in key for key in found), "f-strings, docstring"
    assert found["kind::n == 0 -> True"].line == 18
    mutant = found["clamp::max(0, x) -> x"]
    assert b"return (x)" in mutant.apply((root / "pkg" / "toy.py").read_bytes())


def test_it_kills_a_mutant_the_tests_catch_and_reports_one_they_miss(tmp_path: Path) -> None:
    root = _toy(tmp_path / "toy", SMALL, SMALL_TESTS)  # four mutants: a few seconds
    out = tmp_path / "outcomes.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "mutate.py"), "pkg", "--root", str(root), "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {o["mutant"]["key"].split("::", 1)[1]: o for o in json.loads(out.read_text())["outcomes"]}
    assert sorted(outcomes) == ["at_least_two::n >= 2 -> n > 2", "at_least_two::n >= 2 -> n >= 1",
                                "at_least_two::n >= 2 -> n >= 3", "untested::a + b -> a - b"]  # fmt: skip
    assert outcomes["untested::a + b -> a - b"]["status"] == "survived"
    for key in ("at_least_two::n >= 2 -> n > 2", "at_least_two::n >= 2 -> n >= 1", "at_least_two::n >= 2 -> n >= 3"):
        assert (outcomes[key]["status"], outcomes[key]["killed_by"]) == ("killed", ["tests/test_toy.py"]), key
    assert "pkg/toy.py:6  pkg/toy.py::untested::a + b -> a - b" in done.stdout
    assert "pkg/toy.py" in done.stdout and "75.0" in done.stdout
    assert (root / "pkg" / "toy.py").read_text() == SMALL, "the tree given is never written"


@pytest.mark.parametrize("line", ["pkg/toy.py::untested::a + b -> a - b  # a toy's reason"])
def test_an_equivalent_mutant_is_counted_apart(tmp_path: Path, line: str) -> None:
    root = _toy(tmp_path / "toy")
    (tmp_path / "equivalents.txt").write_text(f"# comment\n{line}\n")
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "mutate.py"), "pkg", "--root", str(root), "--modules", "toy",
         "--sample", "3", "--seed", "0", "--equivalents", str(tmp_path / "equivalents.txt"), "--list"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "tests: tests/test_toy.py" in done.stdout, done.stdout + done.stderr
    assert mutate._load_equivalents(tmp_path / "equivalents.txt") == {
        "pkg/toy.py::untested::a + b -> a - b": "a toy's reason"
    }  # fmt: skip
