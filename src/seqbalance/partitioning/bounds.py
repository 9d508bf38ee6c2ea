"""Lower bounds on the heaviest part of any k-way partition (the yardstick of ``gap``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_groups, as_weights, check_positive_int, check_size_limit
from ._rules import check_size

# The bound of validated units lives with the partitioner: its term 4 is a partition of the
# heaviest units, and the partitioner proves its results optimal against the bound.
from .kway import HEAVIEST_UNITS, bound_of_units

__all__ = ["HEAVIEST_UNITS", "bound_of_units", "lower_bound"]

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
    4. For ``k < t <= 12``: the optimum of the ``t`` heaviest units alone, without count
       rules (every partition, restricted to them, is one of them). Searched exactly
       (up to ~12 ms per bound on adversarial inputs: a dozen near-equal units dominating
       the total) only where longest-first on those units exceeds terms 1-3: when a
       few units dominate, e.g. 1,028 long-context lengths with quadratic costs into 8
       parts, where it lifts the bound by 7%.

    Sums are exact when the weights are integer multiples of one power of two ``2**p``
    (integers: ``p = 0``; also 0.5, 0.25...) with a total below ``2**53 * 2**p``, and then
    the bound is rounded up to such a multiple (to an integer for integer weights), as
    every part's load is one; otherwise the sums in 1-3 are lowered by a rounding allowance
    of ``2 (m+1) eps * total`` (``n`` items in place of ``m`` units with groups), so the
    bound stays valid in floating point (term 2 with ``j = c = 0``, the largest unit, is
    exact without groups). Term 4 counts only optima its search proves; unless the
    weights are integers, it is lowered by the search's tolerance (4e-12 relative) and the
    same allowance, then rounded up as above.

    Examples
    --------
    >>> lower_bound([5, 4, 3, 3, 3], 2)
    9.0
    >>> lower_bound([10, 1, 1, 1], 2, size="equal")
    11.0
    >>> lower_bound([11, 11, 8, 6, 4], 3)  # term 4: 11 | 11 | 8 + 6 + 4 or a 15
    15.0
    """
    w = as_weights(weights)
    k = check_size_limit(check_positive_int(k, "k"), "k", w.shape[0])
    items = w
    if groups is not None:
        labels = as_groups(groups, w.shape[0])
        w = np.bincount(labels, weights=w, minlength=0) if w.size else w
    rule = check_size(size, w.shape[0], k, grouped=groups is not None)
    return bound_of_units(w, k, rule, items=items)
