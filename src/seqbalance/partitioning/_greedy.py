"""Longest processing time first (LPT), with optional count limits."""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["lpt_labels"]


def lpt_labels(w: np.ndarray, k: int, size: str) -> np.ndarray:
    """Give each unit, heaviest first, to the lightest part that may still take one.

    Under "equal" a part may take ``m / k`` units; under "balanced" ``m // k`` units, or
    one more while fewer than ``m % k`` parts have taken one more. Ties go to the lower
    part number. Returns a part label per unit.
    """
    m = int(w.shape[0])
    order = np.argsort(-w, kind="stable")
    heap = [(0.0, p) for p in range(k)]  # already a heap
    chosen: list[int] = []
    if size == "free":
        for x in w[order].tolist():
            load, p = heap[0]
            heapq.heapreplace(heap, (load + x, p))
            chosen.append(p)
    else:
        c = m // k
        extra = m % k if size == "balanced" else 0  # parts still allowed c + 1 units
        counts = [0] * k
        for x in w[order].tolist():
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
    labels = np.empty(m, dtype=np.int64)
    labels[order] = np.asarray(chosen, dtype=np.int64)
    return labels
