"""Ulysses sequence parallelism: one GPU's share of a sequence spread over ``sp`` GPUs.

Under DeepSpeed-Ulysses (verl's ``ulysses_sequence_parallel_size``, the all-to-all form of
sequence parallelism) the ``sp`` GPUs of a group share every micro-batch: each holds
``1/sp`` of its tokens for the linear layers, and before attention an all-to-all trades
tokens for heads, so each GPU computes the attention of all tokens for ``1/sp`` of the
heads; a second all-to-all trades them back. Every GPU of the group therefore does
``1/sp`` of the micro-batch's work, whatever the lengths, and the group behaves as one
data-parallel rank whose micro-batches may hold ``sp`` times the tokens of one GPU (verl
multiplies its per-GPU token budget by ``sp`` in the same way).

The communication is linear in the tokens. Per layer, each GPU sends ``(sp - 1) / sp`` of
its ``L / sp`` tokens' Q, K, V (before attention) and O (after); the backward sends their
gradients, so a training step moves

    comm_passes * (sp - 1) / sp**2 * L * bytes_per_token

bytes per GPU, with ``comm_passes = 2`` (forward and backward) and ``bytes_per_token`` the
Q, K, V and O bytes of one token over all layers (:func:`ulysses_bytes_per_token`; K/V
heads fewer than ``sp`` are repeated to ``sp``, as implementations do). At ``bandwidth``
bytes/s per GPU, not hidden behind compute, the per-sequence cost is

    cost(L) / sp + comm_passes * (sp - 1) / sp**2 * L * bytes_per_token / bandwidth
                   * cost_per_second

so :class:`UlyssesCost` is again ``a + b·L + c·L²``, with ``a``, ``b``, ``c`` divided by
``sp``, the communication added to ``b``, and ``c0`` kept (every GPU pays the per-step
overhead). It plans with every option of :func:`~seqbalance.plan`: equal counts, groups,
pipeline schedules. Ulysses splits heads, so ``sp`` must divide the attention heads, and
the K/V heads must divide ``sp`` or be a multiple of it; :class:`UlyssesCost` checks that
for a :class:`~seqbalance.costs.FlopsCost`. Pipeline schedules split the communication,
folded into ``b``, by ``backward_matmul`` like the matmuls (1:2 forward to backward where
it is 1:1): an approximation of the phases, not of the total.

Plan with the group as the rank: ``plan(lengths, dp_size=world // (sp * tp * pp),
max_tokens=per_gpu_tokens * sp, cost=UlyssesCost(cost, sp))``. A cost fitted to timings
taken under Ulysses is already one GPU's share: plan with it as it is (a refit started
from a :class:`UlyssesCost` records the group size in ``meta["ulysses_sp_size"]``, which
:func:`ulysses_sp_size` reads).

Examples
--------
>>> from seqbalance.costs import QuadraticCost
>>> u = UlyssesCost(QuadraticCost(per_token=4.0, per_token_sq=0.5), sp_size=4)
>>> u([2, 4])
array([2.5, 6. ])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._notes import Note
from .._validate import ArgumentError, as_lengths, check_nonnegative_real, check_positive_int
from .base import FROM_DICT, CostModel, check_keys, cost_from_dict, finite_costs

__all__ = ["UlyssesCost", "ulysses_bytes_per_token", "ulysses_sp_size"]


def ulysses_sp_size(cost: Any) -> int | None:
    """The Ulysses group size ``cost`` is already one GPU's share of, or None.

    That is a :class:`UlyssesCost`'s ``sp_size``, or the ``meta["ulysses_sp_size"]`` a
    refit of timings taken under one records (``TimingRecorder.refit``): dividing such a
    cost by the group size again would count a GPU's work ``sp`` times too small.

    Examples
    --------
    >>> from seqbalance.costs import TokenCost
    >>> ulysses_sp_size(UlyssesCost(TokenCost(), 4)), ulysses_sp_size(TokenCost())
    (4, None)
    """
    if isinstance(cost, UlyssesCost):
        return cost.sp_size
    sp = (getattr(cost, "meta", None) or {}).get("ulysses_sp_size")
    return int(sp) if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1 else None

_KEYS = ("kind", "cost", "sp_size", "bandwidth", "cost_per_second", "bytes_per_token",
         "comm_passes")  # fmt: skip


def _architecture(cost: Any) -> Any:
    return getattr(cost, "architecture", None)


def _splits(heads: int, kv_heads: int, sp: int) -> bool:
    """Whether ``sp`` GPUs each get whole query heads and whole (or repeated) K/V heads."""
    return heads % sp == 0 and (kv_heads % sp == 0 or sp % kv_heads == 0)


def check_heads(cost: Any, sp_size: int) -> None:
    """Refuse an ``sp_size`` that does not split ``cost``'s attention heads evenly (only a
    :class:`~seqbalance.costs.FlopsCost` knows its heads; other costs pass)."""
    arch = _architecture(cost)
    if arch is None or sp_size == 1:
        return
    kinds = sorted({(x.attention.heads, x.attention.kv_heads) for x in arch.layers})
    bad = next(((h, kv) for h, kv in kinds if not _splits(h, kv, sp_size)), None)
    if bad is None:
        return
    heads, kv = bad
    fits = [d for d in range(2, max(h for h, _ in kinds) + 1)
            if all(_splits(h, k, d) for h, k in kinds)]  # fmt: skip
    name = getattr(cost, "name", None) or "the model"
    why = (
        "{heads} heads, not a multiple of {@sp_size:{sp_size}}" if heads % sp_size
        else "{kv} K/V heads, neither a multiple nor a divisor of {@sp_size:{sp_size}}"
    )
    use = "use {@sp_size} {fits}" if fits else "no {@sp_size} > 1 fits"
    raise ArgumentError(Note(
        "argument",
        {"name": name, "heads": heads, "kv": kv, "sp_size": sp_size,
         "fits": ", ".join(map(str, fits))},
        "Ulysses gives each of the {@sp_size} GPUs whole attention heads, and {name} has "
        + why + "; " + use + ", and give the rest of the degree to ring context parallelism "
        "({@cp_size}), which splits tokens, not heads",
    ), argument="sp_size")  # fmt: skip


def ulysses_bytes_per_token(cost: Any, sp_size: int, dtype_bytes: float = 2) -> float:
    """Bytes one token's Q, K, V and O take over all layers, as Ulysses sends them.

    ``sum over layers of (heads * (qk_head_dim + v_head_dim) + kv * (qk_head_dim +
    v_head_dim)) * dtype_bytes`` with ``kv = max(kv_heads, sp_size)``: K/V heads fewer than
    ``sp_size`` are repeated so that each GPU gets one. MLA layers count the heads they
    materialise, with V and O at ``v_head_dim`` (an implementation that pads V to
    ``qk_head_dim`` for its kernel sends more: pass ``bytes_per_token``). Needs a
    :class:`~seqbalance.costs.FlopsCost` (it reads the architecture).

    Examples
    --------
    >>> from seqbalance.costs import FlopsCost
    >>> ulysses_bytes_per_token(FlopsCost.from_name("llama-2-7b"), 4)  # 32 layers, MHA
    1048576.0
    """
    sp = check_positive_int(sp_size, "sp_size")
    bytes_each = check_nonnegative_real(dtype_bytes, "dtype_bytes")
    if bytes_each == 0:
        raise ValueError("dtype_bytes must be > 0 (bytes per value: 2 for bf16)")
    arch = _architecture(cost)
    if arch is None:
        raise ValueError(
            f"ulysses_bytes_per_token needs a FlopsCost (it reads the architecture), got "
            f"{type(cost).__name__}; pass bytes_per_token= explicitly instead"
        )
    total = 0
    for layer in arch.layers:
        att = layer.attention
        width = att.qk_head_dim + att.v_head_dim
        total += (att.heads + max(att.kv_heads, sp)) * width
    return float(total * bytes_each)


class UlyssesCost(CostModel):
    """One GPU's cost of a sequence under Ulysses sequence parallelism over ``sp_size``.

    Parameters
    ----------
    cost : CostModel
        The cost of a sequence on one GPU without sequence parallelism (a
        :class:`FlopsCost`, a calibrated :class:`QuadraticCost`, tokens).
    sp_size : int
        GPUs of a Ulysses group (>= 1; it must split the attention heads evenly).
    bandwidth : float, optional
        Bytes per second each GPU sends in the all-to-all. None: communication is free.
    cost_per_second : float, optional
        Cost units per second (1 for a cost in seconds, the achieved FLOP/s for a FLOP
        cost); default as :class:`ContextParallelCost`'s.
    bytes_per_token : float, optional
        Q, K, V and O bytes of a token over all layers; default from a
        :class:`FlopsCost`'s architecture (:func:`ulysses_bytes_per_token`, bf16),
        required otherwise when ``bandwidth`` is given.
    comm_passes : float
        Times that volume is exchanged per training step (2: forward and backward; 1 for
        a forward-only pass).

    Raises
    ------
    ValueError
        A bad parameter, or an ``sp_size`` that does not split the model's heads.

    See the module docstring for the formula.
    """

    def __init__(
        self,
        cost: CostModel,
        sp_size: int,
        *,
        bandwidth: float | None = None,
        cost_per_second: float | None = None,
        bytes_per_token: float | None = None,
        comm_passes: float = 2.0,
    ) -> None:
        from .context_parallel import check_cost_model, link_settings

        check_cost_model(cost)
        if isinstance(cost, UlyssesCost):
            raise ValueError(
                "cost is already a UlyssesCost; give the cost of one GPU without sequence "
                "parallelism"
            )
        self.cost = cost
        self.sp_size = check_positive_int(sp_size, "sp_size")
        check_heads(cost, self.sp_size)
        self.bandwidth, self.bytes_per_token, self.cost_per_second = link_settings(
            cost, bandwidth, cost_per_second, bytes_per_token, "bytes_per_token",
            "Q, K, V and O bytes of a token over all layers",
            lambda model: ulysses_bytes_per_token(model, self.sp_size),
        )  # fmt: skip
        self.comm_passes = check_nonnegative_real(comm_passes, "comm_passes")
        self.backward_matmul = cost.backward_matmul
        self.backward_attention = cost.backward_attention
        kinds = getattr(cost, "_attention_kinds", None)
        if kinds is not None:  # sliding windows, for ring CP over Ulysses groups (USP)
            self._attention_kinds = kinds
        c0, a, b, c = cost.polynomial
        sp = self.sp_size
        self.per_microbatch = float(c0)
        self.per_sequence = float(a) / sp
        self.per_token = float(b) / sp + self.comm_per_token
        self.per_token_sq = float(c) / sp

    @property
    def comm_per_token(self) -> float:
        """Exposed all-to-all cost of one token on one GPU, in the cost's units."""
        if self.bandwidth is None or self.sp_size == 1:
            return 0.0
        sp = self.sp_size
        seconds = self.comm_passes * (sp - 1) / sp**2 * self.bytes_per_token / self.bandwidth
        return seconds * self.cost_per_second

    def __call__(self, lengths: Any) -> np.ndarray:
        lens = as_lengths(lengths)
        inner = np.asarray(self.cost(lens), dtype=np.float64)
        x = lens.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            out = inner / self.sp_size + self.comm_per_token * x
        return finite_costs(out, x, self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "ulysses",
            "cost": self.cost.to_dict(),
            "sp_size": self.sp_size,
            "bandwidth": self.bandwidth,
            "cost_per_second": self.cost_per_second,
            "bytes_per_token": self.bytes_per_token,
            "comm_passes": self.comm_passes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UlyssesCost:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, Mapping) or "cost" not in data or "sp_size" not in data:
            got = f"keys {sorted(data)}" if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                "a Ulysses cost is an object with 'cost' (the one-GPU cost's to_dict()) and "
                f"'sp_size'; got {got}"
            )
        check_keys(data, _KEYS, "a Ulysses cost")
        return cls(
            cost_from_dict(data["cost"]),
            data["sp_size"],
            bandwidth=data.get("bandwidth"),
            cost_per_second=data.get("cost_per_second"),  # absent: the constructor's default
            bytes_per_token=data.get("bytes_per_token"),
            comm_passes=data.get("comm_passes", 2.0),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UlyssesCost):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"UlyssesCost({self.cost!r}, sp_size={self.sp_size}, bandwidth={self.bandwidth}, "
            f"cost_per_second={self.cost_per_second:g}, "
            f"bytes_per_token={self.bytes_per_token:g})"
        )


FROM_DICT["ulysses"] = UlyssesCost.from_dict
