"""Imports run one way: ``automodel_patch`` below the library below the command line, with no cycle.

Read from the sources (every ``import`` statement, at module level, in functions and under
``TYPE_CHECKING`` alike), so a lazy import cannot hide an arrow running back up:

* ``automodel_patch`` imports nothing of ``nemo_rl_shim``;
* the library (``nemo_rl_shim`` outside ``cli/`` and ``__main__``) never imports ``nemo_rl_shim.cli``;
* ``nemo_rl_shim.config`` knows nothing of ``torch.distributed``;
* the library's modules sit on the floors of :data:`LIBRARY_LAYERS`, and each imports only from floors below its own
  (a new module gets a floor here, or this test names it);
* no module imports, directly or through others, a module that imports it back.

And in a fresh interpreter, ``import nemo_rl_shim`` imports neither nemo-automodel, nor the command line, nor
OmegaConf or Hydra (only the command's NeMo RL package, ``nemo_rl_shim.cli.nemo_rl``, uses them).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

PACKAGES = ("automodel_patch", "nemo_rl_shim")


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


def _imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            # "from package import submodule" depends on the submodule; "from module import name" on the module.
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return {target for name in found if (target := _resolve(name)) and target != module}


GRAPH = {module: _imports(module) for module in MODULES}


#: The library's floors, lowest first: a module imports only from floors below its own.
LIBRARY_LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(f"nemo_rl_shim.{name}" for name in floor.split())
    for floor in (
        "integers error_line groups process_group stack_watchdog",  # no import of the shim; the stack watch
        "config rank_ranges",  # the knob's values; a list of ranks as a person reads it
        "every_group flight_recorder learning",  # every group torch holds and the value later ones get; the recorder;
        # the learned timeouts' rule and state (no torch)
        "learner",  # the learned timeouts: times steps and phases, agrees across ranks
        "timeouts mesh_timeouts audit",  # the phases; the mesh's timeouts, read back; every group audited
        "decision support",  # what happens to the timeout on this Automodel; which pairs run
        "distributed_setup",  # setup_distributed
        "",  # nemo_rl_shim/__init__.py: the package's names
    )
)
_FLOOR = {module: level for level, floor in enumerate(LIBRARY_LAYERS) for module in floor}
_FLOOR["nemo_rl_shim"] = len(LIBRARY_LAYERS) - 1


def _is_cli(module: str) -> bool:
    return module == "nemo_rl_shim.__main__" or module.startswith("nemo_rl_shim.cli")


def test_the_graph_is_read_from_every_module() -> None:
    assert {"automodel_patch._apply", "nemo_rl_shim.distributed_setup", "nemo_rl_shim.cli.preflight.run"} <= set(GRAPH)
    assert "nemo_rl_shim.groups" in GRAPH["nemo_rl_shim.timeouts"]  # a real edge is seen


def test_automodel_patch_knows_nothing_of_the_shim() -> None:
    upward = {
        m: sorted(t for t in GRAPH[m] if t.startswith("nemo_rl_shim")) for m in GRAPH if m.startswith("automodel_patch")
    }
    assert {m: t for m, t in upward.items() if t} == {}


def test_the_library_never_imports_the_command_line() -> None:
    library = [m for m in GRAPH if m.startswith("nemo_rl_shim") and not _is_cli(m)]
    assert len(library) >= 8, library
    upward = {m: sorted(t for t in GRAPH[m] if _is_cli(t)) for m in library}
    assert {m: t for m, t in upward.items() if t} == {}


def test_every_library_module_has_a_floor() -> None:
    library = {m for m in GRAPH if m.startswith("nemo_rl_shim") and not _is_cli(m)}
    assert library - set(_FLOOR) == set(), "give each new library module a floor in LIBRARY_LAYERS"
    assert set(_FLOOR) - set(GRAPH) == set(), "LIBRARY_LAYERS names a module that does not exist"


def test_the_library_imports_only_downwards() -> None:
    upward = {
        (module, target)
        for module, floor in _FLOOR.items()
        for target in GRAPH[module]
        if target in _FLOOR and _FLOOR[target] >= floor
    }
    assert upward == set(), f"imports on or above the importer's floor (LIBRARY_LAYERS): {sorted(upward)}"
    assert "nemo_rl_shim.every_group" in GRAPH["nemo_rl_shim.timeouts"]  # the phases stand on every_group


def test_config_knows_nothing_of_torch_distributed() -> None:
    tree = ast.parse(MODULES["nemo_rl_shim.config"].read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in ("torch", "automodel_patch")}, imported


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


def test_importing_the_library_loads_neither_automodel_nor_the_command_line() -> None:
    code = (
        "import sys, nemo_rl_shim; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('nemo_automodel', 'omegaconf', 'hydra') or m.startswith('nemo_rl_shim.cli')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_only_the_nemo_rl_package_imports_omegaconf_or_hydra() -> None:
    users = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level}
        if {name.split(".")[0] for name in names} & {"omegaconf", "hydra"}:
            users.add(module)
    assert users, "no module imports OmegaConf or Hydra: the recipe reader is not where this test looks"
    assert {user for user in users if not user.startswith("nemo_rl_shim.cli.nemo_rl.")} == set(), users
