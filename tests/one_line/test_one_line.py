"""``format_ranks`` and ``first_line``: the one home of each (issue 21)."""

from __future__ import annotations

import pytest

from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.rank_ranges import format_ranks, rank_runs


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 3, 5], "0-3, 5"),
        ([5, 3, 1, 0, 2, 3], "0-3, 5"),
        ([0, 2], "0, 2"),
        (list(range(1024)), "0-1023"),
        (list(range(0, 8192, 8)), "0, 8, ..., 8184 (1024 ranks)"),
        # exactly DEFAULT_LIMIT (8) parts are printed whole, strided or not; the ninth part shortens the line
        ([0, 2, 5, 7, 10, 12, 15, 17], "0, 2, 5, 7, 10, 12, 15, 17"),
        (list(range(0, 64, 8)), "0, 8, 16, 24, 32, 40, 48, 56"),
        ([0, 2, 5, 7, 10, 12, 15, 17, 20], "0, 2, 5, 7, 10, 12, 15, ..., 20 (9 ranks)"),
        (
            [*range(0, 2), *range(4, 6), *range(8, 10), *range(12, 14), *range(16, 18), 20, 22, 24, 30],
            "0-1, 4-5, 8-9, 12-13, 16-17, 20, 22, ..., 30 (14 ranks)",
        ),
    ],
)
def test_format_ranks(ranks: list[int], expected: str) -> None:
    assert format_ranks(ranks) == expected


def test_format_ranks_limit_and_runs() -> None:
    assert format_ranks([0, 2, 4, 7], limit=2) == "0, ..., 7 (4 ranks)"
    assert rank_runs([4, 0, 1, 2, 9]) == [(0, 2), (4, 4), (9, 9)]
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        format_ranks([1], limit=0)


def test_first_line() -> None:
    assert first_line(ImportError("cannot import name 'X'\nmore")) == "ImportError: cannot import name 'X'"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(ValueError("  bad\n"), with_type=False) == "bad"
    assert first_line(KeyError(), with_type=False) == "KeyError"
