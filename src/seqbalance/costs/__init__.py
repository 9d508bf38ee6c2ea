"""Layer 1: cost models, what a sequence of L tokens costs to train.

- :class:`TokenCost`: cost = L.
- :class:`QuadraticCost`: ``a + b·L + c·L²`` per sequence plus ``c0`` per micro-batch
  (hand-written, or fitted to timings by :func:`fit_cost` / ``seqbalance calibrate``).
- :class:`FlopsCost`: exact training FLOPs from a Hugging Face ``config.json`` (dense,
  GQA, SwiGLU, MoE, MLA, sliding windows), or a shipped config by name (:data:`SHIPPED`).
- :class:`ContextParallelCost`: one GPU's piece of a context-parallel sequence, with the
  ring's communication (:mod:`seqbalance.costs.context_parallel`).
- :class:`UlyssesCost`: one GPU's share under Ulysses (all-to-all) sequence parallelism,
  with its communication (:mod:`seqbalance.costs.ulysses`).
- :func:`load_cost`: any of the above from what the user names (a model, a name, a path).
- :class:`TimingRecorder`: measured micro-batch times against the model, a report per
  rank and slot (:class:`BalanceReport`, metrics for loggers) and a robust refit; the
  records saved or streamed to disk (:mod:`seqbalance.costs.timing_files`).

Pure numpy; nothing here imports torch.

Examples
--------
>>> from seqbalance.costs import load_cost
>>> cost = load_cost("llama-3-8b")
>>> float(cost.microbatch_cost([4096])) > float(cost.microbatch_cost([2048, 2048]))
True
"""

from __future__ import annotations

from .architecture import Architecture, parse_config
from .base import CostModel, QuadraticCost, TokenCost
from .context_parallel import ContextParallelCost
from .feedback import REPORT_METRICS, BalanceReport, Timing, TimingRecorder
from .fit import (
    PoorlyDeterminedCostWarning,
    UnidentifiableCostWarning,
    ZeroLengthWarning,
    evaluate_cost,
    fit_cost,
)
from .flops import SHIPPED, FlopsCost
from .load import cost_from_dict, load_cost
from .report import FitReport
from .timing_files import ResumedStepsWarning, TimingFileError
from .ulysses import UlyssesCost, ulysses_bytes_per_token, ulysses_sp_size

__all__ = [
    "REPORT_METRICS",
    "SHIPPED",
    "Architecture",
    "BalanceReport",
    "ContextParallelCost",
    "CostModel",
    "FitReport",
    "FlopsCost",
    "PoorlyDeterminedCostWarning",
    "QuadraticCost",
    "ResumedStepsWarning",
    "Timing",
    "TimingFileError",
    "TimingRecorder",
    "TokenCost",
    "UlyssesCost",
    "UnidentifiableCostWarning",
    "ZeroLengthWarning",
    "cost_from_dict",
    "evaluate_cost",
    "fit_cost",
    "load_cost",
    "parse_config",
    "ulysses_bytes_per_token",
    "ulysses_sp_size",
]
