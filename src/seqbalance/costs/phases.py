"""Forward and backward parts of a training cost, for pipeline schedules.

A pipeline stage runs a micro-batch's forward and its backward at different times, so the
pipeline simulator needs the two parts separately. Every cost model here gives the
*training* cost of a sequence (forward + backward), ``a + b·L + c·L²``. The split keeps that
total and divides each term by how much more the backward costs than the forward:

- the linear terms (``a``, ``b·L`` and the per-micro-batch ``c0``: matmuls, whose backward
  computes two matmuls per forward one, for the input and the weight gradients) have a
  backward ``r_mm`` times their forward (default 2);
- the quadratic term (``c·L²``: the attention core, whose backward also recomputes or
  re-reads the softmax) has a backward ``r_attn`` times its forward (default 2.5, the
  FlashAttention-2 ratio of backward to forward FLOPs).

So for a sequence of ``L`` tokens::

    forward  = (a + b·L) / (1 + r_mm) + c·L² / (1 + r_attn)
    backward = (a + b·L) · r_mm / (1 + r_mm) + c·L² · r_attn / (1 + r_attn)

and ``forward + backward`` is the model's cost, so a plan keeps the same total work under
every schedule. A model whose exact cost differs from its polynomial (a sliding window
counted by :class:`~seqbalance.costs.FlopsCost`) is split in the polynomial's proportions and
scaled to the exact total. Plain per-sequence cost arrays (no polynomial) are split with
``r_mm`` alone.

Examples
--------
>>> from seqbalance.costs import QuadraticCost
>>> f, b, f0, b0 = phase_costs([10], QuadraticCost(per_token=3.0, per_token_sq=0.35))
>>> float(f[0]), float(b[0])
(20.0, 45.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_lengths, as_weights
from ._ratios import BACKWARD_ATTENTION, BACKWARD_MATMUL, check_ratio

__all__ = ["BACKWARD_ATTENTION", "BACKWARD_MATMUL", "check_ratio", "phase_costs", "split_costs"]


def split_costs(
    totals: Any,
    *,
    quadratic: Any = None,
    r_mm: float = BACKWARD_MATMUL,
    r_attn: float = BACKWARD_ATTENTION,
) -> tuple[np.ndarray, np.ndarray]:
    """Split training costs into (forward, backward), keeping ``forward + backward = totals``.

    Parameters
    ----------
    totals : array-like of float
        Training cost (forward + backward) per item, >= 0.
    quadratic : array-like of float, optional
        The part of each total that is attention (the ``c·L²`` term), one per total;
        default none. A part above its total is capped at the total.
    r_mm, r_attn : float
        Backward / forward ratios of the linear and the quadratic parts.
    """
    t = as_weights(totals, "totals")
    r_mm = check_ratio(r_mm, "r_mm")
    r_attn = check_ratio(r_attn, "r_attn")
    if quadratic is None:
        q = np.zeros_like(t)
    else:
        q = as_weights(quadratic, "quadratic")
        if q.shape != t.shape:  # np.minimum would broadcast one part over every total
            raise ValueError(
                f"quadratic has {q.shape[0]} entries but totals has {t.shape[0]}; pass one "
                "attention part per total"
            )
        q = np.minimum(q, t)
    lin = t - q
    fwd = lin / (1.0 + r_mm) + q / (1.0 + r_attn)
    return fwd, t - fwd


def phase_costs(
    lengths: Any,
    cost: Any = None,
    *,
    r_mm: float | None = None,
    r_attn: float | None = None,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Forward and backward cost per sequence, and of the per-micro-batch term.

    Parameters
    ----------
    lengths : array-like of int
        Tokens per sequence.
    cost : optional
        A cost model (anything :func:`seqbalance.costs.load_cost` accepts), None for tokens
        (all linear), or a 1-D array of per-sequence training costs (split with ``r_mm``).
    r_mm, r_attn : float, optional
        Backward / forward ratios of the matmul (linear) and attention (quadratic) terms.
        Default: the cost model's ``backward_matmul`` / ``backward_attention`` attributes
        where it has them, else :data:`BACKWARD_MATMUL` (2) and :data:`BACKWARD_ATTENTION`
        (2.5).

    Returns
    -------
    forward, backward : np.ndarray
        Per-sequence forward and backward costs (float64); they sum to the training cost.
    forward_c0, backward_c0 : float
        The per-micro-batch cost split with ``r_mm``.
    """
    lens = as_lengths(lengths)
    if cost is None or isinstance(cost, (np.ndarray, list, tuple)):
        model = None
    else:
        from .load import load_cost

        model = load_cost(cost)
    if r_mm is None:
        r_mm = getattr(model, "backward_matmul", BACKWARD_MATMUL)
    if r_attn is None:
        r_attn = getattr(model, "backward_attention", BACKWARD_ATTENTION)
    if cost is None:
        f, b = split_costs(lens.astype(np.float64), r_mm=r_mm, r_attn=r_attn)
        return f, b, 0.0, 0.0
    if isinstance(cost, (np.ndarray, list, tuple)):
        totals = as_weights(cost, "cost")
        if totals.shape[0] != lens.shape[0]:
            raise ValueError(
                f"cost has {totals.shape[0]} entries but there are {lens.shape[0]} lengths; "
                "pass one cost per sequence, or a cost model"
            )
        f, b = split_costs(totals, r_mm=r_mm, r_attn=r_attn)
        return f, b, 0.0, 0.0
    assert model is not None
    totals = as_weights(model(lens), "cost")
    x = lens.astype(np.float64)
    quad = model.per_token_sq * x * x
    poly = model.per_sequence + model.per_token * x + quad
    # Exact totals may differ from the polynomial (sliding windows): keep the proportions.
    scale = np.divide(totals, poly, out=np.ones_like(totals), where=poly > 0)
    f, b = split_costs(totals, quadratic=quad * scale, r_mm=r_mm, r_attn=r_attn)
    c0 = float(model.per_microbatch)
    f0 = c0 / (1.0 + check_ratio(r_mm, "r_mm"))
    return f, b, f0, c0 - f0
