"""UlyssesCost: one GPU's share of a sequence under Ulysses (all-to-all) sequence parallelism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import (
    ContextParallelCost,
    FlopsCost,
    QuadraticCost,
    TokenCost,
    UlyssesCost,
    load_cost,
    ulysses_bytes_per_token,
)
from seqbalance.costs.context_parallel import balanced_layout, kv_bytes_per_token


def test_exact_values_by_hand():
    inner = QuadraticCost(per_token=4.0, per_token_sq=0.5, per_sequence=8.0, per_microbatch=3.0)
    u = UlyssesCost(inner, 4, bandwidth=1e3, bytes_per_token=100.0, cost_per_second=2.0)
    # comm: 2 passes * (4 - 1) / 4**2 * 100 B / 1e3 B/s = 0.0375 s a token, * 2 units/s
    assert u.comm_per_token == pytest.approx(0.075, rel=1e-15)
    # (8 + 4*10 + 0.5*100) / 4 + 0.075*10
    np.testing.assert_allclose(u([10]), [25.25], rtol=1e-15)
    assert u.polynomial == pytest.approx((3.0, 2.0, 1.075, 0.125), rel=1e-15)
    # c0 is every GPU's per-step overhead: kept, not divided
    assert u.microbatch_cost([10, 10]) == pytest.approx(3.0 + 2 * 25.25, rel=1e-15)
    # A forward-only pass sends half of it.
    half = UlyssesCost(inner, 4, bandwidth=1e3, bytes_per_token=100.0, cost_per_second=2.0,
                       comm_passes=1.0)  # fmt: skip
    assert half.comm_per_token == pytest.approx(0.0375, rel=1e-15)


def test_the_communication_formula_against_the_all_to_all_counted_by_hand():
    """Each GPU holds T/sp tokens; before attention it sends GPU j the heads j computes
    (1/sp of each token's bytes) and keeps its own share; after, the same for O; the
    backward repeats both. Counted message by message, that is the formula's volume."""
    sp, bytes_per_token, lengths = 8, 96.0, [300, 500, 1000]
    tokens = sum(lengths) / sp  # this GPU's tokens of the micro-batch
    sent = 0.0
    for _pass in range(2):  # forward, backward
        for dst in range(sp):
            if dst != 0:  # GPU 0's messages; its own share stays
                sent += tokens * bytes_per_token / sp
    u = UlyssesCost(TokenCost(), sp, bandwidth=1.0, bytes_per_token=bytes_per_token,
                    cost_per_second=1.0)  # fmt: skip
    comm = float((u(lengths) - np.asarray(lengths) / sp).sum())
    assert comm == pytest.approx(sent, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    coeffs=st.tuples(*[st.floats(0, 1e3, allow_nan=False) for _ in range(4)]),
    sp=st.sampled_from([1, 2, 3, 4, 8]),
    comm=st.floats(0, 1e2, allow_nan=False),
    lengths=st.lists(st.integers(0, 10**5), min_size=1, max_size=20),
)
def test_a_ulysses_cost_is_its_polynomial(coeffs, sp, comm, lengths):
    c0, a, b, c = coeffs
    inner = QuadraticCost(per_token=b, per_token_sq=c, per_sequence=a, per_microbatch=c0)
    u = UlyssesCost(inner, sp, bandwidth=1.0, bytes_per_token=comm, cost_per_second=1.0)
    x = np.asarray(lengths, dtype=np.float64)
    c0u, au, bu, cu = u.polynomial
    np.testing.assert_allclose(u(lengths), au + bu * x + cu * x * x, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(u(lengths), inner(lengths) / sp + u.comm_per_token * x,
                               rtol=1e-12, atol=1e-9)  # fmt: skip
    assert c0u == c0
    if sp == 1:  # one GPU: no all-to-all, the cost itself
        np.testing.assert_array_equal(u(lengths), inner(lengths))


def test_bytes_per_token_from_the_architecture():
    # llama-2-7b: 32 layers, 32 heads (MHA), head_dim 128: (32 + 32) * 256 * 2 B a layer
    assert ulysses_bytes_per_token(FlopsCost.from_name("llama-2-7b"), 4) == 32 * 64 * 256 * 2
    qwen = FlopsCost.from_name("qwen2.5-7b")  # 28 layers, 28 heads, 4 K/V heads
    assert ulysses_bytes_per_token(qwen, 4) == 28 * (28 + 4) * 256 * 2
    # sp = 28 > 4 K/V heads: each GPU gets one (repeated) K/V head, 28 in all
    assert ulysses_bytes_per_token(qwen, 28) == 28 * (28 + 28) * 256 * 2
    assert ulysses_bytes_per_token(qwen, 4, dtype_bytes=1) == 28 * 32 * 256
    u = UlyssesCost(qwen, 4, bandwidth=2e11)
    assert u.bytes_per_token == 28 * 32 * 256 * 2 and u.cost_per_second == 4e14
    assert u.per_token_sq == qwen.per_token_sq / 4


@pytest.mark.parametrize(
    ("sp", "words"),
    [
        (8, "qwen2.5-7b has 28 heads, not a multiple of sp_size=8; use sp_size 2, 4, 28,"),
        (7, "qwen2.5-7b has 4 K/V heads, neither a multiple nor a divisor of sp_size=7; "
            "use sp_size 2, 4, 28,"),
    ],
)
def test_sp_sizes_that_do_not_split_the_heads_are_refused(sp, words):
    with pytest.raises(ValueError, match="whole attention heads") as exc:
        UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), sp)
    assert words in str(exc.value)
    # advice that holds whether or not ring CP is already in use
    assert "give the rest of the degree to ring context parallelism (cp_size)" in str(exc.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sp_size": 0}, "sp_size"),
        ({"sp_size": 2, "bandwidth": 0.0}, "bandwidth must be > 0"),
        ({"sp_size": 2, "bandwidth": float("nan")}, "bandwidth"),
        ({"sp_size": 2, "bandwidth": 1e9}, "pass bytes_per_token="),
        ({"sp_size": 2, "bytes_per_token": -1.0}, "bytes_per_token"),
        ({"sp_size": 2, "comm_passes": -1.0}, "comm_passes"),
    ],
)
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UlyssesCost(QuadraticCost(per_token=1.0, per_token_sq=0.0), **kwargs)


def test_a_ulysses_cost_is_not_wrapped_twice():
    u = UlyssesCost(FlopsCost.from_name("llama-3-8b"), 4)
    with pytest.raises(ValueError, match="already a UlyssesCost"):
        UlyssesCost(u, 2)


@pytest.mark.parametrize(("model", "sp"), [("llama-3-8b", 2), ("llama-3-8b", 8),
                                           ("gemma-2-9b", 4), ("qwen3-30b-a3b", 4)])  # fmt: skip
def test_ring_over_ulysses_groups_is_the_ring_cost_over_sp(model, sp):
    """USP (ring CP whose ranks are Ulysses groups): with a free all-to-all and K/V heads a
    multiple of sp, every term of a piece (compute, ring transfer, the attention that hides
    it) is one GPU's 1/sp of the ring cost's, sliding windows included (gemma-2)."""
    flops = FlopsCost.from_name(model)
    link = {"bandwidth": 2.5e10, "overlap": 0.5}
    ring = ContextParallelCost(flops, **link)
    usp = ContextParallelCost(UlyssesCost(flops, sp), **link)
    assert usp.kv_bytes_per_token == ring.kv_bytes_per_token / sp
    assert usp.cost_per_second == ring.cost_per_second == 4e14
    for length, d in ((100_000, 8), (9_000, 4), (50_000, 2), (3, 4)):
        for ranges in balanced_layout(length, d):
            want = ring.piece_cost(length, ranges, d) / sp
            assert usp.piece_cost(length, ranges, d) == pytest.approx(want, rel=1e-12)
    # The all-to-all inside each group adds its per-token price to the piece's tokens.
    a2a = UlyssesCost(flops, sp, bandwidth=2.5e10)
    priced = ContextParallelCost(a2a, **link)
    for ranges in balanced_layout(100_000, 8):
        tokens = sum(e - s for s, e in ranges)
        extra = priced.piece_cost(100_000, ranges, 8) - usp.piece_cost(100_000, ranges, 8)
        assert extra == pytest.approx(a2a.comm_per_token * tokens, rel=1e-9)
    back = ContextParallelCost.from_dict(json.loads(json.dumps(priced.to_dict())))
    assert back.to_dict() == priced.to_dict()


def test_ring_over_ulysses_sends_the_repeated_kv_heads():
    """K/V heads fewer than sp are repeated so that each GPU holds one: a GPU sends one
    head's K and V, not kv_heads / sp of them."""
    flops = FlopsCost.from_name("llama-3-8b")  # 32 layers, 8 K/V heads of 128
    usp = ContextParallelCost(UlyssesCost(flops, 16), bandwidth=1e10)
    assert usp.kv_bytes_per_token == 32 * 1 * (128 + 128) * 2
    assert kv_bytes_per_token(UlyssesCost(flops, 4)) == 32 * 2 * (128 + 128) * 2


def test_plans_over_ulysses_groups_are_the_ring_plans_scaled():
    """With a free all-to-all and sp a power of two every cost is the ring cost / sp
    exactly, so plan(cp_size=...) over Ulysses groups is the one-GPU plan of the group's
    capacity, piece for piece, its step 1/sp."""
    flops = FlopsCost.from_name("llama-3-8b")
    lengths = workloads.lengths("long-context", 256, seed=3)
    for sp in (2, 4):
        kw = {"cp_size": 8, "cp_cost": {"bandwidth": 2.5e10, "overlap": 0.5}}
        usp = sb.plan(lengths, 2, sp * 16384, cost=UlyssesCost(flops, sp), **kw)
        ring = sb.plan(lengths, 2, sp * 16384, cost=flops, **kw)
        assert usp.micro_batches == ring.micro_batches
        assert usp.pieces == ring.pieces
        assert usp.simulate().step_time == ring.simulate().step_time / sp


def test_round_trip_through_json(tmp_path):
    u = UlyssesCost(FlopsCost.from_name("qwen3-8b"), 8, bandwidth=2e11, comm_passes=1.0)
    back = load_cost(json.loads(u.to_json()))
    assert back == u and back.polynomial == u.polynomial
    u.save(tmp_path / "u.json")
    assert load_cost(str(tmp_path / "u.json")) == u
    with pytest.raises(ValueError, match="unknown key"):
        load_cost({**u.to_dict(), "sp": 8})
    with pytest.raises(ValueError, match="'sp_size'"):
        load_cost({"kind": "ulysses", "cost": {"kind": "tokens"}})


@pytest.mark.parametrize("pp_size", [1, 2])
def test_free_communication_plans_as_the_one_gpu_cost(pp_size):
    """Dividing every cost by a power of two is exact, so with free communication the
    plan is the one-GPU cost's plan and every simulated time is 1/sp of it."""
    cost = FlopsCost.from_name("llama-3-8b")
    lengths = workloads.lengths("rl-math", 512, seed=3)
    kw = {"pp_size": pp_size} if pp_size > 1 else {}
    base = sb.plan(lengths, 4, 4 * 16384, cost=cost, **kw)
    u = sb.plan(lengths, 4, 4 * 16384, cost=UlyssesCost(cost, 4), **kw)
    assert u.micro_batches == base.micro_batches
    assert u.simulate().step_time == base.simulate().step_time / 4


def test_a_slow_all_to_all_weighs_tokens_more():
    """Over a slow link the all-to-all (linear) grows against attention (quadratic): the
    plan equals the plan of the equivalent polynomial, and its token imbalance shrinks."""
    cost = FlopsCost.from_name("llama-3-8b")
    lengths = workloads.lengths("long-mix", 1024, seed=1)
    slow = UlyssesCost(cost, 8, bandwidth=2.5e9)
    assert slow.comm_per_token > cost.per_token / 8  # communication dominates the linear term
    c0, a, b, c = slow.polynomial
    poly = QuadraticCost(per_token=b, per_token_sq=c, per_sequence=a, per_microbatch=c0)
    p = sb.plan(lengths, 8, 8 * 16384, cost=slow)
    assert p.micro_batches == sb.plan(lengths, 8, 8 * 16384, cost=poly).micro_batches
    free = sb.plan(lengths, 8, 8 * 16384, cost=UlyssesCost(cost, 8))
    tokens = "balance/plan_token_imbalance"
    assert p.metrics()[tokens] <= free.metrics()[tokens]


def test_timing_files_saved_with_a_ulysses_cost_load(tmp_path):
    """Its JSON has a "cost" key, like a cp_cost header's: it was read as one and refused."""
    from seqbalance.costs import TimingRecorder

    u = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4, bandwidth=2.5e10)
    rec = TimingRecorder(u)
    rec.record(0, 0, 0, [1000, 3000], 0.5)
    back = TimingRecorder.load(rec.save(tmp_path / "t.jsonl"))
    assert back.cost == u and back.cp_cost is None and len(back) == 1


def test_a_document_without_a_rate_takes_the_constructors_default():
    """A hand-written document without cost_per_second got 1 FLOP/s for a FLOP cost:
    the all-to-all, priced in seconds, vanished."""
    u = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4, bandwidth=2.5e10)
    doc = {k: v for k, v in u.to_dict().items() if k != "cost_per_second"}
    assert load_cost(doc) == u and load_cost(doc).cost_per_second == 4e14


def test_a_refit_under_ulysses_says_it_is_one_gpus_share():
    """The refit of timings taken under a UlyssesCost is one GPU's share; it says so in
    meta (kept by the next refit, and through JSON) so that it is not divided again."""
    from seqbalance.costs import TimingRecorder, ulysses_sp_size
    from seqbalance.costs.feedback import records_from_plan

    truth = QuadraticCost(per_token=3e-6, per_token_sq=2e-11, per_sequence=1e-4,
                          per_microbatch=2e-3)  # fmt: skip
    for start, want in ((UlyssesCost(TokenCost(), 4), 4), (TokenCost(), None)):
        rec = TimingRecorder(start)
        for step in range(6):
            batch = np.random.default_rng(step).integers(100, 6000, 48)
            p = sb.plan(batch, 2, 24000, cost=rec.cost)
            secs = [[truth.microbatch_cost(batch[mb]) for mb in r] for r in p.micro_batches]
            rec.extend(records_from_plan(p.micro_batches, batch, secs, step))
        first = rec.refit()
        assert ulysses_sp_size(first) == want
        assert ulysses_sp_size(rec.refit()) == want  # the second starts from the first
        assert ulysses_sp_size(load_cost(first.to_dict())) == want
    odd = QuadraticCost(1.0, 0.0)
    for value in (True, 1, "4", 2.0):
        odd.meta["ulysses_sp_size"] = value
        assert ulysses_sp_size(odd) is None, value


def test_ring_rate_of_a_ulysses_cost():
    """Over a ring, a UlyssesCost's units are its inner cost's: one of unknown units must
    say its rate (it took the placeholder 1 of a UlyssesCost without a bandwidth: a free
    ring), a FLOP count gets 4e14, and one that prices its all-to-all keeps that rate."""
    quad = QuadraticCost(per_token=1.0, per_token_sq=1e-5)
    for cost in (UlyssesCost(quad, 4), UlyssesCost(TokenCost(), 2)):
        with pytest.raises(ValueError, match="pass cost_per_second="):
            ContextParallelCost(cost, bandwidth=1e9, kv_bytes_per_token=1e5)
        with pytest.raises(ValueError, match="pass cost_per_second="):
            sb.plan([100, 90000], 1, 65536, cost=cost, cp_size=2,
                    cp_cost={"bandwidth": 1e9, "kv_bytes_per_token": 1e5})  # fmt: skip
    flops = FlopsCost.from_name("llama-3-8b")
    assert ContextParallelCost(UlyssesCost(flops, 2), bandwidth=1e9).cost_per_second == 4e14
    own = UlyssesCost(flops, 2, bandwidth=1e9, cost_per_second=3e14)
    assert ContextParallelCost(own, bandwidth=1e9).cost_per_second == 3e14


@settings(max_examples=60, deadline=None)
@given(
    coeffs=st.tuples(*[st.floats(1e-6, 1e3, allow_nan=False) for _ in range(3)]),
    sp=st.sampled_from([2, 3, 4, 8]),
    log_d=st.integers(0, 4),
    length=st.integers(1, 200_000),
    overlap=st.floats(0, 1),
    kv=st.floats(1.0, 1e6),
)
def test_usp_pieces_are_the_ring_pieces_over_sp(coeffs, sp, log_d, length, overlap, kv):
    """For any polynomial cost, with a free all-to-all: a USP piece is the ring piece / sp
    when each GPU sends kv / sp bytes a token, and without a ring bandwidth the d pieces
    add up to the UlyssesCost of the whole sequence (CP moves work, it creates none)."""
    a, b, c = coeffs
    quad = QuadraticCost(per_token=b, per_token_sq=c, per_sequence=a)
    d = 2**log_d
    link = {"bandwidth": 1e9, "overlap": overlap, "cost_per_second": 1e6}
    ring = ContextParallelCost(quad, kv_bytes_per_token=kv, **link)
    usp = ContextParallelCost(UlyssesCost(quad, sp), kv_bytes_per_token=kv / sp, **link)
    free = ContextParallelCost(UlyssesCost(quad, sp))
    layout = balanced_layout(length, d)
    for ranges in layout:
        want = ring.piece_cost(length, ranges, d) / sp
        assert usp.piece_cost(length, ranges, d) == pytest.approx(want, rel=1e-9, abs=1e-12)
    total = sum(free.piece_cost(length, ranges, d) for ranges in layout)
    whole = float(UlyssesCost(quad, sp)([length])[0])
    assert total == pytest.approx(whole, rel=1e-9)
