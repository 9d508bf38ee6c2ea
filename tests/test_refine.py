"""Refinement passes: the stopping rules for a trailing pass (``beat``) and basic contracts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partitioning import _refine
from seqbalance.partitioning._greedy import lpt_labels
from seqbalance.partitioning._kk import kk_labels
from seqbalance.partitioning._refine import refine_labels
from seqbalance.partitioning.bounds import bound_of_units

SIZES = ("free", "equal", "balanced")


def _top(w: np.ndarray, lab: np.ndarray, k: int) -> float:
    return float(np.bincount(lab, weights=w, minlength=k).max())


def _case(weights: list[int], k: int, size: str, start: str) -> tuple[np.ndarray, np.ndarray]:
    if size == "equal":
        weights = weights[: len(weights) - len(weights) % k] or [1] * k
    w = np.asarray(weights, dtype=np.float64)
    lab = kk_labels(w, k) if start == "kk" else lpt_labels(w, k, size)
    return w, lab


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.integers(1, 500), min_size=2, max_size=120),
    st.integers(2, 16),
    st.sampled_from(SIZES),
    st.sampled_from(["kk", "greedy"]),
    st.floats(0.0, 1.0),
    st.integers(1, 40),
)
def test_count_rule_never_drops_a_pass_that_would_reach_beat(
    weights: list[int], k: int, size: str, start: str, where: float, steps: int
) -> None:
    """With only the exact rule, a pass that ends at or below ``beat`` runs unchanged."""
    w, lab = _case(weights, k, size, start)
    plain = refine_labels(w, lab, k, size, max_steps=steps)
    lo, hi = _top(w, plain, k), _top(w, lab, k)
    beat = lo + where * (hi - lo)  # anywhere between where the pass ends and starts
    saved = _refine.TRAIL_FACTOR
    try:
        _refine.TRAIL_FACTOR = float("inf")
        cut = refine_labels(w, lab, k, size, max_steps=steps, beat=beat)
    finally:
        _refine.TRAIL_FACTOR = saved
    if lo <= beat:
        assert np.array_equal(cut, plain)
    assert _top(w, cut, k) <= hi


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=2, max_size=120),
    st.integers(2, 16),
    st.sampled_from(SIZES),
    st.sampled_from(["kk", "greedy"]),
    st.floats(0.0, 1.5),
)
def test_trailing_pass_keeps_contracts(
    weights: list[int], k: int, size: str, start: str, where: float
) -> None:
    """Whatever stops it, a pass keeps the size rule and never makes the top heavier."""
    w, lab = _case(weights, k, size, start)
    beat = bound_of_units(w, k, size) * where
    out = refine_labels(w, lab, k, size, beat=beat)
    assert out.shape == lab.shape
    assert set(out.tolist()) <= set(range(k))
    assert _top(w, out, k) <= _top(w, lab, k)
    if size != "free":
        counts = np.bincount(out, minlength=k)
        before = np.bincount(lab, minlength=k)
        assert sorted(counts.tolist()) == sorted(before.tolist())


def test_hopeless_pass_stops_before_any_step() -> None:
    # Three parts far above ``beat`` and one step allowed: the pass returns its input.
    w = np.array([4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 1.0])
    lab = np.array([0, 0, 1, 1, 2, 2, 3])
    out = refine_labels(w, lab, 4, "free", max_steps=1, beat=5.0)
    assert np.array_equal(out, lab)
    # Without a rival to beat, it takes its one step (a 4 moves to part 3).
    assert not np.array_equal(refine_labels(w, lab, 4, "free", max_steps=1), lab)


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(0, 60), min_size=2, max_size=90),
    k=st.integers(2, 12),
    size=st.sampled_from(["free", "balanced", "equal"]),
    scale=st.sampled_from([1.0, 0.37, 1e9]),
)
def test_small_parts_python_path_makes_the_numpy_paths_choices(weights, k, size, scale):
    # Small part pairs are compared in plain Python (_best_op_small); it must pick the same
    # move or swap as the vectorised path, ties included (integer weights make many), so
    # a pass ends in the same labels either way.
    from unittest import mock

    w = np.asarray(weights, dtype=np.float64) * scale
    k = min(k, w.size)
    if size == "equal":
        w = w[: w.size - w.size % k]
    start = lpt_labels(w, k, size)
    with mock.patch.object(_refine, "_SMALL_PAIR", -1):
        vectorised = refine_labels(w, start, k, size)
    with mock.patch.object(_refine, "_SMALL_PAIR", 1 << 30):
        python = refine_labels(w, start, k, size)
    assert python.tolist() == vectorised.tolist()


def _steepest_reference(w: np.ndarray, lab: np.ndarray, k: int) -> np.ndarray:
    """steepest_swaps from its contract, pair by pair: the swap (a in the heaviest part,
    b elsewhere, w_a > w_b) leaving max(L_h - d, L_p + d) lowest, first a then first b on
    ties, while that is below L_h; loads kept up to date step by step."""
    lab = lab.copy()
    loads = np.bincount(lab, weights=w, minlength=k).astype(np.float64)
    for _ in range(100 * k):
        h = int(np.argmax(loads))
        top, pick = loads[h], None
        best = top
        for a in np.flatnonzero(lab == h):
            for b in np.flatnonzero(lab != h):
                d = w[a] - w[b]
                if d > 0 and max(top - d, loads[lab[b]] + d) < best:
                    best, pick = max(top - d, loads[lab[b]] + d), (a, b)
        if pick is None:
            break
        a, b = pick
        p, d = lab[b], w[a] - w[b]
        loads[h] -= d
        loads[p] += d
        lab[a], lab[b] = p, h
    return lab


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=3, max_size=40),
    st.integers(2, 6),
    st.sampled_from(["ints", "floats", "huge"]),
    st.sampled_from(["kk", "greedy"]),
)
def test_steepest_swaps_matches_the_pair_by_pair_definition(weights, k, scale, start):
    """The binary-search step (forced here on small inputs) makes exactly the swaps of the
    pair-by-pair definition, ties included; also on floats near 2**60, where rounding
    moves the turn and the step must fall back to its scan."""
    w = np.asarray(weights, dtype=np.float64)
    if scale == "floats":
        w = w / 7.0 + 0.1
    elif scale == "huge":
        w = 2.0**60 + w * 64.0  # spacing 256 there: sums and halves round
    lab = kk_labels(w, k) if start == "kk" else lpt_labels(w, k, "balanced")
    answered: list[bool] = []
    fast = _refine._steepest_pair

    def counted(*args):
        pair = fast(*args)
        answered.append(pair is not None)
        return pair

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_refine, "STEEPEST_SCAN_PAIRS", -1)
        mp.setattr(_refine, "_steepest_pair", counted)
        got = _refine.steepest_swaps(w, lab, k)
    assert np.array_equal(got, _steepest_reference(w, lab, k))
    if scale == "ints":  # exact arithmetic: the binary searches answer every step
        assert all(answered)
    assert np.array_equal(np.bincount(got, minlength=k), np.bincount(lab, minlength=k))
