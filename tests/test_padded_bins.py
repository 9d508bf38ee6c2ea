"""The exact padded bin count (longest first, as many as fit) against exhaustive search."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_capacity_bounds import _set_partitions

import seqbalance as sb
from seqbalance.planning.bounds import min_padded_bins


def brute_force(lengths, cap):
    best = math.inf
    for part in _set_partitions(list(range(len(lengths)))):
        if all(len(b) * max(lengths[i] for i in b) <= cap for b in part):
            best = min(best, len(part))
    return best


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=7), slack=st.integers(1, 60))
def test_matches_exhaustive_search(lengths, slack):
    cap = max(lengths) + slack
    assert min_padded_bins(np.array(lengths), cap) == brute_force(lengths, cap)


def test_known_values():
    assert min_padded_bins(np.array([6, 5, 3, 3, 3]), 10) == 3  # {6}, {5, 3}, {3, 3}
    assert min_padded_bins(np.array([10] * 4), 10) == 4
    assert min_padded_bins(np.array([1] * 100), 10) == 10
    assert min_padded_bins(np.array([], dtype=np.int64), 10) == 0
    assert min_padded_bins(np.array([0, 0, 0]), 10) == 1
    assert min_padded_bins(np.array([5, 5, 0]), 10) == 2  # {5, 5}, {0}


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    dp=st.integers(1, 4),
    slack=st.integers(0, 80),
)
def test_padded_plan_never_below_the_exact_count(lengths, dp, slack):
    lens = np.array(lengths)
    cap = max(int(lens.max()) + slack, 1)
    p = sb.plan(lens, dp, cap, padded=True, allow_empty=True)
    need = max(1, math.ceil(min_padded_bins(lens, cap) / dp))
    assert p.num_micro_batches >= need
    # Every micro-batch obeys the padded capacity.
    for rank in p.micro_batches:
        for mb in rank:
            if mb:
                assert len(mb) * int(lens[mb].max()) <= cap


def test_padded_plan_note_states_the_proof():
    # 64 sequences of 600 tokens and 64 of 50 at cap 1,000: one 600 per padded micro-batch,
    # and the 50s fill 20 per micro-batch, so 64 + 4 = 68 micro-batches in all (2 ranks:
    # 34 each), although the tokens alone fit in 42.
    lens = np.array([600] * 64 + [50] * 64)
    assert min_padded_bins(lens, 1000) == 68
    p = sb.plan(lens, 2, 1000, padded=True)
    assert p.num_micro_batches == 34
    assert any("padded to their longest sequence" in n for n in p.notes)
