"""Close the loop: record what each rank really spent, compare it with the cost model, refit.

A balancer is only as good as its cost model, and a model is never checked unless someone
measures. :class:`TimingRecorder` keeps, for the last ``window`` training steps, one record
per micro-batch: ``(rank, step, slot, sequence lengths, measured seconds)`` (``slot`` is
the micro-batch's position on its rank, ``0..m-1``). From them

- :meth:`TimingRecorder.report` gives a :class:`BalanceReport`: per rank and per slot
  predicted vs measured time, the measured imbalance, the idle fraction, the model's
  relative error, and the slowest rank with its straggler score;
- :meth:`TimingRecorder.refit` fits ``c0 + Σ(a + b·L + c·L²)`` to the window, robustly
  (Huber-weighted), with one speed factor per rank so that a slow rank does not bias the
  cost, and keeps the previous cost (with a warning) when the window cannot identify the
  coefficients.

Units. A cost model may count tokens or FLOPs rather than seconds. A balancer only needs
costs up to a common factor (a plan does not change when all costs are doubled), so the
report first converts predictions to seconds with one factor, ``scale`` = the median of
measured / predicted over the window, and judges the model's *shape* against the
measurements. For a cost already in seconds (a refit or ``seqbalance calibrate``)
``scale`` is close to 1, and its distance from 1 is the model's overall bias.

Pure numpy. The torch side (timing micro-batches, gathering records across ranks) is
:mod:`seqbalance.torch.timing`.

Examples
--------
>>> from seqbalance.costs import QuadraticCost, TokenCost
>>> truth = QuadraticCost(per_token=1e-4, per_token_sq=1e-7, per_microbatch=1e-3)
>>> rec = TimingRecorder(TokenCost(), sync="ddp")
>>> shapes = [[[100, 300], [400]], [[50] * 8, [200, 200]], [[700], [30, 30, 40]]]
>>> for step, per_rank in enumerate(shapes):
...     for rank, lengths in enumerate(per_rank):
...         rec.record(rank, step, 0, lengths, truth.microbatch_cost(lengths))
>>> rec.report().model_error > 0.1          # tokens miss the L² term
True
>>> cost = rec.refit(per_rank=False)
>>> rec.report().model_error < 1e-6
True
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._validate import as_lengths, check_bool, check_choice, check_positive_int, index_array
from ._cp_records import (
    check_pieces,
    comm_seconds,
    exposed_at,
    fit_rows,
    link_split,
    plan_pieces,
    predict,
)
from ._timing import (
    SYNC_MODELS,
    Timing,
    _checked_timing,
    _nonneg_int,
    _resolve_cost,
    _time,
)
from .base import CostModel
from .context_parallel import ContextParallelCost
from .fit import (
    PoorlyDeterminedCostWarning,
    UnidentifiableCostWarning,
    _fit,
    _stats,
    exactly_determined_message,
    poorly_determined_message,
    unidentified_message,
)
from .report import COEFFICIENTS, FitReport
from .ulysses import ulysses_sp_size

__all__ = [
    "REPORT_METRICS",
    "BalanceReport",
    "Timing",
    "TimingRecorder",
    "records_from_plan",
]

# Every key of BalanceReport.metrics(), documented (the README's table mirrors this).
REPORT_METRICS: dict[str, str] = {
    "balance/imbalance_measured": (
        "max / mean - 1 of the ranks' measured busy time (sum of their micro-batch times), "
        "averaged over the steps in the window"
    ),
    "balance/imbalance_predicted": "the same from the cost model's predictions",
    "balance/idle_fraction": (
        "share of rank-time spent waiting, measured: 1 - sum of busy time / (ranks x step "
        "time), step time under the recorder's sync model, over the window"
    ),
    "balance/step_time_measured": (
        "seconds per step implied by the measured micro-batch times under the sync model "
        "(ddp: max over ranks of busy time; fsdp: sum over slots of the max over ranks), "
        "mean over the window; compute only, without optimizer and communication"
    ),
    "balance/step_time_predicted": "the same from the predictions, in seconds (x scale)",
    "balance/model_error": (
        "median over micro-batches of |predicted x scale - measured| / measured"
    ),
    "balance/model_error_p90": "90th percentile of the same relative errors",
    "balance/model_scale": (
        "seconds per cost unit: median of measured / predicted (about 1 for a cost in seconds)"
    ),
    "balance/slowest_rank": (
        "the rank that runs slowest relative to its predictions (largest speed factor)"
    ),
    "balance/straggler_score": (
        "that rank's speed factor / the median rank's: 1.3 = 30% slower than the model "
        "predicts, compared with a typical rank"
    ),
    "balance/samples": "micro-batch records in the window",
}





@dataclass(frozen=True)
class BalanceReport:
    """Predicted vs measured micro-batch times over a window of steps.

    Attributes
    ----------
    sync
        The sync model step times and idle time are computed for.
    steps
        The steps covered, ascending.
    ranks
        The ranks seen, ascending; per-rank arrays follow this order.
    rank_measured, rank_predicted
        Mean busy seconds per step of each rank: measured, and predicted (x ``scale``).
    rank_speed
        Each rank's speed factor: median of measured / (predicted x scale) over its
        micro-batches (1 = as the model says; 1.3 = 30% slower).
    slot_measured, slot_predicted
        Mean seconds of a micro-batch in slot ``j`` (over ranks and steps), for
        ``j = 0..len-1``.
    imbalance_measured, imbalance_predicted
        Mean over steps of max / mean - 1 of the ranks' busy time.
    idle_fraction
        Measured share of rank-time spent waiting under ``sync``.
    step_time_measured, step_time_predicted
        Mean seconds per step implied by the micro-batch times under ``sync``.
    model_error, model_error_p90
        Median and 90th percentile of ``|predicted x scale - measured| / measured``.
    scale
        Seconds per cost unit (median of measured / predicted, over the micro-batches the
        model prices above 0). NaN when it prices every one at 0 (a zero cost model):
        then ``step_time_predicted``, ``rank_speed`` and ``straggler_score`` are NaN too,
        ``model_error`` is 1, and the measured figures stay valid.
    slowest_rank, straggler_score
        The rank with the largest speed factor, and that factor / the median rank's.
    samples
        Micro-batches in the window.
    relative_errors
        The per-micro-batch relative errors, ordered by (step, rank, slot).
    """

    sync: str
    steps: tuple[int, ...]
    ranks: tuple[int, ...]
    rank_measured: np.ndarray
    rank_predicted: np.ndarray
    rank_speed: np.ndarray
    slot_measured: np.ndarray
    slot_predicted: np.ndarray
    imbalance_measured: float
    imbalance_predicted: float
    idle_fraction: float
    step_time_measured: float
    step_time_predicted: float
    model_error: float
    model_error_p90: float
    scale: float
    slowest_rank: int
    straggler_score: float
    samples: int
    relative_errors: np.ndarray = field(repr=False)

    def metrics(self, prefix: str = "balance/") -> dict[str, float | int]:
        """A flat dict for loggers (wandb, TensorBoard, JSONL); keys in :data:`REPORT_METRICS`.

        ``prefix`` replaces the leading ``"balance/"``.
        """
        out: dict[str, float | int] = {
            "balance/imbalance_measured": self.imbalance_measured,
            "balance/imbalance_predicted": self.imbalance_predicted,
            "balance/idle_fraction": self.idle_fraction,
            "balance/step_time_measured": self.step_time_measured,
            "balance/step_time_predicted": self.step_time_predicted,
            "balance/model_error": self.model_error,
            "balance/model_error_p90": self.model_error_p90,
            "balance/model_scale": self.scale,
            "balance/slowest_rank": self.slowest_rank,
            "balance/straggler_score": self.straggler_score,
            "balance/samples": self.samples,
        }
        return {prefix + k[len("balance/"):]: v for k, v in out.items()}

    def __str__(self) -> str:
        lines = [
            f"{self.samples} micro-batches, steps {self.steps[0]}..{self.steps[-1]}, "
            f"{len(self.ranks)} ranks, sync={self.sync}",
            f"  step time  measured {self.step_time_measured * 1e3:9.2f} ms   predicted "
            f"{self.step_time_predicted * 1e3:9.2f} ms",
            f"  imbalance  measured {self.imbalance_measured:9.2%}      predicted "
            f"{self.imbalance_predicted:9.2%}",
            f"  idle {self.idle_fraction:.2%}; model error median {self.model_error:.2%}, "
            f"p90 {self.model_error_p90:.2%}; scale {self.scale:.4g} s/unit",
            f"  slowest rank {self.slowest_rank}: straggler score {self.straggler_score:.2f}",
            "  rank  measured ms  predicted ms  speed",
        ]
        for r, m, p, s in zip(self.ranks, self.rank_measured, self.rank_predicted,
                              self.rank_speed):
            lines.append(f"  {r:>4}  {m * 1e3:11.2f}  {p * 1e3:12.2f}  {s:5.2f}")
        lines.append("  slot  measured ms  predicted ms")
        for j, (m, p) in enumerate(zip(self.slot_measured, self.slot_predicted)):
            lines.append(f"  {j:>4}  {m * 1e3:11.2f}  {p * 1e3:12.2f}")
        return "\n".join(lines)


class TimingRecorder:
    """Micro-batch timings of the last ``window`` steps, a cost model, and the loop between.

    Parameters
    ----------
    cost : cost model, ContextParallelCost, name or None
        The model predictions come from (default :class:`TokenCost`); replaced by
        :meth:`refit`. A :class:`~seqbalance.costs.ContextParallelCost` (the ``cp_cost``
        your CP plans use) sets :attr:`cost` to its sequence cost and keeps its link
        model in :attr:`cp_cost`: records of CP pieces are then predicted with their
        exposed communication, and :meth:`refit` fits the compute that remains.
    sync : {"fsdp", "ddp"}
        How ranks synchronise (see :mod:`seqbalance.planning.simulation`): decides the step
        time and idle time in reports.
    window : int
        Steps kept; records of older steps are dropped as new steps arrive.

    Attributes
    ----------
    cost : CostModel
        The sequence cost (a :class:`QuadraticCost` in seconds after :meth:`refit`).
    cp_cost : ContextParallelCost or None
        The CP cost given, with :attr:`cost` inside after a refit (``cost_per_second``
        then 1: the refit is in seconds); None when a plain cost was given.

    Context parallelism
    -------------------
    A GPU of a CP plan (:class:`~seqbalance.planning.cp_plans.CPPlan`) runs pieces of
    sequences, so its records carry them (:meth:`record`'s ``pieces``;
    :class:`~seqbalance.torch.MicroBatchTimer` adds them from the plan). The fit row of
    such a record is ``[1, Σ 1/d, Σ tokens, Σ (e² − s²)]`` (whole sequences give the usual
    ``[1, n, ΣL, ΣL²]``), in the same four coefficients, so CP and non-CP steps refit one
    cost together. The exposed ring communication is modelled by :attr:`cp_cost`
    (bandwidth, overlap, K/V bytes): while the set of pieces whose transfers outlast
    their share of attention stays fixed it is linear in ``c``, so the fit takes it in
    exactly, recomputing that set until it settles (relative errors are taken against the
    measured times). Without a bandwidth there (or without a ``cp_cost``) it is taken as
    hidden, and any that is not ends up in the fitted per-token terms.

    Notes
    -----
    Every rank that holds the same records (gathered, e.g. by
    :class:`seqbalance.torch.timing.MicroBatchTimer`) computes the same report and the same
    refit, bit for bit: records are processed in (step, rank, slot) order, on hosts whose
    numpy uses the same BLAS kernels. The least-squares solves go through LAPACK, and
    OpenBLAS picks its kernels by CPU generation, and the last digits of a refit can differ
    between, e.g., Haswell and Sandybridge kernels. Ranks on mixed CPUs should take one
    rank's refit (e.g. ``torch.distributed.broadcast_object_list`` of ``cost.to_dict()``,
    then :func:`seqbalance.costs.cost_from_dict`); :class:`seqbalance.torch.Rebalancer`'s
    agreement check raises rather than plan with two costs.
    """

    # Class-level defaults: a recorder pickled before these existed (a checkpoint of an
    # older version) still works.
    _stream: Any = None  # a timing_files.TimingStream while streaming
    _pending: list[Timing] | None = None  # records of an extend(), written in one go

    def __init__(self, cost: Any = None, *, sync: str = "fsdp", window: int = 50) -> None:
        self.cost: CostModel = _resolve_cost(cost)
        self.cp_cost: ContextParallelCost | None = (
            cost if isinstance(cost, ContextParallelCost) else None
        )
        self.sync = check_choice(sync, "sync", SYNC_MODELS)
        self.window = check_positive_int(window, "window")
        self._records: dict[tuple[int, int, int], Timing] = {}
        self._by_step: dict[int, list[tuple[int, int, int]]] = {}
        self._stream = None

    # ---- recording -----------------------------------------------------------------------
    def record(
        self, rank: int, step: int, slot: int, lengths: Any, seconds: float,
        *, pieces: Any = None,
    ) -> None:
        """Add one micro-batch's measurement.

        Parameters
        ----------
        rank, step, slot : int
            Where it ran (``rank``: the GPU, for a CP plan).
        lengths
            The token counts of the sequences it held (whole lengths, also for CP pieces).
        seconds : float
            Its measured time.
        pieces : optional
            For a GPU of a context-parallel plan: rows ``(position in lengths, d, start,
            end)``, one per token range it held of a sequence split over ``d`` GPUs (a
            GPU of the group that got none of its tokens holds an empty range).
            :func:`records_from_plan` with ``pieces=plan.pieces`` builds them.

        Raises
        ------
        ValueError
            On a negative rank, step or slot, malformed lengths or pieces, a time that is
            not a positive finite number, or a second record for the same (rank, step,
            slot).
        OSError
            While streaming (:meth:`stream_to`), when the file cannot be written; the
            record is held all the same.
        """
        added = self._add(rank, step, slot, lengths, seconds, pieces)
        if self._stream is not None:
            if self._pending is not None:
                self._pending.append(added)
            else:
                self._stream.write([added])

    def _add(
        self, rank: Any, step: Any, slot: Any, lengths: Any, seconds: Any, pieces: Any
    ) -> Timing:
        added = _checked_timing(rank, step, slot, lengths, seconds, pieces)
        key = (added.step, added.rank, added.slot)
        if key in self._records:
            raise ValueError(
                f"rank {added.rank} step {added.step} slot {added.slot} is already recorded; "
                "number steps and slots so that each micro-batch is recorded once"
            )
        self._records[key] = added
        self._by_step.setdefault(added.step, []).append(key)
        self._trim()
        return added

    def _trim(self) -> None:
        """Drop the oldest steps beyond the window."""
        if len(self._by_step) > self.window:
            for old in sorted(self._by_step)[: len(self._by_step) - self.window]:
                for k in self._by_step.pop(old):
                    del self._records[k]

    def extend(self, records: Iterable[Any]) -> None:
        """Add many records: :class:`Timing` objects or ``(rank, step, slot, lengths,
        seconds)`` tuples (a sixth item: the pieces of a CP record), each through
        :meth:`record`. Those before a bad one are kept (and streamed, in one write)."""
        self._pending = []
        try:
            for i, r in enumerate(records):
                if isinstance(r, Timing):
                    self.record(r.rank, r.step, r.slot, r.lengths, r.seconds, pieces=r.pieces)
                elif isinstance(r, (tuple, list)) and len(r) in (5, 6):
                    self.record(*r[:5], pieces=r[5] if len(r) == 6 else None)
                else:
                    raise ValueError(
                        f"records[{i}] = {r!r} is not a Timing or a (rank, step, slot, "
                        "lengths, seconds[, pieces]) record"
                    )
        finally:
            pending, self._pending = self._pending, None
            if self._stream is not None and pending:
                self._stream.write(pending)

    def clear(self) -> None:
        """Forget every record (e.g. after switching the plan's cost)."""
        self._records.clear()
        self._by_step.clear()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the settings and the window's records to ``path`` (JSON Lines).

        :meth:`load` (or ``seqbalance refit``) reads it back; the format is in
        :mod:`seqbalance.costs.timing_files`. Records gathered by
        :class:`~seqbalance.torch.MicroBatchTimer` are the same on every rank: save them
        on one. A file that a stream is writing to (this recorder's, or another's: its
        lock, see :meth:`stream_to`) is refused with a ValueError: the new file would
        replace it under the stream, whose later records would be lost.

        Examples
        --------
        >>> import tempfile, os
        >>> rec = TimingRecorder("tokens", sync="ddp")
        >>> rec.record(0, 0, 0, [100, 300], 0.04)
        >>> path = rec.save(os.path.join(tempfile.mkdtemp(), "timings.jsonl"))
        >>> TimingRecorder.load(path).records == rec.records
        True
        """
        from .timing_files import save_timings

        return save_timings(self, path)

    def stream_to(
        self, path: str | os.PathLike[str] | None, *, resume: bool = False
    ) -> Path | None:
        """Append every record from now on to ``path`` as it arrives (None: stop).

        A long run keeps every step this way, not only the window :meth:`save` writes,
        and a job that stops loses at most the line it was writing. Each :meth:`record`,
        and each :meth:`extend` (one a step under
        :class:`~seqbalance.torch.MicroBatchTimer`), is written and flushed to the
        operating system at once; the format is :meth:`save`'s, so :meth:`load` and
        ``seqbalance refit`` read the file at any time (a line being written may show
        cut short: load again).

        A new or empty file gets the header and the records already held. A file that
        holds records is refused unless ``resume=True``: a job resumed from a checkpoint
        then appends its later records after a resume marker that repeats the file's
        header. Its sync and CP link must be this recorder's (the cost may differ: a
        resumed job may start from its refit); the records it already holds are not
        written again (a restored recorder's are in the file). A last line cut short by
        a stopped job is removed first, with a warning. When loading, steps timed after
        a resume marker replace the same steps timed before it.

        Records gathered by :class:`~seqbalance.torch.MicroBatchTimer` are the same on
        every rank: stream on one (``if rank == 0``). The file is locked while streamed
        (an advisory lock, where the system and file system have them), so a second
        stream to it, from another process or recorder, is refused. Streaming to another
        path first closes the current file; :meth:`clear` and the window do not touch it.

        Returns
        -------
        Path or None
            The path streamed to.

        Parameters
        ----------
        path : path or None
            The file (None: stop streaming).
        resume : bool
            Append to a file that holds records (a job resumed from a checkpoint).

        Raises
        ------
        ValueError
            The file holds records and ``resume`` is False; or it holds records without
            a header, or a header with another sync or CP link; or another stream is
            writing to it, or this recorder already streams to it. The current stream, if
            any, goes on.
        OSError
            The file cannot be opened or written; or, on stopping or switching, the
            current file's last records cannot be written (it is closed all the same).

        Examples
        --------
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "timings.jsonl")
        >>> rec = TimingRecorder("tokens", sync="ddp", window=1)
        >>> _ = rec.stream_to(path)
        >>> rec.record(0, 0, 0, [100, 300], 0.04)
        >>> rec.record(0, 1, 0, [200], 0.03)      # the window drops step 0; the file not
        >>> _ = rec.stream_to(None)
        >>> TimingRecorder.load(path).steps
        [0, 1]
        """
        from .timing_files import TimingStream

        resume = check_bool(resume, "resume")
        if path is not None and self._stream is not None and self._stream.same_file(path):
            raise ValueError(f"this recorder already streams to {path}")
        # The new file is opened (and checked) first: a refused one leaves the stream as
        # it was.
        new = None if path is None else TimingStream(self, path, resume=resume)
        old, self._stream = self._stream, new
        if old is not None:
            old.close()  # raises if its last records cannot be written
        return None if new is None else new.path

    @classmethod
    def load(
        cls,
        paths: Any,
        *,
        cost: Any = None,
        sync: str | None = None,
        window: int | None = None,
    ) -> TimingRecorder:
        """A recorder holding the records of one or more files written by :meth:`save`.

        Settings not given come from the files' headers (cost, sync, window); the window
        is raised to the number of steps in the files, so that none is dropped. A plain
        ``cost`` given for files saved with a context-parallel link is wrapped in that
        link. See :func:`seqbalance.costs.timing_files.load_timings`.
        """
        from .timing_files import load_timings

        return load_timings(paths, cost=cost, sync=sync, window=window, recorder_type=cls)

    @property
    def records(self) -> list[Timing]:
        """The records held, ordered by (step, rank, slot)."""
        return [self._records[k] for k in sorted(self._records)]

    @property
    def steps(self) -> list[int]:
        """The steps held, ascending."""
        return sorted(self._by_step)

    def __len__(self) -> int:
        return len(self._records)

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle does not stream: two writers would append the same records.
        state = self.__dict__.copy()
        state["_stream"] = None
        state.pop("_pending", None)
        return state

    def __repr__(self) -> str:
        return (
            f"TimingRecorder(cost={self.cost!r}, sync={self.sync!r}, window={self.window}, "
            f"records={len(self)})"
        )

    # ---- report --------------------------------------------------------------------------
    def report(self, cost: Any = None) -> BalanceReport:
        """Predicted vs measured over the window (predictions from ``cost``, default the
        recorder's current cost and :attr:`cp_cost`).

        ``cost`` may be a :class:`~seqbalance.costs.ContextParallelCost`; a plain cost
        prices the records of CP pieces without communication.

        Raises
        ------
        ValueError
            When nothing has been recorded.
        """
        recs = self.records
        if not recs:
            raise ValueError("nothing recorded yet; record micro-batch timings first")
        model = self.cost if cost is None else _resolve_cost(cost)
        cpc = self.cp_cost if cost is None else cost
        meas = np.array([r.seconds for r in recs])
        pred = _predictions(model, cpc, recs)
        rank_of = np.array([r.rank for r in recs])
        step_of = np.array([r.step for r in recs])
        slot_of = np.array([r.slot for r in recs])
        ok = pred > 0
        scale = float(np.median(meas[ok] / pred[ok])) if ok.any() else math.nan
        ps = pred * scale
        rel = np.where(ok, np.abs(ps - meas) / meas, 1.0)

        ranks = np.unique(rank_of)
        speed = np.array([
            float(np.median(meas[(rank_of == r) & ok] / ps[(rank_of == r) & ok]))
            if ((rank_of == r) & ok).any() else math.nan
            for r in ranks
        ])
        steps = np.unique(step_of)
        imb_m, imb_p, t_m, t_p, busy_total, rank_time = [], [], [], [], 0.0, 0.0
        rank_m = np.zeros(ranks.size)
        rank_p = np.zeros(ranks.size)
        for s in steps:
            sel = step_of == s
            present = np.unique(rank_of[sel])
            bm = np.array([meas[sel & (rank_of == r)].sum() for r in present])
            bp = np.array([ps[sel & (rank_of == r)].sum() for r in present])
            rank_m[np.searchsorted(ranks, present)] += bm
            rank_p[np.searchsorted(ranks, present)] += bp
            imb_m.append(bm.max() / bm.mean() - 1.0)
            imb_p.append(bp.max() / bp.mean() - 1.0 if bp.mean() > 0 else 0.0)
            tm = self._step_time(meas[sel], rank_of[sel], slot_of[sel], bm)
            t_m.append(tm)
            t_p.append(self._step_time(ps[sel], rank_of[sel], slot_of[sel], bp))
            busy_total += float(bm.sum())
            rank_time += tm * present.size
        slots = np.arange(int(slot_of.max()) + 1)
        slot_m = np.array([meas[slot_of == j].mean() if (slot_of == j).any() else 0.0
                           for j in slots])
        slot_p = np.array([ps[slot_of == j].mean() if (slot_of == j).any() else 0.0
                           for j in slots])
        finite = np.isfinite(speed)
        if finite.any():
            slowest = int(ranks[np.nanargmax(speed)])
            straggler = float(np.nanmax(speed) / np.median(speed[finite]))
        else:
            slowest, straggler = int(ranks[0]), math.nan
        return BalanceReport(
            sync=self.sync,
            steps=tuple(int(s) for s in steps),
            ranks=tuple(int(r) for r in ranks),
            rank_measured=rank_m / steps.size,
            rank_predicted=rank_p / steps.size,
            rank_speed=speed,
            slot_measured=slot_m,
            slot_predicted=slot_p,
            imbalance_measured=float(np.mean(imb_m)),
            imbalance_predicted=float(np.mean(imb_p)),
            idle_fraction=1.0 - busy_total / rank_time if rank_time > 0 else 0.0,
            step_time_measured=float(np.mean(t_m)),
            step_time_predicted=float(np.mean(t_p)),
            model_error=float(np.median(rel)),
            model_error_p90=float(np.quantile(rel, 0.9)),
            scale=scale,
            slowest_rank=slowest,
            straggler_score=straggler,
            samples=len(recs),
            relative_errors=rel,
        )

    def _step_time(
        self, t: np.ndarray, ranks: np.ndarray, slots: np.ndarray, busy: np.ndarray
    ) -> float:
        if self.sync == "ddp":
            return float(busy.max())
        # fsdp: slot j runs in lockstep on every rank.
        return float(sum(t[slots == j].max() for j in np.unique(slots)))

    def metrics(self, cost: Any = None, prefix: str = "balance/") -> dict[str, float | int]:
        """``self.report(cost).metrics(prefix)``: the dict a logger wants every step."""
        return self.report(cost).metrics(prefix)

    # ---- refit ---------------------------------------------------------------------------
    def refit(
        self,
        *,
        per_rank: bool = True,
        robust: bool = True,
        weighting: str = "relative",
        per_microbatch: bool = True,
        per_sequence: bool = True,
    ) -> CostModel:
        """Fit the cost to the window's measurements, adopt it, and return it.

        The fit is :func:`seqbalance.costs.fit_cost`'s non-negative least squares with
        Huber weights (``robust``), so a preempted or paused micro-batch does not drag the
        cost. With ``per_rank`` every rank also gets a speed factor (the median of its
        measured / predicted times, the median rank's factor being 1), and the cost is fitted
        to times divided by their rank's factor, alternating until the factors settle: a
        straggling rank then shows up in :attr:`BalanceReport.rank_speed` instead of
        inflating the cost every rank is planned with. Empty micro-batches are left out.

        Returns
        -------
        CostModel
            The new cost (a :class:`QuadraticCost` in seconds, with its
            :class:`~seqbalance.costs.FitReport` and ``meta["rank_speed"]``), which is also
            ``self.cost`` from now on (and the sequence cost of :attr:`cp_cost`, if any);
            or the previous cost, unchanged, when the window cannot identify the
            coefficients or holds fewer micro-batches than coefficients, or when
            :attr:`cp_cost` models more communication than most CP records measured
            (all three warn).

        Warns
        -----
        UnidentifiableCostWarning
            When the previous cost is kept.
        PoorlyDeterminedCostWarning
            When the timing noise leaves a coefficient that matters poorly determined
            (see :func:`seqbalance.costs.fit_cost`; the rank speed factors are taken as
            known there). The new cost is adopted all the same: it predicts shapes like
            the window's, but may mispredict others.

        Notes
        -----
        The report's standard errors (``cost.report.stderr``) come from the last fit, of
        the times divided by the rank speed factors, which they treat as known.
        """
        per_rank = check_bool(per_rank, "per_rank")
        robust = check_bool(robust, "robust")
        per_microbatch = check_bool(per_microbatch, "per_microbatch")
        per_sequence = check_bool(per_sequence, "per_sequence")
        recs = [r for r in self.records if r.lengths.size > 0]
        need = 2 + int(per_microbatch) + int(per_sequence)
        if len(recs) < need:
            warnings.warn(
                f"refit: {len(recs)} non-empty micro-batches recorded, {need} needed to fit "
                f"{need} coefficients; keeping the previous cost",
                UnidentifiableCostWarning,
                stacklevel=2,
            )
            return self.cost
        mbs = [r.lengths for r in recs]
        t = np.array([r.seconds for r in recs])
        ranks, rank_idx = np.unique([r.rank for r in recs], return_inverse=True)
        factors = np.ones(ranks.size)
        cp = any(r.pieces is not None for r in recs)
        # CP records: rows [1, Σ1/d, Σtokens, Σ(e²−s²)] and the modelled communication.
        # (None without CP pieces; used only with them, as are `active` and `comm` below.)
        rows: Any
        entries: Any
        rows, entries = fit_rows(mbs, [r.pieces for r in recs]) if cp else (None, None)
        link = self.cp_cost if cp and self.cp_cost and self.cp_cost.bandwidth else None
        # With a link, the exposed communication is linear in the fitted c while the set of
        # pieces that expose it stays fixed: fit with that set, recompute it from the new
        # c, until it stops changing (from "all exposed", usually one or two fits).
        active: Any = exposed_at(link, entries, 0.0) if link is not None else None
        for _ in range(50 if per_rank else 1):
            base = t / factors[rank_idx]
            for _ in range(50):
                if link is None:
                    fit = _fit(mbs, base, weighting, per_microbatch, per_sequence, robust,
                               rows=rows)  # fmt: skip
                    break
                offset, hide = link_split(link, entries, len(recs), active)
                fit = _fit(mbs, base, weighting, per_microbatch, per_sequence, robust,
                           rows=rows - np.outer(hide, [0, 0, 0, 1]), offset=offset)  # fmt: skip
                if fit.unidentified:
                    break
                new = exposed_at(link, entries, fit.cost.per_token_sq)
                if np.array_equal(new, active):
                    break
                active = new
            else:
                warnings.warn(
                    "refit: the set of CP pieces whose communication is exposed did not "
                    "settle in 50 fits; the cost fits the last one",
                    UserWarning,
                    stacklevel=2,
                )
            cost = fit.cost
            if fit.unidentified:
                warnings.warn(
                    unidentified_message(fit.unidentified, fit.hint)
                    + " refit keeps the previous cost.",
                    UnidentifiableCostWarning,
                    stacklevel=2,
                )
                return self.cost
            # The modelled exposed communication at the fitted c (zeros without a link).
            comm: Any = comm_seconds(link, entries, len(recs), cost.per_token_sq) if cp else None
            if link is not None:
                # A link model that leaves most records no time for their compute is wrong
                # for these GPUs (a few such records are noise, which the robust fit weighs
                # down).
                over = np.flatnonzero(comm >= base)
                if 2 * over.size > len(recs):
                    warnings.warn(
                        _comm_exceeds(recs[over[0]], comm[over[0]], link, over.size, len(recs)),
                        UnidentifiableCostWarning,
                        stacklevel=2,
                    )
                    return self.cost
            if not per_rank:
                break
            if rows is None:
                pred = np.array([cost.microbatch_cost(mb) for mb in mbs])
            else:
                pred = rows @ np.asarray(cost.polynomial) + comm
            ratio = t / np.maximum(pred, np.finfo(np.float64).tiny)
            new = np.array([np.median(ratio[rank_idx == i]) for i in range(ranks.size)])
            new /= np.median(new)
            settled = np.allclose(new, factors, rtol=1e-6, atol=0.0)
            factors = new
            if settled:
                break
        if len(recs) == need:
            warnings.warn(
                exactly_determined_message("refit"), UserWarning, stacklevel=2
            )
        elif fit.poor:
            # Adopted all the same: the new cost predicts shapes like the window's (those
            # the planner makes), and the previous one was never checked on them at all.
            text = poorly_determined_message(fit.poor, fit.hint, fit.clamped, robust, "refit")
            warnings.warn(
                text + " refit adopts the new cost all the "
                "same: it fits the window's shapes.",
                PoorlyDeterminedCostWarning,
                stacklevel=2,
            )
        steps = self.steps
        cost.meta.update(
            {
                "unit": "seconds",
                "source": "refit",
                "steps": [steps[0], steps[-1]],
                "samples": len(recs),
                "rank_speed": {str(int(r)): float(f) for r, f in zip(ranks, factors)},
            }
        )
        if cp:
            cost.meta["cp_samples"] = sum(r.pieces is not None for r in recs)
        sp = ulysses_sp_size(self.cost)
        if sp is not None:  # timed under Ulysses: one GPU's share, not to be divided again
            cost.meta["ulysses_sp_size"] = sp
        self.cost = cost
        if self.cp_cost is not None:
            old = self.cp_cost
            self.cp_cost = ContextParallelCost(
                cost,
                bandwidth=old.bandwidth,
                cost_per_second=1.0,  # the refit is in seconds
                overlap=old.overlap,
                kv_bytes_per_token=old.kv_bytes_per_token,
                comm_passes=old.comm_passes,
            )
        return cost


def _comm_exceeds(
    rec: Timing, comm: float, link: ContextParallelCost, count: int, total: int
) -> str:
    """Why refit cannot use the CP records: the modelled communication fills their time."""
    where = f"rank {rec.rank}'s micro-batch {rec.slot} of step {rec.step}"
    return (
        f"refit: the CP communication that cp_cost models (bandwidth={link.bandwidth:g}, "
        f"overlap={link.overlap:g}) fills all of the measured time of {count} of {total} "
        f"micro-batches (e.g. {comm:.3g} s exposed, {rec.seconds:.3g} s measured for "
        f"{where}); the bandwidth is too low or the overlap too small for these GPUs. "
        "Correct the cp_cost given to the TimingRecorder; refit keeps the previous cost."
    )


def _predictions(
    model: CostModel, cp_cost: Any, records: Sequence[Timing]
) -> np.ndarray:
    """Each record's predicted cost: under ``cp_cost`` (a ContextParallelCost) when given
    or when a record holds CP pieces (then with hidden communication), else ``model``'s."""
    if isinstance(cp_cost, ContextParallelCost) or any(r.pieces is not None for r in records):
        if not isinstance(cp_cost, ContextParallelCost):
            cp_cost = ContextParallelCost(model)
        pred = predict(cp_cost, [r.lengths for r in records], [r.pieces for r in records])
        if not np.isfinite(pred).all():
            raise ValueError(
                f"the predicted cost of a recorded micro-batch overflows float64 under "
                f"{cp_cost!r}; rescale the cost model or cost_per_second"
            )
        return pred
    return np.array([model.microbatch_cost(r.lengths) for r in records], dtype=np.float64)


def evaluate_records(
    cost: CostModel, cp_cost: ContextParallelCost | None, records: Sequence[Timing]
) -> FitReport:
    """How well ``cost`` (under ``cp_cost``'s link, when given, for records of CP pieces)
    predicts the measured times of ``records``, as :func:`~seqbalance.costs.evaluate_cost`
    reports it: R², largest and median relative error, no scale fitted. Records of CP
    pieces without a link are priced with their communication hidden."""
    if not records:
        raise ValueError("no records to evaluate")
    t = np.array([r.seconds for r in records])
    cp = any(r.pieces is not None for r in records)
    pred = _predictions(cost, cp_cost if cp else None, records)
    r2, max_rel, med_rel = _stats(pred, t)
    coefs = {k: float(getattr(cost, k)) for k in COEFFICIENTS}
    return FitReport(r2, max_rel, med_rel, len(records), coefs)


def records_from_plan(
    micro_batches: Any, lengths: Any, seconds: Any, step: int, *, pieces: Any = None
) -> list[tuple[Any, ...]]:
    """Records of one step from a plan's ``micro_batches[rank][slot]`` (sequence indices),
    the lengths they index, and ``seconds[rank][slot]`` measured.

    ``pieces``: a CP plan's ``plan.pieces`` (``[gpu][slot]`` lists of ``(sequence, start,
    end)``), with ``plan.micro_batches`` and one row of times per GPU; each record then
    carries its GPU's pieces as a sixth item (see :meth:`TimingRecorder.record`).

    Examples
    --------
    >>> records_from_plan([[[0], [1, 2]]], [5, 6, 7], [[0.5, 1.0]], step=3)[1][:3]
    (0, 3, 1)
    >>> cp = records_from_plan([[[0]], [[0]]], [8], [[0.5], [0.5]], step=0,
    ...                        pieces=[[[(0, 0, 2), (0, 6, 8)]], [[(0, 2, 6)]]])
    >>> cp[0][5].tolist()        # (position, d, start, end) per range of GPU 0
    [[0, 2, 0, 2], [0, 2, 6, 8]]
    """
    lens = as_lengths(lengths, "lengths")
    step = _nonneg_int(step, "step")
    per_slot = None if pieces is None else plan_pieces(pieces, micro_batches)
    out: list[tuple[Any, ...]] = []
    if isinstance(seconds, (Mapping, str, bytes)) or not hasattr(seconds, "__len__"):
        raise ValueError(
            f"seconds must be nested [rank][slot] numbers, got {type(seconds).__name__}"
        )
    if len(seconds) != len(micro_batches):
        raise ValueError(
            f"seconds has {len(seconds)} ranks but micro_batches has {len(micro_batches)}; "
            "pass one row of times per rank"
        )
    for r, rank in enumerate(micro_batches):
        row = seconds[r]
        if isinstance(row, (Mapping, str, bytes)) or not hasattr(row, "__len__"):
            raise ValueError(
                f"seconds[{r}] = {row!r} must be rank {r}'s row of times, one per micro-batch"
            )
        if len(row) != len(rank):
            raise ValueError(
                f"seconds[{r}] has {len(row)} times but rank {r} has {len(rank)} micro-batches"
            )
        for j, mb in enumerate(rank):
            idx = _indices(mb, lens.size, f"micro_batches[{r}][{j}]")
            rec: tuple[Any, ...] = (r, step, j, lens[idx], _time(row[j], f"seconds[{r}][{j}]"))
            if per_slot is not None:
                rec += (check_pieces(per_slot[r][j], lens[idx], f"pieces[{r}][{j}]"),)
            out.append(rec)
    return out


def _indices(mb: Any, n: int, name: str) -> np.ndarray:
    """Sequence indices of one micro-batch as int64, each in ``0..n-1``: numpy would take
    -1 as the last sequence and 1.7 or True as sequence 1."""
    arr = index_array(mb)
    if arr is None:
        raise ValueError(f"{name} = {mb!r} must be a list of integer sequence indices")
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise ValueError(
            f"{name} holds index {arr[bad][0].item()}, outside 0..{n - 1} (there are {n} "
            "lengths)"
        )
    return arr
