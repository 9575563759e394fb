"""A log of the point-to-point ops of Gloo's groups, kept by the shim: torch's Gloo recorder writes none (G-NO-P2P).

torch's Gloo backend records its collectives in the Flight Recorder, but not a send or a receive: they do not go
through ``ProcessGroupGloo::enqueue``, where it records (G-NO-P2P in ``docs/recorder-semantics.md``). A rank waiting on
a receive whose sender never came looks, in its dump, like the sender: both are out of every collective. This log is
the missing record: the dump (``recorder.dump_now``) carries it under ``nemo_rl_shim["p2p"]``.

* **Where it hooks.** Every send and receive of ``torch.distributed`` (``send``, ``recv``, ``isend``, ``irecv``, and
  ``batch_isend_irecv``, which on Gloo is separate ``isend``/``irecv`` calls: Gloo does not coalesce) ends in the
  process group's ``send`` or ``recv`` method, with the peer's rank in the group. :func:`install` wraps those two
  methods of ``torch._C._distributed_c10d.ProcessGroup``: the wrapper calls torch's method and returns its work
  unchanged, then notes the op, where the backend for the tensor's device is Gloo's (``ProcessGroupGloo``); NCCL's
  recorder writes its own p2p records, so nothing is noted there. ``recv_anysource`` has no peer to match: not noted.
* **What it keeps.** Per op: the group's name (as torch's entries name it), ``send`` or ``recv``, the peer's rank
  in the group, the tag, the op's *ordinal* (the k-th op of its kind toward that peer with that tag on that group,
  counted from :func:`install`), and when it was posted. The last :data:`KEEP` ops are kept; the counts are kept for
  every (group, kind, peer, tag), so that the k-th send toward a peer meets the peer's k-th receive of that tag
  (Gloo matches a pair's sends and receives by tag, in order) whatever was dropped.
  Each op's work is held until it is seen completed (checked at every op and at the dump), then let go: an op is
  ``done`` once its work said so.
* **Never fails the caller.** Noting an op catches every error of its own (a warning, once) and the op's result
  is returned as torch made it.

Turned on by ``record_groups`` (the recorder on, a Gloo backend in the world); :func:`uninstall` restores torch's
methods.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["FORMAT", "KEEP", "install", "installed", "snapshot", "uninstall"]

FORMAT = 1
#: Ops kept in the log (their counts are kept for every op).
KEEP = 256


@dataclass
class _Op:
    group: str
    op: str
    peer: int
    tag: int
    ordinal: int
    created_ns: int
    work: Any  # torch's work, until seen completed
    done: bool = False

    def settle(self) -> None:
        """Let the work go once it says it completed."""
        if self.work is not None and self.work.is_completed():
            self.done, self.work = True, None


class _Log:
    lock = threading.Lock()
    originals: ClassVar[dict[str, Any]] = {}
    ops: ClassVar[deque[_Op]] = deque()
    counts: ClassVar[dict[tuple[str, str, int, int], int]] = {}
    dropped = 0
    since_ns = 0
    warned = False


def installed() -> bool:
    return bool(_Log.originals)


def install() -> bool:
    """Wrap ``ProcessGroup.send`` and ``ProcessGroup.recv`` (see the module docstring); a fresh, empty log. Return
    whether they are wrapped (False where torch has no such methods)."""
    from torch._C._distributed_c10d import ProcessGroup

    with _Log.lock:
        _Log.ops, _Log.counts, _Log.dropped, _Log.since_ns = deque(), {}, 0, time.time_ns()
        _Log.warned = False  # a new set-up: its first op the log cannot read warns again
        if _Log.originals:
            return True
        found = {name: getattr(ProcessGroup, name, None) for name in ("send", "recv")}
        if not all(callable(f) for f in found.values()):
            return False
        for name, original in found.items():
            setattr(ProcessGroup, name, _wrapper(name, original))
        _Log.originals = found
        return True


def uninstall() -> None:
    """torch's methods back, the log emptied."""
    from torch._C._distributed_c10d import ProcessGroup

    with _Log.lock:
        for name, original in _Log.originals.items():
            setattr(ProcessGroup, name, original)
        _Log.originals, _Log.ops, _Log.counts, _Log.dropped = {}, deque(), {}, 0


def _wrapper(name: str, original: Any) -> Any:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(self, *args, **kwargs)
        _note(self, name, args, kwargs, work)
        return work

    wrapped.__name__ = wrapped.__qualname__ = name
    wrapped.__doc__ = original.__doc__
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapped


def _note(group: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], work: Any) -> None:
    try:
        tensors = args[0] if args else kwargs.get("tensors")
        peer = operator.index(args[1] if len(args) > 1 else kwargs["dstRank" if op == "send" else "srcRank"])
        tag = operator.index(args[2] if len(args) > 2 else kwargs.get("tag", 0))  # numpy's ints, as torch takes them
        if work is None or not tensors:
            return
        if not _is_gloo(group, tensors[0].device):
            return
        name = group.group_name
        with _Log.lock:
            key = (name, op, peer, tag)
            ordinal = _Log.counts[key] = _Log.counts.get(key, 0) + 1
            _Log.ops.append(_Op(name, op, peer, tag, ordinal, time.time_ns(), work))
            while len(_Log.ops) > KEEP:
                _Log.ops.popleft()
                _Log.dropped += 1
            for kept in _Log.ops:
                kept.settle()
    except Exception as error:  # a help to the report: it must never fail the op it notes
        if not _Log.warned:
            _Log.warned = True
            warnings.warn(f"a point-to-point op was not logged for the hang report: {error}", RuntimeWarning, 3)


def _is_gloo(group: Any, device: Any) -> bool:
    """Whether ``group``'s backend for ``device`` is Gloo's (a group with none for it: not)."""
    try:
        return type(group._get_backend(device)).__name__ == "ProcessGroupGloo"
    except Exception:
        return False


def snapshot() -> dict[str, Any] | None:
    """The log as the dump carries it (None where it is not installed): ``format``, ``since_ns`` (when counting
    began), ``dropped`` (ops older than the kept ones), ``ops`` (oldest first: ``group``, ``op``, ``peer``, ``tag``,
    ``ordinal``, ``created_ns``, ``done``) and ``counts`` (``[group, op, peer, tag, count]`` for every op noted)."""
    if not _Log.originals:
        return None
    with _Log.lock:
        for kept in _Log.ops:
            with contextlib.suppress(Exception):  # a work that cannot say stays not done: no peer is cleared by it
                kept.settle()
        ops = [
            {"group": o.group, "op": o.op, "peer": o.peer, "tag": o.tag, "ordinal": o.ordinal,
             "created_ns": o.created_ns, "done": o.done}
            for o in _Log.ops
        ]  # fmt: skip
        counts = [[g, op, peer, tag, n] for (g, op, peer, tag), n in _Log.counts.items()]
        return {"format": FORMAT, "since_ns": _Log.since_ns, "dropped": _Log.dropped, "ops": ops, "counts": counts}
