"""``nemo-rl-shim hang-report DIR [--json]``: the command over :mod:`nemo_rl_shim.hang_report`, which reads and judges.

This module only turns the library's answer into the command's: the text (:func:`~nemo_rl_shim.hang_report.render`)
or the JSON (``--json``, JSON on every path), and the exit code: :attr:`~nemo_rl_shim.hang_report.HangReport.exit_code`,
or 2 with one line naming the input for a :class:`~nemo_rl_shim.hang_report.DumpError`, for this process running out
of memory, and for any defect of the report itself (never a traceback, never the exit 1 of a found stall). Where
the run's dumps are many, the early first line is printed first (``early``), and the full reading's first line is
printed again only where it differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from nemo_rl_shim.hang_report import EXIT_AGREE, EXIT_FOUND, EXIT_UNREADABLE, DumpError, read_run, render
from nemo_rl_shim.hang_report.early_line import QuickLine
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import clean, encodable, shown_path

__all__ = ["EXIT_AGREE", "EXIT_FOUND", "EXIT_UNREADABLE", "main"]


def _refusal(directory: str, line: str, as_json: bool) -> tuple[int, str]:
    if as_json:
        payload = {"line": line, "exit_code": EXIT_UNREADABLE, "directory": shown_path(directory), "error": line}
        return EXIT_UNREADABLE, json.dumps(payload, indent=2)
    return EXIT_UNREADABLE, line


def _after_quick(text: str, quick: QuickLine | None) -> str:
    """The text, less its first line where the quick line given before it was the same; else with the full reading's
    first line said as such."""
    if quick is None:
        return text
    first, _, rest = text.partition("\n")
    if first == quick.line:
        return rest.lstrip("\n")
    return f"read in full, the first line is: {first}\n{rest}"


def main(
    directory: str,
    *,
    as_json: bool = False,
    with_torch: bool = False,
    world: int | None = None,
    early: Callable[[str], None] | None = None,
    run: int | None = None,
) -> tuple[int, str]:
    """The command: ``(exit code, text)``; a :class:`DumpError` is ``(2, its one line)``, or with ``as_json`` a JSON
    object that carries it (``line``, ``exit_code``, ``error``), so that ``--json`` is JSON on every path. Whatever
    else goes wrong is exit 2 and one line too, saying it is the report's own defect (never a traceback, never the
    exit 1 of a found stall). The text is always writable as UTF-8."""
    try:
        quick_first = early if not as_json else None
        report = read_run(directory, with_torch=with_torch, world=world, early=quick_first, run=run)
        text = json.dumps(report.to_json(), indent=2, default=str) if as_json else render(report)
        if quick_first is not None:
            text = _after_quick(text, report.quick)
        return report.exit_code, encodable(text)
    except DumpError as e:
        return _refusal(directory, encodable(f"hang-report: {clean(str(e), limit=2000)}"), as_json)
    except MemoryError:  # this process's own limit (the readers' are theirs): not a defect, not a stall
        line = f"hang-report: reading {shown_path(directory)} needs more memory than this process may have"
        return _refusal(directory, encodable(line), as_json)
    except Exception as e:  # a defect of the report itself: still one line and exit 2, never read as a stall
        line = f"hang-report: could not read {shown_path(directory)}: {first_line(e)} (a defect of hang-report)"
        return _refusal(directory, encodable(clean(line, limit=2000)), as_json)
