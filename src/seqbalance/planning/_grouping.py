"""Per-bin totals of many small index lists, without a numpy call per list."""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

__all__ = ["BinSummer", "bin_summer", "bin_totals"]


class BinSummer:
    """Per-bin totals over ``bins``, flattened once: ``summer(values)`` is
    :func:`bin_totals` ``(bins, values, padded=)``. ``sizes``, ``flat`` and ``labels`` are
    each bin's length, the bins' items one after another, and the bin of each item, for
    callers that need other per-bin reductions of the same flattening."""

    def __init__(self, bins: Sequence[Sequence[int]], *, padded: bool = False) -> None:
        self.n = n = len(bins)
        self.padded = padded
        self.sizes = np.fromiter(map(len, bins), dtype=np.int64, count=n)
        self.flat = np.fromiter(
            chain.from_iterable(bins), dtype=np.int64, count=int(self.sizes.sum())
        )
        self.labels = np.repeat(np.arange(n), self.sizes)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        n, labels = self.n, self.labels
        v = values[self.flat]
        if self.padded:
            out = np.zeros(n, dtype=v.dtype)
            np.maximum.at(out, labels, v)
            return out * self.sizes
        if v.dtype.kind in "iu":
            out = np.zeros(n, dtype=np.int64)
            np.add.at(out, labels, v)
            return out
        return np.bincount(labels, weights=v, minlength=n)


def bin_summer(bins: Sequence[Sequence[int]], *, padded: bool = False) -> BinSummer:
    """A function of ``values`` that returns :func:`bin_totals` ``(bins, values, padded=)``,
    with ``bins`` flattened once for every total taken over them."""
    return BinSummer(bins, padded=padded)


def bin_totals(
    bins: Sequence[Sequence[int]], values: np.ndarray, *, padded: bool = False
) -> np.ndarray:
    """``values`` summed over each bin (padded: ``count * max``); empty bins give 0.

    Returns float64 for float ``values`` and int64 for integer ones.
    """
    return bin_summer(bins, padded=padded)(values)
