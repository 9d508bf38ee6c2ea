"""Inputs that used to crash, stall or mislead (issue 15): each gets a clear answer.

Absurd sizes are refused before anything is allocated (a ValueError naming the argument);
inputs users pass from pandas or torch are accepted; overflowing sums are refused; JSON text
is told from paths.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance._validate import as_groups, as_lengths, as_weights, is_array_like, to_numpy


@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda: sb.partition([1, 2], 10**9), "k="),
        (lambda: sb.partition([1, 2], 2**62), "k="),
        (lambda: sb.partition([1, 2], 2**70), "k="),
        (lambda: sb.lower_bound([1, 2], 2**70), "k="),
        (lambda: sb.plan([1, 2], 1, 2**63), "max_tokens="),
        (lambda: sb.plan([1, 2], 1, 2**70), "max_tokens="),
        (lambda: sb.plan([1, 2], 10**9, 10, allow_empty=True), "dp_size="),
        (lambda: sb.plan([1, 2], 10**9, 10, sync="ddp"), "dp_size="),
        (
            lambda: sb.plan([1, 2], 1, 10, micro_batch_multiple=10**9, allow_empty=True),
            "micro_batch_multiple=",
        ),
        (lambda: sb.plan([1, 2], 1, 10, min_micro_batches=10**7), "min_micro_batches="),
        (
            lambda: sb.plan([1, 2], 1, 10, min_micro_batches=10**7, allow_empty=True),
            "min_micro_batches=",
        ),
        (
            lambda: sb.plan([1, 2], 2**8, 10, min_micro_batches=2**9, allow_empty=True),
            "dp_size x micro-batches",
        ),
        (lambda: sb.plan([1, 2], 1, 10, extra_micro_batches=10**9), "extra_micro_batches="),
        (lambda: sb.plan([1, 2], 2**16 + 3, 10, allow_empty=True), "limit: n + 2**16"),
        (lambda: sb.partition([1e308, 1e308], 2), "weights sum"),
        (lambda: sb.lower_bound([1e308, 1e308], 2), "weights sum"),
        (lambda: sb.plan([1, 1], 1, 10, cost=[1e308, 1e308]), "cost sum"),
        (
            lambda: sb.plan(
                [1, 2], 1, 10, cost=sb.QuadraticCost(1.0, 0.0, per_microbatch=1e308)
            ),
            "per_microbatch",
        ),
        (lambda: sb.plan([1, 1], 1, 10, cost=""), "cost is an empty string"),
        (lambda: sb.plan([1, 1], 1, 10, cost="  "), "cost is an empty string"),
        (lambda: sb.plan([2**63, 1], 1, 10), "lengths[0]"),
        (lambda: sb.plan([2**64, 1], 1, 10), "lengths[0]"),
        (lambda: sb.Plan.from_json("[1,2]"), "plan JSON must be an object"),
        (lambda: sb.Plan.from_json('"plan"'), "plan JSON must be an object"),
        (lambda: sb.Plan.from_json("[1,"), "plan JSON does not parse"),
        (lambda: sb.partition([1, 2], 2, groups=[1, None]), "groups[1] is missing"),
        (lambda: sb.partition([2**1100, 1], 2), "weights[0] is an integer of 1101 bits"),
        (lambda: sb.plan([1, -(2**64)], 1, 10), "lengths[1] = -18446744073709551616 is neg"),
        (lambda: sb.plan([1, 2], 1, 2**62), "must be below 2**62"),
        (lambda: sb.Plan.from_json(""), "text_or_path is empty"),
        (lambda: sb.Plan.from_json(b"[1, 2]"), "plan JSON must be an object"),
    ],
)
def test_bad_inputs_get_a_value_error_naming_the_argument(call, arg):
    with pytest.raises(ValueError) as info:
        call()
    assert arg in str(info.value)


def test_many_empty_parts_are_fine():
    # k far above n but within n + 2**20: every part exists, the items sit alone.
    p = sb.partition([1, 2], 10**6)
    assert len(p) == 10**6
    assert sorted(map(tuple, filter(None, p))) == [(0,), (1,)]
    assert p.max_load == 2.0 and p.gap == 0.0
    assert sb.lower_bound([1, 2], 2**20) == 2.0


def test_exact_gap_for_the_only_partition():
    p = sb.partition([0.1, 0.2, 0.3], 1)
    assert p.gap == 0.0 and p.lower_bound == p.max_load
    assert sb.balance_stats([0.1, 0.2, 0.3], [[0, 1, 2]])["gap"] == 0.0


def test_big_python_ints_as_weights_become_floats():
    assert as_weights([2**64, 1]).tolist() == [float(2**64), 1.0]
    assert sb.partition([2**70, 1], 2).max_load == float(2**70)


class FakeSeries:
    """Duck-typed like a pandas Series (to_numpy), so the path is tested without pandas."""

    def __init__(self, values):
        self._values = np.asarray(values, dtype=object)

    def __len__(self):
        return len(self._values)

    def to_numpy(self):
        return self._values


class FakeTensor:
    """Duck-typed like a torch tensor that requires grad: numpy() refuses until detached."""

    def __init__(self, values, floating=True):
        self._values = np.asarray(values)
        self._floating = floating
        self.detached = False

    def __len__(self):
        return len(self._values)

    def detach(self):
        out = FakeTensor(self._values, self._floating)
        out.detached = True
        return out

    def cpu(self):
        return self

    def is_floating_point(self):
        return self._floating

    def double(self):
        return FakeTensor(self._values.astype(np.float64), True)._detached()

    def long(self):
        return FakeTensor(self._values.astype(np.int64), False)._detached()

    def _detached(self):
        self.detached = True
        return self

    def numpy(self):
        if not self.detached:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad")
        return self._values


def test_duck_typed_series_and_tensors():
    assert is_array_like(FakeSeries([1.0])) and is_array_like(FakeTensor([1.0]))
    assert not is_array_like("abc") and not is_array_like({"a": 1})
    np.testing.assert_array_equal(as_weights(FakeSeries([1.5, 2])), [1.5, 2.0])
    np.testing.assert_array_equal(as_lengths(FakeTensor([3.0, 4.0])), [3, 4])
    np.testing.assert_array_equal(as_groups(FakeSeries(["b", "a", "b"]), 3), [0, 1, 0])
    # An object array mixing kinds stays refused.
    with pytest.raises(ValueError, match="groups"):
        as_groups(FakeSeries(["a", 1]), 2)
    p = sb.plan([3, 4], 1, 10, cost=FakeSeries([1.0, 2.0]))
    np.testing.assert_array_equal(p.costs, [1.0, 2.0])
    assert to_numpy([1, 2], "x") == [1, 2]


def test_torch_tensors_are_converted_once():
    torch = pytest.importorskip("torch", reason="needs torch (not in the test extra)")
    cost = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    p = sb.plan(torch.tensor([3, 4, 5], dtype=torch.bfloat16), 2, 10, cost=cost)
    assert p.lengths.dtype == np.int64 and p.costs.dtype == np.float64
    np.testing.assert_array_equal(p.costs, [1.0, 2.0, 3.0])
    q = sb.partition(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16), 2,
                     groups=torch.tensor([0, 0, 1]))
    assert sorted(map(sorted, q)) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="lengths"):
        sb.plan(torch.tensor([1.5, 2.0]), 1, 10)


def test_pandas_series_and_categoricals():
    pd = pytest.importorskip("pandas", reason="pandas is not installed (optional)")
    w = [3.0, 1.0, 2.0, 2.0]
    by_list = sb.partition(w, 2, groups=["a", "b", "a", "c"])
    by_series = sb.partition(w, 2, groups=pd.Series(["a", "b", "a", "c"]))
    by_cat = sb.partition(w, 2, groups=pd.Series(["a", "b", "a", "c"], dtype="category"))
    assert by_list == by_series == by_cat
    p = sb.plan(pd.Series([3, 4]), 1, 10, cost=pd.Series([1.0, 2.0]))
    np.testing.assert_array_equal(p.costs, [1.0, 2.0])
    with pytest.raises(ValueError, match="groups"):
        sb.partition(w, 2, groups=pd.Series(["a", None, "a", "c"], dtype="category"))


def test_from_json_names_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither JSON text"):
        sb.Plan.from_json(str(tmp_path / "missing.json"))


def test_grouped_gaps_never_go_negative():
    # Group sums of decimals are rounded floats, which look exactly summable; the bound's
    # exactness must be judged on the items. Brute force over every assignment of the
    # groups (in exact rationals) gives the true optimum.
    rng = np.random.default_rng(7)
    for _ in range(300):
        n, k = int(rng.integers(2, 7)), int(rng.integers(1, 4))
        w = np.round(rng.random(n), 1).tolist()
        g = rng.integers(0, n - 1, n).tolist()
        p = sb.partition(w, k, groups=g)
        assert p.gap >= 0.0 and p.lower_bound <= p.max_load
        ids = sorted(set(g))
        best = min(
            max(sum((Fraction(w[i]) for i in range(n) if lab[ids.index(g[i])] == j),
                    Fraction(0)) for j in range(k))
            for lab in itertools.product(range(k), repeat=len(ids))
        )
        assert Fraction(sb.lower_bound(w, k, groups=g)) <= best
    # The example that used to report a negative gap.
    p = sb.partition([0.82, 0.25, 0.86], 1, groups=[1, 0, 1])
    assert p.gap == 0.0 and p.lower_bound == p.max_load


def test_from_json_reads_text_and_paths(tmp_path):
    p = sb.plan([3, 4, 5], 2, 10)
    text = p.to_json()
    assert sb.Plan.from_json("  \n" + text).micro_batches == p.micro_batches
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert sb.Plan.from_json(str(path)).micro_batches == p.micro_batches
    assert sb.Plan.from_json(path).micro_batches == p.micro_batches
    assert sb.Plan.from_json(text.encode()).micro_batches == p.micro_batches


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=1, max_size=7), st.integers(1, 3),
       st.sampled_from([1, 2, 8, 1024]))
def test_dyadic_weights_get_exact_bounds_and_gaps(numerators, k, denominator):
    # Multiples of 1/denominator (a power of two) sum exactly in float64, so the bound needs
    # no rounding allowance: it stays valid (checked against exhaustive search in exact
    # rationals), and an optimal partition reports a gap of exactly 0.
    weights = [x / denominator for x in numerators]
    exact = [Fraction(x, denominator) for x in numerators]
    best = min(
        max(sum((exact[i] for i in range(len(exact)) if labels[i] == j), Fraction(0))
            for j in range(k))
        for labels in itertools.product(range(k), repeat=len(exact))
    )
    bound = sb.lower_bound(weights, k)
    assert Fraction(bound) <= best
    # No rounding allowance (it would be ~2 (n+1) eps relative): at most the rounding of
    # one division below the classic bound max(largest, total / k).
    classic = max(max(exact), sum(exact) / k)
    assert Fraction(bound) >= classic * (1 - Fraction(1, 2**52))
    p = sb.partition(weights, k)
    if Fraction(p.max_load) == best == classic:
        assert p.gap == 0.0  # provably optimal, and reported so
