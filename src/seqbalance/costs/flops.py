"""Exact training FLOPs of one sequence, from a Hugging Face ``config.json``.

Counting convention
-------------------
- 2 FLOPs per multiply-add; a matmul of a token through a ``m x n`` weight costs ``2mn``.
- Attention projections Q, K, V, O. With GQA, K and V have ``num_key_value_heads``
  heads; ``head_dim`` comes from the config when given, else ``hidden / heads``.
- Attention core: the scores (Q·Kᵀ) and the attention-weighted values each cost
  ``2 x pairs x num_heads x head_dim`` FLOPs, where ``pairs = L²/2`` for causal
  attention and ``pairs = W·L − W²/2`` for a sliding window ``W < L``. The window applies
  only where the config enables it (see :mod:`seqbalance.costs.architecture`).
- MLA (deepseek_v3): q_a (h → q_lora_rank), q_b (q_lora_rank → heads·(qk_nope+qk_rope)),
  kv_a (h → kv_lora_rank + qk_rope), kv_b (kv_lora_rank → heads·(qk_nope+v_head_dim)),
  o (heads·v_head_dim → h); the scores use ``qk_nope + qk_rope`` per head, the values
  ``v_head_dim``.
- MLP: gated (SwiGLU/GeGLU) = 3 matrices of ``h x intermediate``, otherwise 2.
- MoE layer: router (``h x experts``) + the top-k routed experts + the shared experts,
  each a gated MLP of the expert width (mixtral: ``intermediate_size``; qwen2_moe's shared
  expert: ``shared_expert_intermediate_size``); dense layers where the config says so
  (``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``).
- LM head: ``h x vocab``, counted even when tied to the embedding.
- Not counted: norms, softmax, activations, rotary, biases, embedding lookups,
  multi-token-prediction layers, the qwen2_moe shared-expert gate (``h x 1``).

So forward FLOPs of a sequence of ``L`` tokens are ``2·P·L + Σ_layers 2·pairs(L)·w`` with
``P`` the active matmul parameters per token (:attr:`FlopsCost.matmul_params`) and
``w = heads·(qk_head_dim + v_head_dim)`` per layer. Training costs 3× forward (backward ≈
2× forward), or 4× with full activation recompute.

Polynomial form
---------------
``per_token = k·2·P`` and ``per_token_sq = k·Σ_layers w`` with ``k = 3`` (4 with
recompute); ``per_sequence = per_microbatch = 0``. This is exact when no layer has a
sliding window. With a window, the polynomial counts those layers as full causal
attention, so it equals the exact cost for sequences no longer than the window and is an
upper bound beyond it (:attr:`FlopsCost.polynomial_is_exact` says which); calling the
model always gives the exact, windowed count.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._validate import as_lengths, check_bool
from .architecture import (
    ARCH_KEYS,
    Architecture,
    config_file,
    parse_config,
    read_config,
    text_model_config,
)
from .base import FROM_DICT, CostModel, check_keys, finite_costs

__all__ = ["SHIPPED", "FlopsCost", "shipped_config"]

_CONFIG_DIR = Path(__file__).with_name("configs")

#: Names of the shipped architecture configs (``FlopsCost.from_name``, ``--model``).
SHIPPED: tuple[str, ...] = (
    "llama-2-7b",
    "llama-3-8b",
    "mistral-7b-v0.1",
    "qwen2.5-7b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "mixtral-8x7b",
    "deepseek-v3",
    "gemma-2-9b",
)


def shipped_config(name: str) -> dict[str, Any]:
    """The shipped config called ``name`` (case-insensitive) as a dict.

    Raises
    ------
    ValueError
        If ``name`` is not shipped; the message lists the shipped names.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in SHIPPED:
        raise ValueError(
            f"unknown model name {name!r}; shipped configs are: {', '.join(SHIPPED)} "
            "(or pass a path to a config.json)"
        )
    return read_config(_CONFIG_DIR / f"{key}.json")


def _pairs(lengths: np.ndarray, window: int | None) -> np.ndarray:
    """Query-key pairs a causal layer scores: L²/2, or W·L − W²/2 when W < L."""
    full: np.ndarray = lengths * lengths / 2.0
    if window is None:
        return full
    w = float(window)
    return np.where(lengths > w, w * lengths - w * w / 2.0, full)


class FlopsCost(CostModel):
    """Training FLOPs per sequence from a model architecture (see the module docstring).

    Build one with :meth:`from_hf_config` or :meth:`from_name`. Calling it gives exact
    training FLOPs per sequence (3× forward; 4× when ``recompute``). For pipeline schedules
    the backward counts 2× the forward (3× with ``recompute``), for matmuls and attention
    alike (:attr:`backward_matmul`, :attr:`backward_attention`), so that the forward phase
    is the model's forward FLOPs and the phases add up to the training FLOPs. (A
    :class:`~seqbalance.costs.QuadraticCost` fitted to measured time keeps the 2.5× of
    FlashAttention-2's measured backward for its ``c·L²`` term.)

    Examples
    --------
    >>> cost = FlopsCost.from_name("llama-2-7b")
    >>> round(cost.per_token / cost.per_token_sq)
    50408
    >>> cost.microbatch_cost([1, 2]) == float(cost([1, 2]).sum())
    True
    """

    per_microbatch = 0.0
    per_sequence = 0.0

    def __init__(
        self,
        architecture: Architecture,
        *,
        recompute: bool = False,
        name: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(architecture, Architecture):
            raise ValueError(
                f"architecture must be an Architecture, got {type(architecture).__name__}; "
                "use FlopsCost.from_hf_config(config) to build one from a config"
            )
        recompute = check_bool(recompute, "recompute")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a string or None, got {name!r}")
        self.architecture = architecture
        self.recompute = recompute
        self.name = name
        self.config = config
        mult = 4.0 if recompute else 3.0
        # Recompute runs the forward again inside the backward: one more forward's worth.
        # The FLOP count's own split (2 backward matmuls per forward one), attention too:
        # with 2.5 the forward phase came out 0.90x the forward FLOPs at 131k tokens.
        self.backward_matmul = 3.0 if recompute else 2.0
        self.backward_attention = self.backward_matmul
        # Counted once: the architecture is frozen, and summing its layers on every call
        # took about as long as the costs of a few dozen sequences.
        self._matmul_flops = 2.0 * float(architecture.matmul_params)
        self.per_token = mult * self._matmul_flops
        self.per_token_sq = mult * float(
            sum(layer.attention.core_width for layer in architecture.layers)
        )
        # Layers sharing (core width, window) cost the same: count each kind once.
        self._attention_kinds = sorted(
            Counter(
                (layer.attention.core_width, layer.attention.window)
                for layer in architecture.layers
            ).items(),
            key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1]),
        )

    @classmethod
    def from_hf_config(cls, config: Any, *, recompute: bool = False) -> FlopsCost:
        """Build from a Hugging Face config: a dict, a path to a ``config.json`` or its
        folder, or an object with ``to_dict()`` (transformers is not required)."""
        data = text_model_config(read_config(config))
        if isinstance(config, (str, os.PathLike)):
            try:
                arch = parse_config(data)
            except ValueError as exc:  # (the message's "config.json" is this file)
                raise ValueError(f"{exc} [in {config_file(config)}]") from None
        else:
            arch = parse_config(data)
        kept = {k: data[k] for k in ARCH_KEYS if k in data}
        name = data.get("_name_or_path")
        name = name if isinstance(name, str) and name else None  # a label only
        return cls(arch, recompute=recompute, name=name, config=kept)

    @classmethod
    def from_name(cls, name: str, *, recompute: bool = False) -> FlopsCost:
        """Build from a shipped config, e.g. ``"qwen2.5-7b"`` (see :meth:`names`)."""
        cfg = shipped_config(name)
        out = cls(parse_config(cfg), recompute=recompute, name=name.lower(), config=cfg)
        return out

    @staticmethod
    def names() -> tuple[str, ...]:
        """Names of the shipped configs."""
        return SHIPPED

    @property
    def matmul_params(self) -> int:
        """Active matmul weights per token (layers + LM head; no embedding)."""
        return self.architecture.matmul_params

    @property
    def polynomial_is_exact(self) -> bool:
        """False when a sliding window makes the polynomial an upper bound."""
        return not self.architecture.has_window

    def forward_flops(self, lengths: Any) -> np.ndarray:
        """Forward FLOPs per sequence (float64), sliding windows counted exactly."""
        x = as_lengths(lengths).astype(np.float64)
        return finite_costs(self._forward(x, 1.0), x, self)

    def training_flops(self, lengths: Any, recompute: bool | None = None) -> np.ndarray:
        """Forward + backward FLOPs per sequence: 3× forward, 4× with full recompute
        (default: the model's own :attr:`recompute`, as calling the cost does)."""
        if recompute is None:
            recompute = self.recompute
        recompute = check_bool(recompute, "recompute")  # "no" is truthy: it would count 4x
        x = as_lengths(lengths).astype(np.float64)
        return finite_costs(self._forward(x, 4.0 if recompute else 3.0), x, self)

    def _forward(self, x: np.ndarray, factor: float) -> np.ndarray:
        """``factor`` × forward FLOPs of float lengths ``x``, unchecked (callers check once)."""
        with np.errstate(over="ignore", invalid="ignore"):  # finite_costs says it
            out = self._matmul_flops * x
            for (width, window), count in self._attention_kinds:
                out += (2.0 * count * width) * _pairs(x, window)
            return factor * out if factor != 1.0 else out

    def __call__(self, lengths: Any) -> np.ndarray:
        return self.training_flops(lengths, recompute=self.recompute)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "flops"}
        if self.name:
            out["name"] = self.name
        out["recompute"] = self.recompute
        if self.config is not None:
            # Sorted: from_dict rebuilds the config in another order, and a plan that holds
            # this cost must write the same JSON after a round trip (Plan == compares it).
            out["config"] = dict(sorted(self.config.items()))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FlopsCost:
        """Inverse of :meth:`to_dict`: from ``config`` when present, else the shipped ``name``.

        Raises
        ------
        ValueError
            ``data`` is not a mapping, ``recompute`` is not a bool, ``name`` is not a
            string, or neither a config nor a shipped name is given.
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"a flops cost is an object with a 'config' or a 'name', got {type(data).__name__}"
            )
        check_keys(data, ("kind", "name", "recompute", "config"), "a flops cost")
        # Not bool(...): bool("false") is True, and would count 4x forward without a word.
        recompute = data.get("recompute", False)
        if not isinstance(recompute, bool):
            raise ValueError(
                f"a flops cost's 'recompute' must be true or false, got {recompute!r}"
            )
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"a flops cost's 'name' must be a string, got {name!r}")
        if data.get("config") is not None:
            out = cls.from_hf_config(data["config"], recompute=recompute)
            out.name = name
            return out
        if data.get("name"):
            return cls.from_name(data["name"], recompute=recompute)
        raise ValueError("a flops cost needs a 'config' or a shipped 'name'; got neither")

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        return (
            f"FlopsCost({label}per_token={self.per_token:.6g}, "
            f"per_token_sq={self.per_token_sq:.6g}, recompute={self.recompute})"
        )


FROM_DICT["flops"] = lambda data: FlopsCost.from_dict(dict(data))
