"""``plan``: sequences -> data-parallel ranks x micro-batches under a token capacity.

How a plan is built (every step deterministic):

1. ``m``, the micro-batches per rank, starts at the capacity minimum
   ``ceil(total_tokens / (dp * max_tokens))`` (raised to ``min_micro_batches`` and to a
   multiple of ``micro_batch_multiple``) and grows only when packing fails.
2. Without a size rule or groups, all sequences are packed into ``dp * m`` bins of
   near-equal cost under the capacity (:mod:`seqbalance.planning._packing`; capacitated LPT, and
   first-fit decreasing as a second start on small inputs; under ``fsdp`` with two or
   more ranks also first-fit decreasing left unbalanced, bins filled to the cap). The bins
   are sorted by cost and dealt out in slots of ``dp``: slot ``j`` is every rank's ``j``-th
   micro-batch, so bins of similar cost run side by side (what ``fsdp`` pays for), and
   inside a slot the heaviest bin goes to the rank with the least work so far (what ``ddp``
   pays for). Under ``fsdp``, :mod:`seqbalance.planning._slots` then moves or swaps
   sequences from each slot's heaviest micro-batch into other slots' slack (a slot's cost
   is its heaviest micro-batch). Also under ``fsdp`` (two or more ranks, free size, no
   groups), ranks split by tokens and by cost, each filled first-fit decreasing to the cap
   at the best count so far, are candidates: full micro-batches line up across ranks where
   big sequences keep evened-out bins apart.
3. With a size rule or groups, ranks are chosen first with :func:`seqbalance.partition`
   (three candidates: balanced cost, balanced tokens, balanced counts; the rule honoured),
   then each rank's sequences are packed into ``m`` bins and ordered heaviest first, which
   lines slots up across ranks (under ``ddp`` the bins inside a rank are not evened out:
   only the rank's total counts). Under ``ddp`` a cost-balanced rank-first plan is also
   tried without a rule, and tried first: when it packs into the smallest count ``m`` of
   step 1 and its busiest rank is at the partition lower bound (within ``AUTO_RTOL``,
   where "auto" partitions stop on float costs), no plan can be faster, so the global
   packing of step 2 and the exchange of step 5 are skipped.
4. Among the candidates, the plan with the fewest micro-batches wins, then the lowest
   simulated step time (``extra_micro_batches`` > 0: the lowest step time). Under
   ``fsdp`` (packed, no pipeline) the candidates that might still win by more than
   ``_LEVEL_MIN_GAIN`` first get every rank's micro-batches re-chosen toward the slot
   levels (:func:`seqbalance.planning._slots.fill_to_levels`).
5. Under ``ddp`` (no groups, not padded) sequences are then exchanged between micro-batches
   of the busiest rank and the lightest ones while that lowers the busiest rank and every
   micro-batch stays within the capacity (:mod:`seqbalance.planning._exchange`): with
   nearly full micro-batches, dealing whole bins to ranks leaves little freedom.

With ``pp_size > 1`` the simulated pipeline step decides instead, every packing compared in
the best of the baseline run orders; the chosen plan's order is then searched to minimise
that step (:func:`seqbalance.planning.pipeline_plans.finish_plan`). For at most 1,024
sequences in at most 4,096 micro-batches (all ranks) the plan made without the pipeline is
a candidate too, so the pipelined plan is never slower than it run through the same
pipeline.

:func:`plan` reads as these steps: ``_validate_request`` checks every argument once (the
functions below it take validated arrays), ``_starting_micro_batches`` is step 1,
``_rank_splits`` chooses between steps 2 and 3 (``None`` for global packing, else fixed rank
contents), ``_search`` packs for the smallest feasible ``m``, ``_full_rank_candidates``
and ``_pipeline_candidates`` (the baselines) add candidates, and ``_pick`` is step 4.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, cast

import numpy as np

from .._notes import Note, NotedError, as_note, as_text, term
from .._validate import (
    ArgumentError,
    as_groups,
    as_lengths,
    check_bool,
    check_choice,
    check_max_tokens,
    check_nonnegative_int,
    check_positive_int,
    too_long,
)
from ..partitioning._rules import SIZES
from ..partitioning.bounds import lower_bound
from ..partitioning.kway import AUTO_RTOL, partition_arrays
from ..partitioning.searches import exact_searches_unless_chosen, exact_work_pool
from ._capacity_greedy import ddp_greedy, fsdp_greedy
from ._costing import sequence_costs
from ._count_notes import count_raised, without_raised_to
from ._effort import Effort, effort_of, exact_pool
from ._exact import pack_ranked_exact
from ._exchange import exchange_between_ranks
from ._fitting import EXACT_MAX_ITEMS, fit_by_partition, fit_exact
from ._grouping import bin_totals
from ._ordering import (
    ORDERS,
    OVERSIZED,
    fixed_count_bins,
    order_grid,
    separate_oversized,
    shares_oversized,
)
from ._packed_slot import packed_slot_bound
from ._packing import ffd_failed, first_fit_parts, pack
from ._pair_split import resplit_pairs
from ._pipelines import verl_micro_batches
from ._ranks import repartition_pairs
from ._slot_balance import balance_slots
from ._slot_first import slot_first
from ._slots import fill_slack, fill_to_levels, too_big_to_refill
from ._work import (
    COUNT_WORK,
    candidates_spent,
    charge,
    counts_spent,
    remembered,
    remembered_search,
    spent,
    work_meter,
)
from .baselines import (
    BASELINE_GRIDS,
    BASELINE_STAGES,
    BASELINES,
    UNCAPPED_STAGES,
    _equalize,
)
from .bounds import (
    _step_bound_terms,
    capacity_step_bound,
    fsdp_slot_bound,
    min_bins,
    min_micro_batches,
    min_padded_bins,
    rank_token_bound,
)
from .context_parallel import cost_without_cp, plan_cp_spec
from .cp_plans import CPPlan
from .limits import check_counts, check_mesh, check_slots
from .pipeline_orders import largest_first
from .pipeline_plans import (
    PipelineSetup,
    finish_plan,
    pipeline_setup,
    pipeline_step_time,
)
from .pipeline_plans import (
    order_grid as pipeline_order_grid,
)
from .plans import Plan, capacity_min_micro_batches
from .request import FLAT_KEYWORDS, Capacity, Mesh, MicroBatching, PlanSpec, RankRules
from .simulation import SYNC_MODELS, microbatch_costs, step_time_of

__all__ = ["SIZE_RULES", "plan", "plan_cp"]

SIZE_RULES = SIZES


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _check_fits(lengths: np.ndarray, max_tokens: int) -> None:
    problem = too_long(lengths, max_tokens)
    if problem:
        raise ArgumentError(Note(
            "too_long", {"problem": problem},
            "{problem}; raise {@max_tokens}, or split or truncate such sequences before planning",
        ), argument="max_tokens")  # fmt: skip


def _deal_slots(
    bins: list[list[int]], bin_cost: np.ndarray, dp: int, m: int
) -> list[list[list[int]]]:
    """Sorted bins -> slots of ``dp``; inside a slot the heaviest bin to the lightest rank."""
    return [[bins[b] for b in row] for row in _deal_layout(bin_cost, dp, m)]


def _deal_layout(bin_cost: np.ndarray, dp: int, m: int) -> list[list[int]]:
    """:func:`_deal_slots` as bin indices: ``[rank][slot] -> bin``."""
    order = np.lexsort((np.arange(bin_cost.size), -bin_cost))
    ranks: list[list[int]] = [[] for _ in range(dp)]
    load = np.zeros(dp)
    rank_ids = np.arange(dp)
    busy = np.flatnonzero(bin_cost[order])
    costless_from = int(busy[-1]) + 1 if busy.size else 0  # sorted position
    for j in range(m):
        slot = order[j * dp : (j + 1) * dp]
        lightest = np.lexsort((rank_ids, load))
        if j * dp >= costless_from:
            # Only costless bins left (empty ones, allow_empty): the loads stop changing,
            # so every remaining slot goes to the ranks in this same order.
            rest = order[j * dp :].reshape(-1, dp)[:, np.argsort(lightest)].T.tolist()
            for r in range(dp):
                ranks[r].extend(rest[r])
            break
        for r, b in zip(lightest.tolist(), slot.tolist()):
            ranks[r].append(b)
            load[r] += bin_cost[b]
    return ranks


_FFD_START_WORK = 5e7  # items x bins: above this, first-fit-decreasing as a second start is slow
_THOROUGH = effort_of("thorough")


def _fill_slack(
    grid: list[list[list[int]]], costs: np.ndarray, lengths: np.ndarray, cap: int,
    budget: Effort, same_rank: bool = False, stop_at: float | None = None,
    fill_work: float | None = None,
) -> list[list[list[int]]]:
    """:func:`._slots.fill_slack` within the request's work budget; ``stop_at``: a sum of
    slot maxima within the budget's stop gap of the step bound (the search stops there
    anyway). ``fill_work``: the swap and move scans' work where ``budget`` (a pipelined
    plan's full search) has none: the requested effort's."""
    dp, m = len(grid), len(grid[0]) if grid else 0
    work = fill_work if budget.thorough else budget.swap_work
    return fill_slack(grid, costs, lengths, cap, max_steps=budget.step_factor * dp * m + 100,
                      same_rank=same_rank, swap_work=work, move_work=work,
                      retry=budget.thorough and fill_work is None,
                      stop_at=stop_at)  # fmt: skip


def _step_time(
    grid: list[list[list[int]]], costs: np.ndarray, c0: float, padded: bool, sync: str
) -> float:
    return step_time_of(microbatch_costs(grid, costs, per_microbatch=c0, padded=padded), sync)


def _step_in_order(req: _Request, grid: list[list[list[int]]]) -> float:
    """The simulated step of ``grid`` in the micro-batch order the plan is returned in
    (``order="index"`` sorts each rank on its own, which can misalign FSDP slots)."""
    key = (id(grid), id(req.costs), req.c0, req.padded, req.sync, req.order)
    known = req.steps.get(key)
    if known is not None:
        return known[1]
    kept = (grid, req.costs)
    if req.order is not None:
        grid = order_grid(grid, req.costs, req.c0, req.padded, req.order)
    step = _step_time(grid, req.costs, req.c0, req.padded, req.sync)
    req.steps[key] = (kept, step)
    return step


def _refine_stop(costs: np.ndarray, nbins: int, dp: int, budget: Effort) -> float | None:
    """The bin cost at which the packer's refinement may stop under ``budget``.

    Bins within ``refine_rtol`` of the mean bin leave every rank's ``m`` bins, and every
    sum of ``m`` slot maxima, within it of ``m`` mean bins, the bound of both. With one
    bin per rank the step is the heaviest bin, at least the costliest sequence, so that
    counts too.
    """
    if budget.refine_rtol is None or not costs.size or not nbins:
        return None
    level = float(costs.sum()) / nbins
    if nbins <= dp:
        level = max(level, float(costs.max()))
    return (1.0 + budget.refine_rtol) * level


def _global_bins(
    lengths: np.ndarray, costs: np.ndarray, nbins: int, cap: int, padded: bool,
    full: bool = False, budget: Effort = _THOROUGH, dp: int = 0,
    first: list[list[int]] | None = None,
) -> tuple[list[list[list[int]]], str]:
    """Candidate packings of all sequences into ``nbins`` bins, and how the search ended.

    The fast packers first (their last start is a token partition that stops once it fits
    the cap); only when they all fail, on at most ``EXACT_MAX_ITEMS`` sequences, a token
    partition refined to its end and then the bounded exact search
    (:mod:`seqbalance.planning._fitting`). Status: ``"found"``,
    ``"infeasible"`` (proven: no packing exists), ``"limit"`` (not found within the
    search limit) or ``"skipped"`` (above ``EXACT_MAX_ITEMS`` sequences, where the exact
    search does not run). ``full`` adds first-fit decreasing left unbalanced (bins filled to the
    cap, the rest in the last ones), for lockstep slots. ``budget``: the refinement's stop
    and, without further candidates (``effort="fast"``) under lockstep slots (``full``)
    or over one rank (``dp <= 1``: no packing changes the step), the first start that
    packs alone (``first`` itself where given).
    ``dp``: the ranks the bins are dealt to. ``first``: the LPT start's packing, if made.
    """
    starts = ["lpt"]
    stop = _refine_stop(costs, nbins, dp, budget)
    if not budget.candidates and (full or dp <= 1):
        if first is None:
            first = pack(costs, lengths, nbins, cap, padded=padded, start="lpt", stop_at=stop)
        if first is not None:
            return [first], "found"
    if lengths.size * nbins <= _FFD_START_WORK:
        starts.append("ffd")  # tighter packing sometimes lines slots up better
    memo: dict[Any, Any] = {}  # the starts share FFD and the token partition at this count
    found = [
        first if s == "lpt" and first is not None
        else pack(costs, lengths, nbins, cap, padded=padded, start=s, memo=memo, stop_at=stop)
        for s in starts
    ]  # fmt: skip
    if full and "ffd" in starts and not padded:
        # Under lockstep slots (fsdp) a slot of full bins on every rank wastes nothing, and
        # bins near the cap line up across ranks better than bins evened out around the
        # mean, which big sequences keep apart (measured: up to 7% shorter steps at tight
        # caps with quadratic costs; slack filling then evens out the last slots).
        found.append(
            pack(costs, lengths, nbins, cap, padded=padded, refine=False, start="ffd", memo=memo)
        )
    packed = [b for b in found if b is not None]
    if packed:
        return packed, "found"
    if lengths.size > EXACT_MAX_ITEMS:
        # A token partition refined to its end, after pack's own one (stopped at the cap)
        # failed, never fitted in 879 measured tries (planner sweeps of 64-8,192 sequences)
        # and took up to half of a failing count's time: kept only before the exact search,
        # which runs on at most EXACT_MAX_ITEMS sequences (the note says it was skipped).
        return [], "skipped"
    if not padded:
        bins = fit_by_partition(costs, lengths, nbins, cap)
        if bins is not None:
            return [bins], "found"
    bins, status = fit_exact(costs, lengths, nbins, cap, padded=padded)
    return ([bins] if bins is not None else []), status


def _plan_global(
    lengths: np.ndarray,
    costs: np.ndarray,
    dp: int,
    m: int,
    cap: int,
    padded: bool,
    sync: str,
    c0: float,
    pp: PipelineSetup | None = None,
    sent: np.ndarray | None = None,
    budget: Effort = _THOROUGH,
    enough: float | None = None,
    interim: Callable[[float], bool] | None = None,
    lpt_enough: float | None = None,
    fill_work: float | None = None,
    settle: float | None = None,
) -> tuple[list[list[list[int]]] | None, str]:
    """``sent``: the tokens a pipeline stage sends per sequence (the true lengths where
    ``lengths`` are clipped to the cap for packing); default ``lengths``. ``enough``: a
    step at which the first packing (LPT) is kept without trying the others (the budget's
    stop gap above the step bound; plain plans only). ``interim``: run after the first
    packing when that is not enough, with that packing's step; True keeps the first
    packing without trying the others (another candidate, made by ``interim``, is within
    the stop gap).
    ``lpt_enough``: a step at which the first packing is the only one (the other
    candidates of the search still run). ``settle`` (FSDP, plain plans): each packing's
    slots are evened out across the ranks (:func:`._slot_balance.balance_slots`) down to
    this step; None: they are not."""
    sent = lengths if sent is None else sent
    best, best_time = None, np.inf
    # One rank has nothing to line up with: its step is the sum of its bins whatever they
    # hold, and float rounding must not let unbalanced bins win a tie.
    full = sync == "fsdp" and dp > 1

    def deal(bins: list[list[int]]) -> tuple[list[list[list[int]]], np.ndarray, list[list[int]]]:
        cost = bin_totals(bins, costs, padded=padded)
        layout = _deal_layout(cost, dp, m)
        return [[bins[b] for b in row] for row in layout], cost, layout

    def finish(bins: list[list[int]]) -> tuple[list[list[list[int]]], float]:
        grid, cost, layout = deal(bins)
        if sync == "fsdp" and not padded:
            # (enough: within the stop gap, where the search stops; c0 per slot is apart)
            grid = _fill_slack(grid, costs, lengths, cap, budget,
                               stop_at=None if enough is None else enough - m * c0,
                               fill_work=fill_work)
            grid, cost, layout = deal([mb for rank in grid for mb in rank])
        if pp is None:
            # (the micro-batch costs are the bins' totals as dealt: _step_time's values)
            t = step_time_of(cost[np.asarray(layout, dtype=np.int64)] + c0, sync)
            if settle is not None and sync == "fsdp" and not padded and t > settle:
                grid = balance_slots(grid, costs, lengths, cap, stop_at=settle - m * c0)
                t = _step_time(grid, costs, c0, padded, sync)
                if t > settle and not budget.thorough:
                    # (below "thorough": exchanges of two for one or two for two, which the
                    # steps above cannot make, kept only where they bring the step within
                    # the stop gap, where at the fewest count the search stops; elsewhere
                    # the grid stays as it was: the refill toward slot levels may do better
                    # from there, bimodal 64 x 8 at 90% fill: 1.99% against 2.36%)
                    split = resplit_pairs(grid, costs, lengths, cap, stop_at=settle - m * c0)
                    t_split = _step_time(split, costs, c0, padded, sync)
                    if t_split <= settle:
                        grid, t = split, t_split
        else:  # the pipeline step, in the best starting order
            grid = pipeline_order_grid(grid, costs, c0, sent, padded, sync, pp, quick=True)
            t = pipeline_step_time(grid, costs, c0, sent, padded, sync, pp)
        return grid, t

    first = None
    if enough is not None and pp is None:
        stop = _refine_stop(costs, dp * m, dp, budget)
        lpt = pack(costs, lengths, dp * m, cap, padded=padded, start="lpt", stop_at=stop)
        if lpt is not None:
            first = (lpt, *finish(lpt))
            if first[2] <= enough or (interim is not None and interim(first[2])):
                return first[1], "found"
            if lpt_enough is not None and first[2] <= lpt_enough:
                return first[1], "found"
    packings, status = _global_bins(
        lengths, costs, dp * m, cap, padded, full=full, budget=budget, dp=dp,
        first=None if first is None else first[0],
    )  # fmt: skip
    # A start can return the packing of another (LPT falls back to first-fit decreasing
    # where it finds no room, and refinement may leave first-fit decreasing as it was):
    # finished once, its copies would only repeat the slack filling (3 x 45 ms on rl-math
    # 2,048 x 32 at 98% fill) for the same grid and step.
    # (compared as lists: two packings differ early, so a comparison is cheap)
    done: list[list[list[int]]] = [] if first is None else [first[0]]
    for bins in packings:
        if first is not None and bins is first[0]:
            grid, t = first[1:]
        else:
            if any(bins == b for b in done):
                continue
            done.append(bins)
            grid, t = finish(bins)
        if t < best_time:
            best, best_time = grid, t
    return best, status


def _rank_bins(
    lengths: np.ndarray, costs: np.ndarray, m: int, cap: int, padded: bool, balance: bool,
    rtol: float | None = None,
    fit_first: bool = False,
    ffd_fails: bool = False,
) -> list[list[int]] | None:
    """One rank's sequences into ``m`` bins: fast packer; then, on small inputs only (see
    :func:`_global_bins`), partition-based and exact.

    ``balance=False`` skips evening out the bins (under DDP only a rank's total counts).
    ``rtol``: evening out stops once every bin is within it of the rank's mean bin (its
    ``m`` slots then add up to within it of the rank's total, which the rank's sequences
    need whatever their bins). ``fit_first`` (with ``balance=False``): first-fit
    decreasing first, then LPT (whichever packing fits serves when only the rank's total
    counts; LPT fails more often at tight counts: rl-math, 32,768 sequences over 256
    ranks, on 110 of them). ``ffd_fails`` (with ``fit_first``): first-fit decreasing is
    known not to fit (:func:`._packing.first_fit_parts` said so), so it is not run again.
    """
    stop = None if rtol is None or not costs.size else (1.0 + rtol) * float(costs.sum()) / m
    bins = None
    if fit_first and not balance:
        memo: dict[Any, Any] = {}  # (the LPT start reuses first-fit decreasing's result)
        if ffd_fails:
            ffd_failed(memo, m, cap, padded)
        bins = pack(costs, lengths, m, cap, padded=padded, refine=False, start="ffd", memo=memo)
        if bins is None:
            bins = pack(costs, lengths, m, cap, padded=padded, refine=False, memo=memo)
    else:
        bins = pack(costs, lengths, m, cap, padded=padded, refine=balance, stop_at=stop)
    if bins is None and lengths.size <= EXACT_MAX_ITEMS:
        if not padded:
            bins = fit_by_partition(costs, lengths, m, cap)
        if bins is None:
            bins = fit_exact(costs, lengths, m, cap, padded=padded, node_limit=_RANK_NODE_LIMIT)[0]
    return bins


_RANK_NODE_LIMIT = 20_000  # per rank and count: the joint search below is the thorough one


def _plan_by_rank(
    lengths: np.ndarray,
    costs: np.ndarray,
    rank_items: list[list[int]],
    m: int,
    cap: int,
    padded: bool,
    sync: str,
    rtol: float | None = None,
    fit_first: bool = False,
) -> list[list[list[int]]] | None:
    out = []
    idxs = [np.asarray(items, dtype=np.int64) for items in rank_items]
    fast: list[list[list[int]] | None] = [None] * len(idxs)
    batched = fit_first and sync == "ddp" and not padded
    if batched:
        # _rank_bins' first packing (first-fit decreasing) of every rank at once; a rank
        # where it fails or leaves a bin empty is packed by _rank_bins itself.
        fast = first_fit_parts(idxs, costs, lengths, m, cap)
    for idx, got in zip(idxs, fast):
        if got is not None and all(got):
            bins: list[list[int]] | None = got
        else:
            bins = _rank_bins(lengths[idx], costs[idx], m, cap, padded, balance=sync != "ddp",
                              rtol=rtol, fit_first=fit_first,
                              ffd_fails=batched and got is None)  # fmt: skip
        if bins is None:
            return None
        out.append(_heaviest_first(idx, bins, costs, padded))
    return out


def _heaviest_first(
    idx: np.ndarray, bins: list[list[int]], costs: np.ndarray, padded: bool
) -> list[list[int]]:
    """One rank's ``bins`` (positions into ``idx``) as sequence ids, the heaviest
    micro-batch first (ties keep the bin order), so slots line up across ranks."""
    mbs = [idx[np.asarray(b, dtype=np.int64)].tolist() for b in bins]
    return [mbs[b] for b in largest_first(bin_totals(mbs, costs, padded=padded)).tolist()]


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
    pp: PipelineSetup | None = None  # set when pp_size > 1
    # plan(order=, oversized=, sequences_per_micro_batch=): see _ordering.py. With
    # oversized="alone", ``lens`` is clipped to the capacity for packing and ``true_lens``
    # keeps the real lengths for the Plan.
    order: str | None = None
    true_lens: np.ndarray | None = None
    per_mb: int | None = None
    budget: Effort = _THOROUGH  # plan(effort=): see _effort.py
    # The requested effort, pipelined plans too (whose ``budget`` stays the full search):
    # it sets the joint exact search's nodes and slack filling's work there. (A pipelined
    # plan's baselines stay slack-filled: on rl-math, 64 sequences over 4 ranks, pp_size=2,
    # the areal baseline slack-filled wins and the raw baselines ran 0.87% slower.)
    asked: Effort = _THOROUGH
    # Simulated steps of the grids already judged (_step_in_order), by the grid's id and
    # what the step depends on; each entry keeps its grid and costs alive, so no id is
    # reused while it is here. Candidates are compared again at every stop check.
    steps: dict[tuple[Any, ...], tuple[Any, float]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def fill_work(self) -> float | None:
        """Slack filling's swap and move work at the requested effort (None: unbounded)."""
        return None if self.asked.thorough else self.asked.swap_work

    @property
    def run_lens(self) -> np.ndarray:
        """The lengths the sequences run at (``true_lens``, else ``lens``): the Plan's, and
        the pipeline's forward shares and transfer tokens."""
        return self.lens if self.true_lens is None else self.true_lens

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
    n = lens.shape[0]
    dp = check_positive_int(dp_size, "dp_size")
    cap = check_max_tokens(max_tokens, "max_tokens")
    check_choice(sync, "sync", SYNC_MODELS)
    check_choice(size, "size", SIZE_RULES)
    m_min = check_positive_int(min_micro_batches, "min_micro_batches")
    mult = check_positive_int(micro_batch_multiple, "micro_batch_multiple")
    extra = check_nonnegative_int(extra_micro_batches, "extra_micro_batches")
    # Sizes are bounded relative to n before anything is allocated (see .limits).
    check_counts(n, dp, m_min, mult, extra)
    padded = check_bool(padded, "padded")
    allow_empty = check_bool(allow_empty, "allow_empty")
    group_ids = None if groups is None else as_groups(groups, lens.shape[0])
    costs, c0 = sequence_costs(lens, cost)
    if order is not None:
        check_choice(order, "order", ORDERS)
    per_mb = None
    if sequences_per_micro_batch is not None:
        # (its combinations with other options are checked by PlanSpec, the entry's)
        per_mb = check_positive_int(sequences_per_micro_batch, "sequences_per_micro_batch")
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
    """Step 1: the proven minimum, raised to ``min_micro_batches`` and the multiple.

    The proven minimum is the bin-packing bound of
    :func:`seqbalance.planning.bounds.min_micro_batches`, at least the capacity minimum
    ``ceil(total / (dp * max_tokens))``; no plan can use fewer micro-batches.
    """
    m_cap = capacity_min_micro_batches(req.lens, req.dp, req.cap)
    m_bins = _fewest_by_bins(req) if req.n else 1
    m = _round_up(max(m_cap, m_bins, req.m_min), req.mult)
    notes = []
    if m_bins > m_cap:
        big = int((2 * req.lens > req.cap).sum())
        notes.append(_count_floor_note(
            "count_bins", m_bins, m_cap,
            {"bins": min_bins(req.lens, req.cap), "cap": req.cap, "big": big},
            "a bin-packing bound (Martello-Toth L2) proves the sequences need at least {bins} "
            "micro-batches of {cap} tokens ({big} of them are longer than {cap}/2 and no two "
            "of those can share one)",
        ))  # fmt: skip
    if req.padded and req.n:
        pad_bins = min_padded_bins(req.lens, req.cap)
        m_pad = max(1, math.ceil(pad_bins / req.dp))
        if m_pad > max(m_cap, m_bins):
            notes.append(_count_floor_note(
                "count_padded", m_pad, m_cap, {"bins": pad_bins, "cap": req.cap},
                "padded to their longest sequence, the sequences need at least {bins} "
                "micro-batches of {cap} tokens (longest first, as many as fit, is optimal)",
            ))  # fmt: skip
            m_bins = m_pad  # raises m through m_low below
    m_rule, why_rule = _rule_micro_batches(req)
    if m_rule > max(m_cap, m_bins):
        notes.append(_count_floor_note("count_rule", m_rule, m_cap, {"why": why_rule}, "{why}"))
    m_low = max(m_cap, m_bins, m_rule)
    m = max(m, _round_up(m_low, req.mult))
    # (without allow_empty, too few sequences is refused before packing)
    spec = req.pp.spec if req.pp is not None else None
    chunks = spec.pp_size * spec.virtual_stages if spec is not None else 1
    # a pipeline's count search goes up to pp_size micro-batches, while each gets a sequence
    m_hi = m if spec is None else max(m, min(spec.pp_size, req.n // req.dp))
    check_slots(req.n, req.dp, m_hi, allow_empty=req.allow_empty, chunks=chunks)
    if m > m_low:
        spec = req.pp.spec if req.pp is not None else None
        notes.append(as_text(count_raised(
            m, m_low, req.m_min, req.mult, schedule=None if spec is None else spec.schedule,
            pp_size=None if spec is None else spec.pp_size,
            by_schedule=spec is not None and spec.count_multiple > 1,
        )))  # fmt: skip
    return m, notes


def _fewest_by_bins(req: _Request) -> int:
    """:func:`.bounds.min_micro_batches` of the request, once per request (the count's start
    and the step bound's terms both need it; a sort of every length)."""
    key = ("min_micro_batches", req.lens.dtype.str, req.lens.tobytes(), req.dp, req.cap)
    return int(remembered(key, lambda: min_micro_batches(req.lens, req.dp, req.cap)))


def _count_floor_note(
    kind: str, count: int, needed: int, fields: dict[str, Any], why: str
) -> str:
    """The note on a count above what the token total alone needs (``needed``), and
    ``why`` (a template over ``fields``)."""
    return as_text(Note(
        kind, {"count": count, "needed": needed, **fields},
        "{count} micro-batches per " + term("rank") + " where the token total alone needs "
        "{needed}: " + why,
    ))  # fmt: skip


def _rule_micro_batches(req: _Request) -> tuple[int, str]:
    """A proven floor on ``m`` under a size rule or groups, and the argument for it.

    Every plan obeys the rule, so (1) some rank holds at least ``P`` tokens, ``P`` the
    partition bound of the lengths under the rule
    (:func:`seqbalance.partitioning.lower_bound`), and needs ``ceil(P / cap)``
    micro-batches; (2) a group sits on one rank, so that rank needs at least as many
    micro-batches as the group's sequences longer than ``cap / 2`` (no two share one) and
    as ``ceil(group tokens / cap)``.
    """
    if (req.size == "free" and req.groups is None) or req.n == 0:
        return 0, ""
    p = lower_bound(req.lens.astype(np.float64), req.dp, size=req.size, groups=req.groups)
    best, why = math.ceil(p / req.cap - 1e-9), (
        f"under {req.rule} some {term('rank')} holds at least {int(p)} tokens (partition bound)"
    )
    if req.groups is not None:
        big = np.bincount(req.groups, weights=(2 * req.lens > req.cap).astype(np.float64))
        tok = np.bincount(req.groups, weights=req.lens.astype(np.float64))
        need = np.maximum(big, np.ceil(tok / req.cap - 1e-9)).astype(np.int64)
        g = int(np.argmax(need))
        if need[g] > best:
            best = int(need[g])
            why = (
                f"group {g} (one {term('rank')}) has {int(big[g])} sequences longer than "
                f"{req.cap}/2, no two of which can share a micro-batch, and {int(tok[g])} tokens"
            )
    return best, why


def _rank_splits(req: _Request, first_m: int) -> list[list[list[int]] | None]:
    """Step 2: how to reach ranks. ``None`` packs globally; a list fixes each rank's items."""
    if req.size != "free" or req.groups is not None:
        # Ranks balanced by cost can differ in tokens and so need more micro-batches; ranks
        # balanced by tokens may balance cost worse. Try each and keep the better plan.
        # Third candidate: equal sequence counts, for when a rank would hold too few
        # sequences to give every micro-batch one.
        splits: list[list[list[int]] | None] = []
        by_weight = []
        for weights in (req.costs, req.lens, np.ones(req.n)):
            w = np.asarray(weights, dtype=np.float64)
            parts = _rank_partition(w, req.dp, req.size, req.groups)
            by_weight.append(parts)
            if parts not in splits:
                splits.append(parts)
        if req.groups is not None:
            # Few, large units per rank: exact re-splits of rank pairs even out the cost.
            even = _resplit_groups(req, cast("list[list[int]]", splits[0]))  # a split
            if even not in splits:
                splits.append(even)
            if req.size == "free":
                fitted = _even_groups_within_tokens(req, by_weight[1], first_m)
                if fitted not in splits:
                    splits.append(fitted)
        return splits
    if req.sync == "ddp":
        # DDP only sees rank totals: a direct partition of the costs may balance them more
        # finely than dealing out equal micro-batches does.
        # Below effort="thorough" it stops within the stop gap of the partition bound:
        # then the plan of this split is within it of the step bound, and the search stops
        # (_ddp_rank_first_at_bound).
        fit = (None if req.budget.stop_gap is None
               else lower_bound(req.costs, req.dp) * (1.0 + req.budget.stop_gap))  # fmt: skip
        return [None, _rank_partition(req.costs, req.dp, "free", None, fit)]
    return [None]


def _rank_partition(
    w: np.ndarray, dp: int, size: str, groups: np.ndarray | None, fit: float | None = None
) -> list[list[int]]:
    """``partition_arrays(w, dp, size, "auto", groups, fit=fit)`` as lists, computed once
    per request (:func:`._work.remembered_search`: static CP plans its replicas once per count
    and pipeline candidate, each splitting the same sequences over the same ranks)."""
    key = ("rank split", w.dtype.str, w.tobytes(), dp, size,
           None if groups is None else (groups.dtype.str, groups.tobytes()), fit)  # fmt: skip
    parts = remembered_search(key, lambda: [
        list(p) for p in partition_arrays(w, dp, size, "auto", groups, fit=fit)
    ])  # fmt: skip
    return [list(p) for p in parts]


def _groups_per_rank(req: _Request, parts: list[list[int]]) -> list[list[int]]:
    """The group ids on each rank of ``parts`` (sequence ids per rank), ascending."""
    assert req.groups is not None
    return [sorted(set(req.groups[np.asarray(p, dtype=np.int64)].tolist())) for p in parts]


def _sequences_per_rank(req: _Request, unit_parts: list[list[int]]) -> list[list[int]]:
    """The sequence ids on each rank that holds the groups ``unit_parts``, ascending."""
    assert req.groups is not None
    n_units = int(req.groups.max()) + 1 if req.groups.size else 0
    members: list[list[int]] = [[] for _ in range(n_units)]
    for i, g in enumerate(req.groups.tolist()):
        members[g].append(i)
    return [sorted(i for g in units for i in members[g]) for units in unit_parts]


def _even_groups_within_tokens(
    req: _Request, parts: list[list[int]], m: int
) -> list[list[int]]:
    """``parts`` with whole groups exchanged between ranks to even out the cost while no
    rank holds more than ``m * max_tokens`` tokens.

    The cost-balanced split often needs more micro-batches on some rank (its tokens do not
    fit ``m`` of them) and the token-balanced one leaves the cost uneven; this starts from
    the token split and trades groups as long as the tokens still fit (a necessary
    condition for ``m`` micro-batches; packing decides).
    """
    assert req.groups is not None
    unit_w = np.bincount(req.groups, weights=req.costs)
    unit_t = np.bincount(req.groups, weights=req.lens).astype(np.int64)
    unit_parts = _groups_per_rank(req, parts)
    room = max(m * req.cap, int(max(unit_t[u].sum() for u in unit_parts)))
    grid = exchange_between_ranks(
        [[u] for u in unit_parts], unit_w, unit_t, room, moves=True, allow_empty=False
    )
    return _sequences_per_rank(req, [rank[0] for rank in grid])


def _resplit_groups(req: _Request, parts: list[list[int]]) -> list[list[int]]:
    """``parts`` (sequence ids per rank) after :func:`repartition_pairs` on the groups' costs."""
    assert req.groups is not None
    unit_w = np.bincount(req.groups, weights=req.costs)
    n_units = unit_w.size
    lo = 0 if req.size == "free" else n_units // req.dp
    odd = req.size == "balanced" and n_units % req.dp > 0
    hi = n_units if req.size == "free" else lo + int(odd)
    units = _groups_per_rank(req, parts)
    # (once per request: the plan made without the pipeline, or the fewest count planned
    # again after the extra counts, re-splits the same groups)
    key = ("resplit", unit_w.tobytes(), tuple(map(tuple, units)), lo, hi)
    even = remembered(key, lambda: repartition_pairs(unit_w, units, lo, hi))
    return _sequences_per_rank(req, even)


def _too_few(req: _Request, rank_items: list[list[int]] | None, m: int) -> str | None:
    """Why ``m`` micro-batches per rank cannot all hold a sequence, or None."""
    if rank_items is None:
        if req.n < req.dp * m:
            return f"{req.n} sequences cannot fill {req.dp} {term('ranks')} x {m} micro-batches"
        return None
    short = [r for r, items in enumerate(rank_items) if len(items) < m]
    if short:
        r = short[0]
        rule = "{@size:{size!r}}" + (" {@and groups}" if req.groups is not None else "")
        return as_text(Note(
            "too_few", {"size": req.size, "rank": r, "held": len(rank_items[r]), "count": m},
            "under " + rule + ", " + term("rank") + " {rank} holds {held} sequences but needs "
            "{count} micro-batches",
        ))  # fmt: skip
    return None


_WHY = {
    "infeasible": "an exhaustive search proves that no packing into {k} exists",
    "limit": (
        "none found by the packers, partition-based packing or a bounded exhaustive search "
        "(stopped at its limit), so a packing into {k} may still exist"
    ),
    "skipped": (
        "none found by the packers or partition-based packing (the exhaustive search runs "
        "on at most {n} sequences), so a packing into {k} may still exist"
    ),
}


def _why_more(req: _Request, m: int, status: str) -> str:
    """The note for a plan that needed ``m`` micro-batches, ``status`` saying why not fewer."""
    ruled = req.size != "free" or req.groups is not None
    per = "{fewer} micro-batches of {cap} tokens per " + term("rank")
    return as_text(Note(
        "count_not_found",
        {"count": m, "fewer": m - req.mult, "cap": req.cap, "status": status,
         "limit": _JOINT_EXACT_MAX_ITEMS if ruled else EXACT_MAX_ITEMS,
         "rule": req.rule if ruled else None},
        "{count} micro-batches per " + term("rank") + ": "
        + _WHY[status].format(k=per, n="{limit}") + (" under {rule}" if ruled else ""),
    ))  # fmt: skip


def _joint_exact(req: _Request, m: int, memo: dict[Any, Any]) -> tuple[Any, str]:
    """Rank contents that fit ``m`` micro-batches per rank under the rule, by exact search.

    Returns ``(rank_items, status)``; small inputs only (else status ``"skipped"``).
    """
    if m in memo:
        return cast("tuple[Any, str]", memo[m])
    if req.n > _JOINT_EXACT_MAX_ITEMS:
        memo[m] = (None, "skipped")
        return cast("tuple[Any, str]", memo[m])
    if req.groups is None:
        units = [[i] for i in range(req.n)]
    else:
        order = np.argsort(req.groups, kind="stable")
        cuts = np.flatnonzero(np.diff(req.groups[order])) + 1
        units = [u.tolist() for u in np.split(order, cuts)]
    u = len(units)
    lo = 0 if req.size == "free" else u // req.dp
    hi = u if req.size == "free" else lo + (1 if req.size == "balanced" and u % req.dp else 0)
    ranks, status = pack_ranked_exact(
        req.lens.tolist(),
        units,
        req.dp,
        m,
        req.cap,
        lo=lo,
        hi=hi,
        need=0 if req.allow_empty else m,
        padded=req.padded,
        node_limit=req.asked.joint_nodes,
    )
    items = None if ranks is None else [sorted(i for mb in r for i in mb) for r in ranks]
    memo[m] = (items, status)
    return cast("tuple[Any, str]", memo[m])


_JOINT_EXACT_MAX_ITEMS = 24  # the joint rank x micro-batch search runs on at most this many


def _fill_rank_slack(req: _Request, mbs: list[list[list[int]]]) -> list[list[list[int]]]:
    """FSDP slack filling that keeps every rank's contents (so the rule and groups hold)."""
    if req.sync != "fsdp" or req.padded:
        return mbs
    filled = _fill_slack(mbs, req.costs, req.lens, req.cap, req.budget, same_rank=True,
                         fill_work=req.fill_work)
    return min(
        (mbs, filled),
        key=lambda g: _step_time(g, req.costs, req.c0, req.padded, req.sync),
    )


def _search(
    req: _Request,
    rank_items: list[list[int]] | None,
    first_m: int,
    notes: list[str],
    memo: dict[Any, Any],
    m_stop: int | None = None,
    interim: Callable[[float], bool] | None = None,
) -> list[Plan] | str:
    """Step 3: plans for the smallest feasible m (and the extra ones asked for), or why not.

    ``m`` grows only after a count failed, and the note of the plan says why the count
    below it failed: proven (exhaustive search) or not found within the search limit. On
    the rank-first path, a count the fixed rank split cannot pack is also searched jointly
    over ranks and micro-batches on small inputs (:func:`_joint_exact`, shared by all
    splits through ``memo``).

    ``m_stop``: a count another rank split already reached; larger counts would lose to it
    (fewest micro-batches first), so the search gives up past it (an empty list).
    ``interim``: see :func:`_plan_global` (at ``first_m`` only).
    """
    found: list[Plan] = []
    # One sequence per micro-batch always fits, so the search ends by this count.
    m_limit = max(first_m, _round_up(max(req.n, 1), req.mult)) + req.mult
    m = first_m
    status = "found"  # how the search for the last failed count ended
    before = spent() or 0  # the work meter before the last count planned
    while m <= m_limit:
        if m_stop is not None and m > m_stop and not req.extra:
            return found
        now = spent() or 0
        last, before = now - before, now  # what the last count cost
        if found and counts_spent(last):
            _note_counts_spent(found, m)
            return found
        problem = _too_few(req, rank_items, m)
        blocked = problem is not None and not req.allow_empty
        mbs, st = None, "infeasible"
        if rank_items is None:
            if blocked:
                # Extra counts (extra_micro_batches) that cannot be filled end the search;
                # the plans already found stand.
                return found if found else str(problem)
            mbs, st = _plan_global(
                req.lens, req.costs, req.dp, m, req.cap, req.padded, req.sync, req.c0, req.pp,
                req.run_lens, req.budget, _enough(req, m, memo),
                interim if m == first_m else None, _lpt_enough(req, m, memo),
                fill_work=req.fill_work, settle=_settle(req, m, memo),
            )
        else:
            mbs, st = _by_rank_at(req, rank_items, m, memo, blocked)
            if mbs is None and blocked:
                return found if found else str(problem)
        if mbs is None:
            status = st
        else:
            if found:
                extra = [as_text(Note(
                    "extra_count",
                    {"count": m, "extra": req.extra, "fewest": found[0].num_micro_batches},
                    "{count} micro-batches per " + term("rank") + ", tried because "
                    "{@extra_micro_batches:{extra}}; {fewest} would also fit",
                ))]  # fmt: skip
            else:
                extra = [_why_more(req, m, status)] if m > first_m else []
            extra += _empty_note(mbs)
            found.append(_plan_of(req, mbs, notes + extra))
            if len(found) > req.extra:
                break
        m += req.mult
    return found


def _note_counts_spent(found: list[Plan], m: int) -> None:
    """Say in the plans found so far that counts from ``m`` on were not planned."""
    for p in found:
        p.notes = (
            *p.notes,
            f"counts from {m} micro-batches per {term('rank')} on were not planned: the "
            f"request's work budget for extra counts (COUNT_WORK = {COUNT_WORK:,} units of "
            "packing work, seqbalance.planning._work) was spent",
        )


def _by_rank_at(
    req: _Request, rank_items: list[list[int]], m: int, memo: dict[Any, Any], blocked: bool
) -> tuple[list[list[list[int]]] | None, str]:
    """The rank-first split ``rank_items`` packed into ``m`` micro-batches per rank (the
    joint exact search when it does not pack, on small inputs), and how it ended.

    Kept in ``memo`` per split and count: the DDP shortcut of :func:`plan` tries the
    smallest count before the usual searches, which then reuse it.
    """
    key = ("by_rank", id(rank_items), m, blocked)
    if key in memo:
        return cast("tuple[list[list[list[int]]] | None, str]", memo[key])
    mbs, st = None, "infeasible"
    if not blocked:
        mbs = _plan_by_rank(req.lens, req.costs, rank_items, m, req.cap, req.padded, req.sync,
                            req.budget.refine_rtol, not req.budget.thorough)  # fmt: skip
    if mbs is None:
        joint, st = _joint_exact(req, m, memo)
        if joint is not None:
            mbs = _plan_by_rank(req.lens, req.costs, joint, m, req.cap, req.padded, req.sync,
                                req.budget.refine_rtol, not req.budget.thorough)  # fmt: skip
            st = "found" if mbs is not None else "limit"
    if mbs is not None:
        mbs = _fill_rank_slack(req, mbs)
    memo[key] = (mbs, st)
    return cast("tuple[list[list[list[int]]] | None, str]", memo[key])


def _ddp_rank_first_at_bound(
    req: _Request,
    splits: list[list[list[int]] | None],
    first_m: int,
    notes: list[str],
    memo: dict[Any, Any],
) -> Plan | None:
    """DDP: the rank-first plan at the smallest count when no plan can have a shorter step.

    Under DDP a step is the busiest rank's total, ``m * per_microbatch`` plus its sequence
    costs. If the cost partition behind the rank-first split packs into ``first_m`` (no
    plan has fewer micro-batches) and its heaviest rank is at the partition lower bound
    (within ``AUTO_RTOL``, where "auto" stops on float costs), the global packing could
    shorten the step by at most that, so it is skipped (measured: it was most of a DDP
    plan's time at n = 8,192; on 2,070 DDP plans, 54 steps longer by at most 5.7e-6).
    Packed, free size, no groups, no pipeline, no extra counts, two or more ranks (one
    rank is always at the bound, and there the global packing's evened-out bins win the
    tie); None otherwise.
    """
    return _ddp_rank_first_within(req, splits, first_m, notes, memo, AUTO_RTOL)


def _ddp_rank_first_within_gap(
    req: _Request,
    splits: list[list[list[int]] | None],
    first_m: int,
    notes: list[str],
    memo: dict[Any, Any],
) -> Plan | None:
    """DDP below ``effort="thorough"``: the rank-first plan at the smallest count when its
    busiest rank is within the budget's ``stop_gap`` of the partition lower bound (then
    its step is within it of the step bound, where the search stops anyway: see
    :func:`_close_enough`); the cost partition behind the split stops there too
    (:func:`_rank_splits`). As :func:`_ddp_rank_first_at_bound` otherwise; None where the
    budget never stops early."""
    if req.budget.stop_gap is None:
        return None
    return _ddp_rank_first_within(req, splits, first_m, notes, memo, req.budget.stop_gap)


def _ddp_rank_first_within(
    req: _Request,
    splits: list[list[list[int]] | None],
    first_m: int,
    notes: list[str],
    memo: dict[Any, Any],
    rtol: float,
) -> Plan | None:
    """The rank-first plan at ``first_m`` if its busiest rank is within ``rtol`` of the
    partition lower bound (:func:`_ddp_rank_first_at_bound`), else None."""
    if (req.sync != "ddp" or req.dp < 2 or req.padded or req.pp is not None or req.extra
            or len(splits) != 2 or splits[0] is not None or req.n == 0):  # fmt: skip
        return None
    rank_items = splits[1]
    assert rank_items is not None
    enough = lower_bound(req.costs, req.dp) * (1 + rtol)

    def heaviest(ranks: list[list[int]]) -> float:
        return max(float(req.costs[np.asarray(r, dtype=np.int64)].sum()) for r in ranks)

    if heaviest(rank_items) > enough:
        return None
    found = _search(req, rank_items, first_m, notes, memo, m_stop=first_m)
    if not isinstance(found, list) or not found:
        return None
    # The split may not have packed and the joint exact search (small inputs) chosen
    # other rank contents: the plan itself must be at the bound.
    got = found[0]
    if heaviest([[i for mb in rank for i in mb] for rank in got.micro_batches]) > enough:
        return None
    return got


_PIPELINE_MAX_ITEMS = 20_000  # the framework pipelines run as candidates up to this size
# verl's count loop as a candidate: at most this much KK work (sequences x parts, summed
# over its runs; see verl_pipeline). A normal batch needs a few counts, well under 1% of
# it; tiny micro-batches (thousands of counts of thousands of parts) would take minutes.
_VERL_WORK = 1 << 23


def _baseline_grid(
    req: _Request, name: str, ranks: Any, m_best: int | None
) -> list[list[list[int]]] | None:
    """Baseline ``name``'s micro-batches as its Plan holds them, without building one
    (``ranks``: its rank split, for the baselines that split first); None when it puts a
    micro-batch over the cap and is dropped anyway."""
    if name in UNCAPPED_STAGES:
        # a micro-batch over the cap drops the baseline: stop at the first one
        got = UNCAPPED_STAGES[name](req.lens, ranks, req.cap, req.costs)
        if got is None:
            return None
        return [[sorted(int(i) for i in mb) for mb in rank] for rank in _equalize(got)]
    if name == "verl":
        # verl's loop runs one KK per count until the cap holds; counts above the best
        # plan's are discarded by the caller, so its loop stops there (the same plan
        # otherwise).
        return _equalize(verl_micro_batches(req.lens, ranks, req.cap, m_best, _VERL_WORK) or [])
    staged = BASELINE_STAGES.get(name)
    grid = _equalize(
        staged[1](req.lens, ranks, req.cap, req.costs) if staged is not None
        else BASELINE_GRIDS[name](req.lens, req.dp, req.cap, req.costs)
    )  # fmt: skip
    return [[sorted(int(i) for i in mb) for mb in rank] for rank in grid]


def _pipeline_candidates(
    req: _Request, m_best: int | None, best_step: float | None = None, fewest: bool = False,
    raw: dict[int, str] | None = None,
) -> list[Plan]:
    """Step 3b: every baseline as a candidate, so plan is never worse than one that runs.

    The plans of :data:`seqbalance.planning.baselines.BASELINES` (AReaL's, verl's and
    slime's pipelines, first-fit decreasing, the KK splits, sequential) are kept when they
    meet every constraint of this request: the capacity, equal counts, no empty
    micro-batch (unless allowed), the count rules, the size rule and groups, and no more
    micro-batches than the best plan found. Under FSDP their slots are then slack-filled
    (inside ranks, so the rules hold). Packed mode, inputs up to ``_PIPELINE_MAX_ITEMS``.

    ``best_step``: the fastest step (:func:`_step_in_order`) among the plans found with
    ``m_best`` micro-batches. A baseline with as many whose floor (:func:`_busiest_floor`,
    which neither slack filling nor the later refill can go below) is above it could
    never be picked: it is dropped before its slack filling (0.47 s of a 0.9 s plan of
    8,192 rl-math sequences over 8 ranks), which changes no pick (see :func:`_levelled`).

    ``fewest``: ``m_best`` is the fewest micro-batches any plan can have, so a baseline
    kept has at least as many. Below ``effort="thorough"`` a baseline whose ranks are
    known before its micro-batches (:data:`.baselines.BASELINE_STAGES`) is then not run
    when its busiest rank's total alone is above ``best_step``: its step would be too.

    ``raw``: filled with ``id(plan) -> name`` for the baselines kept as they are (below
    ``effort="thorough"``; :func:`_finished_baseline` fills the one picked).
    """
    if req.padded or req.n > _PIPELINE_MAX_ITEMS or req.n == 0:
        return []
    if req.dp * (m_best or 1) > _PIPELINE_MAX_ITEMS:
        return []  # mostly empty slots (allow_empty): the pipelines' cost is per slot
    filled = req.budget.baselines == "filled"
    # (fewest: no kept baseline has fewer micro-batches, so a step above best_step loses)
    floors = (fewest and best_step is not None and not req.extra and req.pp is None
              and not req.budget.thorough)  # fmt: skip
    out = []
    # (remembered for the request: the replica plans of static CP, one per count and
    # pipeline candidate, run the same baselines on the same sequences)
    items = (req.lens.tobytes(), req.costs.dtype.str, req.costs.tobytes(), req.dp, req.cap)
    for name in BASELINES:
        # (charged whether it runs or not: the work meter counts the same in both)
        charge(req.n >> 3)  # the work meter: a baseline costs about 3 us a sequence
        staged = BASELINE_STAGES.get(name)
        ranks: Any = None
        if staged is not None:
            ranks = remembered_search(
                ("baseline ranks", name, items), partial(staged[0], req.lens, req.dp, req.costs)
            )
            if (floors and m_best is not None and best_step is not None
                    and _ranks_floor(req, ranks, m_best)
                    > best_step * (1.0 + 1e-9)):  # (float sums, as below)  # fmt: skip
                continue  # its step is at least its busiest rank's total
        key = ("baseline grid", name, items, m_best if name == "verl" else None)
        made = remembered_search(key, partial(_baseline_grid, req, name, ranks, m_best))
        if made is None:
            continue
        grid = [[list(mb) for mb in rank] for rank in made]
        m = len(grid[0]) if grid else 0
        if m == 0 or any(len(r) != m for r in grid):
            continue
        if m < req.m_min or m % req.mult or (m_best is not None and m > m_best):
            continue
        if not req.allow_empty and any(not mb for r in grid for mb in r):
            continue
        if int(microbatch_costs(grid, req.lens.astype(np.float64)).max()) > req.cap:
            continue
        if (
            best_step is not None
            and req.sync == "fsdp"
            and req.pp is None
            and m == m_best
            and _busiest_floor(req, grid) > best_step * (1.0 + 1e-9)  # (float sums)
        ):
            continue
        # (past the request's budget for candidates, the baselines as they are)
        fill = filled and not candidates_spent()
        if (not fill and best_step is not None and m == m_best and not req.extra
                and _step_in_order(req, grid) >= best_step):  # fmt: skip
            continue  # as it is, it cannot win the pick (ties go to the plans found first)
        cand = _baseline_plan(req, grid, name, fill)  # (req.padded is False: checked on entry)
        if any(cand._rule_violations().values()):
            continue
        if raw is not None and not filled:  # (not past "thorough"'s candidate budget)
            raw[id(cand)] = name
        out.append(cand)
    return out


def _baseline_plan(
    req: _Request, grid: list[list[list[int]]], name: str, filled: bool
) -> Plan:
    """Baseline ``name``'s ``grid`` as a candidate: slack-filled inside its ranks where
    ``filled`` (so its size rule and groups hold), with the note that names it."""
    return _plan_of(req, _fill_rank_slack(req, grid) if filled else grid, [as_text(Note(
        "won_baseline", {"name": name, "filled": filled},
        "the {name} baseline's plan" + (", slack-filled," if filled else "")
        + " was the fastest candidate",
    ))])  # fmt: skip


def _finished_baseline(
    req: _Request, chosen: Plan, name: str, problems: list[str], n_splits: int
) -> Plan:
    """(fsdp, below ``effort="thorough"``) The baseline plan ``chosen`` as it is, or, where
    faster, slack-filled and refilled toward slot levels as the full search does every
    baseline. The baselines run as they are (filling each costs a large share of the plan's
    time and seldom changes the pick); the one that won the pick is filled: at tight caps a
    baseline can win by its rank split alone, and filling it then takes the plan most of the
    way to the full search's (rl-math-truncated 256 x 8 at 99.5% fill: 0.64% -> 0.15% above
    the bound, the full search's plan; ``bench/fill.py``)."""
    filled = _baseline_plan(req, chosen.micro_batches, name, True)
    # (chosen first: on a tie it stands)
    return _pick(req, [chosen, *_levelled(req, [filled])], problems, n_splits)


# Ranks split first, filled to the cap, up to this many sequences (and micro-batches): on
# 65,536 chat sequences over 1,024 ranks this candidate is 0.16% above the bound where the
# global packing is 6.2%, for ~0.3 s of the plan's time. Above _PIPELINE_MAX_ITEMS it is
# built only when the plan so far is more than _LEVEL_MIN_GAIN above the step bound, and
# above _FULL_RANK_LARGE more than _FULL_RANK_LARGE_GAIN: on 1,048,576 sequences over
# 8,192 ranks it costs ~4 s (chat lengths: 3.9% -> 0.2%; rl-math 0.81% -> 0.68%, left).
_FULL_RANK_MAX_ITEMS = 2**21
_FULL_RANK_LARGE = 2**18
_FULL_RANK_LARGE_GAIN = 0.02


def _full_rank_candidates(
    req: _Request, m_best: int | None, found: list[Plan], enough: float | None = None,
    memo: dict[Any, Any] | None = None, beat: float | None = None,
) -> list[Plan]:
    """Step 3c (fsdp): ranks split first, each rank's micro-batches filled to the cap.

    Under lockstep slots, micro-batches near the cap line up across ranks, which bins
    evened out inside each rank (the rank-first search) or across all ranks (the global
    packing) cannot when big sequences keep them apart; AReaL's pipeline does this with a
    greedy token split. Here the ranks come from the token and the cost partition, each
    rank is packed first-fit decreasing into the best plan's count, left unbalanced, heavy
    micro-batches first, then slack-filled. Free size, no groups, packed, no pipeline,
    at most ``_FULL_RANK_MAX_ITEMS`` sequences; above ``_PIPELINE_MAX_ITEMS`` only when
    the fastest of ``found`` at ``m_best`` is more than ``_LEVEL_MIN_GAIN`` above the
    step bound (``_FULL_RANK_LARGE_GAIN`` above ``_FULL_RANK_LARGE``), or ``found`` is
    empty (tried before the packings). ``enough``: a step at which the first split's plan
    is kept without the second (within the stop gap of the bound: the search stops).
    ``memo``: the request's, where the step bound at ``m_best`` may already be.

    Below ``effort="thorough"``, without extra counts, a split whose busiest rank's total
    is above the fastest step at ``m_best`` (of ``found``, or ``beat``: the step of a grid
    the search has built at that count) is not packed: neither slack filling nor the
    refill moves sequences between ranks, so that candidate could never win the pick.
    (Its slack filling is not charged to the work meter either: budgets counted in work
    reach further. And where :func:`_close_enough` would have sharpened the slot bound on
    it first, the search may go on to the other packings: never a longer step.)
    """
    if (req.sync != "fsdp" or req.dp < 2 or req.padded or req.size != "free"
            or req.groups is not None or req.pp is not None or m_best is None
            or req.n == 0 or req.n > _FULL_RANK_MAX_ITEMS
            or req.dp * m_best > _FULL_RANK_MAX_ITEMS):
        return []
    if found and (req.n > _PIPELINE_MAX_ITEMS or req.dp * m_best > _PIPELINE_MAX_ITEMS):
        fastest = min(_step_time(p.micro_batches, req.costs, req.c0, False, "fsdp")
                      for p in found if p.num_micro_batches == m_best)  # fmt: skip
        # (_enough's bound: fsdp, free size and no groups here)
        key = ("step_bound", m_best)
        bound = float(memo[key]) if memo is not None and key in memo else _step_bound(
            req, m_best, memo)
        large = req.n > _FULL_RANK_LARGE or req.dp * m_best > _FULL_RANK_LARGE
        if fastest <= bound * (1.0 + (_FULL_RANK_LARGE_GAIN if large else _LEVEL_MIN_GAIN)):
            return []
    out: list[Plan] = []
    seen: list[list[list[int]]] = []
    if req.budget.thorough or req.extra:
        beat = None
    elif found:
        steps = [_step_in_order(req, p.micro_batches) for p in found
                 if p.num_micro_batches == m_best]  # fmt: skip
        beat = min([*steps, beat] if beat is not None else steps, default=None)
    for what, weights in (("tokens", req.lens.astype(np.float64)), ("cost", req.costs)):
        # Within 0.1% of max(mean part, largest unit) is close enough to split ranks by:
        # the exact searches behind "auto" would cost more than this whole candidate.
        near = max(float(weights.sum()) / req.dp, float(weights.max())) * 1.001
        ranks = _rank_partition(weights, req.dp, "free", None, near)
        if ranks in seen:
            continue
        seen.append(ranks)
        if beat is not None and _ranks_floor(req, ranks, m_best) > beat * (1.0 + 1e-9):
            continue  # its step is at least its busiest rank's total (float sums: 1e-9)
        grid = []
        idxs = [np.asarray(items, dtype=np.int64) for items in ranks]
        fast = first_fit_parts(idxs, req.costs, req.lens, m_best, req.cap)
        for idx, bins in zip(idxs, fast):
            if bins is None or any(not b for b in bins):  # (pack's other starts or filling)
                bins = pack(req.costs[idx], req.lens[idx], m_best, req.cap, refine=False,
                            start="ffd")
            if bins is None or any(not b for b in bins):  # empty slots: the search's job
                break
            grid.append(_heaviest_first(idx, bins, req.costs, padded=False))
        if len(grid) != req.dp:
            continue
        cand = _plan_of(req, _fill_rank_slack(req, grid), [as_text(Note(
            "won_full_rank", {"by": what},
            term("ranks") + " split by {by}, each filled first-fit decreasing to the cap and "
            "slack-filled, was the fastest candidate",
        ))])  # fmt: skip
        if not any(cand._rule_violations().values()):
            out.append(cand)
            if enough is not None and _step_in_order(req, cand.micro_batches) <= enough:
                break
    return out


# n x dp (x m under DDP) above which the greedy plan is not tried: its scans over the ranks
# (FSDP's first slot, DDP's micro-batches) grow with it; 8,192 sequences over 64 ranks
# take about 10 ms.
_GREEDY_WORK = 1 << 22
_GREEDY_NOTE = (
    "sequences placed costliest first where the token cap left room (a capacity-aware "
    "greedy over the {ranks}) was the fastest candidate"
)  # (the template of the won_greedy note; {ranks} in the words of the call)


def _greedy_candidate(
    req: _Request, m: int, notes: list[str], memo: dict[Any, Any] | None = None
) -> Plan | None:
    """The capacity-aware greedy plan at ``m`` micro-batches (:mod:`._capacity_greedy`), or None.

    It puts the short sequences beside the long ones from the start, where the packers
    balance cost first and meet the cap second: on 1,024 long-context sequences over 8
    ranks (2 micro-batches, a quadratic cost) it is 2-3% shorter than every other
    candidate, and within 0.02% of the optimum (``bench/true_gap.py``). At every effort
    (at ``"fast"`` one of its few candidates). Free size, no groups, packed, no pipeline, no
    extra counts, at most ``_PIPELINE_MAX_ITEMS`` sequences and ``_GREEDY_WORK`` of ``n
    dp`` (``n dp m`` under DDP); None where a sequence fits nowhere or (without
    ``allow_empty``) a micro-batch stays empty. ``notes``: the request's. Under FSDP
    each slot is then evened out across the ranks (:mod:`._slot_balance`; rl-math, 8,192
    sequences over 64 ranks: 0.124% above the bound to 0.090%), down to the default's
    stop (``memo``: the request's, where the step bound at ``m`` is kept).
    """
    if (req.padded or req.size != "free" or req.groups is not None or req.pp is not None
            or req.extra or req.n == 0 or req.n > _PIPELINE_MAX_ITEMS
            or req.n * req.dp * (m if req.sync == "ddp" else 1) > _GREEDY_WORK):
        return None  # fmt: skip
    build = ddp_greedy if req.sync == "ddp" else fsdp_greedy
    grid = build(req.costs, req.lens, req.dp, m, req.cap)
    if grid is None and memo is not None:
        memo[("greedy_stranded", m)] = True  # (the token cap binds: see _slot_first_candidate)
    if grid is None or (not req.allow_empty and any(not mb for rank in grid for mb in rank)):
        return None
    if req.sync == "fsdp":
        enough = _enough(req, m, memo)
        if (enough is not None and memo is not None
                and _step_time(grid, req.costs, req.c0, False, "fsdp") > enough
                and _sharpened_slot_bound(req, memo)):  # fmt: skip
            enough = _enough(req, m, memo)  # (the bound the stop will use)
        grid = balance_slots(grid, req.costs, req.lens, req.cap,
                             stop_at=None if enough is None else enough - m * req.c0)
    won = as_text(Note("won_greedy", {"ranks": term("ranks")}, _GREEDY_NOTE))
    return _plan_of(req, grid, [*notes, won, *_empty_note(grid)])


_SLOT_FIRST_NOTE = (
    "each slot's sequences chosen first, in bands of nearly equal lengths, then split "
    "over the {ranks} (a slot-first plan) was the fastest candidate"
)  # (the template of the won_slot_first note)
# The slot-first plan's slots are evened out within each slot, down to half of each slot's
# share of the stop gap (slots already there are left to the slack filling), and, where
# that leaves the plan within _SLOT_FIRST_GAPS stop gaps of the bound, slack-filled within
# _SLOT_FIRST_FILL_WORK scan elements: rl-math, 1,024 sequences over 8 ranks x 15-20
# (seeds 0-7 of bench/latency.py's workload), within the stop gap on 6 of the 7 seeds it
# builds for, with half the evening-out steps of evening every slot out. Above
# _SLOT_FIRST_MAX_ITEMS sequences it is not tried: there the evening out alone costs as
# much as the packings' whole search (16,384 sequences over 256 ranks: about 0.1 s).
_SLOT_FIRST_GAPS = 3.0
_SLOT_FIRST_SLOT_SHARE = 0.5
_SLOT_FIRST_BALANCE_WORK = 64  # scan elements per sequence (the row above: 21k in all)
_SLOT_FIRST_FILL_WORK = 2e6
_SLOT_FIRST_MAX_ITEMS = 8192
# Below this many micro-batches per rank it is not tried: on bench/plan.py's configurations
# with 2 (rl-math and rl-math-truncated, 128 x 8 and 1,024 x 64) it ended the search with
# a plan up to 0.07% longer than the packings', in no less time, and at 4,096 x 256 it did
# not end it and took half the search's time again.
_SLOT_FIRST_MIN_COUNT = 4


def _slot_first_candidate(
    req: _Request, m: int, notes: list[str], memo: dict[Any, Any]
) -> Plan | None:
    """The slot-first plan at ``m`` micro-batches (:mod:`._slot_first`), its slots evened
    out across the ranks (:mod:`._slot_balance`) and, where that leaves it within
    ``_SLOT_FIRST_GAPS`` stop gaps of the step bound, slack-filled
    (:func:`._slots.fill_slack`), each down to the stop gap; or None.

    Where the token cap binds and the cost is quadratic, full micro-batches spread in
    cost, and the packings' slots keep part of that spread: capacitated LPT finds no
    packing and the packers fall back to first-fit decreasing, whose slots then take a
    long slack filling and the whole search (rl-math, 1,024 sequences over 8 ranks x 19
    at 98% fill: 0.18% above the bound after every candidate). This plan chooses every
    slot's sequences first, in bands of nearly equal lengths, so that each slot splits
    evenly (there: within 0.1% of the bound, where the search stops). It is tried where
    the capacity-aware greedy plan stranded a sequence at ``m`` (the sign that the cap
    binds, which the greedy plan finds for free): FSDP at ``effort="default"`` (at
    ``"thorough"`` as one more candidate, evened out and slack-filled as far as those
    passes go; not at ``"fast"``), free size, no groups, packed, no pipeline, no extra
    counts, no ``order``, at least ``_SLOT_FIRST_MIN_COUNT`` micro-batches per rank (with
    fewer the packings' slots line up nearly as well), at most
    ``_SLOT_FIRST_MAX_ITEMS`` sequences, and only where the partition bound is the
    binding one (where long sequences set the slot bound, the bands put them side by
    side); None elsewhere, or where it has no plan.
    """
    if (req.pp is not None or req.extra or req.padded or req.order is not None
            or req.sync != "fsdp" or not req.budget.candidates or req.size != "free"
            or req.groups is not None or m < _SLOT_FIRST_MIN_COUNT
            or req.n > _SLOT_FIRST_MAX_ITEMS or not memo.get(("greedy_stranded", m))):
        return None  # fmt: skip
    thorough = req.budget.thorough
    enough = None if thorough else _enough(req, m, memo)
    if (enough is None and not thorough) or _slots_set_step(req, memo):
        return None
    grid = slot_first(req.costs, req.lens, req.dp, m, req.cap)
    if grid is None:
        return None
    won = as_text(Note("won_slot_first", {"ranks": term("ranks")}, _SLOT_FIRST_NOTE))
    if enough is None:  # ("thorough": evened out and slack-filled as far as they go)
        grid = balance_slots(grid, req.costs, req.lens, req.cap)
        grid = _fill_slack(grid, req.costs, req.lens, req.cap, req.budget,
                           fill_work=req.fill_work)  # fmt: skip
        return _plan_of(req, grid, [*notes, won])
    stop = enough - m * req.c0  # (a sum of slot maxima: c0 per slot is apart)
    gap = cast(float, req.budget.stop_gap)
    # (each slot's share of the stop gap on the sequences' costs: the bound less the
    # per-micro-batch costs, over the slots)
    share = gap * (enough / (1.0 + gap) - m * req.c0) / m
    grid = balance_slots(grid, req.costs, req.lens, req.cap, stop_at=stop,
                         work=_SLOT_FIRST_BALANCE_WORK * req.n,
                         slot_gap=_SLOT_FIRST_SLOT_SHARE * share)  # fmt: skip
    step = _step_time(grid, req.costs, req.c0, False, "fsdp")
    if enough < step <= enough / (1.0 + gap) * (1.0 + _SLOT_FIRST_GAPS * gap):
        work = min(req.budget.swap_work, _SLOT_FIRST_FILL_WORK)
        grid = fill_slack(grid, req.costs, req.lens, req.cap,
                          max_steps=req.budget.step_factor * req.dp * m + 100,
                          swap_work=work, move_work=work, retry=False, stop_at=stop)  # fmt: skip
    return _plan_of(req, grid, [*notes, won])


def _enough(req: _Request, m: int, memo: dict[Any, Any] | None = None) -> float | None:
    """A step within the budget's stop gap of the step bound at ``m`` micro-batches
    (:func:`.bounds.capacity_step_bound`), or None where the budget never stops early or
    the step is judged otherwise (pipelines, extra counts, ``order=``, padded).
    Kept in ``memo`` per count."""
    gap = req.budget.stop_gap
    if gap is None or req.pp is not None or req.extra or req.order is not None or req.padded:
        return None
    key = ("step_bound", m)
    if memo is None or key not in memo:
        bound = _step_bound(req, m, memo)
        if memo is None:
            return bound * (1.0 + gap)
        memo[key] = bound
    return float(memo[key]) * (1.0 + gap)


def _settle(req: _Request, m: int, memo: dict[Any, Any]) -> float | None:
    """The step down to which the global packings' slots are evened out across the ranks
    (:func:`_plan_global`'s ``settle``), FSDP without a pipeline: at ``effort="thorough"``
    all the way (0); below it, to within the search's stop gap of the step bound
    (:func:`_candidate_gap`: above ``_PIPELINE_MAX_ITEMS`` sequences the search stops at
    five gaps, and evening out 32,768 sequences further cost more than it gained). None
    (not evened out) otherwise, at ``effort="fast"`` and where the budget never stops
    early."""
    if req.sync != "fsdp" or req.padded or req.pp is not None or not req.budget.candidates:
        return None  # ("fast": its packing is slack-filled on a small budget, no more)
    if req.budget.thorough:
        return 0.0
    stop = _candidate_gap(req)
    if stop is None or _enough(req, m, memo) is None:
        return None
    return float(memo[("step_bound", m)]) * (1.0 + stop)  # (the bound _enough keeps)


def _step_bound(req: _Request, m: int, memo: dict[Any, Any] | None) -> float:
    """:func:`.bounds.capacity_step_bound` of the request at ``m`` micro-batches; the terms
    that do not depend on ``m`` are computed once, in ``memo`` (when given)."""
    if req.n == 0 or memo is None:
        return capacity_step_bound(
            req.costs, req.lens, req.dp, req.cap, sync=req.sync, per_microbatch=req.c0,
            size=req.size, groups=req.groups, min_micro_batches_given=m,
        )  # fmt: skip
    p, s, m_cap = _bound_terms(req, memo)
    # At m micro-batches per rank each rank holds at most m * cap tokens: where long costly
    # sequences fill the ranks that hold them in cost long before in tokens, that bound
    # (rank_token_bound) is above the partition's. It holds for plans of at most m per
    # rank, the plans this bound is asked about (the pick takes the fewest count).
    key = ("rank_tokens", m)
    if key not in memo:
        memo[key] = rank_token_bound(req.costs, req.lens, req.dp, m, req.cap)
    r = memo[key]
    packed = memo.get("packed_slot") or 0.0  # (_sharpened_slot_bound's, once it has run)
    return float(max(p, s, r, packed) + max(m, m_cap) * req.c0)  # (as capacity_step_bound)


def _bound_terms(req: _Request, memo: dict[Any, Any]) -> tuple[float, float, int]:
    """:func:`.bounds._step_bound_terms` of the request, kept in ``memo``."""
    if "bound_terms" not in memo:
        memo["bound_terms"] = _step_bound_terms(
            req.costs, req.lens, req.dp, req.cap, sync=req.sync, size=req.size,
            groups=req.groups, fewest=_fewest_by_bins(req),
        )  # fmt: skip
    return cast(tuple[float, float, int], memo["bound_terms"])


def _close_enough(
    req: _Request, candidates: list[Plan], first_m: int, memo: dict[Any, Any] | None = None
) -> bool:
    """Whether the fastest of ``candidates`` is within the budget's stop gap
    (:func:`_candidate_gap`) of the step-time lower bound
    (:func:`.bounds.capacity_step_bound`) and has ``first_m`` micro-batches, the fewest any
    plan can have: then no further candidate, a baseline included, can win by more than
    that gap, and none can win by having fewer micro-batches. Plain plans only (no
    pipeline, no extra counts)."""
    gap = _candidate_gap(req)
    if gap is None or req.pp is not None or req.extra or not candidates:
        return False
    if min(p.num_micro_batches for p in candidates) != first_m:
        return False
    # (the plans the pick would take: the bound at first_m holds for them, not for more)
    best = min(_step_in_order(req, p.micro_batches) for p in candidates
               if p.num_micro_batches == first_m)  # fmt: skip
    key = ("step_bound", first_m)
    if memo is not None and key in memo:
        bound = float(memo[key])
    else:
        bound = _step_bound(req, first_m, memo)
        if memo is not None:
            memo[key] = bound
    if best <= bound * (1.0 + gap):
        return True
    if memo is not None and _sharpened_slot_bound(req, memo):
        return best <= float(memo[key]) * (1.0 + gap)
    return False


def _sharpened_slot_bound(req: _Request, memo: dict[Any, Any]) -> bool:
    """Whether :func:`._packed_slot.packed_slot_bound` raised the request's FSDP slot
    bound (kept in ``memo`` beside the bound's terms, which stay as computed; the step
    bounds in ``memo`` are then recomputed with it). Asked once per
    request, and only where the slot bound is the binding term (the costliest sequence
    sets the step: long sequences, where packing them whole is what the fractional bound
    misses), under FSDP, up to ``_PIPELINE_MAX_ITEMS`` sequences."""
    if "packed_slot" in memo:
        return False
    memo["packed_slot"] = None
    if req.sync != "fsdp" or req.n > _PIPELINE_MAX_ITEMS or req.dp < 2:
        return False
    p, s, _ = _bound_terms(req, memo)
    if s < p:
        return False
    sharper = packed_slot_bound(req.costs, req.lens, req.dp, req.cap)
    if sharper <= s:
        return False
    memo["packed_slot"] = sharper
    for key in [k for k in memo if isinstance(k, tuple) and k and k[0] == "step_bound"]:
        memo[key] = _step_bound(req, key[1], memo)
    return True


# Above _PIPELINE_MAX_ITEMS sequences (where no baseline runs as a candidate) the default
# effort stops adding candidate families once the best plan is within this many stop gaps
# of the bound; each family's own search (slack filling's stop, the first packing kept
# alone) still aims at the stop gap. On bench/latency.py's rows of 32,768 and 65,536
# sequences the families left out (the global packings after the full-rank split where
# big sequences set the step, 3-6% above the bound there; the refill toward slot levels)
# changed no pick, and took up to half of the plan's time.
_LARGE_STOP_GAPS = 5.0


def _candidate_gap(req: _Request) -> float | None:
    """The gap to the step bound within which the search stops adding candidates: the
    budget's ``stop_gap``, ``_LARGE_STOP_GAPS`` of them above ``_PIPELINE_MAX_ITEMS``
    sequences; None where the budget never stops early."""
    gap = req.budget.stop_gap
    if gap is None or req.n <= _PIPELINE_MAX_ITEMS:
        return gap
    return gap * _LARGE_STOP_GAPS


def _slots_set_step(req: _Request, memo: dict[Any, Any]) -> bool:
    """Whether the FSDP slot bound (big sequences) is above the partition bound. Kept in
    ``memo``."""
    if "slots_set_step" not in memo:
        if req.sync == "fsdp" and req.size == "free" and req.groups is None and req.n:
            p, s, _ = _bound_terms(req, memo)
            memo["slots_set_step"] = bool(s > p)
        else:
            memo["slots_set_step"] = bool(
                fsdp_slot_bound(req.costs, req.lens, req.dp, req.cap)
                > lower_bound(req.costs, req.dp)
            )  # fmt: skip
    return bool(memo["slots_set_step"])


# The global packing keeps LPT's packing alone when it is within this many stop gaps of
# the step bound and the slot bound is not above the partition bound (see _lpt_enough).
_LPT_GAPS = 3.0


def _lpt_enough(req: _Request, m: int, memo: dict[Any, Any]) -> float | None:
    """A step at which the global packing keeps LPT's packing without the first-fit
    decreasing starts (the other candidates still run): ``_LPT_GAPS`` stop gaps above the
    step bound at ``m``, under FSDP where the slot bound is not above the partition bound;
    None otherwise (and below ``effort="default"``'s stop gap). There LPT's packing,
    slack-filled, was as fast as the best start on bench/plan.py's plans and
    bench/latency.py's rows but one, at about half the time. Where big sequences set the
    step, the tighter packings line slots up better, so they keep running. Above
    ``_LPT_ALONE_WORK`` (infinite): LPT's packing alone. Kept in ``memo``."""
    if req.sync != "fsdp" or req.budget.stop_gap is None or req.n * req.dp * m > _FFD_START_WORK:
        return None  # (above _FFD_START_WORK there are no first-fit decreasing starts)
    enough = _enough(req, m, memo)
    if enough is None or _slots_set_step(req, memo):
        return None
    if req.n * req.dp * m > _LPT_ALONE_WORK:
        return np.inf
    gap = req.budget.stop_gap
    return enough / (1.0 + gap) * (1.0 + _LPT_GAPS * gap)


# Above this many sequences x micro-batches (n x dp x m), where the slot bound is not above
# the partition bound, the default's global packing is LPT's alone: each further start
# costs a slack filling of the whole grid (rl-math, 8,192 sequences over 64 ranks x 17: a
# quarter of the plan's time) and changed no pick above this size on bench/plan.py's
# configurations and bench/latency.py's rows; below it, a start did (bimodal, 512
# sequences over 8 ranks: 0.10% shorter).
_LPT_ALONE_WORK = 1_000_000


def _busiest_floor(req: _Request, grid: list[list[list[int]]]) -> float:
    """:func:`_ranks_floor` of ``grid``'s ranks and count."""
    return _ranks_floor(req, [[s for mb in rank for s in mb] for rank in grid], len(grid[0]))


def _ranks_floor(req: _Request, ranks: list[list[int]], m: int) -> float:
    """The busiest of ``ranks``' totals plus ``m`` per-micro-batch costs: a floor of the
    FSDP step of any grid with these rank contents and ``m`` micro-batches per rank (a sum
    of slot maxima is at least the largest sum of a rank's micro-batches)."""
    return float(bin_totals(ranks, req.costs).max()) + m * req.c0


def _levelled(
    req: _Request, candidates: list[Plan], known: dict[int, float] | None = None,
    limit: int | None = None, skip: set[int] | None = None,
) -> list[Plan]:
    """Step 4a (fsdp, packed, no pipeline): each candidate that may still win, its slots
    refilled toward their levels (:func:`._slots.fill_to_levels`) where that is faster.

    Candidates are taken by a floor of what refilling can reach, lowest first: the busiest
    rank's total plus ``m`` per-micro-batch costs (a sum of slot maxima is at least the
    largest sum of a rank's micro-batches, and refilling keeps every rank's sequences and
    ``m``). The search stops at the first floor that cannot beat the fastest step found,
    and skips a candidate whose floor, or the FSDP slot bounds, leave it less than
    ``_LEVEL_MIN_GAIN`` to gain. Both tests keep the pick a function of each candidate
    alone (more candidates never make it worse). So the cost-balanced rank splits, whose
    slots are far apart before refilling, get it where the plan is well above the bound,
    and most candidates are never refilled. Steps are compared in the requested
    micro-batch order (``order="index"`` sorts each rank on its own, which can undo what
    the refill lined up). ``known`` maps ``id(plan)`` to steps already computed. ``limit``:
    refill at most this many candidates (lowest floor first). ``skip``: ``id``s of
    candidates not to refill (already were), which still count toward the best step.
    """
    if req.sync != "fsdp" or req.padded or req.pp is not None or req.dp < 2 or not candidates:
        return candidates
    m_min = min(p.num_micro_batches for p in candidates)
    pool = [i for i, p in enumerate(candidates) if req.extra or p.num_micro_batches == m_min]
    known = known or {}
    step = {}
    for i in pool:
        c = candidates[i]
        step[i] = known[id(c)] if id(c) in known else _step_in_order(req, c.micro_batches)

    floors = {i: _busiest_floor(req, candidates[i].micro_batches) for i in pool}
    slots: float | None = None  # the FSDP slot bounds, computed once if needed
    units = None if req.budget.thorough else _LEVEL_DEFAULT_UNITS
    best = min(step.values())
    out = list(candidates)
    for i in sorted(pool, key=lambda i: (floors[i], i)):
        if floors[i] >= best:
            break  # no refill of this or a later candidate can beat the best step
        if limit is not None and limit <= 0:
            break
        if skip is not None and id(candidates[i]) in skip:
            continue
        if candidates[i].num_micro_batches != m_min and counts_spent():
            continue  # an extra count's candidate, past the request's budget for them
        # Each candidate on its own: refilled only if it could gain _LEVEL_MIN_GAIN. (Not
        # relative to the best step: then more candidates could make the pick worse.)
        if floors[i] >= step[i] * (1.0 - _LEVEL_MIN_GAIN):
            continue
        if too_big_to_refill(candidates[i].micro_batches):
            continue
        if units is not None:
            # (below "thorough") each pass of the refill steps through every sequence
            # position of every slot, one numpy call per slot: work ~ m x (width + 8)
            grid_i = candidates[i].micro_batches
            width = max(sum(len(mb) for mb in rank) for rank in grid_i)
            need = len(grid_i[0]) * (width + 8)
            if need > units:
                continue
        if slots is None:
            slots = fsdp_slot_bound(req.costs, req.lens, req.dp, req.cap)
        m = candidates[i].num_micro_batches
        if slots + m * req.c0 >= step[i] * (1.0 - _LEVEL_MIN_GAIN):
            continue
        # (below "thorough": as many passes as the units left pay for, and those run spent)
        grid, ran = _fill_to_levels(req, candidates[i].micro_batches, slots,
                                    None if units is None else units // need)  # fmt: skip
        if units is not None:
            units -= ran * need
        if limit is not None:
            limit -= 1
        if grid is candidates[i].micro_batches:
            continue
        t = _step_in_order(req, grid)
        if t < step[i]:
            out[i] = _plan_of(req, grid, [*candidates[i].notes, _LEVELLED_NOTE])
            best = min(best, t)
    return out


def _fill_to_levels(
    req: _Request, grid: list[list[list[int]]], slots: float, passes: int | None = None
) -> tuple[list[list[list[int]]], int]:
    """:func:`._slots.fill_to_levels` of ``grid``, once per grid in a request (the fewest
    count planned again after the extra counts refills the same grids), and the passes it
    ran (counted where ``passes``, the most it may run, is given); ``grid`` itself when
    nothing improves."""
    cells = tuple(tuple(tuple(mb) for mb in rank) for rank in grid)
    key = ("levels", cells, req.costs.tobytes(), req.lens.tobytes(), req.cap, slots, passes)

    def make() -> tuple[list[list[list[int]]], int]:
        if passes is None:
            return fill_to_levels(grid, req.costs, req.lens, req.cap, slot_bound=slots), 0
        left = [passes]
        got = fill_to_levels(grid, req.costs, req.lens, req.cap, slot_bound=slots,
                             passes=left)  # fmt: skip
        return got, passes - left[0]

    got, ran = remembered(key, make)
    if got is grid or got == grid:
        return grid, ran
    return [[list(mb) for mb in rank] for rank in got], ran


# effort="default", above _LEVEL_LIMIT_ITEMS sequences: refill at most this many
# candidates (lowest floor first; the floor is the busiest rank's total, so the
# cost-balanced rank split comes first, the one refill that won on bench/plan.py's plans;
# on large inputs the others cost almost half the plan and none of them won). Small
# inputs refill every candidate that may gain: cheap there, and a second refill can win.
_LEVEL_DEFAULT_LIMIT = 1
# Below effort="thorough" the refills of one round (the candidates found; then a baseline
# that won the pick, :func:`_finished_baseline`) take at most this many units in all,
# each pass of a refill (2-16 of them) slots x (sequences per rank + 8), about 8 us a unit;
# a refill stops with its best grid when they run out, and a candidate whose first pass
# does not fit is not refilled (1,484 sequences over 2 ranks in 75 slots: 1 s a candidate,
# 11 candidates; 5 sequences in 32,768 slots: 7 s; rl-math 2,048 x 32 in 14 slots at 98%
# fill: two refills of 8 passes, 150 ms, when one pass was counted per candidate).
_LEVEL_DEFAULT_UNITS = 10_000
_LEVEL_LIMIT_ITEMS = 2048

# Refill a candidate only if its floor is this far below its own step: the refill costs
# up to ~0.1 s per candidate on 16,384 sequences over 256 ranks.
_LEVEL_MIN_GAIN = 5e-3
_LEVELLED_NOTE = as_text(Note(
    "levelled", {}, "its micro-batches were then refilled toward each slot's level (fsdp)"
))


def _pick(req: _Request, candidates: list[Plan], problems: list[str], n_splits: int) -> Plan:
    """Step 4: fewest micro-batches, then the lowest simulated step time."""
    if not candidates:
        hedge = (
            f" (for every {term('rank')} split the planner tried; with groups or a size rule "
            "this search "
            "is heuristic)"
            if n_splits > 1
            else ""
        )
        spec = req.pp.spec if req.pp is not None else None
        schedule = (
            " (the {schedule} schedule also needs a multiple of {@pp_size:{pp_size}} "
            "micro-batches: fewer stages, or {@schedule:'1f1b'})"
            if spec is not None and spec.count_multiple > 1
            else ""
        )
        raise NotedError(Note(
            "too_few_sequences",
            {"problem": problems[0] if problems else "no plan found", "hedge": hedge,
             "schedule": spec and spec.schedule, "pp_size": spec and spec.pp_size},
            "{problem}{hedge}; every micro-batch would "
            "need a sequence. Lower {@dp_size}, {@min_micro_batches} or {@micro_batch_multiple}"
            + schedule + ", raise {@max_tokens}, or pass {@allow_empty=True} to allow (marked) "
            "empty micro-batches",
        ))  # fmt: skip

    def key(p: Plan) -> tuple[float, ...]:
        if req.pp is None:
            t = _step_in_order(req, p.micro_batches)
        else:  # the pipeline step, in the best starting order (finish_plan searches more)
            args = (req.costs, req.c0, req.run_lens, req.padded, req.sync, req.pp)
            t = pipeline_step_time(pipeline_order_grid(p.micro_batches, *args, quick=True), *args)
        # Fewest micro-batches first, unless the caller asked to trade them for time.
        return (t,) if req.extra else (p.num_micro_batches, t)

    return min(candidates, key=key)


def _fewer_busy_may_win(req: _Request, m: int) -> bool:
    """Whether a plan with fewer busy micro-batches, the rest empty, is worth a candidate.

    Under FSDP every micro-batch index costs its heaviest rank's share, so when
    ``allow_empty=True`` and the count was raised past what the sequences need
    (``min_micro_batches``, ``micro_batch_multiple``), spreading them over every index can
    cost far more than packing them into fewer and leaving the rest empty: 1,233 against
    875 tokens for 7 sequences on 4 ranks at ``min_micro_batches=3``.
    """
    return (
        req.allow_empty
        and req.sync == "fsdp"
        and req.pp is None
        and req.per_mb is None
        and req.true_lens is None
        and not req.extra
        and (req.m_min > 1 or req.mult > 1)  # (so the plan of the fewer is not asked again)
        and m > _starting_micro_batches(replace(req, m_min=1, mult=1))[0]
    )


def _with_empty_tail(req: _Request, fewer: Plan, rival: Plan) -> Plan:
    """``fewer``'s micro-batches on each rank, then empty ones up to ``rival``'s count.

    Its notes are ``rival``'s (why the count is what it is), then ``fewer``'s own, each
    without its note on empty micro-batches, then the note on this grid's.
    """
    m = rival.num_micro_batches
    if fewer.num_micro_batches > m:
        return fewer  # more micro-batches: _pick drops it
    grid = [[list(mb) for mb in rank] + [[] for _ in range(m - len(rank))]
            for rank in fewer.micro_batches]  # fmt: skip
    notes: list[str] = []
    for p in (rival, fewer):
        empty = _empty_note(p.micro_batches)
        notes += [n for n in p.notes if n not in empty and n not in notes]
    return _plan_of(req, grid, [*notes, *_empty_note(grid)])


def _empty_note(grid: Any) -> list[str]:
    """The note on a plan's empty micro-batches (allowed by ``allow_empty=True``), if any."""
    empty = [(r, j) for r, rank in enumerate(grid) for j, mb in enumerate(rank) if not len(mb)]
    if not empty:
        return []
    return [as_text(Note("empty", {"count": len(empty), "first": empty[0]},
                         "{count} empty micro-batches ({@allow_empty=True}), first at {first}"))]


def _fixed_count(req: _Request, first_m: int, notes: list[str]) -> Plan:
    """``sequences_per_micro_batch``: the fewest micro-batches of at most that many
    sequences (counts within one) that fit the capacity; bins balanced by cost. With
    ``oversized="alone"`` each oversized sequence has a micro-batch of its own, outside the
    count rule."""
    per_mb = int(req.per_mb)  # type: ignore[arg-type]
    # oversized="alone": each sequence above the cap gets a micro-batch of its own, the
    # others share the remaining ones (at most per_mb each, counts within one).
    alone = (
        np.flatnonzero(req.true_lens > req.cap)
        if req.true_lens is not None
        else np.zeros(0, dtype=np.int64)
    )
    rest = np.setdiff1d(np.arange(req.n), alone)
    k = int(alone.size)
    m = _round_up(
        max(first_m, -(-(k + -(-int(rest.size) // per_mb)) // req.dp)), req.mult
    )
    start = m

    def too_few(m: int) -> NotedError:
        return NotedError(Note(
            "too_few_sequences", {"n": req.n, "dp": req.dp, "count": m},
            "{n} sequences cannot fill {dp} " + term("ranks") + " x {count} micro-batches; "
            "lower "
            "{@dp_size}, {@min_micro_batches} or {@micro_batch_multiple}, or pass "
            "{@allow_empty=True}",
        ))  # fmt: skip

    def bins_at(m: int) -> Any:
        if req.dp * m <= k:
            return []
        return fixed_count_bins(
            req.lens[rest], req.costs[rest], req.dp * m - k, per_mb, req.cap, req.padded
        )

    if req.asked.thorough:
        while True:
            if req.n < req.dp * m and not req.allow_empty:
                raise too_few(m)
            bins = bins_at(m)
            if not isinstance(bins, str):
                break
            m += req.mult
    else:
        m, bins = _fixed_count_gallop(req, start, bins_at, too_few)
    bins = [[int(i)] for i in alone] + [sorted(int(rest[i]) for i in b) for b in bins]
    if m > first_m:
        notes = [*notes, as_text(Note(
            "count_fixed",
            {"count": m, "n": req.n, "per_mb": per_mb,
             "reason": "capacity" if m > start else "count"},
            "{count} micro-batches per " + term("rank") + ": {n} sequences at most "
            "{@sequences_per_micro_batch:{per_mb}} per micro-batch, "
            + ("to fit {@max_tokens}" if m > start else "to hold them"),
        ))]  # fmt: skip
    grid = _deal_slots(bins, bin_totals(bins, req.costs, padded=req.padded), req.dp, m)
    return _with_grid(req, grid, [*notes, *_empty_note(grid)])


def _fixed_count_gallop(
    req: _Request, start: int, bins_at: Callable[[int], Any],
    too_few: Callable[[int], NotedError],
) -> tuple[int, Any]:
    """Below ``effort="thorough"``: the count of :func:`_fixed_count` by doubling steps
    from ``start``, then bisection between the last count that failed and the first that
    fit (counts that ``micro_batch_multiple`` allows). Where fitting is monotone in the
    count, the count the full search's one-step scan finds; that scan tried each count in
    turn (362 counts, 9 s, on 1,808 sequences at 16 a micro-batch on one rank).
    ``bins_at(m)``: the bins at ``m``, or a string where none fit."""
    mult = req.mult
    top = None if req.allow_empty else req.n // req.dp // mult * mult  # fewest too many
    failed, step, m = None, 0, start
    while True:
        if top is not None and m > top:
            if top < start or (failed is not None and failed >= top):
                raise too_few(max(m, start) if top < start else top + mult)
            m = top
        bins = bins_at(m)
        if not isinstance(bins, str):
            break
        failed = m
        if top is not None and m >= top:
            raise too_few(top + mult)
        step = mult if step == 0 else 2 * step
        m += step
    lo, hi = failed, m  # lo failed (or None: start fit), hi fits
    while lo is not None and hi - lo > mult:
        mid = lo + (hi - lo) // mult // 2 * mult
        found = bins_at(mid)
        if isinstance(found, str):
            lo = mid
        else:
            hi, bins = mid, found
    return hi, bins


def _plan_of(req: _Request, grid: list[list[list[int]]], notes: Any) -> Plan:
    """A Plan of ``grid`` for this request, micro-batches in the order given."""
    return Plan._from_validated(
        grid,
        req.run_lens,
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


def _with_grid(req: _Request, grid: list[list[list[int]]], notes: Any) -> Plan:
    """A Plan of ``grid`` for this request, in the requested micro-batch order."""
    if req.order is not None:
        grid = order_grid(grid, req.costs, req.c0, req.padded, req.order)
    return _plan_of(req, grid, notes)


class _NeedsMore(Exception):
    """A sequence longer than the cap (``oversized="alone"``) still shares its micro-batch
    at ``m`` micro-batches per rank: no micro-batch the rules let its sharers move to (its
    rank's, or with no size rule and no groups any rank's) is free of such a sequence."""

    def __init__(self, m: int) -> None:
        super().__init__(m)
        self.m = m


def _plan_once(**kw: Any) -> Plan:
    """:func:`plan` for one request as given (``plan`` adds the checks across counts).

    Below ``effort="thorough"`` (plain plans: no pipeline, no context parallelism) the
    partition exact searches are off unless the caller chose, and with a per-micro-batch
    cost a few larger counts are planned too (:func:`_by_count`).
    """
    budget = effort_of(kw.get("effort", "default"))
    plain = kw.get("pp_size", 1) == 1 and kw.get("cp_size", 1) == 1
    if budget.thorough or not plain:
        return _plan_alone(**kw)
    with exact_searches_unless_chosen(budget.exact):
        before = spent() or 0
        fewest = _plan_alone(**kw)
        return _by_count(kw, fewest, budget, (spent() or 0) - before)


def _by_count(kw: dict[str, Any], fewest: Plan, budget: Effort, last: int = 0) -> Plan:
    """``fewest``, or a plan with up to ``budget.counts`` more micro-batches per rank when
    its simulated step is shorter.

    With a per-micro-batch cost every micro-batch index costs that much more, while more
    micro-batches leave the packing more freedom to even out slots (under ``fsdp``) and
    ranks: which wins depends on the batch, so the count is chosen by the step (not with
    ``allow_empty``, ``extra_micro_batches`` or ``sequences_per_micro_batch``). The search
    starts at the fewest and tries one count more at a time (in steps of
    ``micro_batch_multiple``) while each is shorter than the best so far, and while the
    request's work with what the last count cost (``last``: the fewest's, at first) stays
    within ``COUNT_WORK`` (as every search for counts beyond the first; the plan's note
    then says where it stopped). A count is not planned when the best so far is within
    ``budget.stop_gap`` of a floor on every count from it up to the largest the search
    would try (:func:`_counts_floor` plus that many per-micro-batch costs): none of them
    can then gain more than the stop gap, the tolerance the search stops on everywhere
    else. Without that term the fewest stays.
    """
    if (not budget.counts or fewest.per_microbatch <= 0 or kw.get("extra_micro_batches")
            or kw.get("sequences_per_micro_batch") is not None or kw.get("allow_empty")
            or budget.stop_gap is None):  # fmt: skip
        # (allow_empty: larger counts would be planned with empty micro-batches, which the
        # fewer-busy candidate already weighs)
        return fewest
    best, best_step = fewest, _final_step(fewest)
    if fewest.simulate().gap <= budget.stop_gap:
        return fewest
    mult = int(kw.get("micro_batch_multiple", 1))
    floor = _counts_floor(fewest, fewest.num_micro_batches + budget.counts * mult)
    for k in range(1, budget.counts + 1):
        m = fewest.num_micro_batches + k * mult
        if best_step <= (floor + m * fewest.per_microbatch) * (1.0 + budget.stop_gap):
            # (every count from m to the largest tried is bounded below by floor + m
            # per-micro-batch costs: none can be shorter than the best so far by more
            # than the stop gap)
            break
        if counts_spent(last):  # (the next count costs about what the last one did)
            _note_counts_spent([best], m)
            break
        before = spent() or 0
        try:
            more = _plan_alone(**{**kw, "min_micro_batches": m})
        except ValueError:  # too few sequences for that many micro-batches
            break
        last = (spent() or 0) - before
        step = _final_step(more)
        if more.num_micro_batches != m or not step < best_step * (1 - _COUNT_GAIN):
            break
        best, best_step = more, step
    if best is fewest:
        return fewest
    best.notes = (
        *without_raised_to(best.notes, best.num_micro_batches),
        f"{best.num_micro_batches} micro-batches per rank instead of the fewest, "
        f"{fewest.num_micro_batches}: with the per-micro-batch cost, its simulated step is "
        f"{best_step / _final_step(fewest) - 1:+.2%} (counts above the fewest are tried one "
        "at a time while each is shorter)",
    )
    return best


def _counts_floor(fewest: Plan, top: int) -> float:
    """A floor on the sequence cost of the step (the step less its per-micro-batch costs)
    of every plan of ``fewest``'s request with ``fewest.num_micro_batches`` to ``top``
    micro-batches per rank: the terms of :func:`.bounds.capacity_step_bound` that do not
    grow with the count, the tokens-per-rank bound at ``top`` (it falls as the count
    grows) and, under FSDP where the slot bound binds, the packed slot bound."""
    costs, lens = np.asarray(fewest.costs, dtype=np.float64), np.asarray(fewest.lengths)
    if costs.size == 0:
        return 0.0
    dp, cap = fewest.dp_size, fewest.max_tokens
    groups = None if fewest.groups is None else np.asarray(fewest.groups)
    p, s, _ = _step_bound_terms(costs, lens, dp, cap, sync=fewest.sync, size=fewest.size,
                                groups=groups)  # fmt: skip
    floor = max(p, s, rank_token_bound(costs, lens, dp, top, cap))
    if fewest.sync == "fsdp" and dp >= 2 and s >= p and costs.size <= _PIPELINE_MAX_ITEMS:
        floor = max(floor, packed_slot_bound(costs, lens, dp, cap))
    return float(floor)


def _plan_alone(**kw: Any) -> Plan:
    """One request as given. With ``oversized="alone"``, "alone" is kept: a count at which
    some oversized sequence cannot be given a micro-batch of its own is planned again one
    count higher.
    """
    if kw["cp_size"] != 1:  # the CP planner, on the same request (checked by PlanSpec)
        return _plan_cp(kw)
    raised = None
    while True:
        try:
            p = _plan_attempt(**kw)
        except _NeedsMore as more:
            raised = more.m + 1
            kw = {**kw, "min_micro_batches": raised}
            continue
        if raised is not None:
            rank = term("rank")
            p.notes = (*without_raised_to(p.notes, raised), as_text(Note(
                "count_alone", {"count": p.num_micro_batches},
                "{@oversized:'alone'}: {count} micro-batches per " + rank + ", the fewest at "
                "which every sequence longer than {@max_tokens} runs alone (at fewer, every "
                "micro-batch of some " + rank + " held one, and the " + rank + "'s other "
                "sequences had nowhere else to go)",
            )))  # fmt: skip
        return p


def _plan_attempt(
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
    baselines: bool = True,
    cp_size: int = 1,
    cp: str = "static",
    cp_cost: Any = None,
    pp_size: int = 1,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    pp_comm: float = 0.0,
    effort: str = "default",
) -> Plan:
    """One planning pass for the request as given (:func:`_plan_once` repeats it)."""
    budget = effort_of(effort)
    # (cp_size > 1 is planned by plan_cp_spec: the entry points send it there)
    if cp_cost is not None:
        cost = cost_without_cp(cost, cp_cost)
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
    use_baselines = check_bool(baselines, "baselines")
    # The forward share of each sequence's cost, from its true length: with
    # oversized="alone" req.lens is clipped to the cap, and an oversized sequence's
    # backward (cost - forward) came out 13x its forward instead of about 2x.
    pp = pipeline_setup(req.run_lens, cost, pp_size, schedule, virtual_stages, pp_comm)
    user_mult = req.mult
    req = replace(req, asked=budget)
    if pp is not None:
        check_mesh(req.n, req.dp, 1, pp.spec.pp_size, pp.spec.virtual_stages)
        req = replace(req, pp=pp, mult=math.lcm(req.mult, pp.spec.count_multiple))
    else:  # (pipelined plans keep the full search: they have budgets of their own)
        req = replace(req, budget=budget)
    first_m, notes = _starting_micro_batches(req)
    alone_note = []
    if req.true_lens is not None and (req.true_lens > req.cap).any():
        over = np.flatnonzero(req.true_lens > req.cap)
        alone_note.append(as_text(Note(
            "oversized_alone", {"count": over.size, "cap": req.cap, "first": int(over[0])},
            "{count} sequences longer than {@max_tokens}={cap} run alone in their own "
            "micro-batches ({@oversized:'alone'}), first at index {first}"
            if over.size > 1 else
            "1 sequence longer than {@max_tokens}={cap} runs alone in its own micro-batch "
            "({@oversized:'alone'}), at index {first}",
        )))  # fmt: skip
        notes.extend(alone_note)
    if req.per_mb is not None:
        return _fixed_count(req, first_m, notes)
    splits = _rank_splits(req, first_m)
    candidates: list[Plan] = []
    problems: list[str] = []
    memo: dict[Any, Any] = {}
    early = _ddp_rank_first_at_bound(req, splits, first_m, notes, memo)
    if early is None:
        early = _ddp_rank_first_within_gap(req, splits, first_m, notes, memo)
    if early is not None:
        candidates.append(early)
    greedy = None if early is not None else _greedy_candidate(req, first_m, notes, memo)
    if greedy is not None:
        candidates.append(greedy)
        if _close_enough(req, candidates, first_m, memo):
            early = greedy
    # (fsdp, where the greedy plan stranded a sequence) The slot-first plan next: where it
    # is within the stop gap, the packings, the full-rank splits and the baselines are not
    # needed ("thorough": one more candidate).
    slotted = None if early is not None else _slot_first_candidate(req, first_m, notes, memo)
    if slotted is not None:
        candidates.append(slotted)
        if _close_enough(req, candidates, first_m, memo):
            early = slotted
    # (fsdp, below thorough) The full-rank split at first_m is tried early: when it is
    # within the stop gap, the packings are not needed. With one micro-batch per rank
    # the plan is a partition of the sequences over the ranks, which it makes directly,
    # so it comes first. So it does where the FSDP slot bound is above the partition
    # bound (big sequences set the step and keep the packings' slots apart: it is often
    # within the gap where the packings are not). Otherwise it comes between the global
    # packing's first start and the others (there the first start often is within the
    # gap, and trying the split first would cost more than it saves; "fast", which has no
    # other starts, does not try it there). When it is not within the gap it keeps its
    # usual place among the candidates below, so the pick is as without it.
    full_first: list[Plan] | None = None

    def full_rank_first(beat: float | None = None) -> bool:
        nonlocal full_first
        enough = _enough(req, first_m, memo)
        gap, stop = req.budget.stop_gap, _candidate_gap(req)
        if enough is not None and stop is not None and stop != gap:
            # (the second split is a family of its own: kept out where _close_enough stops)
            enough = float(memo[("step_bound", first_m)]) * (1.0 + stop)
        full_first = _full_rank_candidates(req, first_m, [], enough, memo=memo, beat=beat)
        return _close_enough(req, full_first, first_m, memo)

    interim = None
    if early is None and req.sync == "fsdp" and req.budget.stop_gap is not None:
        small = req.n <= _PIPELINE_MAX_ITEMS
        if (first_m == 1 and small) or (first_m > 1 and _slots_set_step(req, memo)):
            if full_rank_first():
                fastest = min(full_first or [],
                              key=lambda p: _step_in_order(req, p.micro_batches))
                # (one micro-batch per rank: with the request's notes only, as the
                # packings' plan would have)
                early = (_plan_of(req, fastest.micro_batches, notes) if first_m == 1
                         else fastest)  # fmt: skip
                candidates.append(early)
        elif small and req.budget.candidates:
            interim = full_rank_first
    # the best candidate is within the budget's stop_gap of the bound
    close = early is not None and _close_enough(req, candidates, first_m, memo)
    levelled: set[int] = set()  # (default effort) candidates already refilled, by id
    for rank_items in splits if early is None else []:
        m_stop = min((p.num_micro_batches for p in candidates), default=None)
        found = _search(req, rank_items, first_m, notes, memo, m_stop, interim)
        interim = None  # (the first split only)
        if isinstance(found, str):
            problems.append(found)
        else:
            candidates.extend(found)
        if full_first and _close_enough(req, full_first, first_m, memo):
            candidates.extend(full_first)
            full_first = []  # (taken)
        close = _close_enough(req, candidates, first_m, memo)
        if close or (candidates and not req.budget.candidates):
            break
    if full_first and early is None and not req.budget.candidates:
        candidates.extend(full_first)  # ("fast": built, so a candidate; no other runs)
    more = req.budget.candidates and not close
    m_best = min((p.num_micro_batches for p in candidates), default=None)
    if more and not req.budget.thorough:
        # The full-rank splits and the refill toward slot levels, then the baselines
        # (below, as they are) only while the plan may still be more than stop_gap above
        # the bound.
        candidates.extend(full_first if full_first is not None and m_best == first_m
                          else _full_rank_candidates(req, m_best, candidates, memo=memo))
        close = _close_enough(req, candidates, first_m, memo)
        if not close:
            candidates = _levelled(
                req, candidates,
                limit=_LEVEL_DEFAULT_LIMIT if req.n > _LEVEL_LIMIT_ITEMS else None,
            )  # fmt: skip
            levelled = {id(p) for p in candidates}
            close = _close_enough(req, candidates, first_m, memo)
        more = not close
    elif more:
        candidates.extend(_full_rank_candidates(req, m_best, candidates, memo=memo))
    if m_best is not None and _fewer_busy_may_win(req, m_best):
        rival = next(p for p in candidates if p.num_micro_batches == m_best)
        candidates.append(
            _with_empty_tail(
                req,
                _plan_checked(_flat_request(lengths, PlanSpec(
                    Mesh(dp_size, sync), Capacity(max_tokens, padded), cost,
                    MicroBatching(allow_empty=True), RankRules(size, groups),
                    baselines=baselines, effort=effort,
                )), pipeline_counts=True),
                rival,
            )
        )  # fmt: skip
    known: dict[int, float] = {}  # id(plan) -> step in order, for _levelled
    raw: dict[int, str] = {}  # id(plan) -> name, the baselines kept as they are
    # With extra counts too: the baselines at the fewest count are candidates as well, or
    # asking for more counts could end slower than not asking (+23% on 7 lengths).
    if use_baselines and more and req.budget.baselines != "none":
        known = {id(p): _step_in_order(req, p.micro_batches) for p in candidates
                 if p.num_micro_batches == m_best}  # fmt: skip
        best_step = min(known.values(), default=None)
        candidates.extend(_pipeline_candidates(req, m_best, best_step, m_best == first_m, raw))
    if req.budget.thorough:
        candidates = _levelled(req, candidates, known)
    elif more and req.budget.baselines == "filled":
        # a slack-filled baseline refilled toward slot levels can still win
        candidates = _levelled(req, candidates, skip=levelled)
    if greedy is not None and greedy is not early and any(p is greedy for p in candidates):
        # (last: on a tie the other candidates' plan stands)
        candidates = [p for p in candidates if p is not greedy] + [greedy]
    best = _pick(req, candidates, problems, len(splits))
    if (id(best) in raw and req.sync == "fsdp" and req.pp is None
            and not _close_enough(req, [best], first_m, memo)):  # fmt: skip
        best = _finished_baseline(req, best, raw[id(best)], problems, len(splits))
    # The request's notes (why the count is what it is, sequences that run alone), which
    # the candidates built beside the packings (full-rank splits, baselines) lack.
    missing = [n for n in notes if n not in best.notes]
    if (
        pp is None
        and req.sync == "ddp"
        and not req.padded
        and req.groups is None
        and best is not early
        and not close
    ):
        # (the early plan's busiest rank is within AUTO_RTOL of the bound: the exchange
        # could gain at most that)
        grid = exchange_between_ranks(
            best.micro_batches,
            req.costs,
            req.lens,
            req.cap,
            moves=req.size == "free",
            allow_empty=req.allow_empty,
        )
        if grid is not best.micro_batches:
            best = _plan_of(req, grid, best.notes)
    grid = best.micro_batches
    if req.true_lens is not None:
        # Packing saw each oversized sequence as exactly the cap: empty ones may share it.
        free = req.size == "free" and req.groups is None
        grid = separate_oversized(
            grid, req.true_lens, req.cap, across_ranks=free, padded=req.padded
        )
        if shares_oversized(grid, req.true_lens, req.cap):
            raise _NeedsMore(best.num_micro_batches)
    if pp is not None:
        if grid is not best.micro_batches:
            best = _plan_of(req, grid, best.notes)
        # Packings were compared in their best starting order; search the winner's order.
        best = finish_plan(best, pp, user_mult)
        best.notes = (*missing, *best.notes)
        return best
    if req.order is None and not missing and grid is best.micro_batches:
        return best
    return _with_grid(req, grid, [*missing, *best.notes])


def plan(
    lengths: Any,
    mesh: Mesh | PlanSpec | int | None = None,
    capacity: Capacity | int | None = None,
    *,
    cost: Any = None,
    batching: MicroBatching | None = None,
    rules: RankRules | None = None,
    effort: str = "default",
    **flat: Any,
) -> Plan:
    """Plan which sequences every data-parallel rank runs, micro-batch by micro-batch.

    Two forms, one planner: ``plan(lengths, Mesh(dp=8, sync="ddp"), Capacity(4096),
    batching=MicroBatching(min_count=2))`` takes the request as values
    (:mod:`seqbalance.planning.request`, each checked once when made); the flat form
    ``plan(lengths, dp_size=8, max_tokens=4096, sync="ddp", min_micro_batches=2)`` takes
    the same options one keyword each (``**flat``, the table
    :data:`~seqbalance.planning.request.FLAT_KEYWORDS`) and builds those values from them
    (:meth:`~seqbalance.planning.request.PlanSpec.from_keywords`), so both give the same
    plan, byte for byte. A number in place of ``mesh`` or ``capacity`` is ``dp_size`` or
    ``max_tokens``, and the flat keywords of that part fill it; next to a part given as a
    value, a flat keyword of that part is refused (each option is said in one place).

    Parameters
    ----------
    lengths : array-like of int
        Tokens per sequence.
    mesh : Mesh, PlanSpec or int
        The ranks, how they synchronise (``sync``), context parallelism and the pipeline;
        an int is ``dp_size``. A :class:`~seqbalance.planning.request.PlanSpec` is the
        whole request (``plan(lengths, spec)``), with nothing else given.
    capacity : Capacity or int
        Tokens per micro-batch, padding and oversized sequences; an int is ``max_tokens``.
    cost : optional
        What to balance: None (tokens), a cost model or anything
        :func:`seqbalance.costs.load_cost` accepts (model name, config path, cost JSON), or
        a 1-D array of per-sequence costs.
    batching : MicroBatching, optional
        Micro-batch counts, order and sizes (default: the fewest that fit).
    rules : RankRules, optional
        What a rank may hold: a size rule, groups (default: free).
    effort : {"fast", "default", "thorough"}
        How much work the search may spend, counted in operations (never in time, so every
        rank computes the same plan). ``"default"``, for planning every step: the search
        stops once the best plan is provably within 0.1% of the step-time lower bound
        (then no other candidate can beat it by more), otherwise the baseline pipelines
        still run as candidates; the partition exact searches on small inputs are off
        (unless inside ``exact_searches(True)``); with a per-micro-batch cost, counts
        above the fewest are tried one at a time while each gives a shorter simulated
        step. ``"thorough"``: the full search, slower, at most a fraction of a per cent
        better. ``"fast"``: the default's first candidates only (the DDP rank-first
        plan at the bound, the greedy plan, the full-rank split where tried first, the
        first rank split's packing with less slack filling, the DDP exchange), within
        the same stop gap, no baselines. Pipelined and context-parallel
        plans keep their full candidate search at every level; below ``"thorough"`` their
        exact searches, slack filling and static CP's replica plans take the effort's
        budgets (:mod:`seqbalance.planning._effort`).
    **flat
        The flat form's keywords, described below (``baselines``, a field of
        :class:`~seqbalance.planning.request.PlanSpec` but of none of its parts, is given
        here next to the parts).

    Other Parameters
    ----------------
    dp_size : int
        Number of data-parallel ranks.
    max_tokens : int
        Token capacity of one micro-batch (packed: sum of lengths; ``padded=True``:
        count x longest).
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
        micro-batches by their first sequence index, which under ``fsdp`` can misalign
        slots, so the planner then also picks among its candidates by their step in that
        order (the micro-batches may differ from ``order=None``'s). Either way the plan is
        never slower than ``order=None``'s plan put in that order.
    oversized : {"error", "alone"}
        What a sequence longer than ``max_tokens`` does: raise ValueError (default), or run
        alone in its own micro-batch (it then breaks the capacity, and ``plan.notes`` and
        ``plan.violations()["over_capacity"]`` count it).
    sequences_per_micro_batch : int, optional
        Every micro-batch holds at most this many sequences and the counts differ by at
        most one; ``m`` is the smallest count that holds all sequences (and meets the
        capacity, ``min_micro_batches`` and the multiple); with ``oversized="alone"`` a
        sequence above ``max_tokens`` takes a micro-batch of its own outside that count
        rule. Not with ``size``, ``groups`` or ``extra_micro_batches``.
    baselines : bool
        Also run the framework pipelines of :data:`BASELINES` as candidates, so that the
        plan is never worse than any of them (default). False skips them: much faster on
        large inputs, for callers that replace one of those pipelines
        (:mod:`seqbalance.compat`) or call plan in a loop.
    cp_size, cp, cp_cost : optional
        Context parallelism over a ``dp_size x cp_size`` mesh (``max_tokens`` per GPU):
        ``cp="static"`` splits every sequence over its replica's ``cp_size`` GPUs,
        ``cp="dynamic"`` picks a power-of-two degree per sequence; ``cp_cost`` prices the
        communication. ``cp_size > 1`` returns a
        :class:`~seqbalance.planning.cp_plans.CPPlan`; see
        :func:`seqbalance.planning.planner.plan_cp`, which honours ``baselines``.
        Static CP plans the replicas with ``size``, ``groups``, ``order``, ``oversized``,
        ``extra_micro_batches`` and ``sequences_per_micro_batch`` as without CP (a
        replica is a rank), and with ``pp_size > 1`` makes each replica a pipeline whose
        stages are CP rings (:mod:`seqbalance.planning.cp_pipeline`); dynamic CP refuses
        all of these other than their defaults, and both refuse ``padded``. At ``cp_size=1`` a
        ``cp_cost`` is still checked, and a sequence cost inside a ``ContextParallelCost``
        is the one planned with.
    pp_size : int
        Pipeline stages per data-parallel replica (``dp_size`` counts replicas). Above 1,
        the plan orders each replica's micro-batches (``fsdp``: the slots) for the pipeline
        schedule and records the layout in ``plan.pipeline``; see
        :meth:`Plan.simulate_pipeline`. When the fewest micro-batches the rules allow are
        fewer than ``pp_size`` (every stage idles part of the step), the larger counts up
        to the first at or above ``pp_size`` are planned too (in steps of
        ``micro_batch_multiple``, while every micro-batch still gets a sequence) and a
        larger one is kept when its simulated pipeline step is shorter (``plan.notes``
        says so); with ``extra_micro_batches`` the plan is never slower than without it.
        1 (default) plans exactly as without pipelines.
    schedule : {"1f1b", "interleaved", "gpipe"}
        Pipeline schedule (:mod:`seqbalance.planning.pipeline`). ``"interleaved"`` needs
        ``virtual_stages >= 2`` and a micro-batch count that is a multiple of ``pp_size``
        (``micro_batch_multiple`` is raised to a multiple of it). With ``pp_size=1`` it
        is checked but changes nothing (one stage runs alike under every schedule), so a
        config may pass its schedule whatever its pipeline size; ``pp_comm`` there is
        refused (no stage boundaries to cross).
    virtual_stages : int
        Model chunks per stage for ``"interleaved"``.
    pp_comm : float
        Time (in cost units) to send one token's activations between two stages; default 0.
    Returns
    -------
    Plan
        Every rank has the same number ``m`` of micro-batches, no micro-batch exceeds
        ``max_tokens``, every index appears exactly once.

    Raises
    ------
    ValueError
        On bad arguments (an :class:`~seqbalance._validate.ArgumentError` naming the
        flat keyword, ``.argument``), a sequence longer than ``max_tokens``, too few sequences for
        non-empty micro-batches, or a size rule that cannot be met. Absurd sizes are
        refused before anything is allocated (the table of
        :mod:`seqbalance.planning.limits`): ``max_tokens >= 2**62``; ``dp_size``,
        ``min_micro_batches``, ``micro_batch_multiple``, ``extra_micro_batches`` or (with
        ``allow_empty``) ``dp_size x m`` above ``n + 2**16``; ``pp_size`` or ``pp_size x
        virtual_stages`` above ``2**8``; CP meshes beyond ``2**20`` GPUs or
        ``cp_size x n + 2**16`` GPU slots; costs whose sum overflows.

    Notes
    -----
    On small inputs (at most 64 sequences in a partition or a packing question) the plan
    runs exact searches that may take up to about a second in all; inside
    ``with seqbalance.exact_searches(False):`` it keeps to milliseconds, with partitions
    from the refined heuristics and a smaller budget for the micro-batch count search
    (:mod:`seqbalance.partitioning.searches`).

    Examples
    --------
    >>> from seqbalance.planning.request import Capacity, Mesh
    >>> p = plan([900, 100, 500, 500, 300, 700], Mesh(dp=2), Capacity(max_tokens=1000))
    >>> p.num_micro_batches
    2
    >>> p.to_json() == plan([900, 100, 500, 500, 300, 700], dp_size=2, max_tokens=1000).to_json()
    True
    >>> p = plan([900, 100, 500, 500, 300, 700], dp_size=2, max_tokens=1000)
    >>> p.num_micro_batches
    2
    >>> sorted(len(mb) for rank in p.micro_batches for mb in rank)
    [1, 1, 2, 2]
    """
    spec = PlanSpec.from_keywords(
        mesh, capacity, cost=cost, batching=batching, rules=rules, effort=effort, flat=flat
    )
    with exact_work_pool(exact_pool(spec.effort)), work_meter():
        return _plan_checked(_flat_request(lengths, spec), pipeline_counts=True)


def plan_cp(
    lengths: Any,
    mesh: Mesh | PlanSpec | int | None = None,
    capacity: Capacity | int | None = None,
    *,
    cost: Any = None,
    batching: MicroBatching | None = None,
    rules: RankRules | None = None,
    effort: str = "default",
    **flat: Any,
) -> CPPlan:
    """:func:`plan` for a mesh with context parallelism: the same two forms, and a
    :class:`~seqbalance.planning.cp_plans.CPPlan` always.

    ``Mesh(dp, cp=C, cp_mode=...)`` (flat: ``cp_size=C, cp=...``) with ``C >= 2`` a power
    of two; what each option means under CP is in
    :func:`seqbalance.planning.context_parallel.plan_cp_spec`'s notes below.

    Raises
    ------
    ArgumentError
        ``cp_size`` below 2, or any bad value as :func:`plan` says it.
    """
    spec = PlanSpec.from_keywords(
        mesh, capacity, cost=cost, batching=batching, rules=rules, effort=effort, flat=flat,
        caller="plan_cp",
    )
    if not spec.mesh.cp_enabled:
        raise ArgumentError(
            f"plan_cp needs cp_size >= 2, got {spec.mesh.cp}; call plan() for cp_size=1",
            argument="cp_size",
        )
    return plan_cp_spec(lengths, spec, _plan_replicas)


def _flat_request(lengths: Any, spec: PlanSpec) -> dict[str, Any]:
    """The keywords the planner's passes read (:meth:`PlanSpec.keywords`), with the
    lengths."""
    return {"lengths": lengths, **spec.keywords(), "effort": spec.effort}


def _plan_cp(kw: dict[str, Any]) -> Plan:
    """``cp_size > 1``: the request ``kw`` (:func:`_flat_request`'s) planned by
    :func:`~seqbalance.planning.context_parallel.plan_cp_spec`."""
    flat = {name: kw[name] for name in FLAT_KEYWORDS}
    spec = PlanSpec.from_keywords(cost=kw["cost"], effort=kw.get("effort", "default"), flat=flat)
    return plan_cp_spec(kw["lengths"], spec, _plan_replicas)


def _plan_replicas(
    lengths: Any, dp_size: int, max_tokens: int, *, cost: Any, **options: Any
) -> Plan:
    """:func:`plan` without the count search for pipelines below ``pp_size`` micro-batches
    (static CP plans its replicas with it, then searches the counts on the CP plan); the
    CP planner is handed this function (it sits below this module)."""
    # (static CP passes its request's effort; the full search unless it does)
    spec = PlanSpec.from_keywords(
        dp_size, max_tokens, cost=cost, effort=options.pop("effort", "thorough"), flat=options
    )
    return _plan_checked(_flat_request(lengths, spec), pipeline_counts=False)


def _plan_checked(kw: dict[str, Any], pipeline_counts: bool) -> Plan:
    """:func:`plan` from its arguments ``kw``: the search, then the checks across counts.

    ``pipeline_counts=False`` leaves out the count search for pipelines whose fewest
    micro-batches are below ``pp_size`` (static CP plans its replicas through this, and
    searches the counts once, on the CP plan).
    """
    extra = kw["extra_micro_batches"]
    best = _plan_in_order(kw)
    if best.pipeline is not None:
        chosen = _pipeline_count(kw, best, pipeline_counts)
        if pipeline_counts and chosen.__class__ is Plan:
            return _flat_candidate(kw, chosen)
        return chosen
    if extra and best.__class__ is Plan:
        # The pick between counts sees each count's step before the ddp rank exchange,
        # which runs on the winner only, and it skips the fewer-busy candidate: the plan
        # made as without extra counts is checked too, so asking for more counts is never
        # slower (a hypothesis draw found 296.1 against 295.09: the counts tied at 296.1,
        # the larger won, and only the fewest's exchange would have gained).
        fewest = _plan_in_order({**kw, "extra_micro_batches": 0})
        if _final_step(fewest) <= _final_step(best):
            return _kept_fewest(fewest, extra)
    return best


def _plan_in_order(kw: dict[str, Any]) -> Plan:
    """:func:`_plan_once`; with ``order=`` (plain plans) the plan made without it, put in
    that order, and with ``"index"`` also the plan whose candidates were judged in that
    order: whichever has the shorter simulated step (ties: the latter). The latter is left
    out where no order changes a step (one rank, ``ddp``), and below ``"thorough"`` where
    the former is within the stop gap of the step's lower bound.

    So an ordered plan is never slower than the plan made without ``order`` reordered
    afterwards: candidates judged in the order stop and refill differently, and ``"index"``
    sorts each rank on its own (which can misalign FSDP slots), so the search in order can
    miss the packing the plain search keeps (341 against 340 on 31 lengths over 2 ranks).
    The plain plan is made first, so it is the plan ``order=None`` gives. Slot orders keep
    every step, so there it is the plan. Both plans draw on the request's one work meter:
    with ``extra_micro_batches`` the second plans the counts the budget has left
    (:data:`._work.COUNT_WORK`), so asking for an order at most doubles the fewest count's
    work, never the extra counts', and its plan is still never slower than the first one
    reordered.
    """
    order = kw.get("order")
    if (order is None or kw.get("pp_size", 1) != 1 or kw.get("cp_size", 1) != 1
            or kw.get("sequences_per_micro_batch") is not None):  # fmt: skip
        # (sequences_per_micro_batch: its bins do not depend on the order)
        return _plan_once(**kw)
    plain = _plan_once(**{**kw, "order": None})
    grid = order_grid(plain.micro_batches, plain.costs, plain.per_microbatch, plain.padded,
                      order)  # fmt: skip
    reordered = Plan._from_validated(
        grid, plain.lengths, max_tokens=plain.max_tokens, costs=plain.costs,
        per_microbatch=plain.per_microbatch, padded=plain.padded, sync=plain.sync,
        strategy=plain.strategy, notes=plain.note_items, size=plain.size, groups=plain.groups,
    )  # fmt: skip
    budget = effort_of(kw.get("effort", "default"))
    if order != "index" or kw["dp_size"] == 1 or kw["sync"] == "ddp":
        return reordered  # (one rank, or ddp: no order changes a step)
    if budget.stop_gap is not None and reordered.simulate().gap <= budget.stop_gap:
        return reordered  # (within the stop gap of the bound: no plan gains more)
    own = _plan_once(**kw)
    return own if _final_step(own) <= _final_step(reordered) else reordered


#: Pipelined requests of at most this many sequences, in at most this many micro-batches
#: over all ranks, also plan without the pipeline, and keep that plan when it runs the
#: pipeline faster (see :func:`_flat_candidate`).
FLAT_CANDIDATE_MAX_SEQUENCES = 1024
FLAT_CANDIDATE_MAX_SLOTS = 4096


def _flat_candidate(kw: dict[str, Any], chosen: Plan) -> Plan:
    """``chosen``, or the plan made without the pipeline (at the schedule's count multiple),
    run in its own order or the pipeline's best starting order and, when one of those is
    faster than ``chosen``, in the searched order too: whichever has the lowest simulated
    pipeline step.

    The pipelined packings are judged in their best starting order with each sequence's
    forward and backward apart; a packing made for the sync step alone can still run the
    pipeline faster, so a pipelined plan is never slower than the plain plan run through
    the same pipeline. (The pipeline's lower bound is of a plan's own slots, so a plan at
    its bound can still lose to another packing.) Planning that plan costs about as much
    again as the pipelined packings, and on larger requests they rarely lose to it: it is
    made for at most :data:`FLAT_CANDIDATE_MAX_SEQUENCES` sequences in at most
    :data:`FLAT_CANDIDATE_MAX_SLOTS` micro-batches (all ranks).
    """
    if (
        chosen.num_sequences > FLAT_CANDIDATE_MAX_SEQUENCES
        or chosen.dp_size * chosen.num_micro_batches > FLAT_CANDIDATE_MAX_SLOTS
    ):
        return chosen
    setup = chosen.pipeline
    flat_kw = {
        **kw,
        "pp_size": 1,
        "schedule": "1f1b",
        "virtual_stages": 1,
        "pp_comm": 0.0,
        # (the requested effort: the flat plan's slot refills can cost seconds in full)
        "effort": kw.get("effort", "thorough"),
        "micro_batch_multiple": math.lcm(
            int(kw["micro_batch_multiple"]), setup.spec.count_multiple
        ),
    }
    try:
        flat = _plan_checked(flat_kw, pipeline_counts=False)
    except ValueError:  # a count the schedule needs that the rules cannot fill
        return chosen
    chosen_step = _final_step(chosen)
    own = _plan_of_pipelined(flat, setup, flat.micro_batches)
    quick = _plan_of_pipelined(flat, setup, pipeline_order_grid(
        [list(r) for r in flat.micro_batches], flat.costs, flat.per_microbatch, flat.lengths,
        flat.padded, flat.sync, setup, quick=True,
    ))  # fmt: skip
    # ties: the pipeline's best start (min keeps the first)
    cheap_step, cheap = min(((_final_step(p), p) for p in (quick, own)), key=lambda c: c[0])
    if cheap_step >= chosen_step * (1 - _COUNT_GAIN):
        # Its own order and the best starting order both lose: the order search is left
        # out (it costs as much as the packing, and the guarantee is against these).
        return chosen
    ordered = finish_plan(
        _plan_of_pipelined(cheap, setup, cheap.micro_batches), setup,
        int(kw["micro_batch_multiple"]),
    )  # fmt: skip
    ordered_step = _final_step(ordered)
    rival, step = (ordered, ordered_step) if ordered_step <= cheap_step else (cheap, cheap_step)
    rival.notes = (
        *(ordered.notes if rival is ordered else flat.notes),
        "pipeline: the plan made without the pipeline, then ordered for it, has the "
        f"lower simulated step ({step / chosen_step - 1:+.2%} against the pipelined "
        "packings)",
    )
    return rival


def _plan_of_pipelined(p: Plan, setup: Any, grid: list[list[list[int]]]) -> Plan:
    """A copy of the plain plan ``p`` with the micro-batches ``grid`` (its own, reordered)
    that runs through the pipeline ``setup``."""
    out = Plan.__new__(Plan)
    out.__dict__.update(p.__dict__)
    out.micro_batches = [[list(mb) for mb in rank] for rank in grid]
    out.notes = tuple(p.notes)
    out.pipeline = setup
    return out


def _kept_fewest(fewest: Plan, extra: int) -> Plan:
    count = fewest.num_micro_batches
    fewest.notes = (
        *fewest.notes,
        as_text(Note("extra_counts", {"extra": extra, "count": count},
                     "{@extra_micro_batches:{extra}}: larger counts were tried, and "
                     "{count} " + ("micro-batch" if count == 1 else "micro-batches")
                     + " per " + term("rank") + " stayed the fastest")),
    )  # fmt: skip
    return fewest


#: A larger count must beat the fewest by more than this (relative) to be kept: steps that
#: differ by rounding alone (142.6 against 142.60000000000002) are a tie.
_COUNT_GAIN = 1e-9


def _pipeline_count(kw: dict[str, Any], best: Plan, search: bool) -> Plan:
    """The count of a pipelined plan. Fewer micro-batches than stages leave every stage
    idle part of the step (1F1B runs ``m + p - 1`` stage slots of work for ``m``), so when
    the fewest count is below ``pp_size`` the larger counts up to it are planned too
    (``search``), and whatever the caller's ``extra_micro_batches`` the plan is never
    slower than the fewest count's or than that search's (ties: fewer micro-batches)."""
    extra = kw["extra_micro_batches"]
    fewest = best if not extra else _plan_once(**{**kw, "extra_micro_batches": 0})
    auto = _pipeline_counts(fewest, kw["micro_batch_multiple"]) if search else 0
    more = _plan_once(**{**kw, "extra_micro_batches": auto}) if auto > extra else None
    if more is not None and _empties(more) > _empties(fewest):
        more = None  # a rank short of sequences (groups, size rules): no empties added
    steps: dict[int, float] = {}  # each plan simulated once (a wide CP mesh's costs 0.1 s)

    def step(p: Plan) -> float:
        if id(p) not in steps:
            steps[id(p)] = _final_step(p)
        return steps[id(p)]

    def same(a: Plan, b: Plan) -> bool:
        # Plans of one request (only the counts asked for differ) with the same slots run
        # the same step: no simulation tells them apart.
        if isinstance(a, CPPlan) and isinstance(b, CPPlan):
            return a.pieces == b.pieces
        return a.micro_batches == b.micro_batches

    chosen = fewest
    for rival in (best, more):
        if rival is not None and rival is not chosen and not same(rival, chosen) and (
            step(rival) < step(chosen) * (1 - _COUNT_GAIN)
        ):
            chosen = rival
    if chosen is more:
        assert more is not None
        word = "replica" if more.cp_size > 1 else "rank"
        m0, m1 = fewest.num_micro_batches, more.num_micro_batches
        more.notes = (
            # (the extra counts were this search's, not the caller's)
            *(n for n in more.notes if as_note(n).kind not in ("extra_count", "extra_counts")),
            f"pipeline: {m1} micro-batches per {word} instead of {m0}, the fewest the rules "
            f"allow, which leave stages idle (pp_size={more.pipeline.spec.pp_size}): "
            f"simulated step {step(more) / step(fewest) - 1:+.1%} (larger "
            "counts, up to the first at or above pp_size, are tried when the fewest is "
            "below it)",
        )
    elif chosen is fewest and extra:
        return _kept_fewest(fewest, extra)
    return chosen


def _empties(p: Plan) -> int:
    """``p.violations()["empty"]``, without the plan's other checks (a CP plan's cover
    and layout checks cost as much as planning a large mesh)."""
    if isinstance(p, CPPlan):
        return sum(1 for gpu in p.pieces for sl in gpu if not sl)
    return sum(1 for rank in p.micro_batches for mb in rank if not mb)


def _pipeline_counts(p: Plan, multiple: int) -> int:
    """How many larger counts (in steps of ``multiple``, the caller's
    ``micro_batch_multiple``; an interleaved schedule already runs ``pp_size`` or more)
    reach ``pp_size`` from ``p``'s count, when that is below it and every micro-batch of
    the larger counts can still hold a sequence; else 0."""
    m, stages = p.num_micro_batches, p.pipeline.spec.pp_size
    if m == 0 or m >= stages:
        return 0
    want = -(-(stages - m) // multiple)
    # counts whose micro-batches would not all get a sequence stay out (allow_empty would
    # fill them with empty ones, which the fewest did without)
    room = (int(p.lengths.shape[0]) // p.dp_size - m) // multiple
    return int(max(0, min(want, room)))


def _final_step(p: Plan) -> float:
    """The step a finished plan is judged by: its pipeline's, else its simulated one."""
    if p.pipeline is not None and isinstance(p, CPPlan):
        return p._planned_pipeline_step()  # (the planner's own pieces: no checks)
    return p.simulate_pipeline().step_time if p.pipeline is not None else p.simulate().step_time
