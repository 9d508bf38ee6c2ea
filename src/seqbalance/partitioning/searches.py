"""Turn the small-problem exact searches of :func:`~seqbalance.partition` off or on.

On problems of at most 64 units, ``partition(method="auto")`` follows its refined
heuristic starts with exact searches (a meet-in-the-middle split into two parts, an
enumeration of the heaviest part, a branch and bound, a bisection of the capacity) that
prove, or come closer to, the optimum. They are bounded by work budgets, not by time, and
can take up to about a second in pure Python, where the heuristic result takes a few
milliseconds and is usually within a fraction of a per cent of it. A caller that
partitions a few dozen sequences inside every training step may prefer the milliseconds:
:func:`exact_searches` switches the searches off (or back on) for a block of code,
including the partitions :func:`~seqbalance.plan` makes, without threading an argument
through every call. Only the two-part split on at most :data:`FAST_TWO_WAY_MAX_UNITS`
units stays on: it takes under a millisecond there.

The setting is a :class:`contextvars.ContextVar`: it holds for the current thread (or
asyncio task) inside the ``with`` block only, and a new thread starts from the default.
With the searches off, results stay deterministic (the same input gives the same output),
``Partition.optimal`` is True only when the heaviest part meets the lower bound (or the
two-part split proved it), and the lower bound is the same as with the searches on (its
heaviest-units term searches at most 12 units, whatever the setting: milliseconds). A
generator that yields inside the ``with`` block lends the setting to its caller until it
resumes (context variables follow the thread, not the generator's frame): leave the block
before yielding. Ranks that plan the same global layout on their own must use the same
setting: :func:`seqbalance.torch.rebalance` and
:class:`~seqbalance.torch.BalancedDistributedSampler` check it across ranks with their other
arguments (the sampler keeps the setting it was built under for every step it plans).

The planner's micro-batch count search ("do these sequences fit into ``m``
micro-batches?") keeps its exact packing search, with 10,000 nodes instead of 200,000
(``FAST_NODE_LIMIT`` in :mod:`seqbalance.planning._exact`): packings that exist are
mostly found within that, and what is given up is the proof that none exists, which needs
the whole tree.

Measured on the 1,836 small calls of ``bench/compat_small.py`` (the compat drop-ins on
8-128 sequences, both settings side by side): the same micro-batch counts in all;
heaviest parts 0.05% heavier on average and 4.5% at most; 2.3 s in all against 56 s, the
slowest call 30 ms against 1.2 s.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

import numpy as np

__all__ = ["FAST_TWO_WAY_MAX_UNITS", "exact_searches", "exact_searches_enabled"]

#: With the searches off, the two-part meet-in-the-middle split still runs on at most this
#: many units: there it takes under a millisecond (0.4 ms at 24, 12 ms at 32) and proves the
#: optimum, which the heuristics miss by up to a few per cent on so few units.
FAST_TWO_WAY_MAX_UNITS = 24

# None: nobody chose; the core reads that as on, the compat drop-ins as off.
_EXACT_SEARCHES: ContextVar[bool | None] = ContextVar("seqbalance_exact_searches", default=None)


# The exact-search nodes one request (one call of plan()) may still spend, or None outside
# such a request: see exact_work_pool.
_POOL: ContextVar[list[int] | None] = ContextVar("seqbalance_exact_pool", default=None)


def exact_searches_enabled() -> bool:
    """Whether :func:`~seqbalance.partition` runs its small-problem exact searches here.

    Returns
    -------
    bool
        False inside ``with exact_searches(False)`` (or a compat drop-in called outside any
        such block), or inside a planning request that has spent its pool of exact-search
        nodes (:func:`exact_work_pool`); True otherwise.
    """
    if _EXACT_SEARCHES.get() is False:
        return False
    pool = _POOL.get()
    return pool is None or pool[0] > 0


def exact_searches_chosen() -> bool:
    """Whether an enclosing ``with exact_searches(True)`` turned the searches on (a
    planning request then keeps the full node pool at every effort)."""
    return _EXACT_SEARCHES.get() is True


@contextlib.contextmanager
def exact_work_pool(nodes: int) -> Iterator[None]:
    """Let the exact searches inside the block spend at most about ``nodes`` nodes in all.

    Each search is bounded on its own; a request that runs many of them (a plan searches
    every rank at every count it tries) could still add up to minutes. Inside the block
    every node-counted search takes its budget out of this pool (:func:`take_nodes`; the
    heaviest-part enumerations and the bisection of ``partition`` count
    ``kway.HEAVIEST_UNITS_PER_NODE`` of their work units a node), and
    once the pool is spent the rest of the block runs as inside
    ``exact_searches(False)``. Counted in nodes, never in time: every rank computes the
    same result. A nested block shares the outer pool.
    """
    if _POOL.get() is not None:
        yield
        return
    token = _POOL.set([int(nodes)])
    try:
        yield
    finally:
        _POOL.reset(token)


def take_nodes(want: int) -> int:
    """The node budget a search asking for ``want`` gets: ``want`` outside a pool, else at
    most what the pool has left (0 when it is spent)."""
    pool = _POOL.get()
    return want if pool is None else max(0, min(want, pool[0]))


def nodes_left() -> int | None:
    """The nodes left in the pool of the enclosing :func:`exact_work_pool`; None outside one."""
    pool = _POOL.get()
    return None if pool is None else pool[0]


def spend_nodes(nodes: int) -> None:
    """Charge ``nodes`` to the pool of the enclosing :func:`exact_work_pool`, if any."""
    pool = _POOL.get()
    if pool is not None:
        pool[0] -= int(nodes)


@contextlib.contextmanager
def exact_searches(enabled: bool = True) -> Iterator[None]:
    """Run the enclosed block with ``partition``'s exact searches on or off.

    Parameters
    ----------
    enabled : bool, default True
        False: ``partition`` (and ``plan``, through it) keeps its refined heuristic result
        on small problems instead of searching for the optimum. True: the searches run, as
        by default; inside the :mod:`seqbalance.compat` drop-ins, which otherwise leave
        them off to stay about as fast as the code they replace.

    Examples
    --------
    >>> import seqbalance as sb
    >>> with sb.exact_searches(False):
    ...     p = sb.partition([8, 7, 6, 5, 4, 3, 2, 1], 3)
    >>> sorted(len(part) for part in p), p.max_load >= p.lower_bound
    ([2, 3, 3], True)
    >>> sb.exact_searches_enabled()
    True
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise ValueError(f"exact_searches takes True or False, got {enabled!r}")
    token = _EXACT_SEARCHES.set(bool(enabled))
    try:
        yield
    finally:
        _EXACT_SEARCHES.reset(token)


@contextlib.contextmanager
def exact_searches_unless_chosen(enabled: bool) -> Iterator[None]:
    """Like :func:`exact_searches`, but only where no enclosing block chose already (the
    compat drop-ins' default, which a user's ``with exact_searches(True)`` overrides)."""
    if _EXACT_SEARCHES.get() is not None:
        yield
        return
    with exact_searches(enabled):
        yield
