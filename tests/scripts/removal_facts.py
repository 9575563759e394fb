"""Run in a copy of the project from which one workaround was removed by its own removal steps.

``python -m tests.scripts.removal_facts`` prints, as JSON, what the copy's library says: the registry,
``decide()`` for each default group a run can have (with and without ``patch_automodel``), and
``nemo-rl-shim status`` (its dict and its text). ``PYTHONPATH`` puts the copy first. Nothing here asserts.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

__all__ = ["facts"]

TIMEOUT = 45.0


def facts() -> dict[str, Any]:
    import automodel_patch
    from nemo_rl_shim.cli.status import RUNS, gather_status, render_status
    from nemo_rl_shim.setup.decision import decide
    from nemo_rl_shim.setup.default_group import backend_for

    decisions = []
    for label, cpu_offload, cuda in RUNS:
        backend = backend_for(cpu_offload=cpu_offload, cuda_available=cuda)
        for patch in (True, False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                decision = decide(TIMEOUT, cpu_offload=cpu_offload, patch_automodel=patch, default_backend=backend)
            decisions.append({"run": label, "patch_automodel": patch, **decision.to_dict()})
    status = gather_status(TIMEOUT)
    return {
        "automodel_patch_file": automodel_patch.__file__,
        "registered": [w.slug for w in automodel_patch.WORKAROUNDS],
        "decisions": decisions,
        "status": status,
        "status_text": render_status(status),
    }


if __name__ == "__main__":
    print(json.dumps(facts()))
