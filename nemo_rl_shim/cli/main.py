"""The ``nemo-rl-shim`` command: ``status``, ``preflight`` and ``hang-report``.

Argument parsing and printing only; the work is in :mod:`nemo_rl_shim.cli.status`,
:mod:`nemo_rl_shim.cli.preflight` and :mod:`nemo_rl_shim.hang_report`. Exit codes: 0 all good,
1 a check failed (for ``status``: this torch and nemo-automodel cannot run together; for
``hang-report``: a stall, a mismatch or a missing dump), 2 bad arguments or config, or dumps that
cannot be read (one line on stderr).

Each subcommand's package is imported by the function that runs it, and this module imports only the standard
library and two small modules that do too (:mod:`.command_clock`, :mod:`nemo_rl_shim.one_line.exception`):
``hang-report`` imports no torch (``status`` and ``preflight`` do, when they run).

``preflight --timeout-s`` bounds the whole command (:class:`~nemo_rl_shim.cli.command_clock.CommandClock`): reading
the recipe (in a bounded child process, before torch is imported), the imports, the ranks and the report; where it
runs out, one line names the phase, with exit 2 where the input could not be read in time and 1 otherwise. No
traceback reaches the user: an error of preflight itself is one line (``NEMO_RL_SHIM_TRACEBACK=1`` adds the
traceback).

The report (table or JSON) is the only thing on standard output: while a command runs,
file descriptor 1 points at standard error, so whatever a library prints there (Gloo on
torch 2.10 and older prints ``[Gloo] Rank N is connected to M peer ranks`` from C++ each
time it creates a group) cannot corrupt it. With ``preflight --json``, standard output holds
one JSON object on every exit path: the report; or, for bad arguments or input (exit 2), a
watchdog's end or an unexpected error (exit 1), ``{"ok": false, "exit_code": ..., "problem": ...}``
(:func:`failure_json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from nemo_rl_shim.cli.command_clock import CommandClock, Phase
from nemo_rl_shim.one_line.exception import first_line

if TYPE_CHECKING:
    from nemo_rl_shim.cli.preflight import PreflightReport

__all__ = ["build_parser", "failure_json", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def failure_json(problem: str, exit_code: int) -> dict[str, Any]:
    """What ``--json`` prints where there is no report: bad arguments or input, a watchdog's end, an error."""
    return {"ok": False, "exit_code": exit_code, "problem": problem}


class BadArguments(SystemExit):
    """argparse's exit 2 (usage and message already on stderr), with the message kept for ``--json``."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse, but an error raises :class:`BadArguments` (a ``SystemExit`` with code 2) that keeps the message."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise BadArguments(message)


def _count(text: str) -> int:
    """A whole number in ASCII digits; ``٨``, ``+8``, `` 8`` and ``8_0`` are refused (see config.numbers)."""
    from nemo_rl_shim.config.numbers import ascii_int

    value = ascii_int(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a whole number in ASCII digits (0-9), got {text[:40]!r}")
    return value


def _positive_int(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _number(text: str) -> float:
    """A decimal number in ASCII (``45``, ``0.5``, ``-1``, ``1e3``); ``٤٥``, ``nan``, ``inf``, ``4_5`` are refused."""
    from nemo_rl_shim.config.numbers import ascii_number

    value = ascii_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a number in ASCII digits (45, 0.5, 1e3), got {text[:40]!r}")
    return value


#: ``preflight``'s exit codes, every outcome (``preflight --help``; the same table is in docs/preflight.md).
PREFLIGHT_EXIT_CODES = """\
exit codes:
  0  every group torch holds carries the configured timeout on every backend and every collective ran;
     or no timeout is configured (distributed_timeout_minutes null or unset, as in examples/grpo.yaml):
     the groups are built and work, at torch's defaults ("no timeout configured: torch's defaults apply")
  1  a problem found: a group at torch's default or without the timeout, a collective that failed or hung,
     a rank that failed (NeMo RL's set-up module raising or exiting as a rank imports it included) or was
     stuck (named, when --timeout-s runs out while the ranks run), or the config's job does not run on the
     checked path; or --timeout-s ran out while importing torch or writing the report, or before the ranks
     started; or preflight itself failed (one line; NEMO_RL_SHIM_TRACEBACK=1 adds the traceback)
  2  bad input, one line naming it: arguments (numbers in ASCII digits), a recipe file, override, value or
     layout; a recipe past its budget (YAML nodes, aliases, defaults depth or files, the CPU or memory its
     interpolations take); --timeout-s ran out while reading the recipe or trying NeMo RL's import; NeMo RL
     not importable (--setup nemo-rl: its import failed, exited or hung); --ray without the ray extra or
     without a cluster; a world larger than the runner can start; a dry run estimated past --timeout-s
"""


def _add_preflight(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="start local ranks with the real set-up and check every process group",
        description="Start local ranks (one per GPU, or 2 CPU ranks) with the real setup_distributed, or join "
        "the torchrun/srun world this runs in, and check every process group's backends, timeouts and "
        "collectives. Without --config: 45 min, CPU offload on, patch_automodel true.",
        epilog=PREFLIGHT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        metavar="PATH",
        help="NeMo RL config, read as NeMo RL reads it (defaults: chains, _override_, ${...} with add/mul/div/max); "
        "its --role section goes to setup_distributed, and its cluster section gives the training world",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides of the config, as NeMo RL takes them: key=value (an existing key), +key=value (a new "
        "key), ++key=value (either), ~key (delete)",
    )
    p.add_argument(
        "--world",
        type=_positive_int,
        metavar="N",
        help="the training world to check (default: NeMo RL's rule on the config's cluster section). A world "
        "larger than this machine (or the Ray cluster) can run exits 2 and points to --dry-run",
    )
    _add_section_flags(p)
    _add_run_flags(p)


def _add_section_flags(p: argparse.ArgumentParser) -> None:
    """The flags that set keys of the role's section."""
    p.add_argument("--role", choices=("policy", "value"), default="policy", help="config section (default policy)")
    p.add_argument("--timeout-minutes", type=_number, help="automodel_cfg.distributed_timeout_minutes")
    p.add_argument(
        "--timeout-minutes-after-init", type=_number, help="nemo_rl_shim.distributed_timeout_minutes_after_init"
    )
    p.add_argument("--cpu-offload", action=argparse.BooleanOptionalAction, default=None, help="dtensor_cfg.cpu_offload")
    p.add_argument("--tp", type=_positive_int, help="dtensor_cfg.tensor_parallel_size")
    p.add_argument("--cp", type=_positive_int, help="dtensor_cfg.context_parallel_size")
    p.add_argument("--ep", type=_positive_int, help="dtensor_cfg.expert_parallel_size")
    p.add_argument("--dp-replicate", type=_positive_int, help="dtensor_cfg.dp_replicate_size")
    p.add_argument("--no-patch", action="store_true", help="nemo_rl_shim.patch_automodel: false")
    p.add_argument(
        "--flight-recorder",
        metavar="DIR",
        help="nemo_rl_shim.flight_recorder: {enabled: true, dump_dir: DIR}; a failed run ends with hang-report's line",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags that choose where and how the ranks run, and the report."""
    p.add_argument("--nproc", type=_count, help="local ranks to spawn (default: one per GPU, or 2 on CPU)")
    p.add_argument(
        "--timeout-s",
        type=_number,
        default=300.0,
        help="bound on the whole command: reading the recipe, the imports (NeMo RL's with --setup nemo-rl), the "
        "ranks (they get what is left), the report (default 300)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run the ranks as Ray actors in a placement group on this cluster ('auto', the default, or host:port)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the training world in this process on torch's fake backend: no GPU, no network, no other "
        "process; every group's backends and timeouts, no collective",
    )
    p.add_argument(
        "--ranks",
        choices=("sample", "all"),
        default=None,
        help="with --dry-run above 64 ranks: a sample covering every group shape (default), or all ranks",
    )
    p.add_argument(
        "--setup",
        choices=("shim", "nemo-rl"),
        default="shim",
        help="whose setup_distributed every rank runs: this project's (default), or NeMo RL's own "
        "(nemo_rl.models.automodel.setup, where NeMo RL is importable; on a machine without CUDA, NCCL is stood in "
        "by Gloo); either way the groups a NeMo RL worker makes later are made too, and every group torch holds "
        "is checked",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    # Fault injection for tests: this rank sleeps after set-up, so its peers wait on it in a collective.
    p.add_argument("--stall-rank", type=_count, help=argparse.SUPPRESS)
    p.add_argument("--stall-s", type=_number, default=0.0, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nemo-rl-shim", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    status = subparsers.add_parser("status", help="versions, what setup_distributed would decide, workarounds")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--timeout-minutes", type=_number, default=45.0, help="sample timeout (default 45)")
    _add_preflight(subparsers)
    hang = subparsers.add_parser(
        "hang-report",
        help="name the rank that did not join a collective, from every rank's Flight Recorder dump",
        description="Read every rank's Flight Recorder dump in DIR (nemo_rl_shim.flight_recorder.dump_dir) and name "
        "the rank(s) that did not enter or finish the collective the others waited in. Exit 0 only when every rank "
        "of a known world dumped and every group's last collective is known to have finished; 1 on a stall, a "
        "mismatch, a missing dump, or what cannot be told (a world no record states, Gloo's collectives); 2 when DIR "
        "or a dump cannot be read, or DIR holds several runs.",
    )
    hang.add_argument("dir", metavar="DIR", help="the dump directory (one run: one folder, or one folder per node)")
    hang.add_argument(
        "--world",
        type=_world_size,
        metavar="N",
        help="the run's world size, where no dump states it (torch's own Gloo dumps): ranks 0 to N-1 must each have "
        "left a dump; the dumps' records must agree",
    )
    hang.add_argument(
        "--run",
        type=_run_number,
        metavar="N",
        help="where DIR holds several runs' dumps (the report names each, 1 the oldest), report on run N; without it, "
        "the newest complete run is reported on, and a folder of several runs never gives exit 0",
    )
    hang.add_argument("--json", action="store_true", help="print JSON")
    hang.add_argument(
        "--torch-analyzer",
        action="store_true",
        help="also run torch's own analyzer on the dumps (it imports torch, which the report does not need)",
    )
    return parser


#: The largest --world hang-report reads (its bounds.MAX_WORLD, without importing the report to parse arguments).
_MAX_WORLD = 1 << 20


def _world_size(text: str) -> int:
    from nemo_rl_shim.config.numbers import ascii_int

    value = ascii_int(text)
    if value is None or not 0 < value <= _MAX_WORLD:
        raise argparse.ArgumentTypeError(f"a world of 1 to {_MAX_WORLD:,} ranks in ASCII digits, got {text[:40]!r}")
    return value


def _run_number(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 6 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a run's number, 1 or more, got {text[:40]!r}")
    return int(text)


def _progress(message: str) -> None:
    print(f"preflight: {message}", file=sys.stderr, flush=True)


@contextmanager
def _report_stream() -> Iterator[TextIO]:
    """A stream to the real standard output; until the block ends, fd 1 (and ``sys.stdout``) go to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with os.fdopen(os.dup(saved), "w", encoding="utf-8") as report:
            yield report
            report.flush()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _status(args: argparse.Namespace, out: TextIO) -> int:
    from nemo_rl_shim.cli.status import gather_status, render_status

    status = gather_status(args.timeout_minutes)
    print(json.dumps(status, indent=2) if args.json else render_status(status), file=out)
    return EXIT_FAILED if status["problem"] else EXIT_OK


def _hang_report(args: argparse.Namespace, out: TextIO) -> int:
    from nemo_rl_shim.cli import hang_report
    from nemo_rl_shim.one_line.printable import encodable

    def early(line: str) -> None:  # the quick first line, at once (many dumps: the rest follows when all are read)
        print(encodable(line), file=out, flush=True)

    code, text = hang_report.main(
        args.dir, as_json=args.json, with_torch=args.torch_analyzer, world=args.world, early=early, run=args.run
    )
    if not args.json:
        print(text, file=sys.stderr if code == hang_report.EXIT_UNREADABLE else out)
        return code
    print(text, file=out)  # JSON on every path; the one line on stderr too where the dumps cannot be read
    if code == hang_report.EXIT_UNREADABLE:
        print(json.loads(text)["line"], file=sys.stderr)
    return code


def _refuse(args: argparse.Namespace, out: TextIO, problem: str, code: int) -> int:
    """One line on stderr, and with ``--json`` the same as JSON on stdout; the exit code."""
    print(f"preflight: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(failure_json(problem, code), indent=2), file=out, flush=True)
    return code


def _usage_problem(args: argparse.Namespace) -> str | None:
    if not args.timeout_s > 0:
        return f"--timeout-s must be a positive number of seconds, got {args.timeout_s:g}"
    if args.ranks is not None and not args.dry_run:
        return "--ranks chooses the ranks of a dry run: add --dry-run, or leave --ranks out"
    if args.dry_run and args.ray is not None:
        return "--dry-run checks the world in this process, --ray on a cluster: choose one"
    if args.dry_run and args.setup == "nemo-rl":
        return (
            "--setup nemo-rl runs NeMo RL's own set-up on real ranks; --dry-run plays the shim's on torch's fake "
            "backend: choose one"
        )
    return None


#: ``1`` prints the traceback of an error of preflight itself (else one line says it, and this variable).
TRACEBACK_ENV = "NEMO_RL_SHIM_TRACEBACK"

#: The phases of ``preflight``, each with its exit code when ``--timeout-s`` runs out in it: 2 where the input could
#: not be read in time, 1 otherwise. The ranks' runner ends its own ranks at the deadline (exit 1, naming them) and
#: cleans up: the watchdog gives it the Ray runner's clean-up time (``WATCHDOG_GRACE_S``, 60 s) on top.
READING = Phase("reading the recipe", EXIT_USAGE)
IMPORTING = Phase("importing torch and the checks", EXIT_FAILED)
CHECKING = Phase("checking the options (with --setup nemo-rl, trying NeMo RL's import)", EXIT_USAGE)
RANKS = Phase("running the ranks", EXIT_FAILED, slack_s=65.0)
REPORTING = Phase("writing the report", EXIT_FAILED)


def _read_recipe(args: argparse.Namespace, clock: CommandClock) -> dict[str, Any] | None:
    """The recipe, read before torch is imported, in a bounded child (``ValueError``: one line, exit 2)."""
    from nemo_rl_shim.cli.nemo_rl import RecipeTimedOut, read_config

    clock.enter(READING)
    try:
        return read_config(args.config, args.overrides, timeout_s=clock.left())
    except RecipeTimedOut as e:
        raise ValueError(f"{clock.ran_out(READING)}: {e}") from None


def _options(args: argparse.Namespace, config: dict[str, Any] | None, clock: CommandClock) -> Any:
    from nemo_rl_shim.cli import preflight

    clock.enter(CHECKING)
    overrides = {
        key: getattr(args, key)
        for key in ("timeout_minutes", "timeout_minutes_after_init", "cpu_offload", "tp", "cp", "ep", "dp_replicate")
    }
    if args.flight_recorder is not None:
        overrides["flight_recorder"] = {"enabled": True, "dump_dir": args.flight_recorder}
    options = preflight.build_options(
        args.config, args.role, overrides=overrides, patch=not args.no_patch, nproc=args.nproc,
        timeout_s=args.timeout_s, stall_rank=args.stall_rank, stall_s=args.stall_s, ray_address=args.ray,
        recipe_overrides=args.overrides, world=args.world, setup=args.setup, config=config, deadline=clock.deadline,
    )  # fmt: skip
    if args.dry_run:
        options = dataclasses.replace(options, dry_run=True, all_ranks=args.ranks == "all")
    return options


def _run_preflight(args: argparse.Namespace, out: TextIO, clock: CommandClock) -> PreflightReport:
    """The report of the run ``args`` ask for (``ValueError``/``OSError``: bad input), phase by phase on ``clock``."""
    config = _read_recipe(args, clock)
    clock.enter(IMPORTING)
    from nemo_rl_shim.cli import preflight

    options = _options(args, config, clock)
    if clock.left() <= 0:  # the options are good: no rank had the time to start
        raise _RanOut(f"--timeout-s {args.timeout_s:g} ran out before the ranks started", EXIT_FAILED)

    def last_words(line: str) -> None:  # a watchdog ends the process: the JSON report's stand-in
        print(json.dumps(failure_json(line, EXIT_FAILED), indent=2), file=out, flush=True)

    clock.enter(RANKS)
    report = preflight.run_preflight(
        options, progress=_progress, last_words=last_words if args.json else None, deadline=clock.deadline
    )
    clock.enter(REPORTING)
    return report


class _RanOut(Exception):
    """``--timeout-s`` ran out between phases: the line and the exit code."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.code = code


def _failed_itself(args: argparse.Namespace, out: TextIO, error: Exception) -> int:
    """An error of preflight itself, not a finding of the checks: one line (the traceback where asked), exit 1."""
    if os.environ.get(TRACEBACK_ENV) == "1":
        traceback.print_exc(file=sys.stderr)
    where = "" if os.environ.get(TRACEBACK_ENV) == "1" else f" ({TRACEBACK_ENV}=1 prints the traceback)"
    problem = f"preflight itself failed: {first_line(error)}{where}"
    return _refuse(args, out, problem, EXIT_FAILED)


def _checked_run(args: argparse.Namespace, out: TextIO, clock: CommandClock) -> PreflightReport | int:
    """The report, or the exit code of a run that ended without one (its line already said)."""
    try:
        return _run_preflight(args, out, clock)
    except _RanOut as e:
        return _refuse(args, out, str(e), e.code)
    except (OSError, ValueError) as e:
        return _refuse(args, out, first_line(e, with_type=False), EXIT_USAGE)
    except RecursionError as e:  # a config nested past what the checks can walk: bad input
        return _refuse(args, out, f"the config is nested too deep to check ({first_line(e)})", EXIT_USAGE)
    except Exception as e:  # not a finding of the checks: say so, and never exit 0
        return _failed_itself(args, out, e)


def _preflight(args: argparse.Namespace, out: TextIO) -> int:
    problem = _usage_problem(args)
    if problem is not None:
        return _refuse(args, out, problem, EXIT_USAGE)
    clock = CommandClock(args.timeout_s)

    def last_words(line: str, code: int) -> None:  # the watchdog ends the process: the JSON report's stand-in
        if args.json:
            print(json.dumps(failure_json(line, code), indent=2), file=out, flush=True)

    clock.watch(last_words)
    try:
        report = _checked_run(args, out, clock)
        if isinstance(report, int):
            return report
        return _finish(args, out, report)
    finally:
        clock.stop()


def _finish(args: argparse.Namespace, out: TextIO, report: PreflightReport) -> int:
    """Print the report (where this process is the one that reports); the exit code."""
    from nemo_rl_shim.cli import preflight

    if report.reports:  # the runner's word: every runner's one process, or rank 0 of a launcher's world
        text = json.dumps(report.to_json(), indent=2, default=str) if args.json else preflight.render_report(report)
        print(text, file=out)
        if report.problem:
            print(f"preflight: FAILED: {report.problem}", file=sys.stderr)
        if "hang_report" in report.facts:
            print(f"preflight: {report.facts['hang_report']['summary']}", file=sys.stderr)
    code = EXIT_OK if report.ok else EXIT_FAILED
    if report.joined:
        # This process was a rank of the launcher's world and its groups are gone: end it here, so that
        # torch's background threads cannot abort it during interpreter finalization (seen on torch
        # 2.11 as "terminate called without an active exception", SIGABRT) and change the exit code.
        out.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = parser.parse_known_args(argv)
        # Overrides may come between flags, as NeMo RL's examples/run_*.py take them (parse_known_args).
        unknown = [arg for arg in extra if arg.startswith("-") or args.command != "preflight"]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except BadArguments as e:
        if "--json" in argv:  # the report's stand-in: stdout holds JSON on this path too
            print(json.dumps(failure_json(e.message, EXIT_USAGE), indent=2), flush=True)
        raise
    if extra:
        args.overrides = [*args.overrides, *extra]
    # Noise from megatron_fsdp's import on machines without Transformer Engine/Apex.
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    with _report_stream() as out:
        if args.command == "hang-report":
            return _hang_report(args, out)
        return _status(args, out) if args.command == "status" else _preflight(args, out)
