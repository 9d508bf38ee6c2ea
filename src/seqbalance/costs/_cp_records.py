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

from .._validate import MAX_PARALLEL_DEGREE
from .context_parallel import ContextParallelCost

__all__ = [
    "check_pieces",
    "comm_seconds",
    "exposed_at",
    "fit_rows",
    "link_split",
    "plan_pieces",
    "predict",
]


def check_pieces(pieces: Any, lengths: np.ndarray, name: str = "pieces") -> np.ndarray:
    """``pieces`` as an int64 ``(q, 4)`` array checked against the record's ``lengths``.

    Every sequence of ``lengths`` needs at least one range (an empty one for a GPU of its
    group that got no token), one degree ``d >= 1`` on all its ranges, and ranges
    ``0 <= start <= end <= L``. Anything else would price tokens the record does not hold.
    """
    if isinstance(pieces, (list, tuple)) and any(
        isinstance(v, (bool, np.bool_))
        for row in pieces if isinstance(row, (list, tuple)) for v in row
    ):  # fmt: skip
        # numpy reads True / False among integers as 1 / 0.
        raise ValueError(f"{name} hold True/False where integers belong; got {_show(pieces)}")
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
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {arr.max()}, beyond any position, degree or token")
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
    bad_d = (d < 1) | (d > MAX_PARALLEL_DEGREE)
    if bad_d.any():
        raise ValueError(
            f"{name} holds degree {int(d[bad_d][0])}; a CP degree is in 1..{MAX_PARALLEL_DEGREE}"
        )
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
    # Overlapping ranges of one sequence would count its tokens twice (and a d = 1
    # sequence whose ranges add up to L would be priced as whole by one and not the other).
    live = np.flatnonzero(e > s)
    order = live[np.lexsort((s[live], pos[live]))]
    same = pos[order[1:]] == pos[order[:-1]]
    clash = same & (s[order[1:]] < e[order[:-1]])
    if clash.any():
        k = int(np.flatnonzero(clash)[0])
        a, b = int(order[k]), int(order[k + 1])
        raise ValueError(
            f"{name} rows {a} ({int(s[a])}, {int(e[a])}) and {b} ({int(s[b])}, {int(e[b])}) "
            f"overlap: sequence {int(pos[a])}'s tokens would count twice; give each token "
            "range once"
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


def _link_parts(cp_cost: ContextParallelCost, entries: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per (record, sequence) entry: the seconds of its ``d - 1`` ring transfers before
    any overlap (``ContextParallelCost._comm`` with no attention; 0 for whole sequences),
    and the attention per unit of ``c`` that can hide them (``(d - 1) * overlap * sq /
    d``). The exposed communication is ``max(0, transfer - c * hide)``."""
    _, length, degree, sq = entries.T
    transfer = cp_cost._comm(length, np.zeros_like(length), degree, 1.0)
    return transfer, (degree - 1) * cp_cost.overlap * sq / degree


def exposed_at(cp_cost: ContextParallelCost, entries: np.ndarray, per_token_sq: float
               ) -> np.ndarray:
    """Which entries expose communication when attention costs ``per_token_sq`` seconds
    per unit of ``e² − s²``: a transfer longer than the ``overlap`` of a ring step's
    attention (``(d - 1) * overlap * c * sq / d`` over the ``d - 1`` steps)."""
    transfer, hide = _link_parts(cp_cost, entries)
    return (entries[:, 2] > 1) & (transfer > per_token_sq * hide)


def link_split(
    cp_cost: ContextParallelCost, entries: np.ndarray, n: int, active: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The exposed communication of each record, linear in ``c`` while the exposed
    entries stay ``active``: ``offset - c * correction`` (seconds), i.e. the transfers'
    seconds and the attention (per unit of ``c``) that hides part of them.

    A fit of ``t - offset`` against the rows with ``correction`` taken off their
    ``Σ(e² − s²)`` column then fits compute and communication together, exactly."""
    rec = entries[:, 0].astype(np.int64)
    transfer, hide = _link_parts(cp_cost, entries)
    return (np.bincount(rec, weights=np.where(active, transfer, 0.0), minlength=n),
            np.bincount(rec, weights=np.where(active, hide, 0.0), minlength=n))  # fmt: skip


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


def _is_list(x: Any) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def _plan_ranges(pieces: Any) -> list[list[list[tuple[int, int, int]]]]:
    """A plan's ``pieces[gpu][slot]`` as lists of int triples, or a ValueError naming the
    first entry that is not a ``(sequence, start, end)`` of integers."""
    want = "a CP plan's pieces: [gpu][slot] lists of (sequence, start, end) integers"
    if not _is_list(pieces):
        raise ValueError(f"pieces must be {want}; got {_show(pieces)}")
    out = []
    for g, gpu in enumerate(pieces):
        if not _is_list(gpu) or not all(_is_list(slot) for slot in gpu):
            raise ValueError(f"pieces[{g}] must be GPU {g}'s slots, each a list; got {_show(gpu)}")
        out_g = []
        for j, slot in enumerate(gpu):
            rows = []
            for k, p in enumerate(slot):
                ok = _is_list(p) and len(p) == 3 and all(
                    isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                    for v in p
                )
                if not ok:
                    raise ValueError(
                        f"pieces[{g}][{j}][{k}] = {_show(p)} is not a (sequence, start, end) "
                        "of integers"
                    )
                rows.append((int(p[0]), int(p[1]), int(p[2])))
            out_g.append(rows)
        out.append(out_g)
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
    pieces = _plan_ranges(pieces)
    holders: dict[tuple[int, int], set[int]] = {}
    for g, gpu in enumerate(pieces):
        for j, slot in enumerate(gpu):
            for seq, _, _ in slot:
                holders.setdefault((j, seq), set()).add(g)
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
            if set(where) != {p[0] for p in slot}:
                raise ValueError(
                    f"GPU {g} slot {j}: its pieces touch sequences "
                    f"{sorted({p[0] for p in slot})} but its micro-batch lists "
                    f"{sorted(where)}"
                )
            rows = [(where[seq], len(holders[(j, seq)]), s, e) for seq, s, e in slot]
            rows_g.append(np.asarray(rows, dtype=np.int64).reshape(-1, 4))
        out.append(rows_g)
    return out
