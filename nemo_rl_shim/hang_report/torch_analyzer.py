"""torch's own analyzer (``torch.distributed.flight_recorder``, the code behind ``torchfrtrace``) on the same dumps.

Run after the shim's own analysis, in this process, with its log captured; whatever it does, the report
keeps one line of it. It works on NCCL dumps and on the shim's Gloo dumps (``pg_config`` keyed by group
name). It fails on torch's own Gloo dumps (``pg_config`` keyed by ``''``: ``KeyError``), on dumps with
coalesced p2p where ``tabulate`` is not installed (``NameError``), and is absent from torch 2.9; any
failure, ``SystemExit`` included, is caught and said in one line. It re-reads the files (the shim's
reading keeps no entries).

Only ``hang-report --torch-analyzer`` runs it (:func:`run`): it imports torch (778 modules, seconds of the
command's time; and a login node may have no torch), which the rest of the report never needs. This module
imports torch only inside :func:`run`; without the flag the report says so in one line (:func:`skipped`).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from nemo_rl_shim.hang_report.loader import RankDump, read_raw
from nemo_rl_shim.one_line.exception import first_line

__all__ = ["run", "skipped"]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def skipped() -> dict[str, Any]:
    """The outcome where it was not asked for: no torch imported, so no version to give (``"torch": None``)."""
    return {"torch": None, "ran": False, "outcome": "skipped", "error": "not run (--torch-analyzer runs it)"}


def _collective_facts(collective: Any) -> dict[str, Any]:
    mismatch = getattr(collective, "type_of_mismatch", None)
    for other in (getattr(collective, "mismatch_collectives", None) or {}).values():
        mismatch = mismatch or getattr(other, "type_of_mismatch", None)
    return {
        "group": getattr(collective, "group_id", None),
        "pg_desc": getattr(collective, "pg_desc", None),
        "seq": getattr(collective, "collective_seq_id", None),
        "op": getattr(collective, "collective_name", None),
        "missing_ranks": sorted(getattr(collective, "missing_ranks", None) or []),
        "mismatch": str(mismatch) if mismatch is not None else None,
    }


def _why(error: BaseException) -> str:
    line = first_line(error)
    if isinstance(error, NameError) and "tabulate" in str(error):
        line += " (tabulate is not installed)"
    return line


def run(dumps: dict[int, RankDump]) -> dict[str, Any]:
    """Run torch's ``build_db`` on the dumps as written: what it did (``ran``, ``flagged``) or why not (``error``)."""
    facts: dict[str, Any] = {"torch": _torch_version()}
    logger = logging.getLogger("Flight Recorder")
    capture, saved = _Capture(), (logger.handlers[:], logger.propagate)
    logger.handlers, logger.propagate = [capture], False  # its import and its run log here, not on stderr
    try:
        return {**facts, **_run(dumps, capture)}
    finally:
        logger.handlers, logger.propagate = saved


def _run(dumps: dict[int, RankDump], capture: _Capture) -> dict[str, Any]:
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # its import warns on stderr when tabulate is missing
    try:
        from torch.distributed.flight_recorder.components import builder
    except ImportError as e:
        return {"ran": False, "outcome": "absent", "error": f"not in this torch: {first_line(e)}"}
    finally:
        logging.disable(previous)
    logging.getLogger("Flight Recorder").handlers = [capture]
    args = argparse.Namespace(
        verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10, selected_ranks=None,
        pg_filters=None, print_stack_trace=False, output=None, transform_ft=False,
    )  # fmt: skip
    try:
        details = {}
        for dump in dumps.values():
            raw = read_raw(dump.path)
            details[dump.path.name] = {
                "host_name": f"host_rank{dump.rank}",
                "rank": dump.rank,
                "entries": raw.get("entries", []),
                "version": raw.get("version", ""),
                "pg_config": raw.get("pg_config") or {},
            }
        version = next(iter(dumps.values())).version if dumps else ""
        db = builder.build_db(details, args, version)
    except (Exception, SystemExit) as e:  # KeyError on Gloo's empty-named pg_config, NameError, SystemExit...
        return {"ran": False, "outcome": "failed", "error": _why(e), "log": capture.lines[-20:]}
    flagged = [
        _collective_facts(c)
        for c in db.collectives
        if not getattr(c, "pass_check", True) or getattr(c, "missing_ranks", None)
    ]
    return {
        "ran": True,
        "outcome": "ran",
        "collectives": len(db.collectives),
        "flagged": flagged,
        "log": capture.lines[-20:],
    }
