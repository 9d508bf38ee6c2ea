"""Lower the FSDP step time of a grid of micro-batches by filling slack in other slots.

Under FSDP the step costs ``sum_j max_r cost(r, j)``: each slot ``j`` (every rank's
``j``-th micro-batch) costs its heaviest micro-batch. A slot whose level is set by a
micro-batch with one very expensive sequence leaves the other ranks' micro-batches of that
slot with slack: work moved there is free. This pass repeatedly takes the heaviest
micro-batch of a slot and moves one of its sequences to a micro-batch of another slot that
has the slack (cost stays at or below its slot's level) and the token room for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._grouping import bin_summer, bin_totals
from ._work import charge
from .bounds import fsdp_slot_bound

__all__ = ["fill_slack", "fill_to_levels", "too_big_to_refill"]


def fill_slack(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    lengths: np.ndarray,
    cap: int,
    *,
    max_steps: int,
    same_rank: bool = False,
    swap_work: float | None = None,
    move_work: float | None = None,
    retry: bool = True,
    stop_at: float | None = None,
) -> list[list[list[int]]]:
    """Return ``grid`` (``[rank][slot] -> indices``) with a lower or equal ``sum_j max_r``.

    Packed micro-batches only. Never breaks the capacity, never empties a micro-batch.
    ``same_rank=True`` moves and swaps sequences only between micro-batches of one rank, so
    every rank keeps its sequences (a size rule and groups stay met). ``swap_work``: the
    budget of the swap scans, in (top-bin sequences + 8) x (all sequences) elements
    (default ``_SWAP_BUDGET``); ``move_work``: the budget of the move scans, in
    (top-bin sequences) x (destination bins) elements (default: none). Both are counted
    in elements, never in time, so every rank stops at the same step. ``retry=False``: a
    slot where no move or swap was found is not searched again until a step changes it
    (faster; a step elsewhere can open room for it, which is then missed). ``stop_at``:
    stop once ``sum_j max_r`` is at most this (a step the caller needs no better than).
    """
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    if dp < 2 or m < 2:
        return grid
    items = [list(grid[r][j]) for j in range(m) for r in range(dp)]  # bin b = j * dp + r
    slot = np.repeat(np.arange(m), dp)
    # Bins a sequence of bin b may go to: another slot's (same-slot moves are the packer's
    # job), of b's rank if asked (rank 0 for every bin otherwise).
    rank = np.tile(np.arange(dp), m) if same_rank else np.zeros(dp * m, dtype=np.int64)
    sums = bin_summer(items)
    cost = sums(costs)
    tok = sums(lengths)
    where = np.full(costs.shape[0], -1, dtype=np.int64)  # bin of each sequence
    where[sums.flat] = sums.labels
    placed = np.flatnonzero(where >= 0)
    # The swap scans' per-sequence arrays (placed sequences, ascending): the sequence's
    # cost and tokens never change; its bin, that bin's slot and rank change only for the
    # sequences a step moves (kept up to date by _Placed.shift).
    seqs = _Placed(placed, where, slot, rank, costs, lengths)
    n_dests = m - 1 if same_rank else dp * (m - 1)  # the bins a sequence may go to
    # elements of (top-bin items x sequences) left to scan, and of (items x bins) for moves
    swap_budget = _SWAP_BUDGET if swap_work is None else swap_work
    move_budget = np.inf if move_work is None else move_work
    stuck = np.zeros(m, dtype=bool)  # retry=False: slots searched in vain since they changed
    tiny = 1e-12 * max(float(cost.max()), 1e-300)
    # Nothing to gain once the step is within 1e-4 of the simple bound max(sum/dp, max).
    good_enough = (1 + 1e-4) * max(float(cost.sum()) / dp, float(costs.max(initial=0.0)))
    if stop_at is not None:
        good_enough = max(good_enough, stop_at)
    # Each slot's level, heaviest bin and second-heaviest cost; a step changes two slots,
    # and only their rows are read again (`cost` changes in place under `by_slot`).
    by_slot = cost.reshape(m, dp)
    level = by_slot.max(axis=1)
    top = by_slot.argmax(axis=1) + np.arange(m) * dp
    second = np.partition(by_slot, dp - 2, axis=1)[:, dp - 2]
    scans = 0  # move scans, and swap scans at _SWAP_UNITS each: the request's work meter
    capped = False  # whether the last swap found lowered its bin all the way to the second
    for _ in range(max_steps):
        if level.sum() <= good_enough:
            break
        slack = level[slot] - cost
        room = cap - tok
        most_room = None  # the largest room of any bin, read once a step when needed
        step = None
        view = None  # the swap scans' per-sequence arrays, made once a step when needed
        for j in _by_level(level):  # (ties: lower slot)
            if level[j] <= tiny:
                break  # this slot and the rest hold no cost: nothing to move off them
            if stuck[j]:
                continue
            b = int(top[j])
            if move_budget <= 0:
                break
            held = items[b]
            move_budget -= len(held) * n_dests
            top_bin = _TopBin(held, costs, lengths)
            if most_room is None:
                most_room = room.max()
            # (a micro-batch keeps one sequence; no bin with room for the shortest: no move)
            if len(held) > 1 and top_bin.t_min <= most_room:
                step = _best_move(top_bin, b, second[j], dp, b % dp if same_rank else -1, cost,
                                  slack, room, tiny)  # fmt: skip
            scans += 1
            if step is None and swap_budget > 0:
                scans += _SWAP_UNITS
                swap_budget -= (len(held) + 8) * placed.size
                if view is None:
                    view = seqs.view(slack, room)
                step, capped = _best_swap(top_bin, b, second[j], slot, rank, cost, tok, cap,
                                          placed, view, tiny, capped)  # fmt: skip
            if step is not None:
                break
            stuck[j] = not retry
        if step is None:
            break
        b, xi, dest, yi = step
        stuck[slot[b]] = stuck[slot[dest]] = False
        _shift(items, cost, tok, where, costs, lengths, xi, b, dest)
        seqs.shift(xi, dest)
        if yi >= 0:
            _shift(items, cost, tok, where, costs, lengths, yi, dest, b)
            seqs.shift(yi, b)
        for j in {int(slot[b]), int(slot[dest])}:
            row = by_slot[j]
            if dp <= _LIST_ROW:  # (a few ranks: plain Python is faster than numpy calls)
                vals = row.tolist()
                high = max(vals)
                level[j], top[j] = high, vals.index(high) + j * dp
                second[j] = sorted(vals)[dp - 2]
            else:
                level[j], top[j] = row.max(), row.argmax() + j * dp
                second[j] = np.partition(row, dp - 2)[dp - 2]
    charge(scans)
    return [[items[j * dp + r] for j in range(m)] for r in range(dp)]


# Slots of at most this many ranks are updated with Python lists after a step (the same
# maximum, first position of it and second-largest cost as numpy's, in fewer calls).
_LIST_ROW = 32

# Top-bin sequences a swap scan looks at one at a time, after a swap that lowered its bin
# to the slot's second, before it scans every pair: on rl-math, 1,024 sequences over 8
# ranks x 19, each of the slot-first plan's 63 swaps is found on one of the first four
# (24 on the first, 33 on the second); a bin of many short sequences with no such swap
# pays at most this many passes more.
_ROWS_FIRST = 4

# A swap scan's work in move scans (measured: about 90 us against 25 us).
_SWAP_UNITS = 4

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


def _by_level(level: np.ndarray) -> Iterator[int]:
    """Slot indices by level, highest first (ties: lower slot), the first without a
    sort: a step nearly always comes from the highest slot."""
    first = int(level.argmax())
    yield first
    for j in np.argsort(-level, kind="stable").tolist():
        if j != first:
            yield j


class _TopBin:
    """A top bin's sequences as arrays, with their cost and token extremes (which bound
    which destinations and partners either scan can use)."""

    __slots__ = ("ib", "t", "t_max", "t_min", "ts", "w", "w_max", "w_min", "ws")

    def __init__(self, held, costs, lengths) -> None:
        self.ib = np.asarray(held, dtype=np.int64)
        self.w, self.t = costs[self.ib], lengths[self.ib]
        # (a few sequences: their extremes in Python, fewer calls than numpy's)
        self.ws, self.ts = self.w.tolist(), self.t.tolist()
        self.w_min, self.w_max = min(self.ws), max(self.ws)
        self.t_min, self.t_max = min(self.ts), max(self.ts)


def _best_move(top_bin, b, second, dp, r, cost, slack, room, tiny):
    """Move one sequence off top bin ``b`` (``top_bin``: its sequences, at least two, since
    a micro-batch must keep one) into a bin of another slot (of rank ``r`` only if
    ``r >= 0``) with slack and room: the sequence that lowers ``b`` most, into the bin it
    leaves the least slack in (ties: the first sequence, the lowest bin)."""
    w = top_bin.w
    s = b // dp  # b's slot
    # Only bins with the slack and room for the cheapest and shortest sequence can take
    # any (the same comparisons as below, so the pick is the one over all destinations).
    if r < 0:  # every bin of another slot, in bin order
        fit = (slack >= top_bin.w_min) & (room >= top_bin.t_min)
        fit[s * dp : (s + 1) * dp] = False
        near = np.flatnonzero(fit)
    else:  # rank r's bin of every other slot: bins r, r + dp, ...
        fit = (slack[r::dp] >= top_bin.w_min) & (room[r::dp] >= top_bin.t_min)
        fit[s] = False
        near = np.flatnonzero(fit) * dp + r
    if near.size == 0:
        return None
    slack_d, room_d = slack[near], room[near]
    ok = (slack_d[None, :] >= w[:, None]) & (room_d[None, :] >= top_bin.t[:, None])
    gain = np.where(ok.any(axis=1), np.minimum(w, cost[b] - second), 0.0)
    x = int(np.argmax(gain))
    if gain[x] <= tiny:
        return None
    left = np.where(ok[x], slack_d - w[x], np.inf)  # best fit: least slack left over
    return b, int(top_bin.ib[x]), int(near[int(np.argmin(left))]), -1


class _Placed:
    """The placed sequences (ascending) with their cost, tokens, bin, and that bin's slot
    and rank, for the swap scans; :meth:`shift` follows a sequence to its new bin."""

    def __init__(self, placed, where, slot, rank, costs, lengths) -> None:
        self.pos = np.full(where.shape[0], -1, dtype=np.int64)
        self.pos[placed] = np.arange(placed.size)
        self.slot_of, self.rank_of = slot, rank
        self.ranked = bool(rank.any())  # (else every bin may swap with every other slot's)
        self.d = where[placed]
        self.slot_d, self.rank_d = slot[self.d], rank[self.d]
        self.w, self.t = costs[placed], lengths[placed]

    def shift(self, i: int, dst: int) -> None:
        k = self.pos[i]
        self.d[k], self.slot_d[k], self.rank_d[k] = dst, self.slot_of[dst], self.rank_of[dst]

    def view(self, slack, room) -> tuple:
        """Per placed sequence: its bin, slot, rank (None where ranks do not matter),
        cost, tokens, and its bin's slack and room each plus its own cost and tokens;
        shared by a step's swap scans (nothing moves between them)."""
        d = self.d
        return (d, self.slot_d, self.rank_d if self.ranked else None, self.w, self.t,
                slack[d] + self.w, room[d] + self.t)  # fmt: skip


def _best_swap(top_bin, b, second, slot, rank, cost, tok, cap, placed, view, tiny, rows_first):
    """Swap a sequence of top bin ``b`` (``top_bin``: its sequences) with a cheaper one of
    another slot's bin that has slack (``view``: :meth:`_Placed.view` of this step): the
    step, or None, and whether its gain is the most any swap can have (``b`` down to the
    slot's second-heaviest bin). ``rows_first``: look for such a swap one sequence of
    ``b`` at a time first (the same pick; cheaper where one is found early, as after a
    swap that had it)."""
    d_all, slot_d, rank_d, w_all, t_all, slack_w, room_t = view
    # A swap lowers ``b`` by at most ``cap_gain``: down to the second-heaviest bin.
    cap_gain = cost[b] - second
    if cap_gain <= tiny:
        return None, False
    room_b = cap - tok[b]
    other = slot_d != slot[b]
    if rank_d is not None:
        other &= rank_d == rank[b]
    if rows_first:
        # The first pair in (sequence of b, partner) order whose gain is the cap is the
        # scan's pick below: no gain is above the cap, and the scan takes the first best.
        # Sequences cheaper than the cap have no such partner (costs are >= 0); after
        # _ROWS_FIRST sequences without one the scan below runs (the same pick either way).
        rows = 0
        for x, (wx, tx) in enumerate(zip(top_bin.ws, top_bin.ts)):
            if wx < cap_gain:
                continue
            ok = other & (wx - w_all >= cap_gain) & (slack_w >= wx) & (room_t >= tx)
            ok &= room_b + tx >= t_all
            k = int(ok.argmax())
            if ok[k]:
                return (b, int(top_bin.ib[x]), int(d_all[k]), int(placed[k])), True
            rows += 1
            if rows == _ROWS_FIRST:
                break
    # Only sequences that pass every test below for some sequence of ``b`` can be swapped
    # (the same comparisons against the extremes of ``b``'s costs and tokens): the 2-D
    # scan runs over those, in the same order, so it picks what the full scan would.
    keep = other
    keep &= w_all < top_bin.w_max
    keep &= slack_w >= top_bin.w_min
    keep &= room_t >= top_bin.t_min
    keep &= room_b + top_bin.t_max >= t_all
    cand = np.flatnonzero(keep)
    if cand.size == 0:
        return None, False
    w_y, t_y, slack_y, room_y = w_all[cand], t_all[cand], slack_w[cand], room_t[cand]
    wx, tx = top_bin.w[:, None], top_bin.t[:, None]
    # A pair where the partner is not cheaper gains nothing (at most 0, never above
    # ``tiny``), so only the slack and the rooms are masked.
    gain = np.minimum(wx - w_y[None, :], cap_gain)
    gain *= (
        (slack_y[None, :] >= wx)  # the other slot's level does not rise
        & (room_y[None, :] >= tx)
        & (room_b + tx >= t_y[None, :])
    )
    flat = int(np.argmax(gain))
    if gain.flat[flat] <= tiny:
        return None, False
    x, k = divmod(flat, gain.shape[1])
    at = int(cand[k])
    capped = bool(gain.flat[flat] == cap_gain)
    return (b, int(top_bin.ib[x]), int(d_all[at]), int(placed[at])), capped


# Subsets of a rank's costliest sequences tried as the core of each slot's micro-batch:
# 2**head of them, each completed greedily, head at most _LEVEL_HEAD and fewer where
# dp x sequences-per-rank x slots is large (_LEVEL_WORK). Measured on bimodal lengths:
# 64 ranks, gap 0.14% with 3 or 6, 1.4% with 1; 256 ranks x 5 slots, 0.03% with 6, 0.05%
# with 3, for 0.16 s against 0.06 s.
_LEVEL_HEAD = 6
_LEVEL_WORK = 4e6
# Above this dp x sequences-per-rank x (slots - 1) the refill is skipped: its greedy pass
# steps through every sequence position of every slot (65,536 truncated rollouts over
# 1,024 ranks x 15 slots, 9e5 with ranks split first: 0.35 s a candidate for a gap of
# 0.9% instead of 1.1%).
_LEVEL_MAX_WORK = 5e5


def fill_to_levels(
    grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int,
    slot_bound: float | None = None, passes: list[int] | None = None,
) -> list[list[list[int]]]:
    """Repack every rank's sequences so each slot is filled up to a target level.

    A slot whose level is set by one expensive micro-batch leaves the other ranks idle in
    it, unless they put as much of their own work there as fits. Single moves and swaps
    (:func:`fill_slack`) cannot do that when the work would have to come as several
    sequences in exchange for one. Here each rank re-chooses its micro-batches, slots in
    order of target, highest first: the subset of its remaining sequences with the most
    cost within the target and the capacity (every in/out choice of its few costliest
    sequences, each completed by the rest, costliest first, where they fit); the slot with
    the lowest target takes what is left. With three slots or more, the third-lowest
    target's micro-batch is chosen among its fullest fills by how little the last slot
    then overflows (:func:`_fill_ahead`); a heuristic, so on small grids
    (``_LEVEL_BOTH_WORK``) every pass also runs without it and the better plan is kept.
    A rank keeps its micro-batches when that leaves a micro-batch empty or over the
    capacity. Two sets of targets: the slots' present
    levels, and water-filled ones (:func:`_water_levels`); each is first tried with one
    cheap pass (only the costliest sequence in or out), and only a set that gained is
    searched further, in rounds (each round's levels the next one's targets) while
    ``sum_j max_r`` falls.

    Packed micro-batches only; every rank keeps its sequences (a size rule and groups stay
    met). Returns ``grid`` itself when nothing improves, or when ``dp`` x sequences per
    rank x (slots - 1) exceeds ``_LEVEL_MAX_WORK``. ``slot_bound``: the grid's
    :func:`.bounds.fsdp_slot_bound` if the caller has it (computed here otherwise).
    ``passes``: ``[k]``, the most passes (one pass of every rank toward a set of targets)
    to run; ``k`` is lowered by the passes run, and the search stops with the best grid
    so far when it reaches 0.
    """
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    if dp < 2 or m < 2:
        return grid
    if too_big_to_refill(grid):
        return grid
    width = max(sum(len(mb) for mb in rank) for rank in grid)
    start, level = _slot_levels(grid, costs)
    if not _worth_levelling(grid, costs, lengths, cap, start, slot_bound):
        return grid
    head = int(np.clip(np.floor(np.log2(_LEVEL_WORK / (dp * width * (m - 1)))), 1, _LEVEL_HEAD))
    best = (start, grid)
    targets = (level, _water_levels(grid, costs, lengths, cap, level))
    # The look-ahead is a heuristic, not a dominance: where the passes are cheap they are
    # also run without it, and the better result is kept.
    both = m >= 3 and dp * width * (m - 1) <= _LEVEL_BOTH_WORK

    def spend() -> bool:  # one more pass, if the budget has it
        if passes is None:
            return True
        if passes[0] <= 0:
            return False
        passes[0] -= 1
        return True

    for ahead, first in ((a, t) for a in ((True, False) if both else (True,)) for t in targets):
        target = first
        # A cheap probe first (the costliest sequence in or out, the rest greedy): a target
        # that does not help there is left.
        if not spend():
            break
        probe = _refill(grid, costs, lengths, cap, target, head=1, ahead=ahead)
        probe_step, _ = _slot_levels(probe, costs)
        if not probe_step < start * (1.0 - _LEVEL_ROUND_GAIN):
            continue
        if probe_step < best[0]:
            best = (probe_step, probe)
        g, step = grid, start
        for _ in range(3):
            if not spend():
                break
            new = _refill(g, costs, lengths, cap, target, head=head, ahead=ahead)
            new_step, target = _slot_levels(new, costs)
            if not new_step < step:
                break
            g, step, gain = new, new_step, step - new_step
            if gain <= _LEVEL_ROUND_GAIN * step:
                break
        if step < best[0]:
            best = (step, g)
    return best[1]


# fill_to_levels runs only where the step is more than this far above the FSDP bound of
# the grid's work, and another round only after a round that gained more than this.
_LEVEL_MIN_GAP = 5e-3
_LEVEL_ROUND_GAIN = 1e-4


def too_big_to_refill(grid: list[list[list[int]]]) -> bool:
    """Whether :func:`fill_to_levels` skips ``grid``: ``dp`` x sequences per rank x
    (slots - 1) above ``_LEVEL_MAX_WORK``."""
    dp = len(grid)
    m = len(grid[0]) if dp else 0
    width = max((sum(len(mb) for mb in rank) for rank in grid), default=0)
    return dp * width * max(m - 1, 0) > _LEVEL_MAX_WORK


def _worth_levelling(
    grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int,
    step: float, slot_bound: float | None,
) -> bool:
    """Whether ``step`` is more than ``_LEVEL_MIN_GAP`` above a bound no packing of the
    grid's sequences beats (the cheap one first; the costlier FSDP terms, ``slot_bound``
    unless given, only if needed)."""
    dp = len(grid)
    items = np.fromiter((i for rank in grid for mb in rank for i in mb), dtype=np.int64)
    c, t = costs[items], lengths[items]
    floor = max(float(c.sum()) / dp, float(c.max(initial=0.0)))
    if step <= floor * (1.0 + _LEVEL_MIN_GAP):
        return False
    if slot_bound is None:
        slot_bound = fsdp_slot_bound(c, t, dp, cap)
    floor = max(floor, slot_bound)
    return step > floor * (1.0 + _LEVEL_MIN_GAP)


def _water_levels(
    grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int,
    level: np.ndarray,
) -> np.ndarray:
    """Slot targets that hold the busiest rank's total with the least ``sum_j``.

    Slot floors: the costliest sequence (some slot holds it), then every ``dp``-th of the
    sequences that no two of share a micro-batch (longer than ``cap / 2``; ``dp`` of them
    per slot at most). Every slot is raised to a common water line, just high enough that
    the targets add up to the busiest rank's total. The floors go to the slots in the
    order of their present levels, highest first.
    """
    dp, m = len(grid), len(grid[0])
    items = np.fromiter((i for rank in grid for mb in rank for i in mb), dtype=np.int64)
    totals = bin_totals([[i for mb in rank for i in mb] for rank in grid], costs)
    big = np.sort(costs[items[2 * lengths[items] > cap]])[::-1][::dp][:m]
    floor = np.zeros(m)
    floor[: big.size] = big
    floor[0] = max(floor[0], float(costs[items].max()))
    need = float(totals.max())
    # The water line w with sum(max(floor, w)) = need: floors sorted high to low, the line
    # sits above the lowest m - i of them.
    f = np.sort(floor)[::-1]
    line = 0.0
    for i in range(m + 1):
        line = (need - f[:i].sum()) / (m - i) if i < m else 0.0
        if i == m or line >= f[i]:
            break
    target = np.maximum(floor, line)
    out = np.empty(m)
    out[np.lexsort((np.arange(m), -level))] = np.sort(target)[::-1]
    return out


def _slot_levels(grid: list[list[list[int]]], costs: np.ndarray) -> tuple[float, np.ndarray]:
    dp, m = len(grid), len(grid[0])
    cost = bin_totals([mb for rank in grid for mb in rank], costs).reshape(dp, m)
    level = cost.max(axis=0).astype(np.float64)
    return float(level.sum()), level


def _refill(
    grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int,
    level: np.ndarray, head: int, ahead: bool = True,
) -> list[list[list[int]]]:
    """One pass of :func:`fill_to_levels` toward the targets ``level``, all ranks at once;
    ``ahead``: choose the third-lowest target's micro-batch by :func:`_fill_ahead`."""
    dp, m = len(grid), len(grid[0])
    # Each rank's sequences, costliest first (index breaks ties), in a padded matrix.
    sizes = np.array([sum(len(mb) for mb in rank) for rank in grid], dtype=np.int64)
    width = int(sizes.max())
    seq = np.full((dp, width), -1, dtype=np.int64)
    for r, rank in enumerate(grid):
        row = np.fromiter((i for mb in rank for i in mb), dtype=np.int64, count=int(sizes[r]))
        seq[r, : row.size] = row[np.lexsort((row, -costs[row]))]
    left = seq >= 0  # not yet placed
    c_all = np.where(left, costs[np.maximum(seq, 0)], 0.0)
    t_all = np.where(left, lengths[np.maximum(seq, 0)], 0)
    slot_of = np.full((dp, width), -1, dtype=np.int64)
    order = np.lexsort((np.arange(m), -level))  # highest level first
    for pos, j in enumerate(order[:-1].tolist()):
        if ahead and pos == m - 3 and _LOOKAHEAD > 1:
            # The last two slots split what is left: choose this slot's micro-batch among
            # its best few by how little the last slot then overflows its target.
            take = _fill_ahead(c_all, t_all, left, level[order[-3:]], cap, head)
        else:
            take = _best_fill(c_all, t_all, left, float(level[j]), cap, head)
        slot_of[take] = j
        left &= ~take
    slot_of[left] = int(order[-1])
    tokens = np.zeros((dp, m), dtype=np.int64)
    count = np.zeros((dp, m), dtype=np.int64)
    rows = np.repeat(np.arange(dp), width).reshape(dp, width)
    placed = seq >= 0
    np.add.at(tokens, (rows[placed], slot_of[placed]), t_all[placed])
    np.add.at(count, (rows[placed], slot_of[placed]), 1)
    ok = (tokens <= cap).all(axis=1) & (count > 0).all(axis=1)
    out = []
    for r in range(dp):
        if not ok[r]:
            out.append(grid[r])
            continue
        s, q = seq[r, : sizes[r]], slot_of[r, : sizes[r]]
        out.append([sorted(s[q == j].tolist()) for j in range(m)])
    return out


# With three slots or more, the third-lowest target's micro-batch is chosen among this many
# of its fullest fills by how the last two slots then split the rest (_fill_ahead). On
# rl-math over 256 ranks, 16 sequences a rank in 3 slots, the gap to the bound fell from
# 1.31% to 0.79% with 4 or 8 (1.04% with 16: other targets in later rounds); no other
# workload of bench/plan.py moved, and plan time moved by under 2%.
_LOOKAHEAD = 4
# Up to this much dp x sequences-per-rank x (slots - 1), fill_to_levels also runs its passes
# without the look-ahead and keeps the better plan (on ~1,050 random small plans the
# look-ahead alone was better in 26 and worse in 4).
_LEVEL_BOTH_WORK = 5e4


def _fill_ahead(
    c_all: np.ndarray, t_all: np.ndarray, left: np.ndarray, levels: np.ndarray, cap: int,
    head: int,
) -> np.ndarray:
    """Like :func:`_best_fill` toward ``levels[0]``, choosing per rank among the
    ``_LOOKAHEAD`` fullest fills the one after which the last slot (what the next fill,
    toward ``levels[1]``, leaves) overflows ``levels[2]`` least; ties: the fuller. A fill
    after which the cap breaks or a micro-batch stays empty counts as overflowing
    without limit."""
    dp = c_all.shape[0]
    c, masks = _best_fill(c_all, t_all, left, float(levels[0]), cap, head, candidates=True)
    ranked = np.argsort(-c, axis=1, kind="stable")[:, :_LOOKAHEAD]
    rows = np.arange(dp)
    over = np.empty(ranked.shape)
    for q in range(ranked.shape[1]):
        mask = masks[rows, ranked[:, q]]
        rest = left & ~mask
        nxt = _best_fill(c_all, t_all, rest, float(levels[1]), cap, head)
        last = rest & ~nxt
        # Summed position by position in a fixed order (as in _best_fill): ranks that plan
        # independently must pick the same candidate on near-ties. (A running sum adds
        # left to right; a plain sum may pair the terms differently.)
        part = np.where(last, c_all, 0.0)
        cost_last = np.cumsum(part, axis=1)[:, -1] if part.shape[1] else np.zeros(dp)
        excess = np.maximum(cost_last - float(levels[2]), 0.0)
        # Invalid, over the cap, or leaving a micro-batch empty (the rank would keep its old
        # micro-batches).
        bad = (c[rows, ranked[:, q]] < 0) | ((t_all * last).sum(axis=1) > cap)
        bad |= ~mask.any(axis=1) | ~nxt.any(axis=1) | ~last.any(axis=1)
        over[:, q] = np.where(bad, np.inf, excess)
    pick = ranked[rows, np.argmin(over, axis=1)]  # first minimum: the fuller on ties
    return masks[rows, pick]


def _best_fill(
    c_all: np.ndarray, t_all: np.ndarray, left: np.ndarray, level: float, cap: int, head: int,
    candidates: bool = False,
) -> Any:
    """Per rank, the sequences (a mask over ``left``) of one micro-batch filled toward
    ``level`` within ``cap``: the best of the greedy completions of every subset of the
    rank's ``head`` costliest remaining sequences. ``candidates``: instead, every
    subset's cost (-1 where invalid) and mask, shapes (dp, 2**head) and (dp, 2**head, n)."""
    dp, width = c_all.shape
    # Positions of each rank's first `head` remaining sequences (costliest first).
    rank_pos = np.cumsum(left, axis=1) - 1
    head_mask = left & (rank_pos < head)
    h = min(head, width)
    subsets = ((np.arange(1 << h)[:, None] >> np.arange(h)[None, :]) & 1).astype(bool)
    head_idx = np.zeros((dp, h), dtype=np.int64)
    head_ok = np.zeros((dp, h), dtype=bool)
    rr, cc = np.nonzero(head_mask)
    head_idx[rr, rank_pos[rr, cc]] = cc
    head_ok[rr, rank_pos[rr, cc]] = True
    hc = np.where(head_ok, np.take_along_axis(c_all, head_idx, axis=1), 0.0)
    ht = np.where(head_ok, np.take_along_axis(t_all, head_idx, axis=1), 0)
    # A subset may only name head sequences the rank has.
    valid = ~(subsets[None, :, :] & ~head_ok[:, None, :]).any(axis=2)
    # Subset sums added one head position at a time, in a fixed order (not a BLAS product,
    # whose summation order may differ between machines: ranks must agree bit for bit).
    c = np.zeros((dp, 1 << h))
    t = np.zeros((dp, 1 << h), dtype=np.int64)
    for b in range(h):
        c = c + np.where(subsets[None, :, b], hc[:, b, None], 0.0)
        t = t + np.where(subsets[None, :, b], ht[:, b, None], 0)
    valid &= (c <= level) & (t <= cap)
    rest = left & ~head_mask
    # took[k]: which (rank, subset) took position k; position-major, so that each column's
    # row is written whole (took.transpose(1, 2, 0) is the (dp, 2**head, n) mask).
    took = np.zeros((width, dp, 1 << h), dtype=bool)
    # A position a rank has no sequence left at costs inf and cap + 1 tokens, so it never
    # fits; a sequence that fits is added in place (the same sums as adding 0 elsewhere).
    # (Transposed copies: each column's values are then contiguous.)
    c_rest = np.where(rest, c_all, np.inf).T.copy()
    t_rest = np.where(rest, t_all, cap + 1).T.copy()
    cols = np.flatnonzero(rest.any(axis=0)).tolist()
    # (the work meter: a column costs about 8 us plus 1 ns per rank and subset; 25 us a unit)
    charge((h + len(cols)) * (1024 + (dp << h)) // 3200)
    cc, tt, fits = np.empty_like(c), np.empty_like(t), np.empty(c.shape, dtype=bool)
    # Where no rank's remaining sequences together exceed the cap, no fill can: the token
    # sums are left out (the same masks).
    tokens_bind = bool((np.where(left, t_all, 0).sum(axis=1) > cap).any())
    for k in cols:
        np.add(c, c_rest[k, :, None], out=cc)
        add = took[k]
        np.less_equal(cc, level, out=add)
        if tokens_bind:
            np.add(t, t_rest[k, :, None], out=tt)
            np.less_equal(tt, cap, out=fits)
            add &= fits
        add &= valid
        np.copyto(c, cc, where=add)
        if tokens_bind:
            np.copyto(t, tt, where=add)
    took = took.transpose(1, 2, 0)
    c = np.where(valid, c, -1.0)
    if candidates:
        rr, ss, hh = np.nonzero(subsets[None, :, :] & head_ok[:, None, :])
        took[rr, ss, head_idx[rr, hh]] = True
        return c, took
    pick = np.argmax(c, axis=1)  # first best subset: deterministic
    chosen = took[np.arange(dp), pick]
    sub = subsets[pick]  # (dp, h)
    chosen[np.repeat(np.arange(dp), h)[(sub & head_ok).ravel()],
           head_idx[sub & head_ok]] = True  # fmt: skip
    # (The empty subset is always valid, cost 0 and no tokens: every rank has a pick.)
    return chosen
