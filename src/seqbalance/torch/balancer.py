"""``rebalance`` with its options fixed once and a cost that can change between steps."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .._validate import check_positive_int
from ..planning.request import PlanSpec
from .exchange import RebalanceHandle, rebalance, spec_options

__all__ = ["Rebalancer"]


def _check_cost(cost: Any) -> Any:
    """A cost every rank can share: None, a name, a cost model or a callable (per-sequence
    arrays belong to one call, so they go to :func:`rebalance` directly)."""
    if cost is None or isinstance(cost, str) or callable(cost):
        if isinstance(cost, str):
            from seqbalance.costs import load_cost

            load_cost(cost)  # fail now on an unknown name, not inside a collective
        return cost
    raise ValueError(
        f"cost must be None, a name, a cost model or a callable, got {type(cost).__name__}; "
        "pass per-sequence cost arrays to rebalance(..., cost=...) itself"
    )


class Rebalancer:
    """Call :func:`rebalance` step after step with the same options and a swappable cost.

    A run can start from :class:`~seqbalance.costs.TokenCost` or FLOPs and switch to a
    cost fitted to its own timings (:meth:`seqbalance.costs.TimingRecorder.refit`) with
    :meth:`set_cost`. Every rank must switch at the same step to the same cost (a refit
    from gathered records gives the same cost on every rank), or the ranks plan
    differently and the exchange fails.

    Parameters
    ----------
    max_tokens : int
        Token capacity of a micro-batch (optional with ``spec``, whose capacity it is).
    cost : None, str, cost model or callable, optional
        The cost plans balance (default: tokens).
    sync : {"fsdp", "ddp"}
        When ranks wait for each other (default ``"fsdp"``; with ``spec``, its mesh's).
    group : ProcessGroup, optional
        Process group (default: the world).
    spec : PlanSpec, optional
        The planner's request as values, in place of the planner options of
        ``**options`` (see :func:`rebalance`).
    **options
        Everything else :func:`rebalance` takes (``token_keys``, ``pad_values``,
        ``method``, planner options...).

    Examples
    --------
    >>> from seqbalance.costs import TokenCost
    >>> bal = Rebalancer(max_tokens=4096, cost=TokenCost(), sync="ddp")
    >>> bal.set_cost("llama-3-8b"); bal.cost
    'llama-3-8b'
    """

    def __init__(
        self,
        max_tokens: int | None = None,
        *,
        cost: Any = None,
        sync: str | None = None,
        group: Any = None,
        spec: PlanSpec | None = None,
        **options: Any,
    ) -> None:
        if spec is not None:  # the request as values (the planner's options by name else)
            options = dict(options)
            max_tokens, _, cost, sync = spec_options(spec, max_tokens, None, cost, sync,
                                                     options)  # fmt: skip
        elif max_tokens is None:
            raise TypeError("Rebalancer needs max_tokens (or spec= with a capacity)")
        self.max_tokens = check_positive_int(max_tokens, "max_tokens")
        self.cost = _check_cost(cost)
        self.sync = "fsdp" if sync is None else sync
        self.group = group
        self.options = dict(options)

    def set_cost(self, cost: Any) -> None:
        """Plan with ``cost`` from the next call on (call it on every rank alike)."""
        self.cost = _check_cost(cost)

    def __call__(
        self, batch: Mapping[str, torch.Tensor], lengths: Any = None
    ) -> tuple[list[dict[str, torch.Tensor]], RebalanceHandle]:
        """``rebalance(batch, lengths, ...)`` with this object's options and cost."""
        return rebalance(
            batch,
            lengths,
            max_tokens=self.max_tokens,
            cost=self.cost,
            sync=self.sync,
            group=self.group,
            **self.options,
        )

    def __repr__(self) -> str:
        return (
            f"Rebalancer(max_tokens={self.max_tokens}, cost={self.cost!r}, sync={self.sync!r})"
        )
