"""FSDP slot refilling (planning._slots.fill_to_levels) and its use by the planner."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning import _slots
from seqbalance.planning._slots import _refill, fill_slack, fill_to_levels
from seqbalance.planning.planner import plan


def _fsdp_step(grid, costs):
    return sum(
        max(sum(costs[i] for i in grid[r][j]) for r in range(len(grid)))
        for j in range(len(grid[0]))
    )


def test_refill_trades_one_sequence_for_two():
    # Ranks 0 and 2 each hold a 16-token sequence at the capacity: slot 0 costs 16 whatever
    # rank 1 does. Rank 1 runs {9} then {8, 8}: 16 + 16 = 32. No single move or swap helps
    # (an 8 beside the 9 is 17 > 16; swapping the 9 for an 8 raises slot 1; a rank with a
    # 16 reversed still leaves the other 16 in each slot), but rank 1 running {8, 8} then
    # {9} costs 16 + 9 = 25, its whole work, which no plan of these ranks can beat.
    lens = np.array([16, 1, 9, 8, 8, 16, 1])
    costs = lens.astype(float)
    grid = [[[0], [1]], [[2], [3, 4]], [[5], [6]]]
    assert _fsdp_step(fill_slack(grid, costs, lens, 16, max_steps=50, same_rank=True),
                      costs) == 32.0  # fmt: skip
    out = fill_to_levels(grid, costs, lens, 16)
    assert out == [[[0], [1]], [[3, 4], [2]], [[5], [6]]]
    assert _fsdp_step(out, costs) == 25.0


def test_refill_leaves_a_grid_at_the_bound_alone():
    lens = np.array([8, 8, 8, 8])
    costs = lens.astype(float)
    grid = [[[0], [1]], [[2], [3]]]
    assert fill_to_levels(grid, costs, lens, 16) is grid


def test_refill_never_empties_a_micro_batch():
    # Rank 1 could put both its sequences under slot 0's level (10) and leave slot 1 to
    # rank 0's 1: 10 + 1 = 11 < 14, but with an empty micro-batch, which the grid did not
    # have; the rank keeps its micro-batches.
    lens = np.array([10, 1, 3, 4])
    costs = lens.astype(float)
    grid = [[[0], [1]], [[2], [3]]]
    out = fill_to_levels(grid, costs, lens, 16)
    assert all(mb for rank in out for mb in rank)


def _random_grid(lens, dp, m, cap, seed):
    """A random grid that fits: the sequences dealt to dp * m micro-batches first-fit in a
    shuffled order; None if one spills over (the test then skips)."""
    rng = np.random.default_rng(seed)
    bins: list[list[int]] = [[] for _ in range(dp * m)]
    room = [cap] * (dp * m)
    for i in rng.permutation(len(lens)).tolist():
        b = next((b for b in range(dp * m) if room[b] >= lens[i]), None)
        if b is None:
            return None
        bins[b].append(i)
        room[b] -= int(lens[i])
    return [[bins[r * m + j] for j in range(m)] for r in range(dp)]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 16), min_size=4, max_size=24),
    dp=st.integers(2, 4),
    m=st.integers(2, 3),
    quad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_refill_keeps_ranks_and_capacity_and_never_slows(lengths, dp, m, quad, seed):
    lens = np.array(lengths, dtype=np.int64)
    costs = lens.astype(float) ** 2 if quad else lens.astype(float) + 0.25
    cap = 16
    grid = _random_grid(lens, dp, m, cap, seed)
    if grid is None:
        return
    out = fill_to_levels(grid, costs, lens, cap)
    assert out == fill_to_levels(grid, costs, lens, cap)  # deterministic
    assert len(out) == dp and all(len(rank) == m for rank in out)
    for before, after in zip(grid, out):
        # every rank keeps exactly its sequences, every micro-batch fits, none is emptied
        assert sorted(i for mb in before for i in mb) == sorted(i for mb in after for i in mb)
        assert all(int(lens[mb].sum()) <= cap for mb in after)
        if all(before):
            assert all(after)
    assert _fsdp_step(out, costs) <= _fsdp_step(grid, costs)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "n", "dp", "m", "gap"),
    [
        # 64 ranks, two micro-batches each; one 18,945-token sequence sets slot 0's level.
        # Before slots were refilled the plan was 3.6% above the bound: the ranks whose
        # work was evened out could not move two sequences into slot 0 for one.
        ("bimodal", 1024, 64, 2, 0.005),
        # 16 sequences a rank in 3 slots, 191 of them above cap / 2: without the look-ahead
        # the rest of many ranks could not split under the last two slots' levels (1.31%
        # above the bound).
        ("rl-math", 4096, 256, 3, 0.01),
    ],
)
def test_fsdp_plan_near_the_bound(workload, n, dp, m, gap):
    lens = workloads.load(workload, n, seed=0).lengths
    costs = load_cost("Qwen2.5-7B")(lens)
    p = plan(lens, dp, 32768, cost=costs, sync="fsdp")
    assert p.num_micro_batches == m
    assert not any(p.violations().values())
    assert p.simulate().gap < gap


def test_refill_looks_ahead_over_the_last_two_slots():
    # Targets 10, 6, 6 for a rank holding costs 6, 9, 2, 2 (a token each). The fullest first
    # micro-batch, {6, 2, 2} = 10, leaves the 9 to two slots of target 6: one of them empty
    # (so the rank would keep its micro-batches) or 3 over. The look-ahead takes {9} first
    # instead: then {6} and {2, 2} fit their targets.
    costs = np.array([6.0, 9.0, 2.0, 2.0])
    lens = np.ones(4, dtype=np.int64)
    grid = [[[0], [1], [2, 3]]]
    out = _refill(grid, costs, lens, 100, np.array([10.0, 6.0, 6.0]), head=6)
    assert out == [[[1], [0], [2, 3]]]


def test_refill_judged_in_the_requested_order():
    # order="index" sorts each rank's micro-batches by their first sequence, on each rank
    # alone, which can undo the alignment the refill built. The refill is kept only if it
    # is faster in that order: here the refilled plan, reordered by index, was 21% slower
    # than the plan without it (609.6 against 502.1).
    from seqbalance.costs import QuadraticCost
    from seqbalance.planning._ordering import order_grid
    from seqbalance.planning.simulation import microbatch_costs, step_time_of

    lens = np.array(
        [1, 2, 1, 3, 2, 2, 1, 1, 1, 2, 3, 1, 2, 1, 3, 3, 23, 3, 2, 2, 1, 1, 2, 3, 28, 2, 2,
         2, 2, 3, 3, 2, 1, 3, 24, 3, 26, 3, 1, 18, 2, 2, 3, 1, 1, 2, 3, 3, 2, 2, 2, 1, 1, 1,
         1, 1, 2, 3, 19, 2, 1, 2, 3, 3, 3, 1, 30, 31, 3, 2, 1, 3, 3, 1, 1, 1, 1, 2, 2, 2, 24,
         3, 2, 3, 1, 3, 3, 1, 3, 3, 1, 3, 1, 3, 1, 2, 1, 2, 3, 2, 3, 3, 1, 19, 2, 2, 2, 2, 26,
         2, 3, 3, 1, 2, 1, 3, 19, 3, 1, 17, 2, 2, 2, 23, 2, 1]
    )  # fmt: skip
    cost = QuadraticCost(per_token=1.0, per_token_sq=0.2869839382475947, per_sequence=3.0)
    costs = cost(lens)
    free = plan(lens, 10, 32, cost=cost, sync="fsdp")
    by_index = plan(lens, 10, 32, cost=cost, sync="fsdp", order="index")
    reordered = order_grid(free.micro_batches, costs, 0.0, False, "index")
    reordered_step = step_time_of(microbatch_costs(reordered, costs), "fsdp")
    assert by_index.simulate().step_time < 0.9 * reordered_step


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=6, max_size=30),
    dp=st.integers(2, 4),
    m=st.integers(3, 4),
    seed=st.integers(0, 2**16),
)
def test_refill_never_slower_than_without_the_look_ahead(lengths, dp, m, seed):
    # The look-ahead is a heuristic: on its own it sometimes ends slower than the plain
    # refill (94 of ~20,000 random small grids). On small grids both run and the faster
    # is kept.
    lens = np.array(lengths, dtype=np.int64)
    costs = lens.astype(float) ** 2 + 3 * lens
    grid = _random_grid(lens, dp, m, 64, seed)
    if grid is None:
        return
    with mock.patch.object(_slots, "_LOOKAHEAD", 1):
        plain = fill_to_levels(grid, costs, lens, 64)
    assert _fsdp_step(fill_to_levels(grid, costs, lens, 64), costs) <= _fsdp_step(plain, costs)


def test_refill_keeps_the_plain_pass_where_looking_ahead_loses():
    # A grid found by random search where the look-ahead alone ends slower than the plain
    # refill: the plain pass's plan must be the one kept.
    lens = np.array([11, 10, 7, 8, 15, 6, 3, 10], dtype=np.int64)
    costs = lens.astype(float) ** 2 + 3 * lens
    grid = [[[0, 6], [2, 5], [1]], [[7], [4], [3]]]
    with mock.patch.object(_slots, "_LOOKAHEAD", 1):
        plain = _fsdp_step(fill_to_levels(grid, costs, lens, 16), costs)
    with mock.patch.object(_slots, "_LEVEL_BOTH_WORK", -1):
        ahead = _fsdp_step(fill_to_levels(grid, costs, lens, 16), costs)
    assert ahead > plain  # the case this test is about
    assert _fsdp_step(fill_to_levels(grid, costs, lens, 16), costs) == plain
