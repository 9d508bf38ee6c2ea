"""Plan: reordering, JSON round trip, statistics and violation reporting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.planning.planner import plan
from seqbalance.planning.plans import Plan


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 900), min_size=1, max_size=50),
    dp=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_inverse_order_restores_input_order(lengths, dp, seed):
    p = plan(lengths, dp, 1000, allow_empty=True)
    data = np.random.default_rng(seed).standard_normal((len(lengths), 3))
    reordered = data[p.order()]
    np.testing.assert_array_equal(reordered[p.inverse_order()], data)
    # rank_indices concatenated give the same layout as order()
    flat = np.concatenate([p.rank_indices(r) for r in range(p.dp_size)])
    np.testing.assert_array_equal(flat, p.order())


@pytest.mark.parametrize(
    ("micro_batches", "words"),
    [
        ([[[0], [0]]], ["1 missing", "[1]", "1 repeated", "[0]"]),  # was [1, -1]: garbage
        ([[[0]]], ["1 missing", "[1]"]),  # was an IndexError
    ],
)
def test_inverse_order_refuses_plans_without_each_sequence_once(micro_batches, words):
    p = Plan(micro_batches, [1, 2], max_tokens=10)
    with pytest.raises(ValueError, match="exactly once") as err:
        p.inverse_order()
    for w in words:
        assert w in str(err.value)


def test_json_round_trip(tmp_path):
    w = workloads.load("rl-math", 512, seed=2)
    cost = w.lengths + w.lengths.astype(float) ** 2 / 7e4  # non-integer floats must survive
    p = plan(w.lengths, 4, 32768, cost=cost, groups=w.groups, size="balanced", sync="ddp")
    q = Plan.from_json(p.to_json())
    assert q == p
    assert q.micro_batches == p.micro_batches
    np.testing.assert_array_equal(q.costs, p.costs)  # bit-exact floats
    assert q.simulate().step_time == p.simulate().step_time
    path = tmp_path / "plan.json"
    p.to_json(path)
    assert Plan.from_json(str(path)) == p


def test_from_json_rejects_other_documents():
    with pytest.raises(ValueError, match="not a seqbalance plan"):
        Plan.from_json('{"format": "something-else"}')


def test_stats_fields_and_values():
    # rank 0: micro-batches {0:600} {1:300}; rank 1: {2:500} {3:200, 4:200}
    p = Plan([[[0], [1]], [[2], [3, 4]]], [600, 300, 500, 200, 200], max_tokens=1000)
    s = p.stats()
    assert s["rank_loads"] == [900.0, 900.0]
    assert s["mb_loads"] == [[600.0, 300.0], [500.0, 400.0]]
    assert s["imbalance"] == 0.0 and s["spread"] == 0.0
    assert s["capacity_utilisation"] == pytest.approx(1800 / 4000)
    assert s["unused_tokens"] == 2200
    assert s["lower_bound"] == 900.0
    assert s["gap_ddp"] == 0.0
    assert s["gap_fsdp"] == pytest.approx((600 + 400) / 900 - 1)
    assert s["violations"] == {
        "over_capacity": 0,
        "empty": 0,
        "unequal_counts": 0,
        "missing": 0,
        "duplicated": 0,
    }


def test_violations_are_counted():
    p = Plan([[[0, 1], []], [[1]]], [600, 500, 7], max_tokens=1000)
    v = p.violations()
    assert v == {"over_capacity": 1, "empty": 1, "unequal_counts": 1, "missing": 1, "duplicated": 1}


def test_padded_tokens():
    p = Plan([[[0, 1, 2]]], [100, 300, 200], max_tokens=1000, padded=True)
    assert p.microbatch_tokens().tolist() == [[900]]
    assert p.simulate().step_time == 900.0  # 3 rows x the longest (cost = tokens)


def test_simulate_with_another_cost():
    p = Plan([[[0]], [[1]]], [100, 200], max_tokens=1000)
    assert p.simulate().step_time == 200.0
    assert p.simulate(cost=[5.0, 1.0]).step_time == 5.0


def test_rank_indices_bad_rank():
    p = Plan([[[0]]], [10], max_tokens=10)
    with pytest.raises(ValueError, match="rank must be in"):
        p.rank_indices(1)


def test_group_and_size_rule_violations_and_group_aware_bound():
    # group 1 = sequences {1, 2} is split over both ranks; per-rank group counts 2 and 1
    p = Plan([[[0, 1]], [[2]]], [1, 1, 1], max_tokens=10, groups=[0, 1, 1], size="balanced")
    v = p.violations()
    assert v["split_groups"] == 1
    assert v["size_rule"] == 0
    # group weights are 1 and 2, so some rank carries at least 2 (not just 3 / 2)
    assert p.lower_bound() == 2.0
    q = Plan([[[0, 1, 2]], []], [1, 1, 1], max_tokens=10, size="equal")
    assert q.violations()["size_rule"] == 2  # 3 and 0 sequences, neither is 3 // 2
    assert Plan.from_json(p.to_json()).groups.tolist() == [0, 1, 1]


def test_from_json_accepts_paths_and_rejects_incomplete_documents(tmp_path):
    p = Plan([[[0]], [[1]]], [3, 4], max_tokens=10)
    path = tmp_path / "p.json"
    p.to_json(path)
    assert Plan.from_json(path) == p  # a pathlib.Path, not only a str
    with pytest.raises(ValueError, match="lacks micro_batches"):
        Plan.from_json('{"format": "seqbalance.plan/1", "lengths": [1], "max_tokens": 4}')
    with pytest.raises(ValueError, match="does not parse"):
        Plan.from_json("{not json")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"micro_batches": [[[0, -1]]]}, r"micro_batches\[0\]\[0\] holds index -1"),
        ({"micro_batches": [[[0, 2]]]}, "holds index 2, outside 0..1"),
        ({"micro_batches": [[[0.5]]]}, "integer indices"),
        # True is 1 to operator.index: as an index it is a typo (CP pieces refuse it too).
        ({"micro_batches": [[[0, True]]]}, r"integer indices \(not bools\)"),
        ({"micro_batches": [[[np.False_, 1]]]}, "integer indices"),
        ({"costs": [1.0]}, "costs has 1 entries but there are 2 lengths"),
        ({"costs": [1.0, float("nan")]}, "not finite"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"padded": "no"}, "padded must be True or False"),
        ({"size": "same"}, "size must be one of"),
    ],
)
def test_bad_plans_are_rejected(kwargs, match):
    args = {"micro_batches": [[[0, 1]]], "lengths": [1, 2], "max_tokens": 10}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Plan(args.pop("micro_batches"), args.pop("lengths"), **args)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        # plan() refuses capacities from 2**62 on; a document must not smuggle one in (it
        # overflowed int64 later, in simulate() and stats()).
        ("max_tokens", 2**63, r"max_tokens=9223372036854775808 .*below 2\*\*62"),
        ("max_tokens", 2**62, r"max_tokens=4611686018427387904 .*below 2\*\*62"),
        ("notes", None, r"notes must be a list of strings.*got None"),
        ("notes", 3, r"notes must be a list of strings.*got 3"),
        ("notes", "one note", r"notes must be a list of strings.*got 'one note'"),
        ("notes", ["fine", 7], r"notes\[1\] must be a string, got 7"),
        ("strategy", None, r"strategy must be a string, got None"),
    ],
)
def test_from_dict_refuses_bad_fields(key, value, match):
    d = plan([5, 3, 8, 1, 0, 9, 2, 2], 2, 10).to_dict()
    d[key] = value
    with pytest.raises(ValueError, match=match):
        Plan.from_dict(d)
    with pytest.raises(ValueError, match=match):
        Plan.from_json(json.dumps(d))


@pytest.mark.parametrize("value", [None, 3, 2.5, {"format": "seqbalance.plan/1"}, ["x"]])
def test_from_json_refuses_what_is_neither_text_nor_a_path(value):
    with pytest.raises(ValueError, match="text_or_path must be the plan's JSON text"):
        Plan.from_json(value)


def test_plan_refuses_notes_that_are_not_a_list_of_strings():
    with pytest.raises(ValueError, match="notes must be a list of strings"):
        Plan([[[0]]], [1], max_tokens=4, notes="abc")  # not one note per character
    assert Plan([[[0]]], [1], max_tokens=4, notes=("a", "b")).notes == ("a", "b")


@pytest.mark.parametrize("rank", [1.0, None, "0", True, -1, 2])
def test_rank_indices_refuses_what_is_not_a_rank(rank):
    p = plan([5, 3, 8, 1, 0, 9, 2, 2], 2, 10)
    with pytest.raises(ValueError, match="rank must be"):
        p.rank_indices(rank)


def test_stats_with_a_sequence_above_the_cap():
    # 95 runs alone, the two 1s share: micro-batches of 95 and 2 tokens under a cap of 8.
    # Room left: 0 + 6; tokens above the cap: 87; utilisation 97 / 16 (above 1: over cap).
    s = plan([95, 1, 1], 1, 8, oversized="alone").stats()
    assert s["unused_tokens"] == 6
    assert s["over_capacity_tokens"] == 87
    assert s["capacity_utilisation"] == 97 / 16


@pytest.mark.parametrize("key, value", [("dp_size", 4), ("num_micro_batches", 9)])
def test_from_dict_refuses_derived_fields_that_disagree(key, value):
    # Both follow from micro_batches; an edited value would silently do nothing.
    d = plan([5, 3, 8, 1, 0, 9, 2, 2], 2, 10).to_dict()
    assert Plan.from_dict(d).to_dict() == d
    d[key] = value
    with pytest.raises(ValueError, match=f"{key} is {value}"):
        Plan.from_dict(d)
