"""Streaming plans: micro-batch slots released while rollouts are still arriving.

In asynchronous RL the trainer receives rollouts one by one, the long ones last. A
:class:`StreamingPlanner` buffers them and releases *slots* (one micro-batch per rank, each
under the token capacity, evened out against each other under the sync model) as soon as
the buffer can fill one well; :meth:`StreamingPlanner.flush` plans what is left with the
offline planner (:func:`seqbalance.plan`) at the end of the step.

The release rule (:class:`StreamingRule`)
------------------------------------------
Decisions are made per arriving sequence, in arrival order, never per call and never by
the clock. After each arrival, when the buffer holds at least ``fill * dp * max_tokens``
tokens (a slot cannot be filled with less), the planner tries to form a slot from the
buffer: buffered sequences, most expensive first, each into the micro-batch of least cost
that still has room (capacitated LPT; under ``ddp`` the least cost counts the rank's work
in the slots released before). When fewer than ``dp`` buffered sequences are longer than
half the cap (no two of them share a micro-batch), a second try leaves them out, so they
wait for more of their kind instead of making short-only micro-batches look light. A slot
is released when

- every micro-batch holds at least ``fill * max_tokens`` tokens, and
- the slot's work is at least ``balance`` of ``dp x`` its time (its heaviest micro-batch
  plus the per-micro-batch cost); under ``ddp``, where each rank runs its micro-batches
  back to back and the step lasts as long as the busiest rank, the same over each rank's
  work in the step so far, this slot included (packing gives a rank that took more
  before less now, so the slot alone looks uneven while the ranks stay level).

What waiting could still gain for such a slot is bounded: no slot of ``dp`` micro-batches
under the cap holds more than ``dp * max_tokens`` tokens, so a released slot holds at least
``fill`` of the most any slot could, and its time is at most ``1 / balance`` of a
perfectly even slot of the same sequences. With the defaults (``fill=0.9``,
``balance=0.95``) waiting could make it at most 10% fuller and 5% shorter.

Two more releases keep the end of the step short, where only the work left after the last
arrival counts:

- ``hold``: once the buffer holds ``hold * dp * max_tokens`` tokens (default: one full
  slot's worth), the best slot formed is released even below ``fill`` or ``balance``
  (the better-balanced of the two tries). Sequences that cannot be packed well (long ones
  without short ones to fill their micro-batches) would otherwise pile up for the flush.
- ``ready(idle=True)``: the trainer says it has nothing to run. Work started now is work
  not left for the end, so one more slot is released if every micro-batch can hold at
  least ``idle_fill * max_tokens`` tokens (default 0.1; the better-balanced try).

The budget: never later than waiting
-------------------------------------
No rule that sees only the arrivals can promise to end the step no later than "wait for
every rollout, then :func:`seqbalance.plan`": when the trainer is slower than generation,
a slot released early may still be running when a long last rollout arrives, and the
offline plan would have run that slot's sequences beside it for free. What decides it is
time, which the planner does not see. So :meth:`~StreamingPlanner.add` and
:meth:`~StreamingPlanner.ready` take a ``budget``: the most work (in the cost model's
units) a slot released in that call may take, or one number per rank. A trainer that
expects the last rollout at time ``A``, will be free at ``t`` and runs ``speed`` cost
units per second passes ``(A - t) * speed`` (under ``ddp`` per rank, each rank free at
its own ``t``). A slot over the budget is not released (an idle call forms a smaller
one: the token cap scaled down until it fits, the most work that fits, any fill). If
``A`` is no later than the real last arrival, every released slot is done by then; the
flush starts at the last arrival and is never slower than the offline plan of the whole
step (the guard below), so the step ends no later than waiting. Times stay outside the
planner: the budget is an input, in work, and the same budgets at the same points give
the same slots.

Under ``fsdp`` an empty micro-batch idles its rank for the whole slot. An idle slot that
fits the budget, leaves a micro-batch empty and takes more than a third of the budget is
among the last before the horizon; while the budget exceeds ``(1 + rule.defer) x`` its
time it is held back for rollouts that may fill it, and
:attr:`~StreamingPlanner.call_again_at` tells the trainer the budget at which to ask
again. It still fits the budget when released, so the guarantee is unchanged. No rule
that sees the arrivals (even with the budget) can always end the step no later than both
waiting and a greedy that starts a slot whenever an arrival fits none of its rows:
``docs/streaming.md`` gives two arrival sequences, the same up to the last arrival, that
need opposite decisions.

A failed try is repeated only after another ``retry * dp * max_tokens`` tokens have
arrived (a try packs the buffer once; this keeps :meth:`~StreamingPlanner.add` cheap).
With ``release="pull"`` nothing is released on arrival: every decision waits for
``ready(idle=True)`` (rule, then ``hold``, then ``idle_fill``), for trainers that ask for
work only when they need it.

The flush and its guard
-----------------------
:meth:`~StreamingPlanner.flush` plans the rest with :func:`seqbalance.plan`
(``allow_empty=True``: a short remainder may leave micro-batches empty). With
``guard=True`` (default) it also takes the offline plan of the *whole* step, removes the
sequences already released (and slots left empty everywhere), and returns whichever of the
two is faster under the sync model. So the flush is never slower than the offline plan of
the whole step. Hence, by construction, the step ends no later than "wait for every
rollout, then :func:`seqbalance.plan`" whenever the trainer has run the released slots by
the time the last rollout arrives: the step then ends at that arrival plus the flush, and
waiting ends at that arrival plus the whole plan. The budget above makes sure of that
case; without one, a trainer still busy then (training slower than generation) can end
later than waiting.

Guarantees
----------
Every sequence appears exactly once across the released slots and the flush; every slot
has ``dp_size`` micro-batches; no micro-batch exceeds ``max_tokens`` (``oversized="alone"``:
a longer sequence is held to the flush, where it runs alone, as in ``plan``); a group
never spans ranks (once a group has a sequence in a released slot, its later sequences go
to that rank). The slots, and their order, depend only on the sequence of arrivals
(lengths, ids, groups, in order) and on the positions in it of the ``ready(idle=True)``
calls and of the budgets: without budgets, how the arrivals are split into
:meth:`~StreamingPlanner.add` calls, and when plain :meth:`~StreamingPlanner.ready` is
called, changes only which call returns a slot.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import (
    ArgumentError,
    _as_1d,
    as_groups,
    as_lengths,
    check_bool,
    check_choice,
    check_degree,
    check_max_tokens,
    check_nonnegative_real,
    first_not_whole,
    group_ids,
    is_array_like,
)
from ..costs import load_cost
from ..planning._costing import sequence_costs
from ..planning._ordering import OVERSIZED
from ..planning.planner import _plan_by_rank, plan
from ..planning.simulation import SYNC_MODELS, microbatch_costs, step_time_of

__all__ = ["StreamingPlanner", "StreamingRule"]

Slot = list[list[int]]

# Looked up once: np.iinfo builds an object on every call.
_INT16_MAX = int(np.iinfo(np.int16).max)
_UINT16_MAX = int(np.iinfo(np.uint16).max)

RELEASES = ("arrival", "pull")


def _unit_real(value: Any, name: str, *, zero: bool = False) -> float:
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
    out = math.nan if bad else float(value)
    low_ok = out >= 0 if zero else out > 0
    if not (math.isfinite(out) and low_ok and out <= 1):
        low = "[0, 1]" if zero else "(0, 1]"
        raise ValueError(f"StreamingRule.{name} = {value!r} is invalid; pass a number in {low}")
    return out


@dataclass(frozen=True)
class StreamingRule:
    """When a :class:`StreamingPlanner` releases a slot (see the module docstring).

    Parameters
    ----------
    fill : float in (0, 1]
        Every micro-batch of a released slot holds at least ``fill * max_tokens`` tokens.
        Lower releases sooner, at the price of emptier slots (and so more of them).
    balance : float in (0, 1]
        A released slot's work is at least ``balance * dp x`` its time (its heaviest
        micro-batch plus the per-micro-batch cost): the slot is within ``1 / balance`` of
        perfectly even.
    hold : float >= fill
        Once the buffer holds ``hold * dp * max_tokens`` tokens, the best-balanced slot
        formed is released whatever its fill and balance.
    idle_fill : float in [0, 1]
        ``ready(idle=True)`` without a budget releases a slot whose micro-batches each
        hold at least ``idle_fill * max_tokens`` tokens (within a budget, any fill).
    retry : float in (0, 1]
        After a failed try, the next waits for ``retry * dp * max_tokens`` more tokens
        (a try packs the whole buffer: fewer tries keep :meth:`StreamingPlanner.add`
        cheap, and a slot that just missed the rule gains little from a try sooner).
    guard : bool
        The flush is never slower than the offline plan of the whole step with the
        released sequences taken out (it plans both and keeps the faster).
    release : {"arrival", "pull"}
        Release on arrival (default), or only when ``ready(idle=True)`` asks.
    defer : float in [0, 1]
        Under ``fsdp``, within a budget: an idle slot that would leave a micro-batch
        empty (its rank idle for the whole slot) and takes more than a third of the
        budget is held back while the budget exceeds ``(1 + defer) x`` its time, so that
        rollouts arriving meanwhile can fill it;
        :attr:`StreamingPlanner.call_again_at` says when to ask again. 0: never held.

    Examples
    --------
    >>> StreamingRule(fill=0.8).balance
    0.95
    >>> StreamingRule(fill=1.5)
    Traceback (most recent call last):
    ...
    ValueError: StreamingRule.fill = 1.5 is invalid; pass a number in (0, 1]
    """

    fill: float = 0.9
    balance: float = 0.95
    hold: float = 1.0
    idle_fill: float = 0.1
    retry: float = 0.1
    guard: bool = True
    release: str = "arrival"
    defer: float = 0.05

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "release", check_choice(self.release, "StreamingRule.release", RELEASES)
        )
        for name in ("fill", "balance", "retry"):
            object.__setattr__(self, name, _unit_real(getattr(self, name), name))
        object.__setattr__(self, "idle_fill", _unit_real(self.idle_fill, "idle_fill", zero=True))
        object.__setattr__(self, "defer", _unit_real(self.defer, "defer", zero=True))
        hold = self.hold
        number = isinstance(hold, (int, float, np.integer, np.floating))
        if isinstance(hold, bool) or not number or not self.fill <= float(hold) < math.inf:
            raise ValueError(
                f"StreamingRule.hold = {hold!r} is invalid; pass a number >= fill "
                f"({self.fill:g}): the buffer is released at hold x dp_size x max_tokens "
                "tokens, and below fill no slot could meet the rule"
            )
        object.__setattr__(self, "hold", float(hold))
        object.__setattr__(self, "guard", check_bool(self.guard, "StreamingRule.guard"))


class StreamingPlanner:
    """Balance micro-batch slots across data-parallel ranks as sequences arrive.

    Parameters
    ----------
    dp_size : int
        Data-parallel ranks; every slot holds one micro-batch per rank.
    max_tokens : int
        Token capacity of one micro-batch (packed: sum of lengths).
    cost : optional
        What to balance: None (tokens), a cost model, or anything
        :func:`seqbalance.costs.load_cost` accepts. Per-sequence cost arrays are refused
        (they would have to be known before the sequences arrive).
    sync : {"fsdp", "ddp"}
        How ranks synchronise (see :func:`seqbalance.simulate`).
    oversized : {"error", "alone"}
        A sequence longer than ``max_tokens``: :meth:`add` raises ValueError, or it is held
        to the flush and runs alone in a micro-batch, as ``plan(oversized="alone")``.
    rule : StreamingRule, optional
        When slots are released (default ``StreamingRule()``).

    Examples
    --------
    >>> sp = StreamingPlanner(2, 100)
    >>> sp.add([50, 45, 40, 60])
    >>> sp.ready()
    [[[2, 3], [0, 1]]]
    >>> sp.add([30, 25, 20])
    >>> sp.ready()
    []
    >>> [sorted(mb) for mb in sorted(sp.flush()[0])]
    [[4], [5, 6]]
    """

    def __init__(
        self,
        dp_size: int,
        max_tokens: int,
        *,
        cost: Any = None,
        sync: str = "fsdp",
        oversized: str = "error",
        rule: StreamingRule | None = None,
    ) -> None:
        self.dp_size = check_degree(dp_size, "dp_size")
        self.max_tokens = check_max_tokens(max_tokens)
        if is_array_like(cost):
            raise ValueError(
                "cost must be None, a cost model or a model name, not per-sequence costs "
                "(the sequences have not arrived yet); pass a cost model such as "
                "seqbalance.QuadraticCost(...)"
            )
        self.cost = cost
        # Loaded once (a name or a path fails here, not at the first add).
        self._model = None if cost is None else load_cost(cost)
        _, self._c0 = sequence_costs(np.zeros(1, dtype=np.int64), self._model)
        self.sync = check_choice(sync, "sync", SYNC_MODELS)
        self.oversized = check_choice(oversized, "oversized", OVERSIZED)
        if rule is None:
            rule = StreamingRule()
        if not isinstance(rule, StreamingRule):
            raise ValueError(
                f"rule must be a StreamingRule, got {type(rule).__name__}; "
                "pass seqbalance.StreamingRule(fill=..., balance=...)"
            )
        self.rule = rule
        self._reset()

    # ---- state -------------------------------------------------------------------------
    def _reset(self) -> None:
        self._ids: list[int] = []  # every arrival of the step, in order
        self._lens: list[int] = []
        self._costs: list[float] = []
        self._groups: list[Any] = []  # None where no group was given
        self._grouped = False  # some arrival of the step has a group
        # The same lengths and costs as arrays (grown by doubling), for the vectorised tries.
        self._len_arr = np.zeros(256, dtype=np.int64)
        self._cost_arr = np.zeros(256, dtype=np.float64)
        self._id_arr = np.zeros(256, dtype=np.int64)
        self._seen: set[int] = set()
        # Arrival positions not yet released, in order: those kept back from the last
        # release, then the run [tail, upto) added since (kept as an array: a try reads
        # the buffer as one).
        self._kept = np.zeros(0, dtype=np.int64)
        self._tail = 0
        self._upto = 0
        self._buffered_tokens = 0
        self._next_try: float = 0  # buffered tokens at which the next try is made
        self._queue: list[Slot] = []  # released, not yet returned by ready()
        # Released slots as arrival positions: per rank lists, or (positions grouped by
        # rank, where each rank's run ends) from the array path (no lists per rank kept).
        self._released: list[Any] = []
        self._pinned: dict[Any, int] = {}  # group -> rank it was released on
        self._rank_work = [0.0] * self.dp_size
        self._fill_tokens = self.rule.fill * self.max_tokens
        self._threshold = self._fill_tokens * self.dp_size
        self._step = self.rule.retry * self.dp_size * self.max_tokens
        self._hold = self.rule.hold * self.dp_size * self.max_tokens
        # The work a micro-batch released in this call may take, per rank (None: no limit).
        self._budget: np.ndarray | None = None
        self._over_budget = False  # the last try formed a slot over the budget
        self._call_again: float | None = None  # see call_again_at

    @property
    def num_buffered(self) -> int:
        """Sequences that arrived and are not yet in a released slot."""
        return int(self._kept.shape[0]) + self._upto - self._tail

    @property
    def call_again_at(self) -> float | None:
        """The budget at which to call ``ready(idle=True)`` again, or None.

        Set when the last ``ready(idle=True)`` held back a slot that fits its budget but
        would leave a micro-batch empty (``rule.defer``, ``fsdp``): rollouts arriving
        before the trainer's budget has fallen to this value may fill it. A trainer with
        horizon ``A`` and speed ``speed`` asks again at ``A - call_again_at / speed`` if
        nothing arrives before (at that budget the slot, or a fuller one, is released).
        """
        return self._call_again

    @property
    def num_released(self) -> int:
        """Slots released so far in this step (returned by :meth:`ready` or queued)."""
        return len(self._released)

    def __repr__(self) -> str:
        return (
            f"StreamingPlanner(dp_size={self.dp_size}, max_tokens={self.max_tokens}, "
            f"sync={self.sync!r}, buffered={self.num_buffered}, released={self.num_released})"
        )

    # ---- arrivals ----------------------------------------------------------------------
    def add(
        self, lengths: Any, ids: Any = None, groups: Any = None, *, budget: Any = None
    ) -> None:
        """Record arriving sequences (in arrival order) and release the slots they complete.

        Parameters
        ----------
        lengths : array-like of int
            Tokens per arriving sequence.
        ids : array-like of int, optional
            One id per sequence, unique within the step; default: the running arrival
            index (0, 1, ... over the step, restarting after :meth:`flush`).
        groups : array-like, optional
            Group id per sequence (numbers or strings): a group never spans ranks. Once a
            group has a sequence in a released slot, its later sequences go to that rank.
        budget : float or array-like of float, optional
            The most work (in the cost model's units, as :func:`seqbalance.simulate`'s
            step time) a slot released in this call may take, or one number per rank:
            see :meth:`ready`. None: no limit.

        Raises
        ------
        ValueError
            On bad input, before anything is recorded: the call then changes nothing.
        """
        lens = as_lengths(lengths)
        limit = _budget(budget, self.dp_size)
        n = lens.shape[0]
        if ids is None:
            start = len(self._ids)
            id_list = list(range(start, start + n))
            clash = next((i for i in id_list if i in self._seen), None)
            if clash is not None:
                raise ValueError(
                    f"ids: the running index {clash} was already given as an explicit id in "
                    "this step; pass ids on every add call, or on none"
                )
        else:
            id_arr = _as_1d(ids, "ids")
            if id_arr.shape[0] != n:
                raise ValueError(
                    f"ids has {id_arr.shape[0]} entries but there are {n} lengths; "
                    "pass one id per sequence"
                )
            if id_arr.dtype.kind == "f":
                k = first_not_whole(id_arr)
                if k is not None:
                    raise ValueError(f"ids[{k}] = {id_arr[k].item()!r} is not an integer id")
            id_list = [int(i) for i in id_arr.tolist()]
            if len(set(id_list)) < n or not self._seen.isdisjoint(id_list):
                seen = set(self._seen)
                for k, i in enumerate(id_list):
                    if i in seen:
                        raise ValueError(
                            f"ids[{k}] = {i} was already added in this step; every id must "
                            "be unique until flush()"
                        )
                    seen.add(i)
        if groups is None:
            group_list: list[Any] = [None] * n
        else:
            arr = group_ids(groups, "groups")
            as_groups(arr, n)  # length and finiteness, with the argument's name
            group_list = [_group_key(g) for g in arr.tolist()]
        if n and self.oversized == "error":
            over = np.flatnonzero(lens > self.max_tokens)
            if over.size:
                i = int(over[0])
                raise ValueError(
                    f"lengths[{i}] = {int(lens[i])} is longer than max_tokens = "
                    f"{self.max_tokens}; raise max_tokens, split or truncate such sequences, "
                    "or pass oversized='alone' to run them alone at the flush"
                )
        costs, _ = sequence_costs(lens, self._model)
        self._budget = limit
        try:
            self._record(id_list, lens, costs, group_list)
        finally:
            self._budget = None

    def _record(
        self, id_list: list[int], lens: np.ndarray, costs: np.ndarray, group_list: list[Any]
    ) -> None:
        """Append validated arrivals and make the decisions they trigger, in order.

        The rule is checked after each arrival that fits the cap; it can only trigger once
        the buffered tokens reach ``max(threshold, next try)``, so the arrivals between two
        such points are appended at once (cumulative sums find the next one).
        """
        n = lens.shape[0]
        start = len(self._ids)
        self._ids.extend(id_list)
        self._lens.extend(lens.tolist())
        self._costs.extend(costs.tolist())
        self._groups.extend(group_list)
        self._seen.update(id_list)
        if any(g is not None for g in group_list):
            self._grouped = True
        size = self._len_arr.shape[0]
        if start + n > size:
            while start + n > size:
                size *= 2
            self._len_arr = np.resize(self._len_arr, size)
            self._cost_arr = np.resize(self._cost_arr, size)
            self._id_arr = np.resize(self._id_arr, size)
        self._len_arr[start : start + n] = lens
        self._id_arr[start : start + n] = id_list
        self._cost_arr[start : start + n] = costs
        fits = lens <= self.max_tokens  # longer ones (oversized="alone") wait for the flush
        total = np.cumsum(np.where(fits, lens, 0))
        if self.rule.release == "arrival":
            checked = np.flatnonzero(fits)  # arrivals after which the rule is checked
            done = 0  # new arrivals [0, done) are in the buffer
            while True:
                before = int(total[done - 1]) if done else 0
                # The first checked arrival j at which buffered + total[j] - before
                # reaches the target (an integer count reaches a number at its ceiling).
                target = math.ceil(max(self._threshold, self._next_try))
                need = target - self._buffered_tokens + before
                lo = int(np.searchsorted(checked, done))
                at = lo + int(np.searchsorted(total[checked[lo:]], need))
                if at >= checked.shape[0]:
                    break
                j = int(checked[at])
                self._upto = start + j + 1
                self._buffered_tokens += int(total[j]) - before
                done = j + 1
                while self._buffered_tokens >= max(self._threshold, self._next_try):
                    mode = "force" if self._buffered_tokens >= self._hold else "rule"
                    self._over_budget = False
                    if not self._try_release(mode):
                        self._next_try = self._buffered_tokens + self._step
                        if not self._over_budget:
                            # At hold every arrival may release (the best slot formed);
                            # over the budget, the next try waits like any other.
                            self._next_try = min(self._next_try, self._hold)
                        break
        else:
            done = 0  # pull: decided when the trainer asks (ready(idle=True))
        if done < n:
            self._upto = start + n
            self._buffered_tokens += int(total[-1]) - (int(total[done - 1]) if done else 0)

    def _try_release(self, mode: str = "rule") -> bool:
        """Form a slot from the buffer and release it if it meets the rule and the budget.

        ``mode``: ``"rule"`` (fill and balance), ``"idle"`` (``idle_fill`` and balance),
        ``"force"`` (the buffer is at ``hold``: the best slot formed, whatever it is).

        A slot that takes more than the call's budget is not released. When the trainer
        is idle, a smaller one is formed instead: the token cap is scaled down by the
        budget over the slot's time (a micro-batch's cost grows at least in proportion to
        its tokens), a few times at most; any fill will do then (see :meth:`_fill_for`).
        """
        cap = self.max_tokens
        for _ in range(4):
            got = self._try_release_fast(mode, cap) if not self._grouped else (
                self._try_release_grouped(mode, cap)
            )
            if isinstance(got, bool):
                return got
            if mode != "idle":
                self._over_budget = True
                return False
            cap = min(int(cap * got), cap - 1)
            if cap < 1:
                break
        self._over_budget = True
        return False

    def _try_release_grouped(self, mode: str, cap: int) -> bool | float:
        """:meth:`_try_release` with groups, at token cap ``cap``: True when a slot was
        released, False when none met the rule, or, when the slot formed met the rule but
        not the budget, the factor to scale the cap by for a smaller one (:meth:`_over`)."""
        lens, costs = self._lens, self._costs
        buffer = self._buffer_array().tolist()
        cand = [p for p in buffer if lens[p] <= cap]
        # Most expensive first, then longest, then earliest: a fixed order.
        cand.sort(key=lambda p: (-costs[p], -lens[p], p))
        tries = [cand]
        big = sum(2 * lens[p] > cap for p in cand)  # no two of these share a micro-batch
        if 0 < big < self.dp_size:
            # Too few to give every rank one: a slot without them, so they wait for more
            # of their kind instead of leaving short-only micro-batches far lighter.
            tries.append([p for p in cand if 2 * lens[p] <= cap])
        fill = self._fill_for(mode, cap)
        best = None
        idle: list[Any] = []  # idle mode: the tries that fill every micro-batch to fill
        for order in tries:
            if not order:
                continue
            bins, tok, work = self._form(order, cap)
            eff = self._balance(work)
            if mode == "idle":
                if min(tok) >= fill:
                    idle.append((bins, tok, work, eff))
                continue
            if min(tok) >= fill and eff >= self.rule.balance:
                best = (bins, tok, work, eff)
                break
            if mode == "force" and (best is None or eff > best[3]):
                best = (bins, tok, work, eff)
        if mode == "idle":
            best = self._pick_idle(idle)
        if best is None:
            return False
        bins, tok, work = best[:3]
        scale = self._over(work)
        if scale is not None:
            return scale
        taken = {p for b in bins for p in b}
        self._keep([p for p in buffer if p not in taken])
        self._buffered_tokens -= sum(tok)
        self._next_try = 0
        for r, b in enumerate(bins):
            b.sort()
            self._rank_work[r] += work[r] + self._c0
            for p in b:
                g = self._groups[p]
                if g is not None:
                    self._pinned.setdefault(g, r)
        self._released.append(bins)
        self._queue.append([[self._ids[p] for p in b] for b in bins])
        return True

    def _try_release_fast(self, mode: str, cap: int) -> bool | float:
        """:meth:`_try_release_grouped` without groups, on arrays: the same slots, decided
        the same way (the same candidate order, the same packing, the same sums in the
        same order), at a cost that grows with the buffer divided by ``dp`` rather than
        the buffer."""
        dp = self.dp_size
        buf = self._buffer_array()
        lens_b = self._len_arr[buf]
        costs_b = self._cost_arr[buf]
        fit = np.flatnonzero(lens_b <= cap)
        fit = fit[_packing_order(lens_b[fit], costs_b[fit], cap)]
        tries = [fit]
        halves = 2 * lens_b[fit] <= cap
        big = fit.size - int(np.count_nonzero(halves))  # no two of these share a micro-batch
        if 0 < big < dp:
            # Too few to give every rank one: a slot without them, so they wait for more
            # of their kind instead of leaving short-only micro-batches far lighter.
            tries.append(fit[halves])
        fill = self._fill_for(mode, cap)
        base = (
            np.asarray(self._rank_work, dtype=np.float64)
            if self.sync == "ddp"
            else np.zeros(dp, dtype=np.float64)
        )
        best = None
        idle: list[Any] = []  # idle mode: the tries that fill every micro-batch to fill
        c0, need = self._c0, self.rule.balance * dp
        lead = float(base.sum()) + dp * c0  # the work besides this slot's sequences
        low_base, top_base = float(base.min()), float(base.max())
        for order in tries:
            if not order.size:
                continue
            lens_o = lens_b[order]
            if mode != "force" and fill > 0 and (
                int(lens_o.sum()) < dp * fill
                or order.size < dp * math.ceil(fill / int(lens_o.max()))
            ):
                # Cannot fill every micro-batch to ``fill``, even if packed perfectly:
                # the tokens fall short, or the sequences are too few (a micro-batch
                # needs ``fill / longest`` of them). Exact tests: the same slots, one
                # packing less.
                continue
            costs_o = costs_b[order]
            if mode == "rule" and (float(costs_o.sum()) + lead) * (1 + 1e-6) < need * (
                max(float(costs_o[0]) + low_base, top_base) + c0
            ):
                # Cannot meet balance: the work is at most all of it (and, under ddp, the
                # ranks' earlier work), the busiest rank's at least the most expensive
                # sequence's on the least loaded rank (with a margin for rounding).
                continue
            where, tok, work_arr = _pack(lens_o, costs_o, base, cap)
            work = work_arr.tolist()
            eff = self._balance(work)
            if mode == "idle":
                if int(tok.min()) >= fill:
                    idle.append((order, where, work, eff))
                continue
            if int(tok.min()) >= fill and eff >= self.rule.balance:
                best = (order, where, work, eff)
                break
            if mode == "force" and (best is None or eff > best[3]):
                best = (order, where, work, eff)
        if mode == "idle":
            best = self._pick_idle(idle)
        if best is None:
            return False
        order, where, work = best[:3]
        scale = self._over(work)
        if scale is not None:
            return scale
        small = np.int16 if dp < _INT16_MAX else np.int64
        rank_of = np.full(buf.shape[0], -1, dtype=small)  # per buffered sequence
        rank_of[order] = where
        # Those left first, then rank by rank, each in arrival order (a stable sort of
        # small integers is a radix sort).
        grouped = np.argsort(rank_of, kind="stable")
        counts = np.bincount(rank_of + 1, minlength=dp + 1)
        left = int(counts[0])
        by_rank = grouped[left:]
        pos = buf[by_rank]
        id_list = self._id_arr[pos].tolist()
        ends = np.cumsum(counts[1:]).tolist()
        slot = [id_list[a:b] for a, b in zip([0, *ends[:-1]], ends)]
        self._keep(buf[grouped[:left]])
        self._buffered_tokens -= int(lens_b[by_rank].sum())
        self._next_try = 0
        c0 = self._c0
        self._rank_work = [b + (w + c0) for b, w in zip(self._rank_work, work)]
        self._released.append((pos, ends))
        self._queue.append(slot)
        return True

    def _buffer_array(self) -> np.ndarray:
        """The buffered arrival positions, in order."""
        if self._upto == self._tail:
            return self._kept
        run = np.arange(self._tail, self._upto, dtype=np.int64)
        return np.concatenate((self._kept, run)) if self._kept.shape[0] else run

    def _keep(self, positions: Any) -> None:
        """After a release: ``positions`` (in order) stay in the buffer."""
        self._kept = np.asarray(positions, dtype=np.int64)
        self._tail = self._upto

    def _balance(self, work: list[float]) -> float:
        """A formed slot's balance: its work over ``dp x`` its time (its heaviest
        micro-batch plus the per-micro-batch cost). Under ``ddp`` each rank runs its own
        micro-batches back to back and the step takes as long as the busiest rank: the
        same ratio over each rank's work in the step so far, this slot included (a rank
        that took more before takes less now, and the ranks end together)."""
        c0, dp = self._c0, self.dp_size
        if self.sync == "ddp":
            total = [b + w + c0 for b, w in zip(self._rank_work, work)]
            top = dp * max(total)
            return sum(total) / top if top > 0 else 1.0
        top = dp * (max(work) + c0)
        return (sum(work) + dp * c0) / top if top > 0 else 1.0

    def _pick_idle(self, formed: list[Any]) -> Any:
        """The slot an idle trainer gets among the tries ``formed`` (each ending in its
        work per micro-batch and its balance). Without a budget: the best balanced. With
        one: the most work that fits it (work run while the trainer would idle, and done
        before the last rollout arrives, is work not left for the end), else the best
        balanced (the caller then forms a smaller one)."""
        if not formed:
            return None
        best = max(formed, key=lambda f: f[3])  # the first of equals: a fixed choice
        if self._budget is not None:
            fits = [f for f in formed if self._over(f[2]) is None]
            if fits:
                best = max(fits, key=lambda f: (sum(f[2]), f[3]))
                if self._held_back(best[2]):
                    return None
        return best

    def _held_back(self, work: list[float]) -> bool:
        """Whether an idle slot that fits the budget waits for more rollouts
        (``rule.defer``): under ``fsdp`` an empty micro-batch idles its rank for the whole
        slot. A slot that takes more than a third of the budget is among the last before
        the horizon, so its empty micro-batches are the last work those ranks could get;
        while the budget still exceeds ``(1 + defer) x`` its time, rollouts that arrive
        meanwhile can fill them, and the trainer is told to ask again once its budget
        has fallen halfway to that time (:attr:`call_again_at`), when it is released (or
        a fuller one). Smaller slots run at once: work started early is not left for
        the end."""
        defer = self.rule.defer
        if not defer or self.sync != "fsdp" or self._budget is None or min(work) > 0:
            return False
        top = max(work) + self._c0
        budget = float(self._budget.min())
        if not budget / 3 < top < budget / (1 + defer):
            return False
        self._call_again = (1 + defer / 2) * top
        return True

    def _over(self, work: list[float]) -> float | None:
        """None when every micro-batch of a slot (its work plus the per-micro-batch cost)
        fits the call's budget on its rank; else the factor to scale the token cap by for
        a smaller try (the budget over the work on the rank most over it; a
        micro-batch's cost grows at least in proportion to its tokens)."""
        if self._budget is None:
            return None
        w = np.asarray(work, dtype=np.float64)
        over = w + self._c0 > self._budget
        if not over.any():
            return None
        with np.errstate(divide="ignore", invalid="ignore"):  # an empty one over: 0
            scale = float(np.nan_to_num((self._budget[over] - self._c0) / w[over]).min())
        return max(0.0, scale)

    def _fill_for(self, mode: str, cap: int) -> float:
        """Tokens every micro-batch of a slot released in ``mode`` holds at least."""
        if mode == "idle":
            # Within a budget an idle release ends before the last arrival: any work it
            # does is work not left for the end, however few tokens it holds.
            return 0.0 if self._budget is not None else self.rule.idle_fill * cap
        return self._fill_tokens

    def _form(
        self, cand: list[int], cap: int
    ) -> tuple[list[list[int]], list[int], list[float]]:
        """``cand`` (in that order) into ``dp`` micro-batches: each sequence to the one of
        least cost with room (capacitated LPT), sequences tied to a rank to that rank;
        sequences that fit nowhere are left out. Returns bins, tokens, and cost."""
        dp = self.dp_size
        lens, costs = self._lens, self._costs
        base = self._rank_work if self.sync == "ddp" else [0.0] * dp
        load = list(base)
        tok = [0] * dp
        bins: list[list[int]] = [[] for _ in range(dp)]
        here: dict[Any, int] = {}  # group -> rank inside this slot
        heap = [(load[r], r) for r in range(dp)]  # entries go stale when a pin adds cost
        heapq.heapify(heap)
        # smallest[k]: the fewest tokens of cand[k:] (a bin with less room is done)
        smallest = np.minimum.accumulate(
            np.asarray([lens[p] for p in cand][::-1], dtype=np.int64)
        )[::-1].tolist()
        for k, p in enumerate(cand):
            t, c = lens[p], costs[p]
            g = self._groups[p]
            r = None if g is None else self._pinned.get(g, here.get(g))
            if r is None:
                skipped = []
                while heap:
                    lr, b = heapq.heappop(heap)
                    if lr != load[b]:
                        continue  # stale: the bin's current entry is in the heap too
                    if tok[b] + t <= cap:
                        r = b
                        break
                    if cap - tok[b] >= smallest[k]:
                        skipped.append((lr, b))  # else nothing left fits it: dropped
                for s in skipped:
                    heapq.heappush(heap, s)
                if r is None:
                    continue
            elif tok[r] + t > cap:
                continue
            bins[r].append(p)
            tok[r] += t
            load[r] += c
            heapq.heappush(heap, (load[r], r))
            if g is not None:
                here.setdefault(g, r)
        return bins, tok, [load[r] - base[r] for r in range(dp)]

    # ---- output ------------------------------------------------------------------------
    def ready(self, idle: bool = False, *, budget: Any = None) -> list[Slot]:
        """The slots released since the last call, oldest first.

        Parameters
        ----------
        idle : bool
            The trainer has nothing to run. One more slot is released if the buffer
            fills every micro-batch to ``rule.idle_fill * max_tokens`` (and
            meets ``rule.balance``): work started now is work not left for the end of the
            step. Slots then also depend on where in the arrivals ``ready(idle=True)`` was
            called (call it at the same points on every rank).
        budget : float or array-like of float, optional
            The most work a slot released in this call may take (in the cost model's
            units: every micro-batch's cost plus the per-micro-batch cost, as
            :func:`seqbalance.simulate`'s step time), or ``dp_size`` numbers, one per
            rank's micro-batch. A trainer that expects the last rollout of the step at
            time ``A``, runs ``speed`` cost units per second and will be free at time
            ``t`` passes ``(A - t) * speed`` (under ``ddp``, per rank, each with its own
            ``t``): a released slot then ends before the last rollout arrives, and the
            step ends no later than waiting for every rollout and then
            :func:`seqbalance.plan` (see ``docs/streaming.md``). When the trainer is
            idle (``idle=True``) and the slot formed is over the budget, a smaller one
            is formed (and ``rule.idle_fill`` does not apply); otherwise nothing is
            released. None: no limit. Slots then also depend on the budgets passed
            (pass the same on every rank).

        Returns
        -------
        list of slots
            Each slot is a list of ``dp_size`` lists of ids: micro-batch ``r`` runs on
            rank ``r``. ``[]`` when nothing was released.
        """
        idle = check_bool(idle, "idle")
        limit = _budget(budget, self.dp_size)
        if idle:
            self._call_again = None
        if idle and self.num_buffered:
            self._budget = limit
            try:
                self._ready_idle()
            finally:
                self._budget = None
        out, self._queue = self._queue, []
        return out

    def _ready_idle(self) -> None:
        """The releases of ``ready(idle=True)``."""
        if self.rule.release == "arrival":
            self._try_release("idle")
        elif not (
            self._try_release("rule")
            or (self._buffered_tokens >= self._hold and self._try_release("force"))
        ):
            self._try_release("idle")

    def flush(self, unstarted: Any = None) -> list[Slot]:
        """The slots not yet returned, then the rest planned offline; starts a new step.

        Parameters
        ----------
        unstarted : list of slots, optional
            Slots that :meth:`ready` returned and the trainer has not started: their
            sequences are planned again with the rest (a slot queued behind a busy trainer
            can then run beside the last arrivals). Each exactly as :meth:`ready` returned
            it. The trainer drops them and runs the returned slots instead.

        Returns
        -------
        list of slots
            The queued slots (as :meth:`ready` would) followed by the buffered sequences
            planned with :func:`seqbalance.plan` (and, with ``rule.guard``, never slower
            than the offline plan of the whole step with the released sequences taken
            out). After it every id of the step has appeared exactly once in the slots
            returned and not handed back.

        Raises
        ------
        ValueError
            If an entry of ``unstarted`` is not a slot released in this step, or appears
            twice; nothing changes then.
        """
        if unstarted is not None:
            self._take_back(unstarted)
        out = self.ready()
        rest = self._buffer_array().tolist()
        if rest:
            grid = self._plan_rest(rest)
            for j in range(len(grid[0])):
                out.append([[self._ids[p] for p in grid[r][j]] for r in range(self.dp_size)])
        self._reset()
        return out

    def _take_back(self, unstarted: Any) -> None:
        """Return the sequences of released, unstarted slots to the buffer."""
        if not isinstance(unstarted, (list, tuple)):
            raise ValueError(
                f"unstarted must be a list of slots as ready() returned them, got "
                f"{type(unstarted).__name__}"
            )
        ids = self._ids
        released = [_positions(s) for s in self._released]
        index = {
            tuple(tuple(ids[p] for p in mb) for mb in slot): j for j, slot in enumerate(released)
        }
        chosen: list[int] = []
        for k, slot in enumerate(unstarted):
            try:
                key = tuple(tuple(int(i) for i in mb) for mb in slot)
            except (TypeError, ValueError):
                key = None
            j = index.get(key) if key is not None else None
            if j is None or j in chosen:
                raise ValueError(
                    f"unstarted[{k}] is not a slot released in this step, or is given "
                    "twice; pass each unstarted slot once, exactly as ready() returned it"
                )
            chosen.append(j)
        if not chosen:
            return
        back = sorted(p for j in chosen for mb in released[j] for p in mb)
        keep = set(chosen)
        self._released = [s for j, s in enumerate(released) if j not in keep]
        merged = np.concatenate((self._buffer_array(), np.asarray(back, dtype=np.int64)))
        self._keep(np.sort(merged, kind="stable"))
        self._pinned = {}  # the groups' ranks, from the slots that stay released
        for slot in self._released:
            for r, mb in enumerate(slot):
                for p in mb:
                    g = self._groups[p]
                    if g is not None:
                        self._pinned.setdefault(g, r)

    def _plan_rest(self, rest: list[int]) -> list[list[list[int]]]:
        """The rest as ``[rank][micro-batch]`` lists of arrival positions."""

        lens = np.asarray(self._lens, dtype=np.int64)
        groups = self._groups
        has_groups = any(g is not None for g in groups)

        def offline(pos: list[int]) -> list[list[list[int]]]:
            idx = np.asarray(pos, dtype=np.int64)
            g = None
            if has_groups:
                # A sequence without a group is a group of its own.
                keys = [("g", groups[p]) if groups[p] is not None else ("s", p) for p in pos]
                g = as_groups([_label(x) for x in keys], len(pos))
            p = plan(
                lens[idx],
                self.dp_size,
                self.max_tokens,
                cost=self._model,
                sync=self.sync,
                groups=g,
                allow_empty=True,
                oversized=self.oversized,
            )
            return [[[pos[k] for k in mb] for mb in rank] for rank in p.micro_batches]

        pins = {g: r for g, r in self._pinned.items() if any(groups[p] == g for p in rest)}
        if pins:
            first = self._pinned_rest(rest, pins)
        else:
            first = offline(rest)
        if not self.rule.guard or not self._released:
            return first
        # Guard: the offline plan of the whole step, released sequences taken out.
        keep = set(rest)
        whole = offline(list(range(len(self._ids))))
        cut = [[[p for p in mb if p in keep] for mb in rank] for rank in whole]
        slots = [j for j in range(len(cut[0])) if any(cut[r][j] for r in range(self.dp_size))]
        cut = [[rank[j] for j in slots] for rank in cut]
        if pins and not all(
            groups[p] not in pins or pins[groups[p]] == r
            for r, rank in enumerate(cut)
            for mb in rank
            for p in mb
        ):
            return first
        return cut if self._time(cut) < self._time(first) else first

    def _time(self, grid: list[list[list[int]]]) -> float:
        costs = np.asarray(self._costs, dtype=np.float64)
        mb = microbatch_costs(grid, costs, per_microbatch=self._c0)
        return step_time_of(mb, self.sync)

    def _pinned_rest(self, rest: list[int], pins: dict[Any, int]) -> list[list[list[int]]]:
        """The rest when some groups are already tied to a rank: ranks first (pinned
        groups on their rank, the other groups heaviest first onto the least-loaded rank),
        then each rank packed by the planner's per-rank packer at the fewest common count."""
        dp, cap = self.dp_size, self.max_tokens
        lens = np.asarray(self._lens, dtype=np.int64)
        costs = np.asarray(self._costs, dtype=np.float64)
        units: dict[Any, list[int]] = {}
        for p in rest:
            g = self._groups[p]
            units.setdefault(("g", g) if g is not None else ("s", p), []).append(p)
        rank_items: list[list[int]] = [[] for _ in range(dp)]
        load = [0.0] * dp
        free = []
        for key, members in units.items():
            if key[0] == "g" and key[1] in pins:
                r = pins[key[1]]
                rank_items[r].extend(members)
                load[r] += float(costs[members].sum())
            else:
                free.append((-float(costs[members].sum()), members[0], members))
        for neg, _, members in sorted(free):
            r = min(range(dp), key=lambda b: (load[b], b))
            rank_items[r].extend(members)
            load[r] -= neg
        over = [[p for p in items if lens[p] > cap] for items in rank_items]
        fits = [sorted(p for p in items if lens[p] <= cap) for items in rank_items]
        m = max(max(-(-int(lens[items].sum()) // cap) for items in fits), 1)
        most = max(len(items) for items in fits)
        grid = None
        while grid is None and m <= most:
            grid = _plan_by_rank(lens, costs, fits, m, cap, False, self.sync)
            m += 1
        if grid is None:  # one sequence a micro-batch always fits
            grid = [[[p] for p in items] for items in fits]
        # Oversized sequences run alone, after the rank's packed micro-batches.
        grid = [rank + [[p] for p in sorted(big)] for rank, big in zip(grid, over)]
        longest = max(len(rank) for rank in grid)
        return [rank + [[] for _ in range(longest - len(rank))] for rank in grid]


def _packing_order(lens: np.ndarray, costs: np.ndarray, cap: int) -> np.ndarray:
    """The order in which sequences are packed: most expensive first, then longest, then
    earliest (the input is in arrival order).

    The same permutation as ``np.lexsort((-lens, -costs))``. Costs almost always grow
    with length; then sorting by length alone (a stable sort of 16-bit keys is a radix
    sort) gives it, and costs that never increase along that order prove it."""
    if lens.shape[0] > 1 and cap <= _UINT16_MAX:
        by_len = np.argsort((cap - lens).astype(np.uint16), kind="stable")
        c = costs[by_len]
        if not np.any(c[1:] > c[:-1]):
            return by_len
    return np.lexsort((-lens, -costs))


def _pack(
    lens: np.ndarray, costs: np.ndarray, base: np.ndarray, cap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Capacitated LPT of sequences given in packing order into ``base.size`` micro-batches:
    each to the micro-batch of least cost (ties: lowest index) that has room; a sequence
    that fits nowhere is left out (``-1``). Returns each sequence's micro-batch, the
    tokens and the cost (above ``base``) of each micro-batch.

    Sequence by sequence in effect, but a run of sequences is placed at once while the
    ``j``-th of the run goes to the ``j``-th lightest micro-batch: that holds while the
    ``j``-th is lighter than every micro-batch the run has already added to, and the
    sequence fits. Each micro-batch gets at most one sequence of a run, so every cost is
    summed in the same order as one at a time.
    """
    n, dp = lens.shape[0], base.shape[0]
    load = base.copy()
    room = np.full(dp, cap, dtype=np.int64)
    where = np.full(n, -1, dtype=np.int64)
    ok = np.empty(dp + 1, dtype=bool)  # ok[m] = False: argmin finds the first miss
    minimum_acc, add_acc = np.minimum.accumulate, np.add.accumulate
    smallest = minimum_acc(lens[::-1])[::-1]  # smallest[k]: the fewest tokens of lens[k:]
    active = None  # the micro-batches that may still take a sequence (None: all)
    k = 0
    while k < n:
        if active is None:
            m = min(dp, n - k)
            by_load = load.argsort(kind="stable")[:m]  # ties: lowest index first
        else:
            m = min(active.shape[0], n - k)
            by_load = active[load[active].argsort(kind="stable")[:m]]
        if room[by_load[0]] < lens[k]:
            j = 0  # (near the end of a packing, most rounds: no run to test)
        else:
            t = lens[k : k + m]
            c = costs[k : k + m]
            lo = load[by_load]
            free = room[by_load]
            np.less_equal(t, free, out=ok[:m])
            ok[m] = False
            new = lo + c
            if m > 1:
                ok[1:m] &= lo[1:] < minimum_acc(new[:-1])
            j = int(ok[: m + 1].argmin())
        if j == 0:  # the lightest has no room: a run among those with room
            # One with less room than every sequence left is done: later runs skip it.
            active = np.flatnonzero(room >= smallest[k])
            if not active.shape[0]:
                break
            if active.shape[0] * (n - k) <= _TAIL_WORK:
                _pack_tail(lens, costs, load, room, where, active, k)
                break
            has = room[active] >= lens[k]
            fit = active[has]
            if not fit.shape[0]:  # it and the next ones too long for every one: left out
                fits = np.flatnonzero(lens[k:] <= room[active].max())
                k = n if not fits.size else k + int(fits[0])
                continue
            # Those left aside may take a later, shorter sequence: the run stops before
            # one that fits one of them lighter than its own target.
            aside = active[~has]
            x_load, x_room = math.inf, -1
            if aside.shape[0]:
                x_load, x_room = float(load[aside].min()), int(room[aside].max())
            m = min(fit.shape[0], n - k)
            by_load = fit[load[fit].argsort(kind="stable")[:m]]
            t = lens[k : k + m]
            lo = load[by_load]
            free = room[by_load]
            new = lo + costs[k : k + m]
            np.less_equal(t, free, out=ok[:m])
            ok[m] = False
            if m > 1:
                ok[1:m] &= lo[1:] < minimum_acc(new[:-1])
            ok[:m] &= (lo < x_load) | (t > x_room)
            j = int(ok[: m + 1].argmin())  # >= 1: the first fits and no aside one can
            by_load, new, free, t = by_load[:j], new[:j], free[:j], t[:j]
            where[k : k + j] = by_load
            load[by_load] = new
            room[by_load] = free - t
            k += j
            continue
        if j == 1 and m > 1:
            # The lightest takes the next sequences too while it stays lighter than the
            # second lightest and has room (loads summed one at a time, as above).
            run = min(n - k, dp)
            after = add_acc(np.concatenate((lo[:1], costs[k : k + run])))[1:]
            used = lens[k : k + run].cumsum()
            good = np.empty(run + 1, dtype=bool)
            np.less_equal(used, free[0], out=good[:run])
            good[1:run] &= after[:-1] < lo[1]
            good[run] = False
            j = int(good.argmin())
            b = by_load[0]
            where[k : k + j] = b
            load[b] = after[j - 1]
            room[b] = free[0] - used[j - 1]
            k += j
            continue
        if j < m:
            by_load, new, free, t = by_load[:j], new[:j], free[:j], t[:j]
        where[k : k + j] = by_load
        load[by_load] = new
        room[by_load] = free - t
        k += j
    return where, cap - room, load - base


# Above this many (micro-batch, sequence) pairs the end of a packing stays in runs.
_TAIL_WORK = 2048


def _pack_tail(
    lens: np.ndarray,
    costs: np.ndarray,
    load: np.ndarray,
    room: np.ndarray,
    where: np.ndarray,
    active: np.ndarray,
    k: int,
) -> None:
    """The end of :func:`_pack` from sequence ``k``, one sequence at a time over the
    micro-batches ``active`` (in index order; the others have no room for any sequence
    left), in place.

    Near the end of a packing most micro-batches are nearly full and a run places one or
    two sequences: a scan of a few Python floats per sequence is then cheaper than a run's
    array calls. The same choice (least cost, then lowest index, among those with room)
    and the same sums (a float64 plus a float64, as numpy adds them).
    """
    bins = active.tolist()
    held = load[active].tolist()
    free = room[active].tolist()
    most = max(free)
    out = where[k:]
    for i, (t, c) in enumerate(zip(lens[k:].tolist(), costs[k:].tolist())):
        if t > most:
            continue  # fits nowhere: left out
        best, least = -1, math.inf
        for a, (h, f) in enumerate(zip(held, free)):
            if f >= t and h < least:
                best, least = a, h
        held[best] = least + c
        free[best] -= t
        out[i] = bins[best]
        if free[best] + t == most:
            most = max(free)
    load[active] = held
    room[active] = free


def _positions(slot: Any) -> list[list[int]]:
    """A released slot as per-rank lists of arrival positions."""
    if isinstance(slot, list):
        return slot
    pos, ends = slot
    flat = pos.tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def _group_key(g: Any) -> Any:
    """A group id as a plain, hashable, order-free key (numpy scalars -> Python)."""
    return g.item() if hasattr(g, "item") else g


def _label(key: tuple[str, Any]) -> str:
    """A group key as a string label (as_groups numbers labels by first appearance)."""
    return f"{key[0]}:{key[1]!r}"


def _budget(value: Any, dp: int) -> np.ndarray | None:
    """A call's budget per rank: None (no limit), a real number >= 0 (every rank), or
    ``dp`` of them (one per rank)."""
    if value is None:
        return None
    why = " (the most work a released micro-batch may take; None: no limit)"
    if is_array_like(value) and np.ndim(value) >= 1:  # (a numpy scalar is one number)
        arr = _as_1d(value, "budget")
        if arr.shape[0] != dp:
            raise ArgumentError(
                f"budget has {arr.shape[0]} entries but dp_size is {dp}; pass one number, "
                "or one per rank",
                argument="budget",
            )
        each = [check_nonnegative_real(x, f"budget[{r}]", why=why) for r, x in enumerate(arr)]
        return np.asarray(each, dtype=np.float64)
    if is_array_like(value):
        value = np.asarray(value).item()
    return np.full(dp, check_nonnegative_real(value, "budget", why=why), dtype=np.float64)
