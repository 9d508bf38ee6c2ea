"""Lower bounds on the heaviest part of any k-way partition (the yardstick of ``gap``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_groups, as_weights, check_positive_int, check_size_limit
from ._rules import check_size, min_count

__all__ = ["lower_bound"]

_EPS = float(np.finfo(np.float64).eps)

#: Term 4 of :func:`lower_bound` looks at the optima of at most this many heaviest units.
HEAVIEST_UNITS = 12


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


def bound_of_units(
    w: np.ndarray, k: int, size: str, items: np.ndarray | None = None, *,
    heaviest: bool = True,
) -> float:
    """The bound of :func:`lower_bound` for validated unit weights ``w`` (no checks).

    ``items``: the item weights the units were summed from (groups), if any. Exactness is
    decided on them: a group's float sum may already be rounded, and a rounded unit looks
    as exact as any other float, while the parts' loads are summed item by item.
    ``heaviest``: include term 4 (False inside its own search, which would recurse).
    """
    m = int(w.shape[0])
    if m == 0:
        return 0.0
    s = np.sort(w)[::-1]  # descending
    c = min_count(m, k, size)
    total = float(s.sum())
    unit = _exact_unit(s, total) if items is None else _exact_unit(items, float(items.sum()))
    # Rounding: each unit sum (groups: each group's sum of items too) loses at most one
    # eps * total per addition, so the allowance counts items, not only units.
    adds = m if items is None else max(m, int(items.shape[0]))
    slack = 0.0 if unit is not None else 2.0 * (adds + 1) * _EPS * total
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
    if unit is not None:
        # Every part's load is a multiple of the unit, so the bound rounds up to one.
        best = float(np.ceil(best / unit) * unit)
    # The largest unit is a bound as is, unless it is a rounded group sum.
    largest = float(s[0]) if items is None or unit is not None else float(s[0]) - slack
    best = float(max(best, largest, 0.0))
    if heaviest:
        best = _heaviest_units_term(s, k, best, unit, slack)
    return best


def _heaviest_units_term(
    s: np.ndarray, k: int, best: float, unit: float | None, slack: float
) -> float:
    """``best`` raised to the proven optimum of the heaviest units alone (term 4 of
    :func:`lower_bound`); ``s``: the unit weights, descending.

    Both the optimum of the ``t`` heaviest units and longest-first's result on them (an
    upper bound on it) only grow with ``t``: longest-first adds each further unit to a
    part. So when longest-first on the ``t_max = min(m, HEAVIEST_UNITS)`` heaviest does not
    exceed ``best``, no ``t`` helps; otherwise ``t_max`` is searched (``partition``
    "auto", free), and fewer units only while a search leaves its optimum unproven. The
    searches prove optima exactly on integers; on other weights only to within their
    tolerance (``REL_TOL``), so there the optimum is lowered by that and by the rounding
    allowance ``slack``, then rounded up to ``unit`` (every part's load is a multiple).
    """
    t_max = min(int(s.shape[0]), HEAVIEST_UNITS)
    if k == 1 or t_max <= k:
        return best  # one part: the total (term 1) is the optimum already
    from ._exact import REL_TOL, exactness
    from .kway import partition_arrays  # kway imports this module
    from .searches import exact_searches

    # Longest first: the k heaviest open the parts, each further unit to the lightest.
    loads = s[:k].tolist()
    lpt = {}
    for t in range(k + 1, t_max + 1):
        j = loads.index(min(loads))
        loads[j] += float(s[t - 1])
        lpt[t] = max(loads)
    for t in range(t_max, k, -1):
        if lpt[t] <= best:
            break  # the optimum of these t units (and of fewer) is no heavier
        # At most 12 units: the searches settle them in milliseconds, so the bound is the
        # same whether or not the caller switched them off (searches.exact_searches).
        with exact_searches(True):
            got = partition_arrays(s[:t], k, "free", "auto", None, heaviest=False)
        if got.optimal:
            top = got.max_load
            if not exactness(s[:t])[0]:
                top = top * (1.0 - 4 * REL_TOL) - slack
                if unit is not None:
                    top = float(np.ceil(top / unit) * unit)
            return max(best, top)
    return best


def _exact_unit(w: np.ndarray, total: float) -> float | None:
    """A power of two ``u <= 1`` such that every weight, and so every sum of weights, is
    an exact multiple of ``u`` in float64; None where sums may round.

    Every weight is ``M * 2**e`` with an integer ``M``; if all are multiples of the
    smallest such unit ``2**p`` and the total is below ``2**53`` units, every sum is an
    integer number of units below ``2**53``, hence exact. (A rounded quotient such as
    ``total / k`` then never exceeds the smallest multiple of the unit above the true
    quotient, which no part can undercut, so the bound needs no allowance.) The unit is
    capped at 1, so integer weights round bounds to integers, no coarser.
    """
    nz = w[w > 0]
    if nz.size == 0:
        return 1.0
    frac, exp = np.frexp(nz)  # nz = frac * 2**exp, 0.5 <= frac < 1
    mant = (frac * 2.0**53).astype(np.int64)  # exact: 53-bit integer mantissas
    low_bit = mant & -mant  # value of the lowest set bit
    unit_exp = int(np.min(exp - 53 + np.log2(low_bit.astype(np.float64)).astype(np.int64)))
    with np.errstate(over="ignore"):  # inf units: not exact
        if not np.ldexp(total, -unit_exp) < 2.0**53:
            return None
    return float(np.ldexp(1.0, min(unit_exp, 0)))
