"""Even out a rank split of groups by re-splitting pairs of ranks exactly.

With groups (all responses of a prompt on one rank) a rank holds only a few, large units,
so moves and swaps of single units often stall above the best split. This pass takes the
busiest rank and a lighter one, pools their units and tries *every* way to split the pool
in two (``2**k`` subsets for ``k`` pooled units, vectorised), keeping the one whose heavier
side is lightest and whose counts obey the size rule. Repeated while it lowers the busiest
rank. Deterministic; pools above ``max_pool`` units are skipped.
"""

from __future__ import annotations

import numpy as np

__all__ = ["repartition_pairs"]


def _best_split(w: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
    """Boolean mask of the pool's first side: least heavier side, counts in [lo, hi]."""
    k = w.size
    masks = np.arange(1 << k, dtype=np.int64)
    bits = (masks[:, None] >> np.arange(k)) & 1
    side = bits @ w
    cnt = bits.sum(axis=1)
    ok = (cnt >= lo) & (cnt <= hi) & (k - cnt >= lo) & (k - cnt <= hi)
    heavier = np.where(ok, np.maximum(side, w.sum() - side), np.inf)
    best = int(np.argmin(heavier))  # ties: the lowest mask, so the result is deterministic
    if not np.isfinite(heavier[best]):
        return None
    return bits[best].astype(bool)


def repartition_pairs(
    unit_w: np.ndarray,
    parts: list[list[int]],
    lo: int,
    hi: int,
    *,
    max_pool: int = 14,
    partners: int = 16,
    max_rounds: int | None = None,
) -> list[list[int]]:
    """Return ``parts`` (unit ids per rank) with a lighter or equal busiest rank.

    Every rank keeps between ``lo`` and ``hi`` units (``hi`` = any for no rule).
    """
    parts = [sorted(p) for p in parts]
    dp = len(parts)
    if dp < 2:
        return parts
    load = np.array([float(unit_w[p].sum()) if p else 0.0 for p in parts])
    rounds = max_rounds if max_rounds is not None else 4 * dp + 16
    tiny = 1e-12 * max(float(load.max()), 1e-300)
    for _ in range(rounds):
        h = int(np.argmax(load))
        improved = False
        for r in np.lexsort((np.arange(dp), load)).tolist()[:partners]:
            if r == h or len(parts[h]) + len(parts[r]) > max_pool:
                continue
            pool = np.array(parts[h] + parts[r], dtype=np.int64)
            mask = _best_split(unit_w[pool], lo, hi)
            if mask is None:
                continue
            a, b = pool[mask], pool[~mask]
            la, lb = float(unit_w[a].sum()), float(unit_w[b].sum())
            if max(la, lb) < load[h] - tiny:
                parts[h], parts[r] = sorted(a.tolist()), sorted(b.tolist())
                load[h], load[r] = la, lb
                improved = True
                break
        if not improved:
            break
    return parts
