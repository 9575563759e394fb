"""The positive-integer check (:mod:`nemo_rl_shim.config.integers`): an ``int`` of at least 1, never a ``bool``."""

from __future__ import annotations

import pytest

from nemo_rl_shim.config.integers import is_positive_int, positive_int

pytestmark = [pytest.mark.every_lane]


@pytest.mark.parametrize("value", [1, 2, 2000, 10**30])
def test_an_int_of_at_least_one_is_a_positive_integer(value: int) -> None:
    assert is_positive_int(value) and positive_int(value, "x.size") == value


@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, "1", None, [1]])
def test_zero_negatives_bools_floats_and_text_are_not(value: object) -> None:
    """``True`` is an ``int`` in Python: YAML's ``yes`` must not read as one entry."""
    assert not is_positive_int(value)
    with pytest.raises(ValueError, match=rf"^x\.size must be a positive integer, got {value!r}$".replace("[", r"\[")):
        positive_int(value, "x.size")
