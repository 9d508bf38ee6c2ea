"""Capacity-aware lower bounds: fewest micro-batches, and the step time no plan can beat.

Every function here takes validated arrays (int64 lengths, float64 costs) and returns a
number that *no* plan under the token capacity can beat, whatever the planner does. Each
bound carries its proof in its docstring; ``tests/test_capacity_bounds.py`` checks them
against exhaustive enumeration of every plan on small inputs.

Padded micro-batches (``count * longest <= capacity``) use at least as many tokens as packed
ones (``count * longest >= sum``) and cost at least as much, so every bound below holds for
them too.
"""

from __future__ import annotations

import math

import numpy as np

from ..partitioning.bounds import lower_bound

__all__ = ["big_item_slot_bound", "capacity_step_bound", "min_bins", "min_micro_batches"]


def min_bins(lengths: np.ndarray, cap: int) -> int:
    """Fewest bins of ``cap`` tokens that can hold ``lengths`` (each ``<= cap``): a lower bound.

    The bound of Martello and Toth (1990), ``L2``, which is at least ``ceil(sum / cap)``.

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
    w = np.sort(lengths.astype(np.int64))
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


def min_micro_batches(lengths: np.ndarray, dp: int, cap: int) -> int:
    """Fewest micro-batches per rank that any plan needs: ``ceil(min_bins / dp)``, at least 1.

    Every rank runs the same number ``m`` of micro-batches, so a plan has ``dp * m`` of them,
    and they must hold every sequence: ``dp * m >= min_bins(lengths, cap)``.
    """
    return max(1, math.ceil(min_bins(lengths, cap) / dp))


def big_item_slot_bound(costs: np.ndarray, lengths: np.ndarray, dp: int, cap: int) -> float:
    """FSDP only: a bound from the sequences longer than half the capacity.

    Let ``b[0] >= b[1] >= ...`` be the costs of the sequences with ``2 L > cap`` ("big").
    The bound is ``b[0] + b[dp] + b[2 dp] + ...``.

    Proof. Two big sequences never share a micro-batch (their tokens exceed ``cap``), and a
    slot (every rank's ``j``-th micro-batch) has ``dp`` micro-batches, so a slot holds at
    most ``dp`` big sequences. For ``k >= 0`` the ``k dp + 1`` most expensive big sequences
    therefore occupy at least ``k + 1`` distinct slots, and each of those slots costs at
    least the cheapest of them, ``b[k dp]`` (a slot under FSDP costs its heaviest
    micro-batch, which costs at least every sequence in it). So the ``(k + 1)``-th most
    expensive slot costs at least ``b[k dp]``, and the FSDP step time, the sum of all slot
    costs, is at least ``sum_k b[k dp]``. It does not depend on the number of slots.
    """
    big = np.sort(costs[2 * lengths > cap])[::-1]
    if big.size == 0:
        return 0.0
    head = big[::dp]
    s = float(head.sum())
    if s < 2.0**53 and bool(np.all(head == np.floor(head))):
        return s  # integer costs: the sum is exact
    # Summing k floats may round up by at most k ulps of the sum: lower it by that much.
    return max(float(head[0]), s - 2.0 * head.size * np.finfo(np.float64).eps * s)


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
    - ``S = big_item_slot_bound(...)`` under ``sync="fsdp"``, else 0;
    - ``M = max(min_micro_batches_given, min_micro_batches(lengths, dp, cap))``.

    Proof. DDP: the step is the busiest rank's total, which is at least ``P`` for its
    sequences plus ``per_microbatch`` for each of its ``m >= M`` micro-batches (empty ones
    included: they still run). FSDP: the step ``sum_j max_r cost(r, j)`` is at least
    ``max_r sum_j cost(r, j)`` (a sum of maxima bounds the maximum of sums), so the DDP
    bound holds; it is also at least ``S`` plus the ``per_microbatch`` of each of its
    ``m >= M`` slots (a slot's heaviest micro-batch pays it once), see
    :func:`big_item_slot_bound` for ``S``. ``sync=None`` gives the bound valid for both.
    """
    if costs.size == 0:
        return float(min_micro_batches_given * per_microbatch)
    p = lower_bound(costs, dp, size=size, groups=groups)
    s = big_item_slot_bound(costs, lengths, dp, cap) if sync == "fsdp" else 0.0
    m = max(min_micro_batches_given, min_micro_batches(lengths, dp, cap))
    return max(p, s) + m * per_microbatch
