"""TimingRecorder: reports of predicted vs measured time, the robust per-rank refit, metrics;
fit_cost's 2-D input and its identifiability warning."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import workloads
from seqbalance.costs import (
    REPORT_METRICS,
    QuadraticCost,
    TimingRecorder,
    TokenCost,
    UnidentifiableCostWarning,
    evaluate_cost,
    fit_cost,
)
from seqbalance.costs.feedback import records_from_plan
from seqbalance.costs.fit import PoorlyDeterminedCostWarning, design_matrix, unidentified
from seqbalance.planning.planner import plan

# Seconds; b/c = 7,000 tokens, so attention matters for the long rl-math responses.
TRUTH = QuadraticCost(per_token=7e-5, per_token_sq=1e-8, per_sequence=2e-4, per_microbatch=5e-3)
SLOW_RANK, SLOWDOWN = 5, 1.3


def _simulated_run(seed: int, steps: int = 12, dp: int = 8, max_tokens: int = 32768):
    """Token-cost plans of rl-math batches, timed by TRUTH with 3% lognormal noise, rank 5
    1.3x slower, and 2% of micro-batches hit by a 3x pause."""
    rng = np.random.default_rng(seed)
    rec = TimingRecorder(TokenCost(), sync="fsdp", window=100)
    for step in range(steps):
        lengths = workloads.lengths("rl-math", 512, seed=1000 * seed + step)
        p = plan(lengths, dp, max_tokens, cost=TokenCost())
        for r, mbs in enumerate(p.micro_batches):
            for j, mb in enumerate(mbs):
                t = TRUTH.microbatch_cost(lengths[mb]) * np.exp(0.03 * rng.standard_normal())
                t *= SLOWDOWN if r == SLOW_RANK else 1.0
                t *= 3.0 if rng.random() < 0.02 else 1.0
                rec.record(r, step, j, lengths[mb], t)
    return rec


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 7])
def test_refit_recovers_cost_and_names_the_slow_rank(seed):
    rec = _simulated_run(seed)
    before = rec.report()
    assert before.slowest_rank == SLOW_RANK
    cost = rec.refit()
    assert rec.cost is cost
    # Token-balanced micro-batches all hold ~max_tokens, so c0 trades against b (c0 comes
    # out up to 60x, b 15% low) and only the range the window saw is identified: "recovers
    # the cost within 5%" means it predicts within 5% on fresh micro-batches of that range
    # (tokens and sequence count), planned from new batches by tokens and by the refit
    # cost itself, plus c. (Outside that range, e.g. micro-batches of a few short
    # sequences, c0's error shows: up to 11% over seeds 0-23; the test below with varied
    # shapes recovers all four coefficients.)
    assert cost.per_token_sq == pytest.approx(TRUTH.per_token_sq, rel=0.05)
    tokens = [int(r.lengths.sum()) for r in rec.records]
    counts = [r.lengths.size for r in rec.records]
    checked = []
    for k in range(4):
        lengths = workloads.lengths("rl-math", 512, seed=10**6 + k)
        for by in (TokenCost(), cost):
            for mbs in plan(lengths, 8, 32768, cost=by).micro_batches:
                for mb in mbs:
                    lens = lengths[mb]
                    if (min(tokens) <= lens.sum() <= max(tokens)
                            and min(counts) <= lens.size <= max(counts)):
                        checked.append(cost.microbatch_cost(lens) / TRUTH.microbatch_cost(lens))
    assert len(checked) > 200
    assert np.max(np.abs(np.array(checked) - 1)) < 0.05
    after = rec.report()
    assert after.slowest_rank == SLOW_RANK
    assert after.straggler_score == pytest.approx(SLOWDOWN, rel=0.05)
    assert cost.meta["rank_speed"][str(SLOW_RANK)] == pytest.approx(SLOWDOWN, rel=0.05)
    assert after.scale == pytest.approx(1.0, rel=0.05)  # the refit cost is in seconds
    assert after.model_error < 0.05 < before.model_error


def test_refit_recovers_all_four_coefficients_from_varied_shapes():
    # Shapes from 1 to 64 sequences and 32 to 32k tokens make c0 and a identifiable too.
    rng = np.random.default_rng(3)
    rec = TimingRecorder(sync="ddp")
    shapes = []
    for budget in (32, 128, 512, 2048, 8192, 32768):
        shapes += [[budget // k] * k for k in (1, 2, 4, 8, 16, 32, 64) if budget // k >= 1]
    for step in range(4):
        for slot, mb in enumerate(shapes):
            for r in range(4):
                t = TRUTH.microbatch_cost(mb) * np.exp(0.01 * rng.standard_normal())
                t *= 1.3 if r == 2 else 1.0
                t *= 4.0 if rng.random() < 0.03 else 1.0
                rec.record(r, step, slot, mb, t)
    cost = rec.refit()
    for got, want in zip(cost.polynomial, TRUTH.polynomial):
        assert got == pytest.approx(want, rel=0.05)
    assert rec.report().slowest_rank == 2


def test_report_known_values():
    # Step 0, TokenCost, every micro-batch at 0.1 s per token: the model is exact up to
    # the scale 0.1. Rank 0 runs 1 s + 3 s, rank 1 runs 4 s + 2 s.
    rec = TimingRecorder(TokenCost(), sync="ddp")
    rec.record(0, 0, 0, [10], 1.0)
    rec.record(0, 0, 1, [30], 3.0)
    rec.record(1, 0, 0, [40], 4.0)
    rec.record(1, 0, 1, [5, 15], 2.0)
    rep = rec.report()
    assert rep.scale == pytest.approx(0.1)
    assert rep.model_error == pytest.approx(0.0, abs=1e-12)
    assert rep.imbalance_measured == pytest.approx(6 / 5 - 1)
    assert rep.step_time_measured == pytest.approx(6.0)
    assert rep.idle_fraction == pytest.approx(1 - 10 / 12)
    np.testing.assert_allclose(rep.rank_measured, [4.0, 6.0])
    np.testing.assert_allclose(rep.slot_measured, [2.5, 2.5])
    np.testing.assert_allclose(rep.rank_speed, [1.0, 1.0])
    assert rep.straggler_score == pytest.approx(1.0)
    rec.sync = "fsdp"  # slots in lockstep: max(1, 4) + max(3, 2) = 7
    fsdp = rec.report()
    assert fsdp.step_time_measured == pytest.approx(7.0)
    assert fsdp.idle_fraction == pytest.approx(1 - 10 / 14)
    assert fsdp.imbalance_measured == rep.imbalance_measured


def test_report_errors_against_a_wrong_model():
    # Truth 1 + 0.01·L² s; TokenCost's best scale is the median ratio.
    rec = TimingRecorder(TokenCost(), sync="ddp")
    lengths = [10, 20, 40]
    for r, L in enumerate(lengths):
        rec.record(r, 0, 0, [L], 1 + 0.01 * L * L)
    ratios = [(1 + 0.01 * L * L) / L for L in lengths]  # 0.2, 0.25, 0.425
    rep = rec.report()
    assert rep.scale == pytest.approx(np.median(ratios))
    rel = [abs(0.25 * L - (1 + 0.01 * L * L)) / (1 + 0.01 * L * L) for L in lengths]
    assert rep.model_error == pytest.approx(np.median(rel))
    assert rep.slowest_rank == 2  # rank 2's time grows fastest against the token model


def test_metrics_keys_are_documented_and_finite():
    rec = _simulated_run(0, steps=3)
    metrics = rec.metrics()
    assert set(metrics) == set(REPORT_METRICS)
    assert all(np.isfinite(v) for v in metrics.values())
    assert isinstance(metrics["balance/slowest_rank"], int)
    assert set(rec.report().metrics(prefix="bal.")) == {
        "bal." + k.split("/", 1)[1] for k in REPORT_METRICS
    }


def test_refit_keeps_previous_cost_when_not_identifiable():
    rec = TimingRecorder(TokenCost(), sync="ddp")
    for step in range(5):
        for r in range(2):
            rec.record(r, step, 0, [100, 100], 0.01 * (1 + 0.01 * step))
    previous = rec.cost
    with pytest.warns(UnidentifiableCostWarning, match="keeps the previous cost"):
        got = rec.refit()
    assert got is previous and rec.cost is previous


def test_refit_warns_on_poorly_determined_coefficients_and_adopts_the_fit():
    """Every sequence 3,500-4,500 tokens, 2% noise, one rank 1.3x slower: the condition
    number passes, the standard errors do not. refit warns (as refit, not fit_cost) and
    still adopts the new cost, which predicts the window's shapes; its report carries the
    standard errors."""
    rng = np.random.default_rng(5)
    rec = TimingRecorder(sync="ddp")
    for step in range(25):
        for r in range(4):
            mb = rng.integers(3500, 4500, size=int(rng.integers(1, 9)))
            t = TRUTH.microbatch_cost(mb) * (1 + 0.02 * rng.standard_normal())
            rec.record(r, step, 0, mb, t * (1.3 if r == 1 else 1.0))
    previous = rec.cost
    with pytest.warns(PoorlyDeterminedCostWarning, match=r"^refit: .*adopts the new cost") as w:
        cost = rec.refit()
    msg = str(w[0].message)
    assert len(w) == 1 and "sequences of 35" in msg
    assert rec.cost is cost and cost is not previous
    assert rec.report().model_error < 0.03  # fits the window's shapes
    assert cost.meta["rank_speed"]["1"] == pytest.approx(1.3, rel=0.03)
    # NNLS put b at 0 and gave its time to a (600x too large) and c (2x): the report's
    # standard errors, those of the coefficients left above 0 with b held at 0, look
    # small (a +-7%, c +-3%); the check's allow for b and see +-212% and +-83%.
    assert cost.per_token == 0.0 and cost.per_sequence > 100 * TRUTH.per_sequence
    assert max(v for v in cost.report.rel_stderr.values() if v is not None) < 0.1
    assert "per_sequence (+-212%), per_token_sq (+-83%)" in msg
    assert "the errors allow for per_microbatch, per_token, fitted as 0" in msg
    # The same window with exact times: the noise is what made it poorly determined.
    exact = TimingRecorder(sync="ddp")
    for r in rec.records:
        exact.record(r.rank, r.step, r.slot, r.lengths, TRUTH.microbatch_cost(r.lengths))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert exact.refit().polynomial == pytest.approx(TRUTH.polynomial, rel=1e-6)


def test_refit_with_too_few_records_keeps_cost():
    rec = TimingRecorder()
    rec.record(0, 0, 0, [3], 1.0)
    with pytest.warns(UnidentifiableCostWarning, match="1 non-empty micro-batches"):
        assert isinstance(rec.refit(), TokenCost)


def test_fit_cost_warns_on_one_shape_and_names_coefficients():
    with pytest.warns(UnidentifiableCostWarning, match="same shape"):
        fit_cost([[100, 200]] * 6, [0.1] * 6)
    # One sequence per micro-batch: c0 and a are the same column; b and c are fine.
    mbs = [[L] for L in (10, 50, 100, 300, 1000, 3000)]
    with pytest.warns(UnidentifiableCostWarning, match="1 sequence\\)") as caught:
        fit_cost(mbs, [TRUTH.microbatch_cost(mb) for mb in mbs])
    msg = str(caught[0].message)
    assert "per_microbatch, per_sequence apart" in msg and "per_token" not in msg
    # Pinning one of them removes the ambiguity.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_cost(mbs, [TRUTH.microbatch_cost(mb) for mb in mbs], per_sequence=False)


def test_unidentified_on_independent_columns():
    rows = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 1.0]])
    # Normalised columns meet at cosine 1/2: Gram eigenvalues 2, 1/2, 1/2; condition 2.
    assert unidentified(rows, names="xyz") == ((), pytest.approx(2.0))
    dup = np.column_stack([rows[:, 0], rows[:, 0], rows[:, 2]])
    assert unidentified(dup, names="xyz")[0] == ("x", "y")


@pytest.mark.parametrize("unit", [1e-300, 2.0**-1000, 3e-7, 1.0, 1e250, 1e300])
@pytest.mark.parametrize("robust", [False, True])
def test_fit_cost_is_independent_of_the_time_unit(unit, robust):
    """Timings scaled by any factor give coefficients and standard errors scaled by it,
    the same fit statistics and the same warnings: near 1e300 s the squared residuals
    overflowed (RuntimeWarning, inf R² terms) and near 1e-300 s the conditioning check
    underflowed to a false UnidentifiableCostWarning."""
    mbs = [[100], [200], [50, 50], [400], [25] * 8, [300, 10]]
    t = np.array([1.0, 2.1, 1.2, 4.5, 2.5, 3.3])  # noisy: a fit with residuals
    with warnings.catch_warnings(record=True) as want:
        warnings.simplefilter("always")
        base = fit_cost(mbs, t, robust=robust)
    # 6 times this noisy leave some coefficient poorly determined; nothing else warns.
    assert [w.category for w in want] == [PoorlyDeterminedCostWarning]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = fit_cost(mbs, t * unit, robust=robust)
        report = evaluate_cost(got, mbs, t * unit)
    assert [(w.category, str(w.message)) for w in seen] == [
        (w.category, str(w.message)) for w in want
    ]
    np.testing.assert_allclose(np.array(got.polynomial) / unit, base.polynomial, rtol=1e-12)
    for k, se in base.report.stderr.items():
        scaled = got.report.stderr[k]
        assert (se is None) == (scaled is None)
        if se is not None:
            assert scaled / unit == pytest.approx(se, rel=1e-9)
    assert got.report.r2 == pytest.approx(base.report.r2, rel=1e-12)
    assert got.report.max_rel_error == pytest.approx(base.report.max_rel_error, rel=1e-12)
    assert report.r2 == pytest.approx(base.report.r2, rel=1e-9)
    rows = design_matrix(mbs)
    names, cond = unidentified(rows, 1.0 / (t * unit))
    assert names == () and cond == pytest.approx(unidentified(rows, 1.0 / t)[1], rel=1e-9)


@pytest.mark.parametrize("t", [
    [0.1, 0.2, 0.1, 0.4, 0.2, 9e307],  # the longest time at or above 2**1023
    [1e-3, 2e-3, 1e-3, 4e-3, 2e-3, 1e306],  # one outlier 1e309 times the shortest
    [1e-300, 2e-300, 1.2e-300, 4e-300, 2.5e-300, 1e10],
])
@pytest.mark.parametrize("weighting", ["relative", "absolute"])
def test_fit_cost_survives_times_spanning_the_float_range(t, weighting):
    """A power-of-two unit taken from the longest time overflowed (2.0 ** 1024,
    OverflowError) or sent 1 / t to inf (LinAlgError from the SVD): a finite fit now, with
    a finite R² (the old code gave NaN through overflowing squares)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnidentifiableCostWarning)
        cost = fit_cost(MBS_SPAN, t, weighting=weighting)
    assert all(np.isfinite(v) and v >= 0 for v in cost.polynomial)
    assert np.isfinite(cost.report.r2)
    assert np.isfinite(evaluate_cost(cost, MBS_SPAN, t).r2)


MBS_SPAN = [[100], [200], [50, 50], [400], [25] * 8, [300, 10]]


def test_fit_cost_accepts_a_zero_padded_matrix():
    mbs = [[100], [200, 50], [50, 50, 50], [400], [100, 300], [25] * 8]
    width = max(len(mb) for mb in mbs)
    mat = np.array([mb + [0] * (width - len(mb)) for mb in mbs])
    t = [TRUTH.microbatch_cost(mb) for mb in mbs]
    a, b = fit_cost(mbs, t), fit_cost(mat, t)
    assert a.polynomial == b.polynomial
    assert b.polynomial == pytest.approx(TRUTH.polynomial, rel=1e-6)
    with pytest.raises(ValueError, match="row 1 is all zeros"):
        fit_cost(np.array([[1, 2], [0, 0], [3, 0], [4, 5]]), [1.0] * 4)
    with pytest.raises(ValueError, match="negative"):
        fit_cost(np.array([[1, -2], [2, 0], [3, 0], [4, 5]]), [1.0] * 4)


def test_robust_fit_ignores_a_gross_outlier():
    mbs = [[100], [200], [50, 50], [400], [100, 300], [25] * 8, [800], [30] * 20] * 3
    t = np.array([TRUTH.microbatch_cost(mb) for mb in mbs])
    t[4] *= 10
    plain = fit_cost(mbs, t)
    robust = fit_cost(mbs, t, robust=True)
    assert robust.polynomial == pytest.approx(TRUTH.polynomial, rel=1e-3)
    assert plain.polynomial != pytest.approx(TRUTH.polynomial, rel=1e-3)
    assert robust.meta["robust"] == "huber"


@pytest.mark.parametrize("factor", [0.1, 0.01, 0.001])
def test_robust_fit_ignores_one_time_far_too_short(factor):
    # One micro-batch timed at a fraction of its time (it failed half-way, the clock
    # misread) weighed 1/t more than the rest in the relative fit: every coefficient but c
    # went to 0, and the Huber weights, scaled by that collapsed fit, kept it there.
    rng = np.random.default_rng(0)
    mbs = [rng.integers(16, 8192, size=int(rng.integers(1, 9))) for _ in range(100)]
    t = np.array([TRUTH.microbatch_cost(mb) for mb in mbs])
    t *= 1 + 0.01 * rng.standard_normal(t.size)
    t[7] *= factor
    plain = fit_cost(mbs, t)
    robust = fit_cost(mbs, t, robust=True)
    assert plain.per_token == 0.0  # the plain relative fit is pulled to the short time
    assert robust.per_token == pytest.approx(TRUTH.per_token, rel=0.03)
    assert robust.per_token_sq == pytest.approx(TRUTH.per_token_sq, rel=0.1)
    assert robust.report.median_rel_error < 0.01
    # The same through the recorder's refit (robust by default).
    rec = TimingRecorder(sync="ddp")
    for j, (mb, tt) in enumerate(zip(mbs, t)):
        rec.record(j % 4, j // 4, 0, mb, float(tt))
    cost = rec.refit(per_rank=False)
    assert cost.per_token == pytest.approx(TRUTH.per_token, rel=0.03)


def test_a_saved_refit_cost_reads_as_seconds_on_the_command_line(tmp_path, capsys):
    # refit wrote meta["units"], the command line read meta["unit"]: a refit cost loaded
    # with --cost was shown in unitless "cost units".
    from seqbalance.cli import main

    rec = _simulated_run(0, steps=3)
    cost = rec.refit()
    assert cost.meta["unit"] == "seconds" and "units" not in cost.meta
    path = tmp_path / "refit.json"
    path.write_text(cost.to_json())
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in workloads.lengths("rl-math", 64, seed=0)))
    argv = ["plan", str(lengths), "--dp", "2", "--max-tokens", "32768", "--cost", str(path)]
    assert main(argv) == 0
    assert "seconds from" in capsys.readouterr().err
    # A file from an older refit, with "units", reads alike.
    old = cost.to_dict()
    old["meta"]["units"] = old["meta"].pop("unit")
    path.write_text(json.dumps(old))
    assert main(argv) == 0
    assert "seconds from" in capsys.readouterr().err


def test_record_errors_and_window():
    rec = TimingRecorder(window=2)
    rec.record(0, 0, 0, [1], 1.0)
    with pytest.raises(ValueError, match="already recorded"):
        rec.record(0, 0, 0, [1], 1.0)
    with pytest.raises(ValueError, match="seconds must be a positive"):
        rec.record(0, 1, 0, [1], 0.0)
    with pytest.raises(ValueError, match="rank must be"):
        rec.record(-1, 1, 0, [1], 1.0)
    with pytest.raises(ValueError, match="nothing recorded"):
        TimingRecorder().report()
    with pytest.raises(ValueError, match="sync"):
        TimingRecorder(sync="zero")
    rec.record(0, 1, 0, [1], 1.0)
    rec.record(0, 2, 0, [1], 1.0)
    assert rec.steps == [1, 2] and len(rec) == 2


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_refit_is_independent_of_record_order(rnd):
    records = [rec for rec in _simulated_run(4, steps=2).records]
    shuffled = list(records)
    rnd.shuffle(shuffled)
    a, b = TimingRecorder(), TimingRecorder()
    a.extend(records)
    b.extend(shuffled)
    assert a.refit().polynomial == b.refit().polynomial


def test_records_from_plan():
    p = plan([5, 6, 7, 8], 2, 16, cost=TokenCost())
    secs = [[1.0] * len(r) for r in p.micro_batches]
    recs = records_from_plan(p.micro_batches, p.lengths, secs, step=4)
    assert sorted(int(x) for r in recs for x in r[3]) == [5, 6, 7, 8]
    assert {r[1] for r in recs} == {4}
    with pytest.raises(ValueError, match="seconds\\[0\\] has 0 times"):
        records_from_plan(p.micro_batches, p.lengths, [[], []], step=0)


@pytest.mark.parametrize("seconds", [True, "1.0", b"1", [1.0], None])
def test_record_seconds_must_be_a_number(seconds):
    # True was recorded as 1 s and "1.0" as 1.0 s.
    with pytest.raises(ValueError, match="seconds"):
        TimingRecorder().record(0, 0, 0, [5], seconds)


def test_record_seconds_numpy_scalars():
    rec = TimingRecorder()
    rec.record(0, 0, 0, [5], np.float32(0.5))
    rec.record(0, 1, 0, [5], np.int64(2))
    assert [r.seconds for r in rec.records] == [0.5, 2.0]


@pytest.mark.parametrize("flag", ["per_rank", "robust", "per_microbatch", "per_sequence"])
def test_refit_flags_must_be_bools(flag):
    rec = _simulated_run(0, steps=2)
    with pytest.raises(ValueError, match=flag):
        rec.refit(**{flag: "no"})


@pytest.mark.parametrize("bad", [(0, 0, 0), "abcde", 5, (0, 0, 0, [1], 1.0, [[0, 1, 0, 1]], 7)])
def test_extend_malformed_record(bad):
    # A short tuple raised TypeError from record(*r); a 5-letter string became 5 arguments.
    with pytest.raises(ValueError, match="record"):
        TimingRecorder().extend([bad])


def test_extend_a_sixth_item_is_the_pieces_of_a_cp_record():
    rec = TimingRecorder()
    with pytest.raises(ValueError, match=r"pieces must be rows \(position in lengths"):
        rec.extend([(0, 0, 0, [1], 1.0, 7)])
    rec.extend([(0, 0, 0, [4], 1.0, [[0, 2, 0, 1], [0, 2, 3, 4]])])
    assert rec.records[0].pieces.tolist() == [[0, 2, 0, 1], [0, 2, 3, 4]]


@pytest.mark.parametrize("index", [-1, 1.7, True, 9, "0"])
def test_records_from_plan_refuses_bad_indices(index):
    # -1 silently took the last sequence, 1.7 sequence 1, True sequence 1; 9 an IndexError.
    with pytest.raises(ValueError, match="micro_batches"):
        records_from_plan([[[index]]], [5, 6], [[0.5]], step=0)
    # Beside a valid index as well: numpy read [0, True] as the integer array [0, 1].
    with pytest.raises(ValueError, match="micro_batches"):
        records_from_plan([[[0, index]]], [5, 6], [[0.5]], step=0)


@pytest.mark.parametrize("mb", [[2**70], np.array([2**63], dtype=np.uint64),
                                np.array(1, dtype=object), [[0], [1]]])
def test_records_from_plan_refuses_indices_beyond_int64_and_nested(mb):
    # 2**70 raised OverflowError, a 0-d object array TypeError, uint64 2**63 was shown
    # as a negative index.
    with pytest.raises(ValueError, match=r"micro_batches.*must be a list of integer"):
        records_from_plan([[mb]], [5, 6], [[0.5]], step=0)


@pytest.mark.parametrize(
    ("seconds", "step", "words"),
    [
        ([[float("nan")]], 0, r"seconds\[0\]\[0\] must be a positive finite time"),
        ([["0.5"]], 0, r"seconds\[0\]\[0\] must be a number, got '0.5'"),
        ([[0.0]], 0, "positive finite"),
        ([[0.5]], -1, "step"),
        ([[0.5]], 1.5, "step"),
        ([0.5], 0, r"seconds\[0\] = 0.5 must be rank 0's row of times"),  # was TypeError
    ],
)
def test_records_from_plan_checks_times_and_step(seconds, step, words):
    # NaN, a string, a negative or fractional step were all turned into records.
    with pytest.raises(ValueError, match=words):
        records_from_plan([[[0]]], [5, 6], seconds, step=step)


def test_records_from_plan_takes_sets_and_iterators():
    for mb in ({1, 0}, iter([0, 1]), (i for i in (0, 1)), range(2)):
        (rec,) = records_from_plan([[mb]], [5, 6], [[0.5]], step=0)
        assert sorted(rec[3].tolist()) == [5, 6]


def test_records_from_plan_refuses_missing_ranks_in_seconds():
    with pytest.raises(ValueError, match="seconds"):
        records_from_plan([[[0]], [[1]]], [5, 6], [[0.5]], step=0)
    with pytest.raises(ValueError, match="seconds"):
        records_from_plan([[[0]]], [5, 6], 0.5, step=0)


def test_records_from_plan_takes_arrays():
    recs = records_from_plan([[np.array([1, 0])], [[]]], [5, 6], np.array([[0.5], [0.25]]), 2)
    assert [(r[0], r[3].tolist(), r[4]) for r in recs] == [(0, [6, 5], 0.5), (1, [], 0.25)]


def test_report_of_a_zero_cost_model_says_nan_where_a_scale_is_needed():
    """A cost model pricing everything at 0 has no seconds-per-unit scale: the predicted
    figures are NaN (as documented), the measured ones are exact."""
    rec = TimingRecorder(QuadraticCost(per_token=0.0, per_token_sq=0.0), sync="ddp")
    rec.record(0, 0, 0, [5, 3], 0.1)
    rec.record(1, 0, 0, [4], 0.3)
    rep = rec.report()
    assert np.isnan(rep.scale) and np.isnan(rep.step_time_predicted)
    assert np.isnan(rep.straggler_score) and np.isnan(rep.rank_speed).all()
    assert rep.model_error == 1.0
    assert rep.step_time_measured == pytest.approx(0.3)  # ddp: the slower rank
    assert rep.imbalance_measured == pytest.approx(0.3 / 0.2 - 1.0)
    assert rep.idle_fraction == pytest.approx(1.0 - 0.4 / 0.6)
