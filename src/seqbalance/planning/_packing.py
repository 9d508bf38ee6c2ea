"""Pack sequences into a fixed number of capacity-bounded bins of near-equal cost.

The planner's workhorse. Three steps, all deterministic (ties broken by index):

1. capacitated LPT: sequences in decreasing cost order, each into the cheapest bin that still
   has room for its tokens;
2. if that fails, first-fit decreasing on tokens (the classic bin-packing heuristic), which
   needs no more bins than FFD-by-tokens does by construction; if that fails too (packed
   only), a k-way partition of the tokens, which fits near-full bins of similar items;
3. pairwise refinement (packed mode): move one sequence, or swap two, between a heavy and a
   light bin whenever that makes the pair more equal without breaking the capacity; first
   the heaviest bin against the lightest ones, then the lightest against the heaviest.

Padded bins (``count * longest <= capacity``) get steps 1 and 2 only; there step 2 is
O(n) (bins fill in index order, see ``_ffd``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from ..partitioning.kway import partition_arrays
from ._grouping import bin_summer
from ._work import charge, remembered_search

__all__ = ["best_fit", "ffd_failed", "first_fit", "first_fit_opening", "first_fit_parts", "pack"]

_PARTNERS = 12  # light (or heavy) bins tried per refinement step


class _Bins:
    """Bin contents with cached cost and token totals."""

    def __init__(self, w: np.ndarray, t: np.ndarray, nbins: int, cap: int, padded: bool) -> None:
        self.w, self.t, self.cap, self.padded = w, t, cap, padded
        self.items: list[list[int]] = [[] for _ in range(nbins)]
        self.cost = np.zeros(nbins)
        self.tok = np.zeros(nbins, dtype=np.int64)
        self.maxw = np.zeros(nbins)
        self.maxt = np.zeros(nbins, dtype=np.int64)

    def after_add(self, b: int, i: int) -> tuple[float, int]:
        """Cost and tokens of bin ``b`` if item ``i`` were added."""
        if self.padded:
            n = len(self.items[b]) + 1
            return n * max(self.maxw[b], self.w[i]), n * max(int(self.maxt[b]), int(self.t[i]))
        return self.cost[b] + self.w[i], int(self.tok[b] + self.t[i])

    def add(self, b: int, i: int) -> None:
        c, tok = self.after_add(b, i)
        self.items[b].append(i)
        self.cost[b], self.tok[b] = c, tok
        self.maxw[b] = max(self.maxw[b], self.w[i])
        self.maxt[b] = max(self.maxt[b], self.t[i])

    def copy(self) -> _Bins:
        """An independent copy (refinement changes bins in place)."""
        out = _Bins.__new__(_Bins)
        out.w, out.t, out.cap, out.padded = self.w, self.t, self.cap, self.padded
        out.items = [list(x) for x in self.items]
        out.cost, out.tok = np.array(self.cost), np.array(self.tok)
        out.maxw, out.maxt = np.array(self.maxw), np.array(self.maxt)
        return out


def _lpt(w: np.ndarray, t: np.ndarray, nbins: int, cap: int, padded: bool) -> _Bins | None:
    idx = np.arange(w.size)
    # Most expensive first; padded bins are priced by their longest row, so longest first there.
    order = np.lexsort((idx, -w, -t)) if padded else np.lexsort((idx, -t, -w))
    if padded:
        return _lpt_padded(w, t, nbins, cap, order)
    # Plain Python floats and lists: this loop runs once per sequence.
    wl, tl = w.tolist(), t.tolist()
    cost, tok = [0.0] * nbins, [0] * nbins
    items: list[list[int]] = [[] for _ in range(nbins)]
    heap = [(0.0, b) for b in range(nbins)]
    for i in order.tolist():
        ti = tl[i]
        c, b = heap[0]
        if tok[b] + ti <= cap:  # the cheapest bin has room (one heap update, not two)
            items[b].append(i)
            tok[b] += ti
            cost[b] = c + wl[i]
            heapq.heapreplace(heap, (cost[b], b))
            continue
        stash = []
        while heap:
            c, b = heapq.heappop(heap)
            if tok[b] + ti <= cap:
                items[b].append(i)
                tok[b] += ti
                cost[b] = c + wl[i]
                heapq.heappush(heap, (cost[b], b))
                break
            stash.append((c, b))
            if len(stash) > 64:  # bins are nearly full in tokens: let first-fit handle it
                return None
        else:
            return None
        for entry in stash:
            heapq.heappush(heap, entry)
    bins = _Bins(w, t, nbins, cap, padded)
    bins.items = items
    bins.cost = np.asarray(cost)
    bins.tok = np.asarray(tok, dtype=np.int64)
    return bins


def _lpt_padded(
    w: np.ndarray, t: np.ndarray, nbins: int, cap: int, order: np.ndarray
) -> _Bins | None:
    # Plain Python lists in the loop (it runs once per sequence): a padded bin's cost and
    # tokens are its count times its largest cost and longest row.
    wl, tl = w.tolist(), t.tolist()
    cnt = [0] * nbins
    mw = [0.0] * nbins
    mt = [0] * nbins
    items: list[list[int]] = [[] for _ in range(nbins)]
    heap = [(0.0, b) for b in range(nbins)]
    for i in order.tolist():
        wi, ti = wl[i], tl[i]
        stash = []
        while heap:
            c, b = heapq.heappop(heap)
            n_b = cnt[b] + 1
            if n_b * max(mt[b], ti) <= cap:
                cnt[b] = n_b
                mw[b] = max(mw[b], wi)
                mt[b] = max(mt[b], ti)
                items[b].append(i)
                heapq.heappush(heap, (n_b * mw[b], b))
                break
            stash.append((c, b))
            if len(stash) > 64:
                return None
        else:
            return None
        for entry in stash:
            heapq.heappush(heap, entry)
    return _padded_bins(w, t, cap, items, cnt, mw, mt)


def _padded_bins(
    w: np.ndarray,
    t: np.ndarray,
    cap: int,
    items: list[list[int]],
    cnt: list[int],
    mw: list[float],
    mt: list[int],
) -> _Bins:
    bins = _Bins(w, t, len(items), cap, True)
    bins.items = items
    counts = np.asarray(cnt, dtype=np.int64)
    bins.maxw = np.asarray(mw, dtype=np.float64)
    bins.maxt = np.asarray(mt, dtype=np.int64)
    bins.cost = counts * bins.maxw
    bins.tok = counts * bins.maxt
    return bins


def first_fit(
    order: Sequence[int], t: np.ndarray, cap: int, nbins: int, *, alone_above_cap: bool = False
) -> list[list[int]] | None:
    """Packed first fit: each item, in ``order``, into the first of ``nbins`` bins with room.

    Returns all ``nbins`` bins (trailing ones may be empty), or None if an item fits nowhere.
    ``O(n log nbins)``: a max-tree over the bins' free room finds the leftmost bin with
    room for an item by one walk from the root (go left whenever the left subtree has a
    bin with room), and an update walks back up, stopping where a maximum is unchanged.

    With ``alone_above_cap`` an item longer than ``cap`` goes into the first bin never
    used, which keeps its negative room: no later item joins it, not even an empty one.
    (Bins are used left to right, so that is the count of bins used so far.)
    """
    if nbins < 1:
        return None if len(order) else []
    size = 1 << (nbins - 1).bit_length()
    tree = [-1] * (2 * size)  # tree[k] = most free room among the bins under node k
    tree[size : size + nbins] = [int(cap)] * nbins
    for k in range(size - 1, 0, -1):
        tree[k] = max(tree[2 * k], tree[2 * k + 1])
    items: list[list[int]] = [[] for _ in range(nbins)]
    used = 0
    tl = t.tolist()
    for i in order:
        x = tl[i]
        if tree[1] >= x:
            k = 1
            while k < size:
                k <<= 1
                if tree[k] < x:
                    k += 1
        elif alone_above_cap and x > cap and used < nbins:
            k = size + used
        else:
            return None
        tree[k] -= x
        b = k - size
        items[b].append(i)
        if b == used:
            used += 1
        k >>= 1
        while k:
            left, right = tree[2 * k], tree[2 * k + 1]
            v = left if left > right else right
            if tree[k] == v:
                break  # the ancestors' maxima are unchanged too
            tree[k] = v
            k >>= 1
    return items


def first_fit_parts(
    parts: Sequence[np.ndarray], w: np.ndarray, t: np.ndarray, nbins: int, cap: int
) -> list[list[list[int]] | None]:
    """First-fit decreasing of each part on its own (many parts: all at once).

    ``parts``: index arrays into ``w`` and ``t``. For each part, what :func:`first_fit`
    gives on the part's items in first-fit-decreasing order (tokens, then cost, both
    decreasing, then position), as positions into the part: ``nbins`` bins, or None where
    an item fits in none. From ``_PARTS_AT_ONCE`` parts on, the parts advance together,
    one item of each per numpy step (each takes the leftmost bin with room, as the one-part
    walk does), so many small parts cost a few vectorised passes instead of a Python loop
    over every part's items; fewer parts are walked one at a time.
    """
    k = len(parts)
    if k == 0 or nbins < 1:
        return [first_fit([], t, cap, nbins) if p.size == 0 else None for p in parts]
    if k < _PARTS_AT_ONCE:  # few parts: one walk each costs less than a numpy step per item
        out_few: list[list[list[int]] | None] = []
        for p in parts:
            p = np.asarray(p, dtype=np.int64)
            out_few.append(first_fit(_ffd_order(w[p], t[p]), t[p], cap, nbins))
        return out_few
    sizes = np.fromiter((p.size for p in parts), dtype=np.int64, count=k)
    width = int(sizes.max())
    idx = np.concatenate(parts).astype(np.int64, copy=False)
    part = np.repeat(np.arange(k), sizes)
    # Each item's position within its part; after the sort below (which keeps the parts
    # where they are), also each sorted item's column.
    pos = np.arange(idx.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    order = np.lexsort((pos, -w[idx], -t[idx], part))  # by part, then as _ffd orders
    col = pos
    local = np.full((k, width), -1, dtype=np.int64)
    tok = np.zeros((k, width), dtype=np.int64)
    local[part, col] = pos[order]
    tok[part, col] = t[idx[order]]
    room = np.full((k, nbins), int(cap), dtype=np.int64)
    where = np.full((k, width), -1, dtype=np.int64)
    failed = np.zeros(k, dtype=bool)
    rows = np.arange(k)
    for c in range(width):
        x = tok[:, c]
        fits = room >= x[:, None]
        b = fits.argmax(axis=1)
        live = (local[:, c] >= 0) & ~failed
        ok = live & fits[rows, b]
        failed |= live & ~ok
        room[rows[ok], b[ok]] -= x[ok]
        where[ok, c] = b[ok]
    # Each part's bins in placement order: a stable sort by (part, bin) of the placed items.
    placed = where >= 0
    key = (rows[:, None] * nbins + where)[placed]
    vals = local[placed]
    grouped = vals[np.argsort(key, kind="stable")].tolist()
    ends = np.cumsum(np.bincount(key, minlength=k * nbins)).tolist()
    out: list[list[list[int]] | None] = []
    for r in range(k):
        if failed[r]:
            out.append(None)
            continue
        lo = 0 if r == 0 else ends[r * nbins - 1]
        bins = []
        for b in range(nbins):
            hi = ends[r * nbins + b]
            bins.append(grouped[lo:hi])
            lo = hi
        out.append(bins)
    return out


# From this many parts on, first_fit_parts advances all parts together in numpy; below it
# each part is walked on its own (8 parts of 128 items: 0.7 ms against 2.2 ms; the two
# are even at 32 parts, and at 64 the numpy steps take 4.1 ms against 6.3 ms).
_PARTS_AT_ONCE = 32


def first_fit_opening(order: Sequence[int], t: np.ndarray, cap: int) -> list[list[int]]:
    """First fit that opens a bin whenever an item fits in none (bins in opening order):
    the trainers' default packing. An item above ``cap`` opens a bin of its own that no
    later item joins (:func:`first_fit` with one bin per item and ``alone_above_cap``)."""
    bins = first_fit(order, t, cap, len(order), alone_above_cap=True)
    assert bins is not None  # one bin per item always suffices
    return [b for b in bins if b]


def best_fit(order: list[int], t: np.ndarray, cap: int, nbins: int) -> list[list[int]] | None:
    """Packed best fit: each item, in ``order``, into the bin with the least room that fits.

    Ties go to the lowest bin index. Returns all ``nbins`` bins, or None if an item fits
    nowhere. The bins are kept sorted by free room: a binary search finds the bin
    (``O(log nbins)`` comparisons), and moving it to its new place shifts list entries
    (a memory move, not a Python loop).
    """
    if nbins < 1:
        return None if len(order) else []
    by_room = [(int(cap), b) for b in range(nbins)]  # sorted by (room, bin)
    items: list[list[int]] = [[] for _ in range(nbins)]
    tl = t.tolist()
    for i in order:
        x = tl[i]
        k = bisect.bisect_left(by_room, (x, -1))
        if k == len(by_room):
            return None
        room, b = by_room.pop(k)
        items[b].append(i)
        bisect.insort(by_room, (room - x, b))
    return items


def _ffd_order(w: np.ndarray, t: np.ndarray) -> list[int]:
    """First-fit decreasing's order: tokens, then cost, both decreasing, then position."""
    return np.lexsort((np.arange(w.size), -w, -t)).tolist()


def _ffd(w: np.ndarray, t: np.ndarray, nbins: int, cap: int, padded: bool) -> _Bins | None:
    order = _ffd_order(w, t)
    bins = _Bins(w, t, nbins, cap, padded)
    if not padded:
        items = first_fit(order, t, cap, nbins)
        if items is None:
            return None
        bins.items = items
        sums = bin_summer(items)  # (flattened once for both totals)
        bins.cost, bins.tok = sums(w), sums(t)
        return bins
    # Padded first fit in O(n): items come longest first, so a bin's longest row is its
    # first item and adding item i to bin b costs (count_b + 1) * longest_b tokens whatever
    # i is. A bin that cannot take the next item can never take a later one either, so
    # first fit is "the lowest bin still open", and bins close for good in index order.
    wl, tl = w.tolist(), t.tolist()
    counts = [0] * nbins
    longest = [0] * nbins
    mw = [0.0] * nbins
    items: list[list[int]] = [[] for _ in range(nbins)]
    b = 0
    for i in order:
        while b < nbins and counts[b] and (counts[b] + 1) * longest[b] > cap:
            b += 1
        if b == nbins or tl[i] > cap:
            return None
        if not counts[b]:
            longest[b] = tl[i]
        counts[b] += 1
        mw[b] = max(mw[b], wl[i])
        items[b].append(i)
    return _padded_bins(w, t, cap, items, counts, mw, longest)


def _token_balanced(w: np.ndarray, t: np.ndarray, nbins: int, cap: int) -> _Bins | None:
    """Last start for tight capacities (packed only): bins with balanced token sums.

    Near-full bins of similar items defeat LPT and FFD, where a k-way partition of the
    tokens (whose heaviest part is as light as it can find) still fits.
    """
    parts = partition_arrays(t.astype(np.float64), nbins, "free", "auto", None, fit=cap)
    if parts.max_load > cap:
        return None
    # The bins as _Bins.add would fill them item by item: each bin's cost summed in its
    # items' order from 0 (bin_totals adds in array order), its maxima taken from 0.
    bins = _Bins(w, t, nbins, cap, False)
    bins.items = [list(part) for part in parts]
    sums = bin_summer(bins.items)
    bins.cost = sums(w).astype(np.float64, copy=False)
    bins.tok = sums(t).astype(np.int64, copy=False)
    np.maximum.at(bins.maxw, sums.labels, w[sums.flat])
    np.maximum.at(bins.maxt, sums.labels, t[sums.flat])
    return bins


def ffd_failed(memo: dict, nbins: int, cap: int, padded: bool = False) -> dict:
    """``memo`` for :func:`pack`, noting that first-fit decreasing of its items into
    ``nbins`` bins is known to fail (so the starts that fall back on it skip it)."""
    memo[("ffd", nbins, cap, padded)] = None
    return memo


def _shared(
    memo: dict | None, key: tuple, make: Callable[[], _Bins | None], w: np.ndarray, t: np.ndarray
) -> _Bins | None:
    """``make()``, computed once per ``key`` in ``memo`` (when given) and once per items and
    ``key`` in the request (:func:`._work.remembered_search`: a request packs the same items at the
    same count from several places, e.g. the first start before the other starts, the
    rank-first split of one rank, a count planned again); each caller gets its own copy,
    since refinement changes bins in place."""
    store = {} if memo is None else memo
    if key not in store:
        items = (w.dtype.str, w.tobytes(), t.dtype.str, t.tobytes())
        store[key] = remembered_search(("pack start", key, items), make)
    got = store[key]
    return None if got is None else got.copy()


_NEAR = np.array([-2, -1, 0, 1])  # candidate offsets around the ideal partner's rank


def _improve_pair(
    bins: _Bins, a: int, b: int, lists: tuple[list[float], list[int]] | None = None
) -> bool:
    """Move or swap between heavier bin ``a`` and lighter bin ``b`` to even them out.

    ``lists``: ``(bins.w.tolist(), bins.t.tolist())``; with them, pairs of few sequences
    are compared in plain Python (:func:`_best_pair_small`)."""
    cost_a = float(bins.cost[a])
    gap = cost_a - float(bins.cost[b])
    if gap <= 0:
        return False
    w, t, cap = bins.w, bins.t, bins.cap
    if lists is not None and len(bins.items[a]) + len(bins.items[b]) <= _SMALL_PAIR:
        move = _best_pair_small(bins, a, b, gap, cost_a, *lists)
        if move is None:
            return False
        _apply_pair(bins, a, b, *move)
        return True
    ia = np.asarray(bins.items[a], dtype=np.int64)
    ib = np.asarray(bins.items[b], dtype=np.int64)
    wa, ta = w[ia], t[ia]
    target = gap / 2.0
    tiny = 1e-12 * cost_a
    lo, hi = tiny, gap - tiny
    room_a, room_b = cap - int(bins.tok[a]), cap - int(bins.tok[b])
    best_err, best = np.inf, None
    # Move x: a -> b.
    ok = (wa > lo) & (wa < hi) & (ta <= room_b)
    if ok.any():
        err = np.where(ok, np.abs(wa - target), np.inf)
        k = int(err.argmin())
        best_err, best = float(err[k]), (k, -1)
    # Swap x <-> y: for each x, the y whose cost is nearest wx - gap/2.
    if ib.size and best_err > 0:
        wb, tb = w[ib], t[ib]
        srt = wb.argsort(kind="stable")
        pos = wb[srt].searchsorted(wa - target)
        cand = pos[:, None] + _NEAR
        np.maximum(cand, 0, out=cand)
        np.minimum(cand, ib.size - 1, out=cand)
        y = srt[cand]
        delta = wa[:, None] - wb[y]
        dt = ta[:, None] - tb[y]  # tokens moving from a to b
        ok = (delta > lo) & (delta < hi) & (dt <= room_b) & (-dt <= room_a)
        if ok.any():
            err = np.where(ok, np.abs(delta - target), np.inf)
            flat = int(err.argmin())
            if err.flat[flat] < best_err:
                x, c = divmod(flat, cand.shape[1])
                best_err, best = float(err.flat[flat]), (x, int(y[x, c]))
    if best is None:
        return False
    x, y = best
    _apply_pair(bins, a, b, int(ia[x]), -1 if y < 0 else int(ib[y]))
    return True


#: Pairs of bins holding at most this many sequences together are compared in plain
#: Python (:func:`_best_pair_small`): on a few sequences numpy's per-call overhead is
#: most of a pair scan (the rank-first packing of a grouped request over 64 ranks runs
#: tens of thousands of them).
_SMALL_PAIR = 40


def _best_pair_small(
    bins: _Bins, a: int, b: int, gap: float, cost_a: float, wl: list[float], tl: list[int]
) -> tuple[int, int] | None:
    """:func:`_improve_pair`'s choice on Python numbers: the same candidates in the same
    order (moves, then for each sequence of ``a`` the partners at offsets ``_NEAR`` around
    its ideal one's rank), the same first minimum; as ``(x, y)``, the sequence leaving
    ``a`` and the one leaving ``b`` (-1: a move), or None."""
    ia, ib = bins.items[a], bins.items[b]
    target = gap / 2.0
    tiny = 1e-12 * cost_a
    lo, hi = tiny, gap - tiny
    room_a, room_b = bins.cap - int(bins.tok[a]), bins.cap - int(bins.tok[b])
    best_err, best = math.inf, None
    for x in ia:
        wx = wl[x]
        if lo < wx < hi and tl[x] <= room_b:
            err = abs(wx - target)
            if err < best_err:
                best_err, best = err, (x, -1)
    if ib and best_err > 0:
        nb = len(ib)
        srt = sorted(ib, key=wl.__getitem__)  # stable, as argsort(kind="stable")
        ws = [wl[y] for y in srt]
        s_err, s_best = math.inf, None
        for x in ia:
            wx, tx = wl[x], tl[x]
            pos = bisect.bisect_left(ws, wx - target)
            for off in _NEAR_OFFSETS:
                c = pos + off
                y = srt[0 if c < 0 else (nb - 1 if c >= nb else c)]
                delta = wx - wl[y]
                dt = tx - tl[y]
                if lo < delta < hi and dt <= room_b and -dt <= room_a:
                    err = abs(delta - target)
                    if err < s_err:
                        s_err, s_best = err, (x, y)
        if s_best is not None and s_err < best_err:
            best = s_best
    return best


_NEAR_OFFSETS = tuple(int(x) for x in _NEAR)


def _apply_pair(bins: _Bins, a: int, b: int, xi: int, yi: int) -> None:
    """Move sequence ``xi`` from bin ``a`` to bin ``b`` and, unless ``yi`` is -1, ``yi``
    from ``b`` to ``a``."""
    w, t = bins.w, bins.t
    bins.items[a].remove(xi)
    bins.items[b].append(xi)
    dc, dt = float(w[xi]), int(t[xi])
    if yi >= 0:
        bins.items[b].remove(yi)
        bins.items[a].append(yi)
        dc -= float(w[yi])
        dt -= int(t[yi])
    bins.cost[a] -= dc
    bins.cost[b] += dc
    bins.tok[a] -= dt
    bins.tok[b] += dt


def _refine(bins: _Bins, max_steps: int, stop_at: float | None = None) -> None:
    """Even out the bins by moves and swaps between the heaviest (then the lightest) bin
    and its nearest partners. ``stop_at``: stop once the heaviest bin costs at most this
    (the caller's level at which evening out cannot gain enough to matter)."""
    nb = bins.cost.size
    k = min(_PARTNERS, nb - 1)
    if k < 1:
        return
    enough = -np.inf if stop_at is None else stop_at
    pool_size = min(nb, 4 * k + 1)
    pairs = [0]  # pair scans run (the request's work meter)
    # (float costs and int64 tokens: Python's numbers then compare as numpy's do)
    exact = bins.w.dtype == np.float64 and bins.t.dtype == np.int64
    lists = (bins.w.tolist(), bins.t.tolist()) if exact else None

    def improve(a: int, b: int) -> bool:
        pairs[0] += 1
        return _improve_pair(bins, a, b, lists)

    try:
        _refine_steps(bins, max_steps, enough, k, pool_size, improve)
    finally:
        charge(pairs[0])


def _refine_steps(bins: _Bins, max_steps: int, enough: float, k: int, pool_size: int,
                  improve: Callable[[int, int], bool]) -> None:
    """:func:`_refine`'s steps, each ``improve(a, b)`` a pair scan."""
    steps = 0
    for phase in ("max", "min", "max"):
        pool = np.zeros(0, dtype=np.int64)
        age = 0
        while steps < max_steps:
            steps += 1
            cost = bins.cost
            sign = 1.0 if phase == "max" else -1.0
            # Light (or heavy) candidates: refreshed now and then rather than every step, since
            # only the bins a step touches change and those sit in the pool.
            if age == 0:
                pool = np.argpartition(sign * cost, pool_size - 1)[:pool_size]
            age = (age + 1) % 16
            part = pool[np.lexsort((pool, sign * cost[pool]))][: k + 1].tolist()
            if phase == "max":
                hi = int(np.argmax(cost))
                if cost[hi] <= enough:
                    return
                done = not any(p != hi and improve(hi, p) for p in part)
            else:
                lo = int(np.argmin(cost))
                done = not any(p != lo and improve(p, lo) for p in part)
            if done:
                if age == 1:  # the pool was fresh: truly stuck
                    break
                age = 0


def _fill_empty(bins: _Bins) -> None:
    """Give every empty bin one sequence from the bin with the most (a single one always
    fits): its cheapest (then lowest index), the bins in order.

    Sources only lose sequences and filled bins hold one (never a source while another
    holds two), so each source's sequences are ordered once and taken from the front,
    and every changed bin is recomputed once at the end.
    """
    empty = [b for b, items in enumerate(bins.items) if not items]
    if not empty:
        return
    counts = np.fromiter((len(x) for x in bins.items), dtype=np.int64, count=len(bins.items))
    queue: dict[int, list[int]] = {}  # source bin -> its sequences, cheapest last
    changed: list[int] = []
    for e in empty:
        src = int(np.argmax(counts))
        if counts[src] < 2:
            break
        if src not in queue:
            items = bins.items[src]
            queue[src] = sorted(items, key=lambda j: (bins.w[j], j), reverse=True)
            changed.append(src)
        i = queue[src].pop()
        bins.items[src].remove(i)
        bins.items[e].append(i)
        counts[src] -= 1
        counts[e] += 1
        changed.append(e)
    for b in changed:
        _recompute(bins, b)


def _recompute(bins: _Bins, b: int) -> None:
    idx = np.asarray(bins.items[b], dtype=np.int64)
    if idx.size == 0:
        bins.cost[b] = bins.tok[b] = bins.maxw[b] = bins.maxt[b] = 0
        return
    w, t = bins.w[idx], bins.t[idx]
    bins.maxw[b], bins.maxt[b] = w.max(), t.max()
    if bins.padded:
        bins.cost[b], bins.tok[b] = idx.size * w.max(), idx.size * int(t.max())
    else:
        bins.cost[b], bins.tok[b] = w.sum(), int(t.sum())


def pack(
    w: np.ndarray,
    t: np.ndarray,
    nbins: int,
    cap: int,
    *,
    padded: bool = False,
    refine: bool = True,
    start: str = "lpt",
    memo: dict | None = None,
    stop_at: float | None = None,
) -> list[list[int]] | None:
    """Pack items (cost ``w``, tokens ``t``) into exactly ``nbins`` bins of ``cap`` tokens.

    ``start="lpt"`` begins with capacitated LPT and falls back to first-fit decreasing;
    ``start="ffd"`` begins with first-fit decreasing (tighter packing, looser balance, for
    refinement to even out). Returns the bins as lists of positions into ``w`` (unsorted),
    or None when no heuristic fits everything. Bins may be empty only when there are fewer
    items than bins. ``memo``: a dict shared by calls on the same ``w`` and ``t`` (other
    starts, other counts), so first-fit decreasing and the token partition, which every
    start falls back on, run once per count. ``stop_at``: refinement stops once the
    heaviest bin costs at most this.
    """
    bins = _lpt(w, t, nbins, cap, padded) if start == "lpt" else None
    if bins is None:
        bins = _shared(memo, ("ffd", nbins, cap, padded), lambda: _ffd(w, t, nbins, cap, padded),
                       w, t)
    if bins is None and not padded:
        bins = _shared(memo, ("tokens", nbins, cap), lambda: _token_balanced(w, t, nbins, cap),
                       w, t)
    if bins is None:
        return None
    if refine and not padded:
        _refine(bins, max_steps=4 * nbins + 2000, stop_at=stop_at)
    _fill_empty(bins)
    return bins.items
