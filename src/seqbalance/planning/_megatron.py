"""The ``megatron-cp`` layout (:mod:`seqbalance.planning.cp_baselines`' docstring): a
degree per sequence as Megatron-LM's dynamic CP scheduler picks it, sequences packed
heaviest first into slots that span every GPU.

On a validated request of :mod:`.context_parallel`; both that planner (a candidate of
dynamic CP) and the baseline use it.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from ._pieces import _flatten
from .cp_plans import CPPlan, Pieces, _layout

__all__ = ["megatron_cp_flat", "megatron_cp_plan", "megatron_degrees"]


def megatron_degrees(req: Any) -> np.ndarray:
    need = np.maximum(1, -(-req.lens // req.cap))
    deg = np.array([1 << math.ceil(math.log2(int(x))) for x in need.tolist()], dtype=np.int64)
    out: np.ndarray = np.maximum(deg, req.d_min)  # chunk rounding can need one doubling more
    return out


def _rooms(width: np.ndarray, tok: np.ndarray, cap: int) -> tuple[int, int]:
    """Upper bounds on the tokens a GPU of a slot can still take: a split (d = 1) sequence
    (GPUs outside CP groups) and a CP piece (any GPU of a group, ``cap`` while a GPU is
    free)."""
    solo = width <= 1
    room1 = cap - int(tok[solo].min()) if solo.any() else -1
    room2 = cap if (width == 0).any() else cap - int(tok[width > 1].min(initial=cap + 1))
    return room1, room2


def megatron_cp_plan(req: Any) -> CPPlan:
    """The ``megatron-cp`` plan for a validated request of :mod:`.context_parallel`."""
    return megatron_cp_flat(req)[0]


def megatron_cp_flat(req: Any) -> tuple[CPPlan, tuple[np.ndarray, ...]]:
    """:func:`megatron_cp_plan`, and its pieces as ``_flatten`` gives them (dynamic CP
    simulates the plan it built)."""
    W, cap, lens = req.world, req.cap, req.lens
    deg = megatron_degrees(req)
    if (deg > req.cp_size).any():
        i = int(np.flatnonzero(deg > req.cp_size)[0])
        raise ValueError(
            f"sequence {i} ({int(lens[i])} tokens) needs CP degree {int(deg[i])} under the "
            f"Megatron rule, more than cp_size={req.cp_size}"
        )
    tmax = np.zeros(req.n)
    ptok = np.zeros(req.n, dtype=np.int64)
    for d in np.unique(deg).tolist():
        sel = deg == d
        tmax[sel] = req.tables[d][0][sel]
        ptok[sel] = req.tables[d][2][sel]
    remaining = np.lexsort((np.arange(req.n), -req.tables[1][0])).tolist()
    slots: list[list[list[int]]] = []  # slot -> per GPU: sequences (CP ones on each member)
    while remaining:
        # The smallest piece among the sequences from each position on, split (d = 1) and
        # not: once no GPU could take such a piece, none of them fits this slot, so the
        # slot is closed there (the same slots as trying each one, without a pass of numpy
        # calls per sequence left over).
        rest = np.asarray(remaining, dtype=np.int64)
        big = np.iinfo(np.int64).max
        rest_min = [
            np.minimum.accumulate(np.where(sel, ptok[rest], big)[::-1])[::-1].tolist()
            for sel in (deg[rest] == 1, deg[rest] > 1)
        ]
        width = np.zeros(W, dtype=np.int64)  # group size each GPU belongs to (0: free)
        tok = np.zeros(W, dtype=np.int64)
        load = np.zeros(W)
        members: list[list[int]] = [[] for _ in range(W)]
        heap: list[tuple[float, int]] = [(0.0, g) for g in range(W)]  # for d = 1 samples
        left = []
        room = -1  # most token room on a GPU open to d = 1 samples; -1: recompute
        room1 = room2 = cap  # most room for a d = 1 piece, for a CP piece (upper bounds)
        for k, i in enumerate(remaining):
            if room1 < rest_min[0][k] and room2 < rest_min[1][k]:
                left.extend(remaining[k:])
                break
            d, p, t = int(deg[i]), int(ptok[i]), float(tmax[i])
            if d == 1:
                if room < 0:
                    room = cap - int(tok[width <= 1].min(initial=cap))
                if p > room:  # fits no GPU of this slot: next slot
                    left.append(i)
                    continue
                stash: list[tuple[float, int]] = []
                g_ok = -1
                while heap and len(stash) < 16:
                    c, g = heapq.heappop(heap)
                    if width[g] > 1 or c != load[g]:
                        continue  # taken by a CP group, or a stale entry
                    if tok[g] + p <= cap:
                        g_ok = g
                        break
                    stash.append((c, g))
                if g_ok < 0 and len(stash) == 16:  # nearly full in tokens: scan them all
                    ok = np.flatnonzero((width <= 1) & (tok + p <= cap))
                    if ok.size:
                        g_ok = int(ok[np.argmin(load[ok])])
                        stash = [(c, g) for c, g in stash if g != g_ok]
                for s in stash:
                    heapq.heappush(heap, s)
                if g_ok < 0:
                    left.append(i)
                    continue
                width[g_ok] = 1
                room = -1
                tok[g_ok] += p
                load[g_ok] += t
                members[g_ok].append(i)
                heapq.heappush(heap, (load[g_ok], g_ok))
                room1, room2 = _rooms(width, tok, cap)
                continue
            w = width.reshape(-1, d)
            tk = tok.reshape(-1, d)
            same = (w == d).all(axis=1) & (tk + p <= cap).all(axis=1)
            free = (w == 0).all(axis=1)
            ok = same | free
            if not ok.any():
                left.append(i)
                continue
            lo = np.where(ok, load.reshape(-1, d).max(axis=1), np.inf)
            off = int(np.argmin(lo)) * d
            width[off : off + d] = d
            room = -1
            tok[off : off + d] += p
            load[off : off + d] += t
            for g in range(off, off + d):
                members[g].append(i)
            room1, room2 = _rooms(width, tok, cap)
        if len(left) == len(remaining):  # cannot happen: an empty slot fits any sample
            raise RuntimeError("megatron-cp made no progress")
        slots.append(members)
        remaining = left
    pieces: Pieces = [[[] for _ in slots] for _ in range(W)]
    for j, members in enumerate(slots):
        for g in range(W):
            for i in members[g]:
                d = int(deg[i])  # aligned group: g % d is the member's rank inside it
                pieces[g][j].extend((i, s, e) for s, e in _layout(int(lens[i]), d)[g % d])
    flat = _flatten(pieces)
    plan = CPPlan._from_validated_pieces(
        pieces,
        lens,
        max_tokens=cap,
        cp_size=req.cp_size,
        cp="dynamic",
        cp_cost=req.cpc,
        replicas=req.dp,
        sync=req.sync,
        strategy="megatron-cp",
        notes=[],
        flat=flat,
    )
    return plan, flat
