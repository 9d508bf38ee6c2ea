"""Resource limits of a planning request, checked before any work starts.

Every entry point that plans checks its sizes here: :func:`seqbalance.plan` on every path
(plain, static CP, dynamic CP, pipelines),
:func:`seqbalance.planning.planner.plan_cp`, and through ``plan`` the sampler and
``rebalance`` of :mod:`seqbalance.torch` and the CLI. So an absurd request (a typo such as
``dp_size=10**9``) is refused in milliseconds, with a :class:`ValueError` naming the
argument, its value and the fix, instead of running for minutes or exhausting memory.
``n`` is the number of sequences, ``m`` the micro-batches per rank (or CP replica), and
``2**16`` is :data:`MAX_SLOTS_BEYOND_N`.

=================================  ======================  ================================
Quantity                           Limit                   What grows with it
=================================  ======================  ================================
a length (tokens)                  below ``2**40``         token sums (int64)
``max_tokens``                     below ``2**62``         sums of lengths and caps (int64)
``dp_size`` (ranks, replicas)      ``n + 2**16``           a micro-batch list per rank
``min_micro_batches``              ``n + 2**16``           micro-batch lists per rank
``micro_batch_multiple``           ``n + 2**16``           the same (counts are multiples)
``extra_micro_batches``            ``n + 2**16``           one candidate plan per count
``dp_size x m`` (slots)            ``n + 2**16``           packing, step times and slack
                                                           filling: linear in the slots
``cp_size``                        power of 2, ``2**14``   a cost table per power of two
``dp_size x cp_size`` (GPUs)       ``2**20``               a list of slots per GPU
``dp_size x cp_size x m``          ``cp_size x n + 2**16``  a piece list per GPU and slot
(GPU slots of a CP mesh)           (dynamic CP without     (a sequence gives at most
                                   ``allow_empty``:        ``cp_size`` pieces)
                                   ``cp_size x n``)
``pp_size``                        ``2**8``                pipeline graph: ``2 pp v m``
``pp_size x virtual_stages``       ``2**8``                operations, ``~2 (pp v + m)``
(model chunks)                                             levels, a numpy pass each; a
                                                           chunk holds one layer or more
``pp_size x virtual_stages x``     ``2**22``               the simulations of all replicas
``dp_size x m`` (pipeline                                  at once (float64 arrays of this
operations of a step)                                      size: 32 MiB each)
=================================  ======================  ================================

Searches that can grow combinatorially under rare option combinations stop on work
budgets, counted in work (never in wall-clock time, so every rank computes the same plan),
and sized so that the plans of normal requests do not reach them:

- the exact searches of one request share :data:`EXACT_NODES_PER_REQUEST` nodes at
  ``effort="thorough"``, fewer below it (:mod:`seqbalance.planning._effort`)
  (:func:`seqbalance.partitioning.searches.exact_work_pool`; each search keeps its own
  limit too; the heaviest-part enumerations draw
  :data:`seqbalance.partitioning.kway.HEAVIEST_UNITS_PER_NODE` of their work units a
  node); past it
  the request finishes as inside ``exact_searches(False)``;
- the pipeline order search (:data:`seqbalance.planning.pipeline_orders.BUDGET`
  simulated operations beyond its starting orders) runs a pass over all neighbour orders
  of a replica only where one pass fits what is left of the budget, and its exhaustive
  search over ``m!`` orders replica by replica while that fits
  (:func:`~seqbalance.planning.pipeline_orders.search_pool` shares one pool among the
  searches of a block); static CP with pipelines searches each compared replica plan's
  slot orders once, within
  :data:`seqbalance.planning.context_parallel.ORDER_BUDGET` in all; the pipeline lower
  bound's window term only up to ``2 pp v m**3 = 2**28``;
- verl's count loop as a planner candidate stops after ``2**23`` sequences x parts of KK
  work; the slot refinement keeps its swap scans within its own budget
  (:mod:`seqbalance.planning._slots`);
- counts beyond the first a search finds (extra counts, the pipeline count search, the plan
  made without the pipeline, the counts chosen by the step under a per-micro-batch cost)
  and their slot refills stop once the request has metered
  :data:`~seqbalance.planning._work.COUNT_WORK` units of packing work, and a pipelined
  plan's baselines are no longer slack-filled past
  :data:`~seqbalance.planning._work.CANDIDATE_WORK`; dynamic CP builds its degree
  candidates within :data:`seqbalance.planning.context_parallel.DYNAMIC_WORK` units of
  layout work.
"""

from __future__ import annotations

from .._notes import Note, NotedError, as_note, term
from .._validate import MAX_EMPTY_SLOTS, ArgumentError, check_size_limit

__all__ = [
    "EXACT_NODES_PER_REQUEST",
    "MAX_GPUS",
    "MAX_PIPELINE_CHUNKS",
    "MAX_PIPELINE_OPERATIONS",
    "MAX_SLOTS_BEYOND_N",
    "check_counts",
    "check_mesh",
    "check_slots",
]

#: Micro-batch slots (ranks x micro-batches), ranks, and counts beyond one per sequence.
MAX_SLOTS_BEYOND_N = MAX_EMPTY_SLOTS

#: GPUs of a context-parallel mesh (``dp_size x cp_size``): beyond any real cluster.
MAX_GPUS = 2**20

#: Pipeline stages, and stages x model chunks per stage (``pp_size x virtual_stages``).
MAX_PIPELINE_CHUNKS = 2**8

#: Operations of one simulated pipeline step over all replicas
#: (``pp_size x virtual_stages x dp_size x m``).
MAX_PIPELINE_OPERATIONS = 2**22

#: Exact-search nodes one request may spend in all at ``effort="thorough"`` (each search
#: has its own limit too, up to 200,000): past it the request finishes as inside
#: ``exact_searches(False)``. Below "thorough" the effort's pool is smaller (_effort.py).
EXACT_NODES_PER_REQUEST = 2**18

_POWER = f"2**{MAX_SLOTS_BEYOND_N.bit_length() - 1}"


def check_counts(n: int, dp: int, m_min: int, mult: int, extra: int, *, ranks: str = "ranks",
                 prefix: str = "") -> None:  # fmt: skip
    """Refuse ``dp_size`` and the micro-batch counts above ``n + 2**16`` (all ints >= 0).

    ``ranks`` names what ``dp_size`` counts (``"replicas"`` under CP); ``prefix`` starts
    the message (``"static CP: "``)."""
    for value, name, unit in (
        (dp, "dp_size", ranks),
        (m_min, "min_micro_batches", f"micro-batches per {term('rank')}"),
        (mult, "micro_batch_multiple", f"micro-batches per {term('rank')}"),
        (extra, "extra_micro_batches", "extra micro-batch counts"),
    ):
        try:
            check_size_limit(value, name, n, unit, MAX_SLOTS_BEYOND_N)
        except ValueError as exc:
            raise ArgumentError(as_note(exc.note if isinstance(exc, NotedError) else str(exc))
                                .after(prefix), argument=name) from None  # fmt: skip


def check_mesh(
    n: int, dp: int, cp_size: int = 1, pp_size: int = 1, virtual_stages: int = 1
) -> None:
    """Refuse meshes beyond :data:`MAX_GPUS` GPUs or :data:`MAX_PIPELINE_CHUNKS` chunks.

    The arguments are validated ints (``cp_size`` a power of two)."""
    if cp_size > 1 and dp * cp_size > MAX_GPUS:
        raise ArgumentError(Note(
            "mesh", {"dp": dp, "cp": cp_size, "gpus": dp * cp_size,
                     "power": MAX_GPUS.bit_length() - 1},
            "{@dp_size} x {@cp_size} = {dp} x {cp} = {gpus} GPUs is beyond any real "
            "cluster (at most 2**{power}); pass the mesh's real {@dp_size} and {@cp_size}",
        ), argument="cp_size")  # fmt: skip
    for value, name in ((pp_size, "pp_size"), (pp_size * virtual_stages,
                                                "pp_size x virtual_stages")):  # fmt: skip
        if value > MAX_PIPELINE_CHUNKS:
            raise ArgumentError(Note(
                "mesh", {"value": value, "limit": MAX_PIPELINE_CHUNKS},
                ("{@pp_size}" if name == "pp_size" else "{@pp_size} x {@virtual_stages}")
                + " = {value} is beyond any real pipeline (at most {limit} model chunks, each "
                "at least one layer); pass the pipeline's real {@pp_size} and {@virtual_stages}",
            ), argument="pp_size" if name == "pp_size" else "virtual_stages")  # fmt: skip


def check_slots(
    n: int,
    dp: int,
    m: int,
    *,
    allow_empty: bool,
    cp_size: int = 1,
    chunks: int = 1,
) -> None:
    """Refuse a micro-batch count ``m`` whose slots exceed the limits of the table above.

    ``chunks``: ``pp_size x virtual_stages`` when pipelined (1 otherwise).
    """
    name = f"dp_size x micro-batches ({dp} x {m})"
    label = Note("name", {"dp": dp, "m": m}, "{@dp_size} x micro-batches ({dp} x {m})")
    fix_note = Note("fix", {}, "lower {@dp_size}, {@min_micro_batches} or {@micro_batch_multiple}")
    if allow_empty:
        try:
            check_size_limit(dp * m, name, n, "micro-batches", MAX_SLOTS_BEYOND_N, fix=fix_note,
                             label=label)  # fmt: skip
        except ArgumentError as exc:
            raise ArgumentError(exc.note, argument="dp_size") from None
    if cp_size > 1:
        gpu_slots = dp * cp_size * m
        pieces = cp_size * n
        if gpu_slots > pieces + MAX_SLOTS_BEYOND_N:
            raise ArgumentError(Note(
                "slots", {"dp": dp, "cp": cp_size, "m": m, "slots": gpu_slots, "n": n,
                          "empty": gpu_slots - pieces, "power": _POWER, "fix": fix_note},
                "{@dp_size} x {@cp_size} x micro-batches = {dp} x {cp} x {m} = {slots} GPU "
                "slots for {n} sequences, so at least {empty} would stay empty "
                "(limit: {@cp_size} x n + {power}); {fix}",
            ), argument="dp_size")  # fmt: skip
    if chunks > 1 and chunks * dp * m > MAX_PIPELINE_OPERATIONS:
        raise ArgumentError(Note(
            "slots", {"chunks": chunks, "dp": dp, "m": m, "ops": chunks * dp * m,
                      "power": MAX_PIPELINE_OPERATIONS.bit_length() - 1, "fix": fix_note},
            "{@pp_size} x {@virtual_stages} x {@dp_size} x micro-batches = {chunks} x {dp} x {m} "
            "= {ops} pipeline operations per step, beyond the limit of 2**{power}; {fix}, or use "
            "fewer pipeline stages or virtual stages",
        ), argument="pp_size")  # fmt: skip
