"""The facts of the machine a GPU run lands on, measured, not assumed: Python, torch, CUDA, NCCL, what is missing.

Run first by ``scripts/gpu_check.sh`` as ``python -m tests.scripts.gpu_facts OUT/facts.json`` (before the wheels are
installed, so it imports nothing of this project and nothing that may be missing; torch inside a ``try``).
``scripts/gpu_wheels.sh --facts OUT/facts.json`` reads ``python`` (the wheels' target version) and ``missing`` (the
projects to bring) from it. Prints the JSON too. Exit 0, or 2 without a path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["NEEDED", "OPTIONAL", "facts", "main"]

#: What ``scripts/gpu_check.sh``'s steps import that a GPU machine may lack: module -> project (as uv.lock names it).
NEEDED = {
    "nemo_automodel": "nemo-automodel",
    "megatron_fsdp": "megatron-fsdp",
    "yaml": "pyyaml",
    "packaging": "packaging",
    "pytest": "pytest",
}
#: Needed only by ``preflight --config`` (a NeMo RL recipe), which the run does not use: reported, not required.
OPTIONAL = {"omegaconf": "omegaconf", "hydra": "hydra-core", "antlr4": "antlr4-python3-runtime"}


def _version(project: str) -> str | None:
    try:
        return importlib.metadata.version(project)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as error:  # a fact too: the run cannot go far without it
        return {"torch": None, "torch_error": f"{type(error).__name__}: {error}"[:300]}
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        out["cuda_devices"] = count
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(count)]
        nccl = torch.cuda.nccl.version() if count else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as error:  # a driver that does not answer: a fact
        out["cuda_error"] = f"{type(error).__name__}: {error}"[:300]
    try:
        import torch.distributed.distributed_c10d as c10d

        out["nccl2"] = hasattr(c10d, "_create_nccl2_process_group")  # torch 2.15: plain "nccl" is NCCL2
    except Exception as error:
        out["distributed_error"] = f"{type(error).__name__}: {error}"[:300]
    return out


def facts() -> dict[str, Any]:
    """This interpreter and machine: Python (version, tag, platform), torch and CUDA, and the projects present or
    missing (:data:`NEEDED`, :data:`OPTIONAL`)."""
    present = {project: _version(project) for project in {**NEEDED, **OPTIONAL}.values()}
    found = {module: importlib.util.find_spec(module) is not None for module in {**NEEDED, **OPTIONAL}}
    return {
        "python": platform.python_version(),
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "machine": platform.machine(),
        "libc": "-".join(platform.libc_ver()),
        "platform": platform.platform(),
        **_torch(),
        "present": {project: version for project, version in present.items() if version},
        "missing": sorted(project for module, project in NEEDED.items() if not found[module]),
        "missing_optional": sorted(project for module, project in OPTIONAL.items() if not found[module]),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.scripts.gpu_facts OUT.json", file=sys.stderr)
        return 2
    found = facts()
    text = json.dumps(found, indent=2)
    Path(args[0]).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
