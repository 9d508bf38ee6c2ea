"""Time every micro-batch on its rank and gather the records at the end of a step.

:class:`MicroBatchTimer` is the measuring half of the feedback loop whose other half is
:class:`seqbalance.costs.TimingRecorder` (report, refit)::

    recorder = TimingRecorder(TokenCost(), sync="ddp")
    if rank == 0:
        recorder.stream_to("timings.jsonl")     # every step, for `seqbalance refit`
    timer = MicroBatchTimer(recorder)
    balancer = Rebalancer(max_tokens=16384, cost=recorder.cost, sync="ddp")
    for step, batch in enumerate(loader):
        mbs, handle = balancer(batch)
        for mb in mbs:
            with timer.time():
                loss = model(mb).backward()
        timer.end_step(handle)                      # two small all_gathers
        log(recorder.metrics() | handle.plan.metrics())
        if step == 10:
            balancer.set_cost(recorder.refit())     # same records on every rank: same cost

Clocks
------
``"cuda"``
    A pair of CUDA events around each micro-batch, read once at the end of the step (one
    synchronize per step, none per micro-batch). The default on a CUDA device.
``"wall"``
    ``time.perf_counter`` after synchronising the device (a no-op on CPU). The default
    elsewhere.
``"thread"``
    ``time.thread_time``: CPU time of the calling thread. CPU training only; it leaves
    out time spent blocked (waiting for another rank's gradients) and time the operating
    system gave the core to other processes, so it measures a micro-batch's own work on
    a shared machine.

Under DDP the last micro-batch's backward also waits for the gradient all-reduce, i.e.
for the slowest rank. With the ``"wall"`` and ``"cuda"`` clocks that wait lands in the
last slot's time; run every micro-batch under ``no_sync()`` and reduce the gradients
after the timed region, or use ``"thread"`` on CPU, to time compute alone (the robust
refit also down-weights such outliers). Under FSDP/ZeRO-3 every micro-batch ends in
collectives, so with ``"wall"`` and ``"cuda"`` every slot's time ends with the slowest
rank's: the records then show no imbalance between ranks (``imbalance_measured`` and
``idle_fraction`` read about 0), and the refit prices each rank's sequences at the
slowest rank's time. ``"thread"`` on CPU measures each rank's own work; on GPUs, read
such records as the lockstep step they are.

A block that raises is not recorded (its time is partial), but it keeps its slot, so a
loop that catches an error and skips the micro-batch still matches the plan. Blocks do
not nest.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from typing import Any, Iterator, cast

import numpy as np
import torch
import torch.distributed as dist

from .._validate import as_index, as_lengths, check_choice
from ..costs._cp_records import plan_pieces
from ..costs.feedback import Timing, TimingRecorder
from ._transport import comm_device
from .context_parallel import CPShardHandle
from .exchange import RebalanceHandle

__all__ = ["CLOCKS", "MicroBatchTimer"]

CLOCKS = ("auto", "cuda", "wall", "thread")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    mod = getattr(torch, device.type, None)  # mps, xpu...
    fn = getattr(mod, "synchronize", None) if device.type != "cpu" else None
    if fn is not None:
        fn()


class MicroBatchTimer:
    """Times this rank's micro-batches; :meth:`end_step` gathers every rank's times.

    Parameters
    ----------
    recorder : TimingRecorder, optional
        Where gathered records go (every rank gets every rank's records, so every rank can
        report and refit identically).
    group : ProcessGroup, optional
        The data-parallel group (default: the world); for a context-parallel plan, the
        group of all its ``dp_size * cp_size`` GPUs (even where :func:`rebalance` ran over
        the data-parallel group: every rank then refits from the same records). Without an
        initialised process group the timer works on one process (rank 0 of 1).
    device : torch.device or str, optional
        The device micro-batches run on (default: the current CUDA device if CUDA is
        available, else CPU).
    clock : {"auto", "cuda", "wall", "thread"}
        See the module docstring. ``"auto"``: CUDA events on CUDA, else ``"wall"``.
    plan_rank : int, optional
        The plan's rank (for a context-parallel plan, its GPU) whose micro-batches this
        process runs, when that is not its rank in ``group`` (default: the group rank).
        The ranks of ``group`` must take every plan rank once. Under static context
        parallelism over a ``dp × cp`` mesh, a replica's GPUs are plan ranks
        ``replica * cp_size + position``; a framework whose rank order puts the CP ranks
        elsewhere (or a sampler given its own ``rank``) passes the plan rank here, and
        :meth:`end_step` records every GPU under it on every rank alike. Records, their
        ``Timing.rank`` and the recorder's per-rank metrics are in plan ranks. Give
        :meth:`end_step` the rebalance handle (or :meth:`time` the lengths): a plan rank
        of another replica (left out, or mapped wrongly) is then refused, where with the
        plan alone its times would be recorded as another GPU's. GPUs of one replica hold
        the same sequences, so a swap among them cannot be told (their pieces differ
        little in the balanced layout). Below ``2**31``.

    Attributes
    ----------
    plan_rank : int or None
        The plan rank given (read-only).
    step : int
        The step the next :meth:`end_step` records (starts at 0, +1 per call).
    overhead : float
        Seconds spent inside the timer itself so far (entering and leaving the timed
        regions, reading clocks, gathering): the cost of measuring. Read on the timer's
        clock family: this thread's CPU time with ``clock="thread"`` (so neither waiting
        nor other processes count), ``perf_counter`` otherwise.
    gather_overhead : float
        The part of :attr:`overhead` spent in the collective of :meth:`end_step` (with a
        wall clock it includes waiting for ranks that arrive later).
    """

    def __init__(
        self,
        recorder: TimingRecorder | None = None,
        *,
        group: Any = None,
        device: Any = None,
        clock: str = "auto",
        plan_rank: int | None = None,
    ) -> None:
        if recorder is not None and not isinstance(recorder, TimingRecorder):
            raise ValueError(
                f"recorder must be a seqbalance.costs.TimingRecorder or None, got "
                f"{type(recorder).__name__}"
            )
        self.recorder = recorder
        self.group = group
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        clock = check_choice(clock, "clock", CLOCKS)
        if clock == "auto":
            clock = "cuda" if self.device.type == "cuda" else "wall"
        if clock == "cuda" and self.device.type != "cuda":
            raise ValueError(f"clock='cuda' needs a CUDA device, got device={self.device}")
        if clock == "thread" and self.device.type != "cpu":
            raise ValueError(
                f"clock='thread' measures CPU time and suits CPU training only, got "
                f"device={self.device}; use 'cuda' or 'wall'"
            )
        self.clock = clock
        self._plan_rank = None if plan_rank is None else _plan_rank(plan_rank)
        self._now = time.thread_time if clock == "thread" else time.perf_counter
        self.step = 0
        self.overhead = 0.0
        self.gather_overhead = 0.0
        # (lengths or None, start mark, end mark, the block raised)
        self._pending: list[tuple[np.ndarray | None, Any, Any, bool]] = []
        self._open = False

    # ---- timing ------------------------------------------------------------------------
    @contextlib.contextmanager
    def time(self, lengths: Any = None) -> Iterator[None]:
        """Time the block as this rank's next micro-batch.

        ``lengths`` are its sequences' token counts; they may be left out when
        :meth:`end_step` is given the plan (which knows them), and if given they must be
        the plan's for this slot (for a CP plan, the whole lengths of the sequences this
        GPU touches, not its pieces' tokens). A block that raises keeps its slot but is
        not recorded.

        Raises
        ------
        ValueError
            When entered inside another :meth:`time` block (the outer time would hold the
            inner one, and the slots would be out of order).
        """
        if self._open:
            raise ValueError(
                "MicroBatchTimer.time() blocks cannot nest: time each micro-batch in its own "
                "block, one after the other"
            )
        t0 = self._now()
        lens = None if lengths is None else as_lengths(_np(lengths), "lengths")
        start = self._mark()
        self.overhead += self._now() - t0
        self._open, failed = True, True
        try:
            yield
            failed = False
        finally:
            t1 = self._now()
            end = self._mark()
            self._pending.append((lens, start, end, failed))
            self._open = False
            self.overhead += self._now() - t1

    def _mark(self) -> Any:
        if self.clock == "cuda":
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ev.record()
            return ev
        if self.clock == "thread":
            return time.thread_time()
        _sync(self.device)
        return time.perf_counter()

    def _seconds(self) -> list[float]:
        """Each pending block's time; NaN for a block that raised (left out of records)."""
        if not self._pending:
            return []
        if self.clock == "cuda":
            self._pending[-1][2].synchronize()  # the last event done: all are
            secs = [s.elapsed_time(e) / 1e3 for _, s, e, _ in self._pending]
        else:
            secs = [float(e - s) for _, s, e, _ in self._pending]
        return [math.nan if failed else t for t, (*_, failed) in zip(secs, self._pending)]

    # ---- gathering ---------------------------------------------------------------------
    def end_step(self, plan: Any = None, *, step: int | None = None) -> list[Timing]:
        """Close the step: gather every rank's micro-batch times and record them.

        Collective: every rank of the group calls it once per step.

        Parameters
        ----------
        plan : Plan, RebalanceHandle or CPShardHandle, optional
            The plan every rank ran (``handle.plan`` from :func:`rebalance` or
            :func:`~seqbalance.torch.cp_shard`, a sampler's step plan), or the ``handle``
            itself: then the lengths of the micro-batches this rank received stand for those
            not given to :meth:`time`, and the plan rank is checked against the handle's
            rank (its replica under CP for :func:`rebalance`'s, the GPU given to
            ``cp_shard`` for its), so a rank that ran micro-batches other than its plan
            rank's (a wrong or missing ``plan_rank``) is refused. The plan's
            ``micro_batches`` and ``lengths`` give every record's lengths, so only the times
            travel: one ``all_gather`` of ``m`` float64 per rank. Without it, each rank's
            lengths (given to :meth:`time`) travel too (``all_gather_object``). Either way a
            9-float header goes first (whether a plan was given, its rank and slot counts, a
            digest of it, whether this rank's timing fits and its arguments are usable, the
            step, the plan rank it ran), so ranks holding different plans, or a plan on some
            ranks only, all raise instead of hanging or pairing times with the wrong
            lengths. In a padded plan (``padded=True``) every row of a micro-batch is
            recorded at the longest one's length, as it ran. For a context-parallel plan
            (:class:`~seqbalance.planning.cp_plans.CPPlan`) the group is every GPU of the
            mesh (``dp_size * cp_size``; a rank's GPU is its group rank or the timer's
            ``plan_rank``) and each record carries the pieces its GPU ran
            (``Timing.pieces``), which the recorder's report and refit price as pieces.
            Records are kept under plan ranks.
        step : int, optional
            The step to record under (default :attr:`step`).

        Returns
        -------
        list of Timing
            Every rank's records of this step, ordered by (plan rank, slot), identical
            on every rank. Also added to the recorder, if any.

        Raises
        ------
        ValueError
            On every rank, when a rank's plan is for another number of ranks than the
            group, the ranks' plans differ, some ranks passed a plan and others not, a
            rank timed a different number of micro-batches than the plan gives it, a
            rank gave :meth:`time` lengths that are not its plan slot's (or, given the
            handle, received another replica's micro-batches), the ranks passed
            different ``step`` values, the ranks' ``plan_rank`` values are not
            ``0..world-1`` each once, or (without a plan) a micro-batch was timed without
            its lengths. Also, alike on every rank and with nothing recorded, when a
            micro-batch measured 0 s (a clock too coarse for it).
        """
        t0 = self._now()
        # A bad argument on one rank is reported in the header gather below, on every rank,
        # never raised here first (the other ranks would wait in the gather).
        unusable: Exception | None = None
        try:
            step = self.step if step is None else as_index(step)
        except TypeError as exc:
            step, unusable = self.step, ValueError(f"step must be an integer, got {step!r}")
            unusable.__cause__ = exc
        secs = self._seconds()
        handle = plan if isinstance(plan, (RebalanceHandle, CPShardHandle)) else None
        if handle is not None:
            # The micro-batches this rank received stand for lengths not given to time():
            # a rank that ran another plan rank's micro-batches is then refused.
            held = handle.micro_batch_lengths
            plan = handle.plan
            self._pending = [
                (held[j] if lens is None and j < len(held) else lens, *rest)
                for j, (lens, *rest) in enumerate(self._pending)
            ]
        rank, world = _group_info(self.group)
        me = rank if self._plan_rank is None else self._plan_rank  # the plan's rank I ran
        # A fixed-size header first, on every rank and in both modes: whether a plan was
        # given, its rank and slot counts, a digest of it, whether this rank's timing
        # fits, whether its arguments are usable, the step and the plan rank it ran. Ranks
        # whose plans differ would otherwise gather rows of different lengths (a hang, or
        # an error on some ranks alone) or silently pair one rank's times with another
        # plan's lengths; every rank sees every header, so every rank raises alike.
        missing = any(lens is None for lens, *_ in self._pending)
        slot_pieces = None
        if plan is not None:
            try:
                planned = len(plan.micro_batches)
                m = plan.num_micro_batches
                mine = plan.micro_batches[me] if me < planned else None
                ok = mine is not None and len(mine) == len(secs)
                header = [1, planned, m, *_plan_digest(plan), ok]
                # A CP plan's GPUs ran pieces: each record carries its GPU's (checked on
                # every rank alike, before any gather of times).
                pieces = getattr(plan, "pieces", None)
                slot_pieces = (
                    None if pieces is None else plan_pieces(pieces, plan.micro_batches)
                )
                if ok and unusable is None and handle is not None:
                    unusable = _not_the_handles(handle, plan, me)
                if ok and unusable is None:
                    unusable = _lengths_disagree(self._pending, mine, plan.lengths)
            except Exception as exc:  # not a Plan
                unusable = unusable or ValueError(
                    f"plan must be the step's Plan or its handle (from rebalance or cp_shard), got "
                    f"{type(plan).__name__}: {exc}"
                )
                header = [1, 0, 0, 0, 0, 0]
        else:
            header = [0, 0, 0, 0, 0, not missing]
        # 1: arguments it cannot use; 2: lengths given to time() that are not the plan's.
        header.append(0 if unusable is None else 2 if isinstance(unusable, _Disagree) else 1)
        header.append(step)  # every rank records the step under one number
        header.append(me)
        g0 = self._now()
        heads = self._gather(np.array(header, dtype=np.float64), world)
        self.gather_overhead += self._now() - g0
        try:
            _check_headers(heads, world, len(secs), plan, me, unusable)
        except ValueError as exc:
            self._pending.clear()
            raise exc from unusable
        plan_ranks = heads[:, 8].astype(np.int64)
        by_plan_rank = np.argsort(plan_ranks, kind="stable")  # records in plan-rank order
        if plan is not None:
            row = np.zeros(m, dtype=np.float64)
            row[: len(secs)] = secs
            g0 = self._now()
            table = self._gather(row, world) if m else np.zeros((world, 0))
            self.gather_overhead += self._now() - g0
            lengths = np.asarray(plan.lengths)
            padded = bool(getattr(plan, "padded", False))
            records = [
                Timing(pr, step, j, _ran(lengths[np.asarray(mb, dtype=np.int64)], padded),
                       float(table[r, j]),
                       None if slot_pieces is None else slot_pieces[pr][j])
                for r in by_plan_rank.tolist()
                for pr in [int(plan_ranks[r])]
                for j, mb in enumerate(plan.micro_batches[pr])
                if not math.isnan(table[r, j])  # the block raised
            ]  # fmt: skip
        else:
            mine_obj = [
                (cast(np.ndarray, lens).tolist(), s) for (lens, *_), s in zip(self._pending, secs)
            ]  # (every record has its lengths without a plan: checked above)
            gathered: list[Any] = [mine_obj]
            g0 = self._now()
            if world > 1:
                gathered = [None] * world
                dist.all_gather_object(gathered, mine_obj, group=self.group)
            self.gather_overhead += self._now() - g0
            records = [
                Timing(int(plan_ranks[r]), step, j, np.asarray(lens, dtype=np.int64), float(s))
                for r in by_plan_rank.tolist()
                for j, (lens, s) in enumerate(gathered[r])
                if not math.isnan(s)  # the block raised
            ]
        self._pending.clear()
        # Records are alike on every rank, so every rank raises here alike, and before the
        # step counter or the recorder changed.
        zero = next((t for t in records if not t.seconds > 0), None)
        if zero is not None:
            raise ValueError(
                f"plan rank {zero.rank}'s micro-batch {zero.slot} measured {zero.seconds!r} s: the "
                f"clock ({self.clock!r}) is too coarse for it; use clock='wall' (or 'cuda' "
                "on a GPU), or time larger micro-batches. Nothing of this step was recorded"
            )
        self.step = step + 1
        if self.recorder is not None:
            self.recorder.extend(records)
        self.overhead += self._now() - t0
        return records

    @property
    def plan_rank(self) -> int | None:
        """The plan rank this process times, as given (None: its group rank)."""
        return self._plan_rank

    def _gather(self, row: np.ndarray, world: int) -> np.ndarray:
        """Every rank's ``row`` (float64, the same length on every rank), one per line."""
        if world == 1:
            return row[None]
        t = torch.as_tensor(row).to(comm_device(self.group))
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.stack(parts).cpu().numpy()

    def __repr__(self) -> str:
        return (
            f"MicroBatchTimer(clock={self.clock!r}, device={str(self.device)!r}, "
            f"step={self.step}, pending={len(self._pending)})"
        )


def _plan_rank(value: Any) -> int:
    """``value`` as a plan rank (an integer >= 0), or a ValueError saying what it is."""
    try:
        rank = as_index(value)
    except TypeError:
        rank = -1
    if not 0 <= rank < 2**31:  # it travels as a float64 in end_step's header
        raise ValueError(
            f"plan_rank must be an integer in 0 .. 2**31 - 1 (the plan's rank this process "
            f"runs) or None, got {value!r}"
        )
    return rank


def _group_info(group: Any) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _ran(lens: np.ndarray, padded: bool) -> np.ndarray:
    """The lengths a micro-batch ran: in a padded plan every row is as long as the longest
    (the plan and the GPU pay count x cost(longest); raw lengths made the fit learn a cost
    too low)."""
    if not padded or lens.size == 0:
        return lens
    return np.full(lens.shape, lens.max(), dtype=lens.dtype)


def _check_headers(
    heads: np.ndarray, world: int, timed: int, plan: Any, rank: int,
    unusable: Exception | None,
) -> None:
    """Raise the same ValueError on every rank when the gathered headers of
    :meth:`MicroBatchTimer.end_step` disagree (rows: has plan, planned ranks, slots, digest
    pair, this rank's timing usable, this rank's arguments unusable (1) or its timed
    lengths not the plan's (2), step, plan rank). ``rank`` is this process's plan rank."""
    bad_args = np.flatnonzero(heads[:, 6] == 1).tolist()
    if bad_args:
        mine = f"this rank: {unusable}" if unusable is not None else "this rank's are fine"
        raise ValueError(
            f"ranks {bad_args} passed end_step arguments it cannot use ({mine}); pass the "
            "step's Plan or its handle (from rebalance or cp_shard) and an integer step, or "
            "neither"
        )
    steps = heads[:, 7]
    if (steps != steps[0]).any():
        odd = np.flatnonzero(steps != steps[0]).tolist()
        raise ValueError(
            f"ranks {odd} record this step as step {int(steps[odd[0]])}, rank 0 as step "
            f"{int(steps[0])}; pass the same step= on every rank (or none)"
        )
    with_plan = heads[:, 0] == 1
    if with_plan.any() and not with_plan.all():
        raise ValueError(
            f"ranks {np.flatnonzero(with_plan).tolist()} passed a plan to end_step and ranks "
            f"{np.flatnonzero(~with_plan).tolist()} did not; pass it on every rank or on none"
        )
    ok = heads[:, 5] == 1
    if not with_plan.any():
        _check_plan_ranks(heads[:, 8], world)
        if not ok.all():
            raise ValueError(
                f"ranks {np.flatnonzero(~ok).tolist()} timed a micro-batch without lengths; "
                "pass timer.time(lengths) or give end_step the plan"
            )
        return
    wrong = np.flatnonzero(heads[:, 1] != world)
    if wrong.size:
        where = "" if wrong.size == world else f" on ranks {wrong.tolist()}"
        raise ValueError(
            f"the plan is for {int(heads[wrong[0], 1])} ranks but the group has {world}"
            f"{where}; pass the plan of this group's step (or the group the plan was made "
            "for; a context-parallel plan's group is all dp_size * cp_size GPUs)"
        )
    _check_plan_ranks(heads[:, 8], world)
    odd = np.flatnonzero((heads[:, 1:5] != heads[0, 1:5]).any(axis=1)).tolist()
    if odd:
        raise ValueError(
            f"ranks {odd} passed a different plan than rank 0; every rank must pass the same "
            "step's plan (plans computed on each rank agree only when their inputs and "
            "options do)"
        )
    if not ok.all():
        raise ValueError(
            f"{_ranks(np.flatnonzero(~ok), heads)} timed a different number of micro-batches "
            f"than the plan gives them (this process: {timed} timed, "
            f"{len(plan.micro_batches[rank])} planned); time each of the plan's "
            "micro-batches exactly once"
        )
    disagree = np.flatnonzero(heads[:, 6] == 2)
    if disagree.size:
        mine = f"this rank: {unusable}" if unusable is not None else "this rank's match"
        raise ValueError(
            f"{_ranks(disagree, heads)} timed micro-batches that are not their plan rank's "
            f"({mine}); run the plan's micro-batches in its order, and pass "
            "MicroBatchTimer(plan_rank=...) where the group's rank order is not the plan's "
            "(e.g. static CP)"
        )


def _ranks(which: np.ndarray, heads: np.ndarray) -> str:
    """Group ranks ``which`` in words, with their plan ranks where those differ."""
    plan_ranks = heads[which, 8].astype(np.int64)
    text = f"ranks {which.tolist()}"
    if np.array_equal(plan_ranks, which):
        return text
    return f"group {text} (plan ranks {plan_ranks.tolist()})"


def _check_plan_ranks(column: np.ndarray, world: int) -> None:
    """Raise when the group's ranks do not run plan ranks ``0..world-1``, each once."""
    plan_ranks = column.astype(np.int64)
    if np.array_equal(np.sort(plan_ranks), np.arange(world)):
        return
    seen: dict[int, list[int]] = {}
    for r, pr in enumerate(plan_ranks.tolist()):
        seen.setdefault(pr, []).append(r)
    problems = [f"ranks {rs} all run plan rank {pr}" for pr, rs in sorted(seen.items())
                if len(rs) > 1][:1]  # fmt: skip
    beyond = sorted(pr for pr in seen if pr >= world)
    if beyond:
        problems.append(f"plan ranks {beyond} are beyond the group's {world} ranks")
    what = " and ".join(problems)
    raise ValueError(
        f"the group's ranks must run plan ranks 0..{world - 1}, each once, but {what}; "
        "pass MicroBatchTimer(plan_rank=...) the plan rank this process runs (for "
        "static CP: replica * cp_size + CP position), or leave it out where it is the "
        "group rank"
    )


class _Disagree(ValueError):
    """This rank timed a block with lengths that are not its plan slot's."""


def _not_the_handles(handle: Any, plan: Any, me: int) -> _Disagree | None:
    """Why plan rank ``me`` is not one whose micro-batches ``handle``'s rank received, or
    None. The handle's rank is its rank in the rebalance group: a replica of a CP plan
    planned over the data-parallel group (any of the replica's ``cp_size`` GPUs, which
    hold the same sequences: a swap among them cannot be told), or a plan rank."""
    if isinstance(handle, CPShardHandle):  # cp_shard's rank is a plan GPU
        if me != handle.rank:
            return _Disagree(
                f"this process took plan GPU {handle.rank}'s pieces (the rank given to "
                f"cp_shard) but times plan rank {me}"
            )
        return None
    cp = int(getattr(plan, "cp_size", 1) or 1)
    if cp > 1 and handle.world_size * cp == len(plan.micro_batches):
        if me // cp != handle.rank:
            return _Disagree(
                f"this process received replica {handle.rank}'s micro-batches (its rank in "
                f"the rebalance group) but times plan rank {me}, a GPU of replica {me // cp}"
            )
    elif handle.world_size == len(plan.micro_batches) and me != handle.rank:
        return _Disagree(
            f"this process received rank {handle.rank}'s micro-batches but times plan rank "
            f"{me}"
        )
    return None


def _lengths_disagree(
    pending: list[tuple[np.ndarray | None, Any, Any, bool]], mine: Any, lengths: Any
) -> _Disagree | None:
    """Why the lengths given to :meth:`MicroBatchTimer.time` are not the plan's, or None."""
    lengths = np.asarray(lengths)
    for j, ((lens, *_), mb) in enumerate(zip(pending, mine)):
        if lens is None:
            continue
        want = np.sort(lengths[np.asarray(mb, dtype=np.int64)].astype(np.int64))
        if not np.array_equal(np.sort(lens.astype(np.int64)), want):
            return _Disagree(
                f"micro-batch {j} was timed with lengths {lens.tolist()}, the plan's slot "
                f"{j} holds {want.tolist()}"
            )
    return None


def _plan_digest(plan: Any) -> tuple[float, float]:
    """Two exact float64 integers (48 bits each) from a SHA-256 of the plan's micro-batches
    and lengths: equal on every process for equal plans, whatever the hash seed."""
    lengths = np.asarray(plan.lengths).astype(np.int64)
    # Every variable-length run is preceded by its length, so no two plans hash the same
    # bytes (without the counts, lengths [5, 7, 1] and an empty first slot read alike as
    # lengths [5, 7] and a slot holding sequence 0).
    h = hashlib.sha256(np.asarray([lengths.size, len(plan.micro_batches)], np.int64).tobytes())
    h.update(lengths.tobytes())
    for rank_mbs in plan.micro_batches:
        sizes = [len(mb) for mb in rank_mbs]
        h.update(np.asarray([len(sizes), *sizes], dtype=np.int64).tobytes())
        for mb in rank_mbs:
            h.update(np.asarray(mb, dtype=np.int64).tobytes())
    pieces = getattr(plan, "pieces", None)
    if pieces is not None:  # a CP plan: two plans may list the same sequences per GPU
        for gpu in pieces:
            h.update(np.asarray([len(gpu), *(len(slot) for slot in gpu)], np.int64).tobytes())
            for slot in gpu:
                h.update(np.asarray(slot, dtype=np.int64).reshape(-1).tobytes())
    d = h.digest()
    return float(int.from_bytes(d[:6], "big")), float(int.from_bytes(d[6:12], "big"))


def _np(values: Any) -> Any:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return values
