"""Reading Hugging Face configs: inputs, families, windows, experts and error messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqbalance.costs import FlopsCost, load_cost, parse_config

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 100,
}
# Hand count for TINY: q 64*64, k and v 64*32 each, o 64*64; MLP 3*64*96; head 64*100.
TINY_LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96
TINY_PARAMS = 3 * TINY_LAYER + 64 * 100


def core(L, heads, qk, v, window=None):
    pairs = L * L / 2 if window is None or window >= L else window * L - window * window / 2
    return 2 * pairs * heads * qk + 2 * pairs * heads * v


def test_tiny_dict():
    cost = FlopsCost.from_hf_config(TINY)
    assert cost.matmul_params == TINY_PARAMS
    L = 300
    want = 2 * L * TINY_PARAMS + 3 * core(L, 4, 16, 16)
    assert cost.forward_flops([L])[0] == pytest.approx(want, rel=1e-12)


def test_path_folder_and_to_dict_object(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "architectures": ["X"]}))
    by_file = FlopsCost.from_hf_config(tmp_path / "config.json")
    by_dir = FlopsCost.from_hf_config(str(tmp_path))

    class Cfg:  # what a transformers PretrainedConfig offers
        def to_dict(self):
            return dict(TINY)

    by_obj = FlopsCost.from_hf_config(Cfg())
    for c in (by_file, by_dir, by_obj, load_cost(tmp_path), load_cost(tmp_path / "config.json")):
        assert c.matmul_params == TINY_PARAMS
    assert "architectures" not in by_file.config  # only architecture fields are kept


def test_missing_folder_config(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json"):
        FlopsCost.from_hf_config(tmp_path)


def test_bad_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        FlopsCost.from_hf_config(p)


def test_bad_config_type():
    with pytest.raises(ValueError, match="config must be"):
        FlopsCost.from_hf_config(42)


def test_missing_fields_are_all_named():
    cfg = {k: v for k, v in TINY.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(ValueError, match="missing") as info:
        FlopsCost.from_hf_config(cfg)
    assert "'hidden_size'" in str(info.value) and "'vocab_size'" in str(info.value)


def test_missing_intermediate_size():
    cfg = {k: v for k, v in TINY.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match="intermediate_size"):
        FlopsCost.from_hf_config(cfg)


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", 0),
        ("hidden_size", "64"),
        ("num_hidden_layers", 2.5),
        ("vocab_size", True),
        ("num_hidden_layers", 10**30),  # an OverflowError from building the layer list
    ],
)
def test_malformed_fields(field, value):
    with pytest.raises(ValueError, match=field):
        FlopsCost.from_hf_config({**TINY, field: value})


def test_head_dim_rules():
    with pytest.raises(ValueError, match="head_dim"):
        FlopsCost.from_hf_config({**TINY, "num_attention_heads": 5, "num_key_value_heads": 5})
    # head_dim given: heads*head_dim may differ from hidden (the slime miscount case).
    cost = FlopsCost.from_hf_config({**TINY, "head_dim": 32})
    attn = 64 * 4 * 32 + 2 * 64 * 2 * 32 + 4 * 32 * 64
    assert cost.matmul_params == 3 * (attn + 3 * 64 * 96) + 64 * 100
    # null head_dim falls back to hidden / heads; missing kv heads means MHA.
    assert FlopsCost.from_hf_config({**TINY, "head_dim": None}).matmul_params == TINY_PARAMS
    mha = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    assert FlopsCost.from_hf_config(mha).matmul_params == 3 * (4 * 64 * 64 + 3 * 64 * 96) + 6400


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        FlopsCost.from_hf_config({**TINY, "num_key_value_heads": 3})


def test_unknown_model_type_uses_generic_path_and_non_gated_families():
    # An unchecked family is read by the same rules, but no longer without a word: the
    # rules counted Nemotron's 2-matrix MLP as 3 (+24%), Llama-4 without its shared
    # experts (-36%) and BERT as a causal decoder.
    with pytest.warns(UserWarning, match="'somethingnew' is not a family seqbalance has"):
        generic = FlopsCost.from_hf_config({**TINY, "model_type": "somethingnew"})
    assert generic.matmul_params == TINY_PARAMS
    for family in ("gpt_neox", "nemotron"):
        neox = FlopsCost.from_hf_config({**TINY, "model_type": family})
        assert neox.matmul_params == TINY_PARAMS - 3 * (64 * 96)  # 2 MLP matrices, not 3


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"model_type": "llama4_text"}, "shared expert"),
        ({"model_type": "llama4"}, "chunked attention"),
        ({"model_type": "bert"}, "encoder"),
        ({"model_type": "somethingnew", "is_encoder_decoder": True}, "encoder-decoder"),
    ],
)
def test_families_the_rules_would_count_wrongly_are_refused(extra, why):
    with pytest.raises(ValueError, match=f"is not supported: .*{why}.*fit a cost"):
        FlopsCost.from_hf_config({**TINY, **extra})


def _windows(cfg):
    return [layer.attention.window for layer in parse_config(cfg).layers]


def test_sliding_window_rules():
    n = TINY["num_hidden_layers"]
    assert _windows({**TINY, "model_type": "mistral", "sliding_window": 32}) == [32] * n
    assert _windows({**TINY, "model_type": "mistral", "sliding_window": None}) == [None] * n
    off = {**TINY, "model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}
    assert _windows(off) == [None] * n
    on = {**off, "use_sliding_window": True, "max_window_layers": 1}
    assert _windows(on) == [None, 32, 32]
    gemma2 = {**TINY, "model_type": "gemma2", "sliding_window": 32}
    assert _windows(gemma2) == [32, None, 32]
    gemma3 = {**TINY, "model_type": "gemma3_text", "num_hidden_layers": 7, "sliding_window": 8}
    assert _windows(gemma3) == [8, 8, 8, 8, 8, None, 8]
    typed = {**gemma2, "layer_types": ["full_attention", "sliding_attention", "full_attention"]}
    assert _windows(typed) == [None, 32, None]


def test_qwen_window_defaults_follow_transformers():
    # seqbalance turned a Qwen window on when use_sliding_window was absent, from layer 0
    # when max_window_layers was: transformers (Qwen2Config, Qwen3Config) defaults to
    # use_sliding_window=False and max_window_layers=28, i.e. full attention. A 28-layer
    # Qwen2 config with only sliding_window cost 0.39x what runs, at 131k tokens.
    for family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        bare = {**TINY, "model_type": family, "sliding_window": 32}
        assert _windows(bare) == [None] * 3
    on = {**TINY, "model_type": "qwen2", "num_hidden_layers": 30, "sliding_window": 32,
          "use_sliding_window": True}  # fmt: skip
    assert _windows(on) == [None] * 28 + [32, 32]


def test_a_window_that_is_off_is_not_read():
    # transformers 5 writes sliding_window 0 when the window is off (Qwen2MoeConfig): the
    # config was refused with "must be an integer >= 1; fix the config.json".
    cfg = {**TINY, "model_type": "qwen2_moe", "sliding_window": 0, "use_sliding_window": False,
           "max_window_layers": 28}  # fmt: skip
    assert _windows(cfg) == [None] * 3
    assert FlopsCost.from_hf_config(cfg).matmul_params == TINY_PARAMS
    # A 0 or null window is no window, whatever the family.
    assert _windows({**TINY, "model_type": "mistral", "sliding_window": 0}) == [None] * 3
    with pytest.raises(ValueError, match="'sliding_window' = -1 must be an integer >= 0"):
        parse_config({**TINY, "model_type": "mistral", "sliding_window": -1})


def test_numpy_integers_in_a_config_dict_are_integers():
    # np.int64(64) was refused with "must be an integer >= 1".
    cfg = {k: (np.int64(v) if isinstance(v, int) else v) for k, v in TINY.items()}
    cfg["sliding_window"] = np.int32(8)
    got = FlopsCost.from_hf_config(cfg)
    want = FlopsCost.from_hf_config({**TINY, "sliding_window": 8})
    assert got.matmul_params == TINY_PARAMS
    assert got.forward_flops([300])[0] == want.forward_flops([300])[0]
    with pytest.raises(ValueError, match="must be an integer"):
        parse_config({**TINY, "hidden_size": np.float64(64.5)})


def test_window_flops_exact():
    cfg = {**TINY, "model_type": "gemma2", "sliding_window": 32}
    cost = FlopsCost.from_hf_config(cfg)
    for L in (1, 32, 33, 1000):
        want = 2 * L * TINY_PARAMS + 2 * core(L, 4, 16, 16, 32) + core(L, 4, 16, 16)
        assert cost.forward_flops([L])[0] == pytest.approx(want, rel=1e-12)


def test_layer_types_errors():
    with pytest.raises(ValueError, match="layer_types"):
        parse_config({**TINY, "sliding_window": 8, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="chunked"):
        parse_config({**TINY, "sliding_window": 8, "layer_types": ["chunked_attention"] * 3})
    with pytest.raises(ValueError, match="sliding_window"):
        parse_config({**TINY, "layer_types": ["sliding_attention"] * 3})


def test_gemma3_multimodal_text_config():
    cfg = {
        "model_type": "gemma3",
        "text_config": {
            **TINY,
            "model_type": "gemma3_text",
            "num_hidden_layers": 6,
            "sliding_window": 8,
        },
    }
    assert _windows(cfg) == [8] * 5 + [None]
    assert FlopsCost.from_hf_config(cfg).matmul_params == 6 * TINY_LAYER + 6400


def test_qwen2_moe_shared_expert_and_dense_layers():
    cfg = {
        **TINY,
        "model_type": "qwen2_moe",
        "num_hidden_layers": 4,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 48,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64
    dense = 3 * 64 * 96
    moe = 64 * 6 + 2 * 3 * 64 * 16 + 3 * 64 * 48
    # Layer i is sparse iff (i+1) % 2 == 0 and i not in [3]: only layer 1.
    assert FlopsCost.from_hf_config(cfg).matmul_params == 4 * attn + 3 * dense + moe + 6400


def test_mixtral_uses_intermediate_size_for_experts():
    cfg = {**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64
    assert (
        FlopsCost.from_hf_config(cfg).matmul_params == 3 * (attn + 64 * 4 + 2 * 3 * 64 * 96) + 6400
    )


def test_top_k_above_experts():
    cfg = {**TINY, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        FlopsCost.from_hf_config(cfg)


def test_moe_missing_top_k():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        FlopsCost.from_hf_config({**TINY, "num_local_experts": 4})


def test_mla_without_q_lora_and_missing_fields():
    cfg = {
        **TINY,
        "model_type": "deepseek_v2",
        "kv_lora_rank": 8,
        "q_lora_rank": None,
        "qk_nope_head_dim": 12,
        "qk_rope_head_dim": 4,
        "v_head_dim": 10,
    }
    attn = 64 * 4 * 16 + 64 * (8 + 4) + 8 * 4 * (12 + 10) + 4 * 10 * 64
    cost = FlopsCost.from_hf_config(cfg)
    assert cost.matmul_params == 3 * (attn + 3 * 64 * 96) + 6400
    L = 50
    want = 2 * L * cost.matmul_params + 3 * core(L, 4, 16, 10)
    assert cost.forward_flops([L])[0] == pytest.approx(want, rel=1e-12)
    broken = {k: v for k, v in cfg.items() if k != "v_head_dim"}
    with pytest.raises(ValueError, match="v_head_dim"):
        FlopsCost.from_hf_config(broken)


def test_json_round_trip(tmp_path):
    for cost in (FlopsCost.from_name("deepseek-v3"), FlopsCost.from_hf_config(TINY)):
        p = tmp_path / "c.json"
        cost.save(p)
        back = load_cost(p)
        assert isinstance(back, FlopsCost)
        x = np.array([1, 5000, 70000])
        np.testing.assert_array_equal(back(x), cost(x))
    rec = load_cost(json.loads(FlopsCost.from_name("llama-3-8b", recompute=True).to_json()))
    assert rec.recompute and rec.name == "llama-3-8b"


@pytest.mark.parametrize("flag", ["false", "False", 0, 1, "no", [False]])
def test_use_sliding_window_must_be_a_bool(flag):
    # "false" and 0 are not False: they used to leave the window on without a word.
    with pytest.raises(ValueError, match="use_sliding_window"):
        parse_config({**TINY, "sliding_window": 8, "use_sliding_window": flag})


def test_use_sliding_window_bools_and_null():
    cfg = {**TINY, "sliding_window": 8}
    assert not parse_config({**cfg, "use_sliding_window": False}).has_window
    assert parse_config({**cfg, "use_sliding_window": np.True_}).has_window
    # null is an absent field: the family's rule (on for llama) applies.
    assert parse_config({**cfg, "use_sliding_window": None}).has_window


@pytest.mark.parametrize(
    "key, value",
    [
        ("layer_types", 3),
        ("layer_types", {"full_attention", "sliding_attention", "sliding_attention "}),
        ("layer_types", {"a": 1, "b": 2, "c": 3}),
        ("layer_types", "full_attention"),
        ("mlp_only_layers", 2),
        ("mlp_only_layers", {0, 1}),
        ("mlp_only_layers", "0"),
    ],
)
def test_layer_lists_must_be_lists(key, value):
    # An int raised a TypeError; a set was read in hash order (a different plan per run).
    cfg = {**TINY, "sliding_window": 8, "num_local_experts": 4, "num_experts_per_tok": 2}
    with pytest.raises(ValueError, match=key):
        parse_config({**cfg, key: value})


def test_layer_lists_as_tuples():
    types = ("full_attention", "full_attention", "sliding_attention")
    cfg = {**TINY, "sliding_window": 8, "layer_types": types}
    assert _windows(cfg) == [None, None, 8]


@pytest.mark.parametrize("model_type", [["gpt_neox"], 5, {"name": "phi"}])
def test_model_type_must_be_a_string(model_type):
    # str(["gpt_neox"]) matched no family: the MLP was counted gated (3 matrices, not 2).
    with pytest.raises(ValueError, match="model_type"):
        parse_config({**TINY, "model_type": model_type})


def test_model_type_missing_is_generic():
    cfg = {k: v for k, v in TINY.items() if k != "model_type"}
    assert parse_config(cfg).model_type == "unknown"
    assert parse_config({**cfg, "model_type": None}).model_type == "unknown"
