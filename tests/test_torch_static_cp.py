"""Static context parallelism in torch loops: whole sequences per data-parallel replica.

A framework such as Megatron-LM loads one micro-batch per replica and cuts every sequence
over the replica's CP ranks itself (two chunks a rank, the balanced layout). For it,
``rebalance(..., cp_size=C)`` and ``BalancedDistributedSampler(..., cp_size=C)`` plan
static CP (``max_tokens`` per GPU, on a sequence's largest piece) and give every CP rank of
a replica that replica's whole sequences. Expected micro-batches come from
``seqbalance.plan(..., cp_size=C, cp="static")`` read per replica from its pieces.
"""

from __future__ import annotations

import numpy as np
import pytest

TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)
torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("torch.distributed")

import seqbalance as sb  # noqa: E402
from seqbalance.costs.context_parallel import balanced_layout  # noqa: E402
from seqbalance.torch import BalancedDistributedSampler, rebalance  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

CP = 2
PER_GPU_TOKENS = 40


def replica_lengths(replica: int) -> np.ndarray:
    """The batch replica ``replica`` starts with (both its CP ranks hold it)."""
    return np.random.default_rng(10 + replica).integers(5, 76, size=7 + 3 * replica)


def _ids(replica: int) -> np.ndarray:
    return np.arange(len(replica_lengths(replica))) + 1000 * replica


def per_replica(p) -> list[list[list[int]]]:
    """Whole sequences per replica and slot, read from the pieces (not from the plan's
    own helper): the sequences that GPU ``r * cp_size`` holds a piece of."""
    return [
        [sorted({i for i, _, _ in slot}) for slot in p.pieces[r * p.cp_size]]
        for r in range(p.dp_size)
    ]


def worker(rank: int, world: int, mode: str) -> dict:
    import torch.distributed as dist

    dp_groups = [dist.new_group([pos + CP * g for g in range(world // CP)]) for pos in range(CP)]
    replica, position = divmod(rank, CP)
    lengths = replica_lengths(replica)
    ids = torch.as_tensor(_ids(replica))
    width = 80
    tokens = torch.where(torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None],
                         ids[:, None] * 100 + torch.arange(width)[None, :], -1)  # fmt: skip
    batch = {"input_ids": tokens, "seq_id": ids}
    try:
        mbs, handle = rebalance(batch, lengths, max_tokens=PER_GPU_TOKENS, cp_size=CP, cp=mode,
                                group=dp_groups[position])  # fmt: skip
    except ValueError as exc:
        return {"error": str(exc)}
    back = handle.restore([mb["seq_id"] * 2 for mb in mbs])
    return {
        "mbs": [mb["seq_id"].tolist() for mb in mbs],
        "rows": [mb["input_ids"].tolist() for mb in mbs],
        "back": back.tolist(),
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rebalance_gives_each_replica_its_static_cp_micro_batches():
    world = 4
    out = run_distributed(worker, world, "static", timeout=110)
    lengths = np.concatenate([replica_lengths(g) for g in range(world // CP)])
    ids = np.concatenate([_ids(g) for g in range(world // CP)])
    assert lengths.max() > PER_GPU_TOKENS  # whole sequences exceed a GPU's capacity
    want = sb.plan(lengths, world // CP, PER_GPU_TOKENS, cp_size=CP, cp="static")
    grid = per_replica(want)
    for rank in range(world):
        replica = rank // CP
        assert "error" not in out[rank], out[rank]
        assert out[rank] == out[replica * CP], "the CP ranks of one replica differ"
        assert out[rank]["mbs"] == [ids[mb].tolist() for mb in grid[replica]]
        assert out[rank]["back"] == (_ids(replica) * 2).tolist()
        # each row arrives whole, and one CP rank's share of a micro-batch fits a GPU
        for mb, rows in zip(out[rank]["mbs"], out[rank]["rows"]):
            held = 0
            for sid, row in zip(mb, rows):
                length = int(lengths[list(ids).index(sid)])
                assert row[:length] == [sid * 100 + t for t in range(length)]
                held += sum(e - s for s, e in balanced_layout(length, CP)[rank % CP])
            assert held <= PER_GPU_TOKENS
    seen = sorted(i for g in range(world // CP) for mb in out[g * CP]["mbs"] for i in mb)
    assert seen == sorted(ids.tolist())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rebalance_refuses_dynamic_cp_on_every_rank():
    out = run_distributed(worker, 4, "dynamic", timeout=110)
    assert all(o == out[0] for o in out)
    assert "only static context parallelism keeps (cp_size=2, cp='dynamic')" in out[0]["error"]
    assert "cp_shard" in out[0]["error"]


def test_sampler_yields_each_replicas_static_cp_micro_batches():
    rng = np.random.default_rng(4)
    lengths = rng.integers(50, 8000, size=70)
    dp, cap, c = 3, 2048, 4
    assert lengths.max() > cap  # whole items above a GPU's capacity, their pieces within
    options = dict(num_replicas=dp, cp_size=c, cost="qwen2.5-7b", seed=1)
    samplers = [BalancedDistributedSampler(lengths, 24, cap, rank=r, **options) for r in range(dp)]
    steps = samplers[0].step_indices()
    mine = [list(s.steps()) for s in samplers]
    for k, idx in enumerate(steps):
        want = per_replica(sb.plan(lengths[idx], dp, cap, cp_size=c, cp="static",
                                   cost="qwen2.5-7b", allow_empty=len(idx) < 24))  # fmt: skip
        for r in range(dp):
            assert mine[r][k] == [idx[mb].tolist() for mb in want[r]]
    everything = sorted(i for r in range(dp) for step in mine[r] for mb in step for i in mb)
    assert everything == list(range(70))
    assert [len(s) for s in samplers] == [len(samplers[0])] * dp


def test_sampler_names_an_item_whose_piece_is_too_long_and_refuses_dynamic_cp():
    lengths = [100, 200, 9000, 50] * 4
    with pytest.raises(ValueError, match=r"dataset item 2 has 9000 tokens: split over "
                       r"cp_size=2 GPUs its largest piece has 4500 tokens"):  # fmt: skip
        BalancedDistributedSampler(lengths, 8, 4096, num_replicas=2, rank=0, cp_size=2)
    # over 4 GPUs its pieces fit: planned, and yielded by one of the two replicas
    ranks = [BalancedDistributedSampler(lengths, 8, 4096, num_replicas=2, rank=r, cp_size=4)
             for r in range(2)]  # fmt: skip
    assert sorted(i for s in ranks for mb in s for i in mb) == list(range(16))
    with pytest.raises(ValueError, match=r"only static context parallelism.*cp='dynamic'"):
        BalancedDistributedSampler(lengths, 8, 4096, num_replicas=2, rank=0, cp_size=4,
                                   cp="dynamic")  # fmt: skip
    # the world counts every CP rank, so the replicas must be given
    with pytest.raises(ValueError, match=r"with cp_size, pass num_replicas= and rank="):
        BalancedDistributedSampler(lengths, 8, 4096, cp_size=4, check_ranks=False)


def timed_worker(rank: int, world: int, case: str) -> dict:
    """CP-major rank order (the CP ranks of a replica are ``world // CP`` apart, as in a
    framework that orders data parallelism inside context parallelism): rebalance over the
    data-parallel group, then time every micro-batch over the world with the timer told
    which plan GPU this process is."""
    import torch.distributed as dist

    from seqbalance.costs import TimingRecorder
    from seqbalance.torch.timing import MicroBatchTimer

    dp = world // CP
    position, replica = divmod(rank, dp)
    dp_groups = [dist.new_group([pos * dp + g for g in range(dp)]) for pos in range(CP)]
    # "uniform": every sequence of every replica alike, so lengths cannot tell replicas apart
    uniform = case.endswith("uniform")
    lengths_of = (lambda g: np.full(8, 30)) if uniform else replica_lengths
    ids_of = (lambda g: np.arange(8) + 1000 * g) if uniform else _ids
    batch = {"seq_id": torch.as_tensor(ids_of(replica))}
    mbs, handle = rebalance(batch, lengths_of(replica), max_tokens=PER_GPU_TOKENS,
                            cp_size=CP, group=dp_groups[position])  # fmt: skip
    gpu = replica * CP + position
    by_handle = case.startswith("handle-")  # no lengths to time(); end_step(handle)
    plan_rank = {"mapped": gpu, "clash": replica, "default": None, "uniform": None}[
        case.removeprefix("handle-")
    ]
    timer = MicroBatchTimer(TimingRecorder(), clock="wall", device="cpu", plan_rank=plan_rank)
    # Exact times that say which GPU and slot they came from (wall times are not exact).
    timer._seconds = lambda: [gpu * 10.0 + j + 1 for j in range(len(timer._pending))]
    length_of = {int(i): int(n) for g in range(dp) for i, n in zip(ids_of(g), lengths_of(g))}
    for mb in mbs:  # the whole lengths of the replica's sequences, checked against the plan
        with timer.time(None if by_handle else [length_of[int(i)] for i in mb["seq_id"]]):
            pass
    try:
        records = timer.end_step(handle if by_handle else handle.plan)
    except ValueError as exc:
        return {"error": str(exc)}
    return {
        "records": [
            (t.rank, t.slot, t.lengths.tolist(), t.seconds, t.pieces.tolist()) for t in records
        ],
        "refit_rows": len(timer.recorder),
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_timer_records_every_gpu_of_a_static_cp_plan_under_its_plan_rank():
    """rebalance(cp_size=C) runs over a data-parallel group; the timer runs over every GPU
    so that all ranks hold the same records (and refit the same cost). In a rank order
    that is not the plan's, ``plan_rank`` pairs each GPU's times with its own pieces."""
    from seqbalance.costs._cp_records import plan_pieces

    world = 4
    out = run_distributed(timed_worker, world, "mapped", timeout=110)
    # the same records when end_step reads the lengths from the rebalance handle
    assert run_distributed(timed_worker, world, "handle-mapped", timeout=110) == out
    assert all("error" not in o for o in out), out
    assert all(o == out[0] for o in out), "ranks hold different records"
    lengths = np.concatenate([replica_lengths(g) for g in range(world // CP)])
    p = sb.plan(lengths, world // CP, PER_GPU_TOKENS, cp_size=CP, cp="static")
    want = plan_pieces(p.pieces, p.micro_batches)
    recs = out[0]["records"]
    assert [(r, s) for r, s, *_ in recs] == [
        (g, j) for g in range(world) for j in range(len(p.micro_batches[g]))
    ]
    for gpu, slot, lens, seconds, pieces in recs:
        assert seconds == gpu * 10.0 + slot + 1  # this GPU's own time
        assert lens == lengths[p.micro_batches[gpu][slot]].tolist()
        assert pieces == want[gpu][slot].tolist()
    assert out[0]["refit_rows"] == len(recs)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["clash", "default", "handle-default", "handle-uniform"])
def test_timer_refuses_plan_ranks_that_are_not_the_gpus_on_every_rank(case):
    """Two processes on one plan rank; or none given in a rank order that is not the
    plan's (the lengths given to time(), or those the handle holds, are another GPU's:
    refused, naming plan_rank)."""
    out = run_distributed(timed_worker, 4, case, timeout=110)
    want = {
        "clash": "ranks [0, 2] all run plan rank 0",
        "default": "ranks [1, 2] timed micro-batches that are not their plan rank's",
        # the handle knows its replica: refused although every length is alike
        "uniform": "ranks [1, 2] timed micro-batches that are not their plan rank's",
    }[case.removeprefix("handle-")]
    # every rank raises; each message may add that rank's own detail
    assert all(want in o["error"] and "MicroBatchTimer(plan_rank=...)" in o["error"] for o in out)


# The GPU seconds of the loop test: c0 + sum over the sequences it holds pieces of (a/d) +
# sum over its ranges (b * tokens + c * (e² - s²)): the d GPUs of a sequence share its
# per-sequence term, and a GPU holds two ranges of it in the balanced layout. The CP cost
# model of seqbalance.costs._cp_records, written out here.
TRUE = {"per_microbatch": 0.02, "per_sequence": 0.004, "per_token": 1e-3, "per_token_sq": 2e-5}


def gpu_seconds(lengths, position: int) -> float:
    """One slot of CP position ``position``: its ranges of each sequence from the balanced
    layout (Megatron's chunks ``position`` and ``2·CP − 1 − position``), not the plan's."""
    t = TRUE["per_microbatch"]
    for length in lengths:
        t += TRUE["per_sequence"] / CP
        for s, e in balanced_layout(int(length), CP)[position]:
            t += TRUE["per_token"] * (e - s) + TRUE["per_token_sq"] * (e * e - s * s)
    return t


def loop_worker(rank: int, world: int) -> dict:
    """Megatron-style static CP with the feedback loop: rebalance over the DP group, time
    over all GPUs (CP-major rank order, plan_rank given), refit on every rank, plan on."""
    import torch.distributed as dist

    from seqbalance.costs import TimingRecorder
    from seqbalance.torch.timing import MicroBatchTimer

    dp = world // CP
    position, replica = divmod(rank, dp)
    dp_group = [dist.new_group([pos * dp + g for g in range(dp)]) for pos in range(CP)][position]
    gpu = replica * CP + position
    recorder = TimingRecorder(sync="fsdp")
    timer = MicroBatchTimer(recorder, clock="wall", device="cpu", plan_rank=gpu)
    cost, out = None, {"ids": []}
    for step in range(4):
        batches = [np.random.default_rng(100 * step + g).integers(5, 76, size=6 + 2 * g)
                   for g in range(dp)]  # every replica's lengths (each rank can make them)
        length_of = {1000 * g + 10_000 * step + k: int(n)
                     for g in range(dp) for k, n in enumerate(batches[g])}  # fmt: skip
        lengths = batches[replica]
        ids = torch.arange(len(lengths)) + 1000 * replica + 10_000 * step
        mbs, handle = rebalance({"seq_id": ids}, lengths, max_tokens=PER_GPU_TOKENS, cp_size=CP,
                                cost=cost, group=dp_group)  # fmt: skip
        out["ids"].append([mb["seq_id"].tolist() for mb in mbs])
        slots = [[length_of[int(i)] for i in mb["seq_id"]] for mb in mbs]
        timer._seconds = lambda slots=slots: [gpu_seconds(x, position) for x in slots]
        for _ in mbs:
            with timer.time():
                pass
        timer.end_step(handle)
        if step == 2:  # refit from three steps of every GPU's records, then plan with it
            cost = recorder.refit(per_rank=False, robust=False)
            out["fitted"] = {k: float(getattr(cost, k)) for k in TRUE}
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_static_cp_feedback_loop_refits_the_true_cost_alike_on_every_rank():
    """Times made from a known cost, per GPU and from its own pieces: the refit over every
    GPU's records recovers that cost, identically on every rank, and the next plan made
    with it still gives both CP ranks of a replica the same micro-batches."""
    world = 4
    out = run_distributed(loop_worker, world, timeout=170)
    for o in out:
        for key, want in TRUE.items():
            assert o["fitted"][key] == pytest.approx(want, rel=1e-6), (key, o["fitted"])
    assert all(o["fitted"] == out[0]["fitted"] for o in out)  # bit for bit
    dp = world // CP
    for replica in range(dp):
        ranks = [pos * dp + replica for pos in range(CP)]
        assert all(out[r]["ids"] == out[ranks[0]]["ids"] for r in ranks)
    for step in range(4):  # every sequence of the step once, over the replicas
        seen = sorted(i for g in range(dp) for mb in out[g]["ids"][step] for i in mb)
        assert len(seen) == len(set(seen)) and len(seen) == 6 + 8
