"""Baselines: the strategies of other frameworks, checked on cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance import workloads
from seqbalance.planning.baselines import BASELINES, sequential, token_ffd


def test_sequential_contiguous_then_first_fit():
    lengths = [600, 300, 500, 200, 900, 100]
    p = sequential(lengths, 2, 1000)
    # rank 0 gets 0..2: 600 opens, 300 joins it, 500 does not fit (1400) and opens another.
    # rank 1 gets 3..5: 200 opens, 900 does not fit (1100) and opens another, 100 joins the
    # first micro-batch (first fit, not next fit).
    assert p.micro_batches == [[[0, 1], [2]], [[3, 5], [4]]]
    assert p.strategy == "sequential"


def test_sequential_syncs_counts_by_splitting():
    lengths = [100, 100, 100, 100, 900, 900, 900]
    p = sequential(lengths, 2, 1000)
    # rank 0 (four sequences of 100) fits one micro-batch; rank 1 needs three, so rank 0's
    # micro-batch is split until it also has three.
    assert [len(r) for r in p.micro_batches] == [3, 3]
    assert sorted(i for mb in p.micro_batches[0] for i in mb) == [0, 1, 2, 3]
    assert p.violations()["empty"] == 0


def test_token_ffd_bins_dealt_round_robin():
    lengths = [700, 600, 500, 400, 300, 300, 200]
    p = token_ffd(lengths, 2, 1000)
    # FFD by tokens: 700+300 | 600+400 | 500+300+200 -> bins 0, 2 to rank 0, bin 1 to rank 1;
    # rank 1 then splits its bin to match two micro-batches.
    assert p.micro_batches[0] == [[0, 4], [2, 5, 6]]
    assert sorted(len(mb) for mb in p.micro_batches[1]) == [1, 1]
    assert p.violations()["over_capacity"] == 0


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_covers_every_index_once(name):
    lengths = workloads.lengths("sft-chat", 1000, seed=4)
    p = BASELINES[name](lengths, 8, 32768)
    flat = sorted(i for rank in p.micro_batches for mb in rank for i in mb)
    assert flat == list(range(lengths.size))
    assert {len(rank) for rank in p.micro_batches} == {p.num_micro_batches}
    assert p.strategy == name


def test_kk_baselines_can_break_capacity_and_report_it():
    # KK balances tokens without bounding them: on long-tailed rollouts some micro-batches
    # end up over the cap, and the plan must report exactly those.
    lengths = workloads.lengths("rl-math", 2048, seed=5)
    for name in ("token-kk", "cost-kk-uncapped"):
        p = BASELINES[name](lengths, 8, 32768)
        over = sum(
            1
            for rank in p.micro_batches
            for mb in rank
            if sum(int(lengths[i]) for i in mb) > 32768  # counted here, not by the library
        )
        assert over > 0
        assert p.violations()["over_capacity"] == over


def test_baseline_bad_input():
    with pytest.raises(ValueError, match="dp_size must be >= 1"):
        sequential([1, 2], 0, 10)
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1"):
        token_ffd(np.array([-1]), 1, 10)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_refuse_the_capacities_plan_refuses(name):
    # sequential and token_ffd raised OverflowError on a capacity of 2**63.
    with pytest.raises(ValueError, match=r"max_tokens=9223372036854775808 .*below 2\*\*62"):
        BASELINES[name]([5, 3, 8, 1], 2, 2**63)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_plans_an_empty_batch(name):
    # verl's and slime's rules start from an equal-count differencing, which has no
    # states to merge on no sequences (verl itself raises IndexError there).
    p = BASELINES[name]([], 3, 10)
    assert p.dp_size == 3
    assert [i for r in p.micro_batches for mb in r for i in mb] == []
    assert p.violations()["over_capacity"] == p.violations()["missing"] == 0
