"""Slack filling between FSDP slots: the swap scan that looks one top-bin sequence at a
time for a swap whose gain is the most any can have picks what the full 2-D scan picks,
and the pass keeps its rules."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning import _slots
from seqbalance.planning._slot_first import slot_first
from seqbalance.planning._slots import fill_slack


def fsdp_step(grid, costs) -> float:
    return sum(max(float(costs[rank[j]].sum()) for rank in grid) for j in range(len(grid[0])))


def both_scans(calls: list):
    """A patch of the swap scan that runs it both ways, asserts they agree, and records
    (whether the pass asked for the row-by-row scan first, the pick) in ``calls``."""
    real = _slots._best_swap

    def both(*args):
        *head, rows_first = args
        fast, full = real(*head, True), real(*head, False)
        assert fast == full
        calls.append((rows_first, fast[0]))
        return fast

    return mock.patch.object(_slots, "_best_swap", both)


@st.composite
def grids(draw):
    dp = draw(st.integers(2, 5))
    m = draw(st.integers(2, 5))
    n = draw(st.integers(dp * m, dp * m * 4))
    # Few distinct lengths, so that costs tie and the first-in-order rule is exercised.
    lens = np.array(draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)), dtype=np.int64)
    quad = draw(st.sampled_from([0.0, 0.05, 1.0, None, None, None]))
    if quad is None:  # costs apart from the lengths: a cheaper partner may be longer
        costs = np.array(draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), float)
    else:
        costs = lens + quad * lens.astype(np.float64) ** 2
    order = draw(st.permutations(range(n)))
    grid = [[[] for _ in range(m)] for _ in range(dp)]
    for k, i in enumerate(order):  # every micro-batch gets one, the rest at random
        b = k if k < dp * m else draw(st.integers(0, dp * m - 1))
        grid[b % dp][b // dp].append(int(i))
    cap = max(int(lens[mb].sum()) for rank in grid for mb in rank) + draw(st.integers(0, 2))
    return grid, costs, lens, cap


@settings(max_examples=300, deadline=None)
@given(grids())
def test_rows_first_swap_scan_picks_what_the_full_scan_picks(case):
    grid, costs, lens, cap = case
    with both_scans([]):
        out = fill_slack(grid, costs, lens, cap, max_steps=200)
    assert sorted(i for rank in out for mb in rank for i in mb) == list(range(lens.size))
    assert all(mb for rank in out for mb in rank)
    assert all(int(lens[mb].sum()) <= cap for rank in out for mb in rank)
    assert fsdp_step(out, costs) <= fsdp_step(grid, costs) * (1 + 1e-12)


def test_after_a_capped_swap_the_next_scan_looks_row_by_row():
    # rl-math, 1,024 sequences over 8 ranks x 19, 98% full: the slot-first plan's slack
    # filling, where nearly every swap lowers its bin to the slot's second.
    lens = workloads.load("rl-math", 1024, seed=0).lengths
    costs = load_cost("qwen2.5-7b")(lens)
    grid = slot_first(costs, lens, 8, 19, 32768)
    calls: list = []
    with both_scans(calls):
        out = fill_slack(grid, costs, lens, 32768, max_steps=100, retry=False)
    assert fsdp_step(out, costs) < fsdp_step(grid, costs)
    assert sum(rows_first for rows_first, _ in calls) > len(calls) // 2


def test_a_capped_swap_keeps_the_top_bin_within_the_cap():
    # Slot 0's top bin holds sequences 0 (cost 5, 1 token) and 1 (1, 5); trading 0 for
    # sequence 3 (cost 1, 7 tokens) would lower it to its second bin's cost, the most
    # a swap can gain, but put it at 12 tokens over a cap of 7: no swap there, in either
    # scan.
    costs = np.array([5.0, 1.0, 4.0, 1.0, 2.0, 4.0])
    lens = np.array([1, 5, 1, 7, 1, 1])
    grid = [[[0, 1], [3]], [[2], [4, 5]]]
    calls: list = []
    with both_scans(calls):
        out = fill_slack(grid, costs, lens, 7, max_steps=10)
    assert calls and calls[0][1] is None
    assert all(int(lens[mb].sum()) <= 7 for rank in out for mb in rank)
