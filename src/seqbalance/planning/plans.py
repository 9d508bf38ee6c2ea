"""The :class:`Plan`: which sequences each data-parallel rank runs, in which micro-batch.

A plan is plain data (index lists plus the lengths and costs it was made for), so it can be
sent between processes as JSON, checked, simulated and used to reorder a batch and restore
per-sequence outputs to their original order.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from .._notes import Note, as_note, as_text
from .._validate import (
    as_groups,
    as_index,
    as_lengths,
    as_weights,
    check_bool,
    check_choice,
    check_max_tokens,
    check_notes,
    check_text,
)
from ..partitioning._rules import SIZES, min_count
from ._costing import sequence_costs
from ._grouping import bin_totals
from .bounds import min_micro_batches, min_padded_bins
from .simulation import SYNC_MODELS, Simulation, check_cover, simulate, step_time_lower_bound

__all__ = ["FORMAT", "Plan"]

FORMAT = "seqbalance.plan/1"


def capacity_min_micro_batches(lengths: np.ndarray, dp_size: int, max_tokens: int) -> int:
    """``ceil(total tokens / (dp_size * max_tokens))``, at least 1: no plan needs fewer."""
    if dp_size < 1:
        return 0
    return max(1, math.ceil(int(lengths.sum()) / (dp_size * max_tokens)))


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back: tuples and arrays as lists, numpy scalars as
    Python numbers (so a document built in Python compares equal to one read from JSON)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def check_derived(
    data: dict[str, Any],
    plan: Any,
    keys: tuple[str, ...],
    source: str = "the plan's micro-batches",
) -> None:
    """Refuse a document whose derived fields (``keys``, written by ``to_dict`` but not
    read back) disagree with the plan rebuilt from it: an edit there would do nothing.

    ``source`` names what those fields follow from, for the message."""
    for key in keys:
        # What to_dict writes: the attribute as plain data (a pipeline as its dict).
        value: Any = getattr(plan, key, None)
        written = value.to_dict() if hasattr(value, "to_dict") else _plain(value)
        if data.get(key) is None and written is not None:
            continue  # absent: nothing was edited
        if not _same(_plain(data.get(key)), written):
            raise ValueError(
                f"{key} is {_short(data[key])} but {source} give {_short(written)}; {key} "
                "follows from them (edit those instead, or leave it out)"
            )


def _same(a: Any, b: Any) -> bool:
    """Equal, or numbers (lists of them) equal to 1e-9 relative: a cost written by another
    version of the arithmetic is not an edit."""
    if a == b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    try:
        x = np.asarray(a, dtype=np.float64)
        y = np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=1e-9, atol=0.0))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: A key only a subclass's documents hold -> that subclass: :meth:`Plan.from_dict` reads
#: any plan document (``"pieces"``: :class:`~seqbalance.planning.cp_plans.CPPlan`, which adds
#: itself here), without this module importing the subclasses built on it.
DOCUMENT_KINDS: dict[str, type[Plan]] = {}


class Plan:
    """A micro-batch schedule for every data-parallel rank.

    Attributes
    ----------
    micro_batches : list of list of list of int
        ``micro_batches[r][j]`` holds the sequence indices (ascending) of rank ``r``'s
        micro-batch ``j``, in the order the rank should run them.
    lengths : np.ndarray
        Tokens per sequence (int64), as planned.
    costs : np.ndarray
        Per-sequence cost (float64) the plan was balanced for.
    per_microbatch : float
        Fixed cost of one micro-batch in the same units.
    max_tokens : int
        Token capacity of a micro-batch (padded: ``count * longest``).
    padded : bool
        Whether micro-batches are padded to their longest sequence.
    sync : str
        The sync model the plan was optimised for.
    strategy : str
        Which planner or baseline made it.
    notes : tuple of str
        Why the plan looks as it does where that is not obvious (e.g. why the micro-batch
        count is above the capacity minimum). Strings or notes (:class:`~seqbalance.Note`) are
        accepted; :attr:`notes` reads them as text, :attr:`note_items` as notes.
    size : str
        The rule on sequences (or groups) per rank the plan was made under.
    groups : np.ndarray or None
        Group id per sequence (int64) where groups had to stay on one rank.
    pipeline : PipelineSetup or None
        Pipeline layout and forward costs when planned with ``pp_size > 1``
        (:mod:`seqbalance.planning.pipeline_plans`); ``micro_batches[r]`` is then replica
        ``r``'s run order. A dict as :meth:`to_dict` writes it is accepted.
    """

    pipeline: Any = None  # subclasses that build themselves (CPPlan) have no pipeline
    #: The notes as :class:`~seqbalance.Note`\ s: their kinds and fields, for code that
    #: reads them; :attr:`notes` is their text.
    note_items: tuple[Note, ...] = ()
    #: GPUs per data-parallel rank for context parallelism: 1 here, ``cp_size`` in a
    #: :class:`~seqbalance.planning.cp_plans.CPPlan`. Code that reads any plan asks this
    #: (and :attr:`pipeline`) instead of its class.
    cp_size: int = 1

    def __init__(
        self,
        micro_batches: Sequence[Sequence[Sequence[int]]],
        lengths: Any,
        *,
        max_tokens: int,
        costs: Any = None,
        per_microbatch: float = 0.0,
        padded: bool = False,
        sync: str = "fsdp",
        strategy: str = "seqbalance",
        notes: Sequence[str | Note] = (),
        size: str = "free",
        groups: Any = None,
        pipeline: Any = None,
    ) -> None:
        self.lengths = as_lengths(lengths)
        n = self.num_sequences
        try:
            self.micro_batches = [
                [sorted(as_index(i) for i in mb) for mb in rank] for rank in micro_batches
            ]
        except TypeError:
            raise ValueError(
                "micro_batches must be nested lists [rank][micro-batch] of integer indices "
                "(not bools)"
            ) from None
        for r, rank in enumerate(self.micro_batches):
            for j, mb in enumerate(rank):
                if mb and not (0 <= mb[0] and mb[-1] < n):
                    bad = mb[0] if mb[0] < 0 else mb[-1]
                    raise ValueError(
                        f"micro_batches[{r}][{j}] holds index {bad}, outside 0..{n - 1} "
                        f"({n} sequences)"
                    )
        self.costs = (
            self.lengths.astype(np.float64) if costs is None else as_weights(costs, "costs")
        )
        if self.costs.shape[0] != n:
            raise ValueError(f"costs has {self.costs.shape[0]} entries but there are {n} lengths")
        self.per_microbatch = float(as_weights([per_microbatch], "per_microbatch")[0])
        self.max_tokens = check_max_tokens(max_tokens, "max_tokens")
        self.padded = check_bool(padded, "padded")
        self.sync = check_choice(sync, "sync", SYNC_MODELS)
        self.strategy = check_text(strategy, "strategy")
        self.notes = check_notes(notes, "notes")
        self.size = check_choice(size, "size", SIZES)
        self.groups = None if groups is None else as_groups(groups, n)
        self.pipeline = _pipeline(pipeline, n, self.num_micro_batches)
        if self.pipeline is not None:
            self.pipeline.check_costs(self.costs, self.per_microbatch)

    @classmethod
    def _from_validated(
        cls,
        micro_batches: list[list[list[int]]],
        lengths: np.ndarray,
        *,
        max_tokens: int,
        costs: np.ndarray,
        per_microbatch: float,
        padded: bool,
        sync: str,
        strategy: str,
        notes: Sequence[str | Note],
        size: str,
        groups: np.ndarray | None,
        pipeline: Any = None,
    ) -> Plan:
        """A plan from arguments :func:`seqbalance.plan` has already validated.

        Skips the checks of ``__init__`` (the planner validated at its boundary); indices
        are still sorted inside each micro-batch, as ``__init__`` does.
        """
        self = cls.__new__(cls)
        self.lengths = lengths
        self.micro_batches = [[sorted(mb) for mb in rank] for rank in micro_batches]
        self.costs = costs
        self.per_microbatch = float(per_microbatch)
        self.max_tokens = max_tokens
        self.padded = padded
        self.sync = sync
        self.strategy = strategy
        self.notes = tuple(notes)
        self.size = size
        self.groups = groups
        self.pipeline = pipeline
        return self

    # ---- notes -------------------------------------------------------------------------
    @property
    def notes(self) -> tuple[str, ...]:
        """The notes as text (:attr:`note_items` in :func:`seqbalance.plan`'s words); each
        string keeps its note, so ``plan.notes = (*plan.notes, extra)`` loses nothing."""
        return tuple(as_text(note) for note in self.note_items)

    @notes.setter
    def notes(self, notes: Sequence[str | Note]) -> None:
        self.note_items = tuple(as_note(note) for note in notes)

    def render_notes(self, words: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """The notes as text, their terms in ``words``: an integration's own names for
        :func:`seqbalance.plan`'s arguments (``{"max_tokens": "--max-tokens"}``)."""
        return tuple(note.render(words) for note in self.note_items)

    # ---- shape -------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        """Number of data-parallel ranks (replicas, when a rank is a CP group or a
        pipeline)."""
        return len(self.micro_batches)

    @property
    def world_size(self) -> int:
        """Rows of :attr:`micro_batches`: ``dp_size`` here, one per GPU of the
        ``dp_size x cp_size`` mesh in a CP plan (pipeline stages not counted)."""
        return len(self.micro_batches)

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per rank (the largest count if a baseline left them unequal)."""
        return max((len(r) for r in self.micro_batches), default=0)

    @property
    def num_sequences(self) -> int:
        """Number of sequences planned."""
        return int(self.lengths.shape[0])

    def __repr__(self) -> str:
        return (
            f"Plan(strategy={self.strategy!r}, dp_size={self.dp_size}, "
            f"num_micro_batches={self.num_micro_batches}, sequences={self.num_sequences}, "
            f"max_tokens={self.max_tokens}, sync={self.sync!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside

    # ---- reordering --------------------------------------------------------------------
    def rank_indices(self, rank: int) -> np.ndarray:
        """Indices of rank ``rank``'s sequences, micro-batch after micro-batch (int64)."""
        try:
            rank = as_index(rank)
        except TypeError:
            raise ValueError(
                f"rank must be an integer in [0, {self.dp_size}), got {rank!r}"
            ) from None
        if not 0 <= rank < self.dp_size:
            raise ValueError(f"rank must be in [0, {self.dp_size}), got {rank}")
        flat = [i for mb in self.micro_batches[rank] for i in mb]
        return np.asarray(flat, dtype=np.int64)

    def order(self) -> np.ndarray:
        """Flat permutation of all sequence indices: rank-major, then micro-batch, then position.

        ``batch[plan.order()]`` lays a batch out as the plan runs it.
        """
        flat = [i for rank in self.micro_batches for mb in rank for i in mb]
        return np.asarray(flat, dtype=np.int64)

    def inverse_order(self) -> np.ndarray:
        """Inverse of :meth:`order`: ``reordered[plan.inverse_order()]`` restores input order."""
        n = self.num_sequences
        order = self.order()  # each sequence once where whole (CP plans: at its first GPU)
        # A hand-made or edited plan without each sequence once has no inverse; one
        # computed anyway would silently read wrong rows.
        check_cover(order, n)
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n, dtype=np.int64)
        return inv

    # ---- tokens and checks -------------------------------------------------------------
    def microbatch_tokens(self) -> np.ndarray:
        """Tokens each micro-batch occupies, shape ``(dp, m)``; padded: ``count * longest``.

        Missing micro-batches (a rank with fewer than ``m``) count as 0.
        """
        out = np.zeros((self.dp_size, self.num_micro_batches), dtype=np.int64)
        flat = [mb for rank in self.micro_batches for mb in rank]
        rows = np.repeat(np.arange(self.dp_size), [len(rank) for rank in self.micro_batches])
        cols = [j for rank in self.micro_batches for j in range(len(rank))]
        out[rows, cols] = bin_totals(flat, self.lengths, padded=self.padded)
        return out

    def violations(self) -> dict[str, int]:
        """Counts of broken constraints; all zero for a plan from :func:`seqbalance.plan`.

        Keys: ``over_capacity`` (micro-batches above ``max_tokens``), ``empty``
        (empty micro-batches), ``unequal_counts`` (ranks whose micro-batch count differs
        from the largest), ``missing`` and ``duplicated`` (sequence indices); for a plan
        made under groups or a size rule also ``split_groups`` (groups found on more than
        one rank, counted once per extra rank) and ``size_rule`` (ranks whose sequence or
        group count breaks the rule).
        """
        seen = np.bincount(self.order(), minlength=self.num_sequences)
        m = self.num_micro_batches
        out = {
            "over_capacity": int((self.microbatch_tokens() > self.max_tokens).sum()),
            "empty": sum(1 for rank in self.micro_batches for mb in rank if not mb),
            "unequal_counts": sum(1 for rank in self.micro_batches if len(rank) != m),
            "missing": int((seen == 0).sum()),
            "duplicated": int(np.clip(seen - 1, 0, None).sum()),
        }
        if self.groups is not None or self.size != "free":
            out.update(self._rule_violations())
        return out

    def _rank_sequences(self, rank: int) -> np.ndarray:
        """The distinct sequences of data-parallel rank ``rank``, the unit rules count on."""
        return np.unique(self.rank_indices(rank))

    def _rule_violations(self) -> dict[str, int]:
        """Groups split across ranks, and ranks whose count breaks the size rule."""
        per_rank = [self._rank_sequences(r) for r in range(self.dp_size)]
        if self.groups is None:
            counts = np.array([u.size for u in per_rank])
            total, split = self.num_sequences, 0
        else:
            held = [np.unique(self.groups[u]) for u in per_rank]
            counts = np.array([h.size for h in held])
            total = int(np.unique(self.groups).size)
            split = int(counts.sum()) - int(np.unique(np.concatenate(held or [np.array([])])).size)
        lo = min_count(total, max(self.dp_size, 1), self.size)
        hi = lo if self.size == "equal" else (lo + 1 if self.size == "balanced" else total)
        bad = int(((counts < lo) | (counts > hi)).sum())
        return {"split_groups": split, "size_rule": bad}

    # ---- evidence ----------------------------------------------------------------------
    def min_micro_batches_bound(self) -> int:
        """Fewest micro-batches per rank that the token capacity allows (a lower bound).

        A bin-packing bound (:func:`seqbalance.planning.bounds.min_micro_batches`), at least
        ``ceil(total tokens / (dp * max_tokens))`` where every sequence fits ``max_tokens``.
        A sequence longer than ``max_tokens`` (``plan(oversized="alone")``) runs alone, so it
        counts as one full micro-batch: ``k`` of them and the others' bin-packing bound
        ``B`` give ``ceil((k + B) / dp)``. A padded plan also needs
        ``ceil(min_padded_bins / dp)`` (:func:`seqbalance.planning.bounds.min_padded_bins`,
        exact for count x longest bins).
        """
        if self.dp_size < 1:
            return 0
        m = min_micro_batches(self.lengths, self.dp_size, self.max_tokens)
        if self.padded:
            bins = min_padded_bins(np.asarray(self.lengths), self.max_tokens)
            m = max(m, -(-bins // self.dp_size))
        return m

    def lower_bound(self, cost: Any = None, sync: str | None = None) -> float:
        """Step-time lower bound under the capacity (see ``step_time_lower_bound``).

        ``sync`` defaults to the plan's own sync model.
        """
        check_choice(self.sync if sync is None else sync, "sync", SYNC_MODELS)
        return self._bound(*self._costs(cost), self.sync if sync is None else sync)

    def _bound(self, costs: np.ndarray, c0: float, sync: str) -> float:
        return step_time_lower_bound(
            costs,
            self.dp_size,
            min_micro_batches=self.min_micro_batches_bound(),
            per_microbatch=c0,
            size=self.size,
            groups=self.groups,
            lengths=self.lengths,
            max_tokens=self.max_tokens,
            sync=sync,
        )

    def simulate(self, cost: Any = None, sync: str | None = None) -> Simulation:
        """Simulate one training step of this plan.

        Parameters
        ----------
        cost : optional
            Cost to simulate with (model, name, array); default: the plan's own costs.
        sync : {"fsdp", "ddp"}, optional
            Default: the sync model the plan was made for.

        Returns
        -------
        Simulation
            Step time, per-rank busy/idle time, the lower bound and the gap to it.
        """
        costs, c0 = self._costs(cost)
        return self._simulate(costs, c0, self.sync if sync is None else sync, None)

    def _simulate(self, costs: np.ndarray, c0: float, sync: str, bound: float | None) -> Simulation:
        if bound is None:
            bound = self._bound(costs, c0, sync)
        return simulate(
            self.micro_batches,
            costs,
            sync=sync,
            per_microbatch=c0,
            padded=self.padded,
            lower_bound=bound,
        )

    def simulate_pipeline(self, sync: str | None = None) -> Any:
        """Simulate the pipeline step of a plan made with ``pp_size > 1``.

        Returns a :class:`~seqbalance.planning.pipeline_plans.PlanPipelineSimulation`
        (step time, per-replica times, the slowest pipeline's per-stage timeline, bubble
        fraction, lower bound and gap).
        """
        from .pipeline_plans import simulate_plan_pipeline

        if self.pipeline is None:
            raise ValueError("this plan has no pipeline; plan with pp_size > 1")
        sync = self.sync if sync is None else check_choice(sync, "sync", SYNC_MODELS)
        return simulate_plan_pipeline(
            self.micro_batches, self.costs, self.per_microbatch, self.lengths, self.padded,
            sync, self.pipeline,
        )

    def stats(self, cost: Any = None) -> dict[str, Any]:
        """Balance and capacity statistics of the plan.

        Returns a dict with per-rank loads (``rank_loads``), per-micro-batch loads
        (``mb_loads``, ``(dp, m)`` nested list), their spread, cv and imbalance
        (max/mean - 1), capacity utilisation (tokens used / ``dp * m * max_tokens``; above
        1 only when micro-batches break the capacity), unused tokens (room left under
        ``max_tokens``, summed over micro-batches) and ``over_capacity_tokens`` (tokens
        above it: sequences run alone with ``oversized="alone"``, or a baseline that
        breaks the cap), the capacity-aware step-time lower bound of the plan's sync model
        (``lower_bound``; per model ``lower_bound_ddp`` and ``lower_bound_fsdp``), and the gap
        to it under both sync models.
        """
        costs, c0 = self._costs(cost)
        ddp = self._simulate(costs, c0, "ddp", None)
        fsdp = self._simulate(costs, c0, "fsdp", None)
        bound = fsdp.lower_bound if self.sync == "fsdp" else ddp.lower_bound
        mb = ddp.mb_costs
        ranks = mb.sum(axis=1)
        mean = float(ranks.mean()) if ranks.size else 0.0
        capacity = self.dp_size * self.num_micro_batches * self.max_tokens
        tokens = self.microbatch_tokens()
        used = int(tokens.sum())
        return {
            "strategy": self.strategy,
            "dp_size": self.dp_size,
            "num_micro_batches": self.num_micro_batches,
            "sequences": self.num_sequences,
            "rank_loads": ranks.tolist(),
            "mb_loads": mb.tolist(),
            "max": float(ranks.max()) if ranks.size else 0.0,
            "min": float(ranks.min()) if ranks.size else 0.0,
            "mean": mean,
            "spread": float(ranks.max() - ranks.min()) if ranks.size else 0.0,
            "cv": float(ranks.std() / mean) if mean > 0 else 0.0,
            "imbalance": float(ranks.max() / mean - 1.0) if mean > 0 else 0.0,
            "mb_spread": float(mb.max() - mb.min()) if mb.size else 0.0,
            "capacity_utilisation": used / capacity if capacity else 0.0,
            "unused_tokens": int(np.maximum(self.max_tokens - tokens, 0).sum()),
            "over_capacity_tokens": int(np.maximum(tokens - self.max_tokens, 0).sum()),
            "lower_bound": bound,
            "lower_bound_ddp": ddp.lower_bound,
            "lower_bound_fsdp": fsdp.lower_bound,
            "gap_ddp": ddp.gap,
            "gap_fsdp": fsdp.gap,
            "violations": self.violations(),
        }

    def metrics(self, cost: Any = None, prefix: str = "balance/") -> dict[str, Any]:
        """Predicted balance as a flat dict for loggers; keys and meanings in
        :data:`seqbalance.planning.metrics.PLAN_METRICS`."""
        from .metrics import plan_metrics

        return plan_metrics(self, cost, prefix)

    def _costs(self, cost: Any) -> tuple[np.ndarray, float]:
        if cost is None:
            return self.costs, self.per_microbatch
        return sequence_costs(self.lengths, cost)

    # ---- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-data form of the plan (what :meth:`to_json` writes)."""
        return {
            "format": FORMAT,
            "strategy": self.strategy,
            "sync": self.sync,
            "dp_size": self.dp_size,
            "num_micro_batches": self.num_micro_batches,
            "max_tokens": self.max_tokens,
            "padded": self.padded,
            "per_microbatch": self.per_microbatch,
            "notes": list(self.notes),
            "size": self.size,
            "groups": None if self.groups is None else self.groups.tolist(),
            "lengths": self.lengths.tolist(),
            "costs": self.costs.tolist(),
            "micro_batches": self.micro_batches,
        } | ({} if self.pipeline is None else {"pipeline": self.pipeline.to_dict()})

    def to_json(self, path: Any = None) -> str:
        """Serialise to JSON (floats round-trip exactly); also write it to ``path`` if given."""
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Rebuild a plan from :meth:`to_dict` output.

        Every field is checked as :class:`Plan` checks its arguments (``max_tokens`` below
        ``2**62`` as :func:`seqbalance.plan` requires, ``notes`` a list of strings, ...);
        a document with ``pieces`` is a :class:`~seqbalance.planning.cp_plans.CPPlan`.

        Raises
        ------
        ValueError
            The document is not a plan, lacks a required key, or has a bad field (the
            message names the key).
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a seqbalance plan: format is {found!r}, want {FORMAT!r}")
        for key, kind in DOCUMENT_KINDS.items():  # e.g. "pieces": a context-parallel plan
            if key in data and kind is not cls:
                return kind.from_dict(data)
        missing = [k for k in ("micro_batches", "lengths", "max_tokens") if k not in data]
        if missing:
            raise ValueError(f"plan document lacks {', '.join(missing)}")
        out = cls(
            data["micro_batches"],
            data["lengths"],
            max_tokens=data["max_tokens"],
            costs=data.get("costs"),
            per_microbatch=data.get("per_microbatch", 0.0),
            padded=data.get("padded", False),
            sync=data.get("sync", "fsdp"),
            strategy=data.get("strategy", "seqbalance"),
            notes=data.get("notes", ()),
            size=data.get("size", "free"),
            groups=data.get("groups"),
            pipeline=data.get("pipeline"),
        )
        check_derived(data, out, ("dp_size", "num_micro_batches"))
        return out

    @classmethod
    def from_json(cls, text_or_path: str | bytes | os.PathLike[str]) -> Plan:
        """Rebuild a plan from a JSON string, or from a path to a JSON file.

        A string (or bytes) whose first non-blank character is ``{``, ``[`` or ``"`` is
        JSON text; any other string, bytes or ``os.PathLike`` is a path. Anything else
        (None, a number, a dict) raises a ValueError: pass a dict to :meth:`from_dict`.

        Raises
        ------
        ValueError
            ``text_or_path`` is of another type, empty, JSON that does not parse or is not
            a plan document, or a plan document with a bad field.
        FileNotFoundError
            ``text_or_path`` is not JSON text and names no existing file.
        """
        if not isinstance(text_or_path, (str, bytes, bytearray, os.PathLike)):
            hint = " (a dict goes to Plan.from_dict)" if isinstance(text_or_path, dict) else ""
            raise ValueError(
                "text_or_path must be the plan's JSON text (str or bytes) or a path to a JSON "
                f"file, got {type(text_or_path).__name__}{hint}"
            )
        if isinstance(text_or_path, (bytes, bytearray)):
            text_or_path = bytes(text_or_path).decode("utf-8")
        if isinstance(text_or_path, str) and not text_or_path.strip():
            raise ValueError("text_or_path is empty; pass the plan's JSON text or a path")
        looks_json = isinstance(text_or_path, str) and text_or_path.lstrip()[:1] in ('{', '[', '"')
        if not looks_json:
            if not os.path.isfile(text_or_path):
                raise FileNotFoundError(
                    f"text_or_path={str(text_or_path)[:80]!r} is neither JSON text (which "
                    "starts with '{') nor an existing file"
                )
            with open(text_or_path, encoding="utf-8") as fh:
                text = fh.read()
        else:
            text = str(text_or_path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"plan JSON does not parse: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(
                f"plan JSON must be an object (as written by Plan.to_json), got a "
                f"{type(data).__name__}"
            )
        return cls.from_dict(data)


def _pipeline(value: Any, n: int, m: int) -> Any:
    """None, a PipelineSetup, or its dict form -> None or a PipelineSetup (for ``m``
    micro-batches per rank: the schedule's divisibility rule is checked here)."""
    if value is None:
        return None
    from .pipeline_plans import PipelineSetup

    if isinstance(value, dict):
        value = PipelineSetup.from_dict(value, n)
    if not isinstance(value, PipelineSetup):
        kind = type(value).__name__
        raise ValueError(f"pipeline must be None, a PipelineSetup or a dict, got {kind}")
    value.spec.check_count(m)
    return value
