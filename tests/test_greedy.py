"""LPT with count limits: the batched implementation against a plain one-at-a-time rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.partitioning import _greedy
from seqbalance.partitioning._greedy import lpt_labels


def reference_lpt(w: np.ndarray, k: int, size: str) -> np.ndarray:
    """Units heaviest first (ties by index); each to the lightest part that may take it
    (ties by part number). O(m k), written from the rule, not from the implementation."""
    m = len(w)
    c, extra = m // k, (m % k if size == "balanced" else 0)
    loads, counts = [0.0] * k, [0] * k
    labels = np.empty(m, dtype=np.int64)
    for i in sorted(range(m), key=lambda i: (-w[i], i)):
        best = None
        for p in range(k):
            if size != "free" and (counts[p] > c or (counts[p] == c and extra == 0)):
                continue
            if best is None or loads[p] < loads[best]:
                best = p
        assert best is not None
        if size != "free" and counts[best] == c:
            extra -= 1
        loads[best] += float(w[i])
        counts[best] += 1
        labels[i] = best
    return labels


BATCHING = {"all-batched": (1, 10**9), "mixed": (2, 4), "default": (128, 16)}


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    k=st.integers(1, 40),
    size=st.sampled_from(["free", "equal", "balanced"]),
    kind=st.sampled_from(["small-int", "float", "zeros"]),
)
def test_lpt_matches_one_at_a_time(data: st.DataObject, k: int, size: str, kind: str) -> None:
    m = data.draw(st.integers(k if size == "equal" else 1, 160))
    if size == "equal":
        m -= m % k
    if kind == "small-int":  # many ties between units and between part loads
        w = np.array(data.draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), float)
    elif kind == "float":
        w = np.array(data.draw(st.lists(st.floats(0, 1e6), min_size=m, max_size=m)))
    else:
        w = np.zeros(m)
    want = reference_lpt(w, k, size)
    saved = _greedy.MIN_BATCH, _greedy.BATCH_FRACTION
    try:
        for how in BATCHING.values():  # from every unit in batches to the default mix
            _greedy.MIN_BATCH, _greedy.BATCH_FRACTION = how
            assert np.array_equal(lpt_labels(w, k, size), want), how
    finally:
        _greedy.MIN_BATCH, _greedy.BATCH_FRACTION = saved


@pytest.mark.parametrize("size", ["free", "equal", "balanced"])
def test_lpt_many_parts_matches_reference(size: str) -> None:
    # Enough parts that the default settings place most units in batches.
    k, m = 512, 512 * 4 + (100 if size == "balanced" else 0)
    w = workloads.lengths("sft-chat", m, 3).astype(np.float64)
    assert np.array_equal(lpt_labels(w, k, size), reference_lpt(w, k, size))


# ---- the folded start ----------------------------------------------------------------


def test_folded_labels_known_values():
    # Sorted 9..1 in rows of 2: [9, 8] [7, 6] to parts 0, 1; the lighter rows [5, 4]
    # [3, 2] [1] in reverse (5 -> 1, 4 -> 0, 3 -> 1, 2 -> 0, the short row's 1 -> 0):
    # part 0 = 9 + 7 + 4 + 2 + 1 = 23, part 1 = 8 + 6 + 5 + 3 = 22.
    w = np.arange(9, 0, -1, dtype=np.float64)
    assert _greedy.folded_labels(w, 2).tolist() == [0, 1, 0, 1, 1, 0, 1, 0, 0]
    # Ties keep the input order, and the input order does not matter otherwise.
    perm = np.array([4, 0, 8, 2, 6, 1, 7, 3, 5])
    assert _greedy.folded_labels(w[perm], 2).tolist() == _greedy.folded_labels(w, 2)[perm].tolist()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=300), st.integers(1, 40))
def test_folded_labels_counts_meet_the_size_rules(xs, k):
    w = np.asarray(xs, dtype=np.float64)
    labels = _greedy.folded_labels(w, k)
    counts = np.bincount(labels, minlength=k)
    assert labels.min() >= 0 and labels.max() < k and counts.sum() == len(xs)
    # m // k each, one more on parts 0 .. m % k - 1 ("balanced"; "equal" when k | m).
    assert counts.tolist() == [len(xs) // k + (p < len(xs) % k) for p in range(k)]
