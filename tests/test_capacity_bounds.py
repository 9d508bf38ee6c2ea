"""Capacity-aware bounds against exhaustive enumeration of every plan on small inputs."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.planning.bounds import (
    big_item_slot_bound,
    capacity_step_bound,
    min_bins,
    min_micro_batches,
)


def _set_partitions(items):
    """Every partition of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]
        yield [[first], *part]


def _brute_min_bins(lengths, cap):
    return min(
        len(p)
        for p in _set_partitions(list(range(len(lengths))))
        if all(sum(lengths[i] for i in b) <= cap for b in p)
    )


def _brute_fsdp(lengths, costs, dp, cap, c0):
    """Least FSDP step over every plan: every split into micro-batches that fit, then the
    best slotting (sorted costs, ``dp`` per slot, which minimises a sum of slot maxima)."""
    best = np.inf
    for p in _set_partitions(list(range(len(lengths)))):
        if any(sum(lengths[i] for i in b) > cap for b in p):
            continue
        c = sorted((sum(costs[i] for i in b) for b in p), reverse=True)
        best = min(best, sum(c[::dp]) + c0 * -(-len(c) // dp))
    return best


def _brute_ddp(lengths, costs, dp, cap, c0):
    """Least DDP step: every assignment of sequences to ranks; each rank packed into its
    fewest bins; all ranks run the largest of those counts (empty micro-batches cost c0)."""

    @cache
    def bins_of(items):
        return _brute_min_bins([lengths[i] for i in items], cap) if items else 0

    best = np.inf
    n = len(lengths)
    for assign in itertools.product(range(dp), repeat=n):
        ranks = [tuple(i for i in range(n) if assign[i] == r) for r in range(dp)]
        m = max(1, max(bins_of(r) for r in ranks))
        best = min(best, max(sum(costs[i] for i in r) for r in ranks) + m * c0)
    return best


small = st.lists(st.integers(1, 12), min_size=1, max_size=7)


@settings(max_examples=120, deadline=None)
@given(lengths=small, cap=st.integers(12, 20))
def test_min_bins_never_above_the_optimum(lengths, cap):
    opt = _brute_min_bins(lengths, cap)
    lb = min_bins(np.array(lengths, dtype=np.int64), cap)
    assert max(1, -(-sum(lengths) // cap)) <= lb <= opt


@settings(max_examples=80, deadline=None)
@given(
    lengths=small,
    cap=st.integers(12, 20),
    dp=st.integers(1, 3),
    c0=st.sampled_from([0.0, 3.0]),
    quad=st.booleans(),
    data=st.data(),
)
def test_step_bound_never_above_the_best_plan(lengths, cap, dp, c0, quad, data):
    lens = np.array(lengths, dtype=np.int64)
    costs = lens.astype(float) ** 2 if quad else lens.astype(float)
    for sync, brute in (("fsdp", _brute_fsdp), ("ddp", _brute_ddp)):
        if sync == "ddp" and len(lengths) > 6 and dp == 3:
            continue  # 3**7 assignments x bin packing: slow, and fsdp covers n = 7
        opt = brute(lengths, costs.tolist(), dp, cap, c0)
        lb = capacity_step_bound(costs, lens, dp, cap, sync=sync, per_microbatch=c0)
        assert lb <= opt * (1 + 1e-12)


def test_known_values():
    # Three sequences above 16 / 2 can't share a micro-batch; dp=2 gives two slots, so
    # FSDP pays at least 11 + 9, while the rank bound is 10 + 9 (two of three on one rank).
    lens = np.array([9, 10, 11])
    costs = lens.astype(float)
    assert big_item_slot_bound(costs, lens, 2, 16) == 20.0
    assert capacity_step_bound(costs, lens, 2, 16, sync="fsdp") == 20.0
    assert capacity_step_bound(costs, lens, 2, 16, sync="ddp") == 19.0
    # [6, 6, 6, 5, 5] into bins of 10: a 5 fits beside no 6, so 3 + 1 bins.
    assert min_bins(np.array([6, 6, 6, 5, 5]), 10) == 4
    assert min_micro_batches(np.array([6, 6, 6, 5, 5]), 3, 10) == 2
    # A per-micro-batch cost is paid for each of the (at least) 2 slots.
    assert capacity_step_bound(costs, lens, 2, 16, sync="fsdp", per_microbatch=5.0) == 30.0
