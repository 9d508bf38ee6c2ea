"""The functions of :mod:`seqbalance.compat.verl`, the drop-in for
``verl.utils.seqlen_balancing`` (verl 0.9), implemented on seqbalance.

They live below both :mod:`seqbalance.compat.verl`, which re-exports them and adds
``patch()`` / ``unpatch()`` (which switch joint mode on and off), and
:mod:`seqbalance.compat.joint_verl`, whose workers fall back to them: joint mode sits on
top of the drop-in without the two importing each other. Their public home (their
``__module__`` too) is :mod:`seqbalance.compat.verl`.

torch (and tensordict, through the batch you pass) are used only by the functions that
take tensors or a process group, and imported inside them.
"""

from __future__ import annotations

import copy
import functools
import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import MAX_EMPTY
from ..planning import inverse_permutation
from ._core import framework_is_better, partition, plan
from ._inputs import (
    CompatAssertionError,
    check_index_lists,
    count_arg,
    grow_to,
    is_tensor,
    to_numpy,
    to_python_list,
    token_counts,
)
from ._verl_kk import equal_partition, free_partition, parts_of_labels, verl_free_kk_labels

#: The names :mod:`seqbalance.compat.verl` re-exports (its ``__all__`` less ``patch`` and
#: ``unpatch``).
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
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "roundup_divisible",
]

# verl's workload of one sequence of L tokens, for a 7B-like model: 24576 * L + L**2.
_LINEAR = 24576


def calculate_workload(seqlen_list: Any) -> Any:
    """Relative forward cost of each sequence, ``24576 * L + L**2`` (verl's 7B estimate).

    Integer inputs are widened to int64 first (with int32 lengths the workload passes
    2**31 - 1 at L = 35,655); a tensor comes back as a tensor on the same device, anything
    else as an int64 numpy array.

    Raises
    ------
    ValueError
        For a negative integer length, or one above ``3,036,988,212``, where the int64
        workload would wrap (a token count that large is a unit mix-up).
    """
    if is_tensor(seqlen_list):
        x = seqlen_list if seqlen_list.is_floating_point() else seqlen_list.long()
        if not x.is_floating_point() and x.numel():
            _check_workload_range(int(x.min()), int(x.max()))
        return _LINEAR * x + x * x
    x = to_numpy(seqlen_list)
    if x.size and (x.dtype.kind == "O" or (x.dtype.kind == "f" and float(abs(x).max()) >= 2**63)):
        # Python ints beyond int64 make numpy choose objects, or floats when mixed with
        # small ones: name the length, as for int64 input.
        given = seqlen_list if isinstance(seqlen_list, (list, tuple)) else x.reshape(-1).tolist()
        ints = [v for v in given if isinstance(v, int) and not isinstance(v, bool)]
        if ints:
            _check_workload_range(min(ints), max(ints))
    if x.dtype.kind != "f" and x.size:
        if x.dtype.kind not in "iub":
            raise ValueError(f"seqlen_list must be numbers, got {x.reshape(-1)[:5].tolist()}")
        _check_workload_range(int(x.min()), int(x.max()))  # before a uint64 cast could wrap
    x = x.astype(np.float64 if x.dtype.kind == "f" else np.int64)
    return _LINEAR * x + x * x


_WORKLOAD_MAX_LENGTH = 3_036_988_212  # the largest L with 24576 L + L**2 < 2**63


def _check_workload_range(low: int, high: int) -> None:
    if low < 0:
        raise ValueError(f"seqlen_list holds a negative length ({low}); lengths must be >= 0")
    if high > _WORKLOAD_MAX_LENGTH:
        raise ValueError(
            f"seqlen_list holds a length of {high}: its int64 workload 24576 L + L**2 would "
            f"wrap above {_WORKLOAD_MAX_LENGTH:,} tokens; lengths are token counts (check "
            "the units, or pass floats)"
        )


def _weights(values: Any, name: str) -> np.ndarray:
    w = to_numpy(values).astype(np.float64, copy=False)
    if w.ndim != 1:
        raise CompatAssertionError(f"{name} must be 1-D, got shape {w.shape}")
    return w


def _by_load_desc(parts: list[list[int]], w: np.ndarray) -> list[list[int]]:
    """Parts heaviest first, as verl's differencing returns them (ties: first index)."""
    loads = [float(w[p].sum()) if p else 0.0 for p in parts]
    order = sorted(range(len(parts)), key=lambda j: (-loads[j], parts[j][:1]))
    return [list(parts[j]) for j in order]


def _balanced(values: Any, k: int, equal_size: bool, method: str) -> list[list[int]]:
    w = _weights(values, "seqlen_list")
    # Count-free parts beyond the items stay empty: up to 2**20 of them, as partition.
    k = count_arg(k, "k_partitions", maximum=w.shape[0] + MAX_EMPTY)
    if equal_size and w.shape[0] % k:
        raise CompatAssertionError(
            f"equal_size=True needs len(seqlen_list) divisible by k_partitions: "
            f"{w.shape[0]} % {k} != 0"
        )
    if method == "auto":  # never heavier than verl's differencing
        parts = (equal_partition if equal_size else free_partition)(w, k, "seqlen_list")
        return _by_load_desc([list(p) for p in parts], w)
    out = [list(p) for p in partition(w, k, size="equal" if equal_size else "free",
                                       method=method)]  # fmt: skip
    if method == "greedy":  # never heavier than verl's own greedy, which is cheap to run
        theirs = _verl_greedy(w, k, equal_size)
        if framework_is_better(theirs, out, w):
            out = [sorted(p) for p in theirs]
    return _by_load_desc(out, w)


def _verl_greedy(w: np.ndarray, k: int, equal_size: bool) -> list[list[int]]:
    """verl's ``greedy_partition``, reproduced: items in input order, each to the part
    with the smallest sum (the first on ties); with ``equal_size`` every item also weighs
    ``sum + 1`` more, so parts fill by count first."""
    bias = float(w.sum()) + 1.0 if equal_size else 0.0
    heap = [(0.0, j) for j in range(k)]
    parts: list[list[int]] = [[] for _ in range(k)]
    for i, x in enumerate(w.tolist()):
        total, j = heapq.heappop(heap)
        parts[j].append(i)
        heapq.heappush(heap, (total + x + bias, j))
    return parts


def karmarkar_karp(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """``k_partitions`` lists of indices with balanced sums (heaviest first).

    ``equal_size=False`` leaves counts free (verl's free mode; a part may stay empty, as in
    verl), ``True`` gives every part ``n / k`` items. seqbalance's
    ``partition(method="auto")``: differencing and greedy, each refined (with
    token-count-like integer weights and many items a part, a refined sorted deal first,
    kept only when it meets the lower bound). verl's own differencing (its merge order and
    tie rules, :mod:`._verl_kk`) is the start with ``equal_size=True`` and a floor without
    (taken, refined, where lighter), so the heaviest part is never heavier than verl's
    (exactly so for integer weights summing below 2**53).
    """
    return _balanced(seqlen_list, k_partitions, equal_size, "auto")


def greedy_partition(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Like :func:`karmarkar_karp`, with longest-first greedy as the only start."""
    return _balanced(seqlen_list, k_partitions, equal_size, "greedy")


def _fill_empty(parts: list[list[int]], w: np.ndarray) -> None:
    """Give each empty part the lightest item of the part holding the most items.

    The moved item weighs no more than the part it left, so the heaviest part never grows.
    """
    for j, p in enumerate(parts):
        if p:
            continue
        donor = max(range(len(parts)), key=lambda d: (len(parts[d]), -d))
        lightest = min(parts[donor], key=lambda i: (w[i], i))
        parts[donor].remove(lightest)
        parts[j] = [lightest]


def get_seqlen_balanced_partitions(
    seqlen_list: Any, k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """``k_partitions`` non-empty, ascending index lists with balanced sums.

    Raises
    ------
    AssertionError (a :class:`CompatAssertionError`, also a ValueError)
        If there are fewer items than partitions, or ``equal_size`` and ``n % k != 0``.
    """
    w = _weights(seqlen_list, "seqlen_list")
    k_partitions = count_arg(k_partitions, "k_partitions")
    if w.shape[0] < k_partitions:
        raise CompatAssertionError(
            f"number of items:[{w.shape[0]}] < k_partitions:[{k_partitions}]"
        )
    parts = karmarkar_karp(w, k_partitions, equal_size)
    _fill_empty(parts, w)
    return [sorted(p) for p in parts]


def log_seqlen_unbalance(seqlen_list: Any, partitions: Any, prefix: str) -> dict[str, Any]:
    """Balance metrics before (consecutive chunks) and after (``partitions``) balancing.

    Keys ``{prefix}/min``, ``/max``, ``/minmax_diff`` (chunks of ``n // k`` in input
    order), ``/balanced_min``, ``/balanced_max`` (the partitions) and ``/mean``.
    """
    x = token_counts(seqlen_list, "seqlen_list").tolist()
    k = len(partitions)
    if k == 0 or not x:
        raise CompatAssertionError(
            f"nothing to measure: {len(x)} lengths in {k} partitions; pass both"
        )
    check_index_lists(partitions, len(x), "partitions")
    size = max(1, len(x) // k)
    chunks = [sum(x[o : o + size]) for o in range(0, len(x), size)]
    balanced = [sum(x[i] for i in p) for p in partitions]
    return {
        f"{prefix}/min": min(chunks),
        f"{prefix}/max": max(chunks),
        f"{prefix}/minmax_diff": max(chunks) - min(chunks),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(chunks) / k,
    }


def ceildiv(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is ``>= a``."""
    return ceildiv(a, b) * b


def get_reverse_idx(idx_map: Any) -> Any:
    """The inverse permutation of ``idx_map``: a tensor (same dtype and device) for a
    tensor, a numpy array (same dtype) for an array, a list for anything else.

    Raises ValueError if ``idx_map`` is not a permutation of ``0..n-1`` (verl's version
    silently returns a wrong map then).
    """
    inv = inverse_permutation(to_numpy(idx_map))
    if is_tensor(idx_map):
        import torch

        return torch.as_tensor(inv, dtype=idx_map.dtype, device=idx_map.device)
    if isinstance(idx_map, np.ndarray):
        return inv.astype(idx_map.dtype, copy=False)
    return inv.tolist()


# ---- dynamic micro-batching -----------------------------------------------------------


def _effective_lengths(batch: Any) -> tuple[np.ndarray, int]:
    """Tokens per row and the padded width verl checks ``max_token_len`` against."""
    input_ids = batch["input_ids"] if "input_ids" in batch.keys() else None
    if input_ids is not None and getattr(input_ids, "is_nested", False):
        lens = to_numpy(input_ids.offsets().diff()).astype(np.int64)
        return lens, int(lens.max()) if lens.size else 0
    mask = batch["attention_mask"]
    # Counted, not cast: a fractional mask truncated to int64 let rows exceed the cap.
    lens = token_counts(mask.sum(dim=1), "attention_mask.sum(dim=1)")
    return lens, int(mask.shape[-1])


def _select(batch: Any, idx: list[int]) -> Any:
    import torch

    index = torch.as_tensor(idx, dtype=torch.long)
    try:
        return batch[index]
    except (RuntimeError, TypeError, IndexError):  # nested tensors: select row by row
        from tensordict import TensorDict

        out = {}
        for key, value in batch.items():
            if getattr(value, "is_nested", False):
                rows = value.unbind()
                out[key] = torch.nested.as_nested_tensor(
                    [rows[i] for i in idx], layout=torch.jagged
                )
            else:
                out[key] = value[index]
        return TensorDict(out, batch_size=[len(idx)])


_WHAT = "rearrange_micro_batches"

# ---- which verl's micro-batch count ----------------------------------------------------

#: verl 0.9.1 on: from ``ceil(tokens / max_token_len)``, raised until verl's split holds the
#: cap. Before 0.9.1 (0.7.0, 0.8.0, 0.9.0 and main up to at least commit b178a3cd): that
#: first count, whatever the split (which can break the cap).
RETRY, NO_RETRY = "retry", "no-retry"
_FIRST_RETRYING = (0, 9, 1)


def _installed_verl_version() -> str | None:
    """The version of the verl that ``import verl`` would load, without importing it: its
    ``verl/version/version`` file (what verl reads for ``__version__``, also in source
    checkouts), else the installed distribution's metadata; None when there is no verl."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("verl")  # a top-level name: verl's code does not run
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc, "version", "version")
        if f.is_file():
            return f.read_text().strip()
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _count_rule(match: Any) -> str | None:
    """``match_framework_count`` as a rule: None (seqbalance's count), :data:`RETRY` or
    :data:`NO_RETRY`. True reads the installed verl's version (0.9.1's rule without one);
    a string is a verl version such as ``"0.9.1"`` or ``"0.8.0.dev"``."""
    if match is False or match is None:
        return None
    if match is True:
        match = _installed_verl_version() or ".".join(map(str, _FIRST_RETRYING))
    version = _version_tuple(match) if isinstance(match, str) else None
    if version is not None:
        return RETRY if version[:3] >= _FIRST_RETRYING else NO_RETRY
    raise ValueError(
        f"match_framework_count must be True, False or a verl version such as '0.9.1' or "
        f"'0.8.0', got {match!r}"
    )


def _version_tuple(version: str) -> tuple[int, int, int, int] | None:
    """``(major, minor, micro, final)`` of a version string (``final`` 0 for a dev, rc,
    alpha or beta release, which comes before the release, 1 for the release and its
    post-releases); None if it is not one."""
    import re

    found = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*?)\s*", version)
    if not found:
        return None
    major, minor, micro, rest = found.groups()
    rest = rest.lower()
    final = 1 if not rest or rest.startswith("+") or rest.lstrip(".-_").startswith("post") else 0
    return int(major), int(minor), int(micro or 0), final


def _syncs_without_group(version: str | None) -> bool:
    """Whether this verl agrees the micro-batch count over the default process group when
    ``rearrange_micro_batches`` gets no ``dp_group`` (verl before 0.8.0: 0.7.0 and main up
    to at least b178a3cd, whose FSDP actor and critic pass none), rather than not at all."""
    parsed = _version_tuple(version) if version else None
    return parsed is not None and parsed < (0, 8, 0, 1)


def _world_without_group(fn: Any) -> Any:
    """``fn`` (rearrange_micro_batches or prepare_dynamic_batch) agreeing the count over the
    default process group when no ``dp_group`` is given, as verl before 0.8.0 does: its
    callers rely on it, and ranks with different counts would hang in FSDP's collectives."""
    import inspect

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        given = bound.arguments
        if given.get("dp_group") is None and given.get("same_micro_num_in_dp", True) and (
            _dist_ready()
        ):
            import torch.distributed as dist

            bound.arguments["dp_group"] = dist.group.WORLD
        return fn(*bound.args, **bound.kwargs)

    return wrapper


def _rule_or_error(match: Any) -> tuple[str | None, ValueError | None]:
    try:
        return _count_rule(match), None
    except ValueError as exc:
        return None, exc



@dataclass
class _Rank:
    """One rank's forced groups (tokens and workload each) and its first micro-batches."""

    lens: np.ndarray
    work: np.ndarray
    step: int
    count: int  # seqbalance's fewest micro-batches, or verl's starting estimate
    parts: list[list[int]] | None  # the plan at ``count`` (None when matching verl's count)

    @property
    def n(self) -> int:
        return int(self.lens.shape[0])


def _read_rank(
    lens: np.ndarray, cap: int, step_arg: Any, min_num: Any, g: int, order: str,
    rule: str | bool | None,
) -> _Rank:
    """Validate one rank's lengths and plan it locally (no communication). ``rule``: None,
    :data:`RETRY` or :data:`NO_RETRY` (a bool is read as ``match_framework_count``)."""
    if isinstance(rule, bool):
        rule = _count_rule(rule)
    cap = count_arg(cap, "max_token_len")  # AssertionError, as verl
    step = count_arg(step_arg or 1, "num_batches_divided_by", ValueError)
    if g < 1 or lens.shape[0] % g:
        raise CompatAssertionError(
            f"Batch size {lens.shape[0]} must be divisible by force_group_size {g}"
        )
    n = lens.shape[0] // g
    group_lens = lens.reshape(n, g).sum(axis=1)
    group_work = calculate_workload(lens).reshape(n, g).sum(axis=1).astype(np.float64)
    # verl's starting count: the token total over the cap, at most one per forced group.
    count = min(n, ceildiv(int(lens.sum()), cap))
    if min_num is not None:
        count = max(count_arg(min_num, "min_num_micro_batch", ValueError, minimum=None), count)
    if n and int(group_lens.max()) > cap:  # verl's message (the width check comes first)
        raise ValueError(
            "A forced group exceeds max_token_len and cannot be split. Got "
            f"max_group_token_len={int(group_lens.max())} and max_token_len={cap}."
        )
    if rule == RETRY:
        return _Rank(group_lens, group_work, step, count, None)
    parts = _plan_parts(group_lens, group_work, cap, count, step, order)
    r = _Rank(group_lens, group_work, step, len(parts), parts)
    m = roundup_divisible(max(count, 1), step)
    if rule == NO_RETRY and m < len(parts) and m <= n:
        # verl before 0.9.1 uses m whatever its split; where that split holds the cap (the
        # planner's packing can miss such a fit), m is verl's count and reachable here too.
        try:
            fit = _kk_fit(r, m, cap)
        except Exception:  # any type: only a candidate
            fit = None
        if fit is not None:
            return _Rank(group_lens, group_work, step, m, _parts_at(r, m, cap, order, fit))
    if n <= VERL_CHECK_MAX and len(parts) > count:
        # verl's own count, cheap on a few dozen groups: where it is lower (the planner's
        # budgeted exact packing can miss a fit there), take that count, with verl's split
        # among the candidates, so the drop-in never uses more micro-batches than verl.
        try:
            m, fit = _framework_count(r, count, n, cap, None)
        except Exception:  # any type: only a check; the planner's parts stand
            m, fit = len(parts), None
        if m < len(parts):
            r = _Rank(group_lens, group_work, step, m, _parts_at(r, m, cap, order, fit))
    return r


#: Up to this many (forced groups of) sequences on a rank, the default micro-batching also
#: runs verl's own count search (each try one differencing of a few dozen items) and never
#: uses more micro-batches than it. Above, the planner's exact packing does not run (it
#: takes at most 64 sequences) and no measured call used more (``bench/compat.py``).
VERL_CHECK_MAX = 64


def _plan_parts(lens: Any, work: Any, cap: int, m: int, step: int, order: str) -> list[list[int]]:
    p = plan(
        lens, 1, cap, cost=work, min_micro_batches=max(m, 1), micro_batch_multiple=step,
        order=order, baselines=False,
    )  # fmt: skip
    return [list(mb) for mb in p.micro_batches[0]]


def _kk_fit(r: _Rank, m: int, cap: int) -> list[list[int]] | None:
    """verl's test at ``m``: the workloads split by verl's own count-free differencing
    (:func:`._verl_kk.verl_free_kk_labels`, its tie rules reproduced); the parts if each is
    non-empty and within the cap, else None. The differencing stops as soon as a subset
    breaks the cap (subsets only grow; on long-tailed lengths that comes late)."""
    labels = verl_free_kk_labels(r.work, m, r.lens.astype(np.float64), float(cap))
    if labels is None:
        return None
    sizes = np.bincount(labels, minlength=m)
    # A guard only: with at least m groups no part stays empty (every merge keeps
    # min(m, items) subsets non-empty), and the differencing checked the cap.
    if (sizes == 0).any():
        return None
    return parts_of_labels(labels, m)


def _too_few(m: int, fewest: int) -> ValueError:
    return ValueError(
        "Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
        f"micro-batch count across DP ranks: the group needs {m} non-empty micro-batches, but "
        f"a rank has only {fewest} forced groups."
    )


def _framework_count(
    r: _Rank, start: int, fewest: int, cap: int, group: Any
) -> tuple[int, list[list[int]]]:
    """verl's own count: from ``start`` (rounded up to the step) in steps of ``step`` until the
    differencing partition of the workloads fits the cap (on every rank of ``group`` when
    one is given: one all-gather of a bool per try, as verl all-reduces one per try)."""
    # At least one: all-padding rows give a token bound of 0 (verl then fails with an
    # IndexError; the default mode returns one micro-batch, and so does this).
    m = roundup_divisible(max(start, 1), r.step)
    while True:
        if m > fewest:
            raise _too_few(m, fewest)
        fit, error = None, None
        try:
            fit = _kk_fit(r, m, cap)
        except Exception as exc:  # reported to every rank by the all-gather, so none waits
            error = exc
        if group is not None:
            from ..torch.agreement import agree  # imports torch: only when communicating

            ok = all(agree(error, {}, fit is not None, group, _WHAT))
        elif error is not None:
            raise error
        else:
            ok = fit is not None
        if ok:
            assert fit is not None
            return m, fit
        m += r.step


def _parts_at(r: _Rank, m: int, cap: int, order: str, verl_parts: Any) -> list[list[int]]:
    """Exactly ``m`` micro-batches within the cap, the lightest heaviest one among the
    candidates; never raises (the count is agreed, so a rank must not fail alone).
    verl's own split at ``m`` is one of them whenever it fits, so where verl would use
    ``m`` micro-batches too the result is never heavier than verl's."""
    if verl_parts is None:
        try:
            verl_parts = _kk_fit(r, m, cap)
        except Exception:  # any type: only a candidate
            pass
    candidates = [] if verl_parts is None else [verl_parts]
    if r.parts is not None and len(r.parts) == m:
        candidates.append(r.parts)
    else:
        try:
            parts = _plan_parts(r.lens, r.work, cap, m, r.step, order)
            if len(parts) == m:
                candidates.append(parts)
        except Exception:  # any type: this rank must not fail alone; split instead
            pass
    if not candidates:  # the planner grew past m: split the fewer, fitting, micro-batches
        assert r.parts is not None
        candidates.append(grow_to(r.parts, m, r.work))
    # A pure workload partition, if it fits the cap (with one rank the planner balances
    # count first, so this often lowers the heaviest micro-batch).
    try:
        alt = [list(q) for q in partition(r.work, m)]
        if all(alt) and all(int(r.lens[q].sum()) <= cap for q in alt):
            candidates.append(alt)
    except Exception:  # any type: only a candidate
        pass
    return min(candidates, key=lambda c: max(float(r.work[p].sum()) for p in c))


def _ordered(parts: list[list[int]], work: np.ndarray, order: str) -> list[list[int]]:
    desc = sorted(parts, key=lambda mb: (-float(work[mb].sum()), mb[:1]))
    return desc[::2][::-1] + desc[1::2] if order == "light_ends" else desc


def _group_micro_batches(
    read: Any, cap: int, group: Any, agreed: bool, match: bool, order: str, fingerprint: Any
) -> list[list[int]]:
    """The micro-batches of forced groups: ``read()`` validates this rank's input (locally);
    with a ``group``, one all-gather agrees the count and checks ``fingerprint`` first."""
    if group is None:
        r = read()
        m, fewest = r.count, r.n
    else:
        from ..torch.agreement import agree_on  # imports torch: only when communicating

        box: list[_Rank] = []

        def check() -> tuple[dict[str, Any], tuple[int, int]]:
            box.append(read())
            return fingerprint, (box[0].count, box[0].n)

        payloads = agree_on(check, group, _WHAT)
        r = box[0]
        m, fewest = r.count, r.n
        if agreed:
            m, fewest = max(c for c, _ in payloads), min(n for _, n in payloads)
    verl_parts = None
    if match:
        m, verl_parts = _framework_count(r, m, fewest, cap, group if agreed else None)
    elif m > fewest:
        raise _too_few(m, fewest)
    return _ordered(_parts_at(r, m, cap, order, verl_parts), r.work, order)


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    match_framework_count: bool | str = False,
) -> tuple[list[Any], list[list[int]]]:
    """Split a batch into micro-batches of at most ``max_token_len`` tokens, balanced.

    Parameters are verl's: ``batch`` is a TensorDict with ``attention_mask`` (B x S) or a
    nested ``input_ids``; with ``dp_group`` (and ``same_micro_num_in_dp``) every rank of
    the group ends with the same number of micro-batches; ``num_batches_divided_by``
    (virtual pipeline stages) divides that number; ``min_num_micro_batch`` is a floor;
    ``use_dynamic_bsz_balance`` puts the lightest micro-batches at both ends;
    ``force_group_size`` keeps that many consecutive rows together.

    How many micro-batches: by default the fewest that hold the cap (seqbalance's
    capacity-bounded packing, balanced on verl's workload ``24576 L + L**2``; the max over
    the DP group), which is often below verl's count. Each micro-batch is a full forward
    and backward, so fewer is cheaper on a rank: its summed work is the same and it pays
    the per-micro-batch overhead fewer times, though its heaviest micro-batch is heavier.
    (With pipeline parallelism more micro-batches shrink the bubble: keep verl's count
    there, or set ``min_num_micro_batch``.) ``match_framework_count`` gives verl's own
    count, which depends on verl's version: a version string (``"0.9.1"``, ``"0.8.0"``,
    ``"0.8.0.dev"``), or True for the verl that ``import verl`` would load (read from its
    version file or metadata, without importing it; 0.9.1 when there is none). verl starts
    at ``min(rows, ceil(tokens / max_token_len))`` (at least ``min_num_micro_batch``), the
    max over the DP group, rounded up to a multiple of ``num_batches_divided_by``. From
    0.9.1 on it then raises that count by the step until its count-free Karmarkar-Karp
    split of the workloads (its tie rules reproduced, :mod:`._verl_kk`) fits the cap on
    every rank; the micro-batches at that count are the lightest of seqbalance's and
    verl's split, so never heavier than verl's. Before 0.9.1 verl keeps the first count
    and its split can break the cap; here that count is kept wherever some split holds
    the cap (verl's own, or the planner's), else the fewest above it that do: the cap is
    always held.

    With a ``dp_group`` (and torch.distributed initialised) every rank of the group must
    call this, even with ``same_micro_num_in_dp=False``: one all-gather
    (:func:`seqbalance.torch.agreement.agree_on`) carries each rank's local error, its
    arguments and its count. If a rank's input failed (a width above ``max_token_len``, a
    forced group above it, ...) or the ranks passed different ``max_token_len``,
    ``num_batches_divided_by``, ``min_num_micro_batch``, ``same_micro_num_in_dp``,
    ``force_group_size`` or ``match_framework_count``, every rank raises the same
    :class:`~seqbalance.torch.agreement.RankAgreementError` (a ValueError) naming the rank
    or the argument; no rank is left waiting. Otherwise ranks below the group's count
    re-plan locally with it. Without a group, errors are raised locally with verl's types.

    Returns
    -------
    (list of TensorDict, list of list of int)
        The micro-batches and, for each, the row indices it holds (ascending).
    """
    order = "light_ends" if use_dynamic_bsz_balance else "heaviest_first"
    cap = max_token_len

    # Nothing before the all-gather may raise outside read(): a rank raising alone there
    # would leave the others waiting.
    rule, rule_error = _rule_or_error(match_framework_count)

    def read() -> _Rank:
        if rule_error is not None:
            raise rule_error
        lens, width = _effective_lengths(batch)
        count_arg(cap, "max_token_len")  # AssertionError, as verl
        if cap < width:
            raise CompatAssertionError(
                "max_token_len must be greater than the sequence length. "
                f"Got max_token_len={cap} and max_seq_len={width}"
            )
        return _read_rank(
            lens, cap, num_batches_divided_by, min_num_micro_batch, int(force_group_size),
            order, rule,
        )  # fmt: skip

    fingerprint = {
        "max_token_len": max_token_len,
        "num_batches_divided_by": num_batches_divided_by or 1,  # None and 1 are the same
        "min_num_micro_batch": min_num_micro_batch,
        "same_micro_num_in_dp": bool(same_micro_num_in_dp),
        "force_group_size": force_group_size,
        "match_framework_count": match_framework_count,
    }
    if match_framework_count is True:  # it follows the installed verl, which may differ
        fingerprint["verl count rule of match_framework_count=True"] = rule
    group = dp_group if dp_group is not None and _dist_ready() else None
    groups_per_mb = _group_micro_batches(
        read, cap, group, bool(same_micro_num_in_dp), rule == RETRY, order, fingerprint,
    )  # fmt: skip
    g = int(force_group_size)  # read() succeeded, so this does too
    idx = [[i * g + r for i in mb for r in range(g)] for mb in groups_per_mb]
    return [_select(batch, p) for p in idx], idx


def micro_batches_of_lengths(
    seqlens: Any,
    max_token_len: int,
    min_num_micro_batch: int | None = None,
    *,
    match_framework_count: bool | str = False,
) -> list[list[int]]:
    """The index lists :func:`rearrange_micro_batches` makes on one rank, from lengths alone
    (no tensors, no DP group): for benchmarks and for callers without a TensorDict.
    ``match_framework_count`` as there."""
    lens = token_counts(seqlens, "seqlens")
    rule = _count_rule(match_framework_count)

    def read() -> _Rank:
        return _read_rank(
            lens, max_token_len, None, min_num_micro_batch, 1, "light_ends", rule
        )  # fmt: skip

    return _group_micro_batches(read, max_token_len, None, False, rule == RETRY, "light_ends", {})


def _dist_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    *,
    match_framework_count: bool | str = False,
) -> tuple[list[Any], list[list[int]]]:
    """:func:`rearrange_micro_batches` on a DataProto; returns DataProtos of the same type."""
    mbs, idx = rearrange_micro_batches(
        data.batch,
        max_token_len=max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
        match_framework_count=match_framework_count,
    )
    out = []
    for mb, rows in zip(mbs, idx):
        non_tensors = {k: v[rows] for k, v in data.non_tensor_batch.items()}
        meta = copy.deepcopy(data.meta_info)
        out.append(type(data).from_dict(dict(mb), non_tensors, meta_info=meta))
    return out, idx


def restore_dynamic_batch(data: Any, batch_idx_list: list[list[int]]) -> Any:
    """Rows of ``data`` (micro-batches concatenated) back in their original order."""
    import torch

    flat = [i for mb in batch_idx_list for i in mb]
    if len(flat) != data.shape[0]:
        raise CompatAssertionError(f"{len(flat)} vs. {data.shape[0]}")
    inv = torch.as_tensor(inverse_permutation(flat), dtype=torch.long)
    if getattr(data, "is_nested", False):
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in inv], layout=torch.jagged)
    return data[inv]


def get_group_balanced_partitions(
    seqlen_list: Any, uid_list: Any, k_partitions: int
) -> list[list[int]]:
    """``k_partitions`` ascending index lists; rows sharing a uid stay together and every
    partition gets the same number of uid groups (balanced by ``calculate_workload``).

    Rows with the same uid are grouped wherever they sit (verl groups consecutive runs).
    """
    lens = token_counts(seqlen_list, "seqlen_list")
    uids = to_python_list(uid_list)
    if len(uids) != lens.shape[0]:
        raise CompatAssertionError("seqlen_list and uid_list must have same length")
    n_groups = len(dict.fromkeys(uids))
    k_partitions = count_arg(k_partitions, "k_partitions")
    if n_groups < k_partitions:
        raise CompatAssertionError(
            f"Number of uid groups ({n_groups}) must be >= k_partitions ({k_partitions}). "
            "Consider reducing world_size or increasing batch_size."
        )
    if n_groups % k_partitions:
        raise CompatAssertionError(f"{n_groups} % {k_partitions} != 0")
    parts = partition(calculate_workload(lens), k_partitions, size="equal", groups=uids)
    return [list(p) for p in parts]


#: ``patch(match_framework_count=...)`` of :mod:`seqbalance.compat.verl`, read by joint
#: mode's workers when they plan locally.
_patch_options: dict[str, bool | str] = {"match_framework_count": False}

# Their public module is seqbalance.compat.verl: help(), pickle and whoever reads a patched
# function's __module__ (to see whether the drop-in replaced it) name that module.
for _name in __all__:
    globals()[_name].__module__ = "seqbalance.compat.verl"
del _name
