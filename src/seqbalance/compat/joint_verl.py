"""verl joint mode: ranks and micro-batches planned together, once per PPO mini-batch.

verl splits a batch in two places: the driver (``RayPPOTrainer._balance_batch``) deals rows
to data-parallel ranks by an equal-count partition of a fixed workload, and each worker then
cuts its rows into micro-batches by tokens (``rearrange_micro_batches`` /
``prepare_dynamic_batch``). Planned apart, neither step sees the other's constraint, and the
simulated step is longer than one plan over ranks x micro-batches. This module puts that
plan inside verl's own path:

- :func:`balance_batch` replaces the driver's ``_balance_batch``. For every PPO mini-batch
  (``ppo_mini_batch_size x rollout.n`` rows, the unit of one optimizer step; which rows, see
  :func:`plan_mini_batches`) it makes one :func:`seqbalance.plan` over ``dp`` ranks under
  the actor's token cap
  (``ppo_max_token_len_per_gpu x ulysses_sequence_parallel_size``) with an equal row count
  per rank (verl's dispatch cuts the batch into equal contiguous chunks), reorders the batch
  so that each rank's chunk holds its planned rows micro-batch by micro-batch, and records
  the micro-batch boundaries in ``batch.meta_info[SLOTS_KEY]``.
- :func:`rearrange_micro_batches` / :func:`prepare_dynamic_batch` replace the worker side.
  A rank finds its boundaries by the lengths of the rows it holds (a key of the length
  sequence, so it needs nothing but the rows and the meta info, which verl's dispatch,
  ``select``, ``split`` and its padding removal all keep) and follows them when every rank
  of the DP group can (same count everywhere, cap held); otherwise every rank plans
  locally with :func:`seqbalance.compat.verl.rearrange_micro_batches`, as without joint
  mode. Rows whose lengths match no recorded mini-batch (shuffled mini-batches, the
  whole-batch log-prob passes, another role's batch) simply take that local path.

Switch it on with :func:`patch` (or ``seqbalance.compat.verl.patch(joint=True)``, or the
environment variable ``SEQBALANCE_VERL_MODE=joint`` beside ``SEQBALANCE_PATCH=verl``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _verl_dropin as _dropin
from ._after_import import PatchOnImport, driver_cost, joint_mode
from ._core import plan
from ._inputs import Patcher, cost_model_of, count_arg, token_counts
from ._verl_kk import verl_free_kk_labels

__all__ = [
    "COST_ENV",
    "MODE_ENV",
    "SLOTS_KEY",
    "JointPlan",
    "balance_batch",
    "joint_requested",
    "patch",
    "plan_mini_batches",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "slots_key",
    "unpatch",
]

#: The meta-info key that carries the planned micro-batch boundaries to the workers.
SLOTS_KEY = "seqbalance_slots"
#: ``SEQBALANCE_VERL_MODE=joint`` selects joint mode when verl is patched.
MODE_ENV = "SEQBALANCE_VERL_MODE"
#: ``SEQBALANCE_VERL_COST=<model name | config.json | cost JSON>`` overrides the cost the
#: driver plans with (default: the actor model's ``config.json``).
COST_ENV = "SEQBALANCE_VERL_COST"

_WHAT = "seqbalance.compat.joint_verl.rearrange_micro_batches"


def joint_requested() -> bool:
    """Whether the environment asks for joint mode (``SEQBALANCE_VERL_MODE=joint``)."""
    return joint_mode(MODE_ENV)


def slots_key(lengths: Any) -> str:
    """The key a rank looks its micro-batch boundaries up by: a hash of its rows' token
    counts, in order (int64 little-endian bytes, BLAKE2b-128)."""
    x = np.ascontiguousarray(np.asarray(lengths, dtype="<i8"))
    return hashlib.blake2b(x.tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class JointPlan:
    """One batch planned mini-batch by mini-batch.

    Attributes
    ----------
    order : np.ndarray
        The new row order: rank ``r``'s contiguous chunk of ``n / dp`` rows holds, mini-batch
        after mini-batch, its planned rows micro-batch by micro-batch.
    slots : dict of str to list of int
        Micro-batch sizes (rows) of each rank's share of each mini-batch, keyed by
        :func:`slots_key` of that share's lengths in the new order.
    partitions : list of list of int
        Rank ``r``'s original row indices, in the new order (verl's metrics take these).
    micro_batches : list of list of list of list of int
        ``[mini_batch][rank][slot]``: original row indices.
    step_fsdp, step_ddp, lower_bound : float
        Simulated step, summed over mini-batches, and the sum of the planner's bounds.
    counts : list of int
        Micro-batches per rank in each mini-batch.
    """

    order: np.ndarray
    slots: dict[str, list[int]]
    partitions: list[list[int]]
    micro_batches: list[list[list[list[int]]]]
    step_fsdp: float
    step_ddp: float
    lower_bound: float
    counts: list[int] = field(default_factory=list)


def plan_mini_batches(
    lengths: Any,
    dp_size: int,
    max_tokens: int,
    mini_batch_rows: int,
    *,
    cost: Any = None,
    groups: Any = None,
    order: str = "light_ends",
    keep_mini_batches: bool = False,
) -> JointPlan:
    """Plan every mini-batch of a batch over ``dp_size`` ranks x micro-batches.

    Which rows form a mini-batch: verl's own driver split (without ``keep_minibatch``)
    already chooses that, by dealing the whole batch to ranks by workload and cutting each
    rank's rows, sorted by workload, into the mini-batches. Unless ``keep_mini_batches``,
    both that composition (with the drop-in's rank split) and the batch's own consecutive
    mini-batches are planned, and the one with the shorter simulated FSDP step is kept
    (ties: the consecutive ones). With ``keep_mini_batches`` (or one mini-batch) only the
    consecutive ones are planned.

    Parameters
    ----------
    lengths : array-like of int
        Tokens per row, in the batch's order.
    dp_size : int
        Data-parallel ranks (verl's dispatch cuts the batch into that many equal chunks).
    max_tokens : int
        Token cap of one micro-batch.
    mini_batch_rows : int
        Rows per mini-batch; a divisor of the row count and a multiple of ``dp_size``.
    cost : optional
        What :func:`seqbalance.plan` balances (a cost model, a name, a path, or per-row
        costs); None balances tokens.
    groups : array-like, optional
        Group id per row: a group stays on one rank (and in one mini-batch; groups keep the
        consecutive mini-batches).
    order : str
        The micro-batch order on every rank (``"light_ends"`` as verl's
        ``use_dynamic_bsz_balance``).
    keep_mini_batches : bool
        Plan the batch's consecutive mini-batches only.

    Returns
    -------
    JointPlan

    Raises
    ------
    ValueError
        If the rows do not split into whole mini-batches with an equal share per rank, or
        :func:`seqbalance.plan` refuses a mini-batch (a row above ``max_tokens``, ...).
    """
    lens = token_counts(lengths, "lengths")
    n = int(lens.shape[0])
    dp = count_arg(dp_size, "dp_size", ValueError)
    cap = count_arg(max_tokens, "max_tokens", ValueError)
    mb = count_arg(mini_batch_rows, "mini_batch_rows", ValueError)
    if n % mb or mb % dp:
        raise ValueError(
            f"mini_batch_rows={mb} must divide the {n} rows and be a multiple of "
            f"dp_size={dp} (each rank takes an equal share of every mini-batch)"
        )
    model = cost_model_of(cost, n)
    gids = None if groups is None else np.asarray(groups, dtype=object)
    candidates = [[np.arange(s, s + mb) for s in range(0, n, mb)]]
    if not keep_mini_batches and gids is None and n > mb:
        candidates.append(_verl_composition(lens, dp, n // mb))
    best = None
    for minis in candidates:
        got = _plan_each(lens, minis, dp, cap, model, gids, order)
        if best is None or got.step_fsdp < best.step_fsdp:
            best = got
    assert best is not None
    return best


def _verl_composition(lens: np.ndarray, dp: int, n_mini: int) -> list[np.ndarray]:
    """verl's driver composition: an equal-count split of the workloads over ranks, each
    rank's rows sorted by workload and laid out lightest at both ends, cut into
    ``n_mini`` equal chunks; mini-batch ``i`` is every rank's chunk ``i``."""
    work = _dropin.calculate_workload(lens)
    parts = _dropin.get_seqlen_balanced_partitions(work, dp, equal_size=True)
    chunks = []
    for part in parts:
        part = sorted(part, key=lambda i: (int(work[i]), i))
        laid = part[::2] + part[1::2][::-1]
        chunks.append(np.array_split(np.asarray(laid, dtype=np.int64), n_mini))
    return [np.sort(np.concatenate([c[i] for c in chunks])) for i in range(n_mini)]


def _plan_each(
    lens: np.ndarray, minis: list[np.ndarray], dp: int, cap: int, model: Any, gids: Any,
    order: str,
) -> JointPlan:  # fmt: skip
    slots: dict[str, list[int]] = {}
    mbs: list[list[list[list[int]]]] = []
    step_f = step_d = bound = 0.0
    counts = []
    for rows in minis:
        p = plan(
            lens[rows], dp, cap, size="equal", order=order,
            cost=model[rows] if isinstance(model, np.ndarray) else model,
            groups=None if gids is None else gids[rows].tolist(),
        )  # fmt: skip
        parts = [[[int(rows[i]) for i in q] for q in rank] for rank in p.micro_batches]
        shares = {sum(len(q) for q in rank) for rank in parts}
        if shares != {len(rows) // dp}:  # groups of unequal sizes: equal counts of groups
            raise ValueError(
                f"groups: the ranks' shares of a mini-batch hold {sorted(shares)} rows, but "
                f"verl's dispatch gives every rank {len(rows) // dp}; groups must be of one "
                "size for joint mode (or leave the prefix grouper off)"
            )
        mbs.append(parts)
        counts.append(p.num_micro_batches)
        for rank in parts:
            slots[slots_key(lens[[i for q in rank for i in q]])] = [len(q) for q in rank]
        fsdp = p.simulate(sync="fsdp")
        step_f += fsdp.step_time
        step_d += p.simulate(sync="ddp").step_time
        bound += fsdp.lower_bound
    dp_n = len(mbs[0]) if mbs else 0
    partitions = [[i for parts in mbs for q in parts[r] for i in q] for r in range(dp_n)]
    order_arr = np.asarray([i for part in partitions for i in part], dtype=np.int64)
    return JointPlan(order_arr, slots, partitions, mbs, step_f, step_d, bound, counts)


# ---- driver side ----------------------------------------------------------------------

#: verl's own ``_balance_batch``, kept by :func:`patch` for the cases joint mode leaves to it.
_ORIGINAL: dict[str, Any] = {}


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    """``cfg.name`` for OmegaConf nodes, dataclass configs and dicts alike."""
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


@dataclass(frozen=True)
class DriverSettings:
    """What the driver plans with, read once per step from the trainer.

    Attributes
    ----------
    dp_size : int
        The actor's data-parallel ranks, as verl's dispatch sees them.
    max_tokens : int
        ``ppo_max_token_len_per_gpu x ulysses_sequence_parallel_size``.
    mini_batch_rows : int
        ``ppo_mini_batch_size x rollout.n``.
    use_groups : bool
        Rows sharing a ``uid`` stay on one rank (verl's prefix grouper).
    """

    dp_size: int
    max_tokens: int
    mini_batch_rows: int
    use_groups: bool


def driver_settings(trainer: Any) -> DriverSettings | str:
    """The trainer's settings for joint mode, or why it does not apply (a str)."""
    ref = _get(trainer.config, "actor_rollout_ref")
    actor, rollout = _get(ref, "actor"), _get(ref, "rollout")
    if not _get(actor, "use_dynamic_bsz", False):
        return "actor.use_dynamic_bsz is off (micro-batches are fixed row counts)"
    sp = int(_get(actor, "ulysses_sequence_parallel_size", 1) or 1)
    cap = int(_get(actor, "ppo_max_token_len_per_gpu")) * sp
    rows = int(_get(actor, "ppo_mini_batch_size")) * int(_get(rollout, "n", 1) or 1)
    dp = int(trainer._get_dp_size(trainer.actor_rollout_wg, "actor"))
    return DriverSettings(dp, cap, rows, bool(getattr(trainer, "use_prefix_grouper", False)))


def _trainer_cost(trainer: Any) -> Any:
    """The cost to plan with: ``$SEQBALANCE_VERL_COST``, else the actor model's
    ``config.json``, else verl's own workload ``24576 L + L**2`` (None here)."""
    model = _get(_get(trainer.config, "actor_rollout_ref"), "model")
    return driver_cost(trainer, COST_ENV, _get(model, "path"))


def _verl_breaks(lens: np.ndarray, jp: JointPlan, cap: int) -> int:
    """Rank shares whose split by verl's own rule breaks the cap: the count
    ``ceil(tokens / cap)`` (the most over the ranks) and verl's count-free differencing of
    ``24576 L + L**2`` (verl main keeps such a split; 0.9.1 retries with more)."""
    broken = 0
    for parts in jp.micro_batches:
        shares = [np.asarray([i for q in rank for i in q]) for rank in parts]
        m = max(min(len(s), -(-int(lens[s].sum()) // cap)) for s in shares)
        for s in shares:
            work = _dropin.calculate_workload(lens[s]).astype(np.float64)
            if verl_free_kk_labels(work, max(m, 1), lens[s].astype(np.float64), float(cap)) is None:
                broken += 1
    return broken


def balance_batch(
    trainer: Any,
    batch: Any,
    metrics: dict[str, Any],
    logging_prefix: str = "global_seqlen",
    keep_minibatch: bool = False,
) -> None:
    """Joint-mode ``RayPPOTrainer._balance_batch``: reorder ``batch`` in place by one plan
    per PPO mini-batch and attach the micro-batch boundaries (``meta_info[SLOTS_KEY]``).

    Where joint mode does not apply (no dynamic batch size, a batch that does not split
    into mini-batches with an equal share per rank) verl's own method runs, and
    ``metrics["seqbalance/joint"]`` is 0. Mini-batches are always planned separately;
    ``keep_minibatch=True`` keeps the batch's consecutive mini-batches, False (verl's
    default) also tries verl's own composition (:func:`plan_mini_batches`).

    Metrics: verl's ``{logging_prefix}/*`` balance figures for the rank split, and
    ``seqbalance/joint`` (1), ``seqbalance/predicted_step`` (simulated FSDP step, cost
    units, summed over mini-batches), ``seqbalance/predicted_step_ddp``,
    ``seqbalance/gap_to_bound`` (step / the planner's lower bound - 1),
    ``seqbalance/micro_batches`` (the most per rank in a mini-batch),
    ``seqbalance/cap_violations_avoided`` (rank shares that verl's own split at its
    starting count would put over the cap) and ``seqbalance/over_cap`` (0).
    """
    import torch

    settings = driver_settings(trainer)
    lens = np.asarray(
        batch.batch["attention_mask"].reshape(len(batch), -1).sum(-1).cpu().numpy(), np.int64
    )
    if isinstance(settings, str) or lens.shape[0] % settings.mini_batch_rows or (
        settings.mini_batch_rows % settings.dp_size
    ):
        original = _ORIGINAL.get("_balance_batch")
        if original is None:
            why = settings if isinstance(settings, str) else (
                f"{lens.shape[0]} rows do not split into mini-batches of "
                f"{settings.mini_batch_rows} rows with an equal share per rank")
            raise ValueError(f"joint mode does not apply ({why}) and verl is not patched")
        original(trainer, batch, metrics, logging_prefix=logging_prefix,
                 keep_minibatch=keep_minibatch)  # fmt: skip
        metrics["seqbalance/joint"] = 0
        return
    groups = None
    if settings.use_groups and "uid" in batch.non_tensor_batch:
        groups = list(batch.non_tensor_batch["uid"])
    jp = plan_mini_batches(
        lens, settings.dp_size, settings.max_tokens, settings.mini_batch_rows,
        cost=_trainer_cost(trainer), groups=groups, keep_mini_batches=bool(keep_minibatch),
    )  # fmt: skip
    batch.reorder(torch.as_tensor(jp.order))
    batch.meta_info[SLOTS_KEY] = jp.slots
    metrics.update(_dropin.log_seqlen_unbalance(lens, jp.partitions, logging_prefix))
    metrics.update({
        "seqbalance/joint": 1,
        "seqbalance/predicted_step": jp.step_fsdp,
        "seqbalance/predicted_step_ddp": jp.step_ddp,
        "seqbalance/gap_to_bound": jp.step_fsdp / jp.lower_bound - 1 if jp.lower_bound else 0.0,
        "seqbalance/micro_batches": max(jp.counts),
        "seqbalance/cap_violations_avoided": _verl_breaks(lens, jp, settings.max_tokens),
        "seqbalance/over_cap": 0,
    })  # fmt: skip


# ---- worker side ----------------------------------------------------------------------


def _table_of(container: Any) -> dict[str, list[int]] | None:
    """The boundaries table carried in a TensorDict (non-tensor entry) or a dict."""
    try:
        if SLOTS_KEY not in container.keys():
            return None
        value = container[SLOTS_KEY]
    except Exception:  # any container type: no table is the answer
        return None
    value = getattr(value, "data", value)  # tensordict's NonTensorData
    return value if isinstance(value, dict) else None


def _followed(
    batch: Any, table: Any, cap: int, step: Any, min_num: Any, g: int
) -> list[list[int]] | None:
    """This rank's planned micro-batches (row index lists), or None where there are none
    or they do not fit this call's rules; never raises (the ranks decide together)."""
    if not table:
        return None
    try:
        lens, width = _dropin._effective_lengths(batch)
        sizes = table.get(slots_key(lens))
        if not sizes or width > cap or sum(sizes) != lens.shape[0] or min(sizes) < 1:
            return None
        m = len(sizes)
        if m % int(step or 1) or (min_num is not None and m < int(min_num)):
            return None
        bounds = np.cumsum([0, *sizes])
        if g > 1 and any(int(b) % g for b in bounds):
            return None
        idx = [list(range(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]
        if any(int(lens[q].sum()) > cap for q in idx):
            return None
        return idx
    except Exception:  # any type: a malformed table only means planning locally
        return None


def _micro_batches(
    batch: Any, table: Any, max_token_len: int, dp_group: Any, num_batches_divided_by: Any,
    same_micro_num_in_dp: bool, min_num_micro_batch: Any, use_dynamic_bsz_balance: bool,
    force_group_size: int, match_framework_count: bool | str,
) -> tuple[list[Any], list[list[int]]]:  # fmt: skip
    # patch(match_framework_count=...) reaches verl's callers, who cannot pass it
    match_framework_count = (
        match_framework_count or _dropin._patch_options["match_framework_count"]
    )
    idx = _followed(batch, table, max_token_len, num_batches_divided_by, min_num_micro_batch,
                    int(force_group_size))  # fmt: skip
    group = dp_group if dp_group is not None and _dropin._dist_ready() else None
    follow = idx is not None
    if group is not None:
        from ..torch.agreement import agree  # imports torch: only when communicating

        counts = agree(None, {}, None if idx is None else len(idx), group, _WHAT)
        follow = all(c is not None for c in counts) and len(set(counts)) == 1
    if follow:
        assert idx is not None
        return [_dropin._select(batch, p) for p in idx], idx
    return _dropin.rearrange_micro_batches(
        batch, max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp,
        min_num_micro_batch, use_dynamic_bsz_balance, force_group_size,
        match_framework_count=match_framework_count,
    )  # fmt: skip


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    match_framework_count: bool | str = False,
) -> tuple[list[Any], list[list[int]]]:
    """verl's ``rearrange_micro_batches`` that follows the driver's plan where it can.

    The boundaries come from the batch's ``SLOTS_KEY`` entry (verl turns the meta info
    into non-tensor entries of the TensorDict). They are followed when this rank's rows
    match a planned share and the boundaries hold ``max_token_len``, the forced groups,
    ``num_batches_divided_by`` and ``min_num_micro_batch`` on every rank of ``dp_group``
    (one all-gather of the count decides, so the count is the same everywhere); otherwise
    every rank runs :func:`seqbalance.compat.verl.rearrange_micro_batches`. Arguments and
    return value as there.
    """
    return _micro_batches(
        batch, _table_of(batch), max_token_len, dp_group, num_batches_divided_by,
        same_micro_num_in_dp, min_num_micro_batch, use_dynamic_bsz_balance, force_group_size,
        match_framework_count,
    )  # fmt: skip


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    *,
    match_framework_count: bool | str = False,
) -> tuple[list[Any], list[list[int]]]:
    """:func:`rearrange_micro_batches` on a DataProto (boundaries from ``data.meta_info``);
    returns DataProtos of the same type, without the boundaries table."""
    table = data.meta_info.get(SLOTS_KEY) if isinstance(data.meta_info, dict) else None
    mbs, idx = _micro_batches(
        data.batch, table, max_token_len, dp_group, num_batches_divided_by,
        same_micro_num_in_dp, min_num_micro_batch, use_dynamic_bsz_balance, 1,
        match_framework_count,
    )  # fmt: skip
    meta = {k: v for k, v in data.meta_info.items() if k != SLOTS_KEY}
    out = []
    for mb, rows in zip(mbs, idx):
        non_tensors = {k: v[rows] for k, v in data.non_tensor_batch.items()}
        out.append(type(data).from_dict(dict(mb), non_tensors, meta_info=copy.deepcopy(meta)))
    return out, idx


# ---- patching -------------------------------------------------------------------------

_SEQLEN = "verl.utils.seqlen_balancing"
_TRAINER = "verl.trainer.ppo.ray_trainer"


def _worker_replacements() -> dict[str, Any]:
    out = {
        "rearrange_micro_batches": rearrange_micro_batches,
        "prepare_dynamic_batch": prepare_dynamic_batch,
    }
    # A verl whose callers pass no DP group and rely on a count agreed over the default
    # group gets the drop-in's wrapper here too: ranks must decide follow-or-plan together.
    if _dropin._syncs_without_group(_dropin._installed_verl_version()):
        out = {name: _dropin._world_without_group(fn) for name, fn in out.items()}
    return out


def _joint_method(
    self: Any,
    batch: Any,
    metrics: dict[str, Any],
    logging_prefix: str = "global_seqlen",
    keep_minibatch: bool = False,
) -> None:
    balance_batch(self, batch, metrics, logging_prefix, keep_minibatch)


class _TrainerPatcher(Patcher):
    """``RayPPOTrainer._balance_batch`` of verl's trainer module (a method, so not a
    module attribute: the dotted name in the replacements is for ``--check``)."""

    def patch(self) -> list[str]:
        name = f"{self.module}.RayPPOTrainer._balance_batch"
        if self._saved:
            return [name]
        cls = getattr(importlib.import_module(self.module), "RayPPOTrainer", None)
        if cls is None or "_balance_batch" not in vars(cls):
            raise ValueError(
                f"{self.module} has no RayPPOTrainer._balance_batch; is this the verl "
                "version joint mode was written for?"
            )
        _ORIGINAL["_balance_batch"] = vars(cls)["_balance_batch"]
        self._saved.append((cls, "_balance_batch", vars(cls)["_balance_batch"]))
        cls._balance_batch = _joint_method
        return [name]

    def unpatch(self) -> None:
        super().unpatch()
        _ORIGINAL.pop("_balance_batch", None)


#: What joint mode replaces, one :class:`Patcher` per verl module; the start-up switch
#: (``SEQBALANCE_PATCH=verl`` with ``SEQBALANCE_VERL_MODE=joint``) applies these after
#: the drop-in's, each when its module loads. Modules that imported the worker functions
#: by name (verl 0.9.1's ``verl.workers.engine.utils``) are patched with the module they
#: came from, or bind the replacement when they load after it.
_worker_patcher = Patcher(_SEQLEN, _worker_replacements, keep_own=True)
_trainer_patcher = _TrainerPatcher(
    _TRAINER, lambda: {"RayPPOTrainer._balance_batch": _joint_method}
)


_HOOK = PatchOnImport(_TRAINER, _trainer_patcher)


def patch(*, trainer: bool = True) -> list[str]:
    """Switch verl to joint mode: the worker functions in ``verl.utils.seqlen_balancing``
    (and in modules that imported them by name) and, with ``trainer``, the driver's
    ``RayPPOTrainer._balance_batch``: at once where ``verl.trainer.ppo.ray_trainer`` is
    loaded, else when it is imported. Returns the dotted names replaced (the trainer's
    with `` (on import)`` while it waits). :func:`unpatch` undoes it."""
    done = _worker_patcher.patch()
    if trainer:
        done += _HOOK.patch("RayPPOTrainer._balance_batch")
    return sorted(set(done))


def unpatch() -> None:
    """Undo :func:`patch` (also what the start-up switch applied in joint mode)."""
    _HOOK.unpatch()
    _worker_patcher.unpatch()
