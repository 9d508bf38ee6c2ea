"""The planner: every constraint as a property, every error path, exact small cases."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.planning.baselines import token_ffd
from seqbalance.planning.planner import plan
from seqbalance.planning.plans import Plan


def _flat(p: Plan) -> list[int]:
    return [i for rank in p.micro_batches for mb in rank for i in mb]


def _check_invariants(p: Plan, lengths, cap, *, padded=False, allow_empty=False):
    lengths = np.asarray(lengths, dtype=np.int64)
    assert sorted(_flat(p)) == list(range(len(lengths)))  # every index exactly once
    m = p.num_micro_batches
    assert all(len(rank) == m for rank in p.micro_batches)  # equal counts
    for rank in p.micro_batches:
        for mb in rank:
            assert mb == sorted(mb)
            if not mb:
                assert allow_empty
                continue
            t = lengths[mb]
            used = len(mb) * int(t.max()) if padded else int(t.sum())
            assert used <= cap
    v = p.violations()
    assert v["over_capacity"] == v["unequal_counts"] == v["missing"] == v["duplicated"] == 0


lengths_st = st.lists(st.integers(0, 1000), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=lengths_st,
    dp=st.integers(1, 5),
    cap=st.integers(1000, 4000),
    sync=st.sampled_from(["fsdp", "ddp"]),
    padded=st.booleans(),
    min_mb=st.integers(1, 3),
    mult=st.integers(1, 3),
)
def test_constraints_hold(lengths, dp, cap, sync, padded, min_mb, mult):
    p = plan(
        lengths,
        dp,
        cap,
        sync=sync,
        padded=padded,
        min_micro_batches=min_mb,
        micro_batch_multiple=mult,
        allow_empty=True,
    )
    _check_invariants(p, lengths, cap, padded=padded, allow_empty=True)
    m = p.num_micro_batches
    assert m >= min_mb and m % mult == 0
    assert m >= math.ceil(sum(lengths) / (dp * cap))
    sim = p.simulate()
    assert sim.step_time >= p.lower_bound() * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, dp=st.integers(1, 5), cap=st.integers(1000, 3000))
def test_no_more_micro_batches_than_ffd_and_none_empty(lengths, dp, cap):
    ffd_m = token_ffd(lengths, dp, cap).num_micro_batches
    assume(len(lengths) >= dp * ffd_m)  # else no plan without empty micro-batches exists
    p = plan(lengths, dp, cap)
    _check_invariants(p, lengths, cap)
    assert p.num_micro_batches <= ffd_m


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    dp=st.integers(1, 4),
    size=st.sampled_from(["free", "balanced"]),
)
def test_groups_stay_on_one_rank(data, dp, size):
    n_groups = data.draw(st.integers(dp, 12))
    per_group = data.draw(st.lists(st.integers(1, 4), min_size=n_groups, max_size=n_groups))
    groups = np.repeat(np.arange(n_groups), per_group)
    lengths = data.draw(st.lists(st.integers(1, 500), min_size=groups.size, max_size=groups.size))
    p = plan(lengths, dp, 2000, groups=groups, size=size, allow_empty=True)
    _check_invariants(p, lengths, 2000, allow_empty=True)
    assert p.violations()["split_groups"] == 0
    assert p.violations()["size_rule"] == 0
    owner = {}
    for r, rank in enumerate(p.micro_batches):
        for mb in rank:
            for i in mb:
                assert owner.setdefault(int(groups[i]), r) == r
    if size == "balanced":
        per_rank = [len({int(groups[i]) for mb in rank for i in mb}) for rank in p.micro_batches]
        assert max(per_rank) - min(per_rank) <= 1


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 800), min_size=4, max_size=48), dp=st.integers(1, 4))
def test_equal_size_rule_per_rank(lengths, dp):
    n = len(lengths) - len(lengths) % dp
    assume(n >= dp)
    lengths = lengths[:n]
    p = plan(lengths, dp, 4000, size="equal", allow_empty=True)
    _check_invariants(p, lengths, 4000, allow_empty=True)
    counts = {sum(len(mb) for mb in rank) for rank in p.micro_batches}
    assert counts == {n // dp}


def test_exact_small_case():
    # 4,000 tokens over 2 ranks at 1,000 per micro-batch: 2 micro-batches per rank, each
    # exactly full, e.g. {900, 100} {500, 500} {300, 700} {400, 600}; cost = tokens.
    lengths = [900, 100, 500, 500, 300, 700, 400, 600]
    p = plan(lengths, 2, 1000)
    assert p.num_micro_batches == 2
    loads = sorted(int(sum(lengths[i] for i in mb)) for rank in p.micro_batches for mb in rank)
    assert loads == [1000, 1000, 1000, 1000]  # 4,000 tokens, four full micro-batches
    assert p.simulate().step_time == 2000.0
    assert p.simulate().gap == 0.0


@pytest.mark.slow
def test_m_is_capacity_minimum_on_workloads():
    for name in ("rl-math", "sft-chat", "bimodal", "uniform"):
        lengths = workloads.lengths(name, 2048, seed=3)
        cap = 32768
        p = plan(lengths, 8, cap)
        _check_invariants(p, lengths, cap)
        assert p.num_micro_batches <= token_ffd(lengths, 8, cap).num_micro_batches
        assert p.num_micro_batches >= p.min_micro_batches_bound()


def test_forced_m_is_explained():
    p = plan([10] * 40, 2, 1000, min_micro_batches=3, micro_batch_multiple=2)
    assert p.num_micro_batches == 4
    assert any("min_micro_batches=3" in n and "micro_batch_multiple=2" in n for n in p.notes)
    assert plan([10] * 40, 2, 1000).notes == ()


@pytest.mark.parametrize("effort", ["default", "thorough"])
def test_forced_m_is_explained_whichever_candidate_wins(effort):
    # On long-context lengths a full-rank split wins; its plan keeps the request's note on
    # why it runs 8 micro-batches where the capacity needs fewer.
    from seqbalance._notes import as_note
    from seqbalance.costs import load_cost

    lens = workloads.load("long-context", 1024, seed=0).lengths
    p = plan(lens, 8, int(lens.max()), cost=load_cost("qwen2.5-7b"), min_micro_batches=8,
             effort=effort)  # fmt: skip
    assert p.num_micro_batches == 8
    raised = [as_note(n) for n in p.notes if as_note(n).kind == "count_raised"]
    assert len(raised) == 1 and raised[0].fields["m_min"] == 8, p.notes


def test_extra_micro_batches_trade_off():
    lengths = workloads.lengths("sft-chat", 512, seed=1)
    base = plan(lengths, 4, 32768, cost=lengths.astype(float))
    more = plan(lengths, 4, 32768, cost=lengths.astype(float), extra_micro_batches=3)
    assert more.simulate().step_time <= base.simulate().step_time
    assert base.num_micro_batches <= more.num_micro_batches <= base.num_micro_batches + 3


def test_extra_counts_note_counts_in_the_singular_and_plural():
    one = plan([5, 5, 5, 5, 7, 3], 2, 100, extra_micro_batches=1)
    two = plan([5, 5, 5, 5, 7, 3], 2, 10, extra_micro_batches=1)
    assert "and 1 micro-batch per rank stayed the fastest" in one.notes[-1]
    assert "and 2 micro-batches per rank stayed the fastest" in two.notes[-1]


def test_allow_empty_marks_empty_micro_batches():
    p = plan([5, 5, 5], 2, 100, min_micro_batches=2, allow_empty=True)
    assert p.violations()["empty"] == 1
    assert any("empty" in n for n in p.notes)


def test_allow_empty_packs_into_fewer_micro_batches_when_that_is_faster():
    # min_micro_batches=3 with allow_empty spread 7 sequences over all 3 FSDP micro-batch
    # indices: 840 + 393 = 1,233 tokens where one index of 875 (the partition bound: the
    # exhaustive optimum) and two empty ones are a plan.
    lens = [482, 840, 393, 229, 175, 830, 396]
    p = plan(lens, 4, 1500, cost="tokens", min_micro_batches=3, allow_empty=True)
    assert p.num_micro_batches == 3
    assert p.simulate().step_time == 875
    assert p.violations()["empty"] == 8
    # and the plan still says why it has 3 micro-batches (the padded candidate lost it)
    assert any("min_micro_batches=3" in n for n in p.notes)
    assert sum("empty micro-batches" in n for n in p.notes) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 100), min_size=1, max_size=14),
    st.integers(1, 4),
    st.integers(2, 6),
    st.integers(1, 3),
    st.sampled_from([None, (1.0, 0.01, 0.0, 5.0)]),
)
def test_more_micro_batches_with_allow_empty_cost_only_their_overhead(lens, dp, m_min, mult,
                                                                      params):  # fmt: skip
    # Under FSDP, asking for more micro-batches than the sequences need may leave the extra
    # ones empty; each then costs per_microbatch (a dummy step) and nothing more.
    from seqbalance import QuadraticCost

    cost = None if params is None else QuadraticCost(*params[:2], per_sequence=params[2],
                                                     per_microbatch=params[3])  # fmt: skip
    base = plan(lens, dp, 100, cost=cost, allow_empty=True)
    more = plan(lens, dp, 100, cost=cost, allow_empty=True, min_micro_batches=m_min,
                micro_batch_multiple=mult)  # fmt: skip
    _check_invariants(more, lens, 100, allow_empty=True)
    extra = more.num_micro_batches - base.num_micro_batches
    c0 = 0.0 if params is None else params[3]
    assert more.simulate().step_time <= (base.simulate().step_time + extra * c0) * (1 + 1e-9)


def test_cost_array_and_cost_model_like_objects():
    lengths = [100, 200, 300, 400]
    p = plan(lengths, 2, 1000, cost=[1.0, 1.0, 1.0, 100.0])
    assert p.costs.tolist() == [1.0, 1.0, 1.0, 100.0]
    # the expensive sequence sits alone on its rank
    ranks = [sorted(i for mb in rank for i in mb) for rank in p.micro_batches]
    assert [3] in ranks


# ---- errors -----------------------------------------------------------------------------


def test_too_long_sequence_names_index():
    with pytest.raises(ValueError, match=r"sequence 2 has 5000 tokens.*max_tokens=4096"):
        plan([10, 20, 5000, 7000], 2, 4096)


def test_too_few_sequences():
    with pytest.raises(ValueError, match=r"cannot fill 4 ranks x 1 micro-batches.*allow_empty"):
        plan([10, 20, 30], 4, 1000)


def test_groups_without_empty_micro_batches():
    # Rank split by cost would leave a rank with one sequence for two micro-batches; the
    # planner must find the split {10}, {10} | {2}, {5} instead of giving up.
    p = plan([2, 10, 5, 10], 2, 11, groups=[0, 1, 0, 3], size="balanced")
    assert p.num_micro_batches == 2
    assert p.violations()["empty"] == 0 and p.violations()["split_groups"] == 0
    p = plan([5, 5, 3, 3, 1, 2], 3, 5, groups=[2, 0, 4, 0, 5, 4])
    assert p.violations() == {
        "over_capacity": 0,
        "empty": 0,
        "unequal_counts": 0,
        "missing": 0,
        "duplicated": 0,
        "split_groups": 0,
        "size_rule": 0,
    }


def test_fsdp_fills_slack_with_swaps():
    # dp=2, 4 micro-batches of <= 20 tokens, cost = tokens. Best: slot 1 = {18} and
    # {8, 5} (level 18), slot 2 = {5} and {5} (level 5): 23. Balanced bins give 26.
    p = plan([5, 5, 8, 18, 5], 2, 20)
    assert p.simulate().step_time == 23.0


def test_too_few_sequences_per_rank_with_groups():
    with pytest.raises(ValueError, match=r"rank .* holds 1 sequences but needs 2"):
        plan([10, 20, 30, 40], 2, 1000, groups=[0, 0, 0, 1], min_micro_batches=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dp_size": 0}, "dp_size must be >= 1"),
        ({"dp_size": 1.5}, "dp_size must be a positive integer"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"sync": "zero3"}, "sync must be one of"),
        ({"size": "same"}, "size must be one of"),
        ({"min_micro_batches": 0}, "min_micro_batches must be >= 1"),
        ({"micro_batch_multiple": -2}, "micro_batch_multiple must be >= 1"),
        ({"extra_micro_batches": -1}, "extra_micro_batches must be >= 0"),
        ({"lengths": [10, -1]}, r"lengths\[1\] = -1 is negative"),
        ({"lengths": [[1, 2]]}, "must be 1-D"),
        ({"lengths": [1.5]}, "not a whole number"),
        ({"cost": [1.0, float("nan"), 1.0, 1.0]}, r"cost\[1\] = nan is not finite"),
        ({"cost": [1.0]}, "cost has 1 entries but there are 4 lengths"),
        ({"groups": [0, 1]}, "groups has 2 entries but there are 4 items"),
        ({"size": "equal", "lengths": [1, 2, 3]}, "equal"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"lengths": [10, 20, 30, 40], "dp_size": 2, "max_tokens": 100}
    args.update(kwargs)
    lengths = args.pop("lengths")
    with pytest.raises(ValueError, match=match):
        plan(lengths, **args)


# ---- determinism ------------------------------------------------------------------------

_SCRIPT = """
import hashlib, numpy as np
from seqbalance import workloads
from seqbalance.planning.planner import plan
w = workloads.load("rl-math", 4096, seed=7)
out = []
for kw in ({}, {"sync": "ddp"}, {"groups": w.groups, "size": "balanced"}):
    out.append(plan(w.lengths, 16, 32768, cost=w.lengths ** 2 / 1e4 + w.lengths, **kw).to_json())
print(hashlib.sha256("".join(out).encode()).hexdigest())
"""


@pytest.mark.slow
def test_same_plan_in_every_process():
    digests = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=240
        )
        assert res.returncode == 0, res.stderr
        digests.add(res.stdout.strip())
    assert len(digests) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rl-math", "sft-chat", "bimodal", "uniform"])
@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
@pytest.mark.parametrize("effort", ["default", "thorough"])
def test_never_slower_than_a_runnable_baseline(name, sync, effort):
    from seqbalance.planning.baselines import BASELINES

    lengths = workloads.lengths(name, 1024, seed=11)
    cost = lengths + lengths.astype(float) ** 2 / 7e4  # ~Qwen2.5-7B's linear/quadratic ratio
    ours = plan(lengths, 8, 32768, cost=cost, sync=sync, effort=effort)
    sim = ours.simulate()
    mine = sim.step_time
    # The full search is never slower than a baseline; the default stops once provably
    # within 0.1% of the bound (so no baseline is more than that faster), and is never
    # slower than one where its gap exceeds that.
    slack = 1e-3 if effort == "default" and sim.gap <= 1e-3 else 1e-12
    for base in BASELINES.values():
        other = base(lengths, 8, 32768, cost=cost, sync=sync)
        v = other.violations()
        if v["over_capacity"] or v["empty"]:
            continue  # would run out of memory or hang: not a plan one could run
        assert mine <= other.simulate().step_time * (1 + slack), other.strategy


def _lockstep_optimum(lengths: list[int], cost, dp: int, m: int, cap: int) -> float:
    """Brute force: every assignment of sequences to ``dp * m`` non-empty bins within
    ``cap``; under lockstep slots the best deal of a bin set to (rank, slot) costs the sum
    of every ``dp``-th bin cost in descending order."""
    import itertools

    nb = dp * m
    codes = np.array(list(itertools.product(range(nb), repeat=len(lengths))))
    rows = np.arange(len(codes))
    tok = np.zeros((len(codes), nb))
    tot = np.zeros((len(codes), nb))
    for i, n in enumerate(lengths):
        np.add.at(tok, (rows, codes[:, i]), n)
        np.add.at(tot, (rows, codes[:, i]), cost.microbatch_cost(np.array([n])))
    ok = (tok <= cap).all(axis=1) & (tok > 0).all(axis=1)
    ranked = -np.sort(-tot[ok], axis=1)
    return float(ranked[:, ::dp].sum(axis=1).min())


@pytest.mark.parametrize("lengths", [
    [818, 666, 2048, 539, 188],
    [1881, 172, 673, 331, 220, 83, 886],
    [1066, 974, 450, 437, 114, 1394],
    [746, 258, 948, 199, 2048],
])
def test_fsdp_plan_reaches_the_lockstep_optimum_with_full_bins(lengths):
    """Small two-rank cases whose optimum fills micro-batches to the cap (brute force):
    bins evened out around the mean missed it by 4-15%; first-fit-decreasing bins left
    unbalanced, a candidate since 2026-11-23, reach it."""
    from seqbalance.costs import QuadraticCost

    cost = QuadraticCost(per_token=1.0, per_token_sq=1.0 / 512, per_sequence=64.0)
    p = plan(lengths, 2, 2048, cost=cost, sync="fsdp", baselines=False)
    assert p.num_micro_batches == 2
    opt = _lockstep_optimum(lengths, cost, 2, 2, 2048)
    assert p.simulate(cost).step_time == pytest.approx(opt, rel=1e-9)


def _first_fit(order: list[int], lengths: np.ndarray, nbins: int,
               cap: int) -> list[list[int]] | None:
    """Independent reference packer: each sequence, in ``order``, into the first of
    ``nbins`` bins of ``cap`` tokens with room (bins as index lists), or None."""
    room = [cap] * nbins
    bins: list[list[int]] = [[] for _ in range(nbins)]
    for i in order:
        b = next((b for b in range(nbins) if room[b] >= lengths[i]), None)
        if b is None:
            return None
        room[b] -= int(lengths[i])
        bins[b].append(i)
    return bins


def _lockstep_time_of_ffd(lengths: np.ndarray, costs: np.ndarray, nbins: int, dp: int,
                          cap: int) -> float | None:
    """Independent reference: first-fit decreasing by tokens into ``nbins`` bins of ``cap``,
    left unbalanced; under lockstep slots the best deal of bins to (rank, slot) costs the
    sum of every ``dp``-th bin cost in descending order. None if FFD leaves a bin empty or
    cannot fit everything."""
    order = sorted(range(lengths.size), key=lambda i: (-lengths[i], -costs[i], i))
    bins = _first_fit(order, lengths, nbins, cap)
    if bins is None or not all(bins):
        return None
    ranked = sorted((float(costs[b].sum()) for b in bins), reverse=True)
    return float(sum(ranked[j] for j in range(0, nbins, dp)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 2048), min_size=8, max_size=80),
    dp=st.integers(2, 4),
    cap=st.sampled_from([2048, 3000, 4096]),
)
def test_fsdp_plan_never_slower_than_full_ffd_bins(lengths, dp, cap):
    """Under lockstep slots, bins filled to the cap line up across ranks; the planner keeps
    that packing as a candidate, so (without the framework baselines) the full search is
    never slower than plain first-fit-decreasing bins at its own micro-batch count, and
    the default is not either unless it stopped within its 0.1% stop gap of the bound
    (then it is within that of them)."""
    from seqbalance.costs import QuadraticCost

    lens = np.asarray(lengths, dtype=np.int64)
    cost = QuadraticCost(per_token=1.0, per_token_sq=1.0 / 512, per_sequence=64.0)
    costs = np.array([cost.microbatch_cost(np.array([x])) for x in lens])
    for effort in ("thorough", "default"):
        try:
            p = plan(lens, dp, cap, cost=cost, sync="fsdp", baselines=False, effort=effort)
        except ValueError:  # too few sequences for every micro-batch of the needed count
            assume(False)
        ref = _lockstep_time_of_ffd(lens, costs, dp * p.num_micro_batches, dp, cap)
        assume(ref is not None)
        sim = p.simulate(cost)
        stopped = effort == "default" and sim.gap <= 1e-3
        assert sim.step_time <= ref * (1 + (1e-3 if stopped else 1e-9))


@pytest.mark.parametrize("seed", [0, 1])
def test_fsdp_tight_cap_within_one_percent_of_the_token_bound(seed):
    """sft-chat lengths / 8 over 8 ranks at a 2,048-token cap (3 micro-batches, 86% full):
    under lockstep slots no plan beats total tokens / dp. Ranks split first and filled to
    the cap come within 0.4% of it; bins evened out (the planner's own search before
    2026-11-23, without the framework baselines) stayed 4.5-5% above."""
    from seqbalance.costs import TokenCost

    lens = np.minimum(np.maximum(2, np.round(workloads.lengths("sft-chat", 256, seed=seed) / 8)),
                      2048).astype(np.int64)
    p = plan(lens, 8, 2048, cost=TokenCost(), sync="fsdp", baselines=False)
    assert p.violations()["over_capacity"] == 0
    assert p.simulate(TokenCost()).step_time <= lens.sum() / 8 * 1.01


def test_one_rank_keeps_micro_batches_even():
    """One rank has nothing to line up with (its step is the sum of its micro-batches), so
    the full-bins candidates stay out. Here float rounding once let unbalanced first-fit
    bins win that tie (in the single-rank drop-ins too: AReaL, slime): one micro-batch of
    161 tokens next to full ones, where the evened-out plan's lightest holds ~1,550."""
    from seqbalance.costs import QuadraticCost

    cost = QuadraticCost(per_token=3e-6, per_token_sq=4e-8, per_sequence=1.7e-3)
    lens = np.minimum(np.maximum(2, np.round(workloads.lengths("bimodal", 128, seed=0) / 8)),
                      2048).astype(np.int64)
    p = plan(lens, 1, 2048, cost=cost, baselines=False)
    order = sorted(range(lens.size), key=lambda i: (-lens[i], i))
    bins = _first_fit(order, lens, p.num_micro_batches, 2048)
    assert bins is not None
    ours = [int(lens[np.asarray(mb)].sum()) for mb in p.micro_batches[0]]
    assert min(ours) > min(int(lens[b].sum()) for b in bins)  # not FFD's near-empty leftover


def test_ddp_skips_the_global_packing_when_the_rank_split_is_at_the_bound(monkeypatch):
    # Tokens 3000 over 2 ranks of 1000-token micro-batches: at least 2 micro-batches per
    # rank, and no rank below 1500 tokens. {900, 100, 500} / {500, 300, 700} meets both
    # (900+100 | 500 and 500+300 | 700), so no plan is faster and the global packing,
    # the slow part of a DDP plan, need not run.
    import seqbalance.planning.planner as planner

    calls = []
    real = planner._plan_global
    monkeypatch.setattr(planner, "_plan_global", lambda *a, **k: calls.append(1) or real(*a, **k))
    lengths = [900, 100, 500, 500, 300, 700]
    p = plan(lengths, 2, 1000, sync="ddp", baselines=False)
    _check_invariants(p, lengths, 1000)
    assert calls == []
    assert p.num_micro_batches == 2
    assert sorted(sum(lengths[i] for mb in rank for i in mb) for rank in p.micro_batches) == [
        1500,
        1500,
    ]
    # FSDP lines slots up across ranks, so there the global packing still runs.
    plan(lengths, 2, 1000, sync="fsdp", baselines=False)
    assert calls


def _ddp_fast_and_full(lens, dp, cap, **kw):
    """The DDP plan as it is, the plan without the rank-first shortcut, and whether the
    shortcut gave the plan (None, None, False when the inputs are infeasible for both)."""
    from unittest import mock

    import seqbalance.planning.planner as planner

    with mock.patch.object(planner, "_ddp_rank_first_at_bound", lambda *a, **k: None):
        try:
            full = planner.plan(lens, dp, cap, sync="ddp", **kw)
        except ValueError:  # too few sequences for the counts the cap needs
            with pytest.raises(ValueError):
                planner.plan(lens, dp, cap, sync="ddp", **kw)
            return None, None, False
    fired = []
    real = planner._ddp_rank_first_at_bound

    def spy(*a, **k):
        got = real(*a, **k)
        fired.append(got is not None)
        return got

    with mock.patch.object(planner, "_ddp_rank_first_at_bound", spy):
        fast = planner.plan(lens, dp, cap, sync="ddp", **kw)
    return fast, full, any(fired)


def _assert_no_loss(fast, full, lens, cap, cost):
    from seqbalance.partitioning.kway import AUTO_RTOL

    lens = np.asarray(lens, dtype=np.int64)
    assert sorted(_flat(fast)) == list(range(lens.size))
    assert len({len(rank) for rank in fast.micro_batches}) == 1
    for rank in fast.micro_batches:
        for mb in rank:  # within the cap, or one sequence above it alone
            assert mb and (int(lens[mb].sum()) <= cap or len(mb) == 1)
    assert fast.num_micro_batches <= full.num_micro_batches
    if fast.num_micro_batches == full.num_micro_batches:
        t_fast, t_full = fast.simulate(cost).step_time, full.simulate(cost).step_time
        assert t_fast <= t_full * (1 + AUTO_RTOL) + 1e-9


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=2, max_size=160),
    dp=st.integers(1, 6),
    cap=st.integers(2500, 9000),
    c0=st.sampled_from([0.0, 500.0]),
    quadratic=st.booleans(),
    min_mb=st.integers(1, 3),
    baselines=st.booleans(),
)
# Found by this test: the split does not pack into 2, the joint exact search finds other
# rank contents that do (6,922 and 4,655 tokens), which must not pass as "at the bound".
@example(lengths=[1] * 11 + [1135, 1168, 1191, 1479, 1985, 2315, 2293], dp=2, cap=3461,
         c0=0.0, quadratic=False, min_mb=1, baselines=False)  # fmt: skip
def test_ddp_shortcut_loses_nothing_beyond_the_partition_tolerance(
    lengths, dp, cap, c0, quadratic, min_mb, baselines
):
    # The DDP shortcut (rank-first split at the bound: global packing and rank exchange
    # skipped) against the full search: never more micro-batches, and a step no longer
    # than the full search's by more than AUTO_RTOL, the tolerance "auto" stops at. A
    # per-micro-batch cost, a count floor, baselines and sequences above the cap (run
    # alone) are drawn too.
    from seqbalance.costs import QuadraticCost

    assume(len(lengths) >= dp)
    lens = np.asarray(lengths, dtype=np.int64)
    cost = QuadraticCost(
        per_token=4096.0, per_token_sq=1.0 if quadratic else 0.0, per_microbatch=c0
    )
    fast, full, _ = _ddp_fast_and_full(lens, dp, cap, cost=cost, min_micro_batches=min_mb,
                                       baselines=baselines, oversized="alone")  # fmt: skip
    if fast is not None:
        _assert_no_loss(fast, full, lens, cap, cost)


def test_ddp_shortcut_fires_on_the_workloads_and_never_for_one_rank():
    # The property test above draws few inputs where the shortcut applies; on the
    # standard workloads it does (and loses nothing), and with one rank it never does.
    fired = 0
    for name in ("rl-math", "sft-chat", "long-mix"):
        lens = np.minimum(workloads.lengths(name, 512, seed=2) // 4, 8192)
        for dp in (1, 2, 4, 8):
            fast, full, hit = _ddp_fast_and_full(lens, dp, 8192, baselines=False)
            _assert_no_loss(fast, full, lens, 8192, None)
            assert not (dp == 1 and hit)
            fired += hit
    assert fired >= 6


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 100), min_size=2, max_size=14),
    st.integers(1, 4),
    st.sampled_from(["fsdp", "ddp"]),
    st.sampled_from([None, (1.0, 0.01, 0.0, 5.0)]),
)
# Asking for one more count skipped the baseline and full-rank candidates: 145 against
# 118 at the same count here (found by a review helper).
@example([11, 53, 100, 45, 18, 100, 18], 3, "fsdp", None)
# The fewest count won only after its ddp rank exchange, which the pick between counts did
# not see: 296.1 against 295.09 (found by a CI run's hypothesis draw).
@example([1, 12, 22, 28, 46, 51, 79, 97], 2, "ddp", (1.0, 0.01, 0.0, 5.0))
def test_extra_micro_batches_never_slower_than_none(lens, dp, sync, params):
    from seqbalance import QuadraticCost

    cost = None if params is None else QuadraticCost(*params[:2], per_sequence=params[2],
                                                     per_microbatch=params[3])  # fmt: skip
    base = plan(lens, dp, 100, cost=cost, sync=sync, allow_empty=True)
    more = plan(lens, dp, 100, cost=cost, sync=sync, allow_empty=True, extra_micro_batches=1)
    assert more.simulate().step_time <= base.simulate().step_time * (1 + 1e-9)
