"""Exact k-way partitioning of a few units by enumerating the heaviest part.

Every partition has a heaviest part ``A``, and ``sum(A)`` lies between ``T / k`` (``T`` the
total) and the partition's maximum. So the optimum is the smallest ``sum(A)`` over subsets
``A`` (with a count the size rule allows) whose complement splits into ``k - 1`` parts that
each weigh at most ``sum(A)``. The search lists the subsets whose sum lies in
``[bound, hi)`` (``bound`` a proven lower bound, ``hi`` the best maximum found so far) in
ascending order of sum, and asks for each whether the rest fits under ``sum(A)``; the first
``A`` for which it does gives an optimal partition, and when none does, ``hi`` itself was
optimal. This is the idea behind Korf's recursive and sequential number partitioning.

The decision "do these units split into ``j`` parts of at most ``C`` each?" is answered by
bin completion (Korf): the heaviest unit lies in some part, so the subsets of the other
units that complete it to a sum in ``[total - (j - 1) C, C]`` (the rest must fit ``j - 1``
parts) are tried, fullest first, and the rest is the same question with ``j - 1`` parts. For
``j = 2`` with few units every subset is listed at once. Anchoring each part on the
heaviest unit left breaks the symmetry between parts, and settles far more decisions than
listing candidates for the heaviest part, which this module did first (k = 8, n = 24 and
30, 30 seeds: ``auto`` proved 220 of 300 cases with that, 292 with bin completion and the
bisection below).

:func:`bisection_labels` uses the same decision search on its own: it bisects the capacity
between the highest refuted and the best found, so it improves the partition step by step
even where the proof is out of reach (many parts), which the ascending enumeration cannot.

Subsets in a window of sums are listed by meeting in the middle: the subset sums of each
half of the units (``2**(m/2)`` each) are sorted, and binary searches find, for every sum of
one half, the sums of the other half that complete it into the window. When the windows are
narrow, which is the hard case for the branch-and-bound search of :mod:`._exact` (the
optimum a hair above the bound, real-valued weights), few subsets qualify and the proof is
quick; wide windows run out of the work budget.

Size rules: ``"equal"`` parts take ``m / k`` units each, so ``A`` takes ``m / k`` and the
rest splits evenly; ``"balanced"`` parts take ``m // k`` or one more, so ``A`` takes either
(the second only when ``m % k > 0``) and the rest is again balanced over ``k - 1`` parts.

Tolerance: integer weights whose total is below ``2**53`` are exact; otherwise fits are
checked with a slack of a few ulps of the total, and the optimum is proven up to ``1e-12``
relative (as in :mod:`._exact`). Deterministic: the work budget counts subset sums and
candidates, never time.

Complexity: O(2**(m/2) m) per enumeration; the number of enumerations grows with the number
of candidates in the windows, hence the budget.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ._exact import REL_TOL, exactness
from ._two_way import TWO_WAY_MAX_UNITS, subset_sums

__all__ = [
    "BISECTION_STEP",
    "HEAVIEST_DEEP_WORK",
    "HEAVIEST_FIRST_PARTS",
    "HEAVIEST_LATE_WORK",
    "HEAVIEST_MAX_PARTS",
    "HEAVIEST_MAX_UNITS",
    "HEAVIEST_WORK",
    "bisection_labels",
    "heaviest_part_labels",
]

#: Largest number of units solved this way (2**16 subset sums per half).
HEAVIEST_MAX_UNITS = TWO_WAY_MAX_UNITS
#: ``method="auto"`` gives the enumeration its full budget, and the branch and bound after
#: it its full node budget, for at most this many parts ...
HEAVIEST_FIRST_PARTS = 4
#: ... and uses these searches at all for at most this many.
HEAVIEST_MAX_PARTS = 8
#: Default work budget: subset sums listed plus candidates tried (~0.5 s at worst).
HEAVIEST_WORK = 12_000_000
#: The enumeration's budget for five to eight parts (deeper: each unit costs more time).
HEAVIEST_DEEP_WORK = 4_000_000
#: The budget of :func:`bisection_labels` after the branch and bound.
HEAVIEST_LATE_WORK = 8_000_000
#: Budget of one undecided step of :func:`bisection_labels`.
BISECTION_STEP = 1_000_000

_CHUNK = 4_096  # candidates materialised at once
_DIRECT_UNITS = 16  # two-part decisions on at most this many units list all subsets
_MEMO_MAX = 100_000  # refuted decisions remembered
_CALL = 300  # the fixed cost of one decision, in work units (~0.1 us each)


class _OutOfWork(Exception):
    """Raised inside the search when the work budget is spent."""


def heaviest_part_labels(
    w: np.ndarray, k: int, size: str, hi: float, bound: float, *, work: int = HEAVIEST_WORK,
    used: list[int] | None = None,
) -> tuple[np.ndarray | None, bool]:
    """Search for a partition lighter than ``hi``; prove the optimum if the budget allows.

    Parameters
    ----------
    w : numpy.ndarray
        Non-negative unit weights, at most :data:`HEAVIEST_MAX_UNITS` of them, more than
        ``k``.
    k : int
        Number of parts, at least 3 (two parts: :func:`._two_way.two_way_labels`).
    size : {"free", "equal", "balanced"}
        The size rule (already checked against ``len(w)`` and ``k``).
    hi : float
        The heaviest part of a known partition under the rule.
    bound : float
        A proven lower bound on the optimum for the rule.
    work : int
        Budget of subset sums listed plus candidates tried.
    used : list of int, optional
        ``used[0]`` is raised by the work spent (for a caller that charges a pool).

    Returns
    -------
    (labels, proven)
        ``labels``: an optimal labelling lighter than ``hi``, or None when none lighter
        was found. ``proven``: whether the result (``labels``, else the partition behind
        ``hi``) is proven optimal; False when the budget ran out first.
    """
    search, integer, lo = _prepare("heaviest_part_labels", w, k, bound, work)
    top = hi if integer else hi * (1.0 - REL_TOL)  # below this counts as lighter
    try:
        labels = search.lightest(np.arange(w.shape[0]), k, size, lo, top)
    except _OutOfWork:
        return None, False
    finally:
        search.report(used)
    return labels, True


def bisection_labels(
    w: np.ndarray, k: int, size: str, hi: float, bound: float, *,
    work: int = HEAVIEST_LATE_WORK, step: int = BISECTION_STEP, enough: float | None = None,
    used: list[int] | None = None,
) -> tuple[np.ndarray | None, bool]:
    """Search for a partition lighter than ``hi`` by bisecting the capacity.

    Each step asks the decision search (bin completion, see :class:`_Search`) whether the
    units fit ``k`` parts of a capacity halfway between the highest capacity refuted so
    far and just below the best maximum found. A partition that fits lowers the best
    maximum to its own; a refutation raises the floor; a decision that spends ``step``
    work units undecided makes the next step aim higher, where partitions are easier to
    find. With the floor just below the best maximum, the last step is the proof and gets
    all the budget left. Unlike :func:`heaviest_part_labels`, which climbs from the bound
    and improves on ``hi`` only when it proves the optimum, this improves as it goes, so
    it pays where many parts (deep searches) leave the proof out of reach.

    Parameters and returns as for :func:`heaviest_part_labels`; ``step`` is the budget of
    one undecided step, and with ``enough`` the search stops (unproven) at the first
    partition no heavier than it.
    """
    search, integer, floor = _prepare("bisection_labels", w, k, bound, work)
    try:
        return _bisect(search, integer, floor, w, k, size, hi, step, enough)
    finally:
        search.report(used)


def _bisect(
    search: _Search, integer: bool, floor: float, w: np.ndarray, k: int, size: str, hi: float,
    step: int, enough: float | None,
) -> tuple[np.ndarray | None, bool]:
    """The loop of :func:`bisection_labels`."""
    items = np.arange(w.shape[0])
    # floor: every partition's maximum is proven at least this; undecided: the lowest
    # capacity a step gave up on (the next step aims between it and the best).
    undecided: float | None = None
    found: np.ndarray | None = None
    while True:
        if enough is not None and found is not None and hi <= enough:
            return found, False  # good enough for the caller; not searched further
        below = hi - 1.0 if integer else hi * (1.0 - REL_TOL)  # lighter than hi
        if not below < hi:  # subnormal hi: the relative step rounds back to hi itself
            below = float(np.nextafter(hi, -np.inf))
        if below < floor:
            return found, True
        low = floor if undecided is None else undecided
        cap = float(np.floor((low + below) / 2)) if integer else (low + below) / 2
        final = not low < cap < below
        if final:
            cap = below
        try:
            labels = search.fits_within(search.left if final else step, items, k, size, cap)
        except _OutOfWork:
            if final or search.left <= 0:
                return found, False
            undecided = cap
            continue
        if labels is None:
            floor = cap + 1.0 if integer else float(np.nextafter(cap, np.inf))
            if undecided is not None and undecided <= cap:
                undecided = None
        else:
            found = labels
            hi = float(np.bincount(labels, weights=w, minlength=k).max())
            if undecided is not None and undecided >= hi:
                undecided = None


def _prepare(name: str, w: np.ndarray, k: int, bound: float,
             work: int) -> tuple[_Search, bool, float]:
    """Check the range; return the search, whether sums are exact, and ``bound`` as the
    lowest maximum the search need consider (rounded up, or lowered by the float slack)."""
    m = int(w.shape[0])
    if m > HEAVIEST_MAX_UNITS or k < 3 or m <= k:
        raise ValueError(f"{name} needs k >= 3 and k < m <= {HEAVIEST_MAX_UNITS}, "
                         f"got m={m}, k={k}")
    integer, slack = exactness(w)
    lowest = float(np.ceil(bound)) if integer else float(bound) - slack
    return _Search(w, slack, work), integer, lowest


class _Search:
    """The recursive enumeration, with its budget and float slack."""

    def __init__(self, w: np.ndarray, slack: float, work: int) -> None:
        self.w, self.slack, self.left = w, slack, work
        self.work = work
        # (bit mask of units, parts) -> the highest capacity they were refuted under
        self.refuted: dict[tuple[int, int], float] = {}

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OutOfWork

    def report(self, used: list[int] | None) -> None:
        """Add the work spent to ``used[0]`` (when given)."""
        if used is not None:
            used[0] += min(self.work, self.work - self.left)

    def fits_within(
        self, limit: int, items: np.ndarray, k: int, size: str, cap: float
    ) -> np.ndarray | None:
        """:meth:`fits` with at most ``limit`` of the budget left; raises
        :class:`_OutOfWork` when that is spent (and then counts all of it as spent)."""
        left = self.left
        self.left = granted = min(limit, left)
        try:
            return self.fits(items, k, size, cap)
        finally:
            self.left = left - (granted - max(self.left, 0))

    def lightest(
        self, items: np.ndarray, k: int, size: str, lo: float, hi: float
    ) -> np.ndarray | None:
        """Optimal labels of ``items`` in ``k`` parts if the optimum is below ``hi``, else None."""
        allowed = _allowed(items.size, k, size)
        for in_a, s in self._windows(items, allowed, lo, hi, ascending=True):
            labels = self._rest_fits(items, in_a, k, size, s)
            if labels is not None:
                return labels
        return None

    def fits(self, items: np.ndarray, k: int, size: str, cap: float) -> np.ndarray | None:
        """Labels of ``items`` in ``k`` parts of at most ``cap`` each, or None if none exist."""
        self.spend(_CALL)
        w = self.w[items]
        total = float(w.sum())
        if total > k * cap + self.slack or (w.size and float(w.max()) > cap + self.slack):
            return None
        if k == 1:
            return np.zeros(items.size, dtype=np.int64)
        if int(np.count_nonzero(w > cap / 2 + self.slack)) > k:
            return None  # units above half the capacity need a part each
        key = int(np.bitwise_or.reduce(np.left_shift(1, items))) if items.size else 0
        if self.refuted.get((key, k), -np.inf) >= cap:
            return None  # refuted before under this capacity or a higher one
        if k == 2 and items.size <= _DIRECT_UNITS:
            # Part 0 in [total - cap, cap] leaves part 1 within cap as well.
            return self._two_direct(w, size, total - cap - self.slack, cap + self.slack)
        # Bin completion: the heaviest unit is in some part; that part's other units are
        # listed, fullest first. The rest must fit k - 1 parts, so the part weighs at least
        # total - (k - 1) * cap. Anchoring on one unit breaks the symmetry of the parts.
        a = int(np.argmax(w))
        pos = np.flatnonzero(np.arange(items.size) != a)  # where the others sit in items
        others = items[pos]
        allowed = _allowed(items.size, k, size)
        if allowed is not None:
            allowed = [c - 1 for c in allowed]
        lo = total - (k - 1) * cap - self.slack - float(w[a])
        top = np.nextafter(cap + self.slack - float(w[a]), np.inf)  # half-open: cap is in
        for o_mask, _ in self._windows(others, allowed, lo, top, ascending=False):
            in_a = np.ones(items.size, dtype=bool)
            in_a[pos] = o_mask
            labels = self._rest_fits(items, in_a, k, size, cap)
            if labels is not None:
                return labels
        if len(self.refuted) < _MEMO_MAX:
            self.refuted[key, k] = max(cap, self.refuted.get((key, k), cap))
        return None

    def _two_direct(self, w: np.ndarray, size: str, lo: float, hi: float) -> np.ndarray | None:
        """Two parts by listing every subset: the first with sum in ``[lo, hi]`` and a
        count the rule allows is part 0 (cheaper than meeting in the middle when small)."""
        m = w.size
        self.spend(2**m)
        sums, counts = subset_sums(w)
        ok = (sums >= lo) & (sums <= hi)
        allowed = _allowed(m, 2, size)
        if allowed is not None:
            ok &= _count_in(counts, allowed)
        hit = np.flatnonzero(ok)
        if hit.size == 0:
            return None
        return ((int(hit[0]) >> np.arange(m)) & 1 ^ 1).astype(np.int64)

    def _rest_fits(
        self, items: np.ndarray, in_a: np.ndarray, k: int, size: str, s: float
    ) -> np.ndarray | None:
        """Labels with ``in_a`` as part 0 when the rest fits ``k - 1`` parts of ``s``."""
        self.spend(1)
        rest = items[~in_a]
        sub = self.fits(rest, k - 1, size, s)
        if sub is None:
            return None
        labels = np.zeros(items.size, dtype=np.int64)
        labels[~in_a] = sub + 1
        return labels

    def _windows(self, items: np.ndarray, allowed: list[int] | None, lo: float, hi: float,
                 *, ascending: bool) -> Iterator[tuple[np.ndarray, float]]:
        """Yield ``(mask over items, sum)`` of subsets with sum in ``[lo, hi)`` and a unit
        count in ``allowed`` (None: any), in ascending (or descending) order of sum, ties
        by subset index."""
        m = items.size
        w = self.w[items]
        h = m // 2
        self.spend(2 ** (m - h) * 2)
        sa, ca = subset_sums(w[:h])
        sb, cb = subset_sums(w[h:])
        # Both halves sorted: ordered queries make the binary searches cache-friendly.
        oa = np.argsort(sa, kind="stable")
        ob = np.argsort(sb, kind="stable")
        sa, ca, sb, cb = sa[oa], ca[oa], sb[ob], cb[ob]
        shift = np.arange(m)

        def ends(x: float) -> np.ndarray:
            """For every sum of half a: the first sum of half b completing it to >= x."""
            self.spend(sa.size)
            return np.searchsorted(sb, x - sa, side="left")

        start, stop = lo, hi
        fixed = ends(start if ascending else stop)  # the end of the window already reached
        while start < stop:
            # The chunk runs from the reached end towards the other; when it holds too
            # many pairs, it is cut to the share a uniform density predicts, until it fits.
            far = stop if ascending else start
            moving = ends(far)
            n = int(np.abs(moving - fixed).sum())
            while n > _CHUNK:
                near = start if ascending else stop
                cut = near + (far - near) * (0.8 * _CHUNK / n)
                if cut == near or cut == far:
                    break  # many equal sums: take them all at once
                far = cut
                moving = ends(far)
                n = int(np.abs(moving - fixed).sum())
            left, right = (fixed, moving) if ascending else (moving, fixed)
            self.spend(n)
            counts = right - left
            ia = np.repeat(np.arange(sa.size), counts)
            offsets = np.cumsum(counts) - counts
            ib = left[ia] + (np.arange(n) - offsets[ia])
            if allowed is not None:
                keep = _count_in(ca[ia] + cb[ib], allowed)
                ia, ib = ia[keep], ib[keep]
            sums = sa[ia] + sb[ib]
            # A subset's mask over items: half a's index in the low bits, half b's above.
            code = oa[ia] | (ob[ib] << h)
            for j in np.lexsort((ib, ia, sums if ascending else -sums)).tolist():
                yield ((int(code[j]) >> shift) & 1).astype(bool), float(sums[j])
            fixed = moving
            if ascending:
                start = far
            else:
                stop = far


def _allowed(m: int, k: int, size: str) -> list[int] | None:
    """Unit counts the heaviest of ``k`` parts of ``m`` units may hold (None: any)."""
    c = m // k
    if size == "free":
        return None
    if size == "equal" or m % k == 0:
        return [c]
    return [c, c + 1]


def _count_in(counts: np.ndarray, allowed: list[int]) -> np.ndarray:
    """``np.isin(counts, allowed)`` for the one or two counts a rule allows, without
    ``isin``'s set-up cost (it dominated the many small decisions)."""
    ok = counts == allowed[0]
    for c in allowed[1:]:
        ok |= counts == c
    return ok
