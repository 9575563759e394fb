"""The catalogue of #35: one NCCL-format case per kind of hang, at any size (16 ranks in tests, 1,024 and 8,192 in
``benchmarks/hang_kinds.py``).

A world of ``dp x tp`` ranks (tp 8, or 4 below 64 ranks): the default group, the tp groups (``mesh_tp``) and the dp
groups (``mesh_dp``). Every rank first runs ``rounds`` steps of a tp ``all_reduce`` and a dp ``reduce_scatter``
(completed), as ``benchmarks/hang_report_scale.py``'s ranks do; then the fault of the kind, around the culprit
(:func:`culprit`: rank 517 of 1,024 or 8,192) and its tp group. Each rank keeps its newest ``2 x rounds`` entries.
The entries are key for key those of :mod:`tests.harness.nccl_format_dumps` (torch's ``FlightRecorderDetail.hpp``),
each with 24 frames (torch's op, its logger, the worker's ``train`` line that called it, and the 21 frames out to the
start), one dict per distinct frame shared by every entry; the file is pickled as torch pickles it: protocol 2, every
memo slot numbered (``BINPUT``), equal strings written once (Python's pickler also numbers every dict and list, where
torch's numbers only those shared: a few bytes more per entry). Made here from templates, not through ``Rank``, since
8,192 ranks of 2,000 entries must be written in minutes; the ranks a case does not touch are the base's files, linked
(:func:`write_base`, :func:`write_case` with ``base``).

Where the kind needs it, the culprit leaves a stack file and a counters file as the stack watch and its helper write
them (three samples a second apart, ten minutes and five seconds into its block). :data:`EXPECTED` holds, per case,
the kind and variant the report must give and the ranks it must name (:func:`expected_ranks`).
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.flight_recorder.names import HEADER, PROGRESS_FILE_NAME, SAMPLE_MARK, STACK_FILE_NAME
from tests.harness.nccl_format_dumps import TIMEOUT_MS, VERSION, Group

__all__ = ["CASES", "EXPECTED", "Layout", "culprit", "expected_ranks", "touched", "write_base", "write_case"]

_T0 = 1_796_000_000_000_000_000
_STEP_NS = 1_000_000
_TORCH = "/opt/venv/lib/python3.12/site-packages/torch"
_WORKER = "/job/nemo_rl/models/policy/dtensor_policy_worker.py"
#: Where the steps call each op (the worker's train loop), and the file of the culprit's own stack.
_CALLS = {"all_reduce": 640, "reduce_scatter": 652, "metric": 646, "send": 700, "recv": 701, "cycle": 660}
_TORCH_FN = {
    "all_reduce": ("all_reduce", 2868),
    "reduce_scatter": ("reduce_scatter_tensor", 4312),
    "send": ("send", 2201),
    "recv": ("recv", 2250),
}
_LOGGER = {"name": "wrapper", "filename": f"{_TORCH}/distributed/c10d_logger.py", "line": 83}
_FRAMES: dict[tuple[str, int], dict[str, Any]] = {}


def _frame(name: str, filename: str, line: int) -> dict[str, Any]:
    return _FRAMES.setdefault((filename, line), {"name": name, "filename": filename, "line": line})


#: The frames outside the call site, as a step's stack goes on to the start (as benchmarks/hang_report_scale.py's
#: stack files have them: 24 frames in all).
_OUTSIDE = [
    *[(f"/job/nemo_rl/models/layers_{depth}.py", 100 + depth, "forward") for depth in range(16)],
    ("/job/nemo_rl/algorithms/grpo.py", 1210, "grpo_train"),
    ("/job/examples/run_grpo_math.py", 271, "main"),
    ("/job/examples/run_grpo_math.py", 281, "<module>"),
    ("/usr/lib/python3.12/runpy.py", 88, "_run_code"),
    ("/usr/lib/python3.12/runpy.py", 198, "_run_module_as_main"),
]


def _frames(op: str, call: str) -> list[dict[str, Any]]:
    """A fresh list of shared frame dicts, innermost first, as torch keeps each entry's stack: torch's op, its logger,
    the worker's line that called it, and the 21 frames outside it."""
    fn, line = _TORCH_FN[op]
    return [
        _frame(fn, f"{_TORCH}/distributed/distributed_c10d.py", line),
        _LOGGER,
        _frame("train", _WORKER, _CALLS[call]),
        *(_frame(name, file, number) for file, number, name in _OUTSIDE),
    ]


@dataclass(frozen=True)
class Layout:
    """The world: its size, tp, the history's length, and where the culprit is."""

    world: int
    rounds: int

    @property
    def tp(self) -> int:
        return 8 if self.world >= 64 else 4

    @property
    def dp(self) -> int:
        return self.world // self.tp

    def tp_group(self, rank: int) -> Group:
        start = rank // self.tp * self.tp
        return _group(str(1 + rank // self.tp), "mesh_tp", range(start, start + self.tp))

    def dp_group(self, rank: int) -> Group:
        return _group(str(1 + self.dp + rank % self.tp), "mesh_dp", range(rank % self.tp, self.world, self.tp))

    def default(self) -> Group:
        return _group("0", "default_pg", range(self.world))

    def ring(self) -> list[Group]:
        """The circular wait's three tp groups, from the culprit's, and the three groups each joins with the next."""
        first = culprit(self.world) // self.tp
        tps = [self.tp_group(((first + k) % self.dp) * self.tp) for k in range(3)]
        base = 1 + self.dp + self.tp
        return tps + [
            _group(str(base + k), "mesh_cp", sorted({*tps[k].ranks, *tps[(k + 1) % 3].ranks})) for k in range(3)
        ]


_GROUPS: dict[tuple[str, str, tuple[int, ...]], Group] = {}


def _group(name: str, desc: str, ranks: Any) -> Group:
    key = (name, desc, tuple(ranks))
    found = _GROUPS.get(key)
    if found is None:
        found = _GROUPS[key] = Group(name, desc, key[2])
    return found


def culprit(world: int) -> int:
    """The rank at the centre of each case: 517 (of 1,024 or 8,192), or past the middle of a smaller world."""
    return 517 if world > 517 else world // 2 + 1


# --- one rank's entries ---------------------------------------------------------------------------------------------


class _Entries:
    """One rank's entries, built from shared strings and frames (equal strings are one object: written once)."""

    def __init__(self, rank: int, groups: list[Group]) -> None:
        self.rank, self.groups, self.items = rank, groups, []
        self.seq: dict[str, int] = {}
        self.p2p: dict[str, int] = {}
        self.ops: dict[str, int] = {}
        self.counts = [[0, 0] for _ in groups]  # per pg_id: ops enqueued, completed (NCCL counts p2p too)

    def add(self, group: Group, op: str, *, at: int, state: str = "completed", call: str | None = None,
            sizes: int = 1024, out: int | None = None, peer: int | None = None) -> None:  # fmt: skip
        """One op at step ``at`` of the shared timeline: a collective, or ``send``/``recv`` to global ``peer``."""
        self.ops[group.name] = self.ops.get(group.name, 0) + 1
        is_p2p = op in ("send", "recv")
        counter = self.p2p if is_p2p else self.seq
        counter[group.name] = counter.get(group.name, 0) + 1
        name = _NAMES[op] if not is_p2p else _p2p_name(op, group, self.rank, peer)
        created = _T0 + at * _STEP_NS
        done = state == "completed"
        counts = self.counts[self.groups.index(group)]
        counts[0] += 1
        counts[1] += done
        self.items.append({
            "frames": _frames(op, call or op),
            "record_id": len(self.items),
            "pg_id": self.groups.index(group),
            "process_group": _PG[group],
            "thread_name": "pt_main_thread",
            "thread_id": "139872345",
            "collective_seq_id": 0 if is_p2p else counter[group.name],
            "p2p_seq_id": counter[group.name] if is_p2p else 0,
            "op_id": self.ops[group.name],
            "profiling_name": name,
            "time_created_ns": created,
            "input_sizes": [[sizes]],
            "input_dtypes": [_FLOAT],
            "output_sizes": [[out if out is not None else sizes]],
            "output_dtypes": [_FLOAT],
            "state": state,
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": created + _STEP_NS // 2 if done else None,
            "retired": done,
            "timeout_ms": TIMEOUT_MS,
            "is_p2p": is_p2p,
        })  # fmt: skip

    def dump(self, buffer: int) -> dict[str, Any]:
        status = {
            str(pg_id): {
                "last_enqueued_collective": enq,
                "last_started_collective": -1,
                "last_completed_collective": done,
            }
            for pg_id, (enq, done) in enumerate(self.counts)
        }
        return {
            "version": VERSION,
            "pg_config": {g.name: _CONFIG[g] for g in self.groups},
            "comm_lib_version": "2.27.5",
            "pg_status": status,
            "entries": self.items[-buffer:],
        }


_FLOAT = "Float"
_NAMES = {"all_reduce": "nccl:all_reduce", "reduce_scatter": "nccl:reduce_scatter"}


def _p2p_name(op: str, group: Group, rank: int, peer: int | None) -> str:
    arrow = "->" if op == "send" else "<-"
    return f"nccl:{op} {group.group_rank(rank)}{arrow}{group.group_rank(peer if peer is not None else rank)}"


class _Shared(dict):
    """Per group: one object for its ``process_group`` tuple and its ``pg_config`` entry (its ranks' text made once)."""

    def __init__(self, make: Callable[[Group], Any]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, group: Group) -> Any:
        self[group] = self.make(group)
        return self[group]


_PG = _Shared(lambda g: (g.name, g.desc))
_CONFIG = _Shared(lambda g: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))})


def _history(layout: Layout, rank: int, extra: list[Group]) -> _Entries:
    tp, dp = layout.tp_group(rank), layout.dp_group(rank)
    entries = _Entries(rank, [layout.default(), tp, dp, *extra])
    for step in range(layout.rounds):
        entries.add(tp, "all_reduce", at=2 * step)
        entries.add(dp, "reduce_scatter", at=2 * step + 1, sizes=1024 * layout.dp, out=1024)
    return entries


# --- the stack and counters files -----------------------------------------------------------------------------------

_STACK_FRAMES = {
    "load_batch": [("/job/nemo_rl/data/loader.py", 57, "load_batch")],
    "write_shard": [("/job/nemo_rl/utils/checkpoint.py", 88, "write_shard")],
    "write_shard_on": [("/job/nemo_rl/utils/checkpoint.py", 91, "write_shard")],
    "c_call": [("/job/nemo_rl/utils/native.py", 31, "pack_weights")],
}
_OUTER = [(_WORKER, 640, "train"), ("/job/nemo_rl/algorithms/grpo.py", 1210, "grpo_train")]
_MAIN = 0x7F3A2B1C0740
_AFTER_S = 605.0


def _thread(place: str) -> str:
    frames = [*_STACK_FRAMES[place], *_OUTER]
    lines = [f"Thread 0x{_MAIN:016x} (most recent call first):"]
    return "\n".join(lines + [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]) + "\n\n"


def _write_stack(directory: Path, rank: int, what: str, places: list[str], counters: list[dict[str, Any]]) -> None:
    """The culprit's stack file (a sample per place, a second apart) and its counters file (a line per sample)."""
    entered = _T0 - 10**9
    header = {"format": 1, "rank": rank, "pid": 10_000 + rank, "thread": f"0x{_MAIN:016x}", "tid": 10_000 + rank,
              "what": what, "entered_ns": entered, "after_s": _AFTER_S, "samples": 3, "interval_s": 1.0}  # fmt: skip
    text = HEADER + json.dumps(header) + "\n"
    for number, place in enumerate(places):
        at = entered + int((_AFTER_S + number) * 1e9)
        text += "Timeout (0:10:05)!\n" if number == 0 else SAMPLE_MARK + json.dumps({"sample": number, "t_ns": at})
        text += "" if number == 0 else "\n"
        text += _thread(place)
    (directory / STACK_FILE_NAME.format(rank=rank)).write_text(text)
    lines = []
    for number, task in enumerate(counters):
        at = entered + int((_AFTER_S + number) * 1e9)
        line = {"format": 1, "pid": 10_000 + rank, "tid": 10_000 + rank, "entered_ns": entered, "sample": number,
                "t_ns": at, "process": task, "thread": task}  # fmt: skip
        lines.append(json.dumps(line) + "\n")
    if lines:
        (directory / PROGRESS_FILE_NAME.format(rank=rank)).write_text("".join(lines))


def _task(cpu: float, written: int, state: str = "S") -> dict[str, Any]:
    return {"state": state, "cpu_s": cpu, "io": {"rchar": 0, "wchar": written, "read_bytes": 0, "write_bytes": written}}


_ASLEEP = [_task(412.0, 9_000_000)] * 3
_WRITING = [_task(412.0, 9_000_000, "R"), _task(412.9, 180_000_000, "R"), _task(413.8, 360_000_000, "D")]


# --- the cases ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fault:
    """A case: who adds which ops after the history, who leaves no dump, and the culprit's files."""

    add: Callable[[Layout, int, _Entries], None]  # per rank, after the history
    extra: Callable[[Layout, int], list[Group]] = lambda layout, rank: []
    no_dump: Callable[[Layout], set[int]] = lambda layout: set()
    stack: tuple[str, list[str], list[dict[str, Any]]] | None = None


def _peers_enter(layout: Layout, rank: int, entries: _Entries) -> None:
    """The culprit's tp peers enter all_reduce #rounds + 1; the culprit does not."""
    c = culprit(layout.world)
    if rank != c and layout.tp_group(rank) == layout.tp_group(c):
        entries.add(layout.tp_group(rank), "all_reduce", at=2 * layout.rounds, state="scheduled")


def _all_enter(state_of: Callable[[int, int], tuple[str, int, str]]) -> Callable[[Layout, int, _Entries], None]:
    """Every member of the culprit's tp group enters all_reduce #rounds + 1: ``state_of(rank, culprit)`` gives its
    state, its sizes and where it called it."""

    def add(layout: Layout, rank: int, entries: _Entries) -> None:
        c = culprit(layout.world)
        if layout.tp_group(rank) == layout.tp_group(c):
            state, sizes, call = state_of(rank, c)
            entries.add(layout.tp_group(rank), "all_reduce", at=2 * layout.rounds, state=state, sizes=sizes, call=call)

    return add


def _p2p(layout: Layout, rank: int, entries: _Entries) -> None:
    """The culprit's next tp peer waits to receive from the culprit, which never sends."""
    c = culprit(layout.world)
    group = layout.tp_group(c)
    receiver = group.ranks[(group.ranks.index(c) + 1) % len(group.ranks)]
    if rank == receiver:
        entries.add(group, "recv", at=2 * layout.rounds, state="scheduled", peer=c, sizes=4)


def _cycle_extra(layout: Layout, rank: int) -> list[Group]:
    *_, ab, bc, ca = layout.ring()
    return [g for g in (ab, bc, ca) if rank in g.ranks]


def _cycle(layout: Layout, rank: int, entries: _Entries) -> None:
    """Each of the three tp groups waits in the group it shares with the next, which waits in the next one's."""
    ta, tb, tc, ab, bc, ca = layout.ring()
    for tp, joint in ((ta, ab), (tb, bc), (tc, ca)):
        if rank in tp.ranks:
            entries.add(joint, "all_reduce", at=2 * layout.rounds, state="scheduled", call="cycle")


CASES: dict[str, _Fault] = {
    "never_came_python": _Fault(_peers_enter, stack=("train step", ["load_batch"] * 3, _ASLEEP)),
    "still_working": _Fault(
        _peers_enter, stack=("checkpoint save", ["write_shard", "write_shard_on", "write_shard"], _WRITING)
    ),
    "never_came_gil": _Fault(
        _peers_enter, no_dump=lambda layout: {culprit(layout.world)}, stack=("train step", ["c_call"], _ASLEEP)
    ),
    "never_came_dead": _Fault(_peers_enter, no_dump=lambda layout: {culprit(layout.world)}),
    "mismatch": _Fault(_all_enter(lambda r, c: ("scheduled", 2048 if r == c else 1024, "all_reduce"))),
    "skipped_collective": _Fault(
        _all_enter(lambda r, c: ("scheduled", 1024, "all_reduce") if r == c else ("scheduled", 2, "metric"))
    ),
    "p2p_stall": _Fault(_p2p),
    "circular_wait": _Fault(_cycle, extra=_cycle_extra),
    "all_entered_none_finished": _Fault(_all_enter(lambda r, c: ("scheduled", 1024, "all_reduce"))),
    "did_not_finish": _Fault(_all_enter(lambda r, c: ("scheduled" if r == c else "completed", 1024, "all_reduce"))),
}

#: case -> (kind, variant) the report must give.
EXPECTED: dict[str, tuple[str, str | None]] = {
    "never_came_python": ("never_came", "python"),
    "still_working": ("still_working", None),
    "never_came_gil": ("never_came", "gil"),
    "never_came_dead": ("never_came", "dead"),
    "mismatch": ("mismatch", "sizes"),
    "skipped_collective": ("skipped_collective", None),
    "p2p_stall": ("p2p_stall", None),
    "circular_wait": ("circular_wait", None),
    "all_entered_none_finished": ("all_entered_none_finished", None),
    "did_not_finish": ("did_not_finish", None),
}


def expected_ranks(case: str, layout: Layout) -> tuple[int, ...]:
    """The ranks the report must name for ``case``: the culprit; a whole tp group; or the cycle's three."""
    c = culprit(layout.world)
    if case == "all_entered_none_finished":
        return tuple(layout.tp_group(c).ranks)
    if case == "circular_wait":
        return tuple(sorted(r for g in layout.ring()[:3] for r in g.ranks))
    return (c,)


def _write(directory: Path, layout: Layout, rank: int, fault: _Fault | None) -> None:
    entries = _history(layout, rank, fault.extra(layout, rank) if fault else [])
    if fault is not None:
        fault.add(layout, rank, entries)
    data = pickle.dumps(entries.dump(2 * layout.rounds), protocol=2)
    (directory / f"nccl_trace_rank_{rank}").write_bytes(data)


def write_base(directory: Path, layout: Layout, ranks: range | None = None) -> None:
    """Every rank's history alone (of ``ranks``, all by default): what the cases share."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank in ranks if ranks is not None else range(layout.world):
        _write(directory, layout, rank, None)


def touched(case: str, layout: Layout) -> set[int]:
    """The ranks whose dump ``case`` changes (or removes): every other rank's is the base's."""
    fault = CASES[case]
    found = set(fault.no_dump(layout))
    for rank in range(layout.world):
        extra = fault.extra(layout, rank)
        probe = _Entries(rank, [layout.default(), layout.tp_group(rank), layout.dp_group(rank), *extra])
        fault.add(layout, rank, probe)
        if probe.items or extra:
            found.add(rank)
    return found


def write_case(
    case: str, directory: Path, layout: Layout, ranks: range | None = None, base: Path | None = None
) -> None:
    """Write ``case``'s dumps (of ``ranks``, all by default: a pool of writers splits them) and files; with ``base``
    (:func:`write_base`'s folder), the ranks the case does not touch are linked to the base's files."""
    fault = CASES[case]
    directory.mkdir(parents=True, exist_ok=True)
    missing = fault.no_dump(layout)
    changed = touched(case, layout) if base is not None else None
    for rank in ranks if ranks is not None else range(layout.world):
        if rank in missing:
            continue
        if changed is not None and rank not in changed:
            os.link(base / f"nccl_trace_rank_{rank}", directory / f"nccl_trace_rank_{rank}")
            continue
        _write(directory, layout, rank, fault)
    c = culprit(layout.world)
    if fault.stack is not None and (ranks is None or c in ranks):
        what, places, counters = fault.stack
        _write_stack(directory, c, what, places, counters)
