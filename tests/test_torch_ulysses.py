"""Rebalancing under Ulysses sequence parallelism (gloo, CPU): the recipe the README gives.

Four processes stand for two Ulysses groups of two GPUs ({0, 1} and {2, 3}); the GPUs of
a group hold the same batch. Each rank rebalances over its data-parallel group (the ranks
at the same position in their Ulysses group: {0, 2} and {1, 3}) with the group's capacity
and a UlyssesCost, so both GPUs of a Ulysses group must receive the same micro-batches,
and each group's micro-batches those of the plan of the groups' sequences.
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

from seqbalance.torch import rebalance  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402

SP = 2
PER_GPU_TOKENS = 40


def group_lengths(group: int) -> np.ndarray:
    """The lengths of Ulysses group ``group``'s batch (both its GPUs hold it)."""
    return np.random.default_rng(group).integers(5, 60, size=7 + 3 * group)


def _ids(group: int) -> np.ndarray:
    return np.arange(len(group_lengths(group))) + 1000 * group


def worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from seqbalance.costs import TokenCost, UlyssesCost

    # Every rank creates every data-parallel group, in the same order.
    dp_groups = [dist.new_group([pos + SP * g for g in range(world // SP)]) for pos in range(SP)]
    group, position = divmod(rank, SP)
    lengths = group_lengths(group)
    ids = torch.as_tensor(_ids(group))
    width = 60  # every rank pads to the same width
    tokens = torch.where(torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None],
                         ids[:, None] * 100 + torch.arange(width)[None, :], -1)  # fmt: skip
    batch = {"input_ids": tokens, "seq_id": ids}
    cost = UlyssesCost(TokenCost(), SP)
    mbs, handle = rebalance(
        batch, lengths, max_tokens=SP * PER_GPU_TOKENS, cost=cost, group=dp_groups[position]
    )
    back = handle.restore([mb["seq_id"] * 2 for mb in mbs])
    return {
        "mbs": [mb["seq_id"].tolist() for mb in mbs],
        "rows": [mb["input_ids"].tolist() for mb in mbs],
        "back": back.tolist(),
    }


@pytest.mark.timeout(120)
def test_the_gpus_of_a_ulysses_group_get_the_same_micro_batches():
    from seqbalance.costs import TokenCost, UlyssesCost
    from seqbalance.planning.planner import plan

    world = 4
    out = run_distributed(worker, world, timeout=110)
    lengths = np.concatenate([group_lengths(g) for g in range(world // SP)])
    ids = np.concatenate([_ids(g) for g in range(world // SP)])
    want = plan(lengths, world // SP, SP * PER_GPU_TOKENS, cost=UlyssesCost(TokenCost(), SP),
                allow_empty=True)  # fmt: skip
    assert want.microbatch_tokens().max() > PER_GPU_TOKENS  # the group's capacity is used
    for rank in range(world):
        group = rank // SP
        assert out[rank] == out[group * SP], "the GPUs of one Ulysses group differ"
        assert out[rank]["mbs"] == [ids[mb].tolist() for mb in want.micro_batches[group]]
        assert out[rank]["back"] == (_ids(group) * 2).tolist()  # restored in input order
    seen = sorted(i for g in range(world // SP) for mb in out[g * SP]["mbs"] for i in mb)
    assert seen == sorted(ids.tolist())  # every sequence once, over the groups
