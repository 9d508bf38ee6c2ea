"""Drop-in for AReaL's allocation code (``areal.utils.seqpack`` and the micro-batch
allocation of ``areal.utils.data``, AReaL 1.0), implemented on seqbalance.

Change one import::

    from seqbalance.compat.areal import ffd_allocate, kk_allocate, balanced_greedy_partition

or call :func:`patch` once (:func:`unpatch` undoes it). Names, signatures and error types
(``RuntimeError`` from the allocators, ``ValueError`` from the partition) are AReaL's; the
differences are listed in ``docs/migrating.md``.
"""

from __future__ import annotations

# The functions live in _areal_dropin, below joint mode (joint_areal), which falls back to
# allocate_balanced_mbs_synced; this module adds patch() and unpatch(), which switch joint
# mode on and off.
from . import joint_areal as _joint
from ._areal_dropin import (
    PACKING_ALGORITHM_FFD,
    PACKING_ALGORITHM_KK,
    PACKING_ALGORITHMS,
    _compute_packing_metrics,
    _kk_partition,
    allocate_balanced_mbs,
    allocate_balanced_mbs_synced,
    balanced_greedy_partition,
    ffd_allocate,
    flat2d,
    get_allocate_fn,
    kk_allocate,
    min_abs_diff_partition,
    partition_balanced,
    partition_balanced_tuples,
    reorder_to_balanced_batches,
)
from ._inputs import Patcher

__all__ = [
    "PACKING_ALGORITHMS",
    "PACKING_ALGORITHM_FFD",
    "PACKING_ALGORITHM_KK",
    "_compute_packing_metrics",
    "_kk_partition",
    "allocate_balanced_mbs",
    "allocate_balanced_mbs_synced",
    "balanced_greedy_partition",
    "ffd_allocate",
    "flat2d",
    "get_allocate_fn",
    "kk_allocate",
    "min_abs_diff_partition",
    "partition_balanced",
    "partition_balanced_tuples",
    "patch",
    "reorder_to_balanced_batches",
    "unpatch",
]


_seqpack = Patcher(
    "areal.utils.seqpack",
    lambda: {
        n: globals()[n]
        for n in (
            "ffd_allocate", "kk_allocate", "balanced_greedy_partition",
            "_compute_packing_metrics", "_kk_partition", "get_allocate_fn",
            "partition_balanced", "partition_balanced_tuples", "min_abs_diff_partition",
            "reorder_to_balanced_batches",
        )
    },
)  # fmt: skip
_data = Patcher(
    "areal.utils.data",
    lambda: {n: globals()[n] for n in ("allocate_balanced_mbs", "allocate_balanced_mbs_synced")},
)


def patch(*, joint: bool | None = None) -> list[str]:
    """Replace AReaL's allocators (``areal.utils.seqpack``, and ``areal.utils.data`` where
    it is importable) with these; returns what was replaced.

    ``joint=True`` also switches on joint mode (:mod:`seqbalance.compat.joint_areal`: the
    training controller plans ranks and micro-batches together per PPO mini-batch and the
    workers follow); None (default) reads ``SEQBALANCE_AREAL_MODE`` (``joint``, or
    ``dropin``/unset).
    """
    on = _joint.joint_requested() if joint is None else joint
    done = _seqpack.patch()
    try:
        done += _data.patch()
    except ImportError:
        if on:
            raise
    if on:
        done = sorted({*done, *_joint.patch()})
    return done


def unpatch() -> None:
    """Undo :func:`patch` (joint mode included)."""
    _joint.unpatch()
    _data.unpatch()
    _seqpack.unpatch()
