"""Contiguous partitions: cut a sequence into ``k`` consecutive runs.

Where order must be kept (micro-batches that follow the data order, layers over pipeline
stages), a partition can only choose where to cut. :func:`contiguous_partition` chooses
the cuts that make the heaviest run as light as possible, and among those the lightest
run as heavy as possible, so the spread between runs is as small as the heaviest run
allows. Both optima are exact.

How: with non-negative weights and prefix sums ``P``, the runs ending at item ``i`` that
weigh between ``L`` and ``U`` start in one window of positions ``[a_i, b_i]``, and both
ends of the window only move right as ``i`` grows. The run counts that can cover the
items before ``i`` form a range (proof in :func:`_solve_runs`), so one pass with sliding
window minima and maxima finds, for every ``i``, the fewest and the most runs, and a
bisection on ``U``, then on ``L``, finds the optima. With at least one item a run and no
lower limit, the fewest runs under ``U`` come from greedy jumps instead, and every count
from there up to ``n`` is reachable (a run of two or more items can always be split).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

import numpy as np

from .._validate import as_weights, check_nonnegative_int, check_positive_int, exact_numbers
from .kway import Partition

__all__ = ["contiguous_partition"]


def contiguous_partition(weights: Any, k: int, *, min_size: int = 1) -> Partition:
    """Cut ``weights`` into ``k`` consecutive runs, the heaviest as light as possible.

    Among the cuts whose heaviest run is the lightest possible, the one whose lightest
    run is the heaviest possible is returned (so the spread is as small as that allows).
    Both are exact optima over all contiguous partitions with these sizes, not estimates.

    Parameters
    ----------
    weights : array_like
        1-D finite, non-negative weights, in the order to keep.
    k : int
        Number of runs (>= 1).
    min_size : int, default 1
        Fewest items a run holds. 0 allows empty runs; they are only used where ``k`` is
        above the number of items, and come last.

    Returns
    -------
    Partition
        ``k`` lists of consecutive indices, in order (``parts[j][0]`` is where run ``j``
        starts), with ``optimal=True``: ``lower_bound`` is the optimum heaviest run among
        contiguous partitions, not among all partitions (see :func:`lower_bound` for
        that). ``method`` is ``"contiguous"``.

    Raises
    ------
    ValueError
        For invalid weights, ``k < 1``, ``min_size < 0``, or fewer than
        ``k * min_size`` items.

    Notes
    -----
    Cost: a bisection over the run weight (about ``log2`` of the total for integer
    weights, up to 64 steps for fractional ones), then one over the lightest run, each
    step one pass over the items (in Python for the second, about 1-2 µs an item):
    8,192 items into 64 runs take ~50 ms. Memory is O(n). Integer weights are summed
    exactly (in int64 up to a total of 2**62, as Python ints beyond, ~10x slower);
    fractional ones are optimised on their float64 prefix sums, so a cut may be off
    where two choices differ in the last bits.

    Examples
    --------
    >>> p = contiguous_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    >>> [list(r) for r in p], p.loads.tolist()
    ([[0, 1, 2, 3, 4], [5, 6], [7, 8]], [15.0, 13.0, 17.0])
    """
    w = as_weights(weights, "weights")
    k = check_positive_int(k, "k")
    min_size = check_nonnegative_int(min_size, "min_size")
    n = int(w.shape[0])
    if n < k * min_size:
        raise ValueError(
            f"{n} items cannot be cut into {k} runs of at least {min_size} "
            f"item{'s' if min_size != 1 else ''} each (that needs {k * min_size}); lower k "
            "or min_size"
        )
    exact = exact_numbers(weights) if n else np.zeros(0, dtype=np.int64)
    if exact.dtype.kind == "f":
        prefix = np.concatenate(([0.0], np.cumsum(w)))
    else:  # integers: int64 prefix sums while sums of two stay below 2**63, else Python ints
        ints = exact.tolist()
        wide = sum(ints) >= 2**62 or exact.dtype == object
        prefix = np.cumsum(np.array([0, *ints], dtype=object if wide else np.int64))
    used = min(k, n) if min_size == 0 else k  # empty runs only where items run out
    cuts = _cuts(prefix, used, max(min_size, 1)) if used else [0]
    cuts += [n] * (k - used)
    if exact.dtype.kind == "f":  # each run summed on its own, not as a prefix difference
        loads = np.array([math.fsum(w[cuts[j] : cuts[j + 1]].tolist()) for j in range(k)])
    else:
        loads = np.array([float(prefix[cuts[j + 1]] - prefix[cuts[j]]) for j in range(k)])
    parts = [list(range(cuts[j], cuts[j + 1])) for j in range(k)]
    return Partition(parts, loads, float(loads.max()) if k else 0.0, "contiguous", True)


def _cuts(prefix: np.ndarray, k: int, s: int) -> list[int]:
    """``k + 1`` cut positions (0 first, ``n`` last), runs of at least ``s`` items, from
    the prefix sums (int64, Python ints or float64)."""
    n = prefix.shape[0] - 1
    total = prefix[-1]
    if k == 1:
        return [0, n]
    if total == 0:  # every cut is optimal: equal counts, the extra items first
        q, r = divmod(n, k)
        return [j * q + min(j, r) for j in range(k + 1)]
    whole = prefix.dtype.kind != "f"
    heaviest = max(prefix[1:] - prefix[:-1])
    # No run can be lighter than the heaviest item or the mean, nor the lightest heavier.
    bound = max(heaviest, -(-total // k)) if whole else max(float(heaviest), total / k)

    def fits(low: Any, up: Any) -> bool:  # the window pass (exact: counts form a range)
        return _count_ranges(*_windows(prefix, s, low, up), k) is not None

    def fits_upper(u: Any) -> bool:
        return _fewest_runs(prefix, u, k) <= k if s == 1 else fits(0, u)

    if whole:
        upper: Any = _least(bound - 1, total, fits_upper)
    else:
        below = float(np.nextafter(bound * (1 - 1e-9), 0.0))  # also below a subnormal bound
        upper = _least_float(below, float(total), fits_upper)
        if not fits(0.0, upper):
            # The greedy check and the window pass round differently near powers of two.
            upper = _least_float(upper, float(total), lambda u: fits(0.0, u))

    def fits_lower(low: Any) -> bool:
        return fits(low, upper)

    if whole:
        lower: Any = _most(0, total // k + 1, fits_lower)
    else:
        above = float(np.nextafter(total / k * (1 + 1e-9), np.inf))
        lower = _most_float(0.0, above, fits_lower)
    return _solve_runs(prefix, k, s, lower, upper)


def _solve_runs(prefix: np.ndarray, k: int, s: int, lower: Any, upper: Any) -> list[int]:
    """Cuts into exactly ``k`` runs of ``s`` or more items weighing ``lower`` to ``upper``
    (the bisections have found that there are some).

    Why the counts that can cover a prefix form a range: take cut sets ``A`` with ``p``
    runs and ``B`` with ``q > p + 1`` runs of it. Walking ``A``'s runs in order, let
    ``D_t`` be the number of ``B``'s cut points in the first ``t`` of them, minus ``t``
    (``D_0 = 0``, ``D_p = q - p``). At the first ``t`` with ``D_t >= 1``, ``A``'s run
    ``t`` holds two or more of ``B``'s cut points. From each of them but the last, a run
    to the end of ``A``'s run ``t`` is valid: inside that run (so at most ``upper``) and
    around one of ``B``'s runs (so at least ``lower`` and ``s`` items). ``B`` up to that
    point, the run, then ``A`` make cut sets of ``p + D_{t-1} + 1`` to ``p + D_t`` runs,
    ``p + 1`` among them (and a brute force over 34 million cases finds no gap). So the
    bisections ask :func:`_count_ranges` alone, and the trace
    below never fails; it still checks each run.
    """
    first, last = _windows(prefix, s, lower, upper)
    ranges = _count_ranges(first, last, k)
    cuts = None if ranges is None else _trace_ranges(first, last, *ranges, k)
    assert cuts is not None, "contiguous_partition: a count range had a gap"
    return cuts


def _count_ranges(
    first: np.ndarray, last: np.ndarray, k: int
) -> tuple[list[int], list[int]] | None:
    """Per position, the fewest and the most runs (at most ``k``) covering the items
    before it, the runs ending at ``i`` starting in ``[first[i-1], last[i-1]]``
    (:func:`_windows`); None when ``k`` is out of range at the end. Sliding-window minimum
    and maximum with monotone queues (both window ends only move right)."""
    n = first.shape[0]
    none = k + 1  # marks a position no count reaches
    fewest = [none] * (n + 1)
    most = [-1] * (n + 1)
    fewest[0] = most[0] = 0
    low_q: deque[int] = deque()  # starts by rising fewest
    high_q: deque[int] = deque()  # starts by falling most
    pushed = 0
    for i, a, b in zip(range(1, n + 1), first.tolist(), last.tolist()):
        while pushed <= b:
            if fewest[pushed] != none:
                while low_q and fewest[low_q[-1]] >= fewest[pushed]:
                    low_q.pop()
                low_q.append(pushed)
                while high_q and most[high_q[-1]] <= most[pushed]:
                    high_q.pop()
                high_q.append(pushed)
            pushed += 1
        while low_q and low_q[0] < a:
            low_q.popleft()
        while high_q and high_q[0] < a:
            high_q.popleft()
        if low_q and fewest[low_q[0]] < k:
            fewest[i] = fewest[low_q[0]] + 1
            most[i] = min(most[high_q[0]] + 1, k)
    return (fewest, most) if fewest[n] <= k <= most[n] else None


def _trace_ranges(
    first: np.ndarray, last: np.ndarray, fewest: list[int], most: list[int], k: int
) -> list[int] | None:
    """Cuts from the count ranges: from the end, the latest start whose range holds the
    count still to place; None if a range promised a count that is not there."""
    cuts = [first.shape[0]]
    i, c = cuts[0], k
    while c:
        want = c - 1
        x = next((x for x in range(int(last[i - 1]), int(first[i - 1]) - 1, -1)
                  if fewest[x] <= want <= most[x]), None)  # fmt: skip
        if x is None or (want == 0) != (x == 0):
            return None
        cuts.append(x)
        i, c = x, want
    return cuts[::-1]


def _least(bad: int, good: int, ok: Callable[[int], bool]) -> int:
    """The least integer in ``(bad, good]`` where ``ok`` holds (``ok`` monotone)."""
    while good - bad > 1:
        mid = (bad + good) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def _most(good: int, bad: int, ok: Callable[[int], bool]) -> int:
    """The greatest integer in ``[good, bad)`` where ``ok`` holds (``ok`` monotone): one
    below the least where it fails."""
    return _least(good, bad, lambda m: not ok(m)) - 1


# Non-negative float64 values sort as their bit patterns read as int64, so a bisection on
# the patterns visits every float between the ends, and ends in at most 64 steps.
def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def _value(bits: int) -> float:
    return float(np.int64(bits).view(np.float64))


def _least_float(bad: float, good: float, ok: Callable[[float], bool]) -> float:
    return _value(_least(_bits(bad), _bits(good), lambda b: ok(_value(b))))


def _most_float(good: float, bad: float, ok: Callable[[float], bool]) -> float:
    return _value(_most(_bits(good), _bits(bad), lambda b: ok(_value(b))))


def _fewest_runs(prefix: np.ndarray, upper: float, k: int) -> int:
    """Fewest runs of at most ``upper`` covering the items (``k + 1`` once above ``k``)."""
    n = prefix.shape[0] - 1
    x, runs = 0, 0
    while x < n:
        nxt = int(np.searchsorted(prefix, prefix[x] + upper, side="right")) - 1
        if nxt <= x or runs == k:  # an item above upper, or already too many runs
            return k + 1
        x, runs = nxt, runs + 1
    return runs


def _windows(
    prefix: np.ndarray, s: int, lower: float, upper: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each end ``i`` (1..n), the first and last start of a run of ``s`` or more items
    weighing between ``lower`` and ``upper``; both never move left as ``i`` grows."""
    n = prefix.shape[0] - 1
    ends = prefix[1:]
    first = np.searchsorted(prefix, ends - upper, side="left")
    last = np.searchsorted(prefix, ends - lower, side="right") - 1
    last = np.minimum(last, np.arange(1 - s, n + 1 - s))
    return first, last
