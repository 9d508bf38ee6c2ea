"""Step-time simulation: exact small cases worked out by hand, and bound validity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.planning.simulation import simulate, step_time_lower_bound

# Two ranks, two micro-batches each. Costs by index: 0:4, 1:1, 2:2, 3:3, 4:5.
COSTS = np.array([4.0, 1.0, 2.0, 3.0, 5.0])
MBS = [[[0], [1, 2]], [[3], [4]]]  # rank 0: 4 then 3; rank 1: 3 then 5


def test_ddp_is_max_of_rank_totals():
    sim = simulate(MBS, COSTS, sync="ddp")
    assert sim.step_time == 8.0  # rank 0: 4 + 3 = 7, rank 1: 3 + 5 = 8
    np.testing.assert_array_equal(sim.rank_busy, [7.0, 8.0])
    np.testing.assert_array_equal(sim.rank_idle, [1.0, 0.0])
    np.testing.assert_array_equal(sim.start, [[0.0, 4.0], [0.0, 3.0]])


def test_fsdp_is_sum_of_slot_maxima():
    sim = simulate(MBS, COSTS, sync="fsdp")
    assert sim.step_time == 9.0  # slot 0: max(4, 3) = 4; slot 1: max(3, 5) = 5
    np.testing.assert_array_equal(sim.start, [[0.0, 4.0], [0.0, 4.0]])
    np.testing.assert_array_equal(sim.rank_idle, [2.0, 1.0])
    assert sim.idle_fraction == pytest.approx(3.0 / 18.0)


def test_per_microbatch_cost_and_padding():
    sim = simulate(MBS, COSTS, sync="ddp", per_microbatch=10.0, padded=True)
    # rank 0: (10 + 4) + (10 + 2 * max(1, 2)) = 28; rank 1: 13 + 15 = 28
    np.testing.assert_array_equal(sim.mb_costs, [[14.0, 14.0], [13.0, 15.0]])
    assert sim.step_time == 28.0


def test_empty_microbatch_pays_fixed_cost():
    sim = simulate([[[0, 1, 2, 3, 4], []]], COSTS, sync="fsdp", per_microbatch=2.0)
    np.testing.assert_array_equal(sim.mb_costs, [[17.0, 2.0]])


def test_gap_against_default_bound():
    sim = simulate(MBS, COSTS, sync="fsdp")
    # bound = max(15 / 2, 5) = 7.5, rounded up to 8: integer costs give integer rank totals
    assert sim.lower_bound == 8.0
    assert sim.gap == pytest.approx(9.0 / 8.0 - 1.0)


def test_unequal_counts_rejected():
    with pytest.raises(ValueError, match="different numbers of micro-batches"):
        simulate([[[0], [1, 2]], [[3, 4]]], COSTS)


@pytest.mark.parametrize(
    ("mbs", "kwargs", "words"),
    [
        # Each was accepted before the review: a -33% gap, an index 1.5, a gap of +inf...
        ([[[0, 1, 2, 3], [0, 4]]], {}, "1 repeated"),
        ([[[0, 1, 2], [3]]], {}, "1 missing"),
        ([[[0, 1, 2, 3], [4.5]]], {}, "integer sequence indices"),
        ([[[0, 1, 2, 3], [7]]], {}, "index 7, outside 0..4"),
        ([[0, 1, 2, 3, 4]], {}, "nested lists"),
        (None, {}, "nested lists"),
        (MBS, {"per_microbatch": -1.0}, "per_microbatch"),
        (MBS, {"per_microbatch": float("nan")}, "per_microbatch"),
        (MBS, {"padded": "no"}, "padded must be True or False"),
        (MBS, {"lower_bound": float("nan")}, "lower_bound"),
        (MBS, {"lower_bound": -1.0}, "lower_bound"),
    ],
)
def test_simulate_refuses_bad_layouts_and_numbers(mbs, kwargs, words):
    with pytest.raises(ValueError, match=words):
        simulate(mbs, COSTS, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lengths": [1, 2], "max_tokens": 10}, "lengths has 2 entries but costs has 5"),
        ({"lengths": [1, 2, 3, 4, 5], "max_tokens": 0}, "max_tokens"),
        ({"lengths": [1, 2, 3, 4, 5]}, "together"),
        ({"lengths": [1, -2, 3, 4, 5], "max_tokens": 10}, "negative"),
        ({"sync": "x"}, "sync"),
        ({"per_microbatch": -5.0}, "per_microbatch"),
        ({"per_microbatch": float("nan")}, "per_microbatch"),
        ({"min_micro_batches": -1}, "min_micro_batches"),
    ],
)
def test_step_time_lower_bound_refuses_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        step_time_lower_bound(COSTS, 2, **kwargs)


def test_bad_sync_rejected():
    with pytest.raises(ValueError, match="sync"):
        simulate(MBS, COSTS, sync="zero3")


def test_bound_formula():
    assert step_time_lower_bound(COSTS, 2) == 8.0  # ceil(15 / 2): integer costs
    assert step_time_lower_bound(COSTS, 5) == 5.0  # the largest item dominates
    assert step_time_lower_bound(COSTS, 2, min_micro_batches=3, per_microbatch=1.0) == 11.0
    assert step_time_lower_bound(np.zeros(0), 4, per_microbatch=2.0) == 2.0


@settings(max_examples=60, deadline=None)
@given(
    costs=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=24),
    dp=st.integers(1, 4),
    m=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    c0=st.floats(0, 100),
)
def test_bound_never_beaten(costs, dp, m, seed, c0):
    """Any assignment of sequences to dp x m micro-batches takes at least the bound."""
    w = np.asarray(costs)
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, dp * m, size=w.size)
    mbs = [[np.flatnonzero(slot == r * m + j).tolist() for j in range(m)] for r in range(dp)]
    bound = step_time_lower_bound(w, dp, min_micro_batches=m, per_microbatch=c0)
    for sync in ("ddp", "fsdp"):
        sim = simulate(mbs, w, sync=sync, per_microbatch=c0)
        assert sim.step_time >= bound * (1 - 1e-12)
    assert simulate(mbs, w, sync="fsdp").step_time >= simulate(mbs, w, sync="ddp").step_time
