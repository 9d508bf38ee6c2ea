"""Slot-first FSDP plans: each slot's sequences are chosen first, then split over the ranks.

Under FSDP a step costs ``sum_j max_r cost(r, j)``, and ``sum_j mean_r cost(r, j)`` is the
partition bound whatever the slots hold: the step is above the bound by exactly the
slots' spreads (each slot's heaviest micro-batch above its mean). The packers even out
every micro-batch around the mean bin, which a quadratic cost does not allow where the
token cap binds: a micro-batch full of long sequences costs more per token than one full
of short ones, so full micro-batches spread in cost, and the slots dealt from them (the
costliest ``dp`` together, and so on) keep part of that spread.

This plan builds the slots instead, so that every slot can be split evenly:

1. The sequences, longest first (ties: lower index), are cut into bands of ``dp``: nearly
   equal lengths, one for each rank (the last band may be short).
2. Bands, longest first, go to the slot with the least cost so far (ties: lower slot)
   among those that can take them one sequence per rank: each slot keeps its ranks'
   tokens as if every band were split that way, longest sequence onto the rank with the
   fewest tokens, and a band fits where no rank then exceeds the cap.
3. Each slot is split over the ranks twice: band by band as step 2 counted (within the
   cap by construction, every rank one sequence of each full band), and costliest
   sequence first onto the least-loaded rank with room (ties: lower rank). The second
   is kept where it fits, leaves no rank empty and its heaviest rank is no heavier.

So every rank's share of a slot costs at most the sum of the slot's bands' costliest
sequences, and the step at most the sum of every band's costliest sequence: near the
partition bound where bands of ``dp`` sequences are nearly equal, as in the dense part of
a long-tailed batch. The caller evens the slots out further (:mod:`._slot_balance`,
:mod:`._slots`). A few milliseconds at 1,024 sequences: O(bands x m x dp) for step 2 in
numpy and O(n log dp) for step 3. None where a band fits no slot or a slot would hold
fewer than ``dp`` sequences.
"""

from __future__ import annotations

import heapq
from operator import add

import numpy as np

from ._capacity_greedy import least_loaded_with_room

__all__ = ["slot_first"]

Grid = list[list[list[int]]]


def slot_first(costs: np.ndarray, lens: np.ndarray, dp: int, m: int, cap: int) -> Grid | None:
    """The slot-first plan of ``m`` micro-batches per rank (module docstring) as a
    ``[rank][slot] -> indices`` grid; None where it has no such plan.

    Examples
    --------
    >>> lens = np.array([6, 5, 4, 4, 3, 2, 2, 1])
    >>> slot_first(lens.astype(float) ** 2, lens, 2, 2, 8)
    [[[0], [2, 4, 7]], [[1], [3, 5, 6]]]
    """
    n = int(lens.size)
    if dp < 1 or m < 1 or n < dp * m:
        return None
    order = np.lexsort((np.arange(n), -lens.astype(np.int64)))
    nbands = -(-n // dp)
    if nbands < m:
        return None
    # Each band's tokens, longest first, padded with 0 to dp; each slot's ranks' tokens
    # if every band were split one sequence per rank, longest onto the rank with the
    # fewest tokens (kept sorted, fewest first: the rank identities do not matter here).
    # Plain Python lists: the loop runs once per band, and the cheapest slot (a heap of
    # (cost, slot)) nearly always fits.
    padded = np.zeros(nbands * dp, dtype=np.int64)
    padded[:n] = lens[order]
    sizes = padded.reshape(nbands, dp).tolist()
    band_cost = np.bincount(np.arange(n) // dp, weights=costs[order], minlength=nbands).tolist()
    tok = [[0] * dp for _ in range(m)]
    heap = [(0.0, s) for s in range(m)]  # (cost so far, slot): a heap as listed
    slot_of = []
    for k, size in enumerate(sizes):
        full = []
        while heap:
            cost, s = heapq.heappop(heap)
            grown = list(map(add, tok[s], size))
            if max(grown) <= cap:
                break
            full.append((cost, s))
        else:
            return None
        slot_of.append(s)
        grown.sort()
        tok[s] = grown
        heapq.heappush(heap, (cost + band_cost[k], s))
        for x in full:
            heapq.heappush(heap, x)
    members = np.repeat(slot_of, dp)[:n]  # slot of each sequence, in ``order``
    if np.bincount(members, minlength=m).min() < dp:
        return None  # (a slot of one short band: some rank would have nothing there)
    w = costs.tolist()
    t = lens.tolist()
    by_slot: list[list[int]] = [[] for _ in range(m)]
    for i, s in zip(order.tolist(), members.tolist()):
        by_slot[s].append(i)
    rank = np.empty(n, dtype=np.int64)  # each sequence's place, costliest first
    rank[np.lexsort((np.arange(n), -costs))] = np.arange(n)
    by_cost = rank.tolist()
    grid: Grid = [[[] for _ in range(m)] for _ in range(dp)]
    for s, held in enumerate(by_slot):
        split, heaviest = _band_by_band(held, w, t, dp)
        greedy = least_loaded_with_room(sorted(held, key=by_cost.__getitem__), w, t, dp, cap)
        if greedy is not None and all(greedy[0]) and max(greedy[1]) <= heaviest:
            split = greedy[0]
        for r in range(dp):
            grid[r][s] = split[r]
    return grid


def _band_by_band(
    held: list[int], w: list[float], t: list[int], dp: int
) -> tuple[list[list[int]], float]:
    """One slot's sequences (bands of ``dp`` in ``held``'s order, longest first) over
    ``dp`` ranks as :func:`slot_first` counted their tokens, and the heaviest rank's cost:
    each band's sequences, longest first, to the ranks with the fewest tokens (ties:
    lower rank), so every rank is within the cap and holds one sequence of each full
    band."""
    parts: list[list[int]] = [[] for _ in range(dp)]
    tok = [0] * dp
    load = [0.0] * dp
    for k in range(0, len(held), dp):
        for i, r in zip(held[k : k + dp], sorted(range(dp), key=tok.__getitem__)):
            parts[r].append(i)
            tok[r] += t[i]
            load[r] += w[i]
    return parts, max(load)
