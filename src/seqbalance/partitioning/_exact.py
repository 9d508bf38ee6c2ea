"""Exact k-way partitioning of a few units: bisection over decision searches.

The optimum lies in ``[lo, hi]``: ``lo`` the lower bound, ``hi`` the heaviest part of the
heuristic start. Each step asks a depth-first search "is there a partition whose heaviest
part is at most ``C``?" for a capacity ``C`` in between (first ``C = lo``, then the middle).
A solution found lowers ``hi`` to its heaviest part; a search that runs to its end proves
that none exists and raises ``lo`` above ``C``; a search that runs out of nodes leaves
``lo`` alone and the next capacity is taken higher. The result is proven optimal when
``lo`` meets ``hi``. (Capacities near ``lo`` are cheap to refute, because the room check
below is tight there; this is the idea of iterative weakening.)

The decision search places units heaviest first, each into every part that may still take
it, lightest part first. A branch is cut when

- the part would exceed ``C``;
- the room the remaining units can still use cannot hold them: a part counts no room
  when its count is full or its room is below the smallest unit, and at most the weight
  of the ``q`` heaviest remaining units when it may take only ``q`` more;
- under a size rule, a part that still needs ``q`` units would exceed ``C`` even
  with the ``q`` lightest units (they are the tail of the sorted weights);
- the part is interchangeable with one already tried at this node (same load and count:
  this removes the ``k!`` relabellings of every solution, empty parts included).
- the state (sorted loads and counts at this depth) was refuted before under a capacity
  at least ``C`` (a bounded memo);
- in "free" mode a unit that fills a part exactly is placed there only (dominance).

A search that runs out of its slice of the budget (a quarter of what is left) is given
up for a higher capacity; when no capacity is left in between, the next sweep starts
lower again, and the memo lets it resume where the last one stopped.

Tolerance: with integer weights whose total is below 2**53 every load is exact and
capacities are integers; otherwise bisection stops when ``hi - lo`` is below ``1e-12``
relative, so optimality is proven up to that rounding.

Complexity: exponential in the worst case, hence a budget of ``max_nodes`` search nodes in
all (deterministic: no clock involved); each node costs O(k log k).
"""

from __future__ import annotations

import numpy as np

from .searches import spend_nodes, take_nodes

__all__ = [
    "EXACT_MAX_NODES",
    "EXACT_MAX_UNITS",
    "EXACT_SMALL_NODES",
    "EXACT_SMALL_UNITS",
    "REL_TOL",
    "exact_budget",
    "exact_labels",
    "exactness",
]

#: ``method="auto"`` runs the exact search on problems with at most this many units ...
EXACT_MAX_UNITS = 64
#: ... and stops it after this many search nodes (a few hundred ms of pure Python at worst);
EXACT_MAX_NODES = 60_000
#: with at most ``EXACT_SMALL_UNITS`` units (per-rank micro-batch splits) the budget is
#: ``EXACT_SMALL_NODES``: those searches often need more nodes to settle, and still end
#: well under a second.
EXACT_SMALL_UNITS = 32
EXACT_SMALL_NODES = 200_000

#: Optimality is proven up to this relative gap for non-integer weights.
REL_TOL = 1e-12
_EPS = float(np.finfo(np.float64).eps)
_SLICE = 4  # a search may use a quarter of the nodes left ...
_MIN_SLICE = 2_000  # ... but at least this many
_MEMO_MIN_LEFT = 8  # states with more units than this left to place are remembered
_MEMO_MAX = 200_000  # refuted search states remembered (memory stays a few tens of MB)


def exact_budget(m: int) -> int:
    """The node budget ``method="auto"`` gives the exact search on ``m`` units."""
    return EXACT_SMALL_NODES if m <= EXACT_SMALL_UNITS else EXACT_MAX_NODES


class _Budget(Exception):
    """Raised inside the search when the node budget is spent."""


def exact_labels(
    w: np.ndarray,
    k: int,
    size: str,
    start: np.ndarray,
    bound: float,
    *,
    max_nodes: int = EXACT_MAX_NODES,
) -> tuple[np.ndarray, bool]:
    """Improve ``start`` (part labels obeying ``size``) to an optimal labelling if possible.

    ``bound`` must be a valid lower bound for the rule. Returns ``(labels, proven)``: the
    best labelling found (``start`` itself when nothing lighter was found) and whether it
    is proven optimal.
    """
    m = int(w.shape[0])
    best = start.astype(np.int64, copy=True)
    if m == 0 or k == 1:
        return best, True
    hi = float(np.bincount(best, weights=w, minlength=k).max())
    integer, slack = exactness(w)
    lo = float(np.ceil(bound)) if integer else float(bound)
    order = np.argsort(-w, kind="stable")
    search = _Decision(w[order].tolist(), k, size, slack)
    budget = start_budget = take_nodes(max_nodes)
    # Searches that run out of nodes are cut short at a slice of what is left, so one
    # hard capacity cannot eat the whole budget; the memo of refuted states makes a later
    # retry at that capacity (or lower) resume cheaply.
    failed_at = -np.inf  # the highest capacity whose search ran out of nodes, this sweep
    while _open(lo, hi, integer) and budget > 0:
        if not search.tried:
            cap = lo
        else:
            floor_ = max(lo, failed_at)
            cap = _middle(floor_, hi, integer)
            if cap is None or cap <= failed_at:
                failed_at = -np.inf  # nothing left between: sweep again from lo
                cap = _middle(lo, hi, integer) if lo < hi else None
                if cap is None:
                    cap = lo
        part = budget if budget <= 4 * _MIN_SLICE else max(_MIN_SLICE, budget // _SLICE)
        found, status = search.run(cap, part)
        budget -= search.nodes
        if found is not None:
            labels = np.empty(m, dtype=np.int64)
            labels[order] = np.asarray(found, dtype=np.int64)
            top = float(np.bincount(labels, weights=w, minlength=k).max())
            if top < hi:
                best, hi = labels, top
            else:  # only rounding can get here: stop rather than loop
                break
        elif status == "refuted":
            lo = cap + 1.0 if integer else max(cap, np.nextafter(cap, np.inf))
        else:  # out of nodes: look higher, where solutions are easier to find
            failed_at = cap
    spend_nodes(start_budget - budget)
    return best, not _open(lo, hi, integer)


def exactness(w: np.ndarray) -> tuple[bool, float]:
    """Whether every sum of ``w`` is exact (integers, total below 2**53), and the margin a
    comparison of float sums of ``w`` needs otherwise (0 for exact weights)."""
    total = float(w.sum())
    integer = bool(np.all(w == np.floor(w))) and total < 2.0**53
    return integer, 0.0 if integer else 4.0 * (w.shape[0] + 1) * _EPS * total


def _middle(lo: float, hi: float, integer: bool) -> float | None:
    """A capacity in ``[lo, hi)`` halfway between, or None when there is none."""
    if integer:
        cap = float(np.floor(lo + (hi - lo) / 2))
        return cap if lo <= cap < hi else None
    if not _open(lo, hi, integer):
        return None
    return lo + (hi - lo) / 2


def _open(lo: float, hi: float, integer: bool) -> bool:
    """Whether the optimum is still unknown between ``lo`` and ``hi``."""
    if integer:
        return lo < hi
    return hi - lo > REL_TOL * hi


class _Decision:
    """Depth-first search for a partition whose parts all weigh at most a capacity."""

    def __init__(self, s: list[float], k: int, size: str, slack: float) -> None:
        m = len(s)
        self.s, self.k, self.m = s, k, m
        self.pre = [0.0] * (m + 1)  # pre[i] = s[0] + ... + s[i-1] (the i heaviest)
        for i in range(m):
            self.pre[i + 1] = self.pre[i] + s[i]
        self.rem = [self.pre[m] - x for x in self.pre]  # rem[i] = s[i] + ... + s[m-1]
        self.tail = [0.0] * (m + 1)  # tail[q] = the q lightest units
        for q in range(1, m + 1):
            self.tail[q] = self.tail[q - 1] + s[m - q]
        self.smallest = s[m - 1] if m else 0.0
        # Float sums may round either way: a cut needs a margin of ``slack`` (0 for integers).
        self.slack = slack
        c = m // k
        self.c = c
        self.free = size == "free"
        self.balanced = size == "balanced"
        if size == "free":
            self.need_min, self.cap_count, self.extra0 = 0, m, 0
        elif size == "equal":
            self.need_min, self.cap_count, self.extra0 = c, c, 0
        else:  # balanced: m % k parts take c + 1 units
            self.need_min, self.cap_count, self.extra0 = c, c + 1, m % k
        self.tried = False
        self.nodes = 0
        # Search states refuted so far -> the highest capacity they were refuted under
        # (a state refuted under a capacity is refuted under every lower one too).
        self.memo: dict[tuple[object, ...], float] = {}

    def run(self, cap: float, budget: int) -> tuple[list[int] | None, str]:
        """A labelling (sorted order) with every part <= ``cap``, or None and why not."""
        self.tried = True
        self.nodes = 0
        self.cap, self.budget = cap, budget
        self.loads = [0.0] * self.k
        self.counts = [0] * self.k
        self.assign = [0] * self.m
        self.extra = self.extra0
        try:
            ok = self._dfs(0)
        except _Budget:
            return None, "budget"
        return (self.assign.copy(), "found") if ok else (None, "refuted")

    def _dfs(self, i: int) -> bool:
        self.nodes += 1
        if self.nodes > self.budget:
            raise _Budget
        m = self.m
        if i == m:
            return True
        cap, loads, counts = self.cap, self.loads, self.counts
        pre, slack, cap_count = self.pre, self.slack, self.cap_count
        closed = self.balanced and self.extra == 0  # no part may grow past c any more
        # Room that the remaining units can really use: none in a part whose count is
        # full or whose room is below the smallest unit, and at most the ``q`` heaviest
        # remaining units in a part that may take ``q`` more.
        left = m - i
        room = 0.0
        for p in range(self.k):
            r = cap - loads[p]
            if r + slack < self.smallest:
                continue
            q = (self.c if closed else cap_count) - counts[p]
            if q <= 0:
                continue
            if q < left:
                t = pre[i + q] - pre[i]
                if t < r:
                    r = t
            room += r
        if room + slack < self.rem[i]:
            return False
        if self.need_min:
            tail, need = self.tail, self.need_min
            for p in range(self.k):
                q = need - counts[p]
                if q > 0 and loads[p] + tail[q] > cap + slack:
                    return False
        key = None
        if left > _MEMO_MIN_LEFT:
            key = (i, *sorted(zip(loads, counts)))
            if self.memo.get(key, -1.0) >= cap:
                return False
        x = self.s[i]
        seen = set()
        c, balanced = self.c, self.balanced
        order = sorted(range(self.k), key=loads.__getitem__)  # lightest first
        if self.free:
            # A unit that fills a part exactly goes there: any solution with it elsewhere
            # swaps it for the later units of that part, which weigh no more.
            for p in order:
                if loads[p] + x == cap:
                    order = [p]
                    break
        for p in order:
            lp = loads[p]
            if lp + x > cap:
                break  # parts are sorted by load: every later one is as heavy
            n_p = counts[p]
            if n_p >= cap_count or (closed and n_p == c):
                continue
            pair = (lp, n_p)
            if pair in seen:
                continue  # an interchangeable part was already tried
            seen.add(pair)
            grows = balanced and n_p == c
            loads[p] = lp + x
            counts[p] = n_p + 1
            self.assign[i] = p
            if grows:
                self.extra -= 1
            if self._dfs(i + 1):
                return True
            loads[p] = lp
            counts[p] = n_p
            if grows:
                self.extra += 1
        if key is not None and (len(self.memo) < _MEMO_MAX or key in self.memo):
            self.memo[key] = max(cap, self.memo.get(key, cap))
        return False
