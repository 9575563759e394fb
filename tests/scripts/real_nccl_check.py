"""The report on a harvest: each scenario folder read by ``nemo-rl-shim hang-report``, its first line against its truth.

Run by ``scripts/gpu_check.sh`` after the harvest as ``python -m tests.scripts.real_nccl_check ROOT`` (ROOT holds
``<torch version>/<scenario>/``; default: the committed fixtures). One line per folder (right or WRONG, the first
line and the truth's), then a count. Exit 0 when every folder reads right, 1 when one does not, 2 when ROOT holds no
scenario folder or a truth that cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.harness.real_nccl import FIXTURES, read_folder, scenario_folders, truth_problems

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=FIXTURES, help="<torch version>/<scenario>/ under it")
    args = parser.parse_args(argv)
    folders = scenario_folders(args.root)
    if not folders:
        print(f"real_nccl_check: no scenario folder (<torch version>/<scenario>/truth.json) under {args.root}")
        return 2
    problems = [problem for folder in folders for problem in truth_problems(folder)]
    if problems:
        print("\n".join(f"real_nccl_check: {problem}" for problem in problems))
        return 2
    readings = [read_folder(folder) for folder in folders]
    for reading in readings:
        print(reading.describe())
    right = sum(reading.right for reading in readings)
    print(f"real_nccl_check: {right} of {len(readings)} read right under {args.root}")
    return 0 if right == len(readings) else 1


if __name__ == "__main__":
    sys.exit(main())
