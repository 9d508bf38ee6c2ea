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
from typing import Iterator

__all__ = ["charge", "spent", "work_meter"]

_METER: ContextVar[list[int] | None] = ContextVar("seqbalance_work_meter", default=None)


@contextlib.contextmanager
def work_meter() -> Iterator[None]:
    """Count the work of the block (a nested block shares the outer meter)."""
    if _METER.get() is not None:
        yield
        return
    token = _METER.set([0])
    try:
        yield
    finally:
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
