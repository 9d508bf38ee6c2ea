"""Shared input checks: every bad input is a ValueError that names the problem."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance._validate import as_groups, as_lengths, as_weights


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([True, False], "must hold numbers"),
        ([1e20], "too large for a token count"),
        ([2**40], "too large"),
        ((x for x in [1, 2]), "wrap iterators and generators"),
        ("123", "got a string"),
        ([[1, 2]], "must be 1-D"),
        ([1, -2], r"lengths\[1\] = -2 is negative"),
        ([1.0, float("inf")], "not a whole number"),
    ],
)
def test_bad_lengths(values, match):
    with pytest.raises(ValueError, match=match):
        as_lengths(values)


def test_lengths_widened_to_int64():
    out = as_lengths(np.array([2**31 - 1, 7], dtype=np.int32))
    assert out.dtype == np.int64 and int(out.sum()) == 2**31 + 6  # no int32 wrap-around
    assert as_lengths(np.array([3, 4], dtype=np.uint64)).tolist() == [3, 4]


def test_weights():
    assert as_weights([1, 2.5]).dtype == np.float64
    with pytest.raises(ValueError, match=r"weights\[0\] = nan is not finite"):
        as_weights([float("nan")])


def test_groups_numbered_by_first_appearance():
    assert as_groups(["b", "a", "b", "c"], 4).tolist() == [0, 1, 0, 2]
    assert as_groups([7, 3, 7], 3).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="mixes strings and numbers"):
        as_groups([1, "1"], 2)
    with pytest.raises(ValueError, match="groups has 1 entries but there are 2 items"):
        as_groups([1], 2)
