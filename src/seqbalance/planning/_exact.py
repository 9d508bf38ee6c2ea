"""Exact packing for small inputs: bounded depth-first branch and bound.

Two searches, both deterministic and bounded by a node budget:

- :func:`pack_exact`: do ``n`` items fit into ``nbins`` bins of ``cap`` tokens (packed:
  sum; padded: count x longest)? Packed bins are filled one at a time (bin completion,
  :func:`_bin_completion`). Padded bins are filled item by item in decreasing length: an
  item tries each bin whose load differs from the bins already tried for it (bins with
  equal loads are interchangeable, so trying one covers all), and a branch stops when the
  remaining tokens exceed the room left in bins that can still take the smallest
  remaining item.
- :func:`pack_ranked_exact`: the same question when bins belong to ranks (``m`` per rank)
  and ranks obey a rule: a count of units per rank in ``[lo, hi]`` (a unit is a group, or
  one sequence without groups), whole groups per rank, and at least ``need`` sequences per
  rank (so no micro-batch is empty). Units go to ranks depth first (ranks with the same
  contents are interchangeable); each complete assignment is checked with
  :func:`pack_exact` per rank.

Both return ``(bins, status)`` with status ``"found"``, ``"infeasible"`` (the whole tree
was searched: a proof that no packing exists) or ``"limit"`` (the budget ran out first).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..partitioning.searches import exact_searches_enabled, spend_nodes, take_nodes
from .bounds import min_bins

__all__ = ["FAST_NODE_LIMIT", "NODE_LIMIT", "pack_exact", "pack_ranked_exact"]

NODE_LIMIT = 200_000  # search nodes per call: a few tenths of a second in the worst case
#: Inside ``exact_searches(False)`` (:mod:`seqbalance.partitioning.searches`) a call gets at
#: most this many nodes (~20 ms): packings that exist are mostly found within it, while
#: proofs that none exists, which need the whole tree, are given up.
FAST_NODE_LIMIT = 10_000


def _limit(node_limit: int) -> int:
    return node_limit if exact_searches_enabled() else min(node_limit, FAST_NODE_LIMIT)


class _OutOfBudget(Exception):
    pass


class _Budget:
    """Search nodes left; taken from (and, by :meth:`close`, charged to) the request's
    pool of exact-search nodes, if any (:func:`..partitioning.searches.exact_work_pool`)."""

    def __init__(self, nodes: int) -> None:
        self.left = self.given = take_nodes(nodes)

    def close(self) -> None:
        spend_nodes(self.given - max(self.left, 0))

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget


def _dfs_bins(
    order: list[int], t: Sequence[int], nbins: int, cap: int, padded: bool, budget: _Budget
) -> list[list[int]] | None:
    """Place ``order`` (decreasing length) into ``nbins`` bins, or None if impossible."""
    lens = [int(t[i]) for i in order]
    suffix = [0] * (len(lens) + 1)
    for k in range(len(lens) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + lens[k]
    load = [0] * nbins  # packed: tokens; padded: count x first (= longest) item
    count = [0] * nbins
    first = [0] * nbins
    items: list[list[int]] = [[] for _ in range(nbins)]

    def fits(b: int, length: int) -> bool:
        if padded:
            longest = first[b] if count[b] else length
            return (count[b] + 1) * longest <= cap
        return load[b] + length <= cap

    def go(k: int) -> bool:
        if k == len(lens):
            return True
        budget.spend()
        length = lens[k]
        if not padded:
            smallest = lens[-1]
            room = sum(cap - x for x in load if cap - x >= smallest)
            if suffix[k] > room:
                return False
        tried = set()
        for b in range(nbins):
            key = (load[b], count[b]) if padded else load[b]
            if key in tried or not fits(b, length):
                continue
            tried.add(key)
            if count[b] == 0:
                first[b] = length
            count[b] += 1
            load[b] = count[b] * first[b] if padded else load[b] + length
            items[b].append(order[k])
            if go(k + 1):
                return True
            items[b].pop()
            count[b] -= 1
            load[b] = count[b] * first[b] if padded else load[b] - length
        return False

    return items if go(0) else None


def _bin_completion(
    order: list[int], t: Sequence[int], nbins: int, cap: int, budget: _Budget
) -> list[list[int]] | None:
    """Packed bins filled one at a time (Korf's bin completion), or None if impossible.

    The largest remaining item must sit in some bin: let the next bin be that one, and try
    every set of other remaining items that fits beside it, least wasted room first. The
    room left unused in closed bins can total at most ``nbins * cap - sum``, which prunes
    hard exactly where greedy packing fails (bins that must be nearly full). Failed states
    (the multiset of remaining lengths, bins left) are remembered.
    """
    lens = [int(t[i]) for i in order]  # decreasing
    total = sum(lens)
    failed: set[tuple[tuple[int, ...], int]] = set()

    def subsets(rest: list[int], room: int, min_sum: int) -> list[tuple[int, list[int]]]:
        """(waste, positions into rest) of subsets of ``rest`` with min_sum <= sum <= room."""
        out: list[tuple[int, list[int]]] = []
        chosen: list[int] = []

        def grow(start: int, acc: int) -> None:
            budget.spend()
            if acc >= min_sum:
                out.append((room - acc, list(chosen)))
            prev = -1
            for k in range(start, len(rest)):
                length = lens[rest[k]]
                if length == prev or acc + length > room:
                    continue  # equal lengths give the same bins; too long does not fit
                prev = length
                chosen.append(k)
                grow(k + 1, acc + length)
                chosen.pop()

        grow(0, 0)
        out.sort(key=lambda x: (x[0], x[1]))
        return out

    def fill(rest: list[int], bins_left: int, waste_left: int) -> list[list[int]] | None:
        if not rest:
            return []
        if bins_left == 0:
            return None
        key = (tuple(lens[k] for k in rest), bins_left)
        if key in failed:
            return None
        budget.spend()
        first, others = rest[0], rest[1:]
        room = cap - lens[first]
        for waste, pick in subsets(others, room, room - waste_left):
            taken = set(pick)
            left = [k for j, k in enumerate(others) if j not in taken]
            tail = fill(left, bins_left - 1, waste_left - waste)
            if tail is not None:
                return [[order[first], *(order[others[j]] for j in pick)], *tail]
        failed.add(key)
        return None

    bins = fill(list(range(len(lens))), nbins, nbins * cap - total)
    if bins is None:
        return None
    return bins + [[] for _ in range(nbins - len(bins))]


def _bin_completion_any(order, t, nbins, cap, padded, budget):  # same signature as _dfs_bins
    return _bin_completion(order, t, nbins, cap, budget)


def pack_exact(
    t: Sequence[int], nbins: int, cap: int, *, padded: bool = False, node_limit: int = NODE_LIMIT
) -> tuple[list[list[int]] | None, str]:
    """Items ``t`` (each ``<= cap``) into exactly ``nbins`` bins, or why not.

    Returns ``(bins, "found")`` with positions into ``t`` (some bins may be empty),
    ``(None, "infeasible")`` when the full search found none, ``(None, "limit")`` when the
    node budget ran out.
    """
    order = sorted(range(len(t)), key=lambda i: (-int(t[i]), i))
    if nbins < 1:
        return (None, "infeasible") if order else ([], "found")
    if order and min_bins(np.asarray(t, dtype=np.int64), cap) > nbins:
        return None, "infeasible"  # the bin-packing bound already rules it out
    budget = _Budget(_limit(node_limit))
    try:
        search = _dfs_bins if padded else _bin_completion_any
        bins = search(order, t, nbins, cap, padded, budget)
    except _OutOfBudget:
        return None, "limit"
    finally:
        budget.close()
    return (bins, "found") if bins is not None else (None, "infeasible")


def pack_ranked_exact(
    t: Sequence[int],
    units: list[list[int]],
    dp: int,
    m: int,
    cap: int,
    *,
    lo: int,
    hi: int,
    need: int,
    padded: bool = False,
    node_limit: int = NODE_LIMIT,
) -> tuple[list[list[list[int]]] | None, str]:
    """Units (lists of positions into ``t``) to ``dp`` ranks, each packed into ``m`` bins.

    Every rank receives between ``lo`` and ``hi`` units and at least ``need`` items; its
    items must fit ``m`` bins of ``cap``. Returns ``(ranks, status)`` with
    ``ranks[r][j]`` the positions in rank ``r``'s bin ``j``.
    """
    budget = _Budget(_limit(node_limit))
    tok = [sum(int(t[i]) for i in u) for u in units]
    order = sorted(range(len(units)), key=lambda u: (-tok[u], -len(units[u]), u))
    suffix = [0] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + tok[order[k]]
    rank_tok = [0] * dp
    rank_cnt = [0] * dp
    rank_items: list[list[int]] = [[] for _ in range(dp)]
    cache: dict[tuple[int, ...], bool] = {}

    def rank_packs(r: int) -> list[list[int]] | None:
        items = rank_items[r]
        key = tuple(sorted(int(t[i]) for i in items))
        if cache.get(key) is False:
            return None
        order_r = sorted(items, key=lambda i: (-int(t[i]), i))
        search = _dfs_bins if padded else _bin_completion_any
        bins = search(order_r, t, m, cap, padded, budget)
        cache[key] = bins is not None
        return bins

    result: list[list[list[int]]] = []

    def go(k: int) -> bool:
        budget.spend()
        if k == len(order):
            if any(c < lo for c in rank_cnt) or any(len(x) < need for x in rank_items):
                return False
            packed = []
            for r in range(dp):
                bins = rank_packs(r)
                if bins is None:
                    return False
                packed.append(bins)
            result.extend(packed)
            return True
        if sum(max(0, lo - c) for c in rank_cnt) > len(order) - k:
            return False
        if not padded and suffix[k] > sum(m * cap - x for x in rank_tok):
            return False
        u = order[k]
        tried = set()
        for r in range(dp):
            key = (rank_tok[r], rank_cnt[r], tuple(sorted(int(t[i]) for i in rank_items[r])))
            if key in tried or rank_cnt[r] >= hi:
                continue
            if not padded and rank_tok[r] + tok[u] > m * cap:
                continue
            tried.add(key)
            rank_tok[r] += tok[u]
            rank_cnt[r] += 1
            rank_items[r].extend(units[u])
            if go(k + 1):
                return True
            del rank_items[r][-len(units[u]) :]
            rank_cnt[r] -= 1
            rank_tok[r] -= tok[u]
        return False

    try:
        ok = go(0)
    except _OutOfBudget:
        return None, "limit"
    finally:
        budget.close()
    return (result, "found") if ok else (None, "infeasible")
