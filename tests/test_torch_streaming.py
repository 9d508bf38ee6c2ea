"""Multi-process tests of seqbalance.torch.StreamingRebalancer (gloo, CPU).

Rows carry their arrival id in every value, so each rank can check what it received
against the slots a single-process StreamingPlanner releases for the same arrivals.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="needs torch; a CPU build: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu",
)
pytest.importorskip("torch.distributed")

from seqbalance import StreamingPlanner, StreamingRule  # noqa: E402
from seqbalance.torch import StreamingRebalancer  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.slow  # each test spawns 2-3 processes: 5-9 s

TIMEOUT = 180
CAP = 64


def _arrivals(world: int, steps: int, seed: int) -> list[list[np.ndarray]]:
    """lengths[step][rank]: the rows arriving on each rank at each call (some empty)."""
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(1, 40, size=int(rng.integers(0, 5))) for _ in range(world)]
        for _ in range(steps)
    ]


def _rows(lens: np.ndarray, first_id: int, width: int) -> dict:
    """Padded rows whose values encode their arrival id (width differs between calls)."""
    ids = np.arange(first_id, first_id + len(lens))
    t = np.arange(width)
    tokens = np.where(t[None, :] < lens[:, None], ids[:, None] * 1000 + t[None, :], -1)
    return {
        "input_ids": torch.as_tensor(tokens.reshape(len(lens), width), dtype=torch.int64),
        "reward": torch.as_tensor(ids * 0.5, dtype=torch.float32),
    }


def _expected(world, arrivals, idle_at, rule, budgets=None):
    """The slots a single StreamingPlanner releases for the same arrivals."""
    sp = StreamingPlanner(world, CAP, rule=rule)
    out, nid = [], 0
    for k, per_rank in enumerate(arrivals):
        budget = None if budgets is None else budgets[k]
        for lens in per_rank:
            sp.add(lens, ids=list(range(nid, nid + len(lens))), budget=budget)
            nid += len(lens)
        out.append(sp.ready(idle=k in idle_at, budget=budget))
    out.append(sp.flush())
    return out


def _run(rank, world, arrivals, idle_at, rule, budgets=None):
    streamer = StreamingRebalancer(CAP, rule=rule, pad_values={"input_ids": -1})
    got, nid = [], 0
    widths = [40 + 3 * k for k in range(len(arrivals))]  # dim 1 differs between calls
    for k, per_rank in enumerate(arrivals):
        first = nid + sum(len(x) for x in per_rank[:rank])
        rows = _rows(per_rank[rank], first, widths[k])
        budget = None if budgets is None else budgets[k]
        mbs, handle, ids = streamer.step(rows, per_rank[rank], idle=k in idle_at, budget=budget)
        nid += sum(len(x) for x in per_rank)
        got.append(_check(mbs, ids, handle))
    empty = _rows(np.zeros(0, dtype=np.int64), 0, 8)
    mbs, handle, ids = streamer.step(empty, [], final=True)
    got.append(_check(mbs, ids, handle))
    return got


def _check(mbs, ids, handle):
    """Each micro-batch holds exactly the rows of its ids, bit-exact; restore round-trips."""
    for mb, mb_ids in zip(mbs, ids):
        got = mb["input_ids"][:, 0].div(1000, rounding_mode="floor").tolist()
        assert got == mb_ids, (got, mb_ids)
        assert mb["reward"].tolist() == [i * 0.5 for i in mb_ids]
    if handle is not None:
        back = handle.restore([mb["reward"] for mb in mbs])
        assert back.tolist() == sorted(back.tolist())  # rows sent in arrival-id order
    return ids


@pytest.mark.parametrize(("world", "budgets"), [(2, None), (3, None), (2, "some")])
def test_every_rank_gets_its_part_of_the_same_slots(world, budgets):
    arrivals = _arrivals(world, steps=8, seed=world)
    idle_at = {2, 5}
    rule = StreamingRule(fill=0.7)
    if budgets is not None:  # budgets in work (tokens here): some calls release less
        budgets = [None, 100.0, 30.0, 0.0, 45.0, 20.0, None, 64.0]
    out = run_distributed(_run, world, arrivals, idle_at, rule, budgets, timeout=TIMEOUT)
    expected = _expected(world, arrivals, idle_at, rule, budgets)
    n = sum(len(x) for per_rank in arrivals for x in per_rank)
    seen = []
    for call, slots in enumerate(expected):
        for r in range(world):
            assert out[r][call] == [s[r] for s in slots]
        seen += [i for s in slots for mb in s for i in mb]
    assert sorted(seen) == list(range(n))
    assert any(expected[:-1]), "some slots are released before the final call"


def _bad(rank, world):
    streamer = StreamingRebalancer(CAP)
    lens = np.array([10, 200 if rank == 1 else 10])
    try:
        streamer.step(_rows(lens, 2 * rank, 8), lens)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_a_bad_length_on_one_rank_raises_on_every_rank():
    out = run_distributed(_bad, 2, timeout=TIMEOUT)
    assert out[0] == out[1]
    assert "rank 1" in out[0] and "max_tokens" in out[0]
