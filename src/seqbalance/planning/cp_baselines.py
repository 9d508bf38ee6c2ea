"""Context-parallel baselines, costed with the same model as :func:`seqbalance.plan`.

``static-cp``
    One CP degree for every sequence: each is split over its data-parallel replica's
    ``cp_size`` GPUs (how most trainers run CP). The replicas' micro-batches are planned by
    seqbalance itself, so this baseline isolates the cost of the fixed degree.
``verl-static-cp`` (:func:`verl_static_cp`, not in :data:`CP_BASELINES`)
    Static CP with verl's own micro-batching: verl's dynamic batching
    (:func:`seqbalance.planning.baselines.verl`: equal-count KK over replicas, KK
    micro-batches, one more until the cap holds, light micro-batches at both ends) on each
    sequence's largest piece, the tokens one GPU holds of it; then every sequence over its
    replica's GPUs.
``megatron-cp``
    Megatron-LM's dynamic ("hybrid") CP scheduler, re-implemented from its published
    description: each sample gets ``d = 2^ceil(log2(ceil(L / max_tokens)))`` GPUs (doubled
    if rounding of the chunk layout leaves a piece above ``max_tokens``); samples are
    taken from the heaviest (by cost) down and packed greedily into micro-batch slots that
    span all ``dp_size * cp_size`` GPUs: each sample joins the least-loaded aligned group of
    its size (an existing group of that size with token room, or free GPUs), and a sample
    that fits nowhere waits for the next slot. GPUs left without work in a slot run an
    empty micro-batch (reported in ``violations()["empty"]``).
"""

from __future__ import annotations

from typing import Any

from ..costs.context_parallel import largest_piece_tokens
from ._megatron import megatron_cp_plan
from .baselines import verl
from .context_parallel import _Request, _static, _static_pieces, _validate
from .cp_plans import CPPlan
from .planner import _plan_replicas

__all__ = ["CP_BASELINES", "megatron_cp", "static_cp", "verl_static_cp"]


def _request(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    cp_size: int,
    cost: Any,
    cp_cost: Any,
    sync: str,
    allow_empty: bool = True,
) -> _Request:
    return _validate(
        lengths, dp_size, max_tokens, cp_size, "dynamic", cost, cp_cost, sync, 1, 1, allow_empty
    )


def megatron_cp(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    *,
    cp_size: int,
    cost: Any = None,
    cp_cost: Any = None,
    sync: str = "fsdp",
) -> CPPlan:
    """Megatron-style dynamic CP (module docstring); arguments as :func:`seqbalance.plan`."""
    return megatron_cp_plan(_request(lengths, dp_size, max_tokens, cp_size, cost, cp_cost, sync))


def static_cp(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    *,
    cp_size: int,
    cost: Any = None,
    cp_cost: Any = None,
    sync: str = "fsdp",
) -> CPPlan:
    """Static CP: every sequence over its replica's ``cp_size`` GPUs (module docstring).

    Empty micro-batches are allowed (and reported) when there are too few sequences.
    """
    req = _request(lengths, dp_size, max_tokens, cp_size, cost, cp_cost, sync)
    req.replicas = _plan_replicas
    p = _static(req, strategy="static-cp")
    if isinstance(p, str):
        raise ValueError(f"static CP: {p}")
    return p


def verl_static_cp(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    *,
    cp_size: int,
    cost: Any = None,
    cp_cost: Any = None,
    sync: str = "fsdp",
) -> CPPlan:
    """Static CP with verl's micro-batching (module docstring), in verl's slot order.

    ``max_tokens`` bounds the tokens of a GPU, so verl batches each sequence's largest
    piece; ``cost`` prices the plan (verl's batching itself counts tokens).

    Raises
    ------
    ValueError
        As :func:`seqbalance.plan` with ``cp="static"``: bad arguments, or a sequence whose
        largest piece exceeds ``max_tokens`` even over ``cp_size`` GPUs (named).
    """
    # (_validate refuses a sequence whose largest piece exceeds max_tokens, naming it)
    req = _validate(lengths, dp_size, max_tokens, cp_size, "static", cost, cp_cost, sync, 1, 1,
                    True)  # fmt: skip
    replicas = verl(largest_piece_tokens(req.lens, req.cp_size), req.dp, req.cap, sync=req.sync)
    return _static_pieces(req, replicas, "verl-static-cp")


CP_BASELINES = {"static-cp": static_cp, "megatron-cp": megatron_cp}
