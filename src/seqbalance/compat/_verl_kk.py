"""verl's equal-count differencing, reproduced with its tie rules (AReaL's ``_kk_partition``,
slime's and OpenRLHF's copies follow the same rules).

``verl.utils.seqlen_balancing.karmarkar_karp(equal_size=True)`` sorts the values ascending
by ``(value, index)``, cuts them into consecutive blocks of ``k`` and merges block states,
largest spread first, pairing the heaviest subset of one state with the lightest of the
other. Which state goes first on equal spreads, and how subsets of equal sum are ordered
inside a state, changes the result: on 8,192 rl-math workloads verl lands 2 above the lower
bound and seqbalance's own differencing (other tie rules) 6 above. Starting the refinement
from verl's own partition makes "never heavier than verl's" hold by construction.

The rules, as verl 0.9 applies them (all comparisons are descending):

- subsets inside a state: by sum, then by the index of the subset's first item (every
  subset of a state holds the same number of items, so verl's length rule never decides);
- states: by spread (largest sum minus smallest), then by their heaviest subset's sum, its
  number of items, and the index of its first item.

The first item of a subset never changes (merging appends the other state's items), and
indices are unique, so these keys never tie and the order of merges is fully determined.
Equal to verl's partition whenever the sums are exact, i.e. integer-valued weights whose
total stays below 2**53 (checked against verl 0.9.1, and slime's and OpenRLHF's copies of
the function, in ``bench/verl_kk_check.py``); with
fractional weights verl adds item by item and the two can round apart on ties.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from .._validate import as_weights
from ..partitioning._kk import resolve_roots
from ..partitioning.kway import Partition, partition_arrays

__all__ = ["equal_partition", "verl_equal_kk_labels"]


def equal_partition(values: Any, k: int, name: str = "values") -> Partition:
    """``partition(values, k, size="equal")``, its differencing start being verl's own.

    ``"auto"`` keeps the lightest of its refined starts, and refinement never raises the
    heaviest part, so the result is never heavier than the frameworks' equal-size
    differencing (verl, AReaL, slime, OpenRLHF). Raises ValueError for invalid weights or
    when ``len(values) % k != 0``.
    """
    return partition_arrays(as_weights(values, name), k, "equal", "auto", None, fold=True,
                            kk_start=verl_equal_kk_labels)  # fmt: skip


def verl_equal_kk_labels(w: np.ndarray, k: int) -> np.ndarray:
    """A part label in ``0..k-1`` per item: verl's equal-count differencing of ``w``.

    Parameters
    ----------
    w : numpy.ndarray
        Validated float64 weights; ``len(w)`` must be a positive multiple of ``k``.
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
    # Each item points at the first item of the subset that absorbed its own; the end of
    # its chain is the first item of its final subset.
    parent = np.arange(n, dtype=np.int64)
    parent[np.asarray(absorbed, dtype=np.int64)] = np.asarray(into, dtype=np.int64)
    root = resolve_roots(parent)
    part_of_first = np.full(n, -1, dtype=np.int64)
    part_of_first[[f for _, f in final]] = np.arange(k, dtype=np.int64)
    return part_of_first[root]
