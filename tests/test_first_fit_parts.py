"""first_fit_parts: first-fit decreasing of many parts at once, against one part at a time.

Each part's bins must be exactly what the one-part first fit gives on the part's items in
first-fit-decreasing order (the planner swaps one for the other), and that in turn what a
plain scan of the bins (leftmost bin with room, no tree) gives.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.planning import _packing
from seqbalance.planning._packing import first_fit, first_fit_parts


def _scan_first_fit(order: list[int], t: np.ndarray, cap: int, nbins: int) -> list | None:
    room = [cap] * nbins
    bins: list[list[int]] = [[] for _ in range(nbins)]
    for i in order:
        for b in range(nbins):
            if room[b] >= t[i]:
                room[b] -= int(t[i])
                bins[b].append(i)
                break
        else:
            return None
    return bins


@st.composite
def _cases(draw: st.DrawFn) -> tuple:
    cap = draw(st.integers(1, 60))
    n = draw(st.integers(0, 40))
    t = np.array(draw(st.lists(st.integers(0, cap), min_size=n, max_size=n)), dtype=np.int64)
    # few distinct costs: ties in tokens and cost leave the order to the position
    w = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0]), min_size=n, max_size=n)))
    labels = np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), dtype=np.int64)
    perm = np.array(draw(st.permutations(list(range(n)))), dtype=np.int64)
    parts = [perm[labels[perm] == k] for k in range(5)]
    nbins = draw(st.integers(1, 6))
    return parts, w, t, nbins, cap


def _all_at_once(parts: list, w: np.ndarray, t: np.ndarray, nbins: int, cap: int) -> list:
    """first_fit_parts with every part count on the numpy path (few parts take the
    one-walk-per-part path by default)."""
    saved = _packing._PARTS_AT_ONCE
    _packing._PARTS_AT_ONCE = 1
    try:
        return first_fit_parts(parts, w, t, nbins, cap)
    finally:
        _packing._PARTS_AT_ONCE = saved


@settings(max_examples=300, deadline=None)
@given(case=_cases())
def test_each_part_packs_as_alone(case: tuple) -> None:
    parts, w, t, nbins, cap = case
    got = first_fit_parts(parts, w, t, nbins, cap)
    assert len(got) == len(parts)
    assert _all_at_once(parts, w, t, nbins, cap) == got  # both paths: the same bins
    for part, bins in zip(parts, got):
        wp, tp = w[part], t[part]
        order = np.lexsort((np.arange(part.size), -wp, -tp)).tolist()
        assert bins == first_fit(order, tp, cap, nbins)
        assert bins == _scan_first_fit(order, tp, cap, nbins)


def test_no_parts_and_empty_parts() -> None:
    t = np.array([3, 4], dtype=np.int64)
    w = t.astype(float)
    assert first_fit_parts([], w, t, 2, 5) == []
    empty = np.array([], dtype=np.int64)
    assert first_fit_parts([empty, np.array([1, 0])], w, t, 2, 5) == [[[], []], [[0], [1]]]
    assert first_fit_parts([np.array([0, 1])], w, t, 1, 5) == [None]  # 7 tokens, one bin of 5
    for parts in ([], [empty, np.array([1, 0])], [np.array([0, 1])]):
        assert _all_at_once(parts, w, t, 2, 5) == first_fit_parts(parts, w, t, 2, 5)
