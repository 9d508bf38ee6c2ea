"""The evidence that comes with a fitted cost: how well it predicts measured times."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_nonnegative_real

__all__ = ["COEFFICIENTS", "FitReport"]

# The polynomial form, in the order c0, a, b, c.
COEFFICIENTS = ("per_microbatch", "per_sequence", "per_token", "per_token_sq")


@dataclass(frozen=True)
class FitReport:
    """How a cost model's micro-batch predictions compare with measured times.

    Attributes
    ----------
    r2
        Coefficient of determination of predicted vs measured seconds (1 is perfect).
    max_rel_error, median_rel_error
        Of ``|predicted - measured| / measured`` over the micro-batches.
    n_samples
        Number of micro-batches compared.
    coefficients
        The cost model's ``per_microbatch``, ``per_sequence``, ``per_token`` and
        ``per_token_sq``.
    holdout
        The same statistics on micro-batches left out of the fit, when there were any.
    stderr
        Standard error of each fitted coefficient, in the coefficient's units, or None
        for a report that comes from no fit (:func:`~seqbalance.costs.evaluate_cost`, a
        hand-written report, one saved before standard errors were reported). Computed
        by :func:`~seqbalance.costs.fit_cost` from the weighted least-squares covariance
        ``σ²·(AᵀWA)⁻¹`` of the coefficients NNLS left above 0 (the others held at 0), with
        ``σ²`` the weighted residuals' sum of squares over ``n_samples`` minus the
        number of those coefficients (with ``robust=True`` the final Huber weights are
        part of ``W``). It measures the scatter of the fit under the timing noise seen
        in its residuals, not the error of the quadratic form itself. A value is None
        where it is undefined: the coefficient was pinned to 0 (``per_microbatch=False``,
        ``per_sequence=False``) or fitted as 0 by NNLS, as many micro-batches as
        fitted coefficients above 0 leave no residual to estimate ``σ`` from, or the
        micro-batches cannot tell the coefficient from the others at all.

        Two caveats. The errors hold the coefficients fitted as 0 at 0: when NNLS clamps
        one of several entangled coefficients, the others can look well determined (a
        test's near-collinear window: ``per_sequence`` 600x too large at ±7%, with
        ``per_token`` at 0); the check behind
        :class:`~seqbalance.costs.fit.PoorlyDeterminedCostWarning` allows for the clamped
        ones. With ``robust=True`` they treat the Huber weights as fixed and run up to ~15%
        below the actual scatter on Gaussian noise.

    See Also
    --------
    FitReport.rel_stderr : the standard errors relative to the coefficients.
    """

    r2: float
    max_rel_error: float
    median_rel_error: float
    n_samples: int
    coefficients: dict[str, float]
    holdout: FitReport | None = None
    stderr: dict[str, float | None] | None = None

    @property
    def rel_stderr(self) -> dict[str, float | None] | None:
        """Each standard error over its coefficient (0.1: known to ±10%), or None.

        None for the whole report when :attr:`stderr` is None, and for a coefficient
        whose standard error is None or whose value is 0.

        Examples
        --------
        >>> coefs = dict(per_microbatch=0.0, per_sequence=0.0, per_token=2.0, per_token_sq=0.5)
        >>> se = dict(per_microbatch=None, per_sequence=None, per_token=0.1, per_token_sq=0.5)
        >>> FitReport(0.99, 0.1, 0.01, 20, coefs, stderr=se).rel_stderr["per_token"]
        0.05
        """
        if self.stderr is None:
            return None
        out: dict[str, float | None] = {}
        for k in COEFFICIENTS:
            se, coef = self.stderr.get(k), self.coefficients[k]
            out[k] = se / coef if se is not None and coef > 0 else None
        return out

    def __str__(self) -> str:
        lines = ["fit: t = c0 + sum(a + b*L + c*L^2) over the micro-batch"]
        labels = ("c0 (per micro-batch)", "a  (per sequence)   ", "b  (per token)      ",
                  "c  (per token^2)    ")  # fmt: skip
        rel = self.rel_stderr
        for label, k in zip(labels, COEFFICIENTS):
            line = f"  {label} = {self.coefficients[k]:.6g}"
            if self.stderr is not None and rel is not None:  # +- one standard error
                se, r = self.stderr.get(k), rel[k]
                line += "  +- n/a" if se is None else f"  +- {se:.2g}"
                line += f" ({r:.1%})" if r is not None else ""
            lines.append(line)
        b, c = self.coefficients["per_token"], self.coefficients["per_token_sq"]
        # c = 0: attention priced at nothing (b > 0: inf); b = c = 0: no per-token cost.
        ratio = f"{b / c:.6g}" if c > 0 else "inf" if b > 0 else "undefined (b = c = 0)"
        lines.append(f"  b/c (tokens)         = {ratio}")
        rows = [("fit", self)] + ([("held out", self.holdout)] if self.holdout else [])
        lines.append(f"  {'':9} {'n':>5} {'R^2':>9} {'median rel err':>15} {'max rel err':>12}")
        for label, rep in rows:
            lines.append(
                f"  {label:9} {rep.n_samples:>5} {rep.r2:>9.5f} "
                f"{rep.median_rel_error:>14.2%} {rep.max_rel_error:>12.2%}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``holdout`` nested, or None).

        ``stderr`` is written only when there is one (a standard error that is None is
        written as null), so a report without it keeps the shorter form.
        """
        out = {
            "r2": _finite_or_none(self.r2),
            "max_rel_error": _finite_or_none(self.max_rel_error),
            "median_rel_error": _finite_or_none(self.median_rel_error),
            "n_samples": self.n_samples,
            "coefficients": {k: float(self.coefficients[k]) for k in COEFFICIENTS},
            "holdout": self.holdout.to_dict() if self.holdout else None,
        }
        if self.stderr is not None:
            errs = [self.stderr.get(k) for k in COEFFICIENTS]
            out["stderr"] = {
                k: None if v is None else _finite_or_none(v) for k, v in zip(COEFFICIENTS, errs)
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitReport:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            ``data`` is not a mapping, misses a key, or holds a value of the wrong type or
            range (statistics are numbers or null, relative errors >= 0, ``n_samples`` a
            whole number >= 0, coefficients finite and >= 0, ``holdout`` a report or null,
            ``stderr`` null or an object with a finite number >= 0 or null per
            coefficient). A dict without ``stderr`` (saved before standard errors were
            reported) reads as ``stderr=None``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"malformed fit report {data!r}: expected an object with r2, max_rel_error, "
                "median_rel_error, n_samples and coefficients"
            )
        try:
            hold = data.get("holdout")
            if hold is not None and not isinstance(hold, Mapping):
                raise ValueError(f"'holdout' must be a fit report or null, got {hold!r}")
            coefs = data["coefficients"]
            if not isinstance(coefs, Mapping):
                raise ValueError(f"'coefficients' must be an object, got {coefs!r}")
            errs = data.get("stderr")
            if errs is not None and not isinstance(errs, Mapping):
                raise ValueError(f"'stderr' must be an object or null, got {errs!r}")
            return cls(
                r2=_statistic(data["r2"], "r2"),
                max_rel_error=_statistic(data["max_rel_error"], "max_rel_error", True),
                median_rel_error=_statistic(data["median_rel_error"], "median_rel_error", True),
                n_samples=_count(data["n_samples"]),
                coefficients={
                    k: check_nonnegative_real(coefs[k], f"coefficient {k!r}")
                    for k in COEFFICIENTS
                },
                holdout=cls.from_dict(hold) if hold is not None else None,
                stderr=None if errs is None else {k: _stderr(errs[k], k) for k in COEFFICIENTS},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed fit report {dict(data)!r} ({exc!r})") from exc


def _finite_or_none(x: float) -> float | None:
    # JSON has no NaN; an undefined statistic is written as null.
    return float(x) if math.isfinite(x) else None


def _number(x: Any, name: str) -> float:
    # Not float(x): it takes "0.9" and True, which no to_dict writes.
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name!r} must be a number, got {x!r}")
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{name!r} = {x!r} is beyond the float64 range") from None


def _statistic(x: Any, name: str, nonnegative: bool = False) -> float:
    """A statistic as written by to_dict: a number, or null for an undefined one (NaN)."""
    if x is None:
        return math.nan
    out = _number(x, name)
    if nonnegative and out < 0:
        raise ValueError(f"{name!r} = {x!r} is negative; a relative error is >= 0")
    return out


def _stderr(x: Any, name: str) -> float | None:
    """A standard error as written by to_dict: a finite number >= 0, or null (undefined)."""
    if x is None:
        return None
    out = _number(x, f"stderr.{name}")
    if not (math.isfinite(out) and out >= 0):
        raise ValueError(f"'stderr.{name}' = {x!r} must be a finite number >= 0 or null")
    return out


def _count(x: Any) -> int:
    out = _number(x, "n_samples")
    if not (math.isfinite(out) and out.is_integer() and out >= 0):
        raise ValueError(f"'n_samples' = {x!r} must be a whole number >= 0")
    return int(out)


