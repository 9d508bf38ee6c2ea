"""What one GPU's piece of a context-parallel (CP) sequence costs.

Under context parallelism a sequence of ``L`` tokens is split over ``d`` GPUs that run
attention together (ring attention: ``d`` steps, in each a GPU attends its queries to one
block of keys and values while the next block travels around the ring).

Layout
------
:func:`balanced_layout` is the standard load-balanced layout for causal attention: the
sequence is cut into ``2d`` chunks (boundaries ``floor(k * L / (2d))``) and rank ``r`` holds
chunks ``r`` and ``2d - 1 - r``. Causal work grows along the sequence, so pairing an early
chunk with a late one gives every rank the same work (exactly, when ``2d`` divides ``L``).

Cost of a piece
---------------
A GPU holding query ranges ``[s_k, e_k)`` of a sequence of length ``L`` split ``d`` ways
costs

    compute = a / d + b * sum_k (e_k - s_k) + c * sum_k (e_k**2 - s_k**2)
    comm    = (d - 1) * max(0, step_bytes / bandwidth * cost_per_second
                               - overlap * attention / d)
    piece   = compute + comm

with ``a, b, c`` the per-sequence, per-token and per-token-squared coefficients of the
sequence cost model (``a + b*L + c*L**2`` for the whole sequence; :class:`FlopsCost` or
:func:`fit_cost` give them). ``c * (e**2 - s**2)`` is the causal key-query work of the
queries in ``[s, e)`` (query ``t`` sees ``t + 1`` keys), so over the ``d`` pieces the compute
terms add up to exactly ``a + b*L + c*L**2``: CP moves work, it does not create it. For a
:class:`FlopsCost` with sliding windows each windowed layer's share of ``e**2 - s**2``
counts the pairs its window leaves (``2 * (P(e) - P(s))`` with ``P(x) = x**2 / 2`` up to the
window ``W`` and ``W*x - W**2/2`` past it), so there too the pieces add up to the
sequence's exact cost.

``attention = c * sum_k (e_k**2 - s_k**2)`` is this GPU's attention work; ring attention
spreads it over ``d`` steps and can hide each of the ``d - 1`` transfers behind up to
``overlap`` (0..1) of one step's attention. Each transfer carries one rank's K and V:
``step_bytes = comm_passes * (L / d) * kv_bytes_per_token``, where
``kv_bytes_per_token = sum over layers of kv_heads * (qk_head_dim + v_head_dim) * dtype_bytes``
(``2 * kv_heads * head_dim * bytes * layers`` for the usual config) and ``comm_passes = 3``
for training (forward sends K/V once around the ring; backward sends K/V again and the
gradients dK/dV). ``bandwidth`` is bytes per second per GPU on the ring's links and
``cost_per_second`` converts seconds into the cost model's units (1 for a cost in seconds,
the achieved FLOP/s for a FLOP cost). A piece with ``d = 1`` costs exactly the sequence
cost: no communication, ``a + b*L + c*L**2``.

Examples
--------
>>> from seqbalance.costs import QuadraticCost
>>> cp = ContextParallelCost(QuadraticCost(per_token=1.0, per_token_sq=0.01, per_sequence=4.0))
>>> balanced_layout(8, 2)
[[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
>>> [cp.piece_cost(8, r, 2) for r in balanced_layout(8, 2)]   # 2 + 4 + 0.01 * 32
[6.32, 6.32]
>>> float(cp.piece_cost(8, [(0, 8)], 1)) == 4.0 + 8 + 0.01 * 64
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from .._notes import Note, arg
from .._validate import (
    ArgumentError,
    as_lengths,
    check_degree,
    check_nonnegative_int,
    check_nonnegative_real,
)
from ._ratios import BACKWARD_ATTENTION, BACKWARD_MATMUL, check_ratio
from .base import CostModel, check_keys, cost_from_dict

__all__ = [
    "FLOPS_PER_SECOND",
    "ContextParallelCost",
    "balanced_layout",
    "kv_bytes_per_token",
    "largest_piece_tokens",
]


def balanced_layout(length: int, d: int) -> list[list[tuple[int, int]]]:
    """Token ranges of each of ``d`` CP ranks in the load-balanced causal layout.

    ``d = 1``: one range ``[(0, L)]``. ``d >= 2``: the sequence is cut at
    ``floor(k * L / (2d))``, ``k = 0..2d``, and rank ``r`` holds chunks ``r`` and
    ``2d - 1 - r`` (two ranges, either may be empty when ``L < 2d``).

    Examples
    --------
    >>> balanced_layout(10, 2)
    [[(0, 2), (7, 10)], [(2, 5), (5, 7)]]
    """
    length = _length(length, "length")
    d = check_degree(d, "d")
    if d == 1:
        return [[(0, length)]]
    cuts = [(k * length) // (2 * d) for k in range(2 * d + 1)]
    return [[(cuts[r], cuts[r + 1]), (cuts[2 * d - 1 - r], cuts[2 * d - r])] for r in range(d)]


def largest_piece_tokens(lengths: Any, d: int) -> np.ndarray:
    """Tokens of each sequence's largest piece when split ``d`` ways in the balanced layout.

    This is what one GPU holds of the sequence under context parallelism of degree ``d``,
    so it is what a per-GPU ``max_tokens`` bounds.

    Examples
    --------
    >>> largest_piece_tokens([10, 7, 1], 2).tolist()
    [5, 4, 1]
    """
    lens = as_lengths(lengths)
    out: np.ndarray = _layout_arrays(lens, check_degree(d, "d"))[0].max(axis=1, initial=0)
    return out


def _length(value: Any, name: str) -> int:
    """A token count: an int (not a bool) in ``0 .. 2**40 - 1``, as :func:`as_lengths`."""
    return int(as_lengths([check_nonnegative_int(value, name)], name)[0])


def _finite(costs: np.ndarray, lengths: np.ndarray, cp: ContextParallelCost) -> np.ndarray:
    """``costs`` (one row per sequence), or a ValueError naming the first sequence whose
    piece cost overflows float64 (a huge bandwidth ratio or coefficient)."""
    bad = ~np.isfinite(costs)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0])
        raise ValueError(
            f"the CP piece cost of a sequence of {int(lengths[i])} tokens overflows float64 "
            f"under {cp!r}; rescale the cost model or cost_per_second (only ratios matter)"
        )
    return costs


def _pairs2(x: Any, w: float) -> Any:
    """Twice the causal pairs of the first ``x`` queries under window ``w``: ``x²`` up to
    the window, ``2·w·x − w²`` past it (``w = inf``: no window)."""
    if np.isinf(w):
        return x * x
    return np.where(x > w, 2.0 * w * x - w * w, x * x)


def _layout_arrays(
    lengths: np.ndarray, d: int, sq: Any = lambda s, e: e * e - s * s
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank tokens and ``sum(sq(s, e))`` of the balanced layout, shape ``(n, d)``."""
    x = lengths.astype(np.int64)[:, None]
    if d == 1:
        xf = x.astype(np.float64)
        return x.copy(), sq(np.zeros_like(xf), xf)
    k = np.arange(2 * d + 1, dtype=np.int64)[None, :]
    cuts = (k * x) // (2 * d)  # int64: L * 2d stays far below 2**63
    r = np.arange(d)
    lo1, hi1 = cuts[:, r], cuts[:, r + 1]
    lo2, hi2 = cuts[:, 2 * d - 1 - r], cuts[:, 2 * d - r]
    tokens = (hi1 - lo1) + (hi2 - lo2)
    f = [a.astype(np.float64) for a in (lo1, hi1, lo2, hi2)]
    return tokens, sq(f[0], f[1]) + sq(f[2], f[3])


def _architecture_of(cost: Any) -> Any:
    """The architecture of a :class:`FlopsCost`, or of the one a UlyssesCost shares; None
    for other costs."""
    arch = getattr(cost, "architecture", None)
    if arch is None and getattr(cost, "sp_size", None):  # a UlyssesCost
        arch = getattr(getattr(cost, "cost", None), "architecture", None)
    return arch


def kv_bytes_per_token(cost: Any, dtype_bytes: float = 2) -> float:
    """Bytes of K and V one token contributes over all layers, from a :class:`FlopsCost`.

    ``sum over layers of kv_heads * (qk_head_dim + v_head_dim) * dtype_bytes``; for a config
    with one ``head_dim`` that is ``2 * kv_heads * head_dim * dtype_bytes * layers``.
    MLA layers count the K/V heads they materialise (the same formula). ``dtype_bytes``
    is a finite number > 0 (2 for bf16, 1 for fp8, 0.5 for 4-bit).

    For a :class:`~seqbalance.costs.UlyssesCost` (ring CP over Ulysses groups, "USP") the
    bytes are one GPU's: each layer's ``kv_heads`` becomes ``max(kv_heads, sp) / sp``, the
    heads a GPU of the group holds (K/V heads fewer than ``sp`` are repeated).
    """
    bytes_each = check_nonnegative_real(dtype_bytes, "dtype_bytes")
    if bytes_each == 0:
        raise ValueError("dtype_bytes must be > 0 (bytes per K/V value: 2 for bf16)")
    # A UlyssesCost (USP: each CP rank a Ulysses group): a GPU holds 1/sp of the K/V
    # heads, at least one (fewer heads than sp are repeated), and sends those.
    sp = getattr(cost, "sp_size", None) or 1
    arch = _architecture_of(cost)
    if arch is None:
        raise ValueError(
            f"kv_bytes_per_token needs a FlopsCost or a UlyssesCost of one (it reads the "
            f"architecture), got {type(cost).__name__}; pass kv_bytes_per_token= explicitly "
            "instead"
        )
    per_layer = [
        max(layer.attention.kv_heads, sp) / sp
        * (layer.attention.qk_head_dim + layer.attention.v_head_dim)
        for layer in arch.layers
    ]
    return float(sum(per_layer) * bytes_each)


_CP_KEYS = ("cost", "bandwidth", "cost_per_second", "overlap", "kv_bytes_per_token", "comm_passes")

_kv_bytes_of = kv_bytes_per_token  # the constructor's argument shadows the function's name

# Achieved training FLOP/s of one GPU, the default rate of a FLOP cost: about 40% of an
# H100's dense bf16 peak (989 TFLOP/s). Only the ratio to the bandwidth matters.
FLOPS_PER_SECOND = 4e14


def _cost_per_second(cost: CostModel, bandwidth: float | None) -> float:
    """The default ``cost_per_second`` of ``cost``, or a ValueError when it is unknown."""
    if getattr(cost, "architecture", None) is not None:  # a FlopsCost
        return FLOPS_PER_SECOND
    if getattr(cost, "sp_size", None):  # a UlyssesCost: the rate of its all-to-all, if
        ulysses: Any = cost
        if getattr(cost, "bandwidth", None) is not None:  # priced; else its inner cost's
            return float(ulysses.cost_per_second)
        return _cost_per_second(ulysses.cost, bandwidth)
    meta = getattr(cost, "meta", None) or {}
    if bandwidth is None or "seconds" in (meta.get("unit"), meta.get("units")):
        return 1.0  # without a bandwidth no time is converted
    raise ValueError(
        f"with bandwidth= and a {type(cost).__name__} of unknown units, pass "
        "cost_per_second= (cost units per second: 1 for a cost in seconds, the achieved "
        "FLOP/s for a FLOP count, the tokens/s for a token cost)"
    )


def check_cost_model(cost: Any) -> None:
    """Refuse a ``cost`` that is not a :class:`CostModel` (a name, an array...)."""
    if not isinstance(cost, CostModel):
        raise ValueError(
            f"cost must be a CostModel (e.g. FlopsCost.from_name('qwen2.5-7b')), got "
            f"{type(cost).__name__}"
        )


def link_settings(
    cost: CostModel,
    bandwidth: float | None,
    cost_per_second: float | None,
    bytes_per_token: float | None,
    bytes_name: str,
    bytes_hint: str,
    bytes_of: Any,
) -> tuple[float | None, float, float]:
    """The checked ``(bandwidth, bytes per token, cost_per_second)`` of a link (the CP
    ring, Ulysses' all-to-all). Bytes default to ``bytes_of(cost)`` for a cost that knows
    its architecture and are required otherwise when there is a bandwidth (named
    ``bytes_name``, described by ``bytes_hint``); 0 without a bandwidth."""
    if bandwidth is not None:
        bandwidth = check_nonnegative_real(bandwidth, "bandwidth")
        if bandwidth == 0:
            raise ArgumentError(
                Note("argument", {},
                     "{@bandwidth must be > 0 bytes/s (or None for free communication)}"),
                argument="bandwidth",
            )  # fmt: skip
    if bytes_per_token is None and bandwidth is not None:
        if _architecture_of(cost) is None:
            raise ArgumentError(Note(
                "argument", {"hint": bytes_hint},
                arg(f"with bandwidth= and a cost that is not a FlopsCost, pass {bytes_name}=")
                + " ({hint})",
            ), argument=bytes_name)  # fmt: skip
        bytes_per_token = bytes_of(cost)
    out_bytes = (
        0.0 if bytes_per_token is None else check_nonnegative_real(bytes_per_token, bytes_name)
    )
    if cost_per_second is None:
        cost_per_second = _cost_per_second(cost, bandwidth)
    return bandwidth, out_bytes, check_nonnegative_real(cost_per_second, "cost_per_second")


class ContextParallelCost:
    """Cost of CP pieces: the sequence cost split over ``d`` GPUs plus exposed communication.

    Parameters
    ----------
    cost : CostModel
        The per-sequence cost; its polynomial ``(c0, a, b, c)`` is used, with the
        attention of a :class:`FlopsCost`'s sliding-window layers counted under their
        windows (module docstring).
    bandwidth : float, optional
        Bytes per second each GPU moves on the CP ring (e.g. ~4e11 NVLink, ~2.5e10 a
        200 Gb/s inter-node link). None: communication is free.
    cost_per_second : float, optional
        Cost units per second: 1 for a cost in seconds (``seqbalance calibrate``), the
        achieved FLOP/s per GPU for a FLOP cost. Default (None): :data:`FLOPS_PER_SECOND`
        for a :class:`FlopsCost` (as the command line), 1 for a cost whose ``meta`` says
        it is in seconds, a UlyssesCost's own rate when it prices its all-to-all (else its
        inner cost's default); any other cost given a ``bandwidth`` must say it (with 1, a
        FLOP or token cost would count the transfer's seconds as a few FLOPs or tokens:
        free, whatever the bandwidth).
    overlap : float
        Fraction (0..1) of one ring step's attention that can hide that step's transfer.
    kv_bytes_per_token : float, optional
        Bytes of K and V one GPU sends per token over all layers; default from the cost's
        architecture (:func:`kv_bytes_per_token`, bf16) when ``cost`` is a
        :class:`FlopsCost` or a :class:`~seqbalance.costs.UlyssesCost` of one (then the
        heads one GPU of the group holds), and required otherwise when ``bandwidth`` is
        given.
    comm_passes : float
        Times the K/V volume crosses the ring per training step (3: forward K/V, backward
        K/V and dK/dV).

    Notes
    -----
    The module docstring gives the formula.
    """

    def __init__(
        self,
        cost: CostModel,
        *,
        bandwidth: float | None = None,
        cost_per_second: float | None = None,
        overlap: float = 0.0,
        kv_bytes_per_token: float | None = None,
        comm_passes: float = 3.0,
    ) -> None:
        check_cost_model(cost)
        self.cost = cost
        c0, a, b, c = cost.polynomial
        # (share of c, window) per attention kind of a windowed FlopsCost; None: c·(e²−s²).
        kinds = getattr(cost, "_attention_kinds", None)
        self._windows: list[tuple[float, float]] | None = None
        if kinds and any(window is not None for (_, window), _ in kinds):
            total = float(sum(width * count for (width, _), count in kinds))
            self._windows = [
                (width * count / total, np.inf if window is None else float(window))
                for (width, window), count in kinds
            ]
        self.per_microbatch, self.per_sequence, self.per_token, self.per_token_sq = (
            float(c0),
            float(a),
            float(b),
            float(c),
        )
        self.bandwidth, self.kv_bytes_per_token, self.cost_per_second = link_settings(
            cost, bandwidth, cost_per_second, kv_bytes_per_token, "kv_bytes_per_token",
            "2 * kv_heads * head_dim * dtype bytes * layers; under Ulysses, the heads one "
            "GPU holds", _kv_bytes_of,
        )  # fmt: skip
        self.overlap = check_nonnegative_real(overlap, "overlap", upper=1.0)
        self.comm_passes = check_nonnegative_real(comm_passes, "comm_passes")

    # ---- scalar form ----------------------------------------------------------------
    def piece_cost(self, length: int, ranges: Sequence[tuple[int, int]], d: int) -> float:
        """Cost of one GPU holding query ``ranges`` of a sequence of ``length`` split ``d`` ways.

        Raises
        ------
        ValueError
            ``length`` is not a token count, ``d`` not a CP degree, a range is not a pair
            of integers ``0 <= start <= end <= length``, or the cost overflows float64.
        """
        length = _length(length, "length")
        d = check_degree(d, "d")
        if isinstance(ranges, (str, bytes)) or not hasattr(ranges, "__iter__"):
            raise ValueError(f"ranges must be a list of (start, end) pairs, got {ranges!r}")
        tok, sq = 0, 0.0
        for k, rng in enumerate(ranges):
            # A backwards or out-of-sequence range would price negative or phantom tokens.
            ok = isinstance(rng, (tuple, list)) and len(rng) == 2 and all(
                not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer))
                for v in rng
            )
            if not ok or not 0 <= rng[0] <= rng[1] <= length:
                raise ValueError(
                    f"ranges[{k}] = {rng!r} is not a token range (start, end) with "
                    f"0 <= start <= end <= length = {length}"
                )
            s, e = int(rng[0]), int(rng[1])
            tok += e - s
            sq += float(self._sq(np.float64(s), np.float64(e)))
        with np.errstate(over="ignore", invalid="ignore"):  # _finite says it
            out = self._cost(np.float64(length), np.float64(tok), np.float64(sq), np.float64(d))
        arr = np.asarray(out, dtype=np.float64).reshape(1, 1)
        return float(_finite(arr, np.array([length]), self)[0, 0])

    def _sq(self, s: Any, e: Any) -> Any:
        """``e² − s²`` of query ranges ``[s, e)`` (arrays), windowed layers' share counted
        under their windows: the measure ``c`` prices."""
        if self._windows is None:
            return e * e - s * s
        out = 0.0
        for share, w in self._windows:
            out = out + share * (_pairs2(e, w) - _pairs2(s, w))
        return out

    def _comm(self, length: Any, attention: Any, d: Any, per_second: float) -> Any:
        """Exposed communication of pieces (arrays): ``(d - 1)`` ring transfers of
        ``comm_passes * (length / d) * kv_bytes_per_token / bandwidth`` seconds, times
        ``per_second`` cost units, each hidden behind up to ``overlap * attention / d``
        (``attention`` in the same units). 0 without a bandwidth."""
        if self.bandwidth is None:
            return np.zeros(np.broadcast(length, attention, d).shape)
        step = (
            self.comm_passes * (length / d) * self.kv_bytes_per_token / self.bandwidth
        ) * per_second
        return (d - 1) * np.maximum(0.0, step - self.overlap * attention / d)

    def _cost(self, length: Any, tok: Any, sq: Any, d: Any) -> Any:
        """The formula on arrays (``d`` may be an array too); a whole sequence on one GPU
        (``d == 1``) is priced by the sequence cost model itself, exactly as without CP."""
        attention = self.per_token_sq * sq
        compute = self.per_sequence / d + self.per_token * tok + attention
        if self.bandwidth is not None:
            compute = compute + self._comm(length, attention, d, self.cost_per_second)
        whole = (np.asarray(d) == 1) & (np.asarray(tok) == np.asarray(length))
        if np.any(whole):
            exact = np.asarray(
                self.cost(np.broadcast_to(length, whole.shape)[whole].astype(np.int64)),
                dtype=np.float64,
            )
            compute = np.array(compute, dtype=np.float64, copy=True)
            compute[whole] = exact
        return compute

    def _phases(self, length: Any, tok: Any, sq: Any, d: Any) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward of pieces (arrays as :meth:`_cost` takes), adding up to
        their cost; for pipeline schedules (:mod:`seqbalance.planning.cp_pipeline`).

        As :func:`seqbalance.costs.phases.phase_costs` splits a sequence: the linear part
        (``a / d + b * tokens``, or whatever the exact model adds beyond the attention)
        has a backward ``backward_matmul`` times its forward, the attention ``c * sq``
        ``backward_attention`` times. Of the exposed ring transfers the forward carries
        ``1 / comm_passes`` (it sends K/V once; the backward sends K/V again and dK/dV).
        """
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.asarray(self._cost(length, tok, sq, d), dtype=np.float64)
            attention = np.asarray(self.per_token_sq * sq, dtype=np.float64)
            comm = np.asarray(self._comm(length, attention, d, self.cost_per_second))
        r_mm, r_attn = self._backward_ratios()
        linear = np.maximum(total - attention - comm, 0.0)  # rounding: never below 0
        share = min(1.0, 1.0 / self.comm_passes) if self.comm_passes else 0.0
        forward = linear / (1.0 + r_mm) + attention / (1.0 + r_attn) + share * comm
        forward = np.minimum(forward, total)
        return forward, total - forward

    def microbatch_phases(self) -> tuple[float, float]:
        """Forward and backward of the per-micro-batch cost (its matmul ratio)."""
        forward = self.per_microbatch / (1.0 + self._backward_ratios()[0])
        return forward, self.per_microbatch - forward

    def _backward_ratios(self) -> tuple[float, float]:
        """The sequence cost's backward / forward ratios (matmul, attention), or the
        defaults of :mod:`seqbalance.costs.phases` where it carries none."""
        return (
            check_ratio(getattr(self.cost, "backward_matmul", BACKWARD_MATMUL),
                        "backward_matmul"),
            check_ratio(getattr(self.cost, "backward_attention", BACKWARD_ATTENTION),
                        "backward_attention"),
        )  # fmt: skip

    # ---- vectorised over sequences ----------------------------------------------------
    def rank_costs(self, lengths: Any, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-rank piece costs and tokens of the balanced layout, each of shape ``(n, d)``.

        Raises
        ------
        ValueError
            ``lengths`` are not token counts (:func:`~seqbalance._validate.as_lengths`),
            ``d`` is not a CP degree (an int in ``1 .. 2**14``), or a cost overflows.
        """
        lens = as_lengths(lengths)
        d = check_degree(d, "d")
        tokens, sq = _layout_arrays(lens, d, self._sq)
        with np.errstate(over="ignore", invalid="ignore"):  # _finite says it
            costs = self._cost(lens.astype(np.float64)[:, None], tokens.astype(np.float64), sq, d)
        return _finite(np.asarray(costs, dtype=np.float64), lens, self), tokens

    def piece_times(self, lengths: Any, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each sequence split ``d`` ways: (slowest rank's cost, summed work, most tokens)."""
        costs, tokens = self.rank_costs(lengths, d)
        return costs.max(axis=1), costs.sum(axis=1), tokens.max(axis=1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready parameters (the sequence cost as its own ``to_dict``)."""
        return {
            "cost": self.cost.to_dict(),
            "bandwidth": self.bandwidth,
            "cost_per_second": self.cost_per_second,
            "overlap": self.overlap,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "comm_passes": self.comm_passes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextParallelCost:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            ``data`` is not a dict with a ``"cost"``, or a parameter is invalid.
        """
        if not isinstance(data, Mapping) or "cost" not in data:
            got = f"keys {sorted(data)}" if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                "a ContextParallelCost document is an object with a 'cost' (the sequence "
                f"cost's to_dict()) and optional bandwidth, overlap, ...; got {got}"
            )
        check_keys(data, _CP_KEYS, "a ContextParallelCost document")
        return cls(
            cost_from_dict(data["cost"]),
            bandwidth=data.get("bandwidth"),
            cost_per_second=data.get("cost_per_second"),  # absent: the constructor's default
            overlap=data.get("overlap", 0.0),
            kv_bytes_per_token=data.get("kv_bytes_per_token"),
            comm_passes=data.get("comm_passes", 3.0),
        )

    def __repr__(self) -> str:
        return (
            f"ContextParallelCost({self.cost!r}, bandwidth={self.bandwidth}, "
            f"cost_per_second={self.cost_per_second:g}, overlap={self.overlap:g}, "
            f"kv_bytes_per_token={self.kv_bytes_per_token:g})"
        )
