"""More ways to fit sequences into a fixed number of bins when the fast packers fail.

:func:`seqbalance.planning._packing.pack` (capacitated LPT, then first-fit decreasing) is
fast but can miss a packing that exists, which would cost every rank a whole extra
micro-batch. Before the planner raises the micro-batch count it tries, in order:

``"partition"``
    Partition the token counts into ``nbins`` parts of near-equal size with
    :func:`seqbalance.partitioning.kway.partition_arrays` (Karmarkar-Karp and greedy, each
    refined): a balanced split often fits where greedy packing does not (tight bins whose
    total is close to ``nbins * cap``). Packed bins only.
``"exact"``
    :func:`seqbalance.planning._exact.pack_exact`, a bounded branch and bound: on small
    inputs it finds a packing whenever one exists, or proves there is none.

Either way the bins are then evened out by cost with the packer's own refinement, which
never breaks the capacity.
"""

from __future__ import annotations

import numpy as np

from ..partitioning.kway import partition_arrays
from ._exact import NODE_LIMIT, pack_exact
from ._grouping import bin_totals
from ._packing import _Bins, _fill_empty, _refine

__all__ = ["EXACT_MAX_ITEMS", "fit_by_partition", "fit_exact"]

EXACT_MAX_ITEMS = 64  # the branch and bound runs on at most this many sequences


def _finish(
    items: list[list[int]], w: np.ndarray, t: np.ndarray, nbins: int, cap: int, padded: bool
) -> list[list[int]]:
    bins = _Bins(w, t, nbins, cap, padded)
    bins.items = [list(b) for b in items]
    bins.cost = np.asarray(bin_totals(bins.items, w, padded=padded), dtype=np.float64)
    bins.tok = np.asarray(bin_totals(bins.items, t, padded=padded), dtype=np.int64)
    for b, x in enumerate(bins.items):
        if x:
            idx = np.asarray(x, dtype=np.int64)
            bins.maxw[b], bins.maxt[b] = w[idx].max(), t[idx].max()
    if not padded:
        _refine(bins, max_steps=4 * nbins + 2000)
    _fill_empty(bins)
    return bins.items


def fit_by_partition(
    w: np.ndarray, t: np.ndarray, nbins: int, cap: int
) -> list[list[int]] | None:
    """Packed bins from a token-balanced partition into ``nbins`` parts, or None if a part
    is over ``cap``."""
    parts = partition_arrays(t.astype(np.float64), nbins, "free", "auto", None)
    items = [list(p) for p in parts]
    if int(bin_totals(items, t).max(initial=0)) > cap:
        return None
    return _finish(items, w, t, nbins, cap, False)


def fit_exact(
    w: np.ndarray,
    t: np.ndarray,
    nbins: int,
    cap: int,
    *,
    padded: bool = False,
    node_limit: int = NODE_LIMIT,
) -> tuple[list[list[int]] | None, str]:
    """Bins from the branch and bound, refined by cost; status as in ``pack_exact``."""
    items, status = pack_exact(t.tolist(), nbins, cap, padded=padded, node_limit=node_limit)
    if items is None:
        return None, status
    return _finish(items, w, t, nbins, cap, padded), status
