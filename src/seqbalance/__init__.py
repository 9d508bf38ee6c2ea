"""seqbalance: balance variable-length sequences across data-parallel ranks and micro-batches."""

from __future__ import annotations

from . import workloads

__version__ = "0.1.0"

__all__ = ["__version__", "workloads"]
