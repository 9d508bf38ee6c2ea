"""Plans with context-parallel pieces: :class:`CPPlan`, its simulation and its lower bound.

A CP plan runs on ``world = dp_size * cp_size`` GPUs. ``pieces[g][j]`` lists what GPU ``g``
holds in micro-batch slot ``j``: ``(sequence, start, end)`` token ranges. A sequence split
over ``d`` GPUs appears on ``d`` GPUs of one slot, each holding its chunk pair of the
load-balanced layout (:func:`seqbalance.costs.context_parallel.balanced_layout`, two ranges;
an empty range ``start == end`` marks a GPU of the group that got no token of a very short
sequence). A sequence on one GPU has one range ``(i, 0, L)``.

JSON schema
-----------
``CPPlan.to_dict()`` is ``Plan.to_dict()`` with these keys added (the existing keys keep
their meaning: ``micro_batches[g][j]`` lists the sequences GPU ``g`` touches in slot ``j``,
so a CP sequence is listed on each GPU of its group; ``num_micro_batches`` is the slots per
GPU)::

    "pieces":     [[[[seq, start, end], ...], ...], ...]   # [gpu][slot] -> ranges
    "cp_size":    int        # largest CP degree allowed
    "cp":         "static" | "dynamic"
    "world_size": int        # GPUs = dp_size * cp_size = len(pieces)
    "cp_cost":    {...}      # ContextParallelCost.to_dict(), the cost pieces are priced with
    "pipeline":   {...}      # static CP with pp_size > 1 only: pp_size, schedule,
                             # virtual_stages, comm_per_token (seqbalance.planning.cp_pipeline)

and ``"dp_size"`` is the number of data-parallel replicas the mesh was given (``world_size /
cp_size``). :meth:`Plan.from_json` returns a :class:`CPPlan` for such a document.

Simulation
----------
A GPU's micro-batch costs ``per_microbatch`` plus its pieces' costs
(:meth:`ContextParallelCost.piece_cost`, with ``d`` the number of GPUs holding that sequence
in that slot). The GPUs that share a CP sequence in a slot form a group that finishes
together, when its slowest member does. ``fsdp``: slot ``j`` starts when every GPU finished
slot ``j - 1`` (as without CP). ``ddp``: a group starts slot ``j`` when all its members
finished their slot ``j - 1``; a GPU alone runs its micro-batches back to back (as without
CP).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from .._notes import Note, arg
from .._validate import (
    ArgumentError,
    as_groups,
    as_index,
    as_lengths,
    check_choice,
    check_degree,
    check_max_tokens,
    check_notes,
    check_positive_int,
    check_text,
)
from ..costs.context_parallel import ContextParallelCost, balanced_layout
from ..partitioning._rules import SIZES
from ..partitioning.stats import relative_gap
from ._pieces import _flatten, _piece_entries
from .plans import DOCUMENT_KINDS, FORMAT, Plan, check_derived
from .simulation import SYNC_MODELS, Simulation, check_equal_counts, lockstep_timeline

__all__ = [
    "CP_MODES",
    "CPPlan",
    "check_cp_size",
    "cp_lower_bound",
    "piece_costs",
    "simulate_pieces",
]

CP_MODES = ("static", "dynamic")

Pieces = list[list[list[tuple[int, int, int]]]]


def _check_cp_cost(cp_cost: Any) -> None:
    if not isinstance(cp_cost, ContextParallelCost):
        raise ValueError(
            f"cp_cost must be a seqbalance.costs.ContextParallelCost, got "
            f"{type(cp_cost).__name__}; build one with ContextParallelCost(cost, ...)"
        )


def check_cp_size(value: Any, name: str = "cp_size") -> int:
    """Return ``value`` as a CP degree: a power of two in ``1..2**14``
    (:data:`seqbalance._validate.MAX_PARALLEL_DEGREE`), or raise a ValueError naming
    ``name``. The limit :func:`seqbalance.plan` puts on ``cp_size``, and the one a loaded
    :class:`CPPlan` meets."""
    c = check_degree(value, name)
    if c & (c - 1):
        raise ArgumentError(Note(
            "argument",
            {"value": value, "lo": 1 << (c.bit_length() - 1), "hi": 1 << c.bit_length()},
            arg(name) + " must be a power of two (CP degrees are), got {value}; use {lo} or {hi}",
        ), argument=name)  # fmt: skip
    return c


def _powers(cp_size: int) -> list[int]:
    out, d = [], 1
    while d <= cp_size:
        out.append(d)
        d *= 2
    return out


@lru_cache(maxsize=1 << 14)
def _layout(length: int, d: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """:func:`balanced_layout`, remembered: a CP request lays out each sequence at every
    degree it tries, for every layout (and baseline) it builds."""
    return tuple(tuple(ranges) for ranges in balanced_layout(length, d))


def _slot_sequences(
    pieces: Sequence[Sequence[Sequence[Any]]], flat: tuple[np.ndarray, ...] | None = None
) -> list[list[list[int]]]:
    """Per GPU and slot: the sequences it holds a piece of, sorted, each once. ``flat``:
    ``_flatten(pieces)``, where the caller has it."""
    gpu, slot, seq, _, _ = _flatten(pieces) if flat is None else flat
    m = max((len(g) for g in pieces), default=0)
    n = int(seq.max()) + 1 if seq.size else 1
    if seq.size and int(seq.min()) < 0:  # (refused by the checks after this)
        return [[sorted({int(p[0]) for p in sl}) for sl in g] for g in pieces]
    key = np.unique((gpu * m + slot) * n + seq)
    cell = (key // n).tolist()  # gpu * m + slot, ascending
    seqs = (key % n).tolist()
    out: list[list[list[int]]] = [[[] for _ in g] for g in pieces]
    for c, i in zip(cell, seqs):
        out[c // m][c % m].append(i)
    return out


def _degrees(flat: tuple[np.ndarray, ...], n: int, world: int, m: int) -> np.ndarray:
    """:meth:`CPPlan.degrees` of the pieces ``flat`` (``_flatten``'s) of ``n`` sequences
    over ``world`` GPUs and ``m`` slots."""
    gpu, slot, seq, _, _ = flat
    out = np.zeros(n, dtype=np.int64)
    if seq.size:
        w, m = world, max(m, 1)
        key = np.unique((seq * w + gpu) * m + slot)  # one entry per (sequence, gpu, slot)
        np.add.at(out, key // (w * m), 1)
    return out


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Non-empty ranges sorted, touching ones joined: (1, 2) and (2, 3) hold (1, 3)."""
    out: list[tuple[int, int]] = []
    for st, en in sorted(r for r in ranges if r[1] > r[0]):
        if out and out[-1][1] == st:
            out[-1] = (out[-1][0], en)
        else:
            out.append((st, en))
    return out


def _off_layout(pieces: Sequence[Sequence[Sequence[Any]]], lengths: np.ndarray,
                cp_size: int, flat: tuple[np.ndarray, ...] | None = None) -> list[int]:
    """Sequences whose pieces in a slot are not :func:`balanced_layout` of some degree on
    an aligned block of GPUs (the layout the piece costs and :func:`cp_lower_bound` assume;
    every plan seqbalance makes has it). A sequence over two slots counts too.
    ``flat``: ``_flatten(pieces)``, where the caller has it."""
    gpu, slot, seq, s, e = _flatten(pieces) if flat is None else flat
    keep = e > s
    gpu, slot, seq, s, e = gpu[keep], slot[keep], seq[keep], s[keep], e[keep]
    unsure = np.setdiff1d(seq, _in_layout(gpu, slot, seq, s, e, lengths, cp_size))
    return _off_layout_exact(gpu, slot, seq, s, e, lengths, cp_size, unsure)


def _in_layout(gpu: np.ndarray, slot: np.ndarray, seq: np.ndarray, s: np.ndarray,
               e: np.ndarray, lengths: np.ndarray, cp_size: int) -> np.ndarray:
    """Sequences (sorted) whose non-empty ranges are certainly in the balanced layout.

    Vectorised, for the sequences of at least ``2·d`` tokens (every chunk non-empty, so
    the degree is the width of the block of GPUs holding them); :func:`_off_layout_exact`
    decides the rest. Planner output is all here, so checking a plan takes no Python loop
    over its sequences.
    """
    if seq.size == 0:
        return seq
    order = np.lexsort((s, gpu, seq))
    gpu, slot, seq, s, e = gpu[order], slot[order], seq[order], s[order], e[order]
    # Touching ranges of a sequence on one GPU join into one run, as _merged does.
    same = np.zeros(seq.size, dtype=bool)
    same[1:] = (seq[1:] == seq[:-1]) & (gpu[1:] == gpu[:-1]) & (s[1:] == e[:-1])
    first = np.flatnonzero(~same)
    last = np.r_[first[1:] - 1, seq.size - 1]
    rq, rg, rs, re_ = seq[first], gpu[first], s[first], e[last]
    # Per sequence: one slot, the block of GPUs [lo, hi], its degree d.
    uq, qstart = np.unique(seq, return_index=True)
    qend = np.r_[qstart[1:], seq.size]
    one_slot = np.maximum.reduceat(slot, qstart) == np.minimum.reduceat(slot, qstart)
    lo, hi = gpu[qstart], gpu[qend - 1]
    d = hi - lo + 1
    length = lengths[uq].astype(np.int64)
    fits = one_slot & ((d & (d - 1)) == 0) & (d <= cp_size) & (lo % d == 0) & (length >= 2 * d)
    # Each run against the layout: GPU r = g - lo holds chunks r and 2d-1-r, one run
    # (chunks d-1 and d) when r = d-1.
    which = np.searchsorted(uq, rq)
    rd, rlen = d[which], length[which]
    r = rg - lo[which]
    group_new = np.ones(rq.size, dtype=bool)
    group_new[1:] = (rq[1:] != rq[:-1]) | (rg[1:] != rg[:-1])
    gstart = np.flatnonzero(group_new)
    gsize = np.diff(np.r_[gstart, rq.size])
    pos = np.arange(rq.size) - np.repeat(gstart, gsize)
    middle = r == rd - 1
    want_size = np.repeat(np.where(middle[gstart], 1, 2), gsize)
    k0 = np.where(middle, rd - 1, np.where(pos == 0, r, 2 * rd - 1 - r))
    k1 = np.where(middle, rd + 1, k0 + 1)
    good = (
        (np.repeat(gsize, gsize) == want_size)
        & (rs == k0 * rlen // (2 * rd))
        & (re_ == k1 * rlen // (2 * rd))
    )
    runs_ok = np.bincount(which, weights=~good, minlength=uq.size) == 0
    gpus = np.bincount(which[gstart], minlength=uq.size)  # GPUs holding each sequence
    out: np.ndarray = uq[fits & runs_ok & (gpus == d)]
    return out


def _off_layout_exact(gpu: np.ndarray, slot: np.ndarray, seq: np.ndarray, s: np.ndarray,
                      e: np.ndarray, lengths: np.ndarray, cp_size: int,
                      which: np.ndarray) -> list[int]:
    """Of the sequences ``which``, those off the layout: every degree tried, one by one."""
    held: dict[int, dict[int, dict[int, list[tuple[int, int]]]]] = {}
    pick = np.isin(seq, which)
    for g, j, i, st, en in zip(*(a[pick].tolist() for a in (gpu, slot, seq, s, e))):
        held.setdefault(i, {}).setdefault(j, {}).setdefault(g, []).append((st, en))
    bad = []
    for i, slots in sorted(held.items()):
        if len(slots) != 1:
            bad.append(i)
            continue
        (gpus,) = slots.values()
        length = int(lengths[i])
        lo, hi = min(gpus), max(gpus)
        ok = False
        d = 1
        while d <= cp_size and not ok:
            start = lo - lo % d
            if hi < start + d:
                want = balanced_layout(length, d)
                ok = all(
                    _merged(gpus.get(start + r, [])) == _merged(want[r]) for r in range(d)
                )
            d *= 2
        if not ok:
            bad.append(i)
    return bad


def piece_costs(
    pieces: Sequence[Sequence[Sequence[Any]]], lengths: np.ndarray, cp_cost: ContextParallelCost
) -> np.ndarray:
    """Cost of every GPU's micro-batch, shape ``(gpus, slots)``; NaN where a GPU lacks a slot.

    ``per_microbatch`` included (also for an empty micro-batch: a dummy step).
    """
    return _piece_costs(pieces, lengths, cp_cost)


def _piece_costs(
    pieces: Sequence[Sequence[Sequence[Any]]], lengths: np.ndarray, cp_cost: ContextParallelCost,
    flat: tuple[np.ndarray, ...] | None = None,
) -> np.ndarray:
    """:func:`piece_costs`; ``flat``: ``_flatten(pieces)``, where the caller has it."""
    world = len(pieces)
    m = max((len(g) for g in pieces), default=0)
    out = np.full((world, m), np.nan)
    for g, gpu in enumerate(pieces):
        out[g, : len(gpu)] = cp_cost.per_microbatch
    kgpu, kslot, length, tok, sq, d = _piece_entries(pieces, lengths, cp_cost, flat)
    if kgpu.size:
        np.add.at(out, (kgpu, kslot), cp_cost._cost(length, tok, sq, d))
    return out


def _slot_groups(pieces: Sequence[Sequence[Sequence[Any]]], world: int, m: int,
                 flat: tuple[np.ndarray, ...] | None = None) -> list[np.ndarray]:
    """For each slot, the group root of every GPU (GPUs alone are their own root): the
    smallest GPU of the GPUs connected through the sequences they share in that slot.
    ``flat``: ``_flatten(pieces)``, where the caller has it."""
    gpu, slot, seq, _, _ = _flatten(pieces) if flat is None else flat
    out = [np.arange(world) for _ in range(m)]
    if seq.size == 0:
        return out
    order = np.lexsort((gpu, seq, slot))
    gpu, slot, seq = gpu[order], slot[order], seq[order]
    same = (slot[1:] == slot[:-1]) & (seq[1:] == seq[:-1]) & (gpu[1:] != gpu[:-1])
    k = np.flatnonzero(same)
    if not k.size:
        return out
    # Connected components of (slot, GPU) nodes by label propagation with pointer jumping:
    # every label is a node of the same component, never above the node, so the fixed
    # point labels each component with its smallest node (the union-find root).
    a = slot[k] * world + gpu[k]
    b = slot[k] * world + gpu[k + 1]
    lab = np.arange(m * world)
    while True:
        low = np.minimum(lab[a], lab[b])
        new = lab.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new]
        if np.array_equal(new, lab):
            break
        lab = new
    roots = lab.reshape(m, world) - (np.arange(m) * world)[:, None]
    for j in np.unique(slot[k]).tolist():
        out[j] = roots[j]
    return out


def simulate_pieces(
    pieces: Sequence[Sequence[Sequence[Any]]],
    lengths: Any,
    cp_cost: ContextParallelCost,
    *,
    sync: str = "fsdp",
    lower_bound: float | None = None,
) -> Simulation:
    """Simulate one step of a plan given as CP pieces (module docstring: the rules).

    Returns the same :class:`~seqbalance.planning.simulation.Simulation` as
    :func:`~seqbalance.planning.simulation.simulate`, with one row per GPU. ``lower_bound``
    defaults to 0 (no gap); :meth:`CPPlan.simulate` passes :func:`cp_lower_bound`.
    """
    check_choice(sync, "sync", SYNC_MODELS)
    lens = as_lengths(lengths)
    _check_cp_cost(cp_cost)
    return _simulate_flat(pieces, lens, cp_cost, sync, lower_bound, _flatten(pieces))


def _simulate_flat(
    pieces: Sequence[Sequence[Sequence[Any]]],
    lens: np.ndarray,
    cp_cost: ContextParallelCost,
    sync: str,
    lower_bound: float | None,
    flat: tuple[np.ndarray, ...],
) -> Simulation:
    """:func:`simulate_pieces` on checked arguments, with ``flat = _flatten(pieces)`` (a
    planner simulating the pieces it built has it already)."""
    _, _, seq, st, en = flat
    # Checked here too, not only by CPPlan: a range past its sequence was priced, a
    # foreign index raised IndexError.
    n = lens.shape[0]
    bad = (seq < 0) | (seq >= n) | (st < 0) | (st > en)
    if n:
        bad |= en > lens[np.where(bad, 0, seq)]
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"piece range (sequence {int(seq[k])}, {int(st[k])}, {int(en[k])}) is not a token "
            f"range 0 <= start <= end <= length of one of the {lens.shape[0]} sequences"
        )
    mb = _piece_costs(pieces, lens, cp_cost, flat)
    check_equal_counts(mb, pieces, "GPUs")
    world, m = mb.shape
    if sync == "fsdp":
        start, end, step = lockstep_timeline(mb)
    else:
        roots = _slot_groups(pieces, world, m, flat)
        start = np.zeros_like(mb)
        end = np.zeros_like(mb)
        ready = np.zeros(world)
        for j in range(m):
            r = roots[j]
            # a group starts when its last member is ready and ends with its slowest member
            g_start = np.full(world, -np.inf)
            np.maximum.at(g_start, r, ready)
            g_end = np.full(world, -np.inf)
            np.maximum.at(g_end, r, g_start[r] + mb[:, j])
            start[:, j] = g_start[r]
            end[:, j] = g_end[r]
            ready = end[:, j]
        step = float(ready.max()) if world else 0.0
    busy = mb.sum(axis=1)
    idle = step - busy
    bound = 0.0 if lower_bound is None else float(lower_bound)
    return Simulation(
        sync=sync,
        step_time=step,
        mb_costs=mb,
        start=start,
        end=end,
        rank_busy=busy,
        rank_idle=idle,
        lower_bound=bound,
        # Without a bound there is no gap (NaN); with one, an empty step is 0 from 0.
        gap=float("nan") if lower_bound is None else float(relative_gap(step, bound)),
        idle_fraction=float(idle.sum() / (world * step)) if world and step > 0 else 0.0,
    )


def degree_tables(
    lengths: np.ndarray, cp_cost: ContextParallelCost, cp_size: int
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{d: (slowest rank's cost, summed work, largest piece tokens)}`` per power of two d."""
    return {d: cp_cost.piece_times(lengths, d) for d in _powers(cp_size)}


def cp_lower_bound(
    lengths: Any,
    world_size: int,
    cp_size: int,
    max_tokens: int,
    cp_cost: ContextParallelCost,
    *,
    min_micro_batches: int = 1,
    tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
) -> float:
    """A step time no CP plan of these sequences can beat, for either sync model.

    Let ``D_i`` be the powers of two ``d <= cp_size`` whose largest balanced-layout piece of
    sequence ``i`` fits ``max_tokens``, ``t_i(d)`` the cost of its slowest piece and
    ``w_i(d)`` the sum of its ``d`` pieces' costs. With ``m0 = max(min_micro_batches,
    ceil(sum L / (world * max_tokens)))`` and ``c0`` the per-micro-batch cost::

        bound = m0 * c0 + max( sum_i min_{d in D_i} w_i(d) / world,  max_i min_{d in D_i} t_i(d) )

    Proof. Take any plan whose pieces follow the balanced layout with a power-of-two
    ``d <= cp_size`` and fit the capacity (every plan of :func:`seqbalance.plan` and of the
    CP baselines). (1) It has ``m >= m0`` slots: every token sits in one piece and a GPU
    holds at most ``max_tokens`` per slot, so ``m * world * max_tokens >= sum L``. (2) The
    GPU-slots' costs add up to ``m * world * c0 + sum_i w_i(d_i) >= world * m0 * c0 + sum_i
    min_d w_i(d)``; under ``fsdp`` the step ``sum_j max_g`` is at least ``sum_j mean_g``,
    under ``ddp`` the step is at least the busiest GPU's busy time, at least the mean: so
    the step is at least that total over ``world``. (3) Sequence ``i`` runs in one slot on
    ``d_i`` GPUs; the GPU holding its slowest piece spends ``t_i(d_i) + c0`` in that slot
    and at least ``c0`` in each of its other ``m - 1 >= m0 - 1`` slots, and under either
    sync model the step is at least that GPU's busy time. Both (2) and (3) hold, so the step
    is at least their maximum. ``t`` and ``w`` include the exposed communication, so the bound
    is not weakened by a comm term no plan can avoid.

    A sequence that fits ``max_tokens`` at no degree (planned with ``oversized="alone"``)
    takes its cheapest degree of all in (2) and (3), and its tokens are left out of
    ``m0``: its GPU-slots break the capacity, and it runs alone in them, so the other
    sequences' tokens still need ``m0`` slots of at most ``max_tokens`` a GPU.
    """
    lens = as_lengths(lengths)
    world = check_positive_int(world_size, "world_size")
    cap = check_positive_int(max_tokens, "max_tokens")
    cp = check_cp_size(cp_size)
    if world % cp:
        raise ValueError(
            f"world_size={world} is not a multiple of cp_size={cp}: the GPUs form "
            "dp_size x cp_size replicas"
        )
    _check_cp_cost(cp_cost)
    m_min = check_positive_int(min_micro_batches, "min_micro_batches")
    c0 = cp_cost.per_microbatch
    if lens.size == 0:
        return max(m_min, 1) * c0
    tables = tables if tables is not None else degree_tables(lens, cp_cost, cp_size)
    best_t = np.full(lens.shape[0], np.inf)
    best_w = np.full(lens.shape[0], np.inf)
    any_t = np.full(lens.shape[0], np.inf)
    any_w = np.full(lens.shape[0], np.inf)
    for _, (tmax, work, ptok) in sorted(tables.items()):
        ok = ptok <= cap
        best_t = np.where(ok, np.minimum(best_t, tmax), best_t)
        best_w = np.where(ok, np.minimum(best_w, work), best_w)
        any_t, any_w = np.minimum(any_t, tmax), np.minimum(any_w, work)
    over = ~np.isfinite(best_t)  # fits at no degree: oversized, alone
    best_t[over], best_w[over] = any_t[over], any_w[over]
    m0 = max(m_min, math.ceil(int(lens[~over].sum()) / (world * cap)), 1)
    return m0 * c0 + max(float(best_w.sum()) / world, float(best_t.max()))


class CPPlan(Plan):
    """A plan whose GPUs hold context-parallel pieces (module docstring: layout and JSON).

    Attributes (besides :class:`Plan`'s)
    ------------------------------------
    pieces : list
        ``pieces[g][j]``: ``(sequence, start, end)`` ranges GPU ``g`` holds in slot ``j``.
    cp_size : int
        Largest CP degree of the mesh.
    cp : str
        ``"static"`` or ``"dynamic"``.
    cp_cost : ContextParallelCost
        Prices pieces for :meth:`simulate`.
    replicas : int
        The mesh's data-parallel size (``world_size / cp_size``); ``dp_size`` returns it.
    pipeline : CPPipelineSetup or None
        Static CP only: each replica is a pipeline whose stages are CP rings running the
        same pieces (:mod:`seqbalance.planning.cp_pipeline`), its slots in run order. A
        dict as :meth:`to_dict` writes it is accepted.

    ``micro_batches[g][j]`` lists the sequences GPU ``g`` touches in slot ``j``.
    """

    def __init__(
        self,
        pieces: Sequence[Sequence[Sequence[Any]]],
        lengths: Any,
        *,
        max_tokens: int,
        cp_size: int,
        cp: str,
        cp_cost: ContextParallelCost,
        dp_size: int | None = None,
        sync: str = "fsdp",
        strategy: str = "seqbalance",
        notes: Sequence[str] = (),
        size: str = "free",
        groups: Any = None,
        pipeline: Any = None,
    ) -> None:
        lens = as_lengths(lengths)
        n = int(lens.shape[0])
        _check_cp_cost(cp_cost)
        clean: Pieces = []
        try:
            for g, gpu in enumerate(pieces):
                rows = []
                for j, slot in enumerate(gpu):
                    ranges = []
                    for p in slot:
                        try:
                            i, s, e = (as_index(v) for v in p)
                        except (ValueError, TypeError):  # not three integers (bools refused)
                            i = s = e = -1
                        if not (0 <= i < n and 0 <= s <= e <= lens[i]):
                            raise ValueError(
                                f"pieces[{g}][{j}] holds {p!r}: want (sequence, start, end) "
                                f"integers with 0 <= sequence < {n} and 0 <= start <= end <= "
                                "its length"
                            )
                        ranges.append((i, s, e))
                    rows.append(ranges)
                clean.append(rows)
        except TypeError:
            raise ValueError(
                "pieces must be nested lists [gpu][slot] of (sequence, start, end)"
            ) from None
        cp_size = check_cp_size(cp_size, "cp_size")
        world = len(clean)
        if world == 0:
            raise ValueError(
                "pieces has no GPU: it must hold one list of slots per GPU (dp_size x cp_size "
                "of them)"
            )
        if dp_size is None:
            if world % cp_size:
                raise ValueError(
                    f"pieces has {world} GPUs, not a multiple of cp_size={cp_size}: the mesh "
                    "has dp_size x cp_size GPUs; give one list of slots per GPU"
                )
            replicas = world // cp_size
        else:
            replicas = check_positive_int(dp_size, "dp_size")
            if replicas * cp_size != world:
                raise ValueError(
                    f"dp_size={replicas} x cp_size={cp_size} = {replicas * cp_size} GPUs, but "
                    f"pieces has {world}; give one list of slots per GPU, or fix dp_size or "
                    "cp_size"
                )
        self._init_fields(clean, lens, max_tokens, cp_size, cp, cp_cost, replicas, sync, strategy)
        self.notes = check_notes(notes, "notes")
        self.size = check_choice(size, "size", SIZES)
        self.groups = None if groups is None else as_groups(groups, n)
        self.pipeline = self._check_pipeline(pipeline)

    def _check_pipeline(self, value: Any) -> Any:
        """None, a CPPipelineSetup or its dict -> None or a CPPipelineSetup that this plan's
        layout can run (static CP, equal slot counts, the schedule's count rule)."""
        if value is None:
            return None
        from .cp_pipeline import CPPipelineSetup

        if isinstance(value, dict):
            value = CPPipelineSetup.from_dict(value)
        if not isinstance(value, CPPipelineSetup):
            kind = type(value).__name__
            raise ValueError(f"pipeline must be None, a CPPipelineSetup or a dict, got {kind}")
        if self.cp != "static":
            raise ValueError(
                "a pipeline needs cp='static': its stages' GPUs run the same slots, which a "
                f"{self.cp} plan does not promise; drop the pipeline or plan with cp='static'"
            )
        if any(len(g) != self.num_micro_batches for g in self.pieces):
            raise ValueError("every GPU needs the same number of slots for a pipeline")
        try:  # a stage's cp_size GPUs run one slot together: they must share its sequences
            self.replica_micro_batches()
        except ValueError as exc:
            raise ValueError(f"a pipeline needs static CP pieces: {exc}") from None
        value.spec.check_count(self.num_micro_batches)
        return value

    def _init_fields(
        self,
        pieces: Pieces,
        lens: np.ndarray,
        max_tokens: int,
        cp_size: int,
        cp: str,
        cp_cost: ContextParallelCost,
        replicas: int,
        sync: str,
        strategy: str,
        micro_batches: list[list[list[int]]] | None = None,
        flat: tuple[np.ndarray, ...] | None = None,
    ) -> None:
        self.pieces = pieces
        self.lengths = lens
        self.cp_size = cp_size
        self.cp = check_choice(cp, "cp", CP_MODES)
        self.cp_cost = cp_cost
        self.replicas = replicas
        self.micro_batches = (
            _slot_sequences(pieces, flat) if micro_batches is None else micro_batches
        )
        self.costs = np.asarray(cp_cost.cost(lens), dtype=np.float64)
        self.per_microbatch = cp_cost.per_microbatch
        self.max_tokens = check_max_tokens(max_tokens, "max_tokens")
        self.padded = False
        self.sync = check_choice(sync, "sync", SYNC_MODELS)
        self.strategy = check_text(strategy, "strategy")
        self.size = "free"
        self.groups = None

    @classmethod
    def _from_validated_pieces(
        cls,
        pieces: Pieces,
        lens: np.ndarray,
        *,
        max_tokens: int,
        cp_size: int,
        cp: str,
        cp_cost: ContextParallelCost,
        replicas: int,
        sync: str,
        strategy: str,
        notes: Sequence[str],
        size: str = "free",
        groups: np.ndarray | None = None,
        micro_batches: list[list[list[int]]] | None = None,
        flat: tuple[np.ndarray, ...] | None = None,
    ) -> CPPlan:
        # micro_batches: each GPU's slots' sorted sequences, where the caller has them;
        # flat: _flatten(pieces), where the caller has it
        self = cls.__new__(cls)
        self._init_fields(pieces, lens, max_tokens, cp_size, cp, cp_cost, replicas, sync, strategy,
                          micro_batches, flat)  # fmt: skip
        self.notes = tuple(notes)
        self.size, self.groups = size, groups
        return self

    # ---- shape -------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the mesh's replicas (``world_size / cp_size``), as in a
        :class:`Plan`; ``micro_batches`` has a row per GPU (:attr:`world_size`)."""
        return self.replicas

    @property
    def world_size(self) -> int:
        """GPUs the plan runs on (rows of ``pieces``)."""
        return len(self.pieces)

    @property
    def num_micro_batches(self) -> int:
        """Slots per GPU."""
        return max((len(g) for g in self.pieces), default=0)

    def degrees(self) -> np.ndarray:
        """CP degree of every sequence: the GPUs holding it (0 if it is missing)."""
        return _degrees(_flatten(self.pieces), self.num_sequences, self.world_size,
                        self.num_micro_batches)  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"CPPlan(strategy={self.strategy!r}, cp={self.cp!r}, dp_size={self.dp_size}, "
            f"cp_size={self.cp_size}, num_micro_batches={self.num_micro_batches}, "
            f"sequences={self.num_sequences}, max_tokens={self.max_tokens}, sync={self.sync!r})"
        )

    # ---- reordering --------------------------------------------------------------------
    def rank_indices(self, rank: int) -> np.ndarray:
        """Sequences GPU ``rank`` touches, slot after slot (a CP sequence on each of its GPUs)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return np.asarray([i for mb in self.micro_batches[rank] for i in mb], dtype=np.int64)

    def replica_micro_batches(self) -> list[list[list[int]]]:
        """Whole sequences per data-parallel replica and slot, for a plan whose replicas
        each split all their sequences over their ``cp_size`` GPUs (every static plan).

        ``out[r][j]`` lists the sequences that the GPUs of replica ``r`` (GPUs ``r *
        cp_size .. (r + 1) * cp_size - 1``) share in slot ``j``. This is what a
        framework that loads one micro-batch per replica and cuts it into its CP pieces
        itself (Megatron-LM's two-chunks-per-rank split is this layout) needs.

        Raises
        ------
        ValueError
            If a GPU of some replica touches other sequences than its replica's first GPU
            in some slot (a dynamic plan with degrees below ``cp_size``, or a hand-made
            plan); then each GPU's pieces are in :attr:`pieces`.
        """
        c = self.cp_size
        out = []
        for r in range(self.replicas):
            rows = self.micro_batches[r * c : (r + 1) * c]
            if any(row != rows[0] for row in rows[1:]):
                raise ValueError(
                    f"replica {r}'s {c} GPUs do not share the same sequences in every slot "
                    f"(a {self.cp} plan with sequences on fewer than cp_size={c} GPUs): "
                    "there are no whole micro-batches per replica; use the pieces "
                    "(seqbalance.torch.cp_shard), or plan with cp='static'"
                )
            out.append([list(mb) for mb in rows[0]])
        return out

    def order(self) -> np.ndarray:
        """Every sequence once, GPU-major, slot, position, at the first GPU that holds it."""
        seen: set[int] = set()
        flat = []
        for gpu in self.micro_batches:
            for mb in gpu:
                for i in mb:
                    if i not in seen:
                        seen.add(i)
                        flat.append(i)
        return np.asarray(flat, dtype=np.int64)

    # ---- tokens and checks -------------------------------------------------------------
    def microbatch_tokens(self) -> np.ndarray:
        """Tokens each GPU holds in each slot, shape ``(world, m)``."""
        out = np.zeros((self.world_size, self.num_micro_batches), dtype=np.int64)
        gpu, slot, _, s, e = _flatten(self.pieces)
        np.add.at(out, (gpu, slot), e - s)
        return out

    def violations(self) -> dict[str, int]:
        """Counts of broken constraints; all zero for a plan from :func:`seqbalance.plan`.

        ``over_capacity`` (GPU-slots above ``max_tokens``), ``empty`` (GPU-slots without a
        piece), ``unequal_counts`` (GPUs whose slot count differs from the largest),
        ``missing`` / ``duplicated`` (sequences with a token in no piece / in two pieces),
        ``split_slots`` (sequences spread over more than one slot), ``bad_degree``
        (sequences whose GPU count is not a power of two <= ``cp_size``), ``off_layout``
        (sequences whose pieces are not the balanced layout of a degree on an aligned
        block of GPUs, those over two slots among them). A plan made under groups or a
        size rule (static CP) also counts ``split_groups`` and ``size_rule`` as
        :meth:`Plan.violations` does, over replicas: a replica's sequences are those its
        ``cp_size`` GPUs touch.
        """
        m = self.num_micro_batches
        _, slot, seq, s, e = _flatten(self.pieces)
        n = self.num_sequences
        missing, dup = self._coverage(seq, s, e)
        pairs = np.unique(seq * max(m, 1) + slot)  # one entry per (sequence, slot)
        split = np.bincount(pairs // max(m, 1), minlength=n) > 1
        deg = self.degrees()
        held = deg > 0
        pow2 = (deg & (deg - 1)) == 0
        out = {
            "over_capacity": int((self.microbatch_tokens() > self.max_tokens).sum()),
            "empty": sum(1 for g in self.pieces for sl in g if not sl),
            "unequal_counts": sum(1 for g in self.pieces if len(g) != m),
            "missing": int(missing.sum()),
            "duplicated": int(dup.sum()),
            "split_slots": int(split.sum()),
            "bad_degree": int((held & (~pow2 | (deg > self.cp_size))).sum()),
            "off_layout": len(_off_layout(self.pieces, self.lengths, self.cp_size)),
        }
        if self.groups is not None or self.size != "free":
            out.update(self._rule_violations())
        return out

    def _rank_sequences(self, rank: int) -> np.ndarray:
        """The distinct sequences the ``cp_size`` GPUs of replica ``rank`` touch."""
        c = self.cp_size
        held = [i for g in range(rank * c, (rank + 1) * c) for mb in self.micro_batches[g]
                for i in mb]  # fmt: skip
        return np.unique(np.asarray(held, dtype=np.int64))

    def _coverage(
        self, seq: np.ndarray, s: np.ndarray, e: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Masks of the sequences with a token in no piece (or in no piece at all) and
        with a token in two pieces, from the flattened ranges."""
        n = self.num_sequences
        keep = e > s
        order = np.lexsort((s[keep], seq[keep]))
        qs, ss, es = seq[keep][order], s[keep][order], e[keep][order]
        missing = np.zeros(n, dtype=bool)
        dup = np.zeros(n, dtype=bool)
        covered = np.bincount(qs, weights=(es - ss).astype(np.float64), minlength=n)
        if qs.size:
            nxt = qs[1:] == qs[:-1]
            dup[qs[1:][nxt & (ss[1:] < es[:-1])]] = True
            missing[qs[1:][nxt & (ss[1:] > es[:-1])]] = True
            first = np.ones(qs.size, dtype=bool)
            first[1:] = ~nxt
            last = np.ones(qs.size, dtype=bool)
            last[:-1] = ~nxt
            missing[qs[first & (ss > 0)]] = True
            missing[qs[last & (es < self.lengths[qs])]] = True
        missing |= (covered < self.lengths) & ~dup
        missing[self.lengths == 0] = False
        missing |= np.bincount(seq, minlength=n) == 0  # in no piece, even an empty one
        return missing, dup

    # ---- evidence ----------------------------------------------------------------------
    def min_micro_batches_bound(self) -> int:
        """Fewest slots per GPU the token capacity allows (a sequence too long for it even
        over ``cp_size`` GPUs, planned alone, takes a GPU-slot on its own at least)."""
        from ..costs.context_parallel import largest_piece_tokens

        over = largest_piece_tokens(self.lengths, self.cp_size) > self.max_tokens
        fits = math.ceil(int(self.lengths[~over].sum()) / (self.world_size * self.max_tokens))
        return max(1, fits, -(-int(over.sum()) // self.world_size))

    def lower_bound(self, cost: Any = None, sync: str | None = None) -> float:
        """:func:`cp_lower_bound` for these sequences on this mesh.

        ``sync`` is checked as :meth:`Plan.lower_bound` checks it; the bound holds under
        both sync models (no step, lockstep or not, is shorter than a GPU's share of the
        work or than the slowest piece), so it is the same for either.
        """
        check_choice(self.sync if sync is None else sync, "sync", SYNC_MODELS)
        return cp_lower_bound(
            self.lengths, self.world_size, self.cp_size, self.max_tokens, self._cp_cost(cost)
        )

    def _pipeline_reordered(self, order: str) -> CPPlan:
        """:func:`~seqbalance.planning.pipeline_plans.reorder` of this pipelined plan: its
        slots in a baseline order, moved on all the GPUs of a replica."""
        from .cp_pipeline import reorder_cp

        out: CPPlan = reorder_cp(self, order)
        return out

    def _cp_cost(self, cost: Any) -> ContextParallelCost:
        if cost is None:
            return self.cp_cost
        if isinstance(cost, ContextParallelCost):
            return cost
        raise ValueError(
            "a CP plan is simulated with a ContextParallelCost; pass one (or None for the "
            f"plan's own), got {type(cost).__name__}"
        )

    def _check_cover(self, flat: tuple[np.ndarray, ...] | None = None) -> None:
        """Refuse pieces that miss or repeat a token, or split a sequence off the balanced
        layout (a hand-edited plan): its step time and gap would describe other work than
        the batch's. ``flat``: ``_flatten(self.pieces)``, where the caller has it."""
        flat = _flatten(self.pieces) if flat is None else flat
        _, _, seq, s, e = flat
        missing, dup = self._coverage(seq, s, e)
        if missing.any() or dup.any():
            raise ValueError(
                f"the pieces must hold every token of each of the {self.num_sequences} "
                f"sequences exactly once: {int(missing.sum())} sequences miss tokens, "
                f"{int(dup.sum())} have tokens in two pieces"
            )
        off = _off_layout(self.pieces, self.lengths, self.cp_size, flat)
        if off:
            # Their pieces would be priced without the K/V they need from other slots or
            # GPUs, and the lower bound assumes the layout: the step could beat it.
            raise ValueError(
                f"sequences {off[:5]}{' ...' if len(off) > 5 else ''} are not split in the "
                "balanced CP layout (seqbalance.costs.context_parallel.balanced_layout of a "
                "power-of-two degree, on an aligned block of GPUs, in one slot), which the "
                "piece costs and the lower bound assume; make the plan with seqbalance.plan"
            )

    def simulate(self, cost: Any = None, sync: str | None = None) -> Simulation:
        """Simulate one step (module docstring: the rules); gap against :func:`cp_lower_bound`.

        Raises ValueError when the pieces miss or repeat a sequence's tokens, or split a
        sequence otherwise than the balanced layout in one slot (``violations()``'s
        ``off_layout``)."""
        self._check_cover()
        cpc = self._cp_cost(cost)
        bound = cp_lower_bound(self.lengths, self.world_size, self.cp_size, self.max_tokens, cpc)
        return simulate_pieces(
            self.pieces,
            self.lengths,
            cpc,
            sync=self.sync if sync is None else sync,
            lower_bound=bound,
        )

    def simulate_pipeline(self, sync: str | None = None) -> Any:
        """Simulate the pipeline step of a static CP plan made with ``pp_size > 1``
        (:mod:`seqbalance.planning.cp_pipeline`: each slot of a replica as slow as its
        slowest GPU, forward and backward apart).

        Returns a :class:`~seqbalance.planning.pipeline_plans.PlanPipelineSimulation`.

        Raises
        ------
        ValueError
            The plan has no pipeline, or its pieces miss or repeat tokens or leave the
            balanced layout (as :meth:`simulate`).
        """
        from .cp_pipeline import simulate_cp_pipeline

        if self.pipeline is None:
            raise ValueError("this plan has no pipeline; plan with cp='static' and pp_size > 1")
        flat = _flatten(self.pieces)  # once, for the checks and the phases
        self._check_cover(flat)
        sync = self.sync if sync is None else check_choice(sync, "sync", SYNC_MODELS)
        return simulate_cp_pipeline(
            self.pieces, self.lengths, self.cp_cost, self.cp_size, sync, self.pipeline, flat
        )

    def _planned_pipeline_step(self) -> float:
        """:meth:`simulate_pipeline`'s step, without its checks of the pieces: for a plan the
        planner has just made (in the balanced layout, covering every token), whose checks
        would cost as much as planning a wide mesh."""
        from .cp_pipeline import simulate_cp_pipeline

        assert self.pipeline is not None
        flat = _flatten(self.pieces)
        return float(simulate_cp_pipeline(
            self.pieces, self.lengths, self.cp_cost, self.cp_size, self.sync, self.pipeline, flat
        ).step_time)  # fmt: skip

    def _simulate(self, costs: Any, c0: float, sync: str, bound: float | None) -> Simulation:
        return simulate_pieces(
            self.pieces, self.lengths, self.cp_cost, sync=sync, lower_bound=bound
        )

    def stats(self, cost: Any = None) -> dict[str, Any]:
        """As :meth:`Plan.stats`, per GPU, plus the CP degree histogram."""
        self._check_cover()
        cpc = self._cp_cost(cost)
        bound = cp_lower_bound(self.lengths, self.world_size, self.cp_size, self.max_tokens, cpc)
        ddp = simulate_pieces(self.pieces, self.lengths, cpc, sync="ddp", lower_bound=bound)
        fsdp = simulate_pieces(self.pieces, self.lengths, cpc, sync="fsdp", lower_bound=bound)
        mb = fsdp.mb_costs
        ranks = mb.sum(axis=1)
        mean = float(ranks.mean()) if ranks.size else 0.0
        capacity = self.world_size * self.num_micro_batches * self.max_tokens
        tokens = self.microbatch_tokens()
        used = int(tokens.sum())
        deg = self.degrees()
        values, counts = np.unique(deg, return_counts=True)
        return {
            "strategy": self.strategy,
            "cp": self.cp,
            "dp_size": self.dp_size,
            "cp_size": self.cp_size,
            "world_size": self.world_size,
            "num_micro_batches": self.num_micro_batches,
            "sequences": self.num_sequences,
            "degrees": {int(v): int(c) for v, c in zip(values, counts)},
            "rank_loads": ranks.tolist(),
            "mb_loads": mb.tolist(),
            "max": float(ranks.max()) if ranks.size else 0.0,
            "min": float(ranks.min()) if ranks.size else 0.0,
            "mean": mean,
            "imbalance": float(ranks.max() / mean - 1.0) if mean > 0 else 0.0,
            "capacity_utilisation": used / capacity if capacity else 0.0,
            "unused_tokens": int(np.maximum(self.max_tokens - tokens, 0).sum()),
            "over_capacity_tokens": int(np.maximum(tokens - self.max_tokens, 0).sum()),
            "lower_bound": bound,
            "gap_ddp": ddp.gap,
            "gap_fsdp": fsdp.gap,
            "violations": self.violations(),
        }

    # ---- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """:meth:`Plan.to_dict` plus ``pieces``, ``cp_size``, ``cp``, ``world_size``,
        ``cp_cost``, and ``pipeline`` when planned with one (module docstring: the schema)."""
        out = super().to_dict()
        out.update(
            {
                "dp_size": self.dp_size,
                "cp_size": self.cp_size,
                "cp": self.cp,
                "world_size": self.world_size,
                "cp_cost": self.cp_cost.to_dict(),
                "pieces": [[[list(p) for p in slot] for slot in gpu] for gpu in self.pieces],
            }
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CPPlan:
        """Rebuild a CP plan from :meth:`to_dict` output.

        Every field is checked as :class:`CPPlan` checks its arguments, with the limits
        :func:`seqbalance.plan` puts on them: ``pieces`` one list of slots per GPU,
        ``dp_size x cp_size`` of them (``world_size``, if given, their number), ``cp_size``
        a power of two up to ``2**14``, ``max_tokens`` below ``2**62``, ``cp_cost`` what
        :meth:`ContextParallelCost.to_dict` writes, ``notes`` a list of strings.

        Raises
        ------
        ValueError
            The document is not a plan, lacks a required key, or has a bad field (the
            message names the key).
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a seqbalance plan: format is {found!r}, want {FORMAT!r}")
        missing = [
            k for k in ("pieces", "lengths", "max_tokens", "cp_size", "cp_cost") if k not in data
        ]
        if missing:
            raise ValueError(f"CP plan document lacks {', '.join(missing)}")
        try:
            cp_cost = ContextParallelCost.from_dict(data["cp_cost"])
        except ValueError as exc:
            raise ValueError(f"cp_cost: {exc}") from None
        out = cls(
            data["pieces"],
            data["lengths"],
            max_tokens=data["max_tokens"],
            cp_size=data["cp_size"],
            cp=data.get("cp", "dynamic"),
            cp_cost=cp_cost,
            dp_size=data.get("dp_size"),
            sync=data.get("sync", "fsdp"),
            strategy=data.get("strategy", "seqbalance"),
            notes=data.get("notes", ()),
            size=data.get("size", "free"),
            groups=data.get("groups"),
            pipeline=data.get("pipeline"),
        )
        # Written by to_dict for a Plan's readers, but CP plans derive them from pieces,
        # lengths and cp_cost: an edited one would silently do nothing.
        check_derived(
            data,
            out,
            ("num_micro_batches", "micro_batches", "costs", "per_microbatch", "padded"),
            source="pieces, lengths and cp_cost",
        )
        if data.get("world_size") is not None:
            world = check_positive_int(data["world_size"], "world_size")
            if world != out.world_size:
                raise ValueError(
                    f"world_size={world} but pieces has {out.world_size} GPUs; world_size must "
                    "be the number of GPUs (dp_size x cp_size)"
                )
        return out


DOCUMENT_KINDS["pieces"] = CPPlan
