"""Exchanges of sequences between ranks under DDP, and verl's pipeline with a count limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.costs import QuadraticCost, TokenCost
from seqbalance.planning._exchange import exchange_between_ranks
from seqbalance.planning._pipelines import verl_pipeline


def _loads(grid, costs):
    return np.array([sum(float(costs[i]) for mb in rank for i in mb) for rank in grid])


def test_known_swap_reaches_the_mean():
    # Rank 0 holds 7 + 3, rank 1 holds 5 + 1 (cost = tokens, cap 10): swapping 7 and 5
    # gives 8 and 8, the mean, so the exact optimum.
    lens = np.array([7, 3, 5, 1])
    grid = [[[0], [1]], [[2], [3]]]
    out = exchange_between_ranks(grid, lens.astype(float), lens, 10, moves=False,
                                 allow_empty=False)  # fmt: skip
    assert _loads(out, lens).tolist() == [8.0, 8.0]
    assert sorted(len(mb) for rank in out for mb in rank) == [1, 1, 1, 1]


def test_capacity_blocks_the_swap():
    # Rank 0: a (6 tokens, cost 5) + x (4, cost 1); rank 1: y (2, cost 3) + z (8, cost 0).
    # Loads 6 and 3. Swapping a and y (d = 2) or x and z (d = 1) would lower the busiest
    # rank, but each puts 14 tokens into a micro-batch: with cap 10 nothing may change,
    # with cap 14 the pair ends at 5 and 4 (or 5 and 4 the other way round).
    lens = np.array([6, 4, 2, 8])
    costs = np.array([5.0, 1.0, 3.0, 0.0])
    grid = [[[0, 1]], [[2, 3]]]
    kept = exchange_between_ranks(grid, costs, lens, 10, moves=False, allow_empty=False)
    assert kept is grid
    out = exchange_between_ranks(grid, costs, lens, 14, moves=False, allow_empty=False)
    assert sorted(_loads(out, costs).tolist()) == [4.0, 5.0]
    assert all(int(lens[mb].sum()) <= 14 for rank in out for mb in rank)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    dp=st.integers(2, 5),
    m=st.integers(1, 4),
    moves=st.booleans(),
    allow_empty=st.booleans(),
)
def test_exchange_properties(data, dp, m, moves, allow_empty):
    cap = data.draw(st.integers(20, 200))
    per_slot = data.draw(st.lists(st.lists(st.integers(1, 60), max_size=4),
                                  min_size=dp * m, max_size=dp * m))  # fmt: skip
    # Build a grid that respects the capacity: truncate each slot's list to fit.
    lens, grid, nxt = [], [[] for _ in range(dp)], 0
    for s, items in enumerate(per_slot):
        mb, tot = [], 0
        for x in items:
            x = min(x, cap)
            if tot + x <= cap:
                mb.append(nxt)
                lens.append(x)
                tot += x
                nxt += 1
        grid[s // m].append(mb)
    lens = np.array(lens, dtype=np.int64)
    costs = lens.astype(float) ** 1.5 + 1.0
    before = _loads(grid, costs)
    out = exchange_between_ranks(grid, costs, lens, cap, moves=moves, allow_empty=allow_empty)
    flat = sorted(i for rank in out for mb in rank for i in mb)
    assert flat == list(range(lens.size))  # every index exactly once
    assert all(len(rank) == m for rank in out)  # micro-batch counts kept
    assert all(int(lens[mb].sum()) <= cap for rank in out for mb in rank)
    after = _loads(out, costs)
    assert after.max() <= before.max() + 1e-9  # the busiest rank never gets heavier
    if not allow_empty:  # no micro-batch that had sequences is emptied
        was = [bool(mb) for rank in grid for mb in rank]
        now = [bool(mb) for rank in out for mb in rank]
        assert all(n or not w for w, n in zip(was, now))
    if not moves:  # swaps keep every count
        assert [[len(mb) for mb in r] for r in out] == [[len(mb) for mb in r] for r in grid]


def test_plan_ddp_tight_capacity_reaches_the_mean():
    # Two ranks, 64 RL-like lengths with nine at the cap: the micro-batches are nearly full,
    # and before the exchange pass the busiest rank sat 0.5% above the mean while a plan
    # balanced by tokens was 0.2% better under the very cost that planned it.
    lens = np.array(
        [140, 145, 181, 209, 219, 232, 238, 247, 251, 258, 270, 275, 294, 300, 313, 334,
         345, 350, 371, 384, 402, 403, 418, 419, 432, 438, 459, 509, 514, 568, 572, 574,
         616, 712, 744, 770, 872, 1070, 1144, 1145, 1166, 1245, 1252, 1282, 1304, 1307,
         1692, 1708, 1734, 1758, 1854, 1855, 1858, 1941, 2039] + [2048] * 9
    )  # fmt: skip
    cost = QuadraticCost(1.66e-6, 4.36e-8, 1.04e-3)
    p = sb.plan(lens, 2, 2048, cost=cost, sync="ddp")
    assert p.violations() == {} or not any(p.violations().values())
    mean = float(p.costs.sum()) / 2 + p.per_microbatch * p.num_micro_batches
    assert p.simulate(cost).step_time <= mean * (1 + 1e-4)
    tok = sb.plan(lens, 2, 2048, cost=TokenCost(), sync="ddp")
    assert tok.num_micro_batches == p.num_micro_batches
    assert p.simulate(cost).step_time <= tok.simulate(cost).step_time


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 400), min_size=1, max_size=40),
    dp=st.integers(1, 4),
    slack=st.integers(0, 600),
    limit=st.integers(1, 20),
)
def test_verl_count_limit_changes_nothing_below_it(lens, dp, slack, limit):
    lens = np.array(lens)
    cap = int(lens.max()) + slack
    full = verl_pipeline(lens, dp, cap)
    cut = verl_pipeline(lens, dp, cap, max_count=limit)
    # verl's final count is the micro-batch count of its fullest rank.
    count = max(len(r) for r in full)
    if count > limit:
        assert cut is None
    else:
        assert cut == full


def test_verl_count_limit_none_when_exceeded():
    lens = np.array([60] * 10)
    # Tokens alone need 6 micro-batches of 100 (two 60s never share one): verl needs 10.
    assert len(verl_pipeline(lens, 1, 100)[0]) == 10
    assert verl_pipeline(lens, 1, 100, max_count=9) is None
    assert verl_pipeline(lens, 1, 100, max_count=10) == verl_pipeline(lens, 1, 100)


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_plan_deterministic_with_exchange(sync):
    lens = sb.workloads.lengths("rl-math", 512, seed=3)
    a = sb.plan(lens, 8, 32768, cost="qwen2.5-7b", sync=sync)
    b = sb.plan(lens.copy(), 8, 32768, cost="qwen2.5-7b", sync=sync)
    assert a.micro_batches == b.micro_batches


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=24),
    dp=st.integers(2, 5),
    seed=st.integers(0, 2**16),
)
def test_groups_exchanged_within_tokens(sizes, dp, seed):
    """The token-bounded group exchange keeps groups whole, every index once, no rank
    above the token room, and never raises the busiest rank's cost."""
    from seqbalance.planning import planner as P

    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    lens = rng.integers(1, 500, size=groups.size)
    cap = int(lens.max()) * 2
    if np.unique(groups).size < dp:
        return
    req = P._validate_request(lens, dp, cap, QuadraticCost(1.0, 0.01), "fsdp", "free",
                              groups, 1, 1, False, False, 0, None, "error", None)  # fmt: skip
    m, _ = P._starting_micro_batches(req)
    start = [list(p) for p in sb.partition(lens, dp, groups=groups)]
    out = P._even_groups_within_tokens(req, start, m)
    assert sorted(i for r in out for i in r) == list(range(lens.size))
    for r in out:  # groups whole
        for g in np.unique(req.groups[r]):
            assert set(np.flatnonzero(req.groups == g).tolist()) <= set(r)
    room = max(m * cap, max(int(lens[r].sum()) for r in start))
    assert max(int(lens[r].sum()) for r in out) <= room
    before = max(float(req.costs[r].sum()) for r in start)
    assert max(float(req.costs[r].sum()) for r in out) <= before * (1 + 1e-12)
