"""The Ray scenarios' process tree (:mod:`tests.ray_harness.scenarios`), seen from outside its network namespace.

The tree runs as ``unshare --net -- python -m tests.ray_harness.scenarios TEMP_DIR OUT_JSON``, in its own
session, its output in ``TEMP_DIR/log``. Every process of its Ray head lives in that private network
namespace and in no other, so the clean-up ends them by it: Ray's agents and client server start
their own sessions and carry nothing of the head's temp dir on their command lines, so neither the
process group nor the command line finds them all.

Started before the suite's workers: ``ray start --head`` gives its raylet a fixed 30 s to register
with the GCS (``ray/_private/node.py``). Started at the suite's start-up peak (six workers importing
torch on 2 cores), it missed that in CI on both of its tries (``Failed to get node info: Deadline
Exceeded``, exit 1 after 78 s). So when a run selects ``tests/cli/preflight/test_ray_preflight.py`` with neither
``-k`` nor ``-m`` (the README's test command), ``tests/conftest.py`` starts the tree in the pytest
process before the xdist workers exist, and waits until its head is up (6 s on an idle
machine) or has failed. The tree's drivers then run beside the suite, and the test's fixture
:func:`collect` s what they saw. Any other selection starts the tree from the fixture, on demand.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.harness.paths import REPO_ROOT

__all__ = [
    "CLEANUP_S",
    "HEAD_DONE",
    "HEAD_WAIT_S",
    "OUT",
    "SCENARIOS_TIMEOUT_S",
    "Started",
    "Tree",
    "collect",
    "end",
    "namespace_wrapper",
    "publish",
    "start",
    "started_early",
    "wait_for_head",
]

#: The whole tree's bound, from its start: the head (two tries at most), the stalled run beside the other two,
#: the refused one, and their clean-up. About 6 min in a run of the suite; the bound is for the worst case.
SCENARIOS_TIMEOUT_S = 1200
#: How long the pytest process waits for the head before it starts the workers anyway (two tries of
#: ``tests.ray_harness.scenarios``'s head bound, and the namespace's set-up).
HEAD_WAIT_S = 2 * 240 + 30
#: How long the clean-up keeps killing what is left in the head's network namespace.
CLEANUP_S = 30.0
#: Where an early start tells the workers about the tree (they inherit the pytest process's environment).
_ENV = "NEMO_RL_SHIM_TEST_RAY_TREE"
#: Written by tests.ray_harness.scenarios once ``ray start --head`` has ended, up or not.
HEAD_DONE = "head-done"
OUT = "scenarios.json"


@dataclass(frozen=True)
class Tree:
    """A started tree: its first process, its temp dir, its network namespace (None if never seen), its start."""

    pid: int
    temp_dir: str
    namespace: str | None
    started_at: float  # time.time(): compared across processes

    def path(self, name: str) -> Path:
        return Path(self.temp_dir, name)


@dataclass
class Started:
    """The starting process's hold on a tree: the process to reap, and the descriptor that pins its namespace."""

    tree: Tree
    process: subprocess.Popen
    pin: int | None

    def release(self) -> None:
        """Kill what is left of the tree, reap its first process, unpin the namespace, remove the temp dir.
        Safe to call twice, and after :func:`collect`."""
        end(self.tree)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=CLEANUP_S)
        if self.pin is not None:
            os.close(self.pin)
            self.pin = None
        shutil.rmtree(self.tree.temp_dir, ignore_errors=True)


def namespace_wrapper() -> tuple[list[str] | None, str]:
    """``(["unshare", "--net", "--"], "")``, or ``(None, why a private network namespace cannot be made here)``."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        return None, (f"the Ray tests run in a private network namespace and need unshare and ip: unshare={unshare}, "
                      f"ip={shutil.which('ip')}")  # fmt: skip
    probe = subprocess.run([unshare, "--net", "--", "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return None, (f"cannot make a private network namespace (unshare --net: {probe.stderr.strip()}): the Ray "
                      "tests keep Ray on loopback only")  # fmt: skip
    return [unshare, "--net", "--"], ""


def _network_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie (which holds no namespace)
        return None


def _pinned_namespace(process: subprocess.Popen) -> tuple[str | None, int | None]:
    """The private network namespace ``unshare --net`` made for ``process``, and a descriptor that holds it.

    While the descriptor is open the namespace cannot be freed, so its name cannot pass to a
    namespace made later (say, by another Ray test on the same machine) while the clean-up
    still goes by it. ``(None, None)`` if ``process`` never entered one within 30 s.
    """
    ours = _network_namespace(os.getpid())
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        try:
            pin = os.open(f"/proc/{process.pid}/ns/net", os.O_RDONLY)
        except OSError:
            pin = None
        if pin is not None:
            name = os.readlink(f"/proc/self/fd/{pin}")  # the namespace the descriptor holds: "net:[inode]"
            if name != ours:
                return name, pin
            os.close(pin)
        time.sleep(0.01)
    return None, None


def start(wrapper: list[str]) -> Started:
    """Start the tree in a private network namespace, in its own session, its output in ``TEMP_DIR/log``."""
    temp_dir = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's socket paths live under it
    started_at = time.time()
    with open(Path(temp_dir, "log"), "w") as log:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "tests.ray_harness.scenarios", temp_dir, str(Path(temp_dir, OUT))],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    namespace, pin = _pinned_namespace(process)
    return Started(Tree(process.pid, temp_dir, namespace, started_at), process, pin)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, not a zombie. (The starting process reaps it only in :meth:`Started.release`,
    so its pid is not reused before.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_head(tree: Tree, timeout_s: float = HEAD_WAIT_S) -> bool:
    """Whether the tree's head was up, or had failed, within ``timeout_s`` (the test reports which, from the
    tree's result; ``ray start``'s own wall time is in it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tree.path(HEAD_DONE).exists() or not _running(tree.pid):
            return True
        time.sleep(0.1)
    return False


def started_early() -> Tree | None:
    """The tree that the pytest process started before the workers, if it did (:mod:`tests.conftest`)."""
    text = os.environ.get(_ENV)
    return Tree(**json.loads(text)) if text else None


def publish(tree: Tree) -> None:
    """Tell this process and the workers it starts later about ``tree``."""
    os.environ[_ENV] = json.dumps(asdict(tree))


def _processes_in(namespace: str) -> dict[int, str]:
    """``{pid: command line}`` of every live process in the network namespace ``namespace``."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _network_namespace(int(entry.name)) == namespace:
            try:
                found[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def end(tree: Tree) -> dict[int, str]:
    """Kill the tree's session, then every process in its network namespace until none is left (bounded).

    Returns the namespace's processes it found, counted before the first kill: Ray's GCS, raylet and dashboard
    share the tree's process group, and die with it. Without a namespace, the command line is all there is to go by.
    """
    found = _processes_in(tree.namespace) if tree.namespace else {}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(tree.pid, signal.SIGKILL)
    if tree.namespace is None:
        subprocess.run(["pkill", "-KILL", "-f", tree.temp_dir], capture_output=True, timeout=30, check=False)
        return {}
    deadline = time.monotonic() + CLEANUP_S
    while (alive := _processes_in(tree.namespace)) and time.monotonic() < deadline:
        found.update(alive)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return found


def collect(tree: Tree) -> dict[str, Any]:
    """What the tree saw (its ``OUT_JSON``), once it ends or at :data:`SCENARIOS_TIMEOUT_S` from its start; then
    end every process of its head, and add ``clean_up``: what was ended, and what is still left (should be none).
    """
    deadline = tree.started_at + SCENARIOS_TIMEOUT_S
    while _running(tree.pid) and time.time() < deadline:
        time.sleep(0.2)
    timed_out = _running(tree.pid)
    ended = end(tree)
    left = _processes_in(tree.namespace) if tree.namespace else None
    log = tree.path("log").read_text(errors="replace")[-4000:] if tree.path("log").exists() else ""
    if timed_out:
        facts: dict[str, Any] = {"error": f"the Ray scenarios did not finish within {SCENARIOS_TIMEOUT_S} s:\n{log}"}
    elif tree.path(OUT).exists():
        facts = json.loads(tree.path(OUT).read_text())
    else:
        facts = {"error": f"no result; output:\n{log}"}
    facts["clean_up"] = {
        "namespace": tree.namespace,
        "ended": sorted(ended.values()),
        "left": sorted(left.values()) if left is not None else None,
    }
    shutil.rmtree(tree.temp_dir, ignore_errors=True)
    return facts
