"""The functions of :mod:`seqbalance.compat.areal`, the drop-in for AReaL's allocation
code (``areal.utils.seqpack`` and the micro-batch allocation of ``areal.utils.data``,
AReaL 1.0), implemented on seqbalance.

They live below both :mod:`seqbalance.compat.areal`, which re-exports them and adds
``patch()`` / ``unpatch()`` (which switch joint mode on and off), and
:mod:`seqbalance.compat.joint_areal`, whose workers fall back to
:func:`allocate_balanced_mbs_synced`: joint mode sits on top of the drop-in without the
two importing each other. Their public home (their ``__module__`` too) is
:mod:`seqbalance.compat.areal`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from typing import Any, cast

import numpy as np

from .._validate import MAX_EMPTY
from ..partitioning.contiguous import contiguous_partition
from ..planning._pipelines import areal_ffd_groups
from ._core import framework_is_better, partition, plan
from ._inputs import (
    CompatAssertionError,
    CompatRuntimeError,
    check_index_lists,
    count_arg,
    grow_to,
    is_tensor,
    to_numpy,
    token_counts,
)
from ._verl_kk import equal_partition, free_partition, parts_of_labels, verl_free_kk_labels

#: The public module: these functions' ``__module__`` and their logger's name.
_PUBLIC = "seqbalance.compat.areal"
logger = logging.getLogger(_PUBLIC)

#: The names :mod:`seqbalance.compat.areal` re-exports (its ``__all__`` less ``patch`` and
#: ``unpatch``).
__all__ = [
    "PACKING_ALGORITHMS",
    "PACKING_ALGORITHM_FFD",
    "PACKING_ALGORITHM_KK",
    "_compute_packing_metrics",
    "_kk_partition",
    "allocate_balanced_mbs",
    "allocate_balanced_mbs_synced",
    "balanced_greedy_partition",
    "ffd_allocate",
    "flat2d",
    "get_allocate_fn",
    "kk_allocate",
    "min_abs_diff_partition",
    "partition_balanced",
    "partition_balanced_tuples",
    "reorder_to_balanced_batches",
]

PACKING_ALGORITHM_FFD = "ffd"
PACKING_ALGORITHM_KK = "kk"
PACKING_ALGORITHMS = {PACKING_ALGORITHM_FFD, PACKING_ALGORITHM_KK}


def flat2d(arr: list[list[Any]]) -> list[Any]:
    """Concatenate a list of lists."""
    return list(itertools.chain(*arr))


def _values(values: Any) -> np.ndarray:
    return token_counts(values, "values", CompatRuntimeError)


def _values_as_areal_sees(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """The token counts as int64 (:func:`_values`) and as AReaL holds them
    (:func:`_as_areal_sees`), converting ``values`` once."""
    raw = values if is_tensor(values) else to_numpy(values)
    v = _values(raw)
    return v, _as_areal_sees(raw, v)


def _check(v: np.ndarray, capacity: int, min_groups: int, message: str) -> None:
    if (v > capacity).any():
        raise CompatRuntimeError(message)
    if v.shape[0] < min_groups:
        raise CompatRuntimeError(
            f"Number of values {v.shape[0]} is smaller than min_groups {min_groups}"
        )


def _allocate(v: np.ndarray, capacity: int, min_groups: int, divisor: int) -> list[list[int]]:
    """Fewest groups (>= min_groups, a multiple of divisor, at most n) under the capacity.

    Raises :class:`CompatRuntimeError`, as AReaL's first-fit decreasing does, where no
    multiple of the divisor can hold the capacity with every group non-empty (a count
    that is not one would not fit the pipeline schedule the divisor is for).
    """
    n = v.shape[0]
    count = min(max(min_groups, 1), n)
    try:
        p = plan(v, 1, capacity, min_micro_batches=count, micro_batch_multiple=max(divisor, 1),
                 baselines=False)  # fmt: skip
    except ValueError:
        raise CompatRuntimeError(
            f"Cannot allocate values {v.tolist()} that satisfies capacity {capacity}, "
            f"min_groups {min_groups} and n_groups_divisor {divisor}."
        ) from None
    return [list(mb) for mb in p.micro_batches[0]]


def ffd_allocate(
    values: Any, capacity: int, min_groups: int, n_groups_divisor: int = 1
) -> list[list[int]]:
    """Groups of indices with sums ``<= capacity``: as few as possible, at least
    ``min_groups`` (raised to ``n_groups_divisor``), a multiple of ``n_groups_divisor``
    where the items allow, and balanced.

    Raises
    ------
    RuntimeError (a :class:`CompatRuntimeError`, also a ValueError)
        A value above ``capacity``, or fewer values than ``min_groups``.
    """
    shown = capacity
    capacity, min_groups, n_groups_divisor = _counts(capacity, min_groups, n_groups_divisor)
    v, seen = _values_as_areal_sees(values)
    _check(v, capacity, min_groups, f"Values {v.tolist()} is larger than capacity {shown}")
    capacity = _within_total(capacity, v)
    return _allocate_no_worse(v, capacity, int(min_groups), int(n_groups_divisor), seen)


def _counts(capacity: Any, min_groups: Any, divisor: Any) -> tuple[int, int, int]:
    """The allocators' numbers as ints (CompatRuntimeError naming a bad one): the capacity
    by :func:`_capacity`; ``min_groups`` None or below the divisor (-1 included) is raised
    to the divisor, as AReaL does."""
    capacity = _capacity(capacity)
    divisor = count_arg(divisor, "n_groups_divisor", CompatRuntimeError, minimum=0)
    if min_groups is not None:
        min_groups = count_arg(min_groups, "min_groups", CompatRuntimeError, minimum=None)
    if min_groups is None or min_groups < divisor:
        min_groups = divisor
    return capacity, min_groups, divisor


def _capacity(value: Any) -> int:
    """AReaL's ``capacity`` as a whole number of tokens: any real number > 0, as AReaL
    compares sums with it. Token counts are integers, so a sum fits ``500.5`` exactly
    when it fits 500 (the floor); ``inf`` (AReaL's docs suggest a very large capacity to
    ignore it) becomes 2**62, which :func:`_within_total` brings down to the total.
    NaN, zero, negative numbers, bools and non-numbers raise CompatRuntimeError."""
    v = value.item() if is_tensor(value) and value.numel() == 1 else value
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise CompatRuntimeError(f"capacity must be a number > 0, got {value!r}")
    if isinstance(v, (int, np.integer)):
        whole = int(v)  # exact, however large
    elif math.isnan(v):
        whole = -1
    else:
        whole = 2**62 if float(v) >= 2.0**62 else math.floor(v)
    if whole < 0 or v == 0:
        raise CompatRuntimeError(f"capacity must be a number > 0, got {value!r}")
    return min(whole, 2**62)


def _within_total(capacity: int, v: np.ndarray) -> int:
    """``capacity`` at most the values' total (at least 1): no group can hold more, so
    the groups, their count and AReaL's ``ceil(total / capacity)`` are the same, and the
    planner gets a cap it accepts (below 2**62)."""
    return max(1, min(capacity, int(v.sum())))


def kk_allocate(
    values: Any,
    capacity: int,
    min_groups: int,
    n_groups_divisor: int = 1,
    equal_size: bool = False,
) -> list[list[int]]:
    """Like :func:`ffd_allocate` (same guarantees); ``equal_size=True`` gives every group
    ``n / k`` items with ``k = max(min_groups, ceil(total / capacity))`` rounded up to the
    divisor and clamped to ``n`` (RuntimeError if ``n % k != 0``). Where equal counts
    cannot meet the capacity it logs a warning and returns :func:`ffd_allocate`'s groups,
    of unequal sizes, as AReaL falls back to first-fit decreasing."""
    shown = capacity
    capacity, min_groups, n_groups_divisor = _counts(capacity, min_groups, n_groups_divisor)
    v, seen = _values_as_areal_sees(values)
    _check(
        v,
        capacity,
        min_groups,
        f"Some values exceed capacity {shown}. "
        "Cannot pack a single item that is larger than the bin.",
    )
    capacity = _within_total(capacity, v)
    n = v.shape[0]
    k = max(min_groups, -(-int(v.sum()) // capacity))
    if n_groups_divisor > 1:  # as AReaL: a divisor of 0 or 1 leaves the count alone
        k = -(-k // n_groups_divisor) * n_groups_divisor
    k = min(k, n)  # AReaL's count
    if k == 0:
        # min_groups and the divisor 0, and no tokens: AReaL fails (IndexError); one
        # group holds them all (no group for no values).
        if n == 0:
            return []
        k = 1
    if not equal_size:
        failed: CompatRuntimeError | None = None
        try:
            groups: list[list[int]] | None = _allocate(
                v, int(capacity), int(min_groups), int(n_groups_divisor)
            )
        except CompatRuntimeError as exc:
            groups, failed = None, exc  # AReaL's differencing may still fit its clamped count
        # AReaL's own answer: its differencing at its count where that holds the capacity
        # (reproduced; it stops at the first group over the capacity, where AReaL falls back
        # to first-fit decreasing). The planner balances its cost model, AReaL the raw
        # values, and on a few dozen values the two can differ by a few tokens the
        # planner's way (e.g. 13,820 against 13,816).
        w = v.astype(np.float64)
        labels = verl_free_kk_labels(w, k, size=w, size_cap=float(capacity))
        if labels is not None:
            theirs = parts_of_labels(labels, k)
            return theirs if groups is None else _no_worse_than(groups, v, theirs)
        if failed is not None:  # AReaL's fallback, first-fit decreasing, raises here too
            raise failed
        found = cast("list[list[int]]", groups)  # _allocate raised, or it is set
        return _no_worse_than_ffd(found, v, int(capacity), int(min_groups),
                                  int(n_groups_divisor), seen)  # fmt: skip
    if n % k:
        raise CompatRuntimeError(
            f"equal_size=True requires len(values) ({n}) to be divisible by k ({k})"
        )
    parts = equal_partition(v, k)  # never heavier than AReaL's own differencing
    if parts.max_load > capacity:
        # As AReaL: the capacity (memory) wins over equal sizes; it logs and falls back to
        # first-fit decreasing, the drop-in to its own capacity-bounded allocation.
        logger.warning(
            "equal_size=True: %d groups of %d items cannot stay under capacity %d "
            "(heaviest %d); allocating without equal sizes",
            k, n // k, capacity, int(parts.max_load),
        )  # fmt: skip
        return _allocate_no_worse(v, int(capacity), int(min_groups), int(n_groups_divisor),
                                  seen)  # fmt: skip
    return [list(p) for p in parts]


def _no_worse_than(
    groups: list[list[int]], v: np.ndarray, theirs: list[list[int]] | None
) -> list[list[int]]:
    """``theirs`` (AReaL's answer) where it has fewer groups than ``groups``, or as many
    and a lighter heaviest one; else ``groups``."""
    if theirs is not None and framework_is_better(theirs, groups, v):
        return theirs
    return groups


def _allocate_no_worse(
    v: np.ndarray, capacity: int, min_groups: int, divisor: int, seen: np.ndarray
) -> list[list[int]]:
    """:func:`_allocate`, never worse than AReaL's first-fit decreasing (of ``seen``, the
    values as AReaL holds them: :func:`_as_areal_sees`)."""
    groups = _allocate(v, capacity, min_groups, divisor)
    return _no_worse_than_ffd(groups, v, capacity, min_groups, divisor, seen)


def _no_worse_than_ffd(
    groups: list[list[int]], v: np.ndarray, capacity: int, min_groups: int, divisor: int,
    seen: np.ndarray,
) -> list[list[int]]:
    return _no_worse_than(groups, v, _areal_ffd(seen, capacity, min_groups, divisor))


def _as_areal_sees(raw: Any, v: np.ndarray) -> np.ndarray:
    """The int64 token counts ``v`` of ``raw`` (a tensor, or the numpy array of what the
    caller passed, as AReaL's ``np.array(values)`` makes it) in ``raw``'s dtype where that
    changes AReaL's answer: unsigned integers, whose negation in AReaL's
    ``np.argsort(-values)`` wraps (zeros first, then ascending), so its groups differ.
    Otherwise ``v`` (signed and float values sort as int64 ones do; ties among equal values
    change no group's load)."""
    if is_tensor(raw):
        name = str(raw.dtype).removeprefix("torch.")
        kind = np.dtype(name) if name.startswith("uint") else None
    else:
        kind = raw.dtype
    return v.astype(kind) if kind is not None and kind.kind == "u" else v


def _areal_ffd(
    v: np.ndarray, capacity: int, min_groups: int, divisor: int
) -> list[list[int]] | None:
    """AReaL 1.0's ``ffd_allocate``, reproduced: values in AReaL's descending order; each
    opens a group while there are fewer than ``min_groups`` or the lightest group cannot
    take it, else joins, among the groups that can, the one holding the fewest values
    (the lightest on ties); ``min_groups`` is raised to the next multiple of ``divisor``
    until the count is a multiple of it. Inputs already checked (no value above the
    capacity, at least ``min_groups`` values)."""
    while True:
        groups = areal_ffd_groups(v, capacity, min_groups)
        min_groups += divisor - min_groups % divisor if divisor > 0 else 0
        if divisor <= 0 or len(groups) % divisor == 0:
            return groups
        if v.shape[0] < min_groups:
            return None  # AReaL raises here; the caller keeps its own groups


def _kk_partition(values: Any, k: int, equal_size: bool = False) -> list[list[int]]:
    """``k`` index lists with balanced sums (uncapacitated); equal counts if asked."""
    v = to_numpy(values).astype(np.float64)
    k = count_arg(k, "k", maximum=v.shape[0] + MAX_EMPTY)  # empty parts: up to 2**20
    if equal_size and v.shape[0] % k:
        raise CompatAssertionError(f"{v.shape[0]} % {k} != 0")  # AReaL asserts
    # Either way never heavier than AReaL's own differencing (verl's rules, reproduced).
    return [list(p) for p in (equal_partition if equal_size else free_partition)(v, k)]


def get_allocate_fn(algorithm: str = PACKING_ALGORITHM_FFD) -> Any:
    """The allocator for ``"ffd"`` or ``"kk"``; ValueError otherwise."""
    if algorithm == PACKING_ALGORITHM_FFD:
        return ffd_allocate
    if algorithm == PACKING_ALGORITHM_KK:
        return kk_allocate
    raise ValueError(
        f"Unknown packing algorithm '{algorithm}'. "
        f"Supported algorithms: {sorted(PACKING_ALGORITHMS)}"
    )


def _compute_packing_metrics(values: Any, partitions: Any, capacity: int) -> dict[str, Any]:
    """Load statistics of ``partitions`` against ``capacity`` (zero parts allowed).

    Keys: n_groups, group_sums, max_load, min_load, mean_load, spread, imbalance_ratio,
    std_dev, cv, max_load_ratio, utilization, wasted_tokens.
    """
    check_index_lists(partitions, len(values), "partitions", ValueError)
    sums = [sum(values[i] for i in g) for g in partitions]
    k = len(sums)
    if k == 0:
        return {
            "n_groups": 0, "group_sums": [], "max_load": 0, "min_load": 0,
            "mean_load": 0.0, "spread": 0, "imbalance_ratio": 0.0, "std_dev": 0.0,
            "cv": 0.0, "max_load_ratio": 0.0, "utilization": 0.0, "wasted_tokens": 0,
        }  # fmt: skip
    hi, lo = max(sums), min(sums)
    mean = sum(sums) / k
    std = (sum((s - mean) ** 2 for s in sums) / k) ** 0.5

    def ratio(a: float) -> float:
        return a / mean if mean > 0 else 0.0

    return {
        "n_groups": k,
        "group_sums": sums,
        "max_load": hi,
        "min_load": lo,
        "mean_load": mean,
        "spread": hi - lo,
        "imbalance_ratio": ratio(hi - lo),
        "std_dev": std,
        "cv": ratio(std),
        "max_load_ratio": ratio(hi),
        "utilization": mean / capacity if capacity > 0 else 0.0,
        "wasted_tokens": sum(max(0, capacity - s) for s in sums),
    }


def balanced_greedy_partition(nums: Any, K: int) -> list[list[int]]:
    """``K`` groups of exactly ``len(nums) / K`` indices with balanced sums.

    Raises
    ------
    ValueError
        If ``len(nums) < K`` ("must be >= K") or ``len(nums) % K != 0`` ("must be
        divisible by K").
    """
    v = to_numpy(nums).astype(np.float64) if len(nums) else np.zeros(0)
    n = v.shape[0]
    K = count_arg(K, "K", ValueError)
    if n < K:
        raise ValueError(f"Number of items ({n}) must be >= K ({K}).")
    if n % K:
        raise ValueError("The length of nums must be divisible by K.")
    return [list(p) for p in partition(v, K, size="equal")]


# ---- contiguous splits and count-capped batches -----------------------------------------


def _contiguous_cuts(nums: Any, k: Any, min_size: Any) -> list[int]:
    v = to_numpy(nums)
    if v.ndim != 1:
        raise ValueError(f"The array to be partitioned must be 1D, got shape {v.shape}")
    k = count_arg(k, "k", ValueError)
    min_size = count_arg(min_size, "min_size", ValueError, minimum=0)
    runs = contiguous_partition(v, k, min_size=min_size)  # integers summed exactly
    cuts: list[int] = np.concatenate(([0], np.cumsum([len(r) for r in runs]))).tolist()
    return cuts


def partition_balanced(nums: Any, k: int, min_size: int = 1) -> list[int]:
    """Where to cut ``nums`` into ``k`` consecutive runs of at least ``min_size`` items:
    ``k + 1`` positions, 0 first and ``len(nums)`` last.

    AReaL's dynamic programme aims at the smallest spread between the runs' sums, keeping
    one (max, min) pair per state. This is :func:`seqbalance.contiguous_partition`: the
    heaviest run exactly as light as possible, then the lightest as heavy as possible,
    so the heaviest run is never heavier than AReaL's.

    Raises
    ------
    ValueError
        For fewer than ``k * min_size`` items (AReaL returns meaningless cuts), ``k < 1``,
        negative or non-finite values, or input that is not 1-D.
    """
    return _contiguous_cuts(nums, k, min_size)


def partition_balanced_tuples(nums: Any, k: int, min_size: int = 1) -> list[tuple[int, int]]:
    """The runs of :func:`partition_balanced` as ``(start, end)`` pairs."""
    cuts = _contiguous_cuts(nums, k, min_size)
    return [(cuts[j], cuts[j + 1]) for j in range(len(cuts) - 1)]


_HINT = (
    " This usually means a bug in the dataset code, or a batch too small for the number "
    "of pipeline micro-batches."
)


def min_abs_diff_partition(arr: Any, k: int, min_size: int = 1) -> list[tuple[int, int]]:
    """:func:`partition_balanced_tuples`, after AReaL's checks of the input.

    Raises
    ------
    ValueError
        If ``arr`` is not 1-D, has fewer than ``k`` items, or fewer than ``k * min_size``
        (AReaL's three cases; the messages begin as AReaL's do but are worded here), or
        for the reasons of :func:`partition_balanced`.
    """
    v = to_numpy(arr)
    k_ = count_arg(k, "k", ValueError)
    size = count_arg(min_size, "min_size", ValueError, minimum=0)
    if v.ndim != 1:
        raise ValueError(f"The array to be partitioned must be 1D, got shape {v.shape}." + _HINT)
    if v.shape[0] < k_:
        raise ValueError(
            f"The array to be partitioned must have length >= k (length {v.shape[0]}, "
            f"k={k_})." + _HINT
        )
    if v.shape[0] < k_ * size:
        raise ValueError(
            f"Length of the array to be partitioned must be at least k * min_size "
            f"({k_} * {size}), current length {v.shape[0]}."
        )
    return partition_balanced_tuples(v, k_, size)


def reorder_to_balanced_batches(seqlens: Any, n_seqs_per_batch: int) -> tuple[np.ndarray, int]:
    """Order ``seqlens`` as ``ceil(n / n_seqs_per_batch)`` batches of at most
    ``n_seqs_per_batch`` sequences with balanced token sums, heaviest batch first.

    Returns
    -------
    (numpy.ndarray, int)
        The sequence indices, batch after batch (int64), and the largest difference
        between two batches' token sums.

    seqbalance's balanced-count partition and AReaL's greedy (longest first into the
    lightest batch with room, reproduced with exact sums: AReaL sums in int32) are both
    computed; AReaL's is kept only where its heaviest batch is lighter, so the heaviest
    batch is never heavier than AReaL's.

    Raises
    ------
    ValueError
        For ``n_seqs_per_batch < 1`` (AReaL divides by zero), or lengths that are
        negative, fractional or not 1-D.
    """
    v = token_counts(seqlens, "seqlens")
    if v.ndim != 1:
        raise ValueError(f"seqlens must be 1-D, got shape {v.shape}")
    c = count_arg(n_seqs_per_batch, "n_seqs_per_batch", ValueError)
    n = v.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    bins = -(-n // c)
    ours = [list(p) for p in partition(v.astype(np.float64), bins,
                                       size="equal" if n % bins == 0 else "balanced")]  # fmt: skip
    theirs = _areal_batches(v, c, bins)
    if framework_is_better(theirs, ours, v):
        ours = theirs
    vl = v.tolist()
    sums = [sum(vl[i] for i in p) for p in ours]
    order = sorted(range(bins), key=lambda j: (-sums[j], j))
    idx = np.asarray([i for j in order for i in ours[j]], dtype=np.int64)
    return idx, max(sums) - min(sums)


def _areal_batches(v: np.ndarray, cap: int, bins: int) -> list[list[int]]:
    """AReaL's greedy: longest first, each into the lightest batch with room (the first
    on ties). Equal lengths are interchangeable, so any descending order gives its sums."""
    heap = [(0, j) for j in range(bins)]
    parts: list[list[int]] = [[] for _ in range(bins)]
    vl = v.tolist()
    for i in np.argsort(-v, kind="stable").tolist():
        total, j = heapq.heappop(heap)
        parts[j].append(i)
        if len(parts[j]) < cap:
            heapq.heappush(heap, (total + vl[i], j))
    return parts


# ---- micro-batch allocation (areal.utils.data) ------------------------------------------


def allocate_balanced_mbs(mb_spec: Any, lens: Any) -> list[list[int]]:
    """Micro-batches for ``lens`` under ``mb_spec`` (max_tokens_per_mb, n_mbs,
    n_mbs_divisor, packing_algorithm); sorted lists of sorted indices."""
    if mb_spec.max_tokens_per_mb is None:
        raise CompatAssertionError("mb_spec.max_tokens_per_mb must be set")  # AReaL asserts
    fn = get_allocate_fn(getattr(mb_spec, "packing_algorithm", "ffd"))
    groups = fn(
        lens,
        mb_spec.max_tokens_per_mb,
        min_groups=mb_spec.n_mbs,
        n_groups_divisor=mb_spec.n_mbs_divisor,
    )
    return sorted(sorted(g) for g in groups)


def _with_n_mbs(mb_spec: Any, n_mbs: int) -> Any:
    new = getattr(type(mb_spec), "new", None)
    if callable(new):
        return new(mb_spec, n_mbs=n_mbs)
    import copy

    out = copy.copy(mb_spec)
    out.n_mbs = n_mbs
    return out


#: The fields of a MicroBatchSpec that must be equal on every rank of the group.
_SPEC_FIELDS = ("n_mbs", "granularity", "max_tokens_per_mb", "n_mbs_divisor", "packing_algorithm")


def allocate_balanced_mbs_synced(mb_spec: Any, lens: Any, group: Any = None) -> list[list[int]]:
    """:func:`allocate_balanced_mbs` with the same number of micro-batches on every rank
    of ``group``.

    One all-gather (:func:`seqbalance.torch.agreement.agree_on`) carries each rank's local
    error, its ``mb_spec`` fields (``n_mbs``, ``granularity``, ``max_tokens_per_mb``,
    ``n_mbs_divisor``, ``packing_algorithm``) and its count; the group's count is the
    largest, and ranks below it allocate again with that count as ``n_mbs`` (AReaL gathers
    counts and may recurse). If a rank's own allocation fails (a sequence above the
    capacity, fewer sequences than ``n_mbs``...) or the ranks' specs differ, every rank
    raises the same :class:`~seqbalance.torch.agreement.RankAgreementError` (a ValueError)
    naming the rank or the field, instead of leaving the others waiting. Without an
    initialised process group, this is :func:`allocate_balanced_mbs`.
    """
    try:
        import torch.distributed as dist
    except ImportError:
        return allocate_balanced_mbs(mb_spec, lens)
    if not (dist.is_available() and dist.is_initialized()):
        return allocate_balanced_mbs(mb_spec, lens)
    from ..torch.agreement import agree_on

    box: list[Any] = []

    def check() -> tuple[dict[str, Any], tuple[int, int]]:
        v = _values(lens)
        box.append((v, allocate_balanced_mbs(mb_spec, v)))
        return {f: getattr(mb_spec, f, None) for f in _SPEC_FIELDS}, (len(box[0][1]), len(v))

    payloads = agree_on(check, group, "allocate_balanced_mbs_synced")
    local: list[list[int]]
    v, local = box[0]
    m, fewest = max(c for c, _ in payloads), min(n for _, n in payloads)
    if m > fewest:  # decided from the gathered counts: raised alike on every rank
        raise CompatRuntimeError(
            f"the group needs {m} micro-batches but a rank holds only {fewest} sequences"
        )
    if m == len(local):
        return local
    # From here on nothing may raise on this rank alone: the others go on with m.
    try:
        again = allocate_balanced_mbs(_with_n_mbs(mb_spec, m), v)
    except Exception:  # any type: fall back to splitting the allocation that fitted
        again = []
    if len(again) != m:
        again = sorted(sorted(g) for g in grow_to(local, m, v.astype(np.float64)))
    return again


# Their public module is seqbalance.compat.areal: help(), pickle and whoever reads a patched
# function's __module__ (to see whether the drop-in replaced it) name that module.
for _name in __all__:
    if callable(globals()[_name]):
        globals()[_name].__module__ = _PUBLIC
del _name
