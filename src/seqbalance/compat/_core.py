"""The core entry points as the drop-ins call them: without the small-problem exact
searches, unless the caller switched them on (``with seqbalance.exact_searches(True)``).

The frameworks' own functions answer a few dozen sequences in 0.05-10 ms; the core's
exact searches may spend up to a second there to shave off a few per cent (see
:mod:`seqbalance.partitioning.searches`), inside every training step. The drop-ins'
guarantees do not rest on those searches: their results are never heavier than the
framework's own at an equal count because the framework's partition is a start, a floor
or a candidate, and the planner's micro-batch count search stays exact.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from ..partitioning import kway
from ..partitioning import partition as _partition
from ..partitioning.searches import exact_searches_unless_chosen
from ..planning import plan as _plan

__all__ = ["partition", "partition_arrays", "plan"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _searches_off_by_default(fn: _F) -> _F:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with exact_searches_unless_chosen(False):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


partition = _searches_off_by_default(_partition)
plan = _searches_off_by_default(_plan)
partition_arrays = _searches_off_by_default(kway.partition_arrays)
