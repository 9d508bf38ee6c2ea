"""TokenCost, QuadraticCost, JSON round trips and load_cost."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.costs import (
    SHIPPED,
    CostModel,
    FitReport,
    FlopsCost,
    QuadraticCost,
    TokenCost,
    cost_from_dict,
    load_cost,
)


def test_token_cost():
    cost = TokenCost()
    out = cost(np.array([0, 3, 10], dtype=np.int32))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [0.0, 3.0, 10.0])
    assert cost.polynomial == (0.0, 0.0, 1.0, 0.0)
    assert cost.microbatch_cost([2, 5]) == 7.0
    assert cost.microbatch_cost([]) == 0.0


def test_quadratic_values():
    cost = QuadraticCost(per_token=2.0, per_token_sq=0.25, per_sequence=3.0, per_microbatch=10.0)
    # 3 + 2*4 + 0.25*16 = 15 ; 3 + 2*0 + 0 = 3
    np.testing.assert_array_equal(cost([4, 0]), [15.0, 3.0])
    assert cost.microbatch_cost([4, 0]) == 28.0
    assert cost.microbatch_cost(np.array([], dtype=np.int64)) == 10.0  # the fixed cost only
    assert cost.polynomial == (10.0, 3.0, 2.0, 0.25)


def test_quadratic_no_int_overflow():
    cost = QuadraticCost(per_token=0.0, per_token_sq=1.0)
    big = np.array([3_000_000], dtype=np.int32)  # L² overflows int32 and int64 would not
    assert cost(big)[0] == 9e12


@pytest.mark.filterwarnings("error")  # the ValueError, not a numpy RuntimeWarning first
def test_cost_that_overflows_float64_is_named():
    quad = QuadraticCost(per_token=1.0, per_token_sq=1e300)
    with pytest.raises(ValueError, match="sequence of 1000000 tokens overflows float64"):
        quad([10, 10**6])
    # A config whose FLOPs would leave float range is refused when read (it raised an
    # OverflowError from int-to-float conversion).
    huge = {"hidden_size": 10**170, "num_hidden_layers": 2, "num_attention_heads": 1,
            "intermediate_size": 8, "vocab_size": 10}  # fmt: skip
    with pytest.raises(ValueError, match=r"'hidden_size' = 1000.* is more than 2\*\*53"):
        FlopsCost.from_hf_config(huge)
    np.testing.assert_array_equal(quad([0, 1]), [0.0, 1.0 + 1e300])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"per_token": -1.0, "per_token_sq": 0.0}, "per_token"),
        ({"per_token": 1.0, "per_token_sq": math.nan}, "per_token_sq"),
        ({"per_token": 1.0, "per_token_sq": 0.0, "per_sequence": math.inf}, "per_sequence"),
        ({"per_token": 1.0, "per_token_sq": 0.0, "per_microbatch": -0.5}, "per_microbatch"),
        ({"per_token": "1", "per_token_sq": 0.0}, "per_token"),
        ({"per_token": True, "per_token_sq": 0.0}, "per_token"),
    ],
)
def test_quadratic_bad_coefficients(kwargs, name):
    with pytest.raises(ValueError, match=name):
        QuadraticCost(**kwargs)


@pytest.mark.parametrize("bad", [[-1], [2.5], [[1, 2]], "12", [math.nan]])
def test_bad_lengths(bad):
    for cost in (TokenCost(), QuadraticCost(1.0, 1.0)):
        with pytest.raises(ValueError, match="lengths"):
            cost(bad)
        with pytest.raises(ValueError, match="lengths"):
            cost.microbatch_cost(bad)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), max_size=30),
    st.tuples(*[st.floats(0, 1e3, allow_nan=False) for _ in range(4)]),
)
def test_quadratic_matches_formula(lengths, coefs):
    b, c, a, c0 = coefs
    cost = QuadraticCost(b, c, a, c0)
    got = cost(lengths)
    want = [a + b * x + c * x * x for x in lengths]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    mb = cost.microbatch_cost(lengths)
    assert mb == pytest.approx(c0 + sum(want), rel=1e-12)


def test_quadratic_json_round_trip(tmp_path):
    report = FitReport(
        0.99,
        0.05,
        0.01,
        12,
        {"per_microbatch": 1.0, "per_sequence": 0.5, "per_token": 2.0, "per_token_sq": 0.1},
    )
    cost = QuadraticCost(2.0, 0.1, 0.5, 1.0, meta={"unit": "seconds"}, report=report)
    p = tmp_path / "cost.json"
    cost.save(p)
    data = json.loads(p.read_text())
    assert data["kind"] == "quadratic" and data["per_token_sq"] == 0.1
    back = load_cost(p)
    assert isinstance(back, QuadraticCost)
    assert back == cost
    assert back.report == report
    assert load_cost(str(p)) == cost
    assert cost_from_dict(json.loads(cost.to_json())) == cost


def test_report_round_trip_with_nan_and_holdout():
    hold = FitReport(
        math.nan,
        0.1,
        0.05,
        3,
        {"per_microbatch": 0.0, "per_sequence": 0.0, "per_token": 1.0, "per_token_sq": 0.0},
    )
    rep = FitReport(0.9, 0.2, 0.1, 9, dict(hold.coefficients), holdout=hold)
    data = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    back = FitReport.from_dict(data)
    assert back.holdout is not None and math.isnan(back.holdout.r2)
    assert back.r2 == 0.9 and back.n_samples == 9
    text = str(rep)
    assert "held out" in text and "R^2" in text and "b/c" in text
    with pytest.raises(ValueError, match="malformed"):
        FitReport.from_dict({"r2": 1.0})


def test_quadratic_from_dict_errors():
    with pytest.raises(ValueError, match="per_token_sq"):
        QuadraticCost.from_dict({"kind": "quadratic", "per_token": 1.0})
    with pytest.raises(ValueError, match="kind"):
        cost_from_dict({"kind": "cubic"})


def test_load_cost_specs(tmp_path):
    q = QuadraticCost(1.0, 2.0)
    assert load_cost(q) is q
    assert isinstance(load_cost(None), TokenCost)
    assert isinstance(load_cost("tokens"), TokenCost)
    assert isinstance(load_cost(TokenCost().to_dict()), TokenCost)
    for name in SHIPPED:
        got = load_cost(name.upper())
        assert isinstance(got, FlopsCost) and got.name == name
    assert isinstance(
        load_cost(
            {
                "model_type": "llama",
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 8,
                "vocab_size": 10,
            }
        ),
        FlopsCost,
    )


def test_load_cost_unknown_lists_names(tmp_path):
    with pytest.raises(ValueError, match="unknown cost") as info:
        load_cost("gpt-17")
    for name in SHIPPED:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="shipped model name"):
        load_cost(3.5)
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_cost(bad)
    bad.write_text("nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_cost(bad)


def test_cost_model_is_abstract():
    with pytest.raises(TypeError):
        CostModel()  # type: ignore[abstract]


def test_empty_microbatch_pays_the_fixed_cost_like_the_simulator():
    from seqbalance.planning.simulation import simulate

    cost = QuadraticCost(per_token=1.0, per_token_sq=0.0, per_microbatch=100.0)
    assert cost.microbatch_cost([]) == 100.0
    sim = simulate([[[0]], [[]]], cost([5]), per_microbatch=cost.per_microbatch)
    assert sim.mb_costs.tolist() == [[cost.microbatch_cost([5])], [cost.microbatch_cost([])]]


def test_quadratic_cost_refuses_what_it_could_not_save_or_use():
    # Each raised a raw OverflowError / AttributeError / TypeError (the last at to_json()).
    with pytest.raises(ValueError, match="per_token = 1000"):
        QuadraticCost(10**400, 0)
    with pytest.raises(ValueError, match="dict of coefficients, got list"):
        QuadraticCost.from_dict([1, 2])
    with pytest.raises(ValueError, match="meta must hold JSON values"):
        QuadraticCost(1.0, 0.0, meta={"x": object()})
    with pytest.raises(ValueError, match="meta must hold JSON values"):
        QuadraticCost(1.0, 0.0, meta={"x": float("nan")})
    kept = QuadraticCost(1.0, 0.0, meta={"x": [1, "a", {"y": 2.5}]})
    assert QuadraticCost.from_dict(json.loads(kept.to_json())) == kept


GOOD_FIT = {
    "r2": 0.9,
    "max_rel_error": 0.2,
    "median_rel_error": 0.1,
    "n_samples": 9,
    "coefficients": {"per_microbatch": 0, "per_sequence": 0, "per_token": 1, "per_token_sq": 0},
}


@pytest.mark.parametrize(
    "fit",
    [
        [1],
        "x",
        0,
        {},
        {**GOOD_FIT, "holdout": [1]},
        {**GOOD_FIT, "holdout": "x"},
        {**GOOD_FIT, "n_samples": 1.7},
        {**GOOD_FIT, "n_samples": -3},
        {**GOOD_FIT, "n_samples": True},
        {**GOOD_FIT, "r2": "0.9"},
        {**GOOD_FIT, "max_rel_error": -1},
        {**GOOD_FIT, "median_rel_error": True},
        {**GOOD_FIT, "coefficients": {**GOOD_FIT["coefficients"], "per_token": "1"}},
        {**GOOD_FIT, "coefficients": {**GOOD_FIT["coefficients"], "per_token": -1}},
    ],
)
def test_malformed_fit_report_in_a_cost_json(fit):
    # A list or a string raised AttributeError; 1.7 samples became 1, 0 / {} were dropped.
    data = {"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.0, "fit": fit}
    with pytest.raises(ValueError, match="fit report"):
        cost_from_dict(data)


def test_fit_report_from_dict_accepts_what_to_dict_writes():
    back = cost_from_dict(
        {"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.0,
         "fit": {**GOOD_FIT, "r2": None, "n_samples": 9.0, "holdout": {**GOOD_FIT}}}
    )
    assert back.report is not None and back.report.n_samples == 9
    assert math.isnan(back.report.r2) and back.report.holdout.r2 == 0.9
    with pytest.raises(ValueError, match="fit report"):
        FitReport.from_dict([GOOD_FIT])


def test_backward_ratio_beyond_float_range():
    # float(10**400) raised a raw OverflowError.
    with pytest.raises(ValueError, match="backward_matmul"):
        QuadraticCost(1.0, 0.0, backward_matmul=10**400)
    with pytest.raises(ValueError, match="backward_attention"):
        cost_from_dict(
            {"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.0,
             "backward_attention": 10**400}
        )


@pytest.mark.parametrize(
    "data, typo",
    [
        ({"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.0, "per_seqence": 5.0},
         "per_seqence"),
        ({"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.0, "backward_matmull": 3},
         "backward_matmull"),
        ({"kind": "tokens", "per_token": 5.0}, "per_token"),
        ({"kind": "flops", "name": "llama-3-8b", "recomptue": True}, "recomptue"),
    ],
)
def test_cost_json_with_an_unknown_key(data, typo):
    # A misspelt coefficient was dropped without a word: the cost silently lost a term.
    with pytest.raises(ValueError, match=typo):
        cost_from_dict(data)


def test_context_parallel_json_with_an_unknown_key():
    from seqbalance.costs import ContextParallelCost

    with pytest.raises(ValueError, match="bandwith"):
        ContextParallelCost.from_dict({"cost": {"kind": "tokens"}, "bandwith": 1e9})
    cp = ContextParallelCost(
        TokenCost(), bandwidth=1e9, kv_bytes_per_token=10.0, cost_per_second=1e5
    )
    back = ContextParallelCost.from_dict(json.loads(json.dumps(cp.to_dict())))
    assert back.to_dict() == cp.to_dict()


def test_context_parallel_json_without_a_rate_takes_the_constructors_default():
    """A hand-written CP document without cost_per_second got 1 FLOP/s for a FLOP cost:
    the ring's seconds counted as a few FLOPs, so a slow link cost nothing."""
    from seqbalance.costs import ContextParallelCost, FlopsCost

    flops = FlopsCost.from_name("qwen2.5-7b")
    cp = ContextParallelCost(flops, bandwidth=2.5e10)
    doc = {k: v for k, v in cp.to_dict().items() if k != "cost_per_second"}
    back = ContextParallelCost.from_dict(doc)
    assert back.cost_per_second == 4e14
    assert back.piece_cost(32768, [(0, 4096)], 8) == cp.piece_cost(32768, [(0, 4096)], 8)
    # A free ring (no rate needed) beats it: the link is priced.
    free = ContextParallelCost(flops)
    assert back.piece_cost(32768, [(0, 4096)], 8) > free.piece_cost(32768, [(0, 4096)], 8)
    # A cost of unknown units must say its rate, as the constructor asks.
    quad = {"cost": QuadraticCost(1.0, 1e-5).to_dict(), "bandwidth": 1e9,
            "kv_bytes_per_token": 10.0}  # fmt: skip
    with pytest.raises(ValueError, match="pass cost_per_second="):
        ContextParallelCost.from_dict(quad)
