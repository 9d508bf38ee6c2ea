"""lower_bound: hand-derived values, validity against brute-forced optima, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partitioning import partition
from seqbalance.partitioning.bounds import lower_bound


def brute_optimum(units: list[float], k: int, size: str) -> float:
    """Smallest possible heaviest part over every assignment of units to k parts."""
    m = len(units)
    if m == 0:
        return 0.0
    best = np.inf
    for assign in itertools.product(range(k), repeat=m):
        counts = np.bincount(assign, minlength=k)
        if size == "equal" and (counts != m // k).any():
            continue
        if size == "balanced" and counts.max() - counts.min() > 1:
            continue
        best = min(best, float(np.bincount(assign, weights=units, minlength=k).max()))
    return best


@pytest.mark.parametrize(
    ("weights", "k", "size", "expected"),
    [
        ([5, 4, 3, 3, 3], 2, "free", 9.0),  # sum / k
        ([9, 1, 1], 2, "free", 9.0),  # largest item
        ([5, 5, 5], 2, "free", 10.0),  # pigeonhole: two of the three 5s share a part
        ([10, 1, 1, 1], 2, "equal", 11.0),  # largest + (n/k - 1) smallest others
        ([1] * 9, 2, "balanced", 5.0),  # one part holds 5 of 9 unit items
        ([6, 1, 1, 1, 1, 1], 3, "equal", 7.0),
        ([], 3, "free", 0.0),
        ([0, 0, 0], 2, "balanced", 0.0),
        ([3, 1], 5, "free", 3.0),  # fewer items than parts
        # The five units alone: with both 11s alone the rest make 18, else an 11 shares
        # a part with at least 4: 15 (sum / k gives 14, the two of the top four 14).
        ([11, 11, 8, 6, 4], 3, "free", 15.0),
        ([11, 11, 8, 6, 4, 0, 0, 0], 3, "free", 15.0),
    ],
)
def test_hand_values(weights: list[int], k: int, size: str, expected: float) -> None:
    assert lower_bound(weights, k, size=size) == expected


def test_groups_are_units() -> None:
    # group weights 2, 2, 4 -> max(8/2, 4) = 4; as plain items max(8/2, 4) = 4 too,
    # but with size="equal" over 2 parts the 3 groups cannot be split evenly.
    assert lower_bound([1, 1, 1, 1, 4], 2, groups=[0, 0, 1, 1, 2]) == 4.0
    # two groups of weight 5 and 1 on 2 parts: groups never split -> 5.
    assert lower_bound([2, 3, 1], 2, groups=["a", "a", "b"]) == 5.0
    with pytest.raises(ValueError, match="groups"):
        lower_bound([1, 1, 1, 1, 4], 2, size="equal", groups=[0, 0, 1, 1, 2])


def test_float_rounding_keeps_bound_valid() -> None:
    w = [0.1, 0.2, 0.3]
    b = lower_bound(w, 1)
    assert b <= 0.1 + 0.2 + 0.3 and b <= 0.3 + 0.2 + 0.1
    assert partition(w, 1).max_load >= b


def test_huge_weights_no_overflow() -> None:
    w = np.array([10**15] * 1000, dtype=np.int64)  # total 1e18
    assert lower_bound(w, 1000) == 1e15
    # Above 2**53 sums round, so the bound keeps a documented allowance (~1e-12 relative).
    b = lower_bound(w, 1)
    assert 1e18 * (1 - 1e-12) <= b <= 1e18
    p = partition(w, 3, size="balanced")
    assert sorted(len(x) for x in p) == [333, 333, 334]
    assert p.max_load == 334 * 1e15


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 50), max_size=7),
    st.integers(1, 3),
    st.sampled_from(["free", "equal", "balanced"]),
)
def test_bound_below_brute_force_optimum(weights: list[int], k: int, size: str) -> None:
    if size == "equal" and len(weights) % k:
        with pytest.raises(ValueError, match="balanced"):
            lower_bound(weights, k, size=size)
        return
    opt = brute_optimum([float(x) for x in weights], k, size)
    b = lower_bound(weights, k, size=size)
    assert b <= opt
    assert b >= max([sum(weights) / k, *weights], default=0.0)  # never weaker than the basics


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), max_size=8),
    st.integers(1, 3),
    st.sampled_from(["free", "equal", "balanced"]),
)
def test_grouped_bound_below_brute_force(pairs: list[tuple[int, int]], k: int, size: str) -> None:
    weights = [p[0] for p in pairs]
    groups = [p[1] for p in pairs]
    units: dict[int, float] = {}
    for x, g in pairs:  # insertion order: first appearance
        units[g] = units.get(g, 0.0) + x
    if size == "equal" and len(units) % k:
        with pytest.raises(ValueError):
            lower_bound(weights, k, size=size, groups=groups)
        return
    assert lower_bound(weights, k, size=size, groups=groups) <= brute_optimum(
        list(units.values()), k, size
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": [1, 2], "k": 0}, "k must be >= 1"),
        ({"weights": [1, 2], "k": 1.5}, "k must be a positive integer"),
        ({"weights": [1, -2], "k": 2}, r"weights\[1\]"),
        ({"weights": [1, float("nan")], "k": 2}, "not finite"),
        ({"weights": [[1, 2]], "k": 2}, "1-D"),
        ({"weights": [1, 2], "k": 2, "size": "even"}, "size must be one of"),
        ({"weights": [1, 2, 3], "k": 2, "size": "equal"}, "balanced"),
        ({"weights": [1, 2, 3], "k": 2, "groups": [0, 1]}, "groups has 2 entries"),
    ],
)
def test_errors(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=match):
        lower_bound(**kwargs)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=3, max_size=7),
    st.integers(2, 3),
    st.sampled_from(["ints", "sevenths", "halves"]),
)
def test_heaviest_units_term_stays_below_the_optimum(weights, k, scale) -> None:
    """Term 4 (the optimum of the heaviest units alone) on integer, non-exact float and
    large half-integer weights (exact sums, but not integers: the search's tolerance
    applies): never above the brute-forced optimum, never below the other terms."""
    from seqbalance.partitioning.bounds import bound_of_units

    w = np.asarray(weights, dtype=np.float64)
    w = {"ints": w, "sevenths": w / 7.0, "halves": 2.0**45 + w / 2.0}[scale]
    w = np.sort(w)[::-1]
    b = bound_of_units(w, k, "free")
    assert bound_of_units(w, k, "free", heaviest=False) <= b <= brute_optimum(w.tolist(), k,
                                                                              "free")


def test_heaviest_units_term_ignores_unproven_searches(monkeypatch) -> None:
    """Only a proven optimum of the heaviest units is a bound: with the search made to
    return longest-first unproven (3 | 3, then 2s: 7 | 5 for [3, 3, 2, 2, 2]; optimum 6),
    the bound stays 6."""
    from seqbalance.partitioning import kway
    from seqbalance.partitioning._greedy import lpt_labels

    monkeypatch.setattr(kway, "_solve", lambda units, k, size, *a, **kw: (
        lpt_labels(units, k, size), "greedy", False))  # fmt: skip
    assert lower_bound([3, 3, 2, 2, 2], 2) == 6.0 == brute_optimum([3, 3, 2, 2, 2], 2, "free")
