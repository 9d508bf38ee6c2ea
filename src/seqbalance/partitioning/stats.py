"""Balance statistics of a given partition."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._validate import as_groups, as_weights, index_array
from ._loads import relative_gap, stats_from_loads
from ._rules import check_size
from .kway import bound_of_units

__all__ = ["balance_stats", "relative_gap", "stats_from_loads"]


def part_labels(parts: Sequence[Any], n: int) -> np.ndarray:
    """Map ``parts`` (lists of indices) to one part label per item, checking exact cover.

    Raises a ValueError for an index that is not an integer, out of range, repeated, or
    missing from every part.
    """
    label = np.full(n, -1, dtype=np.int64)
    for p, members in enumerate(parts):
        idx = index_array(members)
        if idx is None:
            raise ValueError(
                f"parts[{p}] must be a flat list of integer item indices, got {members!r}"
            )
        if idx.size == 0:
            continue
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            i = int(idx[np.flatnonzero(bad)[0]])
            raise ValueError(f"parts[{p}] holds index {i}, outside 0..{n - 1} (n={n} weights)")
        seen = label[idx] >= 0
        uniq, counts = np.unique(idx, return_counts=True)
        if seen.any() or (counts > 1).any():
            i = int(idx[np.flatnonzero(seen)[0]]) if seen.any() else int(uniq[counts > 1][0])
            raise ValueError(f"index {i} appears more than once in parts (again in parts[{p}])")
        label[idx] = p
    missing = np.flatnonzero(label < 0)
    if missing.size:
        raise ValueError(
            f"index {int(missing[0])} is in no part ({missing.size} of {n} missing); "
            "parts must cover every index of weights exactly once"
        )
    return label


def balance_stats(
    weights: Any,
    parts: Sequence[Any],
    *,
    bound: float | None = None,
    groups: Any = None,
    size: str = "free",
) -> dict[str, Any]:
    """Summarise how evenly ``parts`` split ``weights``.

    Parameters
    ----------
    weights : array_like
        1-D finite, non-negative weights, one per item.
    parts : sequence of sequences of int
        The parts (``k = len(parts)``); together they must hold every index of ``weights``
        exactly once.
    bound : float, optional
        Lower bound to measure ``gap`` against; defaults to
        :func:`~seqbalance.partitioning.bounds.lower_bound` of ``weights`` on ``k`` parts
        with this ``size`` rule and ``groups``: the bound ``partition`` measures its
        ``gap`` against (unless it proved its result optimal).
    groups : array_like, optional
        One group id per item, as given to :func:`~seqbalance.partitioning.partition`:
        the default bound then treats each group as one unit.
    size : {"free", "equal", "balanced"}
        Size rule of the default bound (counting groups when ``groups`` is given).

    Returns
    -------
    dict
        ``max``, ``min``, ``mean`` (of part loads), ``spread`` (max - min), ``imbalance``
        (max / mean - 1), ``cv`` (standard deviation / mean of the loads), ``gap``
        (max / lower_bound - 1; 0 when both are 0), ``lower_bound`` and ``counts`` (items
        per part). Ratios are 0 when the mean is 0.

    Raises
    ------
    ValueError
        If ``parts`` is empty, or an index is out of range, repeated or missing; for
        ``groups`` of the wrong length or an unknown ``size``.

    Examples
    --------
    >>> s = balance_stats([3, 3, 2, 2, 2], [[0, 1], [2, 3, 4]])
    >>> s["max"], s["min"], s["spread"], s["gap"], s["counts"]
    (6.0, 6.0, 0.0, 0.0, [2, 3])
    """
    w = as_weights(weights)
    if isinstance(parts, (str, bytes)) or not hasattr(parts, "__len__"):
        raise ValueError(f"parts must be a list of index lists, got {type(parts).__name__}")
    k = len(parts)
    if k < 1:
        raise ValueError("parts must hold at least one part (k >= 1), got an empty sequence")
    label = part_labels(parts, w.shape[0])
    loads = np.bincount(label, weights=w, minlength=k).astype(np.float64, copy=False)
    counts = np.bincount(label, minlength=k)
    if bound is None:
        units = w
        if groups is not None:
            labels = as_groups(groups, w.shape[0])
            units = np.bincount(labels, weights=w, minlength=0) if w.size else w
        rule = check_size(size, units.shape[0], k, grouped=groups is not None)
        bound = bound_of_units(units, k, rule, items=None if groups is None else w)
        if k == 1:  # the only partition is optimal: its load is the bound, gap 0
            bound = float(loads[0])
    elif isinstance(bound, (bool, np.bool_)) or not (np.isfinite(bound) and bound >= 0):
        raise ValueError(f"bound must be a finite number >= 0, got {bound!r}")
    return stats_from_loads(loads, counts, float(bound))
