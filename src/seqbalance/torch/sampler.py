"""A batch sampler that gives every rank balanced micro-batches of a map-style dataset.

Planning needs no communication (every rank computes the same plans), but ranks built with
different arguments would silently yield plans that do not fit together. So when
torch.distributed is initialised, the constructor makes one all-gather of each rank's
validation result and argument fingerprint (:func:`seqbalance.torch.agreement.agree`): a
mistake on any rank raises the same ValueError on every rank ("no hang from bad input").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .._validate import (
    as_lengths,
    as_weights,
    check_bool,
    check_max_tokens,
    check_nonnegative_int,
    check_positive_int,
    is_array_like,
)
from ..partitioning.searches import exact_searches, exact_searches_enabled
from ..planning.request import PlanSpec
from .exchange import cp_size_of, replica_grid, spec_options, too_long_for_cp

__all__ = ["BalancedDistributedSampler"]


def _distributed_ready() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _default_world() -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "num_replicas and rank were not given and torch.distributed is not initialised; "
            "call init_process_group first or pass num_replicas= and rank="
        )
    return dist.get_world_size(), dist.get_rank()


class BalancedDistributedSampler:
    """Yield this rank's balanced micro-batches, global step after global step.

    Every epoch the dataset's indices are (optionally) shuffled with
    ``numpy.random.default_rng(seed + epoch)`` and cut into global batches of
    ``global_batch_size`` sequences. Each global batch is planned with
    :func:`seqbalance.planning.planner.plan` over ``num_replicas`` ranks; this rank yields its
    micro-batches (lists of dataset indices) in order. Every rank computes the same plans
    from the same lengths and seed, so no communication is needed, and every rank yields
    the same number of micro-batches per step (so collectives line up).

    Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=pack_collate)``;
    :meth:`micro_batches_per_step` tells the training loop where optimizer steps end.

    Parameters
    ----------
    lengths : array-like of int, or callable
        Tokens per sample, indexed like the dataset; or a function of one dataset item
        returning its length (then ``dataset`` is required and is read once, item by item,
        here).
    global_batch_size : int
        Sequences per optimizer step over all ranks.
    max_tokens : int
        Token capacity of a micro-batch (optional with ``spec``, whose capacity it is).
    dataset : sized, optional
        The dataset; only needed when ``lengths`` is a callable (or to check its size).
    num_replicas, rank : int, optional
        Data-parallel size and this rank (default: from torch.distributed; with ``spec``
        the number of replicas is its mesh's ``dp``).
    cost : None, str, cost model or array-like, optional
        Passed to the planner; an array gives one cost per dataset item.
    sync : {"fsdp", "ddp"}, optional
        Sync model the plans optimise for (default ``"fsdp"``; with ``spec``, its mesh's).
    shuffle : bool, optional
        Shuffle the sample order every epoch (seeded; see :meth:`set_epoch`).
    seed : int, optional
        Base seed; the same on every rank.
    drop_last : bool, optional
        What happens to the ``len(dataset) % global_batch_size`` samples left over after the
        last full global batch. ``False`` (default): they form one last, smaller step, so
        every sample is used exactly once per epoch; that step is planned with
        ``allow_empty=True``, so when it has fewer samples than ranks some ranks get empty
        micro-batches (yielded as ``[]``; :func:`pack_collate` turns them into empty
        ``input_ids``, ``cu_seqlens``, ``position_ids``, ``lengths`` and ``max_seqlen`` 0,
        and the dataset's other keys only with ``template=`` (``collate_fn=
        functools.partial(pack_collate, template=dataset[0])``): zero rows of each; the
        rank must still run forward/backward for the collectives).
        ``True``: they are skipped this epoch (with shuffling, different ones each epoch),
        and every step has exactly ``global_batch_size`` samples (a dataset smaller than
        one global batch is refused: it would have no step at all).
    check_ranks : bool, optional
        When torch.distributed is initialised (default True): the constructor makes one
        all-gather over ``group`` so that every rank checks that all ranks were built with
        the same arguments (lengths, batch size, capacity, cost, seed, options: everything
        but ``rank``) and that none failed; otherwise every rank raises the same
        ValueError naming the ranks and the argument, instead of yielding plans that do not
        match. Every process of ``group`` must then construct the sampler; pass False to
        build one without communicating. ``set_epoch`` must still be called alike on every
        rank. The :func:`seqbalance.exact_searches` setting in force at construction is part
        of the check, and every step is planned under it, wherever it is iterated.
    group : ProcessGroup, optional
        The group for that check (default: the world).
    spec : PlanSpec, optional
        The planner's request as values (:class:`~seqbalance.planning.request.PlanSpec`:
        mesh, capacity, micro-batching, rank rules, effort), in place of ``**plan_options``
        (which must then be empty). Its mesh's ``dp`` is ``num_replicas`` and its capacity
        ``max_tokens`` (either given as well must agree), its ``sync`` the sync model (do
        not pass ``sync``), and ``cost`` goes in the spec or here, not both. The short last
        step (``drop_last=False``) is planned with ``allow_empty=True``.
    **plan_options
        Forwarded to the planner (``min_micro_batches``, ``micro_batch_multiple``,
        ``padded``, ``allow_empty``...). ``cp_size=C`` plans static context parallelism:
        ``num_replicas`` and ``rank`` are then the data-parallel size and this replica
        (give them; the world counts every CP rank), ``max_tokens`` is per GPU and bounds
        a sequence's largest piece over ``C`` GPUs, and every CP rank of a replica yields
        the replica's whole sequences, for the framework to cut (Megatron-LM's
        two-chunk split is the planned layout). ``cp="dynamic"`` is refused.

    Examples
    --------
    >>> s = BalancedDistributedSampler([5, 1, 4, 4], 4, max_tokens=8, num_replicas=2, rank=0,
    ...                                shuffle=False)
    >>> len(s) == sum(s.micro_batches_per_step())
    True
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray | Callable[[Any], int],
        global_batch_size: int,
        max_tokens: int | None = None,
        *,
        dataset: Any = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        cost: Any = None,
        sync: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        check_ranks: bool = True,
        group: Any = None,
        spec: PlanSpec | None = None,
        **plan_options: Any,
    ) -> None:
        error: Exception | None = None
        fingerprint: dict[str, Any] = {}
        try:
            if spec is not None:
                max_tokens, num_replicas, cost, sync = spec_options(
                    spec, max_tokens, num_replicas, cost, sync, plan_options
                )
            elif max_tokens is None:
                raise TypeError(
                    "BalancedDistributedSampler needs max_tokens (or spec= with a capacity)"
                )
            self._setup(
                lengths, global_batch_size, max_tokens, dataset, num_replicas, rank, cost,
                "fsdp" if sync is None else sync, shuffle, seed, drop_last, plan_options,
            )
            if check_ranks is True and _distributed_ready():
                fingerprint = self._fingerprint()
        except Exception as exc:
            error = exc
        if check_ranks is True and _distributed_ready():
            # One all-gather: every rank learns whether any rank failed or was built with
            # different arguments, and all raise the same error (no silent misrouting).
            from .agreement import agree

            agree(error, fingerprint, None, group, "BalancedDistributedSampler")
        elif error is not None:
            raise error
        elif check_ranks is not False and check_ranks is not True:
            raise ValueError(f"check_ranks must be True or False, got {check_ranks!r}")

    def _fingerprint(self) -> dict[str, Any]:
        """Everything that changes the plans (not ``rank``, which differs by design)."""
        from .agreement import describe_cost

        cost = self._cost_array if self._cost_array is not None else describe_cost(self.cost)
        return {
            "lengths": self.lengths,
            "global_batch_size": self.global_batch_size,
            "max_tokens": self.max_tokens,
            "num_replicas": self.num_replicas,
            "cost": cost,
            "sync": self.sync,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "exact_searches": self._exact_searches,
            **{f"plan option {k}": v for k, v in self.plan_options.items()},
        }

    def _setup(
        self,
        lengths: Any,
        global_batch_size: int,
        max_tokens: int,
        dataset: Any,
        num_replicas: int | None,
        rank: int | None,
        cost: Any,
        sync: str,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        plan_options: dict[str, Any],
    ) -> None:
        if callable(lengths):
            if dataset is None:
                raise ValueError("lengths is a callable, so pass dataset= to apply it to")
            fn = lengths
            lengths = [fn(dataset[i]) for i in range(len(dataset))]
        self.lengths = as_lengths(lengths, "lengths")
        if dataset is not None and len(dataset) != len(self.lengths):
            raise ValueError(
                f"lengths has {len(self.lengths)} entries but the dataset has {len(dataset)} "
                "items; give one length per item"
            )
        self.global_batch_size = check_positive_int(global_batch_size, "global_batch_size")
        self.max_tokens = check_max_tokens(max_tokens, "max_tokens")
        if num_replicas is None or rank is None:
            if plan_options.get("cp_size", 1) != 1:
                raise ValueError(
                    "with cp_size, pass num_replicas= and rank= (the data-parallel size and "
                    "this rank's replica): the world counts every CP rank"
                )
            world, me = _default_world()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        self.num_replicas = check_positive_int(num_replicas, "num_replicas")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise ValueError(f"rank must be an integer, got {rank!r}")
        if not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas}), got {rank}")
        self.rank = int(rank)
        self._store_cost(cost)
        self.sync = sync
        self.shuffle = check_bool(shuffle, "shuffle")
        # numpy's default_rng(seed + epoch) needs a non-negative integer.
        self.seed = check_nonnegative_int(seed, "seed")
        self.drop_last = check_bool(drop_last, "drop_last")
        self.plan_options = dict(plan_options)
        # The options as one checked request (a bad or unknown option fails here, when
        # built); each step plans with it, the cost aside (an array is cut per step).
        try:
            flat = {"sync": sync, **self.plan_options}
            effort = flat.pop("effort", "default")
            self._spec = PlanSpec.from_keywords(
                self.num_replicas, self.max_tokens, effort=effort, flat=flat
            )
        except TypeError as exc:
            raise ValueError(f"BalancedDistributedSampler: bad planner option: {exc}") from None
        # Plans are made lazily (per step, per epoch), maybe under another exact_searches
        # setting than at construction; pinning it keeps every step and every rank on the
        # setting the ranks agreed on here.
        self._exact_searches = exact_searches_enabled()
        self.epoch = 0
        self._cache_epoch: int | None = None
        self._cache: dict[int, tuple[np.ndarray, Any]] = {}
        self._drawn: set[int] = set()
        self._order = np.zeros(0, dtype=np.int64)
        self._remember(self._check_options())

    def _store_cost(self, cost: Any) -> None:
        if not is_array_like(cost):  # None, a name, a path, a config, a cost model
            self.cost, self._cost_array = cost, None
        else:
            arr = as_weights(cost, "cost")
            if len(arr) != len(self.lengths):
                raise ValueError(
                    f"cost has {len(arr)} entries but lengths has "
                    f"{len(self.lengths)}; give one cost per item"
                )
            self.cost, self._cost_array = None, arr

    def _check_options(self) -> dict[int, tuple[np.ndarray, Any]]:
        """Refuse what is wrong before the first draw; return the steps planned to see it.

        What can be known before the first draw fails here: an unknown option, a
        sequence over the cap anywhere in the dataset (shuffling can put it in any
        step), and this epoch's first and short last step. Whether another step fills
        every rank's micro-batches depends on the sequences it draws; such a step raises
        when it is planned (with allow_empty=True none does).
        """
        if self._spec.rules.groups is not None:
            # The plan would take ids by position in each shuffled step (or refuse per-item
            # ids with a wrong count), and a shuffle puts a group's items in several steps.
            raise ValueError(
                "BalancedDistributedSampler does not take groups=: it shuffles items, so a "
                "group's items fall into different steps; keep groups together with "
                "seqbalance.torch.rebalance(..., groups=ids) on produced batches, or pass "
                "the group as one dataset item"
            )
        cp = cp_size_of("BalancedDistributedSampler", self.plan_options)
        if self.plan_options.get("oversized", "error") == "error":
            problem = too_long_for_cp(self.lengths, self.max_tokens, cp, item="dataset item")
            if problem:
                raise ValueError(
                    f"{problem}; raise max_tokens, split or drop such items, or pass "
                    "oversized='alone'"
                )
        n, b = len(self.lengths), self.global_batch_size
        if self.drop_last and 0 < n < b:
            raise ValueError(
                f"the dataset has {n} items, fewer than global_batch_size={b}: with "
                f"drop_last=True every epoch would drop all of them and have no step; lower "
                "global_batch_size or pass drop_last=False"
            )
        if not n:
            # No step to plan: plan an empty one so that a bad sync, cost or option fails
            # here rather than never.
            self._step_plan(self.lengths[:0], last_partial=True)
            return {}
        # The first step of this epoch and its short last step, as they will be drawn:
        # whether a step can fill every rank's micro-batches depends on which sequences it
        # holds, so a stand-in such as the dataset's first items could refuse a dataset
        # whose steps all plan, or pass one whose first step cannot.
        order = self.epoch_order()
        steps = {0: order[: min(n, b)]}
        if not self.drop_last and n > b and n % b:
            steps[self.num_steps - 1] = order[n - n % b :]
        planned = {}
        for s, idx in steps.items():
            size = len(idx)
            try:
                planned[s] = (idx, self._step_plan(idx, last_partial=size < b))
            except ValueError as exc:
                if s == 0:
                    raise
                raise ValueError(
                    f"the last step of each epoch has {size} samples ({n} % "
                    f"global_batch_size={b}), and this epoch's cannot be planned: {exc}. Pass "
                    "drop_last=True to skip those samples, or change the options"
                ) from None
        return planned

    def _remember(self, planned: dict[int, tuple[np.ndarray, Any]]) -> None:
        """Cache the steps :meth:`_check_options` planned (this epoch's), so that drawing
        them does not plan them again; steps already drawn keep their plans."""
        self._enter_epoch()
        for s, step in planned.items():
            if s not in self._drawn:
                self._cache[s] = step

    def set_cost(self, cost: Any) -> None:
        """Plan with ``cost`` from the next step not yet planned on (e.g. a refitted cost).

        Steps are planned when their first micro-batch is drawn, so a switch made between
        two optimizer steps applies to the next one (with DataLoader workers prefetching,
        to the first step none of whose micro-batches was drawn yet). Call it on every rank
        at the same point with the same cost: the ranks plan independently and must agree.
        ``cost`` takes the forms the constructor accepts.
        """
        old = (self.cost, self._cost_array)
        self._store_cost(cost)
        try:
            planned = self._check_options()
        except ValueError:
            self.cost, self._cost_array = old
            raise
        # Keep the plans of steps already drawn; later ones are planned again.
        self._cache = {s: v for s, v in self._cache.items() if s in self._drawn}
        self._remember(planned)

    # ---- epochs ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` (call before each epoch, on every rank alike)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)

    @property
    def num_steps(self) -> int:
        """Global steps (optimizer steps) per epoch."""
        full, rest = divmod(len(self.lengths), self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self) -> np.ndarray:
        """This epoch's order of dataset indices (before the last partial batch is dropped)."""
        n = len(self.lengths)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng(self.seed + self.epoch).permutation(n).astype(np.int64)

    def step_plans(self) -> list[Any]:
        """The plan of every global step of the current epoch (indices are into that step's
        batch; :meth:`step_indices` maps them to dataset indices). Cached per epoch."""
        return [p for _, p in self._epoch()]

    def step_indices(self) -> list[np.ndarray]:
        """Dataset indices of each global step's batch (all ranks together)."""
        return [idx for idx, _ in self._epoch()]

    def micro_batches_per_step(self) -> list[int]:
        """Micro-batches in each global step of the current epoch (the same on every rank)."""
        return [p.num_micro_batches for _, p in self._epoch()]

    def steps(self) -> Iterator[list[list[int]]]:
        """This rank's micro-batches grouped by global step (each step planned when
        reached, so :meth:`set_cost` applies to the steps after it)."""
        for s in range(self.num_steps):
            idx, p = self._step(s)
            self._drawn.add(s)
            mbs = replica_grid(p)[self.rank]
            yield [idx[np.asarray(mb, dtype=np.int64)].tolist() for mb in mbs]

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps():
            yield from step

    def __len__(self) -> int:
        return sum(self.micro_batches_per_step())

    def __repr__(self) -> str:
        return (
            f"BalancedDistributedSampler(n={len(self.lengths)}, "
            f"global_batch_size={self.global_batch_size}, max_tokens={self.max_tokens}, "
            f"rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )

    # ---- planning ----------------------------------------------------------------------
    def _epoch(self) -> list[tuple[np.ndarray, Any]]:
        return [self._step(s) for s in range(self.num_steps)]

    def _step(self, s: int) -> tuple[np.ndarray, Any]:
        """Step ``s`` of the current epoch: its dataset indices and plan (cached)."""
        self._enter_epoch()
        if s not in self._cache:
            b = self.global_batch_size
            idx = self._order[s * b : (s + 1) * b]
            self._cache[s] = (idx, self._step_plan(idx, last_partial=len(idx) < b))
        return self._cache[s]

    def _enter_epoch(self) -> None:
        """Start the cache afresh when the epoch changed since it was filled."""
        if self._cache_epoch != self.epoch:
            self._cache, self._drawn = {}, set()
            self._order = self.epoch_order()
            self._cache_epoch = self.epoch

    def _step_plan(self, idx: np.ndarray, last_partial: bool) -> Any:
        from seqbalance.planning.planner import plan

        spec = self._spec
        if last_partial and "allow_empty" not in self.plan_options:
            spec = spec.replace(**{"batching.allow_empty": True})
        cost = self._cost_array[idx] if self._cost_array is not None else self.cost
        with exact_searches(self._exact_searches):
            return plan(self.lengths[idx], dataclasses.replace(spec, cost=cost))
