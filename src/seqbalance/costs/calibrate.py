"""``seqbalance calibrate``: time a model's layers in torch and fit a cost to the timings.

The FLOPs model says what a sequence costs in arithmetic; real step times also pay a
fixed cost per micro-batch (kernel launches, FSDP all-gathers) and per sequence, and
attention and matmuls run at different speeds. Calibration measures that on the
hardware at hand:

1. Build ``layers`` decoder layers of the model from its config, with random weights (no
   download). They are picked at evenly spaced depths (layer ``floor((j + 1/2) · depth /
   layers)`` for ``j < layers``), so alternating sliding/global layers or dense-then-MoE
   stacks are sampled in proportion. Each layer is: RMS norm, attention (GQA or MLA,
   restricted to each sequence of the packed micro-batch, with the layer's sliding
   window), RMS norm, gated MLP. Rotary embeddings, biases and logit soft-capping are
   left out (element-wise work the fit absorbs into ``b``).
2. Mixture-of-experts layers run the router (softmax, top-k) and then ``top_k`` routed
   experts plus the shared experts, each over *all* tokens of the micro-batch: the FLOPs
   of perfectly balanced top-k routing, without the token permutation and grouped GEMMs
   of a real MoE kernel. Treat MoE calibrations as approximate.
3. Attention: on CUDA with ``flash_attn`` installed (fp16/bf16, equal Q/K and V head
   sizes) one varlen call per layer; otherwise ``scaled_dot_product_attention`` per
   sequence, on batched 4-D inputs so that torch's fused kernels run it (which adds a
   per-sequence launch cost that a varlen kernel would not have). Sliding-window layers
   then run in blocks of ``window`` queries with a band mask (linear in the length past
   the window, like a windowed kernel, but slower per score; calibrate warns).
4. Time forward + backward of packed micro-batches over a grid of token budgets and
   mixes (see :func:`calibration_grid`), fastest of ``repeats`` runs each, in a seeded
   random order; micro-batches far slower than a first fit predicts are timed again
   (background work only ever adds time). The LM head (final norm, ``h x vocab``
   matmul, cross-entropy) is timed separately for each micro-batch. The model's time is
   ``t_layers · depth / layers + t_head``.
5. Fit ``t = c0 + Σ(a + b·L + c·L²)`` with :func:`seqbalance.costs.fit_cost` on most
   micro-batches, check it on the held-out rest, and return the cost (in seconds) with
   its :class:`~seqbalance.costs.FitReport`.

What it does not see: communication (all-gathers, all-reduces), the optimizer step, and
the embedding. ``c0`` is the on-device fixed cost only.

torch is imported inside functions only; without it the command says how to install it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from .._validate import (
    as_lengths,
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_positive_int,
    unwritable,
)
from .architecture import (
    Architecture,
    Attention,
    Layer,
    parse_config,
    read_config,
    text_model_config,
)
from .base import QuadraticCost
from .fit import evaluate_cost, fit_cost
from .flops import SHIPPED, FlopsCost, shipped_config
from .report import FitReport

__all__ = [
    "INSTALL_HINT",
    "MIN_R2",
    "MissingTorchError",
    "calibrate",
    "calibration_grid",
    "fit_warnings",
    "register",
    "run",
]

INSTALL_HINT = (
    'seqbalance calibrate needs PyTorch; install it with: pip install ".[torch]" (in a '
    "seqbalance checkout) or pip install torch; a CPU-only build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

_MIN_LEN = 16  # shortest sequence the grid asks for

# Below this R^2 (on the fit or on the held-out micro-batches) the timings are mostly noise
# and the fitted cost may rank micro-batches wrongly; calibrate then warns.
MIN_R2 = 0.9


# Without flash_attn, sliding-window layers run a stand-in whose speed differs from a
# windowed flash kernel's; an H100 (torch 2.11, bf16) fitted b/c of ~9,000-10,000 tokens
# for mistral-7b-v0.1 and gemma-2-9b where their FLOPs models give ~54,000.
WINDOW_WARNING = (
    "sliding-window layers were timed with blocked, masked scaled_dot_product_attention "
    "(flash_attn is not installed), which runs slower per score than a windowed flash "
    "kernel: the fitted c may overstate long sequences; install flash-attn and calibrate "
    "again, or plan with the model's FLOPs cost"
)


class MissingTorchError(ImportError):
    """torch is not installed; the message says how to install it."""


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingTorchError(INSTALL_HINT) from exc
    return torch


def calibration_grid(max_tokens: int, seed: int = 0) -> list[list[int]]:
    """The micro-batches to time: lengths of each, packed up to ``max_tokens`` tokens.

    Token budgets ``max_tokens / 16, /8, /4, /2, /1`` (those of at least 16 tokens); each
    budget split into 1, 2, 4 and 8 equal sequences (of at least 16 tokens) and into two
    seeded random mixes of 2-8 sequences. Varying the budget separates ``c0`` and ``b``;
    varying the split at a fixed budget separates ``a`` and ``c``.

    Examples
    --------
    >>> grid = calibration_grid(256)
    >>> grid[:3]
    [[16], [32], [16, 16]]
    >>> max(sum(mb) for mb in grid)
    256
    """
    max_tokens = check_positive_int(max_tokens, "max_tokens")
    if max_tokens < 4 * _MIN_LEN:
        raise ValueError(f"max_tokens must be >= {4 * _MIN_LEN}, got {max_tokens}")
    rng = np.random.default_rng(seed)
    grid: list[list[int]] = []
    for shift in range(4, -1, -1):
        budget = max_tokens >> shift
        if budget < _MIN_LEN:
            continue
        grid += [[budget // k] * k for k in (1, 2, 4, 8) if budget // k >= _MIN_LEN]
        for _ in range(2):
            k = int(rng.integers(2, 9))
            if budget < k * _MIN_LEN:
                continue
            spare = budget - k * _MIN_LEN
            extra = np.floor(rng.dirichlet(np.ones(k)) * spare).astype(np.int64)
            grid.append([int(v) + _MIN_LEN for v in extra])
    return grid


def _resolve(config: Any) -> tuple[dict[str, Any], str]:
    """The config dict and a label for it."""
    if isinstance(config, FlopsCost):
        if config.config is None:
            raise ValueError("this FlopsCost carries no config; pass the config itself")
        return dict(config.config), config.name or str(config.config.get("model_type"))
    if isinstance(config, str) and config.lower() in SHIPPED:
        return shipped_config(config), config.lower()
    if isinstance(config, (str, os.PathLike)) and not os.path.exists(config):
        raise ValueError(
            f"model {str(config)!r} is neither a shipped model name ({', '.join(SHIPPED)}) "
            "nor an existing config.json or folder"
        )
    data = text_model_config(read_config(config))
    label = str(config) if isinstance(config, (str, os.PathLike)) else ""
    return data, label or str(data.get("_name_or_path") or data.get("model_type"))


def _layer_indices(depth: int, layers: int) -> list[int]:
    return [int((j + 0.5) * depth / layers) for j in range(layers)]


# --------------------------------------------------------------------------- torch model


class _Model:
    """Random-weight decoder layers and LM head as plain tensors (no nn.Module, so that
    nothing here needs torch at import time)."""

    def __init__(
        self,
        torch: Any,
        arch: Architecture,
        layers: list[Layer],
        device: str,
        dtype: Any,
        seed: int,
    ) -> None:
        self.torch = torch
        self.F = torch.nn.functional
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)
        h = arch.hidden_size
        self.layers = [(layer, self._layer_weights(layer, h)) for layer in layers]
        self.head = self._w(h, arch.vocab_size)
        self.masks: dict[tuple[int, int], Any] = {}
        self.flash = self._flash_fn()

    def _w(self, n_in: int, n_out: int) -> Any:
        t = self.torch.randn(n_in, n_out, generator=self.gen, device=self.device)
        return (t * n_in**-0.5).to(self.dtype).requires_grad_()

    def _layer_weights(self, layer: Layer, h: int) -> dict[str, Any]:
        att, w = layer.attention, {}
        n, qk, vd = att.heads, att.qk_head_dim, att.v_head_dim
        if att.is_mla:
            rope, c = att.qk_rope_head_dim, int(att.kv_lora_rank or 0)
            if att.q_lora_rank:
                w["q_a"], w["q_b"] = self._w(h, att.q_lora_rank), self._w(att.q_lora_rank, n * qk)
            else:
                w["q"] = self._w(h, n * qk)
            w["kv_a"] = self._w(h, c + rope)
            w["kv_b"] = self._w(c, n * (qk - rope + vd))
        else:
            w["q"] = self._w(h, n * qk)
            w["k"] = self._w(h, att.kv_heads * qk)
            w["v"] = self._w(h, att.kv_heads * vd)
        w["o"] = self._w(n * vd, h)
        mlp = layer.mlp
        if mlp.experts:
            w["router"] = self._w(h, mlp.experts)
        for i, width in enumerate(mlp.widths):
            w[f"up{i}"] = self._w(h, width)
            w[f"down{i}"] = self._w(width, h)
            if mlp.gated:
                w[f"gate{i}"] = self._w(h, width)
        return w

    def params(self) -> list[Any]:
        out = [self.head]
        for _, w in self.layers:
            out += list(w.values())
        return out

    def _flash_fn(self) -> Callable[..., Any] | None:
        if self.device != "cuda" or self.dtype not in (self.torch.float16, self.torch.bfloat16):
            return None
        try:
            from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
        except ImportError:
            return None
        return flash_attn_varlen_func  # type: ignore[no-any-return]

    def _flash_runs(self, att: Attention) -> bool:
        """Whether flash_attn's varlen kernel runs this attention (else per sequence)."""
        return self.flash is not None and att.qk_head_dim == att.v_head_dim <= 256

    @property
    def windowed_stand_in(self) -> bool:
        """Some sliding-window layer is timed with blocked, masked attention (flash_attn
        missing, or its kernel cannot take the layer's head sizes)."""
        return any(
            la.attention.window and not self._flash_runs(la.attention) for la, _ in self.layers
        )

    @property
    def attention_backend(self) -> str:
        flash = [self._flash_runs(la.attention) for la, _ in self.layers]
        name = "per-sequence scaled_dot_product_attention"
        if any(flash):
            name = "flash_attn varlen" if all(flash) else "flash_attn varlen and " + name
        return name + (" (sliding windows in masked blocks)" if self.windowed_stand_in else "")

    # -- forward pieces

    def _rms(self, x: Any) -> Any:
        torch = self.torch
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * scale.to(x.dtype)

    def _band(self, rows: int, cols: int, offset: int, window: int) -> Any:
        """Mask of query rows ``offset ..`` over keys ``0 .. cols``: causal, the last
        ``window`` keys."""
        key = (rows, cols, offset, window)
        if key not in self.masks:
            i = self.torch.arange(offset, offset + rows, device=self.device)
            j = self.torch.arange(cols, device=self.device)
            diff = i[:, None] - j[None, :]
            self.masks[key] = (diff >= 0) & (diff < window)
        return self.masks[key]

    def _windowed(self, q: Any, k: Any, v: Any, window: int) -> Any:
        """Sliding-window attention over [1, heads, n, dim] in blocks of ``window`` queries,
        each against its ``2 * window - 1`` nearest keys: about ``2 * window * n`` scores, so
        the time grows linearly in ``n`` past the window, as a windowed kernel's does (one
        masked call over the whole sequence would compute all ``n**2``). Every length of a
        windowed layer runs here, on one kernel, so the timings have no step at ``n = window``
        where another kernel would take over."""
        n, outs = q.shape[2], []
        with self._masked_kernels():
            for start in range(0, n, window):
                end = min(start + window, n)
                first = max(0, start - window + 1)
                mask = self._band(end - start, end - first, start - first, window)
                outs.append(
                    self.F.scaled_dot_product_attention(
                        q[:, :, start:end], k[:, :, first:end], v[:, :, first:end], attn_mask=mask
                    )
                )
        return self.torch.cat(outs, dim=2)

    def _masked_kernels(self) -> Any:
        """Keep masked attention off cuDNN's kernel: on an H100 (torch 2.11) it failed on
        these band masks ("mha_graph.execute ... is_good()" in the backward, or an illegal
        memory access, with key spans of 8,191 and also of multiples of 16); the
        memory-efficient kernel runs them."""
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # torch < 2.3 has no cuDNN attention to avoid
            return contextlib.nullcontext()
        return sdpa_kernel(
            [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        )

    def _attend(self, q: Any, k: Any, v: Any, att: Attention, lens: Sequence[int], cu: Any) -> Any:
        """q [T, H, dqk], k [T, Hkv, dqk], v [T, Hkv, dv] -> [T, H, dv], per sequence."""
        torch = self.torch
        if self._flash_runs(att):
            win = (att.window - 1, 0) if att.window else (-1, -1)
            top = max(lens)
            return self.flash(q, k, v, cu, cu, top, top, causal=True, window_size=win)
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        outs, start = [], 0
        for n in lens:
            # [1, heads, n, dim]: the fused kernels (flash, memory-efficient, on CUDA and
            # CPU) take batched 4-D inputs only; 3-D ones fall back to the math kernel,
            # which stores the n x n scores in float32 (63 GiB for one 24k-token sequence
            # of a 7B model) and times a kernel no trainer runs.
            qs, ks, vs = (t[start : start + n].transpose(0, 1)[None] for t in (q, k, v))
            start += n
            if att.window is not None:
                o = self._windowed(qs, ks, vs, att.window)
            else:
                o = self.F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs)

    def _attention(
        self, x: Any, att: Attention, w: dict[str, Any], lens: Sequence[int], cu: Any
    ) -> Any:
        torch, t, n = self.torch, x.shape[0], att.heads
        if att.is_mla:
            rope, c = att.qk_rope_head_dim, int(att.kv_lora_rank or 0)
            q = self._rms(x @ w["q_a"]) @ w["q_b"] if "q_a" in w else x @ w["q"]
            q = q.view(t, n, att.qk_head_dim)
            latent, k_pe = (x @ w["kv_a"]).split([c, rope], dim=-1)
            kv = (self._rms(latent) @ w["kv_b"]).view(t, n, att.qk_head_dim - rope + att.v_head_dim)
            k_nope, v = kv.split([att.qk_head_dim - rope, att.v_head_dim], dim=-1)
            k = torch.cat([k_nope, k_pe[:, None, :].expand(t, n, rope)], dim=-1)
        else:
            q = (x @ w["q"]).view(t, n, att.qk_head_dim)
            k = (x @ w["k"]).view(t, att.kv_heads, att.qk_head_dim)
            v = (x @ w["v"]).view(t, att.kv_heads, att.v_head_dim)
        o = self._attend(q, k, v, att, lens, cu)
        return o.reshape(t, n * att.v_head_dim) @ w["o"]

    def _mlp(self, x: Any, layer: Layer, w: dict[str, Any]) -> Any:
        mlp, F = layer.mlp, self.F
        gate = None
        if mlp.experts:
            probs = (x @ w["router"]).float().softmax(dim=-1)
            gate = probs.topk(mlp.top_k, dim=-1).values.to(x.dtype)
        out = None
        for i in range(len(mlp.widths)):
            if mlp.gated:
                y = (F.silu(x @ w[f"gate{i}"]) * (x @ w[f"up{i}"])) @ w[f"down{i}"]
            else:
                y = F.gelu(x @ w[f"up{i}"]) @ w[f"down{i}"]
            if gate is not None and i < mlp.top_k:
                y = y * gate[:, i : i + 1]
            out = y if out is None else out + y
        return out

    def forward(self, x: Any, lens: Sequence[int], cu: Any) -> Any:
        """The timed layers on a packed micro-batch ``x`` of shape [sum(lens), hidden]."""
        for layer, w in self.layers:
            x = x + self._attention(self._rms(x), layer.attention, w, lens, cu)
            x = x + self._mlp(self._rms(x), layer, w)
        return x

    def layers_step(self, x: Any, grad: Any, lens: Sequence[int], cu: Any) -> None:
        """Forward and backward through the timed layers."""
        self.forward(x, lens, cu).backward(grad)

    def head_step(self, x: Any, targets: Any) -> None:
        """Forward and backward through the final norm, LM head and cross-entropy."""
        logits = self._rms(x) @ self.head
        self.F.cross_entropy(logits.float(), targets).backward()


@contextlib.contextmanager
def _progress(total: int, enabled: bool, label: str) -> Iterator[Callable[[], None]]:
    """Yield a tick() to call once per step: a rich progress bar when rich is installed,
    else a line on stderr every ~10% of the steps."""
    if not enabled:
        yield lambda: None
        return
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    except ImportError:
        done = [0]
        every = max(1, total // 10)

        def tick() -> None:
            done[0] += 1
            if done[0] % every == 0 or done[0] == total:
                print(f"{label}: {done[0]}/{total}", file=sys.stderr, flush=True)

        yield tick
        return
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def calibrate(
    config: Any,
    *,
    device: str = "cpu",
    layers: int = 2,
    max_tokens: int | None = None,
    grid: Sequence[Sequence[int]] | None = None,
    repeats: int | None = None,
    warmup: int = 2,
    dtype: str | None = None,
    holdout: float = 0.25,
    include_head: bool = True,
    seed: int = 0,
    threads: int | None = None,
    progress: bool = True,
) -> tuple[QuadraticCost, FitReport]:
    """Time ``layers`` decoder layers of a model and fit a cost in seconds.

    Parameters
    ----------
    config
        A shipped model name (``"qwen2.5-7b"``), a path to a ``config.json`` or its
        folder, a config dict, an object with ``to_dict()``, or a FlopsCost.
    device
        ``"cpu"`` or ``"cuda"``.
    layers
        How many decoder layers to build and time (at most the model's depth).
    max_tokens
        Largest micro-batch of the default grid (default 1024 on CPU, 16384 on CUDA).
    grid
        Micro-batches to time (lists of lengths) instead of :func:`calibration_grid`.
    repeats
        Timed runs per micro-batch, fastest kept (default 3 on CPU, 5 on CUDA).
    warmup
        Untimed runs of the largest micro-batch first.
    dtype
        ``"float32"``, ``"bfloat16"`` or ``"float16"`` (default: float32 on CPU,
        bfloat16 on CUDA).
    holdout
        Fraction of micro-batches kept out of the fit to check it (0 for none).
    include_head
        Time the LM head and cross-entropy too.
    seed
        Seeds the weights, the grid's random mixes, the order and the held-out split.
    threads
        CPU threads torch may use while timing (restored afterwards); default: torch's
        setting. On a busy machine 1 thread times small models far more steadily.
    progress
        Show a progress bar on stderr.

    Returns
    -------
    (QuadraticCost, FitReport)
        The cost in seconds (its ``meta`` records model, device, dtype, the timed layers
        and every measurement) and its fit report, with the held-out statistics in
        ``report.holdout``.

    Raises
    ------
    MissingTorchError
        When torch is not installed (an ImportError that says how to install it).
    ValueError
        On bad arguments or configs, or ``device="cuda"`` without a GPU.
    """
    torch = _import_torch()
    device = check_choice(device, "device", ("cpu", "cuda"))
    layers = check_positive_int(layers, "layers")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(holdout, bool) or not (isinstance(holdout, (int, float)) and 0 <= holdout < 1):
        raise ValueError(f"holdout must be a fraction in [0, 1), got {holdout!r}")
    include_head = check_bool(include_head, "include_head")
    progress = check_bool(progress, "progress")
    seed = check_nonnegative_int(seed, "seed")
    # None means the device's default; 0 must not (`0 or default` took it as unset).
    if max_tokens is not None:
        max_tokens = check_positive_int(max_tokens, "max_tokens")
    if repeats is not None:
        repeats = check_positive_int(repeats, "repeats")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    dtype_name = check_choice(
        dtype or ("bfloat16" if device == "cuda" else "float32"),
        "dtype",
        ("float32", "bfloat16", "float16"),
    )
    if repeats is None:
        repeats = 5 if device == "cuda" else 3
    cfg, label = _resolve(config)
    arch = parse_config(cfg)
    if layers > arch.num_layers:
        raise ValueError(
            f"layers = {layers} exceeds the model's {arch.num_layers} layers; pass --layers "
            f"<= {arch.num_layers}"
        )
    if grid is None:
        if max_tokens is None:
            max_tokens = 16384 if device == "cuda" else 1024
        mbs = calibration_grid(max_tokens, seed)
    else:
        mbs = [as_lengths(mb, f"grid[{i}]").tolist() for i, mb in enumerate(grid)]
        for i, mb in enumerate(mbs):
            if not mb or min(mb) < 1:
                raise ValueError(
                    f"grid[{i}] = {mb!r} must hold at least one sequence, each of >= 1 token"
                )
    rng = np.random.default_rng(seed)
    n_hold = round(holdout * len(mbs))
    if len(mbs) - n_hold < 4:
        raise ValueError(
            f"{len(mbs)} micro-batches leave {len(mbs) - n_hold} to fit 4 coefficients; "
            "use a bigger grid or a smaller holdout"
        )

    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_positive_int(threads, "threads"))
    try:
        idx = _layer_indices(arch.num_layers, layers)
        torch.manual_seed(seed)
        dt = getattr(torch, dtype_name)
        model = _Model(torch, arch, [arch.layers[i] for i in idx], device, dt, seed)
        timer = _Timer(torch, model, include_head)
        for _ in range(warmup):
            timer(max(mbs, key=sum), 1)
        seconds = np.empty(len(mbs), dtype=np.float64)
        with _progress(len(mbs), progress, "timing micro-batches") as tick:
            for i in rng.permutation(len(mbs)).tolist():  # random order: drift spreads evenly
                seconds[i] = timer(mbs[i], repeats)
                tick()
        retimed = _retime_outliers(timer, mbs, seconds, repeats)
        device_name = _device_name(torch, device)
    finally:
        torch.set_num_threads(saved_threads)

    order = rng.permutation(len(mbs))
    hold, fit_ids = sorted(order[:n_hold].tolist()), sorted(order[n_hold:].tolist())
    cost = fit_cost([mbs[i] for i in fit_ids], seconds[fit_ids])
    assert cost.report is not None  # fit_cost always reports
    report = cost.report
    if hold:
        report = replace(report, holdout=evaluate_cost(cost, [mbs[i] for i in hold], seconds[hold]))
    flops = FlopsCost(arch)
    meta = {
        "unit": "seconds",
        "source": "seqbalance calibrate",
        "model": label,
        "model_type": arch.model_type,
        "device": device_name,
        "dtype": dtype_name,
        "torch": str(torch.__version__),
        "attention": model.attention_backend,
        "attention_warnings": [WINDOW_WARNING] if model.windowed_stand_in else [],
        "layers_timed": idx,
        "num_layers": arch.num_layers,
        "lm_head": include_head,
        "repeats": repeats,
        "retimed": retimed,
        "seed": seed,
        "flops_b_over_c": flops.per_token / flops.per_token_sq,
        "measurements": [
            {"lengths": mbs[i], "seconds": float(seconds[i]), "held_out": i in set(hold)}
            for i in range(len(mbs))
        ],
    }
    out = QuadraticCost(
        cost.per_token,
        cost.per_token_sq,
        cost.per_sequence,
        cost.per_microbatch,
        meta=meta,
        report=report,
    )
    return out, report


def fit_warnings(report: FitReport | None) -> list[str]:
    """Why a calibrated cost should not be trusted, if it should not (else ``[]``).

    A fit whose R^2 is below :data:`MIN_R2`, on the timed micro-batches or on the held-out
    ones, explains little of the measured times: typically a busy CPU, or micro-batches so
    small that fixed overheads and noise dominate.

    Examples
    --------
    >>> from seqbalance.costs import FitReport
    >>> coefs = dict(per_microbatch=0.0, per_sequence=0.0, per_token=1.0, per_token_sq=0.0)
    >>> fit_warnings(FitReport(0.99, 0.1, 0.01, 20, coefs))
    []
    >>> fit_warnings(FitReport(-0.09, 0.9, 0.3, 20, coefs))[0][:40]
    'the fit explains the timings poorly (R^2'
    """
    if report is None:
        return []
    scores = [("fit", report.r2)]
    if report.holdout is not None:
        scores.append(("held out", report.holdout.r2))
    bad = [(label, r2) for label, r2 in scores if not (math.isfinite(r2) and r2 >= MIN_R2)]
    if not bad:
        return []
    where = ", ".join(f"{r2:.2f} {label}" for label, r2 in bad)
    return [
        f"the fit explains the timings poorly (R^2 {where}; below {MIN_R2}), so this cost "
        "may rank micro-batches wrongly. The timings are mostly noise: time on a GPU "
        "(--device cuda), or on an idle machine with --threads 1, more --repeats and a "
        "larger --max-tokens"
    ]


def _device_name(torch: Any, device: str) -> str:
    if device == "cuda":
        return str(torch.cuda.get_device_name())
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


class _Timer:
    """Seconds of one forward+backward of a micro-batch through the whole model: the
    timed layers scaled to the model's depth, plus the LM head when asked."""

    def __init__(self, torch: Any, model: _Model, include_head: bool) -> None:
        self.torch, self.model, self.include_head = torch, model, include_head
        self.scale = model.arch.num_layers / len(model.layers)
        self.params = model.params()

    def _sync(self) -> None:
        if self.model.device == "cuda":
            self.torch.cuda.synchronize()

    def _fastest(self, fn: Callable[[], None], leaves: list[Any], repeats: int) -> float:
        # The fastest run: interference from other work only ever adds time.
        best = math.inf
        for _ in range(repeats):
            for p in self.params + leaves:
                p.grad = None  # every run allocates its gradients afresh
            self._sync()
            t0 = time.perf_counter()
            fn()
            self._sync()
            best = min(best, time.perf_counter() - t0)
        return best

    def __call__(self, lens: list[int], repeats: int) -> float:
        torch, model = self.torch, self.model
        dev, dtype, h = model.device, model.dtype, model.arch.hidden_size
        total = sum(lens)
        x = torch.randn(total, h, device=dev, dtype=dtype, requires_grad=True)
        g = torch.randn(total, h, device=dev, dtype=dtype)
        cu = torch.tensor([0, *np.cumsum(lens).tolist()], device=dev, dtype=torch.int32)
        t = self._fastest(lambda: model.layers_step(x, g, lens, cu), [x], repeats) * self.scale
        if self.include_head:
            y = torch.randn(total, h, device=dev, dtype=dtype, requires_grad=True)
            targets = torch.randint(0, model.arch.vocab_size, (total,), device=dev)
            t += self._fastest(lambda: model.head_step(y, targets), [y], repeats)
        if not (math.isfinite(t) and t > 0):
            raise RuntimeError(f"timing of {lens} came out as {t}; the clock is too coarse")
        return t


def _retime_outliers(
    timer: _Timer, mbs: list[list[int]], seconds: np.ndarray, repeats: int, rounds: int = 2
) -> int:
    """Re-time micro-batches far slower than a fit of all of them predicts (a background
    job was running), keeping the faster time; returns how many were re-timed."""
    count = 0
    for _ in range(rounds):
        with warnings.catch_warnings():  # a screen for slow outliers: the final fit warns
            warnings.simplefilter("ignore", UserWarning)
            cost = fit_cost(mbs, seconds)
        pred = np.array([cost.microbatch_cost(mb) for mb in mbs])
        rel = seconds / pred - 1.0
        limit = max(0.25, 5.0 * float(np.median(np.abs(rel))))
        suspects = np.flatnonzero(rel > limit).tolist()
        if not suspects:
            break
        for i in suspects:
            seconds[i] = min(seconds[i], timer(mbs[i], repeats))
        count += len(suspects)
    return count


# --------------------------------------------------------------------------- CLI


def register(subparsers: Any) -> None:
    """Add the ``calibrate`` subcommand to an argparse ``subparsers`` object."""
    p = subparsers.add_parser(
        "calibrate",
        help="time a model's layers in torch and fit a cost (seconds) to the timings",
        description=(
            "Build N decoder layers of the model from its config with random weights, time "
            "forward+backward of packed micro-batches, scale by depth, fit "
            "t = c0 + sum(a + b*L + c*L^2), print the fit report and write the cost JSON "
            "(usable wherever a cost is accepted)."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="CONFIG",
        help=f"shipped model name ({', '.join(SHIPPED)}) or a path to a HF config.json "
        "or its folder",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--layers", type=int, default=2, help="decoder layers to build and time (default 2)"
    )
    p.add_argument(
        "--out", metavar="PATH", default=None, help="write the cost JSON here (default: print it)"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="largest micro-batch of the grid, in tokens (default 1024 on cpu, 16384 on cuda)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed runs per micro-batch (fastest kept)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    p.add_argument("--holdout", type=float, default=0.25, help="fraction held out to check the fit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch while timing")
    p.add_argument("--no-head", action="store_true", help="do not time the LM head")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``seqbalance calibrate`` from parsed arguments; returns the exit code."""
    # Errors as the other commands print them: one `error:` line, exit status 2.
    try:
        _import_torch()
    except MissingTorchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = unwritable(args.out) if args.out else None
    if problem:  # before minutes of timing, not after
        print(f"error: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    try:
        cost, report = calibrate(
            args.model,
            device=args.device,
            layers=args.layers,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            warmup=args.warmup,
            dtype=args.dtype,
            holdout=args.holdout,
            include_head=not args.no_head,
            seed=args.seed,
            threads=args.threads,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cautions = fit_warnings(report) + list(cost.meta.get("attention_warnings", []))
    if cautions:
        cost.meta["warnings"] = cautions  # travels with the cost JSON; --cost repeats it
    meta = cost.meta
    print(
        f"model {meta['model']} on {meta['device']}, {meta['dtype']}, layers {meta['layers_timed']}"
        f" of {meta['num_layers']} timed ({meta['attention']})"
    )
    print(report)
    b, c = cost.per_token, cost.per_token_sq
    fitted = f"{b / c:.6g} tokens" if c > 0 else "inf" if b > 0 else "undefined (b = c = 0)"
    print(f"b/c: fitted {fitted}, FLOPs model {meta['flops_b_over_c']:.6g} tokens")
    if args.out:
        cost.save(args.out)
        print(f"wrote {args.out}")
    else:
        print(cost.to_json())
    for warning in cautions:  # last, so that it is not scrolled away by the JSON
        print(f"warning: {warning}", file=sys.stderr)
    return 0
