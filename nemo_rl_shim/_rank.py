"""Entry point of one rank started by :func:`nemo_rl_shim.launch.spawn_ranks`."""

from __future__ import annotations

import importlib
import json
import sys
import traceback


def main(argv: list[str]) -> int:
    target, params_path, out_path = argv
    module_name, _, function_name = target.partition(":")
    try:
        with open(params_path, encoding="utf-8") as handle:
            params = json.load(handle)
        result = getattr(importlib.import_module(module_name), function_name)(params)
        payload, code = {"result": result}, 0
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        payload, code = {"error": traceback.format_exc()}, 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group must not hide the result
                pass
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
