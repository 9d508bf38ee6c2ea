"""Layer 1, beside costs: k-way balanced partitioning of weights, with size rules and groups.

Knows nothing of transformers or micro-batches: weights in, ``k`` index lists out.

- :mod:`.kway`: :func:`partition` and its result :class:`Partition`.
- :mod:`.contiguous`: :func:`contiguous_partition`, cuts of an ordered sequence into ``k``
  consecutive runs (the heaviest, then the spread, exactly minimal).
- :mod:`.bounds`: :func:`lower_bound`, a weight no partition's heaviest part can go below.
- :mod:`.searches`: :func:`exact_searches`, switching the small-problem exact searches off
  (or on) for a block of code.
- :mod:`.stats`: :func:`balance_stats` and the one gap helper, :func:`relative_gap`.
- ``_kk``, ``_greedy``, ``_refine``, ``_rules``: the algorithms (Karmarkar–Karp, longest
  processing time first, local moves and swaps) and the size rules they respect. They take
  arrays already validated by :func:`partition`.
- ``_verl_kk``: verl's own differencing with its tie rules (which AReaL, slime and OpenRLHF
  copy), for the planner's verl and slime baselines and the compat drop-ins.
"""

from __future__ import annotations

from .bounds import lower_bound
from .contiguous import contiguous_partition
from .kway import Partition, partition
from .searches import exact_searches, exact_searches_enabled
from .stats import balance_stats, relative_gap

__all__ = [
    "Partition",
    "balance_stats",
    "contiguous_partition",
    "exact_searches",
    "exact_searches_enabled",
    "lower_bound",
    "partition",
    "relative_gap",
]
