"""Timing records of context-parallel (CP) micro-batches: their pieces, fit rows and prices.

A GPU of a CP plan runs *pieces* of sequences: in one slot it holds token ranges
``[s, e)`` of sequences split ``d`` ways (:mod:`seqbalance.costs.context_parallel`). Its
measured time is then not ``c0 + Σ(a + b·L + c·L²)`` over whole sequences but, with the
same coefficients,

    t = c0 + Σ_seq (a / d + b · Σ(e − s) + c · Σ(e² − s²)) + exposed communication

(the compute terms of a sequence's ``d`` pieces add up to its whole cost). So a CP record
gives the fit the row ``[1, Σ 1/d, Σ tokens, Σ (e² − s²)]``, which is the usual row
``[1, n, ΣL, ΣL²]`` for whole sequences (``d = 1``, one range ``[0, L)``): CP and
non-CP records fit the same four coefficients together. The exposed communication is
the :class:`ContextParallelCost`'s model of it (bandwidth, overlap, K/V bytes), taken as
known by the fit.

A record's pieces are an int64 array of shape ``(q, 4)``, one row per range:
``(position in the record's lengths, d, start, end)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .context_parallel import ContextParallelCost

__all__ = ["check_pieces", "comm_seconds", "fit_rows", "plan_pieces", "predict"]


def check_pieces(pieces: Any, lengths: np.ndarray, name: str = "pieces") -> np.ndarray:
    """``pieces`` as an int64 ``(q, 4)`` array checked against the record's ``lengths``.

    Every sequence of ``lengths`` needs at least one range (an empty one for a GPU of its
    group that got no token), one degree ``d >= 1`` on all its ranges, and ranges
    ``0 <= start <= end <= L``. Anything else would price tokens the record does not hold.
    """
    try:
        arr = np.asarray(pieces)
    except Exception:  # ragged nested lists and the like
        arr = np.asarray([None])
    if arr.size == 0 and arr.ndim >= 1 and arr.dtype != object:
        arr = np.zeros((0, 4), dtype=np.int64)  # an empty micro-batch
    is_int = arr.dtype.kind in "iu" and arr.dtype != np.bool_
    if not is_int or arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(
            f"{name} must be rows (position in lengths, d, start, end) of integers, one "
            f"per token range the GPU held; got {_show(pieces)}"
        )
    arr = arr.astype(np.int64)
    pos, d, s, e = arr.T
    n = lengths.size
    if ((pos < 0) | (pos >= n)).any():
        bad = int(pos[(pos < 0) | (pos >= n)][0])
        raise ValueError(
            f"{name} names position {bad}, but the record holds {n} sequences (0..{n - 1})"
        )
    missing = np.setdiff1d(np.arange(n), pos)
    if missing.size:
        raise ValueError(
            f"{name} has no range of sequence {int(missing[0])} of the record (a GPU of a "
            "CP group that got none of its tokens holds an empty range (start == end))"
        )
    if (d < 1).any():
        raise ValueError(f"{name} holds degree {int(d[d < 1][0])}; a CP degree is >= 1")
    first = np.zeros(n, dtype=np.int64)
    uniq, at = np.unique(pos, return_index=True)
    first[uniq] = d[at]  # the degree of each sequence's first range
    if (first[pos] != d).any():
        i = int(pos[first[pos] != d][0])
        raise ValueError(f"{name} gives sequence {i} of the record two different degrees")
    length = lengths.astype(np.int64)[pos]
    bad = (s < 0) | (s > e) | (e > length)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} row {k} ({int(s[k])}, {int(e[k])}) is not a token range of its sequence "
            f"of {int(length[k])} tokens (0 <= start <= end <= length)"
        )
    return arr


def _show(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _per_sequence(
    lengths: Sequence[np.ndarray], pieces: Sequence[np.ndarray | None], sq: Any
) -> tuple[np.ndarray, ...]:
    """One entry per (record, sequence) of every record: record index, length, degree,
    tokens and ``Σ sq(s, e)``. Records without pieces hold whole sequences."""
    rec, length, degree, tok, sqs = [], [], [], [], []
    for r, (lens, pcs) in enumerate(zip(lengths, pieces)):
        x = lens.astype(np.float64)
        if pcs is None:
            rec.append(np.full(x.size, r))
            length.append(x)
            degree.append(np.ones(x.size))
            tok.append(x)
            sqs.append(sq(np.zeros_like(x), x))
            continue
        pos = pcs[:, 0]
        s, e = pcs[:, 2].astype(np.float64), pcs[:, 3].astype(np.float64)
        dg = np.zeros(x.size)
        dg[pos] = pcs[:, 1]
        rec.append(np.full(x.size, r))
        length.append(x)
        degree.append(dg)
        tok.append(np.bincount(pos, weights=e - s, minlength=x.size))
        sqs.append(np.bincount(pos, weights=sq(s, e), minlength=x.size))
    if not rec:
        return tuple(np.zeros(0) for _ in range(5))
    return tuple(np.concatenate(v) for v in (rec, length, degree, tok, sqs))


def _plain_sq(s: Any, e: Any) -> Any:
    return e * e - s * s


def fit_rows(
    lengths: Sequence[np.ndarray], pieces: Sequence[np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Fit rows ``[1, Σ 1/d, Σ tokens, Σ (e² − s²)]`` of records, and per (record,
    sequence) entries ``(record, length, d, Σ(e² − s²))`` stacked as a ``(k, 4)`` array for
    :func:`comm_seconds`."""
    rec, length, degree, tok, sq = _per_sequence(lengths, pieces, _plain_sq)
    n = len(lengths)
    rows = np.empty((n, 4))
    rows[:, 0] = 1.0
    rec_i = rec.astype(np.int64)
    rows[:, 1] = np.bincount(rec_i, weights=1.0 / degree, minlength=n)
    rows[:, 2] = np.bincount(rec_i, weights=tok, minlength=n)
    rows[:, 3] = np.bincount(rec_i, weights=sq, minlength=n)
    return rows, np.stack([rec, length, degree, sq], axis=1)


def comm_seconds(
    cp_cost: ContextParallelCost | None, entries: np.ndarray, n: int, per_token_sq: float
) -> np.ndarray:
    """Exposed communication of each record in seconds under ``cp_cost``'s link model,
    with attention priced at ``per_token_sq`` seconds (a fitted cost's ``c``); zeros
    without a ``cp_cost`` or a bandwidth, or for whole sequences."""
    if cp_cost is None or cp_cost.bandwidth is None or entries.size == 0:
        return np.zeros(n)
    rec, length, degree, sq = entries.T
    comm = cp_cost._comm(length, per_token_sq * sq, degree, 1.0)
    return np.bincount(rec.astype(np.int64), weights=comm, minlength=n)


def predict(
    cp_cost: ContextParallelCost,
    lengths: Sequence[np.ndarray],
    pieces: Sequence[np.ndarray | None],
) -> np.ndarray:
    """Each record's cost under ``cp_cost``: ``per_microbatch`` plus its pieces (whole
    sequences at ``d = 1`` priced by the sequence cost itself)."""
    rec, length, degree, tok, sq = _per_sequence(lengths, pieces, cp_cost._sq)
    out = np.full(len(lengths), cp_cost.per_microbatch)
    if rec.size:
        with np.errstate(over="ignore", invalid="ignore"):
            costs = np.asarray(cp_cost._cost(length, tok, sq, degree), dtype=np.float64)
        out += np.bincount(rec.astype(np.int64), weights=costs, minlength=len(lengths))
    return out


def plan_pieces(pieces: Any, micro_batches: Any) -> list[list[np.ndarray]]:
    """The pieces array of every (GPU, slot) of a CP plan, positions in the order of
    ``micro_batches[gpu][slot]``; ``d`` is the number of GPUs holding the sequence in
    that slot (:func:`seqbalance.planning.cp_plans.piece_costs`' rule).

    Raises
    ------
    ValueError
        When a GPU's pieces in a slot touch other sequences than its micro-batch lists.
    """
    holders: dict[tuple[int, int], set[int]] = {}
    for g, gpu in enumerate(pieces):
        for j, slot in enumerate(gpu):
            for seq, _, _ in slot:
                holders.setdefault((j, int(seq)), set()).add(g)
    if len(pieces) != len(micro_batches):
        raise ValueError(
            f"pieces has {len(pieces)} GPUs but micro_batches has {len(micro_batches)}; "
            "pass the same plan's pieces and micro_batches"
        )
    out: list[list[np.ndarray]] = []
    for g, (gpu, mbs) in enumerate(zip(pieces, micro_batches)):
        if len(gpu) != len(mbs):
            raise ValueError(
                f"GPU {g} has {len(gpu)} slots of pieces but {len(mbs)} micro-batches"
            )
        rows_g = []
        for j, (slot, mb) in enumerate(zip(gpu, mbs)):
            where = {int(i): k for k, i in enumerate(mb)}
            if set(where) != {int(p[0]) for p in slot}:
                raise ValueError(
                    f"GPU {g} slot {j}: its pieces touch sequences "
                    f"{sorted({int(p[0]) for p in slot})} but its micro-batch lists "
                    f"{sorted(where)}"
                )
            rows = [
                (where[int(seq)], len(holders[(j, int(seq))]), int(s), int(e))
                for seq, s, e in slot
            ]
            rows_g.append(np.asarray(rows, dtype=np.int64).reshape(-1, 4))
        out.append(rows_g)
    return out
