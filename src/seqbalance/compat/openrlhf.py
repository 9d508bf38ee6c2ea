"""Drop-in for OpenRLHF's balancing code, implemented on seqbalance.

Replaces ``openrlhf.utils.seqlen_balancing`` (the partition helpers OpenRLHF copied from
verl, shared with :mod:`seqbalance.compat.verl`, and
:func:`get_minimum_num_micro_batch_size`) and ``balance_experiences`` of
``openrlhf.trainer.ppo_utils.experience``. Change the imports, or call :func:`patch` once
before training (:func:`unpatch` undoes it). ``docs/migrating.md`` lists the differences.

This module never imports OpenRLHF, and torch only when handed tensors.
:func:`balance_experiences` regroups OpenRLHF's own ``Experience`` batches by gathering
rows field by field (``_experience_rows``: the batches splitting and merging would make,
without one object per sample); anything else it splits and merges with the
``split_experience_batch`` / ``make_experience_batch`` functions of the module that
defines the experience class it is given.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np

from ..planning._packing import first_fit_opening
from . import _verl_dropin as _verl
from ._core import framework_is_better, partition
from ._experience_rows import layout as _row_layout
from ._inputs import (
    CompatAssertionError,
    Patcher,
    count_arg,
    patch_all,
    to_numpy,
    token_counts,
    unpatch_all,
)
from ._verl_kk import parts_of_labels, verl_free_kk_labels

__all__ = [
    "balance_experiences",
    "ceildiv",
    "get_minimum_num_micro_batch_size",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "karmarkar_karp",
    "log_seqlen_unbalance",
    "patch",
    "unpatch",
]

karmarkar_karp = _verl.karmarkar_karp
greedy_partition = _verl.greedy_partition
log_seqlen_unbalance = _verl.log_seqlen_unbalance
ceildiv = _verl.ceildiv
get_reverse_idx = _verl.get_reverse_idx


#: :func:`get_minimum_num_micro_batch_size` tries counts one by one this far above the
#: ``ceil(tokens / capacity)`` bound before it gallops.
_LINEAR_STEPS = 3

#: The last partition that :func:`get_minimum_num_micro_batch_size` saw fit: (weights,
#: count, the parts' indices end to end, where each part ends). OpenRLHF asks for the
#: count and then for the partition at that count on the same lengths, which is the same
#: (deterministic) partition; one slot, replaced whole, in arrays (no Python objects per
#: sample are kept between calls).
_last_fit: tuple[np.ndarray, int, np.ndarray, np.ndarray] | None = None

#: :func:`balance_experiences` regroups OpenRLHF's own ``Experience`` batches by gathering
#: rows (``_experience_rows``: the same batches as splitting and merging, without one
#: object per sample). False: always split and merge with the module's helpers.
GATHER_ROWS = True


def get_seqlen_balanced_partitions(
    seqlen_list: Any, k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """:func:`seqbalance.compat.verl.get_seqlen_balanced_partitions` (OpenRLHF's copy).

    The call that follows :func:`get_minimum_num_micro_batch_size` with its count on the
    same lengths gets the partition that count was checked with (a copy): the computed one,
    except where samples exceed the capacity (each alone, the rest balanced into the
    other parts) or where the count is OpenRLHF's own (OpenRLHF's differencing), so that
    the caller's next step holds the cap. Any other call computes the partition.
    """
    last = _last_fit
    if last is not None and not equal_size and int(k_partitions) == last[1]:
        w = _verl._weights(seqlen_list, "seqlen_list")
        if np.array_equal(w, last[0]):
            return [p.tolist() for p in np.split(last[2], last[3][:-1])]
    return _verl.get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)


def get_minimum_num_micro_batch_size(
    total_lengths: Any, max_tokens_per_gpu: int, ring_attn_size: int, ds_tensor_parallel_size: int
) -> int:
    """The number of micro-batches to ask :func:`get_seqlen_balanced_partitions` for.

    The capacity is ``max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size``
    tokens. OpenRLHF counts first-fit bins and then balances into that many parts without
    the cap, which can overflow it; this returns the smallest count (from the
    ``ceil(tokens / capacity)`` bound up) for which the balanced partition of
    :func:`get_seqlen_balanced_partitions` on these lengths holds the cap, a sample longer
    than the capacity alone in its part (the others balanced into the remaining parts),
    and never more than OpenRLHF's count where OpenRLHF's own partition at its count holds
    the cap (that partition is then the one the next call gets). 0 for no samples.
    """
    lens = token_counts(total_lengths, "total_lengths").reshape(-1)
    cap = (
        count_arg(max_tokens_per_gpu, "max_tokens_per_gpu")
        * count_arg(ring_attn_size, "ring_attn_size")
        * count_arg(ds_tensor_parallel_size, "ds_tensor_parallel_size")
    )
    n = lens.shape[0]
    if n == 0:
        return 0
    over = int((lens > cap).sum())
    # Sequences above the cap each need a part of their own; the rest need their tokens.
    lo = max(1, over + ceildiv(int(lens[lens <= cap].sum()), cap))

    weights = lens.astype(np.float64)  # as the partition reads them, converted once
    alone = np.flatnonzero(lens > cap)
    rest = np.flatnonzero(lens <= cap)

    def remember(m: int, parts: list[list[int]]) -> None:
        global _last_fit
        flat = np.fromiter((i for p in parts for i in p), dtype=np.int64, count=n)
        ends = np.cumsum([len(p) for p in parts], dtype=np.int64)
        _last_fit = (weights, m, flat, ends)

    def holds(parts: list[list[int]]) -> bool:
        return all(len(p) == 1 or int(lens[p].sum()) <= cap for p in parts)

    def fits(m: int) -> bool:
        if not over:
            parts = _verl.get_seqlen_balanced_partitions(weights, m, False)
        elif m - over < (1 if rest.size else 0):
            return False
        else:
            # Balanced together, a long sample sets the heaviest part and the others may
            # break the cap beside it: it goes alone, the rest into the other parts.
            sub = (_verl.get_seqlen_balanced_partitions(weights[rest], m - over, False)
                   if rest.size else [])  # fmt: skip
            parts = [[int(i)] for i in alone] + [sorted(rest[p].tolist()) for p in sub]
        ok = holds(parts)
        if ok:
            remember(m, parts)
        return ok

    def at_their_count(found: int) -> int:
        """OpenRLHF's count (first fit in input order) where it is lower and OpenRLHF's
        own differencing at that count holds the cap; else ``found``."""
        theirs = len(first_fit_opening(range(n), lens, cap))
        if theirs >= found:
            return found
        # (without a size, the differencing always labels)
        labels = cast(np.ndarray, verl_free_kk_labels(weights, theirs))
        parts = parts_of_labels(labels, theirs)
        if not holds(parts):
            return found  # OpenRLHF's partition breaks the cap there (a fixed bug)
        remember(theirs, [sorted(p) for p in parts])
        return theirs

    # Step up from the bound (the count is almost always within a few of it), then gallop
    # and bisect back: O(log n) partitions. Only counts seen to fit are returned (n always
    # does: one sample per part).
    if lo >= n or fits(lo):
        return min(lo, n)
    bad, step = lo, 1
    while True:
        good = min(bad + step, n)
        if good == n or fits(good):  # n always holds: one sample a part
            break
        bad = good
        if good - lo >= _LINEAR_STEPS:
            step *= 2
    while good - bad > 1:
        mid = (bad + good) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return at_their_count(good)


def _experience_helpers(item: Any) -> tuple[Any, Any, Any]:
    """The module defining the item's class, and its ``split_experience_batch`` and
    ``make_experience_batch``."""
    mod = sys.modules.get(type(item).__module__)
    split = getattr(mod, "split_experience_batch", None)
    make = getattr(mod, "make_experience_batch", None)
    if split is None or make is None:
        raise TypeError(
            f"balance_experiences needs OpenRLHF experiences: {type(item).__qualname__} "
            f"comes from {type(item).__module__!r}, which has no split_experience_batch / "
            "make_experience_batch"
        )
    return mod, split, make


def _batch_rows(whole: Any) -> np.ndarray | None:
    """A batch's per-sample ``total_length`` field as float64 rows (a copy, taken before
    split runs), or None when it is missing or not numeric."""
    if whole is None:
        return None
    try:
        arr = np.array(to_numpy(whole), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr if arr.ndim >= 1 else None


def _item_lengths(rows: np.ndarray | None, items: list[Any]) -> np.ndarray:
    """Each split item's ``total_length`` (summed, as one item's value is): from the
    batch's field ``rows`` in one conversion when it has one row per item and its first
    and last rows match the first and last items (split keeps the batch order), else item
    by item (a conversion each: 13 ms more for 8,192 items, measured)."""

    def one(it: Any) -> float:
        return float(to_numpy(it.total_length).sum())

    if rows is not None and rows.shape[0] == len(items) and items:
        sums: np.ndarray = rows.reshape(len(items), -1).sum(axis=1)
        if sums[0] == one(items[0]) and sums[-1] == one(items[-1]):
            return sums
    return np.asarray([one(it) for it in items], dtype=np.float64)


def _rank_count(args: Any) -> int:
    actor, ds = args.actor, args.ds
    k = actor.num_nodes * actor.num_gpus_per_node // ds.ring_attn_size // ds.tensor_parallel_size
    if k < 1:
        raise CompatAssertionError(
            "num_nodes * num_gpus_per_node // ring_attn_size // tensor_parallel_size must be "
            f">= 1, got {k}"
        )
    return int(k)


def balance_experiences(experiences: list[Any], args: Any) -> list[Any]:
    """Regroup experiences into one batch per data-parallel actor, balanced by tokens.

    ``args.actor.num_nodes * args.actor.num_gpus_per_node // args.ds.ring_attn_size //
    args.ds.tensor_parallel_size`` actors (as OpenRLHF); each returned batch holds
    ``n // k`` or ``n // k + 1`` samples (fewer batches when there are fewer samples than
    actors) and the heaviest batch's ``total_length`` sum is as small as seqbalance's
    count-balanced partition makes it (OpenRLHF interleaves long and short samples).
    Batches come heaviest first; samples keep their input order within a batch. The
    batches are those OpenRLHF's split and merge make of these samples (gathered row by
    row for its own ``Experience``; see the module docstring); each input's ``index`` is
    set to None, as OpenRLHF's split does.
    """
    if not experiences:
        return []
    module, split, make = _experience_helpers(experiences[0])
    gatherable = _row_layout(experiences, module) if GATHER_ROWS else None
    if gatherable is not None:
        for batch in experiences:
            batch.index = None  # as OpenRLHF's split does to every batch it splits
        lens = gatherable.lengths()
        groups = _balanced_groups(lens, min(_rank_count(args), lens.shape[0]))
        return gatherable.gather([np.asarray(g, dtype=np.int64) for g in groups])
    items: list[Any] = []
    per_batch = []
    for batch in experiences:
        field = _batch_rows(getattr(batch, "total_length", None))  # a copy, before split
        got = split(batch)
        items.extend(got)
        per_batch.append(_item_lengths(field, got))
    if not items:
        return []
    lens = np.concatenate(per_batch)
    groups = _balanced_groups(lens, min(_rank_count(args), len(items)))
    return [make([items[i] for i in g]) for g in groups]


def _balanced_groups(lens: np.ndarray, k: int) -> list[list[int]]:
    """The count-balanced partition of ``lens`` into ``k`` parts, or OpenRLHF's interleave
    where that is lighter (:func:`_interleave_labels`), heaviest part first (ties: the part
    holding the smallest index first); each part's indices ascending."""
    ours = partition(lens, k, size="balanced")
    parts = [list(p) for p in ours]
    loads = ours.loads.tolist()  # each part's total, as the partition summed it
    labels = _interleave_labels(lens, k)
    their_loads = np.bincount(labels, weights=lens, minlength=k)  # part j holds label j
    if their_loads.max() <= max(loads) * (1.0 + 1e-12):  # else clearly heavier: no lists
        theirs = parts_of_labels(labels, k)
        if framework_is_better(theirs, parts, lens):
            parts, loads = theirs, their_loads.tolist()
    order = sorted(range(k), key=lambda j: (-loads[j], min(parts[j])))
    return [parts[j] for j in order]


def _interleave_labels(lens: np.ndarray, k: int) -> np.ndarray:
    """The actor of each sample in OpenRLHF's ``balance_experiences``: samples sorted
    longest first (stable), cut into chunks of ``k``; the first half of the chunks deals
    in order, the second half reversed, so actor ``j`` gets position ``j`` of each chunk
    of the first half and ``len - 1 - j`` of each of the second (zip_longest over the
    interleaved chunks; which chunk comes when does not change an actor's samples)."""
    n = lens.shape[0]
    order = np.argsort(-lens, kind="stable")
    pos = np.arange(n)
    chunk, t = pos // k, pos % k
    size = np.minimum(k, n - chunk * k)  # the last chunk may be short
    actor = np.where(chunk < (-(-n // k)) // 2, t, size - 1 - t)
    labels = np.empty(n, dtype=np.int64)
    labels[order] = actor
    return labels


_SEQLEN = [n for n in __all__ if n not in ("balance_experiences", "patch", "unpatch")]
_patchers = [
    Patcher("openrlhf.utils.seqlen_balancing", lambda: {n: globals()[n] for n in _SEQLEN}),
    Patcher(
        "openrlhf.trainer.ppo_utils.experience",
        lambda: {"balance_experiences": balance_experiences},
    ),
]


def patch() -> list[str]:
    """Replace OpenRLHF's functions in ``openrlhf.utils.seqlen_balancing`` and
    ``openrlhf.trainer.ppo_utils.experience`` (those importable) and wherever they were
    imported by name. Returns what was replaced; ImportError if neither imports."""
    return patch_all(_patchers, "OpenRLHF")


def unpatch() -> None:
    """Undo :func:`patch`."""
    unpatch_all(_patchers)
