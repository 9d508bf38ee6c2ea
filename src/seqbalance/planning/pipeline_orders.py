"""Orders of micro-batches for a pipeline schedule: the baselines, and the planner's search.

Baseline orders (what frameworks do, written from their descriptions), each a function of
the micro-batches' training costs returning the run order (a permutation of positions):

``input``
    as given (the planner's micro-batches sorted by their first sequence index: the
    arrival order a trainer would see).
``largest-first``
    heaviest first (NeMo-RL's sequence packing runs the largest micro-batch first).
``smallest-first``
    lightest first.
``light-ends``
    verl's ``use_dynamic_bsz_balance`` (ROLL does the same): sort heaviest first, then
    take every other micro-batch reversed followed by the rest, so light micro-batches sit
    at both ends and the heaviest in the middle.

:func:`best_orders` is the planner's search, for many replicas at once: every baseline
order plus "lightest, then heaviest first" as starting points; exhaustive over all orders
for ``m <= exact_limit`` (skipped when a start already meets the lower bound); beyond that,
steepest descent over swaps and insertions under the simulator, until no move improves or
a work budget (counted in simulated operations, so the result is deterministic) is spent.
A replica is searched only while it could still set the step (its time is above the
largest lower bound over replicas).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from contextvars import ContextVar
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np

from .pipeline import PipelineSpec, graph, pipeline_lower_bound

__all__ = [
    "ORDERS",
    "best_orders",
    "largest_first",
    "light_ends",
    "search_kind",
    "search_pool",
    "search_suspended",
    "smallest_first",
]


def _input(weights: np.ndarray) -> np.ndarray:
    return np.arange(weights.shape[0], dtype=np.int64)


def largest_first(weights: np.ndarray) -> np.ndarray:
    """Heaviest first; ties keep the given order."""
    return np.lexsort((np.arange(weights.shape[0]), -weights)).astype(np.int64)


def smallest_first(weights: np.ndarray) -> np.ndarray:
    """Lightest first; ties keep the given order."""
    return np.lexsort((np.arange(weights.shape[0]), weights)).astype(np.int64)


def light_ends(weights: np.ndarray) -> np.ndarray:
    """verl's order: ``d[::2][::-1] + d[1::2]`` of the heaviest-first order ``d``.

    Examples
    --------
    >>> light_ends(np.array([5.0, 1.0, 4.0, 2.0, 3.0])).tolist()   # weights 1 3 5 4 2
    [1, 4, 0, 2, 3]
    """
    d = largest_first(weights)
    return np.concatenate([d[::2][::-1], d[1::2]])


ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "input": _input,
    "largest-first": largest_first,
    "smallest-first": smallest_first,
    "light-ends": light_ends,
}
"""Baseline orders by name: ``weights -> permutation`` (run order of positions)."""


def _light_then_heavy(weights: np.ndarray) -> np.ndarray:
    """Lightest first (short fill), then heaviest first (the drain ends on a light one)."""
    d = largest_first(weights)
    return np.concatenate([d[-1:], d[:-1]])


_STARTS = (*ORDERS.values(), _light_then_heavy)

EXACT_LIMIT = 8
#: Simulated operations (nodes of the pipeline graph x orders simulated) one search may
#: spend beyond its starting orders: about 0.1 s of numpy on one core.
BUDGET = 6_000_000
_BATCH = 8  # replicas searched side by side

# The simulated operations the searches of one request (one call of plan()) may still
# spend, or None outside such a request: see search_pool.
_POOL: ContextVar[list[int] | None] = ContextVar("seqbalance_pipeline_search_pool", default=None)


@contextlib.contextmanager
def search_pool(operations: int) -> Iterator[None]:
    """Let the order searches inside the block spend at most ``operations`` simulated
    operations in all (each keeps its own :data:`BUDGET` too).

    A request may search many candidate plans (counts, packings, CP layouts); each search
    takes its budget out of this pool, and once it is spent the rest run their starting
    orders only (the best of the baselines, still simulated). Counted in work, never in
    time: every rank computes the same result. A nested block shares the outer pool.
    """
    if _POOL.get() is not None:
        yield
        return
    token = _POOL.set([int(operations)])
    try:
        yield
    finally:
        _POOL.reset(token)


@contextlib.contextmanager
def search_suspended() -> Iterator[None]:
    """Run the block's order searches on their starting orders only (an empty pool), for
    plans whose order is searched again afterwards on other costs."""
    token = _POOL.set([0])
    try:
        yield
    finally:
        _POOL.reset(token)


def _take(want: int) -> int:
    pool = _POOL.get()
    return want if pool is None else max(0, min(want, pool[0]))


def _spend(operations: int) -> None:
    pool = _POOL.get()
    if pool is not None:
        pool[0] -= int(operations)


def _move_count(m: int) -> int:
    """How many permutations :func:`_moves` returns for ``m``, without building them."""
    if m <= 24:
        return m * (m - 1) // 2 + max(m * m - m - 2 * (m - 1), 0)
    ends = (0, 1, m - 2, m - 1)

    def touching(gap: int) -> int:  # ordered pairs (i, j), |i - j| >= gap, an end among them
        one = sum(m - (min(e + gap - 1, m - 1) - max(e - gap + 1, 0) + 1) for e in ends)
        both = sum(1 for a in ends for b in ends if abs(a - b) >= gap)
        return 2 * one - both

    return (4 * m - 10) + touching(5) // 2 + touching(2)


@lru_cache(maxsize=8)
def _moves(m: int) -> np.ndarray:
    """Neighbour permutations of ``range(m)``: all swaps, and moves of one item elsewhere.

    Above 24 micro-batches only swaps within distance 4 or touching the two ends, and moves
    to or from the ends, to keep a pass affordable. Built with array operations (the rows
    in the order of a loop over swaps ``i < j``, then moves of ``i`` to ``j``); cached and
    read-only, as every search of one micro-batch count asks for the same rows.
    """
    full = m <= 24
    i, j = np.triu_indices(m, 1)
    ends = np.zeros(m, dtype=bool)
    ends[[k for k in (0, 1, m - 2, m - 1) if 0 <= k < m]] = True
    if not full:
        keep = (j - i <= 4) | ends[i] | ends[j]
        i, j = i[keep], j[keep]
    base = np.arange(m, dtype=np.int64)
    swaps = np.broadcast_to(base, (i.size, m)).copy()
    rows = np.arange(i.size)
    swaps[rows, i], swaps[rows, j] = j, i
    # moves of item a to place b, |a - b| >= 2, in the loop's order (a, then b)
    a, b = np.divmod(np.arange(m * m, dtype=np.int64), m)
    keep = np.abs(a - b) >= 2
    if not full:
        keep &= ends[a] | ends[b]
    a, b = a[keep, None], b[keep, None]
    k = base[None, :]
    shifted = np.where((a < b) & (a <= k) & (k < b), k + 1, k)
    shifted = np.where((a > b) & (b < k) & (k <= a), k - 1, shifted)
    inserts = np.where(k == b, a, shifted)
    out = np.concatenate([swaps, inserts]).reshape(-1, m)
    out.setflags(write=False)
    return out


def search_kind(spec: PipelineSpec, m: int) -> str:
    """How :func:`best_orders` searches ``m`` micro-batches under ``spec`` with its default
    budget, in words for a plan's notes."""
    if m <= EXACT_LIMIT and math.factorial(m) * 2 * spec.pp_size * spec.virtual_stages * m <= (
        BUDGET
    ):
        return "exact over all orders, within a work budget"
    return "local search from the baselines, within a work budget"


def best_orders(
    forward: np.ndarray,
    backward: np.ndarray,
    comm: np.ndarray | None,
    spec: PipelineSpec,
    *,
    exact_limit: int = EXACT_LIMIT,
    budget: int = BUDGET,
) -> tuple[np.ndarray, np.ndarray]:
    """Run orders minimising the simulated pipeline step of each replica.

    Parameters
    ----------
    forward, backward, comm : np.ndarray
        ``(R, m)`` per-micro-batch costs of ``R`` replicas (``comm`` may be None).
    spec : PipelineSpec
        The pipeline layout.
    exact_limit : int
        Search every order when ``m <= exact_limit`` (``m!`` simulations per replica).
    budget : int
        Simulated operations the exhaustive or local search may spend beyond the starting
        orders (deterministic stopping rule); inside :func:`search_pool` at most what the
        pool has left, and what is spent is taken out of it.

    Returns
    -------
    orders : np.ndarray
        ``(R, m)`` permutations: ``orders[r][k]`` is the position run ``k``-th.
    times : np.ndarray
        ``(R,)`` simulated step time of each replica in that order.
    """
    r_count, m = forward.shape
    comm_arr = np.zeros_like(forward) if comm is None else comm
    if m == 0:
        return np.zeros((r_count, 0), dtype=np.int64), np.zeros(r_count)
    g = graph(spec, m)

    def evaluate(rows: np.ndarray, perms: np.ndarray) -> np.ndarray:
        f = np.take_along_axis(forward[rows], perms, axis=1)
        b = np.take_along_axis(backward[rows], perms, axis=1)
        c = np.take_along_axis(comm_arr[rows], perms, axis=1) if comm is not None else None
        return g.step_times(f, b, c)

    weights = forward + backward
    best = np.zeros((r_count, m), dtype=np.int64)
    times = np.full(r_count, np.inf)
    # Every start of every replica in one simulation (one pass over the graph's levels
    # instead of one per start), then taken in order as before: a later start wins only
    # when strictly faster.
    starts = np.stack([np.stack([start(weights[r]) for r in range(r_count)])
                       for start in _STARTS])  # fmt: skip
    every = evaluate(np.tile(np.arange(r_count), len(_STARTS)), starts.reshape(-1, m))
    for perms, t in zip(starts, every.reshape(len(_STARTS), r_count)):
        better = t < times
        best[better], times[better] = perms[better], t[better]
    # Each search below runs only where one pass of it over one replica fits the budget
    # (else the best start stands): a pass builds and simulates every neighbour order at
    # once, so its memory and time grow with m**2 (m**2 * pp_size * virtual_stages).
    budget = _take(budget)
    spent = 0
    exhaustive = m <= exact_limit and math.factorial(m) * g.n_nodes <= budget
    if not exhaustive and _move_count(m) * g.n_nodes > budget:
        return best, times  # no search runs (the bounds below only steer one)
    bounds = np.array(
        [
            pipeline_lower_bound(
                forward[r],
                backward[r],
                spec.pp_size,
                virtual_stages=spec.virtual_stages,
                comm=comm_arr[r],
                schedule=spec.schedule,
            )
            for r in range(r_count)
        ]
    )
    # The step is the slowest replica's time: a replica at or below the largest bound, or
    # below a replica that is already as good as the search can make it, cannot set it.
    floor = float(bounds.max())
    done = times <= bounds * (1 + 1e-12)

    def active() -> np.ndarray:
        settled = max(floor, float(times[done].max()) if done.any() else 0.0)
        return np.flatnonzero(~done & (times > settled * (1 + 1e-12)))

    if exhaustive:
        all_perms = np.asarray(list(itertools.permutations(range(m))), dtype=np.int64)
        per = all_perms.shape[0] * g.n_nodes
        while spent + per <= budget:
            rows = active()
            if rows.size == 0:
                break
            r = int(rows[np.lexsort((rows, -times[rows]))][0])  # the slowest first
            t = evaluate(np.full(all_perms.shape[0], r), all_perms)
            spent += per
            k = int(np.argmin(t))  # first minimum: deterministic
            if t[k] < times[r]:
                best[r], times[r] = all_perms[k], t[k]
            done[r] = True
        _spend(spent)
        return best, times

    moves = _moves(m)
    per = moves.shape[0] * g.n_nodes
    while spent + per <= budget:
        rows = active()
        if rows.size == 0:
            break
        # The slowest few first: once they settle, faster replicas often need no search.
        rows = rows[np.lexsort((rows, -times[rows]))]
        rows = rows[: max(1, min(_BATCH, (budget - spent) // per))]
        cand = best[rows][:, moves]  # (rows, moves, m): each move applied to the current order
        owner = np.repeat(rows, moves.shape[0])
        t = evaluate(owner, cand.reshape(-1, m)).reshape(rows.size, moves.shape[0])
        spent += rows.size * per
        k = np.argmin(t, axis=1)
        tk = t[np.arange(rows.size), k]
        improved = tk < times[rows] * (1 - 1e-12)
        done[rows[~improved]] = True  # a local optimum
        sel = np.flatnonzero(improved)
        best[rows[sel]] = cand[sel, k[sel]]
        times[rows[sel]] = tk[sel]
    _spend(spent)
    return best, times
