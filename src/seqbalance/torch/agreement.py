"""One collective that turns local errors and argument mismatches into the same error everywhere.

Why this exists: a collective call in which one rank raises before communicating leaves the
other ranks blocked until the process group times out (30 minutes by default); ranks that
silently use different options compute different plans and route rows to ranks whose plan
does not hold them. Every communicating function of :mod:`seqbalance.torch` (and the compat
adapters built on it) therefore starts with :func:`agree`:

1. each rank validates its own inputs *without communicating*, catching any exception;
2. one ``all_gather_object`` carries, per rank, that local error (or None), a fingerprint of
   the arguments that must agree across ranks (and of seqbalance's version: another release
   may plan alike inputs differently), and the payload the function needs
   (lengths, costs, shapes...);
3. every rank receives the same list, so every rank takes the same decision: if any rank
   failed or the fingerprints differ, every rank raises the same :class:`RankAgreementError`
   (a ValueError) naming the ranks and the argument; otherwise the payloads come back.

So a failure never leaves a rank waiting in a second collective: "no hang from bad input".
What :func:`agree` cannot catch is a rank that never calls it at all, or ranks that pass
different process groups.

Integrations (the compat adapters, user code) use it as the first collective of any function
that communicates, in place of an all-reduce of counts: put the counts in the payload and
take the max from the gathered list. The short form::

    from seqbalance.torch.agreement import agree_on

    def check():                    # local only; may raise anything
        lens = validate(batch)
        return {"max_tokens": max_tokens, "cost": describe_cost(cost)}, len(lens)

    counts = agree_on(check, group, "my_function")   # same list on every rank, or raises
    m = max(counts)

or the long form, when the local error and the payload come from separate places::

    try:
        payload, error = check_my_inputs(...), None
    except Exception as exc:
        payload, error = None, exc
    payloads = agree(error, {"max_tokens": max_tokens}, payload, group, "my_function")

After it, every rank holds the same inputs, so any later error raised from them (a plan
that does not fit, say) is raised alike on every rank, before the next collective.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = [
    "RankAgreementError",
    "agree",
    "agree_on",
    "canonical",
    "describe_cost",
    "describe_error",
]

#: A fingerprint value longer than this (as canonical JSON) travels as a SHA-256 digest.
_INLINE_LIMIT = 200


class RankAgreementError(ValueError):
    """Raised on every rank when a rank's inputs failed or the ranks' arguments differ."""


def canonical(value: Any) -> str:
    """A deterministic short text for ``value``, equal on two processes iff the values are.

    Plain values (None, bools, numbers, strings, lists, tuples, dicts with string keys)
    become canonical JSON (sorted keys, no spaces; numbers by value, so ``1`` and ``1.0``
    agree, while ``True`` and ``1`` do not); numpy arrays and tensors are described by
    dtype, shape and a SHA-256 of their bytes; objects with ``to_dict()`` (cost models) by
    that dict. Long texts are replaced by ``sha256:<hex>`` so the all-gather stays small.
    """
    label = None
    if isinstance(value, Mapping) and isinstance(value.get(_LABEL), str):
        # A value that names itself (describe_cost's models): the name is for the reader
        # of a mismatch message; it repeats compared fields, so it is left out of them.
        label = value[_LABEL]
        value = {k: v for k, v in value.items() if k != _LABEL}
    text = json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), allow_nan=True)
    if len(text) > _INLINE_LIMIT:
        digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        return digest if label is None else f"{label} ({digest})"
    return text


#: The key of a readable name that :func:`canonical` keeps beside a long value's digest.
_LABEL = "name"


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            return repr(f)
        # 4096 on one rank and 4096.0 on another are the same argument.
        return int(f) if f.is_integer() else f
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a tensor
        value = value.detach().cpu()
        dtype = str(value.dtype)
        if dtype == "torch.bfloat16":
            value = value.float()
        return _array(np.asarray(value.numpy()), dtype)
    if isinstance(value, np.ndarray):
        return _array(value, str(value.dtype))
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return {"type": type(value).__name__, "dict": _plain(to_dict())}
    text = repr(value)
    if " at 0x" in text:  # an address differs between processes: say only the type
        text = f"<{type(value).__module__}.{type(value).__qualname__}>"
    return {"type": type(value).__name__, "repr": text}


def _array(arr: np.ndarray, dtype: str) -> dict[str, Any]:
    data = np.ascontiguousarray(arr).tobytes()
    return {"dtype": dtype, "shape": list(arr.shape), "sha256": hashlib.sha256(data).hexdigest()}


def describe_cost(cost: Any) -> Any:
    """The part of a ``cost=`` argument that must agree across ranks.

    Per-rank cost arrays travel as payload, so only the fact that an array was given must
    agree; a name, path or model is resolved with :func:`seqbalance.costs.load_cost` and
    described by its ``to_dict()`` (so ``"qwen2.5-7b"`` on one rank and the same config's
    path on another agree). Raises whatever ``load_cost`` raises (call it inside the local
    try block).
    """
    from seqbalance._validate import is_array_like

    if is_array_like(cost):
        return "per-sequence array"
    from seqbalance.costs import load_cost

    model = load_cost(cost)
    fields = model.to_dict()
    # The label repeats compared fields only (kind and name), so it never differs alone.
    name = fields.get("name")
    label = f"{fields.get('kind', type(model).__name__)} cost" + (
        f" {str(name)[:100]!r}" if name is not None else ""
    )
    return {_LABEL: label, "model": fields}


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` (just the message for ValueError, the common case)."""
    text = str(exc) or type(exc).__name__
    return text if type(exc) is ValueError else f"{type(exc).__name__}: {text}"


_VERSION_KEY = "seqbalance version"


def _version() -> str:
    import seqbalance

    return str(seqbalance.__version__)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def agree(
    local_error: BaseException | str | None,
    fingerprint: Mapping[str, Any],
    payload: Any,
    group: Any,
    what: str,
) -> list[Any]:
    """All-gather ``(local_error, fingerprint, payload)``; raise the same error on every rank
    if any rank failed or the fingerprints differ, else return every rank's payload.

    Parameters
    ----------
    local_error : exception, str or None
        What went wrong on this rank before communicating (None if nothing). Any exception
        type; it is reported with its type name.
    fingerprint : dict of str to value
        The arguments that must be equal on every rank (everything that changes the
        result), by name. Values are compared through :func:`canonical`, so they may be
        plain values, arrays, tensors or cost models. seqbalance's own version is always
        compared too (``"seqbalance version"``).
    payload : any picklable value
        This rank's data (lengths, costs, tensor descriptions...).
    group : ProcessGroup or None
        The process group (None: the world).
    what : str
        The calling function's name, for the messages.

    Returns
    -------
    list
        ``payload`` of every rank, indexed by rank (the same list on every rank).

    Raises
    ------
    RankAgreementError
        On every rank, with the same message: local errors first (every failing rank and
        its error), else the first argument on which the ranks differ (the values and which
        ranks passed each).
    """
    import torch.distributed as dist

    # Nothing between here and the all-gather may raise on one rank only.
    try:
        prints = {str(k): canonical(v) for k, v in fingerprint.items()}
    except Exception as exc:  # an argument that cannot even be described
        prints, local_error = {}, local_error or exc
    # Another release may plan the same inputs differently (a mixed-version job after a
    # partial upgrade): then the ranks' plans would disagree, silently or in a hang.
    prints[_VERSION_KEY] = _version()
    if isinstance(local_error, BaseException):
        local_error = describe_error(local_error)
    if local_error:
        payload = None
    world = dist.get_world_size(group)
    out: list[Any] = [None] * world
    try:
        dist.all_gather_object(out, (local_error, prints, payload), group=group)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:
        # This rank's payload does not pickle; nothing was sent yet, so send the error.
        dist.all_gather_object(out, (describe_error(exc), {}, None), group=group)

    errors = [(r, e) for r, (e, _, _) in enumerate(out) if e]
    if errors:
        detail = "; ".join(f"rank {r}: {e}" for r, e in errors)
        raise RankAgreementError(
            f"{what} failed on {_ranks([r for r, _ in errors])} (raised on every rank, so no "
            f"rank waits for the others): {detail}"
        )
    # The version first: another release may name or describe its arguments differently,
    # which would otherwise read as the user's argument mismatch.
    names = sorted({k for _, p, _ in out for k in p}, key=lambda k: (k != _VERSION_KEY, k))
    for name in names:
        values = [p.get(name, "<not given>") for _, p, _ in out]
        if len(set(values)) > 1:
            by_value: dict[str, list[int]] = {}
            for r, v in enumerate(values):
                by_value.setdefault(v, []).append(r)
            detail = "; ".join(f"{_ranks(rs)}: {v}" for v, rs in by_value.items())
            if name == _VERSION_KEY:
                raise RankAgreementError(
                    f"{what}: the ranks run different seqbalance versions ({detail}); "
                    "install the same version on every rank, or ranks would compute "
                    "different plans"
                )
            raise RankAgreementError(
                f"{what}: the ranks passed different {name} ({detail}); it must be the same "
                "on every rank of the group, or ranks would compute different plans"
            )
    return [p for _, _, p in out]


def agree_on(
    check: Callable[[], tuple[Mapping[str, Any], Any]], group: Any, what: str
) -> list[Any]:
    """Run this rank's local ``check`` and :func:`agree` on its outcome, in one call.

    Parameters
    ----------
    check : callable
        Validates this rank's inputs *without communicating* and returns
        ``(fingerprint, payload)`` as :func:`agree` takes them. Any exception it raises
        becomes the error raised on every rank.
    group : ProcessGroup or None
        The process group (None: the world).
    what : str
        The calling function's name, for the messages.

    Returns
    -------
    list
        Every rank's payload, indexed by rank (the same list on every rank).

    Raises
    ------
    RankAgreementError
        On every rank, if ``check`` raised on any rank or the fingerprints differ.
    """
    try:
        fingerprint, payload = check()
    except Exception as exc:  # reported to every rank by the all-gather
        return agree(exc, {}, None, group, what)
    return agree(None, fingerprint, payload, group, what)
