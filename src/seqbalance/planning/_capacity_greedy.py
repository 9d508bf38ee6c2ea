"""Capacity-aware greedy plans: candidates for batches whose ranks fill up in tokens.

Where a few long sequences cost far more per token than the short ones (long-context
batches under a quadratic cost), the ranks or micro-batches that hold them are full in cost
long before they are full in tokens. The packers balance cost first and meet the token cap
second, and can end a few percent above a plan that puts the short sequences beside the long
ones from the start. These two greedy plans do that directly, in one pass each:

``ddp_greedy``
    Sequences costliest first (ties: lower index), each onto the least-loaded rank that has
    a micro-batch with room for it (ties: lower rank), into that rank's fullest such
    micro-batch (ties: lower index). The busiest rank is the step, so this is LPT over the
    ranks with the token cap kept per micro-batch.
``fsdp_greedy``
    The costliest sequence sets the first slot's level: the other ranks' first micro-batches
    are filled longest first (first fit) up to its cost and the cap, so that slot's cost
    does not grow. The rest, costliest first, go to the least-loaded of the other ``dp (m -
    1)`` micro-batches they fit in, which are then dealt into slots by cost (the costliest
    ``dp`` form a slot, and so on), so that each slot's maximum is as low as the packing
    allows.

Both return a ``dp x m`` grid of sequence indices, or None when a sequence fits nowhere (the
other candidates then stand). They use Python lists and heaps: a pass costs about
O(n (m + log dp)) under DDP and O(n log (dp m)) under FSDP, plus up to O(n dp) for FSDP's
first slot (a first-fit scan over the ranks); a few milliseconds at n = 1,024 and about
10 ms at 8,192 over 64 ranks. The planner bounds ``n dp`` before it asks.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["ddp_greedy", "fsdp_greedy", "least_loaded_with_room"]

Grid = list[list[list[int]]]


def _costliest_first(costs: np.ndarray) -> list[int]:
    return np.lexsort((np.arange(costs.size), -costs)).tolist()


def ddp_greedy(costs: np.ndarray, lens: np.ndarray, dp: int, m: int, cap: int) -> Grid | None:
    """The DDP greedy plan (module docstring); None where a sequence fits on no rank.

    Examples
    --------
    >>> lens = np.array([6, 1, 1, 1, 1, 1, 1, 1, 1])
    >>> ddp_greedy(lens.astype(float) ** 2, lens, 2, 1, 7)
    [[[0, 8]], [[1, 2, 3, 4, 5, 6, 7]]]
    """
    w = costs.tolist()
    t = lens.tolist()
    tok = [[0] * m for _ in range(dp)]
    load = [0.0] * dp
    grid: Grid = [[[] for _ in range(m)] for _ in range(dp)]
    # The least-loaded rank with room: ranks popped without room for the current sequence
    # are parked by their largest room (a max-heap) and come back as soon as a sequence
    # fits them, so every rank with room is in ``heap`` when a sequence chooses.
    heap = [(0.0, r) for r in range(dp)]  # (load, rank): a heap as listed
    parked: list[tuple[int, int]] = []  # (-largest room, rank)
    for i in _costliest_first(costs):
        ti = t[i]
        while parked and -parked[0][0] >= ti:
            r = heapq.heappop(parked)[1]
            heapq.heappush(heap, (load[r], r))
        need = cap - ti
        while heap:
            r = heapq.heappop(heap)[1]
            row = tok[r]
            best, j = -1, -1
            for k in range(m):
                if best < row[k] <= need:
                    best, j = row[k], k
            if j >= 0:
                row[j] += ti
                grid[r][j].append(i)
                load[r] += w[i]
                heapq.heappush(heap, (load[r], r))
                break
            heapq.heappush(parked, (min(row) - cap, r))
        else:
            return None
    return grid


def fsdp_greedy(costs: np.ndarray, lens: np.ndarray, dp: int, m: int, cap: int) -> Grid | None:
    """The FSDP greedy plan (module docstring); None where a sequence fits nowhere, or
    ``m < 2`` with more than one sequence left over from the first slot.

    Examples
    --------
    >>> lens = np.array([8, 4, 4, 2, 2, 1, 1])
    >>> fsdp_greedy(lens.astype(float) ** 2, lens, 2, 2, 8)
    [[[0], [3, 5]], [[1, 2], [4, 6]]]
    """
    n = costs.size
    if n == 0 or dp < 1 or m < 1:
        return None
    w = costs.tolist()
    t = lens.tolist()
    top = int(np.argmax(costs))  # (the costliest; ties: the lowest index)
    level = w[top]
    first: list[list[int]] = [[top]] + [[] for _ in range(dp - 1)]
    ftok = [0] * dp
    fcost = [0.0] * dp
    rest = []
    # First fit, longest first, into ranks 1..dp-1 below the top sequence's cost and the
    # cap. Ranks with no room for the cheapest or the shortest sequence leave the scan; after
    # a scan that placed nothing the least filled ranks' totals are counted, and a sequence
    # that would overflow even them is passed over without a scan (totals only grow; each
    # test adds as the placement test does, so float rounding cannot tell them apart).
    cheapest, shortest = float(costs.min()), int(lens.min())
    open_ranks = list(range(1, dp))
    low_cost, low_tok = 0.0, 0
    for i in np.lexsort((np.arange(n), -lens)).tolist():
        if i == top:
            continue
        wi, ti = w[i], t[i]
        if low_cost + wi > level or low_tok + ti > cap:
            rest.append(i)
            continue
        for pos, b in enumerate(open_ranks):
            if ftok[b] + ti <= cap and fcost[b] + wi <= level:
                first[b].append(i)
                ftok[b] += ti
                fcost[b] += wi
                if fcost[b] + cheapest > level or ftok[b] + shortest > cap:
                    del open_ranks[pos]
                break
        else:
            rest.append(i)
            low_cost = min((fcost[r] for r in open_ranks), default=np.inf)
            low_tok = min((ftok[r] for r in open_ranks), default=cap + 1)
    if m == 1:
        return [[mb] for mb in first] if not rest else None
    nbins = dp * (m - 1)
    rest.sort(key=lambda i: (-w[i], i))
    got = least_loaded_with_room(rest, w, t, nbins, cap)
    if got is None:
        return None
    bins, bcost = got
    order = sorted(range(nbins), key=lambda b: (-bcost[b], b))
    slots = [first] + [[bins[b] for b in order[s * dp : (s + 1) * dp]] for s in range(m - 1)]
    return [[slots[j][r] for j in range(m)] for r in range(dp)]


def least_loaded_with_room(
    items: list[int], w: list[float], t: list[int], nbins: int, cap: int
) -> tuple[list[list[int]], list[float]] | None:
    """``items``, in the order given, each onto the least-loaded of ``nbins`` bins that has
    room for it within ``cap`` tokens (ties: lower bin): the bins and their costs, or
    None where one fits no bin. ``w`` and ``t``: every item's cost and tokens.

    Examples
    --------
    >>> least_loaded_with_room([0, 1, 2], [3.0, 2.0, 2.0], [3, 2, 2], 2, 4)
    ([[0], [1, 2]], [3.0, 4.0])
    """
    bins: list[list[int]] = [[] for _ in range(nbins)]
    btok = [0] * nbins
    bcost = [0.0] * nbins
    # Bins popped without room for the current item are parked by room (a max-heap) and
    # come back as soon as an item fits them, so every bin with room is in ``heap`` when
    # an item chooses (the pick is the plain scan's).
    heap = [(0.0, b) for b in range(nbins)]
    parked: list[tuple[int, int]] = []  # (-room, bin)
    for i in items:
        ti = t[i]
        while parked and -parked[0][0] >= ti:
            b = heapq.heappop(parked)[1]
            heapq.heappush(heap, (bcost[b], b))
        if heap and btok[heap[0][1]] + ti <= cap:  # the least-loaded bin has room (one update)
            c, b = heap[0]
            bins[b].append(i)
            btok[b] += ti
            bcost[b] = c + w[i]
            heapq.heapreplace(heap, (bcost[b], b))
            continue
        while heap:
            c, b = heapq.heappop(heap)
            if btok[b] + ti <= cap:
                bins[b].append(i)
                btok[b] += ti
                bcost[b] = c + w[i]
                heapq.heappush(heap, (bcost[b], b))
                break
            heapq.heappush(parked, (btok[b] - cap, b))
        else:
            return None
    return bins, bcost
