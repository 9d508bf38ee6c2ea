"""A measured micro-batch (:class:`Timing`) and the checks of its fields: what
:mod:`.feedback` (the recorder) and :mod:`.timing_files` (records on disk) share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .._validate import as_lengths
from ._cp_records import check_pieces
from .base import CostModel, TokenCost
from .context_parallel import ContextParallelCost

__all__ = ["SYNC_MODELS", "Timing"]

SYNC_MODELS = ("fsdp", "ddp")


@dataclass(frozen=True)
class Timing:
    """One measured micro-batch.

    ``pieces`` is None for whole sequences. For a GPU of a context-parallel plan it is an
    int64 array of rows ``(position in lengths, d, start, end)``, one per token range the
    GPU held of a sequence split ``d`` ways (see
    :meth:`seqbalance.costs.TimingRecorder.record`).
    """

    rank: int
    step: int
    slot: int
    lengths: np.ndarray
    seconds: float
    pieces: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        # The dataclass's own __eq__ compares arrays with ==, which raises on them.
        if not isinstance(other, Timing):
            return NotImplemented
        return (
            (self.rank, self.step, self.slot, self.seconds)
            == (other.rank, other.step, other.slot, other.seconds)
            and np.array_equal(self.lengths, other.lengths)
            and (self.pieces is None) == (other.pieces is None)
            and (self.pieces is None or np.array_equal(self.pieces, cast(np.ndarray, other.pieces)))
        )


def _nonneg_int(value: Any, name: str) -> int:
    # Below 2**62: numpy sorts and compares them as int64.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if value >= 2**62:
        raise ValueError(f"{name} = {value} is too large (limit 2**62)")
    return int(value)


def _resolve_cost(cost: Any) -> CostModel:
    if isinstance(cost, ContextParallelCost):
        return cost.cost
    if cost is None:
        return TokenCost()
    if isinstance(cost, CostModel):
        return cost
    from .load import load_cost

    out = load_cost(cost)
    if not isinstance(out, CostModel):  # pragma: no cover - load_cost returns models
        raise ValueError(f"cost must name or be a cost model, got {cost!r}")
    return out


def _checked_timing(
    rank: Any, step: Any, slot: Any, lengths: Any, seconds: Any, pieces: Any
) -> Timing:
    """A :class:`Timing` of checked fields (what :meth:`TimingRecorder.record` takes)."""
    rank = _nonneg_int(rank, "rank")
    step = _nonneg_int(step, "step")
    slot = _nonneg_int(slot, "slot")
    lens = as_lengths(lengths, "lengths")
    secs = _time(seconds, "seconds")
    return Timing(rank, step, slot, lens, secs,
                  None if pieces is None else check_pieces(pieces, lens))  # fmt: skip


def _time(value: Any, name: str) -> float:
    """A measured time as a positive finite float, else a ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_, str, bytes)):  # float() takes True and "1.0"
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        secs = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    except OverflowError:  # an int beyond float64
        raise ValueError(f"{name} = {value!r} is not a finite time") from None
    if not (math.isfinite(secs) and secs > 0):
        raise ValueError(f"{name} must be a positive finite time, got {value!r}")
    return secs
