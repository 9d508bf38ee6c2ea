"""No hang from bad input: every distributed scenario ends with the same error on every rank.

Each scenario is a function of (rank, world) that calls rebalance / restore / the sampler with
some rank-dependent mistake. All scenarios of one world size run in one spawn (spawning is
the slow part), one after the other on the same process group, so a scenario that left a
collective half done would also break the next one. The process group's timeout
(``COLLECTIVE_TIMEOUT``) is far below the default 30 minutes and below the test's own
timeout: a rank left waiting shows up as a gloo error on that rank, which fails the test.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

# torch is not in the test extra (it would pull a multi-GB CUDA build); skip, saying why.
TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("torch.distributed")

from seqbalance.torch import BalancedDistributedSampler, rebalance  # noqa: E402
from seqbalance.torch.agreement import RankAgreementError, agree_on, canonical  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

COLLECTIVE_TIMEOUT = 20  # seconds a rank may wait in one collective before gloo gives up
TIMEOUT = 240


def _batch(rank: int, n: int | None = None):
    n = 2 + rank if n is None else n
    ids = torch.arange(n, dtype=torch.int64) + 100 * rank
    return {"x": ids[:, None].repeat(1, 3).float(), "id": ids}, np.full(n, 2)


def _packed(rank: int):
    lens = np.array([1, 2, 3])[: 1 + rank % 3]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    return {"tok": torch.arange(int(lens.sum())), "cu_seqlens": cu}


def _round_trip(rank: int, **kw):
    batch, lens = _batch(rank)
    mbs, handle = rebalance(batch, lens, max_tokens=8, **kw)
    back = handle.restore([mb["id"] for mb in mbs])
    assert torch.equal(back, batch["id"])
    return handle


# ---- scenarios: name -> (function of rank, world; expected words in the message) --------
def s_max_tokens_zero_on_one_rank(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=0 if rank == 1 else 8)


def s_max_tokens_zero_everywhere(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=0)


def s_unknown_method_on_one_rank(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, method="bogus" if rank == 0 else "auto")


def s_unknown_planner_keyword_on_last_rank(rank, world):
    batch, lens = _batch(rank)
    extra = {"bogus_option": 1} if rank == world - 1 else {}
    rebalance(batch, lens, max_tokens=8, **extra)


def s_different_max_tokens(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8 + rank)


def s_different_min_micro_batches(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, min_micro_batches=1 + (rank == 1))


def s_different_size(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, size="balanced" if rank == 0 else "free")


def s_different_sync(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, sync="ddp" if rank == 1 else "fsdp")


def s_different_cost(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, cost="qwen2.5-7b" if rank == 0 else None)


def s_missing_cost_file_on_one_rank(rank, world):
    batch, lens = _batch(rank)
    cost = "/nonexistent/seqbalance-cost.json" if rank == 1 else "qwen2.5-7b"
    rebalance(batch, lens, max_tokens=8, cost=cost)


def s_cost_array_on_some_ranks(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, cost=np.ones(len(lens)) if rank == 0 else None)


def s_different_pad_values(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, pad_values={"x": 0.0} if rank == 1 else None)


def s_exact_searches_on_one_rank(rank, world):
    import seqbalance

    batch, lens = _batch(rank)
    with seqbalance.exact_searches(rank != 1):
        rebalance(batch, lens, max_tokens=8)


def s_nan_pad_for_integer_rows(rank, world):
    # Only the narrower ranks pad; a pad value int64 cannot hold must fail on every rank
    # before the exchange, not on those ranks alone while the others wait.
    width = 3 + 2 * (rank % 2)
    b = {"input_ids": torch.full((2, width), 7, dtype=torch.long)}
    rebalance(b, [width, width], max_tokens=100, pad_values={"input_ids": float("nan")})


def s_pad_for_a_missing_key(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, pad_values={"input_id": 0})


def s_float_cu_seqlens(rank, world):
    batch = {"tok": torch.arange(10), "cu_seqlens": torch.tensor([0.0, 2.5, 10.0])}
    rebalance(batch, None, max_tokens=16)


def s_different_method(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, method="p2p" if rank == 0 else "all_to_all")


def s_packed_on_one_rank(rank, world):
    if rank == 0:
        rebalance(_packed(rank), max_tokens=8)
    else:
        batch, lens = _batch(rank)
        rebalance(batch, lens, max_tokens=8)


def s_different_token_keys(rank, world):
    rebalance(_packed(rank), max_tokens=8, token_keys=["tok"] if rank else None)


def s_sequence_too_long_on_rank_0(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens * (8 if rank == 0 else 1), max_tokens=8)


def s_wrong_row_count_on_rank_1(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens[: len(lens) - (rank == 1)], max_tokens=8)


def s_groups_on_some_ranks(rank, world):
    batch, lens = _batch(rank)
    groups = [f"p{rank}"] * len(lens) if rank else None
    rebalance(batch, lens, max_tokens=8, groups=groups)


def s_groups_wrong_length_on_one_rank(rank, world):
    batch, lens = _batch(rank)
    rebalance(batch, lens, max_tokens=8, groups=[0] * (len(lens) + (rank == 0)))


def s_groups_strings_and_numbers(rank, world):
    batch, lens = _batch(rank)
    ids = [f"p{i}" for i in range(len(lens))] if rank == 0 else list(range(len(lens)))
    rebalance(batch, lens, max_tokens=8, groups=ids)


def s_restore_inconsistent_trailing_shapes(rank, world):
    batch, lens = _batch(rank)
    mbs, handle = rebalance(batch, lens, max_tokens=8, min_micro_batches=2)
    outs = [mb["x"] for mb in mbs]
    if rank == 1:  # torch.cat of [k, 5] and [k', 3] raises a RuntimeError on this rank only
        outs[0] = torch.zeros(outs[0].shape[0], 5)
    handle.restore(outs)


def s_restore_not_a_tensor_on_one_rank(rank, world):
    batch, lens = _batch(rank)
    mbs, handle = rebalance(batch, lens, max_tokens=8)
    outs = [mb["id"] for mb in mbs]
    handle.restore(outs if rank else [o.tolist() for o in outs])


def s_restore_different_token_keys(rank, world):
    mbs, handle = rebalance(_packed(rank), max_tokens=8)
    handle.restore([mb["tok"] for mb in mbs], token_keys={"x"} if rank == 0 else None)


def s_restore_with_handles_of_different_calls(rank, world):
    batch, lens = _batch(rank)
    first = rebalance(batch, lens, max_tokens=8)
    second = rebalance(batch, lens, max_tokens=8, min_micro_batches=2)
    mbs, handle = first if rank == 0 else second  # rank 0 restores the wrong step
    handle.restore([mb["id"] for mb in mbs])


def s_agree_unpicklable_payload_on_rank_0(rank, world):
    from seqbalance.torch.agreement import agree

    agree(None, {"option": 1}, (lambda: 0) if rank == 0 else 1, None, "custom")


def s_agree_on_check_raises_on_rank_1(rank, world):
    from seqbalance.torch.agreement import agree_on

    def check():
        if rank == 1:
            raise KeyError("attention_mask")  # e.g. a batch without the expected key
        return {"max_token_len": 8}, rank

    agree_on(check, None, "compat_call")


def s_agree_on_different_fingerprint(rank, world):
    from seqbalance.torch.agreement import agree_on

    agree_on(lambda: ({"max_token_len": 8 + (rank == 0)}, rank), None, "compat_call")


def _sampler(rank, world, **kw):
    args = {"lengths": [5, 1, 4, 4, 3, 2, 6, 1], "global_batch_size": 8, "max_tokens": 8}
    args.update(kw)
    return BalancedDistributedSampler(num_replicas=world, rank=rank, **args)


def s_sampler_different_seed(rank, world):
    _sampler(rank, world, seed=rank == 1)


def s_sampler_different_max_tokens(rank, world):
    _sampler(rank, world, max_tokens=8 + rank)


def s_sampler_different_lengths(rank, world):
    _sampler(rank, world, lengths=[5, 1, 4, 4, 3, 2, 6, 1 + (rank == 0)])


def s_sampler_bad_lengths_on_rank_0(rank, world):
    _sampler(rank, world, lengths=[5, 1, 4, -4, 3, 2, 6, 1] if rank == 0 else [1] * 8)


def s_sampler_exact_searches_on_one_rank(rank, world):
    import seqbalance

    with seqbalance.exact_searches(rank == 0):
        _sampler(rank, world)


def s_sampler_different_plan_option(rank, world):
    _sampler(rank, world, min_micro_batches=1 + (rank == 1))


def s_agree_on_another_seqbalance_version(rank, world):
    import seqbalance

    real = seqbalance.__version__
    seqbalance.__version__ = "9.9.9" if rank == world - 1 else real
    # The newer release also describes an argument differently ("cost" sorts before
    # "seqbalance version"): the version is what the message must name.
    cost = {"a": 1, "b": 0} if rank == world - 1 else {"a": 1}
    try:
        agree_on(lambda: ({"cost": cost, "max_tokens": 16}, rank), None, "compat_call")
    finally:
        seqbalance.__version__ = real


# ---- scenarios that must succeed ---------------------------------------------------------
def ok_round_trip_after_errors(rank, world):
    h = _round_trip(rank)
    return h.num_micro_batches


def ok_groups_gathered_across_ranks(rank, world):
    batch, lens = _batch(rank)
    # Ids are global: group "g0" has members on every rank and must end up on one rank.
    groups = np.array(["g0"] + [f"r{rank}-{i}" for i in range(1, len(lens))])
    mbs, _ = rebalance(batch, lens, max_tokens=64, groups=groups, size="balanced")
    held = torch.cat([mb["id"] for mb in mbs]).tolist()
    firsts = [100 * r for r in range(world)]
    mine = [i for i in held if i in firsts]
    return sorted(mine)


def ok_sampler_agrees(rank, world):
    s = _sampler(rank, world, seed=3)
    return [mb for step in s.steps() for mb in step]


def ok_agree_on_gathers_payloads(rank, world):
    from seqbalance.torch.agreement import agree_on

    return agree_on(lambda: ({"max_token_len": 8}, 10 * rank), None, "compat_call")


SCENARIOS = {
    "rebalance: max_tokens=0 on rank 1": (s_max_tokens_zero_on_one_rank, ["rank 1", "max_tokens"]),
    "rebalance: max_tokens=0 everywhere": (s_max_tokens_zero_everywhere, ["max_tokens"]),
    "rebalance: unknown method on rank 0": (s_unknown_method_on_one_rank, ["rank 0", "method"]),
    "rebalance: unknown planner keyword on last rank": (
        s_unknown_planner_keyword_on_last_rank,
        ["TypeError", "bogus_option"],
    ),
    "rebalance: different max_tokens": (s_different_max_tokens, ["max_tokens", "rank 0"]),
    "rebalance: different min_micro_batches": (
        s_different_min_micro_batches,
        ["min_micro_batches", "rank 1"],
    ),
    "rebalance: different size": (s_different_size, ["size", "rank 0"]),
    "rebalance: different sync": (s_different_sync, ["sync", "rank 1"]),
    "rebalance: different cost": (s_different_cost, ["cost", "rank 0"]),
    "rebalance: cost file missing on rank 1": (s_missing_cost_file_on_one_rank, ["rank 1", "cost"]),
    "rebalance: cost array on rank 0 only": (s_cost_array_on_some_ranks, ["cost", "rank 0"]),
    "rebalance: different pad_values": (s_different_pad_values, ["pad_values", "rank 1"]),
    "rebalance: different method": (s_different_method, ["method", "rank 0"]),
    "rebalance: NaN pad for int64 rows": (
        s_nan_pad_for_integer_rows,
        ["pad_values['input_ids']", "torch.int64"],
    ),
    "rebalance: pad for a key not in the batch": (
        s_pad_for_a_missing_key,
        ["'input_id'", "not a key"],
    ),
    "rebalance: float cu_seqlens": (s_float_cu_seqlens, ["integer tensor", "torch.float32"]),
    "rebalance: exact_searches off on one rank": (
        s_exact_searches_on_one_rank,
        ["exact_searches", "rank 1"],
    ),
    "rebalance: packed on rank 0, padded elsewhere": (s_packed_on_one_rank, ["layout"]),
    "rebalance: different token_keys": (s_different_token_keys, ["token_keys", "rank 0"]),
    "rebalance: sequence longer than max_tokens": (s_sequence_too_long_on_rank_0, ["max_tokens"]),
    "rebalance: wrong row count on rank 1": (s_wrong_row_count_on_rank_1, ["rank 1"]),
    "rebalance: groups on some ranks only": (s_groups_on_some_ranks, ["groups", "rank 0"]),
    "rebalance: groups of the wrong length on rank 0": (
        s_groups_wrong_length_on_one_rank,
        ["rank 0", "groups"],
    ),
    "rebalance: group ids strings on rank 0, numbers elsewhere": (
        s_groups_strings_and_numbers,
        ["groups", "strings"],
    ),
    "restore: inconsistent trailing shapes on rank 1 (torch.cat error)": (
        s_restore_inconsistent_trailing_shapes,
        ["rank 1", "RuntimeError"],
    ),
    "restore: a list instead of tensors on rank 0": (
        s_restore_not_a_tensor_on_one_rank,
        ["rank 0"],
    ),
    "restore: different token_keys": (s_restore_different_token_keys, ["token_keys"]),
    "restore: handles of two different rebalance calls": (
        s_restore_with_handles_of_different_calls,
        ["handle", "rank 0"],
    ),
    "agree: a payload that does not pickle on rank 0": (
        s_agree_unpicklable_payload_on_rank_0,
        ["custom failed on rank 0"],
    ),
    "agree_on: the local check raises KeyError on rank 1": (
        s_agree_on_check_raises_on_rank_1,
        ["compat_call failed on rank 1", "KeyError", "attention_mask"],
    ),
    "agree_on: different fingerprints": (
        s_agree_on_different_fingerprint,
        ["max_token_len", "rank 0: 9"],
    ),
    "agree_on: another seqbalance version on the last rank": (
        s_agree_on_another_seqbalance_version,
        ["different seqbalance versions", "9.9.9", "install the same version"],
    ),
    "sampler: different seed": (s_sampler_different_seed, ["seed", "rank 1"]),
    "sampler: different max_tokens": (s_sampler_different_max_tokens, ["max_tokens"]),
    "sampler: different lengths": (s_sampler_different_lengths, ["lengths", "rank 0"]),
    "sampler: negative length on rank 0": (s_sampler_bad_lengths_on_rank_0, ["rank 0", "lengths"]),
    "sampler: exact_searches on one rank only": (
        s_sampler_exact_searches_on_one_rank,
        ["exact_searches", "rank 0"],
    ),
    "sampler: different planner option": (
        s_sampler_different_plan_option,
        ["min_micro_batches", "rank 1"],
    ),
}
SUCCESSES = {
    "rebalance + restore after all the errors": ok_round_trip_after_errors,
    "rebalance: groups gathered across ranks": ok_groups_gathered_across_ranks,
    "sampler: same arguments everywhere": ok_sampler_agrees,
    "agree_on: payloads gathered": ok_agree_on_gathers_payloads,
}


def worker(rank: int, world: int) -> list[tuple[str, str, str, float]]:
    """Run every scenario; return (name, outcome kind, detail, seconds) per scenario."""
    out = []
    for name, (fn, _) in SCENARIOS.items():
        t = time.perf_counter()
        try:
            fn(rank, world)
            kind, detail = "no error", ""
        except Exception as exc:  # the test checks which type
            kind, detail = type(exc).__name__, str(exc)
        out.append((name, kind, detail, time.perf_counter() - t))
    for name, fn in SUCCESSES.items():
        t = time.perf_counter()
        try:
            kind, detail = "ok", repr(fn(rank, world))
        except Exception as exc:
            kind, detail = type(exc).__name__, str(exc)
        out.append((name, kind, detail, time.perf_counter() - t))
    return out


@pytest.fixture(scope="module", params=[2, 3, 4])
def outcomes(request):
    world = request.param
    results = run_distributed(
        worker, world, timeout=TIMEOUT - 20, collective_timeout=COLLECTIVE_TIMEOUT
    )
    return world, results


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_every_mismatch_raises_the_same_value_error_on_every_rank(outcomes):
    world, results = outcomes
    for i, (name, (_, words)) in enumerate(SCENARIOS.items()):
        per_rank = [results[r][i] for r in range(world)]
        kinds = {p[1] for p in per_rank}
        details = {p[2] for p in per_rank}
        # A ValueError on every rank: RankAgreementError from the first all-gather, or the
        # planner's own ValueError, raised alike everywhere from the same gathered inputs.
        assert kinds in ({RankAgreementError.__name__}, {"ValueError"}), (name, per_rank)
        assert len(details) == 1, (name, details)  # the very same message everywhere
        msg = details.pop()
        for w in words:
            assert w in msg, (name, w, msg)
        assert "gloo" not in msg.lower() and "timed out" not in msg.lower()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_successes_after_errors(outcomes):
    world, results = outcomes
    base = len(SCENARIOS)
    per_rank = [results[r][base:] for r in range(world)]
    for r in range(world):
        assert [p[1] for p in per_rank[r]] == ["ok"] * len(SUCCESSES), per_rank[r]
    # The group "g0" (the first sequence of every rank) landed on exactly one rank, whole.
    held = [eval(per_rank[r][1][2]) for r in range(world)]
    assert sorted(x for h in held for x in h) == [100 * r for r in range(world)]
    assert sum(1 for h in held if h) == 1
    # Sampler: the ranks' micro-batches partition the batch.
    mbs = [eval(per_rank[r][2][2]) for r in range(world)]
    assert sorted(i for m in mbs for mb in m for i in mb) == list(range(8))
    # agree_on: every rank holds every rank's payload, in rank order.
    for r in range(world):
        assert eval(per_rank[r][3][2]) == [10 * q for q in range(world)]


def test_canonical_is_deterministic_and_discriminating():
    assert canonical({"b": 1, "a": [1, 2.5]}) == canonical({"a": [1, 2.5], "b": 1})
    assert canonical(np.arange(3)) == canonical(np.arange(3))
    assert canonical(np.arange(3)) != canonical(np.arange(3, dtype=np.int32))
    assert canonical(np.int64(8)) == canonical(8)
    # Numbers by value: 4096 and 4096.0 (or a numpy float) are the same argument on two
    # ranks; they used to raise RankAgreementError. Bools stay apart from 1.
    assert canonical({"max_tokens": 4096}) == canonical({"max_tokens": 4096.0})
    assert canonical(np.float32(2.0)) == canonical(2) == "2"
    assert canonical(2.5) != canonical(2)
    assert canonical(True) != canonical(1) and canonical(1.0) != canonical(True)
    assert canonical(float("inf")) != canonical(float("-inf"))
    assert canonical(1e300) == canonical(int(1e300))
    assert canonical(torch.ones(2, dtype=torch.bfloat16)) != canonical(torch.ones(2))
    assert canonical(list(range(1000))).startswith("sha256:")
    assert canonical(object()) == canonical(object())  # no memory address in it


def test_sampler_without_process_group_raises_locally():
    with pytest.raises(ValueError, match="max_tokens"):
        BalancedDistributedSampler([1, 2], 2, 0, num_replicas=1, rank=0)
