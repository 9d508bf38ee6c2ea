"""Lower bounds on the heaviest part of any k-way partition (the yardstick of ``gap``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_groups, as_weights, check_positive_int
from ._rules import check_size, min_count

__all__ = ["lower_bound"]

_EPS = float(np.finfo(np.float64).eps)


def lower_bound(weights: Any, k: int, *, size: str = "free", groups: Any = None) -> float:
    """A proven lower bound on the heaviest part of every partition of ``weights`` into ``k``.

    With ``groups``, each group counts as one unit whose weight is the sum of its members
    (a group is never split); size rules then count groups.

    Parameters
    ----------
    weights : array_like
        1-D finite, non-negative weights.
    k : int
        Number of parts (>= 1).
    size : {"free", "equal", "balanced"}
        Size rule (see :func:`seqbalance.partitioning.partition`).
    groups : array_like, optional
        One group id per item.

    Returns
    -------
    float
        ``B`` such that every partition that obeys the rule has a part weighing ``>= B``.

    Notes
    -----
    Let ``s[0] >= s[1] >= ...`` be the ``m`` unit weights and ``c`` the fewest units a part
    may hold (0 for "free", ``m // k`` otherwise). The bound is the largest of:

    1. ``sum / k``: the heaviest part is at least the average part.
    2. For every ``j >= 0`` with ``j*k + 1 <= m``: by pigeonhole some part holds ``j + 1``
       of the ``j*k + 1`` heaviest units, which weigh at least ``s[j*k-j] + ... + s[j*k]``;
       that part also holds at least ``c - j - 1`` other units, which weigh at least the
       ``c - j - 1`` lightest units. (``j = 0``: the largest unit plus the ``c - 1`` lightest
       others, the classic bound for equal counts.)
    3. "balanced" with ``r = m % k > 0``: ``r`` parts hold ``c + 1`` units, together at
       least the ``r*(c+1)`` lightest units, so one of them weighs at least that sum / ``r``.

    Sums are exact when the weights are integers with a total below 2**53, and then the
    bound is rounded up to an integer (every part's load is one); otherwise the
    sums in 1-3 are lowered by a rounding allowance of ``2 (m+1) eps * total``, so the bound
    stays valid in floating point (term 2 with ``j = c = 0``, the largest unit, is exact).

    Examples
    --------
    >>> lower_bound([5, 4, 3, 3, 3], 2)
    9.0
    >>> lower_bound([10, 1, 1, 1], 2, size="equal")
    11.0
    """
    w = as_weights(weights)
    k = check_positive_int(k, "k")
    if groups is not None:
        labels = as_groups(groups, w.shape[0])
        w = np.bincount(labels, weights=w, minlength=0) if w.size else w
    rule = check_size(size, w.shape[0], k, grouped=groups is not None)
    return bound_of_units(w, k, rule)


def bound_of_units(w: np.ndarray, k: int, size: str) -> float:
    """The bound of :func:`lower_bound` for validated unit weights ``w`` (no checks)."""
    m = int(w.shape[0])
    if m == 0:
        return 0.0
    s = np.sort(w)[::-1]  # descending
    c = min_count(m, k, size)
    total = float(s.sum())
    exact = total < 2.0**53 and bool(np.all(s == np.floor(s)))
    slack = 0.0 if exact else 2.0 * (m + 1) * _EPS * total
    # desc[i] = s[0] + ... + s[i-1]; asc[i] = the i lightest units.
    desc = np.concatenate(([0.0], np.cumsum(s)))
    asc = np.concatenate(([0.0], np.cumsum(s[::-1])))
    j = np.arange((m - 1) // k + 1)
    top = desc[j * k + 1] - desc[j * k - j]
    extra = asc[np.maximum(c - j - 1, 0)]
    terms = [total / k, float(np.max(top + extra))]
    r = m % k
    if size == "balanced" and r:
        terms.append(float(asc[r * (c + 1)]) / r)
    best = max(terms) - slack
    if exact:
        # Integer weights make every part's load an integer, so the bound rounds up.
        best = float(np.ceil(best))
    return float(max(best, s[0]))
