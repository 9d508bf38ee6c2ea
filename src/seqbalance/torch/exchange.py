"""Move sequences that live on the ranks to where a plan puts them, and results back.

Use :func:`rebalance` when each rank produced its own sequences (RL rollouts): the ranks
all-gather their lengths, every rank computes the same plan from them (no further
agreement needed: planning is deterministic), rows travel in one all-to-all, and each rank
gets its micro-batches plus a :class:`RebalanceHandle`. ``handle.restore(outputs)`` sends
per-sequence (or per-token) results back to the rank and position each sequence came from.

Supported batch layouts
-----------------------
A batch is a dict of tensors on one device.

padded rows
    Every tensor's first dimension indexes this rank's ``n`` sequences: ``input_ids [n, T]``,
    ``attention_mask [n, T]``, ``advantages [n]``... Trailing shapes and dtypes may differ
    between keys but must agree across ranks for each key (pass ``pad_values`` to pad dim 1
    to the largest ``T`` of any rank instead). ``lengths`` is required.
packed tokens
    The batch has a ``cu_seqlens`` tensor (``[n + 1]``, starting at 0) and each other tensor
    is either per token (first dim ``cu_seqlens[-1]``: ``input_ids``, ``position_ids``,
    ``labels``...) or per sequence (first dim ``n``). Which is which is read from the shapes
    (on all ranks together) or given as ``token_keys``. ``lengths`` defaults to
    ``diff(cu_seqlens)``. Every micro-batch comes back packed with its own ``cu_seqlens``,
    and with its own ``max_seqlen`` where the batch has one (an int, as
    :func:`~seqbalance.torch.pack_collate` writes it, or a 0-d integer tensor): a batch
    straight from ``pack_collate`` can be rebalanced once the values it returns as lists
    (strings, ragged fields) are set aside.

No hang from bad input
----------------------
:func:`rebalance` and :meth:`RebalanceHandle.restore` validate each rank's inputs locally
(catching any exception) and then make one all-gather that carries, with the lengths, each
rank's error status and a fingerprint of the arguments that must agree (``max_tokens``,
``cost``, ``sync``, ``method``, every planner option, ``token_keys``, ``pad_values``...).
If any rank failed or the ranks differ, every rank raises the same
:class:`~seqbalance.torch.agreement.RankAgreementError` (a ``ValueError``) naming the ranks and
the argument, and no rank enters another collective. Ranks never compute different plans,
and a bad input on one rank never leaves the others waiting for the process-group timeout.
(Not covered: a rank that does not call at all, or ranks that pass different groups.)

Any rank may hold zero sequences, and totals need not divide evenly. The exchange copies
bytes: rows arrive bit-exact, in any dtype, and it is not differentiable (tensors are
detached).

Example (every rank runs this)::

    mbs, handle = rebalance(rollouts, lengths, max_tokens=16384, cost="qwen2.5-7b")
    logps = [policy_logprobs(mb) for mb in mbs]   # per-token, packed per micro-batch
    logps = handle.restore(logps)                 # back in this rank's original order
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence, Union, cast

import numpy as np
import torch
import torch.nn.functional as F

from .._validate import (
    ArgumentError,
    as_lengths,
    as_weights,
    check_choice,
    check_max_tokens,
    group_ids,
    is_array_like,
    too_long,
)
from ..partitioning.searches import exact_searches_enabled
from ..planning.request import FLAT_KEYWORDS, PlanSpec
from ._transport import METHODS, Spec, from_rows, group_info, move, to_rows
from .agreement import agree, canonical, describe_cost
from .collate import check_token_keys, is_integer_dtype

__all__ = ["RebalanceHandle", "rebalance"]

Outputs = Union[torch.Tensor, Mapping[str, torch.Tensor]]

_SINGLE = "\x00output"  # internal key for a bare-tensor output
_MAX_SEQLEN = "max_seqlen"  # a packed batch's longest sequence: recomputed, not moved

#: Why dynamic CP is refused where whole sequences are planned for data-parallel ranks.
CP_REFUSED = (
    "{what} gives each data-parallel rank whole sequences, which only static context "
    "parallelism keeps (cp_size={cp!r}, cp={mode!r}): pass cp='static' to plan for a "
    "framework that cuts each micro-batch over its replica's CP ranks itself, or plan the "
    "dp x cp mesh with seqbalance.plan(..., cp_size=..., cp='dynamic') and cut each GPU's "
    "pieces with seqbalance.torch.cp_shard"
)


def cp_size_of(what: str, options: Mapping[str, Any]) -> int:
    """The CP size of planner ``options`` where each data-parallel rank gets whole
    sequences: 1, or a static-CP ``cp_size`` (dynamic CP is refused with why)."""
    from seqbalance.planning.cp_plans import check_cp_size

    cp = check_cp_size(options.get("cp_size", 1))
    mode = options.get("cp", "static")
    if cp > 1 and mode != "static":
        raise ValueError(CP_REFUSED.format(what=what, cp=cp, mode=mode))
    return cp


def too_long_for_cp(lengths: np.ndarray, max_tokens: int, cp: int, item: str) -> str | None:
    """:func:`too_long` for a per-GPU ``max_tokens`` under static CP of ``cp`` GPUs: what
    one GPU holds of a sequence is its largest piece."""
    if cp == 1:
        return too_long(lengths, max_tokens, item=item)
    from seqbalance.costs.context_parallel import largest_piece_tokens

    pieces = largest_piece_tokens(lengths, cp)
    over = np.flatnonzero(pieces > max_tokens)
    if not over.size:
        return None
    i = int(over[0])
    return (
        f"{item} {i} has {int(lengths[i])} tokens: split over cp_size={cp} GPUs its largest "
        f"piece has {int(pieces[i])} tokens, more than max_tokens={max_tokens} (a larger "
        "cp_size cuts smaller pieces)"
    )


def replica_grid(p: Any) -> list[list[list[int]]]:
    """Whole sequences per data-parallel rank and micro-batch of a plan (a static CP
    plan's per replica)."""
    from seqbalance.planning.cp_plans import CPPlan

    return p.replica_micro_batches() if isinstance(p, CPPlan) else p.micro_batches


def _max_seqlen_kind(value: Any) -> torch.dtype | None:
    """``None`` for an int ``max_seqlen``, the dtype for a 0-d integer tensor; else a
    ValueError (the value is recomputed for each micro-batch, so only its type matters)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and is_integer_dtype(value.dtype):
        return value.dtype
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return None
    raise ValueError(
        f"batch[{_MAX_SEQLEN!r}] must be an int or a 0-d integer tensor (the longest "
        f"sequence, recomputed for each micro-batch), got {type(value).__name__}"
        + (f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else "")
    )


def _describe(
    tensors: Mapping[str, Any],
    n: int,
    tokens: int | None,
    lens: np.ndarray,
    token_keys: Collection[str] | None,
    what: str,
) -> dict[str, tuple[str, torch.dtype, tuple[int, ...], int]]:
    """Classify each tensor as per-sequence / per-token / either, from this rank alone.

    Returns ``{key: (kind, dtype, trailing_shape, rows)}``; raises ValueError on local
    problems. ``tokens`` is None when per-token tensors are not allowed (padded layout).
    """
    out = {}
    for key in sorted(tensors):
        t = tensors[key]
        name = f"{what}[{key!r}]" if key != _SINGLE else what
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"{name} is a {type(t).__name__}, not a torch.Tensor; only tensors can be "
                "exchanged (move other values out of the batch)"
            )
        if t.dim() == 0:
            raise ValueError(f"{name} is a 0-d tensor; it needs a first dimension per sequence")
        rows = int(t.shape[0])
        if tokens is None:
            kind = "seq"
            if rows != n:
                raise ValueError(
                    f"{name} has first dimension {rows} but this rank holds {n} sequences "
                    "(len(lengths)); every tensor needs one row per sequence"
                )
        elif token_keys is not None:
            kind = "token" if key in token_keys else "seq"
            want = tokens if kind == "token" else n
            if rows != want:
                unit = "tokens" if kind == "token" else "sequences"
                raise ValueError(
                    f"{name} has first dimension {rows} but there are {want} {unit} "
                    f"({'listed' if kind == 'token' else 'not listed'} in token_keys)"
                )
        else:
            is_seq, is_tok = rows == n, rows == tokens
            if not (is_seq or is_tok):
                raise ValueError(
                    f"{name} has first dimension {rows}, which is neither the number of "
                    f"sequences ({n}) nor of tokens ({tokens}); give one row per sequence "
                    "or per token"
                )
            kind = "either" if is_seq and is_tok else ("seq" if is_seq else "token")
            if kind == "either" and bool((lens == 1).all()):
                kind = "unit"  # one token per sequence (or none): both readings agree
        out[key] = (kind, t.dtype, tuple(int(s) for s in t.shape[1:]), rows)
    return out


def _resolve(
    metas: Sequence[dict[str, Any]],
    pad_values: Mapping[str, float] | None,
    what: str,
) -> dict[str, Spec]:
    """Agree on one :class:`Spec` per key from every rank's description (same on all ranks)."""
    keysets = [tuple(m["keys"]) for m in metas]
    if any(ks != keysets[0] for ks in keysets):
        detail = ", ".join(f"rank {r}: {list(ks)}" for r, ks in enumerate(keysets))
        raise ValueError(f"{what} must have the same keys on every rank; got {detail}")
    specs = {}
    for key in keysets[0]:
        descs = [m["keys"][key] for m in metas]
        name = f"{what}[{key!r}]" if key != _SINGLE else what
        seen = {d[0] for d in descs}
        kinds = seen - {"either", "unit"}
        if len(kinds) > 1:
            raise ValueError(
                f"{name} is per-token on some ranks and per-sequence on others (from the "
                "shapes); pass token_keys to say which"
            )
        if not kinds and "either" not in seen:
            kinds = {"seq"}
        if not kinds:
            raise ValueError(
                f"{name} has as many rows as both sequences and tokens on every rank, so it "
                "is ambiguous; pass token_keys to say whether it is per token"
            )
        level = kinds.pop()
        full = [d for d in descs if d[3] > 0] or descs[:1]
        dtypes = {d[1] for d in full}
        if len(dtypes) > 1:
            raise ValueError(
                f"{name} has different dtypes on different ranks ({sorted(map(str, dtypes))}); "
                "cast it to one dtype everywhere"
            )
        shapes = sorted({d[2] for d in full})
        trailing = shapes[0]
        if len(shapes) > 1:
            can_pad = (
                pad_values is not None
                and key in pad_values
                and level == "seq"
                and len({len(s) for s in shapes}) == 1
                and len(shapes[0]) >= 1
                and len({s[1:] for s in shapes}) == 1
            )
            if not can_pad:
                raise ValueError(
                    f"{name} has trailing shapes {shapes} on different ranks; pad every rank "
                    f"to the same shape, or pass pad_values={{{key!r}: <pad>}} to right-pad "
                    "dim 1 to the longest"
                )
            trailing = (max(s[0] for s in shapes), *shapes[0][1:])
        specs[key] = Spec(level, next(iter(dtypes)), trailing)
    return specs


def _check_pad_values(pad_values: Any, tensors: Mapping[str, Any], what: str) -> None:
    """Refuse, before the first collective, a pad value that ``_pad`` could not write.

    Padding happens after the ranks agreed, and only on the ranks whose rows are narrower:
    a value that fails there would leave the other ranks waiting in the exchange.
    """
    if pad_values is None:
        return
    if not isinstance(pad_values, Mapping):
        raise ValueError(
            f"pad_values must be a dict of key -> number, got {type(pad_values).__name__}"
        )
    for key, value in pad_values.items():
        if key not in tensors:
            raise ValueError(
                f"pad_values names {key!r}, which is not a key of the {what} (keys: "
                f"{sorted(map(str, tensors))}); fix the name or leave it out"
            )
        t = tensors[key]
        dtype = t.dtype if isinstance(t, torch.Tensor) else None
        ok = isinstance(value, (int, float, np.integer, np.floating))
        if ok and dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            v = float(value)
            if dtype == torch.bool:
                ok = v in (0.0, 1.0)
            else:
                info = torch.iinfo(dtype)
                ok = bool(np.isfinite(v)) and v == int(v) and info.min <= int(value) <= info.max
        if not ok:
            raise ValueError(
                f"pad_values[{key!r}] = {value!r} cannot pad a tensor of dtype {dtype}: give "
                "a number the dtype holds exactly (an integer in its range for integer "
                "tensors, 0 or 1 for bool)"
            )


def _pad(t: torch.Tensor, spec: Spec, value: float | None) -> torch.Tensor:
    extra = spec.trailing[0] - t.shape[1] if t.dim() >= 2 else 0
    if extra <= 0 or value is None:
        return t
    # F.pad pads the last dims first: pad nothing after dim 1, `extra` at the end of dim 1.
    pad = [0, 0] * (t.dim() - 2) + [0, extra]
    return F.pad(t, pad, value=value)


def _as_dict(outputs: Any, what: str) -> tuple[dict[str, Any], bool]:
    if isinstance(outputs, torch.Tensor):
        return {_SINGLE: outputs}, True
    if isinstance(outputs, Mapping):
        return dict(outputs), False
    raise ValueError(
        f"{what} must be a tensor or a dict of tensors, got {type(outputs).__name__}"
    )


def _device_of(tensors: Mapping[str, Any]) -> torch.device:
    devs = {t.device for t in tensors.values() if isinstance(t, torch.Tensor)}
    if len(devs) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    return devs.pop() if devs else torch.device("cpu")


class RebalanceHandle:
    """What :func:`rebalance` did, and the way back.

    Attributes
    ----------
    plan : Plan or None
        The plan every rank computed (None when a custom layout was used).
    rank, world_size : int
        This rank and the group size.
    num_micro_batches : int
        Micro-batches on every rank.
    micro_batch_lengths : list of np.ndarray
        Token counts of the sequences in each of this rank's micro-batches.
    source_rank, source_index : np.ndarray
        For each sequence this rank now holds (in micro-batch order), the rank and local
        index it came from.
    global_lengths : np.ndarray
        Lengths of all sequences, rank-major in original order (rank 0's first).
    """

    def __init__(
        self,
        *,
        plan: Any,
        group: Any,
        rank: int,
        world_size: int,
        counts: np.ndarray,
        global_lengths: np.ndarray,
        micro_batches: list[list[np.ndarray]],
        method: str,
        device: torch.device,
    ) -> None:
        self.plan = plan
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.global_lengths = global_lengths
        self.method = method
        self.device = device
        self._counts = counts
        self._id: str | None = None
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._src = [
            np.arange(offsets[r], offsets[r + 1], dtype=np.int64) for r in range(world_size)
        ]
        self._dst = [
            np.concatenate([np.asarray(mb, dtype=np.int64) for mb in rank_mbs])
            if rank_mbs
            else np.zeros(0, dtype=np.int64)
            for rank_mbs in micro_batches
        ]
        self._mine = micro_batches[rank]
        held = self._dst[rank]
        self.source_rank = np.searchsorted(offsets, held, side="right") - 1
        self.source_index = held - offsets[self.source_rank]
        self.micro_batch_lengths = [
            global_lengths[np.asarray(mb, dtype=np.int64)] for mb in self._mine
        ]

    @property
    def num_micro_batches(self) -> int:
        return len(self._mine)

    def _identity(self) -> str:
        """A digest of the global layout, the same on every rank of one rebalance call."""
        if self._id is None:
            layout = np.concatenate([self._counts, self.global_lengths, *self._dst])
            self._id = canonical(layout.astype(np.int64))
        return self._id

    @property
    def num_sequences(self) -> int:
        """Sequences this rank holds after the rebalance."""
        return int(self._dst[self.rank].shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens this rank holds after the rebalance."""
        return int(self.global_lengths[self._dst[self.rank]].sum())

    @property
    def global_num_tokens(self) -> int:
        """Tokens on all ranks together (a ready denominator for a token-mean loss)."""
        return int(self.global_lengths.sum())

    def __repr__(self) -> str:
        return (
            f"RebalanceHandle(rank={self.rank}, world_size={self.world_size}, "
            f"num_micro_batches={self.num_micro_batches}, num_sequences={self.num_sequences})"
        )

    def restore(
        self,
        outputs: Outputs | Sequence[Outputs],
        *,
        token_keys: Collection[str] | None = None,
    ) -> Any:
        """Send per-sequence results back to the rank and position each sequence came from.

        Collective: every rank of the group must call it, with the same keys. A local
        problem of any type on one rank (wrong row counts, tensors ``torch.cat`` rejects...)
        raises the same ValueError on every rank, before any data moves.

        Parameters
        ----------
        outputs : tensor, dict of tensors, or a list of either (one per micro-batch)
            Results in this rank's micro-batch order: first dimension = sequences this rank
            holds (``num_sequences``) for per-sequence results, or tokens (``num_tokens``,
            packed in the same order) for per-token results. A list is concatenated first.
        token_keys : collection of str, optional
            Keys that are per token; by default read from the first dimensions (pass it when
            the two counts coincide). For a bare tensor, any non-empty value marks it per
            token.

        Returns
        -------
        tensor or dict of tensors
            The same structure, with rows in the original order of this rank's batch:
            first dimension = the sequences (or their tokens, packed) it passed to
            :func:`rebalance`. Values are bit-exact copies.
        """
        what = "outputs"
        held = self._dst[self.rank]
        lens = self.global_lengths[held]
        # Local problems of any type are reported through the all-gather (agree), so every
        # rank raises the same error and none waits in the exchange.
        try:
            if isinstance(outputs, (list, tuple)):
                if len(outputs) != self.num_micro_batches:
                    raise ValueError(
                        f"outputs is a list of {len(outputs)} items but this rank has "
                        f"{self.num_micro_batches} micro-batches; pass one item per "
                        "micro-batch or one concatenated tensor/dict"
                    )
                outputs = _concat(outputs)
            tensors, single = _as_dict(outputs, what)
            if not single:  # for a bare tensor any non-empty token_keys marks it per token
                check_token_keys(token_keys)
            if single and token_keys:
                token_keys = {_SINGLE}
            keys = _describe(tensors, len(held), int(lens.sum()), lens, token_keys, what)
            device = _device_of(tensors)
            error: Exception | None = None
        except Exception as exc:
            tensors, single, keys, error = {}, False, {}, exc
            device = self.device
        fingerprint = {
            "token_keys": None if token_keys is None else sorted(token_keys),
            # Every rank holds the same global view of one rebalance call, so a handle from
            # another call (another step) on some rank shows up here, not as a gloo abort.
            "handle (the rebalance call it comes from)": self._identity(),
        }
        metas = agree(error, fingerprint, {"keys": keys}, self.group, "restore")
        specs = _resolve(metas, None, what)
        rows = {
            k: to_rows(tensors[k], int(tensors[k].shape[0])) for k in specs
        }
        moved = move(
            rows,
            specs,
            self._dst,
            self._src,
            self.global_lengths,
            group=self.group,
            method=self.method,
            device=device,
        )
        out = {k: from_rows(moved[k], specs[k]) for k in specs}
        return out[_SINGLE] if single else out


def _concat(items: Sequence[Outputs]) -> Outputs:
    if all(isinstance(x, torch.Tensor) for x in items):
        return torch.cat(cast("list[torch.Tensor]", list(items)))
    if all(isinstance(x, Mapping) for x in items):
        keys = list(items[0])
        if any(list(x) != keys for x in items):
            raise ValueError("outputs: every micro-batch's dict must have the same keys")
        return {k: torch.cat([x[k] for x in items]) for k in keys}
    raise ValueError("outputs: a list must hold only tensors or only dicts of tensors")


def spec_options(
    spec: Any, max_tokens: Any, num_replicas: Any, cost: Any, sync: Any,
    plan_options: dict[str, Any],
) -> tuple[Any, Any, Any, Any]:
    """``(max_tokens, num_replicas, cost, sync)`` of a sampler or rebalance given
    ``spec=``; its other options go to ``plan_options`` by their flat names (each of those
    given next to the spec is refused, as are values that differ from the spec's)."""
    if not isinstance(spec, PlanSpec):
        raise ArgumentError(
            f"spec must be a seqbalance.planning.request.PlanSpec, got {type(spec).__name__}",
            argument="spec",
        )
    said = [k for k in plan_options if k in FLAT_KEYWORDS or k == "effort"]
    if said:
        name = said[0]
        raise ArgumentError(
            f"{name}= was passed next to spec=; put it in the spec", argument=name
        )
    for name, given, own in (("max_tokens", max_tokens, spec.capacity.max_tokens),
                             ("num_replicas", num_replicas, spec.mesh.dp)):  # fmt: skip
        if given is not None and given != own:
            raise ArgumentError(
                f"{name}={given!r} differs from the spec's {own}; give it once", argument=name
            )
    if sync is not None:
        raise ArgumentError(
            "sync= was passed next to spec=; the spec's mesh says it (Mesh(sync=...))",
            argument="sync",
        )
    if cost is not None and spec.cost is not None:
        raise ArgumentError("cost= was passed next to a spec with a cost; give it once",
                            argument="cost")  # fmt: skip
    flat = spec.keywords()
    defaults = PlanSpec.from_keywords(1, 1).keywords()
    for name in ("dp_size", "max_tokens", "sync", "cost"):
        flat.pop(name)
    plan_options.update(
        (k, v) for k, v in flat.items()
        if not (isinstance(v, np.ndarray) or (v is None and defaults[k] is None))
        and (k == "groups" or v != defaults[k])
    )  # fmt: skip
    if spec.rules.groups is not None:
        plan_options["groups"] = spec.rules.groups
    if spec.effort != "default":
        plan_options["effort"] = spec.effort
    return (spec.capacity.max_tokens, spec.mesh.dp,
            spec.cost if cost is None else cost, spec.mesh.sync)  # fmt: skip


def rebalance(
    batch: Mapping[str, torch.Tensor],
    lengths: Any = None,
    *,
    max_tokens: int | None = None,
    cost: Any = None,
    sync: str | None = None,
    group: Any = None,
    token_keys: Collection[str] | None = None,
    pad_values: Mapping[str, float] | None = None,
    cu_seqlens_key: str = "cu_seqlens",
    method: str = "auto",
    groups: Any = None,
    spec: PlanSpec | None = None,
    **plan_options: Any,
) -> tuple[list[dict[str, torch.Tensor]], RebalanceHandle]:
    """Balance the sequences held by the ranks of ``group`` and move them into place.

    Collective: every rank of the group must call it. The ranks all-gather lengths, each
    computes the same :func:`seqbalance.planning.planner.plan`, and rows move in one exchange
    (``all_to_all_single`` where the backend has it, ``isend``/``irecv`` otherwise).

    Parameters
    ----------
    batch : dict of str to tensor
        This rank's sequences, padded rows or packed with ``cu_seqlens`` (see the module
        docstring for both layouts). May hold zero sequences.
    lengths : array-like of int, optional
        Tokens per sequence of this rank (what the plan balances and ``max_tokens``
        bounds). Required for padded rows; for packed batches defaults to
        ``diff(cu_seqlens)``.
    max_tokens : int
        Token capacity of a micro-batch.
    cost : None, str, cost model, or array-like, optional
        Passed to the planner. An array gives one cost per sequence of *this* rank; the
        ranks gather it along with the lengths.
    sync : {"fsdp", "ddp"}, optional
        When ranks wait for each other; see the planner.
    group : ProcessGroup, optional
        Process group (default: the world).
    token_keys : collection of str, optional
        Packed layout only: the keys that hold one row per token (default: read from the
        shapes on all ranks together).
    pad_values : dict of str to number, optional
        Padded layout: for these keys, right-pad dim 1 to the largest size on any rank with
        the given value instead of requiring equal shapes.
    cu_seqlens_key : str, optional
        Name of the cumulative-lengths key that marks a packed batch.
    method : {"auto", "all_to_all", "p2p"}, optional
        Exchange path. ``auto`` tries ``all_to_all_single`` and falls back to point-to-point
        where the backend does not support it.
    groups : array-like, optional
        Group id per sequence of this rank (numbers or strings; a list, array, tensor or
        pandas Series). Ids are global: equal ids on two ranks are one group. The ids are
        gathered with the lengths, and the planner keeps every group on one rank.
    spec : PlanSpec, optional
        The planner's request as values (:class:`~seqbalance.planning.request.PlanSpec`)
        in place of ``**plan_options`` (then empty): its capacity is ``max_tokens``, its
        mesh's ``sync`` the sync model and its ``dp`` the size of ``group``; ``cost`` goes
        in the spec or here, not both.
    **plan_options
        Forwarded to the planner (``min_micro_batches``, ``micro_batch_multiple``,
        ``padded``, ``allow_empty``, ``size``...). Like ``max_tokens``, ``cost`` (unless an
        array), ``sync`` and ``method``, they must be the same on every rank; the first
        all-gather checks that they are. ``cp_size=C`` plans static context parallelism
        for a framework that cuts each sequence over a replica's ``C`` CP ranks itself:
        ``group`` is the data-parallel group (one rank per replica; call it on every CP
        rank, each over its own data-parallel group), ``max_tokens`` is per GPU and
        bounds a sequence's largest piece, and each rank receives its replica's whole
        sequences (:meth:`~seqbalance.planning.cp_plans.CPPlan.replica_micro_batches`).
        ``cp="dynamic"`` is refused (:func:`seqbalance.torch.cp_shard` cuts its pieces).

    Returns
    -------
    micro_batches : list of dict
        This rank's micro-batches, in order, in the layout of ``batch`` (the same number on
        every rank).
    handle : RebalanceHandle
        The plan and the way back (:meth:`RebalanceHandle.restore`).

    Raises
    ------
    ValueError
        On every rank, with the same message: if any rank's input is malformed (any
        exception raised while checking it locally, reported with its type), the ranks
        pass different planner or exchange arguments, disagree on keys, dtypes or shapes,
        or the planner rejects the lengths (e.g. a sequence longer than ``max_tokens``).
    """
    from seqbalance.planning.planner import plan as make_plan

    _, world = group_info(group)
    if spec is not None:
        plan_options = dict(plan_options)
        max_tokens, dp, cost, sync = spec_options(spec, max_tokens, None, cost, sync,
                                                  plan_options)  # fmt: skip
        if "groups" in plan_options:
            raise ArgumentError(
                "the spec has RankRules(groups=...), but rebalance's groups are each rank's "
                "own: pass groups= (this rank's group ids) and a spec without groups",
                argument="spec",
            )
        if dp != world:
            raise ArgumentError(
                f"the spec's mesh has dp={dp} but the group has {world} ranks; give the "
                "data-parallel group its mesh's size",
                argument="dp_size",
            )
    elif max_tokens is None:
        raise TypeError("rebalance() needs max_tokens= (or spec= with a capacity)")
    sync = "fsdp" if sync is None else sync
    options = dict(plan_options, sync=sync)

    def check() -> dict[str, Any]:
        """Local checks of the planner arguments; returns what must agree across ranks."""
        check_max_tokens(max_tokens, "max_tokens")
        if "groups" in plan_options or "cost" in plan_options:
            raise TypeError("pass groups= and cost= as rebalance's own arguments")
        cp_size_of("rebalance", plan_options)
        # An unknown keyword or a bad option fails here, on its rank, instead of after
        # the exchange; the checked request is what the ranks must agree on.
        flat = dict(options)
        effort = flat.pop("effort", "default")
        spec = PlanSpec.from_keywords(world, max_tokens, effort=effort, flat=flat)
        agreed = {k: v for k, v in spec.keywords().items() if k not in ("cost", "groups")}
        agreed["effort"] = spec.effort
        # Every rank plans the same global layout on its own; a rank inside
        # exact_searches(True) among ranks outside it could plan another one.
        agreed["exact_searches"] = exact_searches_enabled()
        return agreed

    def check_lengths(lens: np.ndarray) -> None:
        """A sequence above the cap, named by this rank's own index (the planner would name
        it by its index in the gathered batch, and not say which rank holds it)."""
        if options.get("oversized", "error") != "error":
            return  # planned alone: the planner decides
        cp = cp_size_of("rebalance", plan_options)
        problem = too_long_for_cp(lens, max_tokens, cp, item="this rank's sequence")
        if problem:
            raise ValueError(
                f"{problem}; raise max_tokens, split or truncate such sequences, or pass "
                "oversized='alone'"
            )

    def layout(
        global_lengths: np.ndarray, global_costs: np.ndarray | None, groups: Any = None
    ) -> Any:
        p = make_plan(
            global_lengths,
            world,
            max_tokens,
            cost=global_costs if global_costs is not None else cost,
            groups=groups,
            **options,
        )
        return p, [[np.asarray(mb, dtype=np.int64) for mb in mbs] for mbs in replica_grid(p)]

    return _rebalance(
        batch,
        lengths,
        layout,
        cost=cost,
        groups=groups,
        group=group,
        token_keys=token_keys,
        pad_values=pad_values,
        cu_seqlens_key=cu_seqlens_key,
        method=method,
        check=check,
        check_lengths=check_lengths,
    )


def _local_costs(cost: Any, n: int) -> np.ndarray | None:
    """Per-sequence costs given as an array travel with the lengths; other forms do not."""
    if not is_array_like(cost):
        return None
    arr = as_weights(cost, "cost")
    if arr.shape[0] != n:
        raise ValueError(f"cost has {arr.shape[0]} entries but this rank holds {n} sequences")
    return arr


def _local_groups(groups: Any, n: int) -> np.ndarray | None:
    """This rank's group ids (numbers or strings), checked for length; gathered as given."""
    if groups is None:
        return None
    ids = group_ids(groups, "groups")
    if ids.shape[0] != n:
        raise ValueError(
            f"groups has {ids.shape[0]} entries but this rank holds {n} sequences; pass one "
            "group id per sequence"
        )
    return ids


def _global_groups(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate every rank's group ids, refusing strings on some ranks, numbers on others."""
    kinds = {"strings" if p.dtype.kind in "US" else "numbers" for p in parts if p.size}
    if len(kinds) > 1:
        raise ValueError(
            "rebalance: groups are strings on some ranks and numbers on others; use one kind "
            "of id everywhere (ids are global: equal ids on two ranks are one group)"
        )
    full = [p for p in parts if p.size]
    if not full:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(full)


def _rebalance(
    batch: Mapping[str, torch.Tensor],
    lengths: Any,
    layout: Any,
    *,
    cost: Any = None,
    group: Any = None,
    token_keys: Collection[str] | None = None,
    pad_values: Mapping[str, float] | None = None,
    cu_seqlens_key: str = "cu_seqlens",
    method: str = "auto",
    groups: Any = None,
    check: Callable[[], Mapping[str, Any]] | None = None,
    check_lengths: Callable[[np.ndarray], None] | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    what: str = "rebalance",
) -> tuple[list[dict[str, torch.Tensor]], RebalanceHandle]:
    """:func:`rebalance` with the plan replaced by ``layout(global_lengths, global_costs)``
    (and ``groups=global_group_ids`` when ``groups`` is given), which returns
    ``(plan_or_None, micro_batches[rank][j] -> global ids)``.

    ``check()`` runs locally before the first collective and returns the arguments that
    must agree across ranks (any exception it raises is reported on every rank);
    ``check_lengths(lengths)`` checks this rank's lengths there too, so a problem is named
    with its rank and local index; ``fingerprint`` adds more. The exchange's own options
    (method, token_keys, pad_values, cu_seqlens_key, the cost's identity, whether groups
    are given) always take part.
    """
    rank, world = group_info(group)
    packed = isinstance(batch, Mapping) and cu_seqlens_key in batch
    meta: dict[str, Any] = {"keys": {}, "lengths": None, "costs": None, "groups": None}
    agreed: dict[str, Any] = dict(fingerprint or {})
    error: Exception | None = None
    cu_dtype = torch.int32
    max_seqlen: tuple[torch.dtype | None] | None = None  # (dtype or None for int) if given
    # Local problems of any type are reported through the first all-gather (agree), so
    # every rank raises the same error and none is left waiting in a collective.
    try:
        check_token_keys(token_keys)
        agreed.update(
            method=method,
            token_keys=None if token_keys is None else sorted(token_keys),
            pad_values=None if pad_values is None else dict(pad_values),
            cu_seqlens_key=cu_seqlens_key,
            groups="given" if groups is not None else None,
            **{"batch layout": "packed (cu_seqlens)" if packed else "padded rows"},
        )
        check_choice(method, "method", METHODS)
        agreed["cost"] = describe_cost(cost)
        if check is not None:
            agreed.update(check())
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a dict of tensors, got {type(batch).__name__}")
        tensors = {k: v for k, v in batch.items() if k != cu_seqlens_key}
        if packed and _MAX_SEQLEN in tensors and _MAX_SEQLEN != cu_seqlens_key:
            max_seqlen = (_max_seqlen_kind(tensors.pop(_MAX_SEQLEN)),)
        if packed:
            cu = batch[cu_seqlens_key]
            if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.shape[0] < 1:
                raise ValueError(
                    f"batch[{cu_seqlens_key!r}] must be a 1-D tensor of n + 1 offsets"
                )
            if not is_integer_dtype(cu.dtype):
                raise ValueError(
                    f"batch[{cu_seqlens_key!r}] must be an integer tensor of offsets, got "
                    f"{cu.dtype}; offsets in another dtype would be truncated"
                )
            cu_dtype = cu.dtype
            cu_np = cu.detach().cpu().numpy().astype(np.int64)
            if cu_np[0] != 0 or (np.diff(cu_np) < 0).any():
                raise ValueError(
                    f"batch[{cu_seqlens_key!r}] must start at 0 and never decrease, got "
                    f"{cu_np[:8].tolist()}..."
                )
            derived = np.diff(cu_np)
            if lengths is None:
                lens = derived
            else:
                lens = as_lengths(lengths, "lengths")
                if lens.shape != derived.shape or (lens != derived).any():
                    raise ValueError(
                        "lengths must equal diff(cu_seqlens) for a packed batch (or be "
                        "left out)"
                    )
            tokens: int | None = int(cu_np[-1])
        else:
            if lengths is None:
                raise ValueError(
                    "lengths is required for a padded batch (one token count per row); "
                    f"or pack the batch and pass {cu_seqlens_key!r}"
                )
            lens = as_lengths(lengths, "lengths")
            tokens = None
            if token_keys:
                raise ValueError("token_keys applies to packed batches (with cu_seqlens) only")
        if check_lengths is not None:
            check_lengths(lens)
        _check_pad_values(pad_values, tensors, "batch")
        meta["keys"] = _describe(tensors, len(lens), tokens, lens, token_keys, "batch")
        meta["lengths"] = lens
        meta["costs"] = _local_costs(cost, len(lens))
        meta["groups"] = _local_groups(groups, len(lens))
        device = _device_of(tensors)
    except Exception as exc:
        error = exc
        tensors, device, lens = {}, torch.device("cpu"), np.zeros(0, dtype=np.int64)
    metas = agree(error, agreed, meta, group, what)
    # From here on every decision depends only on what every rank received, so an error
    # raised below is raised on every rank alike.
    has_costs = [m["costs"] is not None for m in metas]
    if any(has_costs) and not all(has_costs):
        raise ValueError("rebalance: cost is an array on some ranks but not on others")
    specs = _resolve(metas, pad_values, "batch")
    counts = np.array([len(m["lengths"]) for m in metas], dtype=np.int64)
    global_lengths = np.concatenate([m["lengths"] for m in metas]).astype(np.int64)
    global_costs = (
        np.concatenate([m["costs"] for m in metas]) if all(has_costs) else None
    )

    if groups is None:
        plan, micro = layout(global_lengths, global_costs)
    else:
        ids = _global_groups([m["groups"] for m in metas])
        plan, micro = layout(global_lengths, global_costs, groups=ids)
    handle = RebalanceHandle(
        plan=plan,
        group=group,
        rank=rank,
        world_size=world,
        counts=counts,
        global_lengths=global_lengths,
        micro_batches=micro,
        method=method,
        device=device,
    )
    pads = pad_values or {}
    rows = {
        k: to_rows(_pad(tensors[k], specs[k], pads.get(k)), int(tensors[k].shape[0]))
        for k in specs
    }
    moved = move(
        rows,
        specs,
        handle._src,
        handle._dst,
        global_lengths,
        group=group,
        method=method,
        device=device,
    )
    full = {k: from_rows(moved[k], specs[k]) for k in specs}

    # Cut the held rows into micro-batches.
    seq_sizes = [len(mb) for mb in handle._mine]
    tok_sizes = [int(x.sum()) for x in handle.micro_batch_lengths]
    pieces = {
        k: torch.split(v, seq_sizes if specs[k].level == "seq" else tok_sizes)
        for k, v in full.items()
    }
    out: list[dict[str, torch.Tensor]] = []
    for j, mb_lens in enumerate(handle.micro_batch_lengths):
        mb: dict[str, Any] = {k: pieces[k][j] for k in batch if k in pieces}
        if packed:
            offsets = np.concatenate([[0], np.cumsum(mb_lens)])
            mb[cu_seqlens_key] = torch.as_tensor(offsets, dtype=cu_dtype, device=device)
            if max_seqlen is not None:
                longest = int(mb_lens.max()) if len(mb_lens) else 0
                kind = max_seqlen[0]
                mb[_MAX_SEQLEN] = (
                    longest if kind is None
                    else torch.tensor(longest, dtype=kind, device=device)
                )  # fmt: skip
            mb = {k: mb[k] for k in batch}  # keep the caller's key order
        out.append(mb)
    return out, handle

