"""seqbalance.compat: bad arguments raise a ValueError that names them, never another
exception, a wrapped value or a silently dropped sample (cases from a fuzzing review)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from seqbalance.compat import areal, openrlhf, slime, verl

TINY = dict(hidden_size=16, num_attention_heads=2, num_query_groups=2, vocab_size=32,
            ffn_hidden_size=64, num_experts=None, num_layers=2, kv_channels=8)  # fmt: skip


def _slime_args(**kw):
    base = dict(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=10,
                balance_data=False, balance_by_flops=False, **TINY)  # fmt: skip
    base.update(kw)
    return NS(**base)


TP = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
LENS8 = [3, 7, 1, 9, 4, 4, 2, 8]

CASES = {
    # Token counts that are negative or wrap in an int64 cast used to be packed.
    "areal kk negative": (lambda: areal.kk_allocate([-300, 150, 90], 200, 1), "negative"),
    "areal kk 1e19": (lambda: areal.kk_allocate(np.array([1e19, 5.0]), 100, 1), "too large"),
    "verl count negative": (
        lambda: verl.micro_batches_of_lengths([-300, 150, 90], 200, match_framework_count=True),
        "negative",
    ),
    "slime uint64": (
        lambda: slime.first_fit_pack(np.array([2**64 - 1, 5], dtype=np.uint64), 100),
        "18446744073709551615 is too large",
    ),
    "workload overflow": (lambda: verl.calculate_workload([2**53, 1]), "would wrap"),
    # Python ints beyond int64: numpy makes objects, or floats beside small ones.
    "workload 2**70": (lambda: verl.calculate_workload([1, 2**70]), "would wrap"),
    "workload 2**63+1": (lambda: verl.calculate_workload([1, 2**63 + 1]), "would wrap"),
    "workload negative": (lambda: verl.calculate_workload(np.array([-1, 2])), "negative"),
    "slime flops negative": (lambda: slime.calculate_fwd_flops([-5], _slime_args()), "negative"),
    "slime flops fraction": (lambda: slime.sequence_fwd_flops([1.5], _slime_args()), "whole"),
    # Counts and capacities: zero, fractional, None, absurd.
    "areal capacity 0": (lambda: areal.kk_allocate([0, 0], 0, 1, 1), "capacity"),
    "areal capacity nan": (lambda: areal.kk_allocate([5], float("nan"), 1), "capacity"),
    "areal capacity -1.5": (lambda: areal.ffd_allocate([5], -1.5, 1), "capacity"),
    "areal capacity '500'": (lambda: areal.ffd_allocate([5], "500", 1), "capacity"),
    "areal capacity True": (lambda: areal.ffd_allocate([0], True, 1), "capacity"),
    "areal capacity 0.5": (lambda: areal.ffd_allocate([1], 0.5, 1), "larger than capacity 0.5"),
    "areal divisor None": (lambda: areal.ffd_allocate([3], 10, None, None), "n_groups_divisor"),
    "areal K 0": (lambda: areal.balanced_greedy_partition([1, 2], 0), "K"),
    "areal kk k 0": (lambda: areal._kk_partition([0], 0), "k must"),
    "areal kk k huge": (lambda: areal._kk_partition([1, 2], 2**40), "above"),
    "areal metrics index": (lambda: areal._compute_packing_metrics([], [[0]], 0), "index"),
    "verl k 2.9": (lambda: verl.karmarkar_karp([1, 2, 3, 4], 2.9, False), "k_partitions"),
    "verl k '2'": (lambda: verl.karmarkar_karp([1, 2, 3, 4], "2", False), "k_partitions"),
    "verl k huge": (lambda: verl.karmarkar_karp([1, 2], 2**40, False), "above"),
    "verl k None": (lambda: verl.get_seqlen_balanced_partitions([1, 2], None, False),
                    "k_partitions"),
    "verl groups k 0": (
        lambda: verl.get_group_balanced_partitions([1, 2, 3, 4], [0, 0, 1, 1], 0),
        "k_partitions",
    ),
    "verl cap 0": (lambda: verl.micro_batches_of_lengths([1], 0), "max_token_len"),
    "verl cap 5.5": (
        lambda: verl.micro_batches_of_lengths([1] * 6, 5.5, match_framework_count=True),
        "max_token_len",
    ),
    "verl log empty": (lambda: verl.log_seqlen_unbalance([], [], "p"), "nothing"),
    "verl log index": (lambda: verl.log_seqlen_unbalance([1, 2], [[5]], "p"), "index 5"),
    "openrlhf log empty": (lambda: openrlhf.log_seqlen_unbalance([], [], "p"), "nothing"),
    "openrlhf cap None": (
        lambda: openrlhf.get_minimum_num_micro_batch_size([], None, 1, 1),
        "max_tokens_per_gpu",
    ),
    "openrlhf k huge": (lambda: openrlhf.karmarkar_karp([1, 2], 2**40, False), "above"),
    "slime k huge": (lambda: slime.karmarkar_karp([1, 2], 2**40, False), "above"),
    "slime bin cap None": (lambda: slime.first_fit_pack([0], None), "max_tokens_per_bin"),
    "slime bins repeat": (lambda: slime.expand_bins_by_splitting([[0, 0, 1]], 3, [1, 2]),
                          "more than one bin"),
    "slime bins index": (lambda: slime.expand_bins_by_splitting([[0, 5]], 3, [1, 2]),
                         "outside"),
    # slime's schedule: a sample without a rollout id was dropped from every rank.
    "slime ids short": (
        lambda: slime.build_dp_schedule(_slime_args(), TP, LENS8, global_batch_size=2,
                                        rollout_indices=[0, 0, 1, 1, 2, 2, 3]),
        "rollout_indices has 7 entries for 8",
    ),
    "slime batch 0": (
        lambda: slime.build_dp_schedule(_slime_args(), TP, LENS8, global_batch_size=0,
                                        rollout_indices=[0, 0, 1, 1, 2, 2, 3, 3]),
        "global_batch_size",
    ),
    "slime mbs 0": (
        lambda: slime.build_dp_schedule(
            _slime_args(use_dynamic_batch_size=False, micro_batch_size=0), TP, LENS8,
            global_batch_size=2, rollout_indices=[0, 0, 1, 1, 2, 2, 3, 3]),
        "micro_batch_size",
    ),
    "slime vpp None": (
        lambda: slime.build_dp_schedule(_slime_args(), {**TP, "vpp_size": None}, LENS8,
                                        global_batch_size=2,
                                        rollout_indices=[0, 0, 1, 1, 2, 2, 3, 3]),
        "vpp_size",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_arguments_raise_a_value_error_naming_them(name):
    call, words = CASES[name]
    with pytest.raises(ValueError, match=words):
        call()


def test_whole_float_counts_still_work():
    # 2.0 parts and a 10.0-token capacity are whole numbers: accepted, not truncated.
    assert len(verl.karmarkar_karp([1, 2, 3, 4], 2.0, False)) == 2
    assert areal.ffd_allocate([3, 4, 5], 10.0, 1) == areal.ffd_allocate([3, 4, 5], 10, 1)


def test_areal_capacity_is_any_real_number_as_in_areal():
    # AReaL compares integer sums with its capacity: 500.5 holds what 500 holds, and inf
    # (or 1e18, sys.maxsize: AReaL's docs suggest a very large capacity to ignore it) what
    # the total holds. A floor of -1 or 0 groups is raised to the divisor, as AReaL does.
    vals = [100, 200, 300, 150, 250]
    for fn in (areal.ffd_allocate, areal.kk_allocate):
        assert fn(vals, 500.5, 2) == fn(vals, 500, 2)
        for huge in (float("inf"), 1e18, 2**63 - 1, 2**80, np.float32(np.inf)):
            assert fn(vals, huge, 2) == fn(vals, sum(vals), 2)
        assert fn(vals, 500, -1) == fn(vals, 500, 1) == fn(vals, 500, 0)
    assert areal.ffd_allocate([0, 0], 0.5, 1) == [[0, 1]]  # nothing above 0.5 tokens
    # min_groups and divisor 0 with no tokens: AReaL divides by zero; one group here.
    assert areal.kk_allocate([0, 0], 10, 0, 0) == [[0, 1]]
    assert areal.kk_allocate([], 10, 0, 0) == []


def test_verl_min_num_micro_batch_is_a_floor_of_any_integer():
    # verl takes max(min_num_micro_batch, count): 0 and -1 ("unset") leave the count alone.
    lens = [4, 6, 3, 9]
    base = verl.micro_batches_of_lengths(lens, 10)
    for floor in (0, -1, None):
        assert verl.micro_batches_of_lengths(lens, 10, min_num_micro_batch=floor) == base
    assert len(verl.micro_batches_of_lengths(lens, 10, min_num_micro_batch=4)) == 4
    with pytest.raises(ValueError, match="min_num_micro_batch"):
        verl.micro_batches_of_lengths(lens, 10, min_num_micro_batch=1.5)


def test_index_lists_take_what_the_frameworks_index_with():
    # Rows of an integer tensor or array, torch.chunk pieces and numpy integers index the
    # values in verl and AReaL: the metrics take them; bools and floats are refused.
    torch = pytest.importorskip("torch")
    lens = [5, 3, 7, 2]
    plain = [[0, 1], [2, 3]]
    for parts in (list(torch.tensor(plain)), list(torch.arange(4).chunk(2)), np.array(plain),
                  [[np.int32(0), torch.tensor(1)], (2, 3)]):  # fmt: skip
        assert verl.log_seqlen_unbalance(lens, parts, "x") == verl.log_seqlen_unbalance(
            lens, plain, "x"
        )
        assert areal._compute_packing_metrics(lens, parts, 10) == (
            areal._compute_packing_metrics(lens, plain, 10)
        )
    for bad, shown in (([[0, True], [2, 3]], "True"), ([[0, 1.0], [2, 3]], "1.0"),
                       ([torch.tensor([0.0, 1.0]), [2, 3]], "tensor")):  # fmt: skip
        with pytest.raises(ValueError, match=f"partitions\\[0\\] holds {shown}"):
            verl.log_seqlen_unbalance(lens, bad, "x")
    with pytest.raises(ValueError, match="index 1 is in more than one"):
        slime.expand_bins_by_splitting([np.array([0, 1]), [1]], 3, [1, 2])
    # A flat list of indices (or None) where lists were due: "'int' object is not
    # iterable" (TypeError) came out of the error path itself.
    for bad, shown in (([0, 1], "0"), ([None, [2, 3]], "None"), (["01", [2, 3]], "'01'")):
        with pytest.raises(ValueError, match=f"partitions\\[0\\] is {shown}, not a list"):
            verl.log_seqlen_unbalance(lens, bad, "x")


def test_largest_workload_length_is_exact():
    # 24576 L + L**2 for the largest L whose workload stays below 2**63 (worked in Python
    # ints: 3,036,988,212 gives 9,223,372,036,849,255,056); one more token would wrap.
    top = 3_036_988_212
    assert verl.calculate_workload([top]).tolist() == [24576 * top + top * top]
    assert 24576 * (top + 1) + (top + 1) ** 2 >= 2**63
    with pytest.raises(ValueError, match="would wrap"):
        verl.calculate_workload([top + 1])


def test_get_reverse_idx_keeps_tensors_and_arrays_lists_otherwise():
    assert verl.get_reverse_idx((2, 0, 1)) == [1, 2, 0]
    assert verl.get_reverse_idx(np.array([2, 0, 1], dtype=np.int32)).dtype == np.int32
