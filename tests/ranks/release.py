"""What ``automodel_patch`` and ``decide`` make of one Automodel release, in one process.

Run by :mod:`tests.harness.release_facts`: :func:`release_facts_in_turn` for every release in one
process, :func:`release_facts` for one release in a process whose ``PYTHONPATH`` puts its
(or a fixture's, or a source-patched copy's) sources first. No process
group is needed: the probes build their own one-rank world (``automodel_patch._simulated_group``).
Nothing here asserts; the tests read the returned facts.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

__all__ = ["TIMEOUTS", "release_facts", "release_facts_in_turn"]

#: Timeouts the decision matrix is computed for (None: unset).
TIMEOUTS = (None, 45)


def _snapshot(module: Any) -> dict[str, int]:
    return {name: id(value) for name, value in vars(module).items()}


def _verdicts(*, installed: bool) -> dict[str, dict[str, str]]:
    import automodel_patch

    return {w.slug: automodel_patch.detect(w.slug, installed=installed).to_dict() for w in automodel_patch.WORKAROUNDS}


def _matrix() -> list[dict[str, Any]]:
    from nemo_rl_shim.setup.decision import decide
    from nemo_rl_shim.setup.default_group import backend_for

    rows = []
    for timeout in TIMEOUTS:
        for cpu_mesh in (False, True):
            for cpu_offload in (False, True):
                for patch in (True, False):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        backend = backend_for(cpu_offload=cpu_offload, cuda_available=not cpu_mesh)
                        decision = decide(
                            timeout, cpu_offload=cpu_offload, patch_automodel=patch, default_backend=backend
                        )
                    rows.append(
                        {
                            "timeout": timeout,
                            "cpu_mesh": cpu_mesh,
                            "cpu_offload": cpu_offload,
                            "patch_automodel": patch,
                            **decision.to_dict(),
                        }
                    )
    return rows


def release_facts(params: dict[str, Any]) -> dict[str, Any]:
    """Detection, decisions, and apply/revert (all workarounds, then one at a time) on the release in this process."""
    import automodel_patch
    from automodel_patch import _target
    from nemo_rl_shim.setup.support import import_automodel

    imported = import_automodel()
    if imported.error is not None:  # a release this torch cannot import (0.6.0 and 0.7.0 on torch 2.9)
        return {"import_error": imported.error, "mesh_utils_file": None, "installed_version": imported.version}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mesh_utils = _target.load_mesh_utils()
        before = _snapshot(mesh_utils)
        facts: dict[str, Any] = {
            "installed_version": str(automodel_patch.installed_version()),
            "mesh_utils_file": mesh_utils.__file__,
            "build_accepts_timeout": automodel_patch.build_accepts_timeout(),
            "genuine": _verdicts(installed=False),
            "decisions_before": _matrix(),
            "active_before": list(automodel_patch.active()),
        }
        facts["apply"] = automodel_patch.apply().to_dict()
        facts["apply_again"] = automodel_patch.apply().to_dict()
        facts["active_after"] = list(automodel_patch.active())
        facts["patched_names"] = sorted(automodel_patch.patched_names())
        facts["marker_of"] = {
            name: list(getattr(getattr(mesh_utils, name), automodel_patch.MARKER, ()))
            for name in facts["patched_names"]
        }
        facts["installed_after"] = _verdicts(installed=True)
        facts["genuine_after"] = _verdicts(installed=False)
        facts["decisions_after"] = _matrix()
        facts["module_unchanged_after_apply"] = _snapshot(mesh_utils) == before
        # One at a time: take the first active workaround out; the other must stay in force.
        if len(facts["active_after"]) == 2:
            first = facts["active_after"][0]
            facts["revert_one"] = {"slug": first, "changed": automodel_patch.revert(first)}
            facts["revert_one"]["active"] = list(automodel_patch.active())
            facts["revert_one"]["installed"] = _verdicts(installed=True)
        facts["revert"] = automodel_patch.revert()
        facts["revert_again"] = automodel_patch.revert()
        facts["module_restored_after_revert"] = _snapshot(mesh_utils) == before
        facts["installed_after_revert"] = _verdicts(installed=True)
    facts["warnings"] = [
        {"category": w.category.__name__, "message": str(w.message)}
        for w in caught
        if str(w.message).startswith("automodel_patch")
    ]
    return facts


def _forget_automodel() -> None:
    for name in [m for m in sys.modules if m == "nemo_automodel" or m.startswith("nemo_automodel.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def release_facts_in_turn(params: dict[str, Any]) -> dict[str, Any]:
    """:func:`release_facts` of each release in ``params["roots"]`` (name -> source folder), one after another.

    Before each, every ``nemo_automodel`` module is dropped and that release's folder goes
    first on ``sys.path``; the layers of the previous one were reverted by its own run.
    """
    import automodel_patch

    out = {}
    for name, root in params["roots"].items():
        _forget_automodel()
        sys.path.insert(0, root)
        try:
            out[name] = release_facts({})
        finally:
            automodel_patch.revert()
            sys.path.remove(root)
    _forget_automodel()
    return out
