"""Exact two-way partitioning (meet in the middle) against exhaustive search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.partitioning._two_way import TWO_WAY_MAX_UNITS, two_way_labels


def brute_force(w: np.ndarray, size: str) -> float:
    """The lightest heavier part over all 2**m splits that obey ``size``."""
    m, best = w.size, np.inf
    for bits in itertools.product((0, 1), repeat=m):
        c = sum(bits)
        if size == "equal" and c != m - c:
            continue
        if size == "balanced" and abs(2 * c - m) > 1:
            continue
        s = float(np.dot(bits, w))
        best = min(best, max(s, float(w.sum()) - s))
    return best


def heavier(w: np.ndarray, labels: np.ndarray) -> float:
    return float(np.bincount(labels, weights=w, minlength=2).max())


@settings(max_examples=120, deadline=None)
@given(
    w=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=12),
    size=st.sampled_from(["free", "equal", "balanced"]),
)
def test_matches_exhaustive_search(w, size):
    w = np.array(w)
    if size == "equal" and w.size % 2:
        size = "balanced"
    labels = two_way_labels(w, size)
    assert labels.shape == w.shape and set(labels.tolist()) <= {0, 1}
    c = int((labels == 0).sum())
    if size == "equal":
        assert c == w.size // 2
    if size == "balanced":
        assert abs(2 * c - w.size) <= 1
    assert heavier(w, labels) <= brute_force(w, size) * (1 + 1e-12) + 1e-12


def test_known_split():
    # 8, 7, 6, 5, 4 (total 30): {8, 7} vs {6, 5, 4} is a perfect 15/15 split (free and
    # balanced); 2 + 3 counts are the only balanced ones for 5 items, and it is one.
    w = np.array([8.0, 7.0, 6.0, 5.0, 4.0])
    for size in ("free", "balanced"):
        assert heavier(w, two_way_labels(w, size)) == 15.0
    # equal counts on [10, 1, 1, 1]: {10, 1} vs {1, 1} -> 11
    w = np.array([10.0, 1, 1, 1])
    assert heavier(w, two_way_labels(w, "equal")) == 11


@pytest.mark.slow
@pytest.mark.parametrize("size", ["free", "equal", "balanced"])
@pytest.mark.parametrize("seed", range(5))
def test_partition_proves_two_way_optimum(size, seed):
    """Lognormal weights at n = 24 and 30: the exact search alone used to run out of nodes."""
    rng = np.random.default_rng(seed)
    for n in (24, 30):
        w = rng.lognormal(0, 1, n)
        p = sb.partition(w, 2, size=size)
        assert p.optimal
        # Independent check on the first 16 weights only (exhaustive is 2**16 splits).
        w16 = w[:16]
        q = sb.partition(w16, 2, size=size)
        assert q.optimal and q.max_load <= brute_force(w16, size) * (1 + 1e-12)


def test_too_many_units_refused():
    with pytest.raises(ValueError, match="at most"):
        two_way_labels(np.ones(TWO_WAY_MAX_UNITS + 1), "free")


def test_deterministic():
    w = np.random.default_rng(7).lognormal(0, 1, 30)
    assert two_way_labels(w, "free").tolist() == two_way_labels(w.copy(), "free").tolist()
