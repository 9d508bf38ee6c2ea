"""The global-token-count normalisation gives the single-process token mean (loss and
gradients) after rebalancing, under DDP with gloo."""

from __future__ import annotations

import numpy as np
import pytest

# torch is not in the test extra (it would pull a multi-GB CUDA build); skip, saying why.
TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

from seqbalance.torch import global_token_count, rebalance, token_mean_loss  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

TIMEOUT = 120
CLASSES = 5


def all_lengths(world: int) -> tuple[np.ndarray, np.ndarray]:
    """Global lengths and how many sequences each rank starts with (rank 1 starts empty)."""
    rng = np.random.default_rng(world)
    counts = np.array([7, 0, 4][:world], dtype=np.int64)
    if world == 2:
        counts = np.array([9, 0])
    return rng.integers(1, 12, size=int(counts.sum())).astype(np.int64), counts


def features(ids: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token inputs and targets of the given global sequence ids, packed in order."""
    xs, ys = [], []
    for g in ids:
        rng = np.random.default_rng([99, int(g)])
        xs.append(rng.standard_normal((int(lengths[g]), 4)))
        ys.append(rng.integers(0, CLASSES, size=int(lengths[g])))
    if not xs:
        return torch.zeros((0, 4), dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, CLASSES, dtype=torch.float64)


def worker_loss(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    lengths, counts = all_lengths(world)
    start = int(counts[:rank].sum())
    ids = np.arange(start, start + counts[rank])
    x, y = features(ids, lengths)
    cu = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths[ids])]), dtype=torch.int32)
    batch = {"x": x, "y": y, "cu_seqlens": cu}
    mbs, handle = rebalance(batch, max_tokens=16, token_keys={"x", "y"}, allow_empty=True)

    model = DDP(make_model())
    local = sum(int(mb["y"].shape[0]) for mb in mbs)
    count = global_token_count(torch.tensor(local))
    total = torch.zeros((), dtype=torch.float64)
    for j, mb in enumerate(mbs):
        ctx = model.no_sync() if j < len(mbs) - 1 else _Null()
        with ctx:
            logits = model(mb["x"])
            s = torch.nn.functional.cross_entropy(logits, mb["y"], reduction="sum")
            loss = token_mean_loss(s, count)
            loss.backward()
        total += loss.detach()
    # The losses the ranks backpropagated, averaged like DDP averages gradients.
    torch.distributed.all_reduce(total)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    return {
        "count": int(count),
        "global_num_tokens": handle.global_num_tokens,
        "loss": float(total) / world,
        "grads": grads,
        "num_mb": len(mbs),
    }


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", [2, 3])
def test_balanced_loss_equals_single_process_token_mean(world):
    results = run_distributed(worker_loss, world, timeout=TIMEOUT - 10)
    lengths, _ = all_lengths(world)
    # Single process: the plain token mean over every token of the global batch.
    model = make_model()
    x, y = features(np.arange(len(lengths)), lengths)
    ref = torch.nn.functional.cross_entropy(model(x), y, reduction="mean")
    ref.backward()
    for res in results:
        assert res["count"] == int(lengths.sum()) == res["global_num_tokens"]
        np.testing.assert_allclose(res["loss"], float(ref.detach()), rtol=1e-12)
        for got, p in zip(res["grads"], model.parameters()):
            np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert len({res["num_mb"] for res in results}) == 1
    # The test is only meaningful if a per-rank mean would have been wrong: the ranks
    # hold different numbers of tokens after balancing... or at least not all equal.
    assert results[0]["count"] > 0


def test_helpers_without_process_group():
    assert int(global_token_count(5)) == 5
    assert int(global_token_count(torch.tensor([2, 3]))) == 5
    out = token_mean_loss(torch.tensor(6.0), 4, world_size=3)
    assert float(out) == pytest.approx(4.5)
    assert float(token_mean_loss(torch.tensor(6.0), 4, averaged_gradients=False)) == 1.5
    with pytest.raises(ValueError, match="global_count"):
        token_mean_loss(torch.tensor(1.0), 0)
    with pytest.raises(ValueError, match="local_count"):
        global_token_count(-1)
    with pytest.raises(ValueError, match="local_count"):
        global_token_count(torch.tensor(2.5))
    with pytest.raises(ValueError, match="whole number"):
        global_token_count(2.5)


@pytest.mark.parametrize(
    ("count", "kwargs", "words"),
    [
        (3, {"world_size": 0}, "world_size"),  # was a silently zero loss
        (3, {"world_size": -1}, "world_size"),
        (3, {"world_size": 2.5}, "world_size"),
        (3, {"world_size": True}, "world_size"),
        (3, {"averaged_gradients": "yes"}, "averaged_gradients"),
        (2.5, {}, "whole number"),
        (float("inf"), {}, "whole number"),
        (float("nan"), {}, "whole number"),
        (True, {}, "whole number"),
        ("4", {}, "whole number"),
        (2**70, {}, "2\\*\\*63"),
        (torch.tensor(2.5), {}, "whole number"),
        (torch.tensor([1, 2]), {}, "shape"),
        (torch.tensor(0), {}, ">= 1"),
    ],
)
def test_token_mean_loss_refuses_bad_counts(count, kwargs, words):
    with pytest.raises(ValueError, match=words):
        token_mean_loss(torch.tensor(6.0), count, **kwargs)


def test_token_mean_loss_whole_number_kinds_agree():
    # int, whole float, numpy and tensor counts all give 6 * 2 / 4.
    for count in (4, 4.0, np.int64(4), np.float32(4), torch.tensor(4), torch.tensor(4.0)):
        assert float(token_mean_loss(torch.tensor(6.0), count, world_size=2)) == 3.0


def _count_with_a_bad_rank(rank: int, world: int, bad):
    try:
        return "ok", int(global_token_count(bad if rank == 1 else 10 + rank))
    except ValueError as exc:
        return "error", str(exc)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("bad", [-3, 2.5, "many", torch.tensor([1.5]), np.ma.masked])
def test_global_token_count_raises_on_every_rank_when_one_count_is_bad(bad):
    """Rank 1's count was refused before the all-reduce, on rank 1 alone, while the other
    ranks waited in it (a hang until the collective timeout)."""
    out = run_distributed(_count_with_a_bad_rank, 3, bad, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert [kind for kind, _ in out] == ["error"] * 3, out
    assert all("invalid on 1 of 3 ranks" in msg for _, msg in out)
    assert "local_count" in out[1][1] and "this rank's count is valid" in out[0][1]


def _good_counts(rank: int, world: int):
    return [int(global_token_count(rank + 1)), int(global_token_count(torch.tensor([rank, 1])))]


@pytest.mark.slow
def test_global_token_count_sums_ints_and_tensors():
    out = run_distributed(_good_counts, 3, timeout=TIMEOUT - 10, collective_timeout=20)
    assert out == [[6, 6]] * 3


def _count_outside_the_group(rank: int, world: int):
    import torch.distributed as dist

    pair = dist.new_group([0, 1])
    return int(global_token_count(7 + rank, group=pair))


@pytest.mark.slow
def test_global_token_count_on_a_rank_outside_the_group_is_its_own_count():
    """Rank 2 is not in the group: torch's collectives do nothing there, so the local
    count comes back (a CPU count raised "Invalid process group specified" for a while)."""
    out = run_distributed(_count_outside_the_group, 3, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert out == [15, 15, 9]


def test_global_token_count_takes_numbers_that_equal_their_integer():
    from fractions import Fraction

    for value in (np.array(5), np.int32(5), Fraction(5, 1), 5.0, torch.tensor(5)):
        assert int(global_token_count(value)) == 5
    with pytest.raises(ValueError, match="whole number"):
        global_token_count(Fraction(9, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_token_mean_loss_in_half_precision_with_a_large_count(dtype):
    # 100,000 tokens is inf in float16: the loss came out 0 and so did every gradient.
    loss = torch.tensor(50000.0, dtype=dtype, requires_grad=True)
    out = token_mean_loss(loss, torch.tensor(100_000), world_size=2)
    assert out.dtype == dtype
    assert float(out.detach()) == pytest.approx(1.0, rel=1e-2)
    out.backward()
    assert float(loss.grad) == pytest.approx(2e-5, rel=1e-2) and float(loss.grad) > 0


def _loss_in_a_subgroup(rank: int, world: int):
    import torch.distributed as dist

    pair = dist.new_group([0, 1])  # the data-parallel group of a 3-process world
    if rank == 2:
        return None
    count = global_token_count(4, group=pair)  # 8 tokens over the pair
    return float(token_mean_loss(torch.tensor(8.0), count, group=pair))


@pytest.mark.slow
def test_token_mean_loss_takes_the_group_its_gradients_are_averaged_over():
    """Without group= the default world size was the whole world's: 3 where DDP averages
    over 2, so the loss came out 1.5x too large unless world_size= was passed."""
    out = run_distributed(_loss_in_a_subgroup, 3, timeout=TIMEOUT - 10, collective_timeout=20)
    assert out[:2] == [2.0, 2.0]  # 8 * 2 / 8
