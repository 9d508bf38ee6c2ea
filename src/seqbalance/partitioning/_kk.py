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

__all__ = ["kk_free_labels", "kk_labels", "resolve_roots"]


def resolve_roots(parent: np.ndarray) -> np.ndarray:
    """The root of every node of a forest given as parent pointers (roots point to
    themselves), by pointer jumping: O(log depth) vectorised passes."""
    root = parent
    while True:
        up = root[root]
        if np.array_equal(up, root):
            return root
        root = up


# Up to this many parts a tuple is merged as Python lists: numpy's per-call overhead
# (several array operations a merge) outweighs the work on so few values. Both paths
# make the same float64 sums and the same stable descending sorts, so the labels are
# identical.
_LIST_MAX_PARTS = 16


def kk_labels(w: np.ndarray, k: int) -> np.ndarray:
    """Return a part label in ``0..k-1`` for each unit of ``w`` (float64, validated)."""
    m = int(w.shape[0])
    rounds = max(1, -(-m // k))
    slots = rounds * k
    order = np.argsort(-w, kind="stable")  # heaviest first, ties by index
    if k <= _LIST_MAX_PARTS:
        return _kk_labels_lists(w, k, m, rounds, slots, order)
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
    root = resolve_roots(parent)
    part_of_root = np.full(slots, -1, dtype=np.int64)
    part_of_root[final] = np.arange(k, dtype=np.int64)
    return part_of_root[root[:m]]


def _kk_labels_lists(
    w: np.ndarray, k: int, m: int, rounds: int, slots: int, order: np.ndarray
) -> np.ndarray:
    """:func:`kk_labels` for few parts, each tuple a pair of Python lists."""
    ids = order.tolist() + list(range(m, slots))
    vals = w[order].tolist() + [0.0] * (slots - m)
    tup_vals: list[list[float] | None] = [vals[r * k : (r + 1) * k] for r in range(rounds)]
    tup_ids: list[list[int] | None] = [ids[r * k : (r + 1) * k] for r in range(rounds)]
    parent = list(range(slots))
    heap = [(-(v[0] - v[-1]), r) for r, v in enumerate(tup_vals)]  # type: ignore[index]
    heapq.heapify(heap)
    span = range(k)
    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        va, ia, vb, ib = tup_vals[a], tup_ids[a], tup_vals[b], tup_ids[b]
        assert va is not None and ia is not None and vb is not None and ib is not None
        tup_vals[a] = tup_ids[a] = tup_vals[b] = tup_ids[b] = None
        merged = [x + y for x, y in zip(va, reversed(vb))]
        for x, y in zip(ia, reversed(ib)):
            parent[y] = x
        o = sorted(span, key=merged.__getitem__, reverse=True)  # stable: ties keep order
        merged = [merged[i] for i in o]
        tup_vals.append(merged)
        tup_ids.append([ia[i] for i in o])
        heapq.heappush(heap, (-(merged[0] - merged[-1]), len(tup_vals) - 1))
    final = tup_ids[heap[0][1]]
    root = resolve_roots(np.asarray(parent, dtype=np.int64))
    part_of_root = np.full(slots, -1, dtype=np.int64)
    part_of_root[np.asarray(final, dtype=np.int64)] = np.arange(k, dtype=np.int64)
    return part_of_root[root[:m]]


def kk_free_labels(w: np.ndarray, k: int) -> np.ndarray:
    """k-way largest differencing without count limits (the classic Karmarkar–Karp).

    Every unit starts as its own k-tuple ``(w, 0, ..., 0)`` with spread ``w``; the two
    tuples with the largest spreads are merged (heaviest subset of one with the lightest
    of the other) until one is left. Parts may end with any number of units.

    Singletons are not materialised: they wait in weight order and only become length-k
    arrays when merged, so memory is O(m + k * live tuples). A merge with a singleton
    costs O(k) (one insertion into a sorted array), a merge of two tuples O(k log k);
    there are ``m - 1`` merges, so time is O(m k) in the worst case and O(m log m + m k)
    with small constants in practice. Ties go to the older tuple, so the result is
    deterministic.
    """
    m = int(w.shape[0])
    labels = np.zeros(m, dtype=np.int64)
    if m == 0 or k == 1:
        return labels
    order = np.argsort(-w, kind="stable")
    s = w[order].tolist()
    ids = order.tolist()
    parent = np.arange(m, dtype=np.int64)
    # Materialised tuples: values sorted heaviest first and one representative unit per
    # subset (-1 for an empty subset).
    vals: dict[int, np.ndarray] = {}
    reps: dict[int, np.ndarray] = {}
    heap: list[tuple[float, int]] = []  # (-spread, tuple number)
    tick = 0
    nxt = 0  # next singleton (position in weight order)

    def pop() -> tuple[str, int]:
        nonlocal nxt
        # Largest spread first; a tuple beats a singleton of the same spread (older).
        if heap and (nxt >= m or -heap[0][0] >= s[nxt]):
            return "t", heapq.heappop(heap)[1]
        nxt += 1
        return "s", nxt - 1

    def as_tuple(kind: str, x: int) -> tuple[np.ndarray, np.ndarray]:
        if kind == "t":
            return vals.pop(x), reps.pop(x)
        v = np.zeros(k)
        r = np.full(k, -1, dtype=np.int64)
        v[0], r[0] = s[x], ids[x]
        return v, r

    while True:
        remaining = len(heap) + (m - nxt)
        if remaining <= 1:
            break
        ka, xa = pop()
        kb, xb = pop()
        if kb == "s" and ka == "t":
            va, ra = vals.pop(xa), reps.pop(xa)
            unit = ids[xb]
            x = s[xb]
            # The singleton's unit joins the lightest subset; its k-1 empty subsets pair
            # with the others, which keep their values.
            if ra[-1] >= 0:
                parent[unit] = ra[-1]
                rep = int(ra[-1])
            else:
                rep = unit
            new = float(va[-1]) + x
            pos = int(np.searchsorted(-va[:-1], -new, side="right"))
            v = np.concatenate((va[:pos], [new], va[pos:-1]))
            r = np.concatenate((ra[:pos], [rep], ra[pos:-1]))
        else:
            va, ra = as_tuple(ka, xa)
            vb, rb = as_tuple(kb, xb)
            merged = va + vb[::-1]
            rb = rb[::-1]
            both = (ra >= 0) & (rb >= 0)
            parent[rb[both]] = ra[both]
            r0 = np.where(ra >= 0, ra, rb)
            o = np.argsort(-merged, kind="stable")
            v, r = merged[o], r0[o]
        vals[tick], reps[tick] = v, r
        heapq.heappush(heap, (-(float(v[0]) - float(v[-1])), tick))
        tick += 1
    if heap:
        final = reps[heap[0][1]]
    else:  # a single unit
        final = np.full(k, -1, dtype=np.int64)
        final[0] = ids[0]
    root = resolve_roots(parent)
    part_of_root = np.full(m, -1, dtype=np.int64)
    have = final >= 0
    part_of_root[final[have]] = np.flatnonzero(have)
    return part_of_root[root]
