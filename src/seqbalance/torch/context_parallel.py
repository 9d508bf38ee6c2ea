"""Cut a packed batch into one GPU's context-parallel pieces, and bring outputs back.

A :class:`~seqbalance.planning.cp_plans.CPPlan` says which token ranges of which sequences
GPU ``g`` holds in each micro-batch slot. :func:`cp_shard` takes the packed batch those
sequences came from (every sequence in index order, ``cu_seqlens`` of ``n + 1`` entries, as
:func:`seqbalance.torch.pack_collate` builds it) and returns this GPU's micro-batches:

- every per-token tensor (first dimension = total tokens) cut to the GPU's ranges,
- ``position_ids`` kept from the full sequence (a piece ``[s, e)`` has positions
  ``s..e-1``, or the batch's own ``position_ids`` there), so rotary embeddings and the causal
  mask see true positions,
- ``cu_seqlens`` with one segment per non-empty range (int32), ``max_seqlen``,
- ``sequence_ids`` (the sequence of each segment), ``ranges`` (``[k, 2]`` start and end
  inside that sequence) and ``cp_degree`` (GPUs sharing that sequence in this slot): what a
  ring-attention kernel needs to find its partners,
- every per-sequence tensor (first dimension ``n``: rewards, advantages of a sequence,
  ``pack_collate``'s ``lengths``...) one row per segment, the row of its sequence.

Values that are not tensors (``pack_collate``'s ``max_seqlen`` is recomputed) stay behind.

:meth:`CPShardHandle.restore` is collective: every GPU passes its per-token outputs (one
tensor per micro-batch, or all of them concatenated) and gets the whole batch's per-token
output back in the original packed layout. It copies bytes (``all_gather``), so values
arrive bit-exact; it is not differentiable.

Example (every GPU of the ``dp x cp`` mesh runs this)::

    p = seqbalance.plan(lengths, dp, max_tokens, cost=cost, cp_size=cp, cp="dynamic")
    mbs, handle = cp_shard(packed, p, rank)
    logps = [model(mb) for mb in mbs]         # per token, packed per micro-batch
    full = handle.restore(logps)              # [total_tokens, ...] on every GPU
"""

from __future__ import annotations

import hashlib
from typing import Any, Collection, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .._validate import as_index
from .collate import check_token_keys

__all__ = ["CPShardHandle", "cp_shard"]


class _Layout:
    """What sharding reads from a plan: every GPU's (sequence, start, end) ranges per slot.

    A :class:`CPPlan` gives its pieces; a plain :class:`Plan` (no context parallelism, one
    GPU per data-parallel rank) holds every sequence whole.
    """

    def __init__(self, plan: Any) -> None:
        from ..planning.cp_plans import CPPlan  # numpy-only; the planning layer sits below
        from ..planning.plans import Plan

        if not isinstance(plan, Plan):  # a CPPlan is a Plan
            raise ValueError(
                "plan must be a CPPlan (seqbalance.plan(..., cp_size=N)) or a Plan, got "
                f"{type(plan).__name__}"
            )
        # A plan that misses or repeats a token would shard fine and then restore
        # uninitialised memory for it: refuse it here, on every rank alike (no collective).
        bad = plan.violations()
        if bad["missing"] or bad["duplicated"]:
            raise ValueError(
                f"the plan must hold every token of each of its {plan.num_sequences} "
                f"sequences exactly once: {bad['missing']} sequences miss tokens, "
                f"{bad['duplicated']} have tokens twice"
            )
        if isinstance(plan, CPPlan):
            self.pieces = plan.pieces
        else:
            lens = plan.lengths
            self.pieces = [
                [[(int(i), 0, int(lens[i])) for i in mb] for mb in rank]
                for rank in plan.micro_batches
            ]
        self.world_size = len(self.pieces)
        self.lengths = plan.lengths
        self.num_sequences = int(plan.lengths.shape[0])


def _token_indices(plan: Any, cu: np.ndarray, gpu: int) -> list[np.ndarray]:
    """Global token positions of GPU ``gpu``'s ranges, one int64 array per slot."""
    out = []
    for slot in plan.pieces[gpu]:
        parts = [np.arange(cu[i] + s, cu[i] + e, dtype=np.int64) for i, s, e in slot if e > s]
        out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    return out


class CPShardHandle:
    """Remembers where this GPU's tokens came from; :meth:`restore` brings outputs back.

    Attributes
    ----------
    plan : CPPlan or Plan
        The plan :func:`cp_shard` was given.
    rank : int
        This GPU's index in the plan.
    micro_batch_lengths : list of np.ndarray
        Whole lengths of the sequences this GPU holds pieces of, per slot (what
        :meth:`seqbalance.torch.timing.MicroBatchTimer.end_step` records, given the handle).
    """

    def __init__(self, plan: Any, layout: _Layout, cu: np.ndarray, rank: int) -> None:
        self.plan = plan
        self.rank = rank
        self.world_size = layout.world_size
        self.total_tokens = int(cu[-1])
        per_gpu = [_token_indices(layout, cu, g) for g in range(self.world_size)]
        # This GPU's token positions per slot: cp_shard gathers its micro-batches with them.
        self.slot_indices = per_gpu[rank]
        self._indices = [np.concatenate(slots or [np.zeros(0, np.int64)]) for slots in per_gpu]
        self.slot_tokens = [idx.size for idx in self.slot_indices]
        self.micro_batch_lengths = [
            np.asarray(self.plan.lengths)[np.asarray(mb, dtype=np.int64)]
            for mb in self.plan.micro_batches[rank]
        ]
        # What restore's agreement compares, hashed once: the whole layout, not just token
        # counts (GPUs that planned with another cost get equal counts, other tokens).
        order = np.ascontiguousarray(np.concatenate(self._indices), dtype=np.int64)
        self._layout_digest = hashlib.sha256(order.tobytes()).hexdigest()

    def _local_outputs(self, outputs: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """This GPU's outputs as one ``[tokens, ...]`` tensor, checked against the plan."""
        if isinstance(outputs, torch.Tensor):
            local = outputs
        else:
            outs = list(outputs)
            if len(outs) != len(self.slot_tokens):
                raise ValueError(
                    f"outputs has {len(outs)} micro-batches but this GPU ran "
                    f"{len(self.slot_tokens)}"
                )
            for j, (o, k) in enumerate(zip(outs, self.slot_tokens)):
                if not isinstance(o, torch.Tensor) or o.shape[0] != k:
                    got = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
                    raise ValueError(f"outputs[{j}] must have {k} rows (tokens), got {got}")
            local = torch.cat(outs) if outs else torch.zeros(0)
        local = local.detach().contiguous()
        mine = self._indices[self.rank].size
        if local.shape[0] != mine:
            raise ValueError(f"outputs hold {local.shape[0]} tokens but this GPU has {mine}")
        return local

    def restore(
        self, outputs: torch.Tensor | Sequence[torch.Tensor], group: Any = None
    ) -> torch.Tensor:
        """Gather every GPU's per-token outputs into ``[total_tokens, ...]`` (collective).

        Parameters
        ----------
        outputs : tensor or sequence of tensors
            This GPU's per-token outputs: one tensor per micro-batch (first dimension = its
            tokens) or one tensor of all of them in slot order. Trailing shape and dtype
            must be the same on every GPU; a GPU with no slots passes an empty tensor of
            that shape and dtype (``torch.empty(0, *trailing, dtype=...)``), since an
            empty list carries neither.
        group : ProcessGroup, optional
            The group of the plan's ``world_size`` GPUs (default: the whole world), in
            plan order: group rank ``g`` is the plan's GPU ``g`` (checked).
        """
        from .agreement import agree_on

        local = None

        def check() -> tuple[dict[str, Any], None]:
            # Local checks only; agree_on sends any error (and the shape every rank will
            # gather) to every rank, so a bad output on one GPU never leaves the rest
            # waiting in the all-gather.
            nonlocal local
            local = self._local_outputs(outputs)
            size = dist.get_world_size(group)
            if size != self.world_size:
                raise ValueError(
                    f"the process group has {size} ranks but the plan has {self.world_size} GPUs"
                )
            # Group rank g's outputs are put where plan GPU g's tokens go.
            me = dist.get_rank(group)
            if me != self.rank:
                raise ValueError(
                    f"this process is rank {me} in the group but GPU {self.rank} of the plan; "
                    "call cp_shard with the process's rank in the group (or build the group "
                    "in plan GPU order)"
                )
            fingerprint = {
                "plan (tokens per GPU)": np.array([idx.size for idx in self._indices]),
                "plan (which tokens each GPU holds)": self._layout_digest,
                "trailing shape of outputs": tuple(local.shape[1:]),
                "dtype of outputs": str(local.dtype),
            }
            return fingerprint, None

        agree_on(check, group, "CPShardHandle.restore")
        assert local is not None  # check() ran without raising on every rank
        size = self.world_size
        counts = [idx.size for idx in self._indices]
        width = max(counts, default=0)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        gathered = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(gathered, padded, group=group)
        out = local.new_empty((self.total_tokens, *local.shape[1:]))
        for g, idx in enumerate(self._indices):
            if idx.size:
                out[torch.from_numpy(idx).to(out.device)] = gathered[g][: idx.size]
        return out


def _check_rank(rank: Any, world_size: int) -> int:
    """``rank`` as an int in ``[0, world_size)``; floats and bools are refused (``int(1.7)``
    would silently pick GPU 1)."""
    try:
        value = as_index(rank)
    except TypeError:
        raise ValueError(
            f"rank must be an integer (this GPU's index in the plan), got {rank!r}"
        ) from None
    if not 0 <= value < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {value}")
    return value


def _offsets(cu_seqlens: Any) -> np.ndarray:
    """``cu_seqlens`` as int64 offsets: 1-D, integer, from 0, never decreasing.

    Offsets not from 0 match no tensor's row count, so every per-token tensor would be
    silently left out; float offsets would be truncated.
    """
    cu = torch.as_tensor(cu_seqlens)
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(
            f"batch['cu_seqlens'] must be a 1-D tensor of n + 1 offsets, got shape "
            f"{tuple(cu.shape)}"
        )
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise ValueError(
            f"batch['cu_seqlens'] must be an integer tensor of offsets, got {cu.dtype}"
        )
    out = cu.detach().cpu().numpy().astype(np.int64)
    if out[0] != 0 or (np.diff(out) < 0).any():
        raise ValueError(
            f"batch['cu_seqlens'] must start at 0 and never decrease, got "
            f"{out[:8].tolist()}{'...' if out.size > 8 else ''}"
        )
    return out


def cp_shard(
    batch: Mapping[str, Any],
    plan: Any,
    rank: int,
    *,
    token_keys: Collection[str] | None = None,
) -> tuple[list[dict[str, Any]], CPShardHandle]:
    """This GPU's micro-batches of CP pieces from a packed batch (module docstring).

    Parameters
    ----------
    batch : mapping
        The packed batch of all the plan's sequences, in index order: ``cu_seqlens``
        (``[n + 1]``, from 0) and per-token tensors (first dimension ``cu_seqlens[-1]``).
    plan : CPPlan or Plan
        From ``seqbalance.plan(..., cp_size=...)``; a plain :class:`Plan` (``cp_size=1``)
        runs every sequence whole, one GPU per data-parallel rank, so one code path serves
        every CP size.
    rank : int
        This GPU's index in the plan (``0 .. world_size - 1``); for
        :meth:`CPShardHandle.restore`, also its rank in the group passed there.
    token_keys : collection of str, optional
        Keys to cut; default every tensor whose first dimension is the token count. Other
        tensors whose first dimension is the number of sequences are per sequence: each
        micro-batch gets the rows of its segments' sequences (``sequence_ids``).

    Returns
    -------
    (list of dict, CPShardHandle)
        One dict per micro-batch slot of this GPU. The tensors it builds (``cu_seqlens``,
        ``position_ids`` when the batch has none, ``sequence_ids``, ``ranges``,
        ``cp_degree``) are on the device of ``input_ids`` (else of ``position_ids``, else
        of another per-token tensor), where an attention kernel reads them; without
        per-token tensors, on the device of ``batch["cu_seqlens"]``.

    Raises
    ------
    ValueError
        On a plan that misses or repeats a sequence (or, for a CPPlan, a token), a batch
        that does not match the plan's lengths, a bad rank or ``token_keys``.
    """
    source, plan = plan, _Layout(plan)
    rank = _check_rank(rank, plan.world_size)
    check_token_keys(token_keys)
    if "cu_seqlens" not in batch:
        raise ValueError("batch needs 'cu_seqlens' (a packed batch, e.g. from pack_collate)")
    cu = _offsets(batch["cu_seqlens"])
    lens = np.diff(cu)
    if lens.shape[0] != plan.num_sequences or not np.array_equal(lens, plan.lengths):
        bad = (
            "a different number of sequences"
            if lens.shape[0] != plan.num_sequences
            else f"sequence {int(np.flatnonzero(lens != plan.lengths)[0])} with another length"
        )
        raise ValueError(
            f"batch does not match the plan: its cu_seqlens give {bad}; pack the plan's "
            "sequences in index order"
        )
    total = int(cu[-1])
    keys = sorted(
        k
        for k, v in batch.items()
        if k != "cu_seqlens"
        and isinstance(v, torch.Tensor)
        and v.dim() >= 1
        and v.shape[0] == total
        and (token_keys is None or k in token_keys or k == "position_ids")
    )
    if token_keys is not None:
        missing = [k for k in token_keys if k not in keys]
        if missing:
            raise ValueError(f"token_keys {missing} are not per-token tensors of the batch")
    n = int(lens.shape[0])
    per_sequence = sorted(
        k
        for k, v in batch.items()
        if k not in keys
        and k not in ("cu_seqlens", "sequence_ids", "ranges", "cp_degree")
        and isinstance(v, torch.Tensor)
        and v.dim() >= 1
        and v.shape[0] == n
    )
    cu_in = batch["cu_seqlens"]
    # Where the model reads them: input_ids' device, else position_ids', else any
    # per-token tensor's (not the first key by name: `advantages` may stay on the CPU).
    home = next((k for k in ("input_ids", "position_ids") if k in keys), keys[0] if keys else None)
    device = (
        batch[home].device
        if home is not None
        else cu_in.device
        if isinstance(cu_in, torch.Tensor)
        else torch.device("cpu")
    )
    deg: dict[tuple[int, int], set[int]] = {}
    for g, gpu in enumerate(plan.pieces):
        for j, slot in enumerate(gpu):
            for i, s, e in slot:
                if e > s:  # a GPU whose piece is empty drops it: no partner to wait for
                    deg.setdefault((j, i), set()).add(g)
    handle = CPShardHandle(source, plan, cu, rank)
    out = []
    for j, (slot, idx) in enumerate(zip(plan.pieces[rank], handle.slot_indices)):
        ranges = [(i, s, e) for i, s, e in slot if e > s]
        index = torch.from_numpy(idx)
        mb: dict[str, Any] = {}
        for k in keys:
            mb[k] = batch[k][index.to(batch[k].device)]
        if "position_ids" not in mb:
            pos = [np.arange(s, e, dtype=np.int64) for _, s, e in ranges]
            mb["position_ids"] = torch.from_numpy(
                np.concatenate(pos) if pos else np.zeros(0, dtype=np.int64)
            ).to(device)
        seg = np.array([e - s for _, s, e in ranges], dtype=np.int64)
        cus = np.zeros(seg.size + 1, dtype=np.int64)
        np.cumsum(seg, out=cus[1:])
        mb["cu_seqlens"] = torch.as_tensor(cus, dtype=torch.int32, device=device)
        mb["max_seqlen"] = int(seg.max()) if seg.size else 0
        mb["sequence_ids"] = torch.as_tensor(
            [i for i, _, _ in ranges], dtype=torch.int64, device=device
        )
        mb["ranges"] = torch.as_tensor(
            [[s, e] for _, s, e in ranges], dtype=torch.int64, device=device
        ).reshape(-1, 2)
        mb["cp_degree"] = torch.as_tensor(
            [len(deg[(j, i)]) for i, _, _ in ranges], dtype=torch.int64, device=device
        )
        for k in per_sequence:  # rows of the segments' sequences
            mb[k] = batch[k][mb["sequence_ids"].to(batch[k].device)]
        out.append(mb)
    return out, handle
