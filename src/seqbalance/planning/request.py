"""A planning request as values: the mesh, the capacity, the micro-batch rules, the rank rules.

:func:`seqbalance.plan` takes ``plan(lengths, mesh, capacity, *, cost=None, batching=None,
rules=None, effort="default")``. Each group of options is a small frozen value, checked once
when it is made (a bad value raises :class:`~seqbalance._validate.ArgumentError`, a
``ValueError`` naming the keyword of :func:`seqbalance.plan` it stands for), so the planner
below trusts it:

- :class:`Mesh`: data-parallel ranks, how they synchronise, context parallelism and the
  pipeline (``cp_enabled``, ``pp_enabled``: nothing else asks the degrees).
- :class:`Capacity`: the token capacity of one micro-batch, padding, and what a sequence
  above it does.
- :class:`MicroBatching`: how many micro-batches, in what order, how many sequences each.
- :class:`RankRules`: the rule on what a rank holds (counts, groups).
- :class:`PlanSpec`: all of them with the cost and the effort; the rules on how options of
  different groups combine live in its ``__post_init__``, and nowhere else.

Every value has ``to_dict`` / ``from_dict`` (plain keys, the field names), and
:meth:`PlanSpec.from_keywords` builds one from :func:`seqbalance.plan`'s flat keywords
(``dp_size=``, ``max_tokens=``, ``sync=``, ...), which every caller of the flat form goes
through.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

import numpy as np

from .._notes import Note, arg
from .._validate import (
    ArgumentError,
    as_weights,
    check_bool,
    check_choice,
    check_max_tokens,
    check_nonnegative_int,
    check_positive_int,
    group_ids,
)
from ..partitioning._rules import SIZES
from ._effort import EFFORTS
from ._ordering import ORDERS, OVERSIZED
from .cp_plans import CP_MODES, check_cp_size
from .pipeline import check_pipeline
from .simulation import SYNC_MODELS

__all__ = [
    "EFFORTS",
    "FLAT_KEYWORDS",
    "Capacity",
    "Mesh",
    "MicroBatching",
    "PlanSpec",
    "RankRules",
]


_V = TypeVar("_V")


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # frozen: the normalised value, once


def _from_dict(cls: type[_V], data: Mapping[str, Any], argument: str) -> _V:
    if not isinstance(data, Mapping):
        raise ArgumentError(
            f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}",
            argument=argument,
        )
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ArgumentError(
            f"{cls.__name__} has no field {unknown[0]!r}; its fields are "
            f"{', '.join(names)}",
            argument=argument,
        )
    missing = [
        f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in data
        and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ArgumentError(
            f"{cls.__name__}.from_dict needs the field {missing[0]!r} (its fields are "
            f"{', '.join(names)})",
            argument=argument,
        )
    return cls(**data)


@dataclass(frozen=True)
class Mesh:
    """The GPUs a step runs on: data-parallel ranks, context parallelism, pipeline stages.

    Checked once when made (torchtitan's ``ParallelDims`` style); the planner then asks
    :attr:`cp_enabled` and :attr:`pp_enabled` only.

    Parameters
    ----------
    dp : int
        Data-parallel ranks (replicas when ``cp > 1`` or ``pp > 1``); ``dp_size`` in the
        flat form.
    sync : {"fsdp", "ddp"}
        How the ranks synchronise: ``"fsdp"`` in lockstep per micro-batch (sharded
        parameters), ``"ddp"`` once per step (replicated). The plan minimises that model's
        simulated step.
    cp : int
        GPUs per replica for context parallelism, a power of two (``cp_size``); 1: none.
    cp_mode : {"static", "dynamic"}
        ``"static"``: every sequence over its replica's ``cp`` GPUs; ``"dynamic"``: a
        power-of-two degree per sequence (``cp`` in the flat form).
    cp_cost : optional
        How context-parallel communication is priced: None (free), a dict of
        :class:`~seqbalance.costs.context_parallel.ContextParallelCost` keyword arguments,
        or an instance. Checked against the cost when planning (at ``cp=1`` too).
    pp : int
        Pipeline stages per replica (``pp_size``); 1: none.
    schedule : {"1f1b", "interleaved", "gpipe"}
        The pipeline schedule; checked at ``pp=1`` too (one stage runs alike under every
        schedule, so a config may pass its own whatever its pipeline size).
    virtual_stages : int
        Model chunks per stage: at least 2 for ``"interleaved"``, else 1.
    pp_comm : float
        Time (cost units) to send one token's activations between two stages; needs
        ``pp > 1`` when not 0.

    Raises
    ------
    ArgumentError
        A bad value, or a combination no mesh has (a pipeline under dynamic CP).
    """

    dp: int
    sync: str = "fsdp"
    cp: int = 1
    cp_mode: str = "static"
    cp_cost: Any = None
    pp: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    pp_comm: float = 0.0

    def __hash__(self) -> int:
        # cp_cost may be a dict (unhashable); equal meshes still hash equal without it.
        return hash((self.dp, self.sync, self.cp, self.cp_mode, self.pp, self.schedule,
                     self.virtual_stages, self.pp_comm))  # fmt: skip

    def __post_init__(self) -> None:
        _set(self, "dp", check_positive_int(self.dp, "dp_size"))
        _set(self, "sync", check_choice(self.sync, "sync", SYNC_MODELS))
        _set(self, "cp", check_cp_size(self.cp, "cp_size"))
        _set(self, "cp_mode", check_choice(self.cp_mode, "cp", CP_MODES))
        spec = check_pipeline(self.pp, self.schedule, self.virtual_stages)
        _set(self, "pp", spec.pp_size)
        _set(self, "virtual_stages", spec.virtual_stages)
        comm = float(as_weights([self.pp_comm], "pp_comm")[0])
        if spec.pp_size == 1 and comm:
            raise ArgumentError(Note(
                "argument", {"value": self.pp_comm},
                "{@pp_comm:{value!r}} needs {@pp_size} > 1 (no stage boundaries)",
            ), argument="pp_comm")  # fmt: skip
        if self.pp_enabled and self.cp_enabled and self.cp_mode == "dynamic":
            raise ArgumentError(Note(
                "argument", {"value": self.pp},
                "{@pp_size:{value}} needs cp='static' with {@cp_size} > 1: a pipeline stage's "
                "GPUs must run the same slots, and dynamic CP gives them different ones; pass "
                "cp='static', or {@pp_size:1}",
            ), argument="pp_size")  # fmt: skip

    @property
    def cp_enabled(self) -> bool:
        """Context parallelism is on (``cp > 1``)."""
        return self.cp > 1

    @property
    def pp_enabled(self) -> bool:
        """Pipeline parallelism is on (``pp > 1``)."""
        return self.pp > 1

    @property
    def world_size(self) -> int:
        """GPUs in the mesh: ``dp x cp x pp``."""
        return self.dp * self.cp * self.pp

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``cp_cost`` as given)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mesh:
        """The :class:`Mesh` of a :meth:`to_dict` dict."""
        return _from_dict(cls, data, "mesh")


@dataclass(frozen=True)
class Capacity:
    """What one micro-batch may hold.

    Parameters
    ----------
    max_tokens : int
        Tokens per micro-batch (per GPU under context parallelism): the sum of its
        lengths, or with ``padded`` its sequence count x its longest sequence.
    padded : bool
        Micro-batches are padded to their longest sequence (not with ``cp > 1``).
    oversized : {"error", "alone"}
        A sequence above ``max_tokens``: refused (ValueError naming it), or run alone in a
        micro-batch of its own (which then breaks the capacity, and the plan says so).

    Raises
    ------
    ArgumentError
        A bad value.
    """

    max_tokens: int
    padded: bool = False
    oversized: str = "error"

    def __post_init__(self) -> None:
        _set(self, "max_tokens", check_max_tokens(self.max_tokens, "max_tokens"))
        _set(self, "padded", check_bool(self.padded, "padded"))
        _set(self, "oversized", check_choice(self.oversized, "oversized", OVERSIZED))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capacity:
        """The :class:`Capacity` of a :meth:`to_dict` dict."""
        return _from_dict(cls, data, "capacity")


@dataclass(frozen=True)
class MicroBatching:
    """How many micro-batches each rank runs, in what order, with how many sequences.

    Parameters
    ----------
    min_count : int
        Fewest micro-batches per rank (``min_micro_batches``).
    multiple : int
        The count is a multiple of this (``micro_batch_multiple``).
    extra : int
        Also try this many larger counts (in steps of ``multiple``) and keep the fastest
        (``extra_micro_batches``).
    per_micro_batch : int, optional
        At most this many sequences per micro-batch, counts within one
        (``sequences_per_micro_batch``); not with ``extra``.
    allow_empty : bool
        Allow (marked) empty micro-batches when there are too few sequences.
    order : {None, "heaviest_first", "light_ends", "index"}
        The order each rank runs its micro-batches in; None keeps the planner's own.

    Raises
    ------
    ArgumentError
        A bad value, or ``per_micro_batch`` with ``extra``.
    """

    min_count: int = 1
    multiple: int = 1
    extra: int = 0
    per_micro_batch: int | None = None
    allow_empty: bool = False
    order: str | None = None

    def __post_init__(self) -> None:
        _set(self, "min_count", check_positive_int(self.min_count, "min_micro_batches"))
        _set(self, "multiple", check_positive_int(self.multiple, "micro_batch_multiple"))
        _set(self, "extra", check_nonnegative_int(self.extra, "extra_micro_batches"))
        _set(self, "allow_empty", check_bool(self.allow_empty, "allow_empty"))
        if self.order is not None:
            _set(self, "order", check_choice(self.order, "order", ORDERS))
        if self.per_micro_batch is not None:
            _set(
                self,
                "per_micro_batch",
                check_positive_int(self.per_micro_batch, "sequences_per_micro_batch"),
            )
            if self.extra:
                # Its fixed-count path plans the fewest count only, so the option would be lost.
                raise ArgumentError(
                    "sequences_per_micro_batch cannot be combined with extra_micro_batches; "
                    "pass min_micro_batches= to plan more micro-batches",
                    argument="sequences_per_micro_batch",
                )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MicroBatching:
        """The :class:`MicroBatching` of a :meth:`to_dict` dict."""
        return _from_dict(cls, data, "batching")


@dataclass(frozen=True, eq=False)
class RankRules:
    """What a rank (a replica under CP or PP) may hold.

    Parameters
    ----------
    size : {"free", "equal", "balanced"}
        Rule on the number of sequences (or groups) per rank, as in
        :func:`seqbalance.partition`.
    groups : array-like, optional
        A group id per sequence (numbers or strings); a group never spans ranks. Kept as
        a read-only array; its length is checked against the lengths when planning.

    Raises
    ------
    ArgumentError
        A bad value.
    """

    size: str = "free"
    groups: Any = field(default=None)

    def __post_init__(self) -> None:
        _set(self, "size", check_choice(self.size, "size", SIZES))
        if self.groups is not None:
            ids = np.array(group_ids(self.groups, "groups"))  # a copy the caller cannot change
            ids.flags.writeable = False
            _set(self, "groups", ids)

    @property
    def ruled(self) -> bool:
        """A size rule or groups apply (else ranks are free)."""
        return self.size != "free" or self.groups is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankRules):
            return NotImplemented
        if self.size != other.size or (self.groups is None) != (other.groups is None):
            return False
        return self.groups is None or (
            self.groups.dtype.kind == other.groups.dtype.kind
            and np.array_equal(self.groups, other.groups)
        )

    def __hash__(self) -> int:
        # As __eq__ compares: the dtype's kind and the values (int32 and int64 ids of the
        # same values are equal, so their hashes must be too).
        if self.groups is None:
            return hash((self.size, None))
        return hash((self.size, self.groups.dtype.kind, tuple(self.groups.tolist())))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``groups`` as a list)."""
        return {"size": self.size, "groups": None if self.groups is None else self.groups.tolist()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankRules:
        """The :class:`RankRules` of a :meth:`to_dict` dict."""
        return _from_dict(cls, data, "rules")


#: :func:`seqbalance.plan`'s flat keywords -> (part, field): the one table of the flat form.
FLAT_KEYWORDS: dict[str, tuple[str, str]] = {
    "dp_size": ("mesh", "dp"),
    "sync": ("mesh", "sync"),
    "cp_size": ("mesh", "cp"),
    "cp": ("mesh", "cp_mode"),
    "cp_cost": ("mesh", "cp_cost"),
    "pp_size": ("mesh", "pp"),
    "schedule": ("mesh", "schedule"),
    "virtual_stages": ("mesh", "virtual_stages"),
    "pp_comm": ("mesh", "pp_comm"),
    "max_tokens": ("capacity", "max_tokens"),
    "padded": ("capacity", "padded"),
    "oversized": ("capacity", "oversized"),
    "min_micro_batches": ("batching", "min_count"),
    "micro_batch_multiple": ("batching", "multiple"),
    "extra_micro_batches": ("batching", "extra"),
    "sequences_per_micro_batch": ("batching", "per_micro_batch"),
    "allow_empty": ("batching", "allow_empty"),
    "order": ("batching", "order"),
    "size": ("rules", "size"),
    "groups": ("rules", "groups"),
    "baselines": ("spec", "baselines"),
}

_PARTS = {"mesh": Mesh, "capacity": Capacity, "batching": MicroBatching, "rules": RankRules}
_REPLICA_DEFAULTS = {  # static CP's rules on replicas; dynamic CP refuses other values
    "size": "free",
    "groups": None,
    "order": None,
    "oversized": "error",
    "extra_micro_batches": 0,
    "sequences_per_micro_batch": None,
}


@dataclass(frozen=True)
class PlanSpec:
    """Everything :func:`seqbalance.plan` needs besides the lengths, checked once.

    The rules on how options of different parts combine are checked here, and only here.

    Parameters
    ----------
    mesh : Mesh
        The ranks, their sync model, context parallelism and the pipeline.
    capacity : Capacity
        What one micro-batch may hold.
    cost : optional
        What to balance: None (tokens), a cost model, anything
        :func:`seqbalance.costs.load_cost` accepts, or per-sequence numbers (not with
        ``cp > 1``).
    batching : MicroBatching
        Micro-batch counts, order and sizes.
    rules : RankRules
        What a rank may hold.
    effort : {"fast", "default", "thorough"}
        The planner's work budget (counted in work, never in time, so that every rank
        plans alike).
    baselines : bool
        Also run the framework pipelines of :data:`seqbalance.BASELINES` as candidates
        (the plan is then never worse than any of them). The flat form's ``baselines=``.

    Raises
    ------
    ArgumentError
        A part of the wrong type, or options that do not combine: ``per_micro_batch``
        with a size rule or groups; ``order`` or ``per_micro_batch`` with a pipeline;
        ``padded`` with context parallelism; rules on replicas under dynamic CP.
    """

    mesh: Mesh
    capacity: Capacity
    cost: Any = None
    batching: MicroBatching = field(default_factory=MicroBatching)
    rules: RankRules = field(default_factory=RankRules)
    effort: str = "default"
    baselines: bool = True

    def __post_init__(self) -> None:
        for name, cls in _PARTS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise ArgumentError(
                    f"{name} must be a {cls.__name__}, got {type(value).__name__}",
                    argument=name,
                )
        _set(self, "effort", check_choice(self.effort, "effort", EFFORTS))
        _set(self, "baselines", check_bool(self.baselines, "baselines"))
        mesh, batching, rules = self.mesh, self.batching, self.rules
        if mesh.cp_enabled and mesh.cp_mode == "dynamic":
            given = {k: v for k, v in self._replica_rules().items() if (
                v is not None if _REPLICA_DEFAULTS[k] is None else v != _REPLICA_DEFAULTS[k]
            )}  # fmt: skip
            if given:
                k = next(iter(given))
                value = "an array" if k == "groups" else repr(given[k])
                raise ArgumentError(Note(
                    "argument", {"value": value, "default": _REPLICA_DEFAULTS[k]},
                    arg(k)[:-1] + ":{value}} needs cp='static' with {@cp_size} > 1: dynamic "
                    "CP shares one pool of GPUs between replicas, so rules on replicas and "
                    "their micro-batches do not apply; pass cp='static', or leave " + arg(k)
                    + " at {default!r}",
                ), argument=k)  # fmt: skip
        if mesh.pp_enabled and (batching.order is not None or batching.per_micro_batch):
            what = "slots" if mesh.cp_enabled else "micro-batches"
            raise ArgumentError(
                "order= and sequences_per_micro_batch= cannot be combined with pp_size > 1: "
                f"the pipeline planner chooses the {what} and their run order; drop one of "
                "them",
                argument="order" if batching.order is not None else "sequences_per_micro_batch",
            )
        if batching.per_micro_batch is not None and rules.ruled:
            raise ArgumentError(
                "sequences_per_micro_batch cannot be combined with a size rule or groups; "
                "drop one of them",
                argument="sequences_per_micro_batch",
            )
        if mesh.cp_enabled and self.capacity.padded:
            raise ArgumentError(Note(
                "argument", {},
                "{@padded=True} is not supported with {@cp_size} > 1 (a CP piece is priced by "
                "its own tokens, never padded); leave it at False",
            ), argument="padded")  # fmt: skip

    def _replica_rules(self) -> dict[str, Any]:
        b, r = self.batching, self.rules
        return {
            "size": r.size,
            "groups": r.groups,
            "order": b.order,
            "oversized": self.capacity.oversized,
            "extra_micro_batches": b.extra,
            "sequences_per_micro_batch": b.per_micro_batch,
        }

    def replace(self, **changes: Any) -> PlanSpec:
        """A copy with some parts (or fields of parts, as ``"batching.extra"``) changed.

        ``spec.replace(**{"batching.extra": 0})`` is ``spec`` with no extra counts; every
        part is checked again, and so are the rules across parts.
        """
        parts: dict[str, Any] = {}
        fields_of: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            part, _, name = key.partition(".")
            if name:
                fields_of.setdefault(part, {})[name] = value
            else:
                parts[part] = value
        for part, values in fields_of.items():
            parts[part] = dataclasses.replace(parts.get(part, getattr(self, part)), **values)
        return dataclasses.replace(self, **parts)

    def keywords(self) -> dict[str, Any]:
        """The flat keywords of :func:`seqbalance.plan` this spec stands for (every one,
        ``dp_size`` and ``max_tokens`` included): what the planner's passes read."""
        out: dict[str, Any] = {}
        for key, (part, name) in FLAT_KEYWORDS.items():
            out[key] = getattr(self if part == "spec" else getattr(self, part), name)
        out["cost"] = self.cost
        return out

    @classmethod
    def from_keywords(
        cls,
        mesh: Any = None,
        capacity: Any = None,
        *,
        cost: Any = None,
        batching: Any = None,
        rules: Any = None,
        effort: str = "default",
        flat: Mapping[str, Any] | None = None,
        caller: str = "plan",
    ) -> PlanSpec:
        """The spec of a call of :func:`seqbalance.plan` in either form.

        ``mesh`` is a :class:`Mesh` or the number of data-parallel ranks (or a whole
        :class:`PlanSpec`, returned as it is, with nothing else given), ``capacity`` a
        :class:`Capacity` or ``max_tokens``; ``flat`` holds the flat form's keywords
        (:data:`FLAT_KEYWORDS`). A flat keyword fills a field of a part given as a number
        or left out; next to that part given as a value it is refused (one place says
        each option).

        Raises
        ------
        TypeError
            An unknown keyword, or neither ``mesh`` nor ``dp_size`` (as Python does for a
            missing or unexpected argument).
        ArgumentError
            A flat keyword next to the part it belongs to, or a bad value.
        """
        flat = dict(flat or {})
        if isinstance(mesh, PlanSpec):
            extra = [name for name, value in (("capacity", capacity), ("cost", cost),
                     ("batching", batching), ("rules", rules)) if value is not None]
            extra += [*(["effort"] if effort != "default" else []), *flat]
            if extra:
                raise ArgumentError(
                    f"{extra[0]}= was passed next to a PlanSpec, which holds the whole "
                    "request; change the spec (dataclasses.replace) or pass its parts",
                    argument=extra[0],
                )  # fmt: skip
            return mesh
        unknown = sorted(set(flat) - set(FLAT_KEYWORDS))
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        given: dict[str, Any] = {"mesh": mesh, "capacity": capacity, "batching": batching,
                                 "rules": rules}  # fmt: skip
        lead = {"mesh": ("dp_size", "dp"), "capacity": ("max_tokens", "max_tokens")}
        fields_of: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
        baselines = True
        for part, (key, _) in lead.items():
            value = given[part]
            if value is not None and not isinstance(value, _PARTS[part]):
                if key in flat:
                    raise TypeError(f"{caller}() got multiple values for argument {key!r}")
                flat[key] = value
                given[part] = None
        for key, value in flat.items():
            part, name = FLAT_KEYWORDS[key]
            if part == "spec":
                baselines = value
                continue
            if given[part] is not None:
                cls_name = _PARTS[part].__name__
                raise ArgumentError(
                    f"{key}= was passed next to a {cls_name} ({part}=); pass it inside: "
                    f"{cls_name}(..., {name}={value!r})",
                    argument=key,
                )
            fields_of[part][name] = value
        for part, (key, _) in lead.items():
            if given[part] is None and key not in flat:
                raise TypeError(
                    f"{caller}() missing a required argument: {part!r} (a {_PARTS[part].__name__}) "
                    f"or {key!r}"
                )
        parts = {
            part: given[part] if given[part] is not None else _PARTS[part](**fields_of[part])
            for part in _PARTS
        }
        return cls(cost=cost, effort=effort, baselines=baselines, **parts)

    def to_dict(self) -> dict[str, Any]:
        """Every part's :meth:`to_dict`, with ``cost`` as given, ``effort`` and
        ``baselines``."""
        out: dict[str, Any] = {part: getattr(self, part).to_dict() for part in _PARTS}
        out.update(cost=self.cost, effort=self.effort, baselines=self.baselines)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanSpec:
        """The :class:`PlanSpec` of a :meth:`to_dict` dict (parts as dicts or values)."""
        data = dict(data)
        for part, part_cls in _PARTS.items():
            if isinstance(data.get(part), Mapping):
                data[part] = part_cls.from_dict(data[part])  # type: ignore[attr-defined]
        return _from_dict(cls, data, "spec")
