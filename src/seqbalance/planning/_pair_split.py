"""Lower the FSDP step of a grid by splitting the sequences of two micro-batches anew.

Under FSDP a step costs ``sum_j max_r cost(r, j)``. Slack filling (:mod:`._slots`) moves
one sequence, or swaps one for one, between the heaviest micro-batch of a slot and a
micro-batch of another slot; evening out a slot (:mod:`._slot_balance`) does the same
inside it. Where micro-batches hold a few sequences each, what lowers a slot is often an
exchange of two for one or two for two, which neither step can make. Here the heaviest
micro-batch ``a`` of a slot and one other micro-batch ``b`` pool their sequences and split
them again, every way: the split that lowers the sum of the two slots' levels most (or
the one slot's level, when ``a`` and ``b`` share it) within the token cap, neither left
empty. The partners ``b`` are scanned together: the ``_PARTNERS`` with the most to gain
(what ``a``'s slot can fall, capped by how far ``b`` sits below its own slot's level),
among those that pool at most ``_MAX_POOL`` sequences with ``a``.

Slots are taken by level, highest first; a step is taken as soon as a slot has one, and
a slot where none was found is not searched again until a step changes it. The search
ends when no slot has a step, when ``sum_j max_r`` is at most ``stop_at``, when its work
(splits scanned, in elements, never in time) is spent, or, with a ``stop_at``, once the
gain per element so far says the work left cannot reach it.

On 64 rl-math sequences over 8 ranks in 2 slots (Qwen2.5-7B FLOPs cost), where slack
filling and evening out leave the plan 0.21% above the partition bound, this brings it
to 0.07% (0.09% where it stops at the default effort's stop gap, in about 2 ms).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ._grouping import bin_summer
from ._work import charge

__all__ = ["resplit_pairs"]

Grid = list[list[list[int]]]

# The most sequences two micro-batches may pool: every split of them is scanned, 2**pool
# per partner.
_MAX_POOL = 9
# The most partners one top bin is scanned with: the bins with the most to gain.
_PARTNERS = 8
# Elements (partners x splits x (pooled sequences + 8), plus _SCAN_ELEMENTS a scan) one
# call may scan.
_WORK = 4e6
# Top bins scanned after which a pass with a ``stop_at`` that has found a step forecasts
# whether it can get there.
_FORECAST_SCANS = 8
# What the pass costs beside the splits, in elements of about 1.7 ns: a scan's numpy calls
# (about 100 us), its passes over every bin, and the setup's per sequence (measured from 64
# sequences over 8 ranks to 32,768 over 512).
_SCAN_ELEMENTS = 60_000
_BIN_ELEMENTS = 40
_SEQUENCE_ELEMENTS = 60
# Elements per unit of the request's work meter (a unit is about 25 us).
_ELEMENTS_PER_UNIT = 15_000


def resplit_pairs(
    grid: Grid,
    costs: np.ndarray,
    lengths: np.ndarray,
    cap: int,
    *,
    stop_at: float | None = None,
    work: float = _WORK,
) -> Grid:
    """``grid`` (``[rank][slot] -> indices``) with pairs of micro-batches split anew.

    Returns a new grid with a ``sum_j max_r`` at most ``grid``'s (module docstring), no
    micro-batch over ``cap`` tokens that was not over it before, none emptied; a
    sequence may change rank and slot. ``stop_at``: stop once ``sum_j max_r`` is at most
    this. ``work``: the scans' budget in elements.

    Examples
    --------
    >>> lens = np.array([5, 4, 3, 3, 3, 2])
    >>> c = lens.astype(float)
    >>> resplit_pairs([[[0, 1], [4]], [[2, 3], [5]]], c, lens, 8)  # 9 + 3 -> 7 + 3
    [[[0, 5], [4]], [[1, 3], [2]]]
    """
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    out = [[list(mb) for mb in rank] for rank in grid]
    if dp * m < 2:
        return out
    items = [out[r][j] for j in range(m) for r in range(dp)]  # bin b = j * dp + r
    sums = bin_summer(items)
    cost = sums(costs).astype(np.float64)
    by_slot = cost.reshape(m, dp)  # (a view: follows `cost`)
    size = np.fromiter((len(b) for b in items), dtype=np.int64, count=dp * m)
    stuck = np.zeros(m, dtype=bool)
    # (the setup's copies and sums, and each scan's per-bin passes, in elements too)
    scanned = _SEQUENCE_ELEMENTS * int(size.sum()) + _BIN_ELEMENTS * dp * m
    budget = float(work) - scanned
    tiny = 1e-12 * max(float(cost.max(initial=0.0)), 1e-300)
    start = float(by_slot.max(axis=1).sum())
    scans = steps = 0  # top bins scanned, steps taken

    def hopeless(now: float) -> bool:
        # Once a step was found: at the rate so far (gain per element scanned, which slows
        # down as the easy splits are taken) the budget left would not reach stop_at, and
        # the caller keeps the grid only if it does. (Before the first step every slot
        # is scanned once: a slot low in the order may still have one.)
        return (stop_at is not None and steps > 0 and scans >= _FORECAST_SCANS
                and (start - now) * budget < (now - stop_at) * scanned)  # fmt: skip

    while budget > 0:
        # (the slots' levels are what every scan of this step reads: by_slot changes only
        # when a step is taken)
        stats = _slot_stats(by_slot)
        level = stats[1]
        now = float(level.sum())
        if stop_at is not None and now <= stop_at:
            break
        step = None
        for j in np.lexsort((np.arange(m), -level)).tolist():
            if stuck[j]:
                continue
            if budget <= 0 or hopeless(now):
                budget = 0.0
                break
            a = j * dp + int(stats[0][j, 0])  # (its costliest bin; ties: the lowest rank)
            step, spent = _best_split(a, items, size, cost, by_slot, stats, costs,
                                      lengths, cap, tiny)  # fmt: skip
            budget -= spent
            scanned += spent
            scans += 1
            if step is not None:
                break
            stuck[j] = True
        if step is None:
            break
        b, to_a, to_b = step
        a_items = items[a]
        pool = a_items + items[b]
        a_items[:] = [pool[q] for q in to_a]
        items[b][:] = [pool[q] for q in to_b]
        for x in (a, b):
            idx = np.asarray(items[x], dtype=np.int64)
            cost[x] = float(np.add.reduce(costs[idx].astype(np.float64)))
            size[x] = idx.size
        stuck[a // dp] = stuck[b // dp] = False
        steps += 1
    charge(scanned // _ELEMENTS_PER_UNIT)
    for rank in out:
        for mb in rank:
            mb.sort()
    return out


def _slot_stats(by_slot: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per slot (rows of ``by_slot``, ``[slot][rank]`` costs): its bins costliest first, its
    level and second-highest cost; per bin, the level its slot keeps without it (the
    second for the costliest bin, the level for every other)."""
    m, dp = by_slot.shape
    order = np.argsort(-by_slot, axis=1, kind="stable")
    slots = np.arange(m)
    top1 = by_slot[slots, order[:, 0]]
    top2 = by_slot[slots, order[:, 1]] if dp > 1 else np.zeros(m)
    first = order[:, 0] + slots * dp
    slot_of = np.arange(m * dp) // dp
    without = np.where(np.arange(m * dp) == first[slot_of], top2[slot_of], top1[slot_of])
    return order, top1, top2, without


def _best_split(a, items, size, cost, by_slot, stats, costs, lengths, cap, tiny):
    """The best new split of top bin ``a`` and another bin (module docstring):
    ``((b, positions for a, positions for b), elements scanned)``, or ``(None, scanned)``.
    Positions index ``items[a] + items[b]``. Ties: the first bin, then the first split.
    ``stats``: :func:`_slot_stats` of ``by_slot``."""
    nbins = cost.size
    dp = by_slot.shape[1]
    ja = a // dp
    order, top1, top2, without = stats
    slot_of = np.arange(nbins) // dp
    shed = top1[ja] - top2[ja]  # the most a's slot can fall
    # What a split with bin b can gain at most: what a's slot can fall, and no more than b
    # can take below its own slot's level (half the difference, in a's slot).
    room = np.where(slot_of == ja, (cost[a] - cost) / 2.0, without - cost)
    gain_most = np.minimum(shed, room)
    fits = (size + size[a] <= _MAX_POOL) & (gain_most > tiny)
    fits[a] = False
    partners = np.flatnonzero(fits)
    if partners.size == 0 or size[a] == 0:
        return None, _SCAN_ELEMENTS + _BIN_ELEMENTS * nbins
    if partners.size > _PARTNERS:
        # the bins with the most to gain (ties: the lower bin)
        partners = np.sort(partners[np.lexsort((partners, -gain_most[partners]))[:_PARTNERS]])
    k = int(size[a] + size[partners].max())
    npart = partners.size
    # Each partner's pool, a's sequences first, padded with cost 0 and no tokens: costs in
    # pool[0], tokens in pool[1] (as floats: integers below 2**53 stay exact).
    pool = np.zeros((2, npart, k))
    ia = np.asarray(items[a], dtype=np.int64)
    na = ia.size
    pool[0, :, :na] = costs[ia]
    pool[1, :, :na] = lengths[ia]
    per = size[partners]
    flat = np.fromiter(chain.from_iterable(items[b] for b in partners.tolist()),
                       dtype=np.int64, count=int(per.sum()))  # fmt: skip
    row = np.repeat(np.arange(npart), per)
    col = na + np.arange(flat.size) - np.repeat(np.cumsum(per) - per, per)
    pool[0, row, col] = costs[flat]
    pool[1, row, col] = lengths[flat]
    # Split s gives a the pooled positions whose bit is set in s; the rest go to b. The
    # sums double one position at a time (the splits with bit q are those without it plus
    # position q), so each is added in position order, the same on every rank.
    sums = np.zeros((2, npart, 1 << k))
    for q in range(k):
        half = 1 << q
        np.add(sums[:, :, :half], pool[:, :, q, None], out=sums[:, :, half : 2 * half])
    x, t = sums[0], sums[1]
    splits = np.arange(1 << k)
    whole = (1 << (na + size[partners])) - 1  # each partner's full split
    total_cost = x[np.arange(npart), whole]
    total_tok = t[np.arange(npart), whole]
    ok = (splits[None, :] < whole[:, None] + 1) & (splits[None, :] > 0)
    ok &= splits[None, :] != whole[:, None]  # neither left empty
    ok &= (t <= cap) & (total_tok[:, None] - t <= cap)
    # The levels the two slots keep without a and b.
    jb = partners // dp
    same = jb == ja
    top3 = by_slot[ja, order[ja, 2]] if dp > 2 else 0.0
    second = order[ja, 1] + ja * dp if dp > 1 else -1
    rest_a = np.where(same & (partners == second), top3, top2[ja])
    rest_b = without[partners]
    level_a = top1[ja]
    b_side = total_cost[:, None] - x
    new = np.where(
        same[:, None],
        np.maximum(rest_a[:, None], np.maximum(x, b_side)),
        np.maximum(rest_a[:, None], x) + np.maximum(rest_b[:, None], b_side),
    )
    old = np.where(same, level_a, level_a + top1[jb])
    gain = np.where(ok, old[:, None] - new, 0.0)
    scanned = npart * (1 << k) * (k + 8) + _SCAN_ELEMENTS + _BIN_ELEMENTS * nbins
    at = int(np.argmax(gain))
    if gain.flat[at] <= tiny:
        return None, scanned
    p, s = divmod(at, 1 << k)
    n_pool = int(na + size[partners[p]])
    to_a = [q for q in range(n_pool) if s >> q & 1]
    to_b = [q for q in range(n_pool) if not s >> q & 1]
    return (int(partners[p]), to_a, to_b), scanned
