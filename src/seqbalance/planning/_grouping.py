"""Per-bin totals of many small index lists, without a numpy call per list."""

from __future__ import annotations

from itertools import chain
from typing import Callable, Sequence

import numpy as np

__all__ = ["bin_summer", "bin_totals"]


def bin_summer(
    bins: Sequence[Sequence[int]], *, padded: bool = False
) -> Callable[[np.ndarray], np.ndarray]:
    """A function of ``values`` that returns :func:`bin_totals` ``(bins, values, padded=)``,
    with ``bins`` flattened once for every total taken over them."""
    n = len(bins)
    sizes = np.fromiter(map(len, bins), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=int(sizes.sum()))
    labels = np.repeat(np.arange(n), sizes)

    def totals(values: np.ndarray) -> np.ndarray:
        v = values[flat]
        if padded:
            out = np.zeros(n, dtype=v.dtype)
            np.maximum.at(out, labels, v)
            return out * sizes
        if v.dtype.kind in "iu":
            out = np.zeros(n, dtype=np.int64)
            np.add.at(out, labels, v)
            return out
        return np.bincount(labels, weights=v, minlength=n)

    return totals


def bin_totals(
    bins: Sequence[Sequence[int]], values: np.ndarray, *, padded: bool = False
) -> np.ndarray:
    """``values`` summed over each bin (padded: ``count * max``); empty bins give 0.

    Returns float64 for float ``values`` and int64 for integer ones.
    """
    return bin_summer(bins, padded=padded)(values)
