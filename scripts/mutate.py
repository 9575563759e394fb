"""Mutation testing of a package folder: which small, plausible bugs its tests would miss.

Usage (from the repository root; outside CI: a module's run takes minutes to an hour on two cores)::

    uv run --frozen --no-sync python scripts/mutate.py nemo_rl_shim/hang_report --modules cycles,kinds
    uv run --frozen --no-sync python scripts/mutate.py nemo_rl_shim/config --sample 20 --seed 1
    uv run --frozen --no-sync python scripts/mutate.py --summary /tmp/mutants/*.json

Each target is a folder (or one ``.py`` file) under the repository root; its modules are mutated one mutant at a
time. The mutants come from the module's syntax tree, not from a hand list of lines, so the list follows the code
as it is edited (``--list`` prints it):

* ``compare``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``;
* ``boolean``: ``and`` <-> ``or``, and each operand of an ``and``/``or`` dropped; ``not x`` -> ``x``;
* ``condition``: an ``if``/``elif``/conditional expression's test -> ``True`` and -> ``False``; a comprehension's
  ``if`` dropped;
* ``call``: ``any`` <-> ``all``, ``min`` <-> ``max``; ``max(0, x)`` (a clamp to a constant) -> ``x``;
* ``number``: a number compared with -> itself +1 and -1; a module constant (``NAME = 0.10``) -> twice and half
  (ints: +1 and -1);
* ``arithmetic``: ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/`` (and in ``+=``, ``-=``);
* ``constant``: ``True`` <-> ``False``; ``flow``: ``break`` <-> ``continue``.

Not mutated: docstrings, f-strings (a message's wording is not a rule), annotations, decorators, ``__all__`` and
``if TYPE_CHECKING``.

Each mutant is applied to a temporary copy of the repository (the working tree is never written), and the module's
test files run there with ``pytest -x`` under a time bound: a failure, an error or the time bound kills it; a pass
is a survivor. A module's test files are those under ``tests/`` that import it by its dotted name (``--tests``
names others); a file slower than ``--max-file-seconds`` on the unmutated code is left out, and said. Survivors of
those files can be run again against wider ones (``--then tests/hang_report``).

Mutants that change no behaviour are listed in ``--equivalents`` (default: ``scripts/mutate_equivalents.txt``), one
per line as ``<key>  # <why>``, the key as the run prints it (``<folder>/<file>::<function>::<before> -> <after>``:
the target's last folder, so that it holds after the package moves). They are counted apart, never as killed.

Dependency-free: the standard library, and pytest in the environment that runs the tests.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Mutant", "main", "mutants_of"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EQUIVALENTS = Path(__file__).resolve().parent / "mutate_equivalents.txt"
_COMPARE = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
_ARITHMETIC = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}
_CALLS = {"any": "all", "all": "any", "min": "max", "max": "min"}
_CONSTANT_NAME = re.compile(r"_?[A-Z][A-Z0-9_]*")
_SKIPPED_TREES = (ast.JoinedStr,)


@dataclass(frozen=True)
class Mutant:
    """One mutation of one module: where, what, and the bytes that replace the span."""

    path: str  # relative to the root
    key: str  # <target folder>/<file>::<function>::<before> -> <after>[ #n]
    line: int
    operator: str
    before: str
    after: str
    start: int  # byte offsets of the replaced span in the file
    end: int
    replacement: str

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


@dataclass
class Outcome:
    """A mutant's fate: ``killed`` (a test failed or errored), ``timeout``, ``survived`` or ``equivalent``."""

    mutant: Mutant
    status: str
    seconds: float
    detail: str = ""
    killed_by: list[str] = field(default_factory=list)


def _offsets(source: bytes) -> list[int]:
    starts, at = [0], 0
    for line in source.split(b"\n"):
        at += len(line) + 1
        starts.append(at)
    return starts


def _unparse(node: ast.AST) -> str:
    return ast.unparse(node).replace("\n", " ")


class _Finder:
    """Walks a module's tree in a fixed order and yields (node to replace, its new node or text, operator)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.scope: list[str] = []
        self.found: list[tuple[list[str], ast.AST, ast.AST | str, str]] = []

    def run(self) -> list[tuple[list[str], ast.AST, ast.AST | str, str]]:
        body = self.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            if self._module_constant(stmt):
                continue
            self._visit(stmt)
        return self.found

    def _add(self, node: ast.AST, new: ast.AST | str, operator: str) -> None:
        self.found.append((list(self.scope), node, new, operator))

    def _module_constant(self, stmt: ast.stmt) -> bool:
        """``NAME = <number>`` at module level: its value twice and half (ints: +1, -1); ``__all__`` skipped."""
        targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if "__all__" in names:
            return True
        value = getattr(stmt, "value", None)
        if not names or not all(_CONSTANT_NAME.fullmatch(n) for n in names) or not _is_number(value):
            return False
        self._numbers(value)
        return True

    def _numbers(self, node: ast.Constant) -> None:
        value = node.value
        options = [value * 2, value / 2] if isinstance(value, float) else [value + 1, value - 1]
        for option in options:
            self._add(node, ast.Constant(option), "number")

    def _visit(self, node: ast.AST) -> None:
        if isinstance(node, _SKIPPED_TREES):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.append(node.name)
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            for child in [*_defaults(node), *body]:
                self._visit(child)
            self.scope.pop()
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            return
        self._mutations(node)
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self._visit(child)

    def _mutations(self, node: ast.AST) -> None:
        if isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    new = copy.deepcopy(node)
                    new.ops[index] = _COMPARE[type(op)]()
                    self._add(node, new, "compare")
            for index, side in enumerate([node.left, *node.comparators]):
                if _is_number(side):  # the comparison with the number moved by one, either way
                    for option in (side.value + 1, side.value - 1):
                        new = copy.deepcopy(node)
                        if index == 0:
                            new.left = ast.Constant(option)
                        else:
                            new.comparators[index - 1] = ast.Constant(option)
                        self._add(node, new, "number")
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self._add(node, ast.BoolOp(other, copy.deepcopy(node.values)), "boolean")
            for index in range(len(node.values)):
                rest = [copy.deepcopy(v) for i, v in enumerate(node.values) if i != index]
                self._add(node, rest[0] if len(rest) == 1 else ast.BoolOp(copy.deepcopy(node.op), rest), "boolean")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._add(node, copy.deepcopy(node.operand), "boolean")
        elif isinstance(node, (ast.If, ast.IfExp)) and not _is_constant(node.test):
            self._add(node.test, "True", "condition")
            self._add(node.test, "False", "condition")
        elif isinstance(node, ast.comprehension):
            for test in node.ifs:
                self._add(test, "True", "condition")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            self._add(node.func, _CALLS[node.func.id], "call")
            numbers = [a for a in node.args if _is_number(a)]
            if node.func.id in ("min", "max") and len(node.args) == 2 and len(numbers) == 1 and not node.keywords:
                rest = next(a for a in node.args if not _is_number(a))
                self._add(node, copy.deepcopy(rest), "call")
        elif (isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC) or (
            isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub)
        ):
            new = copy.deepcopy(node)
            new.op = _ARITHMETIC[type(node.op)]()
            self._add(node, new, "arithmetic")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            self._add(node, str(not node.value), "constant")
        elif isinstance(node, ast.Break):
            self._add(node, "continue", "flow")
        elif isinstance(node, ast.Continue):
            self._add(node, "break", "flow")


def _defaults(node: ast.AST) -> list[ast.AST]:
    args = getattr(node, "args", None)
    if not isinstance(args, ast.arguments):
        return []
    return [d for d in [*args.defaults, *args.kw_defaults] if d is not None]


def _is_number(node: object) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _is_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant)


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def mutants_of(path: Path, root: Path, label: str) -> list[Mutant]:
    """Every mutant of the module at ``path`` (relative paths and keys from ``root``; ``label``: the target's last
    folder), each one checked to compile."""
    source = path.read_bytes()
    tree = ast.parse(source)
    starts = _offsets(source)
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    relative = path.relative_to(root).as_posix()
    name = f"{label}/{path.name}" if label else path.name
    for scope, node, new, operator in _Finder(tree).run():
        start = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        before = _unparse(node)
        if isinstance(new, str):
            after = replacement = new
        else:
            after = _unparse(new)
            replacement = after if isinstance(node, ast.stmt) else f"({after})"
        base = f"{name}::{'.'.join(scope) or '<module>'}::{before} -> {after}"
        seen[base] = seen.get(base, 0) + 1
        key = base if seen[base] == 1 else f"{base} #{seen[base]}"
        mutant = Mutant(relative, key, node.lineno, operator, before, after, start, end, replacement)
        try:
            compile(mutant.apply(source), relative, "exec")
        except SyntaxError:
            continue
        found.append(mutant)
    return found


# --- running --------------------------------------------------------------------------------------------------------


def _copy_tree(root: Path, into: Path) -> None:
    """The files git tracks, and those it does not ignore (else every file but caches, virtual environments and git's
    own)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (root / name).is_file():
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, into / name)
        return
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "*.pyc")
    shutil.copytree(root, into, ignore=ignore, dirs_exist_ok=True)


_SERVER = r"""
import json, os, signal, sys, time
for name in sys.argv[1].split(","):
    try:
        __import__(name)
    except Exception:
        pass
running = []


def stop(*_):
    for child in running:
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(1)


signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        code = 3
        try:
            import pytest
            code = int(pytest.main(job["args"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    running[:] = [pid]
    deadline, rc = started + job["timeout"], None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    print(json.dumps({"rc": rc, "seconds": time.monotonic() - started}), flush=True)
"""
#: What the fork server imports once, before any file of the tree (each run forks from it: pytest and its plugins
#: are not imported again for every mutant). Names that are not installed are skipped.
PRELOAD = "pytest,xdist,xdist.plugin,hypothesis,_hypothesis_pytestplugin,yaml,omegaconf,numpy"


class _Pytest:
    """Runs pytest in the copied tree: each run forked from a server that imported pytest once (``fork``), or a
    fresh interpreter each time. Returns ``passed``, ``failed`` or ``timeout``, the seconds, and the failing test's
    node id (else the output's last lines)."""

    def __init__(self, tree: Path, fork: bool) -> None:
        self.tree = tree
        path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.env = {**os.environ, "PYTHONPATH": path}
        self.args = ["-x", "-q", "-p", "no:cacheprovider", "--no-header", "-rfE"] + (
            ["-n", "0"] if _has("xdist") else []
        )
        self.fork = fork and hasattr(os, "fork")
        self.server: subprocess.Popen[str] | None = None
        self.out = tree / ".mutate-output.txt"

    def _start(self) -> subprocess.Popen[str]:
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen(
                [sys.executable, "-c", _SERVER, PRELOAD], cwd=self.tree, env=self.env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            assert self.server.stdout is not None
            if self.server.stdout.readline().strip() != "ready":
                raise SystemExit("the fork server did not start")
        return self.server

    def check_origin(self, module: Path) -> None:
        """The module the tests import is the copy's (not the working tree's, through an editable install)."""
        parts = list(module.relative_to(self.tree).with_suffix("").parts)
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = subprocess.run(
            [sys.executable, "-c", f"import {dotted} as m; print(m.__file__)"], cwd=self.tree, env=self.env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if Path(found.stdout.strip()).resolve() != module.resolve():
            raise SystemExit(
                f"{dotted} imports from {found.stdout.strip() or found.stderr[-300:]}, not the copy {module}"
            )

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()  # it ends the run in flight, with every process the tests started
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(timeout=30)

    def __call__(self, files: Sequence[str], timeout: float) -> tuple[str, float, str]:
        rc, seconds = self._forked(files, timeout) if self.fork else self._fresh(files, timeout)
        if rc is None:
            return "timeout", seconds, ""
        if rc == 0:
            return "passed", seconds, ""
        text = self.out.read_text(errors="replace") if self.out.exists() else ""
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)
        return "failed", seconds, " ".join(failed) or " | ".join(text.strip().splitlines()[-3:])

    def _fresh(self, files: Sequence[str], timeout: float) -> tuple[int | None, float]:
        started = time.monotonic()
        with self.out.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "pytest", *self.args, *files], cwd=self.tree, env=self.env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                return process.wait(timeout=timeout), time.monotonic() - started
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait(timeout=30)
                return None, time.monotonic() - started

    def _forked(self, files: Sequence[str], timeout: float) -> tuple[int | None, float]:
        server = self._start()
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps({"args": [*self.args, *files], "timeout": timeout, "out": str(self.out)}) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        if not answer:
            raise SystemExit("the fork server ended")
        found = json.loads(answer)
        return found["rc"], found["seconds"]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _drop_bytecode(path: Path) -> None:
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


def _dotted(root: Path, module_path: Path) -> tuple[str, str, set[str]]:
    """The module's dotted name, its package's, and the names it exports (``__all__``, and its own name)."""
    parts = list(module_path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    names = {parts[-1]}
    for stmt in ast.parse(module_path.read_bytes()).body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            names |= {e.value for e in getattr(stmt.value, "elts", []) if isinstance(e, ast.Constant)}
    return ".".join(parts), ".".join(parts[:-1]), names


def _tests_of(root: Path, module_path: Path, tests_dir: str) -> list[str]:
    """The test files that import the module: by its dotted name (``import a.b.mod``, ``from a.b.mod import x``,
    ``from a.b import mod``, or the name in a string), or a name it exports from its package (``from a.b import x``,
    ``x`` in its ``__all__``)."""
    dotted, package, names = _dotted(root, module_path)
    by_name = re.compile(rf"\b{re.escape(dotted)}\b(?!\.\w)")
    found = []
    for test in sorted((root / tests_dir).rglob("test_*.py")):
        text = test.read_text(errors="replace")
        if by_name.search(text):
            found.append(test.relative_to(root).as_posix())
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == package and {a.name for a in node.names} & names:
                found.append(test.relative_to(root).as_posix())
                break
    return found


def _load_equivalents(path: Path | None) -> dict[str, str]:
    if path is None or not path.is_file():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, why = line.partition("  # ")
            found[key.strip()] = why.strip()
    return found


@dataclass
class _Module:
    path: Path
    mutants: list[Mutant]
    tests: list[str]
    slow: dict[str, float] = field(default_factory=dict)


def _modules(args: argparse.Namespace, root: Path) -> list[_Module]:
    found = []
    for target in args.targets:
        folder = (root / target).resolve()
        files = [folder] if folder.is_file() else sorted(folder.rglob("*.py"))
        label = (folder.parent if folder.is_file() else folder).name
        for path in files:
            if args.modules and path.stem not in args.modules:
                continue
            tests = list(args.tests) if args.tests else _tests_of(root, path, args.tests_dir)
            found.append(_Module(path, mutants_of(path, root, label), tests))
    return found


def _baseline(module: _Module, pytest: _Pytest, args: argparse.Namespace, log) -> dict[str, float]:
    """Times each test file on the unmutated code and leaves out the slow ones; the kept files, fastest first (a
    mutant is run against one file at a time, and the first that fails kills it), each with its time bound."""
    times = {}
    for test in module.tests:
        status, seconds, detail = pytest([test], args.max_file_seconds * 4)
        if status != "passed":
            raise SystemExit(f"{test} does not pass on the unmutated code ({status}): {detail}")
        if seconds > args.max_file_seconds:
            module.slow[test] = round(seconds, 1)
            log(f"  left out {test}: {seconds:.1f} s unmutated (--max-file-seconds {args.max_file_seconds})")
        else:
            times[test] = seconds
    module.tests = sorted(times, key=times.__getitem__)
    return {test: args.timeout or max(20.0, 3 * times[test] + 10) for test in module.tests}


def _try(pytest: _Pytest, bounds: dict[str, float], then: Sequence[str] | None) -> tuple[str, float, str, list[str]]:
    """The mutant against each test file in turn until one fails (or runs out of time); survivors against ``then``."""
    total = 0.0
    for test, bound in bounds.items():
        status, seconds, detail = pytest([test], bound)
        total += seconds
        if status != "passed":
            return status, total, detail, [test]
    if then:
        status, seconds, detail = pytest(then, 20 * max(bounds.values(), default=20.0))
        return status, total + seconds, detail, list(then) if status != "passed" else []
    return "passed", total, "", []


def _run_module(
    module: _Module, pytest: _Pytest, args: argparse.Namespace, equivalents: dict[str, str], log
) -> list[Outcome]:
    target = pytest.tree / module.path.relative_to(args.root)
    original = target.read_bytes()
    mutants = module.mutants
    if args.sample:
        mutants = sorted(
            random.Random(args.seed).sample(mutants, min(args.sample, len(mutants))), key=lambda m: m.start
        )
    outcomes = []
    if not module.tests and mutants:
        log(f"  no test file imports {module.path.name}: every mutant survives")
    bounds = _baseline(module, pytest, args, log) if module.tests and mutants else {}
    if mutants and module.tests:
        pytest.check_origin(target)
    for number, mutant in enumerate(mutants, 1):
        if mutant.key in equivalents:
            outcomes.append(Outcome(mutant, "equivalent", 0.0, equivalents[mutant.key]))
            continue
        if not module.tests:
            outcomes.append(Outcome(mutant, "survived", 0.0, "no test file"))
            continue
        try:
            target.write_bytes(mutant.apply(original))
            _drop_bytecode(target)
            status, seconds, detail, killed_by = _try(pytest, bounds, args.then)
        finally:
            target.write_bytes(original)
            _drop_bytecode(target)
        fate = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[status]
        outcomes.append(Outcome(mutant, fate, seconds, detail, killed_by))
        if fate == "survived" or args.verbose:
            log(f"  [{number}/{len(mutants)}] {fate}: {mutant.path}:{mutant.line} {mutant.before} -> {mutant.after}")
        elif number % 25 == 0:
            log(f"  [{number}/{len(mutants)}] so far: {sum(o.status == 'survived' for o in outcomes)} survived")
    return outcomes


def _table(outcomes: Sequence[Outcome]) -> str:
    by_module: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_module.setdefault(outcome.mutant.path, []).append(outcome)
    rows = [f"{'module':<48} {'mutants':>7} {'killed':>7} {'timeout':>7} {'survived':>8} {'equiv.':>6} {'killed %':>8}"]
    totals = [0, 0, 0, 0, 0]
    for path, found in sorted(by_module.items()):
        counts = [len(found)] + [
            sum(o.status == s for o in found) for s in ("killed", "timeout", "survived", "equivalent")
        ]
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        rows.append(_row(path, counts))
    if len(by_module) > 1:
        rows.append(_row("all", totals))
    survivors = [o for o in outcomes if o.status == "survived"]
    if survivors:
        rows.append("\nsurvivors:")
        rows += [f"  {o.mutant.path}:{o.mutant.line}  {o.mutant.key}" for o in survivors]
    return "\n".join(rows)


def _row(name: str, counts: list[int]) -> str:
    total, killed, timeout, survived, equivalent = counts
    judged = total - equivalent
    share = f"{100 * (killed + timeout) / judged:.1f}" if judged else "-"
    return f"{name:<48} {total:>7} {killed:>7} {timeout:>7} {survived:>8} {equivalent:>6} {share:>8}"


def _commit(root: Path) -> str:
    """The root's commit, ``+dirty`` where its files differ from it (as copied)."""

    def git(*command: str) -> str:
        found = subprocess.run(["git", *command], cwd=root, capture_output=True, text=True, check=False, timeout=60)
        return found.stdout.strip() if found.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    return f"{commit}+dirty" if commit and git("status", "--porcelain", "--untracked-files=no") else commit or "?"


def _save(path: Path, outcomes: Sequence[Outcome], modules: Sequence[_Module], commit: str, started: str) -> None:
    data = {
        "commit": commit,
        "date": started,
        "tests": {m.path.name: m.tests for m in modules},
        "left_out_slow": {m.path.name: m.slow for m in modules if m.slow},
        "outcomes": [{**asdict(o), "mutant": asdict(o.mutant)} for o in outcomes],
    }
    path.write_text(json.dumps(data, indent=1))


def _load(paths: Sequence[Path]) -> list[Outcome]:
    found = []
    for path in paths:
        for raw in json.loads(path.read_text())["outcomes"]:
            found.append(Outcome(**{**raw, "mutant": Mutant(**raw["mutant"])}))
    return found


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="folders or .py files under the root to mutate")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository copied for each run (default: this one)"
    )
    parser.add_argument("--modules", type=lambda s: set(s.split(",")), help="only these module names (comma-separated)")
    parser.add_argument("--tests", nargs="+", help="test files to run for every module (default: those that import it)")
    parser.add_argument("--tests-dir", default="tests", help="where to look for the test files that import a module")
    parser.add_argument("--then", nargs="+", help="test paths run again for each survivor (a wider net)")
    parser.add_argument("--max-file-seconds", type=float, default=30.0, help="leave out test files slower than this")
    parser.add_argument(
        "--timeout", type=float, help="seconds per mutant (default: 3x the unmutated run, 20 s at least)"
    )
    parser.add_argument("--sample", type=int, help="run only N mutants per module, drawn with --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--equivalents", type=Path, default=DEFAULT_EQUIVALENTS, help="mutants that change nothing")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--list", action="store_true", help="print the mutants and their test files; run nothing")
    parser.add_argument("--summary", nargs="+", type=Path, help="print the table of earlier --json files; run nothing")
    parser.add_argument(
        "--no-fork", action="store_true", help="a fresh interpreter per run (slower), not a fork server"
    )
    parser.add_argument("--verbose", action="store_true", help="print every mutant's fate, not only survivors")
    args = parser.parse_args(argv)
    args.root = args.root.resolve()
    if not args.targets and not args.summary:
        parser.error("give a target folder (or --summary FILES)")
    return args


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # the copy is removed and the fork server stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    signal.signal(signal.SIGTERM, _stop)

    def log(text: str) -> None:
        print(text, flush=True)

    if args.summary:
        log(_table(_load(args.summary)))
        return 0
    modules = _modules(args, args.root)
    if args.list:
        for module in modules:
            log(f"{module.path.relative_to(args.root)}: {len(module.mutants)} mutants; tests: {' '.join(module.tests)}")
            for mutant in module.mutants:
                log(f"  {mutant.line:>4} {mutant.operator:<10} {mutant.key}")
        return 0
    equivalents = _load_equivalents(args.equivalents)
    outcomes: list[Outcome] = []
    commit, started = _commit(args.root), time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="mutate-") as scratch:
        tree = Path(scratch)
        _copy_tree(args.root, tree)
        pytest = _Pytest(tree, fork=not args.no_fork)
        try:
            for module in modules:
                where = module.path.relative_to(args.root)
                log(f"{where}: {len(module.mutants)} mutants, tests: {' '.join(module.tests)}")
                outcomes += _run_module(module, pytest, args, equivalents, log)
        finally:
            pytest.close()
    if args.json:
        _save(args.json, outcomes, modules, commit, started)
    log(_table(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
