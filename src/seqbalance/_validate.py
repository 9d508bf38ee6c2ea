"""Input validation shared by every public entry point.

Each function checks one kind of argument, widens it to a safe dtype (int64 / float64:
int32 sums overflow on real batches) and raises a :class:`ValueError` that names the
argument, the first offending value and how to fix it.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np

__all__ = [
    "MAX_LENGTH",
    "as_groups",
    "as_lengths",
    "as_weights",
    "check_bool",
    "check_choice",
    "check_nonnegative_int",
    "check_positive_int",
    "unwritable",
]


def _as_1d(values: Any, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got a string {values!r}")
    if not hasattr(values, "__len__") and not hasattr(values, "__array__"):
        raise ValueError(
            f"{name} must be an array or a list of numbers, got {type(values).__name__}; "
            "wrap iterators and generators in list(...)"
        )
    try:
        arr = np.asarray(values)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} must be a 1-D sequence of numbers ({exc})") from exc
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one value per sequence), got shape {arr.shape}; "
            "flatten it or pass one value per item"
        )
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers, got dtype {arr.dtype}")
    return arr


def as_weights(values: Any, name: str = "weights") -> np.ndarray:
    """Return ``values`` as a float64 1-D array of finite, non-negative numbers.

    Raises
    ------
    ValueError
        If the input is not 1-D numeric, or holds NaN, infinite or negative values.
    """
    arr = _as_1d(values, name).astype(np.float64, copy=False)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}[{i}] = {float(arr[i])!r} is not finite; {name} must be finite numbers "
            "(check the cost model or the data for NaN/inf)"
        )
    neg = arr < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r} is negative; {name} must be >= 0")
    return arr


MAX_LENGTH = 2**40  # a trillion tokens: anything longer is a unit mix-up, and sums stay in int64


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
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{i}] = {arr[i].item()!r} is not a whole number of tokens")
    if arr.size:
        big = arr >= MAX_LENGTH
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise ValueError(
                f"{name}[{i}] = {arr[i].item()!r} is too large for a token count "
                f"(limit 2**40); check the units"
            )
    out = arr.astype(np.int64)
    neg = out < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ValueError(f"{name}[{i}] = {int(out[i])} is negative; lengths must be >= 0")
    return out


def _as_int(value: Any, name: str, minimum: int) -> int:
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {kind}, got {value!r}") from None
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
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
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return str(value)


def as_groups(groups: Any, n: int, name: str = "groups") -> np.ndarray:
    """Map group ids (any hashable numbers or strings, one per item) to dense int64 labels.

    Labels are numbered 0..G-1 in order of each group's first appearance, so the result
    depends only on the input order (never on hash order).

    Raises
    ------
    ValueError
        If ``groups`` is not 1-D or its length differs from the number of items ``n``.
    """
    if isinstance(groups, (list, tuple)) and groups:
        kinds = {isinstance(g, str) for g in groups}
        if len(kinds) > 1:
            raise ValueError(
                f"{name} mixes strings and numbers; use one kind of id so that 1 and '1' "
                "cannot be confused"
            )
    arr = np.asarray(groups)
    if arr.dtype == object or arr.dtype.kind not in "biufUS":
        raise ValueError(f"{name} must hold numbers or strings, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one group id per item), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(
            f"{name} has {arr.shape[0]} entries but there are {n} items; "
            "pass exactly one group id per item"
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"{name}[{i}] = {arr[i].item()!r} is not a valid group id")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    # np.unique numbers groups by sorted id; renumber by first appearance.
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0], dtype=np.int64)
    return rank[inverse.reshape(-1)]


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written, or None when it can (checked without writing).

    Commands check their output paths before minutes of work, not after.
    """
    if os.path.isdir(path):
        return "is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "permission denied"
    return None
