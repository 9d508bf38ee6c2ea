"""Split weighted items into k parts under size rules and groups.

``partition`` is the entry point; it returns a :class:`Partition`, which *is* the list of
``k`` ascending index lists and also carries the evidence (part loads, a proven lower
bound, the gap to it). The bound of validated units (:func:`bound_of_units`, whose term 4
partitions the heaviest units with :func:`partition_arrays`) lives here too;
:func:`seqbalance.partitioning.bounds.lower_bound` checks its arguments and calls it.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator, cast

import numpy as np

from .._validate import (
    as_groups,
    as_weights,
    check_choice,
    check_positive_int,
    check_size_limit,
)
from ._exact import (
    EXACT_MAX_NODES,
    EXACT_MAX_UNITS,
    REL_TOL,
    exact_budget,
    exact_labels,
    exactness,
)
from ._greedy import folded_labels, lpt_labels
from ._heaviest import (
    HEAVIEST_DEEP_WORK,
    HEAVIEST_FIRST_PARTS,
    HEAVIEST_LATE_WORK,
    HEAVIEST_MAX_PARTS,
    HEAVIEST_MAX_UNITS,
    HEAVIEST_WORK,
    bisection_labels,
    heaviest_part_labels,
)
from ._kk import kk_free_labels, kk_labels
from ._loads import relative_gap, stats_from_loads
from ._refine import PAIR_MAX_COUNT, STEEPEST_MAX_UNITS, pair_rounds, refine_labels, steepest_swaps
from ._rules import SIZES, check_size, min_count
from ._two_way import TWO_WAY_MAX_UNITS, two_way_labels
from .searches import (
    FAST_TWO_WAY_MAX_UNITS,
    exact_searches,
    exact_searches_enabled,
    spend_nodes,
    take_nodes,
)

__all__ = ["HEAVIEST_UNITS", "METHODS", "Partition", "bound_of_units", "partition"]

METHODS: tuple[str, ...] = ("auto", "kk", "greedy")

#: In "free" mode, ``method="auto"`` skips its second candidate and classic Karmarkar–Karp
#: when the first is already provably within this relative gap of optimal
#: (``max_load <= (1 + AUTO_RTOL) * bound``), and on float weights with more than 32 units
#: the exact searches too.
AUTO_RTOL = 1e-5

#: In "free" mode, ``method="auto"`` also tries classic Karmarkar–Karp (no count limits)
#: on problems with at most this many units; its O(m k) merges cost too much beyond.
KK_FREE_MAX_UNITS = 4096

#: With more parts than this (and at most ``PAIR_MAX_COUNT`` units a part), "auto" evens
#: out all parts in vectorised pair rounds before the refinement (in "free" mode too,
#: except for ``fit`` queries: at tight counts, e.g. 8,192 rl-math lengths into 1,170
#: parts, the rounds take the gap to the bound from 1.4e-3 to 1.6e-4).
PAIR_MIN_PARTS = 256

#: Under a size rule, :func:`partition` ("auto") first refines
#: :func:`._greedy.folded_labels` (one sort, no differencing) when the weights are
#: integers with two of them 1 apart (see :func:`_foldable`), there are at most
#: ``FOLD_MAX_PARTS`` parts and at least ``FOLD_MIN_PER_PART`` units a part, and keeps it
#: only if it meets the lower bound (then it is optimal); otherwise the usual starts run
#: after it. Measured on 360 such partitions (5 workloads, 1,024-32,768 lengths,
#: k = 2-16, "balanced" and "equal"): the bound met in 354, 1.8 s in all against 9.5 s.
#: The planner's own rank splits keep the usual starts: another optimal token split
#: changed 192 of 1,280 plans (the same micro-batch counts, 52 steps longer by up to 1.6%
#: and 24 shorter, FSDP), tie-breaking noise it was not tuned on.
FOLD_MAX_PARTS = 16
FOLD_MIN_PER_PART = 64


class Partition(list):  # type: ignore[type-arg]
    """The result of :func:`partition`: a ``list`` of ``k`` ascending index lists, plus evidence.

    It compares equal to (and can be used as) a plain ``list[list[int]]``.

    Attributes
    ----------
    loads : numpy.ndarray
        Total weight of each part (float64, shape ``(k,)``).
    lower_bound : float
        Proven lower bound on the heaviest part for this size rule and grouping; when
        ``optimal`` is True, the optimum itself (so ``gap`` is 0). With ``k = 1`` the only
        possible partition is optimal, so its gap is exactly 0.
    optimal : bool
        Whether the heaviest part is proven as light as possible: it meets the lower bound,
        or the exact search of ``method="auto"`` ran to its end (up to ``1e-12`` relative
        for non-integer weights; exact for integers), or there is one part, or one unit
        per part.
    max_load : float
        Weight of the heaviest part.
    gap : float
        ``max_load / lower_bound - 1`` (0.0 when both are 0): how far from optimal at most.
    method : str
        The algorithm that produced it: ``"kk"``, ``"greedy"``, or for ``method="auto"``
        the winning candidate, ``"kk+refine"``, ``"greedy+refine"``, ``"kkfree+refine"``
        (free mode, classic Karmarkar–Karp), ``"folded+refine"`` (a size rule, integer
        weights, many units a part: the sorted fold met the bound), ``"exact"`` (the
        exact search improved on the heuristics) or ``"floor+refine"`` (a caller's floor
        partition was lighter; the compat drop-ins pass their framework's differencing);
        ``"contiguous"`` from :func:`~seqbalance.contiguous_partition`.
    """

    loads: np.ndarray
    lower_bound: float
    method: str
    optimal: bool

    def __init__(
        self,
        parts: list[list[int]],
        loads: np.ndarray,
        bound: float,
        method: str,
        optimal: bool = False,
    ) -> None:
        super().__init__(parts)
        self.loads = loads
        self.method = method
        mx = float(loads.max()) if loads.size else 0.0
        self.optimal = bool(optimal) or mx <= bound
        # Proven optimal: the optimum is the best bound there is.
        self.lower_bound = max(float(bound), mx) if self.optimal else float(bound)
        self._counts = np.array(list(map(len, parts)), dtype=np.int64).reshape(len(parts))

    @property
    def max_load(self) -> float:
        """Weight of the heaviest part."""
        return float(self.loads.max()) if self.loads.size else 0.0

    @property
    def gap(self) -> float:
        """``max_load / lower_bound - 1``; 0.0 when both are 0."""
        return relative_gap(self.max_load, self.lower_bound)

    def stats(self) -> dict[str, Any]:
        """The :func:`balance_stats` dictionary, measured against this result's bound."""
        return stats_from_loads(self.loads, self._counts, self.lower_bound)


def partition(
    weights: Any,
    k: int,
    *,
    size: str = "free",
    groups: Any = None,
    method: str = "auto",
) -> Partition:
    """Split items into ``k`` parts so that the heaviest part is as light as possible.

    Parameters
    ----------
    weights : array_like
        1-D finite, non-negative weights (any integer width or float; integers are widened
        to float64, exact up to 2**53 and accurate to ~1e-16 relative beyond).
    k : int
        Number of parts (>= 1).
    size : {"free", "equal", "balanced"}
        ``"free"``: any counts; with fewer items than parts, some parts stay empty.
        ``"equal"``: every part gets ``n / k`` items (ValueError if ``n % k != 0``).
        ``"balanced"``: counts differ by at most one.
    groups : array_like, optional
        One group id per item (numbers or strings). All items of a group land in the same
        part, and size rules count groups instead of items.
    method : {"auto", "kk", "greedy"}
        ``"kk"``: k-way largest differencing (Karmarkar–Karp), dealing units in rounds of
        ``k`` (so every part gets ``ceil(n / k)`` slots; in "free" mode on long-tailed
        weights that equal-count start can be far from optimal until "auto" refines it).
        ``"greedy"``: longest first to the lightest part that may take it (LPT).
        ``"auto"``: under a size rule with integer weights (two of them 1 apart), at most
        :data:`FOLD_MAX_PARTS` parts and at least :data:`FOLD_MIN_PER_PART` units a part,
        first the units sorted and dealt in rows of ``k``, the lighter half of the rows in
        reverse, then refined: kept when it meets the lower bound (optimal). Otherwise
        both starts above, each followed by a refinement pass of moves and swaps that lower
        the heaviest part within the size rule (for small problems under a size rule,
        first steepest-descent swaps); the lighter result wins (ties: kk). The lighter
        start is refined first, and the other is skipped when the first reaches the lower
        bound, or in "free" mode comes within :data:`AUTO_RTOL` (1e-5) of it; otherwise
        its refinement stops once it cannot, or by a generous forecast of its progress
        will not, end lighter than the first. In "free" mode with at most
        :data:`KK_FREE_MAX_UNITS` units, classic Karmarkar–Karp (no count limits) plus
        refinement is a further candidate, taken only when strictly lighter, and skipped
        when the result is already within ``AUTO_RTOL`` of the bound. Then, on
        small problems, exact searches start from the winner within fixed work budgets,
        and the result says whether it is ``optimal``: two parts and at most 32 units, a
        meet-in-the-middle split (always proven); three to eight parts and at most 32
        units, an enumeration of the heaviest part in ascending order of weight (a
        smaller budget above four parts); at most ``EXACT_MAX_UNITS`` (64) units, when
        still unproven, a branch-and-bound search; three to eight parts and at most 32
        units, when that leaves it unproven, a bisection of the capacity by bin
        completion, which lowers the heaviest part step by step even when it cannot
        prove the optimum. The branch and bound is skipped on 33 to 64 units whose sums
        are not exact (non-integer weights) in "free" mode already within ``AUTO_RTOL``
        of the bound (it could gain less than that and would spend its whole budget
        trying).

    Returns
    -------
    Partition
        ``k`` ascending lists of indices into ``weights``; every index appears exactly once.
        Carries ``loads``, ``lower_bound``, ``max_load``, ``gap``, ``method`` and
        ``stats()``.

    Raises
    ------
    ValueError
        For ``k < 1`` or not an integer; weights that are not 1-D, negative, NaN or infinite;
        ``groups`` of the wrong length; an unknown ``size`` or ``method``; a size rule
        the items (groups) cannot meet; ``k`` above ``n + 2**20`` (refused before
        anything is allocated); or weights whose sum overflows float64.

    Notes
    -----
    Deterministic: ties are broken by index with stable sorts and every budget counts
    work, never time, so the same input gives the same output in every process.

    The small-problem exact searches can be switched off for a block of code with
    ``with seqbalance.exact_searches(False):`` (:mod:`seqbalance.partitioning.searches`):
    a few milliseconds instead of up to ~1.5 s on at most 64 units, for the refined
    starts' result. The :mod:`seqbalance.compat` drop-ins leave them off by default.

    Complexity (n items, m units, k parts): ``"kk"`` O(m log m + (m/k) k log k);
    ``"greedy"`` O(m log m + m log k) (most units placed in vectorised batches when k is
    large); ``"auto"`` adds per start a refinement pass of O(m log m) set-up and at most
    ``min(3k + 256, 1,024)`` steps of O(k + m/k log m) each plus an O(m) scan when the
    lightest parts do not help, stopped after its first 64 steps once it has counted 2**24
    element operations (so at most ~2**24 while m + k <= 2**18, and linear in m beyond);
    the second start stops refining once it
    cannot (or, by a generous forecast of its progress, will not) end lighter than the
    first. For k > 256 each start whose parts hold at most 32 units (under a size rule,
    or in "free" mode without ``fit``) first gets at most
    32 vectorised rounds of swaps between paired parts, O(m c) each (c the largest
    count); then the free-mode Karmarkar–Karp candidate
    O(m k) for m <= 4,096; for m <= 32 the two-way split O(2**(m/2) m), or for k = 3..8
    the heaviest-part enumeration within 12e6 work units for k <= 4, 4e6 above (subset
    sums listed and candidates tried; ~0.5 s at worst); the branch and bound at most
    60,000 nodes of O(k) for m <= 64 (200,000 for m <= 32 and k <= 4); then for k = 3..8
    and m <= 32 the bisection within 8e6 units, so that rare small inputs take up to
    ~1.5 s in all (measured on 2,760 small inputs, k = 3..8, n = 12..30). Memory is
    O(n + k), and O(2**(m/2)) for the small-problem searches.

    Examples
    --------
    >>> p = partition([8, 7, 6, 5, 4], 2)
    >>> sorted(p)
    [[0, 1], [2, 3, 4]]
    >>> p.max_load, p.lower_bound, p.gap
    (15.0, 15.0, 0.0)
    >>> sorted(partition([8, 7, 6, 5, 4, 3], 2, size="equal").loads.tolist())
    [16.0, 17.0]
    """
    w = as_weights(weights)
    k = check_size_limit(check_positive_int(k, "k"), "k", w.shape[0])
    rule = check_choice(size, "size", SIZES)
    how = check_choice(method, "method", METHODS)
    labels_of_groups = None if groups is None else as_groups(groups, w.shape[0])
    return partition_arrays(w, k, rule, how, labels_of_groups, fold=True)


def partition_arrays(
    w: np.ndarray,
    k: int,
    rule: str,
    how: str,
    labels_of_groups: np.ndarray | None,
    *,
    fit: float | None = None,
    fold: bool = False,
    heaviest: bool = True,
    kk_start: Callable[[np.ndarray, int], np.ndarray] | None = None,
    floor: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> Partition:
    """:func:`partition` on validated inputs (float64 weights, int64 dense group labels).

    For callers inside seqbalance that validated at their own boundary (the planner); the
    size rule is still checked against the number of units, as it depends on the groups.
    ``fit``: the caller only asks whether the heaviest part can be brought to ``fit`` or
    below (a bin capacity), so ``"auto"`` stops refining once it is there, and a pass that
    cannot (or by its progress forecast will not) get there stops early; the result is
    then any partition within ``fit``, not the lightest found, or one above it.
    ``fold``: allow the folded start (see :data:`FOLD_MAX_PARTS`); :func:`partition`
    does, the planner does not. ``heaviest``: the bound includes its heaviest-units term
    (:func:`bound_of_units`; False inside that term's own search).
    ``kk_start``: ``labels_of(units, k)``, used by ``"auto"`` in place of its differencing
    start (not by the folded start, which is kept only at the bound). ``"auto"`` keeps the
    lightest of its refined starts and refinement never makes a start heavier, so the
    result is never heavier than this start: the compat drop-in for verl passes verl's own
    differencing. ``floor``: ``labels_of(units, k)`` (meeting the size rule), computed
    after the search unless that proved its optimum; when its partition is lighter than
    the result, it is refined and returned instead. The result
    is then never heavier than it nor than the search's own (the count-free drop-ins pass
    the framework's differencing: a replaced start there lost cap fits the search found).
    """
    units = w
    if labels_of_groups is not None:
        units = np.bincount(labels_of_groups, weights=w, minlength=0).astype(np.float64)
    rule = check_size(rule, units.shape[0], k, grouped=labels_of_groups is not None)

    bound = bound_of_units(units, k, rule, items=None if labels_of_groups is None else w,
                           heaviest=heaviest)  # fmt: skip
    if units.shape[0] <= k:
        # One unit per part, heaviest first, is optimal (the heaviest part is the largest
        # unit, which every partition holds somewhere) and is what KK and LPT give;
        # O(m log m) however large k is, where the general methods cost O(k) per step.
        unit_labels = np.empty(units.shape[0], dtype=np.int64)
        unit_labels[np.argsort(-units, kind="stable")] = np.arange(units.shape[0])
        used, proven = {"auto": "kk+refine"}.get(how, how), True
    else:
        unit_labels, used, proven = _solve(units, k, rule, how, bound, fit, fold, kk_start)
        if floor is not None and not proven:
            unit_labels, used, proven = _at_most_floor(units, k, rule, bound, fit,
                                                       unit_labels, used, floor)  # fmt: skip
    item_labels = unit_labels if labels_of_groups is None else unit_labels[labels_of_groups]
    loads = np.bincount(item_labels, weights=w, minlength=k).astype(np.float64)
    counts = np.bincount(item_labels, minlength=k)
    order = np.argsort(item_labels, kind="stable").tolist()  # ascending within each part
    ends = np.cumsum(counts)
    with _gc_paused(k):
        parts: list[list[int]] = [[] for _ in range(k)]  # cheap even if most stay empty
        for p in np.flatnonzero(counts).tolist():
            parts[p] = order[int(ends[p] - counts[p]) : int(ends[p])]
        # k = 1: the only partition is optimal, so its load is the bound and the gap is 0.
        return Partition(parts, loads, bound, used, optimal=proven or k == 1)


def kk_parts(w: np.ndarray, k: int, rule: str = "free") -> list[list[int]]:
    """The parts of ``partition(w, k, size=rule, method="kk")`` (validated float64 ``w``,
    no groups), without the lower bound its :class:`Partition` reports: the baselines
    that run KK as a step of their own pipeline need the parts only."""
    check_size(rule, w.shape[0], k, grouped=False)
    if w.shape[0] <= k:  # as partition_arrays: one unit per part, heaviest first
        labels = np.empty(w.shape[0], dtype=np.int64)
        labels[np.argsort(-w, kind="stable")] = np.arange(w.shape[0])
    else:
        labels = kk_labels(w, k)
    counts = np.bincount(labels, minlength=k)
    order = np.argsort(labels, kind="stable").tolist()  # ascending within each part
    ends = np.cumsum(counts)
    parts: list[list[int]] = [[] for _ in range(k)]
    for p in np.flatnonzero(counts).tolist():
        parts[p] = order[int(ends[p] - counts[p]) : int(ends[p])]
    return parts


def _at_most_floor(
    units: np.ndarray, k: int, size: str, bound: float, fit: float | None,
    labels: np.ndarray, used: str, floor: Callable[[np.ndarray, int], np.ndarray],
) -> tuple[np.ndarray, str, bool]:
    """``labels`` unless the ``floor`` partition is lighter; then that one, refined."""
    top = float(np.bincount(labels, weights=units, minlength=k).max())
    below = floor(units, k)
    if float(np.bincount(below, weights=units, minlength=k).max()) >= top:
        return labels, used, False
    enough = bound if fit is None else max(bound, fit)
    below = refine_labels(units, below, k, size, target=enough,
                          by_weight=np.argsort(units, kind="stable"))  # fmt: skip
    proven = float(np.bincount(below, weights=units, minlength=k).max()) <= bound
    return below, "floor+refine", proven


@contextlib.contextmanager
def _gc_paused(k: int) -> Iterator[None]:
    """Pause the cyclic garbage collector while ``k`` part lists are built.

    A million fresh lists trigger many collections, each of which walks every object of
    the process (seconds when torch is loaded); the lists cannot form cycles.
    """
    pause = k > 10_000 and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


def _solve(
    units: np.ndarray, k: int, size: str, method: str, bound: float, fit: float | None = None,
    fold: bool = False, kk_start: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> tuple[np.ndarray, str, bool]:
    """Labels per unit, the name of the algorithm that produced them, and proven optimality."""
    if method == "kk":
        return kk_labels(units, k), "kk", False
    if method == "greedy":
        return lpt_labels(units, k, size), "greedy", False
    m = units.shape[0]
    by_weight = np.argsort(units, kind="stable")  # shared by every refinement pass
    enough = bound if fit is None else max(bound, fit)  # lighter than this is no use
    if fold and _foldable(units, k, size, by_weight):
        # Many integer units a part: the bound is usually met, and a refined fold meets
        # it ~5x sooner than the differencing and greedy starts below.
        labels = refine_labels(units, folded_labels(units, k), k, size, target=enough,
                               by_weight=by_weight)  # fmt: skip
        top = float(np.bincount(labels, weights=units, minlength=k).max())
        if top <= enough:
            return labels, "folded+refine", top <= bound
    # Under a size rule, small problems first get steepest-descent swaps, so there "auto"
    # is never worse than greedy-with-counts followed by best-improvement swaps.
    steepest = size != "free" and m <= STEEPEST_MAX_UNITS
    kk = kk_labels(units, k) if kk_start is None else kk_start(units, k)
    starts = [("kk", kk), ("greedy", lpt_labels(units, k, size))]
    # Refine the lighter start first: it usually needs fewer steps, and may end the search.
    tops = [float(np.bincount(lab, weights=units, minlength=k).max()) for _, lab in starts]
    if tops[1] < tops[0]:
        starts.reverse()
    best: tuple[float, np.ndarray, str] | None = None
    for name, labels in starts:
        if steepest:
            labels = steepest_swaps(units, labels, k, by_weight=by_weight)
        if k > PAIR_MIN_PARTS and _pairable(labels, k, m, size, fit):
            labels = pair_rounds(units, labels, k)
        # A later start stops refining once it can no longer end as light as the best.
        rival = [x for x in (fit, None if best is None else best[0]) if x is not None]
        labels = refine_labels(units, labels, k, size, target=enough, by_weight=by_weight,
                               beat=min(rival) if rival else None)
        top = float(np.bincount(labels, weights=units, minlength=k).max())
        if best is None or top < best[0] or (top == best[0] and name == "kk"):
            best = (top, labels, name + "+refine")
        if best[0] <= max(enough, bound * (1.0 + (AUTO_RTOL if size == "free" else 0.0))):
            break  # optimal (or, in free mode, within AUTO_RTOL of it), or fits
    assert best is not None
    # Free mode, within AUTO_RTOL of the bound: a further search could shave off less
    # than that. With ``fit`` the caller needs to know whether the cap can be met, so
    # search anyway.
    def close() -> bool:
        top = cast("tuple[float, np.ndarray, str]", best)[0]  # set above: not None
        return fit is None and size == "free" and top <= bound * (1.0 + AUTO_RTOL)

    def within_rtol() -> bool:
        # For the exact searches, only on float costs: they rarely meet the bound exactly,
        # while on integers the search may prove the optimum.
        return close() and not exactness(units)[0]

    # Classic KK (O(m k) Python merges: 16 ms at m = 1,024, k = 8) proves nothing, so it
    # is skipped within AUTO_RTOL whatever the weights.
    if (size == "free" and k > 1 and m <= KK_FREE_MAX_UNITS and best[0] > enough
            and not close()):  # fmt: skip
        labels = refine_labels(units, kk_free_labels(units, k), k, size, target=enough,
                               by_weight=by_weight, beat=best[0] if fit is None else
                               min(best[0], fit))
        best = _lighter(best, units, labels, k, "kkfree+refine")
    searching = exact_searches_enabled()  # off: the caller chose speed (module searches)
    two_way_max = TWO_WAY_MAX_UNITS if searching else FAST_TWO_WAY_MAX_UNITS
    if k == 2 and m <= two_way_max and best[0] > enough:
        # Two parts: meet in the middle proves the optimum at once (module _two_way).
        best = _lighter(best, units, two_way_labels(units, size), k, "two-way")
        return best[1], best[2], True
    if not searching:
        return best[1], best[2], best[0] <= bound
    few = 3 <= k <= HEAVIEST_MAX_PARTS and k < m <= HEAVIEST_MAX_UNITS
    if few and best[0] > enough:
        # Few parts: enumerating the heaviest part settles the cases whose optimum lies a
        # hair above the bound, which the branch and bound below rarely can (_heaviest).
        best, proven = _enumerate_heaviest(units, k, size, best, bound, fit, work=(
            HEAVIEST_WORK if k <= HEAVIEST_FIRST_PARTS else HEAVIEST_DEEP_WORK))
        if proven:
            return best[1], best[2], True
    # On more units than the small searches take, the branch and bound would spend its
    # whole node budget (0.1-0.4 s, inside every training step of a run planning with a
    # fitted cost) trying to gain less than AUTO_RTOL (within_rtol).
    skip_exact = m > TWO_WAY_MAX_UNITS and within_rtol()
    if m <= EXACT_MAX_UNITS and best[0] > enough and not skip_exact:
        # After the enumeration, more parts get the smaller budget: the bisection below
        # settles more of what is left per second than more nodes do.
        nodes = EXACT_MAX_NODES if few and k > HEAVIEST_FIRST_PARTS else exact_budget(m)
        labels, proven = exact_labels(units, k, size, best[1], bound, max_nodes=nodes)
        best = _lighter(best, units, labels, k, "exact")
        if few and not proven and best[0] > enough:
            # Still open: bisect the capacity with bin completion, which improves the
            # partition as it goes even where the proof stays out of reach (_heaviest).
            best, proven = _enumerate_heaviest(units, k, size, best, bound, fit,
                                               work=HEAVIEST_LATE_WORK, bisect=True)
        return best[1], best[2], proven
    return best[1], best[2], best[0] <= bound


def _foldable(units: np.ndarray, k: int, size: str, by_weight: np.ndarray) -> bool:
    """Whether "auto" tries the folded start first (see :data:`FOLD_MAX_PARTS`).

    Integer weights, two of which differ by exactly 1: then moves and swaps can shift a
    part by single units and the bound is usually met (token lengths: 197 of 200). Coarse
    integers cannot fine-tune a part that way (verl's workloads 24576 L + L**2 met it in
    4 of 200, each failed try a wasted refinement, 9 ms on average), so they skip it.
    """
    if size == "free" or not 1 < k <= FOLD_MAX_PARTS or units.shape[0] < FOLD_MIN_PER_PART * k:
        return False
    if not exactness(units)[0]:
        return False
    steps = np.diff(units[by_weight])
    return bool(np.any(steps == 1.0))


def _pairable(labels: np.ndarray, k: int, m: int, size: str, fit: float | None) -> bool:
    """Whether :func:`pair_rounds` may run on ``labels``: its arrays hold k c**2 / 2 numbers
    for the largest count c, which a size rule keeps at ``ceil(m / k)``; in "free" mode a
    start may pile many light units into one part, so the counts are looked at.

    Not for a "free" ``fit`` query (the planner asking whether a count holds the cap): the
    better-paired parts keep the refinement's progress forecast hopeful for longer, so a
    count that fails takes longer to give up (with the rounds, on 8,192 rl-math lengths,
    slime's default schedule would take 0.45 s instead of 0.28 s and AReaL's ffd_allocate
    0.17 s instead of 0.11 s, for one micro-batch fewer in one of six AReaL calls).
    """
    if -(-m // k) > PAIR_MAX_COUNT:
        return False
    if size != "free":
        return True
    return fit is None and int(np.bincount(labels, minlength=k).max()) <= PAIR_MAX_COUNT


#: Work units of the heaviest-part searches (:mod:`._heaviest`: 0.03-0.16 us each) charged
#: as one node of a request's exact-search pool (a branch-and-bound node: a few to 25 us).
HEAVIEST_UNITS_PER_NODE = 64


def _enumerate_heaviest(
    units: np.ndarray, k: int, size: str, best: tuple[float, np.ndarray, str], bound: float,
    fit: float | None, work: int = HEAVIEST_WORK, bisect: bool = False,
) -> tuple[tuple[float, np.ndarray, str], bool]:
    """``best`` improved by :func:`._heaviest.heaviest_part_labels` (or, with ``bisect``,
    :func:`._heaviest.bisection_labels`), and whether it is proven optimal. With ``fit``,
    only a partition within it is of use, so nothing heavier is searched (then "nothing
    lighter found" proves only that nothing fits), and the bisection stops at the first
    partition within it."""
    hi = best[0] if fit is None else min(best[0], float(np.nextafter(fit, np.inf)))
    # Inside a planning request its work comes out of the request's exact-search pool
    # (searches.exact_work_pool), HEAVIEST_UNITS_PER_NODE units a node, as the branch and
    # bound's nodes do; outside one, the whole budget.
    want = -(-work // HEAVIEST_UNITS_PER_NODE)
    nodes = take_nodes(want)
    if nodes <= 0 and not bisect:
        return best, False
    # (the bisection runs with no work left too: a floor already at the best maximum
    # proves it without a decision)
    work = min(work, nodes * HEAVIEST_UNITS_PER_NODE)  # (take_nodes is never negative)
    used = [0]
    try:
        if bisect:
            labels, proven = bisection_labels(units, k, size, hi, bound, work=work,
                                              enough=fit, used=used)  # fmt: skip
        else:
            labels, proven = heaviest_part_labels(units, k, size, hi, bound, work=work,
                                                  used=used)  # fmt: skip
    finally:
        spend_nodes(-(-used[0] // HEAVIEST_UNITS_PER_NODE))
    if labels is not None:
        best = _lighter(best, units, labels, k, "exact")
    # Proven: the optimum was found, or nothing lighter than ``hi`` exists.
    return best, proven and (labels is not None or hi == best[0])


def _lighter(
    best: tuple[float, np.ndarray, str], units: np.ndarray, labels: np.ndarray, k: int,
    name: str,
) -> tuple[float, np.ndarray, str]:
    """``(heaviest part, labels, name)`` of ``labels`` if strictly lighter than ``best``."""
    top = float(np.bincount(labels, weights=units, minlength=k).max())
    return (top, labels, name) if top < best[0] else best


# ---- the lower bound of validated units -----------------------------------------------

_EPS = float(np.finfo(np.float64).eps)

#: Term 4 of :func:`lower_bound` looks at the optima of at most this many heaviest units.
HEAVIEST_UNITS = 12


def bound_of_units(
    w: np.ndarray, k: int, size: str, items: np.ndarray | None = None, *,
    heaviest: bool = True,
) -> float:
    """The bound of :func:`~seqbalance.partitioning.bounds.lower_bound` for validated unit
    weights ``w`` (no checks).

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
    :func:`~seqbalance.partitioning.bounds.lower_bound`); ``s``: the unit weights, descending.

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
