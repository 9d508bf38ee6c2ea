"""How much work one call of :func:`seqbalance.plan` may spend: ``effort=``.

A plan is made on every training step, on the critical path, so its search is bounded by a
work budget counted in operations (never in wall-clock time: every rank must compute the
same plan, byte for byte). Three levels:

``"thorough"``
    The full search: every candidate packing, every rank split, every baseline pipeline
    slack-filled as a candidate, the slot-first plan where the default tries it, the
    exact searches on small inputs, slack filling up to
    its own limits, and under FSDP the packings' slots evened out across the ranks
    (:mod:`._slot_balance`) within that pass's budget. The plan is never slower than any
    baseline that runs.
``"default"``
    For per-step use. The search stops adding candidates once the best plan so far is
    provably within ``stop_gap`` of the step-time lower bound at the fewest micro-batches
    (the largest of :func:`seqbalance.planning.bounds.capacity_step_bound`,
    :func:`~seqbalance.planning.bounds.rank_token_bound` at that count and, under FSDP
    where the costliest sequence sets the step, :mod:`._packed_slot`'s bound): then no
    other candidate, a baseline included, can be shorter by more than that. It checks
    after the capacity-aware greedy plan (:mod:`._capacity_greedy`, tried first; under
    FSDP its slots evened out across the ranks, :mod:`._slot_balance`), under FSDP
    where that plan stranded a sequence (the token cap binds) after the slot-first plan
    (:mod:`._slot_first`, evened out and slack-filled on a budget of its own), after
    the first packing (LPT; under FSDP, after slack filling and evening out, pairs of its
    micro-batches split anew, :mod:`._pair_split`, each packing of the global search
    alike), after the other starts and rank splits, and after the
    full-rank splits
    and the refill toward slot levels (under FSDP the full-rank split comes first where
    big sequences set the slot bound, else right after LPT's packing; under DDP the cost
    partition over the ranks stops within ``stop_gap`` of its bound, and its plan then
    stops the search); otherwise the baselines run as candidates as they
    are (not slack-filled), so the plan is never slower than any of them, and under FSDP
    one that wins the pick is then slack-filled and refilled as the full search does
    every baseline. Above 20,000
    sequences (where no baseline runs) the search stops adding candidate families (the
    second full-rank split, the packings, the refill) once within five stop gaps of the
    bound; each family's own search still aims at ``stop_gap``. The packer's
    refinement stops within ``refine_rtol`` of the mean bin; slack filling does not search
    a slot again until a step changes it, and the global packings then have each slot
    evened out across the ranks; the partition exact searches are off (as inside
    ``exact_searches(False)``, unless the caller chose). When the cost has a
    per-micro-batch term, counts above the fewest are planned one at a time while each
    runs a shorter simulated step, unless a bound on the larger counts it would try shows
    that none can be shorter by more than ``stop_gap``, and within the budget of work for
    counts beyond the first (``COUNT_WORK``).
``"fast"``
    The default's first steps, none of its later ones, with the same ``stop_gap``: the
    DDP rank-first plan at the bound, the capacity-aware greedy plan (both models), the
    full-rank split where the default tries it first (FSDP: one micro-batch per rank, or
    big sequences set the slot bound), then the first rank split's search (where ranks
    are free, the global packing: under FSDP or over one rank its LPT start only, slack
    filled on a small budget and not evened out further; under DDP over two or more
    ranks every start). The plan is the best of those, exchanged between ranks under DDP
    and judged in the requested order with ``order="index"`` as at the default. No other
    rank split, no slot-first plan, no full-rank split after the packing, no refill
    toward slot levels, no baselines, no count above the fewest. Its candidates are the
    default's first ones but the slot-first plan;
    where the default stops on one of them the plans can still differ through the
    packer's looser refinement stop, the smaller slack-filling budget and the slots not
    evened out (by less than the stop gap on the measured workloads).

Pipelined (``pp_size > 1``) and context-parallel plans run their own budgets
(:mod:`seqbalance.planning.limits`) and keep the full candidate search at every level;
below ``"thorough"`` they take the effort's exact-search nodes and slack filling's work,
static CP's replicas and a pipelined plan's rival planned without the pipeline are
planned at the effort. Below ``"thorough"`` the slot refills of the candidates share a
work budget (``planner._LEVEL_DEFAULT_UNITS``, counted per pass; a baseline that wins the
pick is refilled within a budget of its own), and with
``sequences_per_micro_batch`` the count is found by doubling steps and bisection.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_choice
from ..partitioning.searches import exact_searches_chosen
from ._exact import NODE_LIMIT
from .limits import EXACT_NODES_PER_REQUEST

__all__ = ["EFFORTS", "Effort", "effort_of", "exact_pool"]

EFFORTS = ("fast", "default", "thorough")


@dataclass(frozen=True)
class Effort:
    """The work budget of one planning request.

    Attributes
    ----------
    name : str
        One of :data:`EFFORTS`.
    stop_gap : float or None
        Stop adding candidates once the best plan is within this relative gap of the
        step-time lower bound at the fewest micro-batches; None never stops early.
    swap_work : float
        Slack filling's swap scans, in (sequences of a slot's heaviest micro-batch) x (all
        sequences) elements, per call; the moves that come first cost little.
    step_factor : int
        Slack filling's steps: ``step_factor * dp * m + 100`` at most.
    candidates : bool
        Go on past the first rank split's search (the other rank splits, the full-rank
        splits after the packings, the refill toward slot levels, the baselines); under
        FSDP also run every packing start, the full-rank split between them, and even
        out the packings' slots and split pairs of their micro-batches anew. False is
        ``"fast"``.
    baselines : str
        ``"filled"``: the baseline pipelines are candidates after slack filling;
        ``"raw"``: as they are; ``"none"``: not run.
    exact : bool
        Run the partition exact searches on small inputs (unless the caller turned them
        off with ``exact_searches(False)``).
    counts : int
        With a per-micro-batch cost, at most this many counts above the fewest, tried one
        at a time while each gives a shorter simulated step and, where ``stop_gap`` is
        set, while a bound leaves room for a gain above it, within ``COUNT_WORK``; 0: the
        fewest only.
    refine_rtol : float or None
        The packer's refinement stops once its heaviest bin is within this of the mean bin
        (or the costliest sequence); None: it runs until stuck or out of steps.
    exact_pool : int
        Exact-search nodes the whole request may spend (every plan, pipelined and
        context-parallel ones included; :func:`seqbalance.partitioning.searches.exact_work_pool`).
    joint_nodes : int
        Nodes of one joint rank x micro-batch exact search (small ruled requests whose
        packers found no packing): past them the note says a packing may still exist.
    """

    name: str
    stop_gap: float | None
    swap_work: float
    step_factor: int
    candidates: bool
    baselines: str
    exact: bool
    counts: int
    refine_rtol: float | None
    exact_pool: int = EXACT_NODES_PER_REQUEST
    joint_nodes: int = NODE_LIMIT

    @property
    def thorough(self) -> bool:
        return self.name == "thorough"


# The budgets. "default": 1e-3 is the gap to the bound within which no candidate is worth
# building; the baselines as they are (on bench/plan.py's plans slack-filling them
# changed no pick, at a large share of the plan's time); slack filling keeps the full
# search's swap budget (a smaller one left some FSDP configurations more than 0.1% behind
# the full search); refinement within 5e-4 of the mean bin keeps near-bound plans well
# within the stop gap.
# The exact-search nodes: "thorough" keeps EXACT_NODES_PER_REQUEST and the joint
# search's own limit (NODE_LIMIT); below it a request's exact
# searches (8-25 us a node in the partition searches, 35-75 us in the joint one) stay
# within a few tenths of a second (bench/bounds.py --reproducers).
_POOL, _JOINT = 2**15, 10_000
_LEVELS = {
    "thorough": Effort("thorough", None, 1.5e7, 2, True, "filled", True, 0, None),
    "default": Effort("default", 1e-3, 1.5e7, 2, True, "raw", False, 3, 5e-4, _POOL, _JOINT),
    "fast": Effort("fast", 1e-3, 2e5, 1, False, "none", False, 0, 1e-3, _POOL, _JOINT),
}


def exact_pool(effort: str) -> int:
    """The exact-search nodes of one request at ``effort``: the full pool (``"thorough"``'s)
    where the caller turned the searches on with ``exact_searches(True)``."""
    return _LEVELS["thorough" if exact_searches_chosen() else effort].exact_pool


def effort_of(value: object) -> Effort:
    """The budget named ``value``; a ValueError naming ``effort`` otherwise."""
    return _LEVELS[check_choice(value, "effort", EFFORTS)]
