"""seqbalance calibrate: end to end on tiny configs (CPU), the torch layers, the CLI."""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import pytest

from seqbalance.costs import QuadraticCost, load_cost, parse_config
from seqbalance.costs import calibrate as cal

# torch is not in the test extra (it would pull a multi-GB CUDA build); skip, saying why.
TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}
TINY_MOE_MLA = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 12,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "vocab_size": 128,
}
TINY_WINDOW = {**TINY, "model_type": "gemma2", "head_dim": 32, "sliding_window": 8}


@pytest.fixture(autouse=True)
def one_thread():
    # On a shared 2-core runner, torch's spinning worker threads make tiny models crawl.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


SMALL_GRID = [[16], [32], [64], [16, 16], [32, 32], [16] * 4, [48, 16], [20, 30, 14]]


def _cli(argv):
    p = argparse.ArgumentParser()
    sp = p.add_subparsers()
    cal.register(sp)
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_end_to_end_tiny(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "cost.json"
    argv = ["calibrate", "--model", str(cfg), "--out", str(out), "--max-tokens", "256",
            "--repeats", "1", "--warmup", "1", "--no-progress", "--threads", "1"]  # fmt: skip
    assert _cli(argv) == 0
    printed = capsys.readouterr().out
    assert "R^2" in printed and "held out" in printed and "FLOPs model" in printed
    cost = load_cost(out)
    assert isinstance(cost, QuadraticCost)
    assert all(math.isfinite(v) and v >= 0 for v in cost.polynomial)
    assert cost.per_token > 0 or cost.per_token_sq > 0
    meta = cost.meta
    assert meta["unit"] == "seconds" and meta["layers_timed"] == [0, 1]
    assert len(meta["measurements"]) == len(cal.calibration_grid(256))
    assert cost.report is not None and cost.report.holdout is not None
    assert cost.report.n_samples + cost.report.holdout.n_samples == len(meta["measurements"])
    # Model FLOPs b/c of TINY, by hand: per layer 64*64*2 + 64*32*2 + 3*64*128 = 36864,
    # head 64*256: b = 2*(2*36864 + 16384); c = 2 layers * 4 heads * (16 + 16).
    assert meta["flops_b_over_c"] == pytest.approx(2 * (2 * 36864 + 16384) / (2 * 4 * 32))


@pytest.mark.parametrize(("cfg", "warned"), [(TINY, False), (TINY_WINDOW, True)])
def test_windowed_stand_in_is_warned_about(tmp_path, capsys, cfg, warned):
    """Without flash_attn a sliding-window model's layers run a stand-in kernel whose
    fitted c disagreed ~5x with the FLOPs model on an H100: the cost JSON and stderr say
    so, and a model without windows gets no such warning."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "cost.json"
    argv = ["calibrate", "--model", str(path), "--out", str(out), "--max-tokens", "128",
            "--repeats", "1", "--warmup", "0", "--no-progress", "--no-head"]  # fmt: skip
    assert _cli(argv) == 0
    err = capsys.readouterr().err
    meta = load_cost(out).meta
    assert (cal.WINDOW_WARNING in meta.get("warnings", [])) is warned
    assert ("sliding-window layers were timed" in err) is warned
    assert ("sliding windows in masked blocks" in meta["attention"]) is warned


def test_stand_in_follows_the_path_each_windowed_layer_takes():
    """flash_attn installed does not mean it runs: head sizes above 256 (or q/k and v
    sizes that differ) go per sequence, through the masked blocks, and must be warned
    about (found by review)."""
    model = _model(TINY_WINDOW)
    assert model.windowed_stand_in  # no flash_attn here
    model.flash = lambda *a, **k: None  # as if flash_attn were installed
    assert not model.windowed_stand_in and model.attention_backend == "flash_attn varlen"
    wide = _model({**TINY_WINDOW, "head_dim": 512})
    wide.flash = model.flash
    assert wide.windowed_stand_in
    assert "sliding windows in masked blocks" in wide.attention_backend
    assert not _model(TINY).windowed_stand_in


def test_cli_prints_json_without_out(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    argv = ["calibrate", "--model", str(cfg), "--max-tokens", "64", "--repeats", "1",
            "--no-progress", "--no-head", "--holdout", "0"]  # fmt: skip
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("\n{") :])
    cost = load_cost(data)
    assert isinstance(cost, QuadraticCost) and cost.meta["lm_head"] is False
    assert data["fit"]["holdout"] is None


@pytest.mark.parametrize("cfg", [TINY_MOE_MLA, TINY_WINDOW], ids=["moe-mla", "window"])
def test_python_api_other_architectures(cfg):
    cost, report = cal.calibrate(
        cfg, layers=2, grid=SMALL_GRID, repeats=1, warmup=0, holdout=0, progress=False
    )
    assert report.n_samples == len(SMALL_GRID) and report.holdout is None
    assert all(math.isfinite(v) and v >= 0 for v in cost.polynomial)
    assert cost.report is report


def _model(cfg, layers=None):
    arch = parse_config(cfg)
    chosen = list(arch.layers if layers is None else [arch.layers[i] for i in layers])
    return cal._Model(torch, arch, chosen, "cpu", torch.float64, seed=0)


@pytest.mark.parametrize("cfg", [TINY, TINY_MOE_MLA, TINY_WINDOW], ids=["gqa", "moe-mla", "window"])
def test_built_layers_have_the_counted_weights(cfg):
    model = _model(cfg)
    h = model.arch.hidden_size
    for layer, weights in model.layers:
        got = sum(w.numel() for w in weights.values())
        assert got == layer.params(h)
    assert model.head.numel() == h * model.arch.vocab_size


@pytest.mark.parametrize("cfg", [TINY, TINY_MOE_MLA, TINY_WINDOW], ids=["gqa", "moe-mla", "window"])
def test_attention_stays_within_each_sequence(cfg):
    model = _model(cfg)
    lens = [5, 11, 3]
    x = torch.randn(sum(lens), 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    packed = model.forward(x, lens, cu)
    alone, start = [], 0
    for n in lens:
        alone.append(model.forward(x[start : start + n], [n], torch.tensor([0, n])))
        start += n
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-10, atol=1e-10)


def test_attention_runs_on_a_fused_kernel():
    """Per-sequence attention passed 3-D tensors, which only the math kernel accepts: it
    stores every sequence's L x L scores in float32 (on an H100 a 24k-token sequence of a
    7B model asked for 63 GiB) and times a kernel no trainer uses. With the math kernel
    disabled, the layers must still run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = _model(TINY)
    lens = [40, 7, 90]
    x = torch.randn(sum(lens), 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    cu = torch.tensor([0, 40, 47, 137], dtype=torch.int32)
    want = model.forward(x, lens, cu)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        got = model.forward(x, lens, cu)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("n", "window"), [(12, 8), (17, 4), (9, 1), (30, 7), (8, 8), (40, 16), (70, 20), (5, 8)]
)
def test_windowed_blocks_equal_one_masked_call(n, window):
    """Sliding-window layers ran one call with an n x n mask, whose time grows as n**2
    (on an H100 it fitted b/c of ~10k tokens for mistral-7b-v0.1 against the FLOPs model's
    54k); they now run blocks of `window` queries. Same values as the dense masked call."""
    model = _model(TINY_WINDOW, layers=[0])
    g = torch.Generator().manual_seed(n * 100 + window)
    q, k, v = (torch.randn(1, 3, n, 5, dtype=torch.float64, generator=g) for _ in range(3))
    i = torch.arange(n)
    band = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] < window)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(model._windowed(q, k, v, window), want, rtol=1e-12, atol=1e-12)


def test_window_covers_exactly_w_keys():
    # One sliding layer with W = 8: position 7 still sees position 0, position 8 does not,
    # which is the W·L − W²/2 pair count of the FLOPs model.
    model = _model(TINY_WINDOW, layers=[0])
    assert model.layers[0][0].attention.window == 8
    x = torch.randn(12, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[0] += 1.0
    cu = torch.tensor([0, 12])
    dx = (model.forward(y, [12], cu) - model.forward(x, [12], cu)).abs().amax(dim=1)
    assert (dx[:8] > 1e-6).all()
    assert (dx[8:] == 0).all()


def test_calibration_grid():
    grid = cal.calibration_grid(1024, seed=3)
    assert grid == cal.calibration_grid(1024, seed=3)
    assert all(16 <= v for mb in grid for v in mb)
    assert max(sum(mb) for mb in grid) == 1024
    assert all(sum(mb) <= 1024 for mb in grid)
    assert {len(mb) for mb in grid} >= {1, 2, 4, 8}
    with pytest.raises(ValueError, match="max_tokens"):
        cal.calibration_grid(32)


def test_layer_indices_are_spread():
    assert cal._layer_indices(61, 2) == [15, 45]
    assert cal._layer_indices(42, 2) == [10, 31]  # gemma2: one sliding, one global
    assert cal._layer_indices(4, 4) == [0, 1, 2, 3]


def test_missing_torch_cli_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert _cli(["calibrate", "--model", "llama-2-7b"]) == 2
    err = capsys.readouterr().err
    assert 'pip install ".[torch]"' in err
    with pytest.raises(cal.MissingTorchError, match=r"pip install \"\.\[torch\]\""):
        cal.calibrate("llama-2-7b")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-17"], "qwen2.5-7b"),
        (["--model", "llama-2-7b", "--layers", "40"], "layers"),
        (["--model", "llama-2-7b", "--max-tokens", "10"], "max_tokens"),
        (["--model", "llama-2-7b", "--holdout", "1.5"], "holdout"),
    ],
)
def test_cli_errors_exit_2(argv, message, capsys):
    assert _cli(["calibrate", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_a_clear_error(capsys):
    assert _cli(["calibrate", "--model", "llama-2-7b", "--device", "cuda"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_bad_grid_and_arguments():
    with pytest.raises(ValueError, match=r"grid\[1\]"):
        cal.calibrate(TINY, grid=[[16], [], [3], [4], [5]], progress=False)
    with pytest.raises(ValueError, match=r"grid\[0\]"):
        cal.calibrate(TINY, grid=[[-3]], progress=False)
    with pytest.raises(ValueError, match="leave"):
        cal.calibrate(TINY, grid=[[16], [32], [48], [64]], holdout=0.5, progress=False)
    with pytest.raises(ValueError, match="device"):
        cal.calibrate(TINY, device="tpu")
    with pytest.raises(ValueError, match="warmup"):
        cal.calibrate(TINY, warmup=-1)


def test_progress_fallback_without_rich(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    with cal._progress(20, True, "timing") as tick:
        for _ in range(20):
            tick()
    err = capsys.readouterr().err
    assert "timing: 2/20" in err and "timing: 20/20" in err
    assert err.count("\n") == 10


def test_progress_rich_bar_runs(capsys):
    pytest.importorskip("rich")
    with cal._progress(3, True, "timing") as tick:
        for _ in range(3):
            tick()
    with cal._progress(3, False, "timing") as tick:
        tick()
    assert np.isfinite(1.0)  # the bar drew without error


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),  # read as "the default" (1024) before
        ({"repeats": 0}, "repeats"),  # likewise (3)
        ({"max_tokens": False}, "max_tokens"),
        ({"holdout": True}, "holdout"),
        ({"holdout": False}, "holdout"),  # taken as 0
        ({"include_head": "no"}, "include_head"),  # truthy: the head was timed
        ({"progress": "no"}, "progress"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_calibrate_refuses_arguments_it_would_misread(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cal.calibrate(TINY, **kwargs)


def test_cli_max_tokens_zero_exits_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    argv = ["calibrate", "--model", str(tmp_path), "--max-tokens", "0", "--no-progress"]
    assert _cli(argv) == 2
    assert "max_tokens" in capsys.readouterr().err
