"""What one dump says of the run it belongs to (:class:`~.records.RunEvidence`), gathered as the dump is reduced.

A folder fed by torch's default prefix (``/tmp/nccl_trace_rank_``, shared by every job on a node) and by restarts
holds dumps of several runs; :mod:`.run_split` tells them apart from what each dump says here:

* **Versions.** ``version`` (the dump format) and ``comm_lib_version`` (the NCCL version
  ``record_accelerator_version`` stored), both written beside the entries by ``FlightRecorder::dump_dict``
  (``FlightRecorderDetail.hpp``, 2.4 to 2.15): one job runs one torch and one NCCL.
* **The world and the groups.** The default group's size (``pg_config``'s ``default_pg``, or the shim's
  ``world_size``); each group's members as its record lists them (``record_pg_ranks``, from the process group's
  own ``global_ranks_in_group``).
* **Times.** ``time_created_ns`` and the ``time_discovered_*`` times are ``c10::getTime()``, the wall clock
  (``CLOCK_REALTIME`` on Linux: ``c10/util/ApproximateClock.h``) of the rank's host. The oldest creation among
  the first entries (buffer order is record order: ``dump_entries`` starts at the ring's oldest), and the newest
  time among the last entries: a time an entry holds, or the shim's own ``dump_time_ns`` (torch writes no dump time
  of its own: ``dump_dict`` holds none); and, as late as the dump may have been written, an unfinished entry's
  creation plus its timeout (torch's watchdog dumps at a timeout: ``ProcessGroupNCCL``'s watchdog and heartbeat
  monitor; not evidence of a record, since a coalesced collective's ops and Gloo's entries are never completed).
* **Collective marks per group** (:class:`~.records.GroupMarks`): the number and creation time of its first record,
  where the recorder's buffer never wrapped (its first entry's ``record_id`` is 0: the group's first record is the
  first the rank made of it); the number and completion time of its newest *completed*
  collective whose every member's input goes into every member's output (all-reduce, all-gather, reduce-scatter,
  all-to-all, barrier; with at least one element: NCCL returns at once for an empty one). Such a collective cannot
  complete on one rank before every member has entered it (a broadcast, a gather, a send may: NCCL sends small
  messages eagerly), and every member records a collective when it enters it (``ProcessGroupNCCL::collective``,
  ``FlightRecorderHook::onPre``).

Each walk is bounded: the first and last :data:`EDGE_ENTRIES` entries, and a look back of :data:`LOOK_BACK` entries
per group for a completed collective. Every value read is checked (an int in int64's range, text); one that is not
is no evidence, never an error here (the reading names malformed entries).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nemo_rl_shim.hang_report.bounds import is_count
from nemo_rl_shim.hang_report.group_members import group_name
from nemo_rl_shim.hang_report.records import GroupFacts, GroupKey, GroupMarks, Recorder, RunEvidence
from nemo_rl_shim.one_line.printable import clean

__all__ = ["EDGE_ENTRIES", "LOOK_BACK", "every_input_op", "gather"]

#: Entries read at each end of the buffer for its time range.
EDGE_ENTRIES = 8
#: Per group, entries looked back through for its newest completed collective of :func:`every_input_op`.
LOOK_BACK = 64
#: A recorder a dump does not account for: taken as wrapped (no first record is claimed of it).
_WRAPPED = Recorder(wrapped=True, oldest_ns=None, tracks_completion=False)
#: Ops whose every member's input goes into every member's output (by the start of torch's name for them).
_EVERY_INPUT = ("all_reduce", "allreduce", "all_gather", "allgather", "_allgather", "_all_gather", "reduce_scatter",
                "_reduce_scatter", "all_to_all", "alltoall", "barrier")  # fmt: skip


def _op(raw: Mapping[str, Any]) -> tuple[str, str]:
    """``(recorder, op)`` of an entry's profiling name (checked text, or ``("", "")``)."""
    name = raw.get("profiling_name")
    if type(name) is not str:
        return "", ""
    lib, _, rest = name.partition(":")
    return (lib, rest.partition(" ")[0]) if rest else ("", lib.partition(" ")[0])


def every_input_op(op: str) -> bool:
    """Whether ``op`` (``"all_reduce"``, ``"_allgather_base"``...) is one whose every member's input goes into every
    member's output (see the module docstring)."""
    return op.startswith(_EVERY_INPUT)


def _has_elements(sizes: Any) -> bool:
    """At least one input with an element (a shape with no zero dimension; a scalar's ``[]`` has one)."""
    if type(sizes) is not list and type(sizes) is not tuple:
        return False
    return any((type(s) is list or type(s) is tuple) and all(d != 0 for d in s) for s in sizes)


def _time(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if is_count(value) else None


def _times(entries: Sequence[Any], dump_time: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """In one pass over the buffer's first and last :data:`EDGE_ENTRIES` entries: its oldest creation; its newest
    time (an entry's, or the dump's); as late as it may have been dumped (an unfinished entry's creation plus its
    timeout, too); and the longest timeout among its newest entries."""
    firsts = [_time(e, "time_created_ns") for e in entries[:EDGE_ENTRIES] if type(e) is dict]
    start = min((t for t in firsts if t is not None), default=None)
    end = until = dump_time if is_count(dump_time) else None
    longest = None
    for raw in entries[-EDGE_ENTRIES:]:
        if type(raw) is not dict:
            continue
        created, timeout = _time(raw, "time_created_ns"), _time(raw, "timeout_ms")
        for t in (created, _time(raw, "time_discovered_started_ns"), _time(raw, "time_discovered_completed_ns")):
            if t is not None and (end is None or t > end):
                end = t
        if timeout is not None and (longest is None or timeout > longest):
            longest = timeout
        if raw.get("state") != "completed" and created is not None and timeout is not None:
            waits = created + timeout * 1_000_000
            until = waits if until is None or waits > until else until
    until = end if until is None or (end is not None and end > until) else until
    return start, end, until, longest


def _completed(raw: Mapping[str, Any], seq_key: str) -> tuple[int, int] | None:
    """``(number, completion time)`` of a completed collective of :func:`every_input_op` with elements, else None."""
    if raw.get("state") != "completed" or raw.get("is_p2p") is True or not every_input_op(_op(raw)[1]):
        return None
    seq, done = raw.get(seq_key), _time(raw, "time_discovered_completed_ns")
    if not is_count(seq) or not seq or done is None or not _has_elements(raw.get("input_sizes")):
        return None
    return seq, done


def _done_marks(entries: Sequence[Any], keys: set[GroupKey], seq_key: str) -> dict[GroupKey, tuple[int, int]]:
    """Per group, its newest completed collective of :func:`every_input_op` within the look back."""
    found: dict[GroupKey, tuple[int, int]] = {}
    stop = max(0, len(entries) - LOOK_BACK * max(1, len(keys)))
    for index in range(len(entries) - 1, stop - 1, -1):
        if len(found) == len(keys):
            break
        raw = entries[index]
        pg = raw.get("process_group") if type(raw) is dict else None
        if (type(pg) is not tuple and type(pg) is not list) or not pg or type(pg[0]) is not str:
            continue
        key = (group_name(pg[0]), clean(_op(raw)[0], limit=40))
        if key in keys and key not in found and (mark := _completed(raw, seq_key)) is not None:
            found[key] = mark
    return found


def gather(
    raw: Mapping[str, Any],
    seq_key: str,
    groups: Mapping[str, GroupFacts],
    firsts: Mapping[GroupKey, int],
    recorders: Mapping[str, Recorder],
    world: int | None,
) -> RunEvidence:
    """What the dump ``raw`` says of its run (see the module docstring). ``firsts``: per group (and recorder) the
    index of its first collective in the buffer; ``groups``: its members as the dump's records list them (a group no
    record lists gives no marks); ``world``: the world it states."""
    entries = raw["entries"]
    shim = raw.get("nemo_rl_shim") or {}
    start, end, until, longest = _times(entries, shim.get("dump_time_ns"))
    done = _done_marks(entries, set(firsts), seq_key)
    marks: dict[tuple[str, str, Sequence[int]], GroupMarks] = {}
    for key, index in firsts.items():
        facts = groups.get(key[0])
        if facts is None or not facts.stated:
            continue
        first_raw, first = entries[index], None
        if not recorders.get(key[1], _WRAPPED).wrapped and is_count(first_raw.get(seq_key)):
            created = _time(first_raw, "time_created_ns")
            first = (first_raw[seq_key], created) if created is not None else None
        marks[(key[0], key[1], facts.ranks)] = GroupMarks(facts.ranks, first, done.get(key))
    version, comm = raw.get("version"), raw.get("comm_lib_version")
    return RunEvidence(
        version=clean(version, limit=40) if isinstance(version, str) else "",
        comm_lib=clean(comm, limit=40) if isinstance(comm, str) else "",
        world=world,
        start_ns=start,
        end_ns=end,
        until_ns=until,
        groups=marks,
        only_active=not any(type(e) is dict and e.get("state") == "completed" for e in entries),
        timeout_ms=longest,
    )
