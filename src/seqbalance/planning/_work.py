"""A request's work meter: the passes its packers have run, so that optional searches
(counts beyond the first one found) can stop on a budget counted in work.

The packers charge what they run (:func:`charge`): one unit is about one numpy pass over a
pair of bins or a slot's candidates (tens of microseconds). A search that plans more
candidates than it needs reads the meter (:func:`spent`) and stops once its share is used.
Counted in work, never in time: every rank computes the same plan. Outside
:func:`work_meter` nothing is counted and nothing stops.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Callable, Iterator

from ..partitioning.searches import nodes_left, spend_nodes

__all__ = [
    "CANDIDATE_WORK",
    "COUNT_WORK",
    "candidates_spent",
    "charge",
    "counts_spent",
    "remembered",
    "remembered_search",
    "spent",
    "work_meter",
]

#: Work after which a request plans no more counts beyond the first each search finds: the
#: caller's ``extra_micro_batches`` (static CP's too), the pipeline count search and the
#: plan made without the pipeline stop there with the counts planned. The count searches of
#: ``bench/pp.py`` reach at most 16,500 units with their next count's.
COUNT_WORK = 18_000

#: Work after which the baselines' plans are candidates as they are, no longer slack-filled
#: (pipelined plans fill them): twice :data:`COUNT_WORK`, so that the plans of a count
#: search within its budget keep their filled baselines.
CANDIDATE_WORK = 2 * COUNT_WORK

_METER: ContextVar[list[int] | None] = ContextVar("seqbalance_work_meter", default=None)
# Results remembered for the block (see remembered), beside the meter.
_MEMO: ContextVar[dict[Any, Any] | None] = ContextVar("seqbalance_request_memo", default=None)


@contextlib.contextmanager
def work_meter() -> Iterator[None]:
    """Count the work of the block (a nested block shares the outer meter)."""
    if _METER.get() is not None:
        yield
        return
    token = _METER.set([0])
    memo = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(memo)
        _METER.reset(token)


def charge(units: int) -> None:
    """Add ``units`` to the enclosing meter, if any."""
    meter = _METER.get()
    if meter is not None:
        meter[0] += int(units)


def spent() -> int | None:
    """The units charged so far in the enclosing meter; None outside one."""
    meter = _METER.get()
    return None if meter is None else meter[0]


def counts_spent(next_count: int = 0) -> bool:
    """Whether this request's work, plus ``next_count`` (what the last count planned cost:
    the next one costs about as much), is past :data:`COUNT_WORK` (never outside a
    meter)."""
    done = spent()
    return done is not None and done + next_count > COUNT_WORK


def remembered(key: Any, make: Callable[[], Any]) -> Any:
    """``make()``, computed once per ``key`` inside the enclosing meter's block (a request
    repeats some deterministic steps on the same input, e.g. when it plans its fewest count
    again after the extra counts); outside a block, every time. Callers pass keys that fix
    the result and copy what they change."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


def remembered_search(key: Any, make: Callable[[], Any]) -> Any:
    """:func:`remembered` for steps whose exact searches draw on the request's node pool
    (:func:`seqbalance.partitioning.searches.exact_work_pool`): remembered per ``key`` and
    the nodes left when it runs, and a remembered result spends again the nodes it spent
    when made, so every later search finds the pool as if it had run again."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    left = nodes_left()
    full = ("nodes", key, left)
    if full not in memo:
        got = make()
        after = nodes_left()
        memo[full] = (got, 0 if left is None or after is None else left - after)
    else:
        spend_nodes(memo[full][1])
    return memo[full][0]


def candidates_spent() -> bool:
    """Whether this request's work is past :data:`CANDIDATE_WORK` (never outside a meter)."""
    done = spent()
    return done is not None and done > CANDIDATE_WORK
