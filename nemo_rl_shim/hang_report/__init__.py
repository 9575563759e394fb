"""The hang report as a library: who did not join the collective, from every rank's Flight Recorder dump.

A NeMo RL driver (or anything else) calls it when a worker times out::

    from nemo_rl_shim.hang_report import read_run

    report = read_run("/shared/fr_dumps", world=8)  # a HangReport; DumpError where the input cannot be read
    report.line        # the first line: the kind, who, where, what to do; or that every rank agrees
    report.exit_code   # 0 agreement proved, 1 a problem found or what cannot be told, 2 nothing to compare
    report.kind        # the Kind: its name, variant and ranks (typed; ``.to_json()`` for JSON)
    report.findings    # every finding, group by group; report.missing: ranks that left no dump
    report.to_json()   # everything, as ``nemo-rl-shim hang-report --json`` prints it

:func:`read_run` takes ``world=`` (the run's world size where the caller knows it), ``run=`` (which run of a folder
that holds several, 1 the oldest), ``with_torch=`` (also run torch's own analyzer, which imports torch) and
``early=`` (a callback handed the early first line before every entry is read). :func:`render` is the text the
command prints. The command itself (``nemo_rl_shim.cli.hang_report``) only parses its arguments and prints.

The first line names the rank(s) that did not enter, or did not finish, the collective or the point-to-point op the
others waited in: the group as its mesh axes and ranks, the op, its sequence number; then, where that rank left a
stack file, its innermost frame in user code; then how long, and where, the others waited.

Split by job, as torch's own ``flight_recorder/`` keeps loader, builder and types apart:
:mod:`.report` (the API: :func:`read_run` and :class:`HangReport`), :mod:`.folder` (which files of a folder may be
one run's, by their names), :mod:`.file_identity` (each file is its rank's: no link, no copy), :mod:`.loader` (reading
them in forked readers bounded by their bytes), :mod:`.dump_format` (torch's dump format, read as untrusted input
through :mod:`.safe_pickle` and :mod:`nemo_rl_shim.untrusted.files`, bounded by :mod:`.bounds`),
:mod:`.recording_rules` (what torch's recorder guarantees of one dump, each rule citing its torch code),
:mod:`.run_evidence` and :mod:`.run_split` (which dumps are one run, proved from what they hold, and which run is
reported on), :mod:`.group_members` (a group's members as a record lists them), :mod:`.group_identity` (a group is
its rank set, whatever its name), :mod:`.field_checks` (every field checked, before a healthy verdict),
:mod:`.records` (the typed records), :mod:`.world` (the run's ranks, from records or ``world=``), :mod:`.analysis`
(who did not join), :mod:`.cycles` (circular waits), :mod:`.cascade` (a cascade followed to its root), :mod:`.kinds`
(the kind of failure), :mod:`.progress` (still working or not, from stack samples and counters), :mod:`.early_line`
(the first line from each rank's newest entries, read by :mod:`.newest_entries`), :mod:`.torch_analyzer` (torch's
analyzer, one line whatever it does), :mod:`.stacks` (the stack files), :mod:`.receivers`
(a rank in a receive is waiting), :mod:`.where` (the first line, with places)
and :mod:`.render` (text and JSON).

**One run.** A folder may hold several runs' dumps (torch's default prefix is shared by every job on a node; a
restart writes where the last run wrote). The report is about one run, proved (:mod:`.run_split`): the run
``run=`` names, else the newest complete one; the others are named with their files and time ranges and set
aside, never merged, and a rank missing from the run reported on left no dump, whatever an older run left. Without
``run=``, a folder of several runs never gives exit 0.

Exit codes (``HangReport.exit_code``): 0 only with evidence: every rank of a known world left a dump, every group's
last collective is known to have finished, and every field of every dump was checked; 1 a stall, an unfinished
collective or p2p op, a mismatch, a missing dump, a stack written (a rank stayed in a watched block past its
deadline), or what cannot be told (a world no record states, a collective no recorder says finished: torch's Gloo
dumps). :class:`DumpError` (the command's exit 2): a folder or file that cannot be read or is not a regular file, a
dump that is malformed or refused (it would run code, or expand past its bytes), dumps that disagree on the world, a
folder of several runs, or dumps that hold no entry to compare.

Imports no torch: the report reads pickles, and a login node may have no torch. Of the library it reaches only
:mod:`nemo_rl_shim.flight_recorder.names`, :mod:`nemo_rl_shim.untrusted.files` and :mod:`nemo_rl_shim.one_line`;
torch's analyzer imports torch when asked for (``tests/test_layers.py`` holds both, from the sources and in a fresh
interpreter).
"""

from __future__ import annotations

from nemo_rl_shim.hang_report.analysis import Finding, GroupState
from nemo_rl_shim.hang_report.kinds import Kind
from nemo_rl_shim.hang_report.loader import DumpError, RankDump
from nemo_rl_shim.hang_report.progress import Progress
from nemo_rl_shim.hang_report.report import (
    EXIT_AGREE,
    EXIT_FOUND,
    EXIT_UNREADABLE,
    PREFLIGHT_DUMP_WAIT_S,
    HangReport,
    preflight_summary,
    quick_first_line,
    read_run,
    render,
)
from nemo_rl_shim.hang_report.stacks import RankStack

__all__ = [
    "EXIT_AGREE",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "PREFLIGHT_DUMP_WAIT_S",
    "DumpError",
    "Finding",
    "GroupState",
    "HangReport",
    "Kind",
    "Progress",
    "RankDump",
    "RankStack",
    "preflight_summary",
    "quick_first_line",
    "read_run",
    "render",
]
