"""The strategies other frameworks use, written from their descriptions, for comparison.

Each baseline returns a :class:`~seqbalance.planning.plans.Plan` with the same fields as
:func:`seqbalance.plan`, so it can be simulated and checked the same way; baselines do not
promise the planner's guarantees, and :meth:`Plan.violations` reports what they break.

``sequential``
    The default of most trainers: contiguous slices of the batch per rank, then each rank
    fills micro-batches in arrival order, first fit under the token capacity.
``token-ffd``
    First-fit decreasing on tokens over the whole batch (fewest micro-batches), the bins
    dealt to ranks round-robin (AReaL-style packing).
``token-kk``
    Karmarkar-Karp on tokens for the rank split (balanced counts), then on each rank
    Karmarkar-Karp on tokens into ``ceil(rank tokens / capacity)`` micro-batches, the count
    synced to the maximum over ranks (verl's dynamic batch size). The capacity is not
    enforced: KK balances tokens, it does not bound them.
``cost-kk-uncapped``
    As ``token-kk`` but balancing the cost (slime's ``--balance-by-flops``); capacity
    violations are reported, not prevented.
``areal``
    AReaL's pipeline as its code runs it: ranks by tokens (heaviest first to the lightest
    rank, equal counts), per rank first-fit decreasing into the fitting micro-batch with the
    fewest sequences, the count agreed across ranks as the maximum (ranks repack with that
    many). Respects the capacity.
``verl``
    verl's pipeline: ranks by equal-count Karmarkar-Karp on verl's workload
    ``24576 L + L**2``, then per rank Karmarkar-Karp into ``m`` micro-batches, ``m`` raised
    by one until every micro-batch of every rank fits the capacity.
``slime-flops``
    slime with ``--balance-by-flops --balance-data``: the whole batch into
    ``ceil(tokens / cap)`` micro-batches by Karmarkar-Karp on the cost (no token cap),
    split up to a multiple of ``dp``, dealt to ranks by equal-count Karmarkar-Karp.

The last three are written from the frameworks' code (:mod:`._pipelines`, which lists the
files), tie breaking included; ``bench/pipelines_check.py`` compares them with the real
functions where those import.

The context-parallel baselines ``static-cp`` and ``megatron-cp`` take a ``cp_size`` and
return CP plans: :mod:`seqbalance.planning.cp_baselines` (which builds on this module).

Ranks that end with fewer micro-batches than the busiest rank split their fullest
micro-batches until the counts match (what a trainer must do to avoid hung collectives);
where nothing can be split, empty micro-batches are added and reported.

With pipeline parallelism the baselines are run orders of a pipelined plan's micro-batches:
:data:`PIPELINE_ORDERS` (``input``, ``largest-first``, ``smallest-first``, ``light-ends`` as
in verl), applied with :func:`reorder` (:mod:`seqbalance.planning.pipeline_orders`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, cast

import numpy as np

from .._validate import as_lengths, check_choice, check_max_tokens, check_positive_int
from ._costing import sequence_costs
from ._packing import first_fit_opening
from ._pipelines import (
    areal_micro_batches,
    areal_pipeline,
    areal_ranks,
    slime_flops_pipeline,
    verl_micro_batches,
    verl_pipeline,
    verl_ranks,
)
from .pipeline_orders import ORDERS as PIPELINE_ORDERS
from .pipeline_plans import reorder
from .plans import Plan
from .simulation import SYNC_MODELS

__all__ = [
    "BASELINES",
    "PIPELINE_ORDERS",
    "areal",
    "cost_kk_uncapped",
    "reorder",
    "sequential",
    "slime_flops",
    "token_ffd",
    "token_kk",
    "verl",
]


Grid = list[list[list[int]]]


def _equalize(ranks: list[list[list[int]]]) -> list[list[list[int]]]:
    """Give every rank the same micro-batch count by splitting its fullest micro-batches."""
    m = max((len(r) for r in ranks), default=0)
    for rank in ranks:
        while len(rank) < m:
            j = max(range(len(rank)), key=lambda k: (len(rank[k]), -k), default=None)
            if j is None or len(rank[j]) < 2:
                rank.append([])
                continue
            mb = rank[j]
            half = (len(mb) + 1) // 2
            rank[j], tail = mb[:half], mb[half:]
            rank.insert(j + 1, tail)
    return ranks


def _first_fit(items: list[int], lengths: np.ndarray, cap: int) -> list[list[int]]:
    """First fit in the given order; a sequence that fits nowhere opens a new micro-batch.

    A sequence longer than ``cap`` gets a micro-batch of its own (a reported violation).
    """
    # Only these items' lengths: a rank's slice of a large batch must not cost a pass
    # over the whole batch.
    t = lengths[np.asarray(items, dtype=np.int64)]
    return [[items[p] for p in b] for b in first_fit_opening(range(len(items)), t, cap)]


def _prepare(
    lengths: Any, dp_size: int, max_tokens: int, cost: Any, sync: str
) -> tuple[np.ndarray, int, int, np.ndarray, float]:
    lens = as_lengths(lengths)
    dp = check_positive_int(dp_size, "dp_size")
    cap = check_max_tokens(max_tokens, "max_tokens")
    check_choice(sync, "sync", SYNC_MODELS)
    costs, c0 = sequence_costs(lens, cost)
    return lens, dp, cap, costs, c0


def _plan(
    name: str,
    ranks: list[list[list[int]]],
    lens: np.ndarray,
    cap: int,
    costs: np.ndarray,
    c0: float,
    sync: str,
) -> Plan:
    return Plan(
        _equalize(ranks),
        lens,
        max_tokens=cap,
        costs=costs,
        per_microbatch=c0,
        sync=sync,
        strategy=name,
    )


def sequential(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """Contiguous rank slices, then first-fit micro-batches in arrival order.

    Sequences longer than ``max_tokens`` get a micro-batch of their own (reported as a
    capacity violation).
    """
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    return _plan("sequential", _sequential_grid(lens, dp, cap, costs), lens, cap, costs, c0, sync)


def _sequential_ranks(lens: np.ndarray, dp: int) -> list[list[int]]:
    return [s.tolist() for s in np.array_split(np.arange(lens.size), dp)]


def _sequential_grid(lens: np.ndarray, dp: int, cap: int, costs: np.ndarray) -> Grid:
    return [_first_fit(s, lens, cap) for s in _sequential_ranks(lens, dp)]


def token_ffd(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """First-fit decreasing on tokens over the batch; bins dealt to ranks round-robin."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    return _plan("token-ffd", _token_ffd_grid(lens, dp, cap, costs), lens, cap, costs, c0, sync)


def _token_ffd_grid(lens: np.ndarray, dp: int, cap: int, costs: np.ndarray) -> Grid:
    order = np.lexsort((np.arange(lens.size), -lens)).tolist()
    bins = _first_fit(order, lens, cap)
    return [bins[r::dp] for r in range(dp)]


def _kk_two_level(weights: np.ndarray, lens: np.ndarray, dp: int, cap: int) -> Grid:
    return cast("Grid", _kk_micro_batches(weights, lens, _kk_ranks(weights, dp), cap))


def _kk_ranks(weights: np.ndarray, dp: int) -> list[list[int]]:
    from ..partitioning.kway import kk_parts  # lazy: keeps import order free

    return kk_parts(np.asarray(weights, dtype=np.float64), dp, "balanced")


def _kk_micro_batches(
    weights: np.ndarray, lens: np.ndarray, rank_parts: list[list[int]], cap: int,
    fit: bool = False,
) -> Grid | None:
    """Each rank's sequences by KK into the count the busiest rank's tokens need.
    ``fit``: None as soon as a micro-batch is over ``cap`` (every rank gets ``m`` of
    them, so the grid is final: no later step could split that one)."""
    from ..partitioning.kway import kk_parts  # lazy: keeps import order free

    weights = np.asarray(weights, dtype=np.float64)
    m = max((max(1, math.ceil(int(lens[p].sum()) / cap)) for p in rank_parts if p), default=1)
    ranks = []
    for items in rank_parts:
        idx = np.asarray(items, dtype=np.int64)
        parts = kk_parts(weights[idx], m) if idx.size else [[] for _ in range(m)]
        rank = [idx[np.asarray(p, dtype=np.int64)].tolist() for p in parts]
        if fit and any(int(lens[mb].sum()) > cap for mb in rank):
            return None
        ranks.append(rank)
    return ranks


def token_kk(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """KK on tokens for ranks and micro-batches; micro-batch count synced to the maximum."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    return _plan("token-kk", _token_kk_grid(lens, dp, cap, costs), lens, cap, costs, c0, sync)


def _token_kk_grid(lens: np.ndarray, dp: int, cap: int, costs: np.ndarray) -> Grid:
    return _kk_two_level(lens.astype(np.float64), lens, dp, cap)


def cost_kk_uncapped(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """KK on cost for ranks and micro-batches; the capacity is not enforced."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    grid = _kk_two_level(costs, lens, dp, cap)
    return _plan("cost-kk-uncapped", grid, lens, cap, costs, c0, sync)


def areal(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """AReaL: token-balanced ranks, per-rank FFD, micro-batch count synced to the maximum."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    return _plan("areal", areal_pipeline(lens, dp, cap), lens, cap, costs, c0, sync)


def verl(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """verl: equal-count KK ranks, per-rank KK micro-batches, one more until the cap holds."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    return _plan("verl", _verl_grid(lens, dp, cap, costs), lens, cap, costs, c0, sync)


def _verl_grid(lens: np.ndarray, dp: int, cap: int, costs: np.ndarray) -> Grid:
    return cast("Grid", verl_pipeline(lens, dp, cap))  # no max_count: found


def slime_flops(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any = None, sync: str = "fsdp"
) -> Plan:
    """slime's FLOPs schedule: KK on cost into micro-batches, then KK of those over ranks."""
    lens, dp, cap, costs, c0 = _prepare(lengths, dp_size, max_tokens, cost, sync)
    ranks = slime_flops_pipeline(lens, costs, dp, cap)
    return _plan("slime-flops", ranks, lens, cap, costs, c0, sync)


def _slime_flops_grid(lens: np.ndarray, dp: int, cap: int, costs: np.ndarray) -> Grid:
    return slime_flops_pipeline(lens, costs, dp, cap)


BASELINES: dict[str, Callable[..., Plan]] = {
    "sequential": sequential,
    "token-ffd": token_ffd,
    "token-kk": token_kk,
    "cost-kk-uncapped": cost_kk_uncapped,
    "areal": areal,
    "verl": verl,
    "slime-flops": slime_flops,
}

#: The micro-batches of each of :data:`BASELINES` (``[rank][micro-batch] -> indices``, counts
#: not yet equalized, unsorted) from validated arrays: ``(lengths, dp, cap, costs) -> grid``.
#: The planner runs the baselines as candidates through these, without building a Plan.
BASELINE_GRIDS: dict[str, Callable[[np.ndarray, int, int, np.ndarray], Grid]] = {
    "sequential": _sequential_grid,
    "token-ffd": _token_ffd_grid,
    "token-kk": _token_kk_grid,
    "cost-kk-uncapped": lambda lens, dp, cap, costs: _kk_two_level(costs, lens, dp, cap),
    "areal": lambda lens, dp, cap, costs: areal_pipeline(lens, dp, cap),
    "verl": _verl_grid,
    "slime-flops": _slime_flops_grid,
}

#: The baselines of :data:`BASELINES` whose rank split comes first, in two stages:
#: ``ranks(lengths, dp, costs)`` (each rank's sequences) and ``micro_batches(lengths, ranks,
#: cap, costs)`` (the grid of :data:`BASELINE_GRIDS` from those ranks). Under either sync a
#: plan's step is at least its busiest rank's total, so the planner can tell from the
#: first stage alone that such a baseline cannot win, and skip the second (verl's is
#: :func:`._pipelines.verl_micro_batches`, which the planner runs with its own limits).
_Ranks = Callable[[np.ndarray, int, np.ndarray], list[list[int]]]
_FromRanks = Callable[[np.ndarray, list[list[int]], int, np.ndarray], Grid]
BASELINE_STAGES: dict[str, tuple[_Ranks, _FromRanks]] = {
    "sequential": (
        lambda lens, dp, costs: _sequential_ranks(lens, dp),
        lambda lens, ranks, cap, costs: [_first_fit(r, lens, cap) for r in ranks],
    ),
    "token-kk": (
        lambda lens, dp, costs: _kk_ranks(lens, dp),
        lambda lens, ranks, cap, costs: cast("Grid", _kk_micro_batches(lens, lens, ranks, cap)),
    ),
    "cost-kk-uncapped": (
        lambda lens, dp, costs: _kk_ranks(costs, dp),
        lambda lens, ranks, cap, costs: cast("Grid", _kk_micro_batches(costs, lens, ranks, cap)),
    ),
    "areal": (
        lambda lens, dp, costs: areal_ranks(lens, dp),
        lambda lens, ranks, cap, costs: areal_micro_batches(lens, ranks, cap),
    ),
    "verl": (
        lambda lens, dp, costs: verl_ranks(lens, dp),
        lambda lens, ranks, cap, costs: cast("Grid", verl_micro_batches(lens, ranks, cap)),
    ),
}  # fmt: skip

#: The second stage of the baselines of :data:`BASELINE_STAGES` that do not enforce the
#: capacity, returning None at the first micro-batch over it (what a caller that drops
#: such a plan needs; the grid otherwise).
UNCAPPED_STAGES: dict[str, Callable[[np.ndarray, list[list[int]], int, np.ndarray], Grid | None]]
UNCAPPED_STAGES = {
    "token-kk": lambda lens, ranks, cap, costs: _kk_micro_batches(lens, lens, ranks, cap, True),
    "cost-kk-uncapped": (
        lambda lens, ranks, cap, costs: _kk_micro_batches(costs, lens, ranks, cap, True)
    ),
}  # fmt: skip
