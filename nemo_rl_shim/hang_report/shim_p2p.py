"""The shim's log of Gloo's sends and receives, read: the point-to-point record torch's Gloo recorder does not write.

torch's Gloo recorder writes no send or receive (``G-NO-P2P``, ``docs/recorder-semantics.md``), so on Gloo a rank
waiting on a receive looks like the rank that never sent. Where the shim's recorder ran, its dump carries its own
log of them under ``nemo_rl_shim["p2p"]`` (written by :mod:`nemo_rl_shim.flight_recorder.p2p_log`; its rules are
the table "the shim's p2p log" there):

* ``S-P2P-OPS``: the last ops, oldest first, each ``group`` (the name torch's entries use), ``op`` (``send`` or
  ``recv``), ``peer`` (its rank in the group), ``tag``, ``ordinal`` (the k-th op of its kind toward that peer with
  that tag on that group, counted from set-up), ``created_ns`` and ``done`` (its work said it completed by the dump).
* ``S-P2P-COUNT``: ``counts``, ``[group, op, peer, tag, count]``, for every op since set-up, dropped ones included.
* ``S-P2P-MATCH``: between two ranks whose dumps both carry the log, a peer posted its side of an unfinished op
  exactly when its count of the opposite kind toward the op's rank reaches the op's ordinal (Gloo matches a pair's
  sends and receives of one tag in order; the log counts them all). Where the peer's dump carries no log (a dump
  torch wrote, an older shim), nothing says whether it posted: "cannot tell", never that it did not.
* ``S-P2P-TAG``: only tag 0's ops and counts are read (``batch_isend_irecv``'s and ``send``/``recv``'s default);
  an op of another tag is left out, and the report reads it as it would without the log.

:func:`read_log` checks the log as untrusted input (every field's type and range, the ordinals within their counts,
the items charged to the dump's :class:`~.bounds.Budget`) and gives its ops as the dump's p2p entries (recorder
``gloo``, as torch would name them): the unfinished ones, the newest per (group, kind, peer), and the counts.
:func:`posted` is ``S-P2P-MATCH``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.hang_report.bounds import MAX_WORLD, Budget, is_count, is_text
from nemo_rl_shim.hang_report.group_members import group_name
from nemo_rl_shim.hang_report.records import DumpError, Entry, P2PKey, RankDump
from nemo_rl_shim.one_line.printable import shown, shown_path

__all__ = ["FORMAT", "LIB", "MAX_OPS", "LoggedP2P", "posted", "read_log"]

FORMAT = 1
#: The recorder the log stands in for: its entries are keyed as Gloo's would be.
LIB = "gloo"
#: The most ops and counts a log may hold (the writer keeps 256 ops).
MAX_OPS = 1 << 16
_KINDS = ("send", "recv")
_OPPOSITE = {"send": "recv", "recv": "send"}
_MAX_NAME = 1024


@dataclass
class LoggedP2P:
    """A dump's logged ops as p2p entries: the unfinished ones, the newest and the count per (group, kind, peer)."""

    pending: list[Entry]
    newest: dict[P2PKey, Entry]
    count: dict[P2PKey, int]


def _bad(path: Path, field: str, value: Any, expected: str) -> DumpError:
    return DumpError(f"{shown_path(path)}: nemo_rl_shim.p2p{field} is {shown(value)}, {expected}")


_OP = "not {group, op ('send' or 'recv'), peer, tag, ordinal from 1, created_ns, done}"


def _peer(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_WORLD


def _name(value: Any) -> bool:
    return is_text(value) and len(value) <= _MAX_NAME


def read_log(shim: Mapping[str, Any], path: Path, budget: Budget) -> LoggedP2P | None:
    """The log in ``shim`` (a dump's ``nemo_rl_shim``), checked; None where the dump carries none. :class:`DumpError`
    naming the file and the field where it is malformed."""
    log = shim.get("p2p")
    if log is None:
        return None
    if type(log) is not dict or log.get("format") != FORMAT:
        raise _bad(path, "", log, f"not the shim's p2p log (format {FORMAT})")
    ops, counts = log.get("ops"), log.get("counts")
    if type(ops) is not list or len(ops) > MAX_OPS:
        raise _bad(path, ".ops", ops, f"not a list of at most {MAX_OPS:,} ops")
    if type(counts) is not list or len(counts) > MAX_OPS:
        raise _bad(path, ".counts", counts, f"not a list of at most {MAX_OPS:,} counts")
    budget.spend(len(ops) + len(counts), "nemo_rl_shim.p2p")
    found = LoggedP2P([], {}, {})
    tagged: dict[P2PKey, int] = {}  # S-P2P-TAG: the counts of tag 0, the only ones read
    for index, item in enumerate(counts):
        ok = type(item) is list and len(item) == 5 and _name(item[0]) and item[1] in _KINDS and _peer(item[2])
        if not (ok and is_count(item[3]) and is_count(item[4]) and item[4] > 0):
            raise _bad(path, f".counts[{index}]", item, "not [group, op ('send' or 'recv'), peer, tag, count from 1]")
        key = ((group_name(item[0]), LIB), item[1], item[2])
        if item[3] == 0:
            found.count[key] = item[4]
        else:
            tagged[key] = max(tagged.get(key, 0), item[4])
    for index, item in enumerate(ops):
        entry, tag = _entry(item), item.get("tag") if type(item) is dict else None
        if entry is None or not is_count(tag):
            raise _bad(path, f".ops[{index}]", item, _OP)
        key = (entry.key, entry.op, entry.peer)
        if not 1 <= entry.ordinal <= (found.count if tag == 0 else tagged).get(key, 0):
            raise _bad(path, f".ops[{index}].ordinal", entry.ordinal, "past its count in nemo_rl_shim.p2p.counts")
        if tag != 0:
            continue  # S-P2P-TAG: not read (its counts are per tag): the report reads it as before the log
        newest = found.newest.get(key)
        if newest is None or entry.ordinal > newest.ordinal:
            found.newest[key] = entry
        if not entry.done:
            found.pending.append(entry)
    return found


def _entry(item: Any) -> Entry | None:
    """One logged op as a p2p entry (its number: its ordinal), or None where a field is out of its type or range."""
    if type(item) is not dict:
        return None
    group, op, peer, ordinal = item.get("group"), item.get("op"), item.get("peer"), item.get("ordinal")
    created, done = item.get("created_ns"), item.get("done")
    if not (_name(group) and op in _KINDS and _peer(peer) and is_count(ordinal) and ordinal >= 1):
        return None
    if not (is_count(created) and type(done) is bool):
        return None
    return Entry(
        group=group_name(group),
        seq=ordinal,
        op=op,
        sizes="",
        state="completed" if done else "scheduled",
        created_ns=created,
        completed_ns=None,
        timeout_ms=None,
        pg_id="",
        is_p2p=True,
        peer=peer,
        lib=LIB,
        ordinal=ordinal,
    )


def posted(op: Entry, my_group_rank: int | None, peer: RankDump) -> bool | None:
    """``S-P2P-MATCH``: whether ``peer`` posted its side of the logged, unfinished ``op`` (None: its dump carries no
    log, or this rank's place in the group is unknown)."""
    if not peer.p2p_logged or my_group_rank is None:
        return None
    return peer.p2p_count.get((op.key, _OPPOSITE[op.op], my_group_rank), 0) >= op.ordinal
