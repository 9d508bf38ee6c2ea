"""Micro-batch orderings, a free inverse permutation, and fixed sequence counts.

Three small additions the framework drop-ins (:mod:`seqbalance.compat`) need and other
callers can use:

- :func:`inverse_permutation`: ``inv[perm[i]] = i``, checked.
- :func:`order_grid`: the order in which each rank runs its micro-batches. ``plan(...,
  order=...)`` applies it as its last step. Slot orders (``"heaviest_first"``,
  ``"light_ends"``) permute micro-batch slots the same way on every rank, so micro-batches
  that ran side by side still do and the simulated step time is unchanged; ``"index"``
  sorts each rank on its own.
- :func:`fixed_count_bins`: micro-batches holding a fixed number of sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_lengths
from ..partitioning.kway import partition_arrays
from ._grouping import bin_totals

__all__ = [
    "ORDERS",
    "OVERSIZED",
    "fixed_count_bins",
    "inverse_permutation",
    "order_grid",
    "separate_oversized",
    "shares_oversized",
]

ORDERS = ("heaviest_first", "index", "light_ends")
OVERSIZED = ("error", "alone")


def inverse_permutation(perm: Any) -> np.ndarray:
    """The inverse of a permutation of ``0..n-1``: ``inv[perm[i]] == i``.

    Parameters
    ----------
    perm : array-like of int
        Each of ``0..n-1`` exactly once (a list, numpy array, or anything array-like).

    Returns
    -------
    np.ndarray
        int64 array ``inv`` with ``inv[perm] == arange(n)``, so that
        ``reordered[inv]`` restores the order ``reordered = data[perm]`` came from.

    Raises
    ------
    ValueError
        If ``perm`` is not 1-D integers, or misses or repeats an index (the first one is
        named).

    Examples
    --------
    >>> inverse_permutation([2, 0, 1]).tolist()
    [1, 2, 0]
    """
    p = as_lengths(perm, "perm")  # 1-D, whole, non-negative, int64
    n = p.shape[0]
    if n and int(p.max()) >= n:
        i = int(np.flatnonzero(p >= n)[0])
        raise ValueError(
            f"perm[{i}] = {int(p[i])} is out of range for a permutation of {n} items; "
            f"pass each of 0..{n - 1} exactly once"
        )
    seen = np.bincount(p, minlength=n)
    if (seen != 1).any():
        missing = int(np.flatnonzero(seen == 0)[0])
        raise ValueError(
            f"perm is not a permutation: index {missing} is missing "
            f"(and {int((seen > 1).sum())} indices repeat); pass each of 0..{n - 1} once"
        )
    inv = np.empty(n, dtype=np.int64)
    inv[p] = np.arange(n, dtype=np.int64)
    return inv


def _light_ends(desc: list[int]) -> list[int]:
    """Heaviest in the middle, lightest at both ends: every other item, mirrored."""
    return desc[::2][::-1] + desc[1::2]


def order_grid(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    per_microbatch: float,
    padded: bool,
    order: str,
) -> list[list[list[int]]]:
    """Reorder each rank's micro-batches (validated inputs; ``order`` in :data:`ORDERS`).

    ``"heaviest_first"``: slots by descending cost (a slot's cost is its heaviest
    micro-batch over the ranks). ``"light_ends"``: the same descending list dealt so that
    the heaviest slots sit in the middle and the lightest at both ends, which shortens
    pipeline warm-up and cool-down (verl's order). ``"index"``: each rank's micro-batches
    by their smallest sequence index (empty ones last). Ties keep the current order.
    """
    if order == "index":
        big = np.iinfo(np.int64).max
        return [sorted(rank, key=lambda mb: min(mb) if mb else big) for rank in grid]
    m = max((len(rank) for rank in grid), default=0)
    slot_cost = np.zeros(m)
    for rank in grid:
        c = bin_totals(rank, costs, padded=padded) + per_microbatch
        slot_cost[: len(rank)] = np.maximum(slot_cost[: len(rank)], c)
    desc = np.lexsort((np.arange(m), -slot_cost)).tolist()
    perm = desc if order == "heaviest_first" else _light_ends(desc)
    return [[rank[j] for j in perm if j < len(rank)] for rank in grid]


def fixed_count_bins(
    lengths: np.ndarray, costs: np.ndarray, nbins: int, per_bin: int, cap: int, padded: bool
) -> list[list[int]] | str:
    """``nbins`` bins of at most ``per_bin`` sequences each, counts within one, under ``cap``.

    Tries bins balanced by cost, then by tokens (lighter token peaks), then (``padded``)
    the lengths sorted and cut into runs, the longer counts on the shorter sequences;
    returns the first that fits the capacity, or a sentence saying why none did. The last
    is the fewest padded tokens any split of these counts can have in its fullest bin
    (count × longest is smallest with the longest sequences together), so with
    ``padded`` a split is found whenever one exists. None is tried where a lower bound on
    every split's fullest bin (:func:`_fullest_floor`) is above ``cap``.
    """
    n = lengths.shape[0]
    if n > nbins * per_bin:  # the caller sized nbins; guard the invariant anyway
        return f"{n} sequences do not fit {nbins} micro-batches of {per_bin}"
    need = _fullest_floor(lengths, nbins, padded)
    if need > cap:  # (no split of these counts fits: the partitions need not be tried)
        return (
            f"with {per_bin} sequences per micro-batch a micro-batch needs at least {need} "
            f"tokens, more than max_tokens={cap}"
        )
    worst = 0
    for weights in (costs, lengths.astype(np.float64)):
        parts = [list(p) for p in partition_arrays(weights, nbins, "balanced", "auto", None)]
        tokens = bin_totals(parts, lengths, padded=padded)
        if (tokens <= cap).all():
            return parts
        worst = max(worst, int(tokens.max()))
    if padded and n:
        # Balanced partitions mix long and short sequences, and a padded micro-batch costs
        # count x its longest: [3, 4, 2, 5, 1] at cap 10, 3 a batch, needed 3 where
        # {5, 4} + {3, 2, 1} fit 2.
        order = np.argsort(-lengths, kind="stable")
        q, r = divmod(n, nbins)
        sizes = [q] * (nbins - r) + [q + 1] * r
        cuts = np.cumsum([0, *sizes])
        parts = [sorted(order[a:b].tolist()) for a, b in zip(cuts[:-1], cuts[1:])]
        tokens = bin_totals(parts, lengths, padded=True)
        if (tokens <= cap).all():
            return parts
        worst = min(worst, int(tokens.max()))
    return (
        f"with {per_bin} sequences per micro-batch a micro-batch needs {worst} tokens, more "
        f"than max_tokens={cap}"
    )


def _fullest_floor(lengths: np.ndarray, nbins: int, padded: bool) -> int:
    """A lower bound on the tokens of the fullest of ``nbins`` bins holding ``lengths``
    with counts within one, so that a caller searching for the fewest bins can pass
    over counts no split fits without trying one.

    Every bin holds at least ``c = n // nbins`` sequences, so the one with the longest
    holds ``c - 1`` others, at least the shortest ones (padded: ``c`` times the
    longest). Where bins hold two sequences at most, the bins of two hold, at best, the
    shortest sequences (the longest run alone), paired shortest with longest: the fewest
    tokens any pairing of them has in its fullest pair, so the floor is exact there.
    """
    n = int(lengths.shape[0])
    if n == 0 or nbins < 1:
        return 0
    c, pairs = divmod(n, nbins)
    y = np.sort(lengths.astype(np.int64))
    longest = int(y[-1])
    if c == 0:
        return longest
    if padded:
        floor = c * longest
        if c == 1 and pairs:
            floor = max(floor, 2 * int(y[2 * pairs - 1]))
        return floor
    floor = longest + int(y[: c - 1].sum())
    two = pairs if c == 1 else nbins if c == 2 and not pairs else 0  # (bins of two)
    if two:
        short = y[: 2 * two]
        floor = max(floor, int((short[:two] + short[::-1][:two]).max()))
    return floor


def separate_oversized(
    grid: list[list[list[int]]],
    true_lens: np.ndarray,
    cap: int,
    *,
    across_ranks: bool = False,
    padded: bool = False,
) -> list[list[list[int]]]:
    """``grid`` with every sequence longer than ``cap`` alone in its micro-batch where the
    rules allow it (``grid`` itself when nothing moves).

    Packing sees such a sequence as exactly ``cap`` tokens, so only empty (zero-token)
    sequences can have joined it; each moves to the micro-batch with the fewest tokens that
    holds no oversized sequence and has room (ties: the first), on the same rank, else
    (``across_ranks``: no size rule, no groups) on any rank. A sharer with nowhere to go
    stays: :func:`shares_oversized` tells, and the planner then plans more micro-batches.
    """
    if not shares_oversized(grid, true_lens, cap):
        return grid
    over = [[any(true_lens[i] > cap for i in mb) for mb in rank] for rank in grid]
    out = [[list(mb) for mb in rank] for rank in grid]
    lens = [int(x) for x in true_lens.tolist()]
    # each micro-batch's tokens, count and longest sequence, kept as sequences move
    tok = [[sum(lens[i] for i in mb) for mb in rank] for rank in out]
    cnt = [[len(mb) for mb in rank] for rank in out]
    top = [[max((lens[i] for i in mb), default=0) for mb in rank] for rank in out]

    def load(s: int, d: int, extra: int = -1) -> int:
        """The tokens of ``out[s][d]`` (padded: count x longest), with ``extra`` too."""
        if padded:
            if extra < 0:
                return cnt[s][d] * top[s][d]
            return (cnt[s][d] + 1) * max(top[s][d], lens[extra])
        return tok[s][d] + (lens[extra] if extra >= 0 else 0)

    def room(s: int, d: int, i: int) -> bool:
        return not over[s][d] and load(s, d, i) <= cap

    moved = False
    for r, rank in enumerate(out):
        for j, mb in enumerate(rank):
            if not over[r][j] or len(mb) < 2:
                continue
            for i in [i for i in mb if true_lens[i] <= cap]:
                dest = [(r, d) for d in range(len(rank)) if room(r, d, i)]
                if not dest and across_ranks:
                    dest = [(s, d) for s in range(len(out)) for d in range(len(out[s]))
                            if room(s, d, i)]  # fmt: skip
                if not dest:
                    continue
                s, d = min(dest, key=lambda sd: (load(*sd), sd))
                mb.remove(i)
                out[s][d].append(i)
                tok[r][j] -= lens[i]
                cnt[r][j] -= 1
                top[r][j] = max((lens[x] for x in mb), default=0)
                tok[s][d] += lens[i]
                cnt[s][d] += 1
                top[s][d] = max(top[s][d], lens[i])
                moved = True
    return [[sorted(mb) for mb in rank] for rank in out] if moved else grid


def shares_oversized(grid: list[list[list[int]]], true_lens: np.ndarray, cap: int) -> bool:
    """Whether a sequence longer than ``cap`` shares its micro-batch in ``grid``."""
    return any(
        len(mb) > 1 and any(true_lens[i] > cap for i in mb) for rank in grid for mb in rank
    )
