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


def reference(grid, costs, lens, cap, max_steps, same_rank=False, retry=True, stop_at=None):
    """The pass with plain loops, from its rule: slots by level (ties: lower slot), the
    heaviest micro-batch of each (lowest rank on ties) gives its best move (the first
    sequence of the largest gain, into the bin it leaves the least slack in), else its
    best swap (the first pair, in (its sequence, partner index) order, of the largest
    gain), the gain at most down to the slot's second. Integer costs, so sums are exact."""
    dp, m = len(grid), len(grid[0])
    items = [list(grid[r][j]) for j in range(m) for r in range(dp)]  # bin b = j * dp + r
    cost = [float(sum(costs[i] for i in it)) for it in items]
    tok = [int(sum(lens[i] for i in it)) for it in items]
    tiny = 1e-12 * max(max(cost), 1e-300)
    good = (1 + 1e-4) * max(sum(cost) / dp, float(max(costs)))
    good = good if stop_at is None else max(good, stop_at)
    stuck = [False] * m

    def level(j):
        return max(cost[j * dp : (j + 1) * dp])

    def reachable(b, d):  # d may take a sequence of b
        return d // dp != b // dp and (not same_rank or d % dp == b % dp)

    for _ in range(max_steps):
        if sum(level(j) for j in range(m)) <= good:
            break
        slack = [level(d // dp) - cost[d] for d in range(dp * m)]
        room = [cap - tok[d] for d in range(dp * m)]
        where = {i: d for d in range(dp * m) for i in items[d]}
        step = None
        for j in sorted(range(m), key=lambda j: (-level(j), j)):
            if level(j) <= tiny:
                break
            if stuck[j]:
                continue
            row = cost[j * dp : (j + 1) * dp]
            b = j * dp + row.index(max(row))
            most = max(row) - sorted(row)[dp - 2]  # down to the slot's second
            best = 0.0
            if len(items[b]) > 1:
                for x in items[b]:
                    dests = [d for d in range(dp * m) if reachable(b, d)
                             and slack[d] >= costs[x] and room[d] >= lens[x]]  # fmt: skip
                    gain = min(costs[x], most) if dests else 0.0
                    if gain > best:
                        dest = min(dests, key=lambda d: (slack[d] - costs[x], d))
                        best, step = gain, (b, x, dest, -1)
            if step is None or best <= tiny:
                step, best = None, 0.0
                for x in items[b]:
                    for y in sorted(where):
                        d = where[y]
                        if not reachable(b, d) or not costs[y] < costs[x]:
                            continue
                        if (slack[d] + costs[y] >= costs[x] and room[d] + lens[y] >= lens[x]
                                and room[b] + lens[x] >= lens[y]):  # fmt: skip
                            gain = min(costs[x] - costs[y], most)
                            if gain > best:
                                best, step = gain, (b, x, d, y)
                if best <= tiny:
                    step = None
            if step is not None:
                break
            stuck[j] = not retry
        if step is None:
            break
        b, x, d, y = step
        stuck[b // dp] = stuck[d // dp] = False
        for i, src, dst in ((x, b, d), (y, d, b)):
            if i >= 0:
                items[src].remove(i)
                items[dst].append(i)
                cost[src] -= costs[i]
                cost[dst] += costs[i]
                tok[src] -= lens[i]
                tok[dst] += lens[i]
    return [[items[j * dp + r] for j in range(m)] for r in range(dp)]


@st.composite
def grids(draw, integer_costs=False):
    dp = draw(st.integers(2, 5))
    m = draw(st.integers(2, 5))
    n = draw(st.integers(dp * m, dp * m * 4))
    # Few distinct lengths, so that costs tie and the first-in-order rule is exercised.
    lens = np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), dtype=np.int64)
    quad = draw(st.sampled_from([0.0, 1.0, None] if integer_costs else
                                [0.0, 0.05, 1.0, None, None, None]))  # fmt: skip
    if quad is None:  # costs apart from the lengths: a cheaper partner may be longer
        costs = np.array(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), float)
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


@settings(max_examples=300, deadline=None)
@given(grids(integer_costs=True), st.booleans(), st.booleans(), st.booleans())
def test_matches_the_plain_loop(case, same_rank, retry, stop):
    grid, costs, lens, cap = case
    stop_at = 0.999 * fsdp_step(grid, costs) if stop else None
    got = fill_slack(grid, costs, lens, cap, max_steps=60, same_rank=same_rank, retry=retry,
                     stop_at=stop_at)  # fmt: skip
    want = reference(grid, costs, lens, cap, 60, same_rank, retry, stop_at)
    assert got == want


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


def test_a_move_into_a_bin_with_room_for_exactly_the_shortest_sequence():
    # Slot 0's top bin (sequences 0 and 1, 3 tokens each, at a cap of 6) can give
    # sequence 1 (cost 4) to slot 1's bin of sequence 2, whose room is exactly 3 tokens
    # and the most any bin has: a move, not a swap.
    costs = np.array([2.0, 4.0, 1.0, 6.0, 1.0])
    lens = np.array([3, 3, 3, 3, 3])
    grid = [[[0, 1], [2]], [[4], [3]]]
    out = fill_slack(grid, costs, lens, 6, max_steps=1)
    assert out == reference(grid, costs, lens, 6, 1)
    assert out == [[[0], [2, 1]], [[4], [3]]]
