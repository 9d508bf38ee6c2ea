"""Multi-process tests of seqbalance.torch.rebalance / RebalanceHandle.restore (gloo, CPU).

Every scenario runs inside one spawn per world size (spawning is the slow part). Rows are
built from global sequence ids, so the expected contents of every micro-batch follow from
the layout alone, independently of the exchange code.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

# torch is not in the test extra (it would pull a multi-GB CUDA build); skip, saying why.
TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("torch.distributed")

from seqbalance.torch import rebalance  # noqa: E402
from seqbalance.torch.exchange import _rebalance  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

TIMEOUT = 120


# ---- data: a pure function of (case, global id), so any process can rebuild it ----------
def case_counts(seed: int, world: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 7, size=world)
    counts[seed % world] = 0  # some rank always starts empty
    if counts.sum() < world:
        counts[(seed + 1) % world] += world
    return counts.astype(np.int64)


def case_lengths(seed: int, world: int) -> np.ndarray:
    n = int(case_counts(seed, world).sum())
    rng = np.random.default_rng(seed + 1000)
    return rng.integers(1, 9, size=n).astype(np.int64)


def rows_for(seed: int, world: int, ids: np.ndarray, width: int) -> dict[str, np.ndarray]:
    """Padded rows of the given global ids (input_ids padded with -1 to `width`)."""
    lens = case_lengths(seed, world)[ids]
    t = np.arange(width)
    ids_col = ids[:, None].astype(np.int64)
    input_ids = np.where(t[None, :] < lens[:, None], ids_col * 100 + t[None, :], -1)
    mask = t[None, :] < lens[:, None]
    # Random float bits (incl. NaN payloads, -0.0) so bit-exactness is really tested.
    bits = np.stack(
        [np.random.default_rng([seed, int(g)]).integers(0, 2**32, size=3) for g in ids]
    ).astype(np.uint32) if len(ids) else np.zeros((0, 3), dtype=np.uint32)
    return {
        "input_ids": input_ids.astype(np.int64),
        "attention_mask": mask,
        "advantages": bits[:, 0].view(np.float32),
        "pair": bits[:, 1:].view(np.float32).reshape(-1, 2),
    }


def layout_random(seed: int, world: int, global_lengths: np.ndarray, costs=None):
    """A hand-made destination map: a random permutation cut into world x m micro-batches
    (some possibly empty)."""
    rng = np.random.default_rng(seed + 7)
    n = len(global_lengths)
    perm = rng.permutation(n)
    m = int(rng.integers(1, 4))
    cuts = np.sort(rng.integers(0, n + 1, size=world * m - 1))
    parts = np.split(perm, cuts)
    return None, [[parts[r * m + j] for j in range(m)] for r in range(world)]


def _local_batch(seed: int, world: int, rank: int, width_mode: str):
    counts = case_counts(seed, world)
    off = int(counts[:rank].sum())
    ids = np.arange(off, off + counts[rank], dtype=np.int64)
    lens = case_lengths(seed, world)[ids]
    if width_mode == "common":
        width = 8
    else:  # each rank pads to its own longest sequence
        width = int(lens.max()) if len(lens) else 1
    rows = rows_for(seed, world, ids, width)
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items()}
    batch["bf16"] = torch.from_numpy(ids.astype(np.float32) / 3).to(torch.bfloat16)
    return batch, lens, ids


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy().copy() if t.numel() else np.zeros(0, np.uint8)


def worker_padded(rank: int, world: int, seeds: list[int]) -> list[dict]:
    out = []
    for seed in seeds:
        for method in ("all_to_all", "p2p"):
            width_mode = "common" if seed % 2 else "own"
            batch, lens, _ = _local_batch(seed, world, rank, width_mode)
            pads = {"input_ids": -1, "attention_mask": False} if width_mode == "own" else None
            mbs, handle = _rebalance(
                batch,
                torch.from_numpy(lens),
                functools.partial(layout_random, seed, world),
                pad_values=pads,
                method=method,
            )
            # Per-sequence outputs computed from the received rows, plus the rows themselves.
            outputs = [
                {
                    "score": mb["input_ids"].clamp(min=0).sum(1).double() * 0.5 + mb["advantages"],
                    "input_ids": mb["input_ids"],
                    "bf16": mb["bf16"],
                }
                for mb in mbs
            ]
            back = handle.restore(outputs)
            single = handle.restore(torch.cat([mb["advantages"] for mb in mbs]))
            out.append(
                {
                    "seed": seed,
                    "method": method,
                    "mbs": [{k: v.numpy() if v.dtype != torch.bfloat16 else _bytes(v)
                             for k, v in mb.items()} for mb in mbs],
                    "back_ids": back["input_ids"].numpy(),
                    "back_score": back["score"].numpy(),
                    "back_bf16": _bytes(back["bf16"]),
                    "orig_bf16": _bytes(batch["bf16"]),
                    "orig_ids": batch["input_ids"].numpy(),
                    "single_bits": single.numpy().view(np.uint32),
                    "orig_adv_bits": batch["advantages"].numpy().view(np.uint32),
                    "source_rank": handle.source_rank,
                    "num_mb": handle.num_micro_batches,
                }
            )
    return out


def _check_padded(world: int, results: list[list[dict]], seeds: list[int]) -> None:
    for ci in range(len(results[0])):
        seed = results[0][ci]["seed"]
        lengths = case_lengths(seed, world)
        _, layout = layout_random(seed, world, lengths)
        counts = case_counts(seed, world)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        width = 8 if seed % 2 else int(lengths.max())
        for r in range(world):
            res = results[r][ci]
            assert res["num_mb"] == len(layout[r])
            for j, mb in enumerate(res["mbs"]):
                ids = np.asarray(layout[r][j], dtype=np.int64)
                want = rows_for(seed, world, ids, width)
                np.testing.assert_array_equal(mb["input_ids"], want["input_ids"])
                np.testing.assert_array_equal(mb["attention_mask"], want["attention_mask"])
                # Compare float rows as bits: NaN payloads and -0.0 must survive.
                np.testing.assert_array_equal(
                    mb["advantages"].view(np.uint32), want["advantages"].view(np.uint32)
                )
                np.testing.assert_array_equal(
                    mb["pair"].view(np.uint32), want["pair"].view(np.uint32)
                )
                assert mb["input_ids"].shape == (len(ids), width)
            held = np.concatenate([np.asarray(x, dtype=np.int64) for x in layout[r]])
            want_src = np.searchsorted(offsets, held, side="right") - 1
            np.testing.assert_array_equal(res["source_rank"], want_src)
            # Round trip: the restored rows are the original rows, in original order.
            mine = np.arange(offsets[r], offsets[r + 1])
            orig = rows_for(seed, world, mine, width)
            np.testing.assert_array_equal(res["back_ids"], orig["input_ids"])
            np.testing.assert_array_equal(res["back_bf16"], res["orig_bf16"])
            np.testing.assert_array_equal(res["single_bits"], res["orig_adv_bits"])
            want_score = (
                np.clip(orig["input_ids"], 0, None).sum(1).astype(np.float64) * 0.5
                + orig["advantages"].astype(np.float64)
            )
            np.testing.assert_array_equal(
                res["back_score"].view(np.uint64), want_score.view(np.uint64)
            )


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", [2, 3])
def test_padded_round_trip_hand_made_layouts(world):
    seeds = [1, 2, 3, 4, 5, 6]
    results = run_distributed(worker_padded, world, seeds, timeout=TIMEOUT - 10)
    _check_padded(world, results, seeds)
    # The scenarios really include empty ranks and uneven totals.
    assert any((case_counts(s, world) == 0).any() for s in seeds)
    assert len({int(case_counts(s, world).sum()) % world for s in seeds}) > 1


# ---- packed layout with the real planner --------------------------------------------------
def worker_packed(rank: int, world: int, seeds: list[int]) -> list[dict]:
    out = []
    for seed in seeds:
        counts = case_counts(seed, world)
        off = int(counts[:rank].sum())
        ids = np.arange(off, off + counts[rank], dtype=np.int64)
        lens = case_lengths(seed, world)[ids]
        tok = np.concatenate([g * 100 + np.arange(n) for g, n in zip(ids, lens)]) if len(
            ids
        ) else np.zeros(0, dtype=np.int64)
        cu = np.concatenate([[0], np.cumsum(lens)])
        batch = {
            "input_ids": torch.from_numpy(tok.astype(np.int64)),
            "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
            "reward": torch.from_numpy(ids.astype(np.float64) + 0.25),
        }
        mbs, handle = rebalance(batch, max_tokens=12, sync="fsdp", allow_empty=True)
        logp = [mb["input_ids"].double() / 7 for mb in mbs]  # a per-token output
        back = handle.restore(logp)
        out.append(
            {
                "mbs": [{k: v.numpy() for k, v in mb.items()} for mb in mbs],
                "plan": handle.plan.to_json(),
                "back": back.numpy(),
                "tok": tok,
            }
        )
    return out


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", [2, 3])
def test_packed_rebalance_with_planner(world):
    from seqbalance.planning.planner import plan

    seeds = [11, 12, 13]
    results = run_distributed(worker_packed, world, seeds, timeout=TIMEOUT - 10)
    for ci, seed in enumerate(seeds):
        lengths = case_lengths(seed, world)
        want_plan = plan(lengths, world, 12, sync="fsdp", allow_empty=True)
        ms = {len(results[r][ci]["mbs"]) for r in range(world)}
        assert ms == {want_plan.num_micro_batches}  # same count on every rank
        for r in range(world):
            res = results[r][ci]
            assert res["plan"] == want_plan.to_json()  # every rank computed the same plan
            for j, mb in enumerate(res["mbs"]):
                ids = np.asarray(want_plan.micro_batches[r][j], dtype=np.int64)
                want_tok = [g * 100 + np.arange(lengths[g]) for g in ids]
                want_tok = np.concatenate(want_tok) if len(ids) else np.zeros(0, np.int64)
                np.testing.assert_array_equal(mb["input_ids"], want_tok)
                np.testing.assert_array_equal(
                    mb["cu_seqlens"], np.concatenate([[0], np.cumsum(lengths[ids])])
                )
                assert mb["cu_seqlens"].dtype == np.int32
                np.testing.assert_array_equal(mb["reward"], ids + 0.25)
                assert int(mb["cu_seqlens"][-1]) <= 12
            np.testing.assert_array_equal(res["back"], res["tok"].astype(np.float64) / 7)


# ---- errors reach every rank, and the group stays usable ---------------------------------
def worker_errors(rank: int, world: int) -> list[str]:
    msgs = []

    def attempt(fn):
        try:
            fn()
            msgs.append("no error")
        except ValueError as exc:
            msgs.append(str(exc))

    n = 2 + rank
    good = {"x": torch.zeros(n, 3), "y": torch.ones(n)}
    lens = np.full(n, 2)
    # Rank 1 passes a tensor with the wrong number of rows: every rank must raise.
    bad = dict(good, y=torch.ones(n + (rank == 1)))
    attempt(lambda: rebalance(bad, lens, max_tokens=8))
    # Ranks disagree on dtype.
    attempt(lambda: rebalance(dict(good, x=good["x"].to(torch.float64 if rank else torch.float32)),
                              lens, max_tokens=8))
    # Trailing shapes differ and no pad value is given.
    attempt(lambda: rebalance(dict(good, x=torch.zeros(n, 3 + rank)), lens, max_tokens=8))
    # A sequence longer than max_tokens: the planner raises, identically everywhere.
    attempt(lambda: rebalance(good, np.full(n, 9), max_tokens=8))
    # Missing lengths for a padded batch.
    attempt(lambda: rebalance(good, None if rank == 0 else lens, max_tokens=8))
    # A batch that is not a dict, on one rank only.
    attempt(lambda: rebalance(good if rank else [good["x"]], lens, max_tokens=8))
    # After all that, a good call still works (no collective was left half done).
    mbs, h = rebalance(good, lens, max_tokens=8)
    # restore with one output too few on rank 0 only: every rank raises.
    outs = [mb["y"] * 2 for mb in mbs]
    attempt(lambda: h.restore(outs[:-1] if rank == 0 else outs))
    back = h.restore(outs)
    msgs.append("ok" if torch.equal(back, good["y"] * 2) else "bad restore")
    # One rank holds a sequence above the cap: named by that rank and its own index.
    attempt(lambda: rebalance(good, np.array([2, 9 if rank == 1 else 2] + [2] * (n - 2)),
                              max_tokens=8))  # fmt: skip
    # Dynamic context parallelism is cp_shard's job: refused, not planned for whole
    # sequences (static CP is planned: tests/test_torch_static_cp.py).
    attempt(lambda: rebalance(good, lens, max_tokens=8, cp_size=2, cp="dynamic"))
    return msgs


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("world", [2, 3])
def test_errors_raise_on_every_rank(world):
    results = run_distributed(worker_errors, world, timeout=TIMEOUT - 10)
    for msgs in results:
        assert msgs == results[0]  # identical ValueError text on every rank
    first = results[0]
    assert "rank 1" in first[0] and "first dimension" in first[0] and "'y'" in first[0]
    assert "dtype" in first[1]
    assert "pad_values" in first[2]
    assert "max_tokens" in first[3]
    assert "rank 0" in first[4] and "lengths is required" in first[4]
    assert "rank 0" in first[5] and "dict of tensors" in first[5]
    assert "rank 0" in first[6] and "micro-batches" in first[6] and "restore" in first[6]
    assert first[7] == "ok"
    assert "rank 1" in first[8] and "this rank's sequence 1 has 9 tokens" in first[8]
    assert "rank 0" not in first[8]
    assert "only static context parallelism keeps (cp_size=2, cp='dynamic')" in first[9]
    assert "cp_shard" in first[9]


def worker_token_keys_string(rank: int, world: int) -> list[str]:
    msgs = []
    batch = {
        "input_ids": torch.arange(5),
        "ids": torch.arange(2),  # per sequence; "ids" in "input_ids" is True for a string
        "cu_seqlens": torch.tensor([0, 2, 5], dtype=torch.int32),
    }
    try:
        rebalance(batch, max_tokens=8, token_keys="input_ids")
        msgs.append("no error")
    except ValueError as exc:
        msgs.append(str(exc))
    mbs, h = rebalance(batch, max_tokens=8, token_keys=["input_ids"])
    try:
        h.restore({"logp": torch.cat([mb["input_ids"] for mb in mbs])}, token_keys="logp")
        msgs.append("no error")
    except ValueError as exc:
        msgs.append(str(exc))
    return msgs


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_token_keys_given_as_a_string_is_refused_on_every_rank():
    results = run_distributed(worker_token_keys_string, 2, timeout=TIMEOUT - 10)
    for msgs in results:
        assert msgs == results[0]
        assert all("token_keys must be a collection of key names" in m for m in msgs)


# ---- a batch straight from pack_collate --------------------------------------------------
def _describe_value(v) -> tuple:
    """(type name, dims, value) of an int or 0-d tensor, as plain picklable values."""
    if isinstance(v, torch.Tensor):
        return ("Tensor", v.dim(), int(v))
    return (type(v).__name__, None, v)


def worker_pack_collate(rank: int, world: int) -> list:
    from seqbalance.torch import pack_collate

    rng = np.random.default_rng(rank)
    lens = rng.integers(1, 9, size=3 + 2 * rank)
    samples = [{"input_ids": torch.arange(int(n)) + 100 * i, "reward": float(i)}
               for i, n in enumerate(lens)]  # fmt: skip
    batch = pack_collate(samples)  # cu_seqlens, position_ids, lengths and max_seqlen (an int)
    out = []
    for as_tensor in (False, True):
        b = dict(batch, max_seqlen=torch.tensor(batch["max_seqlen"])) if as_tensor else batch
        mbs, h = rebalance(b, max_tokens=12)
        out.append([(list(mb), _describe_value(mb["max_seqlen"]), mb["cu_seqlens"].tolist(),
                     mb["position_ids"].tolist()) for mb in mbs])  # fmt: skip
        back = h.restore([mb["input_ids"] for mb in mbs])
        out.append(bool(torch.equal(back, batch["input_ids"])))
    msgs = []
    for bad in (1.5, True, torch.tensor([3]), "3"):
        try:
            rebalance(dict(batch, max_seqlen=bad if rank == 1 else 3), max_tokens=12)
            msgs.append("no error")
        except ValueError as exc:
            msgs.append(str(exc))
    out.append(msgs)
    return out


@pytest.mark.timeout(TIMEOUT)
def test_a_pack_collate_batch_rebalances_with_its_own_max_seqlen():
    results = run_distributed(worker_pack_collate, 2, timeout=TIMEOUT - 10)
    for res in results:
        for as_tensor, mbs, restored in ((False, res[0], res[1]), (True, res[2], res[3])):
            assert restored
            assert mbs
            for keys, longest, cu, pos in mbs:
                assert keys == ["input_ids", "reward", "cu_seqlens", "position_ids",
                                "lengths", "max_seqlen"]  # fmt: skip
                seg = np.diff(cu)
                want = int(seg.max()) if len(seg) else 0
                assert longest == (("Tensor", 0, want) if as_tensor else ("int", None, want))
                # positions restart at every sequence of the micro-batch
                assert pos == [p for n in seg for p in range(n)]
        msgs = res[4]
        assert msgs == results[0][4]  # raised on every rank alike
        assert all("rank 1" in m and "max_seqlen" in m and "int or a 0-d integer tensor" in m
                   for m in msgs), msgs  # fmt: skip
