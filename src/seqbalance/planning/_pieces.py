"""A CP plan's pieces as flat arrays: what :mod:`.cp_plans` (the plan) and
:mod:`.cp_pipeline` (its pipeline) both read them through."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from ..costs.context_parallel import ContextParallelCost

__all__ = ["_flatten", "_piece_entries"]


def _flatten(pieces: Sequence[Sequence[Sequence[Any]]]) -> tuple[np.ndarray, ...]:
    """Arrays (gpu, slot, seq, start, end) of every range of ``pieces``."""
    flat = [p for gpu in pieces for slot in gpu for p in slot]
    if not flat:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
    if (np.fromiter(map(len, flat), dtype=np.int64, count=len(flat)) == 3).all():
        # fromiter over the numbers: several times faster than np.array over the tuples
        # (a malformed piece gets numpy's own error below)
        arr = np.fromiter(itertools.chain.from_iterable(flat), dtype=np.int64,
                          count=3 * len(flat)).reshape(-1, 3)  # fmt: skip
    else:
        arr = np.array(flat, dtype=np.int64).reshape(-1, 3)
    per_slot = [len(slot) for gpu in pieces for slot in gpu]
    gpu_of = np.repeat(np.arange(len(pieces)), [len(gpu) for gpu in pieces])
    slot_of = np.concatenate([np.arange(len(gpu)) for gpu in pieces])
    gpu = np.repeat(gpu_of, per_slot)
    slot = np.repeat(slot_of, per_slot)
    return gpu, slot, arr[:, 0], arr[:, 1], arr[:, 2]


def _piece_entries(
    pieces: Sequence[Sequence[Sequence[Any]]], lengths: np.ndarray, cp_cost: ContextParallelCost,
    flat: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, ...]:
    """One entry per (gpu, slot, sequence) a GPU holds: arrays ``(gpu, slot, length, tokens,
    sq, d)``, ``sq`` the sum of ``e² − s²`` its cost prices and ``d`` the GPUs holding that
    sequence in that slot."""
    m = max((len(g) for g in pieces), default=0)
    gpu, slot, seq, s, e = _flatten(pieces) if flat is None else flat
    n = int(lengths.shape[0])
    key = (gpu * m + slot) * n + seq
    uk, inv = np.unique(key, return_inverse=True)
    tok = np.bincount(inv, weights=(e - s).astype(np.float64), minlength=uk.size)
    sq = np.bincount(
        inv, weights=cp_cost._sq(s.astype(np.float64), e.astype(np.float64)), minlength=uk.size
    )
    kseq = uk % n if n else uk
    kslot = (uk // n) % m if n else uk
    kgpu = uk // (n * m) if n else uk
    _, ginv, gcount = np.unique(kslot * n + kseq, return_inverse=True, return_counts=True)
    d = gcount[ginv].astype(np.float64)
    return kgpu, kslot, lengths[kseq].astype(np.float64), tok, sq, d
