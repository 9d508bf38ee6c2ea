"""Lower the FSDP step time of a grid of micro-batches by filling slack in other slots.

Under FSDP the step costs ``sum_j max_r cost(r, j)``: each slot ``j`` (every rank's
``j``-th micro-batch) costs its heaviest micro-batch. A slot whose level is set by a
micro-batch with one very expensive sequence leaves the other ranks' micro-batches of that
slot with slack: work moved there is free. This pass repeatedly takes the heaviest
micro-batch of a slot and moves one of its sequences to a micro-batch of another slot that
has the slack (cost stays at or below its slot's level) and the token room for it.
"""

from __future__ import annotations

import numpy as np

from ._grouping import bin_totals

__all__ = ["fill_slack"]


def fill_slack(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    lengths: np.ndarray,
    cap: int,
    *,
    max_steps: int,
) -> list[list[list[int]]]:
    """Return ``grid`` (``[rank][slot] -> indices``) with a lower or equal ``sum_j max_r``.

    Packed micro-batches only. Never breaks the capacity, never empties a micro-batch.
    """
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    if dp < 2 or m < 2:
        return grid
    items = [list(grid[r][j]) for j in range(m) for r in range(dp)]  # bin b = j * dp + r
    slot = np.repeat(np.arange(m), dp)
    cost = bin_totals(items, costs)
    tok = bin_totals(items, lengths)
    tiny = 1e-12 * max(float(cost.max()), 1e-300)
    # Nothing to gain once the step is within 1e-4 of the simple bound max(sum/dp, max).
    good_enough = (1 + 1e-4) * max(float(cost.sum()) / dp, float(costs.max(initial=0.0)))
    for _ in range(max_steps):
        by_slot = cost.reshape(m, dp)
        level = by_slot.max(axis=1)
        if level.sum() <= good_enough:
            break
        top = by_slot.argmax(axis=1) + np.arange(m) * dp
        srt = np.sort(by_slot, axis=1)
        second = srt[:, -2]
        slack = level[slot] - cost
        room = cap - tok
        moved = False
        for j in np.lexsort((np.arange(m), -level)).tolist():
            b = int(top[j])
            if len(items[b]) < 2:
                continue
            ib = np.asarray(items[b], dtype=np.int64)
            w, t = costs[ib], lengths[ib]
            ok = (slack[None, :] >= w[:, None]) & (room[None, :] >= t[:, None])
            ok[:, slot == j] = False  # same-slot moves are the packer's job
            gain = np.minimum(w, cost[b] - second[j])
            gain = np.where(ok.any(axis=1), gain, 0.0)
            x = int(np.argmax(gain))
            if gain[x] <= tiny:
                continue
            # Best fit: the target with the least slack left over.
            left = np.where(ok[x], slack - w[x], np.inf)
            dest = int(np.argmin(left))
            xi = int(ib[x])
            items[b].remove(xi)
            items[dest].append(xi)
            cost[b] -= costs[xi]
            cost[dest] += costs[xi]
            tok[b] -= lengths[xi]
            tok[dest] += lengths[xi]
            moved = True
            break
        if not moved:
            break
    return [[items[j * dp + r] for j in range(m)] for r in range(dp)]
