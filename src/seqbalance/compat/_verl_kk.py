"""seqbalance's partition started from (or floored by) verl's own differencing, whose
reproduction with verl's tie rules lives in :mod:`seqbalance.partitioning._verl_kk` (the
planner's verl baseline runs it too); its names are re-exported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import as_weights
from ..partitioning._verl_kk import parts_of_labels, verl_equal_kk_labels, verl_free_kk_labels
from ..partitioning.kway import Partition
from ._core import partition_arrays

__all__ = [
    "equal_partition",
    "free_partition",
    "parts_of_labels",
    "verl_equal_kk_labels",
    "verl_free_kk_labels",
]


def equal_partition(values: Any, k: int, name: str = "values") -> Partition:
    """``partition(values, k, size="equal")``, its differencing start being verl's own.

    ``"auto"`` keeps the lightest of its refined starts, and refinement never raises the
    heaviest part, so the result is never heavier than the frameworks' equal-size
    differencing (verl, AReaL, slime, OpenRLHF). Raises ValueError for invalid weights or
    when ``len(values) % k != 0``.
    """
    return partition_arrays(as_weights(values, name), k, "equal", "auto", None, fold=True,
                            kk_start=verl_equal_kk_labels)  # fmt: skip


def free_partition(values: Any, k: int, name: str = "values") -> Partition:
    """``partition(values, k, size="free")``, with verl's own count-free differencing
    (:func:`verl_free_kk_labels`) as a floor: where it is lighter than seqbalance's
    partition it is refined and returned instead. So the heaviest part is never heavier
    than that of verl's, AReaL's, slime's or OpenRLHF's ``karmarkar_karp(equal_size=False)``,
    nor than ``partition``'s. Parts may be empty. Raises ValueError for invalid weights or
    ``k < 1``.
    """
    # A floor, not the start: seqbalance's own starts reach cap-fitting partitions that a
    # search from verl's start misses (OpenRLHF's count search on 8,192 rl-math lengths
    # needed 1,225 micro-batches instead of 1,224 that way).
    return partition_arrays(as_weights(values, name), k, "free", "auto", None,
                            floor=_free_labels)  # fmt: skip


def _free_labels(w: np.ndarray, k: int) -> np.ndarray:
    labels = verl_free_kk_labels(w, k)
    assert labels is not None  # no size cap given
    return labels
