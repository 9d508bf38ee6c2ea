"""seqbalance.compat: the verl and AReaL drop-ins (contracts, errors, patching, gloo counts)."""

from __future__ import annotations

import heapq
import itertools
import types

import numpy as np
import pytest
from _fakes import fake_module
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.compat import _areal_dropin, _verl_dropin, areal, openrlhf, slime, verl
from seqbalance.planning._pipelines import areal_ffd_groups

weights_st = st.lists(st.integers(0, 1000), min_size=1, max_size=9)


def _brute_opt(w, k):
    """The lightest possible heaviest part, by enumeration."""
    return min(
        max(np.bincount(lab, weights=w, minlength=k))
        for lab in itertools.product(range(k), repeat=len(w))
    )


@settings(max_examples=40, deadline=None)
@given(weights_st, st.integers(1, 3))
def test_verl_partitions_contract(w, k):
    if len(w) < k:
        with pytest.raises(AssertionError):
            verl.get_seqlen_balanced_partitions(w, k, False)
        return
    parts = verl.get_seqlen_balanced_partitions(w, k, False)
    assert len(parts) == k and all(parts) and all(p == sorted(p) for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(len(w)))
    heaviest = max(sum(w[i] for i in p) for p in parts)
    # Never below the optimum; LPT-quality or better (4/3 of it).
    opt = _brute_opt(np.asarray(w, float), k)
    assert opt <= heaviest <= 4 / 3 * opt + 1e-9


def test_verl_equal_size_and_errors():
    parts = verl.karmarkar_karp([8, 7, 6, 5, 4, 3], 2, True)
    assert sorted(len(p) for p in parts) == [3, 3]
    assert sorted(sum([8, 7, 6, 5, 4, 3][i] for i in p) for p in parts) == [16, 17]
    with pytest.raises(AssertionError, match="divisible"):
        verl.karmarkar_karp([1, 2, 3], 2, True)
    with pytest.raises(ValueError):  # the same error is also a ValueError
        verl.get_seqlen_balanced_partitions([1], 2, False)


def test_verl_workload_widens_int32():
    torch = pytest.importorskip("torch")
    x = torch.tensor([50_000], dtype=torch.int32)
    assert verl.calculate_workload(x).item() == 24576 * 50_000 + 50_000**2
    assert verl.calculate_workload(np.array([50_000], dtype=np.int32))[0] == 3_728_800_000


def test_verl_reverse_idx_and_helpers():
    assert verl.get_reverse_idx([2, 0, 1]) == [1, 2, 0]
    assert verl.ceildiv(7, 3) == 3 and verl.roundup_divisible(7, 4) == 8
    with pytest.raises(ValueError, match="permutation"):
        verl.get_reverse_idx([0, 0])
    m = verl.log_seqlen_unbalance([1, 2, 3, 4], [[0, 3], [1, 2]], "p")
    assert m == {"p/min": 3, "p/max": 7, "p/minmax_diff": 4, "p/balanced_min": 5,
                 "p/balanced_max": 5, "p/mean": 5.0}  # fmt: skip


def test_verl_group_partitions_object_uids():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    lens = [100, 100, 300, 300, 200, 200, 150, 150]
    parts = verl.get_group_balanced_partitions(lens, uids, 2)
    for p in parts:
        assert {uids[i] for i in p} and all(uids[i] == uids[i ^ 1] for i in p)
        assert len(p) == 4  # two groups each
    with pytest.raises(AssertionError):
        verl.get_group_balanced_partitions(lens, uids, 3)


class FakeTD:
    """The parts of a TensorDict rearrange_micro_batches touches."""

    def __init__(self, data):
        self.data = data

    def keys(self):
        return self.data.keys()

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.data[key]
        return FakeTD({k: v[key] for k, v in self.data.items()})


def _batch(torch, lens, width):
    mask = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    ids = torch.arange(len(lens)).unsqueeze(1).expand(-1, width).clone()
    return FakeTD({"input_ids": ids, "attention_mask": mask})


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.integers(1, 3))
def test_verl_rearrange_local(lens, min_mb):
    torch = pytest.importorskip("torch")
    batch = _batch(torch, lens, 100)
    if min_mb > len(lens):
        return
    mbs, idx = verl.rearrange_micro_batches(batch, 250, min_num_micro_batch=min_mb)
    assert sorted(i for p in idx for i in p) == list(range(len(lens)))
    assert len(mbs) >= max(min_mb, -(-sum(lens) // 250))
    for mb, p in zip(mbs, idx):
        assert int(mb["attention_mask"].sum()) == sum(lens[i] for i in p) <= 250
        assert mb["input_ids"][:, 0].tolist() == p  # rows follow the index list
    # Light micro-batches at both ends: the heaviest is never first or last when m >= 3.
    work = [sum(24576 * lens[i] + lens[i] ** 2 for i in p) for p in idx]
    if len(work) >= 3 and len(set(work)) == len(work):
        assert max(work) not in (work[0], work[-1])


def test_verl_rearrange_force_group_and_errors():
    torch = pytest.importorskip("torch")
    batch = _batch(torch, [60, 60, 50, 50, 40, 40], 100)
    _, idx = verl.rearrange_micro_batches(batch, 150, force_group_size=2)
    for p in idx:
        assert all(i ^ 1 in p for i in p)
    with pytest.raises(AssertionError, match="max_token_len"):
        verl.rearrange_micro_batches(batch, 90)
    with pytest.raises(AssertionError, match="force_group_size"):
        verl.rearrange_micro_batches(batch, 150, force_group_size=4)
    with pytest.raises(AssertionError, match="max_token_len"):  # verl's type, as above
        verl.rearrange_micro_batches(batch, 0)


def test_verl_rearrange_refuses_a_fractional_mask():
    # Truncated to int64, rows of 2.5 and 1.5 tokens counted 2 and 1 and shared a
    # micro-batch of max_token_len=3: 4 real tokens (verl keeps them apart).
    torch = pytest.importorskip("torch")
    batch = FakeTD({"input_ids": torch.zeros(2, 3, dtype=torch.long),
                    "attention_mask": torch.tensor([[1.5, 1.0, 0.0], [1.0, 0.5, 0.0]])})
    with pytest.raises(ValueError, match=r"attention_mask.*2\.5 is not a whole number"):
        verl.rearrange_micro_batches(batch, 3)
    whole = FakeTD({"input_ids": torch.zeros(2, 3, dtype=torch.long),
                    "attention_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])})
    assert verl.rearrange_micro_batches(whole, 3)[1] == [[0, 1]]


# ---- AReaL ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=40), st.integers(1, 4),
       st.integers(1, 3), st.sampled_from(["ffd", "kk"]))  # fmt: skip
def test_areal_allocators(values, min_groups, divisor, algo):
    fn = areal.get_allocate_fn(algo)
    cap = 800
    need = max(min_groups, divisor)
    if len(values) < need:
        with pytest.raises(RuntimeError, match="smaller than min_groups"):
            fn(values, cap, min_groups, divisor)
        return
    from seqbalance.compat._areal_dropin import _areal_ffd

    # AReaL's first-fit decreasing (reproduced) finds a multiple of the divisor or raises.
    theirs = _areal_ffd(np.asarray(values), cap, need, divisor)
    try:
        groups = fn(values, cap, min_groups, divisor)
    except RuntimeError as exc:
        # Only where AReaL raises too (its kk_allocate falls back to that FFD), and never
        # for a count the divisor does not divide (it used to return one).
        assert "Cannot allocate" in str(exc) and theirs is None
        return
    assert sorted(i for g in groups for i in g) == list(range(len(values)))
    assert all(sum(values[i] for i in g) <= cap for g in groups)
    assert len(groups) >= min(need, len(values))
    if algo == "ffd" or len(groups) != len(values):
        assert len(groups) % divisor == 0  # kk: AReaL's own clamp to n is the exception
    if theirs is not None:
        assert len(groups) <= len(theirs)
    assert all(groups)


def _areal_ffd_plain(values, capacity, min_groups):
    """AReaL 1.0's first-fit decreasing pass, transcribed plainly from its rule: values
    largest first (numpy's argsort of the negated values, AReaL's own call); a value opens
    a group while there are fewer than ``min_groups`` or no group has room, else joins,
    among the groups with room, the one holding the fewest values, then the lightest, then
    the first opened."""
    v = np.asarray(values, dtype=np.int64)
    groups, loads = [], []
    for i in np.argsort(-v).tolist():
        fits = [g for g in range(len(groups)) if loads[g] + v[i] <= capacity]
        if len(groups) < min_groups or not fits:
            groups.append([i])
            loads.append(int(v[i]))
            continue
        g = min(fits, key=lambda g: (len(groups[g]), loads[g], g))
        groups[g].append(i)
        loads[g] += int(v[i])
    return groups


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=120), st.integers(0, 120),
       st.integers(1, 8))  # fmt: skip
def test_areal_ffd_reproduction_matches_a_plain_transcription(values, slack, min_groups):
    # The reproduction (the compat module's and the planner's baseline) keeps groups in
    # sets by size instead of scanning them all; ties
    # (equal values, equal loads, equal sizes) are frequent with values up to 60.
    cap = max(values) + slack
    if cap == 0 or len(values) < min_groups:
        return
    assert areal_ffd_groups(np.asarray(values), cap, min_groups) == _areal_ffd_plain(
        values, cap, min_groups
    )


def test_areal_allocators_never_worse_than_areal_above_256_values():
    # 300 values: the planner alone packs them into as many groups as AReaL's first-fit
    # decreasing but its heaviest holds 16,231 tokens against FFD's 16,229. AReaL's answer
    # is now computed at every size (it was on <= 256 values only) and taken there.
    rng = np.random.default_rng(1)
    v = rng.integers(1, 16000, 300)
    cap = int(v.max()) + int(rng.integers(0, 3000))
    theirs = _areal_ffd_plain(v, cap, 1)

    def heaviest(groups):
        return max(int(v[g].sum()) for g in groups)

    alone = _areal_dropin._allocate(v, cap, 1, 1)
    assert len(alone) == len(theirs) and heaviest(alone) > heaviest(theirs)  # the case bites
    for fn in (areal.ffd_allocate, areal.kk_allocate):
        groups = fn(v.tolist(), cap, 1)
        assert sorted(i for g in groups for i in g) == list(range(300))
        assert len(groups) <= len(theirs) and heaviest(groups) <= heaviest(theirs)


def test_areal_allocators_compare_with_areals_order_for_unsigned_values():
    # AReaL sorts np.argsort(-values) on the array as passed: for uint32 the negation wraps,
    # the zero goes first, and AReaL 1.0.4's ffd_allocate returns groups of 8, 9 and 10
    # tokens. The drop-in reproduced the int64 order instead and returned 11, 8, 8.
    v = np.array([4, 3, 4, 5, 8, 3, 0], dtype=np.uint32)
    groups = areal.ffd_allocate(v, 11, 1)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert len(groups) <= 3 and max(int(v[g].sum()) for g in groups) <= 10


def test_areal_ffd_raises_where_no_multiple_of_the_divisor_fits():
    # 4 values need 4 groups of 800; the next multiple of 3 is 6 > 4 values. AReaL 1.0.4
    # raises RuntimeError("Cannot allocate values ..."); the drop-in returned 4 groups.
    with pytest.raises(RuntimeError, match="Cannot allocate values"):
        areal.ffd_allocate([391, 410, 410, 410], 800, 1, 3)
    with pytest.raises(RuntimeError, match="Cannot allocate values"):
        areal.ffd_allocate([1, 1, 1], 1, 2, 2)
    # kk_allocate: AReaL's differencing on its count clamped to n holds the cap: kept.
    assert sorted(map(sorted, areal.kk_allocate([1, 1, 1], 1, 2, 2))) == [[0], [1], [2]]


def test_areal_kk_equal_size_falls_back_like_areal_where_equal_sizes_break_the_cap():
    # AReaL 1.0.4 logs and falls back to first-fit decreasing (5 groups here); the drop-in
    # raised. Now: a capacity-bounded allocation, never heavier or more groups than FFD.
    values = [71, 28, 58, 24, 43, 77, 13, 77]
    groups = areal.kk_allocate(values, 98, 2, 1, True)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert max(sum(values[i] for i in g) for g in groups) <= 98
    assert len(groups) <= 5


@pytest.mark.parametrize(
    "call",
    [
        lambda: areal.ffd_allocate([0.5, 0.6, 0.7], 1, 1),  # cut to 0s: one group of 1.8
        lambda: areal.kk_allocate([1.5, 0.2], 1, 1),
        lambda: slime.first_fit_pack([0.5, 0.6, 0.7], 1),
        lambda: openrlhf.get_minimum_num_micro_batch_size([0.5, 0.6, 0.7], 1, 1, 1),
        lambda: verl.log_seqlen_unbalance([1.5, 2], [[0], [1]], "x"),
    ],
)
def test_fractional_token_counts_are_refused_not_truncated(call):
    with pytest.raises(ValueError, match="not a whole number of tokens"):
        call()


def test_areal_errors_and_metrics():
    with pytest.raises(RuntimeError, match="larger than capacity"):
        areal.ffd_allocate([100, 600], 500, 1)
    with pytest.raises(RuntimeError, match="exceed capacity"):
        areal.kk_allocate([100, 600], 500, 1)
    with pytest.raises(RuntimeError, match="divisible"):
        areal.kk_allocate([1, 2, 3, 4, 5], int(1e12), 3, equal_size=True)
    with pytest.raises(ValueError, match="must be >= K"):
        areal.balanced_greedy_partition([], 4)
    with pytest.raises(ValueError, match="divisible by K"):
        areal.balanced_greedy_partition([1, 2, 3], 2)
    m = areal._compute_packing_metrics([100, 200, 300, 400], [[0], [1, 2, 3]], 1000)
    assert (m["spread"], m["mean_load"], m["wasted_tokens"]) == (800, 500.0, 1000)
    assert areal._compute_packing_metrics([], [], 100)["n_groups"] == 0
    assert [len(g) for g in areal.balanced_greedy_partition([4, 3, 2, 1], 2)] == [2, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=25), st.data())
def test_grow_to_exact_count_never_heavier(weights, data):
    from seqbalance.compat._inputs import grow_to

    w = np.asarray(weights, dtype=np.float64)
    k = data.draw(st.integers(1, len(weights)))
    parts = [list(p) for p in np.array_split(np.arange(len(weights)), k)]
    m = data.draw(st.integers(k, len(weights)))
    out = grow_to(parts, m, w)
    assert len(out) == m and all(out)
    assert sorted(i for p in out for i in p) == list(range(len(weights)))
    # Every new part lies inside an old one, so no part (or token count) grew.
    owner = {i: j for j, p in enumerate(parts) for i in p}
    assert all(len({owner[i] for i in p}) == 1 for p in out)
    with pytest.raises(ValueError, match="non-empty"):
        grow_to(parts, len(weights) + 1, w)


# ---- patch() against a fake module tree ------------------------------------------------


_fake = fake_module


def test_patch_and_unpatch_fake_trees(monkeypatch):
    def old(*a, **k):
        return "old"

    sb_mod = _fake(monkeypatch, "verl.utils.seqlen_balancing",
                   get_seqlen_balanced_partitions=old, rearrange_micro_batches=old)  # fmt: skip
    user = _fake(monkeypatch, "verl.trainer.fake_user", get_seqlen_balanced_partitions=old)
    done = verl.patch()
    try:
        assert sb_mod.get_seqlen_balanced_partitions is verl.get_seqlen_balanced_partitions
        assert user.get_seqlen_balanced_partitions is verl.get_seqlen_balanced_partitions
        assert "verl.trainer.fake_user.get_seqlen_balanced_partitions" in done
        assert verl.patch() == done  # idempotent
    finally:
        verl.unpatch()
    assert sb_mod.get_seqlen_balanced_partitions is old
    assert user.get_seqlen_balanced_partitions is old

    seqpack = _fake(monkeypatch, "areal.utils.seqpack", ffd_allocate=old, kk_allocate=old)
    data = _fake(monkeypatch, "areal.utils.data", allocate_balanced_mbs_synced=old)
    areal.patch()
    try:
        assert seqpack.ffd_allocate is areal.ffd_allocate
        assert data.allocate_balanced_mbs_synced is areal.allocate_balanced_mbs_synced
    finally:
        areal.unpatch()
    assert seqpack.ffd_allocate is old and data.allocate_balanced_mbs_synced is old


def test_patch_with_verl_count(monkeypatch):
    torch = pytest.importorskip("torch")

    def old(*a, **k):
        return "old"

    mod = _fake(monkeypatch, "verl.utils.seqlen_balancing", rearrange_micro_batches=old)
    verl.patch(match_framework_count=True)
    try:
        with pytest.raises(ValueError, match="unpatch"):
            verl.patch()  # a different setting while patched
        lens = _match_lengths(1)  # verl's loop needs 12 micro-batches, 11 hold the cap
        _, idx = mod.rearrange_micro_batches(_batch(torch, lens, 120), 150)  # as verl calls it
        assert len(idx) == _verl_loop_count([lens], 150)
        assert len(idx) > len(verl.micro_batches_of_lengths(lens, 150))
    finally:
        verl.unpatch()
    assert mod.rearrange_micro_batches is old


def test_patch_refuses_unrelated_module(monkeypatch):
    _fake(monkeypatch, "verl.utils.seqlen_balancing")
    with pytest.raises(ValueError, match="none of"):
        verl.patch()


# ---- count agreement across ranks (gloo) -----------------------------------------------


def _rank_lengths(rank):
    rng = np.random.default_rng(100 + rank)
    return rng.integers(20, 100, size=10 + 7 * rank).tolist()


def worker_counts(rank, world):
    import torch
    import torch.distributed as dist

    from seqbalance.compat import areal as a
    from seqbalance.compat import verl as v

    lens = _rank_lengths(rank)
    batch = _batch(torch, lens, 100)
    mbs, idx = v.rearrange_micro_batches(batch, 250, dp_group=dist.group.WORLD)
    mbs_free, _ = v.rearrange_micro_batches(batch, 250, dp_group=dist.group.WORLD,
                                            same_micro_num_in_dp=False)  # fmt: skip
    spec = types.SimpleNamespace(max_tokens_per_mb=250, n_mbs=1, n_mbs_divisor=1,
                                 packing_algorithm="kk")  # fmt: skip
    groups = a.allocate_balanced_mbs_synced(spec, lens, group=dist.group.WORLD)
    caps = [int(mb["attention_mask"].sum()) for mb in mbs] + [
        sum(lens[i] for i in g) for g in groups
    ]
    return len(mbs), len(mbs_free), len(groups), max(caps), sorted(i for p in idx for i in p)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_count_agreement_gloo(world):
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_counts, world, timeout=100)
    counts = [o[0] for o in out]
    assert len(set(counts)) == 1  # verl: one count for the group
    assert len({o[2] for o in out}) == 1  # AReaL: one count for the group
    natural = [o[1] for o in out]
    assert counts[0] == max(natural)  # the group's count is the largest local one
    assert len(set(natural)) > 1  # the ranks really disagreed before agreeing
    for rank, o in enumerate(out):
        assert o[3] <= 250
        assert o[4] == list(range(len(_rank_lengths(rank))))


# ---- count agreement: mismatched arguments and local errors (gloo) -----------------------
#
# Every scenario runs on every rank, one after the other on one process group (spawning is
# the slow part), with a collective timeout far below the test's: a rank left waiting shows
# up as a gloo error, and a scenario that left a collective half done breaks the next one.


def _verl_count(rank, lens=None, cap=250, width=100, **kw):
    import torch
    import torch.distributed as dist

    batch = _batch(torch, _rank_lengths(rank) if lens is None else lens, width)
    return len(verl.rearrange_micro_batches(batch, cap, dp_group=dist.group.WORLD, **kw)[1])


def _no_mask(rank, world):
    import torch
    import torch.distributed as dist

    batch = _batch(torch, _rank_lengths(rank), 100)
    if rank == 0:  # a batch without the key verl reads the lengths from
        batch = FakeTD({"input_ids": batch["input_ids"]})
    return len(verl.rearrange_micro_batches(batch, 250, dp_group=dist.group.WORLD)[1])


def _areal_count(rank, lens=None, **spec):
    fields = dict(max_tokens_per_mb=250, n_mbs=1, n_mbs_divisor=1, packing_algorithm="ffd",
                  granularity=1)  # fmt: skip
    fields.update(spec)
    lens = _rank_lengths(rank) if lens is None else lens
    return len(areal.allocate_balanced_mbs_synced(types.SimpleNamespace(**fields), lens, None))


def _pairs(rank, world):
    # Rank 1's forced pair (100 + 100 tokens) is above the cap of 150.
    return _verl_count(rank, [100, 100, 60, 60] if rank == 1 else [60] * 4, cap=150,
                       force_group_size=2)  # fmt: skip


# name -> (function of rank and world, words every rank's message must hold; "{last}" is the
# last rank). Each must raise the same ValueError on every rank.
AGREEMENT_ERRORS = {
    "verl: different max_token_len": (
        lambda r, w: _verl_count(r, cap=300 if r == 1 else 250),
        ["rearrange_micro_batches", "max_token_len", "rank 1: 300"],
    ),
    "verl: different num_batches_divided_by": (
        lambda r, w: _verl_count(r, num_batches_divided_by=2 if r == w - 1 else None),
        ["num_batches_divided_by", "rank {last}: 2"],
    ),
    "verl: different min_num_micro_batch": (
        lambda r, w: _verl_count(r, min_num_micro_batch=4 if r == 0 else None),
        ["min_num_micro_batch", "rank 0: 4"],
    ),
    "verl: same_micro_num_in_dp=False on rank 1 only": (
        lambda r, w: _verl_count(r, same_micro_num_in_dp=r != 1),
        ["same_micro_num_in_dp", "rank 1: false"],
    ),
    "verl: different force_group_size": (
        lambda r, w: _verl_count(r, force_group_size=2 if r == 0 else 1),
        ["force_group_size", "rank 0: 2"],
    ),
    "verl: match_framework_count on rank 0 only": (
        lambda r, w: _verl_count(r, match_framework_count=r == 0),
        ["match_framework_count", "rank 0: true"],
    ),
    "verl: padded width above max_token_len on rank 1": (
        lambda r, w: _verl_count(r, [60] * 4, cap=150, width=200 if r == 1 else 100),
        ["failed on rank 1", "max_token_len must be greater"],
    ),
    "verl: a forced group above the cap on rank 1": (
        _pairs,
        ["failed on rank 1", "A forced group exceeds max_token_len", "=200"],
    ),
    "verl: no attention_mask on rank 0": (_no_mask, ["failed on rank 0", "attention_mask"]),
    "verl: rank 0 has fewer rows than the group's count": (
        lambda r, w: _verl_count(r, [90] if r == 0 else [90] * 6, cap=100),
        ["needs 6 non-empty micro-batches", "only 1 forced groups"],
    ),
    "verl, verl's count: rank 0 has fewer rows": (
        lambda r, w: _verl_count(
            r, [90] if r == 0 else [90] * 6, cap=100, match_framework_count=True
        ),
        ["needs 6 non-empty micro-batches", "only 1 forced groups"],
    ),
    "areal: different max_tokens_per_mb": (
        lambda r, w: _areal_count(r, max_tokens_per_mb=200 + 50 * (r == 1)),
        ["allocate_balanced_mbs_synced", "max_tokens_per_mb", "rank 1: 250"],
    ),
    "areal: different n_mbs": (
        lambda r, w: _areal_count(r, n_mbs=2 if r == w - 1 else 1),
        ["n_mbs", "rank {last}: 2"],
    ),
    "areal: different granularity": (
        lambda r, w: _areal_count(r, granularity=2 if r == 0 else 1),
        ["granularity", "rank 0: 2"],
    ),
    "areal: different packing_algorithm": (
        lambda r, w: _areal_count(r, packing_algorithm="kk" if r == 1 else "ffd"),
        ["packing_algorithm", "kk"],
    ),
    "areal: a sequence above the capacity on the last rank": (
        lambda r, w: _areal_count(r, [50, 150] if r == w - 1 else [50, 50], max_tokens_per_mb=100),
        ["failed on rank {last}", "capacity 100"],
    ),
    "areal: a negative length on rank 0": (
        lambda r, w: _areal_count(r, [50, -5] if r == 0 else [50, 50]),
        ["failed on rank 0"],
    ),
    "areal: rank 0 has fewer sequences than the group's count": (
        lambda r, w: _areal_count(r, [90] if r == 0 else [90] * 6, max_tokens_per_mb=100),
        ["needs 6 micro-batches", "only 1 sequences"],
    ),
}
AGREEMENT_OK = {  # run after all the errors: the ranks must still be in step
    "verl, divisor 2, at least 3": lambda r, w: _verl_count(
        r, num_batches_divided_by=2, min_num_micro_batch=3
    ),
    "verl, default": lambda r, w: _verl_count(r),
    "verl, same_micro_num_in_dp=False": lambda r, w: _verl_count(r, same_micro_num_in_dp=False),
    "areal: rank 0 needs 3, the others 2": lambda r, w: _areal_count(
        r, [90] * 3 if r == 0 else [30] * 6, max_tokens_per_mb=100
    ),
}


def worker_agreement_paths(rank, world):
    """(name, exception type or "ok", is a ValueError, message or value) per scenario."""
    out = []
    for name, (fn, _) in AGREEMENT_ERRORS.items():
        try:
            out.append((name, "ok", False, repr(fn(rank, world))))
        except Exception as exc:  # the test checks the type
            out.append((name, type(exc).__name__, isinstance(exc, ValueError), str(exc)))
    for name, fn in AGREEMENT_OK.items():
        try:
            out.append((name, "ok", False, fn(rank, world)))
        except Exception as exc:
            out.append((name, type(exc).__name__, False, str(exc)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_count_agreement_error_paths_gloo(world):
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_agreement_paths, world, timeout=200, collective_timeout=20)
    for i, (name, (_, words)) in enumerate(AGREEMENT_ERRORS.items()):
        per_rank = {o[i][1:] for o in out}
        assert len(per_rank) == 1, (name, per_rank)  # the same type and message everywhere
        ((kind, is_value_error, msg),) = per_rank
        assert is_value_error, (name, kind, msg)
        for w in words:
            assert w.format(last=world - 1) in msg, (name, w, msg)
        assert "gloo" not in msg.lower() and "timed out" not in msg.lower()
    ok = {name: [o[len(AGREEMENT_ERRORS) + j] for o in out] for j, name in enumerate(AGREEMENT_OK)}
    free = [p[3] for p in ok.pop("verl, same_micro_num_in_dp=False")]
    for name, per_rank in ok.items():
        assert {p[1] for p in per_rank} == {"ok"}, (name, per_rank)
        assert len({p[3] for p in per_rank}) == 1, (name, per_rank)  # one count for the group
    (c,) = {p[3] for p in ok["verl, divisor 2, at least 3"]}
    assert c % 2 == 0 and c >= 3
    # Without same_micro_num_in_dp each rank keeps its own count (they differ here); with
    # it, the group's count is the largest of those.
    assert len(set(free)) > 1 and ok["verl, default"][0][3] == max(free)
    assert ok["areal: rank 0 needs 3, the others 2"][0][3] == 3


# ---- match_framework_count: verl's own micro-batch count ---------------------------------


def _ldm(values, k):
    """Largest differencing (Karmarkar-Karp, free counts), plain Python, written here
    independently of seqbalance: k-tuples of (sum, items) heaviest first; the two tuples
    with the largest spread merge, heaviest subset with lightest, until one is left."""
    heap = []
    for i, v in enumerate(values):
        sets = [(v, [i])] + [(0, [])] * (k - 1)
        heapq.heappush(heap, (-v, -v, i, sets))
    tick = len(values)
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], -merged[0][0], tick, merged))
        tick += 1
    return [items for _, items in heap[0][3]]


def _verl_loop_count(rank_lens, cap, step=1, min_num=None):
    """verl 0.9's micro-batch count for a DP group, re-derived from its documented rule:
    per rank min(n, ceil(tokens / cap)) raised to min_num; the max over ranks; rounded up
    to a multiple of step; then + step until the differencing split of the workloads
    24576 L + L**2 into m parts is non-empty and within the cap on every rank."""
    starts = [min(len(x), -(-sum(x) // cap)) for x in rank_lens]
    if min_num is not None:
        starts = [max(min_num, s) for s in starts]
    m = -(-max(starts) // step) * step

    def fits(lens):
        parts = _ldm([24576 * x + x * x for x in lens], m)
        return all(p and sum(lens[i] for i in p) <= cap for p in parts)

    while not all(fits(x) for x in rank_lens):
        m += step
    return m


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=40), st.integers(120, 400))
def test_verl_match_framework_count_single_rank(lens, cap):
    m = _verl_loop_count([lens], cap)
    parts = verl.micro_batches_of_lengths(lens, cap, match_framework_count=True)
    assert len(parts) == m  # verl's count ...
    assert sorted(i for p in parts for i in p) == list(range(len(lens)))
    assert all(p and sum(lens[i] for i in p) <= cap for p in parts)  # ... every one fits
    # ... and at that count the heaviest micro-batch is never heavier than verl's split.
    work = [24576 * x + x * x for x in lens]
    theirs = max(sum(work[i] for i in p) for p in _ldm(work, m))
    assert max(sum(work[i] for i in p) for p in parts) <= theirs
    # By default: the fewest micro-batches that hold the cap, never more than verl's.
    assert len(verl.micro_batches_of_lengths(lens, cap)) <= m


def _match_lengths(rank):
    # Long-tailed lengths (chosen so that verl's loop needs more micro-batches than the
    # fewest that hold the cap, at world 2 and 3).
    rng = np.random.default_rng(170 + rank)
    return np.minimum(rng.geometric(1 / 40, size=25 + 9 * rank), 120).tolist()


def worker_match_count(rank, world):
    import torch
    import torch.distributed as dist

    batch = _batch(torch, _match_lengths(rank), 120)
    out = []
    for step in (None, 2, 3):
        kw = dict(dp_group=dist.group.WORLD, num_batches_divided_by=step)
        _, idx = verl.rearrange_micro_batches(batch, 150, match_framework_count=True, **kw)
        _, ours = verl.rearrange_micro_batches(batch, 150, **kw)
        out.append((len(idx), len(ours), sorted(i for p in idx for i in p)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_verl_match_framework_count_gloo(world):
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_match_count, world, timeout=200, collective_timeout=20)
    rank_lens = [_match_lengths(r) for r in range(world)]
    larger = 0
    for j, step in enumerate((1, 2, 3)):
        (m,) = {o[j][0] for o in out}  # one count for the group ...
        assert m == _verl_loop_count(rank_lens, 150, step)  # ... verl's
        (ours,) = {o[j][1] for o in out}
        assert ours <= m and ours % step == 0
        larger += ours < m
        for r, o in enumerate(out):
            assert o[j][2] == list(range(len(rank_lens[r])))
    assert larger  # the inputs are ones where verl's loop needs more micro-batches


def test_verl_all_padding_rows_give_one_micro_batch_in_both_modes():
    # verl 0.9.1 fails with an IndexError here; match_framework_count raised
    # "k must be at least 1, got 0" while the default returned one micro-batch.
    for match in (False, True):
        assert verl.micro_batches_of_lengths([0, 0, 0], 10, match_framework_count=match) == [
            [0, 1, 2]
        ]


def test_areal_assertions_stay_assertion_errors():
    # AReaL asserts here; framework code that catches AssertionError must still catch it.
    with pytest.raises(AssertionError, match="5 % 2 != 0"):
        areal._kk_partition([1, 2, 3, 4, 5], 2, equal_size=True)
    spec = types.SimpleNamespace(n_mbs=1, granularity=1, max_tokens_per_mb=None,
                                 n_mbs_divisor=1, packing_algorithm="ffd")
    with pytest.raises(AssertionError, match="max_tokens_per_mb"):
        areal.allocate_balanced_mbs(spec, [1, 2, 3])


def test_verl_greedy_partition_never_heavier_than_verls_greedy():
    # verl 0.9.1's output here is [[0, 2, 3, 5], [1, 4]] (heaviest 108,298,995); the
    # drop-in's refined longest-first greedy gave 110,565,562 (review).
    w = [9965025, 59052105, 41548432, 14153257, 47956081, 42632281]
    parts = verl.greedy_partition(w, 2, False)
    assert max(sum(w[i] for i in p) for p in parts) <= 108298995
    # The reproduction of verl's greedy: items in order to the lightest part (first on
    # ties); equal_size fills by count first.
    assert _verl_dropin._verl_greedy(np.array(w, float), 2, False) == [[0, 2, 3, 5], [1, 4]]
    assert _verl_dropin._verl_greedy(np.array([5.0, 1, 1, 1]), 2, True) == [[0, 3], [1, 2]]
