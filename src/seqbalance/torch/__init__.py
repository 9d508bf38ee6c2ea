"""PyTorch integration: balanced batch sampler, cross-rank rebalancing, loss normalisation.

Importing this module imports torch (``import seqbalance`` alone never does).

- :class:`BalancedDistributedSampler`: data with known lengths (SFT). Every rank plans the
  same global batches from the lengths and the epoch seed, without communication.
- :func:`rebalance` / :class:`RebalanceHandle`: data produced on the ranks (RL rollouts).
  Ranks exchange lengths, agree on one plan, move rows, and later restore outputs to their
  original rank and order.
- :func:`pack_collate`: a DataLoader collate function for packed (varlen) micro-batches.
- :func:`global_token_count`, :func:`token_mean_loss`: a token-mean loss over balanced
  micro-batches that equals the single-process value.
- :func:`cp_shard` / :class:`CPShardHandle`: one GPU's context-parallel pieces of a packed
  batch, and per-token outputs gathered back (:mod:`seqbalance.torch.context_parallel`).
- :class:`MicroBatchTimer`: time each micro-batch on its rank (CUDA events, or
  ``perf_counter`` after a synchronize) and gather the records at step end into a
  :class:`seqbalance.costs.TimingRecorder`; :class:`Rebalancer`: ``rebalance`` with a cost
  that can be swapped between steps (``set_cost``), as the sampler's ``set_cost``.
- :class:`StreamingRebalancer`: rows that arrive on the ranks over a step (asynchronous RL)
  moved into balanced slots as :class:`seqbalance.StreamingPlanner` releases them.
- :func:`seqbalance.torch.testing.run_distributed`: run a function on local gloo processes
  (or NCCL ones, one per GPU).

No hang from bad input: every function here that communicates starts with one all-gather
that carries each rank's local validation result and a fingerprint of the arguments that
must agree (:func:`seqbalance.torch.agreement.agree`). A bad input on one rank, or ranks passing
different options, raises the same :class:`RankAgreementError` (a ``ValueError``) on every
rank, naming the ranks and the argument, instead of leaving the others waiting in a
collective or silently computing different plans.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (the real torch: imports are absolute)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'seqbalance.torch needs PyTorch; install it with: pip install ".[torch]" (in a '
        "seqbalance checkout) or pip install torch; a CPU-only build: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    ) from exc

from .agreement import RankAgreementError
from .balancer import Rebalancer
from .collate import pack_collate
from .context_parallel import CPShardHandle, cp_shard
from .exchange import RebalanceHandle, rebalance
from .loss import global_token_count, token_mean_loss
from .sampler import BalancedDistributedSampler
from .streaming import StreamingRebalancer
from .timing import MicroBatchTimer

__all__ = [
    "BalancedDistributedSampler",
    "CPShardHandle",
    "MicroBatchTimer",
    "RankAgreementError",
    "RebalanceHandle",
    "Rebalancer",
    "StreamingRebalancer",
    "cp_shard",
    "global_token_count",
    "pack_collate",
    "rebalance",
    "token_mean_loss",
]
