"""A sharper FSDP slot bound where long sequences must be packed whole: the planner's stop.

:func:`.bounds.costliest_slot_bound` bounds the step from the slot that holds the costliest
sequence ``x``: the other ``dp - 1`` micro-batches of that slot hold at most ``(dp - 1) *
cap`` tokens, and it lets them take the densest tokens (cost per token) fractionally. Where
the dense sequences are long (a quadratic cost, long-context batches) that is far from what
whole sequences can do: a sequence longer than half the capacity leaves room beside it that
only shorter, less dense sequences fill, and a full micro-batch of long ones ends with a gap.
On 1,024 long-context sequences over 8 ranks the fractional bound is 0.6% below a plan that
exists; packing the long sequences whole brings it within 0.02% of that plan.

:func:`packed_slot_bound` keeps the proof of ``costliest_slot_bound`` and bounds the cost
``X`` of the other ``dp - 1`` micro-batches by a best-first branch and bound over the
(at most ``_MAX_LARGE``) sequences longer than ``cap / 8``: each goes whole into one
micro-batch with room for it, or not into the slot. A node's bound is a fractional filling
of the rooms left, costliest per token first, where an undecided long sequence takes only
rooms at least its length and the short ones (at most ``cap / 8``, or shorter than every
long one) any room. The search is counted in work units, never in time: past
``_MAX_WORK`` the largest bound among the open nodes is the bound (still valid, looser).

It is not part of :func:`.bounds.capacity_step_bound` (the bound plans report): the
planner asks for it only to stop its search early under FSDP, where the slot bound is
the binding term.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from ..partitioning._exact import exactness
from .bounds import clip_to_capacity

__all__ = ["packed_slot_bound"]

_MAX_LARGE = 24  # sequences packed whole by the search: the longest, above cap / 8
_MAX_WORK = 20_000  # relaxation steps of one bound (a few milliseconds)


def packed_slot_bound(costs: np.ndarray, lengths: np.ndarray, dp: int, cap: int) -> float:
    """FSDP only: the step (sequence costs, no per-micro-batch term) no plan can beat,
    from the slot of the costliest sequence with its other micro-batches packed whole.

    Let ``x`` be the costliest sequence (cost ``c``), ``W`` the total cost and ``U`` an
    upper bound on the cost that ``dp - 1`` micro-batches of at most ``cap`` tokens each
    can hold of the other sequences. The bound is ``c (dp - 1) / dp + (W - U) / dp``.

    Proof. As in :func:`.bounds.costliest_slot_bound`: the slot ``j0`` of ``x`` costs at
    least ``Y``, the cost of ``x``'s micro-batch, and every other slot at least its total
    over ``dp``, so the step is at least ``Y + (W - X - Y) / dp = Y (dp - 1) / dp + (W - X)
    / dp``, where ``X`` is the cost of the other ``dp - 1`` micro-batches of ``j0``. With
    ``Y >= c`` and ``X <= U`` the bound follows. ``U``: every assignment of whole sequences
    to those micro-batches within ``cap`` tokens lies in one leaf of the search (each long
    sequence in one micro-batch, or not in the slot); a node's value is the cost of its
    placed long sequences plus a fractional filling (tokens ``y_i <= L_i`` of each
    undecided sequence, gaining ``c_i / L_i`` per token) in which the sequences that may go
    only into micro-batches with room ``>= s`` take at most the room of those micro-batches,
    for every such ``s``. A whole assignment of the node meets those constraints (a long
    sequence in a micro-batch with room ``r`` has ``L_i <= r``), so the value bounds it;
    the constraints are sums over nested sets, a polymatroid, on which taking tokens
    costliest per token first is optimal. Best first, the largest open value bounds every
    leaf not yet reached, and a leaf's value is exact for its long sequences. Sequences of
    length 0 fit anywhere: all count in ``U``. Lengths above ``cap`` count as ``cap``
    (module docstring of :mod:`.bounds`); padding only adds cost, and rules only restrict
    plans.

    The result is lowered by ``4 (n + 8) eps`` of the total cost (the rounding of the sums),
    then rounded up to an integer for integer costs (every step is one).

    Examples
    --------
    >>> lens = np.array([10, 6, 6, 6, 6, 4, 4])   # cap 10: beside the 10, a 6 and a 4 at best
    >>> c = lens.astype(float) ** 2
    >>> round(packed_slot_bound(c, lens, 2, 10), 6)   # costliest_slot_bound: 158.0 (10 of 6s)
    162.0
    """
    n = int(costs.shape[0])
    if dp < 2 or n < 2:
        return 0.0
    lens = clip_to_capacity(lengths, cap)
    star = int(np.argmax(costs))
    c_star, total = float(costs[star]), float(costs.sum())
    others = np.ones(n, dtype=bool)
    others[star] = False
    c, length = costs[others], lens[others]
    free = float(c[length == 0].sum())  # (length 0: in every micro-batch's reach)
    c, length = c[length > 0], length[length > 0]
    if c.size == 0:
        return c_star
    order = np.lexsort((np.arange(c.size), -(c / length)))  # costliest per token first
    c, length = c[order], length[order]
    longest = np.sort(length)[::-1]
    tau = max(cap // 8, int(longest[_MAX_LARGE]) if longest.size > _MAX_LARGE else 0)
    large = np.flatnonzero(length > tau)
    small = length <= tau
    small_cost = np.concatenate([[0.0], np.cumsum(c[small])])
    small_tok = np.concatenate([[0], np.cumsum(length[small])])
    # small sequences ahead of each long one, in the order above (the long ones' turns)
    ahead = [*np.cumsum(small)[large].tolist(), int(small.sum())]
    big_c, big_len = c[large].tolist(), length[large].tolist()
    k_large = len(big_len)
    work = [0]

    def shorts(lo: int, hi: int, room: int) -> tuple[float, int]:
        """Short sequences ``lo:hi`` (their order above) into ``room`` tokens, fractionally."""
        if room <= 0 or lo >= hi:
            return 0.0, 0
        if int(small_tok[hi] - small_tok[lo]) <= room:
            return float(small_cost[hi] - small_cost[lo]), int(small_tok[hi] - small_tok[lo])
        t = int(np.searchsorted(small_tok, small_tok[lo] + room, side="right")) - 1
        got = float(small_cost[t] - small_cost[lo])
        part = room - int(small_tok[t] - small_tok[lo])
        whole = int(small_tok[t + 1] - small_tok[t])  # (the sequence taken in part)
        got += float(small_cost[t + 1] - small_cost[t]) * part / whole
        return got, room

    def relaxed(rooms: tuple[int, ...], k: int) -> float:
        """The fractional filling of ``rooms`` by the long sequences ``k:`` and every short one."""
        work[0] += len(rooms)
        # The distinct rooms, ascending, and the total room of those at least each: one
        # pass down the rooms (kept in descending order).
        levels: list[int] = []
        slack: list[int] = []
        total = 0
        for r in rooms:
            if r <= 0:
                break
            total += r
            if levels and levels[-1] == r:
                slack[-1] = total
            else:
                levels.append(r)
                slack.append(total)
        if not levels:
            return 0.0
        levels.reverse()
        slack.reverse()
        got = 0.0
        for j in range(k, k_large + 1):
            work[0] += 1 + len(levels)
            g, used = shorts(0 if j == k else ahead[j - 1], ahead[j], slack[0])
            got += g
            slack[0] -= used  # (short sequences may go into any room: the first set only)
            if slack[0] <= 0 or j == k_large:
                break
            size = big_len[j]
            if size > levels[-1]:
                continue
            t = bisect.bisect_left(levels, size)
            room = min(slack[: t + 1])
            if room <= 0:
                continue
            take = min(size, room)
            for u in range(t + 1):
                slack[u] -= take
            got += big_c[j] * take / size
        return got

    start = tuple([cap] * (dp - 1))
    tick = 0  # (ties: first pushed first)
    heap = [(-relaxed(start, 0), tick, 0.0, 0, start)]
    while True:
        neg, _, placed, k, rooms = heapq.heappop(heap)
        if k == k_large or work[0] > _MAX_WORK:
            upper = -neg
            break
        size, gain = big_len[k], big_c[k]
        work[0] += len(rooms)
        tried: set[int] = set()
        for b, r in enumerate(rooms):
            if r >= size and r not in tried:  # (micro-batches with equal room: one branch)
                tried.add(r)
                nxt = tuple(sorted((*rooms[:b], r - size, *rooms[b + 1 :]), reverse=True))
                tick += 1
                heapq.heappush(heap, (-(placed + gain + relaxed(nxt, k + 1)), tick,
                                      placed + gain, k + 1, nxt))  # fmt: skip
        tick += 1
        heapq.heappush(heap, (-(placed + relaxed(rooms, k + 1)), tick, placed, k + 1, rooms))
    bound = c_star * (dp - 1) / dp + (total - upper - free) / dp
    slack_fp = 4.0 * (n + 8) * np.finfo(float).eps * total
    integer, _ = exactness(costs)
    if integer:  # (every step is then an integer)
        return float(max(0, math.ceil(bound - slack_fp)))
    return float(max(0.0, bound - slack_fp))
