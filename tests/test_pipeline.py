"""Pipeline simulator: closed forms, an independent event loop, the bound against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.planning.pipeline import (
    check_pipeline,
    pipeline_lower_bound,
    simulate_pipeline,
    stage_orders,
)

LAYOUTS = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("interleaved", 4)]


def _counts(schedule: str, p: int) -> list[int]:
    step = p if schedule == "interleaved" else 1
    return [m for m in range(1, 4 * p + 3) if m % step == 0]


@pytest.mark.parametrize("schedule,v", LAYOUTS)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("fb", [(1, 2), (2, 5), (3, 3)])  # per-stage-chunk f, b (integers)
def test_closed_forms_exactly(schedule, v, p, fb):
    # Whole-model costs chosen so every per-operation time is an integer: sums are exact.
    f_op, b_op = fb
    for m in _counts(schedule, p):
        sim = simulate_pipeline(
            [float(f_op * p * v)] * m,
            [float(b_op * p * v)] * m,
            p,
            schedule=schedule,
            virtual_stages=v,
        )
        f, b = f_op * v, b_op * v  # per-stage forward and backward (all chunks)
        if v == 1:
            expected = (m + p - 1) * (f + b)
        else:
            expected = m * (f + b) + (p - 1) * (f + b) // v  # (m + (p-1)/v)(f + b)
        assert sim.step_time == expected, (schedule, v, p, m)
        assert sim.lower_bound == expected  # the bound is tight on equal micro-batches
        assert sim.gap == 0.0
        np.testing.assert_array_equal(sim.stage_busy, [m * (f + b)] * p)
        assert sim.bubble_fraction == pytest.approx((expected - m * (f + b)) / expected)


def _event_loop(fwd, bwd, comm, p, schedule, v):
    """Independent reference: stages take turns; an op runs once its input has arrived."""
    orders = stage_orders(p, len(fwd), schedule, v)
    done: dict[tuple, float] = {}
    nxt = [0] * p
    free = [0.0] * p
    total = sum(len(o) for o in orders)
    while len(done) < total:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                ph, i, c = orders[s][nxt[s]]
                if ph == 0:
                    src = (0, i, c, s - 1) if s else ((0, i, c - 1, p - 1) if c else None)
                    dur = fwd[i] / (p * v)
                elif s == p - 1 and c == v - 1:
                    src, dur = (0, i, c, s), bwd[i] / (p * v)
                else:
                    src = (1, i, c, s + 1) if s < p - 1 else (1, i, c + 1, 0)
                    dur = bwd[i] / (p * v)
                if src is not None and src not in done:
                    break
                ready = 0.0 if src is None else done[src] + (comm[i] if src[3] != s else 0.0)
                start = max(free[s], ready)
                free[s] = done[(ph, i, c, s)] = start + dur
                nxt[s] += 1
                progressed = True
        assert progressed, "deadlock"
    return max(done.values())


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
    p=st.integers(1, 4),
    k=st.integers(1, 3),
    seed=st.integers(0, 10**6),
    with_comm=st.booleans(),
)
def test_matches_independent_event_loop(layout, p, k, seed, with_comm):
    schedule, v = layout
    m = k * p if schedule == "interleaved" else k + p
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.1, 5.0, m)
    b = f * rng.uniform(1.0, 3.0, m)
    c = rng.uniform(0.0, 1.0, m) if with_comm else np.zeros(m)
    sim = simulate_pipeline(f, b, p, schedule=schedule, virtual_stages=v, comm=c)
    assert sim.step_time == pytest.approx(_event_loop(f, b, c, p, schedule, v), rel=1e-12)
    assert sim.step_time >= sim.lower_bound * (1 - 1e-12)
    # Stages never run two operations at once, and every op runs for its cost.
    for s in range(p):
        sel = sim.stage == s
        st_, en = sim.start[sel], sim.end[sel]
        assert np.all(st_[1:] >= en[:-1] - 1e-12)
    np.testing.assert_allclose(sim.stage_busy + sim.stage_idle, sim.step_time)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
    p=st.integers(2, 4),
    m=st.integers(1, 5),
    seed=st.integers(0, 10**6),
    with_comm=st.booleans(),
    sigma=st.sampled_from([1.0, 2.0]),  # 2.0: one micro-batch often dominates
)
def test_bound_below_every_order(layout, p, m, seed, with_comm, sigma):
    schedule, v = layout
    if schedule == "interleaved":
        m = p * (1 + m % 2)
        if m > 6:
            m = p
    rng = np.random.default_rng(seed)
    f = rng.lognormal(0.0, sigma, m)
    b = f * rng.uniform(1.5, 3.0, m)
    c = rng.uniform(0.0, 0.5, m) if with_comm else None
    bound = pipeline_lower_bound(f, b, p, virtual_stages=v, comm=c, schedule=schedule)
    best = min(
        simulate_pipeline(
            f[list(o)],
            b[list(o)],
            p,
            schedule=schedule,
            virtual_stages=v,
            comm=None if c is None else c[list(o)],
        ).step_time
        for o in itertools.permutations(range(m))
    )
    assert bound <= best * (1 + 1e-12)


def test_one_f_one_b_order_and_memory():
    # Stage s keeps at most p - s micro-batches in flight (1F1B's memory promise).
    p, m = 4, 7
    for s, ops in enumerate(stage_orders(p, m, "1f1b")):
        in_flight = peak = 0
        for ph, _, _ in ops:
            in_flight += 1 if ph == 0 else -1
            peak = max(peak, in_flight)
        assert peak == p - s
        assert sorted(ops) == sorted([(0, i, 0) for i in range(m)] + [(1, i, 0) for i in range(m)])
    gpipe = [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0), (1, 2, 0)]
    assert stage_orders(2, 3, "gpipe")[1] == gpipe


def test_interleaved_visits_every_chunk_once():
    p, v, m = 3, 2, 6
    for ops in stage_orders(p, m, "interleaved", v):
        want = [(ph, i, c) for ph in (0, 1) for i in range(m) for c in range(v)]
        assert sorted(ops) == sorted(want)


def test_unequal_costs_by_hand():
    # p = 2, 1F1B, two micro-batches; per stage f = (1, 2), b = (2, 4).
    # stage 0: F0 [0,1] F1 [1,3]; stage 1: F0 [1,2] B0 [2,4] F1 [4,6] B1 [6,10];
    # stage 0: B0 [4,6] B1 [10,14]. Each stage is busy 1 + 2 + 2 + 4 = 9.
    sim = simulate_pipeline([2.0, 4.0], [4.0, 8.0], 2)
    assert sim.step_time == 14.0
    np.testing.assert_array_equal(sim.stage_busy, [9.0, 9.0])
    np.testing.assert_array_equal(sim.stage_idle, [5.0, 5.0])
    # Bound: W + (p - 1) * min over a != z of f_a + b_z = 9 + min(1 + 4, 2 + 2) = 13.
    assert sim.lower_bound == 13.0
    # The other order: stage 0 F [0,2] [2,3]; stage 1 F0 [2,4] B0 [4,8] F1 [8,9] B1 [9,11];
    # stage 0 B0 [8,12] B1 [12,14].
    assert simulate_pipeline([4.0, 2.0], [8.0, 4.0], 2).step_time == 14.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"pp_size": 0}, "pp_size"),
        ({"pp_size": 2, "schedule": "zb"}, "schedule"),
        ({"pp_size": 2, "schedule": "interleaved"}, "virtual_stages >= 2"),
        ({"pp_size": 2, "schedule": "1f1b", "virtual_stages": 2}, "applies to"),
    ],
)
def test_bad_layouts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_pipeline(**kwargs)


def test_interleaved_needs_multiple_of_p():
    with pytest.raises(ValueError, match="multiple of pp_size=4"):
        simulate_pipeline([1.0] * 6, [2.0] * 6, 4, schedule="interleaved", virtual_stages=2)


def test_mismatched_inputs():
    with pytest.raises(ValueError, match="backward has 2 entries"):
        simulate_pipeline([1.0], [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="comm has 1 entries"):
        simulate_pipeline([1.0, 1.0], [1.0, 2.0], 2, comm=[0.1])


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 9), seed=st.integers(0, 10**6))
def test_gpipe_step_is_the_flow_shop_formula_for_every_order(p, m, seed):
    # GPipe is two proportionate flow shops: W + (p - 1)(max f + max b), order-free.
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.1, 3.0, m)
    b = rng.uniform(0.1, 6.0, m)
    expected = (f + b).sum() / p + (p - 1) * (f.max() + b.max()) / p
    for _ in range(3):
        o = rng.permutation(m)
        sim = simulate_pipeline(f[o], b[o], p, schedule="gpipe")
        assert sim.step_time == pytest.approx(expected, rel=1e-12)
        assert sim.lower_bound == pytest.approx(expected, rel=1e-12)


def test_pipeline_lower_bound_checks_the_schedule_with_one_micro_batch():
    from seqbalance.planning.pipeline import pipeline_lower_bound

    with pytest.raises(ValueError, match="schedule must be one of"):
        pipeline_lower_bound([1.0], [2.0], 2, schedule="x")  # was accepted: m == 1 shortcut


@pytest.mark.parametrize(
    ("kwargs", "m", "words"),
    [
        ({"schedule": "1f1b", "virtual_stages": 2}, 1, "applies to schedule='interleaved' only"),
        ({"schedule": "interleaved", "virtual_stages": 2}, 1, "multiple of pp_size=2"),
        ({"schedule": "interleaved", "virtual_stages": 2}, 3, "multiple of pp_size=2"),
        ({"pp_size": 10**6}, 4, "pp_size"),
        ({"pp_size": 10**6, "schedule": "1f1b"}, 600, "pp_size"),
    ],
)
def test_pipeline_lower_bound_checks_the_layout_at_every_count(kwargs, m, words):
    # The layout was checked only where the window term runs (2 <= m <= 512): one
    # micro-batch took virtual_stages=2 with 1f1b, and pp_size=10**6 passed everywhere,
    # where simulate_pipeline refuses them.
    kw = {"pp_size": 2, **kwargs}
    with pytest.raises(ValueError, match=words):
        sb.pipeline_lower_bound([1.0] * m, [2.0] * m, **kw)
    with pytest.raises(ValueError, match=words):
        sb.simulate_pipeline([1.0] * m, [2.0] * m, **kw)
