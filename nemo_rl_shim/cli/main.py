"""The ``nemo-rl-shim`` command: ``status`` and ``preflight``.

Argument parsing and printing only; the work is in :mod:`nemo_rl_shim.cli.status`
and :mod:`nemo_rl_shim.cli.preflight`. Exit codes: 0 all good, 1 a check failed (for
``status``: this torch and nemo-automodel cannot run together), 2 bad arguments or config
(one line on stderr).

The report (table or JSON) is the only thing on standard output: while a command runs,
file descriptor 1 points at standard error, so whatever a library prints there (Gloo on
torch 2.10 and older prints ``[Gloo] Rank N is connected to M peer ranks`` from C++ each
time it creates a group) cannot corrupt it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _add_preflight(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="start local ranks with the real set-up and check every process group",
        description="Start local ranks (one per GPU, or 2 CPU ranks) with the real setup_distributed, or join "
        "the torchrun/srun world this runs in, and check every process group's backends, timeouts and "
        "collectives. Without --config: 45 min, CPU offload on, patch_automodel true.",
    )
    p.add_argument("--config", metavar="PATH", help="NeMo RL YAML; its --role section goes to setup_distributed")
    p.add_argument("--role", choices=("policy", "value"), default="policy", help="config section (default policy)")
    p.add_argument("--timeout-minutes", type=float, help="automodel_cfg.distributed_timeout_minutes")
    p.add_argument(
        "--timeout-minutes-after-init", type=float, help="automodel_cfg.distributed_timeout_minutes_after_init"
    )
    p.add_argument("--cpu-offload", action=argparse.BooleanOptionalAction, default=None, help="dtensor_cfg.cpu_offload")
    p.add_argument("--tp", type=_positive_int, help="dtensor_cfg.tensor_parallel_size")
    p.add_argument("--cp", type=_positive_int, help="dtensor_cfg.context_parallel_size")
    p.add_argument("--ep", type=_positive_int, help="dtensor_cfg.expert_parallel_size")
    p.add_argument("--dp-replicate", type=_positive_int, help="dtensor_cfg.dp_replicate_size")
    p.add_argument("--no-patch", action="store_true", help="automodel_cfg.patch_automodel: false")
    p.add_argument("--nproc", type=int, help="local ranks to spawn (default: one per GPU, or 2 on CPU)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="bound on the whole run (default 300)")
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run the ranks as Ray actors in a placement group on this cluster ('auto', the default, or host:port)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    # Fault injection for tests: this rank sleeps after set-up, so its peers wait on it in a collective.
    p.add_argument("--stall-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stall-s", type=float, default=0.0, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nemo-rl-shim", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    status = subparsers.add_parser("status", help="versions, what setup_distributed would decide, workarounds")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--timeout-minutes", type=float, default=45.0, help="sample timeout (default 45)")
    _add_preflight(subparsers)
    return parser


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


def _preflight(args: argparse.Namespace, out: TextIO) -> int:
    from nemo_rl_shim.cli import preflight

    overrides = {
        key: getattr(args, key)
        for key in ("timeout_minutes", "timeout_minutes_after_init", "cpu_offload", "tp", "cp", "ep", "dp_replicate")
    }
    try:
        options = preflight.build_options(
            args.config, args.role, overrides=overrides, patch=not args.no_patch, nproc=args.nproc,
            timeout_s=args.timeout_s, stall_rank=args.stall_rank, stall_s=args.stall_s, ray_address=args.ray,
        )  # fmt: skip
        report = preflight.run_preflight(options, progress=_progress)
    except (OSError, ValueError) as e:
        print(f"preflight: {e}", file=sys.stderr)
        return EXIT_USAGE
    launcher = None if args.ray is not None else preflight.detect_launcher()
    if launcher is None or launcher.rank == 0:
        text = json.dumps(report.to_json(), indent=2, default=str) if args.json else preflight.render_report(report)
        print(text, file=out)
        if report.problem:
            print(f"preflight: FAILED: {report.problem}", file=sys.stderr)
    code = EXIT_OK if report.ok else EXIT_FAILED
    if launcher is not None:
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
    args = build_parser().parse_args(argv)
    # Noise from megatron_fsdp's import on machines without Transformer Engine/Apex.
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    with _report_stream() as out:
        return _status(args, out) if args.command == "status" else _preflight(args, out)
