"""Drop-in for ``verl.utils.seqlen_balancing`` (verl 0.9), implemented on seqbalance.

Change one import::

    from seqbalance.compat.verl import get_seqlen_balanced_partitions, rearrange_micro_batches

or, without editing verl, call :func:`patch` once before training (:func:`unpatch` undoes
it). Names, signatures, argument conventions and return types are verl's; the behaviour
differences (better balance, caps always held, input widening) are listed in
``docs/migrating.md``.

torch (and tensordict, through the batch you pass) are used only by the functions that
take tensors or a process group, and imported inside them.
"""

from __future__ import annotations

import functools
from typing import Any

# The functions live in _verl_dropin, below joint mode (joint_verl), which falls back to
# them; this module adds patch() and unpatch(), which switch joint mode on and off.
from . import _verl_dropin as _impl
from . import joint_verl as _joint
from ._inputs import Patcher
from ._verl_dropin import (
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    log_seqlen_unbalance,
    micro_batches_of_lengths,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
    roundup_divisible,
)

__all__ = [
    "calculate_workload",
    "ceildiv",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "karmarkar_karp",
    "log_seqlen_unbalance",
    "micro_batches_of_lengths",
    "patch",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "roundup_divisible",
    "unpatch",
]


def _replacements() -> dict[str, Any]:
    out = {
        name: globals()[name]
        for name in __all__
        if name not in ("patch", "unpatch", "micro_batches_of_lengths")
    }
    match = _impl._patch_options["match_framework_count"]
    if match:
        for name in ("rearrange_micro_batches", "prepare_dynamic_batch"):
            out[name] = _with_verl_count(out[name], match)
    if _impl._syncs_without_group(_impl._installed_verl_version()):
        for name in ("rearrange_micro_batches", "prepare_dynamic_batch"):
            out[name] = _impl._world_without_group(out[name])
    return out


def _with_verl_count(fn: Any, match: bool | str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("match_framework_count", match)
        return fn(*args, **kwargs)

    return wrapper


_patcher = Patcher("verl.utils.seqlen_balancing", _replacements)


def patch(
    *, match_framework_count: bool | str = False, joint: bool | None = None
) -> list[str]:
    """Replace verl's balancing functions with these (in ``verl.utils.seqlen_balancing``
    and in every loaded module that imported them by name). Returns what was replaced.

    ``match_framework_count=True`` (or a verl version) makes the patched
    ``rearrange_micro_batches`` and ``prepare_dynamic_batch`` use verl's own micro-batch
    count (see :func:`rearrange_micro_batches`), for callers inside verl that cannot pass
    the keyword. To change it, :func:`unpatch` first (ValueError otherwise).

    ``joint=True`` also switches on joint mode (:mod:`seqbalance.compat.joint_verl`: the
    driver plans ranks and micro-batches together per PPO mini-batch, the workers follow);
    None (default) reads ``SEQBALANCE_VERL_MODE`` (``joint``, or ``dropin``/unset).
    """
    _impl._count_rule(match_framework_count)  # ValueError for a bad value, before any change
    match = match_framework_count if isinstance(match_framework_count, str) else bool(
        match_framework_count
    )
    options = _impl._patch_options
    if _patcher.active and match != options["match_framework_count"]:
        raise ValueError(
            f"verl is already patched with match_framework_count="
            f"{options['match_framework_count']!r}; call unpatch() before patching with "
            f"match_framework_count={match!r}"
        )
    options["match_framework_count"] = match
    done = _patcher.patch()
    if _joint.joint_requested() if joint is None else joint:
        done = sorted({*done, *_joint.patch()})
    return done


def unpatch() -> None:
    """Undo :func:`patch` (joint mode included)."""
    _joint.unpatch()
    _patcher.unpatch()
