"""Tripwires: each fails on the day the locked nemo-automodel no longer needs its workaround, and says what to delete.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): test_keep_cpu_backend_is_still_needed goes with it.
# AUTOMODEL-WORKAROUND(cpu-mesh-timeout): test_cpu_mesh_timeout_is_still_needed goes with it.

Each calls the genuine Automodel code through the workaround's own probe (the layers of
this process, if any, are looked past). It passes while the bug exists. When the probe
finds the bug gone, it fails with the workaround's removal steps, which name every place
carrying its tag. When the probe cannot judge the release (or finds nothing to probe), it
fails with "cannot probe this release; check by hand" and the reason.
"""

from __future__ import annotations

import pytest

import automodel_patch
from automodel_patch import Verdict

__all__: list[str] = []

pytestmark = pytest.mark.every_lane

CANNOT_PROBE = "cannot probe this release; check by hand"


def _still_needed(slug: str) -> None:
    workaround = automodel_patch.workaround(slug)
    detection = automodel_patch.detect(slug)
    version = automodel_patch.installed_version()
    if detection.verdict in (Verdict.UNKNOWN, Verdict.ABSENT):
        pytest.fail(
            f"{CANNOT_PROBE}: the {slug} probe says {detection.verdict.value} for nemo-automodel {version}: "
            f"{detection.reason}. If by hand it meets the removal condition, follow these steps:\n"
            + workaround.removal_steps(version),
            pytrace=False,
        )
    assert detection.verdict is Verdict.NEEDED, workaround.removal_steps(version)


def test_keep_cpu_backend_is_still_needed() -> None:
    _still_needed("keep-cpu-backend")


def test_cpu_mesh_timeout_is_still_needed() -> None:
    _still_needed("cpu-mesh-timeout")
