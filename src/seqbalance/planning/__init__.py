"""Layer 2: plans of ranks x micro-batches under a trainer's constraints, and their evidence.

Combines a cost model (:mod:`seqbalance.costs`) with the partitioner
(:mod:`seqbalance.partitioning`) under a token capacity per micro-batch, equal micro-batch
counts on every rank, count multiples and the sync model.

- :mod:`.planner`: :func:`plan` (and ``plan_cp``, for a mesh with context parallelism).
- :mod:`.request`: the request as checked values: :class:`Mesh`, :class:`Capacity`,
  :class:`MicroBatching`, :class:`RankRules`, and :class:`PlanSpec` holding them.
- :mod:`.plans`: :class:`Plan` (reorder and restore data, JSON, stats, violations).
- :mod:`.simulation`: :func:`simulate` and the one step-time lower bound.
- :mod:`.baselines`: the strategies other frameworks use, for comparison.
- :mod:`.pipeline`: pipeline-parallel schedules (GPipe, 1F1B, interleaved), their
  simulation and lower bound; :mod:`.pipeline_orders` micro-batch orders (baselines and the
  planner's search); :mod:`.pipeline_plans` plans of DP replicas x pipelines.
- :mod:`.context_parallel`, :mod:`.cp_plans`, :mod:`.cp_baselines`: context parallelism
  (``plan(..., cp_size=N)``), :class:`CPPlan` with its pieces, and the static / Megatron-style
  CP baselines.
- ``_packing``, ``_slots``, ``_grouping``, ``_costing``: bin packing under the capacity,
  FSDP slot filling, bin totals and cost resolution, on validated arrays.
"""

from __future__ import annotations

from ._ordering import inverse_permutation
from .baselines import BASELINES
from .cp_plans import CPPlan
from .planner import plan
from .plans import Plan
from .request import Capacity, Mesh, MicroBatching, PlanSpec, RankRules
from .simulation import Simulation, simulate, step_time_lower_bound

__all__ = [
    "BASELINES",
    "CPPlan",
    "Capacity",
    "Mesh",
    "MicroBatching",
    "Plan",
    "PlanSpec",
    "RankRules",
    "Simulation",
    "inverse_permutation",
    "plan",
    "simulate",
    "step_time_lower_bound",
]
