"""``match_framework_count`` reproduces the micro-batch count of each verl version.

verl 0.9.1 raises its count until its Karmarkar-Karp split holds ``max_token_len``; verl
before it (0.7.0, 0.8.0, 0.9.0, main at commit b178a3cd, version file 0.8.0.dev) keeps
``ceil(tokens / max_token_len)`` and its split can break the cap. The expectations below
are ``bench/verl_versions.py``'s figures from the two real codes:

    python bench/verl_versions.py --verl 0.9.1=/work/ext --verl main=/work/verl_main

CI has no verl: the ranks come from verl's driver split reproduced
(``verl_equal_kk_labels``, identical to verl's in ``bench/verl_kk_check.py``), and the
cap breaks of the pre-0.9.1 code from its split reproduced (``verl_free_kk_labels``).
"""

from __future__ import annotations

import numpy as np
import pytest

import seqbalance.workloads as workloads
from seqbalance.compat import _verl_dropin
from seqbalance.compat import verl as c_verl
from seqbalance.partitioning._verl_kk import (
    parts_of_labels,
    verl_equal_kk_labels,
    verl_free_kk_labels,
)

# workload, n, dp, cap (the README demo's setups) -> per version: sorted per-rank counts,
# micro-batches over the cap, largest micro-batch in tokens (bench/results/verl_versions.json)
RECORDED = {
    ("rl-math", 1024, 8, 32768): {
        "0.9.1": ([21] * 8, 0, 32550),
        "0.8.0.dev": ([19] * 8, 88, 35492),
    },
    ("sft-chat", 4096, 16, 32768): {
        "0.9.1": ([11] * 16, 0, 31650),
        "0.8.0.dev": ([11] * 16, 0, 31650),
    },
    ("bimodal", 2048, 8, 32768): {
        "0.9.1": ([18] * 8, 0, 31861),
        "0.8.0.dev": ([17] * 8, 97, 33687),
    },
    ("long-mix", 16384, 16, 131072): {
        "0.9.1": ([6] * 16, 0, 125385),
        "0.8.0.dev": ([5] * 5 + [6] * 11, 20, 135546),
    },
}


def _ranks(lens: np.ndarray, dp: int) -> list[np.ndarray]:
    work = 24576 * lens.astype(np.int64) + lens.astype(np.int64) ** 2
    return [np.asarray(p) for p in parts_of_labels(verl_equal_kk_labels(work, dp), dp)]


@pytest.mark.parametrize("setup", list(RECORDED), ids=lambda s: s[0])
def test_each_versions_count_on_the_demo_workloads(setup):
    name, n, dp, cap = setup
    lens = workloads.lengths(name, n)
    ranks = _ranks(lens, dp)
    for version, (counts, _, _) in RECORDED[setup].items():
        got = []
        for r in ranks:
            mbs = c_verl.micro_batches_of_lengths(lens[r], cap, match_framework_count=version)
            assert sorted(i for mb in mbs for i in mb) == list(range(len(r)))
            assert max(int(lens[r][mb].sum()) for mb in mbs) <= cap  # held in every version
            got.append(len(mbs))
        assert sorted(got) == counts, version
    # The pre-0.9.1 code at its own count: its split (reproduced) breaks the cap as the
    # real code did.
    counts, over_cap, largest = RECORDED[setup]["0.8.0.dev"]
    tokens = []
    for r in ranks:
        lr = lens[r].astype(np.int64)
        m = min(len(r), -(-int(lr.sum()) // cap))
        labels = verl_free_kk_labels((24576 * lr + lr * lr).astype(np.float64), m)
        tokens += [int(lr[p].sum()) for p in parts_of_labels(labels, m)]
    assert (sum(t > cap for t in tokens), max(tokens)) == (over_cap, largest)


@pytest.mark.parametrize(
    ("value", "rule"),
    [(False, None), ("0.9.1", "retry"), ("0.10.0", "retry"), ("1.0", "retry"),
     ("v0.9.1rc1", "retry"), ("0.9.0", "no-retry"), ("0.8.0.dev", "no-retry"),
     ("0.7.0", "no-retry")],
)  # fmt: skip
def test_versions_map_to_their_rule(value, rule):
    assert _verl_dropin._count_rule(value) == rule


def test_true_follows_the_installed_verl(monkeypatch):
    monkeypatch.setattr(_verl_dropin, "_installed_verl_version", lambda: "0.8.0.dev")
    assert _verl_dropin._count_rule(True) == _verl_dropin.NO_RETRY
    monkeypatch.setattr(_verl_dropin, "_installed_verl_version", lambda: None)  # no verl: 0.9.1
    assert _verl_dropin._count_rule(True) == _verl_dropin.RETRY


@pytest.mark.parametrize("bad", ["main", "latest", "9", 2, 1.5])
def test_a_bad_version_is_named(bad):
    with pytest.raises(ValueError, match=r"match_framework_count must be True, False or a verl"):
        c_verl.micro_batches_of_lengths([10, 20], 40, match_framework_count=bad)


def test_pre_0_9_1_count_is_verls_where_its_own_split_holds_the_cap():
    # ceil(60 / 30) = 2 micro-batches; verl's split {25, 5} {20, 10} holds the cap, so
    # that count is kept (0.9.1 keeps it too: its first try fits).
    lens = [25, 20, 10, 5]
    for version in ("0.8.0", "0.9.1"):
        assert len(c_verl.micro_batches_of_lengths(lens, 30, match_framework_count=version)) == 2


# ---- verl before 0.8.0 agrees the count over the default group without a dp_group --------


def worker_without_group(rank, world):
    import torch
    from test_compat import _batch, _rank_lengths

    lens = _rank_lengths(rank)
    batch = _batch(torch, lens, 100)
    as_before_0_8 = _verl_dropin._world_without_group(c_verl.rearrange_micro_batches)
    agreed, _ = as_before_0_8(batch, 250)  # no dp_group, as verl's FSDP actor calls it
    alone, _ = c_verl.rearrange_micro_batches(batch, 250)
    return len(agreed), len(alone)


@pytest.mark.timeout(200)
def test_without_a_dp_group_the_pre_0_8_wrapper_agrees_over_the_default_group():
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_without_group, 2, timeout=150)
    assert len({o[0] for o in out}) == 1  # one count for the default group
    assert len({o[1] for o in out}) == 2  # unwrapped, each rank kept its own
    assert out[0][0] == max(o[1] for o in out)


@pytest.mark.parametrize(("version", "wrapped"),
                         [("0.7.0", True), ("0.8.0.dev", True), ("0.8.0", False),
                          ("0.9.1", False), (None, False)])  # fmt: skip
def test_patch_agrees_over_the_default_group_only_for_verl_before_0_8(monkeypatch, version,
                                                                       wrapped):  # fmt: skip
    monkeypatch.setattr(_verl_dropin, "_installed_verl_version", lambda: version)
    out = c_verl._replacements()
    for name in ("rearrange_micro_batches", "prepare_dynamic_batch"):
        assert (out[name] is not getattr(c_verl, name)) == wrapped
        assert out[name].__wrapped__ is getattr(c_verl, name) if wrapped else True
