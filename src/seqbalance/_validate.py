"""Input validation shared by every public entry point.

Each function checks one kind of argument, widens it to a safe dtype (int64 / float64:
int32 sums overflow on real batches) and raises a :class:`ValueError` that names the
argument, the first offending value and how to fix it (an :class:`ArgumentError`, whose
``argument`` names it for callers that map it to their own words).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._notes import Note, NotedError, arg, as_text

__all__ = [
    "MAX_EMPTY",
    "MAX_EMPTY_SLOTS",
    "MAX_LENGTH",
    "MAX_TOKENS",
    "ArgumentError",
    "as_groups",
    "as_index",
    "as_lengths",
    "as_weights",
    "check_bool",
    "check_choice",
    "check_max_tokens",
    "check_nonnegative_int",
    "check_notes",
    "check_positive_int",
    "check_size_limit",
    "check_text",
    "group_ids",
    "is_array_like",
    "to_numpy",
    "unwritable",
]


class ArgumentError(NotedError):
    """A bad argument: a :class:`ValueError` that names the argument it is about.

    Parameters
    ----------
    message : str or Note
        What is wrong, the bad value and the fix, in the words of the function raising it
        (a :class:`~seqbalance.Note` whose terms an integration can write in its own words).
    argument : str
        The keyword the caller passed the bad value as (``"dp_size"``, ``"max_tokens"``,
        ``"groups"``...), as :func:`seqbalance.plan` spells it. Integrations map it to
        their own names (the command line to its flags) without reading the message.
    """

    def __init__(self, message: str | Note, *, argument: str) -> None:
        super().__init__(message)
        self.argument = argument

    def __reduce__(self) -> Any:  # picklable, e.g. across worker processes
        return (_argument_error, (self.note, self.argument))


def _argument_error(message: str | Note, argument: str) -> ArgumentError:
    return ArgumentError(message, argument=argument)


def is_array_like(value: Any) -> bool:
    """True for what :func:`to_numpy` turns into an array: lists, tuples, numpy arrays,
    tensors (anything with ``detach``/``cpu``), pandas Series/Index/Categorical
    (``to_numpy``) and other objects with ``__array__``. Strings and mappings are not."""
    if isinstance(value, (str, bytes, Mapping)):
        return False
    return (
        isinstance(value, (list, tuple, np.ndarray))
        or _is_tensor(value)
        or callable(getattr(value, "to_numpy", None))
        or hasattr(value, "__array__")
    )


def _is_tensor(value: Any) -> bool:
    return callable(getattr(value, "detach", None)) and callable(getattr(value, "cpu", None))


def to_numpy(values: Any, name: str) -> Any:
    """Bring framework containers to numpy without importing the framework.

    - tensors (torch, duck-typed by ``detach``/``cpu``): detached, moved to the CPU once, and
      widened (floating types, bf16 and fp16 included, to float64; integers to int64;
      bools stay bool), so ``requires_grad`` and CUDA tensors are fine;
    - pandas Series, Index, Categorical (``to_numpy``): their values; categoricals give
      their category values, not the codes, so ids mean the same on every process;
    - object arrays (Python ints of any size, strings from pandas) are narrowed to int64,
      float64 or unicode where every element allows it.

    Anything else is returned as given (lists stay lists for ``np.asarray``).
    """
    if _is_tensor(values):
        t = values.detach().cpu()
        if getattr(t, "is_complex", lambda: False)():
            raise ArgumentError(
                f"{name} must hold real numbers, got a complex tensor", argument=name
            )
        if str(getattr(t, "dtype", "")) == "torch.bool":
            values = t.numpy()
        elif t.is_floating_point():
            values = t.double().numpy()
        else:
            values = t.long().numpy()
    elif not isinstance(values, (np.ndarray, list, tuple)) and callable(
        getattr(values, "to_numpy", None)
    ):
        values = values.to_numpy()
    if isinstance(values, np.ndarray) and values.dtype == object:
        values = _narrow_objects(values, name)
    return values


def _narrow_objects(arr: np.ndarray, name: str) -> np.ndarray:
    """An object array of plain ints, floats or strings as int64 / float64 / unicode."""
    if arr.ndim != 1:
        return arr
    items = arr.tolist()
    for i, v in enumerate(items):
        if v is None or (isinstance(v, float) and v != v):
            raise ArgumentError(
                f"{name}[{i}] is missing ({v!r}); give every item a value", argument=name
            )
    if all(isinstance(v, str) for v in items):
        return np.array(items, dtype=str) if items else np.zeros(0, dtype=np.int64)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in items):
        if all(-(2**63) <= int(v) < 2**63 for v in items):
            return np.array(items, dtype=np.int64)
        # Beyond int64: float64 keeps the magnitude (weights accept it, lengths refuse it
        # as too large, naming the index).
        return _floats(items, name)
    if all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        for v in items
    ):
        return _floats(items, name)
    return arr


def _floats(items: list[Any], name: str) -> np.ndarray:
    """Numbers as float64; an int beyond float64's range is refused, naming its index."""
    out = np.empty(len(items), dtype=np.float64)
    for i, v in enumerate(items):
        try:
            out[i] = float(v)
        except OverflowError:
            raise ArgumentError(
                f"{name}[{i}] is an integer of {int(v).bit_length()} bits, beyond the float64 "
                "range (~1.8e308); rescale the values"
            , argument=name) from None
    return out


def _as_1d(values: Any, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise ArgumentError(
            f"{name} must be a 1-D sequence of numbers, got a string {values!r}", argument=name
        )
    if not hasattr(values, "__len__") and not hasattr(values, "__array__"):
        raise ArgumentError(
            f"{name} must be an array or a list of numbers, got {type(values).__name__}; "
            "wrap iterators and generators in list(...)"
        , argument=name)
    values = to_numpy(values, name)
    try:
        arr = np.asarray(values)
    except Exception as exc:  # ragged lists and the like
        raise ArgumentError(
            f"{name} must be a 1-D sequence of numbers ({exc})", argument=name
        ) from exc
    if arr.dtype == object:
        arr = _narrow_objects(arr, name)
    if arr.ndim != 1:
        raise ArgumentError(
            f"{name} must be 1-D (one value per sequence), got shape {arr.shape}; "
            "flatten it or pass one value per item"
        , argument=name)
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise ArgumentError(f"{name} must hold numbers, got dtype {arr.dtype}", argument=name)
    return arr


def as_weights(values: Any, name: str = "weights") -> np.ndarray:
    """Return ``values`` as a float64 1-D array of finite, non-negative numbers.

    Raises
    ------
    ValueError
        If the input is not 1-D numeric, or holds NaN, infinite or negative values.
    """
    arr = _as_1d(values, name).astype(np.float64, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(arr.sum())
    if math.isfinite(total) and (not arr.size or float(arr.min()) >= 0):
        # A finite sum means every value is finite (a NaN or an infinity makes it
        # NaN or infinite); the checks below only find which one is at fault.
        return arr
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ArgumentError(
            f"{name}[{i}] = {float(arr[i])!r} is not finite; {name} must be finite numbers "
            "(check the cost model or the data for NaN/inf)"
        , argument=name)
    neg = arr < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ArgumentError(
            f"{name}[{i}] = {float(arr[i])!r} is negative; {name} must be >= 0", argument=name
        )
    with np.errstate(over="ignore"):
        total = float(arr.sum())
    if not np.isfinite(total):
        # Loads, bounds and step times are sums: they would be inf/nan, so refuse early.
        raise ArgumentError(
            f"{name} sum to more than the largest float64 (~1.8e308); rescale them "
            "(only ratios matter for balancing), e.g. divide by their maximum"
        , argument=name)
    return arr


MAX_LENGTH = 2**40  # a trillion tokens: anything longer is a unit mix-up, and sums stay in int64


def exact_numbers(values: Any) -> np.ndarray:
    """``values`` for exact sums: int64 for integers, an object array of Python ints for
    integers beyond int64 (which numpy reads as uint64 when all lie in [2**63, 2**64),
    as float64 when mixed with small ones, and as objects beyond 2**64), else float64.
    Tensors are read as :func:`to_numpy` reads them. No validation: callers check the
    values (e.g. with :func:`as_weights`) first."""
    arr = np.asarray(to_numpy(values, "values") if _is_tensor(values) else values)
    kind = arr.dtype.kind
    # The uint64 and float64 readings must not be cast: they are not the values given.
    maybe_big = (
        kind == "O"
        or (kind == "u" and arr.size > 0 and int(arr.max()) >= 2**63)
        or (kind == "f" and not isinstance(values, np.ndarray) and arr.size > 0
            and float(np.abs(arr).max()) >= 2.0**63)
    )  # fmt: skip
    if maybe_big:
        vals = arr.reshape(-1).tolist() if isinstance(values, np.ndarray) else list(values)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in vals):  # fmt: skip
            return np.array([int(v) for v in vals], dtype=object)
    return arr.astype(np.int64 if kind in "iub" else np.float64, copy=False)


def first_not_whole(arr: np.ndarray) -> int | None:
    """Flat index of the first entry of a float array that is not a finite whole number."""
    bad = ~np.isfinite(arr) | (arr != np.round(arr))
    return int(np.flatnonzero(bad.reshape(-1))[0]) if bad.any() else None


def as_lengths(values: Any, name: str = "lengths") -> np.ndarray:
    """Return ``values`` as an int64 1-D array of non-negative integer token counts.

    Floats are accepted only when they hold whole numbers. Values must stay below
    ``2**40`` so that sums of millions of them cannot overflow int64.

    Raises
    ------
    ValueError
        If the input is not 1-D numeric, or holds negative, non-integer, non-finite or
        absurdly large values.
    """
    arr = _as_1d(values, name)
    if arr.dtype.kind == "f":
        i = first_not_whole(arr)
        if i is not None:
            raise ArgumentError(
                f"{name}[{i}] = {arr[i].item()!r} is not a whole number of tokens", argument=name
            )
    if arr.size:
        # float16 cannot hold 2**40: compare in float64 (numpy warned of an overflow).
        wide = arr.astype(np.float64) if arr.dtype.kind == "f" and arr.dtype.itemsize < 8 else arr
        big = wide >= MAX_LENGTH
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise ArgumentError(
                f"{name}[{i}] = {arr[i].item()!r} is too large for a token count "
                f"(limit 2**40); check the units"
            , argument=name)
    neg = arr < 0  # before the cast, which would wrap values below -2**63
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ArgumentError(
            f"{name}[{i}] = {int(arr[i].item())} is negative; {name} must be >= 0", argument=name
        )
    return arr.astype(np.int64)


def as_index(value: Any) -> int:
    """``value`` as an integer index: a Python or numpy integer, or an integer 0-d tensor.

    Raises TypeError for anything else, bools and bool tensors included: ``True`` passes
    ``operator.index`` as 1, but as an index or a count it is a typo.
    """
    if isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) == "torch.bool":
        raise TypeError(f"{value!r} is a bool, not an index")
    return operator.index(value)


def index_array(members: Any) -> np.ndarray | None:
    """``members`` (a list, tuple, set, iterator, array or tensor of item indices) as a 1-D
    int64 array, or None where it is not a flat collection of integer indices that fit in
    int64. Not range-checked.

    Arrays and tensors need an integer dtype (an empty one may have any); other iterables
    are read once, value by value through :func:`as_index` (so bools, floats and strings
    give None), except that a list of plain ints goes to numpy at once.
    """
    if _is_tensor(members):
        dtype = members.dtype
        if dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool":
            return np.zeros(0, np.int64) if members.numel() == 0 else None
        members = members.detach().cpu().numpy()
    if isinstance(members, np.ndarray):
        if members.size == 0:
            return np.zeros(0, np.int64)
        if members.ndim != 1:
            return None
        if members.dtype != object:
            kind = members.dtype.kind
            if kind not in "iu" or (kind == "u" and int(members.max()) > _INT64_MAX):
                return None
            return members.astype(np.int64, copy=False)
    elif isinstance(members, (str, bytes, Mapping)) or not hasattr(members, "__iter__"):
        return None
    # Sets, iterators, generators and object arrays: read once, as a list.
    values = members if isinstance(members, (list, tuple)) else list(members)
    if not set(map(type, values)) <= {int}:  # bools are of type bool: they go this way
        try:
            values = [as_index(v) for v in values]
        except TypeError:
            return None
    try:
        return np.array(values, dtype=np.int64) if len(values) else np.zeros(0, np.int64)
    except OverflowError:  # an integer beyond int64: no index of any real batch
        return None


_INT64_MAX = 2**63 - 1


def _as_int(value: Any, name: str, minimum: int) -> int:
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        out = as_index(value)
    except TypeError:
        raise ArgumentError(Note("argument", {"what": kind, "value": value},
                                 arg(name) + " must be {what}, got {value!r}"),
                            argument=name) from None  # fmt: skip
    if out < minimum:
        raise ArgumentError(Note("argument", {"minimum": minimum, "value": out},
                                 arg(name) + " must be >= {minimum}, got {value}"),
                            argument=name)  # fmt: skip
    return int(out)


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an ``int`` >= 1, or raise a ValueError naming ``name``."""
    return _as_int(value, name, 1)


def check_nonnegative_int(value: Any, name: str) -> int:
    """Return ``value`` as an ``int`` >= 0, or raise a ValueError naming ``name``."""
    return _as_int(value, name, 0)


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool (numpy bools too), else raise a ValueError."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(Note("argument", {"value": value},
                                 arg(name) + " must be True or False, got {value!r}"),
                            argument=name)  # fmt: skip
    return bool(value)


def check_nonnegative_real(
    value: Any, name: str, *, upper: float | None = None, why: str = ""
) -> float:
    """Return ``value`` as a finite float in ``[0, upper]``, or raise a ValueError naming
    ``name`` (``why`` is appended to the range message). Bools and non-numbers are refused;
    a Python int beyond float range counts as infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(Note("argument", {"value": value},
                                 arg(name) + " must be a real number >= 0, got {value!r}"),
                            argument=name)  # fmt: skip
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out) or out < 0 or (upper is not None and out > upper):
        rng = f"in [0, {upper:g}]" if upper is not None else "finite and >= 0"
        invalid = arg(name, " = ") + "{value!r} is invalid; it must be {range}{why}"
        raise ArgumentError(Note("argument", {"value": value, "range": rng, "why": why}, invalid),
                            argument=name)  # fmt: skip
    return out


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a ValueError listing them."""
    if value not in choices:
        raise ArgumentError(
            f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}", argument=name
        )
    return str(value)


def check_text(value: Any, name: str) -> str:
    """Return ``value`` if it is a ``str``, else raise a ValueError naming ``name``."""
    if not isinstance(value, str):
        raise ArgumentError(
            f"{name} must be a string, got {value!r} ({type(value).__name__})", argument=name
        )
    return value


def check_notes(value: Any, name: str = "notes") -> tuple[str, ...]:
    """Return ``value``, a list or tuple of strings, as a tuple, or raise a ValueError.

    A bare string is refused too: it would otherwise become one note per character.
    """
    if not isinstance(value, (list, tuple)):
        raise ArgumentError(
            f"{name} must be a list of strings (one per note; [] for none), got {value!r} "
            f"({type(value).__name__})"
        , argument=name)
    for i, note in enumerate(value):
        if not isinstance(note, (str, Note)):
            raise ArgumentError(
                f"{name}[{i}] must be a string, got {note!r} ({type(note).__name__}); "
                f"{name} is a list of strings"
            , argument=name)
    return tuple(value)


def group_ids(groups: Any, name: str = "groups") -> np.ndarray:
    """``groups`` as a 1-D numpy array of ids (numbers or strings), not yet renumbered.

    Accepts lists, numpy arrays, tensors and pandas Series / Categorical (see
    :func:`to_numpy`).

    Raises
    ------
    ValueError
        If the ids are not 1-D, mix strings and numbers, or are of another type.
    """
    if isinstance(groups, (str, bytes)):
        raise ArgumentError(
            f"{name} must be one id per item, got a string {groups!r}", argument=name
        )
    if isinstance(groups, np.ndarray) and groups.dtype == object and groups.ndim == 1:
        groups = groups.tolist()  # e.g. string uids in an object array: checked as a list
    if isinstance(groups, (list, tuple)) and groups:
        kinds = {isinstance(g, str) for g in groups}
        if len(kinds) > 1:
            raise ArgumentError(
                f"{name} mixes strings and numbers; use one kind of id so that 1 and '1' "
                "cannot be confused"
            , argument=name)
    arr = np.asarray(to_numpy(groups, name))
    if arr.dtype == object:
        arr = _narrow_objects(arr, name)
    if arr.dtype == object or arr.dtype.kind not in "biufUS":
        raise ArgumentError(
            f"{name} must hold numbers or strings (one kind), got dtype {arr.dtype}"
        , argument=name)
    if arr.ndim != 1:
        raise ArgumentError(
            f"{name} must be 1-D (one group id per item), got shape {arr.shape}", argument=name
        )
    return arr


def as_groups(groups: Any, n: int, name: str = "groups") -> np.ndarray:
    """Map group ids (any hashable numbers or strings, one per item) to dense int64 labels.

    Labels are numbered 0..G-1 in order of each group's first appearance, so the result
    depends only on the input order (never on hash order).

    Raises
    ------
    ValueError
        If ``groups`` is not 1-D or its length differs from the number of items ``n``.
    """
    arr = group_ids(groups, name)
    if arr.shape[0] != n:
        raise ArgumentError(
            f"{name} has {arr.shape[0]} entries but there are {n} items; "
            "pass exactly one group id per item"
        , argument=name)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ArgumentError(
            f"{name}[{i}] = {arr[i].item()!r} is not a valid group id", argument=name
        )
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    # np.unique numbers groups by sorted id; renumber by first appearance.
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0], dtype=np.int64)
    return rank[inverse.reshape(-1)]


#: Token capacities at or above this are refused (sums of lengths and capacities stay
#: far inside int64).
MAX_TOKENS = 2**62

#: How many empty parts (partition) or empty micro-batch slots (plan) beyond one per item a
#: request may ask for. Above it the request is refused before anything is allocated: such
#: a request is a typo (dp_size=10**9) and would otherwise exhaust memory or run for minutes.
MAX_EMPTY = 2**20

#: The same for :func:`seqbalance.plan`'s micro-batch slots (ranks x micro-batches), which
#: cost more each (packing, step times): 2**16 empty slots plan in about a second.
MAX_EMPTY_SLOTS = 2**16


def check_max_tokens(value: Any, name: str = "max_tokens") -> int:
    """Return ``value`` as a positive ``int`` below ``2**62``, or raise a ValueError."""
    out = _as_int(value, name, 1)
    if out >= MAX_TOKENS:
        raise ArgumentError(
            f"{name}={out} is beyond any real token capacity (it must be below 2**62); "
            "pass the capacity of one micro-batch in tokens"
        , argument=name)
    return out


#: Parallel degrees beyond any real machine; above them planning would only run out of
#: memory or time (a pipeline simulation grows with stages x chunks, CP tables with cp_size).
MAX_PARALLEL_DEGREE = 2**14


def check_degree(value: Any, name: str, limit: int = MAX_PARALLEL_DEGREE) -> int:
    """Return ``value`` as an int in ``1..limit``, or raise a ValueError naming ``name``."""
    out = _as_int(value, name, 1)
    if out > limit:
        raise ArgumentError(
            f"{name}={out} is beyond any real parallel layout (at most {limit}); pass the "
            "number of GPUs (or model chunks) it really has"
        , argument=name)
    return out


def too_long(
    lengths: np.ndarray, cap: int, item: str = "sequence", flag: str = "max_tokens"
) -> str:
    """The start of a message naming the first length above ``cap`` (and how many more),
    or "" when all fit; each caller adds its own fix."""
    over = np.flatnonzero(lengths > cap)
    if not over.size:
        return ""
    i = int(over[0])
    more = f" (and {over.size - 1} more)" if over.size > 1 else ""
    # the capacity as a term with its value (max_tokens=8192, or --max-tokens=8192)
    cap_term = arg(flag)[:-1] + ":{cap}}" if arg(flag).startswith("{@") else arg(flag) + "={cap}"
    return as_text(Note(
        "too_long", {"item": item, "index": i, "tokens": int(lengths[i]), "cap": cap, "more": more},
        "{item} {index} has {tokens} tokens, more than " + cap_term + "{more}",
    ))  # fmt: skip


def check_size_limit(
    value: int,
    name: str,
    n: int,
    unit: str = "parts",
    limit: int = MAX_EMPTY,
    fix: str | Note | None = None,
    label: Note | None = None,
) -> int:
    """Refuse ``value`` (already an int) above ``n + limit``: absurd for ``n`` items.

    ``unit`` names what ``value`` counts, for the message; ``limit`` is ``MAX_EMPTY``
    (2**20) or ``MAX_EMPTY_SLOTS`` (2**16); ``fix`` is what to do (default: pass ``name``
    near the real number); ``label`` how the message names ``value`` (default: ``name``).
    """
    if value > n + limit:
        power = f"2**{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)
        fix = fix or Note("fix", {"at_most": n + limit},
                          "pass " + arg(name) + " near the real number (at most {at_most} here)")
        raise ArgumentError(Note(
            "size_limit",
            {"label": label or Note("name", {}, arg(name)), "value": value, "unit": unit,
             "n": n, "empty": value - n, "power": power, "fix": fix},
            "{label}={value} asks for {value} {unit} for {n} items, so at least "
            "{empty} would stay empty (limit: n + {power}); {fix}",
        ), argument=name)  # fmt: skip
    return value


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written, or None when it can (checked without writing).

    Commands check their output paths before minutes of work, not after.
    """
    if os.path.isdir(path):
        return "is a directory"
    if path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        # abspath drops the slash, and open() fails only after the work is done.
        return "names a folder (it ends in a path separator); give a file name"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "permission denied"
    return None
