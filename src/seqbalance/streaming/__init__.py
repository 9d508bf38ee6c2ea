"""Streaming plans for asynchronous RL: micro-batch slots released as sequences arrive.

:class:`StreamingPlanner` (numpy only) buffers arriving sequences and releases balanced
slots under the rule of a :class:`StreamingRule`; :mod:`seqbalance.torch.streaming` does
the same for rows produced on the ranks. See ``docs/streaming.md``.
"""

from __future__ import annotations

from .planner import StreamingPlanner, StreamingRule

__all__ = ["StreamingPlanner", "StreamingRule"]
