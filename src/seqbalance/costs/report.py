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
    """

    r2: float
    max_rel_error: float
    median_rel_error: float
    n_samples: int
    coefficients: dict[str, float]
    holdout: FitReport | None = None

    def __str__(self) -> str:
        lines = [
            "fit: t = c0 + sum(a + b*L + c*L^2) over the micro-batch",
            f"  c0 (per micro-batch) = {self.coefficients['per_microbatch']:.6g}",
            f"  a  (per sequence)    = {self.coefficients['per_sequence']:.6g}",
            f"  b  (per token)       = {self.coefficients['per_token']:.6g}",
            f"  c  (per token^2)     = {self.coefficients['per_token_sq']:.6g}",
        ]
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
        """A JSON-ready dict (``holdout`` nested, or None)."""
        return {
            "r2": _finite_or_none(self.r2),
            "max_rel_error": _finite_or_none(self.max_rel_error),
            "median_rel_error": _finite_or_none(self.median_rel_error),
            "n_samples": self.n_samples,
            "coefficients": {k: float(self.coefficients[k]) for k in COEFFICIENTS},
            "holdout": self.holdout.to_dict() if self.holdout else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitReport:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            ``data`` is not a mapping, misses a key, or holds a value of the wrong type or
            range (statistics are numbers or null, relative errors >= 0, ``n_samples`` a
            whole number >= 0, coefficients finite and >= 0, ``holdout`` a report or null).
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


def _count(x: Any) -> int:
    out = _number(x, "n_samples")
    if not (math.isfinite(out) and out.is_integer() and out >= 0):
        raise ValueError(f"'n_samples' = {x!r} must be a whole number >= 0")
    return int(out)


