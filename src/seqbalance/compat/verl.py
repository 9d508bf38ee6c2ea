"""Drop-in for ``verl.utils.seqlen_balancing`` (verl 0.9), implemented on seqbalance.

Change one import::

    from seqbalance.compat.verl import get_seqlen_balanced_partitions, rearrange_micro_batches

or, without editing verl, call :func:`patch` once before training (:func:`unpatch` undoes
it). Names, signatures, argument conventions and return types are verl's; the behaviour
differences (better balance, caps always held, input widening) are listed in
``docs/migrating.md``.

torch (and tensordict, through the batch you pass) are used only by the functions that
take tensors, and imported inside them.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..partitioning import partition
from ..planning import inverse_permutation, plan
from ._inputs import CompatAssertionError, Patcher, is_tensor, to_numpy, to_python_list

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

# verl's workload of one sequence of L tokens, for a 7B-like model: 24576 * L + L**2.
_LINEAR = 24576


def calculate_workload(seqlen_list: Any) -> Any:
    """Relative forward cost of each sequence, ``24576 * L + L**2`` (verl's 7B estimate).

    Integer inputs are widened to int64 first (int32 lengths overflow at L ~ 46k); a tensor
    comes back as a tensor on the same device, anything else as an int64 numpy array.
    """
    if is_tensor(seqlen_list):
        x = seqlen_list if seqlen_list.is_floating_point() else seqlen_list.long()
        return _LINEAR * x + x * x
    x = to_numpy(seqlen_list)
    x = x.astype(np.float64 if x.dtype.kind == "f" else np.int64)
    return _LINEAR * x + x * x


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
    k = int(k)
    if k < 1:
        raise CompatAssertionError(f"k_partitions must be >= 1, got {k}")
    if equal_size and w.shape[0] % k:
        raise CompatAssertionError(
            f"equal_size=True needs len(seqlen_list) divisible by k_partitions: "
            f"{w.shape[0]} % {k} != 0"
        )
    parts = partition(w, k, size="equal" if equal_size else "free", method=method)
    return _by_load_desc([list(p) for p in parts], w)


def karmarkar_karp(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """``k_partitions`` lists of indices with balanced sums (heaviest first).

    ``equal_size=False`` leaves counts free (verl's free mode), ``True`` gives every part
    ``n / k`` items. seqbalance's ``partition(method="auto")``: differencing and greedy,
    each refined, so the heaviest part is never heavier than plain differencing's.
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
    x = to_numpy(seqlen_list).astype(np.int64).tolist()
    k = len(partitions)
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
    """The inverse permutation of ``idx_map``, in the same container type.

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
    lens = to_numpy(mask.sum(dim=1)).astype(np.int64)
    return lens, int(mask.shape[-1])


def _agree(dp_group: Any, m_local: int, n_groups: int) -> tuple[int, int]:
    """One all-reduce (MAX) of ``[m, -n]``: the group's micro-batch count and fewest items.

    A rank that could not plan sends a sentinel count so every rank raises together
    instead of leaving the others waiting in the next collective.
    """
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend(dp_group) == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    t = torch.tensor([m_local, -n_groups], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dp_group)
    return int(t[0].item()), -int(t[1].item())


_FAILED = 2**62  # count sent by a rank whose local plan failed


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


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[Any], list[list[int]]]:
    """Split a batch into micro-batches of at most ``max_token_len`` tokens, balanced.

    Parameters are verl's: ``batch`` is a TensorDict with ``attention_mask`` (B x S) or a
    nested ``input_ids``; with ``dp_group`` (and ``same_micro_num_in_dp``) every rank of
    the group ends with the same number of micro-batches; ``num_batches_divided_by``
    (virtual pipeline stages) divides that number; ``min_num_micro_batch`` is a floor;
    ``use_dynamic_bsz_balance`` puts the lightest micro-batches at both ends;
    ``force_group_size`` keeps that many consecutive rows together.

    Each rank plans locally with :func:`seqbalance.plan` (token capacity held, cost
    ``24576 L + L**2`` balanced), then one all-reduce agrees on the count and ranks below
    it re-plan with that many micro-batches.

    Returns
    -------
    (list of TensorDict, list of list of int)
        The micro-batches and, for each, the row indices it holds (ascending).
    """
    step = 1
    order = "light_ends" if use_dynamic_bsz_balance else "heaviest_first"
    g, n_groups = int(force_group_size), 0
    group_lens = group_work = np.zeros(0)

    def local(m: int) -> Any:
        return _local_plan(group_lens, group_work, max_token_len, m, step, order)

    # Bad input or a failed local plan is raised only after the count agreement below, so
    # that one rank's error does not leave the others waiting in the all-reduce.
    result, error = None, None
    try:
        step = int(num_batches_divided_by or 1)
        lens, width = _effective_lengths(batch)
        if max_token_len < width:
            raise CompatAssertionError(
                "max_token_len must be greater than the sequence length. "
                f"Got max_token_len={max_token_len} and max_seq_len={width}"
            )
        if g < 1 or lens.shape[0] % g:
            raise CompatAssertionError(
                f"Batch size {lens.shape[0]} must be divisible by force_group_size {g}"
            )
        n_groups = lens.shape[0] // g
        group_lens = lens.reshape(n_groups, g).sum(axis=1)
        group_work = calculate_workload(lens).reshape(n_groups, g).sum(axis=1)
        group_work = group_work.astype(np.float64)
        count = min(n_groups, ceildiv(int(lens.sum()), max_token_len))
        if min_num_micro_batch is not None:
            count = max(int(min_num_micro_batch), count)
        result = local(count)
    except Exception as exc:  # any type: raised after the count agreement, so no rank waits
        error = exc
    sync = dp_group is not None and same_micro_num_in_dp and _dist_ready()
    if sync:
        m_local = _FAILED if result is None else result.num_micro_batches
        m, fewest = _agree(dp_group, m_local, n_groups)
        if error is None and m >= _FAILED:
            raise ValueError("another rank of the DP group could not plan its micro-batches")
        if error is None and m > fewest:
            raise ValueError(
                "Cannot satisfy max_token_len while keeping forced groups atomic and using "
                f"the same micro-batch count across DP ranks: the group needs {m} non-empty "
                f"micro-batches, but a rank has only {fewest} forced groups."
            )
        if error is None and m > result.num_micro_batches:
            result = local(m)
    if error is not None:
        raise error
    groups_per_mb = _rebalance_work(result, group_lens, group_work, max_token_len, order)
    idx = [[i * g + r for i in mb for r in range(g)] for mb in groups_per_mb]
    return [_select(batch, p) for p in idx], idx


def _rebalance_work(
    p: Any, lens: np.ndarray, work: np.ndarray, cap: int, order: str
) -> list[list[int]]:
    """The plan's micro-batches, or a workload partition into as many if it fits the cap
    with a lighter heaviest micro-batch (with one rank the planner balances count first)."""
    mbs = [list(mb) for mb in p.micro_batches[0]]
    m = len(mbs)
    alt = [list(q) for q in partition(work, m)]
    heavy = max(float(work[mb].sum()) for mb in mbs)
    if all(alt) and all(int(lens[q].sum()) <= cap for q in alt):
        if max(float(work[q].sum()) for q in alt) < heavy:
            mbs = alt
    desc = sorted(mbs, key=lambda mb: (-float(work[mb].sum()), mb[:1]))
    return desc[::2][::-1] + desc[1::2] if order == "light_ends" else desc


def _local_plan(lens: Any, work: Any, cap: int, m: int, step: int, order: str) -> Any:
    return plan(
        lens, 1, cap, cost=work, min_micro_batches=max(m, 1), micro_batch_multiple=step,
        order=order, baselines=False,
    )  # fmt: skip


def micro_batches_of_lengths(
    seqlens: Any, max_token_len: int, min_num_micro_batch: int | None = None
) -> list[list[int]]:
    """The index lists :func:`rearrange_micro_batches` makes on one rank, from lengths alone
    (no tensors, no DP group): for benchmarks and for callers without a TensorDict."""
    lens = to_numpy(seqlens).astype(np.int64)
    count = min(lens.shape[0], ceildiv(int(lens.sum()), max_token_len))
    if min_num_micro_batch is not None:
        count = max(count, int(min_num_micro_batch))
    work = calculate_workload(lens).astype(np.float64)
    p = _local_plan(lens, work, max_token_len, count, 1, "light_ends")
    return _rebalance_work(p, lens, work, max_token_len, "light_ends")


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
    lens = to_numpy(seqlen_list).astype(np.int64)
    uids = to_python_list(uid_list)
    if len(uids) != lens.shape[0]:
        raise CompatAssertionError("seqlen_list and uid_list must have same length")
    n_groups = len(dict.fromkeys(uids))
    if n_groups < k_partitions:
        raise CompatAssertionError(
            f"Number of uid groups ({n_groups}) must be >= k_partitions ({k_partitions}). "
            "Consider reducing world_size or increasing batch_size."
        )
    if n_groups % k_partitions:
        raise CompatAssertionError(f"{n_groups} % {k_partitions} != 0")
    parts = partition(calculate_workload(lens), k_partitions, size="equal", groups=uids)
    return [list(p) for p in parts]


_patcher = Patcher(
    "verl.utils.seqlen_balancing",
    lambda: {
        name: globals()[name]
        for name in __all__
        if name not in ("patch", "unpatch", "micro_batches_of_lengths")
    },
)


def patch() -> list[str]:
    """Replace verl's balancing functions with these (in ``verl.utils.seqlen_balancing``
    and in every loaded module that imported them by name). Returns what was replaced."""
    return _patcher.patch()


def unpatch() -> None:
    """Undo :func:`patch`."""
    _patcher.unpatch()
