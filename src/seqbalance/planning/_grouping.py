"""Per-bin totals of many small index lists, without a numpy call per list."""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

__all__ = ["bin_totals"]


def bin_totals(
    bins: Sequence[Sequence[int]], values: np.ndarray, *, padded: bool = False
) -> np.ndarray:
    """``values`` summed over each bin (padded: ``count * max``); empty bins give 0.

    Returns float64 for float ``values`` and int64 for integer ones.
    """
    sizes = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
    flat = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=int(sizes.sum()))
    labels = np.repeat(np.arange(len(bins)), sizes)
    v = values[flat]
    if padded:
        out = np.zeros(len(bins), dtype=v.dtype)
        np.maximum.at(out, labels, v)
        return out * sizes
    if v.dtype.kind in "iu":
        out = np.zeros(len(bins), dtype=np.int64)
        np.add.at(out, labels, v)
        return out
    return np.bincount(labels, weights=v, minlength=len(bins))
