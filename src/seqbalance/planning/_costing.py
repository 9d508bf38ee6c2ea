"""Turn the ``cost=`` argument of the planner, baselines and simulator into numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import MAX_EMPTY, as_weights, is_array_like

__all__ = ["sequence_costs"]


def sequence_costs(lengths: np.ndarray, cost: Any) -> tuple[np.ndarray, float]:
    """Per-sequence costs (float64) and the per-micro-batch cost for ``lengths``.

    ``cost`` may be None (cost = tokens), a 1-D array of per-sequence costs (one per
    length, no per-micro-batch term), or anything :func:`seqbalance.costs.load_cost`
    accepts: a cost model, ``"tokens"``, a shipped model name, a path to a HF config or to
    a cost JSON.
    """
    if cost is None:
        return lengths.astype(np.float64), 0.0
    if is_array_like(cost):  # lists, arrays, tensors, pandas Series
        costs = as_weights(cost, "cost")
        if costs.shape[0] != lengths.shape[0]:
            raise ValueError(
                f"cost has {costs.shape[0]} entries but there are {lengths.shape[0]} lengths; "
                "pass one cost per sequence, or a cost model"
            )
        return costs, 0.0
    from ..costs import load_cost  # the costs package imports nothing heavy

    model = load_cost(cost)
    costs = as_weights(model(lengths), "cost")
    c0 = float(model.per_microbatch)
    # Step times add one c0 per micro-batch; plans hold at most n + MAX_EMPTY of them.
    with np.errstate(over="ignore"):
        worst = float(costs.sum()) + c0 * (lengths.shape[0] + MAX_EMPTY)
    if not np.isfinite(worst):
        raise ValueError(
            f"cost: per_microbatch={c0!r} is so large that step times overflow float64; "
            "rescale the cost model (only ratios matter for balancing)"
        )
    return costs, c0
