"""How a missing resource ends a test: a skip naming what is missing, or under CI a failure.

A test that needs something this machine may lack (the package index, a private network
namespace for Ray) calls :func:`unavailable`: a developer offline gets a skip naming what
is missing; CI (``NEMO_RL_SHIM_CI=1``, set by ``.ci/run``) gets a failure, so a green CI
run has really run every test.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["IN_CI", "unavailable"]

IN_CI = os.environ.get("NEMO_RL_SHIM_CI") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it under CI."""
    if IN_CI:
        pytest.fail(f"{reason} (NEMO_RL_SHIM_CI=1: CI must run this test, not skip it)", pytrace=False)
    pytest.skip(reason)
