"""``exact_searches``: the switch for partition's small-problem exact searches, its scope,
what it changes, and the compat drop-ins' default (off unless the caller chose)."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.compat import _areal_dropin, areal, verl
from seqbalance.compat._verl_kk import verl_free_kk_labels
from seqbalance.partitioning import kway
from seqbalance.planning._pipelines import areal_ffd_groups

# The names of the searches, as Partition.method reports their results (the two-part
# split, which stays on for a few units, is not among the inputs this is used on).
SEARCH_METHODS = {"two-way", "exact", "heaviest", "bisection"}


def _searched(method: str) -> bool:
    return any(name in method for name in SEARCH_METHODS)


@pytest.fixture
def search_calls(monkeypatch):
    """Record every call into the exact searches ``partition`` may start."""
    calls: list[str] = []
    for name in ("exact_labels", "two_way_labels", "_enumerate_heaviest"):
        real = getattr(kway, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(kway, name, spy)
    return calls


# 20 long-tailed integer weights into 3 parts: the refined starts leave this unproven, so
# by default partition goes on to search (asserted below, not assumed).
HARD = sb.workloads.lengths("long-mix", 20, seed=3).astype(float)


def _brute_force(w: list[float], k: int) -> float:
    """The optimum heaviest part by trying every assignment (independent of seqbalance)."""
    best = float("inf")
    for labels in itertools.product(range(k), repeat=len(w)):
        if labels[0] != 0:
            continue  # relabellings of the same partition
        loads = [0.0] * k
        for x, lab in zip(w, labels):
            loads[lab] += x
        best = min(best, max(loads))
    return best


def test_scope_nests_and_restores():
    assert sb.exact_searches_enabled()
    with sb.exact_searches(False):
        assert not sb.exact_searches_enabled()
        with sb.exact_searches(True):
            assert sb.exact_searches_enabled()
        assert not sb.exact_searches_enabled()
    assert sb.exact_searches_enabled()
    with pytest.raises(RuntimeError), sb.exact_searches(False):
        raise RuntimeError("boom")
    assert sb.exact_searches_enabled()  # restored on the way out of an exception too


def test_new_thread_starts_from_the_default():
    seen = []
    with sb.exact_searches(False):
        t = threading.Thread(target=lambda: seen.append(sb.exact_searches_enabled()))
        t.start()
        t.join()
    assert seen == [True]


@pytest.mark.parametrize("bad", [0, 1, "no", None, np.array([True])])
def test_refuses_anything_but_a_bool(bad):
    with pytest.raises(ValueError, match="True or False"), sb.exact_searches(bad):
        pass


def test_off_skips_the_searches(search_calls):
    on = sb.partition(HARD, 3)
    assert search_calls, "the default should search on this input"
    search_calls.clear()
    with sb.exact_searches(False):
        off = sb.partition(HARD, 3)
    assert search_calls == []
    assert not _searched(off.method)
    assert sorted(i for p in off for i in p) == list(range(len(HARD)))
    assert on.max_load <= off.max_load


def test_the_searches_are_what_finds_the_optimum_here():
    # Independent check: the optimum by brute force over 3**11 assignments.
    w = sb.workloads.lengths("long-mix", 12, seed=7).astype(float).tolist()
    best = _brute_force(w, 3)
    assert sb.partition(w, 3).max_load == best
    with sb.exact_searches(False):
        off = sb.partition(w, 3)
    assert off.max_load > best  # the refined heuristics alone miss it on this input
    assert not off.optimal


def test_off_keeps_the_two_part_split_on_few_units(search_calls):
    w = sb.workloads.lengths("long-mix", 16, seed=5).astype(float).tolist()
    with sb.exact_searches(False):
        p = sb.partition(w, 2)
        assert p.method == "two-way" and search_calls == ["two_way_labels"]
        assert p.optimal and p.max_load == _brute_force(w, 2)
        search_calls.clear()
        sb.partition(sb.workloads.lengths("long-mix", 30, seed=5), 2)
    assert "two_way_labels" not in search_calls  # 30 units: above FAST_TWO_WAY_MAX_UNITS


@settings(max_examples=60, deadline=None)
@given(
    w=st.lists(st.integers(0, 5000), min_size=2, max_size=40),
    k=st.integers(2, 6),
    size=st.sampled_from(["free", "balanced"]),
)
def test_off_is_valid_and_never_lighter_than_on(w, k, size):
    with sb.exact_searches(False):
        off = sb.partition(w, k, size=size)
        again = sb.partition(w, k, size=size)
    on = sb.partition(w, k, size=size)
    assert [list(p) for p in off] == [list(p) for p in again]  # deterministic
    assert sorted(i for p in off for i in p) == list(range(len(w)))
    if size == "balanced":
        counts = [len(p) for p in off]
        assert max(counts) - min(counts) <= 1
    # The searches start from the same refined result and only keep something lighter;
    # the bound does not depend on the setting, except that a result proven optimal
    # reports its optimum as the bound.
    assert on.max_load <= off.max_load
    assert off.lower_bound <= on.lower_bound <= on.max_load
    assert off.lower_bound == sb.lower_bound(w, k, size=size) or off.optimal
    if off.optimal:
        assert off.max_load == on.max_load


def test_compat_default_is_off_and_the_caller_can_turn_it_on(search_calls):
    verl.get_seqlen_balanced_partitions(HARD, 3, equal_size=False)
    areal.kk_allocate(HARD.astype(int).tolist(), int(HARD.sum()), 3)
    assert search_calls == []
    assert sb.exact_searches_enabled()  # the drop-in's choice does not leak out
    with sb.exact_searches(True):
        verl.get_seqlen_balanced_partitions(HARD, 3, equal_size=False)
    assert search_calls


def test_plan_follows_the_switch(search_calls):
    # effort="thorough": the searches run unless switched off
    lens = sb.workloads.lengths("long-mix", 48, seed=1)
    with sb.exact_searches(False):
        off = sb.plan(lens, 8, 16384, sync="ddp", baselines=False, effort="thorough")
    assert search_calls == []
    on = sb.plan(lens, 8, 16384, sync="ddp", baselines=False, effort="thorough")
    assert search_calls
    for p in (off, on):
        assert sorted(i for rank in p.micro_batches for mb in rank for i in mb) == list(range(48))
        assert not any(p.violations().values())


def test_default_effort_leaves_the_searches_off_unless_the_caller_chose(search_calls):
    # (rl-math: a batch whose default search does not stop before the partition)
    lens = sb.workloads.lengths("rl-math", 48, seed=0)
    sb.plan(lens, 8, 16384, sync="ddp", baselines=False)
    assert search_calls == []
    assert sb.exact_searches_enabled()  # the planner's choice does not leak out
    with sb.exact_searches(True):
        sb.plan(lens, 8, 16384, sync="ddp", baselines=False)
    assert search_calls


def test_areal_kk_allocate_no_heavier_than_areals_differencing_hand_case():
    # AReaL 1.0.4's own kk_allocate on these 16 lengths (cap 16,384): 2 groups, the heavier
    # holding 8,425 tokens (the drop-in's planner split gave 8,430 before it compared).
    values = [1978, 1819, 1456, 1430, 1382, 1250, 1152, 1130, 1113, 1074, 823, 680, 494, 468,
              383, 217]  # fmt: skip
    groups = areal.kk_allocate(values, 16384, 1)
    assert len(groups) == 2
    assert max(sum(values[i] for i in g) for g in groups) <= 8425
    assert sorted(i for g in groups for i in g) == list(range(16))


@settings(max_examples=80, deadline=None)
@given(
    w=st.lists(st.integers(1, 8000), min_size=2, max_size=60),
    cap=st.integers(8000, 40000),
    min_groups=st.integers(1, 4),
)
def test_areal_kk_allocate_never_heavier_at_its_count(w, cap, min_groups):
    """AReaL's kk_allocate: k = max(min_groups, ceil(total / cap)) clamped to n, its
    differencing (verl's count-free rules, reproduced and checked against AReaL in
    bench/verl_kk_check.py), else first-fit decreasing. Where its differencing fits, the
    drop-in uses at most k groups and, at k, is never heavier."""
    if len(w) < min_groups:
        return
    k = min(max(min_groups, -(-sum(w) // cap)), len(w))
    labels = verl_free_kk_labels(np.asarray(w, dtype=float), k)
    sums = np.bincount(labels, weights=w, minlength=k)
    groups = areal.kk_allocate(w, cap, min_groups)
    assert sorted(i for g in groups for i in g) == list(range(len(w)))
    assert all(sum(w[i] for i in g) <= cap for g in groups)
    if sums.max() <= cap:
        assert len(groups) <= k
        if len(groups) == k:
            assert max(sum(w[i] for i in g) for g in groups) <= sums.max()


# ---- never more parts than the framework (the review of the searches-off default) -------

# Expected groups below are AReaL 1.0.4's own output (areal.utils.seqpack), not ours.
AREAL_TIES = [300, 100, 300, 200, 100, 300, 200, 100]
AREAL_TIES_FFD = [[0, 3], [2, 6], [5, 1, 4], [7]]  # _ffd_allocate(ties, 500, min_groups=2)


def test_areal_ffd_reproduction_matches_areals_output():
    assert areal_ffd_groups(np.array(AREAL_TIES), 500, 2) == AREAL_TIES_FFD
    assert _areal_dropin._areal_ffd(np.array(AREAL_TIES), 500, 1, 2) == AREAL_TIES_FFD


def test_areal_allocators_never_use_more_groups_than_areal():
    # AReaL's ffd_allocate packs these 20 values into 3 groups of at most 32,317; with the
    # searches off the planner's exact packing stopped at 10,000 nodes and used 4.
    values = [2963, 2125, 4745, 2063, 5665, 4018, 3248, 7169, 2803, 3965, 8052, 8170, 8249,
              2049, 3609, 3697, 2321, 4998, 8720, 8238]  # fmt: skip
    for fn in (areal.ffd_allocate, areal.kk_allocate):
        groups = fn(values, 32317, 1)
        assert len(groups) <= 3
        assert sorted(i for g in groups for i in g) == list(range(20))
        assert all(sum(values[i] for i in g) <= 32317 for g in groups)


def test_areal_kk_allocate_no_heavier_when_areal_falls_back_to_ffd():
    # AReaL's differencing at its count (9) breaks the cap, so AReaL returns first-fit
    # decreasing: 9 groups, the heaviest 21,715 (AReaL 1.0.4's output).
    values = [14784, 1621, 426, 5591, 7773, 3840, 13571, 1992, 2388, 1818, 3538, 172, 219,
              615, 6443, 2722, 12855, 6746, 1330, 14412, 669, 5952, 523, 5705, 423, 292, 117,
              10532, 693, 11806, 2804, 11783, 11529, 2481, 9265, 9867, 6933, 576]  # fmt: skip
    groups = areal.kk_allocate(values, 21740, 2)
    assert len(groups) <= 9
    if len(groups) == 9:
        assert max(sum(values[i] for i in g) for g in groups) <= 21715


def test_areal_kk_allocate_divisor_zero_is_no_rounding():
    # AReaL rounds the count only for a divisor above 1.
    groups = areal.kk_allocate([100, 200, 300, 150, 250], 500, 2, n_groups_divisor=0)
    assert len(groups) == 2
    assert sorted(i for g in groups for i in g) == list(range(5))


def test_verl_default_never_more_micro_batches_than_verl():
    # verl 0.9.1's own loop fits these 27 lengths into 2 micro-batches of 69,878 tokens.
    lens = np.array([8730, 6174, 1209, 701, 1588, 8013, 5324, 8012, 4417, 7894, 1619, 911,
                     7577, 6970, 8352, 7109, 1339, 7957, 4132, 7273, 7718, 5848, 3893, 880,
                     7409, 7015, 1688])  # fmt: skip
    parts = verl.micro_batches_of_lengths(lens, 69878)
    assert len(parts) <= 2
    assert all(int(lens[p].sum()) <= 69878 for p in parts)


def test_fast_node_limit_applies_only_with_the_searches_off(monkeypatch):
    from seqbalance.planning import _exact

    monkeypatch.setattr(_exact, "FAST_NODE_LIMIT", 0)
    t = [5, 5, 4, 4, 3, 3, 2, 2, 1, 1]  # 30 into 3 bins of 10: fits, found by search
    assert _exact.pack_exact(t, 3, 10)[1] == "found"
    with sb.exact_searches(False):
        assert _exact.pack_exact(t, 3, 10) == (None, "limit")


@pytest.mark.slow
def test_bound_does_not_depend_on_the_setting():
    # The heaviest-units term decides this bound (1.5e6 with it, 1.4e6 without), and a
    # plan's lower_bound() must not change with where it is called.
    w = [11, 11, 8, 6, 4] * 100_000 + [1] * 5000
    on = sb.partition(w, 3)
    with sb.exact_searches(False):
        off = sb.partition(w, 3)
        assert sb.lower_bound(w, 3) == on.lower_bound
    assert off.lower_bound == on.lower_bound
    p = sb.plan([1100, 1100, 800, 600, 400], 3, 4000, sync="ddp")
    with sb.exact_searches(False):
        inside = p.lower_bound()
    assert inside == p.lower_bound()
