"""AReaL joint mode: ranks and micro-batches planned together, once per PPO mini-batch.

AReaL splits a batch in three places: the training controller deals trajectories to
data-parallel ranks by tokens (``TrainController._partition_inputs`` ->
``_dispatch_tensors``, an equal-count greedy partition), each worker cuts its share into
``ppo_n_minibatches`` mini-batches, and each mini-batch into micro-batches under
``mb_spec.max_tokens_per_mb`` (both through ``split_padded_tensor_dict_into_mb_list`` and
its allocator ``allocate_balanced_mbs_synced``, which sees only lengths). Planned apart,
the rank split never sees the cap and the micro-batch split never sees the other ranks.
This module puts one plan over ranks x micro-batches inside AReaL's own path:

- On the controller, ``_dispatch_tensors`` (called by AReaL's own ``_partition_inputs``,
  which :func:`patch` wraps to hand over the engine's ``mb_spec`` and
  ``ppo_n_minibatches``) makes one :func:`seqbalance.plan` per mini-batch over ``dp``
  ranks under ``max_tokens_per_mb`` (:func:`plan_dispatch`), deals the trajectories as
  planned, and gives each trajectory a copy with one more tensor, ``SLOT_KEY``: shaped
  like its ``attention_mask``, every position holding its row's slot code
  (:func:`slot_code`: mini-batch and micro-batch). AReaL's own concatenation, padding
  (zeros past column 0 are never read), mini-batch split and ``to(device)`` carry it
  with the other per-token tensors.
- On the workers, :func:`split_padded_tensor_dict_into_mb_list` reads the codes. A split
  into ``n_mbs`` groups without a cap (the actor's mini-batch split) groups the rows by
  mini-batch and keeps the codes; a split under a cap (the engine's micro-batches, also
  ``forward`` over a whole share) groups them by slot and drops the codes. Every rank of
  the group follows only when all can (one all-gather of the counts: the same count
  everywhere, the cap and ``n_mbs``/``n_mbs_divisor``/``granularity`` held); otherwise
  every rank runs the drop-in allocator (:mod:`seqbalance.compat.areal`), as without
  joint mode. The tensor work is AReaL's own function, handed the groups through its
  allocator.

Trajectories held as remote tensors (AReaL's ``RTensor``: only their shape is on the
controller) are planned with their width as every row's length, as AReaL's own dispatch
weighs them; the workers check the cap on the real lengths.

Where joint mode does not apply (no ``max_tokens_per_mb``, trajectory pairs kept together
by ``group_size`` or ``granularity``, fewer trajectories than ``dp x ppo_n_minibatches``,
a mini-batch ``seqbalance.plan`` refuses), AReaL's own dispatch runs and carries nothing.

Switch it on with :func:`patch` (or ``seqbalance.compat.areal.patch(joint=True)``, or
``SEQBALANCE_AREAL_MODE=joint`` beside ``SEQBALANCE_PATCH=areal``).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _areal_dropin as _dropin
from ._after_import import PatchOnImport, driver_cost, joint_mode
from ._core import plan
from ._inputs import Patcher, cost_model_of, count_arg, to_numpy

logger = logging.getLogger(__name__)

__all__ = [
    "COST_ENV",
    "MODE_ENV",
    "SLOT_KEY",
    "DispatchPlan",
    "allocate_balanced_mbs_synced",
    "dispatch_tensors",
    "joint_requested",
    "last_plan",
    "patch",
    "plan_dispatch",
    "slot_code",
    "split_padded_tensor_dict_into_mb_list",
    "unpatch",
]

#: The per-token tensor that carries each row's slot code from the controller to the workers.
SLOT_KEY = "seqbalance_slot"
#: ``SEQBALANCE_AREAL_MODE=joint`` selects joint mode when AReaL is patched.
MODE_ENV = "SEQBALANCE_AREAL_MODE"
#: ``SEQBALANCE_AREAL_COST=<model name | config.json | cost JSON>`` overrides the cost the
#: controller plans with (default: the engine's ``config.json`` under ``config.path``).
COST_ENV = "SEQBALANCE_AREAL_COST"
#: Slot codes: ``mini_batch * _STRIDE + slot + 1`` (0 is padding).
_STRIDE = 1 << 20
_WHAT = "seqbalance.compat.joint_areal.split_padded_tensor_dict_into_mb_list"
_CONTROLLER = "areal.infra.controller.train_controller"
_DATA = "areal.utils.data"


def joint_requested() -> bool:
    """Whether the environment asks for joint mode (``SEQBALANCE_AREAL_MODE=joint``)."""
    return joint_mode(MODE_ENV)


def slot_code(mini_batch: int, slot: int) -> int:
    """The code a row carries for micro-batch ``slot`` of mini-batch ``mini_batch``."""
    return int(mini_batch) * _STRIDE + int(slot) + 1


@dataclass(frozen=True)
class DispatchPlan:
    """One dispatch planned mini-batch by mini-batch.

    Attributes
    ----------
    group_indices : list of list of int
        Trajectory indices per rank, in the order the rank receives them (AReaL's
        ``group_indices``).
    codes : list of np.ndarray
        Per trajectory, the slot code (:func:`slot_code`) of each of its rows.
    micro_batches : list of list of list of list of int
        ``[mini_batch][rank][slot]``: row indices (trajectories' rows numbered in order).
    counts : list of int
        Micro-batches per rank in each mini-batch.
    step_fsdp, step_ddp, lower_bound : float
        Simulated step, summed over mini-batches, and the sum of the planner's bounds.
    """

    group_indices: list[list[int]]
    codes: list[np.ndarray]
    micro_batches: list[list[list[list[int]]]]
    counts: list[int]
    step_fsdp: float
    step_ddp: float
    lower_bound: float


def _row_costs(model: Any, lens: np.ndarray) -> np.ndarray:
    if model is None:
        return lens.astype(np.float64)
    if isinstance(model, np.ndarray):
        return model
    return np.asarray(model(lens), dtype=np.float64)  # a cost model: per-sequence costs


def _mini_compositions(item_cost: np.ndarray, dp: int, n_mini: int) -> list[list[np.ndarray]]:
    """Which trajectories form each mini-batch: ``dp * c_i`` of them in mini-batch ``i``
    (``c`` the per-rank share split as evenly as possible). Two candidates: consecutive
    runs of the batch, and runs of the trajectories sorted heaviest first. Under FSDP a
    mini-batch lasts as long as its busiest rank, so the heaviest trajectories together in
    one mini-batch (each on its own rank) cost less than one of them in every mini-batch."""
    n = item_cost.shape[0]
    per = [len(a) for a in np.array_split(np.arange(n // dp), n_mini)]
    bounds = np.cumsum([0, *[dp * c for c in per]])
    bounds[-1] = n
    out = [[np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]]
    if n_mini > 1:
        order = np.argsort(-item_cost, kind="stable")
        out.append([np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
    return out


def plan_dispatch(
    rows_per_item: Any,
    dp_size: int,
    max_tokens: int,
    n_minibatches: int = 1,
    *,
    cost: Any = None,
    min_micro_batches: int = 1,
    micro_batch_multiple: int = 1,
    size: str = "free",
) -> DispatchPlan:
    """Plan a dispatch of trajectories over ``dp_size`` ranks x micro-batches, one
    :func:`seqbalance.plan` per mini-batch.

    Every rank takes the same number of trajectories of every mini-batch (AReaL's
    dispatch gives equal counts); a trajectory's rows stay on one rank (they may take
    different micro-batches). Two compositions of the mini-batches are planned
    (consecutive trajectories, and the trajectories sorted heaviest first) and the one with the
    shorter simulated FSDP step is kept (ties: the consecutive one).

    Parameters
    ----------
    rows_per_item : sequence of array-like of int
        Per trajectory, the token count of each of its rows.
    dp_size : int
        Data-parallel ranks.
    max_tokens : int
        Token cap of one micro-batch (``mb_spec.max_tokens_per_mb``).
    n_minibatches : int
        Mini-batches per step (``ppo_n_minibatches``).
    cost : optional
        What :func:`seqbalance.plan` balances (a cost model, a name, a path, or per-row
        costs in the rows' order); None balances tokens.
    min_micro_batches, micro_batch_multiple : int
        ``mb_spec.n_mbs`` and ``mb_spec.n_mbs_divisor``.

    Raises
    ------
    ValueError
        If the trajectories do not split into an equal share per rank with at least one
        per mini-batch, or :func:`seqbalance.plan` refuses a mini-batch.
    """
    items = [np.asarray(to_numpy(r), dtype=np.int64).reshape(-1) for r in rows_per_item]
    n_items = len(items)
    dp = count_arg(dp_size, "dp_size", ValueError)
    cap = count_arg(max_tokens, "max_tokens", ValueError)
    k = count_arg(n_minibatches, "n_minibatches", ValueError)
    if size not in ("free", "equal", "balanced"):
        raise ValueError(f"size={size!r}: use 'free', 'equal' or 'balanced'")
    if n_items // dp < k or (size == "equal" and n_items % dp):
        raise ValueError(
            f"{n_items} trajectories do not give each of dp_size={dp} ranks at least "
            f"n_minibatches={k}" + (" in equal shares" if size == "equal" else "")
            + f"; pass at least {dp * k}" + (f", a multiple of {dp}" if size == "equal" else "")
        )
    if any(r.shape[0] == 0 or (r < 0).any() for r in items):
        raise ValueError("rows_per_item: every trajectory needs one or more rows of >= 0 tokens")
    lens = np.concatenate(items)
    owner = np.repeat(np.arange(n_items), [r.shape[0] for r in items])
    first = np.concatenate([[0], np.cumsum([r.shape[0] for r in items])])
    model = cost_model_of(cost, lens.shape[0])
    row_cost = _row_costs(model, lens)
    item_cost = np.asarray([row_cost[first[i] : first[i + 1]].sum() for i in range(n_items)])
    grouped = any(r.shape[0] > 1 for r in items)
    best: DispatchPlan | None = None
    for minis in _mini_compositions(item_cost, dp, k):
        got = _plan_minis(lens, owner, first, minis, dp, cap, model, grouped,
                          int(min_micro_batches or 1), int(micro_batch_multiple or 1),
                          size)  # fmt: skip
        if best is None or got.step_fsdp < best.step_fsdp:
            best = got
    assert best is not None
    return best


def _plan_minis(
    lens: np.ndarray, owner: np.ndarray, first: np.ndarray, minis: list[np.ndarray], dp: int,
    cap: int, model: Any, grouped: bool, min_mbs: int, multiple: int, size: str,
) -> DispatchPlan:  # fmt: skip
    n_items = first.shape[0] - 1
    codes = [np.zeros(first[i + 1] - first[i], dtype=np.int64) for i in range(n_items)]
    ranks: list[list[int]] = [[] for _ in range(dp)]
    mbs: list[list[list[list[int]]]] = []
    counts: list[int] = []
    step_f = step_d = bound = 0.0
    for mi, its in enumerate(minis):
        rows = np.concatenate([np.arange(first[i], first[i + 1]) for i in its])
        p = plan(
            lens[rows], dp, cap, size=size,
            cost=model[rows] if isinstance(model, np.ndarray) else model,
            groups=owner[rows].tolist() if grouped else None,
            min_micro_batches=min_mbs, micro_batch_multiple=multiple,
        )  # fmt: skip
        parts = [[[int(rows[j]) for j in q] for q in rank] for rank in p.micro_batches]
        mbs.append(parts)
        counts.append(p.num_micro_batches)
        for r, rank in enumerate(parts):
            seen: dict[int, None] = {}  # the rank's trajectories, by their first slot
            for s, q in enumerate(rank):
                for row in q:
                    it = int(owner[row])
                    codes[it][row - first[it]] = slot_code(mi, s)
                    seen.setdefault(it)
            ranks[r].extend(seen)
        fsdp = p.simulate(sync="fsdp")
        step_f += fsdp.step_time
        step_d += p.simulate(sync="ddp").step_time
        bound += fsdp.lower_bound
    return DispatchPlan(ranks, codes, mbs, counts, step_f, step_d, bound)


# ---- controller side ------------------------------------------------------------------

#: AReaL's own functions, kept by :func:`patch`.
_ORIGINAL: dict[str, Any] = {}
_local = threading.local()


@dataclass(frozen=True)
class ControllerSettings:
    """What the controller plans with, read from its engine config at each dispatch.

    Attributes
    ----------
    max_tokens : int
        ``mb_spec.max_tokens_per_mb``.
    n_minibatches : int
        ``ppo_n_minibatches`` (1 for configs without it).
    min_micro_batches, micro_batch_multiple : int
        ``mb_spec.n_mbs`` and ``mb_spec.n_mbs_divisor``; with pipeline stages (``pp``),
        at least ``2 x pp`` and a multiple of ``pp``, as AReaL's Megatron engine asks.
    cost : object
        A cost model, or None for tokens.
    """

    max_tokens: int
    n_minibatches: int
    min_micro_batches: int
    micro_batch_multiple: int
    cost: Any


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def controller_settings(controller: Any) -> ControllerSettings | str:
    """The controller's settings for joint mode, or why it does not apply (a str)."""
    config = getattr(controller, "config", None)
    spec = _get(config, "mb_spec")
    cap = _get(spec, "max_tokens_per_mb")
    if not cap:
        return "mb_spec.max_tokens_per_mb is not set (micro-batches have no token cap)"
    if int(_get(spec, "granularity", 1) or 1) != 1:
        return "mb_spec.granularity > 1 (rows are paired)"
    min_mbs = int(_get(spec, "n_mbs", 1) or 1)
    multiple = int(_get(spec, "n_mbs_divisor", 1) or 1)
    strategy = getattr(controller, "parallel_strategy", None)
    pp = int(getattr(strategy, "pipeline_parallel_size", 1) or 1)
    if pp > 1:  # the Megatron engine's split: at least 2 x pp micro-batches, a multiple of pp
        min_mbs, multiple = max(min_mbs, 2 * pp), pp
    return ControllerSettings(
        int(cap), int(_get(config, "ppo_n_minibatches", 1) or 1), min_mbs, multiple,
        _controller_cost(controller, config),
    )  # fmt: skip


def _controller_cost(controller: Any, config: Any) -> Any:
    """``$SEQBALANCE_AREAL_COST``, else the model's ``config.json`` (``config.path``),
    else None (tokens)."""
    return driver_cost(controller, COST_ENV, _get(config, "path"))


def _rows_of(item: Any) -> np.ndarray | None:
    """Token counts of a trajectory's rows: the row sums of a local 2-D
    ``attention_mask``; for a remote one (AReaL's ``RTensor``, whose ``data`` holds only
    the shape of a trajectory stored with its padding trimmed) its width for every row,
    what AReaL's own dispatch weighs it by: never below a row's length, so the cap
    planned with holds for the real rows."""
    mask = item.get("attention_mask") if isinstance(item, dict) else None
    if mask is not None and not hasattr(mask, "detach"):
        shape = getattr(getattr(mask, "data", None), "shape", None)
        if shape is not None and len(shape) == 2:
            return np.full(int(shape[0]), int(shape[1]), dtype=np.int64)
        return None
    if mask is None or getattr(mask, "ndim", 0) != 2:
        return None
    return np.asarray(mask.detach().sum(-1).cpu().numpy(), dtype=np.int64)


def dispatch_tensors(
    item_list: list[dict[str, Any]], dp_size: int, group_size: int = 1
) -> tuple[list[list[dict[str, Any]]], list[list[int]]]:
    """Joint-mode ``_dispatch_tensors``: as AReaL's (same arguments and return value), but
    planned by :func:`plan_dispatch` with the settings of the controller whose
    ``_partition_inputs`` is running; each trajectory is passed on as a new dict with
    ``SLOT_KEY`` added (the caller's dicts are not changed). AReaL's own function runs
    where joint mode does not apply (see the module docstring)."""
    settings = getattr(_local, "settings", None)
    original = _ORIGINAL.get("_dispatch_tensors")
    why, rows = _why_not(item_list, settings, group_size)
    plan_ = None
    if why is None:
        assert isinstance(settings, ControllerSettings)
        try:
            plan_ = _cached_plan(rows, int(dp_size), settings)
        except ValueError as exc:
            why = str(exc)
    if plan_ is None:
        if original is None:
            raise ValueError(f"joint mode does not apply ({why}) and AReaL is not patched")
        logger.info("seqbalance joint mode: AReaL's own dispatch runs (%s)", why)
        if isinstance(item_list, list) and any(
            isinstance(d, dict) and SLOT_KEY in d for d in item_list
        ):  # codes of an earlier dispatch (returned by the workers) would be stale
            item_list = [_without_codes(d) if isinstance(d, dict) else d for d in item_list]
        theirs: tuple[list[list[dict[str, Any]]], list[list[int]]] = original(
            item_list, dp_size, group_size=group_size
        )
        _log_metrics(None)
        return theirs
    _local.last_plan = plan_
    _log_metrics(plan_)
    import torch

    splits = []
    for part in plan_.group_indices:
        out = []
        for i in part:
            d = item_list[i]
            mask = d["attention_mask"]
            local = hasattr(mask, "detach")  # an RTensor: its shape, codes on the CPU
            shape = tuple(mask.shape if local else mask.data.shape)
            code = torch.as_tensor(plan_.codes[i], dtype=torch.int64,
                                   device=mask.device if local else "cpu")  # fmt: skip
            out.append({**d, SLOT_KEY: code[:, None].expand(shape).contiguous()})
        splits.append(out)
    return splits, [list(p) for p in plan_.group_indices]


#: The last plan made, by its inputs: a step dispatches the same trajectories several
#: times (log-probabilities, advantages, the update), and the plan is a function of them.
_CACHE: dict[str, DispatchPlan] = {}
_CACHE_LOCK = threading.Lock()


def _cached_plan(rows: list[Any], dp: int, settings: ControllerSettings) -> DispatchPlan:
    sizes = np.asarray([len(r) for r in rows], dtype="<i8")
    digest = hashlib.blake2b(digest_size=16)
    for part in (sizes, np.concatenate(rows).astype("<i8")):
        digest.update(np.ascontiguousarray(part).tobytes())
    cost = settings.cost
    described = "tokens" if cost is None else repr(getattr(cost, "to_dict", lambda: cost)())
    key = repr((digest.hexdigest(), dp, settings.max_tokens, settings.n_minibatches,
                settings.min_micro_batches, settings.micro_batch_multiple, described))  # fmt: skip
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    got = plan_dispatch(
        rows, dp, settings.max_tokens, settings.n_minibatches, cost=cost,
        min_micro_batches=settings.min_micro_batches,
        micro_batch_multiple=settings.micro_batch_multiple,
    )  # fmt: skip
    with _CACHE_LOCK:
        _CACHE.clear()
        _CACHE[key] = got
    return got


def _log_metrics(plan_: DispatchPlan | None) -> None:
    """Scalars into AReaL's ``stats_tracker`` where AReaL has loaded it (the controller's
    ``export_stats`` reports them): ``seqbalance/joint`` (1, or 0 where AReaL's dispatch
    ran), ``seqbalance/predicted_step`` and ``seqbalance/predicted_step_ddp`` (simulated
    step in cost units, summed over mini-batches), ``seqbalance/gap_to_bound`` (step / the
    planner's lower bound - 1) and ``seqbalance/micro_batches`` (the most per rank)."""
    tracker = sys.modules.get("areal.utils.stats_tracker")
    scalar = getattr(tracker, "scalar", None)
    if scalar is None:
        return
    values: dict[str, float] = {"seqbalance/joint": 0.0 if plan_ is None else 1.0}
    if plan_ is not None:
        gap = plan_.step_fsdp / plan_.lower_bound - 1 if plan_.lower_bound else 0.0
        values.update({
            "seqbalance/predicted_step": plan_.step_fsdp,
            "seqbalance/predicted_step_ddp": plan_.step_ddp,
            "seqbalance/gap_to_bound": gap,
            "seqbalance/micro_batches": float(max(plan_.counts)),
        })  # fmt: skip
    try:
        scalar(**values)
    except Exception:  # metrics never stop a training step
        logger.debug("seqbalance: AReaL's stats_tracker refused the joint-mode metrics")


def _why_not(items: Any, settings: Any, group_size: int) -> tuple[str | None, list[Any]]:
    """Why joint mode does not apply (None if it does), and the trajectories' rows."""
    if settings is None:
        return "not called from a patched TrainController._partition_inputs", []
    if isinstance(settings, str):
        return settings, []
    if int(group_size) != 1:
        return f"group_size={group_size} (trajectory pairs)", []
    if not isinstance(items, list) or not items:
        return "the batch is not a list of trajectories", []
    rows = [_rows_of(d) for d in items]
    if any(r is None for r in rows):
        return "a trajectory has no 2-D attention_mask", []
    return None, rows


def _joint_partition_inputs(self: Any, group_size: int, /, *args: Any, **kwargs: Any) -> Any:
    """``TrainController._partition_inputs`` with the controller's settings handed to the
    joint ``_dispatch_tensors`` that AReaL's own method calls."""
    saved = getattr(_local, "settings", None)
    try:
        _local.settings = controller_settings(self)
    except Exception as exc:  # a config joint mode cannot read: AReaL's dispatch
        _local.settings = f"config: {type(exc).__name__}: {exc}"
    try:
        return _ORIGINAL["_partition_inputs"](self, group_size, *args, **kwargs)
    finally:
        _local.settings = saved


def last_plan() -> DispatchPlan | None:
    """The last plan the joint dispatch made in this thread (for logging), or None."""
    return getattr(_local, "last_plan", None)


# ---- worker side ----------------------------------------------------------------------


def _codes_of(data: Any) -> np.ndarray | None:
    value = data.get(SLOT_KEY) if isinstance(data, dict) else None
    if value is None or not hasattr(value, "detach") or value.ndim < 2:
        return None
    return np.asarray(value.detach()[:, 0].cpu().numpy(), dtype=np.int64)


def _groups_to_follow(data: Any, mb_spec: Any) -> tuple[str, list[list[int]]] | None:
    """``("mini", groups)`` or ``("micro", groups)`` (row indices, in run order) where this
    rank can follow the carried codes under ``mb_spec``; None otherwise. Never raises."""
    try:
        codes = _codes_of(data)
        if codes is None or (codes < 1).any():
            return None
        mask = data["attention_mask"]
        if int(mask.shape[0]) != codes.shape[0]:
            return None
        cap = getattr(mb_spec, "max_tokens_per_mb", None)
        n_mbs = int(getattr(mb_spec, "n_mbs", 1) or 1)
        g = int(getattr(mb_spec, "granularity", 1) or 1)
        if g != 1:
            return None
        if cap is None:
            keys = (codes - 1) // _STRIDE
            kind = "mini"
        else:
            keys = codes
            kind = "micro"
        order = np.argsort(keys, kind="stable")
        _, starts = np.unique(keys[order], return_index=True)
        groups = [g_.tolist() for g_ in np.split(order, starts[1:])]
        m = len(groups)
        if kind == "mini":
            return (kind, groups) if m == n_mbs else None
        divisor = int(getattr(mb_spec, "n_mbs_divisor", 1) or 1)
        if m < n_mbs or (divisor > 1 and m % divisor):
            return None
        lens = np.asarray(mask.sum(1).long().cpu().numpy(), dtype=np.int64)
        limit = int(cap) if cap is not None else 0
        if any(int(lens[q].sum()) > limit for q in groups):
            return None
        return kind, groups
    except Exception:  # any container: a malformed code only means the drop-in runs
        return None


def _without_codes(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != SLOT_KEY}


def split_padded_tensor_dict_into_mb_list(
    data: dict[str, Any], mb_spec: Any, group: Any = None
) -> Any:
    """AReaL's ``split_padded_tensor_dict_into_mb_list`` that follows the carried slots.

    Rows carrying ``SLOT_KEY`` codes are grouped as the controller planned: by mini-batch
    for a split without a token cap into ``mb_spec.n_mbs`` groups (the codes stay, for
    the micro-batch split that follows), by micro-batch for a split under
    ``max_tokens_per_mb`` (the codes are dropped). Every rank of ``group`` (None: the
    world, as AReaL) follows only when all can, decided by one all-gather; otherwise AReaL's
    function runs with the drop-in allocator. Arguments and return value as AReaL's.
    """
    original = _ORIGINAL["split_padded_tensor_dict_into_mb_list"]
    mine = _groups_to_follow(data, mb_spec)
    follow = mine is not None
    if _dist_ready():
        from ..torch.agreement import agree  # imports torch: only when communicating

        payload = None if mine is None else (mine[0], len(mine[1]))
        got = agree(None, {}, payload, group, _WHAT)
        follow = all(p is not None for p in got) and len(set(got)) == 1
    cap = getattr(mb_spec, "max_tokens_per_mb", None)
    inner = data if (follow and mine is not None and mine[0] == "mini") else (
        _without_codes(data) if cap is not None else data)  # fmt: skip
    if not follow:
        return original(inner, mb_spec, group)
    assert mine is not None
    _local.forced = mine[1]
    try:
        return original(inner, mb_spec, group)
    finally:
        _local.forced = None


def _dist_ready() -> bool:
    mod = sys.modules.get("torch.distributed")
    if mod is None:
        return False
    try:
        return bool(mod.is_available() and mod.is_initialized())
    except Exception:
        return False


def allocate_balanced_mbs_synced(mb_spec: Any, lens: Any, group: Any = None) -> list[list[int]]:
    """The groups :func:`split_padded_tensor_dict_into_mb_list` decided to follow (handed
    to AReaL's function through its allocator, without communicating: the ranks already
    agreed); otherwise :func:`seqbalance.compat.areal.allocate_balanced_mbs_synced`."""
    forced = getattr(_local, "forced", None)
    if forced is not None:
        _local.forced = None
        return [list(q) for q in forced]
    return _DROPIN_SYNCED(mb_spec, lens, group)


#: The drop-in's allocator, held here: patching swaps module attributes by identity.
_DROPIN_SYNCED = _dropin.allocate_balanced_mbs_synced


# ---- patching -------------------------------------------------------------------------


def _data_replacements() -> dict[str, Any]:
    current = getattr(sys.modules.get(_DATA), "split_padded_tensor_dict_into_mb_list", None)
    if current is not None and current is not split_padded_tensor_dict_into_mb_list:
        _ORIGINAL["split_padded_tensor_dict_into_mb_list"] = current
    return {
        "allocate_balanced_mbs_synced": allocate_balanced_mbs_synced,
        "split_padded_tensor_dict_into_mb_list": split_padded_tensor_dict_into_mb_list,
    }


class _ControllerPatcher(Patcher):
    """``_dispatch_tensors`` (a module function, as :class:`Patcher`) and the
    ``TrainController._partition_inputs`` method of AReaL's controller module."""

    def patch(self) -> list[str]:
        if self._saved:
            return super().patch()
        mod = importlib.import_module(self.module)
        current = getattr(mod, "_dispatch_tensors", None)
        if current is not None and current is not dispatch_tensors:
            _ORIGINAL["_dispatch_tensors"] = current
        done = super().patch()
        cls = getattr(sys.modules[self.module], "TrainController", None)
        if cls is not None and "_partition_inputs" in vars(cls):
            _ORIGINAL["_partition_inputs"] = vars(cls)["_partition_inputs"]
            self._saved.append((cls, "_partition_inputs", vars(cls)["_partition_inputs"]))
            cls._partition_inputs = _joint_partition_inputs
            done.append(f"{self.module}.TrainController._partition_inputs")
        return sorted(done)


_data_patcher = Patcher(_DATA, _data_replacements, keep_own=True)
# The method's dotted name is for ``--check``; module attributes are looked up by name, so
# the function replacement skips it and ``_ControllerPatcher.patch`` swaps it.
_controller_patcher = _ControllerPatcher(
    _CONTROLLER,
    lambda: {
        "_dispatch_tensors": dispatch_tensors,
        "TrainController._partition_inputs": _joint_partition_inputs,
    },
)


_HOOK = PatchOnImport(_CONTROLLER, _controller_patcher)


def patch(*, controller: bool = True) -> list[str]:
    """Switch AReaL to joint mode: the worker side in ``areal.utils.data`` (and in modules
    that imported its functions by name) and, with ``controller``, the training
    controller's dispatch: at once where ``areal.infra.controller.train_controller`` is
    loaded, else when it is imported. Returns the dotted names replaced (the
    controller's with `` (on import)`` while it waits). :func:`unpatch` undoes it."""
    done = _data_patcher.patch()
    if controller:
        done += _HOOK.patch("_dispatch_tensors")
    return sorted(set(done))


def unpatch() -> None:
    """Undo :func:`patch`."""
    _HOOK.unpatch()
    _data_patcher.unpatch()
