"""balance_stats: hand-computed values and every error path."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.partitioning import balance_stats, partition


def test_hand_values() -> None:
    # loads 4 and 2: mean 3, spread 2, imbalance 4/3 - 1, cv = std([4, 2]) / 3 = 1/3;
    # free bound = max(6/2, 4) = 4, so the gap is 0.
    s = balance_stats([4, 1, 1], [[0], [1, 2]])
    assert s["max"] == 4.0 and s["min"] == 2.0 and s["mean"] == 3.0 and s["spread"] == 2.0
    assert s["imbalance"] == pytest.approx(1 / 3)
    assert s["cv"] == pytest.approx(1 / 3)
    assert s["lower_bound"] == 4.0 and s["gap"] == 0.0
    assert s["counts"] == [1, 2]
    assert set(s) == {
        "max", "min", "mean", "spread", "imbalance", "cv", "gap", "counts", "lower_bound"
    }


def test_gap_against_bound() -> None:
    # loads 7 | 5, bound max(12/2, 4) = 6 -> gap 7/6 - 1
    s = balance_stats([4, 3, 3, 2], [[0, 2], [1, 3]])
    assert s["gap"] == pytest.approx(1 / 6)
    s = balance_stats([4, 3, 3, 2], [[0, 2], [1, 3]], bound=7.0)
    assert s["gap"] == 0.0 and s["lower_bound"] == 7.0


def test_zero_and_empty_parts() -> None:
    s = balance_stats([0, 0], [[0, 1], []])
    assert s["max"] == 0.0 and s["imbalance"] == 0.0 and s["cv"] == 0.0 and s["gap"] == 0.0
    s = balance_stats([], [[], []])
    assert s["counts"] == [0, 0] and s["max"] == 0.0


def test_matches_partition_stats() -> None:
    w = np.arange(1, 101, dtype=np.int64) ** 2
    p = partition(w, 7)
    a, b = balance_stats(w, p), p.stats()
    assert a["counts"] == b["counts"]
    for key in ("max", "min", "mean", "spread", "imbalance", "cv", "gap", "lower_bound"):
        assert a[key] == pytest.approx(b[key], rel=1e-12)


def test_accepts_numpy_parts() -> None:
    s = balance_stats([1, 2, 3], [np.array([2]), np.array([0, 1], dtype=np.int32)])
    assert s["counts"] == [1, 2] and s["max"] == 3.0
    # Sets, dict views and iterators of indices are parts too (a set raised TypeError
    # for a while: numpy cannot build an array from one).
    d = {0: "a", 1: "b"}
    for parts in ([{0, 1}, {2}], [d.keys(), iter([2])], [range(2), (i for i in [2])]):
        s = balance_stats([1, 2, 3], parts)
        assert s["counts"] == [2, 1] and s["max"] == 3.0


@pytest.mark.parametrize(
    ("weights", "parts", "match"),
    [
        ([1, 2, 3], [[0, 1], [1, 2]], "index 1 appears more than once"),
        ([1, 2, 3], [[0, 0, 1], [2]], "index 0 appears more than once"),
        ([1, 2, 3], [[0, 1], [3, 2]], "parts\\[1\\] holds index 3, outside 0..2"),
        ([1, 2, 3], [[0, -1], [2, 1]], "index -1"),
        ([1, 2, 3], [[0], [2]], "index 1 is in no part"),
        ([1, 2, 3], [], "at least one part"),
        ([1, 2, 3], [[0, 1.5], [2]], "integer item indices"),
        ([1, 2, 3], ["012"], "flat list of integer item indices"),
        ([1, -2, 3], [[0, 1, 2]], "negative"),
        # A flag is not an index, even where numpy would read True as 1.
        ([1, 2, 3], [[True, 0], [2]], "integer item indices"),
        ([1, 2, 3], [np.array([False, True]), [2]], "integer item indices"),
        ([1, 2, 3], [np.array([True, 0], dtype=object), [2]], "integer item indices"),
        ([1, 2, 3], [0, 1, 2], "integer item indices"),  # a part is a list, not an index
        ([1, 2, 3], [np.int64(0), [1, 2]], "integer item indices"),
    ],
)
def test_errors(weights: list, parts: list, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=match):
        balance_stats(weights, parts)


def test_parts_may_be_any_container_read_once():
    parts = [(i for i in (0, 1)), range(2, 3), np.array([3, 4], dtype=np.uint8), []]
    assert balance_stats([1, 2, 3, 4, 5], parts)["counts"] == [2, 1, 2, 0]


def test_parts_and_bound_are_checked():
    with pytest.raises(ValueError, match="parts must be a list of index lists"):
        balance_stats([1.0, 2.0], 3)
    with pytest.raises(ValueError, match="bound must be a finite number >= 0"):
        balance_stats([1.0, 2.0], [[0, 1]], bound=-1.0)
    with pytest.raises(ValueError, match="bound must be a finite number >= 0"):
        balance_stats([1.0, 2.0], [[0, 1]], bound=True)
