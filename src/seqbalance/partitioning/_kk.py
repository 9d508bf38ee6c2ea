"""k-way largest differencing (Karmarkar–Karp) on numpy arrays.

Units are sorted heaviest first and dealt in rounds of ``k`` into k-tuples (one unit per
slot), padding the last round with zero-weight dummies. A k-tuple is a partial partition:
``k`` subset sums, kept sorted heaviest first. The two tuples with the largest spread
(max - min) are merged by pairing the heaviest subset of one with the lightest of the
other, which cancels as much of both spreads as possible; the merge repeats until one
tuple is left. Every slot of every tuple holds one unit per round, so every part ends with
exactly ``ceil(m / k)`` slots: that is what makes the method honour "equal" and, with the
dummies dropped, "balanced". In "free" mode the same construction gives a strong start
that the refinement pass (moves) then frees from the equal counts.

Subset membership is a forest: merging subset ``b`` into subset ``a`` sets
``parent[b] = a``. Resolving the roots once at the end by pointer jumping keeps every
merge a handful of vectorised operations on length-``k`` arrays and memory at O(m + k).
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["kk_labels"]


def kk_labels(w: np.ndarray, k: int) -> np.ndarray:
    """Return a part label in ``0..k-1`` for each unit of ``w`` (float64, validated)."""
    m = int(w.shape[0])
    rounds = max(1, -(-m // k))
    slots = rounds * k
    order = np.argsort(-w, kind="stable")  # heaviest first, ties by index
    ids = np.concatenate([order, np.arange(m, slots, dtype=np.int64)])
    vals = np.concatenate([w[order], np.zeros(slots - m)])
    tup_vals: list[np.ndarray | None] = list(vals.reshape(rounds, k))
    tup_ids: list[np.ndarray | None] = list(ids.reshape(rounds, k))
    parent = np.arange(slots, dtype=np.int64)
    # Heap of (-spread, tuple number): largest spread first, older tuple on ties.
    heap = [(-(float(v[0]) - float(v[-1])), r) for r, v in enumerate(tup_vals)]  # type: ignore[index]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        va, ia, vb, ib = tup_vals[a], tup_ids[a], tup_vals[b], tup_ids[b]
        tup_vals[a] = tup_ids[a] = tup_vals[b] = tup_ids[b] = None
        merged = va + vb[::-1]  # type: ignore[index,operator]
        parent[ib[::-1]] = ia  # type: ignore[index]
        o = np.argsort(-merged, kind="stable")
        merged = merged[o]
        tup_vals.append(merged)
        tup_ids.append(ia[o])  # type: ignore[index]
        heapq.heappush(heap, (-(float(merged[0]) - float(merged[-1])), len(tup_vals) - 1))
    final = tup_ids[heap[0][1]]
    root = parent
    while True:  # pointer jumping: O(log depth) passes
        up = root[root]
        if np.array_equal(up, root):
            break
        root = up
    part_of_root = np.full(slots, -1, dtype=np.int64)
    part_of_root[final] = np.arange(k, dtype=np.int64)
    return part_of_root[root[:m]]
