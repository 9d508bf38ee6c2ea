"""Other frameworks' balancing pipelines, re-implemented from reading their code.

Written in our own code from the behaviour of AReaL 1.0.4 (``areal/utils/seqpack.py``,
``areal/utils/data.py``, ``areal/infra/controller/train_controller.py``), verl 0.9.1
(``verl/utils/seqlen_balancing.py``, ``verl/trainer/ppo/ray_trainer.py``) and slime
(``slime/utils/dp_schedule.py``, ``slime/utils/seqlen_balancing.py``), including their tie
breaking, so ``bench/pipelines_check.py`` can compare the results with the frameworks' own
functions. Each function returns ``ranks[r][j]``: sequence indices of rank ``r``'s
micro-batch ``j`` in the order the framework runs them.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Sequence

import numpy as np

from .._validate import exact_numbers as _kk_weights
from ..partitioning._verl_kk import parts_of_labels, verl_equal_kk_labels, verl_free_kk_labels

__all__ = [
    "areal_ffd",
    "areal_ffd_groups",
    "areal_micro_batches",
    "areal_pipeline",
    "areal_ranks",
    "kk_partition",
    "slime_flops_pipeline",
    "verl_micro_batches",
    "verl_pipeline",
    "verl_ranks",
    "verl_workload",
]


# ---- Karmarkar-Karp as verl (and slime, which vendors it) run it -------------------------
def kk_partition(values: Sequence[float], k: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing into ``k`` parts with verl's tie rules, each part's indices
    ascending, parts in verl's order (heaviest first, empty ones last).

    ``equal_size``: ``len(values)`` must be a multiple of ``k``; the sorted values are cut
    into runs of ``k`` that each seed one state, so every part gets one item per run.
    Integer values are summed exactly. :mod:`seqbalance.partitioning._verl_kk` does the
    work (a state absorbing one item costs O(log k), not a sort of its ``k`` parts).
    """
    w = _kk_weights(values)
    if w.size == 0:
        return [[] for _ in range(k)]  # nothing to split (verl's own raises IndexError)
    labels = verl_equal_kk_labels(w, k) if equal_size else verl_free_kk_labels(w, k)
    assert labels is not None  # no size cap given
    return parts_of_labels(labels, k)


def verl_workload(lengths: np.ndarray) -> list[int]:
    """verl's attention-aware weight of a sequence: ``24576 L + L**2`` (a 7B-model rule)."""
    lens = lengths.astype(np.int64)
    if lens.size and int(lens.max()) > 3_036_988_212:  # int64 would wrap: Python ints
        return [24576 * x + x * x for x in lens.tolist()]
    return (24576 * lens + lens * lens).tolist()


def _pad_to_multiple(values: list, k: int) -> list:
    """Zero-weight dummies up to a multiple of ``k`` (dropped again after partitioning)."""
    return values + [0] * ((-len(values)) % k)


# ---- verl ---------------------------------------------------------------------------------
def verl_pipeline(
    lengths: np.ndarray, dp: int, cap: int, max_count: int | None = None,
    max_work: int | None = None,
) -> list[list[list[int]]] | None:
    """verl: ranks by equal-count KK on its workload, then per rank KK into ``m`` micro-batches.

    Ranks: KK with equal counts on ``24576 L + L**2``; inside a rank the sequences are
    ordered light to heavy and interleaved (``p[::2] + p[1::2][::-1]``). Micro-batches: ``m``
    starts at ``min(count, ceil(tokens / cap))``, the maximum over ranks; KK (free counts)
    on the workload into ``m`` parts on every rank, and ``m + 1`` while any part of any rank
    is over ``cap`` (verl gives up when ``m`` passes the smallest rank's count; here the
    last try is kept, over the capacity). Each rank runs its micro-batches heaviest in the
    middle: sorted by workload, then ``mbs[::2][::-1] + mbs[1::2]``.

    ``max_count``: give up (return None) once ``m`` would pass it; the planner uses it to
    skip the counts whose plans it would discard anyway. ``max_work``: give up (None) once
    the KK runs would pass this much work, counted as sequences x parts per run (a KK
    state holds one sum per part): with tiny micro-batches verl climbs through hundreds
    of counts, each a KK over thousands of parts.
    """
    return verl_micro_batches(lengths, verl_ranks(lengths, dp), cap, max_count, max_work)


def verl_ranks(lengths: np.ndarray, dp: int) -> list[list[int]]:
    """The rank split of :func:`verl_pipeline`: each rank's sequences in verl's order."""
    n = int(lengths.size)
    work = verl_workload(lengths)
    padded = _pad_to_multiple(work, dp)
    parts = [[i for i in p if i < n] for p in kk_partition(padded, dp, equal_size=True)]
    ranks = []
    for p in parts:
        p = sorted(p, key=lambda i: (work[i], i))
        ranks.append(p[::2] + p[1::2][::-1])
    return ranks


def verl_micro_batches(
    lengths: np.ndarray, ranks: list[list[int]], cap: int, max_count: int | None = None,
    max_work: int | None = None,
) -> list[list[list[int]]] | None:
    """The micro-batches of :func:`verl_pipeline` from its rank split (:func:`verl_ranks`)."""
    work = verl_workload(lengths)
    toks = lengths.astype(np.int64).tolist()
    m = max(min(len(r), max(1, math.ceil(sum(toks[i] for i in r) / cap))) for r in ranks)
    limit = min(len(r) for r in ranks)
    # verl tries every rank at each count; a count fails as soon as one rank does, so the
    # rank that failed last is tried first and the rest are skipped (the same result: only
    # the final count's micro-batches are kept, and those are computed for every rank).
    check = list(range(len(ranks)))
    rank_work = [_kk_weights([work[i] for i in r]) for r in ranks]
    rank_toks = [np.asarray([toks[i] for i in r], dtype=np.int64) for r in ranks]
    spent = 0
    while True:
        if max_count is not None and m > max_count:
            return None
        last = m >= limit
        got: dict[int, list[list[int]]] = {}
        failed = False
        for x in check:
            r = ranks[x]
            k = min(m, len(r))
            spent += len(r) * k
            if max_work is not None and spent > max_work:
                return None
            # Below the last count a part over the cap fails the count: the split stops
            # there (None) rather than finishing.
            labels = verl_free_kk_labels(
                rank_work[x], k, None if last else rank_toks[x], None if last else cap
            ) if r else None  # fmt: skip
            if r and labels is None:
                check.remove(x)
                check.insert(0, x)
                failed = True
                break
            local = parts_of_labels(labels, k) if labels is not None else []
            got[x] = [[r[j] for j in part] for part in local]
        if not failed:
            mbs = [got[x] for x in range(len(ranks))]
            break
        m += 1
    out = []
    for rank_mbs, r in zip(mbs, ranks):
        pos = {s: j for j, s in enumerate(r)}
        rank_mbs.sort(
            key=lambda mb: (sum(work[i] for i in mb), pos[mb[0]] if mb else 0), reverse=True
        )
        out.append(rank_mbs[::2][::-1] + rank_mbs[1::2])
    return out


# ---- AReaL --------------------------------------------------------------------------------
def areal_ffd(values: Sequence[int], cap: int, min_groups: int) -> list[list[int]]:
    """AReaL's first-fit decreasing: into the fitting group with the fewest items.

    Values in decreasing order (numpy's default argsort of the negated values); a new group
    opens while there are fewer than ``min_groups`` or the lightest group cannot take the
    value; otherwise, among the groups with room, the one holding the fewest items (ties:
    the lighter). Groups come back sorted by their smallest index, indices ascending
    (:func:`areal_ffd_groups` keeps AReaL's own order).
    """
    groups = areal_ffd_groups(np.asarray(values, dtype=np.int64), cap, min_groups)
    return sorted(sorted(g) for g in groups)


def areal_ffd_groups(v: np.ndarray, capacity: int, min_groups: int) -> list[list[int]]:
    """AReaL's first-fit decreasing (one pass of its ``_ffd_allocate``): groups in opening
    order, values in joining order. ``v``: the values as AReaL holds them (an unsigned
    array's negation wraps in AReaL's ``np.argsort(-values)``, and here too).

    AReaL scans every group with room for each value (O(values x groups); 0.65 s on 8,192
    values into 2,000 groups). Here the groups are kept in sets by how many values they
    hold, each set sorted by (load, group) as AReaL's list is: the first set, fewest values
    up, whose lightest group has room holds AReaL's choice (the first of the fewest among
    the groups with room, ties to the lighter, then to the first opened), and no set with
    room means a new group. A value visits as many sets as there are distinct group sizes
    (a handful): 4-7 ms for 8,192 values.
    """
    x = v.tolist()
    scale = len(x) + 1  # a group as one int, load * scale + group: sorts as (load, group)
    by_size: dict[int, list[int]] = {}  # values held -> that set's groups, ascending
    sizes: list[int] = []  # the keys of by_size, ascending
    groups: list[list[int]] = []
    for i in np.argsort(-v).tolist():  # AReaL's own call: its tie order on equal values
        xi = x[i]
        members: list[int] | None = None
        if len(groups) >= min_groups:
            below = (capacity - xi + 1) * scale  # the groups with room sort below this
            for size in sizes:
                if by_size[size][0] < below:
                    members = by_size[size]
                    break
        if members is None:
            key, size = xi * scale + len(groups), 1
            groups.append([i])
        else:
            old = members.pop(0)
            if not members:
                del by_size[size]
                sizes.remove(size)
            groups[old % scale].append(i)
            key, size = old + xi * scale, size + 1
        members = by_size.get(size)
        if members is None:
            by_size[size] = [key]
            bisect.insort(sizes, size)
        else:
            bisect.insort(members, key)
    return groups


def _areal_dp_split(tokens: list[int], dp: int) -> list[list[int]]:
    """AReaL's dispatch: heaviest first to the lightest rank with room for ``ceil(n / dp)``."""
    n = len(tokens)
    limit = -(-n // dp)
    parts: list[list[int]] = [[] for _ in range(dp)]
    sums = [0] * dp
    heap = [(0, r) for r in range(dp)]  # (load, rank) of ranks with room: the lightest first
    for i in sorted(range(n), key=lambda x: -tokens[x]):
        load, r = heapq.heappop(heap)
        parts[r].append(i)
        sums[r] = load + tokens[i]
        if len(parts[r]) < limit:
            heapq.heappush(heap, (sums[r], r))
    return parts


def areal_pipeline(lengths: np.ndarray, dp: int, cap: int) -> list[list[list[int]]]:
    """AReaL: ranks by tokens (equal counts, greedy), per-rank FFD, counts agreed as the max.

    After each rank packs with :func:`areal_ffd`, every rank repacks with ``min_groups`` set
    to the largest count, until all counts agree (AReaL's synced allocation).
    """
    return areal_micro_batches(lengths, areal_ranks(lengths, dp), cap)


def areal_ranks(lengths: np.ndarray, dp: int) -> list[list[int]]:
    """The rank split of :func:`areal_pipeline`."""
    return _areal_dp_split(lengths.astype(np.int64).tolist(), dp)


def areal_micro_batches(
    lengths: np.ndarray, ranks: list[list[int]], cap: int
) -> list[list[list[int]]]:
    """The micro-batches of :func:`areal_pipeline` from its rank split (:func:`areal_ranks`)."""
    toks = lengths.astype(np.int64).tolist()
    m = 1
    while True:
        mbs = [
            areal_ffd([toks[i] for i in r], cap, min(m, max(len(r), 1))) if r else []
            for r in ranks
        ]
        counts = [len(x) for x in mbs]
        if len(set(counts)) <= 1 or max(counts) == m:
            break
        m = max(counts)
    return [[[r[j] for j in g] for g in rank_mbs] for r, rank_mbs in zip(ranks, mbs)]


# ---- slime --------------------------------------------------------------------------------
def _split_halves(mb: list[int], toks: list[int]) -> list[list[int]]:
    halves: list[list[int]] = [[], []]
    sums = [0, 0]
    for i in sorted(mb, key=lambda x: -toks[x]):
        h = 0 if sums[0] <= sums[1] else 1
        halves[h].append(i)
        sums[h] += toks[i]
    return halves


def slime_flops_pipeline(
    lengths: np.ndarray, costs: np.ndarray, dp: int, cap: int
) -> list[list[list[int]]]:
    """slime with ``--balance-by-flops --balance-data``: pack first, distribute second.

    ``K = ceil(tokens / cap)`` micro-batches by KK on FLOPs (the cost), without the token
    cap (singletons when ``K >= n``); ``K`` raised to a multiple of ``dp`` by splitting the
    largest multi-sequence micro-batch in two by tokens; micro-batches to ranks by
    equal-count KK on their FLOPs, each rank running them in index order.
    """
    n = int(lengths.size)
    toks = lengths.astype(np.int64).tolist()
    flops = costs.tolist()
    k = max(1, -(-sum(toks) // cap))
    if k >= n:
        mbs = [[i] for i in range(n)]
    else:
        mbs = kk_partition(flops, k, equal_size=False)
    target = max(-(-len(mbs) // dp) * dp, dp)
    # The multi-sequence micro-batches by (tokens, position), largest first: each split
    # takes the top one (ties: the later) and puts back its halves that still hold two.
    multi = [(-sum(toks[i] for i in mb), -j) for j, mb in enumerate(mbs) if len(mb) > 1]
    heapq.heapify(multi)
    while len(mbs) < target and multi:
        j = -heapq.heappop(multi)[1]
        left, right = _split_halves(mbs[j], toks)
        mbs[j] = left
        mbs.append(right)
        for at, half in ((j, left), (len(mbs) - 1, right)):
            if len(half) > 1:
                heapq.heappush(multi, (-sum(toks[i] for i in half), -at))
    weights = _pad_to_multiple([sum(flops[i] for i in mb) for mb in mbs], dp)
    parts = kk_partition(weights, dp, equal_size=True)
    return [[mbs[j] for j in p if j < len(mbs)] for p in parts]
