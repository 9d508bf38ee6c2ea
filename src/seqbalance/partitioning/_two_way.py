"""Exact two-way partitioning by meeting in the middle (Horowitz and Sahni's idea).

Splitting ``m`` weights into two parts minimises ``max(s, T - s)``, where ``s`` is the
weight of the first part and ``T`` the total: the best first part is the subset sum
closest to ``T / 2``. The weights are cut into two halves; every subset sum of each half
is listed (``2**(m/2)`` each, with its count of units), one half's sums are sorted, and
for every sum ``a`` of the other half a binary search finds the sums ``b`` next to
``T / 2 - a``. Size rules restrict the counts: the sums are grouped by count and only
count pairs that the rule allows are matched. Time O(2**(m/2) * m), memory O(2**(m/2));
with ``m <= TWO_WAY_MAX_UNITS`` that is at most 65,536 sums per half.

The branch-and-bound search of :mod:`._exact` must refute every capacity below the answer,
which for real-valued weights (no perfect split exists) can take more nodes than its budget
at ``m`` in the twenties; this enumeration proves the optimum in milliseconds there.
Deterministic: ties go to the lowest subset index.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TWO_WAY_MAX_UNITS", "subset_sums", "two_way_labels"]

#: Largest number of units solved this way (2**16 subset sums per half, ~25 ms).
TWO_WAY_MAX_UNITS = 32


def subset_sums(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts of every subset of ``w``; bit ``i`` of the index selects ``w[i]``.

    Sums are built by doubling (``sums[2**i + j] = sums[j] + w[i]``), the same additions
    in the same order on every machine.
    """
    m = int(w.shape[0])
    sums = np.zeros(1 << m, dtype=np.float64)
    for i, x in enumerate(w.tolist()):
        np.add(sums[: 1 << i], x, out=sums[1 << i : 2 << i])
    return sums, _popcounts(m)


_POPCOUNTS: dict[int, np.ndarray] = {}


def _popcounts(m: int) -> np.ndarray:
    """The number of set bits of ``0 .. 2**m - 1`` (cached; callers must not write to it)."""
    if m not in _POPCOUNTS:
        counts = np.zeros(1 << m, dtype=np.int64)
        for i in range(m):
            np.add(counts[: 1 << i], 1, out=counts[1 << i : 2 << i])
        counts.flags.writeable = False
        _POPCOUNTS[m] = counts
    return _POPCOUNTS[m]


def _allowed_counts(m: int, size: str) -> list[int]:
    """Unit counts the first part may hold under ``size`` (two parts)."""
    if size == "free":
        return list(range(m + 1))
    if size == "equal":
        return [m // 2]
    return sorted({m // 2, (m + 1) // 2})  # balanced


def two_way_labels(w: np.ndarray, size: str) -> np.ndarray:
    """Labels (0 or 1) of an optimal two-way split of ``w`` under ``size``.

    Parameters
    ----------
    w : numpy.ndarray
        Non-negative unit weights, at most :data:`TWO_WAY_MAX_UNITS` of them.
    size : {"free", "equal", "balanced"}
        The size rule ("equal" needs an even number of units).

    Returns
    -------
    numpy.ndarray
        int64 labels; the heavier part is as light as any split under the rule allows
        (up to floating-point rounding of the sums).
    """
    m = int(w.shape[0])
    if m > TWO_WAY_MAX_UNITS:
        raise ValueError(f"two_way_labels handles at most {TWO_WAY_MAX_UNITS} units, got {m}")
    h = m // 2
    sums_a, cnt_a = subset_sums(w[:h])
    sums_b, cnt_b = subset_sums(w[h:])
    half = float(w.sum()) / 2.0
    total = float(w.sum())
    best = (np.inf, 0, 0)  # (heavier part, subset of the first half, subset of the second)
    free = size == "free"
    if free:
        a_groups = [np.arange(sums_a.size)]
    else:
        a_groups = [np.flatnonzero(cnt_a == c) for c in range(h + 1)]
    for ia in a_groups:
        if ia.size == 0:
            continue
        ca = int(cnt_a[ia[0]])
        wanted = [None] if free else [c - ca for c in _allowed_counts(m, size)]
        for cb in wanted:
            if cb is None:
                ib = np.arange(sums_b.size)
            elif 0 <= cb <= m - h:
                ib = np.flatnonzero(cnt_b == cb)
            else:
                continue
            order = ib[np.argsort(sums_b[ib], kind="stable")]
            sb = sums_b[order]
            sa = sums_a[ia]
            pos = np.searchsorted(sb, half - sa)
            for cand in (np.clip(pos - 1, 0, sb.size - 1), np.clip(pos, 0, sb.size - 1)):
                s = sa + sb[cand]
                heavier = np.maximum(s, total - s)
                j = int(np.argmin(heavier))
                if heavier[j] < best[0]:
                    best = (float(heavier[j]), int(ia[j]), int(order[cand[j]]))
    _, mask_a, mask_b = best
    labels = np.ones(m, dtype=np.int64)
    bits_a = (mask_a >> np.arange(h)) & 1
    bits_b = (mask_b >> np.arange(m - h)) & 1
    labels[:h][bits_a == 1] = 0
    labels[h:][bits_b == 1] = 0
    return labels
