"""fit_cost, evaluate_cost and the NNLS solver."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from seqbalance import workloads
from seqbalance.costs import QuadraticCost, evaluate_cost, fit_cost
from seqbalance.costs.fit import design_matrix, nnls

# A 7B-on-one-GPU-like truth in seconds (b/c = 70k tokens), with a fixed cost per
# micro-batch and per sequence large enough to be measurable.
TRUTH = QuadraticCost(per_token=7e-5, per_token_sq=1e-9, per_sequence=2e-4, per_microbatch=5e-3)


def _grid(seed: int) -> list[list[int]]:
    """A designed experiment, like calibrate's: token budgets from 32 to 128k, each split
    into 1-64 equal sequences and into 3 random mixes; every micro-batch measured twice."""
    rng = np.random.default_rng(seed)
    out = []
    for budget in (32, 128, 512, 2048, 8192, 32768, 131072):
        out += [[budget // k] * k for k in (1, 2, 4, 8, 16, 32, 64) if budget // k >= 1]
        for _ in range(3):
            k = int(rng.integers(2, 33))
            out.append([max(1, int(v)) for v in rng.dirichlet(np.ones(k)) * budget])
    return out + out


def _sft_grid(seed: int, n: int) -> list[list[int]]:
    """Micro-batches of 1-32 sequences drawn from the sft-chat workload."""
    rng = np.random.default_rng(seed)
    pool = workloads.lengths("sft-chat", 4000, seed=seed)
    return [[int(v) for v in rng.choice(pool, size=int(rng.integers(1, 33)))] for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_recovers_coefficients_with_one_percent_noise(seed):
    mbs = _grid(seed)
    rng = np.random.default_rng(100 + seed)
    clean = np.array([TRUTH.microbatch_cost(mb) for mb in mbs])
    noisy = clean * (1 + 0.01 * rng.standard_normal(clean.shape))
    cost = fit_cost(mbs, noisy)
    for got, want in zip(cost.polynomial, TRUTH.polynomial):
        assert got == pytest.approx(want, rel=0.03)
    rep = cost.report
    assert rep is not None and rep.n_samples == len(mbs)
    assert rep.r2 > 0.99
    assert rep.median_rel_error < 0.02 and rep.max_rel_error < 0.06
    assert rep.coefficients["per_token"] == cost.per_token


def test_exact_data_is_fit_exactly_with_both_weightings():
    mbs = _sft_grid(5, 30)
    t = [TRUTH.microbatch_cost(mb) for mb in mbs]
    for weighting in ("relative", "absolute"):
        cost = fit_cost(mbs, t, weighting=weighting)
        np.testing.assert_allclose(cost.polynomial, TRUTH.polynomial, rtol=1e-6)
        assert cost.report.max_rel_error < 1e-6


def test_negative_truth_is_clipped_to_zero():
    # Times that fall with the number of sequences would need a < 0: the fit pins a = 0.
    mbs = [[100], [50, 50], [25] * 4, [200], [100, 100], [50] * 4, [300], [150, 150]]
    t = [0.001 * sum(mb) - 0.01 * len(mb) + 0.1 for mb in mbs]
    cost = fit_cost(mbs, t)
    assert cost.per_sequence == 0.0
    assert min(cost.polynomial) >= 0.0


def test_pinned_coefficients():
    mbs = _sft_grid(3, 20)
    t = [TRUTH.microbatch_cost(mb) for mb in mbs]
    cost = fit_cost(mbs, t, per_microbatch=False, per_sequence=False)
    assert cost.per_microbatch == 0.0 and cost.per_sequence == 0.0
    assert cost.per_token > 0


def test_fit_errors():
    with pytest.raises(ValueError, match="seconds has 1 entries"):
        fit_cost([[1], [2]], [1.0])
    with pytest.raises(ValueError, match=r"seconds\[1\]"):
        fit_cost([[1], [2], [3], [4]], [1.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"microbatches\[1\] is empty"):
        fit_cost([[1], [], [3], [4]], [1.0] * 4)
    with pytest.raises(ValueError, match=r"microbatches\[0\]"):
        fit_cost([[-1], [2], [3], [4]], [1.0] * 4)
    with pytest.raises(ValueError, match="at least 4"):
        fit_cost([[1], [2], [3]], [1.0] * 3)
    with pytest.raises(ValueError, match="weighting"):
        fit_cost([[1], [2], [3], [4]], [1.0] * 4, weighting="log")
    with pytest.raises(ValueError, match="microbatches must be"):
        fit_cost("abc", [1.0])


def test_evaluate_cost():
    cost = QuadraticCost(per_token=1.0, per_token_sq=0.0)
    rep = evaluate_cost(cost, [[1], [2], [4]], [1.0, 2.0, 5.0])
    # relative errors 0, 0, 0.2; R^2 = 1 - 1 / ((1-8/3)^2 + (2-8/3)^2 + (5-8/3)^2)
    assert rep.max_rel_error == pytest.approx(0.2)
    assert rep.median_rel_error == 0.0
    assert rep.r2 == pytest.approx(1 - 1 / (25 / 9 + 4 / 9 + 49 / 9))
    assert rep.n_samples == 3


def test_design_matrix_rows():
    np.testing.assert_array_equal(design_matrix([[3, 4], [10]]), [[1, 2, 7, 25], [1, 1, 10, 100]])


def _norm(v: np.ndarray) -> float:
    """2-norm without underflow or overflow of the squares."""
    top = float(np.abs(v).max(initial=0.0))
    return top * float(np.linalg.norm(v / top)) if top > 0 else 0.0


def _check_kkt(a: np.ndarray, y: np.ndarray, x: np.ndarray) -> None:
    """KKT conditions of min ‖a x − y‖ s.t. x >= 0, to rounding: the gradient's error is
    about ε·‖a_j‖·(‖a‖‖x‖ + ‖y‖) per column (plus an underflow floor), so that is the
    tolerance's scale; a fixed scale ignoring ‖x‖ fails on ill-conditioned a."""
    assert np.isfinite(x).all() and (x >= 0).all()
    grad = a.T @ (a @ x - y)
    cols = np.array([_norm(a[:, j]) for j in range(a.shape[1])])
    # Floor: x itself is only known to the smallest subnormal η, which moves the gradient
    # by up to ‖a_j‖·‖a‖·η (matters when x is subnormal), plus the underflow threshold.
    eta = np.nextafter(0.0, 1.0)
    scale = 1e-9 * cols * (_norm(a) * _norm(x) + _norm(y))
    scale += 4 * a.shape[0] * cols * _norm(a) * eta + np.finfo(np.float64).tiny
    # Stationary on the support, no descent direction off it.
    assert (np.abs(grad[x > 0]) <= scale[x > 0]).all(), (grad, scale)
    assert (grad[x == 0] >= -scale[x == 0]).all(), (grad, scale)


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float64, st.tuples(st.integers(4, 12), st.integers(1, 4)), elements=st.floats(-10, 10)
    ),
    st.data(),
)
def test_nnls_satisfies_kkt(a, data):
    y = data.draw(hnp.arrays(np.float64, a.shape[0], elements=st.floats(-10, 10)))
    # A column whose largest entry is below ~1e-290 can need a coefficient beyond float64's
    # range (|y| / 1e-290 / conditioning); such an optimum has no answer to check.
    top = np.abs(a).max(axis=0)
    assume(((top == 0) | (top >= 1e-285)).all())
    _check_kkt(a, y, nnls(a, y))


E = -3.0310687e-281
NNLS_REGRESSIONS = [
    # Squares of the second column underflow: its norm was 0, it stayed unscaled, and
    # lstsq dropped it beside the unit column (residual 0.75 instead of 2/3).
    (np.array([[-1.0, E], [E, E], [E, E], [E, E]]), np.array([-1.0, 0.0, -1.0, -1.0])),
    # The optimum x = 5e-6 improves the residual by 5e-11 on 64: below the old tie
    # tolerance (1e-12 relative), so x = 0 was returned.
    (np.array([[1.0]] + [[0.0]] * 8 + [[1.0]]), np.array([1e-5, 8.0] + [0.0] * 8)),
    # Improvement 9e-16 relative: invisible in residuals at all; the KKT test sees it.
    (np.array([[2.0], [-5.96046448e-08], [0.0], [0.0]]), np.array([0.0, -1.0, 0.0, 0.0])),
    # A tiny right-hand side: its squared norm underflows to 0.
    (np.ones((4, 1)), np.full(4, 2.2250738585072014e-308)),
    # Ill-conditioned: x ~ 1e12.
    (np.array([[1e-12, 0.0], [0.0, 0.0], [1.0, -1.0], [0.0, 0.0]]), np.ones(4)),
]


@pytest.mark.parametrize("case", range(len(NNLS_REGRESSIONS)))
def test_nnls_regressions(case):
    a, y = NNLS_REGRESSIONS[case]
    _check_kkt(a, y, nnls(a, y))


def test_nnls_first_regression_value():
    # Independent: x1·col1 = c·(1,1,1,1) with c = x1·E, and x0·col0 = (-x0, 0, 0, 0) up to
    # O(E). Entries 2-4 give c = mean(0, -1, -1) = -2/3; entry 1 gives c - x0 = -1.
    a, y = NNLS_REGRESSIONS[0]
    x = nnls(a, y)
    assert x[0] == pytest.approx(1 / 3, rel=1e-9)
    assert x[1] == pytest.approx(-(2 / 3) / E, rel=1e-9)


def test_nnls_errors():
    with pytest.raises(ValueError, match="2-D"):
        nnls(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="12 columns"):
        nnls(np.ones((20, 13)), np.ones(20))


@pytest.mark.parametrize("flag", ["per_microbatch", "per_sequence", "robust"])
@pytest.mark.parametrize("value", ["False", "no", None, 0, 1])
def test_fit_flags_must_be_bools(flag, value):
    # per_microbatch="False" is truthy (c0 was fitted), per_sequence=None falsy (a pinned).
    mbs = _sft_grid(3, 20)
    t = [TRUTH.microbatch_cost(mb) for mb in mbs]
    with pytest.raises(ValueError, match=flag):
        fit_cost(mbs, t, **{flag: value})


def test_fit_flags_take_numpy_bools():
    mbs = _sft_grid(3, 20)
    t = [TRUTH.microbatch_cost(mb) for mb in mbs]
    cost = fit_cost(mbs, t, per_microbatch=np.False_, per_sequence=np.True_, robust=np.False_)
    assert cost.per_microbatch == 0.0


def test_evaluate_cost_takes_a_cost_model_or_a_name():
    # A name raised AttributeError ('str' object has no attribute 'microbatch_cost').
    rep = evaluate_cost("tokens", [[1], [2], [4]], [1.0, 2.0, 5.0])
    assert rep.max_rel_error == pytest.approx(0.2) and rep.coefficients["per_token"] == 1.0
    with pytest.raises(ValueError, match="cost"):
        evaluate_cost(3.5, [[1], [2], [4]], [1.0, 2.0, 5.0])


@pytest.mark.parametrize(
    ("bad", "shown"), [(-3.0, "-3.0 is negative"), (0.0, "0.0 is not positive")]
)
def test_non_positive_times_get_one_rule(bad, shown):
    # -3 was refused with "must be >= 0", and 0 then with "must be > 0".
    want = f"seconds\\[2\\] = {shown}; a measured time must be > 0"
    with pytest.raises(ValueError, match=want):
        fit_cost([[1], [2], [3], [4], [5]], [1.0, 2.0, bad, 4.0, 5.0])


def test_report_of_a_fit_without_per_token_cost_says_so():

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = fit_cost([[1], [2], [3], [4], [5]], [1.0] * 5)
    assert (cost.per_token, cost.per_token_sq) == (0.0, 0.0)
    assert "b/c (tokens)         = undefined (b = c = 0)" in str(cost.report)  # was "inf"


def test_as_many_micro_batches_as_coefficients_warns():
    # 4 noisy micro-batches for 4 coefficients: the fit passes through all of them and
    # reported R² ~1 while c came out 10x too large (a review), without a word.
    mbs = [[100], [200, 300], [50] * 4, [1000]]
    truth = QuadraticCost(per_token=1e-3, per_token_sq=1e-6, per_sequence=0.01,
                          per_microbatch=0.05)  # fmt: skip
    t = [truth.microbatch_cost(mb) * f for mb, f in zip(mbs, (1.05, 0.95, 1.03, 0.97))]
    with pytest.warns(UserWarning, match="as many micro-batches as coefficients"):
        cost = fit_cost(mbs, t)
    assert cost.report.r2 > 0.999  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one more micro-batch: no warning
        fit_cost([*mbs, [400, 400]], [*t, truth.microbatch_cost([400, 400])])
    # Pinning coefficients lowers the count that is exact.
    with pytest.warns(UserWarning, match="as many micro-batches"):
        fit_cost(mbs[:2], t[:2], per_microbatch=False, per_sequence=False)
