"""Standard workloads: deterministic, shaped as documented, strict about arguments."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance import workloads


@pytest.mark.parametrize("name", workloads.NAMES)
def test_deterministic_and_positive(name):
    a = workloads.load(name, 3000, seed=4)
    b = workloads.load(name, 3000, seed=4)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert a.lengths.dtype == np.int64 and a.lengths.shape == (3000,)
    assert (a.lengths >= 1).all()
    assert not np.array_equal(a.lengths, workloads.lengths(name, 3000, seed=5))


def test_shapes_match_the_documentation():
    rl = workloads.load("rl-math", 20_000, seed=0)
    np.testing.assert_array_equal(rl.groups, np.arange(20_000) // 16)  # 16 per prompt
    response_cap = 20480
    # the truncation spike: a few percent of responses hit the generation limit
    spike = np.mean(rl.lengths >= response_cap)
    assert 0.01 < spike < 0.08
    hard = workloads.load("rl-math-truncated", 20_000, seed=0)
    assert 0.07 < np.mean(hard.lengths >= response_cap) < 0.11  # ~9% truncated
    np.testing.assert_array_equal(hard.groups, rl.groups)
    chat = workloads.lengths("sft-chat", 20_000, seed=0)
    assert 600 < np.median(chat) < 1000 and chat.max() <= 32768
    mix = workloads.lengths("long-mix", 20_000, seed=0)
    long = mix >= 16384
    assert 0 < long.mean() < 0.003 and mix.max() <= 131072
    assert np.median(mix[~long]) < 1000
    uni = workloads.lengths("uniform", 20_000, seed=0)
    assert uni.min() >= 64 and uni.max() <= 8192
    bi = workloads.lengths("bimodal", 20_000, seed=0)
    assert 0.6 < np.mean(bi < 2000) < 0.8  # ~70% short answers
    assert workloads.load("uniform", 10).groups is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("nope", 10), "unknown workload 'nope'"),
        (("uniform", -1), "n must be >= 0"),
        (("uniform", 2.5), "n must be an integer"),
        (("uniform", 10, None), "seed must be an integer"),
        (("rl-math", 10**13), "n = 10000000000000 sequences is more than 100,000,000"),
    ],
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        workloads.load(*args)


def test_long_context_shape():
    w = workloads.lengths("long-context", 20_000, seed=0)
    long = w >= 32768
    assert 0.005 < long.mean() < 0.02 and w.max() <= 262144
    assert w[~long].max() <= 16384 and 600 < np.median(w[~long]) < 1500
    assert all((workloads.lengths("long-context", 200, seed=s) >= 32768).any() for s in range(5))
