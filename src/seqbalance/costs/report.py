"""The evidence that comes with a fitted cost: how well it predicts measured times."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
        ratio = f"{b / c:.6g}" if c > 0 else "inf"
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
        """Inverse of :meth:`to_dict`."""
        try:
            hold = data.get("holdout")
            return cls(
                r2=_nan_if_none(data["r2"]),
                max_rel_error=_nan_if_none(data["max_rel_error"]),
                median_rel_error=_nan_if_none(data["median_rel_error"]),
                n_samples=int(data["n_samples"]),
                coefficients={k: float(data["coefficients"][k]) for k in COEFFICIENTS},
                holdout=cls.from_dict(hold) if hold else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed fit report {dict(data)!r} ({exc!r})") from exc


def _finite_or_none(x: float) -> float | None:
    # JSON has no NaN; an undefined statistic is written as null.
    return float(x) if math.isfinite(x) else None


def _nan_if_none(x: Any) -> float:
    return math.nan if x is None else float(x)
