"""Statistics of per-part loads against a lower bound (what :func:`balance_stats` and
:class:`Partition` report)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["relative_gap", "stats_from_loads"]


def stats_from_loads(
    loads: np.ndarray, counts: np.ndarray, bound: float
) -> dict[str, Any]:
    """The balance_stats dictionary from per-part loads and counts and a lower bound."""
    k = loads.shape[0]
    mx = float(loads.max()) if k else 0.0
    mn = float(loads.min()) if k else 0.0
    mean = float(loads.sum()) / k if k else 0.0
    return {
        "max": mx,
        "min": mn,
        "mean": mean,
        "spread": mx - mn,
        "imbalance": mx / mean - 1.0 if mean > 0 else 0.0,
        "cv": float(loads.std()) / mean if mean > 0 else 0.0,
        "gap": relative_gap(mx, bound),
        "lower_bound": float(bound),
        "counts": [int(c) for c in counts],
    }


def relative_gap(mx: float, bound: float) -> float:
    """``mx / bound - 1``: 0 when both are 0, inf when only the bound is."""
    if bound > 0:
        return mx / bound - 1.0
    return 0.0 if mx <= 0 else float("inf")
