"""The heaviest-part enumeration and the capacity bisection against independent exact answers.

Checked against brute force (test_exact's: every labelling, k**n, so n <= 10), a dynamic
programme over the reachable pairs of part loads (exact three-way splits of small
integers, n up to a few dozen) and HiGHS where scipy is installed. None shares code with
the library.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_exact import brute_optimum_np, counts_ok, milp_optimum

from seqbalance.partitioning import lower_bound, partition
from seqbalance.partitioning._greedy import lpt_labels
from seqbalance.partitioning._heaviest import bisection_labels, heaviest_part_labels


def three_way_dp(w: list[int]) -> int:
    """Optimal heaviest part of a free three-way split of non-negative integers.

    reach[a, b]: some split puts load a in part 1 and b in part 2 (part 3 gets the rest).
    """
    total = sum(w)
    reach = np.zeros((total + 1, total + 1), dtype=bool)
    reach[0, 0] = True
    for x in w:
        nxt = reach.copy()
        nxt[x:, :] |= reach[: total + 1 - x, :]
        nxt[:, x:] |= reach[:, : total + 1 - x]
        reach = nxt
    a, b = np.nonzero(reach)
    return int(np.maximum(np.maximum(a, b), total - a - b).min())


weights_st = st.one_of(
    st.lists(st.integers(0, 60), min_size=5, max_size=9),
    st.lists(st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False), min_size=5,
             max_size=9),
)


SEARCHES = [heaviest_part_labels, bisection_labels]


@pytest.mark.slow
@pytest.mark.parametrize("search", SEARCHES)
@settings(max_examples=120, deadline=None)
@given(weights=weights_st, k=st.sampled_from([3, 4, 5]),
       size=st.sampled_from(["free", "equal", "balanced"]))
def test_matches_brute_force(search: Any, weights: list[float], k: int, size: str) -> None:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) <= k:
        return
    if size == "equal" and len(w) % k:
        size = "balanced"
    start = lpt_labels(w, k, size)
    hi = float(np.bincount(start, weights=w, minlength=k).max())
    labels, proven = search(w, k, size, hi, lower_bound(w, k, size=size))
    opt = brute_optimum_np(w, k, size)
    assert proven  # a few units never exhaust the budget
    if labels is None:  # nothing lighter than the start: the start was optimal
        assert hi == pytest.approx(opt, rel=1e-12, abs=1e-12)
    else:
        counts = np.bincount(labels, minlength=k).tolist()
        assert labels.shape == w.shape and counts_ok(counts, len(w), k, size)
        top = float(np.bincount(labels, weights=w, minlength=k).max())
        assert top < hi
        assert top == pytest.approx(opt, rel=1e-12, abs=1e-12)


def test_bisection_proves_subnormal_weights() -> None:
    # Found by hypothesis: hi = 5e-324, and hi * (1 - 1e-12) rounds back to hi, so every
    # step "found" a partition as heavy as the best and the budget ran out unproven.
    w = np.array([0.0, 0.0, 0.0, 0.0, 5e-324])
    labels, proven = bisection_labels(w, 3, "free", 5e-324, lower_bound(w, 3))
    assert proven and labels is None  # nothing is lighter than the heaviest unit


@pytest.mark.parametrize("seed", range(12))
def test_three_way_matches_dynamic_programme(seed: int) -> None:
    # 12-16 integers up to 300: few enough that the optimum often sits above the bound
    # (so it must be proven, not just met), too many for brute force, easy for the DP.
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 300, size=int(rng.integers(12, 17))).tolist()
    p = partition(w, 3)
    assert p.optimal
    assert p.max_load == three_way_dp(w)
    labels, proven = heaviest_part_labels(
        np.asarray(w, dtype=np.float64), 3, "free", p.max_load + 1, lower_bound(w, 3))
    assert proven and labels is not None
    assert float(np.bincount(labels, weights=w, minlength=3).max()) == three_way_dp(w)


@pytest.mark.parametrize("search", SEARCHES)
def test_optimum_above_the_bound_is_proven(search: Any) -> None:
    # Four 5s in three parts: two must share a part, so 10, while the bound says 20/3 -> 7.
    w = np.array([5.0, 5.0, 5.0, 5.0, 0.5])
    labels, proven = search(w, 3, "free", 10.5, lower_bound(w, 3))
    assert proven and labels is not None
    assert float(np.bincount(labels, weights=w, minlength=3).max()) == 10.0
    # Starting from the optimum, nothing lighter exists, and that is proven.
    assert search(w, 3, "free", 10.0, lower_bound(w, 3)) == (None, True)


def test_budget_runs_out_without_a_claim() -> None:
    w = np.random.default_rng(0).lognormal(0.0, 1.0, 24)
    start = lpt_labels(w, 3, "free")
    hi = float(np.bincount(start, weights=w, minlength=3).max())
    assert heaviest_part_labels(w, 3, "free", hi, lower_bound(w, 3), work=10) == (None, False)


HARD = [(20, 3, "free"), (24, 3, "equal"), (30, 3, "balanced"), (20, 4, "free")]


def test_hard_real_valued_cases_are_proven_by_auto() -> None:
    # Lognormal weights, n = 20..30, k = 3..4: the optimum sits a hair above the bound,
    # which the branch and bound alone did not settle within its budget.
    for n, k, size in HARD:
        w = np.random.default_rng(n + k).lognormal(0.0, 1.0, n)
        p = partition(w, k, size=size)
        assert p.optimal and p.method == "exact", (n, k, size)
        assert sorted(i for part in p for i in part) == list(range(n))
        assert counts_ok([len(part) for part in p], n, k, size)


@pytest.mark.slow
def test_hard_cases_match_the_milp() -> None:
    """The same cases against HiGHS (skipped without scipy): nothing is lighter."""
    checked = 0
    for n, k, size in HARD[:2]:
        w = np.random.default_rng(n + k).lognormal(0.0, 1.0, n)
        opt = milp_optimum(w, k, size)
        if opt is None:
            continue
        checked += 1
        assert partition(w, k, size=size).max_load <= opt * (1 + 1e-9)
    if not checked:
        pytest.skip("the MILP proved nothing within its time limit")


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("m,k", [(32 + 1, 3), (10, 2), (3, 3)])
def test_out_of_range_refused(search: Any, m: int, k: int) -> None:
    with pytest.raises(ValueError, match=search.__name__):
        search(np.ones(m), k, "free", float(m), 1.0)


def test_deterministic() -> None:
    w = np.random.default_rng(5).lognormal(0.0, 1.0, 26)
    a = partition(w, 4, size="balanced")
    b = partition(w, 4, size="balanced")
    assert a == b and a.method == b.method and a.optimal == b.optimal


def test_many_parts_reach_the_milp_optimum() -> None:
    # rl-math lengths, 24 into 8 balanced parts (3 each): the branch and bound alone stopped
    # 2.0% above the optimum; the enumeration after it finds and proves 22,967, the value
    # HiGHS proves for this input (scipy.optimize.milp, bench/peers.py's milp_opt).
    w = [13079, 8379, 6805, 6851, 6530, 16877, 10369, 11357, 7783, 6251, 5913, 7051,
         14332, 10758, 8515, 9476, 2078, 6935, 2272, 3976, 10723, 1326, 2096, 2815]
    p = partition(w, 8, size="balanced")
    assert p.max_load == 22967.0 and p.optimal
    assert sorted(len(part) for part in p) == [3] * 8


# rl-math lengths (seqbalance.workloads, seed 26), 24 of them.
RL_MATH_24 = [16103, 6722, 8022, 7198, 16417, 12824, 8561, 11821, 16352, 10015, 4862, 8014,
              6732, 3790, 3034, 8953, 7396, 15303, 8356, 18578, 19354, 15060, 6852, 4511]


def test_bisection_stops_when_good_enough() -> None:
    # The caller only asks for a partition within 10.25: the first one found is returned,
    # and no optimality is claimed for it.
    w = np.array([5.0, 5.0, 5.0, 5.0, 0.5])
    labels, proven = bisection_labels(w, 3, "free", 10.5, lower_bound(w, 3), enough=10.25)
    assert labels is not None and not proven
    assert float(np.bincount(labels, weights=w, minlength=3).max()) <= 10.25


def test_bisection_budget_runs_out_without_a_claim() -> None:
    w = np.asarray(RL_MATH_24, dtype=np.float64)
    start = lpt_labels(w, 8, "free")
    hi = float(np.bincount(start, weights=w, minlength=8).max())
    assert hi > lower_bound(w, 8)  # the start alone proves nothing
    assert bisection_labels(w, 8, "free", hi, lower_bound(w, 8), work=10) == (None, False)


@pytest.mark.slow
def test_eight_free_parts_reach_the_milp_optimum() -> None:
    # rl-math lengths (workloads seed 26), 24 into 8 parts, free counts: before bin
    # completion, auto ended 0.13% above the optimum, unproven; HiGHS proves 30,839
    # (bench/peers.py's milp_opt). Now auto finds and proves it.
    p = partition(RL_MATH_24, 8)
    assert p.max_load == 30839.0 and p.optimal
    assert sorted(i for part in p for i in part) == list(range(24))
