"""Fit ``t = c0 + Σ(a + b·L + c·L²)`` to measured micro-batch times.

Each measured micro-batch gives one row ``[1, n, ΣL, ΣL²]`` of a linear model in
``(c0, a, b, c)``. The fit is a non-negative least-squares solve (a negative coefficient
would price some sequence below nothing), by default on relative errors: timings span
orders of magnitude, and a 1% error on a 10 ms micro-batch matters as much to a balancer
as 1% on a 1 s one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._validate import as_lengths, as_weights, check_choice
from .base import CostModel, QuadraticCost
from .report import COEFFICIENTS, FitReport

__all__ = ["design_matrix", "evaluate_cost", "fit_cost", "nnls"]


def _microbatches(microbatches: Any) -> list[np.ndarray]:
    if isinstance(microbatches, (str, bytes)) or not isinstance(microbatches, Sequence):
        raise ValueError(
            "microbatches must be a sequence of micro-batches, each a list of lengths; "
            f"got {type(microbatches).__name__}"
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


def design_matrix(microbatches: Sequence[Any]) -> np.ndarray:
    """Rows ``[1, n, ΣL, ΣL²]`` (float64), one per micro-batch.

    Examples
    --------
    >>> design_matrix([[1, 2], [3]])
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


def _stats(pred: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    rel = np.abs(pred - seconds) / seconds
    ss_res = float(((pred - seconds) ** 2).sum())
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:  # all times equal: R² is undefined unless the fit is exact
        r2 = 1.0 if ss_res == 0 else float("nan")
    return r2, float(rel.max()), float(np.median(rel))


def _seconds(seconds: Any, n: int) -> np.ndarray:
    t = as_weights(seconds, "seconds")
    if t.shape[0] != n:
        raise ValueError(
            f"seconds has {t.shape[0]} entries but there are {n} micro-batches; pass one "
            "time per micro-batch"
        )
    if (t <= 0).any():
        i = int(np.flatnonzero(t <= 0)[0])
        raise ValueError(f"seconds[{i}] = {t[i]!r} is not positive; a measured time must be > 0")
    return t


def evaluate_cost(cost: CostModel, microbatches: Sequence[Any], seconds: Any) -> FitReport:
    """Compare ``cost.microbatch_cost`` with measured ``seconds``, one per micro-batch.

    Examples
    --------
    >>> cost = QuadraticCost(per_token=1.0, per_token_sq=0.0)
    >>> evaluate_cost(cost, [[1], [2], [4]], [1.0, 2.0, 5.0]).max_rel_error
    0.2
    """
    mbs = _microbatches(microbatches)
    t = _seconds(seconds, len(mbs))
    if not mbs:
        raise ValueError("microbatches is empty; pass at least one measured micro-batch")
    pred = np.array([cost.microbatch_cost(mb) for mb in mbs], dtype=np.float64)
    r2, max_rel, med_rel = _stats(pred, t)
    coefs = {k: float(getattr(cost, k)) for k in COEFFICIENTS}
    return FitReport(r2, max_rel, med_rel, len(mbs), coefs)


def fit_cost(
    microbatches: Sequence[Any],
    seconds: Any,
    *,
    weighting: str = "relative",
    per_microbatch: bool = True,
    per_sequence: bool = True,
) -> QuadraticCost:
    """Fit ``t = c0 + Σ(a + b·L + c·L²)`` to measured micro-batches by non-negative least squares.

    Parameters
    ----------
    microbatches
        One list of sequence lengths per measured micro-batch (non-empty).
    seconds
        The measured time of each micro-batch (> 0).
    weighting
        ``"relative"`` (default) minimises squared relative errors; ``"absolute"``
        squared errors in seconds (favours the longest micro-batches).
    per_microbatch, per_sequence
        Set False to pin ``c0`` or ``a`` to 0.

    Returns
    -------
    QuadraticCost
        With its :class:`FitReport` (R², max and median relative error on the fitted
        data) in ``.report``.

    Raises
    ------
    ValueError
        On malformed inputs, or fewer micro-batches than coefficients to fit.

    Examples
    --------
    >>> mbs = [[100], [200], [50, 50], [400], [100, 300], [25] * 8]
    >>> truth = QuadraticCost(per_token=1e-3, per_token_sq=1e-6, per_sequence=0.01,
    ...                       per_microbatch=0.05)
    >>> cost = fit_cost(mbs, [truth.microbatch_cost(mb) for mb in mbs])
    >>> [round(v, 9) for v in cost.polynomial]
    [0.05, 0.01, 0.001, 1e-06]
    """
    check_choice(weighting, "weighting", ("relative", "absolute"))
    a = design_matrix(microbatches)
    t = _seconds(seconds, a.shape[0])
    keep = [per_microbatch, per_sequence, True, True]
    cols = [j for j in range(4) if keep[j]]
    if a.shape[0] < len(cols):
        raise ValueError(
            f"fit_cost needs at least {len(cols)} micro-batches to fit {len(cols)} "
            f"coefficients, got {a.shape[0]}; measure more micro-batches"
        )
    w = 1.0 / t if weighting == "relative" else np.ones_like(t)
    sol = nnls(a[:, cols] * w[:, None], t * w)
    coef = np.zeros(4)
    coef[cols] = sol
    c0, a_seq, b, c = (float(v) for v in coef)
    pred = a @ coef
    r2, max_rel, med_rel = _stats(pred, t)
    coefs = dict(zip(COEFFICIENTS, (c0, a_seq, b, c)))
    report = FitReport(r2, max_rel, med_rel, int(a.shape[0]), coefs)
    return QuadraticCost(b, c, a_seq, c0, meta={"weighting": weighting}, report=report)
