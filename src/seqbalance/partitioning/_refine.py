"""Local refinement: moves and swaps that lower the heaviest part under a size rule.

Each step takes the heaviest part ``h``. With a part ``p`` lighter by ``D``, moving a unit
of weight ``x`` from ``h`` to ``p`` leaves the pair at ``max(L_h - x, L_p + x)``, and
swapping units ``a`` (in ``h``) and ``b`` (in ``p``) with ``d = w_a - w_b`` leaves it at
``max(L_h - d, L_p + d)``: both help only when ``0 < x, d < D`` and are best near ``D / 2``.
For one pair of parts the best swap per unit of ``h`` is the unit of ``p`` nearest
``w_a - D / 2`` (one binary search), so a pair costs O(m/k log(m/k)).

A step first tries the few lightest parts (the most room). If none helps, one O(m) scan
over every other unit decides whether *any* improving swap exists: swapping ``a`` with a
lighter ``b`` in part ``p`` helps iff ``w_b - L_p > w_a - L_h``, so a running maximum of
``w_b - L_p`` over units sorted by weight answers all ``a`` at once; the part it names is
then searched exactly. When nothing helps, the heaviest part is locally optimal and the
pass stops. Moves run only where the rule allows them ("free"; "balanced" from a part with
one more unit to one with one fewer; the lightest such part is the best target) and swaps
keep every count.

Cost of a pass: an O(m log m) set-up (two sorts; the members of a part are sliced only
when a step touches it, so nothing is O(k) Python objects), then steps of O(k) (the
heaviest and lightest parts) plus O(m/k log(m/k)) per pair tried plus, when the lightest
parts do not help, the O(m) scan. A pass takes at most :func:`default_steps`
(``min(3k + 256, 1024)``) steps, and after its first 64 it stops once the element
operations it has done (counted, never timed) pass 2**24; so a pass is O(m log m) plus
at most ~2**24 operations while ``m + k <= 2**18``, and at most 64 steps of O(m + k)
beyond, linear in m. Most passes end far sooner: at the lower bound (``target``), or when no move or
swap helps. A pass that trails a rival (``beat``) also ends when it can no longer get
below it (see :func:`refine_labels`).

With many parts one heaviest part at a time is too slow (thousands of parts sit near the
maximum), so :func:`pair_rounds` first evens out all parts at once: it pairs the i-th
heaviest part with the i-th lightest and applies the best swap of every pair in one
vectorised round.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["pair_rounds", "refine_labels"]

_TRY_LIGHTEST = 4

#: Refinement steps are capped at ``min(3k + 256, MAX_STEPS)``, and after ``MIN_STEPS``
#: steps a pass stops once it has done ``STEP_WORK`` element operations: a step costs
#: O(k) plus O(m/k) per pair tried plus, when no light part helps, an O(m) scan, so the
#: work cap keeps a pass near 2**24 operations (a few tenths of a second of numpy calls)
#: however large k gets, and 64 steps of O(m + k) when m + k passes 2**18. The work is
#: counted as done, not assumed: a cap of ``2**24 / (m + k)`` steps would stop cheap passes
#: early (n = 65,536, k = 1,024, free: gap 2.4e-4 after 252 steps, 1.2e-5 after 1,024, in
#: 0.2 s).
MAX_STEPS = 1024
MIN_STEPS = 64
STEP_WORK = 2**24

#: A trailing pass (``beat`` given) is judged on its progress after this many steps ...
TRAIL_MIN_STEPS = 16
#: ... and stops once even this many times its average progress per step so far, kept up
#: for every step left, would not bring its parts down to ``beat`` (``inf``: never).
TRAIL_FACTOR = 2.0


def default_steps(m: int, k: int) -> int:
    """The default step cap of :func:`refine_labels`: ``min(3k + 256, MAX_STEPS)``.

    Past ``MIN_STEPS`` steps the work budget (``STEP_WORK`` counted operations) applies
    too, so a pass does at most ~``max(STEP_WORK, MIN_STEPS (m + 2k))`` operations: no
    more than linear in m (plus its O(m log m) set-up).
    """
    return max(MIN_STEPS, min(3 * k + 256, MAX_STEPS))


def refine_labels(
    w: np.ndarray,
    labels: np.ndarray,
    k: int,
    size: str,
    *,
    max_steps: int | None = None,
    max_work: int | None = None,
    target: float = 0.0,
    beat: float | None = None,
    by_weight: np.ndarray | None = None,
) -> np.ndarray:
    """Return improved part labels (a new array); the heaviest part never gets heavier.

    Stops early once the heaviest part weighs no more than ``target`` (a lower bound),
    after ``max_steps`` steps (default :func:`default_steps`), or, after ``MIN_STEPS``
    steps, once its counted element operations pass ``max_work`` (default ``STEP_WORK``).

    With ``beat`` (the heaviest part of a rival partition that the caller keeps unless
    this pass ends lighter), a trailing pass also stops when it can no longer get there:

    - as soon as more parts weigh above ``beat`` than steps remain (a step lowers one part
      only, so the pass cannot end at or below ``beat``; this never changes the winner);
    - after :data:`TRAIL_MIN_STEPS` steps, when the total excess over ``beat`` (the sum of
      ``L_p - beat`` over parts above it) exceeds :data:`TRAIL_FACTOR` times what the
      steps so far removed per step, times the steps left (by the step cap, or by the
      work left at the average work per step so far). Progress slows as the pass goes
      (the heaviest parts have the most room), so this forecast is generous; it spares
      the hopeless second start most of its steps (n = 65,536, k = 16,384).

    ``by_weight`` is ``np.argsort(w, kind="stable")`` when the caller has it already.
    """
    m = int(w.shape[0])
    lab = labels.astype(np.int64, copy=True)
    if m == 0 or k == 1:
        return lab
    if max_steps is None:
        max_steps = default_steps(m, k)
    if max_work is None:
        max_work = STEP_WORK
    work = 0  # element operations so far (counted, so the pass is deterministic)
    loads = np.bincount(lab, weights=w, minlength=k).astype(np.float64)
    # A part counts as above ``beat`` only if clearly so: the running loads carry rounding
    # that a fresh sum would not, and erring this way can only stop later, never wrongly.
    above = None if beat is None else beat * (1.0 + 1e-9)
    if above is not None and int(np.count_nonzero(loads > above)) > max_steps:
        return lab  # cannot reach ``beat``: skip the O(m log m) set-up as well
    excess0 = 0.0 if above is None else float(np.maximum(loads - above, 0.0).sum())
    counts = np.bincount(lab, minlength=k).astype(np.int64)
    members = _Members(np.argsort(lab, kind="stable"), counts)
    if by_weight is None:
        by_weight = np.argsort(w, kind="stable")
    w_sorted = w[by_weight]
    rank = np.empty(m, dtype=np.int64)
    rank[by_weight] = np.arange(m)
    lab_sorted = lab[by_weight]  # kept in step with lab by _step
    c = m // k
    for step_no in range(max_steps):
        if work > max_work and step_no >= MIN_STEPS:
            break
        work += 2 * k  # the heaviest and the lightest parts
        h = int(np.argmax(loads))
        top = float(loads[h])
        tol = top * 1e-12
        if members[h].size == 0 or top <= target:
            break
        if above is not None and top > above:
            left = max_steps - step_no
            if int(np.count_nonzero(loads > above)) > left:
                break
            if step_no >= TRAIL_MIN_STEPS:
                # Steps left: by the cap, or by the work left at the average cost so far.
                by_work = (max_work - work) * step_no // max(work, 1) + 1
                left = min(left, max(by_work, MIN_STEPS - step_no))
                excess = float(np.maximum(loads - above, 0.0).sum())
                if excess > TRAIL_FACTOR * (excess0 - excess) / step_no * left:
                    break
        movable = size == "free" or (size == "balanced" and counts[h] > c)
        few = min(_TRY_LIGHTEST + 1, k - 1)
        light = np.argpartition(loads, few)[: few + 1]
        light = light[np.lexsort((light, loads[light]))]  # lightest first, ties by part
        tries = [int(p) for p in light if p != h][:_TRY_LIGHTEST]
        if movable and size == "balanced":
            at_c = np.flatnonzero(counts == c)
            if at_c.size:
                p = int(at_c[np.argmin(loads[at_c])])
                if p not in tries:
                    tries.append(p)
        state = (w, members, loads, counts, size, c, tol, lab, lab_sorted, rank)
        done = False
        for p in tries:
            work += members[h].size + members[p].size
            if _step(state, h, p):
                done = True
                break
        if done:
            continue
        # Nothing with the lightest parts: scan every unit for any improving swap. Only
        # units lighter than the heaviest unit of h can take part: a prefix by weight.
        wh = w[members[h]]
        end = int(np.searchsorted(w_sorted, wh.max(), side="left"))
        if end == 0:
            break
        work += end
        owner = lab_sorted[:end]
        ks = w_sorted[:end] - loads[owner]
        ks[owner == h] = -np.inf
        run_max = np.maximum.accumulate(ks)
        pos = np.searchsorted(w_sorted[:end], wh, side="left") - 1  # strictly lighter units
        ok = pos >= 0
        best_key = np.where(ok, run_max[np.maximum(pos, 0)], -np.inf)
        good = best_key > wh - top + tol
        if not good.any():
            break
        i = int(np.argmax(np.where(good, best_key - (wh - top), -np.inf)))
        j = int(np.argmax(ks[: pos[i] + 1] == run_max[pos[i]]))  # where that maximum sits
        if not _step(state, h, int(owner[j])):
            break  # only rounding could get here; stop rather than loop
    return lab


class _Members(dict):  # type: ignore[type-arg]
    """Unit indices of each part (ascending at first), made on first use.

    A pass touches few parts, so slicing all ``k`` of them up front (``np.split``) would
    cost O(k) Python objects per pass: ~0.5 s at k = 250,000. The slices are views of one
    array sorted by part; ``_step`` swaps within them in place or replaces them.
    """

    def __init__(self, order: np.ndarray, counts: np.ndarray) -> None:
        super().__init__()
        self._order = order
        self._ends = np.cumsum(counts)

    def __missing__(self, p: int) -> np.ndarray:
        start = int(self._ends[p - 1]) if p else 0
        got = self._order[start : int(self._ends[p])]
        self[p] = got
        return got


def _step(state: tuple, h: int, p: int) -> bool:  # type: ignore[type-arg]
    """Apply the best improving move or swap between parts ``h`` and ``p``, if any."""
    w, members, loads, counts, size, c, tol = state[:7]
    top, low = float(loads[h]), float(loads[p])
    gap = top - low
    if gap <= tol:
        return False
    uh, up = members[h], members[p]
    movable = size == "free" or (size == "balanced" and counts[h] > c and counts[p] == c)
    if uh.size * max(up.size, 1) <= _SMALL_PAIR:
        op = _best_op_small(w[uh].tolist(), w[up].tolist(), top, low, gap, tol, movable)
        return op is not None and _apply(state, h, p, op)
    wh = w[uh]
    best = top - tol  # an operation must beat this strictly
    op: tuple[str, int, int] | None = None
    if movable:
        after = np.maximum(top - wh, low + wh)
        after[(wh <= 0) | (wh >= gap)] = np.inf
        i = int(after.argmin())
        if after[i] < best:
            best, op = float(after[i]), ("move", i, -1)
    if up.size:
        wp = w[up]
        srt = wp.argsort(kind="stable")
        wps = wp[srt]
        pos = wps.searchsorted(wh - gap / 2)
        # the nearest unit of p above and below the ideal weight, for every unit of h
        # (method calls and in-place bounds: this runs thousands of times per pass)
        js = np.empty((2, pos.size), dtype=pos.dtype)
        np.minimum(pos, wps.size - 1, out=js[0])
        np.subtract(pos, 1, out=js[1])
        np.maximum(js[1], 0, out=js[1])
        d = wh - wps[js]
        after = np.maximum(top - d, low + d)
        after[(d <= 0) | (d >= gap)] = np.inf
        f = int(after.argmin())
        if after.flat[f] < best:
            r, i = divmod(f, wh.size)
            best, op = float(after.flat[f]), ("swap", i, int(srt[js[r, i]]))
    if op is None:
        return False
    return _apply(state, h, p, op)


# Parts this small (|h| * max(|p|, 1) pairs) are compared in plain Python: on a few units numpy's
# per-call overhead is most of a step (token packing of 1,024 sequences into 131
# micro-batches, ~8 a part: 470 steps a pass).
_SMALL_PAIR = 144


def _best_op_small(
    wh: list[float], wp: list[float], top: float, low: float, gap: float, tol: float,
    movable: bool,
) -> tuple[str, int, int] | None:
    """:func:`_step`'s choice on Python floats: the same candidates, the same order and
    ties (the first minimum, moves before swaps, swap rows "nearest above" then "nearest
    below"), so both paths pick the same operation."""
    best = top - tol
    op: tuple[str, int, int] | None = None
    if movable:
        b_after, b_i = math.inf, -1
        for i, x in enumerate(wh):
            if 0 < x < gap:
                after = top - x if top - x > low + x else low + x
                if after < b_after:
                    b_after, b_i = after, i
        if b_after < best:
            best, op = b_after, ("move", b_i, -1)
    n = len(wp)
    if n:
        srt = sorted(range(n), key=wp.__getitem__)
        wps = [wp[j] for j in srt]
        half = gap / 2
        # one binary search per unit for both rows, each row's first minimum kept apart:
        # the "nearest below" row wins only when strictly lower, as if scanned second
        a_after, a_op = math.inf, None
        b_after, b_op = math.inf, None
        for i, x in enumerate(wh):
            pos = bisect.bisect_left(wps, x - half)
            j = pos if pos < n else n - 1
            d = x - wps[j]
            if 0 < d < gap:
                after = top - d if top - d > low + d else low + d
                if after < a_after:
                    a_after, a_op = after, (i, srt[j])
            j = pos - 1 if pos > 0 else 0
            d = x - wps[j]
            if 0 < d < gap:
                after = top - d if top - d > low + d else low + d
                if after < b_after:
                    b_after, b_op = after, (i, srt[j])
        if b_after < a_after:
            a_after, a_op = b_after, b_op
        if a_op is not None and a_after < best:
            op = ("swap", a_op[0], a_op[1])
    return op


def _apply(state: tuple, h: int, p: int, op: tuple[str, int, int]) -> bool:  # type: ignore[type-arg]
    """Carry out ``op`` (a move of unit ``i`` of ``h`` to ``p``, or its swap with unit
    ``jb`` of ``p``; positions into the parts' member arrays) on the pass's state."""
    w, members, loads, counts, _, _, _, lab, lab_sorted, rank = state
    uh, up = members[h], members[p]
    kind, i, jb = op
    a = int(uh[i])
    if kind == "move":
        members[h] = np.delete(uh, i)
        members[p] = np.append(up, a)
        loads[h] -= w[a]
        loads[p] += w[a]
        counts[h] -= 1
        counts[p] += 1
        lab[a] = p
        lab_sorted[rank[a]] = p
    else:
        b = int(up[jb])
        uh[i], up[jb] = b, a
        lab[a], lab[b] = p, h
        lab_sorted[rank[a]], lab_sorted[rank[b]] = p, h
        d = w[a] - w[b]
        loads[h] -= d
        loads[p] += d
    return True


# Problems with at most this many units get a first phase of steepest-descent swaps. A
# pass takes O(k) steps and more on long-tailed inputs; a step costs O(m log m) plus
# O(|h| k log m) (below). The limit keeps m**2 <= 2**21; raising it would change results.
# A pass on 1,024-1,448 verl-style workloads into 8 equal parts takes 0.4-15 ms.
STEEPEST_MAX_UNITS = 1448

#: A step of :func:`steepest_swaps` scans all pairs when there are at most this many
#: (cheaper than the binary searches' fixed cost of some 20 numpy calls).
STEEPEST_SCAN_PAIRS = 24576


def steepest_swaps(
    w: np.ndarray, labels: np.ndarray, k: int, *, by_weight: np.ndarray | None = None
) -> np.ndarray:
    """Greedy-with-counts' classic finish: best-improvement swaps from the heaviest part.

    Each step swaps the pair (unit ``a`` of the heaviest part ``h``, unit ``b`` elsewhere)
    that leaves ``max(L_h - d, L_p + d)`` smallest, ``d = w_a - w_b > 0``, while that is
    strictly below ``L_h``; it stops when no swap helps (at most ``100 k`` steps). Ties go
    to the lowest index ``a``, then the lowest index ``b``. Counts never change.

    A step does not look at all ``|h| * m`` pairs: for a unit ``a`` and a part ``p``,
    ``max(L_h - d, L_p + d)`` falls while ``w_b`` rises to ``w_a - (L_h - L_p) / 2`` and
    rises after, so the best ``b`` of ``p`` is one of the two members of ``p`` around that
    point (binary searches in the units sorted by part and weight). Where rounding could
    put the turn elsewhere (float weights within a few ulps of it), the step falls back
    to scanning every pair; the result is the same either way. Cost per step:
    O(m log m + |h| k log m). ``by_weight``: ``np.argsort(w, kind="stable")`` if the
    caller has it.
    """
    lab = labels.astype(np.int64, copy=True)
    m = int(w.shape[0])
    loads = np.bincount(lab, weights=w, minlength=k).astype(np.float64)
    if by_weight is None:
        by_weight = np.argsort(w, kind="stable")
    w_sorted = w[by_weight]
    rank = np.empty(m, dtype=np.int64)
    rank[by_weight] = np.arange(m, dtype=np.int64)
    lighter = np.searchsorted(w_sorted, w)  # units lighter than each unit
    counts = np.bincount(lab, minlength=k)  # swaps keep them
    ends = np.cumsum(counts)
    key = lab * m + rank  # units by part, then by weight (ties by index): all distinct
    for _ in range(100 * k):
        h = int(np.argmax(loads))
        top = loads[h]
        in_h = lab == h
        ia = np.flatnonzero(in_h)
        if ia.size == 0 or ia.size == m:
            break
        pair = None
        if ia.size * (m - ia.size) > STEEPEST_SCAN_PAIRS:
            pair = _steepest_pair(w, lab, key, loads, h, ia, counts, ends, lighter, w_sorted)
        if pair is None:
            pair = _steepest_pair_scan(w, lab, loads, h, ia, np.flatnonzero(~in_h))
        a, b, after = pair
        if not after < top:
            break
        p = int(lab[b])
        d = w[a] - w[b]
        loads[h] -= d
        loads[p] += d
        lab[a], lab[b] = p, h
        key[a], key[b] = p * m + rank[a], h * m + rank[b]
    return lab


def _steepest_pair_scan(
    w: np.ndarray, lab: np.ndarray, loads: np.ndarray, h: int, ia: np.ndarray, ib: np.ndarray
) -> tuple[int, int, float]:
    """The best swap of :func:`steepest_swaps` by scanning all ``|ia| * |ib|`` pairs."""
    d = w[ia][:, None] - w[ib][None, :]
    after = np.maximum(loads[h] - d, loads[lab[ib]][None, :] + d)
    after[d <= 0] = np.inf
    i, j = np.unravel_index(int(np.argmin(after)), after.shape)
    return int(ia[i]), int(ib[j]), float(after[i, j])


def _steepest_pair(
    w: np.ndarray, lab: np.ndarray, key: np.ndarray, loads: np.ndarray, h: int,
    ia: np.ndarray, counts: np.ndarray, ends: np.ndarray, lighter: np.ndarray, w_sorted: np.ndarray,
) -> tuple[int, int, float] | None:
    """The best swap of :func:`steepest_swaps` from two candidates per (unit of ``h``,
    other part); None where float rounding leaves the candidates in doubt."""
    top = loads[h]
    m = int(w.shape[0])
    order = np.argsort(key)  # ``key``: part * m + rank by weight, as in steepest_swaps
    skey = key[order]
    w_at = np.concatenate(([0.0], w[order], [0.0]))  # w_at[j + 1]: weight at j (-1..m)
    parts = np.flatnonzero(counts)
    parts = parts[parts != h]
    lp = loads[parts][None, :]  # (1, P)
    start = (ends - counts)[parts][None, :]
    wa = w[ia][:, None]  # (c, 1)
    # First member of p at or above the turn w_a - (L_h - L_p) / 2; last one below w_a.
    turn = np.searchsorted(skey, parts * m + np.searchsorted(w_sorted, wa - (top - lp) / 2))
    below_a = np.searchsorted(skey, parts * m + lighter[ia][:, None]) - 1
    d0, d1 = wa - w_at[turn], wa - w_at[turn + 1]
    rise0, fall0, rise1, fall1 = top - d0, lp + d0, top - d1, lp + d1
    # Rounding check (a safety net: never seen to fire where it mattered): below the turn
    # the part's side is the larger, at it the other (a tie below it is harmless).
    has0 = turn - 1 >= start
    if np.any(has0 & (rise0 > fall0)) or np.any((turn < ends[parts]) & (rise1 < fall1)):
        return None
    # The best b of each part: turn - 1 or turn, where w_b < w_a. The turn lies at or
    # below w_a (L_h is the heaviest), so below_a >= turn - 1: only turn can be too heavy.
    best = np.where(has0, np.maximum(rise0, fall0), np.inf)
    best = np.minimum(best, np.where(turn <= below_a, np.maximum(rise1, fall1), np.inf))
    row = best.min(axis=1) if best.shape[1] else np.full(ia.shape[0], np.inf)
    i = int(np.argmin(row))
    if not row[i] < np.inf:
        # No other part holds a unit lighter than any of h's: no swap helps (an "after"
        # of inf stops steepest_swaps, as the scan's would).
        return int(ia[0]), int(ia[0]), float("inf")
    # a's row of the full scan: the lowest-index b reaching that value, as its argmin picks.
    pair = _steepest_pair_scan(w, lab, loads, h, ia[i : i + 1], np.flatnonzero(lab != h))
    return pair if pair[2] == row[i] else None  # unequal only if the candidates were wrong


#: ``pair_rounds`` handles parts of at most this many units (its arrays hold k c**2 / 2
#: numbers).
PAIR_MAX_COUNT = 32


def pair_rounds(
    w: np.ndarray, labels: np.ndarray, k: int, *, max_rounds: int = 32
) -> np.ndarray:
    """Swap rounds over disjoint (heavy, light) pairs of parts; counts never change.

    Each round sorts the parts by load, pairs the i-th heaviest with the i-th lightest and,
    for every pair at once, applies the swap of one unit each way that leaves the pair's
    heavier part lightest (``d = w_a - w_b`` nearest half the gap, ``0 < d < gap``). The
    heaviest part never gets heavier. Stops when a round no longer lowers the heaviest
    part, or after ``max_rounds``. A round costs O(k log k + k c**2) with ``c`` the largest
    count (meant for ``c <= PAIR_MAX_COUNT``); returns new labels.
    """
    lab = labels.astype(np.int64, copy=True)
    m = int(w.shape[0])
    if m == 0 or k < 2:
        return lab
    counts = np.bincount(lab, minlength=k)
    cmax = int(counts.max())
    # members[p, j]: the j-th unit of part p, or m (a padding unit of weight NaN).
    order = np.argsort(lab, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    col = np.arange(m) - np.repeat(starts, counts)
    members = np.full((k, cmax), m, dtype=np.int64)
    members[lab[order], col] = order
    wpad = np.append(w, np.nan)
    loads = np.bincount(lab, weights=w, minlength=k).astype(np.float64)
    half = k // 2
    prev = float(loads.max())
    for _ in range(max_rounds):
        by_load = np.lexsort((np.arange(k), -loads))  # heaviest first, ties by part
        hv, lt = by_load[:half], by_load[::-1][:half]
        gap = loads[hv] - loads[lt]
        wh = wpad[members[hv]]  # (P, c)
        wl = wpad[members[lt]]
        d = wh[:, :, None] - wl[:, None, :]  # (P, c, c); NaN where padding
        with np.errstate(invalid="ignore"):
            after = np.maximum(loads[hv][:, None, None] - d, loads[lt][:, None, None] + d)
            ok = (d > 0) & (d < gap[:, None, None])
        after = np.where(ok, after, np.inf).reshape(half, -1)
        f = np.argmin(after, axis=1)
        best = after[np.arange(half), f]
        do = best < loads[hv] * (1.0 - 1e-12)
        if not do.any():
            break
        pi = np.flatnonzero(do)
        ia, ib = np.divmod(f[pi], cmax)
        ph, pl = hv[pi], lt[pi]
        ua, ub = members[ph, ia], members[pl, ib]
        members[ph, ia], members[pl, ib] = ub, ua
        lab[ua], lab[ub] = pl, ph
        dd = w[ua] - w[ub]
        loads[ph] -= dd
        loads[pl] += dd
        top = float(loads.max())
        if not top < prev:
            break
        prev = top
    return lab
