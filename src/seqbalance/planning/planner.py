"""``plan``: sequences -> data-parallel ranks x micro-batches under a token capacity.

How a plan is built (every step deterministic):

1. ``m``, the micro-batches per rank, starts at the capacity minimum
   ``ceil(total_tokens / (dp * max_tokens))`` (raised to ``min_micro_batches`` and to a
   multiple of ``micro_batch_multiple``) and grows only when packing fails.
2. Without a size rule or groups, all sequences are packed into ``dp * m`` bins of
   near-equal cost under the capacity (:mod:`seqbalance.planning._packing`; capacitated LPT, and
   first-fit decreasing as a second start on small inputs). The bins are sorted by cost and
   dealt out in slots of ``dp``: slot ``j`` is every rank's ``j``-th micro-batch, so bins of
   similar cost run side by side (what ``fsdp`` pays for), and inside a slot the heaviest
   bin goes to the rank with the least work so far (what ``ddp`` pays for). Under ``fsdp``,
   :mod:`seqbalance.planning._slots` then moves or swaps sequences from each slot's heaviest
   micro-batch into other slots' slack (a slot's cost is its heaviest micro-batch).
3. With a size rule or groups, ranks are chosen first with :func:`seqbalance.partition`
   (three candidates: balanced cost, balanced tokens, balanced counts; the rule honoured),
   then each rank's sequences are packed into ``m`` bins and ordered heaviest first, which
   lines slots up across ranks. Under ``ddp`` a cost-balanced rank-first plan is also tried
   without a rule.
4. Among the candidates, the plan with the fewest micro-batches wins, then the lowest
   simulated step time (``extra_micro_batches`` > 0: the lowest step time).

:func:`plan` reads as these steps: ``_validate_request`` checks every argument once (the
functions below it take validated arrays), ``_starting_micro_batches`` is step 1,
``_rank_splits`` chooses between steps 2 and 3 (``None`` for global packing, else fixed rank
contents), ``_search`` packs for the smallest feasible ``m``, and ``_pick`` is step 4.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import (
    as_groups,
    as_lengths,
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_positive_int,
)
from ..partitioning._rules import SIZES
from ..partitioning.kway import partition_arrays
from ._costing import sequence_costs
from ._grouping import bin_totals
from ._ordering import ORDERS, OVERSIZED, fixed_count_bins, order_grid
from ._packing import pack
from ._slots import fill_slack
from .plans import Plan, capacity_min_micro_batches
from .simulation import SYNC_MODELS, microbatch_costs, step_time_of

__all__ = ["SIZE_RULES", "plan"]

SIZE_RULES = SIZES


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _check_fits(lengths: np.ndarray, max_tokens: int) -> None:
    over = np.flatnonzero(lengths > max_tokens)
    if over.size:
        i = int(over[0])
        more = f" (and {over.size - 1} more)" if over.size > 1 else ""
        raise ValueError(
            f"sequence {i} has {int(lengths[i])} tokens, more than max_tokens={max_tokens}{more}; "
            "raise max_tokens, or split or truncate such sequences before planning"
        )


def _deal_slots(
    bins: list[list[int]], bin_cost: np.ndarray, dp: int, m: int
) -> list[list[list[int]]]:
    """Sorted bins -> slots of ``dp``; inside a slot the heaviest bin to the lightest rank."""
    order = np.lexsort((np.arange(bin_cost.size), -bin_cost))
    ranks: list[list[list[int]]] = [[] for _ in range(dp)]
    load = np.zeros(dp)
    rank_ids = np.arange(dp)
    for j in range(m):
        slot = order[j * dp : (j + 1) * dp]
        lightest = np.lexsort((rank_ids, load))
        for r, b in zip(lightest.tolist(), slot.tolist()):
            ranks[r].append(bins[b])
            load[r] += bin_cost[b]
    return ranks


_FFD_START_WORK = 5e7  # items x bins: above this, first-fit-decreasing as a second start is slow


def _step_time(
    grid: list[list[list[int]]], costs: np.ndarray, c0: float, padded: bool, sync: str
) -> float:
    return step_time_of(microbatch_costs(grid, costs, per_microbatch=c0, padded=padded), sync)


def _plan_global(
    lengths: np.ndarray,
    costs: np.ndarray,
    dp: int,
    m: int,
    cap: int,
    padded: bool,
    sync: str,
    c0: float,
) -> list[list[list[int]]] | None:
    starts = ["lpt"]
    if lengths.size * dp * m <= _FFD_START_WORK:
        starts.append("ffd")  # tighter packing sometimes lines slots up better
    best, best_time = None, np.inf
    for start in starts:
        bins = pack(costs, lengths, dp * m, cap, padded=padded, start=start)
        if bins is None:
            continue
        grid = _deal_slots(bins, bin_totals(bins, costs, padded=padded), dp, m)
        if sync == "fsdp" and not padded:
            grid = fill_slack(grid, costs, lengths, cap, max_steps=2 * dp * m + 100)
            bins = [mb for rank in grid for mb in rank]
            grid = _deal_slots(bins, bin_totals(bins, costs, padded=padded), dp, m)
        t = _step_time(grid, costs, c0, padded, sync)
        if t < best_time:
            best, best_time = grid, t
    return best


def _plan_by_rank(
    lengths: np.ndarray,
    costs: np.ndarray,
    rank_items: list[list[int]],
    m: int,
    cap: int,
    padded: bool,
) -> list[list[list[int]]] | None:
    out = []
    for items in rank_items:
        idx = np.asarray(items, dtype=np.int64)
        bins = pack(costs[idx], lengths[idx], m, cap, padded=padded)
        if bins is None:
            return None
        mbs = [idx[np.asarray(b, dtype=np.int64)].tolist() for b in bins]
        c = bin_totals(mbs, costs, padded=padded)
        out.append([mbs[b] for b in np.lexsort((np.arange(m), -c)).tolist()])
    return out


@dataclass(frozen=True)
class _Request:
    """The arguments of :func:`plan`, validated once; every step below trusts them."""

    lens: np.ndarray  # int64 lengths
    costs: np.ndarray  # float64 per-sequence costs
    c0: float  # per-micro-batch cost
    dp: int
    cap: int
    sync: str
    size: str
    groups: np.ndarray | None
    m_min: int
    mult: int
    padded: bool
    allow_empty: bool
    extra: int
    # plan(order=, oversized=, sequences_per_micro_batch=): see _ordering.py. With
    # oversized="alone", ``lens`` is clipped to the capacity for packing and ``true_lens``
    # keeps the real lengths for the Plan.
    order: str | None = None
    true_lens: np.ndarray | None = None
    per_mb: int | None = None

    def _with_options(self, order: Any, true_lens: Any, per_mb: Any) -> _Request:
        return dataclasses.replace(self, order=order, true_lens=true_lens, per_mb=per_mb)

    @property
    def n(self) -> int:
        return int(self.lens.shape[0])

    @property
    def rule(self) -> str:
        return f"size={self.size!r}" + (" and groups" if self.groups is not None else "")


def _validate_request(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    cost: Any,
    sync: str,
    size: str,
    groups: Any,
    min_micro_batches: int,
    micro_batch_multiple: int,
    padded: bool,
    allow_empty: bool,
    extra_micro_batches: int,
    order: str | None = None,
    oversized: str = "error",
    sequences_per_micro_batch: int | None = None,
) -> _Request:
    """Step 0: check every argument of :func:`plan` and resolve the costs."""
    lens = as_lengths(lengths)
    dp = check_positive_int(dp_size, "dp_size")
    cap = check_positive_int(max_tokens, "max_tokens")
    check_choice(sync, "sync", SYNC_MODELS)
    check_choice(size, "size", SIZE_RULES)
    m_min = check_positive_int(min_micro_batches, "min_micro_batches")
    mult = check_positive_int(micro_batch_multiple, "micro_batch_multiple")
    extra = check_nonnegative_int(extra_micro_batches, "extra_micro_batches")
    padded = check_bool(padded, "padded")
    allow_empty = check_bool(allow_empty, "allow_empty")
    group_ids = None if groups is None else as_groups(groups, lens.shape[0])
    costs, c0 = sequence_costs(lens, cost)
    if order is not None:
        check_choice(order, "order", ORDERS)
    per_mb = None
    if sequences_per_micro_batch is not None:
        per_mb = check_positive_int(sequences_per_micro_batch, "sequences_per_micro_batch")
        if size != "free" or group_ids is not None:
            raise ValueError(
                "sequences_per_micro_batch cannot be combined with a size rule or groups; "
                "drop one of them"
            )
    true_lens = None
    if check_choice(oversized, "oversized", OVERSIZED) == "alone":
        # A sequence above the capacity fills a micro-batch on its own: pack it as if it
        # held exactly max_tokens, and keep its real length (and cost) for the Plan.
        true_lens, lens = lens, np.minimum(lens, cap)
    _check_fits(lens, cap)
    return _Request(
        lens, costs, c0, dp, cap, sync, size, group_ids, m_min, mult, padded, allow_empty, extra
    )._with_options(order, true_lens, per_mb)


def _starting_micro_batches(req: _Request) -> tuple[int, list[str]]:
    """Step 1: the capacity minimum, raised to ``min_micro_batches`` and the multiple."""
    m_cap = capacity_min_micro_batches(req.lens, req.dp, req.cap)
    m = _round_up(max(m_cap, req.m_min), req.mult)
    notes = []
    if m > m_cap:
        why = []
        if req.m_min > m_cap:
            why.append(f"min_micro_batches={req.m_min}")
        if m > max(m_cap, req.m_min):
            why.append(f"rounded up to a multiple of micro_batch_multiple={req.mult}")
        notes.append(
            f"{m} micro-batches per rank where the capacity alone needs {m_cap}: "
            + " and ".join(why)
        )
    return m, notes


def _rank_splits(req: _Request) -> list[list[list[int]] | None]:
    """Step 2: how to reach ranks. ``None`` packs globally; a list fixes each rank's items."""
    if req.size != "free" or req.groups is not None:
        # Ranks balanced by cost can differ in tokens and so need more micro-batches; ranks
        # balanced by tokens may balance cost worse. Try each and keep the better plan.
        # Third candidate: equal sequence counts, for when a rank would hold too few
        # sequences to give every micro-batch one.
        splits: list[list[list[int]] | None] = []
        for weights in (req.costs, req.lens, np.ones(req.n)):
            w = np.asarray(weights, dtype=np.float64)
            parts = [list(p) for p in partition_arrays(w, req.dp, req.size, "auto", req.groups)]
            if parts not in splits:
                splits.append(parts)
        return splits
    if req.sync == "ddp":
        # DDP only sees rank totals: a direct partition of the costs may balance them more
        # finely than dealing out equal micro-batches does.
        return [None, [list(p) for p in partition_arrays(req.costs, req.dp, "free", "auto", None)]]
    return [None]


def _too_few(req: _Request, rank_items: list[list[int]] | None, m: int) -> str | None:
    """Why ``m`` micro-batches per rank cannot all hold a sequence, or None."""
    if rank_items is None:
        if req.n < req.dp * m:
            return f"{req.n} sequences cannot fill {req.dp} ranks x {m} micro-batches"
        return None
    short = [r for r, items in enumerate(rank_items) if len(items) < m]
    if short:
        r = short[0]
        return (
            f"under {req.rule}, rank {r} holds {len(rank_items[r])} sequences but needs "
            f"{m} micro-batches"
        )
    return None


def _why_more(req: _Request, rank_items: list[list[int]] | None, m: int, first_m: int) -> str:
    """The note for a plan that needed more micro-batches than the first count tried."""
    if rank_items is None:
        return (
            f"{m} micro-batches per rank: the packing heuristics found no way to fit the "
            f"sequences into {first_m} micro-batches of {req.cap} tokens per rank"
        )
    tokens = [int(req.lens[np.asarray(items, dtype=np.int64)].sum()) for items in rank_items]
    r = int(np.argmax(tokens))
    return (
        f"{m} micro-batches per rank: under {req.rule} rank {r} holds {tokens[r]} tokens, "
        f"which the packing heuristics did not fit into {first_m} micro-batches of {req.cap}"
    )


def _search(
    req: _Request, rank_items: list[list[int]] | None, first_m: int, notes: list[str]
) -> list[Plan] | str:
    """Step 3: plans for the smallest feasible m (and the extra ones asked for), or why not."""
    found: list[Plan] = []
    # One sequence per micro-batch always fits, so the search ends by this count.
    m_limit = max(first_m, _round_up(max(req.n, 1), req.mult)) + req.mult
    m = first_m
    while m <= m_limit:
        problem = _too_few(req, rank_items, m)
        if problem and not req.allow_empty:
            return problem
        if rank_items is None:
            mbs = _plan_global(
                req.lens, req.costs, req.dp, m, req.cap, req.padded, req.sync, req.c0
            )
        else:
            mbs = _plan_by_rank(req.lens, req.costs, rank_items, m, req.cap, req.padded)
        if mbs is not None:
            if found:
                extra = [
                    f"{m} micro-batches per rank, tried because extra_micro_batches="
                    f"{req.extra}; {found[0].num_micro_batches} would also fit"
                ]
            else:
                extra = [_why_more(req, rank_items, m, first_m)] if m > first_m else []
            empty = [(r, j) for r, rank in enumerate(mbs) for j, mb in enumerate(rank) if not mb]
            if empty:
                extra.append(
                    f"{len(empty)} empty micro-batches (allow_empty=True), first at {empty[0]}"
                )
            found.append(
                Plan._from_validated(
                    mbs,
                    req.lens if req.true_lens is None else req.true_lens,
                    max_tokens=req.cap,
                    costs=req.costs,
                    per_microbatch=req.c0,
                    padded=req.padded,
                    sync=req.sync,
                    strategy="seqbalance",
                    notes=notes + extra,
                    size=req.size,
                    groups=req.groups,
                )
            )
            if len(found) > req.extra:
                break
        m += req.mult
    return found


def _pick(req: _Request, candidates: list[Plan], problems: list[str], n_splits: int) -> Plan:
    """Step 4: fewest micro-batches, then the lowest simulated step time."""
    if not candidates:
        hedge = (
            " (for every rank split the planner tried; with groups or a size rule this search "
            "is heuristic)"
            if n_splits > 1
            else ""
        )
        raise ValueError(
            f"{problems[0] if problems else 'no plan found'}{hedge}; every micro-batch would "
            "need a sequence. Lower dp_size, min_micro_batches or micro_batch_multiple, raise "
            "max_tokens, or pass allow_empty=True to allow (marked) empty micro-batches"
        )

    def key(p: Plan) -> tuple[float, ...]:
        t = _step_time(p.micro_batches, req.costs, req.c0, req.padded, req.sync)
        # Fewest micro-batches first, unless the caller asked to trade them for time.
        return (t,) if req.extra else (p.num_micro_batches, t)

    return min(candidates, key=key)


def _fixed_count(req: _Request, first_m: int, notes: list[str]) -> Plan:
    """``sequences_per_micro_batch``: the fewest micro-batches of at most that many
    sequences (counts within one) that fit the capacity; bins balanced by cost."""
    per_mb = int(req.per_mb)  # type: ignore[arg-type]
    m = _round_up(max(first_m, -(-req.n // (req.dp * per_mb))), req.mult)
    start = m
    while True:
        if req.n < req.dp * m and not req.allow_empty:
            raise ValueError(
                f"{req.n} sequences cannot fill {req.dp} ranks x {m} micro-batches; lower "
                "dp_size, min_micro_batches or micro_batch_multiple, or pass allow_empty=True"
            )
        bins = fixed_count_bins(req.lens, req.costs, req.dp * m, per_mb, req.cap, req.padded)
        if not isinstance(bins, str):
            break
        m += req.mult
    if m > first_m:
        why = "to fit max_tokens" if m > start else "to hold them"
        notes = [
            *notes,
            f"{m} micro-batches per rank: {req.n} sequences at most "
            f"sequences_per_micro_batch={per_mb} per micro-batch, {why}",
        ]
    grid = _deal_slots(bins, bin_totals(bins, req.costs, padded=req.padded), req.dp, m)
    return _with_grid(req, grid, notes)


def _with_grid(req: _Request, grid: list[list[list[int]]], notes: Any) -> Plan:
    """A Plan of ``grid`` for this request, in the requested micro-batch order."""
    if req.order is not None:
        grid = order_grid(grid, req.costs, req.c0, req.padded, req.order)
    return Plan._from_validated(
        grid,
        req.lens if req.true_lens is None else req.true_lens,
        max_tokens=req.cap,
        costs=req.costs,
        per_microbatch=req.c0,
        padded=req.padded,
        sync=req.sync,
        strategy="seqbalance",
        notes=list(notes),
        size=req.size,
        groups=req.groups,
    )


def plan(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    *,
    cost: Any = None,
    sync: str = "fsdp",
    size: str = "free",
    groups: Any = None,
    min_micro_batches: int = 1,
    micro_batch_multiple: int = 1,
    padded: bool = False,
    allow_empty: bool = False,
    extra_micro_batches: int = 0,
    order: str | None = None,
    oversized: str = "error",
    sequences_per_micro_batch: int | None = None,
) -> Plan:
    """Plan which sequences every data-parallel rank runs, micro-batch by micro-batch.

    Parameters
    ----------
    lengths : array-like of int
        Tokens per sequence.
    dp_size : int
        Number of data-parallel ranks.
    max_tokens : int
        Token capacity of one micro-batch (packed: sum of lengths; ``padded=True``:
        count x longest).
    cost : optional
        What to balance: None (tokens), a cost model or anything
        :func:`seqbalance.costs.load_cost` accepts (model name, config path, cost JSON), or
        a 1-D array of per-sequence costs.
    sync : {"fsdp", "ddp"}
        How ranks synchronise; the plan minimises that model's simulated step time.
    size : {"free", "equal", "balanced"}
        Rule on the number of sequences (or groups) per rank, as in
        :func:`seqbalance.partition`.
    groups : array-like, optional
        Group id per sequence; a group never spans ranks (it may span micro-batches).
    min_micro_batches : int
        Fewest micro-batches per rank.
    micro_batch_multiple : int
        The micro-batch count must be a multiple of this (e.g. virtual pipeline stages).
    padded : bool
        Micro-batches are padded to their longest sequence.
    allow_empty : bool
        Allow empty micro-batches when there are too few sequences for ``dp * m`` of them;
        the plan marks them (``plan.violations()["empty"]`` and ``plan.notes``). Otherwise
        that case raises ValueError.
    extra_micro_batches : int
        Also try this many larger micro-batch counts (in steps of
        ``micro_batch_multiple``) and keep the plan with the lowest simulated step time.
        Useful when the cost model has a per-micro-batch term, which makes extra
        micro-batches cost something.
    order : {None, "heaviest_first", "light_ends", "index"}
        The order each rank runs its micro-batches in; None keeps the planner's own.
        ``"heaviest_first"`` and ``"light_ends"`` (lightest slots at both ends, the heaviest
        in the middle: short pipeline warm-up and cool-down) permute slots the same way on
        every rank, so the step time is unchanged; ``"index"`` sorts each rank's
        micro-batches by their first sequence index.
    oversized : {"error", "alone"}
        What a sequence longer than ``max_tokens`` does: raise ValueError (default), or run
        alone in its own micro-batch (it then breaks the capacity, and ``plan.notes`` and
        ``plan.violations()["over_capacity"]`` count it).
    sequences_per_micro_batch : int, optional
        Every micro-batch holds at most this many sequences and the counts differ by at
        most one; ``m`` is the smallest count that holds all sequences (and meets the
        capacity, ``min_micro_batches`` and the multiple). Not with ``size`` or ``groups``.

    Returns
    -------
    Plan
        Every rank has the same number ``m`` of micro-batches, no micro-batch exceeds
        ``max_tokens``, every index appears exactly once.

    Raises
    ------
    ValueError
        On bad arguments, a sequence longer than ``max_tokens``, too few sequences for
        non-empty micro-batches, or a size rule that cannot be met.

    Examples
    --------
    >>> p = plan([900, 100, 500, 500, 300, 700], dp_size=2, max_tokens=1000)
    >>> p.num_micro_batches
    2
    >>> sorted(len(mb) for rank in p.micro_batches for mb in rank)
    [1, 1, 2, 2]
    """
    req = _validate_request(
        lengths,
        dp_size,
        max_tokens,
        cost,
        sync,
        size,
        groups,
        min_micro_batches,
        micro_batch_multiple,
        padded,
        allow_empty,
        extra_micro_batches,
        order,
        oversized,
        sequences_per_micro_batch,
    )
    first_m, notes = _starting_micro_batches(req)
    if req.true_lens is not None and (req.true_lens > req.cap).any():
        over = np.flatnonzero(req.true_lens > req.cap)
        notes.append(
            f"{over.size} sequences longer than max_tokens={req.cap} run alone in their own "
            f"micro-batches (oversized='alone'), first at index {int(over[0])}"
        )
    if req.per_mb is not None:
        return _fixed_count(req, first_m, notes)
    splits = _rank_splits(req)
    candidates: list[Plan] = []
    problems: list[str] = []
    for rank_items in splits:
        found = _search(req, rank_items, first_m, notes)
        if isinstance(found, str):
            problems.append(found)
        else:
            candidates.extend(found)
    best = _pick(req, candidates, problems, len(splits))
    return best if req.order is None else _with_grid(req, best.micro_batches, best.notes)
