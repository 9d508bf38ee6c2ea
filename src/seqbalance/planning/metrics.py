"""A plan's predicted balance as a flat dict for loggers (wandb, TensorBoard, JSONL).

:meth:`seqbalance.planning.plans.Plan.metrics` calls :func:`plan_metrics`. The keys
describe the plan before it runs, in the units of its cost model; the measured side
(``balance/imbalance_measured``, ``balance/model_error``...) comes from
:meth:`seqbalance.costs.feedback.BalanceReport.metrics`. Both sets share the
``balance/`` prefix and never share a key, so they can be logged into one record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .plans import Plan

__all__ = ["PLAN_METRICS", "plan_metrics"]

# Every key plan_metrics returns, documented (the README's table mirrors this).
PLAN_METRICS: dict[str, str] = {
    "balance/plan_imbalance": (
        "max / mean - 1 of the ranks' predicted load (sum of their micro-batch costs)"
    ),
    "balance/plan_token_imbalance": (
        "max / mean - 1 of the ranks' token counts (what token-based balancers report)"
    ),
    "balance/plan_step_time": (
        "simulated step time under the plan's sync model, in cost units"
    ),
    "balance/plan_gap": "plan_step_time / lower bound - 1 (no plan can be below the bound)",
    "balance/plan_idle_fraction": "simulated share of rank-time spent waiting",
    "balance/plan_micro_batches": "micro-batches per rank",
    "balance/plan_capacity_utilisation": "tokens used / (ranks x micro-batches x max_tokens)",
}


def _imbalance(x: np.ndarray) -> float:
    mean = float(x.mean()) if x.size else 0.0
    return float(x.max() / mean - 1.0) if mean > 0 else 0.0


def plan_metrics(plan: Plan, cost: Any = None, prefix: str = "balance/") -> dict[str, Any]:
    """The :data:`PLAN_METRICS` of ``plan`` (costs from ``cost``, default the plan's own).

    ``prefix`` replaces the leading ``"balance/"``.

    Examples
    --------
    >>> from seqbalance.planning.plans import Plan
    >>> p = Plan([[[0]], [[1, 2]]], [4, 2, 2], max_tokens=4, sync="ddp")
    >>> m = plan_metrics(p)
    >>> m["balance/plan_imbalance"], m["balance/plan_gap"], m["balance/plan_micro_batches"]
    (0.0, 0.0, 1)
    """
    sim = plan.simulate(cost)
    per_slot = plan.microbatch_tokens()  # a row per rank, or per GPU of a CP plan
    tokens = per_slot.sum(axis=1).astype(np.float64)
    capacity = per_slot.shape[0] * plan.num_micro_batches * plan.max_tokens
    out: dict[str, Any] = {
        "balance/plan_imbalance": _imbalance(sim.mb_costs.sum(axis=1)),
        "balance/plan_token_imbalance": _imbalance(tokens),
        "balance/plan_step_time": float(sim.step_time),
        "balance/plan_gap": float(sim.gap),
        "balance/plan_idle_fraction": float(sim.idle_fraction),
        "balance/plan_micro_batches": int(plan.num_micro_batches),
        "balance/plan_capacity_utilisation": float(tokens.sum() / capacity) if capacity else 0.0,
    }
    return {prefix + k[len("balance/"):]: v for k, v in out.items()}
