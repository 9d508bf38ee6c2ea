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
- the parts' remaining room below ``C`` cannot hold the remaining weight;
- under a size rule, a part that still needs ``q`` units would exceed ``C`` even
  with the ``q`` lightest units (they are the tail of the sorted weights);
- the part is interchangeable with one already tried at this node (same load and count:
  this removes the ``k!`` relabellings of every solution, empty parts included).

Tolerance: with integer weights whose total is below 2**53 every load is exact and
capacities are integers; otherwise bisection stops when ``hi - lo`` is below ``1e-12``
relative, so optimality is proven up to that rounding.

Complexity: exponential in the worst case, hence a budget of ``max_nodes`` search nodes in
all (deterministic: no clock involved); each node costs O(k).
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXACT_MAX_NODES", "EXACT_MAX_UNITS", "exact_labels"]

#: ``method="auto"`` runs the exact search on problems with at most this many units ...
EXACT_MAX_UNITS = 64
#: ... and stops it after this many search nodes (a few hundred ms of pure Python at worst).
EXACT_MAX_NODES = 60_000

_REL_TOL = 1e-12


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
    integer = bool(np.all(w == np.floor(w))) and float(w.sum()) < 2.0**53
    lo = float(np.ceil(bound)) if integer else float(bound)
    order = np.argsort(-w, kind="stable")
    search = _Decision(w[order].tolist(), k, size)
    budget = max_nodes
    failed_at = -np.inf  # the lowest capacity whose search ran out of nodes
    while _open(lo, hi, integer) and budget > 0:
        if failed_at == -np.inf and not search.tried:
            cap = lo
        else:
            floor_ = max(lo, failed_at)
            cap = floor_ + (hi - floor_) / 2
            if integer:
                cap = float(np.floor(cap))
                if cap >= hi or cap <= failed_at:
                    break
        found, status = search.run(cap, budget)
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
            if not _open(max(lo, cap), hi, integer):
                break
            failed_at = cap if integer else np.nextafter(cap, np.inf)
    return best, not _open(lo, hi, integer)


def _open(lo: float, hi: float, integer: bool) -> bool:
    """Whether the optimum is still unknown between ``lo`` and ``hi``."""
    if integer:
        return lo < hi
    return hi - lo > _REL_TOL * hi


class _Decision:
    """Depth-first search for a partition whose parts all weigh at most a capacity."""

    def __init__(self, s: list[float], k: int, size: str) -> None:
        m = len(s)
        self.s, self.k, self.m = s, k, m
        self.rem = [0.0] * (m + 1)  # rem[i] = s[i] + ... + s[m-1]
        for i in range(m - 1, -1, -1):
            self.rem[i] = self.rem[i + 1] + s[i]
        self.tail = [0.0] * (m + 1)  # tail[q] = the q lightest units
        for q in range(1, m + 1):
            self.tail[q] = self.tail[q - 1] + s[m - q]
        c = m // k
        self.c = c
        self.balanced = size == "balanced"
        if size == "free":
            self.need_min, self.cap_count, self.extra0 = 0, m, 0
        elif size == "equal":
            self.need_min, self.cap_count, self.extra0 = c, c, 0
        else:  # balanced: m % k parts take c + 1 units
            self.need_min, self.cap_count, self.extra0 = c, c + 1, m % k
        self.tried = False
        self.nodes = 0

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
        if i == self.m:
            return True
        cap, loads, counts = self.cap, self.loads, self.counts
        room = 0.0
        for lp in loads:
            room += cap - lp
        if room < self.rem[i]:
            return False
        if self.need_min:
            tail, need = self.tail, self.need_min
            for p in range(self.k):
                q = need - counts[p]
                if q > 0 and loads[p] + tail[q] > cap:
                    return False
        x = self.s[i]
        seen = set()
        c, cap_count, balanced = self.c, self.cap_count, self.balanced
        for p in sorted(range(self.k), key=loads.__getitem__):  # lightest first
            lp = loads[p]
            if lp + x > cap:
                break  # parts are sorted by load: every later one is as heavy
            n_p = counts[p]
            if n_p >= cap_count or (balanced and n_p == c and self.extra == 0):
                continue
            key = (lp, n_p)
            if key in seen:
                continue  # an interchangeable part was already tried
            seen.add(key)
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
        return False
