"""Drop-in for slime's balancing code, implemented on seqbalance.

Replaces three slime modules (the names, signatures, argument conventions and return types
are slime's):

- ``slime.utils.seqlen_balancing``: the partition helpers slime copied from verl
  (:func:`get_seqlen_balanced_partitions` and friends, shared with
  :mod:`seqbalance.compat.verl`), :func:`first_fit_pack` and
  :func:`expand_bins_by_splitting`.
- ``slime.utils.dp_schedule``: :func:`build_dp_schedule`, the per-rollout DP and
  micro-batch schedule.
- ``slime.utils.flops_utils``: :func:`calculate_fwd_flops` and its per-part helpers, from
  Megatron-style arguments.

Change the imports, or call :func:`patch` once before training (:func:`unpatch` undoes it).
What differs (caps always held, balanced ranks, fewer micro-batches) is listed in
``docs/migrating.md``.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..planning._packing import first_fit_opening
from . import verl as _verl
from ._core import framework_is_better, plan
from ._inputs import (
    CompatAssertionError,
    Patcher,
    check_index_lists,
    count_arg,
    patch_all,
    to_numpy,
    to_python_list,
    token_counts,
    unpatch_all,
)
from ._verl_kk import verl_equal_kk_labels

__all__ = [
    "build_dp_schedule",
    "calculate_attention_flops",
    "calculate_embedding_flops",
    "calculate_fwd_flops",
    "calculate_layer_flops",
    "calculate_lm_head_flops",
    "calculate_mlp_flops",
    "calculate_output_flops",
    "calculate_qkv_projection_flops",
    "expand_bins_by_splitting",
    "first_fit_pack",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "karmarkar_karp",
    "patch",
    "sequence_fwd_flops",
    "unpatch",
]

# slime's seqlen_balancing is verl's (an older copy): the same contracts.
karmarkar_karp = _verl.karmarkar_karp
greedy_partition = _verl.greedy_partition
get_seqlen_balanced_partitions = _verl.get_seqlen_balanced_partitions
get_reverse_idx = _verl.get_reverse_idx


# ---- FLOPs (slime.utils.flops_utils) --------------------------------------------------
#
# Every term is a * L + b * L**2 for a sequence of L tokens. The helpers below give one
# sequence's FLOPs (slime's per-part functions); sequence_fwd_flops evaluates the summed
# coefficients on an array at once.


def _mla(args: Any) -> bool:
    return bool(getattr(args, "multi_latent_attention", False))


def calculate_embedding_flops(seqlen: Any, hidden_size: Any) -> Any:
    """FLOPs of the embedding lookup as slime counts it: ``2 L h``."""
    return 2 * seqlen * hidden_size


def calculate_lm_head_flops(seqlen: Any, hidden_size: Any, vocab_size: Any) -> Any:
    """Output projection to the vocabulary: ``2 L h V``."""
    return 2 * seqlen * hidden_size * vocab_size


def _qkv_per_token(args: Any, hidden: Any, heads: Any, groups: Any) -> Any:
    """Q and K/V projection FLOPs per token (low-rank forms under multi-latent attention)."""
    mla = _mla(args)
    if mla and args.q_lora_rank is not None:
        q_dim = args.qk_head_dim + args.qk_pos_emb_head_dim
        q = 2 * args.q_lora_rank * (args.hidden_size + args.num_attention_heads * q_dim)
    else:
        head = args.qk_head_dim + args.qk_pos_emb_head_dim if mla else args.kv_channels
        q = 2 * hidden * heads * head
    if mla and args.kv_lora_rank is not None:
        up = args.num_attention_heads * (args.qk_head_dim + args.v_head_dim)
        kv = 2 * (args.kv_lora_rank * (args.hidden_size + up)
                  + args.hidden_size * args.qk_pos_emb_head_dim)  # fmt: skip
    else:
        kv = 4 * hidden * groups * args.kv_channels  # K and V
    return q + kv


def calculate_qkv_projection_flops(
    args: Any, seqlen: Any, hidden_size: Any, num_attention_heads: Any, num_query_groups: Any
) -> Any:
    """Q, K and V projections of one layer for ``seqlen`` tokens."""
    return seqlen * _qkv_per_token(args, hidden_size, num_attention_heads, num_query_groups)


def _attention_per_token_squared(args: Any, heads: Any) -> Any:
    """Causal ``Q K^T`` (half the score matrix, 2 FLOPs a product) plus ``A V``, per L**2."""
    if _mla(args):
        return heads * (args.qk_head_dim + args.qk_pos_emb_head_dim) + heads * args.v_head_dim
    return 2 * heads * args.kv_channels


def calculate_attention_flops(args: Any, seqlen: Any, num_attention_heads: Any) -> Any:
    """Score and value products of one layer (causal). Like slime's: a float for an
    integer ``seqlen``, and elementwise (float) for a numpy array or a torch tensor."""
    # Floats first (true division, as slime's "/ 2": a float, a float64 array or a float
    # tensor), so int32 lengths do not wrap when squared.
    return seqlen / 1 * seqlen * _attention_per_token_squared(args, num_attention_heads)


def calculate_output_flops(seqlen: Any, hidden_size: Any) -> Any:
    """Attention output projection: ``2 L h**2``."""
    return 2 * seqlen * hidden_size * hidden_size


def calculate_mlp_flops(seqlen: Any, hidden_size: Any, ffn_hidden_size: Any) -> Any:
    """Gated MLP (three matrices): ``6 L h f``."""
    return 6 * seqlen * hidden_size * ffn_hidden_size


def calculate_layer_flops(
    args: Any,
    seqlen: Any,
    hidden_size: Any,
    num_attention_heads: Any,
    num_query_groups: Any,
    ffn_hidden_size: Any,
) -> Any:
    """One transformer layer: projections, attention, output projection and MLP (a float,
    or elementwise over an array or tensor ``seqlen``, as slime's)."""
    return (
        calculate_qkv_projection_flops(
            args, seqlen, hidden_size, num_attention_heads, num_query_groups
        )
        + calculate_attention_flops(args, seqlen, num_attention_heads)
        + calculate_output_flops(seqlen, hidden_size)
        + calculate_mlp_flops(seqlen, hidden_size, ffn_hidden_size)
    )


def _layer_counts(args: Any) -> tuple[int, int, Any]:
    """(dense layers, MoE layers, active FFN width of a MoE layer) from Megatron args."""
    if args.num_experts is None:
        return int(args.num_layers), 0, 0
    shared = getattr(args, "moe_shared_expert_intermediate_size", None) or 0
    moe_ffn = args.moe_ffn_hidden_size * args.moe_router_topk + shared
    if not hasattr(args, "moe_layer_freq"):
        return 0, int(args.num_layers), moe_ffn
    freq = args.moe_layer_freq
    if isinstance(freq, list):  # a 0/1 pattern, one entry per layer
        moe = sum(1 for f in freq if f > 0)
        return sum(1 for f in freq if f == 0), moe, moe_ffn
    moe = sum(1 for i in range(args.num_layers) if i % freq == 0)  # every freq-th layer
    return int(args.num_layers) - moe, moe, moe_ffn


def _coefficients(args: Any) -> tuple[int, int]:
    """(linear, quadratic) integer coefficients: FLOPs(L) = lin * L + quad * L**2."""
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    dense, moe, moe_ffn = _layer_counts(args)
    per_layer = _qkv_per_token(args, h, heads, groups) + 2 * h * h  # width-free part
    # As slime, the dense width is read only where dense layers exist (all-MoE configs
    # may leave ffn_hidden_size None).
    dense_mlp = dense * args.ffn_hidden_size if dense else 0
    lin = (dense + moe) * per_layer + 6 * h * (dense_mlp + moe * moe_ffn)
    lin += 2 * h * args.vocab_size  # LM head
    quad = (dense + moe) * _attention_per_token_squared(args, heads)
    return int(lin), int(quad)


def sequence_fwd_flops(seqlens: Any, args: Any) -> np.ndarray:
    """Forward FLOPs of each sequence (float64 array): ``calculate_fwd_flops([L], args)``
    for every ``L`` at once, the per-sample weights of :func:`build_dp_schedule`.
    ValueError for a negative, fractional or absurdly large length."""
    x = token_counts(seqlens, "seqlens").astype(np.float64)
    lin, quad = _coefficients(args)
    return lin * x + quad * x * x


def calculate_fwd_flops(seqlens: Any, args: Any) -> float:
    """Total forward FLOPs of ``seqlens`` (a list of sequence lengths) for the model that
    Megatron-style ``args`` describe (dense, MoE with ``moe_layer_freq``, multi-latent
    attention). Evaluated exactly in integers, returned as a float (0 for no sequences).
    ValueError for a negative, fractional or absurdly large length.
    """
    lens = token_counts(seqlens, "seqlens").reshape(-1).tolist()  # whole, >= 0
    if not lens:
        return 0
    lin, quad = _coefficients(args)
    return float(lin * sum(lens) + quad * sum(s * s for s in lens))


# ---- packing (slime.utils.seqlen_balancing) -------------------------------------------


def _lengths(values: Any, name: str) -> np.ndarray:
    x = to_numpy(values)
    if x.ndim != 1:
        raise CompatAssertionError(f"{name} must be 1-D, got shape {x.shape}")
    return token_counts(x, name)


def first_fit_pack(total_lengths: Any, max_tokens_per_bin: int) -> list[list[int]]:
    """Pack sample indices into bins of at most ``max_tokens_per_bin`` tokens.

    As slime's: every bin holds ``<= max_tokens_per_bin`` tokens except that a sample
    longer than that sits alone in its own bin; bins come in index order (by their first
    index), each ascending. Unlike first fit, the bin count is seqbalance's smallest
    feasible one and the bins are balanced by tokens.
    """
    lens = _lengths(total_lengths, "total_lengths")
    cap = count_arg(max_tokens_per_bin, "max_tokens_per_bin")
    if lens.shape[0] == 0:
        return []
    p = plan(lens, 1, cap, oversized="alone", order="index", baselines=False)
    bins = [list(mb) for mb in p.micro_batches[0]]
    # The planner lets an empty sample share an oversized one's micro-batch where every
    # micro-batch holds one (it never adds a micro-batch for no tokens); slime's contract
    # is "alone", so such samples get a bin of their own here, as first fit gives them.
    sharers = _sharers([bins], lens, cap)
    if sharers:
        moved = set(sharers)
        bins = [[i for i in b if i not in moved] for b in bins] + [sharers]
        bins.sort(key=lambda b: b[0])
    return bins


def expand_bins_by_splitting(bins: list[list[int]], target_count: int, lengths: Any) -> None:
    """Grow ``bins`` in place to ``target_count`` bins, none heavier than the heaviest
    multi-sample bin given (so bins that held the cap still do, and a sample above it stays
    alone), bins in index order.

    The items are re-planned into token-balanced bins under that bound (slime halves the
    heaviest bin again and again). With too few items every item ends alone in its own
    bin, as in slime; with no multi-sample bin there is nothing to split.
    """
    target_count = count_arg(target_count, "target_count", minimum=0)
    if len(bins) >= target_count:
        return
    lens = _lengths(lengths, "lengths")
    check_index_lists(bins, lens.shape[0], "bins", part="bin", distinct=True)
    multi = [b for b in bins if len(b) > 1]
    if not multi:
        return
    bound = max(int(lens[b].sum()) for b in multi)
    alone = [list(b) for b in bins if len(b) == 1 and lens[b[0]] > bound]
    rest = sorted(i for b in bins if not (len(b) == 1 and lens[b[0]] > bound) for i in b)
    k = int(target_count) - len(alone)
    if len(rest) <= k:
        new = [[i] for i in rest]
    else:
        p = plan(lens[rest], 1, max(bound, 1), min_micro_batches=k, order="index",
                 baselines=False)
        new = [[rest[j] for j in mb] for mb in p.micro_batches[0]]
    bins[:] = sorted(alone + new, key=lambda b: b[0])


# ---- DP schedule (slime.utils.dp_schedule) --------------------------------------------


def _rollout_steps(ids: list[Any], global_batch_size: int) -> list[list[int]]:
    """Sample positions of each training step: rollouts in first-seen order, their samples
    kept together, ``global_batch_size`` rollouts a step, trailing rollouts dropped.
    ``ids``: one rollout id per sample, a plain list (:func:`to_python_list`)."""
    by_rollout: dict[Any, list[int]] = {}
    # As slime, ids as given (a list keeps 1 and "1" apart, and tuples hashable; numpy
    # would merge the first and split the second).
    for pos, rid in enumerate(ids):
        by_rollout.setdefault(rid, []).append(pos)
    rollouts = list(by_rollout.values())
    steps = len(rollouts) // global_batch_size
    if steps < 1:
        raise CompatAssertionError(
            f"num_rollouts ({len(rollouts)}) < global_batch_size ({global_batch_size}); "
            "need at least one rollout per step."
        )
    return [
        [pos for r in rollouts[s * global_batch_size : (s + 1) * global_batch_size] for pos in r]
        for s in range(steps)
    ]


def _step_plan(
    step: int, lens: np.ndarray, cost: Any, args: Any, dp: int, cap: int | None, group: int
) -> Any:
    """One step's plan: ``dp`` ranks with equal micro-batch counts, a multiple of ``group``."""
    n = lens.shape[0]
    if n < dp:
        raise CompatAssertionError(
            f"step {step}: {n} samples < dp_size {dp}; each step needs at least one sample "
            "per rank."
        )
    if cap is not None:  # dynamic batch size: token cap, oversized samples alone
        if n < dp * group:
            raise CompatAssertionError(
                f"dynamic path: could only produce {n} mbs; need {dp * group}. step {step} "
                f"has {n} samples, below the alignment threshold ({dp * group})."
            )
        try:
            return plan(lens, dp, cap, cost=cost, sync="ddp", micro_batch_multiple=group,
                        oversized="alone", order="index", baselines=False)  # fmt: skip
        except ValueError as exc:  # too few samples for a count that is a multiple of the group
            raise CompatAssertionError(
                f"dynamic path: step {step} has {n} samples, too few for {dp} ranks x a "
                f"multiple of {group} micro-batches under the token cap ({exc})"
            ) from exc
    if getattr(args, "micro_batch_size", None) is None:  # slime asserts
        raise CompatAssertionError("micro_batch_size must be set without dynamic batch size")
    per_mb = count_arg(args.micro_batch_size, "micro_batch_size")
    k = -(-n // per_mb)
    if k % (dp * group):
        raise CompatAssertionError(
            f"static path: num_mbs ({k}) is not a multiple of dp_size * mb_group "
            f"({dp * group}); got step_size={n}, micro_batch_size={per_mb}, dp_size={dp}, "
            f"mb_group={group}. Adjust the config so step_size % (dp_size * "
            "micro_batch_size * mb_group) == 0."
        )
    return plan(lens, dp, max(int(lens.sum()), 1), cost=cost, sync="ddp",
                min_micro_batches=k // dp, micro_batch_multiple=group,
                sequences_per_micro_batch=per_mb, order="index", baselines=False)  # fmt: skip


def _slime_first_fit(lens: np.ndarray, cap: int) -> list[list[int]]:
    """slime's first fit: each sample, in index order, into the first bin with room.

    slime scans the bins one by one: O(samples x bins) Python, 0.07-0.33 s on 8,192
    samples. Here ``best[t]`` is the largest room among bins ``0..t``; it never decreases
    along ``t``, so the first bin with room for ``x`` is where a bisection puts ``x``. A
    bin that takes a sample mends ``best`` from itself up to the first bin where it no
    longer changes: 2-8 ms on 8,192 samples of the standard workloads and of uniform,
    lognormal or bimodal lengths. An early bin with more room than all later ones that
    keeps taking small samples makes every mend walk to the end; past a budget of
    ``_WALK_BUDGET`` steps a sample, the pass restarts on a max-tree (:func:`_first_fit_tree`,
    ~6 ms on 8,192 samples, O(log bins) a sample; 11-13 ms with the aborted pass). Both
    give slime's bins exactly.
    """
    room: list[int] = []
    best: list[int] = []
    bins: list[list[int]] = []
    budget = _WALK_BUDGET * len(lens)
    for i, x in enumerate(lens.tolist()):
        j = bisect.bisect_left(best, x)
        if j == len(best):  # no bin has room: a new one (an oversized sample's has none)
            r = cap - x
            room.append(r)
            best.append(r if not best or r > best[-1] else best[-1])
            bins.append([i])
            continue
        bins[j].append(i)
        room[j] -= x
        top = best[j - 1] if j else room[j]
        for t in range(j, len(best)):
            if room[t] > top:
                top = room[t]
            if best[t] == top:
                break
            best[t] = top
        budget -= t - j
        if budget < 0:
            return _first_fit_tree(lens, cap)
    return bins


#: Mending steps per sample that :func:`_slime_first_fit` allows before it switches to the
#: max-tree (deterministic: a count, not a time).
_WALK_BUDGET = 16


def _first_fit_tree(lens: np.ndarray, cap: int) -> list[list[int]]:
    """slime's first fit on the core's max-tree of bin rooms (a sample above the cap opens
    a bin of its own, as in slime)."""
    return first_fit_opening(range(len(lens)), lens, cap)


def _slime_expand(bins: list[list[int]], target: int, lens: np.ndarray) -> None:
    """slime's growth to ``target`` bins: split the heaviest multi-sample bin (ties: the
    last) into two halves, longest samples first, each to the lighter half (ties: first)."""
    x = lens.tolist()
    sums = [sum(x[i] for i in b) for b in bins]
    while len(bins) < target:
        multi = [(sums[j], j) for j, b in enumerate(bins) if len(b) > 1]
        if not multi:
            return
        _, j = max(multi)
        halves: list[list[int]] = [[], []]
        half = [0, 0]
        for i in sorted(bins[j], key=lambda i: -x[i]):
            h = 0 if half[0] <= half[1] else 1
            halves[h].append(i)
            half[h] += x[i]
        bins[j], sums[j] = halves[0], half[0]
        bins.append(halves[1])
        sums.append(half[1])


def _slime_grid(
    lens: np.ndarray, cost: Any, args: Any, dp: int, cap: int | None, group: int
) -> list[list[list[int]]] | None:
    """slime's own schedule of one step (reproduced) as ``grid[rank][mb]``, or None where
    it is not a valid answer here (``balance_by_flops`` ignores the cap; slime would
    raise; an empty micro-batch). 3-13 ms on 8,192 samples."""
    n, align = lens.shape[0], dp * group
    if cap is not None:
        if getattr(args, "balance_by_flops", False):
            return None
        bins = _slime_first_fit(lens, cap)
        _slime_expand(bins, max(-(-len(bins) // align) * align, align), lens)
        # Splitting a bin of empty samples can leave slime an empty micro-batch, which
        # the drop-in never returns.
        if len(bins) % align or not all(bins):
            return None
    else:
        per = int(args.micro_batch_size)
        bins = [list(range(i, min(i + per, n))) for i in range(0, n, per)]
        if len(bins) % align:
            return None
    if getattr(args, "balance_data", False):  # KK of whole bins over ranks, by FLOPs
        c = np.asarray(cost, dtype=np.float64).tolist()
        w = np.array([sum(c[i] for i in b) for b in bins])  # slime's sums, in its order
        labels = verl_equal_kk_labels(w, dp)
        return [[bins[j] for j in np.flatnonzero(labels == r)] for r in range(dp)]
    return [[bins[j] for j in range(r, len(bins), dp)] for r in range(dp)]


def _no_worse_than_slime(
    grid: Any, theirs: list[list[list[int]]] | None, lens: np.ndarray, cost: Any
) -> Any:
    """``theirs`` (in the drop-in's layout: micro-batches by first index, indices
    ascending) where it has fewer micro-batches per rank than ``grid``, or as many and a
    lighter heaviest rank (by FLOPs, or tokens without ``balance_data``); else ``grid``."""
    if theirs is None:
        return grid
    w = lens.astype(np.float64) if cost is None else np.asarray(cost, dtype=np.float64)

    def flat(g: Any) -> list[list[int]]:
        return [[i for mb in rank for i in mb] for rank in g]

    if framework_is_better(flat(theirs), flat(grid), w, (len(theirs[0]), len(grid[0]))):
        return [sorted((sorted(mb) for mb in rank), key=lambda mb: mb[0]) for rank in theirs]
    return grid


def _oversized_alone(
    p: Any, lens: np.ndarray, cost: Any, dp: int, cap: int, group: int
) -> Any:
    """The micro-batches of the dynamic plan ``p`` with every oversized sample alone where
    the samples allow: empty samples beside one move elsewhere
    (:func:`_empty_sharers_moved`); where every micro-batch holds an oversized sample,
    ranks get ``group`` more micro-batches (slime's first fit opens a bin for them too)
    until one is free. Where the samples are too few for that, they stay beside it (no
    tokens added); slime then returns empty micro-batches or raises."""
    grid = _empty_sharers_moved(p.micro_batches, lens, cap)
    while _sharers(grid, lens, cap):
        m = len(grid[0]) + group
        if lens.shape[0] < dp * m:  # every micro-batch needs a sample
            return grid
        p = plan(lens, dp, cap, cost=cost, sync="ddp", min_micro_batches=m,
                 micro_batch_multiple=group, oversized="alone", order="index",
                 baselines=False)  # fmt: skip
        grid = _empty_sharers_moved(p.micro_batches, lens, cap)
    return grid


def _sharers(grid: Any, lens: np.ndarray, cap: int) -> list[int]:
    """Samples within ``cap`` in a micro-batch that holds a sample above it (empty ones:
    the planner counts an oversized sample as ``cap`` tokens, so nothing else fits)."""
    if lens.all() or not (lens > cap).any():  # the usual step: no empty or no oversized one
        return []
    out = [
        i for rank in grid for mb in rank if len(mb) > 1 and lens[mb].max() > cap
        for i in mb if lens[i] <= cap
    ]  # fmt: skip
    if lens[out].any():
        raise AssertionError(f"samples with tokens beside an oversized one: {out}")
    return out


def _empty_sharers_moved(grid: Any, lens: np.ndarray, cap: int) -> Any:
    """``grid`` with every empty sample that shares an oversized sample's micro-batch
    moved to the micro-batch, on any rank, with the fewest tokens among those without an
    oversized sample (ties: lowest rank, then first), so oversized samples run alone as
    slime's contract says. The planner keeps such samples on their rank, where every
    micro-batch holds an oversized one; an empty sample adds no tokens and no FLOPs, so
    moving it changes no load. Left where no micro-batch anywhere is free of oversized
    samples."""
    sharers = _sharers(grid, lens, cap)
    if not sharers:
        return grid
    free = [(int(lens[mb].sum()), r, j) for r, rank in enumerate(grid)
            for j, mb in enumerate(rank) if lens[mb].max() <= cap]  # fmt: skip
    if not free:
        return grid
    _, r, j = min(free)
    moved = set(sharers)
    out = [[[i for i in mb if i not in moved] for mb in rank] for rank in grid]
    out[r][j] = sorted(out[r][j] + sharers)
    return [sorted(rank, key=lambda mb: mb[0]) for rank in out]


def _heaviest_rank_first(grid: Any, lens: np.ndarray, cost: Any) -> list[Any]:
    """Ranks by descending load (ties: smallest sample index first), slime's rank order
    (its partitions come heaviest first); relabelling ranks leaves the step time alone."""
    w = lens.astype(np.float64) if cost is None else cost
    big = lens.shape[0]

    def key(rank: Any) -> tuple[float, int]:
        items = [i for mb in rank for i in mb]
        return (-float(w[items].sum()) if items else 0.0, min(items, default=big))

    return sorted(grid, key=key)


def build_dp_schedule(
    args: Any,
    train_parallel_config: dict[str, Any],
    total_lengths: Any,
    *,
    global_batch_size: int,
    rollout_indices: Any,
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """Per-rank samples and micro-batch schedule for one rollout, slime's contract.

    Parameters
    ----------
    args : namespace
        ``use_dynamic_batch_size``, ``max_tokens_per_gpu`` (dynamic), ``micro_batch_size``
        (static), ``balance_data`` and ``balance_by_flops`` (balance FLOPs rather than
        tokens), and the model fields :func:`calculate_fwd_flops` reads.
    train_parallel_config : dict
        ``dp_size``, ``cp_size``, ``vpp_size``, ``microbatch_group_size_per_vp_stage``.
    total_lengths : list of int
        Tokens per sample, indexed globally.
    global_batch_size : int
        Rollouts (not samples) per training step; trailing rollouts that do not fill a
        step are dropped. Samples of one rollout stay in one step.
    rollout_indices : list
        Rollout id of each sample.

    Returns
    -------
    (partitions, micro_batch_indices, num_microbatches, global_batch_sizes)
        ``partitions[r]``: global sample indices rank ``r`` runs, micro-batch after
        micro-batch; ``micro_batch_indices[r]``: each micro-batch as consecutive positions
        into ``partitions[r]``; ``num_microbatches[s]``: micro-batches per rank in step
        ``s`` (the same on every rank, a multiple of the micro-batch group under virtual
        pipelining); ``global_batch_sizes[s] = global_batch_size``.

    Each step is one :func:`seqbalance.plan` over all ranks: dynamic batches hold
    ``max_tokens_per_gpu * cp_size`` tokens (a longer sample runs alone), static batches
    hold at most ``micro_batch_size`` samples; ranks are balanced by FLOPs when
    ``balance_data`` or ``balance_by_flops`` is set, by tokens otherwise. Micro-batches
    run in index order.
    """
    tp = train_parallel_config
    dp, cp = count_arg(tp["dp_size"], "dp_size"), count_arg(tp["cp_size"], "cp_size")
    vpp = count_arg(tp["vpp_size"], "vpp_size")
    group = 1
    if vpp > 1:
        group = count_arg(tp["microbatch_group_size_per_vp_stage"],
                          "microbatch_group_size_per_vp_stage")  # fmt: skip
    global_batch_size = count_arg(global_batch_size, "global_batch_size")
    cap = None
    if args.use_dynamic_batch_size:
        if args.max_tokens_per_gpu is None:
            raise CompatAssertionError("use_dynamic_batch_size needs max_tokens_per_gpu")
        cap = count_arg(args.max_tokens_per_gpu, "max_tokens_per_gpu") * cp
    lens_all = _lengths(total_lengths, "total_lengths")
    ids = to_python_list(rollout_indices)
    if len(ids) != lens_all.shape[0]:  # slime would drop (or index past) the samples left over
        raise CompatAssertionError(
            f"rollout_indices has {len(ids)} entries for {lens_all.shape[0]} samples in "
            "total_lengths; give every sample its rollout id"
        )
    by_flops = bool(getattr(args, "balance_data", False)) or bool(
        getattr(args, "balance_by_flops", False)
    )

    partitions: list[list[int]] = [[] for _ in range(dp)]
    mb_indices: list[list[list[int]]] = [[] for _ in range(dp)]
    counts: list[int] = []
    for s, positions in enumerate(_rollout_steps(ids, global_batch_size)):
        lens = lens_all[positions]
        cost = sequence_fwd_flops(lens, args) if by_flops else None
        p = _step_plan(s, lens, cost, args, dp, cap, group)
        mine = p.micro_batches if cap is None else _oversized_alone(p, lens, cost, dp, cap, group)
        grid = _no_worse_than_slime(
            mine, _slime_grid(lens, cost, args, dp, cap, group), lens, cost
        )
        counts.append(len(grid[0]))
        for r, rank in enumerate(_heaviest_rank_first(grid, lens, cost)):
            for mb in rank:
                start = len(partitions[r])
                partitions[r].extend(positions[j] for j in mb)
                mb_indices[r].append(list(range(start, start + len(mb))))
    return partitions, mb_indices, counts, [global_batch_size] * len(counts)


# ---- patching ---------------------------------------------------------------------------

_FLOPS = [n for n in __all__ if n.startswith("calculate_")]
_SEQLEN = (
    "karmarkar_karp", "greedy_partition", "get_seqlen_balanced_partitions",
    "first_fit_pack", "expand_bins_by_splitting", "get_reverse_idx",
)  # fmt: skip
_patchers = [
    Patcher("slime.utils.seqlen_balancing", lambda: {n: globals()[n] for n in _SEQLEN}),
    Patcher("slime.utils.flops_utils", lambda: {n: globals()[n] for n in _FLOPS}),
    Patcher("slime.utils.dp_schedule", lambda: {"build_dp_schedule": build_dp_schedule}),
]


def patch() -> list[str]:
    """Replace slime's functions in ``slime.utils.seqlen_balancing``, ``.flops_utils`` and
    ``.dp_schedule`` (those importable) and wherever they were imported by name. Returns
    what was replaced; ImportError if none of the three modules can be imported."""
    return patch_all(_patchers, "slime")


def unpatch() -> None:
    """Undo :func:`patch`."""
    unpatch_all(_patchers)
