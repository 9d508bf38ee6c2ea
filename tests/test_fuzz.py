"""Fuzz suite: random inputs, good and bad, against the invariants of partition and plan.

The invariants are checked from first principles (sums and counts recomputed here), never
against numbers taken from the code's output. Bad inputs must end in a ValueError or
TypeError (never another exception, a crash or a stall). Every test has a bounded number of
examples and a pytest timeout, so the suite runs in CI in well under a minute.
"""

from __future__ import annotations

import itertools
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.planning.plans import Plan

# SEQBALANCE_FUZZ_EXAMPLES=5000 runs a longer campaign (with a larger pytest timeout).
EXAMPLES = int(os.environ.get("SEQBALANCE_FUZZ_EXAMPLES", "250"))
FAST = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
SIZES = ("free", "equal", "balanced")


def check_cover(parts, n):
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n)), "every index exactly once"


# ---- partition -----------------------------------------------------------------------
weights_st = st.one_of(
    st.lists(st.integers(0, 10**6), max_size=40),
    st.lists(st.floats(0, 1e9, allow_nan=False, allow_infinity=False), max_size=40),
    st.lists(st.sampled_from([0, 1, 1, 2, 1000, 10**12]), max_size=40),  # ties and spikes
    # Decimals: their float sums round, which is where bounds and gaps go wrong by an ulp.
    st.lists(st.integers(0, 100).map(lambda x: x / 10), max_size=40),
)


@FAST
@given(weights_st, st.integers(1, 12), st.sampled_from(SIZES), st.booleans(), st.data())
@pytest.mark.timeout(120)
def test_partition_invariants(weights, k, size, grouped, data):
    n = len(weights)
    groups = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)) if grouped else None
    units = len(set(groups)) if grouped else n
    if size == "equal" and units % k:
        with pytest.raises(ValueError, match="equal"):
            sb.partition(weights, k, size=size, groups=groups)
        return
    p = sb.partition(weights, k, size=size, groups=groups)
    assert len(p) == k
    check_cover(p, n)
    loads = [math.fsum(weights[i] for i in part) for part in p]
    np.testing.assert_allclose(p.loads, loads, rtol=1e-9, atol=1e-6)
    counts = [len({groups[i] for i in part}) if grouped else len(part) for part in p]
    if size == "equal":
        assert set(counts) <= {units // k}
    if size == "balanced":
        assert max(counts) - min(counts) <= 1
    if grouped:
        where = {}
        for j, part in enumerate(p):
            for i in part:
                assert where.setdefault(groups[i], j) == j, "a group spans parts"
    assert p.gap >= 0.0 and p.max_load >= p.lower_bound
    # The bound holds against a simple certificate: the largest unit and the average part.
    assert p.max_load >= max(loads, default=0.0) * (1 - 1e-12)
    # Determinism: the same call gives the same partition.
    assert sb.partition(weights, k, size=size, groups=groups) == p


@FAST
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=30))
@pytest.mark.timeout(60)
def test_one_part_gap_is_exact(weights):
    # With k=1 there is one partition, so it is optimal and the reported gap is exactly 0.
    p = sb.partition(weights, 1)
    assert p.gap == 0.0
    assert sb.balance_stats(weights, [list(range(len(weights)))])["gap"] == 0.0


@FAST
@given(
    st.lists(
        st.one_of(st.integers(0, 20), st.integers(0, 20).map(lambda x: x / 10)),
        min_size=1, max_size=7,
    ),
    st.integers(1, 3),
    st.booleans(),
    st.data(),
)
@pytest.mark.timeout(120)
def test_bound_and_zero_gap_against_brute_force(weights, k, grouped, data):
    # The true optimum, by trying every assignment of the units in exact rationals.
    n = len(weights)
    groups = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) if grouped else None
    ids = sorted(set(groups)) if grouped else list(range(n))
    unit_of = [ids.index(groups[i]) for i in range(n)] if grouped else list(range(n))
    exact = [Fraction(x) for x in weights]
    best = min(
        max(sum((exact[i] for i in range(n) if lab[unit_of[i]] == j), Fraction(0))
            for j in range(k))
        for lab in itertools.product(range(k), repeat=len(ids))
    )
    # Float weights: the bound is computed in floats, so it may sit a rounding step above
    # the exact optimum ([1, 0.7, 1.2, 1.6, 0.1, 0, 0.4] over 2 with groups: 3.0 against
    # 3 - 3 * 2**-55); integers are exact.
    slack = 1 if all(float(x).is_integer() for x in weights) else 1 + Fraction(1, 10**12)
    assert Fraction(sb.lower_bound(weights, k, groups=groups)) <= best * slack
    p = sb.partition(weights, k, groups=groups)
    real = max(sum((exact[i] for i in part), Fraction(0)) for part in p)
    assert real >= best
    if p.gap == 0.0 or p.optimal:
        # A reported gap of 0 claims optimality (and then the computed load is the bound):
        # it must be true, exactly for integers, up to 1e-12 relative otherwise.
        assert p.optimal and p.lower_bound == p.max_load
        if all(float(x).is_integer() for x in weights):
            assert real == best
        else:
            assert real <= best * (1 + Fraction(1, 10**12))
    else:
        assert Fraction(p.lower_bound) <= best * slack


# ---- plan ----------------------------------------------------------------------------
@pytest.mark.slow
@FAST
@given(
    st.lists(st.integers(0, 64), max_size=40),
    st.integers(1, 5),
    st.integers(64, 200),
    st.sampled_from(("fsdp", "ddp")),
    st.sampled_from(SIZES),
    st.integers(1, 3),
    st.integers(1, 2),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2),
)
@pytest.mark.timeout(180)
def test_plan_invariants(
    lengths, dp, cap, sync, size, m_min, mult, padded, allow_empty, extra
):
    kwargs = dict(
        sync=sync,
        size=size,
        min_micro_batches=m_min,
        micro_batch_multiple=mult,
        padded=padded,
        allow_empty=allow_empty,
        extra_micro_batches=extra,
    )
    try:
        p = sb.plan(lengths, dp, cap, **kwargs)
    except ValueError as exc:
        # Refusals are allowed only for the documented reasons.
        msg = str(exc)
        assert any(w in msg for w in ("cannot fill", "needs", "equal", "size", "empty")), msg
        return
    mbs = p.micro_batches
    assert len(mbs) == dp
    m = len(mbs[0])
    assert all(len(r) == m for r in mbs), "same micro-batch count on every rank"
    assert m >= m_min and m % mult == 0
    check_cover([mb for r in mbs for mb in r], len(lengths))
    for r in mbs:
        for mb in r:
            used = len(mb) * max((lengths[i] for i in mb), default=0) if padded else sum(
                lengths[i] for i in mb
            )
            assert used <= cap, "capacity"
            assert mb or allow_empty, "empty micro-batch without allow_empty"
    if size != "free":
        counts = [sum(len(mb) for mb in r) for r in mbs]
        if size == "equal":
            assert len(set(counts)) == 1
        else:
            assert max(counts) - min(counts) <= 1
    # Determinism, byte for byte.
    assert sb.plan(lengths, dp, cap, **kwargs).to_json() == p.to_json()
    assert Plan.from_json(p.to_json()).micro_batches == mbs


@pytest.mark.slow
@FAST
@given(st.lists(st.integers(0, 64), min_size=1, max_size=30), st.integers(1, 3), st.data())
@pytest.mark.timeout(120)
def test_plan_is_the_same_for_every_container(lengths, dp, data):
    # A list, a numpy array of another integer width, floats holding whole numbers and a
    # tensor (when torch is installed) are the same lengths, so they give the same plan.
    cost = data.draw(st.lists(st.floats(0.5, 100.0), min_size=len(lengths),
                              max_size=len(lengths)))
    try:
        ref = sb.plan(lengths, dp, 64, cost=cost, allow_empty=True).to_json()
    except ValueError:
        return
    variants = [
        (np.asarray(lengths, dtype=np.int32), np.asarray(cost)),
        (np.asarray(lengths, dtype=np.float64), tuple(cost)),
        (np.asarray(lengths, dtype=object), np.asarray(cost, dtype=object)),
    ]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        variants.append((torch.tensor(lengths), torch.tensor(cost, dtype=torch.float64,
                                                               requires_grad=True)))
    for lens, c in variants:
        assert sb.plan(lens, dp, 64, cost=c, allow_empty=True).to_json() == ref


def test_extra_micro_batches_keeps_what_was_found():
    # Only m=1 can hold two sequences on one rank without empty micro-batches; asking for
    # two extra counts must not discard it.
    p = sb.plan([1, 1], dp_size=1, max_tokens=10, extra_micro_batches=2)
    assert p.num_micro_batches == 1
    assert sorted(i for mb in p.micro_batches[0] for i in mb) == [0, 1]


# ---- bad arguments -------------------------------------------------------------------
WEIRD = [
    None, 0, -1, 1.5, float("nan"), float("inf"), 2**63, 2**70, 10**9, True, "x", "", b"1",
    [], [1, 2], {"a": 1}, object(), np.int64(3), np.float32(2.0), (1,), -(2**70),
]


@settings(max_examples=max(300, EXAMPLES), deadline=None)
@given(
    st.sampled_from(["k", "size", "method", "weights", "groups"]),
    st.sampled_from(WEIRD),
)
@pytest.mark.timeout(120)
def test_partition_bad_arguments_raise_value_or_type_error(arg, value):
    kwargs = {"weights": [3, 1, 2, 2], "k": 2, "size": "free", "method": "auto",
              "groups": None}
    kwargs[arg] = value
    w, k = kwargs.pop("weights"), kwargs.pop("k")
    try:
        p = sb.partition(w, k, **kwargs)
    except (ValueError, TypeError):
        return
    check_cover(p, len(w))


@settings(max_examples=max(400, EXAMPLES), deadline=None)
@given(
    st.sampled_from(
        [
            "lengths", "dp_size", "max_tokens", "cost", "sync", "size", "groups",
            "min_micro_batches", "micro_batch_multiple", "padded", "allow_empty",
            "extra_micro_batches",
        ]
    ),
    st.sampled_from(WEIRD),
)
@pytest.mark.timeout(180)
def test_plan_bad_arguments_raise_value_or_type_error(arg, value):
    kwargs = {"lengths": [3, 1, 2, 2], "dp_size": 2, "max_tokens": 4}
    kwargs[arg] = value
    try:
        p = sb.plan(**kwargs)
    except (ValueError, TypeError):
        return
    n = len(p.lengths)
    check_cover([mb for r in p.micro_batches for mb in r], n)
