"""Shared fixtures: released Automodel sources, and skip marks with the numbers found."""

from __future__ import annotations

import pytest

from tests.releases import ReleaseUnavailable, release_env


@pytest.fixture(scope="session")
def release_environment():
    """``release_environment(version)`` -> env for a spawned process, or a skip naming why it is unavailable."""

    def get(version: str) -> dict[str, str]:
        try:
            return release_env(version)
        except ReleaseUnavailable as e:
            pytest.skip(f"nemo-automodel {version} unavailable: {e}")

    return get
