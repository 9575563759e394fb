"""A layer that cannot read the default group falls back to Automodel's answer and warns once per place and reason.

Pure Python: :func:`automodel_patch._fallback.or_genuine` is called with a layer that raises (as a
c10d query does where no default group exists) and a genuine function that answers.
"""

from __future__ import annotations

import warnings

import pytest

from automodel_patch import _fallback

__all__: list[str] = []


def _fallback_warnings(*reasons: str) -> list[str]:
    """The warnings of one ``or_genuine`` call per reason, all at one place; each call returns the genuine answer."""

    def layer_failing_with(reason: str):
        def layered() -> str:
            raise RuntimeError(reason)

        return layered

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for reason in reasons:
            assert _fallback.or_genuine("cpu-mesh-timeout", "f()", layer_failing_with(reason), lambda: "genuine") == (
                "genuine"
            )
    return [str(w.message) for w in caught if issubclass(w.category, _fallback.WorkaroundFallbackWarning)]


def test_two_reasons_at_one_place_give_two_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fallback, "_warned", set())
    found = _fallback_warnings("no default group", "the backend string is empty", "no default group")
    assert len(found) == 2, found
    assert found[0].endswith("RuntimeError: no default group"), found[0]
    assert found[1].endswith("RuntimeError: the backend string is empty"), found[1]
