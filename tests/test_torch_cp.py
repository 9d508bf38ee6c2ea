"""seqbalance.torch.cp_shard / CPShardHandle.restore: pieces of a packed batch, and back.

Token ids are ``sequence * 1_000_000 + position``, so what each GPU must hold follows from
the plan's ranges alone. Outputs carry random float bits (NaN payloads, -0.0 included) so
that the round trip is checked bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import seqbalance as sb  # noqa: E402
from seqbalance.torch import cp_shard  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

TIMEOUT = 120


def case(seed: int, world: int, cp_size: int):
    rng = np.random.default_rng(seed)
    n = 6 * world
    lengths = rng.integers(1, 60, size=n)
    lengths[rng.integers(n)] = 50 * cp_size + 7  # needs CP at max_tokens=64
    lengths[rng.integers(n)] = 5  # shorter than 2 * cp_size for some degrees
    mode = "dynamic" if seed % 2 else "static"
    p = sb.plan(
        lengths,
        world // cp_size,
        64,
        cp_size=cp_size,
        cp=mode,
        allow_empty=True,
        cost=sb.QuadraticCost(per_token=1.0, per_token_sq=0.01),
    )
    return lengths, p


def packed(lengths: np.ndarray, seed: int) -> dict:
    cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    seq = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(cu[-1]) - cu[:-1][seq]
    bits = np.random.default_rng(seed).integers(0, 2**32, size=(int(cu[-1]), 2), dtype=np.uint64)
    return {
        "input_ids": torch.from_numpy(seq * 1_000_000 + pos),
        "labels": torch.from_numpy(-(seq * 1_000_000 + pos)),
        "payload": torch.from_numpy(bits.astype(np.uint32).view(np.float32)),
        "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
    }


def pieces_of(p, lengths):
    """A CPPlan's pieces; a plain Plan's sequences whole, one GPU per rank."""
    if hasattr(p, "pieces"):
        return p.pieces
    return [[[(i, 0, int(lengths[i])) for i in mb] for mb in rank] for rank in p.micro_batches]


def check_shard(mbs, p, rank, lengths):
    assert len(mbs) == p.num_micro_batches
    pieces = pieces_of(p, lengths)
    for j, mb in enumerate(mbs):
        ranges = [(i, s, e) for i, s, e in pieces[rank][j] if e > s]
        ids = np.concatenate([i * 1_000_000 + np.arange(s, e) for i, s, e in ranges] or [[]])
        pos = np.concatenate([np.arange(s, e) for _, s, e in ranges] or [[]])
        assert mb["input_ids"].tolist() == ids.astype(np.int64).tolist()
        assert mb["labels"].tolist() == (-ids).astype(np.int64).tolist()
        assert mb["position_ids"].tolist() == pos.astype(np.int64).tolist()
        seg = [e - s for _, s, e in ranges]
        assert mb["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(seg)]).tolist()
        assert mb["cu_seqlens"].dtype == torch.int32
        assert mb["sequence_ids"].tolist() == [i for i, _, _ in ranges]
        assert mb["ranges"].tolist() == [[s, e] for _, s, e in ranges]
        holders = [  # GPUs holding tokens of it: an empty piece is dropped by its GPU
            sum(any(q == i and e > s for q, s, e in pieces[g][j]) for g in range(len(pieces)))
            for i, _, _ in ranges
        ]
        assert mb["cp_degree"].tolist() == holders


def test_shards_cover_every_token_once():
    lengths, p = case(1, 8, 4)
    batch = packed(lengths, 0)
    seen = []
    for rank in range(p.world_size):
        mbs, _ = cp_shard(batch, p, rank)
        check_shard(mbs, p, rank, lengths)
        seen.extend(t for mb in mbs for t in mb["input_ids"].tolist())
    assert sorted(seen) == sorted(batch["input_ids"].tolist())
    assert (p.degrees() > 1).any()  # the case really exercises CP


def test_per_sequence_tensors_follow_their_segments():
    # A batch straight from pack_collate: per-sequence values (a reward, its `lengths`)
    # reach every segment of their sequence (they were dropped).
    from seqbalance.torch import pack_collate

    lengths, p = case(3, 8, 4)
    samples = [{"input_ids": torch.arange(int(n)), "reward": float(i) + 0.5}
               for i, n in enumerate(lengths)]  # fmt: skip
    batch = pack_collate(samples)
    rows = 0
    for rank in range(p.world_size):
        for mb in cp_shard(batch, p, rank)[0]:
            ids = mb["sequence_ids"]
            assert mb["reward"].tolist() == (ids.double() + 0.5).tolist()
            assert mb["lengths"].tolist() == lengths[ids.numpy()].tolist()
            assert mb["max_seqlen"] == int(np.diff(mb["cu_seqlens"].numpy()).max(initial=0))
            rows += len(ids)
    assert rows > len(lengths)  # some sequences really are split into several segments


def test_shard_errors():
    lengths, p = case(2, 4, 2)
    batch = packed(lengths, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        cp_shard(batch, p, 4)
    short = dict(batch, cu_seqlens=batch["cu_seqlens"][:-1])
    with pytest.raises(ValueError, match="does not match the plan"):
        cp_shard(short, p, 0)
    with pytest.raises(ValueError, match="does not match the plan"):
        cp_shard(batch, sb.plan(lengths[lengths <= 64], 2, 64), 0)  # a Plan of other lengths
    with pytest.raises(ValueError, match=r"must be a CPPlan .* or a Plan, got dict"):
        cp_shard(batch, {"pieces": p.pieces}, 0)


def test_a_plain_plan_shards_whole_sequences():
    """The docstring promised a plain Plan (cp_size=1: every sequence whole) and cp_shard
    refused it, so a trainer whose CP size may be 1 needed a second code path."""
    lengths = np.array([9, 3, 14, 1, 6, 11, 2])
    p = sb.plan(lengths, 2, 16)
    assert not isinstance(p, sb.planning.cp_plans.CPPlan)
    batch = packed(lengths, 5)
    cu = batch["cu_seqlens"].numpy()
    for rank in range(2):
        mbs, handle = cp_shard(batch, p, rank)
        assert len(mbs) == p.num_micro_batches
        for j, mb in enumerate(mbs):
            ids = p.micro_batches[rank][j]
            want = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in ids])
            np.testing.assert_array_equal(mb["input_ids"], batch["input_ids"][want])
            np.testing.assert_array_equal(mb["sequence_ids"], ids)
            np.testing.assert_array_equal(mb["ranges"], [[0, lengths[i]] for i in ids])
            np.testing.assert_array_equal(mb["cp_degree"], np.ones(len(ids)))
            np.testing.assert_array_equal(mb["cu_seqlens"], np.cumsum([0, *lengths[ids]]))
        assert handle.slot_tokens == [int(lengths[mb].sum()) for mb in p.micro_batches[rank]]


def test_built_tensors_follow_the_batch_device():
    """cu_seqlens, position_ids, sequence_ids, ranges and cp_degree were built on the CPU
    beside CUDA input_ids, where a varlen attention kernel refuses them. The meta device
    stands in for CUDA here."""
    lengths, p = case(6, 4, 2)
    batch = packed(lengths, 6)
    on_meta = {k: (v if k == "cu_seqlens" else v.to("meta")) for k, v in batch.items()}
    for rank in range(p.world_size):
        mbs, _ = cp_shard(on_meta, p, rank)
        for mb in mbs:
            devices = {k: v.device.type for k, v in mb.items() if isinstance(v, torch.Tensor)}
            assert set(devices.values()) == {"meta"}, devices
    # A per-token tensor left on the CPU whose name sorts first (found by review): the
    # built tensors still follow input_ids.
    mixed = dict(on_meta, advantages=torch.zeros(int(batch["cu_seqlens"][-1])))
    mbs, _ = cp_shard(mixed, p, 0)
    assert mbs[0]["advantages"].device.type == "cpu"
    assert {mbs[0][k].device.type for k in ("cu_seqlens", "sequence_ids", "ranges")} == {"meta"}


def test_plans_that_miss_or_repeat_a_sequence_are_refused():
    """restore filled a missing sequence with uninitialised memory, and a sequence held
    whole on two ranks got cp_degree 2 (found by review)."""
    lengths = np.array([2, 3, 2])
    batch = packed(lengths, 1)
    for micro_batches in ([[[0, 2]], [[2]]], [[[0]], [[2]]]):
        bad = sb.Plan(micro_batches, lengths, max_tokens=16)
        with pytest.raises(ValueError, match="exactly once"):
            cp_shard(batch, bad, 0)
    lengths, p = case(7, 4, 2)
    gpu, slot = next((g, j) for g, gpu in enumerate(p.pieces) for j, sl in enumerate(gpu) if sl)
    p.pieces[gpu][slot] = p.pieces[gpu][slot][1:]  # a hand-edited plan drops a piece
    with pytest.raises(ValueError, match="exactly once"):
        cp_shard(packed(lengths, 7), p, 0)


def _round_trip(rank: int, world: int, seeds: list[int], cp_size: int):
    out = []
    for seed in seeds:  # one spawn per world size: spawning is the slow part
        lengths, p = case(seed, world, cp_size)
        batch = packed(lengths, seed)
        mbs, handle = cp_shard(batch, p, rank)
        check_shard(mbs, p, rank, lengths)
        # per-token outputs: the payload's bits per micro-batch, and a 1-D int64 output
        full = handle.restore([mb["payload"] for mb in mbs])
        ids = handle.restore(torch.cat([mb["input_ids"] for mb in mbs]))
        exact = full.view(torch.int32).numpy().tobytes() == (
            batch["payload"].view(torch.int32).numpy().tobytes()
        )
        out.append((exact, bool(torch.equal(ids, batch["input_ids"])), p.to_json()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "cp_size", "seeds"), [(4, 2, [3, 4]), (8, 4, [5]), (2, 1, [3, 4])]
)
def test_restore_is_bit_exact_on_gloo(world, cp_size, seeds):
    """dp 2 x cp 2 (a static and a dynamic plan), dp 2 x cp 4 (dynamic), and dp 2 without
    CP (a plain Plan)."""
    out = run_distributed(_round_trip, world, seeds, cp_size, timeout=TIMEOUT)
    for k in range(len(seeds)):
        assert all(rank[k][0] and rank[k][1] for rank in out)
        assert len({rank[k][2] for rank in out}) == 1  # every rank planned the same


def _restore_outcome(handle, outs) -> tuple[str, str]:
    """("ok", "") when ``handle.restore(outs)`` succeeds, else the ValueError's class name
    and message (workers return it for the test to compare across ranks)."""
    try:
        handle.restore(outs)
    except ValueError as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def _restore_mismatch(rank: int, world: int, kind: str):
    lengths, p = case(3, world, 2)
    batch = packed(lengths, 3)
    mbs, handle = cp_shard(batch, p, rank)
    outs = [mb["payload"] for mb in mbs]
    if rank == 1 and kind == "rows":
        outs = outs[:-1] if outs else [torch.zeros(1)]  # one micro-batch short
    if rank == 1 and kind == "trailing":
        outs = [o[:, :1] for o in outs]  # a different trailing shape than rank 0
    return _restore_outcome(handle, outs)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "expected"),
    [("rows", "failed on rank 1"), ("trailing", "different trailing shape of outputs")],
)
def test_restore_errors_reach_every_rank(kind, expected):
    """A bad output on one GPU raises the same error on every GPU instead of a hang."""
    out = run_distributed(_restore_mismatch, 4, kind, timeout=TIMEOUT, collective_timeout=30)
    assert {name for name, _ in out} == {"RankAgreementError"}
    assert len({msg for _, msg in out}) == 1
    assert expected in out[0][1]


@pytest.mark.parametrize(
    ("cu", "expected"),
    [
        ([2, 6, 12], "start at 0"),  # per-token tensors then matched no key and were dropped
        ([0.0, 4.0, 10.0], "integer tensor"),
        ([[0, 4, 10]], "1-D"),
    ],
)
def test_shard_refuses_malformed_cu_seqlens(cu, expected):
    p = sb.plan([4, 6], 1, 8, cp_size=2, cp="dynamic")
    batch = {"input_ids": torch.arange(10), "cu_seqlens": torch.tensor(cu)}
    with pytest.raises(ValueError, match=expected):
        cp_shard(batch, p, 0)


@pytest.mark.parametrize("rank", [1.7, True, "1", np.float64(1.0)])
def test_shard_refuses_a_rank_that_is_not_an_integer(rank):
    # int(1.7) silently took GPU 1's pieces.
    lengths, p = case(2, 4, 2)
    with pytest.raises(ValueError, match="rank must be an integer"):
        cp_shard(packed(lengths, 0), p, rank)


def test_shard_accepts_numpy_and_tensor_ranks():
    lengths, p = case(2, 4, 2)
    batch = packed(lengths, 0)
    for rank in (np.int64(1), torch.tensor(1)):
        mbs, handle = cp_shard(batch, p, rank)
        check_shard(mbs, p, 1, lengths)
        assert handle.rank == 1


def test_shard_refuses_token_keys_as_a_string():
    lengths, p = case(2, 4, 2)
    with pytest.raises(ValueError, match=r"token_keys must be a collection.*\['input_ids'\]"):
        cp_shard(packed(lengths, 0), p, 0, token_keys="input_ids")


def _restore_swapped(rank: int, world: int):
    lengths, p = case(3, world, 2)
    batch = packed(lengths, 3)
    gpu = world - 1 - rank  # this process shards as another plan GPU than its group rank
    mbs, handle = cp_shard(batch, p, gpu)
    return _restore_outcome(handle, [mb["payload"] for mb in mbs])


@pytest.mark.slow
def test_restore_refuses_a_plan_gpu_other_than_the_group_rank():
    """restore puts what group rank g sends where plan GPU g's tokens go: a process that
    sharded as another GPU got every other GPU's outputs in the wrong places."""
    out = run_distributed(_restore_swapped, 2, timeout=TIMEOUT, collective_timeout=30)
    assert {name for name, _ in out} == {"RankAgreementError"}
    assert len({msg for _, msg in out}) == 1
    assert "rank 0 in the group but GPU 1 of the plan" in out[0][1]


_OTHER_COST_LENGTHS = [16, 48, 40, 8, 24, 56, 32, 8, 48, 48]


def _plan_with(cost):
    # (the full search: a batch where the two costs give plans with equal tokens per GPU)
    return sb.plan(_OTHER_COST_LENGTHS, 2, 64, cost=cost, effort="thorough")


def _restore_with_another_plan(rank: int, world: int):
    from seqbalance.torch import pack_collate

    p = _plan_with(None if rank == 0 else "qwen2.5-7b")  # each rank plans on its own
    batch = pack_collate([torch.full((n,), i) for i, n in enumerate(_OTHER_COST_LENGTHS)])
    mbs, handle = cp_shard(batch, p, rank)
    return _restore_outcome(handle, [mb["input_ids"] for mb in mbs])


@pytest.mark.slow
def test_restore_refuses_plans_that_differ_with_equal_token_counts():
    """Ranks planning with different costs got plans with the same tokens per GPU, the only
    thing restore compared, so each put the other's rows in the wrong places, silently."""
    a, b = _plan_with(None), _plan_with("qwen2.5-7b")
    def tokens(p):
        return [sum(_OTHER_COST_LENGTHS[i] for mb in r for i in mb) for r in p.micro_batches]

    assert a.micro_batches != b.micro_batches and tokens(a) == tokens(b)  # the premise
    out = run_distributed(_restore_with_another_plan, 2, timeout=TIMEOUT, collective_timeout=30)
    assert {name for name, _ in out} == {"RankAgreementError"}
    assert "different plan (which tokens each GPU holds)" in out[0][1]


def test_cp_degree_counts_the_gpus_that_list_the_sequence():
    # A 1-token sequence split 2 ways leaves one GPU an empty piece, which cp_shard drops;
    # the other GPU said cp_degree 2, so a ring kernel waited for a partner never coming.
    lengths = np.array([1, 3, 200, 2])
    p = sb.plan(lengths, 1, 128, cp_size=2, cp="static", allow_empty=True)
    batch = packed(lengths, 0)
    seen = {}  # (slot, sequence) -> [(gpu, cp_degree)]
    for g in range(p.world_size):
        for j, mb in enumerate(cp_shard(batch, p, g)[0]):
            for i, d in zip(mb["sequence_ids"].tolist(), mb["cp_degree"].tolist()):
                seen.setdefault((j, i), []).append((g, d))
    assert {i for _, i in seen} == {0, 1, 2, 3}
    for holders in seen.values():  # a GPU may list a sequence twice (its two chunks)
        gpus = {g for g, _ in holders}
        assert all(d == len(gpus) for _, d in holders), holders
    assert any(len({g for g, _ in h}) == 1 for h in seen.values())  # a lone piece exists


# ---- ring CP over Ulysses groups (USP): the README's recipe on processes -----------------

USP_SP, USP_CP = 2, 2


def _usp_case():
    from seqbalance.costs import TokenCost, UlyssesCost

    rng = np.random.default_rng(21)
    lengths = rng.integers(3, 90, size=14)
    lengths[4] = 230  # above one group's 2 x 64 tokens: split over the ring
    p = sb.plan(lengths, 1, USP_SP * 64, cost=UlyssesCost(TokenCost(), USP_SP),
                cp_size=USP_CP, cp="dynamic")  # fmt: skip
    return lengths, p


def _usp_worker(rank: int, world: int):
    import torch.distributed as dist

    # Process = (Ulysses group g, position k in it). The plan's "GPUs" are the groups; the
    # ring of position k holds position k of every group, in plan order.
    g, k = divmod(rank, USP_SP)
    ulysses = [dist.new_group([h * USP_SP + j for j in range(USP_SP)]) for h in range(USP_CP)]
    rings = [dist.new_group([h * USP_SP + j for h in range(USP_CP)]) for j in range(USP_SP)]
    lengths, p = _usp_case()
    batch = packed(lengths, 21)
    mbs, handle = cp_shard(batch, p, g)  # every GPU of group g takes the group's pieces
    outs = []
    for mb in mbs:
        # The Ulysses layer gives each GPU a contiguous 1/sp of the piece's tokens, and
        # gathers the group's outputs back after the model.
        mine = torch.tensor_split(mb["input_ids"], USP_SP)[k] * 3
        parts = [None] * USP_SP
        dist.all_gather_object(parts, mine.tolist(), group=ulysses[g])
        outs.append(torch.tensor([x for part in parts for x in part], dtype=torch.int64))
    full = handle.restore(outs, group=rings[k])
    return bool(torch.equal(full, batch["input_ids"] * 3)), p.to_json()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_usp_groups_shard_and_restore_over_their_ring():
    _, p = _usp_case()
    assert (p.degrees() == USP_CP).any()  # the long sequence really is split over the ring
    assert p.microbatch_tokens().max() > 64  # a group holds more than one GPU's tokens
    out = run_distributed(_usp_worker, USP_SP * USP_CP, timeout=TIMEOUT)
    assert all(ok for ok, _ in out)
    assert len({js for _, js in out}) == 1
