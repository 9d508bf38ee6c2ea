"""seqbalance: balance variable-length sequences across data-parallel ranks and micro-batches.

The core needs only numpy:

- :func:`partition`, :func:`lower_bound`, :func:`balance_stats`: k-way balanced partitioning
  with size rules and groups, and the evidence (bounds, gaps); :func:`contiguous_partition`
  cuts an ordered sequence into ``k`` consecutive runs; :func:`exact_searches`
  turns its small-problem exact searches off for a block of code where milliseconds matter.
- Cost models (:class:`TokenCost`, :class:`QuadraticCost`, :class:`FlopsCost`,
  :func:`fit_cost`, :func:`load_cost`): what a sequence of L tokens costs;
  :class:`TimingRecorder` checks a cost against measured times and refits it.
- :func:`plan` -> :class:`Plan`: ranks x micro-batches under a token capacity, optimised for
  the sync model (``fsdp`` or ``ddp``); :data:`BASELINES` for comparison; :func:`simulate`.
  The request as checked values: :class:`Mesh`, :class:`Capacity`, :class:`MicroBatching`,
  :class:`RankRules` (and :class:`PlanSpec`, all of them); a bad argument raises
  :class:`ArgumentError`, a ``ValueError`` that names it. A plan's notes and
  library messages are :class:`Note` values (a kind, its fields), written as text where
  they are shown.
- :mod:`seqbalance.workloads`: seeded length sets shared by tests, benchmarks and the demo.

The layers are packages: :mod:`seqbalance.costs` and :mod:`seqbalance.partitioning` at the
bottom, :mod:`seqbalance.planning` on top of both, and the integrations
(:mod:`seqbalance.cli`, :mod:`seqbalance.torch`) above. Imports point down only.

The PyTorch integration (:class:`BalancedDistributedSampler`, :func:`rebalance`,
:func:`pack_collate`, :func:`global_token_count`, :func:`token_mean_loss`) lives in
:mod:`seqbalance.torch`; its names are also reachable from here, and torch is imported only
when one of them is first used.
"""

from __future__ import annotations

from typing import Any as _Any

from . import workloads
from ._notes import Note
from ._validate import ArgumentError
from .costs import (
    SHIPPED,
    CostModel,
    FitReport,
    FlopsCost,
    QuadraticCost,
    TimingRecorder,
    TokenCost,
    fit_cost,
    load_cost,
)
from .partitioning import (
    Partition,
    balance_stats,
    contiguous_partition,
    exact_searches,
    exact_searches_enabled,
    lower_bound,
    partition,
)
from .planning import (
    BASELINES,
    Capacity,
    Mesh,
    MicroBatching,
    Plan,
    PlanSpec,
    RankRules,
    Simulation,
    inverse_permutation,
    plan,
    simulate,
    step_time_lower_bound,
)
from .planning.pipeline import pipeline_lower_bound, simulate_pipeline
from .streaming import StreamingPlanner, StreamingRule

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "1.0.0rc2"

_TORCH_NAMES = (
    "BalancedDistributedSampler",
    "MicroBatchTimer",
    "RebalanceHandle",
    "Rebalancer",
    "global_token_count",
    "pack_collate",
    "rebalance",
    "token_mean_loss",
)

__all__ = [
    "BASELINES",
    "SHIPPED",
    "ArgumentError",
    "Capacity",
    "CostModel",
    "FitReport",
    "FlopsCost",
    "Mesh",
    "MicroBatching",
    "Note",
    "Partition",
    "Plan",
    "PlanSpec",
    "QuadraticCost",
    "RankRules",
    "Simulation",
    "StreamingPlanner",
    "StreamingRule",
    "TimingRecorder",
    "TokenCost",
    "__version__",
    "balance_stats",
    "contiguous_partition",
    "exact_searches",
    "exact_searches_enabled",
    "fit_cost",
    "inverse_permutation",
    "load_cost",
    "lower_bound",
    "partition",
    "pipeline_lower_bound",
    "plan",
    "simulate",
    "simulate_pipeline",
    "step_time_lower_bound",
    "workloads",
]
# The torch names stay out of __all__: `from seqbalance import *` would otherwise import
# torch, and fail without it. They resolve on attribute access (below).


def __getattr__(name: str) -> _Any:
    # Torch-backed names resolve on first use, so `import seqbalance` never imports torch.
    if name in _TORCH_NAMES:
        from . import torch as _integration

        return getattr(_integration, name)
    raise AttributeError(f"module 'seqbalance' has no attribute {name!r}")
