"""Named, seeded sets of sequence lengths that look like real training batches.

Tests, benchmarks, the demo and the docs all draw from here, so every number this project
reports is about the same data. Every generator is deterministic for a given ``(n, seed)``
(numpy's PCG64 generator, identical on every platform).

Workloads
---------
``rl-math``
    GRPO-style math rollouts: prompts of ~100-1,000 tokens (lognormal, median 180), each
    with ``group_size=16`` responses. A prompt's difficulty sets the median of its
    responses (lognormal, median 2,600 across prompts, sigma 1.0); responses scatter around
    it (sigma 0.5), and those that hit the generation limit are cut at
    ``max_response=20480``, which gives the spike of truncated responses seen in
    DAPO/Qwen2.5-Math runs (about 3% here). Lengths are prompt + response. Items of one
    prompt are contiguous and share a group id (``Workload.groups``).
``rl-math-truncated``
    As ``rl-math`` with harder prompts (median response 4,600 tokens): about 9% of the
    responses run into ``max_response=20480`` and are cut there, a spike of identical
    lengths that makes tight packing hard (seen in long-CoT RL runs with a low limit).
``sft-chat``
    Chat SFT samples: lognormal with median 800 and sigma 1.0, clipped to [16, 32,768],
    which matches the published length histograms of ShareGPT/UltraChat-style mixes
    (mean ~1,300, p99 ~8k, a thin tail to 32k).
``long-mix``
    Mostly short samples (99.9%: lognormal, median 512, sigma 0.6, clipped to [16, 8,192])
    with 0.1% long documents, log-uniform on [16,384, 131,072], as in long-context SFT mixes.
    At least one long document is placed in every batch of 1,000 or more.
``long-context``
    Long-context SFT or agentic RL: 1% of sequences (at least one in every batch of 200 or
    more) are long, log-uniform on [32,768, 262,144]; the rest are chat-like (lognormal,
    median 1,000, sigma 0.8, clipped to [16, 16,384]). Sequences longer than a GPU's token
    budget need context parallelism (``plan(..., cp_size=...)``).
``uniform``
    Uniform integers on [64, 8,192]: a control with no tail.
``bimodal``
    70% short answers (lognormal, median 300, sigma 0.5) and 30% long reasoning traces
    (lognormal, median 6,000, sigma 0.4), clipped to [16, 32,768].

Examples
--------
>>> from seqbalance import workloads
>>> w = workloads.load("rl-math", 64, seed=1)
>>> w.lengths.shape, int(w.groups.max()) + 1
((64,), 4)
>>> bool((workloads.lengths("uniform", 1000) >= 64).all())
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import NDArray

from ._validate import check_nonnegative_int

__all__ = ["NAMES", "Workload", "describe", "lengths", "load"]


@dataclass(frozen=True)
class Workload:
    """A generated batch: lengths in tokens, and group ids where items come in groups."""

    name: str
    lengths: np.ndarray
    groups: np.ndarray | None
    seed: int


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


def _rl_math(
    n: int,
    rng: np.random.Generator,
    group_size: int = 16,
    max_response: int = 20480,
    median_response: float = 2600.0,
) -> tuple[np.ndarray, np.ndarray]:
    n_prompts = -(-n // group_size)
    prompt = np.clip(_lognormal(rng, 180.0, 0.5, n_prompts), 32, 2048)
    difficulty = _lognormal(rng, median_response, 1.0, n_prompts)
    groups = np.arange(n, dtype=np.int64) // group_size
    response = difficulty[groups] * np.exp(0.5 * rng.standard_normal(n))
    response = np.clip(response, 8, max_response)
    out = np.round(prompt[groups] + response).astype(np.int64)
    return out, groups


def _sft_chat(n: int, rng: np.random.Generator) -> np.ndarray:
    out: NDArray[np.int64] = np.round(np.clip(_lognormal(rng, 800.0, 1.0, n), 16, 32768)).astype(
        np.int64
    )
    return out


def _long_mix(n: int, rng: np.random.Generator) -> np.ndarray:
    out = np.clip(_lognormal(rng, 512.0, 0.6, n), 16, 8192)
    is_long = rng.random(n) < 0.001
    if n >= 1000 and not is_long.any():
        is_long[rng.integers(n)] = True
    long_len = np.exp(rng.uniform(np.log(16384), np.log(131072), n))
    out = np.where(is_long, long_len, out)
    return np.round(out).astype(np.int64)


def _long_context(n: int, rng: np.random.Generator) -> np.ndarray:
    out = np.clip(_lognormal(rng, 1000.0, 0.8, n), 16, 16384)
    is_long = rng.random(n) < 0.01
    if n >= 200 and not is_long.any():
        is_long[rng.integers(n)] = True
    long_len = np.exp(rng.uniform(np.log(32768), np.log(262144), n))
    out = np.where(is_long, long_len, out)
    return np.round(out).astype(np.int64)


def _uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(64, 8192, size=n, endpoint=True).astype(np.int64)


def _bimodal(n: int, rng: np.random.Generator) -> np.ndarray:
    short = _lognormal(rng, 300.0, 0.5, n)
    long = _lognormal(rng, 6000.0, 0.4, n)
    out = np.where(rng.random(n) < 0.7, short, long)
    return np.round(np.clip(out, 16, 32768)).astype(np.int64)


_PLAIN: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "sft-chat": _sft_chat,
    "long-mix": _long_mix,
    "long-context": _long_context,
    "uniform": _uniform,
    "bimodal": _bimodal,
}

NAMES: tuple[str, ...] = (
    "rl-math",
    "sft-chat",
    "long-mix",
    "long-context",
    "uniform",
    "bimodal",
    "rl-math-truncated",
)

_DESCRIPTIONS = {
    "rl-math": "GRPO math rollouts, 16 responses/prompt, truncation spike at 20,480",
    "sft-chat": "chat SFT, lognormal median 800, tail to 32k",
    "long-mix": "99.9% short + 0.1% long documents of 16k-128k",
    "long-context": "99% chat-like + 1% long sequences of 32k-256k (needs CP)",
    "uniform": "uniform on [64, 8192]",
    "bimodal": "70% short answers + 30% long reasoning traces",
    "rl-math-truncated": "GRPO rollouts, 16 responses/prompt, ~9% truncated at 20,480",
}


# Generation peaks at 16-40 bytes a sequence (measured): 10**8 stays within a few GB.
MAX_SEQUENCES = 10**8


def describe(name: str) -> str:
    """Return a one-line description of the workload ``name``."""
    _check_name(name)
    return _DESCRIPTIONS[name]


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(NAMES)}")


def load(name: str, n: int, seed: int = 0) -> Workload:
    """Generate ``n`` sequence lengths of the workload ``name``.

    Parameters
    ----------
    name : str
        One of :data:`NAMES`.
    n : int
        Number of sequences (>= 0).
    seed : int, optional
        Seed of the generator (an integer >= 0); the same ``(name, n, seed)`` always gives
        the same lengths.

    Returns
    -------
    Workload
        ``lengths`` (int64, shape ``(n,)``, all >= 1) and ``groups`` (int64 group ids for
        ``rl-math`` and ``rl-math-truncated``, else None).

    Raises
    ------
    ValueError
        For an unknown name, a negative or non-integer ``n`` or ``seed``, or ``n`` above
        :data:`MAX_SEQUENCES` (10**8).
    """
    _check_name(name)
    n = check_nonnegative_int(n, "n")
    if n > MAX_SEQUENCES:
        raise ValueError(
            f"n = {n} sequences is more than {MAX_SEQUENCES:,} (several GB of lengths); "
            "generate a smaller batch, or several with different seeds"
        )
    # An explicit integer seed: None would silently give different data on every call.
    seed = check_nonnegative_int(seed, "seed")
    rng = np.random.default_rng(seed)
    if name == "rl-math":
        out, groups = _rl_math(n, rng)
        return Workload(name, out, groups, seed)
    if name == "rl-math-truncated":
        out, groups = _rl_math(n, rng, median_response=4600.0)
        return Workload(name, out, groups, seed)
    return Workload(name, _PLAIN[name](n, rng), None, seed)


def lengths(name: str, n: int, seed: int = 0) -> np.ndarray:
    """Shorthand for ``load(name, n, seed).lengths``."""
    return load(name, n, seed).lengths
