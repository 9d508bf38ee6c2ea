"""Fit ``t = c0 + Σ(a + b·L + c·L²)`` to measured micro-batch times.

Each measured micro-batch gives one row ``[1, n, ΣL, ΣL²]`` of a linear model in
``(c0, a, b, c)``. The fit is a non-negative least-squares solve (a negative coefficient
would price some sequence below nothing), by default on relative errors: timings span
orders of magnitude, and a 1% error on a 10 ms micro-batch matters as much to a balancer
as 1% on a 1 s one.

Micro-batches come as lists of lengths or as a 2-D array with one zero-padded row per
micro-batch. When their shapes cannot tell some coefficients apart (every micro-batch the
same shape, or the same number of sequences...), :func:`fit_cost` warns with an
:class:`UnidentifiableCostWarning` naming them. The report carries each coefficient's
standard error, estimated from the fit's own residuals; when the timing noise leaves a
coefficient that matters for the measured times poorly determined (the shapes vary too
little for that noise), :func:`fit_cost` warns with a :class:`PoorlyDeterminedCostWarning`.
``robust=True`` down-weights outliers (Huber IRLS), as
:meth:`seqbalance.costs.TimingRecorder.refit` does.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .._validate import as_lengths, as_weights, check_bool, check_choice
from .base import CostModel, QuadraticCost
from .report import COEFFICIENTS, FitReport

__all__ = [
    "MAX_CONDITION",
    "MAX_REL_STDERR",
    "MIN_TERM_SHARE",
    "PoorlyDeterminedCostWarning",
    "UnidentifiableCostWarning",
    "ZeroLengthWarning",
    "design_matrix",
    "evaluate_cost",
    "fit_cost",
    "nnls",
    "unidentified",
]


def _microbatches(microbatches: Any) -> list[np.ndarray]:
    """One int64 array of lengths per micro-batch.

    A 2-D array (numpy, or anything with ``__array__`` and ``ndim == 2``) is a
    micro-batch per row, zero-padded on the right: zeros are empty slots, not sequences
    (a row ``[300, 200, 0, 0]`` is the micro-batch ``[300, 200]``), so length matrices
    of ragged micro-batches can be passed as they are. A sequence of lists keeps every
    entry, zeros included (:func:`fit_cost` and :func:`evaluate_cost` warn of them).
    """
    if getattr(microbatches, "ndim", None) == 2:
        mat = np.asarray(microbatches)
        flat = as_lengths(mat.reshape(-1), "microbatches").reshape(mat.shape)
        out = [row[row > 0] for row in flat]
        for i, row in enumerate(out):
            if row.size == 0:
                raise ValueError(
                    f"microbatches row {i} is all zeros; in a 2-D array zeros are padding, so "
                    "every row needs at least one positive length"
                )
        return out
    if isinstance(microbatches, (str, bytes)) or not isinstance(microbatches, Sequence):
        raise ValueError(
            "microbatches must be a sequence of micro-batches, each a list of lengths, or a "
            f"2-D array with one zero-padded row per micro-batch; got "
            f"{type(microbatches).__name__}"
        )
    out = []
    for i, mb in enumerate(microbatches):
        arr = as_lengths(mb, f"microbatches[{i}]")
        if arr.size == 0:
            raise ValueError(
                f"microbatches[{i}] is empty; every measured micro-batch must hold at least "
                "one sequence"
            )
        out.append(arr)
    return out


class ZeroLengthWarning(UserWarning):
    """A list of micro-batches holds zero-length sequences, which the fit counts as
    sequences (each costs ``per_sequence``): padding in a list, not a 2-D array?"""


def _warn_zero_lengths(microbatches: Any, mbs: list[np.ndarray], caller: str) -> None:
    """Warn when a list (not a 2-D array) of micro-batches holds zero lengths: a padded
    matrix's ``.tolist()`` reads its padding as sequences of 0 tokens, each priced
    ``per_sequence``, where the matrix itself would drop them."""
    if getattr(microbatches, "ndim", None) == 2:
        return
    rows = [i for i, mb in enumerate(mbs) if (mb == 0).any()]
    if rows:
        i = rows[0]
        warnings.warn(
            f"{caller}: microbatches[{i}] = {mbs[i].tolist()[:8]}"
            f"{'...' if mbs[i].size > 8 else ''} holds zero-length sequences ({len(rows)} "
            "micro-batches do); in a list of lists every entry is a sequence and costs "
            "per_sequence. If the zeros are padding, drop them or pass a 2-D numpy array "
            "(zeros are padding there)",
            ZeroLengthWarning,
            stacklevel=3,
        )


def design_matrix(microbatches: Any) -> np.ndarray:
    """Rows ``[1, n, ΣL, ΣL²]`` (float64), one per micro-batch.

    ``microbatches`` is a list of length lists, or a 2-D array with one zero-padded row
    per micro-batch (zeros are padding there).

    Examples
    --------
    >>> design_matrix([[1, 2], [3]])
    array([[1., 2., 3., 5.],
           [1., 1., 3., 9.]])
    >>> design_matrix(np.array([[1, 2], [3, 0]]))
    array([[1., 2., 3., 5.],
           [1., 1., 3., 9.]])
    """
    mbs = _microbatches(microbatches)
    rows = np.empty((len(mbs), 4), dtype=np.float64)
    for i, arr in enumerate(mbs):
        x = arr.astype(np.float64)
        rows[i] = (1.0, float(x.size), x.sum(), (x * x).sum())
    return rows


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Solve ``min ||a x − y||₂`` subject to ``x >= 0``, exactly, for a few columns.

    The optimum is the unconstrained least-squares solution on its own support (the
    KKT conditions), so trying every support and keeping the first feasible solution that
    meets the KKT conditions finds it. With the 4 columns of a cost fit that is 16 small
    solves: simpler to trust than an iterative active-set method.

    Each column, and ``y``, is first scaled by a power of two so that its largest entry
    lies in [0.5, 1): the scaling is exact (no rounding) and cannot underflow, unlike
    dividing by ``np.linalg.norm`` of a column whose squares underflow (entries below
    ~1e-154), which left such a column unscaled and let ``lstsq`` drop it as numerically
    zero. A support whose solution overflows float64 after unscaling is skipped (it is no
    solution). The result is optimal to rounding: ``|(aᵀ(a x − y))_j|`` is within a small
    multiple of ``ε·‖a_j‖·(‖a‖·‖x‖ + ‖y‖)`` of the KKT conditions.

    Examples
    --------
    >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0]))
    array([2., 0.])
    """
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if a.ndim != 2 or y.shape != (a.shape[0],):
        raise ValueError(
            f"nnls needs a 2-D matrix and a matching vector, got {a.shape} and {y.shape}"
        )
    m = a.shape[1]
    if m > 12:
        raise ValueError(f"nnls enumerates supports and handles at most 12 columns, got {m}")
    if not (np.isfinite(a).all() and np.isfinite(y).all()):
        raise ValueError("nnls needs finite inputs; a or y holds NaN or infinity")
    # Exponents e with max|a_j| = f * 2**e, f in [0.5, 1); all-zero columns keep e = 0.
    _, exps = np.frexp(np.abs(a).max(axis=0) if a.shape[0] else np.zeros(m))
    scaled = np.ldexp(a, -exps)
    # The same for y, so that residuals of tiny right-hand sides do not underflow.
    _, ey = np.frexp(np.abs(y).max(initial=0.0))
    y = np.ldexp(y, -ey)
    # Pick the first support (smallest first) whose least-squares solution is feasible
    # and satisfies the KKT conditions to rounding: gradient ~0 on the support, >= 0 off
    # it. Comparing residuals instead cannot see an improvement below ~ε·‖y‖², i.e. a
    # gradient below ~√ε, and picked x = 0 where a small positive coefficient was optimal.
    col_norms = np.linalg.norm(scaled, axis=0)
    a_norm = float(np.linalg.norm(scaled))
    y_norm = float(np.linalg.norm(y))
    tol = 16 * max(a.shape) * np.finfo(np.float64).eps
    best, best_viol = np.zeros(m), np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        for size in range(0, m + 1):
            for support in itertools.combinations(range(m), size):
                cols = list(support)
                xs = np.zeros(m)
                if cols:
                    sol = np.linalg.lstsq(scaled[:, cols], y, rcond=None)[0]
                    if (sol < 0).any():
                        continue
                    xs[cols] = sol
                x = np.ldexp(xs, ey - exps)
                if not np.isfinite(x).all():
                    continue
                # Gradient of ½‖a x − y‖², in units of its rounding error's size.
                size_j = col_norms * (a_norm * float(np.linalg.norm(xs)) + y_norm)
                g = (scaled.T @ (scaled @ xs - y)) / np.where(size_j > 0, size_j, 1.0)
                g[cols] = -np.abs(g[cols])  # on the support: stationary, either sign
                viol = float(np.max(-g, initial=0.0))
                if viol < best_viol:
                    best, best_viol = x, viol
                if viol <= tol:
                    return best
    return best


def _power_of_two_near(x: float) -> float:
    """A power of two within a factor 2 of ``x > 0`` that is itself finite: dividing by it
    is exact, and brings ``x`` to [0.5, 2)."""
    return float(np.ldexp(1.0, min(int(np.frexp(x)[1]), 1023)))


def _stats(pred: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    # Squares of timings near 1e300 s overflow: in units of a power of two (exact).
    unit = _power_of_two_near(float(seconds.max()))
    pred, seconds = pred / unit, seconds / unit
    with np.errstate(over="ignore"):  # a relative error beyond 1e308 is reported as inf
        rel = np.abs(pred - seconds) / seconds
    ss_res = float(((pred - seconds) ** 2).sum())
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:  # all times equal: R² is undefined unless the fit is exact
        r2 = 1.0 if ss_res == 0 else float("nan")
    return r2, float(rel.max()), float(np.median(rel))


def _seconds(seconds: Any, n: int) -> np.ndarray:
    try:
        t = as_weights(seconds, "seconds")
    except ValueError as exc:  # as_weights allows 0, which is no time either: say "> 0"
        text = str(exc).replace("seconds must be >= 0", "a measured time must be > 0")
        raise ValueError(text) from None
    if t.shape[0] != n:
        raise ValueError(
            f"seconds has {t.shape[0]} entries but there are {n} micro-batches; pass one "
            "time per micro-batch"
        )
    if (t <= 0).any():
        i = int(np.flatnonzero(t <= 0)[0])
        raise ValueError(
            f"seconds[{i}] = {float(t[i])!r} is not positive; a measured time must be > 0"
        )
    return t


def evaluate_cost(cost: Any, microbatches: Sequence[Any], seconds: Any) -> FitReport:
    """Compare ``cost.microbatch_cost`` with measured ``seconds``, one per micro-batch.

    ``cost`` is a cost model or anything :func:`seqbalance.costs.load_cost` accepts (a
    shipped name, a path, a cost dict).

    Examples
    --------
    >>> cost = QuadraticCost(per_token=1.0, per_token_sq=0.0)
    >>> evaluate_cost(cost, [[1], [2], [4]], [1.0, 2.0, 5.0]).max_rel_error
    0.2
    """
    if not isinstance(cost, CostModel):
        from .load import load_cost  # load imports flops, which imports base: not at the top

        cost = load_cost(cost)
    mbs = _microbatches(microbatches)
    t = _seconds(seconds, len(mbs))
    if not mbs:
        raise ValueError("microbatches is empty; pass at least one measured micro-batch")
    _warn_zero_lengths(microbatches, mbs, "evaluate_cost")
    pred = np.array([cost.microbatch_cost(mb) for mb in mbs], dtype=np.float64)
    r2, max_rel, med_rel = _stats(pred, t)
    coefs = {k: float(getattr(cost, k)) for k in COEFFICIENTS}
    return FitReport(r2, max_rel, med_rel, len(mbs), coefs)


class UnidentifiableCostWarning(UserWarning):
    """The measured micro-batches cannot tell some cost coefficients apart.

    Raised (as a warning) by :func:`fit_cost` when the design ``[1, n, ΣL, ΣL²]`` of the
    fitted columns is (nearly) rank-deficient, e.g. when every micro-batch has the same
    shape: the fit then splits the time between the entangled coefficients arbitrarily,
    and predictions for other shapes are unreliable.
    """


# Condition number of the column-scaled, weighted design above which coefficients count
# as not identifiable: past ~1e8, 1e-8 relative noise in the times (far below timer
# noise) can move the entangled coefficients by 100%.
MAX_CONDITION = 1e8


class PoorlyDeterminedCostWarning(UnidentifiableCostWarning):
    """The timing noise leaves a cost coefficient that matters poorly determined.

    Raised (as a warning) by :func:`fit_cost` and
    :meth:`seqbalance.costs.TimingRecorder.refit` when a fitted coefficient's standard
    error exceeds :data:`MAX_REL_STDERR` times its value while its term carries at least
    :data:`MIN_TERM_SHARE` of the predicted time of some measured micro-batch. The design
    is well enough conditioned for exact times (no :class:`UnidentifiableCostWarning`),
    but with the noise seen in the residuals the coefficients trade off against each
    other: the fit matches shapes like the measured ones, yet predictions for other
    lengths or sequence counts can be off by about that term. A subclass of
    :class:`UnidentifiableCostWarning`, so filters on that class catch it too.
    """


# A coefficient is poorly determined when its standard error exceeds this fraction of its
# value (two standard errors reach 0: the data cannot tell it from 0) ...
MAX_REL_STDERR = 0.5
# ... and its term carries at least this fraction of the predicted time of some measured
# micro-batch (an uncertain coefficient worth less than that everywhere cannot move a
# prediction of a shape like the measured ones by more than ~5%, within timing noise).
MIN_TERM_SHARE = 0.1


def unidentified(design: np.ndarray, weights: Any = None, names: Sequence[str] = COEFFICIENTS
                 ) -> tuple[tuple[str, ...], float]:
    """Which coefficients of a linear fit the rows cannot identify, and the condition number.

    Parameters
    ----------
    design
        The design matrix, one row per measurement (e.g. :func:`design_matrix`), restricted
        to the fitted columns.
    weights
        Row weights of the fit (default 1).
    names
        A name per column.

    Returns
    -------
    names, condition
        The columns that take part in a near-null direction of the (column-normalised)
        design, in column order; empty when the condition number is at most
        :data:`MAX_CONDITION`.

    Examples
    --------
    >>> rows = design_matrix([[100, 100]] * 6)     # one shape only
    >>> unidentified(rows)[0]
    ('per_microbatch', 'per_sequence', 'per_token', 'per_token_sq')
    >>> unidentified(design_matrix([[100], [200], [50, 50], [400], [25] * 8]))[0]
    ()
    """
    a = np.asarray(design, dtype=np.float64)
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        # Conditioning ignores a common factor: scaled to at most 1 first, weights of 1/t
        # with t near 1e-300 s (or 1e300 s) neither overflow nor underflow below.
        top = float(np.abs(w).max()) if w.size else 0.0
        a = a * (w / top if top > 0 else w)[:, None]
    # Each column scaled by its largest entry before the norm, for the same reason.
    peak = np.abs(a).max(axis=0) if a.shape[0] else np.zeros(a.shape[1])
    a = a / np.where(peak > 0, peak, 1.0)
    norms = np.linalg.norm(a, axis=0)
    names = tuple(names)
    if a.shape[0] < a.shape[1] or (norms == 0).any():
        # Fewer rows than columns, or a column that is zero on every row.
        zero = norms == 0
        bad = names if not zero.any() else tuple(n for n, z in zip(names, zero) if z)
        return bad, float("inf")
    sv, vt = np.linalg.svd(a / norms, full_matrices=False)[1:]
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    if cond <= MAX_CONDITION:
        return (), cond
    null = vt[sv < sv[0] / MAX_CONDITION]
    involved = (np.abs(null) > 0.05).any(axis=0)
    return tuple(n for n, b in zip(names, involved) if b), cond


def _hint(mbs: list[np.ndarray]) -> str:
    shapes = {tuple(np.sort(mb)) for mb in mbs}
    if len(shapes) == 1:
        return "every micro-batch has the same shape"
    counts = {mb.size for mb in mbs}
    if len(counts) == 1:
        n = counts.pop()
        return f"every micro-batch holds {n} sequence{'' if n == 1 else 's'}"
    if len({int(mb.sum()) for mb in mbs}) == 1:
        return "every micro-batch holds the same number of tokens"
    return "the micro-batch shapes vary too little"


def _weighted_nnls(
    a: np.ndarray, t: np.ndarray, w: np.ndarray, robust: bool, relative: bool = False,
    offset: np.ndarray | float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """NNLS of ``a x ≈ t`` with row weights ``w``; robust: Huber IRLS on weighted residuals.

    Returns the coefficients and the row weights of the solve that gave them (``w``
    itself, or the last IRLS step's, Huber weights included).

    Robust and ``relative``: the residuals are taken relative to the prediction, not to
    the measured time. Relative to ``t``, one time far too short (a block that failed
    half-way, a misread clock) weighs ``1/t`` times more than the rest, and the least
    squares pull every coefficient towards 0 to serve it; the Huber weights, scaled by
    the residuals of that collapsed start, cannot undo it. Relative to the prediction
    such a time is at most a -100% error, which the Huber weights then down-weight.

    ``offset``: a known part of each measured time (``t`` is the time minus it), added to
    the prediction the relative residuals are taken against.
    """
    coef = nnls(a * w[:, None], t * w)
    if not robust:
        return coef, w
    used = w  # the row weights of the solve that gave coef
    floor = 1e-9 * float(t.max())  # a prediction of 0 (all coefficients 0) stays finite
    for _ in range(50):
        if relative:
            w = 1.0 / np.maximum(a @ coef + offset, floor)
        r = (a @ coef - t) * w
        # Robust scale: the median absolute residual (1.4826 makes it σ for Gaussian noise).
        sigma = 1.4826 * float(np.median(np.abs(r)))
        if sigma <= 0:
            break
        u = np.abs(r) / (1.345 * sigma)
        h = np.minimum(1.0, 1.0 / np.maximum(u, 1e-300))  # Huber weights
        used = w * np.sqrt(h)
        new = nnls(a * used[:, None], t * w * np.sqrt(h))  # the same bits on every rank
        done = np.allclose(new, coef, rtol=1e-9, atol=0.0)
        coef = new
        if done:
            break
    return coef, used


def _norm(v: np.ndarray) -> float:
    """2-norm whose squares neither overflow nor underflow."""
    top = float(np.abs(v).max(initial=0.0))
    return top * float(np.linalg.norm(v / top)) if top > 0 else 0.0


def _stderrs(aw: np.ndarray, rw: np.ndarray, dof: int) -> np.ndarray:
    """Standard errors of a weighted least-squares fit: ``sqrt(diag(σ²·(awᵀaw)⁻¹))``.

    ``aw`` is the design with each row multiplied by its weight, ``rw`` the weighted
    residuals, ``σ² = ‖rw‖² / dof``. NaN everywhere when ``dof <= 0`` (no residual to
    estimate the noise from); inf for a column the others reproduce exactly (it has a
    component in a null direction of ``aw``: not identifiable at any noise). Columns are
    scaled by powers of two first (exact), as in :func:`nnls`, so that neither the SVD nor
    the squares of entries near 1e±300 overflow or lose the small columns.
    """
    m = aw.shape[1]
    if dof <= 0 or m == 0:
        return np.full(m, np.nan)
    _, exps = np.frexp(np.abs(aw).max(axis=0))
    _, sv, vt = np.linalg.svd(np.ldexp(aw, -exps), full_matrices=False)
    live = sv > sv[0] * max(aw.shape) * np.finfo(np.float64).eps
    # diag((AᵀA)⁺) = Σ_k v_kj² / s_k² over the singular values kept.
    unit = ((vt[live] / sv[live, None]) ** 2).sum(axis=0)
    with np.errstate(over="ignore"):
        se = np.ldexp(_norm(rw) / np.sqrt(dof) * np.sqrt(unit), -exps)
    se[(np.abs(vt[~live]) > 1e-6).any(axis=0)] = np.inf
    out: np.ndarray = se
    return out


def _poorly_determined(
    a: np.ndarray, coef: np.ndarray, se: np.ndarray, names: Sequence[str]
) -> tuple[tuple[str, float], ...]:
    """The coefficients whose standard error exceeds :data:`MAX_REL_STDERR` times their
    value while their term carries at least :data:`MIN_TERM_SHARE` of the predicted time
    of some row of ``a``, each with its relative standard error."""
    pred = a @ coef
    rows = pred > 0
    if not rows.any():
        return ()
    share = coef * (a[rows] / pred[rows, None]).max(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = se / coef
    poor = (coef > 0) & (share >= MIN_TERM_SHARE) & (rel > MAX_REL_STDERR)
    return tuple((n, float(r)) for n, r, p in zip(names, rel, poor) if p)


class _Fitted(NamedTuple):
    """What :func:`_fit` found besides the cost."""

    cost: QuadraticCost
    unidentified: tuple[str, ...]  # coefficients the shapes cannot tell apart
    poor: tuple[tuple[str, float], ...]  # poorly determined ones, with relative stderr
    hint: str  # why ("" when both are empty)
    clamped: tuple[str, ...] = ()  # fitted coefficients NNLS set to 0


def _fit(
    microbatches: Any,
    seconds: Any,
    weighting: str,
    per_microbatch: bool,
    per_sequence: bool,
    robust: bool,
    rows: np.ndarray | None = None,
    offset: np.ndarray | None = None,
) -> _Fitted:
    """fit_cost's work; also returns the unidentified and poorly determined coefficients
    and a hint why. ``rows``: the design, when it is not ``design_matrix(microbatches)``;
    ``offset``: a known part of each measured time (seconds), fitted as ``seconds -
    offset`` but weighted and reported against ``seconds`` (context-parallel records'
    exposed communication, :mod:`seqbalance.costs._cp_records`)."""
    check_choice(weighting, "weighting", ("relative", "absolute"))
    # Flags as bools only: per_microbatch="False" is truthy and would fit c0 regardless.
    per_microbatch = check_bool(per_microbatch, "per_microbatch")
    per_sequence = check_bool(per_sequence, "per_sequence")
    robust = check_bool(robust, "robust")
    mbs = _microbatches(microbatches)
    a = design_matrix(mbs) if rows is None else rows
    t = _seconds(seconds, a.shape[0])
    keep = [per_microbatch, per_sequence, True, True]
    cols = [j for j in range(4) if keep[j]]
    if a.shape[0] < len(cols):
        raise ValueError(
            f"fit_cost needs at least {len(cols)} micro-batches to fit {len(cols)} "
            f"coefficients, got {a.shape[0]}; measure more micro-batches"
        )
    # Fitted in units of a power of two midway (in log scale) between the shortest and
    # longest time (exact scaling, the same result): timings near 1e300 s or 1e-300 s
    # neither overflow nor underflow inside, nor does 1 / t (relative weights).
    unit = _power_of_two_near(float(np.sqrt(t.min()) * np.sqrt(t.max())))
    t = t / unit
    w = 1.0 / t if weighting == "relative" else np.ones_like(t)
    off = np.zeros_like(t) if offset is None else np.asarray(offset, dtype=np.float64) / unit
    t_measured, t = t, t - off
    names = [COEFFICIENTS[j] for j in cols]
    fitted = a[:, cols]
    bad, _ = unidentified(fitted, w, names)
    sol, w_fit = _weighted_nnls(fitted, t, w, robust, relative=weighting == "relative",
                                offset=off)  # fmt: skip
    # Standard errors from the weighted residuals of the final solve, dof = n - active.
    aw = fitted * w_fit[:, None]
    rw = (fitted @ sol - t) * w_fit
    active = sol > 0
    dof = int(a.shape[0] - active.sum())
    se_active = np.full(len(cols), np.nan)
    se_active[active] = _stderrs(aw[:, active], rw, dof)
    # The check allows for the coefficients NNLS fitted as 0 as well: a clamp says the
    # data prefer 0 (or less), not that they rule out a positive value, and a collinear
    # design often clamps one of the entangled coefficients (b = 0 with a and c taking
    # its time) while the active ones alone look well determined.
    poor = () if bad else _poorly_determined(fitted, sol, _stderrs(aw, rw, dof), names)
    coef = np.zeros(4)
    coef[cols] = sol
    r2, max_rel, med_rel = _stats(a @ coef + off, t_measured)
    coef *= unit  # back to seconds
    c0, a_seq, b, c = (float(v) for v in coef)
    coefs = dict(zip(COEFFICIENTS, (c0, a_seq, b, c)))
    stderr: dict[str, float | None] = dict.fromkeys(COEFFICIENTS)
    with np.errstate(over="ignore"):
        for j, se in zip(cols, se_active * unit):
            stderr[COEFFICIENTS[j]] = float(se) if np.isfinite(se) else None
    report = FitReport(r2, max_rel, med_rel, int(a.shape[0]), coefs, stderr=stderr)
    meta: dict[str, Any] = {"weighting": weighting}
    if robust:
        meta["robust"] = "huber"
    cost = QuadraticCost(b, c, a_seq, c0, meta=meta, report=report)
    hint = _hint(mbs) if bad else ""
    if poor and not bad:
        # Not "the shapes vary too little": a well spread design with a few wild times
        # (a busy GPU, a failed block) scatters the same way; say what was measured.
        lens, counts = np.concatenate(mbs), [mb.size for mb in mbs]
        hint = (
            f"measured: {len(mbs)} micro-batches, sequences of {lens.min()}..{lens.max()} "
            f"tokens, {min(counts)}..{max(counts)} per micro-batch, median error "
            f"{med_rel:.1%}"
        )
    clamped = tuple(n for n, x in zip(names, sol) if x == 0)
    return _Fitted(cost, bad, poor, hint, clamped)


def fit_cost(
    microbatches: Any,
    seconds: Any,
    *,
    weighting: str = "relative",
    per_microbatch: bool = True,
    per_sequence: bool = True,
    robust: bool = False,
) -> QuadraticCost:
    """Fit ``t = c0 + Σ(a + b·L + c·L²)`` to measured micro-batches by non-negative least squares.

    Parameters
    ----------
    microbatches
        One list of sequence lengths per measured micro-batch (non-empty), or a 2-D
        array with one row per micro-batch, zero-padded on the right (zeros there are
        empty slots, not sequences).
    seconds
        The measured time of each micro-batch (> 0).
    weighting
        ``"relative"`` (default) minimises squared relative errors; ``"absolute"``
        squared errors in seconds (favours the longest micro-batches).
    per_microbatch, per_sequence
        Set False to pin ``c0`` or ``a`` to 0.
    robust
        Down-weight outliers (a rank preempted, a garbage-collection pause): iteratively
        reweighted least squares with Huber weights (k = 1.345 robust standard deviations
        of the weighted residuals), each step a non-negative solve. With relative
        weighting the robust residuals are relative to the prediction, so one time far
        too short (a micro-batch that failed half-way) counts as at most -100% and is
        down-weighted; the plain relative fit weighs it by ``1/t`` and can be pulled to
        0 by it. Use ``robust=True`` on measurements from a training run.

    Returns
    -------
    QuadraticCost
        With its :class:`FitReport` (R², max and median relative error on the fitted
        data, and each coefficient's standard error: ``report.stderr``,
        ``report.rel_stderr``) in ``.report``.

    Raises
    ------
    ValueError
        On malformed inputs, or fewer micro-batches than coefficients to fit.

    Warns
    -----
    UnidentifiableCostWarning
        When the micro-batches cannot tell some fitted coefficients apart (condition
        number of the scaled design above :data:`MAX_CONDITION`, e.g. every micro-batch
        has the same shape or the same sequence count). The returned cost still fits the
        measured shapes, but splits their time between those coefficients arbitrarily.
    UserWarning
        When there are exactly as many micro-batches as fitted coefficients (no other
        warning then).
    ZeroLengthWarning
        When ``microbatches`` is a list holding zero lengths: they count as sequences
        there (each costs ``per_sequence``), unlike the padding of a 2-D array.
    PoorlyDeterminedCostWarning
        When the design is well enough conditioned for exact times but not for the
        scatter of the measured ones: some coefficient's standard error exceeds
        :data:`MAX_REL_STDERR` (50%) of its value, i.e. two standard errors reach 0,
        while its term carries at least :data:`MIN_TERM_SHARE` (10%) of the predicted
        time of some measured micro-batch. Such a coefficient trades off against the
        others (b against c when every sequence has about the same length), so shapes
        unlike the measured ones can be mispredicted by about its term; one that carries
        less everywhere cannot move a prediction of the measured range by more than
        ~5% and is left alone (``per_sequence`` often is, at ±100% or more). The
        standard errors of this check are those of all fitted coefficients, including
        any NNLS fitted as 0 (a collinear design often pushes one of the entangled
        coefficients to 0 and lets the others look well determined), so they can exceed
        ``report.stderr``. The check judges the measured range only: a cost fitted to
        sequences of up to 1k tokens can be accurate there and still mispredict 32k
        ones without a warning; measure the lengths you will train on.

    Examples
    --------
    >>> mbs = [[100], [200], [50, 50], [400], [100, 300], [25] * 8]
    >>> truth = QuadraticCost(per_token=1e-3, per_token_sq=1e-6, per_sequence=0.01,
    ...                       per_microbatch=0.05)
    >>> cost = fit_cost(mbs, [truth.microbatch_cost(mb) for mb in mbs])
    >>> [round(v, 9) for v in cost.polynomial]
    [0.05, 0.01, 0.001, 1e-06]
    """
    fit = _fit(microbatches, seconds, weighting, per_microbatch, per_sequence, robust)
    _warn_zero_lengths(microbatches, _microbatches(microbatches), "fit_cost")
    cost = fit.cost
    if fit.unidentified:
        warnings.warn(
            unidentified_message(fit.unidentified, fit.hint),
            UnidentifiableCostWarning,
            stacklevel=2,
        )
    elif cost.report is not None and cost.report.n_samples == 2 + per_microbatch + per_sequence:
        warnings.warn(EXACTLY_DETERMINED, UserWarning, stacklevel=2)
    elif fit.poor:
        warnings.warn(
            poorly_determined_message(fit.poor, fit.hint, fit.clamped, robust),
            PoorlyDeterminedCostWarning,
            stacklevel=2,
        )
    return cost


# Zero residual degrees of freedom: 4 noisy micro-batches for 4 coefficients can report
# R² 0.9997 with c 10x too large.
def exactly_determined_message(caller: str = "fit_cost") -> str:
    """The warning for a fit with as many micro-batches as coefficients, from ``caller``."""
    return (
        f"{caller}: as many micro-batches as coefficients: the fit passes through every "
        "one, so its R² and errors say nothing of its error on other shapes; measure "
        "several micro-batches per coefficient"
    )


EXACTLY_DETERMINED = exactly_determined_message()


def unidentified_message(names: Sequence[str], hint: str) -> str:
    """The text of an :class:`UnidentifiableCostWarning`."""
    pins = [f"{n}=False" for n in names if n in ("per_microbatch", "per_sequence")]
    pin = f", or pin {' / '.join(pins)}" if pins else ""
    return (
        f"fit_cost: the measured micro-batches cannot tell {', '.join(names)} apart "
        f"({hint}); the fit splits their time arbitrarily and may mispredict other shapes. "
        f"Measure micro-batches with varied sequence counts and lengths{pin}."
    )


def poorly_determined_message(
    poor: Sequence[tuple[str, float]], hint: str, clamped: Sequence[str] = (),
    robust: bool = False, caller: str = "fit_cost",
) -> str:
    """The text of a :class:`PoorlyDeterminedCostWarning` from ``caller``; ``poor`` holds ``(name,
    relative standard error)`` pairs, ``clamped`` the fitted coefficients NNLS set to 0
    (the check's standard errors allow for them, unlike the report's); ``robust``: the fit
    already down-weighted outliers (so it does not suggest doing so)."""
    names = ", ".join(f"{n} (+-{r:.0%})" for n, r in poor)
    allow = f"; the errors allow for {', '.join(clamped)}, fitted as 0" if clamped else ""
    pins = [f"{n}=False" for n, _ in poor if n in ("per_microbatch", "per_sequence")]
    pin = f", or pin {' / '.join(pins)} if negligible" if pins else ""
    outliers = (
        ""
        if robust
        else "; if a few times are far off the others (a busy GPU, a failed step), "
        "robust=True down-weights them"
    )
    return (
        f"{caller}: the scatter of the measured times leaves {names} poorly determined "
        f"({hint}): a standard error above {MAX_REL_STDERR:.0%} of the coefficient, whose "
        f"term carries {MIN_TERM_SHARE:.0%} or more of some micro-batch's time{allow}. The "
        "fit matches shapes like the measured ones but may mispredict other lengths or "
        "sequence counts. Measure more micro-batches, with more varied sequence counts and "
        f"lengths{outliers}{pin}."
    )
