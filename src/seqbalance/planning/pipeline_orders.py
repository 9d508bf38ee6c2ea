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

import itertools
import math
from typing import Callable

import numpy as np

from .pipeline import PipelineSpec, graph, pipeline_lower_bound

__all__ = ["ORDERS", "best_orders", "largest_first", "light_ends", "smallest_first"]


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
BUDGET = 40_000_000  # simulated operations per search
_BATCH = 8  # replicas searched side by side


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


def _moves(m: int) -> np.ndarray:
    """Neighbour permutations of ``range(m)``: all swaps, and moves of one item elsewhere.

    Above 24 micro-batches only swaps within distance 4 or touching the two ends, and moves
    to or from the ends, to keep a pass affordable.
    """
    base = np.arange(m)
    out = []
    full = m <= 24
    ends = {0, 1, m - 2, m - 1}
    for i in range(m):
        for j in range(i + 1, m):
            if full or j - i <= 4 or i in ends or j in ends:
                q = base.copy()
                q[i], q[j] = q[j], q[i]
                out.append(q)
    for i in range(m):
        for j in range(m):
            if abs(i - j) < 2:
                continue  # a swap already covers neighbours
            if full or i in ends or j in ends:
                q = np.delete(base, i)
                out.append(np.insert(q, j, i))
    return np.asarray(out, dtype=np.int64).reshape(-1, m)


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
        Simulated operations the local search may spend (deterministic stopping rule).

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

    # Each search below runs only where one pass of it over one replica fits the budget
    # (else the best start stands): a pass builds and simulates every neighbour order at
    # once, so its memory and time grow with m**2 (m**2 * pp_size * virtual_stages).
    if m <= exact_limit and math.factorial(m) * g.n_nodes <= budget:
        all_perms = np.asarray(list(itertools.permutations(range(m))), dtype=np.int64)
        while True:
            rows = active()
            if rows.size == 0:
                break
            r = int(rows[np.lexsort((rows, -times[rows]))][0])  # the slowest first
            t = evaluate(np.full(all_perms.shape[0], r), all_perms)
            k = int(np.argmin(t))  # first minimum: deterministic
            if t[k] < times[r]:
                best[r], times[r] = all_perms[k], t[k]
            done[r] = True
        return best, times

    if _move_count(m) * g.n_nodes > budget:
        return best, times
    moves = _moves(m)
    per = moves.shape[0] * g.n_nodes
    spent = 0
    while spent < budget:
        rows = active()
        if rows.size == 0:
            break
        # The slowest few first: once they settle, faster replicas often need no search.
        rows = rows[np.lexsort((rows, -times[rows]))]
        rows = rows[: max(1, min(_BATCH, (budget - spent) // max(per, 1)))]
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
    return best, times
