"""Tripwire: fails once the locked nemo-automodel keeps the CPU half itself, and says what to delete then.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): TEMPORARY. Remove when the automodel pin
# includes NVIDIA-NeMo/Automodel#4602.
"""

from __future__ import annotations

import automodel_patch

__all__: list[str] = []

REMOVAL_STEPS = """\
nemo-automodel {version} (the locked release) now keeps the CPU (gloo) half of a "cuda:nccl,cpu:gloo" default \
group in its mesh sub-groups: NVIDIA-NeMo/Automodel#4602 has landed in the pin, so the fork fix is dead code.
Delete the AUTOMODEL-WORKAROUND(keep-cpu-backend) code (find it all with: \
grep -rn "AUTOMODEL-WORKAROUND(keep-cpu-backend)" .):
  1. the run-time patch: the automodel_patch package (apply/revert/keep_all_backends_override) and its use in \
nemo_rl_shim (the automodel_patch.apply() call in distributed_setup.py, Action.PATCH_AND_FORWARD in decision.py, \
the patch_automodel config key), with its tests: tests/test_patch_api.py, tests/test_releases.py, \
tests/test_mesh_cpu.py, tests/test_fault.py, tests/workers_patch.py;
  2. the source patch automodel_patch/keep-cpu-backend.patch and tests/test_source_patch.py;
  3. the *patched* variant guard of the GPU tests in tests/test_gpu.py (the id="patched" parameter and the \
NEEDS_NATIVE_FIX mark that skips the native variant), keeping only the native variant;
  4. this tripwire, tests/test_tripwire.py::test_locked_automodel_still_drops_cpu_half."""


def test_locked_automodel_still_drops_cpu_half() -> None:
    version = automodel_patch.installed_version()
    assert automodel_patch.is_supported(), (
        f"nemo-automodel {version} has no _nccl_backend_override(axes, *, device_type, timeout_minutes): "
        "the tripwire cannot probe it; re-check the keep-cpu-backend workaround against this release by hand"
    )
    assert not automodel_patch.is_applied(), "the run-time patch is applied; the tripwire must see the genuine function"
    assert automodel_patch.keeps_cpu_backend() is False, REMOVAL_STEPS.format(version=version)
