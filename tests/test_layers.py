"""Imports run one way: ``automodel_patch`` below the library's rooms below the command line, with no cycle.

Read from the sources (every ``import`` statement, at module level, in functions and under
``TYPE_CHECKING`` alike), so a lazy import cannot hide an arrow running back up:

* ``automodel_patch`` imports nothing of ``nemo_rl_shim``;
* the library (``nemo_rl_shim`` outside ``cli/`` and ``__main__``) never imports ``nemo_rl_shim.cli``;
* the library's rooms (``nemo_rl_shim.<room>``) sit on the floors of :data:`ROOM_FLOORS`, and a module imports only
  from its own room or from floors below (a new room, or a new flat module, gets a floor here, or this test names it);
* ``nemo_rl_shim.config`` knows nothing of torch.distributed: it imports the standard library alone, even through
  others;
* no module imports, directly or through others, a module that imports it back.

What runs, also from the sources: the hang report (``nemo-rl-shim hang-report``) reaches no module that imports
torch, nor any package outside the standard library, even transitively. Followed there: every import that runs
(not those under ``TYPE_CHECKING``), the ``__init__`` of every package a module is in (Python runs it first), and
the imports inside functions, except the command's dispatcher (``cli/main.py`` imports each subcommand in the
function that runs it) and torch's analyzer, which only ``--torch-analyzer`` runs.

And in a fresh interpreter: ``import nemo_rl_shim`` imports no torch, no nemo-automodel, not the command line, not
OmegaConf or Hydra (only the command's NeMo RL package, ``nemo_rl_shim.cli.nemo_rl``, uses them); the console
script ``nemo-rl-shim hang-report DIR`` on a folder of dumps imports no torch, and with ``--torch-analyzer`` it does.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.harness.nccl_scenarios import EXPECTED, build
from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

PACKAGES = ("automodel_patch", "nemo_rl_shim")
#: How an import statement runs: when its module is imported, when a function of it is called, or never.
MODULE_LEVEL, IN_FUNCTION, TYPE_CHECKING_ONLY = "module", "function", "type_checking"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for package in PACKAGES for path in sorted((REPO_ROOT / package).rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The project module an import of ``name`` loads (a package's submodule, or the package), else None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(nodes: Iterable[ast.AST], how: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under ``nodes``, with how it runs."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, how
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.body, TYPE_CHECKING_ONLY)
            yield from _statements(node.orelse, how)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(ast.iter_child_nodes(node), IN_FUNCTION if how == MODULE_LEVEL else how)
        else:
            yield from _statements(ast.iter_child_nodes(node), how)


def _read(module: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """``(project imports, other imports)`` of ``module``: ``{(module or top-level package, how it runs)}``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    project, other = set(), set()
    for node, how in _statements(tree.body, MODULE_LEVEL):
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        else:
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            # "from package import submodule" depends on the submodule; "from module import name" on the module.
            names = {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
        for name in names:
            target = _resolve(name)
            if target is None:
                other.add((name.split(".")[0], how))
            elif target != module:
                project.add((target, how))
    return project, {(name, how) for name, how in other if name != "__future__"}


READ = {module: _read(module) for module in MODULES}
GRAPH = {module: {target for target, _ in project} for module, (project, _) in READ.items()}


#: The library's rooms, lowest first: a module imports from its own room or from floors below its room's.
ROOM_FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor.split())
    for floor in (
        "_lazy config",  # the lazy exports' helper; the knob and its checks (standard library only)
        "one_line",  # an exception's first line, a list of ranks (the integer check from config)
        "untrusted",  # reading a file anyone may have written: regular, never blocking, bounded
        "process_groups",  # every group torch holds; the value later ones get; setting a timeout, read back
        "flight_recorder",  # the recorder, its dumps and their names; the stack watchdog
        "timeouts audit",  # the phases and the learned timeouts; every group audited
        "hang_report",  # reading and judging a run's dumps: read_run -> HangReport (imports no torch)
        "setup",  # the default group, the decision, the supported pairs, setup_distributed
        ".",  # nemo_rl_shim/__init__.py: the package's names
    )
)
_FLOOR = {room: level for level, floor in enumerate(ROOM_FLOORS) for room in floor}


def _is_cli(module: str) -> bool:
    return module == "nemo_rl_shim.__main__" or module.startswith("nemo_rl_shim.cli")


LIBRARY = sorted(m for m in GRAPH if m.startswith("nemo_rl_shim") and not _is_cli(m))


def _room(module: str) -> str:
    """``nemo_rl_shim.timeouts.phases`` -> ``timeouts``; the package itself -> ``"."``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "."


def test_the_graph_is_read_from_every_module() -> None:
    assert {"automodel_patch._apply", "nemo_rl_shim.setup.distributed", "nemo_rl_shim.cli.preflight.run"} <= set(GRAPH)
    assert "nemo_rl_shim.process_groups.registry" in GRAPH["nemo_rl_shim.timeouts.phases"]  # a real edge is seen
    project, _ = READ["nemo_rl_shim.flight_recorder"]
    assert ("nemo_rl_shim.flight_recorder.recorder", TYPE_CHECKING_ONLY) in project  # how it runs is seen
    assert ("torch", IN_FUNCTION) in READ["nemo_rl_shim.hang_report.torch_analyzer"][1]
    assert ("torch", MODULE_LEVEL) in READ["nemo_rl_shim.process_groups.registry"][1]


def test_automodel_patch_knows_nothing_of_the_shim() -> None:
    upward = {
        m: sorted(t for t in GRAPH[m] if t.startswith("nemo_rl_shim")) for m in GRAPH if m.startswith("automodel_patch")
    }
    assert {m: t for m, t in upward.items() if t} == {}


def test_the_library_never_imports_the_command_line() -> None:
    assert len(LIBRARY) >= 20, LIBRARY
    upward = {m: sorted(t for t in GRAPH[m] if _is_cli(t)) for m in LIBRARY}
    assert {m: t for m, t in upward.items() if t} == {}


def test_every_library_module_is_in_a_room_with_a_floor() -> None:
    rooms = {_room(m) for m in LIBRARY}
    assert rooms - set(_FLOOR) == set(), "give each new room (or flat module) a floor in ROOM_FLOORS"
    assert set(_FLOOR) - rooms == set(), "ROOM_FLOORS names a room that does not exist"
    flat = sorted(m for m in LIBRARY if m.count(".") == 1 and MODULES[m].name != "__init__.py")
    assert flat == ["nemo_rl_shim._lazy"], f"a module outside every room: {flat}"


def test_the_rooms_import_only_downwards() -> None:
    upward = sorted(
        (module, target)
        for module in LIBRARY
        for target in GRAPH[module]
        if target in LIBRARY and _room(target) != _room(module) and _FLOOR[_room(target)] >= _FLOOR[_room(module)]
    )
    assert upward == [], f"imports on or above the importer's floor (ROOM_FLOORS): {upward}"
    assert "nemo_rl_shim.process_groups.later" in GRAPH["nemo_rl_shim.timeouts.phases"]  # phases stand on it


def _reached(
    start: Iterable[str], *, not_into: frozenset[str] = frozenset(), dispatchers: frozenset[str] = frozenset()
) -> set[str]:
    """The project modules that importing ``start`` runs and that their functions import, each package's
    ``__init__`` included; never ``not_into``, and of ``dispatchers`` only what they import at module level."""
    seen: set[str] = set()
    stack = list(start)
    while stack:
        module = stack.pop()
        if module in seen or module in not_into:
            continue
        seen.add(module)
        parts = module.split(".")
        stack += [".".join(parts[:n]) for n in range(1, len(parts))]  # its packages, which Python runs first
        for target, how in READ[module][0]:
            if how == MODULE_LEVEL or (how == IN_FUNCTION and module not in dispatchers):
                stack.append(target)
    return seen


def _outside_the_standard_library(modules: Iterable[str]) -> dict[str, list[str]]:
    found = {
        m: sorted({name for name, how in READ[m][1] if how != TYPE_CHECKING_ONLY} - set(sys.stdlib_module_names))
        for m in modules
    }
    return {m: names for m, names in found.items() if names}


def test_config_knows_nothing_of_torch_distributed() -> None:
    config = [m for m in LIBRARY if _room(m) == "config"]
    assert len(config) == 4, config  # the package, integers, numbers, settings
    reached = _reached(config)
    assert {_room(m) for m in reached} <= {".", "_lazy", "config"}, sorted(reached)
    assert _outside_the_standard_library(reached) == {}


#: Only ``--torch-analyzer`` runs it (inside its functions, it imports torch).
TORCH_ANALYZER = "nemo_rl_shim.hang_report.torch_analyzer"
#: The command's dispatcher: its functions import each subcommand (preflight and status import torch), so only what
#: it imports at module level runs for every subcommand.
DISPATCHER = "nemo_rl_shim.cli.main"
#: The library room and the command over it.
HANG_REPORT = [
    *sorted(m for m in MODULES if m.startswith("nemo_rl_shim.hang_report") and m != TORCH_ANALYZER),
    "nemo_rl_shim.cli.hang_report",
]


def test_the_hang_reports_modules_import_no_torch_even_transitively() -> None:
    assert len(HANG_REPORT) >= 10, HANG_REPORT
    reached = _reached(HANG_REPORT, not_into=frozenset({TORCH_ANALYZER}), dispatchers=frozenset({DISPATCHER}))
    assert {
        "nemo_rl_shim",
        DISPATCHER,
        "nemo_rl_shim.flight_recorder.names",
        "nemo_rl_shim.one_line.rank_ranges",
    } <= reached
    assert _outside_the_standard_library(reached) == {}, "the hang report reaches a module that imports these"
    at_import = {name for name, how in READ[TORCH_ANALYZER][1] if how == MODULE_LEVEL}
    assert at_import <= set(sys.stdlib_module_names), "torch's analyzer imports torch inside its functions only"
    assert ("torch", IN_FUNCTION) in READ[TORCH_ANALYZER][1]


@pytest.mark.parametrize("start", sorted(GRAPH))
def test_no_import_cycle(start: str) -> None:
    seen, stack = set(), [(start, (start,))]
    while stack:
        module, path = stack.pop()
        for target in GRAPH[module]:
            if target == start:
                pytest.fail(f"import cycle: {' -> '.join((*path, target))}")
            if target not in seen:
                seen.add(target)
                stack.append((target, (*path, target)))


def _fresh(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=True
    )  # a bound for a hang: a fresh interpreter that imports torch took over 120 s on a machine at a load of 80
    return done.stdout.strip()


def test_importing_the_library_loads_neither_torch_nor_automodel_nor_the_command_line() -> None:
    code = (
        "import sys, nemo_rl_shim; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'nemo_automodel', 'omegaconf', 'hydra', 'automodel_patch') or m.startswith('nemo_rl_shim.cli')))"
    )
    assert _fresh(code) == "[]"
    # the check can fail: reading an export imports its room, torch with it
    assert _fresh("import sys, nemo_rl_shim; nemo_rl_shim.setup_distributed; print('torch' in sys.modules)") == "True"


def _command_imports(*args: str) -> tuple[int, str, set[str]]:
    """The console script in a fresh interpreter: its exit code, its output, and every module it imported."""
    script = Path(sys.executable).with_name("nemo-rl-shim")
    assert script.is_file(), f"no console script beside {sys.executable}: `uv sync` installs it"
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = done.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:") and "|" in line}
    return done.returncode, done.stdout, imported


def test_the_hang_report_command_imports_no_torch(tmp_path) -> None:
    directory = build("sub_group_stall", tmp_path / "stall")
    code, out, imported = _command_imports("hang-report", str(directory))
    assert code == EXPECTED["sub_group_stall"][0] and out.startswith(EXPECTED["sub_group_stall"][1]), out
    assert "nemo_rl_shim.hang_report.loader" in imported, sorted(imported)  # the report ran, and was seen
    assert {m for m in imported if m.split(".")[0] in ("torch", "automodel_patch", "nemo_automodel")} == set()
    code, out, imported = _command_imports("hang-report", "--json", str(tmp_path / "missing"))
    assert code == 2 and "torch" not in imported, out
    # the check can fail: torch's analyzer, asked for, imports torch
    code, out, imported = _command_imports("hang-report", "--torch-analyzer", str(directory))
    assert code == 1 and "torch" in imported, out


def test_no_test_folder_stands_in_for_a_package() -> None:
    """The test folders mirror the rooms (``tests/automodel_patch/``, ``tests/setup/``): ``tests/`` itself must never
    be on ``sys.path``, where ``import automodel_patch`` would find the folder of tests."""
    import automodel_patch

    assert str(REPO_ROOT / "tests") not in {str(Path(p).resolve()) for p in sys.path if p}
    assert Path(automodel_patch.__file__).resolve() == REPO_ROOT / "automodel_patch" / "__init__.py"


def test_only_the_nemo_rl_package_imports_omegaconf_or_hydra() -> None:
    users = {module for module, (_, other) in READ.items() if {name for name, _ in other} & {"omegaconf", "hydra"}}
    assert users, "no module imports OmegaConf or Hydra: the recipe reader is not where this test looks"
    assert {user for user in users if not user.startswith("nemo_rl_shim.cli.nemo_rl.")} == set(), users
