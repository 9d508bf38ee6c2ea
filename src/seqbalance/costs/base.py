"""Cost models: the interface, the token count, and the quadratic polynomial.

Every cost model maps a 1-D array of sequence lengths to per-sequence costs (float64)
and exposes its polynomial form, so a micro-batch of lengths ``L_1..L_n`` costs

    c0 + sum_i (a + b * L_i + c * L_i**2)

with ``c0 = per_microbatch``, ``a = per_sequence``, ``b = per_token`` and
``c = per_token_sq``. Calling a model returns the per-sequence part (no ``c0``);
:meth:`CostModel.microbatch_cost` adds ``c0`` once, also to an empty micro-batch: a rank
with an empty slot still runs a dummy step to take part in the collectives (the same rule
as :mod:`seqbalance.planning.simulation`).

Pipeline schedules run a micro-batch's forward and backward apart, so every model also
carries two backward / forward ratios, ``backward_matmul`` (linear terms, default 2) and
``backward_attention`` (the ``c·L²`` term, default 2.5), which
:mod:`seqbalance.costs.phases` uses to split the training cost.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from .._validate import as_lengths, check_nonnegative_real
from ._ratios import BACKWARD_ATTENTION, BACKWARD_MATMUL, check_ratio
from .report import COEFFICIENTS, FitReport

__all__ = ["CostModel", "QuadraticCost", "TokenCost", "cost_from_dict"]


def finite_costs(costs: np.ndarray, lengths: np.ndarray, model: Any) -> np.ndarray:
    """``costs`` of ``lengths`` under ``model``, or a ValueError naming the first that
    overflows float64 (only ratios of costs matter, so a rescaled model plans alike)."""
    bad = ~np.isfinite(costs)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"the cost of a sequence of {lengths[i]:.0f} tokens overflows float64 under "
            f"{model!r}; rescale the cost model (only ratios of costs matter)"
        )
    return costs


def check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> None:
    """Refuse keys of a cost document outside ``allowed``: a misspelt optional key (say
    ``per_seqence``) would otherwise be dropped, and the cost silently lose a term."""
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ValueError(
            f"{what} has unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
            f"{', '.join(map(repr, allowed))} (check the spelling)"
        )


class CostModel(abc.ABC):
    """Interface of a cost model: per-sequence costs plus the polynomial form."""

    per_microbatch: float
    per_sequence: float
    per_token: float
    per_token_sq: float
    backward_matmul: float = BACKWARD_MATMUL
    """Backward / forward cost of the linear terms (matmuls: input and weight gradients)."""
    backward_attention: float = BACKWARD_ATTENTION
    """Backward / forward cost of the quadratic (attention) term."""

    @abc.abstractmethod
    def __call__(self, lengths: Any) -> np.ndarray:
        """Per-sequence costs (float64, one per length), without the per-micro-batch term."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a ``"kind"`` key; :func:`seqbalance.costs.load_cost` reads it."""

    @property
    def polynomial(self) -> tuple[float, float, float, float]:
        """``(per_microbatch, per_sequence, per_token, per_token_sq)``."""
        return (self.per_microbatch, self.per_sequence, self.per_token, self.per_token_sq)

    def microbatch_cost(self, lengths: Any) -> float:
        """Cost of one micro-batch: ``per_microbatch + sum(self(lengths))``.

        An empty micro-batch costs ``per_microbatch``: the rank still runs a dummy step to
        take part in the collectives (as :mod:`seqbalance.planning.simulation` assumes).

        Examples
        --------
        >>> cost = QuadraticCost(per_token=2.0, per_token_sq=0.0, per_microbatch=5.0)
        >>> cost.microbatch_cost([1, 3])
        13.0
        >>> cost.microbatch_cost([])
        5.0
        """
        arr = as_lengths(lengths)
        return float(self.per_microbatch + self(arr).sum())

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` to ``path`` (read back with ``load_cost(path)``)."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json() + "\n")

    def __repr__(self) -> str:
        terms = ", ".join(f"{k}={getattr(self, k):.6g}" for k in COEFFICIENTS)
        return f"{type(self).__name__}({terms})"


class TokenCost(CostModel):
    """Cost = number of tokens: ``b = 1``, every other coefficient 0.

    Examples
    --------
    >>> TokenCost()([3, 5])
    array([3., 5.])
    """

    per_microbatch = 0.0
    per_sequence = 0.0
    per_token = 1.0
    per_token_sq = 0.0

    def __call__(self, lengths: Any) -> np.ndarray:
        return as_lengths(lengths).astype(np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tokens"}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenCost)

    def __hash__(self) -> int:
        return hash("TokenCost")


_RATIOS = ("backward_matmul", "backward_attention")


def _coefficient(value: Any, name: str) -> float:
    return check_nonnegative_real(
        value, name, why=" (a negative cost coefficient would make some sequences cost less "
        "than nothing)"
    )


class QuadraticCost(CostModel):
    """Cost ``a + b*L + c*L**2`` per sequence plus ``c0`` per micro-batch.

    Parameters
    ----------
    per_token, per_token_sq, per_sequence, per_microbatch
        ``b``, ``c``, ``a`` and ``c0``; finite and >= 0. Units are the caller's (seconds
        for a cost from ``seqbalance calibrate``).
    backward_matmul, backward_attention
        Backward / forward cost ratios of the linear and the quadratic terms, used only to
        split the cost for pipeline schedules (default 2 and 2.5; e.g. 3 and 3.5 with
        full activation recompute).
    meta
        Free-form JSON-ready facts kept with the model (units, source, device...).
    report
        The :class:`FitReport` when the model was fitted (set by ``fit_cost``).

    Examples
    --------
    >>> cost = QuadraticCost(per_token=4.0, per_token_sq=0.5, per_sequence=1.0)
    >>> cost([0, 2, 4])
    array([ 1., 11., 25.])
    """

    def __init__(
        self,
        per_token: float,
        per_token_sq: float,
        per_sequence: float = 0.0,
        per_microbatch: float = 0.0,
        *,
        backward_matmul: float = BACKWARD_MATMUL,
        backward_attention: float = BACKWARD_ATTENTION,
        meta: Mapping[str, Any] | None = None,
        report: FitReport | None = None,
    ) -> None:
        self.backward_matmul = check_ratio(backward_matmul, "backward_matmul")
        self.backward_attention = check_ratio(backward_attention, "backward_attention")
        self.per_token = _coefficient(per_token, "per_token")
        self.per_token_sq = _coefficient(per_token_sq, "per_token_sq")
        self.per_sequence = _coefficient(per_sequence, "per_sequence")
        self.per_microbatch = _coefficient(per_microbatch, "per_microbatch")
        if meta is not None and not isinstance(meta, Mapping):
            raise ValueError(f"meta must be a mapping or None, got {type(meta).__name__}")
        self.meta: dict[str, Any] = dict(meta or {})
        try:  # saved with the cost: fail here, not at to_json() after a long fit
            json.dumps(self.meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"meta must hold JSON values (str, finite number, list, dict): {exc}"
            ) from None
        if report is not None and not isinstance(report, FitReport):
            raise ValueError(f"report must be a FitReport or None, got {type(report).__name__}")
        self.report = report

    def __call__(self, lengths: Any) -> np.ndarray:
        x = as_lengths(lengths).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):  # the check below says it
            out = self.per_sequence + x * (self.per_token + self.per_token_sq * x)
        return finite_costs(out, x, self)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "quadratic"}
        out.update({k: getattr(self, k) for k in COEFFICIENTS})
        for k in _RATIOS:  # written only when set, so older JSON stays byte-identical
            if getattr(self, k) != getattr(CostModel, k):
                out[k] = getattr(self, k)
        if self.meta:
            out["meta"] = self.meta
        if self.report is not None:
            out["fit"] = self.report.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuadraticCost:
        """Inverse of :meth:`to_dict`; missing coefficients other than ``per_token`` are 0."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"a quadratic cost is a dict of coefficients, got {type(data).__name__}"
            )
        if data.get("kind", "quadratic") != "quadratic":
            raise ValueError(f"expected a cost of kind 'quadratic', got {data.get('kind')!r}")
        check_keys(data, ("kind", *COEFFICIENTS, *_RATIOS, "meta", "fit"), "a quadratic cost")
        if "per_token" not in data or "per_token_sq" not in data:
            raise ValueError(
                f"a quadratic cost needs 'per_token' and 'per_token_sq'; got keys {sorted(data)}"
            )
        fit = data.get("fit")  # null or absent: no report; anything else must be one
        return cls(
            data["per_token"],
            data["per_token_sq"],
            data.get("per_sequence", 0.0),
            data.get("per_microbatch", 0.0),
            **{k: data[k] for k in _RATIOS if k in data},
            meta=data.get("meta"),
            report=FitReport.from_dict(fit) if fit is not None else None,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuadraticCost):
            return NotImplemented
        return (
            self.polynomial == other.polynomial
            and self.meta == other.meta
            and all(getattr(self, k) == getattr(other, k) for k in _RATIOS)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable meta: not hashable


#: ``"kind"`` of a cost document -> the function rebuilding it. Each module that defines a
#: cost model adds its own (the package imports them all), so a cost that wraps another
#: (:class:`~seqbalance.costs.UlyssesCost`, ``ContextParallelCost``) rebuilds it from here
#: without importing the loader above it.
def _token_cost(data: Mapping[str, Any]) -> CostModel:
    check_keys(data, ("kind",), "a token cost")
    return TokenCost()


FROM_DICT: dict[str, Callable[[Mapping[str, Any]], CostModel]] = {
    "tokens": _token_cost,
    "quadratic": QuadraticCost.from_dict,
}


def cost_from_dict(data: Mapping[str, Any]) -> CostModel:
    """Rebuild a cost model from its ``to_dict()`` (dispatching on ``"kind"``).

    Examples
    --------
    >>> cost_from_dict({"kind": "quadratic", "per_token": 1.0, "per_token_sq": 0.5})
    QuadraticCost(per_microbatch=0, per_sequence=0, per_token=1, per_token_sq=0.5)
    """
    if not isinstance(data, Mapping):
        raise ValueError(
            "a cost JSON must be an object with a 'kind' ('tokens', 'quadratic', 'flops' or "
            "'ulysses'), "
            f"got {type(data).__name__}"
        )
    kind = data.get("kind")
    if isinstance(kind, str) and kind in FROM_DICT:
        return FROM_DICT[kind](data)
    raise ValueError(
        f"cost kind {kind!r} is unknown; a cost JSON has kind 'tokens', 'quadratic', 'flops' "
        "or 'ulysses'"
    )
