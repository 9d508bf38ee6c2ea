"""Context-parallel planning: sequences -> CP groups of GPUs x micro-batch slots.

:func:`seqbalance.plan` calls :func:`plan_cp_spec` when ``cp_size > 1``. The mesh has
``world = dp_size * cp_size`` GPUs and ``max_tokens`` is per GPU. A sequence with CP
degree ``d`` runs on ``d`` GPUs of one slot in the load-balanced layout (see
:mod:`seqbalance.costs.context_parallel`); CP groups are aligned blocks of ``d`` GPUs
(GPUs ``k*d .. k*d + d - 1``), so a group never crosses a data-parallel replica's
``cp_size`` GPUs and the mesh's own process groups can serve it.

``cp="static"``
    Every sequence is split over its replica's ``cp_size`` GPUs (the usual setting). The
    replicas are planned by :func:`seqbalance.plan` with each sequence's largest piece as
    its tokens and its slowest piece as its cost, so the capacity holds on every GPU.
``cp="dynamic"``
    One pool of GPUs. Each sequence gets a power-of-two degree ``d <= cp_size``: the
    smallest whose largest piece fits ``max_tokens`` (``d = 1`` for sequences that fit;
    they fill the CP slots' slack and then ordinary micro-batches, packed by capacitated
    LPT, not by :func:`seqbalance.plan`: within 0.5% of its step on 360 random cases,
    and the static layout stays a candidate), raised only where that lowers the
    simulated step. Steps:

    1. For a threshold ``theta``, every sequence whose slowest piece costs more than
       ``theta`` gets the smallest larger degree that brings it under ``theta`` (or the
       fastest one). Thresholds tried: none, then the costliest piece halved repeatedly.
    2. Sequences with ``d >= 2``, costliest first, join an existing CP group of their
       degree or larger when that keeps the group within its slot's level and token room
       (a group may hold several sequences, each split over all its GPUs), or open a group
       of ``d`` GPUs in the first slot with room; so groups of similar cost share a slot.
    3. The sequences with ``d = 1`` fill the rest: first the slack of slots whose level a CP
       group sets (groups below the level, split at the group's degree, and the slot's
       free GPUs), heaviest sequences first, never above the slot's level (that work is
       free under FSDP); then the remaining slots, as capacitated LPT bins dealt out by
       cost. Too little room: one more slot.
    4. Each candidate is simulated; the best one is rebuilt with the slot refinement of
       :mod:`seqbalance.planning._slots`. The static-CP plan and the Megatron-style plan
       (:mod:`seqbalance.planning.cp_baselines`) are candidates too, unless a lower bound
       for their fixed degrees shows they cannot win. The lowest simulated step wins
       (ties: fewer slots, then the order above), and ``plan.notes`` says which.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
from itertools import chain
from typing import Any, Callable

import numpy as np

from .._notes import REPLICA_WORDS, Note, NotedError, as_note, as_text, using_words
from .._validate import (
    ArgumentError,
    as_lengths,
    check_bool,
    check_choice,
    check_max_tokens,
    check_nonnegative_int,
    check_positive_int,
    is_array_like,
)
from ..costs.context_parallel import ContextParallelCost
from ..partitioning._rules import SIZES
from ..partitioning.searches import exact_work_pool
from ._count_notes import states_tokens, with_asked_multiple, without_raised_to
from ._effort import exact_pool
from ._grouping import bin_totals
from ._megatron import megatron_cp_flat, megatron_degrees
from ._pieces import _flatten
from ._slots import fill_slack
from ._work import COUNT_WORK, counts_spent, remembered, spent, work_meter
from .cp_pipeline import CPPipelineSetup, order_phases, permute_slots, pipeline_note
from .cp_plans import (
    CP_MODES,
    CPPlan,
    Pieces,
    _degrees,
    _layout,
    _powers,
    _simulate_flat,
    check_cp_size,
    degree_tables,
    simulate_pieces,
)
from .limits import check_counts, check_mesh, check_slots
from .pipeline_orders import BUDGET, search_suspended
from .simulation import SYNC_MODELS

#: Simulated operations the pipeline order searches of one static CP plan may spend in all
#: (its replica plans' slot orders; see :func:`_static`).
ORDER_BUDGET = 2 * BUDGET

#: Dynamic CP builds its degree candidates (and refines the best) while they fit this many
#: units of layout work: a candidate's piece ranges (``2 d`` for a sequence split ``d``
#: ways, 1 unsplit) plus its GPU slots (GPUs x micro-batches), about 2-4 us a unit. The
#: first candidate is always built; the candidates and refinement of ``bench/cp.py``'s
#: grid use at most 121,321 (long-context, 4,096 sequences over 8 x 32 GPUs, ib-800g).
DYNAMIC_WORK = 130_000

__all__ = ["cost_without_cp", "make_cp_cost", "plan_cp_spec"]


def make_cp_cost(cost: Any, cp_cost: Any) -> ContextParallelCost:
    """The :class:`ContextParallelCost` for ``plan(cost=..., cp_cost=...)``.

    ``cp_cost`` may be None (free communication), a :class:`ContextParallelCost` (then
    ``cost`` must be None), or a dict of its keyword arguments (``bandwidth``, ``overlap``,
    ``cost_per_second``, ``kv_bytes_per_token``, ``comm_passes``).
    """
    if isinstance(cp_cost, ContextParallelCost):
        if cost is not None:
            raise ValueError("pass the sequence cost either as cost= or inside cp_cost=, not both")
        return cp_cost
    from ..costs import TokenCost, load_cost

    if isinstance(cost, (np.ndarray, list, tuple)):
        raise ValueError(
            "with cp_size > 1, cost must be a cost model (or a name, path or None), not "
            "per-sequence numbers: pieces of a sequence are priced from its polynomial"
        )
    model = TokenCost() if cost is None else load_cost(cost)
    if cp_cost is None:
        return ContextParallelCost(model)
    if not isinstance(cp_cost, dict):
        raise ValueError(
            f"cp_cost must be None, a ContextParallelCost or a dict of its arguments, got "
            f"{type(cp_cost).__name__}"
        )
    try:
        return ContextParallelCost(model, **cp_cost)
    except TypeError as exc:
        raise ValueError(f"cp_cost has an unknown key ({exc})") from None


def cost_without_cp(cost: Any, cp_cost: Any) -> Any:
    """The sequence cost ``plan`` uses at ``cp_size=1``, given ``cost`` and ``cp_cost``.

    Nothing is communicated at degree 1, but ``cp_cost`` is still checked (a config that
    is wrong should fail whatever its CP degree), and a sequence cost given inside a
    :class:`ContextParallelCost` is the one planned with, as it is at ``cp_size > 1``.
    """
    if cp_cost is None:
        return cost
    if isinstance(cp_cost, ContextParallelCost):
        make_cp_cost(cost, cp_cost)  # refuses a second sequence cost
        return cp_cost.cost
    if not is_array_like(cost):
        make_cp_cost(cost, cp_cost)  # checks the dict against the model it prices
    elif not isinstance(cp_cost, dict):
        make_cp_cost(None, cp_cost)  # raises the type error
    else:  # per-sequence costs: no model to derive the KV bytes from, so a stand-in
        make_cp_cost(None, {"kv_bytes_per_token": 1.0, "cost_per_second": 1.0, **cp_cost})
    return cost


def _round_up(x: int, k: int) -> int:
    return -(-x // k) * k


class _Request:
    """The validated arguments of :func:`plan_cp_spec`."""

    def __init__(
        self,
        lens: np.ndarray,
        dp: int,
        cp_size: int,
        cap: int,
        cpc: ContextParallelCost,
        sync: str,
        m_min: int,
        mult: int,
        allow_empty: bool,
        baselines: bool = True,
        rules: dict[str, Any] | None = None,
        pp: tuple[CPPipelineSetup, dict[str, Any]] | None = None,
        replicas: Callable[..., Any] | None = None,
    ) -> None:
        self.lens, self.dp, self.cp_size, self.cap = lens, dp, cp_size, cap
        # static CP in pipeline stages: the layout (None: no pipeline) and plan()'s keywords
        self.pp: CPPipelineSetup | None = None if pp is None else pp[0]
        self.pp_kwargs: dict[str, Any] = {} if pp is None else pp[1]
        self.cpc, self.sync, self.m_min, self.mult = cpc, sync, m_min, mult
        self.allow_empty, self.baselines = allow_empty, baselines
        # plan()'s rules for the replicas of static CP (a replica is a rank there)
        self.rules: dict[str, Any] = dict(rules or {})
        # the planner of static CP's replicas (plan() without its pipeline count search),
        # handed down by the entry point: that planner sits above this module
        self.replicas = replicas
        # the replicas are planned at the request's effort (plan_cp_spec sets it)
        self.effort = "thorough"
        self.world = dp * cp_size
        self.n = int(lens.shape[0])
        self.tables = degree_tables(lens, cpc, cp_size)
        self.d_min = self._min_degrees()
        # static CP: each sequence's ranges on the cp_size GPUs of its replica, its pieces'
        # phases there, and the slot orders searched for a replica plan (by id, with the
        # plan kept alive next to them), each computed once per request
        self._members: dict[int, list[list[tuple[int, int, int]]]] = {}
        self._phases: tuple[np.ndarray, ...] | None = None
        self._orders: dict[int, tuple[Any, np.ndarray, float, tuple[np.ndarray, ...]]] = {}
        self.order_budget = ORDER_BUDGET

    def members(self, i: int) -> list[list[tuple[int, int, int]]]:
        """Sequence ``i``'s ranges on each of the ``cp_size`` GPUs of a replica."""
        if not self._members and self.n and self.cp_size > 1:
            # (once per request: a pipelined plan's count search builds several requests)
            key = ("cp members", self.lens.tobytes(), self.cp_size)
            self._members = remembered(key, lambda: _balanced_members(self.lens, self.cp_size))
        out = self._members.get(i)
        if out is None:
            out = self._members[i] = _group_pieces([i], self.lens, self.cp_size)
        return out

    def _min_degrees(self) -> np.ndarray:
        d_min = np.zeros(self.n, dtype=np.int64)
        for d, (_, _, ptok) in sorted(self.tables.items()):
            d_min = np.where((d_min == 0) & (ptok <= self.cap), d, d_min)
        if (d_min == 0).any() and self.rules.get("oversized") == "alone":
            # static CP only: such a sequence runs alone, over the cap, at cp_size
            d_min[d_min == 0] = self.cp_size
        if (d_min == 0).any():
            i = int(np.flatnonzero(d_min == 0)[0])
            largest = int(self.tables[self.cp_size][2][i])
            raise ArgumentError(Note(
                "too_long", {"index": i, "tokens": int(self.lens[i]), "cp_size": self.cp_size,
                             "largest": largest, "cap": self.cap},
                "sequence {index} has {tokens} tokens: split over {@cp_size:{cp_size}} "
                "{@GPUs} its largest piece has {largest} tokens, more than "
                "{@max_tokens:{cap}}; raise {@cp_size or max_tokens}, or truncate it",
            ), argument="max_tokens")  # fmt: skip
        return d_min

    def m_start(self) -> int:
        m_cap = max(1, math.ceil(int(self.lens.sum()) / (self.world * self.cap)))
        return _round_up(max(m_cap, self.m_min), self.mult)


#: plan()'s rules on ranks and micro-batches that static CP applies to its replicas, with
#: their defaults (dynamic CP refuses any other value).
REPLICA_RULES: dict[str, Any] = {
    "size": "free",
    "groups": None,
    "order": None,
    "oversized": "error",
    "extra_micro_batches": 0,
    "sequences_per_micro_batch": None,
}


def _check_rules(rules: dict[str, Any], cp: str) -> dict[str, Any]:
    """The rules away from their defaults (under dynamic CP, PlanSpec refuses them)."""
    from ._ordering import ORDERS, OVERSIZED

    check_choice(rules["size"], "size", SIZES)
    if rules["order"] is not None:
        check_choice(rules["order"], "order", ORDERS)
    check_choice(rules["oversized"], "oversized", OVERSIZED)
    check_nonnegative_int(rules["extra_micro_batches"], "extra_micro_batches")
    if rules["sequences_per_micro_batch"] is not None:
        check_positive_int(rules["sequences_per_micro_batch"], "sequences_per_micro_batch")
    return {
        k: v
        for k, v in rules.items()
        if ((v is not None) if REPLICA_RULES[k] is None else (v != REPLICA_RULES[k]))
    }


def _check_pipeline(lens: np.ndarray, cp: str, pipeline: dict[str, Any] | None) -> Any:
    """``(CPPipelineSetup, plan()'s keywords)`` for ``pp_size > 1``, else None (under
    dynamic CP, :class:`~seqbalance.planning.request.Mesh` refuses a pipeline)."""
    from .pipeline_plans import pipeline_setup

    kw = {"pp_size": 1, "schedule": "1f1b", "virtual_stages": 1, "pp_comm": 0.0,
          **(pipeline or {})}  # fmt: skip
    # Validates the keywords (pp_comm needs pp_size > 1; the schedule's rules), costs aside.
    setup = pipeline_setup(lens, None, kw["pp_size"], kw["schedule"], kw["virtual_stages"],
                           kw["pp_comm"])  # fmt: skip
    if setup is None:
        return None
    return CPPipelineSetup(setup.spec, setup.comm_per_token), kw


def _validate(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    cp_size: int,
    cp: str,
    cost: Any,
    cp_cost: Any,
    sync: str,
    m_min: int,
    mult: int,
    allow_empty: bool,
    baselines: bool = True,
    rules: dict[str, Any] | None = None,
    pipeline: dict[str, Any] | None = None,
    replicas: Callable[..., Any] | None = None,
) -> _Request:
    lens = as_lengths(lengths)
    dp = check_positive_int(dp_size, "dp_size")
    cap = check_max_tokens(max_tokens, "max_tokens")
    c = check_cp_size(cp_size, "cp_size")
    check_choice(cp, "cp", CP_MODES)
    check_choice(sync, "sync", SYNC_MODELS)
    given = _check_rules({**REPLICA_RULES, **(rules or {})}, cp)
    pp = _check_pipeline(lens, cp, pipeline)
    m_min = check_positive_int(m_min, "min_micro_batches")
    mult = check_positive_int(mult, "micro_batch_multiple")
    allow_empty = check_bool(allow_empty, "allow_empty")
    _check_bounds(lens, dp, cap, c, cp, m_min, mult, allow_empty, given, pipeline)
    cpc = make_cp_cost(cost, cp_cost)
    return _Request(
        lens, dp, c, cap, cpc, sync, m_min, mult, allow_empty, check_bool(baselines, "baselines"),
        given, pp, replicas,
    )


def _check_bounds(
    lens: np.ndarray, dp: int, cap: int, c: int, cp: str, m_min: int, mult: int,
    allow_empty: bool, rules: dict[str, Any], pipeline: dict[str, Any] | None,
) -> None:
    """The limits of :mod:`.limits` for this mesh, before the degree tables (which grow
    with ``n x log2(cp_size)``) or any slot is built."""
    n = int(lens.shape[0])
    extra = int(rules.get("extra_micro_batches", 0))
    check_counts(n, dp, m_min, mult, extra, ranks="replicas", prefix=f"{cp} CP: ")
    p = int((pipeline or {}).get("pp_size", 1))
    v = int((pipeline or {}).get("virtual_stages", 1))
    check_mesh(n, dp, c, p, v)
    # The fewest slots any plan has: the capacity minimum over every GPU of the mesh.
    m_cap = max(1, -(-int(lens.sum()) // (dp * c * cap)))
    m = _round_up(max(m_cap, m_min), mult)
    if p > 1:
        m_hi = max(m, min(p, n // dp))
        check_slots(n, dp, m_hi, allow_empty=allow_empty, cp_size=c, chunks=p * v)
    else:
        # (too few sequences for every GPU slot is the planner's own error, after the one
        # that names a sequence too long for its pieces; no sequence at all is refused here)
        if cp == "dynamic" and n == 0 and not allow_empty:
            raise ValueError(
                f"0 sequences cannot give each of {dp * c} GPUs a piece; pass "
                "allow_empty=True for a plan of (marked) empty micro-batches"
            )
        check_slots(n, dp, m, allow_empty=allow_empty, cp_size=c)


# ---- pieces from groups -------------------------------------------------------------------


def _balanced_members(lens: np.ndarray, d: int) -> dict[int, list[list[tuple[int, int, int]]]]:
    """:func:`_group_pieces` of every sequence alone at degree ``d >= 2``, from the
    balanced layout's cuts computed for all sequences at once (the same ranges)."""
    cuts = (np.arange(2 * d + 1, dtype=np.int64)[None, :] * lens.astype(np.int64)[:, None]) // (
        2 * d
    )
    r = np.arange(d)
    s1, e1 = cuts[:, r].tolist(), cuts[:, r + 1].tolist()
    s2, e2 = cuts[:, 2 * d - 1 - r].tolist(), cuts[:, 2 * d - r].tolist()
    return {
        i: [[(i, a, b), (i, c, e)] for a, b, c, e in zip(s1[i], e1[i], s2[i], e2[i])]
        for i in range(lens.shape[0])
    }


def _group_pieces(seqs: list[int], lens: np.ndarray, d: int) -> list[list[tuple[int, int, int]]]:
    """Per member GPU of a ``d``-group: the ranges of every sequence of the group."""
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(d)]
    for i in seqs:
        for r, ranges in enumerate(_layout(int(lens[i]), d)):
            out[r].extend((i, s, e) for s, e in ranges)
    return out



def _place_block(free: np.ndarray, load: np.ndarray, w: int, sync: str) -> int:
    """Offset of a free aligned block of ``w`` GPUs (ddp: the least-loaded one)."""
    blocks = free.reshape(-1, w).all(axis=1)
    cand = np.flatnonzero(blocks)
    if sync == "ddp" and cand.size > 1:
        lo = load.reshape(-1, w).max(axis=1)[cand]
        return int(cand[int(np.argmin(lo))]) * w
    return int(cand[0]) * w


# ---- static CP --------------------------------------------------------------------------


def _in_replicas(exc: ValueError) -> str:
    """plan()'s message for this mesh (its ranks are the replicas: :func:`_static_base`
    plans them in :data:`REPLICA_WORDS`), keeping its note where it has one."""
    return as_text(exc.note.in_words(REPLICA_WORDS)) if isinstance(exc, NotedError) else str(exc)


def _static_base(req: _Request, flat: bool = False, **overrides: Any) -> Any:
    """The replica-level plan of static CP (a :class:`Plan` over ``dp`` replicas), or why not.

    Each sequence counts its largest piece as tokens (so every GPU stays within
    ``max_tokens``) and its slowest piece as cost. ``extra_micro_batches`` is not passed
    on: the replica plan's costs carry no per-micro-batch term, so larger counts would
    look free there; :func:`_static` tries them under the CP step instead. With a
    pipeline the replicas are planned for it, or (``flat``) without it, at the schedule's
    count multiple.
    """
    # The count search for pipelines runs once, on the CP plan (plan()'s wrapper), not
    # here on the proxy costs: req.replicas leaves it out.
    replicas = req.replicas
    if replicas is None:
        return "the replicas need a planner (static CP is planned through seqbalance.plan)"
    tmax, _, ptok = req.tables[req.cp_size]
    rules = {k: v for k, v in req.rules.items() if k != "extra_micro_batches"}
    options: dict[str, Any] = {
        "sync": req.sync,
        "min_micro_batches": req.m_min,
        "micro_batch_multiple": req.mult,
        "allow_empty": req.allow_empty,
        "baselines": req.baselines,
        "effort": req.effort,
        **req.pp_kwargs,
        **rules,
        **overrides,
    }
    mult = req.mult
    if flat and req.pp is not None:
        options = {k: v for k, v in options.items() if k not in req.pp_kwargs}
        options["micro_batch_multiple"] = mult = math.lcm(req.mult, req.pp.spec.count_multiple)
    key = ("cp replicas", ptok.tobytes(), tmax.tobytes(), req.dp, req.cap, _frozen(options))

    def make() -> Any:
        try:
            # With a pipeline the replicas' slot order is searched afterwards on the
            # pieces' own phases (_static_step), so the replica plan keeps its best
            # starting order.
            with search_suspended(), using_words(REPLICA_WORDS):
                base = replicas(ptok, req.dp, req.cap, cost=tmax, **options)
                if mult != req.mult and req.pp is not None:  # (its note would blame a
                    # multiple nobody passed: the schedule's raised it)
                    base.notes = with_asked_multiple(base.notes, req.mult, mult,
                                                     req.pp.spec.schedule)  # fmt: skip
        except ValueError as exc:
            return _in_replicas(exc)
        return base

    # With a pipeline and extra_micro_batches, plan() plans the CP plan again without the
    # extra counts, whose replica plans are the ones made here: remembered for the request
    # (never across requests, so every rank computes the same), handed out as copies
    # (their notes are rewritten by the caller).
    base = remembered(key, make)
    return base if isinstance(base, str) else copy.copy(base)


def _frozen(value: Any) -> Any:
    """A hashable, exact stand-in for an option value (arrays by their bytes)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)


def _replica_plan(req: _Request, with_flat: bool = True, **overrides: Any) -> Any:
    """:func:`_static_base`; with a pipeline, the faster on the pieces' own pipeline of the
    replicas planned for it and planned without it. The first prices each sequence at its
    slowest piece split with one backward ratio, a proxy that can lose (bench/cp_pp.py:
    1.5% slower in a long-context case under ddp), so the second is a candidate too
    (unless ``with_flat`` is False)."""
    base = _static_base(req, **overrides)
    if req.pp is None or isinstance(base, str) or not with_flat:
        return base
    flat = _static_base(req, flat=True, **overrides)
    if isinstance(flat, str):
        return base
    step, flat_step = _static_step(req, base), _static_step(req, flat)
    if flat_step < step:
        flat.notes = (
            *flat.notes,
            "the replicas planned without the pipeline, then ordered for it, ran "
            f"{1 - flat_step / step:.2%} faster than those planned for it (each sequence "
            "priced at its slowest piece there), and were kept",
        )
        return flat
    return base


def _static_step(req: _Request, base: Any) -> float:
    """Simulated step of the static plan from its replica plan, without building pieces.

    Every GPU of a replica holds a piece of every sequence of the replica's micro-batch, so
    the replica is one CP group per slot: under ``ddp`` it advances by its slowest GPU.
    With a pipeline: the pipeline step of the pieces in the order :func:`_static_pieces`
    gives them (the order search runs here, on the slots' phases, and its orders are kept
    for :func:`_static_pieces`: the count that wins here is the plan built there).
    """
    if req.pp is not None:
        if id(base) not in req._orders:
            phases = _replica_phases(req, base)
            orders, step = order_phases(*phases, req.sync, req.pp, budget=req.order_budget)
            req._orders[id(base)] = (base, orders, step, phases)
        return float(req._orders[id(base)][2])
    costs, _ = req.cpc.rank_costs(req.lens, req.cp_size)  # (n, cp_size)
    c0 = req.cpc.per_microbatch
    m = base.num_micro_batches
    mb = np.full((req.dp, m), c0)  # slowest GPU of each replica micro-batch
    for r, rank in enumerate(base.micro_batches):
        for j, items in enumerate(rank):
            if items:
                mb[r, j] = float((c0 + costs[items].sum(axis=0)).max())
    return float(mb.max(axis=0).sum()) if req.sync == "fsdp" else float(mb.sum(axis=1).max())


def _sequence_phases(req: _Request) -> tuple[np.ndarray, ...]:
    """``(n, cp_size)`` forward, backward and tokens of each sequence's piece on each GPU of
    its replica (static CP: every sequence over ``cp_size`` GPUs, GPU ``r`` holding chunks
    ``r`` and ``2 cp_size - 1 - r`` of the balanced layout), priced as
    :func:`~.cp_plans._piece_entries` prices the pieces of a plan (the same sums)."""
    if req._phases is None:
        c = req.cp_size
        lens = req.lens.astype(np.int64)
        cuts = (np.arange(2 * c + 1, dtype=np.int64)[None, :] * lens[:, None]) // (2 * c)
        r = np.arange(c)
        s1, e1 = cuts[:, r], cuts[:, r + 1]
        s2, e2 = cuts[:, 2 * c - 1 - r], cuts[:, 2 * c - r]
        tok = (e1 - s1).astype(np.float64) + (e2 - s2).astype(np.float64)
        f64 = np.float64
        sq = (np.asarray(req.cpc._sq(s1.astype(f64), e1.astype(f64)), dtype=f64)
              + np.asarray(req.cpc._sq(s2.astype(f64), e2.astype(f64)), dtype=f64))  # fmt: skip
        length = np.broadcast_to(lens[:, None].astype(f64), tok.shape)
        pf, pb = req.cpc._phases(length.ravel(), tok.ravel(), sq.ravel(),
                                 np.full(tok.size, float(c)))  # fmt: skip
        shape = tok.shape
        req._phases = (np.asarray(pf, dtype=f64).reshape(shape),
                       np.asarray(pb, dtype=f64).reshape(shape), tok,
                       np.ones(shape, dtype=bool))  # fmt: skip
    return req._phases


def _replica_phases(req: _Request, base: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~.cp_pipeline.slot_phases` of ``_replica_pieces(req, base)``, from the
    per-sequence table of :func:`_sequence_phases` (each GPU's slot sums its pieces in
    the same order as there) without building the pieces."""
    fseq, bseq, tseq, present = _sequence_phases(req)
    c, m = req.cp_size, base.num_micro_batches
    if any(len(rank) != m for rank in base.micro_batches):
        raise ValueError("every GPU needs the same number of slots for a pipeline")
    f0, b0 = req.cpc.microbatch_phases()
    world = req.dp * c
    fwd, bwd, toks = np.full((world, m), f0), np.full((world, m), b0), np.zeros((world, m))
    rows = [(r, j, i) for r, rank in enumerate(base.micro_batches)
            for j, mb in enumerate(rank) for i in mb]  # fmt: skip
    if rows:
        r, j, i = (np.asarray(x, dtype=np.int64) for x in zip(*rows))
        k = np.broadcast_to(np.arange(c), (r.size, c))
        keep = present[i]
        gpu = (r[:, None] * c + k)[keep]
        slot = np.broadcast_to(j[:, None], (r.size, c))[keep]
        seq = np.broadcast_to(i[:, None], (r.size, c))[keep]
        k = k[keep]
        order = np.lexsort((seq, slot, gpu))  # as the pieces' entries are summed
        gpu, slot, seq, k = gpu[order], slot[order], seq[order], k[order]
        np.add.at(fwd, (gpu, slot), fseq[seq, k])
        np.add.at(bwd, (gpu, slot), bseq[seq, k])
        np.add.at(toks, (gpu, slot), tseq[seq, k])
    shape = (req.dp, c, m)
    return (
        fwd.reshape(shape).max(axis=1),
        bwd.reshape(shape).max(axis=1),
        toks.reshape(shape).max(axis=1) * req.pp.comm_per_token,  # type: ignore[union-attr]
    )


def _static_notes(req: _Request, notes: Any) -> list[str]:
    """The replica plan's notes, in this mesh's words: its ranks are replicas, and its
    tokens a sequence's largest piece (what one GPU holds), not the sequence's."""
    out = [
        as_text(note.with_fields(
            "{count} sequences whose largest piece over {@cp_size}={cp_size} GPUs is longer "
            "than {@max_tokens}={cap} run alone in their own micro-batches "
            "({@oversized:'alone'}), first at index {first}"
            if note.fields["count"] > 1 else
            "1 sequence whose largest piece over {@cp_size}={cp_size} GPUs is longer "
            "than {@max_tokens}={cap} runs alone in its own micro-batch "
            "({@oversized:'alone'}), at index {first}",
            cp_size=req.cp_size,
        ).in_words(REPLICA_WORDS))
        if note.kind == "oversized_alone" else as_text(note.in_words(REPLICA_WORDS))
        for note in notes
    ]  # fmt: skip
    if any(states_tokens(note) for note in notes):
        out.append(as_text(Note(
            "largest_piece", {"cp_size": req.cp_size},
            "the replica plan above counts each sequence's largest piece (its tokens on one "
            "of the {@cp_size:{cp_size}} GPUs) as its tokens",
        )))  # fmt: skip
    return out


def _replica_pieces(req: _Request, base: Any) -> Pieces:
    """Every sequence of a replica's micro-batch over the replica's cp_size GPUs: on GPU
    ``k`` of the replica, the ranges :meth:`_Request.members` gives it, sequence after
    sequence in the micro-batch's order."""
    return _replica_layout(req, base)[0]


def _replica_layout(req: _Request, base: Any) -> tuple[Pieces, tuple[np.ndarray, ...] | None]:
    """:func:`_replica_pieces`, and the pieces as ``_flatten`` gives them (None with
    ``cp_size`` 1), both built from the layout's cuts of all sequences at once: a wide
    mesh holds a hundred thousand ranges."""
    c = req.cp_size
    if c < 2:
        pieces: Pieces = [[] for _ in range(req.world)]
        for r, rank in enumerate(base.micro_batches):
            for mb in rank:
                members: list[list[tuple[int, int, int]]] = [[] for _ in range(c)]
                for i in mb:
                    for k, ranges in enumerate(req.members(i)):
                        members[k].extend(ranges)
                for k in range(c):
                    pieces[r * c + k].append(members[k])
        return pieces, None
    sizes = [len(mb) for rank in base.micro_batches for mb in rank]
    seq = np.fromiter(chain.from_iterable(chain.from_iterable(base.micro_batches)),
                      dtype=np.int64, count=sum(sizes))  # fmt: skip
    lens = req.lens.astype(np.int64)[seq]
    # the cuts of _balanced_members, of the sequences in slot order: (len(seq), 2c + 1)
    cuts = (np.arange(2 * c + 1, dtype=np.int64)[None, :] * lens[:, None]) // (2 * c)
    at_k = np.arange(c)
    # a row per GPU k of a replica: every sequence's two ranges, first then second
    start = np.stack((cuts[:, at_k].T, cuts[:, 2 * c - 1 - at_k].T), axis=2).reshape(c, -1)
    end = np.stack((cuts[:, at_k + 1].T, cuts[:, 2 * c - at_k].T), axis=2).reshape(c, -1)
    pair = np.repeat(seq, 2)
    ids = pair.tolist()
    row_of: list[list[tuple[int, int, int]]] = [
        list(zip(ids, a, b)) for a, b in zip(start.tolist(), end.tolist())
    ]
    bounds = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64) * 2)).tolist()
    slot_of = np.repeat(np.arange(len(sizes), dtype=np.int64), np.multiply(sizes, 2))
    out: Pieces = []
    # the flat arrays: per replica, its ranges (``at`` of a row) on each of its GPUs
    flat_parts: list[list[np.ndarray]] = [[] for _ in range(5)]
    cell = 0
    for k_rank, rank in enumerate(base.micro_batches):
        lo = cell
        cell += len(rank)
        for k in range(c):
            row = row_of[k]
            out.append([row[bounds[x] : bounds[x + 1]] for x in range(lo, cell)])
        at = slice(bounds[lo], bounds[cell])
        gpus = np.arange(k_rank * c, k_rank * c + c, dtype=np.int64)
        for part, values in zip(flat_parts, (
            np.repeat(gpus, bounds[cell] - bounds[lo]), np.tile(slot_of[at] - lo, c),
            np.tile(pair[at], c), start[:, at].ravel(), end[:, at].ravel(),
        )):  # fmt: skip
            part.append(values)
    flat = tuple(
        np.concatenate(part) if part else np.zeros(0, dtype=np.int64) for part in flat_parts
    )
    return out, flat


def _static_pieces(req: _Request, base: Any, strategy: str) -> CPPlan:
    return _static_layout(req, base, strategy)[0]


def _static_layout(
    req: _Request, base: Any, strategy: str
) -> tuple[CPPlan, tuple[np.ndarray, ...] | None]:
    """:func:`_static_pieces`, and its pieces as ``_flatten`` gives them where they are
    built so (no pipeline; else None)."""
    pieces, flat = _replica_layout(req, base)
    notes = _static_notes(req, base.note_items)
    slots = [[sorted(set(mb)) for mb in rank] for rank in base.micro_batches]
    if req.pp is not None:
        # The replica plan's order and note priced each sequence at its slowest piece,
        # with one backward ratio; order the slots on the pieces' own phases instead (the
        # orders _static_step searched for this replica plan, where it did).
        if id(base) not in req._orders:
            _static_step(req, base)
        _, orders, _, (f0, b0, c0) = req._orders[id(base)]
        phases = (f0, b0, c0)
        pieces = permute_slots(pieces, orders, req.cp_size, req.sync)
        flat = None
        if orders.shape[-1]:
            slots = [[rank[j] for j in orders[0 if req.sync == "fsdp" else r].tolist()]
                     for r, rank in enumerate(slots)]  # fmt: skip
            orders = np.broadcast_to(orders, phases[0].shape)
            fo, bo, co = (np.take_along_axis(x, orders, axis=1) for x in phases)
            phases = (fo, bo, co)
        notes = [n for n in notes if as_note(n).kind != "pipeline"]
        notes.append(pipeline_note(pieces, req.lens, req.cpc, req.cp_size, req.sync, req.pp,
                                   phases))  # fmt: skip
    p = CPPlan._from_validated_pieces(
        pieces,
        req.lens,
        max_tokens=req.cap,
        cp_size=req.cp_size,
        cp="static",
        cp_cost=req.cpc,
        replicas=req.dp,
        sync=req.sync,
        strategy=strategy,
        notes=notes,
        size=base.size,
        groups=base.groups,
        # every GPU of a replica holds a piece of each sequence of the replica's slot
        micro_batches=[[list(mb) for mb in slots[g // req.cp_size]] for g in range(req.world)],
    )
    p.pipeline = req.pp
    return p, flat


def _static(req: _Request, strategy: str = "seqbalance") -> CPPlan | str:
    """Every sequence over its replica's cp_size GPUs, replicas planned by :func:`plan`.

    With ``extra_micro_batches=E`` the replicas are also planned at the ``E`` next counts
    (in steps of ``micro_batch_multiple``), and the lowest simulated CP step wins (ties:
    fewer slots), so the per-micro-batch cost is counted and asking is never slower.
    """
    extra = req.rules.get("extra_micro_batches", 0)
    # The pipeline's order searches (two replica plans at the fewest count, one at each
    # larger count tried) share one budget of simulated operations, alike for each.
    req.order_budget = ORDER_BUDGET // (2 + extra)
    base = _replica_plan(req)
    if isinstance(base, str) or not extra:
        return base if isinstance(base, str) else _static_pieces(req, base, strategy)
    m = base.num_micro_batches
    best, best_step = base, _static_step(req, base)
    step_mult = req.mult if req.pp is None else math.lcm(req.mult, req.pp.spec.count_multiple)
    tried_to = m
    before = 0  # the work meter before the last count planned
    for e in range(1, extra + 1):
        count = m + e * step_mult
        now = spent() or 0
        if counts_spent(now - before if e > 1 else 0):  # (with what the last count cost)
            break
        before, tried_to = now, count
        # (the replicas planned without the pipeline are a candidate at the fewest count
        # only: each costs a whole replica plan, and the one there keeps the pipelined
        # plan never slower than the plain plan of the same request)
        # (below effort="thorough" the replicas planned without the pipeline are a
        # candidate at every count: they are planned at that effort, and a request asking
        # for extra counts must not end slower than one asking for the count it picks)
        more = _replica_plan(req, with_flat=req.effort != "thorough", min_micro_batches=count)
        if isinstance(more, str):
            break  # too few sequences for more slots: larger counts fail too
        # its note would blame a min_micro_batches the caller did not pass
        more.notes = without_raised_to(more.notes, count)
        step = _static_step(req, more)
        if step < best_step:
            best, best_step = more, step
    template = (
        "{@extra_micro_batches:{extra}}: {count} slots per GPU were the fastest of the "
        "counts tried from {first}"
        if best.num_micro_batches > 1 else
        "{@extra_micro_batches:{extra}}: 1 slot per GPU was the fastest of the counts "
        "tried from {first}"
    )
    if tried_to < m + extra * step_mult:
        template += (" (to {tried_to}: the request's work budget for extra counts, "
                     "COUNT_WORK = {budget:,} of seqbalance.planning._work, was spent)")
    note = Note("extra_counts", {"extra": extra, "count": best.num_micro_batches, "first": m,
                                 "tried_to": tried_to, "budget": COUNT_WORK}, template)
    p = _static_pieces(req, best, strategy)
    p.notes = (*p.notes, as_text(note))
    return p


def _fixed_bound(req: _Request, deg: np.ndarray) -> float:
    """A step no plan with these exact degrees can beat (as :func:`cp_lower_bound`)."""
    t = np.zeros(req.n)
    w = np.zeros(req.n)
    for d in np.unique(deg).tolist():
        sel = deg == d
        t[sel] = req.tables[d][0][sel]
        w[sel] = req.tables[d][1][sel]
    if req.n == 0:
        return 0.0
    return req.m_start() * req.cpc.per_microbatch + max(float(w.sum()) / req.world, float(t.max()))


# ---- dynamic CP -------------------------------------------------------------------------


def _degrees_for(req: _Request, theta: float) -> np.ndarray:
    """Smallest allowed degree >= d_min whose slowest piece costs <= theta (else the fastest)."""
    deg = req.d_min.copy()
    if not np.isfinite(theta):
        return deg
    chosen = np.zeros(req.n, dtype=np.int64)
    fastest = req.d_min.copy()
    fastest_t = np.full(req.n, np.inf)
    for d, (tmax, _, ptok) in sorted(req.tables.items()):
        allowed = (d >= req.d_min) & (ptok <= req.cap) & ((d == req.d_min) | (2 * d <= req.lens))
        pick = allowed & (chosen == 0) & (tmax <= theta)
        chosen = np.where(pick, d, chosen)
        better = allowed & (tmax < fastest_t)
        fastest = np.where(better, d, fastest)
        fastest_t = np.where(better, tmax, fastest_t)
    return np.where(chosen > 0, chosen, fastest)


class _Group:
    """A CP group in a slot: ``d`` aligned GPUs running ``seqs`` (each split ``d`` ways)."""

    __slots__ = ("d", "seqs", "slot", "time", "tok")

    def __init__(self, d: int, slot: int) -> None:
        self.seqs: list[int] = []
        self.d, self.slot, self.time, self.tok = d, slot, 0.0, 0

    def add(self, i: int, t: float, p: int) -> None:
        self.seqs.append(i)
        self.time += t  # per GPU: the sum of each sequence's slowest piece (an upper bound)
        self.tok += p  # per GPU: the sum of each sequence's largest piece (an upper bound)


def _absorb_shorts(
    req: _Request, shorts: np.ndarray, bins: list[tuple[float, int, int]]
) -> tuple[list[list[int]], list[int]]:
    """The absorb step of :func:`_fill_shorts` (the same whatever the free bins): the
    absorb bins' items and the positions into ``shorts`` left for the free bins."""
    w = req.tables[1][0][shorts]
    t = req.lens[shorts]
    n = w.size
    order = np.lexsort((np.arange(n), -t, -w))
    a_items: list[list[int]] = [[] for _ in bins]
    pos = 0
    if bins and n:
        sums: dict[int, tuple[list[float], list[int]]] = {}
        for b in sorted(range(len(bins)), key=lambda k: (-bins[k][0], k)):
            if pos >= n:
                break
            head, room, d = bins[b]
            if d not in sums:
                tmax, _, ptok = req.tables[d]
                sums[d] = (
                    np.concatenate([[0.0], np.cumsum(tmax[shorts][order])]).tolist(),
                    np.concatenate([[0], np.cumsum(ptok[shorts][order])]).tolist(),
                )
            cw, ct = sums[d]
            # (bisect on lists: np.searchsorted's side="right" on the same numbers)
            k = min(bisect.bisect_right(cw, cw[pos] + head) - 1,
                    bisect.bisect_right(ct, ct[pos] + room) - 1)  # fmt: skip
            if k > pos:
                a_items[b] = order[pos:k].tolist()
                pos = k
    return a_items, order[pos:].tolist()


def _fill_shorts(
    req: _Request,
    shorts: np.ndarray,
    bins: list[tuple[float, int, int]],
    n_free: int,
    absorbed: tuple[list[list[int]], list[int]] | None = None,
) -> tuple[list[list[int]], list[list[int]]] | None:
    """Put the ``d = 1`` sequences into absorb bins, then into ``n_free`` free bins.

    ``bins`` are ``(headroom, token room, degree)``: CP groups below their slot's level and
    the free GPUs of such slots (degree 1). Most headroom first, each bin takes the next
    heaviest sequences (next fit, split at the bin's degree) while its cost stays within
    the headroom and its tokens within the room: work there is free under FSDP. The rest go
    to capacitated LPT bins (each into the cheapest bin with token room). Returns (absorb
    bins, free bins) as positions into ``shorts``, or None when a sequence fits no bin.
    ``absorbed``: :func:`_absorb_shorts` of the same arguments, where the caller has it.
    """
    cap = req.cap
    w = req.tables[1][0][shorts]
    t = req.lens[shorts]
    a_items, rest = absorbed if absorbed is not None else _absorb_shorts(req, shorts, bins)
    a_items = [list(x) for x in a_items]
    f_items: list[list[int]] = [[] for _ in range(n_free)]
    if not rest:
        return a_items, f_items
    if n_free == 0:
        return None
    f_load = np.zeros(n_free)
    f_tok = np.zeros(n_free, dtype=np.int64)
    heap = [(0.0, b) for b in range(n_free)]
    wl, tl = w.tolist(), t.tolist()
    for i in rest:
        wi, ti = wl[i], tl[i]
        stash: list[tuple[float, int]] = []
        b = -1
        while heap and len(stash) < 16:
            c, x = heapq.heappop(heap)
            if f_tok[x] + ti <= cap:
                b = x
                break
            stash.append((c, x))
        if b < 0 and len(stash) == 16:  # bins nearly full in tokens: scan them all
            ok = np.flatnonzero(f_tok + ti <= cap)
            if ok.size:
                b = int(ok[np.argmin(f_load[ok])])
                stash = [(c, x) for c, x in stash if x != b]
                heap = [(c, x) for c, x in heap if x != b]
                heapq.heapify(heap)
        for e in stash:
            heapq.heappush(heap, e)
        if b < 0:
            return None
        f_items[b].append(i)
        f_tok[b] += ti
        f_load[b] += wi
        heapq.heappush(heap, (float(f_load[b]), b))
    return a_items, f_items


def _place_groups(req: _Request, deg: np.ndarray) -> tuple[list[_Group], list[int], list[float]]:
    """Step 2: sequences with ``d >= 2``, costliest first, into CP groups and slots.

    A sequence joins an existing group of its degree or larger (split that many ways) when
    that stays within the group's slot level and the token room; otherwise it opens a
    group in the first slot with ``d`` GPUs left (a new slot if none).
    """
    W, cap, lens = req.world, req.cap, req.lens
    longs = np.flatnonzero(deg >= 2)
    t_long = np.array([req.tables[int(deg[i])][0][i] for i in longs.tolist()])
    groups: list[_Group] = []
    # Every group's degree, slot, time and tokens as arrays, so that each sequence scans
    # the groups in one numpy pass (a Python loop over them is quadratic in the sequences).
    # A group whose token room is below every long sequence's piece at its degree can
    # never take one again (its tokens only grow) and is closed.
    degrees = sorted(req.tables)
    row = {d: k for k, d in enumerate(degrees)}
    t_tab = np.stack([req.tables[d][0] for d in degrees])  # (degrees, n)
    p_tab = np.stack([req.tables[d][2] for d in degrees])
    smallest = {
        d: int(req.tables[d][2][longs].min()) if longs.size else 0 for d in req.tables
    }
    size = max(int(longs.size), 1)
    g_deg = np.zeros(size, dtype=np.int64)
    g_row = np.zeros(size, dtype=np.int64)
    g_slot = np.zeros(size, dtype=np.int64)
    g_time = np.zeros(size)
    g_tok = np.zeros(size, dtype=np.int64)
    g_open = np.zeros(size, dtype=bool)
    lvl = np.zeros(size)  # level per slot (slots <= groups)
    used: list[int] = []
    level: list[float] = []
    first: dict[int, int] = {}
    # the open groups, ascending (a closed group never opens again): each sequence scans
    # only these, and the first best among them is the first best among all groups
    live = np.zeros(0, dtype=np.int64)
    for k in np.lexsort((longs, -t_long)).tolist():
        i, d = int(longs[k]), int(deg[longs[k]])
        best = None
        ng = len(groups)
        if live.size:
            gd, gr = g_deg[live], g_row[live]
            # (level - time - piece cost, as the scalar loop computed it: the same floats)
            head = lvl[g_slot[live]] - g_time[live] - t_tab[gr, i]
            ok = ((gd >= d) & (2 * gd <= lens[i]) & (head >= 0)
                  & (g_tok[live] + p_tab[gr, i] <= cap))  # fmt: skip
            if ok.any():
                b = int(live[np.argmax(np.where(ok, head, -np.inf))])  # the first best
                best = groups[b]
        if best is None:
            # the first slot with d GPUs left (slots only fill up, so it never moves back)
            j = first.get(d, 0)
            while j < len(used) and used[j] + d > W:
                j += 1
            first[d] = j
            if j == len(used):
                used.append(0)
                level.append(0.0)
            best, b = _Group(d, j), ng
            g_deg[b], g_row[b], g_slot[b], g_open[b] = d, row[d], j, True
            groups.append(best)
            live = np.append(live, b)
            used[j] += d
        best.add(i, float(req.tables[best.d][0][i]), int(req.tables[best.d][2][i]))
        g_time[b], g_tok[b] = best.time, best.tok
        level[best.slot] = max(level[best.slot], best.time)
        lvl[best.slot] = level[best.slot]
        if best.tok + smallest[best.d] > cap:
            g_open[b] = False
            live = live[live != b]
    return groups, used, level


def _build_dynamic(
    req: _Request, deg: np.ndarray, refine: bool = True, layouts: dict[bytes, Any] | None = None
) -> tuple[CPPlan, tuple[np.ndarray, ...]] | None:
    """Steps 2-3 of the module docstring for one degree vector, and the plan's pieces as
    ``_flatten`` gives them; None if nothing fits. ``layouts``: what :func:`_place_shorts`
    gave for the degree vectors built so far (by their bytes), which the slot refinement
    of the best one builds on again rather than placing its sequences anew."""
    key = deg.tobytes()
    if layouts is not None and key in layouts:
        built = layouts[key]
    else:
        built = _place_shorts(req, deg)
        if layouts is not None:
            layouts[key] = built
    if built is None:
        return None
    placed, owners, shorts, a_items, f_items, m, m_long = built
    # (_assemble adds the absorbed sequences to the groups: it gets copies of them)
    twins = {}
    for g in placed:
        twin = _Group(g.d, g.slot)
        twin.seqs, twin.time, twin.tok = list(g.seqs), g.time, g.tok
        twins[id(g)] = twin
    groups = [twins[id(g)] for g in placed]
    owner = [twins[id(o)] if isinstance(o, _Group) else o for o in owners]
    return _assemble(req, groups, owner, shorts, a_items, f_items, m, m_long, refine)


_Placed = tuple[list["_Group"], list[Any], np.ndarray, list[list[int]], list[list[int]], int, int]


def _place_shorts(req: _Request, deg: np.ndarray) -> _Placed | None:
    """:func:`_build_dynamic` up to its pieces: the groups, the absorb bins' owners, the
    short sequences and their absorb and free bins, the count and the slots of the groups;
    None if nothing fits."""
    W, cap = req.world, req.cap
    groups, used, level = _place_groups(req, deg)
    shorts = np.flatnonzero(deg == 1)
    m_long = len(used)
    # Absorb bins: groups below their slot's level, then the free GPUs of those slots.
    bins = [(level[g.slot] - g.time, cap - g.tok, g.d) for g in groups]
    owner: list[Any] = list(groups)
    for j in range(m_long):
        bins += [(level[j], cap, 1)] * (W - used[j])
        owner += [j] * (W - used[j])
    m = _round_up(max(req.m_start(), m_long), req.mult)
    m_limit = m + max(shorts.size, 1) + req.mult
    absorbed = _absorb_shorts(req, shorts, bins)  # the same at every count
    while m <= m_limit:
        n_free = (m - m_long) * W
        got = _fill_shorts(req, shorts, bins, n_free, absorbed)
        if got is not None:
            a_items, f_items = got
            return groups, owner, shorts, a_items, f_items, m, m_long
        m += req.mult
    return None


def _assemble(
    req: _Request,
    groups: list[_Group],
    owner: list[Any],
    shorts: np.ndarray,
    a_items: list[list[int]],
    f_items: list[list[int]],
    m: int,
    m_long: int,
    refine: bool,
) -> tuple[CPPlan, tuple[np.ndarray, ...]] | None:
    W, lens = req.world, req.lens
    full_cost = req.tables[1][0]
    pieces: Pieces = [[[] for _ in range(m)] for _ in range(W)]
    load = np.zeros(W)
    singles: dict[int, list[list[int]]] = {}
    short_ids = shorts.tolist()
    for k, items in enumerate(a_items):
        ids = [short_ids[x] for x in items]
        if isinstance(owner[k], _Group):
            g = owner[k]
            g.seqs.extend(ids)
        else:
            singles.setdefault(owner[k], []).append(ids)
    free_bins = [[short_ids[x] for x in b] for b in f_items]
    if any(not b for b in free_bins) or any(not b for v in singles.values() for b in v):
        if not req.allow_empty:
            return None  # too few sequences for a piece on every GPU in every slot
    grid: list[list[list[int]]] = [[] for _ in range(W)]
    if free_bins:
        bcost = _bin_sums(free_bins, full_cost)  # (thousands of bins, most empty)
        order = np.lexsort((np.arange(len(free_bins)), -bcost)).tolist()
        grid = [[free_bins[order[j * W + r]] for j in range(m - m_long)] for r in range(W)]
        if refine and req.sync == "fsdp" and m - m_long >= 2:
            grid = fill_slack(grid, full_cost, lens, req.cap, max_steps=2 * W * (m - m_long) + 100)
    by_slot: dict[int, list[_Group]] = {}
    for g in groups:
        by_slot.setdefault(g.slot, []).append(g)
    # the free slots' bin costs, all at once (thousands of GPU slots, most of them empty
    # with allow_empty, made a numpy call each)
    free_cost = (_bin_sums([grid[r][k] for k in range(m - m_long) for r in range(W)],
                           full_cost).reshape(m - m_long, W)
                 if m > m_long else None)  # fmt: skip
    for j in range(m):
        free = np.ones(W, dtype=bool)
        slot_load = np.zeros(W)
        if j < m_long:
            for g in sorted(by_slot.get(j, []), key=lambda g: (-g.d, g.seqs[0])):
                off = _place_block(free, load, g.d, req.sync)
                members = _group_pieces(sorted(g.seqs), lens, g.d)
                for r in range(g.d):
                    pieces[off + r][j].extend(members[r])
                free[off : off + g.d] = False
                slot_load[off : off + g.d] = float(sum(req.tables[g.d][0][i] for i in g.seqs))
            bins = singles.get(j, [])
            bcost = _bin_sums(bins, full_cost) if bins else np.zeros(0)
        else:
            bins = [grid[r][j - m_long] for r in range(W)]
            assert free_cost is not None
            bcost = free_cost[j - m_long]
        gpus = np.flatnonzero(free)
        b_order = np.lexsort((np.arange(len(bins)), -bcost)).tolist()
        g_order = gpus[np.lexsort((gpus, load[gpus]))].tolist()  # lightest GPU first
        for b, g in zip(b_order, g_order):
            if bins[b]:
                pieces[g][j].extend((i, 0, int(lens[i])) for i in sorted(bins[b]))
            slot_load[g] = bcost[b]
        load += slot_load
    flat = _flatten(pieces)
    plan = CPPlan._from_validated_pieces(
        pieces,
        lens,
        max_tokens=req.cap,
        cp_size=req.cp_size,
        cp="dynamic",
        cp_cost=req.cpc,
        replicas=req.dp,
        sync=req.sync,
        strategy="seqbalance",
        notes=[],
        flat=flat,
    )
    return plan, flat


def _bin_sums(bins: list[list[int]], values: np.ndarray) -> np.ndarray:
    """``float(values[b].sum())`` of every bin ``b``, the same floats without a numpy call
    a bin: numpy adds fewer than 8 numbers one after another, from the first, as the
    per-bin totals do; larger bins are summed by numpy itself."""
    out = bin_totals(bins, values).astype(np.float64)
    sizes = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
    for k in np.flatnonzero(sizes >= 8).tolist():
        out[k] = float(values[bins[k]].sum())
    return out


def _ranges(deg: np.ndarray) -> int:
    """The piece ranges of a layout with degrees ``deg``: ``2 d`` per split sequence."""
    return int(np.where(deg > 1, 2 * deg, 1).sum())


def _step(p: CPPlan, sync: str, flat: tuple[np.ndarray, ...] | None = None) -> float:
    """The simulated step of ``p`` (``flat``: its pieces as ``_flatten`` gives them)."""
    if flat is None:
        return simulate_pieces(p.pieces, p.lengths, p.cp_cost, sync=sync).step_time
    return _simulate_flat(p.pieces, p.lengths, p.cp_cost, sync, None, flat).step_time


def _dynamic(req: _Request) -> CPPlan:

    if req.n == 0:  # (allow_empty: _check_bounds refused it otherwise) every slot empty
        base = _static_base(req)
        assert not isinstance(base, str)
        empty = _static_pieces(req, base, "seqbalance")
        empty.cp = "dynamic"
        return empty
    tried: list[tuple[str, CPPlan, float]] = []
    flats: dict[int, tuple[np.ndarray, ...] | None] = {}  # by id of a tried plan: _flatten's
    layouts: dict[bytes, Any] = {}  # _build_dynamic's placements, by degree vector
    seen: list[np.ndarray] = []
    t_top = float(max(req.tables[int(d)][0][i] for i, d in enumerate(req.d_min.tolist())))
    thetas = [math.inf] + [t_top / 2**k for k in range(1, len(req.tables) + 1)]
    worse = 0
    best_time = math.inf
    best_deg = req.d_min
    work, slots = 0, 0  # layout work so far (DYNAMIC_WORK); the last candidate's GPU slots
    skipped = []
    for theta in thetas:
        deg = _degrees_for(req, theta)
        if any(np.array_equal(deg, s) for s in seen):
            continue
        seen.append(deg)
        # (its GPU slots at least the last candidate's: higher degrees take more slots)
        if seen[1:] and work + _ranges(deg) + slots > DYNAMIC_WORK:
            skipped.append(f"degrees raised further (the work budget DYNAMIC_WORK = "
                           f"{DYNAMIC_WORK:,} of seqbalance.planning.context_parallel)")
            break
        # Candidates are compared unrefined; the winner gets the slot refinement below.
        built = _build_dynamic(req, deg, refine=False, layouts=layouts)
        work += _ranges(deg)
        if built is None:
            continue
        p, flats[id(p)] = built
        slots = req.world * p.num_micro_batches
        work += slots
        t = _step(p, req.sync, flats[id(p)])
        label = (
            "smallest fitting degrees"
            if math.isinf(theta)
            else (f"degrees raised until each piece costs <= {theta:.4g}")
        )
        tried.append((label, p, t))
        if t < best_time:
            best_time, worse, best_deg = t, 0, deg
        else:
            worse += 1
            if worse >= 2:  # raising further keeps costing more: stop
                break
    best_units = _ranges(best_deg) + max(
        (req.world * p.num_micro_batches for _, p, t in tried if t == best_time), default=0
    )
    if tried and work + best_units > DYNAMIC_WORK:
        skipped.append("the slot refinement of the best degree candidate (DYNAMIC_WORK)")
    elif tried:
        built = _build_dynamic(req, best_deg, refine=True, layouts=layouts)
        if built is not None:
            refined, flats[id(built[0])] = built
            t = _step(refined, req.sync, flats[id(refined)])
            k = next(k for k, (_, _, tt) in enumerate(tried) if tt == best_time)
            if t <= best_time:
                tried[k] = (tried[k][0], refined, t)
                best_time = t
    # The baselines' layouts are candidates too, unless a bound shows they cannot win.
    static_deg = np.full(req.n, req.cp_size, dtype=np.int64)
    if best_time <= _fixed_bound(req, static_deg):
        skipped.append("the static-CP layout (its bound is no lower)")
    else:
        base = _static_base(req)
        if not isinstance(base, str) and _static_step(req, base) <= best_time * (1 + 1e-9):
            p, flats[id(p)] = _static_layout(req, base, "seqbalance")
            if req.allow_empty or all(sl for gpu in p.pieces for sl in gpu):
                tried.append(("the static-CP layout", p, _step(p, req.sync, flats[id(p)])))
    if not req.baselines:
        skipped.append("the Megatron-style layout (baselines=False)")
    elif best_time <= _fixed_bound(req, megatron_degrees(req)):
        skipped.append("the Megatron-style layout (its bound is no lower)")
    else:
        p, flats[id(p)] = megatron_cp_flat(req)
        m = p.num_micro_batches
        # Megatron packs into as few slots as it can: it knows no min_micro_batches/multiple.
        keeps_count = m >= req.m_min and m % req.mult == 0
        if keeps_count and (req.allow_empty or all(sl for gpu in p.pieces for sl in gpu)):
            tried.append(("the Megatron-style layout", p, _step(p, req.sync, flats[id(p)])))
    if not tried:
        raise ValueError(
            f"{req.n} sequences cannot give each of {req.world} GPUs x "
            f"{req.m_start()} micro-batches a piece; lower dp_size or cp_size, raise "
            "max_tokens, or pass allow_empty=True to allow (marked) empty micro-batches"
        )
    k = min(range(len(tried)), key=lambda x: (tried[x][2], tried[x][1].num_micro_batches, x))
    label, best, t = tried[k]
    flat = flats.get(id(best))
    deg = best.degrees() if flat is None else _degrees(
        flat, best.num_sequences, best.world_size, best.num_micro_batches)
    hist = ", ".join(
        f"d={d}: {int((deg == d).sum())}" for d in _powers(req.cp_size) if (deg == d).any()
    )
    others = "; ".join(f"{lab}: {tt:.6g}" for lab, _, tt in tried if lab != label)
    notes = [f"dynamic CP: {label} gave the lowest simulated {req.sync} step ({hist})"]
    if others:
        notes.append(f"other candidates' steps: {others}")
    if skipped:
        notes.append("not built: " + "; ".join(skipped))
    notes.extend(n for n in best.notes if n not in notes)
    best.cp, best.strategy, best.notes = "dynamic", "seqbalance", tuple(notes)
    return best


def plan_cp_spec(lengths: Any, spec: Any, replicas: Callable[..., Any]) -> CPPlan:
    """Plan a ``dp_size x cp_size`` mesh with context parallelism (module docstring).

    :func:`seqbalance.plan` and :func:`seqbalance.planning.planner.plan_cp` call this for
    ``cp_size > 1``, with the request as a checked
    :class:`~seqbalance.planning.request.PlanSpec` and the planner of static CP's replicas
    (``replicas``, :func:`seqbalance.plan` without its pipeline count search; it sits above
    this module). The options, by their flat names:

    Other Parameters
    ----------------
    lengths, dp_size, max_tokens, sync, min_micro_batches, micro_batch_multiple, allow_empty
        As in :func:`seqbalance.plan`; ``max_tokens`` is per GPU.
    cp_size : int
        GPUs per data-parallel replica, a power of two; the largest CP degree.
    cp : {"static", "dynamic"}
        One degree (``cp_size``) for all sequences, or a degree per sequence.
    cost : optional
        The sequence cost model (None: tokens); not per-sequence numbers.
    cp_cost : optional
        Communication parameters: None (free), a dict of
        :class:`~seqbalance.costs.context_parallel.ContextParallelCost` keyword arguments
        (``bandwidth``, ``cost_per_second``, ``overlap``, ...), or a ready instance.
    size, groups, extra_micro_batches, order, oversized, sequences_per_micro_batch
        Static CP only (dynamic CP refuses them other than their defaults): as in
        :func:`seqbalance.plan`, applied to the replicas, each of which counts as one
        rank, with a sequence's largest piece as its tokens. So ``size`` counts the
        sequences (or groups) of a replica, ``groups`` keeps a group on one replica,
        ``order`` orders a replica's slots, and ``oversized="alone"`` runs a sequence
        whose largest piece exceeds ``max_tokens`` alone in its slot (``violations()``
        counts its GPUs over the cap).
    baselines : bool
        As in :func:`seqbalance.plan`: False keeps the baselines' plans out of the
        candidates (the replica plan of static CP, and the Megatron-style layout that
        ``"dynamic"`` otherwise tries).
    pp_size, schedule, virtual_stages, pp_comm
        Static CP only: each replica is a pipeline of ``pp_size`` stages, each stage a CP
        ring of ``cp_size`` GPUs running the same pieces
        (:mod:`seqbalance.planning.cp_pipeline`). As in :func:`seqbalance.plan`;
        ``pp_comm`` is per token one GPU sends to the next stage. The replicas are
        planned for the pipeline and without it, each candidate's slots ordered for the
        lowest simulated pipeline step, and the faster kept;
        :meth:`CPPlan.simulate_pipeline` simulates it. ``order`` and
        ``sequences_per_micro_batch`` are refused with them.

    Returns
    -------
    CPPlan

    Raises
    ------
    ValueError
        Bad arguments; a sequence whose largest piece exceeds ``max_tokens`` even at
        ``d = cp_size`` (named; unless ``oversized="alone"``); too few sequences for
        non-empty micro-batches; a rule the replicas cannot meet (as :func:`seqbalance.plan`
        says it, after ``"static CP: "``).
    """
    kw = spec.keywords()
    with exact_work_pool(exact_pool(spec.effort)), work_meter():  # (plan()'s, when it called this)
        req = _validate(
            lengths,
            kw["dp_size"],
            kw["max_tokens"],
            kw["cp_size"],
            kw["cp"],
            kw["cost"],
            kw["cp_cost"],
            kw["sync"],
            kw["min_micro_batches"],
            kw["micro_batch_multiple"],
            kw["allow_empty"],
            kw["baselines"],
            {name: kw[name] for name in REPLICA_RULES},
            {name: kw[name] for name in ("pp_size", "schedule", "virtual_stages", "pp_comm")},
            replicas,
        )
        req.effort = spec.effort
        if kw["cp"] == "static":
            p = _static(req)
            if isinstance(p, str):
                raise NotedError(as_note(p).after("static CP: "))
            return p
        return _dynamic(req)
