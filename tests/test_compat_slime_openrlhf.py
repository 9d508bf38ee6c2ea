"""seqbalance.compat: the slime and OpenRLHF drop-ins (contracts, known values, patching)."""

from __future__ import annotations

import itertools
import sys
import types
from types import SimpleNamespace as NS

import numpy as np
import pytest
from _fakes import fake_module
from hypothesis import example, given, settings
from hypothesis import strategies as st

from seqbalance.compat import openrlhf, slime

# A tiny dense model: h=16, 2 heads, 2 KV groups, head dim 8, FFN 64, 2 layers, vocab 32.
TINY = dict(hidden_size=16, num_attention_heads=2, num_query_groups=2, vocab_size=32,
            ffn_hidden_size=64, num_experts=None, num_layers=2, kv_channels=8)  # fmt: skip


def _args(**kw):
    base = dict(micro_batch_size=1, use_dynamic_batch_size=False, max_tokens_per_gpu=None,
                balance_data=False, balance_by_flops=False, **TINY)  # fmt: skip
    base.update(kw)
    return NS(**base)


def _tp(dp=1, cp=1, vpp=1, group=1):
    return {"dp_size": dp, "cp_size": cp, "vpp_size": vpp,
            "microbatch_group_size_per_vp_stage": group}  # fmt: skip


# ---- FLOPs ----------------------------------------------------------------------------


def test_fwd_flops_known_values_dense():
    # Per layer and token: Q 2*16*2*8 = 512, K+V 4*16*2*8 = 1024, out 2*16*16 = 512,
    # MLP 6*16*64 = 6144 -> 8192; attention 2*2*8 = 32 per L**2; LM head 2*16*32 = 1024.
    # FLOPs(L) = 2 * (8192 L + 32 L**2) + 1024 L = 17408 L + 64 L**2.
    a = NS(**TINY)
    assert slime.calculate_fwd_flops([10], a) == 17408 * 10 + 64 * 100
    assert slime.calculate_fwd_flops([10, 3], a) == 17408 * 13 + 64 * 109
    assert slime.calculate_fwd_flops([], a) == 0
    assert slime.calculate_attention_flops(a, 10, 2) == 3200.0
    assert slime.calculate_lm_head_flops(10, 16, 32) == 10240
    assert slime.calculate_embedding_flops(10, 16) == 320


def test_layer_flops_broadcast_over_arrays_and_tensors_as_slime():
    # slime's per-layer helpers are plain arithmetic, so callers pass arrays of lengths;
    # the drop-in's attention term used float(), which refuses more than one value.
    a = NS(**TINY)
    lens = [0, 10, 3000]
    one = [slime.calculate_layer_flops(a, n, 16, 2, 2, 64) for n in lens]
    assert one[1] == 10 * 8192 + 32 * 100  # per layer: 8192 L + 32 L**2 (the dense test)
    arr = slime.calculate_layer_flops(a, np.array(lens), 16, 2, 2, 64)
    assert arr.dtype == np.float64 and arr.tolist() == one
    assert slime.calculate_attention_flops(a, np.array(lens), 2).tolist() == [0.0, 3200.0, 2.88e8]
    # int32 lengths (cu_seqlens often are) do not wrap when squared.
    wide = slime.calculate_attention_flops(a, np.array([30_000], dtype=np.int32), 2)
    assert wide.tolist() == [32 * 30_000**2]
    torch = pytest.importorskip("torch")
    t = slime.calculate_layer_flops(a, torch.tensor(lens), 16, 2, 2, 64)
    assert t.is_floating_point() and t.tolist() == pytest.approx(one, rel=1e-6)  # float32


def test_fwd_flops_known_values_moe_and_mla():
    # MoE FFN width 8 * top-2 + shared 4 = 20. Pattern [0, 1]: one dense, one MoE layer:
    # 2 * (1536 + 512) + 6*16*(64 + 20) + 1024 = 13184 per token, 64 per L**2.
    moe = NS(**{**TINY, "num_experts": 4, "moe_ffn_hidden_size": 8, "moe_router_topk": 2,
                "moe_shared_expert_intermediate_size": 4, "moe_layer_freq": [0, 1]})  # fmt: skip
    assert slime.calculate_fwd_flops([3], moe) == 13184 * 3 + 64 * 9
    # An integer frequency: layers 0 and 2 of 4 are MoE.
    moe4 = NS(**{**vars(moe), "num_layers": 4, "moe_layer_freq": 2})
    assert slime.calculate_fwd_flops([3], moe4) == 2 * (13184 - 1024) * 3 + 1024 * 3 + 128 * 9
    # No moe_layer_freq: every layer is MoE; no shared expert counts 0.
    all_moe = NS(**{k: v for k, v in vars(moe).items() if k != "moe_layer_freq"})
    all_moe.moe_shared_expert_intermediate_size = None
    per_tok = 2 * (1536 + 512 + 6 * 16 * 16) + 1024
    assert slime.calculate_fwd_flops([1], all_moe) == per_tok + 64
    # slime never reads ffn_hidden_size without dense layers: None is fine there (review).
    all_moe.ffn_hidden_size = None
    assert slime.calculate_fwd_flops([1], all_moe) == per_tok + 64
    # Multi-latent attention, low-rank Q and KV: q 2*4*(16 + 2*(8+2)) = 288,
    # kv 2*(4*(16 + 2*(8+6)) + 16*2) = 416; attention 2*(8+2) + 2*6 = 32 per L**2.
    mla = NS(**{**TINY, "multi_latent_attention": True, "q_lora_rank": 4, "kv_lora_rank": 4,
                "qk_head_dim": 8, "qk_pos_emb_head_dim": 2, "v_head_dim": 6})  # fmt: skip
    per_tok = 2 * (288 + 416 + 512 + 6144) + 1024
    assert slime.calculate_fwd_flops([5], mla) == per_tok * 5 + 2 * 32 * 25


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 100_000), max_size=20))
def test_fwd_flops_is_a_sum_over_sequences(lens):
    a = NS(**TINY)
    each = slime.sequence_fwd_flops(lens, a)
    assert each.tolist() == [slime.calculate_fwd_flops([n], a) for n in lens]
    assert slime.calculate_fwd_flops(lens, a) == pytest.approx(sum(each), rel=1e-12)


# ---- first_fit_pack / expand_bins_by_splitting -----------------------------------------


def _first_fit_count(lens, cap):
    """Bins plain first fit opens, in input order, a new bin per misfit (independent
    reference; also OpenRLHF's count, which is this)."""
    sums = []
    for n in lens:
        for j, s in enumerate(sums):
            if s + n <= cap:
                sums[j] += n
                break
        else:
            sums.append(n)
    return len(sums)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 120), max_size=40), st.integers(20, 100))
def test_first_fit_pack_contract(lens, cap):
    bins = slime.first_fit_pack(lens, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    for b in bins:
        assert b == sorted(b) and b
        assert sum(lens[i] for i in b) <= cap or len(b) == 1  # oversized: alone
    assert [b[0] for b in bins] == sorted(b[0] for b in bins)  # index order
    assert len(bins) <= _first_fit_count(lens, cap)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 160), min_size=1, max_size=30), st.integers(1, 40))
def test_expand_bins_contract(lens, target):
    cap = 100
    bins = slime.first_fit_pack(lens, cap)
    n_before = len(bins)
    slime.expand_bins_by_splitting(bins, target, lens)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    assert all(bins) and [b[0] for b in bins] == sorted(b[0] for b in bins)
    # Still cap-or-singleton (samples above the cap stay alone).
    assert all(sum(lens[i] for i in b) <= cap or len(b) == 1 for b in bins)
    if all(n <= cap for n in lens) and n_before < target and any(
        len(b) > 1 for b in slime.first_fit_pack(lens, cap)
    ):
        assert len(bins) == min(target, len(lens))  # grown as far as slime would


def test_first_fit_pack_keeps_an_oversized_sample_alone_beside_empty_ones():
    # slime's first fit opens a bin for the empty sample; the planner alone had put it
    # with the oversized one (47 > 41 tokens in a bin of two).
    assert slime.first_fit_pack([0, 47], 41) == [[0], [1]]
    assert slime.first_fit_pack([47, 0, 0, 50, 3], 41) == [[0], [1, 2, 4], [3]]


# ---- build_dp_schedule ------------------------------------------------------------------


def _check_schedule(out, lens, dp, kept, cap=None):
    parts, mbi, nmb, _ = out
    seen = set()
    for r in range(dp):
        assert len(mbi[r]) == sum(nmb)  # same count on every rank
        assert [i for mb in mbi[r] for i in mb] == list(range(len(parts[r])))
        assert seen.isdisjoint(parts[r])
        seen.update(parts[r])
        for j, mb in enumerate(mbi[r]):
            tokens = sum(lens[parts[r][i]] for i in mb)
            assert cap is None or tokens <= cap or len(mb) == 1 or _no_room(out, lens, cap, r, j)
    assert seen == set(kept)


def _no_room(out, lens, cap, r, j):
    """An oversized sample may keep empty samples beside it (micro-batch ``j`` of rank
    ``r``) only where no micro-batch of its step is free of oversized samples and the step
    is too small for more micro-batches (slime returns empty micro-batches or raises)."""
    parts, mbi, nmb, _ = out
    if sorted(lens[parts[r][i]] for i in mbi[r][j])[-2] != 0:
        return False
    starts = np.cumsum([0, *nmb])
    s = int(np.searchsorted(starts, j, side="right")) - 1  # the step of micro-batch j
    step = [[parts[q][i] for i in mb] for q in range(len(parts))
            for mb in mbi[q][starts[s] : starts[s + 1]]]  # fmt: skip
    every = all(max(lens[i] for i in mb) > cap for mb in step)
    return every and sum(map(len, step)) < len(parts) * (nmb[s] + 2)  # groups of <= 2 here


# Lengths above the cap of 200 run alone; empty samples (0) must not join them.
_SAMPLE = st.one_of(st.integers(1, 300), st.just(0), st.integers(201, 300))


@settings(max_examples=150, deadline=None)
@given(st.lists(_SAMPLE, min_size=8, max_size=40), st.integers(1, 3),
       st.sampled_from([1, 2]), st.booleans(), st.booleans())  # fmt: skip
# Step 0 (3 oversized, 1 empty, 3 ranks) is too small to free a micro-batch; step 1 is not.
@example([201, 201, 201, 0, 0, 0, 0, 0], 3, 1, False, True)
def test_dynamic_schedule_invariants(lens, dp, group, balance, two_steps):
    n = len(lens)
    gbs = n // 2 if two_steps else n
    if gbs < dp * group:
        return
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=200, balance_data=balance)
    tp = _tp(dp, vpp=2 if group > 1 else 1, group=group)
    try:
        out = slime.build_dp_schedule(args, tp, lens, global_batch_size=gbs,
                                      rollout_indices=list(range(n)))  # fmt: skip
    except AssertionError as exc:
        # Only where slime fails too: a step whose first-fit bin count, rounded up to a
        # multiple of dp * group, exceeds its samples (singletons cannot be split).
        assert "dynamic path" in str(exc)
        align = dp * group
        steps = [lens[s * gbs : (s + 1) * gbs] for s in range(n // gbs)]
        assert any(-(-_first_fit_count(s, 200) // align) * align > len(s) for s in steps)
        return
    _check_schedule(out, lens, dp, range(gbs * (n // gbs)), cap=200)
    assert all(k % group == 0 for k in out[2])


def test_static_schedule_is_near_optimal_by_flops():
    # dp=2, one sample per micro-batch: the ranks' FLOPs against brute force over all
    # equal-count splits (LPT-quality or better).
    args = _args(micro_batch_size=1, balance_data=True)
    rng = np.random.default_rng(3)
    for _ in range(10):
        lens = rng.integers(1, 60, size=8).tolist()
        w = slime.sequence_fwd_flops(lens, args)
        parts, mbi, nmb, _ = slime.build_dp_schedule(
            args, _tp(2), lens, global_batch_size=8, rollout_indices=list(range(8))
        )
        assert nmb == [4] and all(len(m) == 1 for r in mbi for m in r)
        heavy = max(w[p].sum() for p in parts)
        opt = min(max(w[list(c)].sum(), w.sum() - w[list(c)].sum())
                  for c in itertools.combinations(range(8), 4))  # fmt: skip
        assert opt <= heavy <= 4 / 3 * opt
        assert w[parts[0]].sum() >= w[parts[1]].sum()  # heaviest rank first, as slime


def test_schedule_errors():
    dyn = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=10)
    with pytest.raises(AssertionError, match="num_rollouts"):
        slime.build_dp_schedule(dyn, _tp(), [3] * 4, global_batch_size=3,
                                rollout_indices=[0, 0, 1, 1])  # fmt: skip
    with pytest.raises(AssertionError, match="samples < dp_size"):
        slime.build_dp_schedule(dyn, _tp(4), [3] * 3, global_batch_size=3,
                                rollout_indices=[0, 1, 2])  # fmt: skip
    with pytest.raises(AssertionError, match="static path"):
        slime.build_dp_schedule(_args(micro_batch_size=2), _tp(2), [3] * 6,
                                global_batch_size=6, rollout_indices=list(range(6)))  # fmt: skip
    with pytest.raises(AssertionError, match="micro_batch_size must be set"):  # slime asserts
        slime.build_dp_schedule(_args(micro_batch_size=None), _tp(2), [3] * 4,
                                global_batch_size=4, rollout_indices=list(range(4)))  # fmt: skip
    with pytest.raises(ValueError):  # the same errors are ValueErrors too
        slime.build_dp_schedule(dyn, _tp(2, vpp=2, group=2), [3] * 3, global_batch_size=3,
                                rollout_indices=[0, 1, 2])  # fmt: skip


def test_schedule_keeps_rollouts_together_and_cp_widens_cap():
    lens = [6, 6, 6, 6, 6, 6]
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=6)
    parts, mbi, nmb, gbs = slime.build_dp_schedule(
        args, _tp(1, cp=2), lens, global_batch_size=1, rollout_indices=[0, 0, 0, 1, 1, 1]
    )
    assert gbs == [1, 1] and nmb == [2, 2]  # 18 tokens a step, 12 per micro-batch
    assert sorted(parts[0][i] for mb in mbi[0][:2] for i in mb) == [0, 1, 2]


# ---- OpenRLHF ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 150), max_size=40), st.integers(10, 100), st.integers(1, 2))
def test_minimum_micro_batch_count(lens, max_tokens, ring):
    cap = max_tokens * ring
    m = openrlhf.get_minimum_num_micro_batch_size(lens, max_tokens, ring, 1)
    if not lens:
        assert m == 0
        return
    over = sum(n > cap for n in lens)
    lo = max(1, over + -(-sum(n for n in lens if n <= cap) // cap))
    assert min(lo, len(lens)) <= m <= len(lens)

    def fits(k):
        parts = openrlhf.get_seqlen_balanced_partitions(lens, k, False)
        return all(len(p) == 1 or sum(lens[i] for i in p) <= cap for p in parts)

    assert fits(m)  # the partition the caller makes next holds the cap
    assert m == min(lo, len(lens)) or not fits(m - 1)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 4000), min_size=1, max_size=40), st.integers(1000, 5000))
# A sample above the cap set the heaviest part, so the balanced partition at OpenRLHF's
# count (3) put 791 + 2705 = 3,496 > 3,412 tokens beside it, and the drop-in asked for 4
# (4,601 of 36,889 random calls with such a sample, found by a review helper).
@example([791, 816, 2705, 3551, 1281], 3412)
def test_minimum_count_with_samples_above_the_cap(lens, cap):
    from seqbalance.partitioning._verl_kk import parts_of_labels, verl_free_kk_labels

    m = openrlhf.get_minimum_num_micro_batch_size(lens, cap, 1, 1)
    parts = openrlhf.get_seqlen_balanced_partitions(lens, m, False)  # as OpenRLHF calls it
    assert sorted(i for p in parts for i in p) == list(range(len(lens))) and len(parts) == m
    assert all(len(p) == 1 or sum(lens[i] for i in p) <= cap for p in parts)
    theirs = _first_fit_count(lens, cap)
    kk = parts_of_labels(verl_free_kk_labels(np.asarray(lens, dtype=np.float64), theirs), theirs)
    if all(len(p) == 1 or sum(lens[i] for i in p) <= cap for p in kk):
        assert m <= theirs  # never more parts where OpenRLHF's own holds the cap


def test_partition_after_count_search_is_the_computed_one(monkeypatch):
    from seqbalance.compat import verl

    rng = np.random.default_rng(7)
    lens = rng.integers(1, 400, size=300).tolist()
    m = openrlhf.get_minimum_num_micro_batch_size(lens, 500, 1, 1)
    real = verl.get_seqlen_balanced_partitions
    fresh = real(lens, m, False)
    calls = []

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(openrlhf._verl, "get_seqlen_balanced_partitions", spy)
    got = openrlhf.get_seqlen_balanced_partitions(lens, m, False)
    assert got == fresh and calls == []  # the search's partition, not a second run
    got[0].append(-1)  # the caller owns what it gets: the next call is not affected
    assert openrlhf.get_seqlen_balanced_partitions(lens, m, False) == fresh and calls == []
    # Other lengths, another count or equal sizes are computed.
    other = [*lens[:-1], lens[-1] + 1]
    openrlhf.get_seqlen_balanced_partitions(other, m, False)
    openrlhf.get_seqlen_balanced_partitions(lens, m + 1, False)
    openrlhf.get_seqlen_balanced_partitions(lens, 1, True)
    assert [c[1:] for c in calls] == [(m, False), (m + 1, False), (1, True)]


class _Exp:
    """A stand-in for OpenRLHF's Experience: per-sample lengths and names."""

    def __init__(self, lengths, names):
        self.total_length, self.prompts = list(lengths), list(names)


def _split(batch):
    return [_Exp([n], [p]) for n, p in zip(batch.total_length, batch.prompts)]


def _make(items):
    return _Exp([n for it in items for n in it.total_length],
                [p for it in items for p in it.prompts])  # fmt: skip


def _interleave_heaviest(lens, k):
    """OpenRLHF's interleaving (from its docstring), heaviest batch's tokens."""
    s = sorted(lens, reverse=True)
    chunks = [s[i : i + k] for i in range(0, len(s), k)]
    half = len(chunks) // 2
    first, last = chunks[:half], [c[::-1] for c in chunks[half:]]
    seq = [c for i in range(half) for c in (first[i], last[-(i + 1)])]
    if len(last) > len(first):
        seq.append(last[0])
    return max(sum(c[j] for c in seq if j < len(c)) for j in range(len(seq[0])))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=50), st.integers(1, 8),
       st.integers(1, 4))  # fmt: skip
# The count-balanced partition alone was heavier than the interleave here (12,209 against
# 12,202; 2 in 22,195 random calls, found by a review helper): the drop-in now compares.
@example([132, 2902, 1001, 697, 699, 2710, 1525, 643, 2924, 28, 1186, 486, 2521, 1560, 881,
          2307, 2572, 1923, 1957, 1347, 293, 165, 2903, 229, 1325, 1697], 3, 1)  # fmt: skip
def test_balance_experiences(lens, gpus, n_batches):
    mod = types.ModuleType("fake_openrlhf_experience")
    mod.split_experience_batch, mod.make_experience_batch, mod._Exp = _split, _make, _Exp
    sys.modules[mod.__name__] = mod
    cls = type("Experience", (_Exp,), {"__module__": mod.__name__})
    try:
        chunks = np.array_split(np.arange(len(lens)), min(n_batches, len(lens)))
        inputs = [cls([lens[i] for i in c], [f"s{i}" for i in c]) for c in chunks]
        args = NS(actor=NS(num_nodes=1, num_gpus_per_node=gpus),
                  ds=NS(ring_attn_size=1, tensor_parallel_size=1))  # fmt: skip
        out = openrlhf.balance_experiences(inputs, args)
    finally:
        del sys.modules[mod.__name__]
    k = min(gpus, len(lens))
    assert len(out) == k
    assert sorted(p for b in out for p in b.prompts) == sorted(f"s{i}" for i in range(len(lens)))
    sizes = [len(b.prompts) for b in out]
    assert max(sizes) - min(sizes) <= 1
    loads = [sum(b.total_length) for b in out]
    assert loads == sorted(loads, reverse=True)
    assert max(loads) <= _interleave_heaviest(lens, gpus)


class _CountedExp(_Exp):
    """An item whose ``total_length`` reads are counted."""

    reads = 0

    @property
    def total_length(self):
        type(self).reads += 1
        return self._lengths

    @total_length.setter
    def total_length(self, value):
        self._lengths = value


@pytest.mark.parametrize(
    ("field", "reads"),
    [("batch", 4), ("rows", 4), ("missing", 11), ("short", 11), ("reversed", 13)],
)
def test_balance_experiences_reads_each_batch_once(field, reads):
    # OpenRLHF's split items carry a 0-d tensor each (a conversion apiece): the lengths
    # come from the batch's per-sample field when it has one row per item (a row summed,
    # as an item's value is) and its first and last rows match the first and last items
    # (two reads a batch); item by item otherwise (missing, wrong length, another order:
    # the first item's check fails, then all are read), with the same result.
    lens = [7, 1, 4, 9, 3, 3, 8, 2, 6, 5, 4]
    mod = types.ModuleType("fake_openrlhf_counted")
    mod.split_experience_batch = lambda b: [_CountedExp([n], [p])
                                            for n, p in zip(b.lengths, b.prompts)]
    mod.make_experience_batch = lambda items: _Exp([n for it in items for n in it._lengths],
                                                   [p for it in items for p in it.prompts])
    sys.modules[mod.__name__] = mod
    cls = type("Experience", (), {"__module__": mod.__name__})
    batches = []
    for c in ([0, 1, 2, 3], [4, 5, 6, 7, 8, 9, 10]):
        b = cls()
        b.lengths, b.prompts = [lens[i] for i in c], [f"s{i}" for i in c]
        b.total_length = {
            "batch": list(b.lengths), "rows": [[n - 1, 1] for n in b.lengths],
            "missing": None, "short": b.lengths[:-1], "reversed": b.lengths[::-1],
        }[field]  # fmt: skip
        batches.append(b)
    args = NS(actor=NS(num_nodes=1, num_gpus_per_node=3),
              ds=NS(ring_attn_size=1, tensor_parallel_size=1))  # fmt: skip
    _CountedExp.reads = 0
    try:
        out = openrlhf.balance_experiences(batches, args)
    finally:
        del sys.modules[mod.__name__]
    assert _CountedExp.reads == reads
    # 52 tokens, 11 samples over 3 actors (3 or 4 samples each): no actor can hold less
    # than ceil(52 / 3) = 18 at the heaviest ({9, 4, 3, 2}, {8, 4, 3, 1}, {7, 6, 5} meets
    # it), and the drop-in reaches it in every case.
    assert sorted(p for b in out for p in b.prompts) == sorted(f"s{i}" for i in range(11))
    assert sorted(len(b.prompts) for b in out) == [3, 4, 4]
    assert max(sum(b.total_length) for b in out) == 18


def test_balance_experiences_refuses_foreign_objects():
    args = NS(actor=NS(num_nodes=1, num_gpus_per_node=2), ds=NS(ring_attn_size=1,
              tensor_parallel_size=1))  # fmt: skip
    with pytest.raises(TypeError, match="split_experience_batch"):
        openrlhf.balance_experiences([NS(total_length=[3])], args)
    assert openrlhf.balance_experiences([], args) == []


# ---- patch() against fake module trees --------------------------------------------------


_fake = fake_module


def _old(*a, **k):
    return "old"


def test_slime_patch_fake_tree(monkeypatch):
    sb = _fake(monkeypatch, "slime.utils.seqlen_balancing",
               first_fit_pack=_old, get_seqlen_balanced_partitions=_old)  # fmt: skip
    fl = _fake(monkeypatch, "slime.utils.flops_utils", calculate_fwd_flops=_old)
    ds = _fake(monkeypatch, "slime.utils.dp_schedule", build_dp_schedule=_old,
               calculate_fwd_flops=_old, first_fit_pack=_old)  # fmt: skip
    done = slime.patch()
    try:
        assert sb.first_fit_pack is slime.first_fit_pack
        assert fl.calculate_fwd_flops is slime.calculate_fwd_flops
        assert ds.build_dp_schedule is slime.build_dp_schedule
        assert ds.calculate_fwd_flops is slime.calculate_fwd_flops  # imported by name
        assert ds.first_fit_pack is slime.first_fit_pack
        assert "slime.utils.dp_schedule.build_dp_schedule" in done
        assert slime.patch() == done  # idempotent
    finally:
        slime.unpatch()
    assert sb.first_fit_pack is _old and fl.calculate_fwd_flops is _old
    assert ds.build_dp_schedule is _old and ds.calculate_fwd_flops is _old
    slime.unpatch()  # a second unpatch is a no-op


def test_openrlhf_patch_fake_tree(monkeypatch):
    sb = _fake(monkeypatch, "openrlhf.utils.seqlen_balancing", get_seqlen_balanced_partitions=_old,
               get_minimum_num_micro_batch_size=_old)  # fmt: skip
    ex = _fake(monkeypatch, "openrlhf.trainer.ppo_utils.experience", balance_experiences=_old)
    user = _fake(monkeypatch, "openrlhf.trainer.ppo_trainer", balance_experiences=_old)
    openrlhf.patch()
    try:
        assert sb.get_minimum_num_micro_batch_size is openrlhf.get_minimum_num_micro_batch_size
        assert sb.get_seqlen_balanced_partitions is openrlhf.get_seqlen_balanced_partitions
        assert ex.balance_experiences is openrlhf.balance_experiences
        assert user.balance_experiences is openrlhf.balance_experiences
    finally:
        openrlhf.unpatch()
    assert sb.get_seqlen_balanced_partitions is _old and user.balance_experiences is _old


def test_patch_without_framework(monkeypatch):
    for name in ("slime", "openrlhf"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name...` fail
    with pytest.raises(ImportError, match="slime"):
        slime.patch()
    with pytest.raises(ImportError, match="OpenRLHF"):
        openrlhf.patch()


# Qwen2-7B shapes (as bench/compat.py): the review's counterexamples were found with them.
QWEN2_7B = dict(hidden_size=3584, num_attention_heads=28, num_query_groups=4,
                vocab_size=152064, ffn_hidden_size=18944, num_experts=None, num_layers=28,
                kv_channels=128)  # fmt: skip


def _args7b(**kw):
    base = dict(micro_batch_size=1, use_dynamic_batch_size=False, max_tokens_per_gpu=None,
                balance_data=True, balance_by_flops=False, **QWEN2_7B)  # fmt: skip
    base.update(kw)
    return NS(**base)


def test_slime_first_fit_and_expansion_reproduced():
    # slime 624b824's own output for these lengths (first_fit_pack, then
    # expand_bins_by_splitting to 6 bins).
    lens = np.array([220, 41, 78, 297, 41, 210, 185, 66, 72, 28])
    bins = slime._slime_first_fit(lens, 337)
    assert bins == [[0, 1, 4, 9], [2, 5], [3], [6, 7, 8]]
    slime._slime_expand(bins, 6, lens)
    assert bins == [[0], [2, 5], [3], [6], [1, 4, 9], [8, 7]]


def _first_fit_plain(lens, cap):
    """slime's first_fit_pack rule, transcribed plainly: each sample, in index order, into
    the first bin whose sum stays within ``cap``, else a new bin."""
    bins, sums = [], []
    for i, x in enumerate(lens):
        j = next((j for j, s in enumerate(sums) if s + x <= cap), None)
        if j is None:
            bins.append([i])
            sums.append(x)
        else:
            bins[j].append(i)
            sums[j] += x
    return bins


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 80), min_size=1, max_size=150), st.integers(1, 70),
       st.integers(0, 12))  # fmt: skip
def test_slime_first_fit_and_expansion_match_plain_transcriptions(lens, cap, extra):
    # Zeros and samples above the cap (alone in a bin, with no room) included. The
    # reproduction finds the first bin with room by bisection over running room maxima.
    arr = np.asarray(lens)
    bins = slime._slime_first_fit(arr, cap)
    assert bins == _first_fit_plain(lens, cap) == slime._first_fit_tree(arr, cap)
    # slime's expansion: split the heaviest multi-sample bin (ties: the last), longest
    # samples first, each to the lighter half (ties: the first half).
    plain = [list(b) for b in bins]
    for _ in range(extra):
        multi = [(sum(lens[i] for i in b), j) for j, b in enumerate(plain) if len(b) > 1]
        if not multi:
            break
        j = max(multi)[1]
        halves, sums = [[], []], [0, 0]
        for i in sorted(plain[j], key=lambda i: -lens[i]):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += lens[i]
        plain[j] = halves[0]
        plain.append(halves[1])
    slime._slime_expand(bins, len(bins) + extra, arr)
    assert bins == plain


def test_schedule_never_heavier_than_slimes_own_above_256_samples(monkeypatch):
    # 293 samples over 3 ranks. slime 624b824's own build_dp_schedule gives 55 micro-batches
    # a rank, its heaviest rank 8,575,653,264,568,320 FLOPs (7B model below); the planner
    # alone is 1e-8 heavier at that count. slime's schedule is now reproduced and compared
    # at every step size (it was on <= 256 samples only) and taken there.
    rng = np.random.default_rng(4804)
    n, dp, cap = 293, 3, 10720
    assert (int(rng.integers(257, 600)), int(rng.integers(1, 5)),
            int(rng.integers(2000, 20000))) == (n, dp, cap)  # fmt: skip
    lens = rng.integers(1, cap + 1, n).tolist()
    args = _args7b(use_dynamic_batch_size=True, max_tokens_per_gpu=cap)
    w = slime.sequence_fwd_flops(lens, args)
    slime_count, slime_heaviest = 55, 8575653264568320.0

    def schedule():
        return slime.build_dp_schedule(args, _tp(dp), lens, global_batch_size=n,
                                       rollout_indices=list(range(n)))  # fmt: skip

    def heaviest(parts):
        return max(float(w[list(p)].sum()) for p in parts)

    parts, _, nmb, _ = schedule()
    assert sorted(i for p in parts for i in p) == list(range(n))
    assert nmb == [slime_count] and heaviest(parts) <= slime_heaviest
    monkeypatch.setattr(slime, "_slime_grid", lambda *a: None)  # the planner alone
    parts, _, nmb, _ = schedule()
    assert nmb == [slime_count] and heaviest(parts) > slime_heaviest  # the case bites


def test_slime_first_fit_switches_to_a_tree_on_long_mends():
    # Bin 0 keeps more room than the 300 full bins after it and takes every later 1-token
    # sample: each mend of the running maximum would walk all 300 bins. Past the walk
    # budget the pass restarts on the max-tree; both give slime's bins.
    cap = 10**6
    lens = [1] + [cap] * 300 + [1] * 3000
    plain = _first_fit_plain(lens, cap)
    assert slime._slime_first_fit(np.asarray(lens), cap) == plain
    assert slime._first_fit_tree(np.asarray(lens), cap) == plain
    assert plain[0] == [0, *range(301, 3301)]


def test_schedule_never_heavier_than_slimes_own_on_the_reviews_counterexamples():
    # Static path, 4 samples of micro_batch_size 3 over 2 ranks: slime runs chunks [0, 1, 2]
    # and [3]; the drop-in's counts-within-one split (2 + 2) was 1.30x heavier. Now slime's
    # own answer is taken (its output, 624b824: partitions [[0, 1, 2], [3]]).
    lens = [96, 115, 105, 283]
    parts, mbi, nmb, _ = slime.build_dp_schedule(
        _args7b(micro_batch_size=3), _tp(2), lens, global_batch_size=4,
        rollout_indices=list(range(4)))  # fmt: skip
    assert sorted(map(sorted, parts)) == [[0, 1, 2], [3]] and nmb == [1]
    # Dynamic path, 3 ranks, cap 337: the drop-in was 1.0% heavier than slime's partitions
    # (its output, below) at slime's count (2); never heavier now.
    lens = [220, 41, 78, 297, 41, 210, 185, 66, 72, 28]
    args = _args7b(use_dynamic_batch_size=True, max_tokens_per_gpu=337)
    parts, mbi, nmb, _ = slime.build_dp_schedule(
        args, _tp(3), lens, global_batch_size=10, rollout_indices=list(range(10)))  # fmt: skip
    w = slime.sequence_fwd_flops(lens, args)
    theirs = [[2, 5, 8, 7], [3, 1, 4, 9], [0, 6]]
    assert nmb == [2]
    assert max(w[p].sum() for p in parts) <= max(w[p].sum() for p in theirs)
    for r, rank in enumerate(mbi):
        for mb in rank:
            assert sum(lens[parts[r][j]] for j in mb) <= 337


def test_rollout_ids_are_kept_as_given():
    # 1 and "1" are two rollouts for slime (a dict of the ids); numpy made them one, and
    # tuple ids failed ("unhashable type: 'list'").
    args = _args(micro_batch_size=1)
    parts, _, nmb, gbs = slime.build_dp_schedule(
        args, _tp(1), [3, 4, 5, 6], global_batch_size=1, rollout_indices=[1, 1, "1", "1"])
    assert len(nmb) == 2 and gbs == [1, 1]  # two steps of one rollout each
    assert parts == [[0, 1, 2, 3]]
    parts, _, nmb, _ = slime.build_dp_schedule(
        args, _tp(1), [3, 4], global_batch_size=1, rollout_indices=[(0, 1), (0, 2)])
    assert len(nmb) == 2 and parts == [[0, 1]]
