"""Pipeline-parallel step simulation: GPipe, 1F1B and interleaved 1F1B with unequal micro-batches.

The model
---------
A data-parallel replica splits the model's layers evenly over ``p`` pipeline stages; with
the interleaved schedule every stage holds ``v`` model chunks ("virtual stages"), and chunk
``c`` of stage ``s`` is virtual stage ``c·p + s``. Micro-batch ``i`` costs ``F_i`` forward
and ``B_i`` backward for the whole model (see :mod:`seqbalance.costs.phases`), so one
operation (forward or backward of one micro-batch on one virtual stage) lasts
``F_i / (p·v)`` or ``B_i / (p·v)``.

A schedule fixes the order of the operations on every stage (:func:`stage_orders`):

``gpipe``
    every forward in micro-batch order, then every backward in the same order.
``1f1b``
    stage ``s`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward
    and one backward, then drains the remaining backwards (PipeDream-flush / Megatron).
``interleaved``
    Megatron's interleaved 1F1B: forwards visit chunk 0 for micro-batches ``0..p-1``, then
    chunk 1 for the same ``p`` micro-batches, ..., then the next ``p`` micro-batches;
    backwards the same with chunks reversed; ``2·(p - s - 1) + (v - 1)·p`` warm-up
    forwards (all of them when ``m == p``). ``m`` must be a multiple of ``p``.

An operation starts when (a) the previous operation of its stage in the schedule's order
has ended and (b) the operation it depends on has ended and its activations (forward) or
gradients (backward) have arrived: a forward needs the same micro-batch's forward on the
previous virtual stage, a backward the backward on the next virtual stage (the last
virtual stage's backward needs its own forward). A transfer between two stages takes
``comm_i`` (e.g. a per-token time x the micro-batch's tokens) and does not occupy either
stage (asynchronous send/receive). This event-driven rule is the longest path through a
fixed graph, which :class:`PipelineGraph` evaluates for many micro-batch orders at once.

Closed forms (equal micro-batches, per-stage forward ``f = F/p``, backward ``b = B/p``,
no transfer time; checked exactly by the tests)
-----------------------------------------------------------------------------------------
- GPipe and 1F1B: ``(m + p - 1)·(f + b)``. The last stage cannot start before the first
  forward has crossed the ``p - 1`` stages before it (``(p - 1)·f``), then has ``m·(f + b)``
  of work, and the first stage ends ``(p - 1)·b`` after the last stage's last backward;
  both schedules keep the last stage busy in between.
- Interleaved with ``v`` chunks and ``m`` a multiple of ``p``: ``(m + (p - 1)/v)·(f + b)``.
  Every operation lasts ``f/v`` or ``b/v``; stage ``p - 1`` waits ``(p - 1)·f/v`` for the
  first chunk-0 forward and the first stage ends ``(p - 1)·b/v`` after stage ``p - 1``'s
  last backward; Megatron's warm-up depth ``2(p - s - 1) + (v - 1)p`` keeps stage
  ``p - 1`` busy in between (the tests check it for p up to 8, v up to 4), so the bubble
  is ``(p - 1)(f + b)/v``, the Megatron-LM paper's interleaved bubble.

These are the lower bound of :func:`pipeline_lower_bound` for equal micro-batches, so the
schedules are optimal there; with unequal micro-batches the order decides the stalls.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .._notes import Note
from .._validate import (
    ArgumentError,
    as_weights,
    check_choice,
    check_degree,
    check_positive_int,
)
from ..partitioning.stats import relative_gap

__all__ = [
    "SCHEDULES",
    "PipelineGraph",
    "PipelineSimulation",
    "PipelineSpec",
    "check_pipeline",
    "pipeline_lower_bound",
    "simulate_pipeline",
    "stage_orders",
]

SCHEDULES = ("1f1b", "interleaved", "gpipe")

FORWARD, BACKWARD = 0, 1


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline layout: ``pp_size`` stages, schedule, virtual stages per stage."""

    pp_size: int
    schedule: str = "1f1b"
    virtual_stages: int = 1

    @property
    def count_multiple(self) -> int:
        """Micro-batch counts must be a multiple of this (``pp_size`` when interleaved)."""
        return self.pp_size if self.schedule == "interleaved" else 1

    def check_count(self, m: int) -> None:
        """Raise ValueError unless ``m`` micro-batches suit the schedule."""
        if m % self.count_multiple:
            raise ValueError(
                f"schedule='interleaved' needs a micro-batch count that is a multiple of "
                f"pp_size={self.pp_size}, got {m}; add or merge micro-batches, or plan with "
                f"seqbalance.plan(..., pp_size={self.pp_size}, schedule='interleaved')"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pp_size": self.pp_size,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
        }


def check_pipeline(pp_size: Any, schedule: Any = "1f1b", virtual_stages: Any = 1) -> PipelineSpec:
    """Validate a pipeline layout; raises ValueError naming the bad argument and the fix."""
    p = check_degree(pp_size, "pp_size")
    check_choice(schedule, "schedule", SCHEDULES)
    v = check_degree(virtual_stages, "virtual_stages")
    check_degree(p * v, "pp_size * virtual_stages")  # the simulation grows with both
    if schedule == "interleaved" and v < 2:
        raise ArgumentError(Note(
            "argument", {"value": v},
            "{@schedule:'interleaved'} needs {@virtual_stages} >= 2, got {value}; pass the "
            "number of model chunks per stage, or use {@schedule:'1f1b'}",
        ), argument="virtual_stages")  # fmt: skip
    if schedule != "interleaved" and v != 1:
        raise ArgumentError(
            f"virtual_stages={v} applies to schedule='interleaved' only; got schedule="
            f"{schedule!r}. Pass virtual_stages=1, or schedule='interleaved'",
            argument="virtual_stages",
        )
    return PipelineSpec(p, str(schedule), v)


def _check_count(spec: PipelineSpec, m: int) -> None:
    spec.check_count(m)


def stage_orders(
    pp_size: int, m: int, schedule: str = "1f1b", virtual_stages: int = 1
) -> list[list[tuple[int, int, int]]]:
    """The operations of every stage in the schedule's order.

    Returns ``orders[s]``: a list of ``(phase, position, chunk)`` with phase 0 forward,
    1 backward, ``position`` the micro-batch's place in the run order (0..m-1) and
    ``chunk`` the model chunk (0 unless interleaved).

    Examples
    --------
    >>> [(("F", "B")[ph], i) for ph, i, _ in stage_orders(2, 3, "1f1b")[0]]
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    """
    spec = check_pipeline(pp_size, schedule, virtual_stages)
    m = check_positive_int(m, "m")
    _check_count(spec, m)
    return [list(ops) for ops in _stage_orders(spec.pp_size, m, spec.schedule, spec.virtual_stages)]


@lru_cache(maxsize=64)
def _stage_orders(
    p: int, m: int, schedule: str, v: int
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    out = []
    for s in range(p):
        phase, pos, chunk = (x.tolist() for x in _stage_arrays(p, m, schedule, v, s))
        out.append(tuple(zip(phase, pos, chunk)))
    return tuple(out)


def _stage_arrays(
    p: int, m: int, schedule: str, v: int, s: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stage ``s``'s operations in the schedule's order as arrays ``(phase, position,
    chunk)``.

    Every schedule runs its ``T`` forward operations in one order and its ``T`` backward
    operations in the same order (``T = m`` or ``m v``), ``w`` forwards first (warm-up),
    then one forward and one backward alternately, then the remaining backwards: GPipe is
    ``w = T``, 1F1B ``w = min(p - s - 1, m)``, interleaved Megatron's warm-up depth.
    """
    if schedule == "gpipe":
        total, w = m, m
    elif schedule == "1f1b":
        total, w = m, min(p - s - 1, m)
    else:
        total = m * v
        w = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
    k = np.arange(total, dtype=np.int64)
    steady = total - w
    phase = np.concatenate([
        np.zeros(w, dtype=np.int64),
        np.tile(np.array([FORWARD, BACKWARD], dtype=np.int64), steady),
        np.ones(w, dtype=np.int64),
    ])  # fmt: skip
    idx = np.concatenate([
        k[:w],
        np.stack([k[w:], k[:steady]], axis=1).ravel(),
        k[steady:],
    ])  # fmt: skip
    if schedule == "interleaved":
        pos = (idx // (p * v)) * p + idx % p
        chunk = (idx // p) % v
        chunk = np.where(phase == BACKWARD, v - 1 - chunk, chunk)
    else:
        pos, chunk = idx, np.zeros(2 * total, dtype=np.int64)
    return phase, pos, chunk


class PipelineGraph:
    """The dependency graph of one schedule for ``m`` micro-batches, compiled once.

    Nodes are the operations of every stage; each has at most two predecessors: the
    previous operation of its stage, and the operation it needs data from (with a
    transfer when that one ran on another stage). :meth:`step_times` evaluates the longest
    path for many micro-batch orders in one vectorised pass, level by level.
    """

    def __init__(self, spec: PipelineSpec, m: int) -> None:
        _check_count(spec, m)
        self.spec, self.m = spec, m
        p, v = spec.pp_size, spec.virtual_stages
        # Built with array operations: a graph of 2 p v m operations (up to millions with
        # thousands of micro-batches) is compiled in milliseconds.
        arrays = [_stage_arrays(p, m, spec.schedule, v, s) for s in range(p)]
        per = 2 * m * v  # operations per stage
        n = p * per
        self.n_nodes = n
        self.stage = np.repeat(np.arange(p, dtype=np.int64), per)
        self.phase = np.concatenate([a[0] for a in arrays])
        self.position = np.concatenate([a[1] for a in arrays])
        self.chunk = np.concatenate([a[2] for a in arrays])
        # node of (stage, phase, position, chunk)
        key = ((self.stage * 2 + self.phase) * m + self.position) * v + self.chunk
        node = np.empty(n, dtype=np.int64)
        node[key] = np.arange(n)

        def at(stage: np.ndarray, phase: int, pos: np.ndarray, chunk: np.ndarray) -> np.ndarray:
            out: np.ndarray = node[((stage * 2 + phase) * m + pos) * v + chunk]
            return out

        st, ph, pos, ch = self.stage, self.phase, self.position, self.chunk
        prev = np.arange(-1, n - 1, dtype=np.int64)
        prev[::per] = n  # n: a virtual node that ends at time 0
        dep = np.full(n, n, dtype=np.int64)
        src_stage = st.copy()
        # forward: the same chunk on the previous stage, or the previous chunk on the last
        fw = ph == FORWARD
        sel = fw & (st > 0)
        dep[sel] = at(st[sel] - 1, FORWARD, pos[sel], ch[sel])
        src_stage[sel] = st[sel] - 1
        sel = fw & (st == 0) & (ch > 0)
        dep[sel] = at(np.full(int(sel.sum()), p - 1), FORWARD, pos[sel], ch[sel] - 1)
        src_stage[sel] = p - 1
        # backward: its own forward on the last virtual stage, else the next virtual stage
        bw = ~fw
        sel = bw & (st == p - 1) & (ch == v - 1)
        dep[sel] = at(st[sel], FORWARD, pos[sel], ch[sel])
        sel = bw & (st < p - 1)
        dep[sel] = at(st[sel] + 1, BACKWARD, pos[sel], ch[sel])
        src_stage[sel] = st[sel] + 1
        sel = bw & (st == p - 1) & (ch < v - 1)
        dep[sel] = at(np.zeros(int(sel.sum()), dtype=np.int64), BACKWARD, pos[sel], ch[sel] + 1)
        src_stage[sel] = 0
        cross = (dep < n) & (src_stage != st)  # does the data dependency cross stages?
        self.prev, self.dep, self.cross = prev, dep, cross
        self.levels = self._levels()
        self._compile()
        self._memo: dict[bytes, float] = {}  # see _keys
        self._memo_lock = threading.Lock()

    def _levels(self) -> list[np.ndarray]:
        """Nodes grouped by longest-path depth (Kahn's algorithm; a cycle is a schedule bug).

        Every node has at most one successor on its stage (the next operation) and at most
        one that needs its data, so the frontier walk runs over two plain lists.
        """
        n = self.n_nodes
        prev, dep = self.prev, self.dep
        indeg = ((prev < n).astype(np.int64) + (dep < n)).tolist()
        nxt = np.full(n + 1, -1, dtype=np.int64)
        has = prev < n
        nxt[prev[has]] = np.flatnonzero(has)
        user = np.full(n + 1, -1, dtype=np.int64)
        has = dep < n
        if np.bincount(dep[has], minlength=n + 1).max(initial=0) > 1:  # pragma: no cover
            raise RuntimeError("an operation feeds two others: a bug in _stage_arrays")
        user[dep[has]] = np.flatnonzero(has)
        nxt_l, user_l = nxt.tolist(), user.tolist()
        level = [-1] * n
        frontier = [k for k in range(n) if indeg[k] == 0]
        depth = 0
        while frontier:
            new = []
            for k in frontier:
                level[k] = depth
                t = nxt_l[k]
                if t >= 0:
                    indeg[t] -= 1
                    if indeg[t] == 0:
                        new.append(t)
                t = user_l[k]
                if t >= 0:
                    indeg[t] -= 1
                    if indeg[t] == 0:
                        new.append(t)
            frontier, depth = new, depth + 1
        lv = np.asarray(level, dtype=np.int64)
        if (lv < 0).any():  # pragma: no cover - would be a bug in _stage_arrays
            raise RuntimeError(f"schedule {self.spec.schedule!r} deadlocks for m={self.m}")
        order = np.argsort(lv, kind="stable")
        bounds = np.searchsorted(lv[order], np.arange(depth + 1))
        return [order[bounds[d] : bounds[d + 1]] for d in range(depth)]

    def _compile(self) -> None:
        """Renumber the nodes level by level, so a level is a contiguous block of rows."""
        n = self.n_nodes
        topo = np.concatenate(self.levels) if self.levels else np.zeros(0, dtype=np.int64)
        inv = np.empty(n + 1, dtype=np.int64)
        inv[topo] = np.arange(n)
        inv[n] = n  # the virtual node that ends at time 0
        self._topo, self._inv = topo, inv[:n]
        self._prev = inv[self.prev[topo]]
        self._dep = inv[self.dep[topo]]
        self._cross = self.cross[topo]
        self._row = self.phase[topo] * self.m + self.position[topo]  # row of (fwd; bwd)
        self._cuts = np.cumsum([0] + [len(lv) for lv in self.levels]).tolist()

    def _run(
        self, fwd: np.ndarray, bwd: np.ndarray, comm: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Durations and end times, node-major ``(nodes, K)`` in level order."""
        scale = 1.0 / (self.spec.pp_size * self.spec.virtual_stages)
        dur = (np.concatenate([fwd.T, bwd.T]) * scale)[self._row]
        lag = None
        if comm is not None and self._cross.any():
            lag = comm.T[self._row % self.m] * self._cross[:, None]
        k = fwd.shape[0]
        if k * self.n_nodes < _SCALAR_RATIO * len(self.levels):
            # Thin levels (few stages, many micro-batches) and few orders: a numpy pass per
            # level costs more than the nodes themselves; the same sums node by node.
            return dur, self._run_nodes(dur, lag)
        end = np.zeros((self.n_nodes + 1, k))
        cuts = self._cuts
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            ready = end[self._dep[lo:hi]]
            if lag is not None:
                ready += lag[lo:hi]
            np.maximum(ready, end[self._prev[lo:hi]], out=ready)
            ready += dur[lo:hi]
            end[lo:hi] = ready
        return dur, end[:-1]

    def _run_nodes(self, dur: np.ndarray, lag: np.ndarray | None) -> np.ndarray:
        """:meth:`_run`'s end times, node by node in level order, each order on its own
        (the same float operations in the same order, so the same results)."""
        n = self.n_nodes
        dep, prev = self._dep.tolist(), self._prev.tolist()
        out = np.empty((n, dur.shape[1]))
        for col in range(dur.shape[1]):
            d = dur[:, col].tolist()
            g = lag[:, col].tolist() if lag is not None else None
            end = [0.0] * (n + 1)  # n: the virtual node that ends at time 0
            for x in range(n):
                ready = end[dep[x]]
                if g is not None:
                    ready += g[x]
                other = end[prev[x]]
                if other > ready:
                    ready = other
                end[x] = ready + d[x]
            out[:, col] = end[:n]
        return out

    def run(
        self, fwd: np.ndarray, bwd: np.ndarray, comm: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of every node for ``K`` orders: inputs ``(K, m)`` in run order.

        Returns two ``(K, nodes)`` arrays, nodes in stage order (as :attr:`stage` etc.).
        """
        dur, end = self._run(fwd, bwd, comm)
        start = end - dur
        return start[self._inv].T, end[self._inv].T

    def step_times(
        self,
        fwd: np.ndarray,
        bwd: np.ndarray,
        comm: np.ndarray | None = None,
        chunk: int = 1 << 21,
    ) -> np.ndarray:
        """Step time of each of ``K`` orders (rows of ``(K, m)`` forward/backward costs)."""
        fwd = np.atleast_2d(fwd)
        bwd = np.atleast_2d(bwd)
        comm = None if comm is None else np.atleast_2d(comm)
        keys = self._keys(fwd, bwd, comm)
        out = np.empty(fwd.shape[0])
        todo = np.arange(fwd.shape[0])
        if keys is not None:
            with self._memo_lock:
                known = [self._memo.get(k) for k in keys]
            todo = np.array([i for i, t in enumerate(known) if t is None], dtype=np.int64)
            for i, t in enumerate(known):
                if t is not None:
                    out[i] = t
        rows = max(1, chunk // max(self.n_nodes, 1))
        for a in range(0, todo.size, rows):
            sel = todo[a : a + rows]
            _, end = self._run(fwd[sel], bwd[sel], None if comm is None else comm[sel])
            out[sel] = end.max(axis=0) if end.shape[0] else 0.0
        if keys is not None:
            with self._memo_lock:  # (graphs are shared: cached by graph())
                for i in todo.tolist():
                    if len(self._memo) >= _MEMO_ROWS:
                        self._memo.pop(next(iter(self._memo)))  # the oldest
                    self._memo[keys[i]] = float(out[i])
        return out

    def _keys(
        self, fwd: np.ndarray, bwd: np.ndarray, comm: np.ndarray | None
    ) -> list[bytes] | None:
        """Digests of a few orders' inputs on a large graph, else None. A plan's run
        orders are simulated again and again on their way through the planner (the
        search's starts, the candidates compared, the chosen plan, its note): on graphs of
        hundreds of thousands of operations each repeat costs a tenth of a second, so their
        step times are remembered, by a 128-bit digest of the exact float inputs."""
        if self.n_nodes < _MEMO_MIN_NODES or fwd.shape[0] > _MEMO_MAX_ORDERS:
            return None
        keys = []
        for r in range(fwd.shape[0]):
            h = hashlib.blake2b(digest_size=16)
            h.update(np.ascontiguousarray(fwd[r], dtype=np.float64).tobytes())
            h.update(np.ascontiguousarray(bwd[r], dtype=np.float64).tobytes())
            if comm is not None and comm[r].any():  # no transfer time and zeros run alike
                h.update(np.ascontiguousarray(comm[r], dtype=np.float64).tobytes())
            keys.append(h.digest())
        return keys


# Step times of orders on graphs of at least this many operations, simulated at most this
# many at a time, are remembered (PipelineGraph._keys), up to this many per graph.
_MEMO_MIN_NODES = 1 << 14
_MEMO_MAX_ORDERS = 64
_MEMO_ROWS = 1024

# Node by node (pure Python, ~0.3 us a node and order) beats a numpy pass per level (~15
# us) when orders x nodes < this x levels.
_SCALAR_RATIO = 24


@lru_cache(maxsize=32)
def graph(spec: PipelineSpec, m: int) -> PipelineGraph:
    """The compiled graph for ``spec`` and ``m`` micro-batches (cached)."""
    return PipelineGraph(spec, m)


@dataclass(frozen=True)
class PipelineSimulation:
    """One simulated pipeline step of one replica (or of all replicas in lockstep).

    Attributes
    ----------
    spec : PipelineSpec
        Stages, schedule, virtual stages.
    step_time : float
        When the last operation ends.
    forward, backward, comm : np.ndarray
        Per-micro-batch whole-model forward and backward costs and transfer times, in run order.
    stage, phase, position, chunk, start, end : np.ndarray
        One entry per operation: its stage, phase (0 forward, 1 backward), the micro-batch's
        position in the run order, its model chunk, and when it starts and ends.
    stage_busy, stage_idle : np.ndarray
        Per-stage compute and idle time (``busy + idle == step_time``).
    bubble_fraction : float
        ``sum(stage_idle) / (p * step_time)``.
    lower_bound : float
        :func:`pipeline_lower_bound` of these micro-batches (any order).
    gap : float
        ``step_time / lower_bound - 1``.
    """

    spec: PipelineSpec
    step_time: float
    forward: np.ndarray
    backward: np.ndarray
    comm: np.ndarray
    stage: np.ndarray
    phase: np.ndarray
    position: np.ndarray
    chunk: np.ndarray
    start: np.ndarray
    end: np.ndarray
    stage_busy: np.ndarray
    stage_idle: np.ndarray
    bubble_fraction: float
    lower_bound: float
    gap: float


def _phase_arrays(
    forward: Any, backward: Any, comm: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = as_weights(forward, "forward")
    b = as_weights(backward, "backward")
    if b.shape != f.shape:
        raise ValueError(
            f"backward has {b.shape[0]} entries but forward has {f.shape[0]}; pass one forward "
            "and one backward cost per micro-batch"
        )
    c = np.zeros_like(f) if comm is None else as_weights(comm, "comm")
    if c.shape != f.shape:
        raise ValueError(
            f"comm has {c.shape[0]} entries but there are {f.shape[0]} micro-batches; pass one "
            "transfer time per micro-batch, or None"
        )
    return f, b, c


def simulate_pipeline(
    forward: Any,
    backward: Any,
    pp_size: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    comm: Any = None,
) -> PipelineSimulation:
    """Simulate one pipeline step of micro-batches run in the given order.

    Parameters
    ----------
    forward, backward : array-like of float
        Whole-model forward and backward cost of each micro-batch, in run order; each stage
        (chunk) runs ``1 / (pp_size * virtual_stages)`` of it.
    pp_size : int
        Pipeline stages ``p``.
    schedule : {"1f1b", "interleaved", "gpipe"}
        The schedule (module docstring).
    virtual_stages : int
        Model chunks per stage (``interleaved`` only, >= 2).
    comm : array-like of float, optional
        Time to send one micro-batch's activations (or gradients) from one stage to the
        next, e.g. a per-token time times its tokens; default 0.

    Returns
    -------
    PipelineSimulation

    Examples
    --------
    >>> sim = simulate_pipeline([1.0] * 8, [2.0] * 8, 4)   # f = 1/4, b = 2/4 per stage
    >>> sim.step_time == (8 + 4 - 1) * (0.25 + 0.5)
    True
    """
    spec = check_pipeline(pp_size, schedule, virtual_stages)
    f, b, c = _phase_arrays(forward, backward, comm)
    m = f.shape[0]
    bound = pipeline_lower_bound(
        f, b, spec.pp_size, virtual_stages=spec.virtual_stages, comm=c, schedule=spec.schedule
    )
    p = spec.pp_size
    if m == 0:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return PipelineSimulation(
            spec, 0.0, f, b, c, zi, zi, zi, zi, z, z, np.zeros(p), np.zeros(p), 0.0, bound, 0.0
        )
    g = graph(spec, m)
    start, end = g.run(f[None], b[None], c[None])
    start, end = start[0], end[0]
    step = float(end.max())
    busy = np.bincount(g.stage, weights=end - start, minlength=p)
    idle = step - busy
    return PipelineSimulation(
        spec=spec,
        step_time=step,
        forward=f,
        backward=b,
        comm=c,
        stage=g.stage,
        phase=g.phase,
        position=g.position,
        chunk=g.chunk,
        start=start,
        end=end,
        stage_busy=busy,
        stage_idle=idle,
        bubble_fraction=float(idle.sum() / (p * step)) if step > 0 else 0.0,
        lower_bound=bound,
        gap=float(relative_gap(step, bound)),
    )


def pipeline_lower_bound(
    forward: Any,
    backward: Any,
    pp_size: int,
    *,
    virtual_stages: int = 1,
    comm: Any = None,
    schedule: str | None = None,
) -> float:
    """A pipeline step time that no order of these micro-batches can beat.

    With per-stage costs ``f_i = F_i / p`` and ``b_i = B_i / p``, transfer times ``c_i``,
    ``W = sum_i (f_i + b_i)`` (every stage's work) and ``v`` virtual stages::

        LB = max( W + (p - 1) * min_{a != z} (f_a / v + c_a + b_z / v + c_z),
                  max_i  p * (f_i + b_i) + 2 * (p*v - 1) * c_i,
                  LB_heavy )

    (``a = z`` allowed when there is one micro-batch). ``LB_heavy`` is what one heavy
    micro-batch costs wherever it is placed: for every micro-batch ``k``, with
    ``S_k = W - f_k - b_k``, ``F = min_i (f_i / v + c_i)``, ``B = min_i (b_i / v + c_i)``,
    ``A_k = (p - 1)(f_k / v + c_k) + f_k + b_k + (p - 1) B`` and
    ``B_k = (p - 1) F + f_k + b_k + (p - 1)(b_k / v + c_k)``::

        LB_heavy = max_k max(A_k, B_k, (A_k + B_k + S_k) / 2).

    With ``schedule="gpipe"`` also

        LB_gpipe = W + (p - 1) * (max_i (f_i + c_i) + max_i (b_i + c_i)),

    which is GPipe's exact step time without transfers, for every order, and with
    ``schedule="1f1b"`` also, with round trips ``R_i = p (f_i + b_i) + 2 (p - 1) c_i`` and
    ``q = floor(m / p)``::

        LB_1f1b_memory = max_k R_k + (q - 1) * min_{i != k} R_i.

    With any ``schedule`` also the window term: with ``R_i = p (f_i + b_i) + 2 (p v - 1)
    c_i``, and for positions ``j != j'`` in the run order ``α[j, j']`` (``β[j, j']``) the
    number of forward (backward) chunk operations of position ``j'`` that stage 0 runs
    before the chunk-0 forward or after the chunk-0 backward of position ``j``::

        LB_window = max_k min_j ( R_k + sum_t α↓[j]_t f↑_t / v + sum_t β↓[j]_t b↑_t / v ),

    where ``α↓[j]`` is row ``j`` without ``j`` sorted descending and ``f↑`` the forward
    costs of the micro-batches other than ``k`` sorted ascending (same for ``β``, ``b``).

    Proof. Take the last stage ``s = p - 1``; it runs all of its work ``W``, one operation
    at a time. Its first operation is a forward of some micro-batch ``a`` on chunk 0 (every
    other operation of ``a`` on this stage needs that one first), which cannot start before
    ``a``'s chunk-0 forward has run on stages ``0..s-1`` and been sent ``s`` times:
    ``s·(f_a/v + c_a)``. Its last operation is a backward of some micro-batch ``z`` on
    chunk 0 (a backward on chunk ``k > 0`` is followed by the same micro-batch's chunk-0
    backward on this stage), after which ``z``'s chunk-0 backward still runs on stages
    ``s-1..0``, each after a transfer: ``s·(b_z/v + c_z)``. So the step lasts at least
    ``s·(f_a/v + c_a) + W + s·(b_z/v + c_z)``. GPipe, 1F1B and interleaved 1F1B run every
    stage's forwards and backwards in the same micro-batch order, so the first forward is
    of the first micro-batch in the order and the last backward of the last one: with two
    or more micro-batches, ``a != z``. Minimising over such pairs gives the first term.
    Second term: each micro-batch passes forward through all ``p·v`` virtual stages and
    back, one after another, with ``p·v - 1`` transfers each way (none when ``p = 1``).
    Heavy term (any schedule): on the last stage, micro-batch ``k``'s operations (work
    ``f_k + b_k``) start with its chunk-0 forward and end with its chunk-0 backward (as
    above); the other operations of that stage split into those that run before the first
    (work ``x``), between the two (``y``) and after the last (``S_k - x - y``). Chain A:
    ``k``'s chunk-0 forward reaches the last stage (``(p - 1)(f_k/v + c_k)``), which then
    runs ``k``'s operations and everything after its first one, then the chunk-0 backward
    of the stage's last operation returns to stage 0 (``>= (p - 1) B``):
    ``A_k + S_k - x``. Chain B: the stage's first operation waits for its chunk-0 forward
    (``>= (p - 1) F``), the stage runs everything up to ``k``'s last operation, then
    ``k``'s chunk-0 backward returns: ``B_k + x + y``. The step is at least the larger of
    the two, which for the best ``x`` in ``[0, S_k]`` (and ``y = 0``) is
    ``max(A_k, B_k, (A_k + B_k + S_k) / 2)``.
    GPipe term: let ``k`` maximise ``f_k + c_k`` and ``k'`` maximise ``b_k' + c_k'``. The
    step contains this chain of operations, each waiting for the one before: stage 0's
    forwards up to ``k``; ``k``'s forward on stages ``1..p-1`` (``(p - 1)(f_k + c_k)``);
    stage ``p-1``'s remaining forwards and its backwards up to ``k'`` (GPipe runs every
    forward before any backward); ``k'``'s backward on stages ``p-2..0``; stage 0's
    remaining backwards. Its length is the bound, whatever the order (for ``c = 0`` this
    is the proportionate flow shop's makespan, reached by every order).
    1F1B memory term: stage 0 runs the forward of the micro-batch at position ``j + p``
    only after the backward of the one at position ``j`` has come back to it (at most
    ``p`` micro-batches in flight), so the round trips of positions ``j, j + p, j + 2p,
    ...`` run one after another. The positions holding ``k`` form such a class with at
    least ``q`` members.
    Window term: put micro-batch ``k`` at position ``j``. Stage 0 runs its operations in
    the schedule's fixed order; between the start of ``k``'s chunk-0 forward and the end
    of its chunk-0 backward there, ``k`` makes its whole round trip (``R_k``, second term);
    before it stage 0 runs the operations it lists earlier and after it those it lists
    later, one at a time. Which operations those are depends only on ``j``: position
    ``j'`` contributes ``α[j, j'] f/v + β[j, j'] b/v`` of whichever micro-batch runs there.
    Over any assignment of the other micro-batches to the other positions, that sum is at
    least the rearrangement-inequality pairing (largest count with the smallest cost),
    taken for forwards and backwards separately. Minimising over ``j`` covers every place
    ``k`` can take. ∎

    For equal micro-batches and no transfers the first term is ``(m + p - 1)·(f + b)``
    (``v = 1``) or ``(m + (p - 1)/v)·(f + b)``: the closed forms of the module docstring, so
    the bound is tight there.
    """
    # The layout is checked as simulate_pipeline checks it, whatever the micro-batch count
    # (it was checked only where the window term runs, 2 <= m <= 512).
    if schedule is not None:
        spec = check_pipeline(pp_size, schedule, virtual_stages)
        p, v = spec.pp_size, spec.virtual_stages
    else:
        p = check_degree(pp_size, "pp_size")
        v = check_degree(virtual_stages, "virtual_stages")
        check_degree(p * v, "pp_size * virtual_stages")
    f, b, c = _phase_arrays(forward, backward, comm)
    m = f.shape[0]
    if m == 0:
        return 0.0
    if schedule is not None:
        spec.check_count(m)
    f, b = f / p, b / p
    work = float(np.sum(f + b))
    head = f / v + c
    tail = b / v + c
    if m == 1:
        ends = float(head[0] + tail[0])
    else:
        ia = np.argsort(head, kind="stable")[:2]
        iz = np.argsort(tail, kind="stable")[:2]
        if ia[0] != iz[0]:
            ends = float(head[ia[0]] + tail[iz[0]])
        else:
            ends = float(min(head[ia[0]] + tail[iz[1]], head[ia[1]] + tail[iz[0]]))
    fill = work + (p - 1) * ends
    if p > 1:  # the heavy-micro-batch term (any schedule)
        lo_f, lo_b = float(np.min(head)), float(np.min(tail))
        a_k = (p - 1) * head + f + b + (p - 1) * lo_b
        b_k = (p - 1) * lo_f + f + b + (p - 1) * tail
        s_k = work - f - b
        heavy = np.maximum(np.maximum(a_k, b_k), (a_k + b_k + s_k) / 2)
        fill = max(fill, float(heavy.max()))
    if schedule == "gpipe" and v == 1:
        fill = max(fill, work + (p - 1) * float(np.max(f + c) + np.max(b + c)))
    if schedule == "1f1b" and v == 1 and p > 1:
        q = m // p
        if q >= 2:
            trip = p * (f + b) + 2 * (p - 1) * c
            order = np.argsort(trip, kind="stable")
            # the lightest other micro-batch: the lightest, or the second for the lightest
            other = np.where(np.arange(m) == order[0], trip[order[1]], trip[order[0]])
            fill = max(fill, float(np.max(trip + (q - 1) * other)))
    hops = p * v - 1 if p > 1 else 0  # with one stage nothing is sent
    trips = p * (f + b) + 2 * hops * c
    chain = float(np.max(trips))
    if (schedule is not None and p > 1 and 2 <= m <= _WINDOW_MAX_M
            and 2 * p * v * m**3 <= _WINDOW_WORK):  # fmt: skip
        spec = check_pipeline(p, schedule, v)
        spec.check_count(m)
        chain = max(chain, _window_term(trips, f / v, b / v, _windows(spec, m)))
    return max(fill, chain)


_WINDOW_MAX_M = 512  # the window term costs O(m^3): beyond this many micro-batches, skip it
# ... and its tables O(p v m^3) time and O(p v m^2) memory (stage 0's 2 p v m operations
# against m positions, for m positions): beyond this much work the term is left out (a
# weaker bound, never a wrong one; 8 stages x 4 chunks reach it at m = 161)
_WINDOW_WORK = 1 << 28


@lru_cache(maxsize=32)
def _windows(spec: PipelineSpec, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position ``j``: counts of other positions' forward / backward chunk operations
    that stage 0 runs outside ``j``'s chunk-0 forward .. chunk-0 backward, each row sorted
    descending without its own (zero) entry: two ``(m, m - 1)`` arrays (window term).

    Stage 0 runs ``v`` forward and ``v`` backward operations of each position, so the
    counts come from where those ``2 v m`` operations sit: ``O(v m**2)``."""
    p, v = spec.pp_size, spec.virtual_stages
    phase, pos, chunk = _stage_arrays(p, m, spec.schedule, v, 0)
    t = np.arange(phase.size)
    zero = chunk == 0
    first = np.empty(m, dtype=np.int64)
    last = np.empty(m, dtype=np.int64)
    first[pos[zero & (phase == FORWARD)]] = t[zero & (phase == FORWARD)]
    last[pos[zero & (phase == BACKWARD)]] = t[zero & (phase == BACKWARD)]
    rows = []
    for ph in (FORWARD, BACKWARD):
        sel = phase == ph
        order = np.lexsort((t[sel], pos[sel]))
        when = t[sel][order].reshape(m, v)  # (position j', its v operations' places)
        outside = (when[None, :, :] < first[:, None, None]) | (
            when[None, :, :] > last[:, None, None]
        )
        counts = outside.sum(axis=2)  # (j, j')
        np.fill_diagonal(counts, 0)  # k's own operations are inside its window
        rows.append(-np.sort(-counts, axis=1)[:, : m - 1])  # drop one zero: its own entry
    return rows[0].astype(np.float64), rows[1].astype(np.float64)


def _window_term(
    trips: np.ndarray, f_op: np.ndarray, b_op: np.ndarray, windows: tuple[np.ndarray, np.ndarray]
) -> float:
    """``max_k (trips_k + min_j outside work)`` (see :func:`pipeline_lower_bound`).

    Row ``k`` pairs the costs of every micro-batch but ``k``, sorted ascending, with each
    row ``j`` of the counts: the sorted costs with ``k``'s removed are the sorted costs
    shifted by one from ``k``'s place on, so prefix and suffix sums over the sorted costs
    give every ``(k, j)`` in ``O(m**2)`` (no matrix product: a multithreaded BLAS on a
    busy machine took milliseconds for what is microseconds of work)."""
    alpha, beta = windows
    m = trips.shape[0]
    outside = np.zeros((m, m))  # (k, j)
    for x, counts in ((f_op, alpha), (b_op, beta)):
        order = np.argsort(x, kind="stable")
        srt = x[order]
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        # before[j, r] = sum_{t < r} srt[t] counts[j, t]; after[j, r] = sum_{t >= r}
        # srt[t + 1] counts[j, t] (counts has m - 1 columns)
        before = np.zeros((m, m))
        np.cumsum(srt[None, :-1] * counts, axis=1, out=before[:, 1:])
        after = np.zeros((m, m))
        after[:, :-1] = np.cumsum((srt[None, 1:] * counts)[:, ::-1], axis=1)[:, ::-1]
        outside += (before + after)[:, rank].T
    return float(np.max(trips + outside.min(axis=1)))
