"""The slot-first FSDP plan (seqbalance.planning._slot_first) and its place in the planner."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning import _slot_first, planner
from seqbalance.planning._slot_first import slot_first

_QWEN = load_cost("qwen2.5-7b")


def _check(grid, lens: np.ndarray, dp: int, m: int, cap: int) -> None:
    assert len(grid) == dp and all(len(rank) == m for rank in grid)
    flat = sorted(i for rank in grid for mb in rank for i in mb)
    assert flat == list(range(lens.size))  # every index exactly once
    assert all(mb for rank in grid for mb in rank)  # no micro-batch empty
    assert max(int(lens[mb].sum()) for rank in grid for mb in rank) <= cap


def _band_maxima(costs: np.ndarray, lens: np.ndarray, dp: int) -> float:
    """The sum over bands of dp (longest first, ties: lower index) of the costliest."""
    order = np.lexsort((np.arange(lens.size), -lens))
    return float(np.maximum.reduceat(costs[order], np.arange(0, lens.size, dp)).sum())


def _step(grid, costs: np.ndarray) -> float:
    m = len(grid[0])
    return sum(max(float(costs[rank[j]].sum()) for rank in grid) for j in range(m))


@settings(max_examples=300, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    dp=st.integers(1, 6),
    m=st.integers(1, 5),
    cap=st.integers(40, 120),
    quadratic=st.booleans(),
)
@example(lens=[6, 5, 4, 4, 3, 2, 2, 1], dp=2, m=2, cap=8, quadratic=True)
@example(lens=[40] * 7, dp=2, m=2, cap=80, quadratic=False)  # a short last band
def test_a_plan_holds_every_sequence_once_within_the_cap_and_the_band_bound(
    lens, dp, m, cap, quadratic
) -> None:
    """Every index once, no micro-batch empty or over the cap, and the step at most the
    sum of each band's costliest sequence (the bound the module docstring states)."""
    lens = np.asarray(lens, dtype=np.int64)
    costs = lens.astype(np.float64) ** (2 if quadratic else 1) + 0.5
    grid = slot_first(costs, lens, dp, m, cap)
    if lens.size < dp * m:
        assert grid is None
    if grid is None:
        return
    _check(grid, lens, dp, m, cap)
    assert _step(grid, costs) <= _band_maxima(costs, lens, dp) * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=4, max_size=50),
    dp=st.integers(2, 5),
    m=st.integers(1, 4),
    cap=st.integers(40, 90),
)
def test_the_band_by_band_split_alone_fits(lens, dp, m, cap) -> None:
    """Where the costliest-first split finds no room, the band-by-band split (as step 2
    counted the tokens) always fits: the plan stays valid without the first."""
    lens = np.asarray(lens, dtype=np.int64)
    costs = lens.astype(np.float64) ** 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_slot_first, "least_loaded_with_room", lambda *a: None)
        grid = slot_first(costs, lens, dp, m, cap)
    if grid is not None:
        _check(grid, lens, dp, m, cap)


def test_no_plan_where_a_band_fits_no_slot_or_too_few_sequences() -> None:
    lens = np.array([10, 10, 10])
    costs = lens.astype(np.float64)
    assert slot_first(costs, lens, 1, 2, 10) is None  # a third band of one fits nowhere
    assert slot_first(costs, lens, 2, 2, 10) is None  # 3 sequences, 4 micro-batches
    # a slot that would hold only the short last band leaves a rank without a sequence
    assert slot_first(np.ones(3), np.array([5, 5, 5]), 2, 2, 5) is None


def test_same_input_same_plan() -> None:
    w = workloads.load("rl-math", 512, seed=3)
    costs = w.lengths.astype(np.float64) ** 2
    one = slot_first(costs, w.lengths, 8, 9, 32768)
    assert one is not None and one == slot_first(costs.copy(), w.lengths.copy(), 8, 9, 32768)


def test_the_default_stops_on_it_where_the_packings_end_far_from_the_bound(monkeypatch):
    """rl-math, 1,024 sequences over 8 ranks (bench/latency.py's row), FSDP: the greedy
    plan strands a sequence, capacitated LPT finds no packing, and the packings end 0.18%
    above the bound after every candidate; the slot-first plan is within the stop gap,
    so the search ends there, before the packings."""
    w = workloads.load("rl-math", 1024, seed=0)
    packed: list[object] = []
    real = planner._plan_global
    monkeypatch.setattr(planner, "_plan_global", lambda *a, **k: packed.append(1) or real(*a, **k))
    p = sb.plan(w.lengths, 8, 32768, cost=_QWEN)
    assert not packed
    assert p.simulate().gap <= 1e-3
    assert any("slot-first plan" in n for n in p.notes)
    _check(p.micro_batches, w.lengths, 8, p.num_micro_batches, 32768)
    fast = sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort="fast")
    assert p.num_micro_batches == fast.num_micro_batches


@pytest.mark.parametrize(
    ("effort", "kwargs", "tried"),
    [
        ("default", {}, True),
        ("thorough", {}, True),  # one more candidate
        ("fast", {}, False),  # the default's other first steps only
        ("default", {"sync": "ddp"}, False),
        ("default", {"size": "equal"}, False),
    ],
)
def test_tried_under_fsdp_at_default_and_thorough(monkeypatch, effort, kwargs, tried) -> None:
    calls: list[object] = []
    monkeypatch.setattr(planner, "slot_first", lambda *a: calls.append(a) or None)
    w = workloads.load("rl-math", 1024, seed=0)
    sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort=effort, **kwargs)
    assert bool(calls) == tried


def test_thorough_is_never_slower_than_the_default_on_it() -> None:
    """The slot-first plan is among "thorough"'s candidates too, evened out further."""
    w = workloads.load("rl-math", 1024, seed=0)
    default = sb.plan(w.lengths, 8, 32768, cost=_QWEN)
    thorough = sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort="thorough")
    assert thorough.simulate().step_time <= default.simulate().step_time


def test_not_tried_where_the_greedy_plan_places_every_sequence(monkeypatch) -> None:
    """rl-math, 1,024 over 8 ranks, seed 3: the greedy plan places every sequence, though
    not within the stop gap (the packings run after it), so the slot-first plan is not
    built."""
    calls: list[object] = []
    packed: list[object] = []
    real = planner._plan_global
    monkeypatch.setattr(planner, "slot_first", lambda *a: calls.append(a) or None)
    monkeypatch.setattr(planner, "_plan_global", lambda *a, **k: packed.append(1) or real(*a, **k))
    w = workloads.load("rl-math", 1024, seed=3)
    sb.plan(w.lengths, 8, 32768, cost=_QWEN)
    assert packed and not calls
