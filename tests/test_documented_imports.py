"""The import paths the README and docs/ document, and every name the package offered before its rooms (#34).

* Every ``from nemo_rl_shim... import ...`` line of a code block in README.md and docs/*.md runs, together, in a
  fresh interpreter.
* Every dotted ``nemo_rl_shim.<...>`` they name in backticks is a module or one of its names.
* ``nemo_rl_shim``, ``nemo_rl_shim.config``, ``nemo_rl_shim.timeouts``, ``nemo_rl_shim.flight_recorder`` and
  ``nemo_rl_shim.audit`` still offer every name they offered as flat modules (their ``__all__`` then).
* The lazy exports (PEP 562) agree with themselves: ``__all__``, the ``TYPE_CHECKING`` imports type checkers read,
  and what ``__getattr__`` hands out (the owner module's own object) name the same names.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys

import pytest

from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
_IMPORT_LINE = re.compile(r"^\s*(from nemo_rl_shim[\w.]* import [\w, ]+|import nemo_rl_shim[\w.]*)\s*(?:#.*)?$", re.M)
_DOTTED = re.compile(r"`~?(nemo_rl_shim(?:\.\w+)+)")

#: What each path offered before the rooms: its ``__all__`` in the flat modules (commit 8f6e3f4).
OFFERED = {
    "nemo_rl_shim": (
        "Action AutomodelConfig Decision DistributedContext RuntimeConfig UnsupportedVersions WorkaroundState "
        "automodel_cfg backend_for check_layout decide distributed_timeout_minutes "
        "distributed_timeout_minutes_after_init init_process_group patch_automodel setup_distributed"
    ),
    "nemo_rl_shim.config": (
        "AUTOMODEL_CFG_KEYS FLIGHT_RECORDER_DEFAULTS LEARNED_TIMEOUTS_DEFAULTS MIN_TIMEOUT ROLES AutomodelConfig "
        "FlightRecorderSettings LearnedTimeoutsSettings Role automodel_cfg distributed_timeout_minutes "
        "distributed_timeout_minutes_after_init flight_recorder learned_timeouts minutes_timedelta patch_automodel"
    ),
    "nemo_rl_shim.timeouts": (
        "TIMEOUT_API after_first_step current_timeouts extended_timeout learned_timeouts restore_torch_defaults "
        "run_groups set_group_timeout set_timeouts"
    ),
    "nemo_rl_shim.flight_recorder": (
        "DUMP_FILE_NAME ENV_PAIRS PEER_DUMP_WAIT_S PG_STATUS_KEY SIDECAR_NAME STACK_GRACE_S TORCH_DEFAULT_PREFIX "
        "configure dump_now dump_on_timeout dump_path group_map is_enabled record_groups request_peer_dumps stack_watch"
    ),
    "nemo_rl_shim.audit": "BackendTimeout GroupAudit GroupsAudit TimeoutSource audit_groups log_groups",
}
LAZY = ("nemo_rl_shim", "nemo_rl_shim.timeouts", "nemo_rl_shim.flight_recorder")
#: Named like a path, but a key of the ``nemo_rl_shim`` dict a dump carries (docs/flight-recorder.md).
DUMP_KEYS = frozenset({"nemo_rl_shim.groups", "nemo_rl_shim.recorders"})


def _documented_imports() -> list[str]:
    return sorted({m[1] for doc in DOCS for m in _IMPORT_LINE.finditer(doc.read_text(encoding="utf-8"))})


def test_every_documented_import_line_runs_in_a_fresh_interpreter() -> None:
    lines = _documented_imports()
    assert "from nemo_rl_shim import RuntimeConfig, setup_distributed" in lines, lines
    assert len(lines) >= 6, lines
    code = "\n".join([*lines, "print('imported')"])
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "imported"), done.stderr[-2000:]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_dotted_path_the_docs_name_exists() -> None:
    named = sorted({m[1] for doc in DOCS for m in _DOTTED.finditer(doc.read_text(encoding="utf-8"))})
    assert "nemo_rl_shim.timeouts" in named, named
    assert [path for path in named if path not in DUMP_KEYS and not _resolves(path)] == []


@pytest.mark.parametrize("path", sorted(OFFERED))
def test_every_name_offered_before_the_rooms_is_still_offered(path: str) -> None:
    module = importlib.import_module(path)
    offered = set(OFFERED[path].split())
    assert offered - set(module.__all__) == set()
    assert [name for name in sorted(offered) if not hasattr(module, name)] == []


def _type_checking_names(path: str) -> set[str]:
    tree = ast.parse((REPO_ROOT / path.replace(".", "/") / "__init__.py").read_text(encoding="utf-8"))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    return {a.asname or a.name for b in blocks for n in b.body if isinstance(n, ast.ImportFrom) for a in n.names}


@pytest.mark.parametrize("path", LAZY)
def test_the_lazy_exports_agree_with_their_type_checking_imports(path: str) -> None:
    package = importlib.import_module(path)
    assert sorted(package.__all__) == sorted(_type_checking_names(path))
    assert set(package.__all__) <= set(dir(package))
    for name in package.__all__:
        value = getattr(package, name)
        owner = importlib.import_module(getattr(value, "__module__", None) or path)
        assert getattr(owner, name, value) is value, (path, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        package.no_such_name  # noqa: B018
