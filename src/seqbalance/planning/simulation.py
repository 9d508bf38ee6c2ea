"""Step-time simulation of a plan under the way data-parallel ranks synchronise.

Two sync models (docs/concepts/sync-and-bounds.md):

``ddp``
    DDP, ZeRO-1/2, Megatron's distributed optimizer: ranks meet once per optimizer step (the
    gradient all-reduce), so each rank runs its micro-batches back to back and
    ``step_time = max_r sum_j cost(r, j)``.
``fsdp``
    FSDP, ZeRO-3: parameters are all-gathered in every layer of every micro-batch, so
    micro-batch slot ``j`` runs in lockstep on all ranks and
    ``step_time = sum_j max_r cost(r, j)``.

A micro-batch costs ``per_microbatch + sum of its sequences' costs`` (packed), or
``per_microbatch + count * max cost`` when padded (every row is as long as the longest).
An empty micro-batch still costs ``per_microbatch``: the rank must run a dummy forward and
backward to take part in the collectives.

The lower bound used for gaps is :func:`step_time_lower_bound`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._validate import (
    as_lengths,
    as_weights,
    check_bool,
    check_choice,
    check_max_tokens,
    check_nonnegative_int,
    check_nonnegative_real,
    check_positive_int,
)
from ..partitioning.bounds import lower_bound
from ..partitioning.stats import relative_gap
from ._grouping import bin_totals

__all__ = [
    "SYNC_MODELS",
    "Simulation",
    "microbatch_costs",
    "simulate",
    "step_time_lower_bound",
    "step_time_of",
]

SYNC_MODELS = ("fsdp", "ddp")


@dataclass(frozen=True)
class Simulation:
    """The simulated step of one plan.

    Attributes
    ----------
    sync : str
        ``"fsdp"`` or ``"ddp"``.
    step_time : float
        Time of the whole step, in cost units.
    mb_costs : np.ndarray
        Cost of each micro-batch, shape ``(dp, m)``.
    start, end : np.ndarray
        When each micro-batch starts and ends, shape ``(dp, m)``.
    rank_busy, rank_idle : np.ndarray
        Per-rank compute time and waiting time; ``busy + idle == step_time``.
    lower_bound : float
        A step time no plan of these sequences on ``dp`` ranks can beat.
    gap : float
        ``step_time / lower_bound - 1``.
    idle_fraction : float
        Share of all rank-time spent waiting: ``sum(rank_idle) / (dp * step_time)``.
    """

    sync: str
    step_time: float
    mb_costs: np.ndarray
    start: np.ndarray
    end: np.ndarray
    rank_busy: np.ndarray
    rank_idle: np.ndarray
    lower_bound: float
    gap: float
    idle_fraction: float

    def __repr__(self) -> str:
        # The arrays hold dp x m entries (thousands for a real job): show their shape only.
        shape = np.shape(self.mb_costs)
        dp, m = shape if len(shape) == 2 else ("?", "?")
        return (
            f"Simulation(sync={self.sync!r}, step_time={self.step_time:.6g}, "
            f"lower_bound={self.lower_bound:.6g}, gap={self.gap:+.2%}, "
            f"idle_fraction={self.idle_fraction:.2%}, dp={dp}, micro_batches={m})"
        )


def microbatch_costs(
    micro_batches: Sequence[Sequence[Sequence[int]]],
    costs: np.ndarray,
    *,
    per_microbatch: float = 0.0,
    padded: bool = False,
) -> np.ndarray:
    """Cost of every micro-batch of a plan as a ``(dp, m)`` float64 array.

    Ranks with fewer micro-batches than the longest rank are padded with NaN (such a plan
    would hang a real job; :func:`simulate` refuses it).
    """
    dp = len(micro_batches)
    m = max((len(r) for r in micro_batches), default=0)
    out = np.full((dp, m), np.nan)
    flat = [mb for rank in micro_batches for mb in rank]
    totals = bin_totals(flat, costs, padded=padded) + per_microbatch
    rows = np.repeat(np.arange(dp), [len(rank) for rank in micro_batches])
    cols = np.concatenate([np.arange(len(rank)) for rank in micro_batches] or [np.zeros(0, int)])
    out[rows, cols] = totals
    return out


def step_time_of(mb_costs: np.ndarray, sync: str) -> float:
    """Step time of a ``(dp, m)`` micro-batch cost matrix under ``sync`` (validated inputs).

    ``ddp``: the busiest rank's total; ``fsdp``: the sum over slots of the slot's heaviest
    micro-batch. The planner compares candidates with this instead of a full
    :func:`simulate`, which also computes a lower bound.
    """
    if mb_costs.size == 0:
        return 0.0
    if sync == "ddp":
        # cumsum, as simulate() does, so both give the same float
        return float(np.cumsum(mb_costs, axis=1)[:, -1].max())
    return float(mb_costs.max(axis=0).sum())


def step_time_lower_bound(
    costs: np.ndarray,
    dp_size: int,
    *,
    min_micro_batches: int = 1,
    per_microbatch: float = 0.0,
    size: str = "free",
    groups: Any = None,
    lengths: Any = None,
    max_tokens: int | None = None,
    sync: str | None = None,
) -> float:
    """A step time that no plan can beat, for either sync model.

    Given ``lengths`` and ``max_tokens``, the bound also knows the capacity: see
    :func:`seqbalance.planning.bounds.capacity_step_bound` (fewest micro-batches by a
    bin-packing bound, and under ``sync="fsdp"`` the sequences longer than half the
    capacity, which cannot share a micro-batch). This is the bound every reported gap uses.
    A length above ``max_tokens`` (a sequence that runs alone, ``plan(oversized="alone")``)
    counts as ``max_tokens`` there: it fills its micro-batch by itself.

    ``lower_bound(costs, dp_size, size=size, groups=groups) + min_micro_batches *
    per_microbatch``, where :func:`seqbalance.partitioning.lower_bound` bounds the busiest
    rank's total (at least ``max(sum / dp, largest sequence or group)``, more under a size
    rule).

    Why it is valid: under ``ddp`` the step lasts as long as the busiest rank, whose share
    of the sequences is bounded as above, and every rank runs at least
    ``min_micro_batches`` micro-batches, paying ``per_microbatch`` for each. Under ``fsdp``
    the step time ``sum_j max_r`` is never below ``max_r sum_j`` (a sum of maxima bounds the
    maximum of sums), so the same bound holds. Padding only adds cost.
    ``min_micro_batches`` must itself be a lower bound on the count (e.g.
    ``ceil(total_tokens / (dp * max_tokens))``).
    """
    costs = as_weights(costs, "costs")
    dp_size = check_positive_int(dp_size, "dp_size")
    min_micro_batches = check_nonnegative_int(min_micro_batches, "min_micro_batches")
    per_microbatch = check_nonnegative_real(per_microbatch, "per_microbatch")
    if sync is not None:
        check_choice(sync, "sync", SYNC_MODELS)
    if (lengths is None) != (max_tokens is None):
        raise ValueError(
            "pass lengths and max_tokens together (the capacity bound needs both), or neither"
        )
    if lengths is not None and max_tokens is not None:
        from .bounds import capacity_step_bound  # imports only partitioning

        lens = as_lengths(lengths, "lengths")
        if lens.shape != costs.shape:
            raise ValueError(
                f"lengths has {lens.shape[0]} entries but costs has {costs.shape[0]}; give "
                "one length per cost"
            )
        max_tokens = check_max_tokens(max_tokens)
        return capacity_step_bound(
            costs,
            lens,
            dp_size,
            int(max_tokens),
            sync=sync,
            per_microbatch=per_microbatch,
            size=size,
            groups=groups,
            min_micro_batches_given=min_micro_batches,
        )
    if costs.size == 0:
        return float(min_micro_batches * per_microbatch)
    bound = lower_bound(costs, dp_size, size=size, groups=groups)
    return bound + min_micro_batches * per_microbatch


def check_layout(micro_batches: Any, n: int) -> None:
    """Every rank a list of micro-batches of integer indices, each of ``0..n-1`` once."""
    try:
        flat = [i for rank in micro_batches for mb in rank for i in mb]
    except TypeError:
        raise ValueError(
            "micro_batches must be nested lists [rank][micro-batch] of sequence indices"
        ) from None
    arr = np.asarray(flat) if flat else np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(
            "micro_batches must hold integer sequence indices, got "
            f"{arr.dtype if arr.ndim == 1 else 'nested values'}"
        )
    check_cover(arr, n)


def check_cover(arr: np.ndarray, n: int) -> None:
    """The flat integer indices ``arr`` of micro-batches hold each of ``0..n-1`` once
    (:func:`check_layout` after flattening; an array needs no flattening)."""
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
        bad = int(arr[(arr < 0) | (arr >= n)][0])
        raise ValueError(f"micro_batches hold index {bad}, outside 0..{n - 1} ({n} costs)")
    seen = np.bincount(arr, minlength=n)
    if (seen != 1).any():
        # A sequence run twice, or not at all, has no meaningful step time or gap.
        missing, repeated = np.flatnonzero(seen == 0), np.flatnonzero(seen > 1)
        raise ValueError(
            f"micro_batches must hold each of the {n} sequences exactly once: "
            f"{missing.size} missing (e.g. {missing[:3].tolist()}), {repeated.size} repeated "
            f"(e.g. {repeated[:3].tolist()})"
        )


def check_equal_counts(mb: np.ndarray, holders: Sequence[Sequence[Any]], who: str) -> None:
    """Refuse a cost matrix whose NaN padding shows unequal micro-batch counts.

    ``who`` names the holders in the message ("ranks", "GPUs").
    """
    if np.isnan(mb).any():
        counts = sorted({len(h) for h in holders})
        raise ValueError(
            f"{who} hold different numbers of micro-batches ({counts}); collectives would hang. "
            f"Every one of the {who} needs the same count"
        )


def lockstep_timeline(mb: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Start and end of every micro-batch when slot ``j`` runs in lockstep on all rows.

    Under FSDP/ZeRO-3 every row waits for the slowest row of slot ``j`` before slot
    ``j + 1`` starts, so the step is the sum over slots of the slot's maximum.
    """
    rows, m = mb.shape
    slot = mb.max(axis=0) if rows else np.zeros(m)
    slot_start = np.concatenate([[0.0], np.cumsum(slot)[:-1]]) if m else np.zeros(0)
    start = np.broadcast_to(slot_start, mb.shape).copy()
    return start, start + mb, float(slot.sum())


def simulate(
    micro_batches: Sequence[Sequence[Sequence[int]]],
    costs: np.ndarray,
    *,
    sync: str = "fsdp",
    per_microbatch: float = 0.0,
    padded: bool = False,
    lower_bound: float | None = None,
) -> Simulation:
    """Simulate one step of a plan.

    Parameters
    ----------
    micro_batches : list of list of list of int
        ``micro_batches[r][j]``: the sequence indices of rank ``r``'s micro-batch ``j``.
        Every rank must hold the same number of micro-batches.
    costs : np.ndarray
        Per-sequence cost (float64), indexed by sequence.
    sync : {"fsdp", "ddp"}
        How ranks synchronise (module docstring).
    per_microbatch : float
        Fixed cost of every micro-batch.
    padded : bool
        Cost a micro-batch as ``count * max`` instead of the sum.
    lower_bound : float, optional
        The bound to report the gap against; defaults to :func:`step_time_lower_bound`
        with one micro-batch per rank.

    Returns
    -------
    Simulation
    """
    check_choice(sync, "sync", SYNC_MODELS)
    costs = as_weights(costs, "costs")
    per_microbatch = check_nonnegative_real(per_microbatch, "per_microbatch")
    padded = check_bool(padded, "padded")
    if lower_bound is not None:
        lower_bound = check_nonnegative_real(lower_bound, "lower_bound")
    check_layout(micro_batches, costs.shape[0])
    mb = microbatch_costs(micro_batches, costs, per_microbatch=per_microbatch, padded=padded)
    check_equal_counts(mb, micro_batches, "ranks")
    dp, m = mb.shape
    if sync == "ddp":
        end = np.cumsum(mb, axis=1)
        start = end - mb
        busy = end[:, -1] if m else np.zeros(dp)
        step = float(busy.max()) if dp else 0.0
    else:
        start, end, step = lockstep_timeline(mb)
        busy = mb.sum(axis=1)
    idle = step - busy
    if lower_bound is None:
        lower_bound = step_time_lower_bound(costs, max(dp, 1), per_microbatch=per_microbatch)
    gap = relative_gap(step, lower_bound)
    idle_fraction = float(idle.sum() / (dp * step)) if dp and step > 0 else 0.0
    return Simulation(
        sync=sync,
        step_time=step,
        mb_costs=mb,
        start=start,
        end=end,
        rank_busy=busy,
        rank_idle=idle,
        lower_bound=float(lower_bound),
        gap=float(gap),
        idle_fraction=idle_fraction,
    )
