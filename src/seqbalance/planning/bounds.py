"""Capacity-aware lower bounds: fewest micro-batches, and the step time no plan can beat.

Every function here takes validated arrays (int64 lengths, float64 costs) and returns a
number that *no* plan under the token capacity can beat, whatever the planner does. Each
bound carries its proof in its docstring; ``tests/test_capacity_bounds.py`` checks them
against exhaustive enumeration of every plan on small inputs.

Padded micro-batches (``count * longest <= capacity``) use at least as many tokens as packed
ones (``count * longest >= sum``) and cost at least as much, so every bound below holds for
them too.

Sequences longer than the capacity (``plan(oversized="alone")``) run alone: their
micro-batch holds no other sequence with a token (only empty ones may join it). Every
function here first clips each length to the capacity (:func:`clip_to_capacity`). Proof
that this keeps every bound valid: in such a plan, clipping changes only the micro-batches
of oversized sequences, which then hold exactly ``cap`` tokens, so the plan's micro-batches
are also a packing of the clipped lengths under the capacity (same sequences, same costs).
Every proof below uses only that each micro-batch holds at most ``cap`` tokens of the
lengths it is given, and treats the costs as arbitrary per-sequence numbers, so each bound
computed on the clipped lengths holds for the plan. Clipping a length ``<= cap`` changes
nothing.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_groups
from ..partitioning._exact import exactness
from ..partitioning.bounds import lower_bound

__all__ = [
    "big_item_slot_bound",
    "capacity_step_bound",
    "clip_to_capacity",
    "costliest_slot_bound",
    "fsdp_slot_bound",
    "min_bins",
    "min_micro_batches",
    "min_padded_bins",
    "rank_token_bound",
]


def clip_to_capacity(lengths: np.ndarray, cap: int) -> np.ndarray:
    """``lengths`` as int64 with every length above ``cap`` lowered to ``cap``.

    A sequence longer than the capacity (``plan(oversized="alone")``) runs alone, so for
    every capacity bound it fills its micro-batch exactly: see the module docstring for why
    the bounds stay valid. Returns ``lengths`` itself (as int64) when nothing is above ``cap``.

    Examples
    --------
    >>> clip_to_capacity(np.array([95, 1, 1]), 8).tolist()
    [8, 1, 1]
    """
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.size and int(lens.max()) > cap:
        return np.minimum(lens, cap)
    return lens


def min_bins(lengths: np.ndarray, cap: int) -> int:
    """Fewest bins of ``cap`` tokens that can hold ``lengths``: a lower bound.

    The bound of Martello and Toth (1990), ``L2``, which is at least ``ceil(sum / cap)``.
    A length above ``cap`` (a sequence that runs alone, ``plan(oversized="alone")``) counts
    as ``cap``: it fills one bin by itself (module docstring). For ``k`` such lengths the
    result is then exactly ``k`` plus the bound of the others (a full bin leaves no room:
    ``ceil(sum / cap)`` and each ``L2`` term below gain exactly ``k``), or ``k`` when all the
    others are empty (they may join an oversized one).

    Proof. Fix an integer ``a`` with ``0 <= a <= cap / 2`` and split the items into
    ``J1 = {L > cap - a}``, ``J2 = {cap/2 < L <= cap - a}``, ``J3 = {a <= L <= cap/2}``
    (items below ``a`` are ignored, which can only lower the count). Two items above
    ``cap/2`` never share a bin, so the items of ``J1`` and ``J2`` sit in ``|J1| + |J2|``
    distinct bins. An item of ``J1`` leaves less than ``a`` tokens free, so no item of ``J3``
    (each ``>= a``) joins it: the ``J3`` items go into the ``J2`` bins, which have
    ``|J2| * cap - sum(J2)`` tokens free in all, or into other bins. So the other bins take
    at least ``sum(J3) - (|J2| * cap - sum(J2))`` tokens, which needs at least the ceiling
    of that over ``cap`` further bins. The bound is the largest of these counts over all
    ``a`` (only ``a = 0`` and the item lengths ``<= cap/2`` can change it) and
    ``ceil(sum / cap)``. Integer arithmetic throughout: exact.

    Examples
    --------
    >>> min_bins(np.array([6, 6, 6, 5, 5]), 10)   # no 5 fits beside a 6: 3 bins + 1 for the 5s
    4
    """
    n = int(lengths.shape[0])
    if n == 0:
        return 0
    w = np.sort(clip_to_capacity(lengths, cap))
    pre = np.concatenate(([0], np.cumsum(w)))  # pre[i] = sum of the i smallest
    total = int(pre[-1])
    l1 = -(-total // cap)
    half = int(np.searchsorted(w, cap // 2, side="right"))  # items with 2L <= cap, L int
    n_small, n_big = half, n - half
    sum_big = total - int(pre[half])
    alphas = np.unique(np.concatenate(([0], w[:n_small])))
    # J1: L > cap - a  (a <= cap/2, so J1 is inside the big items)
    j1_start = np.searchsorted(w, cap - alphas, side="right")
    n_j1 = n - j1_start
    sum_j1 = total - pre[j1_start]
    n_j2 = n_big - n_j1
    sum_j2 = sum_big - sum_j1
    # J3: a <= L <= cap/2
    j3_start = np.searchsorted(w, alphas, side="left")
    sum_j3 = pre[half] - pre[j3_start]
    over = sum_j3 - (n_j2 * cap - sum_j2)
    extra = np.where(over > 0, -(-over // cap), 0)
    l2 = int((n_j1 + n_j2 + extra).max())
    return max(l1, l2, 1 if total > 0 or n else 0)


def min_padded_bins(lengths: np.ndarray, cap: int) -> int:
    """Fewest padded bins of ``cap`` tokens that hold ``lengths``: exact.

    A padded bin costs its count times its longest sequence, so a bin whose longest
    sequence has ``L`` tokens holds at most ``cap // L`` sequences. Taking the sequences
    longest first, as many as fit into each bin, needs the fewest bins. A length above
    ``cap`` (it runs alone) takes a bin of its own.

    Proof (exchange). In any packing, let the longest sequence be in bin ``B``. If ``B``
    holds a sequence ``x`` while a longer ``y`` sits in another bin ``C``, swapping them
    keeps ``B``'s longest sequence and count, and ``C``'s longest cannot grow: both still
    fit. So some optimal packing puts the ``cap // L_1`` longest sequences (or all, if fewer)
    into one bin; repeat on the rest.

    Examples
    --------
    >>> min_padded_bins(np.array([6, 5, 3, 3, 3]), 10)   # {6}, {5, 3}, {3, 3}
    3
    """
    w = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    i, bins, n = 0, 0, int(w.shape[0])
    while i < n:
        if w[i] == 0:  # only empty sequences left: one bin holds any number of them
            return bins + 1
        take = max(1, cap // int(w[i]))  # w[i] <= cap, so at least one fits
        # Every following sequence is no longer, so the bin takes the next `take` of them.
        i += take
        bins += 1
    return bins


def min_micro_batches(lengths: np.ndarray, dp: int, cap: int) -> int:
    """Fewest micro-batches per rank that any plan needs: ``ceil(min_bins / dp)``, at least 1.

    Every rank runs the same number ``m`` of micro-batches, so a plan has ``dp * m`` of them,
    and they must hold every sequence: ``dp * m >= min_bins(lengths, cap)``.

    With ``k`` sequences longer than ``cap`` (``plan(oversized="alone")``), each alone in a
    micro-batch, :func:`min_bins` is ``k`` plus the bin-packing bound ``B`` of the others
    (``B = 0`` when those hold no token), so the bound is ``ceil((k + B) / dp)``. Proof: the
    ``k`` oversized sequences occupy ``k`` distinct micro-batches that hold no other token,
    so the others' tokens lie in the remaining ``dp * m - k`` micro-batches, at least ``B``
    of them: ``dp * m >= k + B``. (It is at least ``ceil(k / dp)``, the count the oversized
    sequences force by themselves.)

    Examples
    --------
    >>> min_micro_batches(np.array([95, 1, 1]), 1, 8)   # {95} alone, {1, 1}
    2
    """
    return max(1, math.ceil(min_bins(lengths, cap) / dp))


def _clique_order(lengths: np.ndarray, cap: int) -> np.ndarray:
    """Indices of a set of sequences no two of which fit in one micro-batch, longest first.

    The sequences longer than ``cap / 2`` (two of them exceed ``cap``), plus the longest
    other one when it does not fit beside the shortest of those (then it fits beside none:
    the others are longer). Only one other can join: two sequences of ``<= cap / 2`` fit.
    """
    order = np.lexsort((np.arange(lengths.size), -lengths))
    n_big = int((2 * lengths > cap).sum())
    if 0 < n_big < order.size and lengths[order[n_big]] + lengths[order[n_big - 1]] > cap:
        n_big += 1
    return order[:n_big]


def _exact_sum_down(head: np.ndarray) -> float:
    """``head.sum()`` rounded so that it never exceeds the exact sum (``head >= 0``)."""
    if head.size == 0:
        return 0.0
    s = float(head.sum())
    if s < 2.0**53 and bool(np.all(head == np.floor(head))):
        return s  # integer costs: the sum is exact
    # Summing k floats may round up by at most k ulps of the sum: lower it by that much.
    return max(float(head.max()), s - 2.0 * head.size * np.finfo(np.float64).eps * s)


def big_item_slot_bound(
    costs: np.ndarray,
    lengths: np.ndarray,
    dp: int,
    cap: int,
    groups: np.ndarray | None = None,
) -> float:
    """FSDP only: a bound from sequences that cannot share a micro-batch.

    A *clique* is a set of sequences no two of which fit together in ``cap`` tokens: the
    sequences longer than ``cap / 2``, plus the longest other one if it does not fit beside
    the shortest of them. Let ``b[0] >= b[1] >= ...`` be the costs of the clique of all
    sequences and, for every group ``g`` (``groups``: dense labels, all of a group on one
    rank), ``v_g[0] >= v_g[1] >= ...`` the costs of the clique of ``g``'s sequences. The
    bound is ``sum_i u[i]`` with ``u[i] = max(b[i dp], max_g v_g[i])`` (missing entries 0).
    Without groups it is ``b[0] + b[dp] + b[2 dp] + ...``.

    Proof. Let ``s[0] >= s[1] >= ...`` be the slot costs of any plan, sorted (slot ``j`` is
    every rank's ``j``-th micro-batch; under FSDP it costs its heaviest micro-batch, at
    least the cost of every sequence in it, and the step is the sum of all slot costs).
    Clique members sit in distinct micro-batches. A slot has ``dp`` micro-batches, so the
    ``i dp + 1`` most expensive members of the global clique lie in at least ``i + 1``
    distinct slots, each costing at least ``b[i dp]``: so ``s[i] >= b[i dp]``. The members
    of ``g``'s clique are on one rank, which has one micro-batch per slot, so its ``i + 1``
    most expensive members lie in ``i + 1`` distinct slots, each costing at least
    ``v_g[i]``: so ``s[i] >= v_g[i]``. Hence ``s[i] >= u[i]`` for every ``i`` (and a
    positive ``u[i]`` means the plan has more than ``i`` slots), so the step
    ``sum_i s[i] >= sum_i u[i]``. It does not depend on the number of slots.

    Why groups matter: GRPO groups whose responses were truncated at the generation limit
    hold many sequences longer than ``cap / 2``; one rank must run them one per micro-batch,
    so the slots they occupy are expensive whatever the other ranks do, which the bound on
    the busiest rank's total does not see.

    Examples
    --------
    >>> lens = np.array([9, 10, 11, 9, 10])
    >>> big_item_slot_bound(lens.astype(float), lens, 4, 16)   # 5 in 4 per slot: 11 + 9
    20.0
    >>> big_item_slot_bound(lens.astype(float), lens, 4, 16, np.array([0, 0, 0, 1, 1]))
    30.0
    """
    lengths = clip_to_capacity(lengths, cap)  # oversized ones run alone: module docstring
    clique = _clique_order(lengths, cap)
    if clique.size == 0:
        return 0.0
    u = np.sort(costs[clique])[::-1][::dp].copy()
    if groups is not None:
        # Each group's own clique, longest first inside the group (a group may hold a
        # sequence <= cap / 2 that joins its clique though not the global one).
        order = np.lexsort((np.arange(lengths.size), -lengths, groups))
        g, ln = groups[order], lengths[order]
        start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        size = np.diff(np.r_[start, g.size])
        n_big = np.add.reduceat((2 * ln > cap).astype(np.int64), start)
        # the first non-big of a group with a big one, if it fits beside no big one
        nxt = start + n_big
        has = (n_big > 0) & (n_big < size)
        joins = np.zeros(start.size, dtype=bool)
        joins[has] = ln[nxt[has]] + ln[nxt[has] - 1] > cap
        k = n_big + joins
        pos = np.arange(g.size) - np.repeat(start, size)  # place inside the group
        member = pos < np.repeat(k, size)
        if member.any():
            gid, vc = g[member], costs[order[member]]
            by = np.lexsort((-vc, gid))  # by group, costliest first
            gid, vc = gid[by], vc[by]
            first = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
            rank = np.arange(gid.size) - np.repeat(first, np.diff(np.r_[first, gid.size]))
            width = int(rank.max()) + 1
            if width > u.size:
                u = np.concatenate((u, np.zeros(width - u.size)))
            np.maximum.at(u, rank, vc)
    return _exact_sum_down(u)


def costliest_slot_bound(costs: np.ndarray, lengths: np.ndarray, dp: int, cap: int) -> float:
    """FSDP only: a bound from the slot that holds the costliest sequence.

    Let ``x`` be the costliest sequence (cost ``c``). Take the other sequences by cost per
    token, highest first, until they fill ``(dp - 1) * cap`` tokens, the last one
    fractionally; let ``R`` be the cost of what is left over (the rest of the last one
    included). The bound is ``c + R / dp``. A sequence longer than ``cap`` (allowed by
    ``plan(oversized="alone")``, where it runs alone) counts as ``cap`` tokens.

    Proof. Let slot ``j0`` hold ``x``, on rank ``r``. Under FSDP the step is the sum of the
    slot costs ``s_j``, each at least the heaviest micro-batch of its slot, so
    ``s_j0 >= Y``, the cost of ``x``'s micro-batch, and ``s_j >= (sum of slot j) / dp`` for
    every other slot. The other ``dp - 1`` micro-batches of slot ``j0`` hold distinct
    sequences other than ``x``, at most ``(dp - 1) * cap`` tokens of them, so their cost
    ``X`` is at most what the fractional knapsack above takes, ``W - c - R`` (``W`` the
    total cost). Hence the step is at least
    ``Y + (W - X - Y) / dp = Y (dp - 1) / dp + (W - X) / dp >= c (dp - 1) / dp + (c + R) / dp``,
    using ``Y >= c``. Padding only adds cost; groups and size rules only restrict plans.

    Why it matters: when one sequence costs far more than a full micro-batch of the others
    (a sequence at the capacity among short ones), every other rank idles through part of
    its slot, since the capacity stops them from filling it with as much work; the bound
    on the busiest rank's total does not see that (256 ranks, one 32,768-token sequence
    among 16,384 chat sequences: that bound is 12% below the best plan found, this one
    0.13%).

    Examples
    --------
    >>> lens = np.array([16, 8, 8, 8, 8])
    >>> costliest_slot_bound(lens.astype(float) ** 2, lens, 2, 16)   # 256 + (64 + 64) / 2
    320.0
    """
    n = int(costs.shape[0])
    if dp < 2 or n < 2:
        return 0.0
    star = int(np.argmax(costs))
    c_star = float(costs[star])
    others = np.ones(n, dtype=bool)
    others[star] = False
    # A sequence above the cap (plan(oversized="alone")) runs alone: counted as the cap,
    # it still leaves every micro-batch at most `cap` tokens, as the proof needs.
    c, length = costs[others], np.minimum(lengths[others].astype(np.int64), cap)
    # Empty sequences take no room: the knapsack holds all of them.
    c, length = c[length > 0], length[length > 0]
    order = np.argsort(-(c / length), kind="stable")
    c, length = c[order], length[order]
    room = (dp - 1) * cap
    taken = int(np.searchsorted(np.cumsum(length), room, side="right"))  # whole ones
    if taken == c.shape[0]:
        return c_star  # the others all fit in the slot beside x
    used = int(length[:taken].sum())
    # Left over: the part of sequence `taken` that did not fit, and everything after it.
    part_num, part_den = float(c[taken]) * (used + int(length[taken]) - room), int(length[taken])
    tail = c[taken + 1 :]
    integer, _ = exactness(costs)
    if integer:
        # Integer costs: the step is an integer, so round the bound up. The order above
        # compares float ratios: ratios within an ulp may come out swapped, which can put
        # up to eps x (total cost) < 2 too much in R (total < 2**53), so that comes off
        # first.
        whole = int(tail.sum()) * part_den + int(c[taken]) * (used + int(length[taken]) - room)
        whole -= -(-int(costs.sum()) * part_den // 2**52)
        return c_star + float(max(0, -(-whole // (part_den * dp))))
    rest = _exact_sum_down(tail) + part_num / part_den
    # Lowered by the rounding of the last few operations, and of the sum by one ulp.
    bound = c_star + rest * (1.0 - 8.0 * np.finfo(np.float64).eps) / dp
    return float(np.nextafter(bound, 0.0))


def rank_token_bound(
    costs: np.ndarray, lengths: np.ndarray, dp: int, m: int, cap: int
) -> float:
    """Both syncs, plans with at most ``m`` micro-batches per rank: a bound on the busiest
    rank's total from the tokens each rank can hold (``m * cap``).

    Let ``rho`` be the least cost per token of a non-empty sequence, so that every
    sequence's cost is ``c_i = rho * (L_i + e_i)`` with an *excess* ``e_i >= 0``. Let
    ``K = m * cap``, ``T`` the total tokens and ``F = dp * K - T`` the tokens the ranks
    leave free. The bound is ``rho * (K + t)`` for the least ``t >= 0`` with
    ``sum_i max(0, e_i - t) <= F`` (0 when ``t = 0`` already meets it: then nothing here
    beats the average rank). Sequences longer than the capacity (they run alone) count as
    ``cap`` tokens (module docstring).

    Proof. Take a plan whose busiest rank costs ``C`` and put ``t = C / rho - K``. A rank
    ``r`` holds ``T_r <= K`` tokens and costs ``rho * (T_r + E_r) <= C`` (``E_r``: the
    excess of its sequences), so ``T_r <= K - max(0, E_r - t)``. For ``t >= 0`` the
    function ``x -> max(0, x - t)`` is superadditive on ``x >= 0`` (``max(0, a + b - t)
    >= max(0, a - t) + max(0, b - t)``), so ``max(0, E_r - t) >= sum_{i in r} max(0, e_i -
    t)``. Summing over the ranks, ``T <= dp * K - sum_i max(0, e_i - t)``, that is
    ``sum_i max(0, e_i - t) <= F``. That sum does not grow with ``t``, so ``t`` is at least
    the least ``t >= 0`` meeting it, and ``C = rho * (K + t)``. A plan with ``t < 0``
    has ``T_r <= K - E_r`` on every rank, so ``sum_i e_i <= F``: ``t = 0`` meets the
    condition and the bound is 0. Under FSDP the step is at least the busiest rank's
    total, so the bound holds there too. More micro-batches than ``m`` hold more tokens:
    the bound is for plans of at most ``m`` per rank (the planner picks among plans of the
    fewest count); it is not part of :func:`capacity_step_bound`, which holds for every
    count.

    Floating point: ``rho`` is lowered by a few ulps (every cost stays at least ``rho``
    times its tokens), the search runs in cost units (``rho * e_i``, ``rho * t``, ``rho *
    F``: nothing is divided by a tiny ``rho``), and the result is lowered by ``4 (n + 8)
    eps`` of the total cost (the rounding of the sums), then rounded up to an integer for
    integer costs (every rank's total is one).

    Why it matters: where a few long sequences cost far more per token than the short
    ones (long-context batches with quadratic costs), the ranks that hold them are full in
    cost long before they are full in tokens, so the short sequences must go to the other
    ranks, whose tokens are capped. The partition bound does not see that (1,024
    long-context sequences, 8 ranks, 2 micro-batches: 1.7% above it; a capacity-aware
    greedy plan is within 0.01% of this bound).

    Examples
    --------
    >>> lens = np.array([6] + [1] * 14)
    >>> c = np.array([60.0] + [1.0] * 14)     # the 6 costs 60; every rank holds 10 tokens
    >>> rank_token_bound(c, lens, 2, 1, 10)   # so 4 ones join the 6 (partition bound: 60)
    64.0
    """
    lens = clip_to_capacity(lengths, cap)
    k_tok = m * cap
    free = dp * k_tok - int(lens.sum())
    full = lens > 0
    if free < 0 or not bool(full.any()):
        return 0.0  # (no plan has m micro-batches, or no token costs anything)
    # rho lowered by a few ulps: every cost is then at least rho times its tokens.
    rho = float(np.min(costs[full] / lens[full]))
    rho = float(np.nextafter(np.nextafter(rho, 0.0), 0.0)) * (1.0 - 4 * np.finfo(float).eps)
    if rho <= 0.0:
        return 0.0
    # In cost units (rho * e_i, rho * t, rho * F): no division by a tiny rho.
    e = np.sort(np.maximum(costs - rho * lens, 0.0))[::-1]
    pre = np.cumsum(e)
    room = rho * free
    if pre[-1] <= room:
        return 0.0
    # On [e[k], e[k-1]] the sum is pre[k-1] - k t: the least t >= 0 where it is <= room.
    t = (pre - room) / np.arange(1, e.size + 1)
    ok = (t >= np.r_[e[1:], 0.0]) & (t <= e)
    t_star = float(t[np.flatnonzero(ok)[0]]) if ok.any() else 0.0
    bound = rho * k_tok + max(t_star, 0.0)
    # Lowered by the rounding of the sums (each below n eps of the total cost).
    tiny = np.finfo(float).tiny
    slack = 4.0 * (e.size + 8) * np.finfo(float).eps * float(costs.sum()) + 16.0 * tiny
    integer, _ = exactness(costs)
    if integer:  # every rank's total is then an integer
        return float(max(0, math.ceil(bound - slack)))
    return float(max(0.0, bound - slack))


def fsdp_slot_bound(
    costs: np.ndarray, lengths: np.ndarray, dp: int, cap: int,
    labels: np.ndarray | None = None,
) -> float:
    """FSDP only: the larger of :func:`big_item_slot_bound` (``labels``: dense group ids,
    or None) and :func:`costliest_slot_bound`, a bound on the sum of slot maxima without
    per-micro-batch costs (the ``S`` of :func:`capacity_step_bound`).

    Examples
    --------
    >>> lens = np.array([16, 8, 8, 8, 8])
    >>> fsdp_slot_bound(lens.astype(float) ** 2, lens, 2, 16)   # costliest slot: 256 + 64
    320.0
    """
    return max(big_item_slot_bound(costs, lengths, dp, cap, labels),
               costliest_slot_bound(costs, lengths, dp, cap))  # fmt: skip


def capacity_step_bound(
    costs: np.ndarray,
    lengths: np.ndarray,
    dp: int,
    cap: int,
    *,
    sync: str | None = None,
    per_microbatch: float = 0.0,
    size: str = "free",
    groups: np.ndarray | None = None,
    min_micro_batches_given: int = 1,
) -> float:
    """The step time no plan under the capacity can beat.

    ``max(P, S) + M * per_microbatch`` where

    - ``P = lower_bound(costs, dp, size=size, groups=groups)`` bounds the busiest rank's total
      (:func:`seqbalance.partitioning.lower_bound`);
    - ``S`` under ``sync="fsdp"``, else 0: the larger of ``big_item_slot_bound(...,
      groups)`` (with groups it also uses that a group's sequences that cannot share a
      micro-batch take distinct slots of one rank) and :func:`costliest_slot_bound`;
    - ``M = max(min_micro_batches_given, min_micro_batches(lengths, dp, cap))``.

    Proof. DDP: the step is the busiest rank's total, which is at least ``P`` for its
    sequences plus ``per_microbatch`` for each of its ``m >= M`` micro-batches (empty ones
    included: they still run). FSDP: the step ``sum_j max_r cost(r, j)`` is at least
    ``max_r sum_j cost(r, j)`` (a sum of maxima bounds the maximum of sums), so the DDP
    bound holds; it is also at least ``S`` plus the ``per_microbatch`` of each of its
    ``m >= M`` slots (a slot's heaviest micro-batch pays it once), see
    :func:`big_item_slot_bound` and :func:`costliest_slot_bound` for ``S``.
    ``sync=None`` gives the bound valid for both.

    Lengths above ``cap`` (sequences that run alone, ``plan(oversized="alone")``) count as
    ``cap`` in ``S`` and ``M`` (module docstring: why that keeps the bound valid); ``P``
    does not look at lengths.
    """
    if costs.size == 0:
        return float(min_micro_batches_given * per_microbatch)
    p, s, m_cap = _step_bound_terms(costs, lengths, dp, cap, sync=sync, size=size, groups=groups)
    m = max(min_micro_batches_given, m_cap)
    return max(p, s) + m * per_microbatch


def _step_bound_terms(
    costs: np.ndarray,
    lengths: np.ndarray,
    dp: int,
    cap: int,
    *,
    sync: str | None = None,
    size: str = "free",
    groups: np.ndarray | None = None,
    fewest: int | None = None,
) -> tuple[float, float, int]:
    """The terms of :func:`capacity_step_bound` that do not depend on the count: ``P``,
    ``S`` (0 unless ``sync="fsdp"``) and :func:`min_micro_batches`; non-empty ``costs``.
    The bound at a count ``M`` is ``max(P, S) + max(M, min_micro_batches) *
    per_microbatch``, so a caller that asks at several counts computes these once.
    ``fewest``: :func:`min_micro_batches` of these lengths clipped to ``cap``, where the
    caller has it."""
    lengths = clip_to_capacity(lengths, cap)  # oversized ones run alone: module docstring
    p = lower_bound(costs, dp, size=size, groups=groups)
    labels = None if groups is None else as_groups(groups, costs.shape[0])
    s = fsdp_slot_bound(costs, lengths, dp, cap, labels) if sync == "fsdp" else 0.0
    return p, s, min_micro_batches(lengths, dp, cap) if fewest is None else fewest
