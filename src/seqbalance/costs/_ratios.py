"""Backward / forward cost ratios: their defaults and their check (every cost model
carries two; :mod:`.phases` splits costs with them)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BACKWARD_ATTENTION", "BACKWARD_MATMUL", "check_ratio"]

BACKWARD_MATMUL = 2.0
"""Default backward / forward ratio of the matmul (linear) terms."""

BACKWARD_ATTENTION = 2.5
"""Default backward / forward ratio of the attention (quadratic) term."""


def check_ratio(value: Any, name: str) -> float:
    """A backward / forward ratio: a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number > 0 (backward / forward), got {value!r}")
    try:
        out = float(value)
    except OverflowError:  # a Python int beyond float range
        out = math.inf
    if not math.isfinite(out) or out <= 0:
        raise ValueError(
            f"{name} = {value!r} is invalid; a backward / forward cost ratio must be finite "
            "and > 0 (typical: 2 for matmuls, 2.5 for attention)"
        )
    return out
