"""verl's differencing, equal-count and count-free, reproduced with its tie rules (AReaL's
``_kk_partition``, slime's and OpenRLHF's copies follow the same rules).

``verl.utils.seqlen_balancing.karmarkar_karp(equal_size=True)`` sorts the values ascending
by ``(value, index)``, cuts them into consecutive blocks of ``k`` and merges block states,
largest spread first, pairing the heaviest subset of one state with the lightest of the
other. Which state goes first on equal spreads, and how subsets of equal sum are ordered
inside a state, changes the result: on 8,192 rl-math workloads verl lands 2 above the lower
bound and seqbalance's own differencing (other tie rules) 6 above. Starting the refinement
from verl's own partition makes "never heavier than verl's" hold by construction.
``equal_size=False`` starts from one state per item instead; verl's micro-batching raises
the count until that partition holds the token cap, so reproducing it gives verl's count.

The rules, as verl 0.9 applies them (all comparisons are descending):

- subsets inside a state: by sum, then number of items, then the index of the subset's
  first item (an empty subset comes last; with equal counts the length rule never
  decides);
- states: by spread (largest sum minus smallest), then by their heaviest subset's sum, its
  number of items, and the index of its first item.

The first item of a subset never changes (merging appends the other state's items), and
indices are unique, so these keys never tie and the order of merges is fully determined.
Equal to verl's partition whenever the sums are exact: int64 weights (summed as Python
ints, exact at any size) or integer-valued float64 ones whose total stays below 2**53
(checked against verl 0.9.1, AReaL 1.0.4, and slime's and OpenRLHF's copies of the
function, in ``bench/verl_kk_check.py``); with fractional weights verl adds item by item
and the two can round apart on ties.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from ._kk import resolve_roots

__all__ = ["parts_of_labels", "verl_equal_kk_labels", "verl_free_kk_labels"]


def parts_of_labels(labels: np.ndarray, k: int) -> list[list[int]]:
    """``k`` ascending index lists from one part label per item (a part may be empty)."""
    counts = np.bincount(labels, minlength=k)
    order = np.argsort(labels, kind="stable")
    return [p.tolist() for p in np.split(order, np.cumsum(counts)[:-1])]


def verl_equal_kk_labels(w: np.ndarray, k: int) -> np.ndarray:
    """A part label in ``0..k-1`` per item: verl's equal-count differencing of ``w``.

    Parameters
    ----------
    w : numpy.ndarray
        Validated float64 or int64 weights (int64: exact sums at any size); ``len(w)``
        must be a positive multiple of ``k``.
    k : int
        Number of parts (at least 1).

    Returns
    -------
    numpy.ndarray
        int64 labels; every part gets ``len(w) / k`` items. Part 0 is the heaviest at the
        end (verl's first partition), then descending.
    """
    n = int(w.shape[0])
    if k < 1 or n == 0 or n % k:
        raise ValueError(f"need a positive multiple of k={k} items, got {n}")
    ascending = np.lexsort((np.arange(n), w))
    # Each block of k, its subsets heaviest first (ties: the larger index first).
    blocks = ascending.reshape(n // k, k)[:, ::-1]
    # A state: its subsets as (sum, first item) pairs, sorted descending.
    states: list[list[tuple[float, int]] | None] = [
        list(zip(v, f)) for v, f in zip(w[blocks].tolist(), blocks.tolist())
    ]
    items = [1] * len(states)  # items per subset in each state
    # Heap keys: smaller pops first, so every descending rule is negated.
    heap = [(-(s[0][0] - s[-1][0]), -s[0][0], -1, -s[0][1], r) for r, s in enumerate(states)]  # type: ignore[index]
    heapq.heapify(heap)
    into: list[int] = []  # subset first items that absorb ...
    absorbed: list[int] = []  # ... these subsets' first items
    while len(heap) > 1:
        a = heapq.heappop(heap)[4]
        b = heapq.heappop(heap)[4]
        sa, sb = states[a], states[b]
        assert sa is not None and sb is not None
        paired = list(zip(sa, reversed(sb)))  # heaviest of a with lightest of b
        merged = sorted(((x[0] + y[0], x[1]) for x, y in paired), reverse=True)
        into.extend(x[1] for x, _ in paired)
        absorbed.extend(y[1] for _, y in paired)
        states[a], states[b] = merged, None
        items[a] += items[b]
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), -merged[0][0], -items[a],
                              -merged[0][1], a))  # fmt: skip
    final = states[heap[0][4]]
    assert final is not None
    return _labels(n, into, absorbed, [f for _, f in final])


def _labels(n: int, into: list[int], absorbed: list[int], firsts: list[int]) -> np.ndarray:
    """Part labels from the merges: subset ``absorbed[i]`` (named by its first item) went
    into ``into[i]``; ``firsts`` names the final subsets, part 0 first."""
    # Each item points at the first item of the subset that absorbed its own; the end of
    # its chain is the first item of its final subset.
    parent = np.arange(n, dtype=np.int64)
    parent[np.asarray(absorbed, dtype=np.int64)] = np.asarray(into, dtype=np.int64)
    part_of_first = np.full(n, -1, dtype=np.int64)
    part_of_first[firsts] = np.arange(len(firsts), dtype=np.int64)
    return part_of_first[resolve_roots(parent)]


def verl_free_kk_labels(
    w: np.ndarray, k: int, size: np.ndarray | None = None, size_cap: float | None = None
) -> np.ndarray | None:
    """A part label in ``0..k-1`` per item: verl's differencing of ``w`` without count
    limits (``karmarkar_karp(equal_size=False)``).

    Every item starts as a state of one non-empty subset and ``k - 1`` empty ones. verl's
    rules (descending): subsets by sum, then number of items, then first item's index (an
    empty subset is lighter than any other); states by spread, then by their heaviest
    subset. Merging pairs the i-th heaviest subset of the first state with the i-th
    lightest of the second. Only the non-empty subsets are stored, on a min-heap per state,
    and a merge touches only the smaller state's non-empty subsets and as many of the
    larger's lightest, so most merges (a state absorbing one item) cost O(log k) instead of
    verl's O(k log k).

    Parameters
    ----------
    w : numpy.ndarray
        Validated float64 or int64 weights (non-negative; int64: exact sums at any size).
    k : int
        Number of parts (at least 1).
    size, size_cap : numpy.ndarray and float, optional
        With both given, stop and return None as soon as a subset's total ``size`` exceeds
        ``size_cap``: subsets only grow, so the final partition would break it too.

    Returns
    -------
    numpy.ndarray or None
        int64 labels (part 0 the heaviest at the end, as verl's first partition; parts may
        be empty), or None when stopped by ``size_cap``.
    """
    n = int(w.shape[0])
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k == 1 or n == 0:
        if k == 1 and size is not None and size_cap is not None and float(size.sum()) > size_cap:
            return None
        return np.zeros(n, dtype=np.int64)
    vals = w.tolist()
    sizes = None
    if size is not None and size_cap is not None:
        if float(size.max()) > size_cap:  # an item alone breaks it
            return None
        sizes = size.tolist()
    # Items pop as one-item states: largest value first, then larger index.
    order = np.lexsort((-np.arange(n), -w)).tolist()
    # A state: [heap of its non-empty subsets as (sum, items, first item), heaviest one].
    states: dict[int, tuple[list[tuple[Any, int, int]], tuple[Any, int, int]]] = {}
    heap: list[tuple[Any, Any, int, int, int]] = []  # (-spread, -top sum, -items, -first, id)
    into: list[int] = []  # first items that absorb ...
    absorbed: list[int] = []  # ... these subsets' first items
    nxt = 0

    def pop() -> tuple[list[tuple[Any, int, int]], tuple[Any, int, int]]:
        nonlocal nxt
        if nxt < n:
            i = order[nxt]
            # (the item's key (-v, -v, -1, -i) against the top state's first four
            # entries, compared element by element as the tuples would be)
            v = -vals[i]
            top = heap[0] if heap else None
            if top is None or v < top[0] or (v == top[0] and (v, -1, -i) < top[1:4]):
                nxt += 1
                one = (vals[i], 1, i)
                return [one], one
        return states.pop(heapq.heappop(heap)[4])

    def join(b: tuple[Any, int, int], d: tuple[Any, int, int], d_first: bool
             ) -> tuple[Any, int, int] | None:
        """Subsets ``b`` and ``d`` (of the other state) as one, headed by the first state's
        first item; None if that breaks the size cap."""
        keep, gone = (d[2], b[2]) if d_first else (b[2], d[2])
        into.append(keep)
        absorbed.append(gone)
        if sizes is not None:
            sizes[keep] += sizes[gone]
            if sizes[keep] > size_cap:  # type: ignore[operator]
                return None
        return (b[0] + d[0], b[1] + d[1], keep)

    sid = 0
    while (n - nxt) + len(heap) > 1:
        h0, top0 = pop()
        h1, top1 = pop()
        first_is_small = len(h0) < len(h1)
        big, small, top = (h1, h0, top1) if first_is_small else (h0, h1, top0)
        empties = k - len(big)
        if len(small) == 1:  # the usual merge: one subset into the lightest (O(log k))
            d = small[0]
            if empties:
                heapq.heappush(big, d)
                new = d
            else:
                new = join(big[0], d, first_is_small)
                if new is None:
                    return None
                heapq.heapreplace(big, new)
            if new > top:
                top = new
        else:
            pairs = sorted(small, reverse=True)  # the small state's subsets, heaviest first
            lightest = [heapq.heappop(big) for _ in range(max(0, len(pairs) - empties))]
            for j, d in enumerate(pairs):
                if j < empties:  # paired with an empty subset: moves over unchanged
                    new = d
                else:
                    new = join(lightest[j - empties], d, first_is_small)
                    if new is None:
                        return None
                heapq.heappush(big, new)
                if new > top:
                    top = new
        low = big[0][0] if len(big) == k else 0
        states[sid] = (big, top)
        heapq.heappush(heap, (low - top[0], -top[0], -top[1], -top[2], sid))
        sid += 1
    final_heap = states[heap[0][4]][0] if heap else [(vals[order[0]], 1, order[0])]
    return _labels(n, into, absorbed, [f for _, _, f in sorted(final_heap, reverse=True)])
