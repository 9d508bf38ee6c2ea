"""contiguous_partition and AReaL's contiguous and count-capped drop-ins built on it."""

from __future__ import annotations

import itertools
import sys
import types

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.compat import areal


def _brute(w, k, s):
    """(heaviest, -lightest) of the best cuts, by enumerating every cut set."""
    n = len(w)
    best = None
    for inner in itertools.combinations(range(1, n), k - 1):
        c = (0, *inner, n)
        if any(c[j + 1] - c[j] < s for j in range(k)):
            continue
        loads = [sum(w[c[j] : c[j + 1]]) for j in range(k)]
        key = (max(loads), -min(loads))
        best = key if best is None or key < best else best
    return best


def _all_keys(w, k, s, pre):
    """(heaviest, -lightest) of every valid cut set, its runs weighed as differences of
    the prefix sums ``pre``."""
    n = len(w)
    for inner in itertools.combinations(range(1, n), k - 1):
        c = (0, *inner, n)
        if all(c[j + 1] - c[j] >= s for j in range(k)):
            loads = [pre[c[j + 1]] - pre[c[j]] for j in range(k)]
            yield max(loads), -min(loads)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 10))
    k = draw(st.integers(1, n))
    s = draw(st.integers(1, n // k))
    whole = draw(st.booleans())
    elems = st.integers(0, 60) if whole else st.floats(0, 50, allow_nan=False)
    return draw(st.lists(elems, min_size=n, max_size=n)), k, s


@settings(max_examples=300, deadline=None)
@given(cases())
@example(case=([1.0, 13.0, 50.0, 6.884422343322074e-15], 3, 1))
@example(case=([20.0, 3.0, 19.415865678201207, 22.0, 19.415865678201207], 3, 1))
@example(case=([1e-09, 1e-09, 1e-09, 1e-09], 3, 1))
def test_heaviest_then_lightest_run_are_exact_optima(case):
    w, k, s = case
    p = sb.contiguous_partition(w, k, min_size=s)
    assert [i for run in p for i in run] == list(range(len(w)))  # in order, each once
    assert len(p) == k and all(len(run) >= s for run in p)
    heavy, neg_light = _brute(w, k, s)
    assert p.max_load == pytest.approx(heavy, rel=1e-12, abs=1e-12)
    assert p.optimal and p.gap == 0.0 and p.method == "contiguous"
    if all(float(x).is_integer() for x in w):  # exact sums: the lightest run is exact too
        assert float(p.loads.min()) == -neg_light
        return
    # Float weights are optimised on their float64 prefix sums (documented): there the
    # cuts are the lexicographic optimum, up to the last bits. In true sums, cut sets
    # whose heaviest runs differ only in the last bits may tie or swap, and their lightest
    # runs then differ by anything (hypothesis: [1, 13, 50, 6.9e-15] into 3, where
    # 64 + 6.9e-15 rounds to 64, and [20, 3, 19.4..., 22, 19.4...] into 3, three equal
    # heaviest runs in true sums).
    pre = np.concatenate(([0.0], np.cumsum(np.asarray(w, dtype=np.float64))))
    cuts = [r[0] for r in p] + [len(w)]
    ours = [pre[b] - pre[a] for a, b in zip(cuts, cuts[1:])]
    best = min(_all_keys(w, k, s, pre))
    tol = 1e-12 * max(1.0, heavy)  # the windows compare thresholds, not differences
    assert max(ours) <= best[0] + tol and min(ours) >= -best[1] - tol


def test_known_cuts():
    # 1..9 in 3 runs: 45 / 3 = 15, but no cut gives three runs of 15; the best heaviest
    # run is 17 (8 + 9), and then 1..5 = 15 and 6 + 7 = 13 (1..6 = 21 is too heavy).
    p = sb.contiguous_partition(range(1, 10), 3)
    assert [r[0] for r in p] == [0, 5, 7]
    assert p.loads.tolist() == [15.0, 13.0, 17.0]
    # A heavy item alone; the rest shared as evenly as contiguity allows.
    assert sb.contiguous_partition([1, 1, 9, 1, 1], 3).loads.tolist() == [2.0, 9.0, 2.0]


def _linear_partition_optimum(w, k):
    """Textbook O(n^2 k) dynamic programme for the lightest heaviest run (any sizes >= 1)."""
    n = len(w)
    pre = np.concatenate(([0], np.cumsum(w)))
    inf = float("inf")
    best = [[inf] * (k + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, k) + 1):
            best[i][j] = min(max(best[x][j - 1], pre[i] - pre[x]) for x in range(j - 1, i))
    return best[n][k]


@pytest.mark.parametrize("workload", ["rl-math", "long-mix"])
def test_heaviest_run_matches_the_textbook_programme_on_workloads(workload):
    w = sb.workloads.lengths(workload, 120, seed=3)
    for k in (2, 7, 16):
        assert sb.contiguous_partition(w, k).max_load == _linear_partition_optimum(w, k)


def test_min_size_zero_leaves_empty_runs_only_at_the_end():
    p = sb.contiguous_partition([3, 1, 2], 5, min_size=0)
    assert p == [[0], [1], [2], [], []]
    assert sb.contiguous_partition([], 2, min_size=0) == [[], []]
    # Enough items: no empty run, as with min_size=1.
    assert sb.contiguous_partition([3, 1, 2, 2], 2, min_size=0) == [[0, 1], [2, 3]]  # 4 and 4


def test_all_zero_weights_give_even_counts():
    assert sb.contiguous_partition([0] * 7, 3) == [[0, 1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (([1, 2], 3), r"2 items cannot be cut into 3 runs of at least 1 item each"),
        (([1, 2, 3], 2, 2), r"needs 4\); lower k or min_size"),
        (([1, -1], 1), "negative"),
        (([1.0, float("nan")], 1), "NaN|finite"),
        (([1, 2], 0), "k must be >= 1"),
        (([1, 2], 1, -1), "min_size must be >= 0"),
    ],
)
def test_bad_input_raises(args, pattern):
    w, k, *rest = args
    with pytest.raises(ValueError, match=pattern):
        sb.contiguous_partition(w, k, **({"min_size": rest[0]} if rest else {}))


def test_large_input_is_exact_and_deterministic():
    w = sb.workloads.lengths("sft-chat", 4096, seed=1)
    p = sb.contiguous_partition(w, 32, min_size=3)
    assert p == sb.contiguous_partition(w.copy(), 32, min_size=3)
    runs = [len(r) for r in p]
    assert min(runs) >= 3 and sum(runs) == 4096
    # One token less on the heaviest run cannot be had: the greedy cover with runs of at
    # most max_load - 1 tokens needs more than 32 runs.
    cap, x, count = p.max_load - 1, 0, 0
    pre = np.concatenate(([0], np.cumsum(w)))
    while x < len(w):
        x = int(np.searchsorted(pre, pre[x] + cap, side="right")) - 1
        count += 1
    assert count > 32


# ---- AReaL drop-ins ----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(cases())
def test_areal_partition_balanced_cuts(case):
    w, k, s = case
    cuts = areal.partition_balanced(np.asarray(w), k, s)
    assert cuts[0] == 0 and cuts[-1] == len(w) and len(cuts) == k + 1
    assert all(b - a >= s for a, b in zip(cuts, cuts[1:]))
    tuples = areal.min_abs_diff_partition(list(w), k, s)
    assert tuples == list(zip(cuts, cuts[1:])) == areal.partition_balanced_tuples(w, k, s)
    heavy = max(sum(w[a:b]) for a, b in tuples)
    assert heavy == pytest.approx(_brute(w, k, s)[0], rel=1e-12, abs=1e-12)


def test_areal_min_abs_diff_partition_checks_like_areal():
    with pytest.raises(ValueError, match="must be 1D"):
        areal.min_abs_diff_partition(np.ones((2, 3)), 2)
    with pytest.raises(ValueError, match=r"must have length >= k \(length 2, k=3\)"):
        areal.min_abs_diff_partition([1, 2], 3)
    with pytest.raises(ValueError, match=r"at least k \* min_size \(2 \* 2\), current length 3"):
        areal.min_abs_diff_partition([1, 2, 3], 2, 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        areal.partition_balanced([1, 2], 0)


def test_areal_contiguous_sums_beyond_areals_sentinel():
    # AReaL's programme marks unreachable states with 1e10; with run sums above that it
    # returned an empty first run here (measured with AReaL 1.0.4 and numba).
    w = [47318900000, 511822, 755167, 95046300000, 34853, 144160, 82294300000,
         94864900000, 249229, 311832]  # fmt: skip
    tuples = areal.min_abs_diff_partition(w, 3)
    assert all(b > a for a, b in tuples)
    assert max(sum(w[a:b]) for a, b in tuples) == _brute(w, 3, 1)[0]


def _greedy_batches(v, c):
    """Longest first into the lightest batch with room (a plain reading of AReaL's rule)."""
    bins = -(-len(v) // c)
    sums, sizes = [0] * bins, [0] * bins
    for i in sorted(range(len(v)), key=lambda i: -v[i]):
        j = min((j for j in range(bins) if sizes[j] < c), key=lambda j: (sums[j], j))
        sums[j] += v[i]
        sizes[j] += 1
    return sums


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.integers(1, 9))
def test_areal_reorder_to_balanced_batches(v, c):
    idx, diff = areal.reorder_to_balanced_batches(np.asarray(v), c)
    assert idx.dtype == np.int64 and sorted(idx.tolist()) == list(range(len(v)))
    greedy = _greedy_batches(v, c)
    if len(v) % c == 0:  # every batch full: consecutive runs of c are the batches
        sums = [int(np.asarray(v)[idx[j : j + c]].sum()) for j in range(0, len(v), c)]
        assert sums == sorted(sums, reverse=True)  # heaviest batch first
        assert diff == max(sums) - min(sums)
        assert max(sums) <= max(greedy)
    assert isinstance(diff, int) and diff >= 0


def test_areal_reorder_keeps_areals_batches_where_uneven_counts_are_lighter():
    # Two batches of at most 4: balanced counts (3, 2) would put 10 + 1 + 1 together;
    # AReaL's greedy gives (10) and (1, 1, 1, 1).
    idx, diff = areal.reorder_to_balanced_batches(np.array([10, 1, 1, 1, 1]), 4)
    assert idx.tolist() == [0, 1, 2, 3, 4] and diff == 6


def test_areal_reorder_edges():
    idx, diff = areal.reorder_to_balanced_batches(np.array([], dtype=np.int64), 4)
    assert idx.shape == (0,) and idx.dtype == np.int64 and diff == 0
    with pytest.raises(ValueError, match="n_seqs_per_batch must be >= 1"):
        areal.reorder_to_balanced_batches(np.array([1, 2]), 0)
    with pytest.raises(ValueError, match="whole number"):
        areal.reorder_to_balanced_batches(np.array([1.5, 2]), 1)
    # Sums beyond int32, where AReaL's batch sums wrap: exact here.
    idx, diff = areal.reorder_to_balanced_batches(np.array([2**31, 2**31, 5, 3]), 2)
    assert diff == 2


def test_areal_patch_covers_the_contiguous_functions(monkeypatch):
    def old(*a, **k):
        return "old"

    names = ("partition_balanced", "partition_balanced_tuples", "min_abs_diff_partition",
             "reorder_to_balanced_batches")  # fmt: skip
    mod = types.ModuleType("areal.utils.seqpack")
    for name in names:
        setattr(mod, name, old)
    for parent in ("areal", "areal.utils"):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, "areal.utils.seqpack", mod)
    areal.patch()
    try:
        assert all(getattr(mod, name) is getattr(areal, name) for name in names)
    finally:
        areal.unpatch()
    assert all(getattr(mod, name) is old for name in names)


# ---- exactness and cost (a review's findings, 2026-11-24) -------------------------------


def test_integers_past_2_53_are_summed_exactly():
    # float64 prefix sums lost the 1s after 2**54: cut [0..19] | [20], loads [2**54, 0].
    p = sb.contiguous_partition([2**54] + [1] * 20, 2)
    assert p == [[0], list(range(1, 21))]
    assert p.loads.tolist() == [2.0**54, 20.0]
    assert areal.partition_balanced(np.array([2**60, 3, 5, 2**60], dtype=np.int64), 3) == [
        0, 1, 3, 4]  # fmt: skip
    # Python ints beyond int64 and uint64 beyond 2**63 stay exact too.
    assert sb.contiguous_partition([2**70, 1, 2**70, 5], 2) == [[0, 1], [2, 3]]
    assert sb.contiguous_partition(np.array([2**64 - 1, 1, 2], dtype=np.uint64), 2).loads[
        1] == 3.0  # fmt: skip


def test_loads_are_each_runs_own_sum():
    assert sb.contiguous_partition([1e16, 1, 1, 1, 1], 5).loads.tolist() == [1e16, 1, 1, 1, 1]


def test_subnormal_weights():
    assert sb.contiguous_partition([5e-324] * 4, 2) == [[0, 1], [2, 3]]


def test_float_rounding_gap_is_bisected_not_stepped(monkeypatch):
    # The greedy check and the window pass round differently when a run crosses a power
    # of two; closing that gap one ulp at a time took 1,088 passes here (2 s; 81 s at
    # 16k items).
    from seqbalance.partitioning import contiguous

    calls = []
    real = contiguous._count_ranges
    monkeypatch.setattr(contiguous, "_count_ranges", lambda *a: calls.append(1) or real(*a))
    w = np.r_[0.75, np.ones(4095), 0.505, 0.505]
    sb.contiguous_partition(w, len(w) - 1)
    assert len(calls) <= 200


@pytest.mark.slow
def test_memory_is_linear_in_the_items():
    import tracemalloc

    w = np.random.default_rng(0).integers(1, 4096, 20000)
    tracemalloc.start()
    try:
        p = sb.contiguous_partition(w, 10000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(p) == 10000 and all(p)
    assert peak < 12 * 2**20  # one bitmask of 10,000 counts per item took ~22 MB


def _count_sets(w, k, s, lo, hi):
    """Every run count (up to k) that can cover each prefix, by a plain set programme."""
    pre = [0, *itertools.accumulate(w)]
    sets = [{0}] + [set() for _ in w]
    for i in range(1, len(w) + 1):
        for x in range(i - s + 1):
            if lo <= pre[i] - pre[x] <= hi:
                sets[i] |= {c + 1 for c in sets[x] if c < k}
    return sets


def test_count_ranges_are_the_exact_count_sets():
    # The O(n) pass keeps the fewest and most runs per position; that is exact because
    # the counts form a range (the proof in _solve_runs). Checked on adversarial weights.
    from seqbalance.partitioning.contiguous import _count_ranges, _windows

    rng = np.random.default_rng(4)
    for _ in range(400):
        n = int(rng.integers(1, 16))
        w = rng.choice([0, 1, 2, 5, 11, 25], n).tolist()
        pre = np.concatenate(([0], np.cumsum(w))).astype(np.int64)
        lo = int(rng.integers(0, pre[-1] + 1))
        hi = int(rng.integers(lo, pre[-1] + 2))
        s, k = int(rng.integers(1, 4)), n
        sets = _count_sets(w, k, s, lo, hi)
        ranges = _count_ranges(*_windows(pre, s, lo, hi), k)
        assert (ranges is None) == (k not in sets[-1])
        if ranges is not None:
            for x, counts in enumerate(sets):
                want = list(range(ranges[0][x], ranges[1][x] + 1))
                assert sorted(counts) == want
                assert counts == set(range(min(counts), max(counts) + 1)) if counts else True


def test_int64_totals_between_2_62_and_2_63_stay_optimal():
    # Sums of two prefix values wrapped in int64 (bisection midpoints, greedy jumps).
    w = [1, 2**62 - 1, 1, 1]
    assert sb.contiguous_partition(w, 3) == [[0], [1], [2, 3]]
    assert areal.partition_balanced(w, 3) == [0, 1, 2, 4]


def test_areal_reorder_refuses_0d_input():
    with pytest.raises(ValueError, match="1-D"):
        areal.reorder_to_balanced_batches(np.array(5), 2)
