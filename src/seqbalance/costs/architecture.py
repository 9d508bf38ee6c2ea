"""Read a Hugging Face ``config.json`` into the few numbers that decide compute.

:func:`parse_config` turns a config (a dict, a path to a ``config.json`` or to a folder
holding one, or an object with ``to_dict()`` such as a transformers ``PretrainedConfig``)
into an :class:`Architecture`: one :class:`Layer` per decoder layer, each with its
:class:`Attention` (GQA or MLA, with its sliding window if one is active) and its
:class:`MLP` (dense, or the experts one token runs through in a mixture-of-experts layer).
The FLOPs model (:mod:`seqbalance.costs.flops`) and ``seqbalance calibrate`` both build on
it, so both read a config the same way.

Families
--------
``llama``, ``mistral``, ``qwen2``, ``qwen2_moe``, ``qwen3``, ``qwen3_moe``, ``mixtral``,
``deepseek_v3`` (and ``deepseek_v2``, same fields), ``gemma2``, ``gemma3``/``gemma3_text``.
Checked also: ``gemma``, ``phi3``, ``gpt_oss``, ``gpt_neox``, ``phi``, ``starcoder2``,
``nemotron`` (:data:`KNOWN_MODEL_TYPES`). Any other decoder ``model_type`` carrying the
standard fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``intermediate_size``, ``vocab_size``) goes through the same generic reading, with a
warning; missing fields raise a ValueError naming them. A multimodal config whose text
model sits under ``text_config`` is read from there.

Rules, field by field
---------------------
- ``head_dim`` when given (and not null), else ``hidden_size / num_attention_heads``;
  ``num_key_value_heads`` defaults to ``num_attention_heads`` (as in transformers).
- MLA is used when the config has ``kv_lora_rank`` (deepseek_v2/v3); ``q_lora_rank`` null
  means a direct query projection.
- Sliding window: active only when ``sliding_window`` is set (a null or 0 window is
  none) and ``use_sliding_window`` is on. ``use_sliding_window`` defaults to false for
  the qwen families and to true for the others, as in transformers (Mistral-7B-v0.1 ships
  ``sliding_window: 4096`` with no ``use_sliding_window`` field, so its window is on; a
  Qwen config with a ``sliding_window`` but no ``use_sliding_window`` runs full
  attention). When it is off, ``sliding_window`` is not read (transformers 5 writes 0
  there). Which layers: ``layer_types`` when given (``"sliding_attention"`` /
  ``"full_attention"``); else gemma2 alternates starting with a sliding layer 0, gemma3
  makes every ``sliding_window_pattern``-th layer (default 6) global, the qwen families
  slide on layers ``>= max_window_layers`` (28 when absent, transformers' default), and
  every other family on all layers.
- Experts: ``num_local_experts`` (mixtral), ``num_experts`` (qwen MoE) or
  ``n_routed_experts`` (deepseek), with ``num_experts_per_tok`` routed per token. Expert
  width ``moe_intermediate_size``, else ``intermediate_size`` (mixtral). Shared experts:
  ``shared_expert_intermediate_size`` (one, qwen2_moe) or ``n_shared_experts`` experts of
  the expert width (deepseek). A layer is dense (width ``intermediate_size``) when it is in
  ``mlp_only_layers``, when ``(i + 1) % decoder_sparse_step != 0``, when
  ``i < first_k_dense_replace`` or when ``i % moe_layer_freq != 0``.
- MLPs are gated (3 matrices) except for ``gpt_neox``, ``phi``, ``starcoder2`` and
  ``nemotron`` (2).
- Llama-4 and encoder models (BERT and kin, encoder-decoders) are refused: these rules
  would count them wrongly. A ``model_type`` outside :data:`KNOWN_MODEL_TYPES` is read
  by the same rules with a ``UserWarning`` (a config without ``model_type``, as written
  by hand, without one).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

__all__ = [
    "ARCH_KEYS",
    "KNOWN_MODEL_TYPES",
    "MLP",
    "Architecture",
    "Attention",
    "Layer",
    "parse_config",
    "read_config",
    "text_model_config",
]

# Every field the parser may read; to_dict() of a FlopsCost keeps only these.
ARCH_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "layer_types",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "mlp_only_layers",
    "decoder_sparse_step",
    "first_k_dense_replace",
    "moe_layer_freq",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)

_NON_GATED = frozenset({"gpt_neox", "phi", "starcoder2", "nemotron"})
# Families whose FLOPs were checked against transformers' modules or a hand count; any
# other model_type is read by the same rules, with a warning.
KNOWN_MODEL_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
        "gemma2", "gemma3", "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", "gpt_oss",
        *_NON_GATED,
    }
)  # fmt: skip
# Families the rules would count wrongly: refused, saying why.
_UNSUPPORTED = {
    **dict.fromkeys(
        ("llama4", "llama4_text"),
        "its MoE layers add a shared expert, alternate with dense layers of another width "
        "and mostly use chunked attention, which these rules do not read",
    ),
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "camembert", "deberta", "deberta-v2", "electra",
         "albert", "distilbert", "mpnet", "modernbert", "ernie", "t5", "mt5", "bart"),
        "it is an encoder (bidirectional attention), and the FLOP model is of causal decoders",
    ),
}  # fmt: skip
_QWEN = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _check_fields(obj: Any, minimums: dict[str, int], optional: tuple[str, ...] = ()) -> None:
    """Refuse a field that is not an integer at or above its minimum (None allowed for the
    ``optional`` ones): a negative width or window gave negative FLOPs, a NaN window none."""
    for name, low in minimums.items():
        value = getattr(obj, name)
        if value is None and name in optional:
            continue
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if not ok or value < low:
            raise ValueError(
                f"{type(obj).__name__}.{name} = {value!r} must be an integer >= {low}"
                + (" or None" if name in optional else "")
            )


@dataclass(frozen=True)
class Attention:
    """One layer's attention: head counts, head sizes, window and (for MLA) ranks.

    For MLA, ``qk_head_dim`` is ``qk_nope_head_dim + qk_rope_head_dim``.
    """

    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    window: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0

    def __post_init__(self) -> None:
        _check_fields(
            self,
            {"heads": 1, "kv_heads": 1, "qk_head_dim": 1, "v_head_dim": 1, "window": 1,
             "kv_lora_rank": 1, "q_lora_rank": 1, "qk_rope_head_dim": 0},
            optional=("window", "kv_lora_rank", "q_lora_rank"),
        )  # fmt: skip
        if self.qk_rope_head_dim > self.qk_head_dim:
            raise ValueError(
                f"Attention.qk_rope_head_dim = {self.qk_rope_head_dim} exceeds qk_head_dim = "
                f"{self.qk_head_dim}, of which it is a part"
            )

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (deepseek_v2/v3)."""
        return self.kv_lora_rank is not None

    def params(self, hidden: int) -> int:
        """Weights of the Q/K/V/O projections (biases not counted)."""
        h, n = hidden, self.heads
        out = n * self.v_head_dim * h  # o_proj
        if not self.is_mla:
            q = h * n * self.qk_head_dim
            kv = h * self.kv_heads * (self.qk_head_dim + self.v_head_dim)
            return q + kv + out
        r = self.q_lora_rank
        q = h * n * self.qk_head_dim if r is None else h * r + r * n * self.qk_head_dim
        c = int(cast(int, self.kv_lora_rank))  # not None: is_mla
        nope = self.qk_head_dim - self.qk_rope_head_dim
        kv_a = h * (c + self.qk_rope_head_dim)
        kv_b = c * n * (nope + self.v_head_dim)
        return q + kv_a + kv_b + out

    @property
    def core_width(self) -> int:
        """``heads * (qk_head_dim + v_head_dim)``: FLOPs of the attention core are
        ``2 * pairs * core_width``."""
        return self.heads * (self.qk_head_dim + self.v_head_dim)


@dataclass(frozen=True)
class MLP:
    """The MLP a token runs through: ``widths`` lists the intermediate sizes of the
    (gated) MLPs it visits (one for a dense layer; top-k routed plus shared experts for
    a MoE layer); ``experts`` is the router's output size (0: dense)."""

    widths: tuple[int, ...]
    gated: bool = True
    experts: int = 0
    top_k: int = 0

    def __post_init__(self) -> None:
        _check_fields(self, {"experts": 0, "top_k": 0})
        if not isinstance(self.widths, tuple):
            raise ValueError(f"MLP.widths must be a tuple of integers, got {self.widths!r}")
        for i, w in enumerate(self.widths):
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)) or w < 0:
                raise ValueError(f"MLP.widths[{i}] = {w!r} must be an integer >= 0")

    def params(self, hidden: int) -> int:
        """Active matmul weights per token: router plus the MLPs in ``widths``."""
        mats = 3 if self.gated else 2
        return hidden * self.experts + sum(mats * hidden * w for w in self.widths)


@dataclass(frozen=True)
class Layer:
    """One decoder layer."""

    attention: Attention
    mlp: MLP

    def __post_init__(self) -> None:
        if not isinstance(self.attention, Attention) or not isinstance(self.mlp, MLP):
            raise ValueError(
                f"Layer needs an Attention and an MLP, got {type(self.attention).__name__} "
                f"and {type(self.mlp).__name__}"
            )

    def params(self, hidden: int) -> int:
        """Active matmul weights per token of this layer."""
        return self.attention.params(hidden) + self.mlp.params(hidden)


@dataclass(frozen=True)
class Architecture:
    """What a config says about compute: hidden size, vocabulary and the layers."""

    model_type: str
    hidden_size: int
    vocab_size: int
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        _check_fields(self, {"hidden_size": 1, "vocab_size": 1})
        if not isinstance(self.layers, tuple) or not self.layers:
            raise ValueError("Architecture.layers must be a non-empty tuple of Layer objects")
        bad = next((i for i, x in enumerate(self.layers) if not isinstance(x, Layer)), None)
        if bad is not None:
            raise ValueError(f"Architecture.layers[{bad}] is not a Layer")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def head_params(self) -> int:
        """LM head weights, ``hidden_size * vocab_size`` (counted even when tied)."""
        return self.hidden_size * self.vocab_size

    @property
    def matmul_params(self) -> int:
        """Active matmul weights per token: all layers plus the LM head."""
        return sum(layer.params(self.hidden_size) for layer in self.layers) + self.head_params

    @property
    def has_window(self) -> bool:
        """True when some layer uses a sliding window."""
        return any(layer.attention.window is not None for layer in self.layers)


def read_config(config: Any) -> dict[str, Any]:
    """Return ``config`` as a plain dict.

    Accepts a mapping, a path to a ``config.json`` (or to a folder holding one), or any
    object with a ``to_dict()`` method (a transformers ``PretrainedConfig``).

    Raises
    ------
    ValueError
        If the path does not exist, holds no ``config.json``, is not valid JSON, or the
        object is of an unsupported type.
    """
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(
                f"config path {str(config)!r} is not a config.json file or a folder holding "
                "one; pass the path to a Hugging Face config.json"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"config {str(path)!r} could not be read as JSON ({exc})") from exc
        except ValueError:  # json.loads applies Python's digit limit for int()
            raise ValueError(
                f"config {str(path)!r} holds an integer of more than 4,300 digits, which no "
                "config field needs; fix the config.json"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(
                f"config {str(path)!r} must hold a JSON object, got {type(data).__name__}"
            )
        return data
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, Mapping):
            return dict(data)
    raise ValueError(
        f"config must be a dict, a path to a config.json (or its folder) or an object with "
        f"to_dict(); got {type(config).__name__}"
    )


def text_model_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: ``cfg["text_config"]`` for a multimodal config without
    ``hidden_size`` of its own (gemma3, llava...), else ``cfg`` itself."""
    text = cfg.get("text_config")
    if "hidden_size" not in cfg and isinstance(text, Mapping):
        return {"model_type": cfg.get("model_type"), **dict(text)}
    return cfg


MAX_LAYERS = 1 << 16  # far above any model's depth; a list of this many layers is cheap
# Any integer field: exact in float64, and products of a few of them stay in float range.
MAX_FIELD = 1 << 53


class _Reader:
    """Reads integer fields from a config, collecting every missing one for one error."""

    def __init__(self, cfg: Mapping[str, Any], model_type: str) -> None:
        self.cfg = cfg
        self.model_type = model_type
        self.missing: list[str] = []

    def _check(self, key: str, value: Any, minimum: int, maximum: int | None = None) -> int:
        if isinstance(value, (np.integer, np.floating)):  # a config built with numpy
            value = value.item()
        ok = not isinstance(value, bool) and isinstance(value, (int, float))
        if ok and isinstance(value, float):
            ok = value.is_integer()
        if not ok or value < minimum:
            raise ValueError(
                f"config field {key!r} = {value!r} must be an integer >= {minimum}; "
                "fix the config.json"
            )
        maximum = MAX_FIELD if maximum is None else maximum
        if value > maximum:
            raise ValueError(
                f"config field {key!r} = {value!r} is more than 2**{maximum.bit_length() - 1}; "
                "fix the config.json"
            )
        return int(value)

    def req(self, key: str, minimum: int = 1, maximum: int | None = None) -> int:
        value = self.cfg.get(key)
        if value is None:
            self.missing.append(key)
            return 1  # placeholder; done() raises before it is used
        return self._check(key, value, minimum, maximum)

    def opt(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.cfg.get(key)
        return default if value is None else self._check(key, value, minimum)

    def done(self) -> None:
        if self.missing:
            raise ValueError(
                f"config (model_type {self.model_type!r}) is missing required field(s) "
                f"{', '.join(map(repr, self.missing))}; add them to the config.json"
            )


def _use_sliding_window(cfg: Mapping[str, Any], family: str) -> bool:
    """``use_sliding_window`` (default: false for the qwen families, true otherwise, as in
    transformers); only a bool: a string "false" or a 0 would otherwise count as true (it
    is not False) and silently turn the window on."""
    value = cfg.get("use_sliding_window")
    if value is None:
        return family not in _QWEN
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"config field 'use_sliding_window' = {value!r} must be true or false; "
            "fix the config.json"
        )
    return bool(value)


def _index_list(cfg: Mapping[str, Any], key: str) -> list[Any] | None:
    """``cfg[key]`` as a list when it is a JSON array (list or tuple), None when absent.

    Sets and dicts are refused too: their order is not the layers' order.
    """
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"config field {key!r} must be a list, got {value!r} ({type(value).__name__}); "
            "fix the config.json"
        )
    return list(value)


def _windows(cfg: Mapping[str, Any], family: str, r: _Reader, n: int) -> list[int | None]:
    """The sliding window of each layer (None: full causal attention)."""
    use = _use_sliding_window(cfg, family)
    # Read only when on (transformers 5 writes 0 when it is off); 0 or null: no window.
    window = (r.opt("sliding_window", None, minimum=0) or None) if use else None
    enabled = window is not None
    layer_types = _index_list(cfg, "layer_types")
    if layer_types is not None:
        if len(layer_types) != n:
            raise ValueError(
                f"config field 'layer_types' must list one type per layer ({n}), "
                f"got {layer_types!r}"
            )
        for i, t in enumerate(layer_types):
            if t not in _LAYER_TYPES:
                raise ValueError(
                    f"config field 'layer_types'[{i}] = {t!r} is not supported; "
                    f"only {', '.join(map(repr, _LAYER_TYPES))} are"
                )
        sliding = [t == "sliding_attention" for t in layer_types]
        if any(sliding) and window is None and use:
            raise ValueError(
                "config field 'layer_types' marks sliding layers but 'sliding_window' is "
                "missing; add the window size to the config.json"
            )
    elif family == "gemma2":
        sliding = [i % 2 == 0 for i in range(n)]
    elif family == "gemma3":
        pattern = r.opt("sliding_window_pattern", 6)
        assert pattern is not None
        sliding = [(i + 1) % pattern != 0 for i in range(n)]
    elif family in _QWEN:
        first = r.opt("max_window_layers", 28, minimum=0)
        assert first is not None
        sliding = [i >= first for i in range(n)]
    else:
        sliding = [True] * n
    if not enabled:
        return [None] * n
    return [window if s else None for s in sliding]


def _moe_layers(cfg: Mapping[str, Any], r: _Reader, n: int) -> list[bool]:
    """Which layers are mixture-of-experts layers (given the config has experts)."""
    only = _index_list(cfg, "mlp_only_layers") or []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ValueError(
            f"config field 'mlp_only_layers' must be a list of layer indices, got {only!r}"
        )
    bad = [i for i in only if not 0 <= i < n]
    if bad:
        raise ValueError(
            f"config field 'mlp_only_layers' names layer {bad[0]}, outside the model's "
            f"{n} layers (0 to {n - 1}); fix the config.json"
        )
    only_set = set(only)
    step = r.opt("decoder_sparse_step", 1)
    first_dense = r.opt("first_k_dense_replace", 0, minimum=0)
    freq = r.opt("moe_layer_freq", 1)
    assert step is not None and first_dense is not None and freq is not None
    if first_dense > n:
        raise ValueError(
            f"config field 'first_k_dense_replace' = {first_dense} is more than "
            f"'num_hidden_layers' = {n}; fix the config.json"
        )
    return [
        i not in only_set and (i + 1) % step == 0 and i >= first_dense and i % freq == 0
        for i in range(n)
    ]


def parse_config(config: Any) -> Architecture:
    """Read a Hugging Face config into an :class:`Architecture`.

    Parameters
    ----------
    config
        A dict, a path to a ``config.json`` or to a folder holding one, or an object with
        ``to_dict()``. See the module docstring for the rules.

    Raises
    ------
    ValueError
        Naming every missing required field, or the first malformed one.

    Examples
    --------
    >>> arch = parse_config({"model_type": "llama", "hidden_size": 64,
    ...     "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
    ...     "vocab_size": 100})
    >>> arch.num_layers, arch.layers[0].attention.qk_head_dim, arch.head_params
    (2, 16, 6400)
    """
    cfg = text_model_config(read_config(config))
    if isinstance(config, (str, os.PathLike)):
        try:
            return _parse(cfg)
        except ValueError as exc:  # (the message's "config.json" is this file)
            raise ValueError(f"{exc} [in {config_file(config)}]") from None
    return _parse(cfg)


def config_file(config: str | os.PathLike[str]) -> str:
    """The ``config.json`` a path names (the path, or the file in the folder it names)."""
    path = Path(config)
    return str(path / "config.json" if path.is_dir() else path)


def _parse(cfg: dict[str, Any]) -> Architecture:
    """:func:`parse_config` of a config read into a dict."""
    model_type = cfg.get("model_type") or "unknown"
    if not isinstance(model_type, str):  # str() of a list would match no family, silently
        raise ValueError(
            f"config field 'model_type' = {model_type!r} must be a string such as 'llama'; "
            "fix the config.json"
        )
    family = "gemma3" if model_type == "gemma3_text" else model_type
    if family in _UNSUPPORTED or cfg.get("is_encoder_decoder") is True:
        why = _UNSUPPORTED.get(family, "it is an encoder-decoder model")
        raise ValueError(
            f"model_type {model_type!r} is not supported: {why}; fit a cost to measured "
            "times instead (seqbalance calibrate, or seqbalance.costs.fit_cost)"
        )
    if model_type != "unknown" and model_type not in KNOWN_MODEL_TYPES:
        warnings.warn(
            f"model_type {model_type!r} is not a family seqbalance has checked; it is read "
            "as a causal decoder with a gated (3-matrix) MLP and the standard attention "
            "fields. Compare cost.matmul_params with the model's size (without its "
            "embedding), or fit a cost to measured times",
            UserWarning,
            stacklevel=4,
        )
    r = _Reader(cfg, model_type)

    h = r.req("hidden_size")
    n = r.req("num_hidden_layers", maximum=MAX_LAYERS)  # one entry per layer is built
    heads = r.req("num_attention_heads")
    vocab = r.req("vocab_size")

    experts = 0
    experts_key = None
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = r.opt(key, None, minimum=0)
        if value is not None:
            experts, experts_key = value, key
            break
    top_k = r.req("num_experts_per_tok") if experts else 0
    if experts_key is not None and not experts:
        routed = r.opt("num_experts_per_tok", 0, minimum=0)
        if routed:
            # Costed as dense, the MoE layers' expert work would be silently wrong.
            raise ValueError(
                f"config field {experts_key!r} = 0 but 'num_experts_per_tok' = {routed}: a "
                "model cannot route tokens to experts it does not have; give the number of "
                f"experts, or drop 'num_experts_per_tok' for a dense model (fix the "
                "config.json)"
            )
    r.done()  # the layer rules below need these numbers
    if top_k > experts:
        raise ValueError(
            f"config field 'num_experts_per_tok' = {top_k} exceeds the number of experts "
            f"({experts}); fix the config.json"
        )

    moe = _moe_layers(cfg, r, n) if experts else [False] * n
    expert_width = r.opt("moe_intermediate_size", None) if experts else None
    dense_width = r.req("intermediate_size") if (not all(moe) or expert_width is None) else 0
    expert_width = expert_width or dense_width
    shared: tuple[int, ...] = ()
    if experts:
        qwen_shared = r.opt("shared_expert_intermediate_size", 0, minimum=0)
        n_shared = r.opt("n_shared_experts", 0, minimum=0)
        if qwen_shared:
            shared = (qwen_shared,)
        elif n_shared:
            shared = (expert_width,) * n_shared

    if cfg.get("kv_lora_rank") is not None:
        kv_rank = r.req("kv_lora_rank")
        nope = r.req("qk_nope_head_dim", minimum=0)
        rope = r.req("qk_rope_head_dim", minimum=0)
        v_dim = r.req("v_head_dim")
        q_rank = r.opt("q_lora_rank", None)
        r.done()
        if nope + rope < 1:
            raise ValueError("config fields 'qk_nope_head_dim' + 'qk_rope_head_dim' must be >= 1")
        base = Attention(heads, heads, nope + rope, v_dim, None, kv_rank, q_rank, rope)
    else:
        kv = r.opt("num_key_value_heads", heads)
        hd = r.opt("head_dim", None)
        r.done()
        assert kv is not None
        if hd is None:
            if h % heads:
                raise ValueError(
                    f"config has no 'head_dim' and hidden_size {h} is not divisible by "
                    f"num_attention_heads {heads}; add 'head_dim' to the config.json"
                )
            hd = h // heads
        if heads % kv:
            raise ValueError(
                f"config field 'num_attention_heads' = {heads} is not a multiple of "
                f"'num_key_value_heads' = {kv}; fix the config.json"
            )
        base = Attention(heads, kv, hd, hd)

    windows = _windows(cfg, family, r, n)
    r.done()
    gated = family not in _NON_GATED
    dense = MLP((dense_width,), gated)
    sparse = MLP((expert_width,) * top_k + shared, gated, experts, top_k)
    layers = tuple(
        Layer(replace(base, window=windows[i]), sparse if moe[i] else dense) for i in range(n)
    )
    return Architecture(model_type, h, vocab, layers)
