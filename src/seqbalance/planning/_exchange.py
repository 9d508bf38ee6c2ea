"""Even out rank loads under DDP by exchanging sequences between micro-batches of two ranks.

Under DDP a step waits once, for the busiest rank, so only each rank's total matters. The
packers fill micro-batches first and deal them to ranks second; when the micro-batches are
nearly full (long sequences, a tight ``max_tokens``) the dealing has little freedom and a
rank can stay visibly above the mean although sequences could still trade places.

Each step takes the busiest rank ``h`` and, in turn, the few lightest ranks ``p``, lighter
by ``D``. Swapping a sequence ``a`` of ``h`` with ``b`` of ``p`` (``d = w_a - w_b``) leaves
the pair at ``max(L_h - d, L_p + d)``: it helps iff ``0 < d < D`` and is best near
``D / 2``. A swap is allowed when both micro-batches stay within the token capacity; it
keeps every count (sequences per rank and per micro-batch), so size rules and non-empty
micro-batches hold. In free mode a sequence may also move into a micro-batch of ``p`` with
room, unless that would empty its own micro-batch. The best exchange of the first partner
that has one is applied; the busiest rank never gets heavier, the sum of squared loads falls,
and the pass stops when no partner helps or its work cap is reached. Each step costs
O(s_h * s_p) for ranks holding ``s`` sequences (one vectorised comparison); pairs above
``max_pair`` candidates are skipped, which only happens when ranks hold thousands of
sequences, where totals are already even. Deterministic: ties go to the lowest index.
"""

from __future__ import annotations

import numpy as np

__all__ = ["exchange_between_ranks"]

_PARTNERS = 4  # lightest ranks tried per step
_MAX_PAIR = 1 << 20  # candidate pairs compared in one step
_MAX_WORK = 1 << 24  # candidate pairs compared in the whole pass


def exchange_between_ranks(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    lengths: np.ndarray,
    cap: int,
    *,
    moves: bool,
    allow_empty: bool,
    max_steps: int | None = None,
) -> list[list[list[int]]]:
    """Return ``grid`` with sequences exchanged so that the busiest rank is lighter.

    Parameters
    ----------
    grid : list of list of list of int
        ``grid[r][j]``: sequence indices of micro-batch ``j`` of rank ``r``.
    costs, lengths : numpy.ndarray
        Per-sequence cost and token count.
    cap : int
        Token capacity of one micro-batch.
    moves : bool
        Also move single sequences (changes per-rank counts: only for the free size rule).
    allow_empty : bool
        Whether a move may empty a micro-batch.
    max_steps : int, optional
        Exchanges applied at most; default ``4 * ranks + 64``.

    Returns
    -------
    list of list of list of int
        A new grid (the input is not modified), or ``grid`` itself when nothing helped.
        Every micro-batch keeps within ``cap``; every index stays exactly once.
    """
    dp = len(grid)
    if dp < 2 or not grid[0]:
        return grid
    steps = 4 * dp + 64 if max_steps is None else max_steps
    ranks = _Ranks(grid, costs, lengths, cap)
    loads = ranks.loads
    work, changed = 0, False
    for _ in range(steps):
        h = int(np.argmax(loads))
        done = True
        for p in np.argsort(loads, kind="stable")[:_PARTNERS].tolist():
            gap = loads[h] - loads[p]
            if p == h or gap <= 0:
                continue
            pairs = ranks.seqs[h].size * ranks.seqs[p].size
            if pairs > _MAX_PAIR or work + pairs > _MAX_WORK:
                continue
            work += pairs
            best = ranks.best_exchange(h, p, gap, moves, allow_empty)
            if best is None:
                continue
            ranks.apply(best, h, p)
            changed, done = True, False
            break
        if done:
            break
    return ranks.grid() if changed else grid


_Exchange = tuple[str, int, int]  # ("swap", a, b) or ("move", a, j)


class _Ranks:
    """Per rank: sequence ids, the micro-batch each sits in, and per micro-batch its tokens
    and sequence count; the rank loads. Updated in place by :meth:`apply`."""

    def __init__(
        self, grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int
    ) -> None:
        self.costs, self.lengths, self.cap, self.m = costs, lengths, cap, len(grid[0])
        self.seqs = [np.array([i for mb in rank for i in mb], dtype=np.int64) for rank in grid]
        self.slot = [np.repeat(np.arange(len(rank)), [len(mb) for mb in rank]) for rank in grid]
        self.tok = [
            np.array([int(lengths[mb].sum()) for mb in rank], dtype=np.int64) for rank in grid
        ]
        self.cnt = [np.array([len(mb) for mb in rank], dtype=np.int64) for rank in grid]
        self.loads = np.array([float(costs[s].sum()) for s in self.seqs])

    def best_exchange(
        self, h: int, p: int, gap: float, moves: bool, allow_empty: bool
    ) -> _Exchange | None:
        """The exchange between ranks ``h`` and ``p`` that leaves the pair closest to even
        (positions in the ranks' arrays), or None when none lowers ``h``."""
        seqs, slot, tok, cap = self.seqs, self.slot, self.tok, self.cap
        wa, wb = self.costs[seqs[h]], self.costs[seqs[p]]
        la, lb = self.lengths[seqs[h]], self.lengths[seqs[p]]
        room_a = cap - tok[h][slot[h]] + la  # tokens a's micro-batch can take in place of a
        room_b = cap - tok[p][slot[p]] + lb
        d = np.subtract.outer(wa, wb).astype(np.float64, copy=False)
        # (in place: one step compares every pair of the two ranks, so temporaries count)
        ok = d > 0
        ok &= d < gap
        ok &= lb[None, :] <= room_a[:, None]
        ok &= la[:, None] <= room_b[None, :]
        best: _Exchange | None = None
        best_score = np.inf
        if ok.any():
            score = np.subtract(d, gap / 2, out=d)
            np.abs(score, out=score)
            score[~ok] = np.inf
            flat = int(np.argmin(score))
            best_score, best = float(score.flat[flat]), ("swap", flat // wb.size, flat % wb.size)
        if moves and wa.size:
            j = int(np.argmin(tok[p]))  # the roomiest micro-batch of p takes any that fits
            fits = (wa > 0) & (wa < gap) & (tok[p][j] + la <= cap)
            if not allow_empty:
                fits &= self.cnt[h][slot[h]] > 1
            mscore = np.where(fits, np.abs(wa - gap / 2), np.inf)
            a = int(np.argmin(mscore))
            if float(mscore[a]) < best_score:
                best = ("move", a, j)
        return best

    def apply(self, best: _Exchange, h: int, p: int) -> None:
        """Carry out ``best`` between ranks ``h`` and ``p``."""
        seqs, slot, tok, cnt, lengths = self.seqs, self.slot, self.tok, self.cnt, self.lengths
        kind, a, x = best
        sa, ja = int(seqs[h][a]), int(slot[h][a])
        if kind == "swap":
            sb, jb = int(seqs[p][x]), int(slot[p][x])
            d_tok = int(lengths[sb]) - int(lengths[sa])
            tok[h][ja] += d_tok
            tok[p][jb] -= d_tok
            seqs[h][a], seqs[p][x] = sb, sa
        else:
            tok[h][ja] -= int(lengths[sa])
            tok[p][x] += int(lengths[sa])
            cnt[h][ja] -= 1
            cnt[p][x] += 1
            seqs[h], slot[h] = np.delete(seqs[h], a), np.delete(slot[h], a)
            seqs[p], slot[p] = np.append(seqs[p], sa), np.append(slot[p], x)
        # Summed afresh, not updated, so rounding cannot accumulate over many steps.
        self.loads[h] = float(self.costs[seqs[h]].sum())
        self.loads[p] = float(self.costs[seqs[p]].sum())

    def grid(self) -> list[list[list[int]]]:
        """The micro-batches of every rank, indices ascending."""
        out = []
        for ids, where in zip(self.seqs, self.slot):
            order = np.argsort(ids, kind="stable")
            ids, where = ids[order], where[order]
            out.append([ids[where == j].tolist() for j in range(self.m)])
        return out
