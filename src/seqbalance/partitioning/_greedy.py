"""Longest processing time first (LPT), with optional count limits."""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["folded_labels", "lpt_labels"]

#: A batch of the vectorised phase must place at least this many units, and at least
#: 1/``BATCH_FRACTION`` of the open parts (it costs a sort of them); below that the
#: rest goes unit by unit through a heap.
MIN_BATCH = 128
BATCH_FRACTION = 16


def lpt_labels(w: np.ndarray, k: int, size: str) -> np.ndarray:
    """Give each unit, heaviest first, to the lightest part that may still take one.

    Under "equal" a part may take ``m / k`` units; under "balanced" ``m // k`` units, or
    one more while fewer than ``m % k`` parts have taken one more. Ties go to the lower
    part number. Returns a part label per unit.

    Cost: O(m log m) for the sort, then O(m log k). The units go in batches while that is
    the same as one at a time (below), then one at a time through a heap; a heap of
    100,000s of parts is slow in Python (~1 us a unit, cache misses), and with many parts
    most units go in batches (k = 250,000, m = 10**6: ~6x faster). The labels are exactly
    those of the one-at-a-time rule.
    """
    m = int(w.shape[0])
    order = np.argsort(-w, kind="stable")
    xs = w[order]
    c = m // k
    extra = m % k if size == "balanced" else 0  # parts still allowed c + 1 units
    chosen = np.empty(m, dtype=np.int64)
    counts = np.zeros(k, dtype=np.int64)
    i, loads, parts = _batches(xs, k, size, chosen, counts, c, extra)
    if size == "balanced":
        extra -= int(np.count_nonzero(counts > c))
    if i < m:
        # (load, part) sorted lexicographically is already a valid heap.
        heap = list(zip(loads.tolist(), parts.tolist()))
        chosen[i:] = _heap_rest(xs[i:].tolist(), heap, size, counts.tolist(), c, extra)
    labels = np.empty(m, dtype=np.int64)
    labels[order] = chosen
    return labels


def _batches(
    xs: np.ndarray,
    k: int,
    size: str,
    chosen: np.ndarray,
    counts: np.ndarray,
    c: int,
    extra: int,
) -> tuple[int, np.ndarray, np.ndarray]:
    """The vectorised phase: place units ``xs`` (descending) in batches; ``chosen`` and
    ``counts`` are filled in place. Returns how many units were placed and the open parts
    as (loads, parts) sorted by (load, part).

    One at a time, unit ``i + t`` goes to the lightest open part. With the open parts
    sorted, ``(L_0, P_0) < (L_1, P_1) < ...``, units ``i, i+1, ..., i+B-1`` go to
    ``P_0, ..., P_{B-1}`` in turn as long as no part already given a unit in the batch
    becomes lighter than the next one: ``L_t < L_0 + x_{i+t-1}`` suffices for every
    ``t < B``, because ``L_s + x_{i+s} >= L_0 + x_{i+t-1}`` for ``s < t`` (loads ascend,
    units descend). Strict, so ties never need the part number. Under "balanced" a batch
    also ends where the last ``c + 1``-th unit is handed out, after which parts holding
    ``c`` units close.
    """
    m = int(xs.shape[0])
    loads = np.zeros(k, dtype=np.float64)
    parts = np.arange(k, dtype=np.int64)
    cap = m + 1 if size == "free" else c  # a part holding ``cap`` units is closed
    i = 0
    while i < m and parts.size:
        width = min(parts.size, m - i)
        fits = loads[1:width] < loads[0] + xs[i : i + width - 1]
        b = width if fits.all() else int(np.argmin(fits)) + 1
        if extra > 0:
            at_c = np.flatnonzero(counts[parts[:b]] == c)
            if at_c.size >= extra:
                b = int(at_c[extra - 1]) + 1
        if i > 0 and b < max(MIN_BATCH, parts.size // BATCH_FRACTION):
            break
        got = parts[:b]
        chosen[i : i + b] = got
        counts[got] += 1
        if extra > 0:
            extra -= int(np.count_nonzero(counts[got] > c))
        new_loads = loads[:b] + xs[i : i + b]
        i += b
        limit = cap + 1 if extra > 0 else cap
        keep = counts[got] < limit
        rest_l, rest_p = loads[b:], parts[b:]
        if size == "balanced" and extra == 0:
            open_rest = counts[rest_p] < c
            rest_l, rest_p = rest_l[open_rest], rest_p[open_rest]
        loads = np.concatenate((new_loads[keep], rest_l))
        parts = np.concatenate((got[keep], rest_p))
        srt = np.lexsort((parts, loads))
        loads, parts = loads[srt], parts[srt]
    return i, loads, parts


def _heap_rest(
    xs: list[float], heap: list[tuple[float, int]], size: str, counts: list[int], c: int,
    extra: int,
) -> list[int]:
    """One unit at a time: the lightest open part (ties: lower part number) takes it."""
    chosen: list[int] = []
    if size == "free":
        for x in xs:
            load, p = heap[0]
            heapq.heapreplace(heap, (load + x, p))
            chosen.append(p)
        return chosen
    for x in xs:
        while True:  # drop parts that became full (lazily, fullness only grows)
            load, p = heap[0]
            n_p = counts[p]
            if n_p > c or (n_p == c and extra == 0):
                heapq.heappop(heap)
                continue
            break
        n_p += 1
        counts[p] = n_p
        if n_p > c:
            extra -= 1
        chosen.append(p)
        if n_p > c or (n_p == c and extra == 0):
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (load + x, p))
    return chosen


def folded_labels(w: np.ndarray, k: int) -> np.ndarray:
    """Deal the units, heaviest first, in rows of ``k``: the first ``rows // 2`` rows to
    parts 0, 1, ..., the rest (the lighter half, and the middle row of an odd count) in
    reverse, so a part's share of heavy units is offset by light ones. Returns a part
    label per unit.

    Each row gives one unit to each of its first parts (a short last row to the lowest
    ones), so counts differ by at most one: ``m // k`` or one more, the extra units on
    parts ``0 .. m % k - 1``, which meets "balanced", and "equal" when ``k`` divides
    ``m``. O(m log m) for the sort, the rest vectorised; ties keep the input order.
    """
    m = int(w.shape[0])
    order = np.argsort(-w, kind="stable")
    pos = np.arange(m, dtype=np.int64)
    row, col = pos // k, pos % k
    width = np.minimum(k, m - row * k)  # units in each row (the last may be short)
    lighter_half = row >= (-(-m // k)) // 2
    labels = np.empty(m, dtype=np.int64)
    labels[order] = np.where(lighter_half, width - 1 - col, col)
    return labels
