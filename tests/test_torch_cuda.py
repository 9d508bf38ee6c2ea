"""The torch layer on CUDA under NCCL: the paths gloo tests cannot reach.

NCCL all-reduces and gathers CUDA tensors only, and CUDA-event timing needs a GPU, so
these run only where torch sees CUDA devices and has NCCL (never in CI, which has no GPU);
world 2 needs two devices. One spawn per world runs every scenario (spawning and NCCL
set-up are the slow part); the tests then check what each rank returned.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import seqbalance as sb  # noqa: E402
from seqbalance.costs import TimingRecorder  # noqa: E402
from seqbalance.torch import (  # noqa: E402
    BalancedDistributedSampler,
    MicroBatchTimer,
    cp_shard,
    global_token_count,
    rebalance,
)
from seqbalance.torch.testing import run_distributed  # noqa: E402

CUDA_DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(
    CUDA_DEVICES == 0 or not dist.is_nccl_available(), reason="needs a CUDA GPU and NCCL"
)
TIMEOUT = 300
WORLDS = [
    pytest.param(
        w, marks=pytest.mark.skipif(CUDA_DEVICES < w, reason=f"needs {w} CUDA device(s)")
    )
    for w in (1, 2)
]

# The timed micro-batches: one long sequence alone, and short ones.
TIMED_LENGTHS = [4000, 300, 200, 100, 4000, 250, 150, 50]


def _matmul_work(tokens: int) -> None:
    """Work proportional to ``tokens`` (a chain of matmuls on the current device)."""
    x = torch.ones(tokens, 2048, device="cuda")
    w = torch.full((2048, 2048), 1 / 2048, device="cuda")
    for _ in range(8):
        x = x @ w


def _packed(lengths: np.ndarray, device: str) -> dict:
    cu = np.concatenate([[0], np.cumsum(lengths)])
    seq = np.repeat(np.arange(lengths.size), lengths)
    ids = seq * 10_000 + (np.arange(cu[-1]) - cu[:-1][seq])
    return {
        "input_ids": torch.from_numpy(ids.astype(np.int64)).to(device),
        "cu_seqlens": torch.from_numpy(cu.astype(np.int32)).to(device),
    }


def _worker(rank: int, world: int) -> dict:
    out: dict = {"device": str(torch.cuda.current_device())}

    # 1. MicroBatchTimer: CUDA events, the 9-float header and the times gathered on CUDA.
    p = sb.plan(TIMED_LENGTHS * world, world, 4096)
    recorder = TimingRecorder()
    timer = MicroBatchTimer(recorder)
    lengths = np.asarray(TIMED_LENGTHS * world)
    _matmul_work(4096)  # warm-up: the first matmul pays cuBLAS's set-up
    for mb in p.micro_batches[rank]:
        with timer.time(lengths[mb]):
            _matmul_work(int(lengths[mb].sum()))
    timings = timer.end_step(p)
    out["clock"] = timer.clock
    out["timings"] = [(t.rank, t.slot, float(t.seconds), int(t.lengths.sum())) for t in timings]
    out["recorded"] = len(recorder)
    out["plan"] = p.to_json()

    # 2. global_token_count: an int, a CPU tensor and a CUDA tensor; then a bad count on
    # rank 0 alone, which must raise on every rank instead of hanging the all-reduce.
    counts = {}
    for kind, value in (
        ("int", 5 + rank),
        ("cpu", torch.tensor(5 + rank)),
        ("cuda", torch.tensor(5 + rank, device="cuda")),
    ):
        total = global_token_count(value)
        counts[kind] = (int(total), total.device.type, str(total.dtype))
    out["counts"] = counts
    try:
        global_token_count(-3 if rank == 0 else 4)
        out["bad_count"] = "no error"
    except ValueError as exc:
        out["bad_count"] = str(exc)

    # 3. rebalance a packed CUDA batch and restore a per-token output.
    rng = np.random.default_rng(7 + rank)
    mine = rng.integers(1, 40, size=6 + 3 * rank)
    batch = _packed(mine, "cuda")
    batch["input_ids"] += 1_000_000 * rank  # sequences of different ranks differ
    mbs, handle = rebalance(batch, max_tokens=64, sync="fsdp", allow_empty=True)
    out["rebalance_devices"] = sorted({v.device.type for mb in mbs for v in mb.values()})
    out["rebalance_tokens"] = [mb["input_ids"].cpu().numpy() for mb in mbs]
    out["rebalance_cu"] = [mb["cu_seqlens"].cpu().numpy() for mb in mbs]
    back = handle.restore([mb["input_ids"].double() / 3 for mb in mbs])
    out["restored_exact"] = bool(torch.equal(back, batch["input_ids"].double() / 3))
    out["restored_device"] = back.device.type
    out["rebalance_plan"] = handle.plan.to_json()

    # 4. cp_shard over all GPUs of the world (one replica of cp_size = world).
    cp_lengths = np.array([300, 17, 45, 90, 8, 61])
    cp_batch = _packed(cp_lengths, "cuda")
    cp_plan = (
        sb.plan(cp_lengths, 1, 256, cp_size=world, cp="static")
        if world > 1
        else sb.plan(cp_lengths, 1, 512)
    )
    shards, cp_handle = cp_shard(cp_batch, cp_plan, rank)
    full = cp_handle.restore([mb["input_ids"] for mb in shards])
    out["cp_exact"] = bool(torch.equal(full, cp_batch["input_ids"]))
    out["cp_device"] = full.device.type

    # 5. The sampler's agreement check (an object all-gather under NCCL).
    sampler = BalancedDistributedSampler(
        [int(v) for v in np.arange(1, 65) * 7 % 200 + 1], 32, 512,
        num_replicas=world, rank=rank, seed=3,
    )  # fmt: skip
    sampler.set_epoch(1)
    out["sampler"] = [list(map(int, mb)) for mb in sampler]
    return out


@functools.cache
def _results(world: int) -> list[dict]:
    return run_distributed(_worker, world, timeout=TIMEOUT - 20, backend="nccl")


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", WORLDS)
def test_timer_uses_cuda_events_and_gathers_every_rank(world):
    res = _results(world)
    p = sb.Plan.from_json(res[0]["plan"])
    for r in range(world):
        assert res[r]["clock"] == "cuda"
        assert res[r]["device"] == str(r)  # rank r runs on cuda:r
        assert res[r]["timings"] == res[0]["timings"]  # every rank got every rank's times
    timings = res[0]["timings"]
    assert len(timings) == sum(len(mbs) for mbs in p.micro_batches)
    assert all(res[r]["recorded"] == len(timings) for r in range(world))
    assert {t[0] for t in timings} == set(range(world))
    assert all(np.isfinite(t[2]) and t[2] > 0 for t in timings)
    # The work is proportional to tokens: the busiest micro-batch (one 4,000-token
    # sequence) must measure longer than the lightest (the short ones, ~1,000 tokens
    # together), by far more than timer noise.
    heavy = max(timings, key=lambda t: t[3])
    light = min(timings, key=lambda t: t[3])
    assert heavy[3] >= 3.5 * light[3]
    assert heavy[2] > 2 * light[2]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", WORLDS)
def test_global_token_count_on_nccl(world):
    res = _results(world)
    want = sum(5 + r for r in range(world))
    for r in range(world):
        counts = res[r]["counts"]
        assert counts["int"] == (want, "cpu", "torch.int64")
        assert counts["cpu"] == (want, "cpu", "torch.int64")
        assert counts["cuda"] == (want, "cuda", "torch.int64")
        assert f"invalid on 1 of {world} ranks" in res[r]["bad_count"]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", WORLDS)
def test_rebalance_moves_cuda_rows_and_restores_them(world):
    res = _results(world)
    assert len({res[r]["rebalance_plan"] for r in range(world)}) == 1  # one plan everywhere
    all_tokens = []
    for r in range(world):
        assert res[r]["rebalance_devices"] == ["cuda"]
        assert res[r]["restored_device"] == "cuda"
        assert res[r]["restored_exact"]
        for tok, cu in zip(res[r]["rebalance_tokens"], res[r]["rebalance_cu"]):
            assert int(cu[-1]) == tok.size <= 64
            all_tokens.append(tok)
    # Every token of every rank arrives exactly once, whole sequences together.
    got = np.sort(np.concatenate(all_tokens))
    want = []
    for r in range(world):
        mine = np.random.default_rng(7 + r).integers(1, 40, size=6 + 3 * r)
        want.append(_packed(mine, "cpu")["input_ids"].numpy() + 1_000_000 * r)
    np.testing.assert_array_equal(got, np.sort(np.concatenate(want)))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", WORLDS)
def test_cp_shard_restores_cuda_outputs_exactly(world):
    res = _results(world)
    for r in range(world):
        assert res[r]["cp_exact"]
        assert res[r]["cp_device"] == "cuda"


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", WORLDS)
def test_sampler_agrees_under_nccl(world):
    res = _results(world)
    seen = sorted(i for r in range(world) for mb in res[r]["sampler"] for i in mb)
    assert seen == sorted(set(seen))  # no sequence twice
    assert len(seen) == 32 * (64 // 32)  # both global batches of the epoch
    assert len({len(res[r]["sampler"]) for r in range(world)}) == 1  # same count per rank
