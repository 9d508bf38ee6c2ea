"""Pipelines whose stages run static context parallelism: ``dp x pp x cp`` meshes.

The mesh
--------
Each of ``dp`` data-parallel replicas is a pipeline of ``pp`` stages, and each stage is a CP
ring of ``cp_size`` GPUs (Megatron-LM's ``dp x pp x cp`` layout; tensor parallelism, if
any, sits inside a GPU here). A static CP plan (:class:`~seqbalance.planning.cp_plans.CPPlan`
with ``cp="static"``) gives each replica whole micro-batches, every sequence split over its
``cp_size`` GPUs. ``pieces[r * cp_size + k]`` is what CP position ``k`` of replica ``r``
holds, at every stage: a stage runs the same pieces through its share of the layers.

The phases of a slot
--------------------
Each piece's cost (:class:`~seqbalance.costs.context_parallel.ContextParallelCost`) splits
into forward and backward as a sequence's does (:mod:`seqbalance.costs.phases`: linear terms
with ``backward_matmul``, attention with ``backward_attention``); of the exposed ring
transfers the forward carries ``1 / comm_passes`` (``ContextParallelCost._phases``). The ring
runs inside every layer, so the ``cp_size`` GPUs of a stage advance together: replica
``r``'s slot ``j`` costs the slowest of its GPUs, forward and backward apart::

    F[r, j] = max_k (forward share of per_microbatch + sum of GPU k's piece forwards)
    B[r, j] = max_k (backward share of per_microbatch + sum of GPU k's piece backwards)
    C[r, j] = pp_comm x max_k (tokens GPU k holds)      # its activations to the next stage

These ``(dp, m)`` arrays are micro-batches to the pipeline simulator
(:mod:`seqbalance.planning.pipeline_plans`: ``ddp`` replicas meet once per step, ``fsdp``
operations run in lockstep across replicas). A replica's slots may run in any order as long
as its ``cp_size`` GPUs keep the same one (under ``fsdp`` every replica keeps it).

Planning
--------
:func:`seqbalance.plan` with ``cp_size > 1``, ``cp="static"`` and ``pp_size > 1`` plans the
replicas as a pipelined plan over ranks (each sequence's slowest piece as its cost, split
with ``backward_matmul``: a proxy), and also without the pipeline (at the schedule's count
multiple); it builds both sets of pieces, searches their slot orders on the phases above
(:func:`order_slots`) and keeps the lower simulated step (the second wins now and then
under ``ddp``, by up to a few percent). Dynamic CP gives the GPUs of a replica different
slots and is refused with a pipeline.

JSON: ``CPPlan.to_dict()`` writes ``"pipeline": {"pp_size", "schedule", "virtual_stages",
"comm_per_token"}`` (no per-sequence costs: the phases follow from the pieces and
``cp_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._notes import Note, as_text
from .._validate import as_weights, check_choice, check_positive_int
from ..costs.context_parallel import ContextParallelCost
from ._pieces import _piece_entries
from .pipeline import PipelineSpec, check_pipeline
from .pipeline_orders import BUDGET, ORDERS, best_orders, search_kind
from .pipeline_plans import PlanPipelineSimulation, _lockstep, simulate_phases
from .simulation import SYNC_MODELS

__all__ = [
    "CPPipelineSetup",
    "as_pipeline",
    "baseline_order",
    "order_phases",
    "order_slots",
    "permute_slots",
    "reorder_cp",
    "simulate_cp_pipeline",
    "slot_phases",
]


@dataclass(frozen=True)
class CPPipelineSetup:
    """The pipeline of a static CP plan: layout and per-token transfer time between stages.

    The forward and backward costs come from the plan's pieces and ``cp_cost`` (module
    docstring), so unlike :class:`~seqbalance.planning.pipeline_plans.PipelineSetup` this
    holds no per-sequence costs.
    """

    spec: PipelineSpec
    comm_per_token: float = 0.0

    def __post_init__(self) -> None:
        # Checked here, not only in from_dict: a setup built by hand must be one that its
        # plan's own JSON can load again.
        if not isinstance(self.spec, PipelineSpec):
            raise ValueError(
                "CPPipelineSetup.spec must be a PipelineSpec (seqbalance.planning.pipeline."
                f"check_pipeline), got {type(self.spec).__name__}"
            )
        if self.spec.pp_size == 1:
            raise ValueError(
                "pipeline.pp_size is 1: a plan without pipeline stages has no pipeline; drop "
                "the key, or give pp_size > 1"
            )
        comm = as_weights([self.comm_per_token], "pipeline.comm_per_token")[0]
        object.__setattr__(self, "comm_per_token", float(comm))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :meth:`CPPlan.to_dict` writes as ``"pipeline"``."""
        return {**self.spec.to_dict(), "comm_per_token": self.comm_per_token}

    @classmethod
    def from_dict(cls, data: Any) -> CPPipelineSetup:
        """Inverse of :meth:`to_dict`; raises ValueError naming a bad or unknown key."""
        if not isinstance(data, dict):
            raise ValueError(
                "pipeline must be an object with pp_size, schedule, virtual_stages and "
                f"comm_per_token, got {type(data).__name__}"
            )
        known = {"pp_size", "schedule", "virtual_stages", "comm_per_token"}
        if set(data) - known:
            raise ValueError(
                f"pipeline has keys {sorted(set(data) - known)} a CP plan does not take (its "
                "forward costs come from its pieces); it takes "
                f"{', '.join(sorted(known))}"
            )
        try:
            spec = check_pipeline(
                data.get("pp_size"), data.get("schedule", "1f1b"), data.get("virtual_stages", 1)
            )
        except ValueError as exc:
            raise ValueError(f"pipeline: {exc}") from None
        return cls(spec, data.get("comm_per_token", 0.0))


def _gpu_phases(
    pieces: Sequence[Sequence[Sequence[Any]]], lengths: np.ndarray, cpc: ContextParallelCost,
    flat: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(world, m)`` forward, backward and tokens of every GPU's slot (per-micro-batch cost
    included, also for an empty slot: a dummy step)."""
    world = len(pieces)
    m = max((len(g) for g in pieces), default=0)
    f0, b0 = cpc.microbatch_phases()
    fwd = np.full((world, m), f0)
    bwd = np.full((world, m), b0)
    toks = np.zeros((world, m))
    kgpu, kslot, length, tok, sq, d = _piece_entries(pieces, lengths, cpc, flat)
    if kgpu.size:
        pf, pb = cpc._phases(length, tok, sq, d)
        np.add.at(fwd, (kgpu, kslot), pf)
        np.add.at(bwd, (kgpu, kslot), pb)
        np.add.at(toks, (kgpu, kslot), tok)
    return fwd, bwd, toks


def slot_phases(
    pieces: Sequence[Sequence[Sequence[Any]]],
    lengths: np.ndarray,
    cpc: ContextParallelCost,
    cp_size: int,
    comm_per_token: float = 0.0,
    flat: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(replicas, m)`` forward, backward and stage-to-stage transfer time of every
    replica's slot: the slowest of its ``cp_size`` GPUs (module docstring). ``flat``: the
    pieces' ranges as ``cp_plans._flatten`` gives them, where the caller has them.

    Raises
    ------
    ValueError
        The GPUs do not all have the same number of slots.
    """
    m = max((len(g) for g in pieces), default=0)
    if any(len(g) != m for g in pieces):
        raise ValueError("every GPU needs the same number of slots for a pipeline")
    cp_size = check_positive_int(cp_size, "cp_size")
    if len(pieces) % cp_size:
        raise ValueError(
            f"cp_size={cp_size} does not divide the {len(pieces)} GPUs of the pieces into "
            "replicas; give the plan's cp_size"
        )
    fwd, bwd, toks = _gpu_phases(pieces, lengths, cpc, flat)
    shape = (len(pieces) // cp_size, cp_size, m)
    return (
        fwd.reshape(shape).max(axis=1),
        bwd.reshape(shape).max(axis=1),
        toks.reshape(shape).max(axis=1) * comm_per_token,
    )


def _permute(pieces: list[Any], orders: np.ndarray, cp_size: int, sync: str) -> list[Any]:
    """Each replica's slots (fsdp: every replica's) in the order ``orders`` gives."""
    out = []
    for g, gpu in enumerate(pieces):
        perm = orders[0 if sync == "fsdp" else g // cp_size].tolist()
        out.append([gpu[j] for j in perm])
    return out


def order_phases(
    f: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    sync: str,
    setup: CPPipelineSetup,
    budget: int = BUDGET,
) -> tuple[np.ndarray, float]:
    """The run orders of :func:`order_slots` from the slots' ``(replicas, m)`` phases
    (:func:`slot_phases`), and the simulated pipeline step in those orders (what
    :func:`simulate_cp_pipeline` gives the permuted pieces). ``budget``: simulated
    operations the order search may spend (:func:`~.pipeline_orders.best_orders`)."""
    check_choice(sync, "sync", SYNC_MODELS)
    if f.shape[1] == 0:
        return np.zeros((1 if sync == "fsdp" else f.shape[0], 0), dtype=np.int64), 0.0
    if sync == "fsdp":
        f, b, c = _lockstep(f, b, c)
    orders, times = best_orders(
        f, b, c if setup.comm_per_token else None, setup.spec, budget=budget
    )
    return orders, float(times.max())


def permute_slots(pieces: list[Any], orders: np.ndarray, cp_size: int, sync: str) -> list[Any]:
    """Each replica's slots (fsdp: every replica's) in the run order ``orders`` gives (as
    :func:`order_phases` returns them)."""
    if not orders.shape[-1]:
        return pieces
    return _permute(pieces, orders, cp_size, sync)


def order_slots(
    pieces: list[Any],
    lengths: np.ndarray,
    cpc: ContextParallelCost,
    cp_size: int,
    sync: str,
    setup: CPPipelineSetup,
) -> list[Any]:
    """The pieces with each replica's slots (fsdp: all replicas' slots alike) in the run
    order that minimises the simulated pipeline step
    (:func:`~seqbalance.planning.pipeline_orders.best_orders`: exact over all orders up to
    ``EXACT_LIMIT`` slots where that fits its work budget, a local search beyond)."""
    check_choice(sync, "sync", SYNC_MODELS)
    f, b, c = slot_phases(pieces, lengths, cpc, cp_size, setup.comm_per_token)
    orders, _ = order_phases(f, b, c, sync, setup)
    return permute_slots(pieces, orders, cp_size, sync)


def simulate_cp_pipeline(
    pieces: Sequence[Sequence[Sequence[Any]]],
    lengths: np.ndarray,
    cpc: ContextParallelCost,
    cp_size: int,
    sync: str,
    setup: CPPipelineSetup,
    flat: tuple[np.ndarray, ...] | None = None,
) -> PlanPipelineSimulation:
    """The simulated pipeline step of a static CP plan's pieces, in their slot order."""
    f, b, c = slot_phases(pieces, lengths, cpc, cp_size, setup.comm_per_token, flat)
    return simulate_phases(f, b, c, sync, setup.spec)


def baseline_order(pieces: list[Any], lengths: np.ndarray, cpc: ContextParallelCost, cp_size: int,
                   sync: str, order: str) -> list[Any]:
    """The pieces with each replica's slots (fsdp: all replicas' slots alike) in a baseline
    order of :data:`~seqbalance.planning.pipeline_orders.ORDERS`, as
    :func:`~seqbalance.planning.pipeline_plans.reorder` does without CP: first by smallest
    sequence index (fsdp: over the replicas), then by each slot's training cost (fsdp: its
    heaviest replica's)."""
    check_choice(sync, "sync", SYNC_MODELS)
    first = _first_indices(pieces, cp_size)
    if first.size == 0:
        return pieces
    f, b, _ = slot_phases(pieces, lengths, cpc, cp_size)
    return _permute(pieces, _baseline_orders(first, f, b, sync, order), cp_size, sync)


def _first_indices(pieces: list[Any], cp_size: int) -> np.ndarray:
    """``(replicas, m)`` smallest sequence index of each replica's slot (int64 max: empty)."""
    big = np.iinfo(np.int64).max
    return np.array([[min((p[0] for p in slot), default=big) for slot in pieces[g]]
                     for g in range(0, len(pieces), cp_size)], dtype=np.int64)  # fmt: skip


def _baseline_orders(
    first: np.ndarray, f: np.ndarray, b: np.ndarray, sync: str, order: str
) -> np.ndarray:
    """The run orders of :func:`baseline_order` from the slots' first sequence indices and
    ``(replicas, m)`` phases in their current order."""
    if sync == "fsdp":
        key = first.min(axis=0)
        start = np.lexsort((np.arange(key.size), key))[None]
    else:
        start = np.stack([np.lexsort((np.arange(row.size), row)) for row in first])
    start = np.broadcast_to(start, f.shape)
    w = np.take_along_axis(f, start, axis=1) + np.take_along_axis(b, start, axis=1)
    if sync == "fsdp":
        w = w.max(axis=0)[None]
    orders = np.stack([ORDERS[order](row) for row in w])
    return np.take_along_axis(start[: orders.shape[0]], orders, axis=1)


def reorder_cp(plan: Any, order: str) -> Any:
    """A copy of a pipelined static CP plan with its slots in a baseline order (what
    :func:`~seqbalance.planning.pipeline_plans.reorder` returns for a CPPlan)."""
    pieces = baseline_order([list(g) for g in plan.pieces], plan.lengths, plan.cp_cost,
                            plan.cp_size, plan.sync, order)  # fmt: skip
    out = type(plan)._from_validated_pieces(
        pieces, plan.lengths, max_tokens=plan.max_tokens, cp_size=plan.cp_size, cp=plan.cp,
        cp_cost=plan.cp_cost, replicas=plan.replicas, sync=plan.sync,
        strategy=f"{plan.strategy}+{order}", notes=plan.notes, size=plan.size,
        groups=plan.groups,
    )  # fmt: skip
    out.pipeline = plan.pipeline
    return out


def pipeline_note(
    pieces: list[Any], lengths: np.ndarray, cpc: ContextParallelCost, cp_size: int, sync: str,
    setup: CPPipelineSetup, phases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> str:
    """What the order search did and gained, as :func:`~.pipeline_plans.finish_plan` says
    it for plans without CP. ``phases``: :func:`slot_phases` of ``pieces`` (with the
    setup's transfer time), where the caller has them."""
    spec = setup.spec
    m = max((len(g) for g in pieces), default=0)
    if phases is None:
        phases = slot_phases(pieces, lengths, cpc, cp_size, setup.comm_per_token)
    f, b, c = phases
    sim = simulate_phases(f, b, c, sync, spec)
    layout = "{schedule}, {@pp_size:{pp_size}}" + (
        ", {@virtual_stages:{virtual_stages}}" if spec.virtual_stages > 1 else ""
    )
    fields = {"schedule": spec.schedule, "pp_size": spec.pp_size,
              "virtual_stages": spec.virtual_stages, "sync": sync, "cp_size": cp_size}
    if sim.step_time <= 0:
        return as_text(Note("pipeline", fields,
                            "pipeline (" + layout + ", {sync}, static CP): every slot costs 0"))
    orders = _baseline_orders(_first_indices(pieces, cp_size), f, b, sync, "light-ends")
    orders = np.broadcast_to(orders, f.shape)
    fo, bo, co = (np.take_along_axis(x, orders, axis=1) for x in (f, b, c))
    verl = simulate_phases(fo, bo, co, sync, spec)
    what = "slots" if sync == "fsdp" else "slots of each replica"
    how = search_kind(spec, m)
    return as_text(Note(
        "pipeline",
        {**fields, "what": what, "how": how, "step": sim.step_time, "gap": sim.gap,
         "bubble": sim.bubble_fraction, "verl": verl.step_time / sim.step_time - 1},
        "pipeline (" + layout + ", {sync}, static CP over {@cp_size:{cp_size}} GPUs a stage): "
        "{what} run in the order with the lowest simulated step ({how}), each slot as slow as "
        "its slowest GPU; step {step:.6g}, {gap:+.2%} vs the pipeline lower bound, "
        "bubble {bubble:.1%}; verl's light-ends order of the same slots: {verl:+.2%}",
    ))  # fmt: skip


def as_pipeline(plan: Any, setup: CPPipelineSetup) -> Any:
    """A copy of the static CP plan ``plan`` run as the pipeline ``setup``, its slots in
    their own order (a plan made without the pipeline, as a user gets it without
    seqbalance's pipeline planner).

    Raises
    ------
    ValueError
        ``plan`` is not static CP with aligned replicas, or its slot count does not suit
        the schedule (interleaved: a multiple of ``pp_size``).
    """
    if getattr(plan, "pieces", None) is None:  # (a CPPlan; this module sits below it)
        raise ValueError(
            f"plan must be a static CPPlan (seqbalance.plan(..., cp_size=C, cp='static')), got "
            f"{type(plan).__name__}; a Plan without CP takes pp_size= in seqbalance.plan"
        )
    if not isinstance(setup, CPPipelineSetup):
        raise ValueError(f"setup must be a CPPipelineSetup, got {type(setup).__name__}")
    return type(plan)(plan.pieces, plan.lengths, max_tokens=plan.max_tokens, cp_size=plan.cp_size,
                  cp=plan.cp, cp_cost=plan.cp_cost, dp_size=plan.dp_size, sync=plan.sync,
                  strategy=plan.strategy, notes=plan.notes, size=plan.size, groups=plan.groups,
                  pipeline=setup)  # fmt: skip
