"""Contiguous partitions: cut a sequence into ``k`` consecutive runs.

Where order must be kept (micro-batches that follow the data order, layers over pipeline
stages), a partition can only choose where to cut. :func:`contiguous_partition` chooses
the cuts that make the heaviest run as light as possible, and among those the lightest
run as heavy as possible, so the spread between runs is as small as the heaviest run
allows. Both optima are exact.

How: with non-negative weights and prefix sums ``P``, the runs ending at item ``i`` that
weigh between ``L`` and ``U`` start in one window of positions ``[a_i, b_i]``, and both
ends of the window only move right as ``i`` grows. So one pass with a sliding window
finds every run count that can end at each ``i`` (one bitmask per position), and a
bisection on ``U``, then on ``L``, finds the optima. With at least one item a run and no
lower limit, the fewest runs under ``U`` come from greedy jumps instead, and every count
from there up to ``n`` is reachable (a run of two or more items can always be split).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._validate import as_weights, check_nonnegative_int, check_positive_int
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
    weights, up to 64 steps for fractional ones), each step one pass over the items;
    the second bisection runs the windowed pass in Python, about 2-3 µs an item a step.
    Integer weights totalling below 2**53 are exact; fractional sums may round in the
    last bit.

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
    used = min(k, n) if min_size == 0 else k  # empty runs only where items run out
    cuts = _cuts(w, used, max(min_size, 1)) if used else [0]
    cuts += [n] * (k - used)
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    c = np.asarray(cuts, dtype=np.int64)
    loads = prefix[c[1:]] - prefix[c[:-1]]
    parts = [list(range(cuts[j], cuts[j + 1])) for j in range(k)]
    return Partition(parts, loads, float(loads.max()) if k else 0.0, "contiguous", True)


def _cuts(w: np.ndarray, k: int, s: int) -> list[int]:
    """``k + 1`` cut positions (0 first, ``n`` last), runs of at least ``s`` items."""
    n = int(w.shape[0])
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    total = float(prefix[-1])
    if k == 1:
        return [0, n]
    if total == 0.0:  # every cut is optimal: equal counts, the extra items first
        q, r = divmod(n, k)
        return [j * q + min(j, r) for j in range(k + 1)]
    exact = total < 2.0**53 and bool(np.all(w == np.floor(w)))
    bound = max(float(w.max()), total / k)  # no run can be lighter than this

    def fits_upper(u: float) -> bool:
        if s == 1:
            return _fewest_runs(prefix, u, k) <= k
        return _reach(prefix, k, s, 0.0, u) is not None

    if exact:
        upper = float(_least(int(bound) - 1, int(total), lambda v: fits_upper(v)))
    else:
        upper = _least_float(bound * (1 - 1e-9), total, fits_upper)
    while _reach(prefix, k, s, 0.0, upper) is None:  # float rounding between the checks
        upper = float(np.nextafter(upper, np.inf))

    def fits_lower(low: float) -> bool:
        return _reach(prefix, k, s, low, upper) is not None

    mean = total / k
    if exact:
        lower = float(_most(0, int(mean) + 1, lambda v: fits_lower(v)))
    else:
        lower = _most_float(0.0, mean * (1 + 1e-9), fits_lower)
    reach = _reach(prefix, k, s, lower, upper)
    assert reach is not None
    return _trace(prefix, reach, k, s, lower, upper)


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
    """The greatest integer in ``[good, bad)`` where ``ok`` holds (``ok`` monotone)."""
    while bad - good > 1:
        mid = (bad + good) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


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


def _reach(prefix: np.ndarray, k: int, s: int, lower: float, upper: float) -> list[int] | None:
    """Per position ``i``, a bitmask of the run counts (up to ``k``) that can cover items
    ``0..i-1`` with runs of ``s`` or more items weighing between ``lower`` and ``upper``;
    None when ``k`` runs cannot cover them all.

    The window OR is a queue of two stacks: new starts are pushed on the back, the oldest
    leave from the front, and each keeps the OR of what it holds (O(1) amortised a step).
    """
    n = prefix.shape[0] - 1
    first, last = _windows(prefix, s, lower, upper)
    mask = (1 << (k + 1)) - 1
    reach = [0] * (n + 1)
    reach[0] = 1
    front_x: list[int] = []  # oldest on top
    front_or: list[int] = []  # front_or[j]: OR of reach over front_x[0..j]
    back_x: list[int] = []
    back_or = 0
    pushed = 0  # the next start to enter the window
    for i, a, b in zip(range(1, n + 1), first.tolist(), last.tolist()):
        if pushed < a:  # every start queued lies left of a: drop them, skip to a
            front_x.clear()
            front_or.clear()
            back_x, back_or, pushed = [], 0, a
        while pushed <= b:
            back_x.append(pushed)
            back_or |= reach[pushed]
            pushed += 1
        while True:  # drop starts left of a from the front
            if not front_x and back_x:
                acc = 0
                for x in reversed(back_x):
                    acc |= reach[x]
                    front_x.append(x)
                    front_or.append(acc)
                back_x, back_or = [], 0
            if front_x and front_x[-1] < a:
                front_x.pop()
                front_or.pop()
                continue
            break
        if a <= b:
            seen = (front_or[-1] if front_or else 0) | back_or
            reach[i] = (seen << 1) & mask
    return reach if (reach[n] >> k) & 1 else None


def _trace(
    prefix: np.ndarray, reach: list[int], k: int, s: int, lower: float, upper: float
) -> list[int]:
    """Cut positions from the reach masks: from the end, the latest start that leaves a
    reachable count for the items before it."""
    first, last = _windows(prefix, s, lower, upper)
    cuts = [prefix.shape[0] - 1]
    i, c = cuts[0], k
    while c:
        bit = 1 << (c - 1)
        x = next(x for x in range(int(last[i - 1]), int(first[i - 1]) - 1, -1) if reach[x] & bit)
        cuts.append(x)
        i, c = x, c - 1
    return cuts[::-1]
