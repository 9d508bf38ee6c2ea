"""Even out a rank split of groups by re-splitting pairs of ranks exactly.

With groups (all responses of a prompt on one rank) a rank holds only a few, large units,
so moves and swaps of single units often stall above the best split. This pass takes the
busiest rank and a lighter one, pools their units and tries *every* way to split the pool
in two (``2**k`` subsets for ``k`` pooled units, vectorised), keeping the one whose heavier
side is lightest and whose counts obey the size rule. Repeated while it lowers the busiest
rank. When no pair with the busiest rank helps, the next-heaviest ranks are evened out with
lighter ones (every accepted re-split lowers the heavier rank of its pair, so the busiest
rank never grows and the sum of squared loads falls: the search ends); that reshuffles the
units so that a later pair with the busiest rank can split better. Deterministic; pools
above ``max_pool`` units are skipped, and the subsets tried are capped by ``max_work``.
"""

from __future__ import annotations

from functools import cache

import numpy as np

__all__ = ["repartition_pairs"]


@cache
def _subsets(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every subset of ``k`` units as a row of 0.0/1.0 (row ``mask``: its bits), and each
    subset's size. Made once per ``k`` (at most ``2**k x k`` floats: 1.8 MB at 14) since a
    search tries hundreds of pools; the float rows give ``rows @ w`` exactly the sums the
    integer rows did (numpy casts those to float64 for the product)."""
    masks = np.arange(1 << k, dtype=np.int64)
    bits = (masks[:, None] >> np.arange(k)) & 1
    rows = bits.astype(np.float64)
    rows.flags.writeable = False
    cnt = bits.sum(axis=1)
    cnt.flags.writeable = False
    return rows, cnt


def _best_split(w: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
    """Boolean mask of the pool's first side: least heavier side, counts in [lo, hi]."""
    k = w.size
    bits, cnt = _subsets(k)
    side = bits @ w
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
    max_work: int = 1 << 22,
) -> list[list[int]]:
    """Return ``parts`` (unit ids per rank) with a lighter or equal busiest rank.

    Every rank keeps between ``lo`` and ``hi`` units (``hi`` = any for no rule). The search
    stops early when the busiest rank weighs no more than the heaviest unit or the mean
    load (no split does better).
    """
    parts = [sorted(p) for p in parts]
    dp = len(parts)
    if dp < 2:
        return parts
    load = np.array([float(unit_w[p].sum()) if p else 0.0 for p in parts])
    rounds = max_rounds if max_rounds is not None else 4 * dp + 16
    tiny = 1e-12 * max(float(load.max()), 1e-300)
    floor = max(float(unit_w.max(initial=0.0)), float(unit_w.sum()) / dp)
    work = 0
    ids = np.arange(dp)
    for _ in range(rounds):
        if load.max() <= floor + tiny:
            break  # proven optimal
        improved = False
        lightest = np.lexsort((ids, load)).tolist()
        # The busiest rank first; the others only when it cannot improve.
        for h in np.lexsort((ids, -load)).tolist():
            tried = 0
            for r in lightest:
                if load[r] >= load[h] or tried >= partners:
                    break
                if len(parts[h]) + len(parts[r]) > max_pool:
                    continue
                tried += 1
                pool = np.array(parts[h] + parts[r], dtype=np.int64)
                work += 1 << pool.size
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
            if improved or work > max_work:
                break
        if not improved or work > max_work:
            break
    return parts
