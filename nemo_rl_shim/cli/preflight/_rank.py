"""Entry point of one rank started by :func:`nemo_rl_shim.cli.preflight.spawn.spawn_ranks`."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback

from nemo_rl_shim.cli.preflight.rendezvous import take_rendezvous_port

__all__ = ["main"]


def _run(target: str, params_path: str) -> tuple[dict, int]:
    module_name, _, function_name = target.partition(":")
    try:
        with open(params_path, encoding="utf-8") as handle:
            params = json.load(handle)
        take_rendezvous_port()
        result = getattr(importlib.import_module(module_name), function_name)(params)
    except BaseException:  # every failure, SystemExit included, is reported to the parent
        return {"error": traceback.format_exc()}, 1
    return {"result": result}, 0


def main(argv: list[str]) -> int:
    """``TARGET PARAMS_JSON OUT_JSON``: run ``TARGET(params)``, write its result or traceback, tear down."""
    target, params_path, out_path = argv
    payload, code = _run(target, params_path)
    # The result is written before teardown, so a group broken by a timeout cannot hide it.
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, default=str)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is written and the groups are gone: skip interpreter finalization, where torch's
    # background threads have been seen to abort ("terminate called without an active exception",
    # SIGABRT) on torch 2.11 after a rank had reported, turning a finished rank into a failed one.
    os._exit(code)
