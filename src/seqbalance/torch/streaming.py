"""Streaming plans for rows produced on the ranks: slots released as rollouts arrive.

:class:`StreamingRebalancer` runs one :class:`seqbalance.StreamingPlanner` on every rank of
a process group. Each :meth:`~StreamingRebalancer.step` is collective: the ranks all-gather
the lengths of the rows that arrived on them since the last step (rank 0's first, each in
its own order: that is the arrival order, the same on every rank), every rank feeds them
to its planner (deterministic, so every rank releases the same slots), and the rows of the
released slots move to their ranks in one exchange of :func:`seqbalance.torch.rebalance`.
Rows not yet released stay on the rank they arrived on.

Rows are padded-row batches (every tensor's first dimension indexes the rows, as
:func:`~seqbalance.torch.rebalance`'s padded layout); rows from different steps are
concatenated, so their trailing shapes must agree, or be padded on dim 1 with
``pad_values``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from .._validate import as_lengths, too_long
from ..streaming import StreamingPlanner, StreamingRule
from ..streaming.planner import _budget
from ._transport import group_info
from .agreement import agree, describe_cost
from .exchange import RebalanceHandle, _rebalance

__all__ = ["StreamingRebalancer"]


class StreamingRebalancer:
    """Balance micro-batch slots across the ranks of a group as rows arrive on them.

    Parameters
    ----------
    max_tokens : int
        Token capacity of one micro-batch.
    cost, sync, oversized, rule
        As :class:`seqbalance.StreamingPlanner` (``dp_size`` is the group's size).
    group : ProcessGroup, optional
        Process group (default: the world).
    pad_values : dict of str to number, optional
        Right-pad dim 1 of these keys to the longest row released together (across steps
        and ranks) with the given value, instead of requiring equal shapes.
    method : {"auto", "all_to_all", "p2p"}
        Exchange path, as :func:`seqbalance.torch.rebalance`.

    Examples
    --------
    Every rank runs::

        streamer = StreamingRebalancer(max_tokens=16384, cost="qwen2.5-7b")
        for rows, lengths in rollouts_arriving_here():       # this rank's new rollouts
            mbs, handle, ids = streamer.step(rows, lengths, idle=trainer_is_idle)
            for mb in mbs:                                    # one per released slot
                train_on(mb)
        mbs, handle, ids = streamer.step(empty_rows, [], final=True)  # the rest
    """

    def __init__(
        self,
        max_tokens: int,
        *,
        cost: Any = None,
        sync: str = "fsdp",
        oversized: str = "error",
        rule: StreamingRule | None = None,
        group: Any = None,
        pad_values: Mapping[str, float] | None = None,
        method: str = "auto",
    ) -> None:
        self.rank, self.world_size = group_info(group)
        self.planner = StreamingPlanner(
            self.world_size, max_tokens, cost=cost, sync=sync, oversized=oversized, rule=rule
        )
        self.group = group
        self.pad_values = None if pad_values is None else dict(pad_values)
        self.method = method
        self._new_step()

    def _new_step(self) -> None:
        self._next_id = 0
        self._origin: list[int] = []  # arrival id -> rank the row arrived on
        self._lengths: list[int] = []  # arrival id -> tokens
        self._rows: dict[int, dict[str, torch.Tensor]] = {}  # this rank's unreleased rows

    def step(
        self,
        batch: Mapping[str, torch.Tensor],
        lengths: Any,
        *,
        idle: bool = False,
        final: bool = False,
        budget: Any = None,
    ) -> tuple[list[dict[str, torch.Tensor]], RebalanceHandle | None, list[list[int]]]:
        """Record the rows that arrived on this rank; return this rank's released
        micro-batches.

        Collective: every rank of the group calls it, with the same ``idle`` and ``final``
        (a rank with no new rows passes a batch of zero rows with the usual keys).

        Parameters
        ----------
        batch : dict of str to tensor
            The new rows (first dimension: one row per sequence; may be zero rows).
        lengths : array-like of int
            Tokens per new row.
        idle : bool
            The trainer has nothing to run (see :meth:`StreamingPlanner.ready`).
        final : bool
            The step's last call: the rest is planned offline and released
            (:meth:`StreamingPlanner.flush`), and the next call starts a new step.
        budget : float or list of float, optional
            The most work a micro-batch released in this call may take, or one number per
            rank (see :meth:`StreamingPlanner.ready`); the same on every rank.

        Returns
        -------
        micro_batches : list of dict
            This rank's micro-batch of each released slot, in slot order (every rank gets
            the same number).
        handle : RebalanceHandle or None
            ``handle.restore(outputs)`` sends per-row results of these micro-batches back
            to the rank and position (in the rows released together) they came from; None
            when nothing was released.
        ids : list of list of int
            The arrival ids in each micro-batch (ids count the step's rows in arrival
            order: each step's rows by rank, rank 0 first).
        """
        what = "StreamingRebalancer.step"
        error: Exception | None = None
        lens = np.zeros(0, dtype=np.int64)
        limit = None
        try:
            checked = _budget(budget, self.world_size)  # the planner's own check
            limit = None if checked is None else checked.tolist()
            if not isinstance(batch, Mapping):
                raise ValueError(f"batch must be a dict of tensors, got {type(batch).__name__}")
            lens = as_lengths(lengths, "lengths")
            for key, t in batch.items():
                if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != lens.shape[0]:
                    raise ValueError(
                        f"batch[{key!r}] must be a tensor with one row per length "
                        f"({lens.shape[0]}), got "
                        f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
                    )
            if self.planner.oversized == "error":
                problem = too_long(lens, self.planner.max_tokens)
                if problem:
                    raise ValueError(
                        f"{problem}; raise max_tokens, split or truncate such sequences, or "
                        "pass oversized='alone'"
                    )
        except Exception as exc:  # reported on every rank by agree
            error = exc
        fingerprint = {
            "max_tokens": self.planner.max_tokens,
            "cost": describe_cost(self.planner.cost),
            "sync": self.planner.sync,
            "oversized": self.planner.oversized,
            "rule": repr(self.planner.rule),
            "idle": bool(idle),
            "final": bool(final),
            "budget": limit,
            "keys": sorted(batch) if isinstance(batch, Mapping) else None,
            "arrivals so far in this step": self._next_id,
        }
        gathered = agree(error, fingerprint, lens, self.group, what)
        for q, q_lens in enumerate(gathered):
            ids = list(range(self._next_id, self._next_id + len(q_lens)))
            self.planner.add(q_lens, ids=ids, budget=limit)
            self._origin += [q] * len(q_lens)
            self._lengths += [int(x) for x in q_lens]
            if q == self.rank:
                for i, a in enumerate(ids):
                    self._rows[a] = {k: v[i : i + 1] for k, v in batch.items()}
            self._next_id += len(q_lens)
        template = {k: v[:0] for k, v in batch.items()}
        slots = self.planner.flush() if final else self.planner.ready(idle=idle, budget=limit)
        if not slots:
            if final:
                self._new_step()
            return [], None, []
        out = self._exchange(slots, template)
        if final:
            self._new_step()
        return out

    def _exchange(
        self, slots: list[list[list[int]]], template: Mapping[str, torch.Tensor]
    ) -> tuple[list[dict[str, torch.Tensor]], RebalanceHandle, list[list[int]]]:
        released = sorted(i for s in slots for mb in s for i in mb)
        sending = [[i for i in released if self._origin[i] == q] for q in range(self.world_size)]
        position: dict[int, int] = {}
        for ids in sending:
            for i in ids:
                position[i] = len(position)
        mine = sending[self.rank]
        problem: Exception | None = None
        try:
            sub = self._concat([self._rows[i] for i in mine], template)
        except Exception as exc:  # reported on every rank through the exchange's agree
            problem, sub = exc, {k: v for k, v in template.items()}

        def check() -> dict[str, Any]:
            if problem is not None:
                raise problem
            return {}

        micro = [
            [np.asarray([position[i] for i in s[r]], dtype=np.int64) for s in slots]
            for r in range(self.world_size)
        ]

        def layout(global_lengths: np.ndarray, global_costs: Any) -> tuple[None, list[Any]]:
            return None, micro

        sub_lens = [self._lengths[i] for i in mine] if problem is None else []
        mbs, handle = _rebalance(
            sub,
            sub_lens,
            layout,
            cost=self.planner.cost,
            group=self.group,
            pad_values=self.pad_values,
            method=self.method,
            check=check,
            what="StreamingRebalancer.step",
        )
        for i in mine:
            del self._rows[i]
        return mbs, handle, [list(s[self.rank]) for s in slots]

    def _concat(
        self, rows: list[dict[str, torch.Tensor]], template: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """This rank's released rows as one padded-row batch (dim 1 padded where asked)."""
        if not rows:
            return dict(template)
        out = {}
        pads = self.pad_values or {}
        for key in rows[0]:
            parts = [r[key] for r in rows]
            if key in pads and parts[0].dim() >= 2:
                width = max(int(p.shape[1]) for p in parts)
                parts = [
                    F.pad(p, (0, 0) * (p.dim() - 2) + (0, width - int(p.shape[1])),
                          value=pads[key])
                    for p in parts
                ]  # fmt: skip
            shapes = {tuple(p.shape[1:]) for p in parts}
            if len(shapes) > 1:
                raise ValueError(
                    f"batch[{key!r}]: rows released together have different shapes "
                    f"{sorted(shapes)}; give every step's rows the same trailing shape, or "
                    f"pass pad_values={{{key!r}: ...}} to pad dim 1"
                )
            out[key] = torch.cat(parts)
        return out

    def __repr__(self) -> str:
        p = self.planner
        return (
            f"StreamingRebalancer(world_size={self.world_size}, max_tokens={p.max_tokens}, "
            f"sync={p.sync!r}, buffered={p.num_buffered})"
        )
