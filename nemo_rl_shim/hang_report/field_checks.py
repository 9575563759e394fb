"""Every field of every entry of a dump, checked against what torch writes: what a healthy verdict requires.

The reading for the analysis (:mod:`.dump_format`) checks only the fields it reads, so that a report of a stall
costs little more than unpickling. A healthy verdict (exit 0) says more: that nothing in the dumps is amiss. So
before it is given, every dump is read again and :func:`check_dump` looks at all of it:

* **Keys.** Every entry of one recorder holds the same keys (``duration_ms``, which NCCL writes only for an op it
  timed, aside), among them torch's core keys (``process_group``, ``profiling_name``, ``state``, the sequence
  number, the times, the sizes; and, where the format has ``is_p2p``, the rest of what torch 2.4 and later write,
  and beside the entries ``version``, ``pg_config``, ``pg_status`` and ``comm_lib_version``).
* **Types and ranges.** Each known key holds the type torch writes, exactly (its pickler writes lists as lists, the
  group as a tuple): counts in int64's range, text that UTF-8 can
  write (no lone surrogate), shapes of ints, a state among ``scheduled``/``started``/``completed``, frames of
  ``(name, filename, line)``; ``pg_config`` and ``pg_status`` likewise. Keys torch may add later are left alone.
* **Consistency.** ``state`` is ``completed`` exactly where a completion time is, and ``started`` only with a start
  time; no entry is there twice (``record_id`` distinct per recorder: a pickle's shared reference repeats one).

Anything else is a :class:`DumpError` naming the file, the entry and the key (exit 2). Every walk is charged to the
dump's :class:`~.bounds.Budget`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.bounds import MAX_INT64, Budget, is_count
from nemo_rl_shim.hang_report.dump_format import MAX_NAME, load_dump
from nemo_rl_shim.hang_report.group_members import groups_from_map
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.one_line.printable import shown, shown_path

__all__ = ["CORE_KEYS", "MODERN_KEYS", "OPTIONAL_KEYS", "TOP_KEYS", "check_dump", "confirm"]

#: Every entry of every format holds these (and ``collective_seq_id``, or ``seq_id`` before torch 2.4).
CORE_KEYS = frozenset(
    {"process_group", "profiling_name", "state", "time_created_ns", "input_sizes", "output_sizes", "record_id"}
)
#: Where an entry holds ``is_p2p`` (torch 2.4 and later), it holds these too.
MODERN_KEYS = CORE_KEYS | {
    "pg_id",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "input_dtypes",
    "output_dtypes",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "is_p2p",
}
#: Where entries hold ``is_p2p``, the dump holds these beside them.
TOP_KEYS = ("version", "pg_config", "pg_status", "comm_lib_version")
#: Keys an entry may hold or not, whatever the others hold.
OPTIONAL_KEYS = frozenset({"duration_ms"})
_STATES = ("scheduled", "started", "completed")


def _text(value: Any) -> bool:
    if type(value) is not str:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _optional_count(value: Any) -> bool:
    return value is None or is_count(value)


def _shapes(budget: Budget) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if type(value) is not list:
            return False
        budget.spend(len(value), "sizes")
        for shape in value:
            if type(shape) is not list:
                return False
            budget.spend(len(shape), "sizes")
            if not all(type(d) is int and 0 <= d <= MAX_INT64 for d in shape):
                return False
        return True

    return check


def _texts(budget: Budget) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if type(value) is not list:
            return False
        budget.spend(len(value), "dtypes")
        return all(_text(v) for v in value)

    return check


def _process_group(value: Any) -> bool:
    return type(value) is tuple and len(value) == 2 and all(_text(v) for v in value)


def _duration(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _checks(budget: Budget) -> dict[str, tuple[Callable[[Any], bool], str]]:
    """Each known key's check, and what it expects (for the message)."""
    count, text = (is_count, "an int from 0 to 2**63 - 1"), (_text, "text")
    return {
        "record_id": count,
        "pg_id": (lambda v: is_count(v) or _text(v), "an id"),
        "process_group": (_process_group, "(name, description), both text"),
        "thread_name": text,
        "thread_id": text,
        "collective_seq_id": count,
        "seq_id": count,
        "p2p_seq_id": count,
        "op_id": count,
        "profiling_name": (lambda v: _text(v) and len(v) <= MAX_NAME, "an op's name"),
        "time_created_ns": count,
        "input_sizes": (_shapes(budget), "a list of shapes"),
        "output_sizes": (_shapes(budget), "a list of shapes"),
        "input_dtypes": (_texts(budget), "a list of dtype names"),
        "output_dtypes": (_texts(budget), "a list of dtype names"),
        "state": (lambda v: v in _STATES and type(v) is str, f"one of {', '.join(_STATES)}"),
        "time_discovered_started_ns": (_optional_count, "a time in ns, or None"),
        "time_discovered_completed_ns": (_optional_count, "a time in ns, or None"),
        "retired": (lambda v: type(v) is bool, "a bool"),
        "timeout_ms": count,
        "is_p2p": (lambda v: type(v) is bool, "a bool"),
        "duration_ms": (_duration, "a finite duration"),
    }


def _frames(value: Any, seen: set[int], budget: Budget) -> str | None:
    if type(value) is not list:
        return f"'frames' is {shown(value)}, not a list of frames"
    budget.spend(len(value), "'frames'")
    for item in value:
        if id(item) in seen:
            continue
        seen.add(id(item))
        ok = type(item) is dict and _text(item.get("name")) and _text(item.get("filename"))
        if not ok or not (item.get("line") is None or is_count(item["line"])):
            return f"'frames' holds {shown(item)}, not a frame (name, filename, line)"
    return None


def _entry_keys(keys: frozenset[str], path: Path) -> frozenset[str]:
    """The keys every entry of a recorder must hold (those most of them hold), which must include the core keys of
    its format."""
    required = MODERN_KEYS if "is_p2p" in keys else CORE_KEYS | {"seq_id" if "seq_id" in keys else "collective_seq_id"}
    if not required <= keys:
        lacks = ", ".join(repr(k) for k in sorted(required - keys))
        raise DumpError(f"{shown_path(path)}: its entries lack {lacks}, which torch writes in every entry")
    return keys


def _recorder_of(entry: Any) -> str:
    name = entry.get("profiling_name") if type(entry) is dict else None
    return name.partition(":")[0] if type(name) is str else ""


def _check_entries(entries: list[Any], path: Path, budget: Budget) -> None:
    """Every entry (see the module docstring): per recorder (the part of ``profiling_name`` before ``:``), the keys
    most of its entries hold, and ``record_id`` s distinct."""
    checks = _checks(budget)
    seen: set[int] = set()
    budget.spend(len(entries), "the entries")
    libs = [_recorder_of(entry) for entry in entries]
    own = [frozenset(entry) - OPTIONAL_KEYS if type(entry) is dict else frozenset() for entry in entries]
    common: dict[str, Counter[frozenset[str]]] = {}
    for lib, keys in zip(libs, own, strict=True):
        common.setdefault(lib, Counter())[keys] += 1
    keys_of = {lib: _entry_keys(counts.most_common(1)[0][0], path) for lib, counts in common.items()}
    records: dict[str, set[int]] = {}
    for index, entry in enumerate(entries):
        budget.spend(len(own[index]), "the entries")
        problem = _entry_problem(entry, keys_of[libs[index]], checks, seen, budget)
        if problem is None:
            ids = records.setdefault(libs[index], set())
            if entry["record_id"] in ids:
                problem = f"'record_id' is {entry['record_id']}, which an earlier entry of its recorder has"
            ids.add(entry["record_id"])
        if problem:
            raise DumpError(f"{shown_path(path)}: entry {index} {problem}")


def _entry_problem(
    entry: Any,
    keys: frozenset[str],
    checks: Mapping[str, tuple[Callable[[Any], bool], str]],
    seen: set[int],
    budget: Budget,
) -> str | None:
    if type(entry) is not dict:
        return f"is {shown(entry)}, not a dict"
    own = frozenset(entry) - OPTIONAL_KEYS
    if own != keys:
        lacks, extra = sorted(keys - own), sorted(own - keys, key=repr)
        return f"lacks {', '.join(map(repr, lacks))}" if lacks else f"holds {shown(extra[0])}, which the others do not"
    for key, value in entry.items():
        check = checks.get(key)
        if check is not None and not check[0](value):
            return f"{key!r} is {shown(value)}, not {check[1]}"
    if "frames" in entry and (problem := _frames(entry["frames"], seen, budget)):
        return problem
    completed, started = entry.get("time_discovered_completed_ns"), entry.get("time_discovered_started_ns")
    state = entry["state"]
    if "time_discovered_completed_ns" in entry and (state == "completed") != (completed is not None):
        return f"'state' is {state!r} where 'time_discovered_completed_ns' is {shown(completed)}"
    if state == "started" and "time_discovered_started_ns" in entry and started is None:
        return "'state' is 'started' where 'time_discovered_started_ns' is None"
    return None


def _check_top(raw: Mapping[str, Any], path: Path, budget: Budget) -> None:
    where = shown_path(path)
    modern = any(type(e) is dict and "is_p2p" in e for e in raw["entries"][:1])
    lacks = [key for key in TOP_KEYS if key not in raw] if modern else []
    if lacks:
        raise DumpError(f"{where}: lacks {', '.join(map(repr, lacks))}, which torch writes beside entries with is_p2p")
    for key in ("version", "comm_lib_version"):
        if key in raw and not _text(raw[key]):
            raise DumpError(f"{where}: {key!r} is {shown(raw[key])}, not text")
    for key in ("pg_config", "pg_status"):
        if key in raw and type(raw[key]) is not dict:
            raise DumpError(f"{where}: {key!r} is {shown(raw[key])}, not a dict")
    for name, facts in (raw.get("pg_config") or {}).items():
        budget.spend(1 + (len(facts) if type(facts) is dict else 0), "pg_config")
        ok = _text(name) and type(facts) is dict and all(_text(facts.get(k)) for k in ("name", "desc", "ranks"))
        ok = ok and facts["name"] == name  # torch keys each group's config by its name
        if not ok:
            key = shown(name, typed=False)
            raise DumpError(f"{where}: pg_config[{key}] is {shown(facts)}, not (name, desc, ranks) as text")
    for key, status in (raw.get("pg_status") or {}).items():
        budget.spend(1 + (len(status) if type(status) is dict else 0), "pg_status")
        ok = _text(key) and type(status) is dict
        if not ok or not all(_counter(k, v) for k, v in status.items()):
            raise DumpError(f"{where}: pg_status[{shown(key, typed=False)}] is {shown(status)}, not a group's counters")
    shim = raw.get("nemo_rl_shim")
    if shim:
        groups_from_map(shim.get("groups") or {}, f"{where}: nemo_rl_shim.groups", budget)


def _counter(key: Any, value: Any) -> bool:
    """A ``pg_status`` field: a counter from -1 (none yet), or a work's name."""
    return _text(key) and (_text(value) or (type(value) is int and -1 <= value <= MAX_INT64))


def check_dump(path: Path, root: Path | None = None) -> None:
    """Read ``path`` and check every field (see the module docstring); :class:`DumpError` naming the file, the entry
    and the key."""
    raw, size = load_dump(path, root)
    budget = Budget.for_bytes(path, size)
    _check_top(raw, path, budget)
    _check_entries(raw["entries"], path, budget)


def confirm(job: Any, keep: list[Any]) -> None:
    """:func:`check_dump` for a reader process (:func:`~.loader.run_readers`): ``job`` a :class:`~.loader.Job`."""
    del keep
    check_dump(job.path, job.root)
