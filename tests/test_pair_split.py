"""Splitting two micro-batches anew (FSDP): each step against a brute force over every
pair and every split, the pass's invariants, and the plan it lets the default effort stop
on."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning import _pair_split
from seqbalance.planning._pair_split import resplit_pairs
from seqbalance.planning._slots import fill_slack


def fsdp_step(grid, costs) -> float:
    return sum(
        max(float(costs[np.asarray(rank[j], dtype=np.int64)].sum()) for rank in grid)
        for j in range(len(grid[0]))
    )


def best_gain_brute(grid, costs, lens, cap, a) -> float:
    """The most any new split of top bin ``a`` with one other bin lowers the step (pools of
    at most ``_MAX_POOL`` sequences, neither side empty, both within the cap)."""
    dp, m = len(grid), len(grid[0])
    bins = [list(grid[r][j]) for j in range(m) for r in range(dp)]
    before = fsdp_step(grid, costs)
    best = 0.0
    for b in range(dp * m):
        if b == a or len(bins[a]) + len(bins[b]) > _pair_split._MAX_POOL:
            continue
        pool = bins[a] + bins[b]
        for k in range(1, len(pool)):
            for side in itertools.combinations(range(len(pool)), k):
                to_a = [pool[q] for q in side]
                to_b = [pool[q] for q in range(len(pool)) if q not in side]
                if lens[to_a].sum() > cap or lens[to_b].sum() > cap:
                    continue
                trial = [list(x) for x in bins]
                trial[a], trial[b] = to_a, to_b
                g = [[trial[j * dp + r] for j in range(m)] for r in range(dp)]
                best = max(best, before - fsdp_step(g, costs))
    return best


def random_grid(rng, dp, m, n):
    labels = np.concatenate([np.arange(dp * m), rng.integers(0, dp * m, n - dp * m)])
    rng.shuffle(labels)
    bins = [np.flatnonzero(labels == b).tolist() for b in range(dp * m)]
    return [[bins[j * dp + r] for j in range(m)] for r in range(dp)]


@settings(max_examples=40)
@given(st.integers(0, 2**31 - 1), st.integers(2, 3), st.integers(1, 3))
def test_one_step_is_the_best_split_of_the_heaviest_bin(seed, dp, m):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(dp * m, dp * m + 6))
    lens = rng.integers(1, 20, n)
    costs = lens.astype(np.float64) + 0.01 * lens.astype(np.float64) ** 2
    grid = random_grid(rng, dp, m, n)
    cap = int(max(lens.sum() // (dp * m) + 10, max(sum(lens[mb]) for r in grid for mb in r)))
    loads = np.array([[costs[mb].sum() for mb in rank] for rank in grid])  # [rank][slot]
    j = int(np.argmax(loads.max(axis=0)))  # the first slot the pass takes
    a = j * dp + int(np.argmax(loads[:, j]))
    want = best_gain_brute(grid, costs, lens, cap, a)
    # One step (work for the setup and one scan): what it gains is the brute force's
    # best, where every bin is scanned (dp * m - 1 <= _PARTNERS).
    assert dp * m - 1 <= _pair_split._PARTNERS
    setup = _pair_split._SEQUENCE_ELEMENTS * n + _pair_split._BIN_ELEMENTS * dp * m
    one = resplit_pairs(grid, costs, lens, cap, work=setup + 1)
    got = fsdp_step(grid, costs) - fsdp_step(one, costs)
    if want <= 1e-9 * fsdp_step(grid, costs):
        assert got <= 1e-9 * fsdp_step(grid, costs)
    else:
        assert abs(got - want) <= 1e-9 * fsdp_step(grid, costs)


@settings(max_examples=60)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.integers(1, 4))
def test_the_pass_keeps_every_sequence_once_within_the_cap(seed, dp, m):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(dp * m, 4 * dp * m + 1))
    lens = rng.integers(0, 50, n)
    costs = lens.astype(np.float64) ** 2 / 10 + lens
    grid = random_grid(rng, dp, m, n)
    cap = int(max(max(sum(lens[mb]) for r in grid for mb in r), 1))
    out = resplit_pairs(grid, costs, lens, cap)
    assert sorted(i for r in out for mb in r for i in mb) == list(range(n))
    assert all(mb for r in out for mb in r)  # none emptied
    assert all(mb == sorted(mb) for r in out for mb in r)
    assert max(int(lens[mb].sum()) for r in out for mb in r) <= cap
    assert fsdp_step(out, costs) <= fsdp_step(grid, costs) * (1 + 1e-12)
    assert resplit_pairs(grid, costs, lens, cap) == out  # deterministic


def test_stop_at_and_work_end_the_pass():
    lens = np.array([5, 4, 3, 3, 3, 2])
    c = lens.astype(float)
    grid = [[[0, 1], [4]], [[2, 3], [5]]]  # 9 + 3
    assert fill_slack(grid, c, lens, 8, max_steps=100) == grid  # no move or swap helps
    assert fsdp_step(resplit_pairs(grid, c, lens, 8), c) == 10.0  # the bound: 20 / 2
    assert resplit_pairs(grid, c, lens, 8, stop_at=12.0) == grid  # already there
    assert resplit_pairs(grid, c, lens, 8, work=0) == grid
    assert resplit_pairs([[[0, 1, 2]]], c, lens, 20) == [[[0, 1, 2]]]  # one bin


def test_a_slot_low_in_the_order_is_scanned_before_the_pass_gives_up():
    # 2 ranks x 10 slots: slots 0-7 are tied at 10 (nothing to gain there), slot 8 can
    # fall from 9 to 7. The stop (88) is reached only by scanning slot 8.
    c = np.array([10.0] * 16 + [6, 3, 4, 1, 1, 1])
    lens = np.ones(22, dtype=np.int64)
    grid = [[[2 * j] for j in range(8)] + [[16, 17], [20]],
            [[2 * j + 1] for j in range(8)] + [[18, 19], [21]]]  # fmt: skip
    assert fsdp_step(grid, c) == 90.0
    assert fsdp_step(resplit_pairs(grid, c, lens, 100, stop_at=88.0), c) == 88.0


def test_the_default_effort_stops_on_rl_math_64_over_8(monkeypatch):
    # Slack filling and evening out leave this batch 0.21% above the bound; new splits of
    # pairs bring it within the default's stop gap (0.1%), where the search stops.
    from seqbalance.planning import planner

    lens = workloads.load("rl-math", 64, seed=0).lengths
    cost = load_cost("qwen2.5-7b")
    p = sb.plan(lens, 8, 32768, cost=cost)
    assert p.num_micro_batches == 2
    assert p.simulate().gap <= 1e-3
    monkeypatch.setattr(planner, "resplit_pairs", lambda grid, *args, **kw: grid)
    without = sb.plan(lens, 8, 32768, cost=cost)
    assert without.simulate().gap > 2e-3
