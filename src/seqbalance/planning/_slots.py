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
    same_rank: bool = False,
) -> list[list[list[int]]]:
    """Return ``grid`` (``[rank][slot] -> indices``) with a lower or equal ``sum_j max_r``.

    Packed micro-batches only. Never breaks the capacity, never empties a micro-batch.
    ``same_rank=True`` moves and swaps sequences only between micro-batches of one rank, so
    every rank keeps its sequences (a size rule and groups stay met).
    """
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    if dp < 2 or m < 2:
        return grid
    items = [list(grid[r][j]) for j in range(m) for r in range(dp)]  # bin b = j * dp + r
    slot = np.repeat(np.arange(m), dp)
    # Bins a sequence of bin b may go to: another slot, and the same rank if asked.
    rank = np.tile(np.arange(dp), m) if same_rank else np.zeros(dp * m, dtype=np.int64)
    cost = bin_totals(items, costs)
    tok = bin_totals(items, lengths)
    where = np.full(costs.shape[0], -1, dtype=np.int64)  # bin of each sequence
    for b, x in enumerate(items):
        where[np.asarray(x, dtype=np.int64)] = b
    placed = np.flatnonzero(where >= 0)
    swap_budget = _SWAP_BUDGET  # elements of (top-bin items x sequences) left to scan
    tiny = 1e-12 * max(float(cost.max()), 1e-300)
    # Nothing to gain once the step is within 1e-4 of the simple bound max(sum/dp, max).
    good_enough = (1 + 1e-4) * max(float(cost.sum()) / dp, float(costs.max(initial=0.0)))
    for _ in range(max_steps):
        by_slot = cost.reshape(m, dp)
        level = by_slot.max(axis=1)
        if level.sum() <= good_enough:
            break
        top = by_slot.argmax(axis=1) + np.arange(m) * dp
        second = np.sort(by_slot, axis=1)[:, -2]
        slack = level[slot] - cost
        room = cap - tok
        step = None
        for j in np.lexsort((np.arange(m), -level)).tolist():
            step = _best_move(
                items, int(top[j]), second[j], slot, rank, cost, slack, room, costs, lengths, tiny
            )
            if step is None and swap_budget > 0:
                swap_budget -= (len(items[int(top[j])]) + 8) * placed.size
                step = _best_swap(
                    items,
                    int(top[j]),
                    second[j],
                    slot,
                    rank,
                    cost,
                    slack,
                    room,
                    tok,
                    cap,
                    costs,
                    lengths,
                    placed,
                    where,
                    tiny,
                )
            if step is not None:
                break
        if step is None:
            break
        b, xi, dest, yi = step
        _shift(items, cost, tok, where, costs, lengths, xi, b, dest)
        if yi >= 0:
            _shift(items, cost, tok, where, costs, lengths, yi, dest, b)
    return [[items[j * dp + r] for j in range(m)] for r in range(dp)]


# Swap scans cost (items of a top bin) x (all sequences) each; this caps their total, which
# keeps the pass well under a second on large batches while small ones get the full search.
_SWAP_BUDGET = 1.5e7


def _shift(items, cost, tok, where, costs, lengths, i: int, src: int, dst: int) -> None:
    items[src].remove(i)
    items[dst].append(i)
    cost[src] -= costs[i]
    cost[dst] += costs[i]
    tok[src] -= lengths[i]
    tok[dst] += lengths[i]
    where[i] = dst


def _best_move(items, b, second, slot, rank, cost, slack, room, costs, lengths, tiny):
    """Move one sequence off top bin ``b`` into a bin of another slot with slack and room."""
    if len(items[b]) < 2:  # a micro-batch must keep one sequence
        return None
    ib = np.asarray(items[b], dtype=np.int64)
    w, t = costs[ib], lengths[ib]
    ok = (slack[None, :] >= w[:, None]) & (room[None, :] >= t[:, None])
    ok[:, (slot == slot[b]) | (rank != rank[b])] = False  # same-slot moves: the packer's job
    gain = np.where(ok.any(axis=1), np.minimum(w, cost[b] - second), 0.0)
    x = int(np.argmax(gain))
    if gain[x] <= tiny:
        return None
    left = np.where(ok[x], slack - w[x], np.inf)  # best fit: least slack left over
    return b, int(ib[x]), int(np.argmin(left)), -1


def _best_swap(
    items, b, second, slot, rank, cost, slack, room, tok, cap, costs, lengths, placed, where, tiny
):
    """Swap a sequence of top bin ``b`` with a cheaper one of another slot's bin that has slack."""
    ib = np.asarray(items[b], dtype=np.int64)
    wx, tx = costs[ib][:, None], lengths[ib][:, None]
    d = where[placed]
    other = (slot[d] != slot[b]) & (rank[d] == rank[b])
    y, d = placed[other], d[other]
    wy, ty = costs[y][None, :], lengths[y][None, :]
    ok = (
        (wy < wx)
        & (slack[d][None, :] + wy >= wx)  # the other slot's level does not rise
        & (room[d][None, :] + ty >= tx)
        & (cap - tok[b] + tx >= ty)
    )
    gain = np.where(ok, np.minimum(wx - wy, cost[b] - second), 0.0)
    if gain.size == 0:
        return None
    flat = int(np.argmax(gain))
    if gain.flat[flat] <= tiny:
        return None
    x, k = divmod(flat, gain.shape[1])
    return b, int(ib[x]), int(d[k]), int(y[k])
