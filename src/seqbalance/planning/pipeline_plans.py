"""Plans under pipeline parallelism: data-parallel replicas, each a pipeline of ``p`` stages.

How replicas synchronise with pipelines (the DP sync model on top of
:mod:`seqbalance.planning.pipeline`):

``ddp``
    every replica runs its own pipeline over its own micro-batches and the replicas meet
    once per step (the gradient all-reduce), so the step is the slowest replica's
    pipeline: ``max_r pipeline(r)``. Each replica may run its micro-batches in its own order.
``fsdp``
    with FSDP/ZeRO-3 inside each stage, the stage-``s`` ranks of all replicas all-gather
    that stage's parameters for every micro-batch's forward and backward, so every
    operation runs in lockstep across replicas: the slot-``j`` operation of stage ``s``
    lasts as long as the slowest replica's micro-batch ``j``. The step is one pipeline whose
    micro-batch ``j`` costs ``max_r F(r, j)`` forward and ``max_r B(r, j)`` backward. Orders
    permute slots (every replica the same way), which keeps the slots aligned.

A micro-batch's forward is ``forward_c0 + sum of its sequences' forward costs`` (padded:
``count x the largest``), its backward the rest of its training cost, and its transfer time
``comm_per_token x its tokens`` (padded: ``count x longest``) per stage boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from .._notes import Note
from .._validate import as_weights, check_choice
from ..partitioning.stats import relative_gap
from ._grouping import bin_summer
from .pipeline import (
    PipelineSimulation,
    PipelineSpec,
    check_pipeline,
    graph,
    pipeline_lower_bound,
    simulate_pipeline,
)
from .pipeline_orders import ORDERS, best_orders, search_kind
from .simulation import SYNC_MODELS

if TYPE_CHECKING:
    from .plans import Plan

__all__ = [
    "PipelineSetup",
    "PlanPipelineSimulation",
    "finish_plan",
    "order_grid",
    "pipeline_setup",
    "reorder",
    "simulate_phases",
    "simulate_plan_pipeline",
]


@dataclass(frozen=True)
class PipelineSetup:
    """What a plan needs to be simulated as a pipeline: layout, forward costs, transfers."""

    spec: PipelineSpec
    forward: np.ndarray  # per-sequence forward cost; backward = training cost - forward
    forward_c0: float  # forward share of the per-micro-batch cost
    comm_per_token: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = self.spec.to_dict()
        out.update(
            forward_costs=self.forward.tolist(),
            forward_per_microbatch=self.forward_c0,
            comm_per_token=self.comm_per_token,
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], n: int) -> PipelineSetup:
        spec = check_pipeline(
            data.get("pp_size"), data.get("schedule", "1f1b"), data.get("virtual_stages", 1)
        )
        fwd = as_weights(data.get("forward_costs", []), "pipeline.forward_costs")
        if fwd.shape[0] != n:
            raise ValueError(
                f"pipeline.forward_costs has {fwd.shape[0]} entries but the plan has {n} sequences"
            )
        scalars = [
            float(as_weights([data.get(key, 0.0)], f"pipeline.{key}")[0])
            for key in ("forward_per_microbatch", "comm_per_token")
        ]
        return cls(spec, fwd, *scalars)

    def check_costs(self, costs: np.ndarray, per_microbatch: float) -> None:
        """Refuse forward costs above the training costs they are part of (the backward,
        their difference, would be negative), naming the entry."""
        # A relative slack for the rounding of the forward/backward split.
        over = self.forward > costs + 1e-9 * np.abs(costs)
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ValueError(
                f"pipeline.forward_costs[{i}] = {float(self.forward[i])!r} exceeds the "
                f"sequence's training cost costs[{i}] = {float(costs[i])!r}; the forward is "
                "part of it (backward = cost - forward)"
            )
        if self.forward_c0 > per_microbatch * (1 + 1e-9):
            raise ValueError(
                f"pipeline.forward_per_microbatch = {self.forward_c0!r} exceeds "
                f"per_microbatch = {per_microbatch!r}; it is the forward share of it"
            )


def pipeline_setup(
    lengths: np.ndarray,
    cost: Any,
    pp_size: Any,
    schedule: Any,
    virtual_stages: Any,
    pp_comm: Any = 0.0,
) -> PipelineSetup | None:
    """Validate the pipeline keywords of :func:`seqbalance.plan`; None when ``pp_size == 1``.

    The forward/backward split is :func:`seqbalance.costs.phases.phase_costs`, with the
    ratios a cost model carries as ``backward_matmul`` / ``backward_attention`` attributes
    (default 2 and 2.5).
    """
    spec = check_pipeline(pp_size, schedule, virtual_stages)
    comm = float(as_weights([pp_comm], "pp_comm")[0])
    if spec.pp_size == 1:
        if comm:
            raise ValueError(f"pp_comm={pp_comm!r} needs pp_size > 1 (no stage boundaries)")
        return None
    # A micro-batch's transfer is comm x its tokens; at most all tokens of the batch.
    tokens = float(np.asarray(lengths, dtype=np.float64).sum())
    if not math.isfinite(comm * tokens):
        raise ValueError(
            f"pp_comm={pp_comm!r} times the batch's {tokens:.0f} tokens overflows float64; "
            "give pp_comm (and the cost model) in a larger time unit"
        )
    from ..costs.phases import phase_costs

    fwd, _, f0, _ = phase_costs(lengths, cost)
    return PipelineSetup(spec, fwd, f0, comm)


def micro_batch_phases(
    grid: Sequence[Sequence[Sequence[int]]],
    costs: np.ndarray,
    c0: float,
    lengths: np.ndarray,
    padded: bool,
    setup: PipelineSetup,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dp, m)`` forward, backward and transfer time of every micro-batch of a plan."""
    dp = len(grid)
    m = max((len(r) for r in grid), default=0)
    if any(len(r) != m for r in grid):
        raise ValueError("every replica needs the same number of micro-batches for a pipeline")
    flat = [mb for rank in grid for mb in rank]
    totals = bin_summer(flat, padded=padded)  # one flattening for the three totals
    total = totals(costs) + c0
    fwd = totals(setup.forward) + setup.forward_c0
    toks = totals(lengths).astype(np.float64)
    shape = (dp, m)
    return (
        fwd.reshape(shape),
        (total - fwd).reshape(shape),
        (toks * setup.comm_per_token).reshape(shape),
    )


def _lockstep(f: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
    return f.max(axis=0)[None], b.max(axis=0)[None], c.max(axis=0)[None]


def _first_index_order(grid: list[list[list[int]]], sync: str) -> list[list[list[int]]]:
    """Input order: micro-batches (fsdp: slots) sorted by their smallest sequence index."""
    big = np.iinfo(np.int64).max
    m = len(grid[0]) if grid else 0
    if not m:
        return [list(rank) for rank in grid]
    if any(len(rank) != m for rank in grid):  # (refused later, by micro_batch_phases)
        return [sorted(rank, key=lambda mb: min(mb) if mb else big) for rank in grid]
    flat = [mb for rank in grid for mb in rank]
    sizes = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
    items = np.fromiter(chain.from_iterable(flat), dtype=np.int64, count=int(sizes.sum()))
    first: np.ndarray = np.full(len(flat), big, dtype=np.int64)
    full = np.flatnonzero(sizes)
    if full.size:
        first[full] = np.minimum.reduceat(items, (np.cumsum(sizes) - sizes)[full])
    first = first.reshape(len(grid), m)
    if sync == "fsdp":
        perm = np.argsort(first.min(axis=0), kind="stable").tolist()
        return [[rank[j] for j in perm] for rank in grid]
    orders = np.argsort(first, axis=1, kind="stable").tolist()
    return [[rank[j] for j in o] for rank, o in zip(grid, orders)]


def _apply(grid: list[list[list[int]]], orders: np.ndarray, sync: str) -> list[list[list[int]]]:
    if sync == "fsdp":
        perm = orders[0].tolist()
        return [[rank[j] for j in perm] for rank in grid]
    return [[rank[j] for j in o.tolist()] for rank, o in zip(grid, orders)]


def order_grid(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    c0: float,
    lengths: np.ndarray,
    padded: bool,
    sync: str,
    setup: PipelineSetup,
    quick: bool = False,
) -> list[list[list[int]]]:
    """The planner's order: each replica's micro-batches (fsdp: the slots) in the run order
    that minimises the simulated pipeline step (:func:`~.pipeline_orders.best_orders`).

    ``quick``: only the best starting order, no search (to compare packings cheaply).
    """
    grid = _first_index_order(grid, sync)
    if not grid or not grid[0]:
        return grid
    f, b, c = micro_batch_phases(grid, costs, c0, lengths, padded, setup)
    if sync == "fsdp":
        f, b, c = _lockstep(f, b, c)
    extra = {"exact_limit": 0, "budget": 0} if quick else {}
    orders, _ = best_orders(f, b, c if setup.comm_per_token else None, setup.spec, **extra)
    return _apply(grid, orders, sync)


def pipeline_step_time(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    c0: float,
    lengths: np.ndarray,
    padded: bool,
    sync: str,
    setup: PipelineSetup,
) -> float:
    """Simulated pipeline step of a plan's grid in its current order (validated inputs)."""
    if not grid or not grid[0]:
        return 0.0
    f, b, c = micro_batch_phases(grid, costs, c0, lengths, padded, setup)
    if sync == "fsdp":
        f, b, c = _lockstep(f, b, c)
    return float(graph(setup.spec, f.shape[1]).step_times(f, b, c).max())


@dataclass(frozen=True)
class PlanPipelineSimulation:
    """The simulated pipeline step of a plan.

    Attributes
    ----------
    sync : str
        ``"ddp"`` (replicas meet once per step) or ``"fsdp"`` (lockstep operations).
    step_time : float
        The slowest replica's pipeline (ddp) or the lockstep pipeline (fsdp).
    replica_times : np.ndarray
        Each replica's own pipeline time (fsdp: all equal to the step).
    slowest : PipelineSimulation
        The pipeline that sets the step (fsdp: the lockstep pipeline), with per-operation
        start and end, per-stage busy and idle time and the bubble fraction.
    lower_bound : float
        No order of these micro-batches beats it: the largest
        :func:`~.pipeline.pipeline_lower_bound` over replicas (fsdp: of the lockstep costs).
    gap : float
        ``step_time / lower_bound - 1``.
    """

    sync: str
    step_time: float
    replica_times: np.ndarray
    slowest: PipelineSimulation
    lower_bound: float
    gap: float

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the pipeline that sets the step."""
        return self.slowest.bubble_fraction


def simulate_plan_pipeline(
    grid: list[list[list[int]]],
    costs: np.ndarray,
    c0: float,
    lengths: np.ndarray,
    padded: bool,
    sync: str,
    setup: PipelineSetup,
) -> PlanPipelineSimulation:
    """Simulate the pipeline step of a plan (see the module docstring for the sync models)."""
    f, b, c = micro_batch_phases(grid, costs, c0, lengths, padded, setup)
    return simulate_phases(f, b, c, sync, setup.spec)


def simulate_phases(
    f: np.ndarray, b: np.ndarray, c: np.ndarray, sync: str, spec: PipelineSpec
) -> PlanPipelineSimulation:
    """:func:`simulate_plan_pipeline` from ``(replicas, m)`` forward, backward and transfer
    times of every micro-batch, in run order."""
    check_choice(sync, "sync", SYNC_MODELS)  # a typo would run the ddp model silently
    kw: dict[str, Any] = {"schedule": spec.schedule, "virtual_stages": spec.virtual_stages}
    replicas = len(f)
    if sync == "fsdp":
        f, b, c = _lockstep(f, b, c)
    m = f.shape[1]
    # Every replica's time in one vectorised pass; the full timeline of the slowest only.
    times = graph(spec, m).step_times(f, b, c) if m else np.zeros(len(f))
    r = int(np.argmax(times)) if times.size else 0
    slowest = simulate_pipeline(f[r], b[r], spec.pp_size, comm=c[r], **kw)
    bound = max(
        pipeline_lower_bound(f[k], b[k], spec.pp_size, comm=c[k], **kw) for k in range(len(f))
    )
    step = float(times.max()) if times.size else 0.0
    if sync == "fsdp":
        times = np.full(replicas, step)
    return PlanPipelineSimulation(
        sync, step, times, slowest, bound, float(relative_gap(step, bound))
    )


def finish_plan(plan: Plan, setup: PipelineSetup, user_multiple: int) -> Plan:
    """The planner's last step with ``pp_size > 1``: search the chosen plan's run order and
    say in ``plan.notes`` what was done and what it gained.

    Packings were compared in their best starting order (cheap); the search runs once, on
    the winner. ``user_multiple`` is the caller's ``micro_batch_multiple`` (to say when the
    schedule raised it).
    """
    spec = setup.spec
    plan.pipeline = setup
    args = (plan.costs, plan.per_microbatch, plan.lengths, plan.padded, plan.sync, setup)
    plan.micro_batches = order_grid([list(r) for r in plan.micro_batches], *args)
    m = plan.num_micro_batches
    notes = []
    if spec.count_multiple > 1 and user_multiple % spec.count_multiple:
        raised = user_multiple * spec.count_multiple // np.gcd(user_multiple, spec.count_multiple)
        notes.append(Note(
            "multiple_raised",
            {"pp_size": spec.pp_size, "multiple": user_multiple, "raised": raised},
            "{@schedule:'interleaved'} runs a multiple of {@pp_size:{pp_size}} micro-batches: "
            "{@micro_batch_multiple:{multiple}} raised to {raised}",
        ))  # fmt: skip
    if m:
        sim = simulate_plan_pipeline(plan.micro_batches, *args)
        verl = simulate_plan_pipeline(reorder(plan, "light-ends").micro_batches, *args)
        layout = "{schedule}, {@pp_size:{pp_size}}" + (
            ", {@virtual_stages:{virtual_stages}}" if spec.virtual_stages > 1 else ""
        )
        what = "slots" if plan.sync == "fsdp" else "micro-batches of each replica"
        how = search_kind(setup.spec, m)
        fields = {"schedule": spec.schedule, "pp_size": spec.pp_size,
                  "virtual_stages": spec.virtual_stages, "sync": plan.sync, "what": what,
                  "how": how, "step": sim.step_time, "gap": sim.gap,
                  "bubble": sim.bubble_fraction}  # fmt: skip
        notes.append(Note(
            "pipeline", {**fields, "verl": verl.step_time / sim.step_time - 1},
            "pipeline (" + layout + ", {sync}): {what} run in the order with the lowest "
            "simulated step ({how}); step {step:.6g}, {gap:+.2%} vs the "
            "pipeline lower bound, bubble {bubble:.1%}; verl's light-ends "
            "order of the same micro-batches: {verl:+.2%}",
        )
            if sim.step_time > 0
            else Note("pipeline", fields,
                      "pipeline (" + layout + ", {sync}): every micro-batch costs 0")
        )  # fmt: skip
    plan.notes = tuple(plan.notes) + tuple(notes)
    return plan


def reorder(plan: Plan, order: str) -> Plan:
    """A copy of a pipelined plan with its micro-batches in a baseline order (or ``"input"``);
    a static CP plan's slots move on all the GPUs of a replica (:func:`.cp_pipeline.reorder_cp`).

    ``order`` is a name of :data:`~.pipeline_orders.ORDERS`; each replica's micro-batches
    (fsdp: the slots, by their heaviest micro-batch) are put in input order (by smallest
    sequence index), then ordered by training cost as the baseline does.
    """
    if plan.pipeline is None:
        raise ValueError("reorder needs a plan made with pp_size > 1 (plan.pipeline is None)")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}; got {order!r}")
    if hasattr(plan, "pieces"):  # a static CP plan: its slots move on all its GPUs
        reordered: Plan = cast(Any, plan)._pipeline_reordered(order)  # (CPPlan's own)
        return reordered
    grid = _first_index_order([list(r) for r in plan.micro_batches], plan.sync)
    f, b, _ = micro_batch_phases(
        grid, plan.costs, plan.per_microbatch, plan.lengths, plan.padded, plan.pipeline
    )
    w = f + b
    if plan.sync == "fsdp":
        w = w.max(axis=0)[None]
    orders = np.stack([ORDERS[order](row) for row in w]) if w.size else np.zeros((len(w), 0), int)
    out = type(plan).__new__(type(plan))
    out.__dict__.update(plan.__dict__)
    out.micro_batches = _apply(grid, orders, plan.sync) if w.size else grid
    out.strategy = f"{plan.strategy}+{order}"
    return out
