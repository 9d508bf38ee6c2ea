"""What the framework drop-ins share: input conversion, error types, patching.

Frameworks hand their balancing code lists, numpy arrays (object arrays for ids), and torch
tensors (on a GPU, sometimes requiring grad). The core takes numpy; the conversion lives
here, done once per call, on CPU and without gradients. torch is never imported: a tensor
is recognised by its methods.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

import numpy as np

from .._validate import (
    MAX_LENGTH,
    as_index,
    check_nonnegative_int,
    check_positive_int,
    first_not_whole,
    index_array,
)
from .._validate import to_numpy as _core_to_numpy

__all__ = [
    "CompatAssertionError",
    "CompatRuntimeError",
    "Patcher",
    "check_index_lists",
    "cost_model_of",
    "count_arg",
    "grow_to",
    "is_tensor",
    "to_numpy",
    "to_python_list",
    "token_counts",
]


class CompatAssertionError(ValueError, AssertionError):
    """Bad input where the original framework raised AssertionError.

    It is both: ``except AssertionError`` in framework code still catches it, and it is a
    ValueError like every other input error of seqbalance.
    """


class CompatRuntimeError(ValueError, RuntimeError):
    """Bad input where the original framework raised RuntimeError (AReaL's allocators)."""


def is_tensor(x: Any) -> bool:
    """True for a torch tensor, without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(values: Any) -> np.ndarray:
    """A 1-D (or n-D) numpy array of ``values``: tensors detached and moved to CPU first,
    object arrays of numbers turned numeric, ids left as objects. Tensors go through the
    core's conversion: floats (bfloat16 and float8 included) widened to float64, integers
    to int64, complex ones refused."""
    if is_tensor(values):
        return np.asarray(_core_to_numpy(values, "values"))
    if isinstance(values, np.ndarray) and values.dtype == object:
        items = values.tolist()
        try:
            numeric = np.asarray(items)
        except (TypeError, ValueError):
            return values
        return numeric if numeric.dtype.kind in "biuf" else values
    if isinstance(values, (list, tuple)) and values and is_tensor(values[0]):
        return np.asarray([float(v) if v.is_floating_point() else int(v) for v in values])
    return np.asarray(values)



def cost_model_of(cost: Any, n: int) -> Any:
    """What a joint mode plans with: ``None``, per-row costs (float64) for an array of ``n``
    rows, or the cost model a name, path or model gives.
    """
    if cost is None:
        return None
    if isinstance(cost, (list, tuple, np.ndarray)) or hasattr(cost, "detach"):
        c = np.asarray(to_numpy(cost), dtype=np.float64)
        if c.shape != (n,):
            raise ValueError(f"cost has shape {c.shape} for {n} rows; pass one cost per row")
        return c
    from ..costs import load_cost

    return load_cost(cost)

def token_counts(values: Any, name: str = "lengths", error: type = ValueError) -> np.ndarray:
    """``values`` (token counts) as int64, refusing fractions instead of truncating them.

    The originals pack whatever numbers they are given; cut to integers, 0.5 + 0.6 + 0.7
    tokens would fit a capacity of 1 and break it. Whole floats (3.0) are fine. Negative
    counts and counts of ``2**40`` or more (a unit mix-up; uint64 and floats above
    ``2**63`` would wrap in the cast) raise ``error`` too, naming the first one.
    """
    x = to_numpy(values)
    if x.dtype.kind in "fc" or x.dtype == object:
        try:
            f = x.astype(np.float64)
        except (TypeError, ValueError):
            raise error(f"{name} must be numbers (token counts), got {x[:5].tolist()}") from None
        i = first_not_whole(f)
        if i is not None:
            raise error(
                f"{name}[{i}] = {float(f.reshape(-1)[i])!r} is not a whole number of tokens; the "
                "drop-in packs token counts (round them first, or pass integers)"
            )
        x = f
    if x.size:
        # Before the cast: uint64 and floats of 2**63 or more would wrap to negatives.
        big = x >= MAX_LENGTH
        if big.any():
            i = int(np.flatnonzero(big.reshape(-1))[0])
            raise error(
                f"{name}[{i}] = {x.reshape(-1)[i].item()!r} is too large for a token count "
                "(limit 2**40); check the units"
            )
        neg = x < 0
        if neg.any():
            i = int(np.flatnonzero(neg.reshape(-1))[0])
            raise error(
                f"{name}[{i}] = {x.reshape(-1)[i].item()!r} is negative; token counts must "
                "be >= 0"
            )
    return x.astype(np.int64)


def count_arg(
    value: Any, name: str, error: type = CompatAssertionError, minimum: int | None = 1,
    maximum: int | None = None,
) -> int:
    """``value`` (a count, a capacity) as an int in ``[minimum, maximum]``, else ``error``.

    ``minimum`` is 1, 0 or None (any integer: a floor the framework takes with ``max()``,
    where -1 may mean "none"). Whole floats (``2.0``) and numpy or tensor integers pass;
    ``2.9``, ``"2"``, bools and None raise, naming ``name``, where ``int()`` would
    truncate, a division by zero or an allocation of ``k`` lists would follow.
    """
    if minimum not in (0, 1, None):
        raise ValueError(f"count_arg: minimum must be 0, 1 or None, got {minimum!r}")
    v = value.item() if is_tensor(value) and value.numel() == 1 else value
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        v = int(v)
    try:  # the core's check (bools and non-integers refused, the minimum), in our type
        if minimum is None:  # its sign ignored, so any integer passes
            plain_int = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
            check_nonnegative_int(abs(v) if plain_int else v, name)
            out = int(v)
        else:
            out = (check_positive_int if minimum == 1 else check_nonnegative_int)(v, name)
    except ValueError as exc:
        raise error(str(exc)) from None
    if maximum is not None and out > maximum:
        raise error(f"{name} = {out} is above {maximum:,}, the most this call can use")
    return out


def check_index_lists(
    parts: Any, n: int, name: str, error: type = CompatAssertionError, part: str = "part",
    distinct: bool = False,
) -> None:
    """Each of ``parts`` a list (array, tensor) of integer indices into ``n`` items, else
    ``error`` naming the first bad one (``distinct``: no index in two places either).
    Framework metrics and splitting helpers index with them, where a bad one raised
    IndexError or was copied. Bools and floats are refused; integer tensors, arrays and
    their 0-d elements pass, as the frameworks index with them."""
    arrays = []
    for p, members in enumerate(parts):
        idx = index_array(members)
        if idx is None:  # name the first value that is not an index
            if isinstance(members, (str, bytes)) or not hasattr(members, "__iter__"):
                raise error(f"{name}[{p}] is {members!r}, not a list of indices")
            for i in members:
                j = _index_of(i)
                if j is None:
                    raise error(f"{name}[{p}] holds {i!r}, not an index")
                if not 0 <= j < n:
                    raise error(f"{name}[{p}] holds index {j}, outside the {n} items (0..{n - 1})")
            raise error(f"{name}[{p}] is not a flat list of indices")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            i = int(idx[(idx < 0) | (idx >= n)][0])
            raise error(f"{name}[{p}] holds index {i}, outside the {n} items (0..{n - 1})")
        arrays.append(idx)
    if distinct and arrays:
        flat = np.concatenate(arrays)
        if flat.size and int(np.bincount(flat, minlength=n).max()) > 1:
            seen: set[int] = set()
            for p, idx in enumerate(arrays):
                for i in idx.tolist():
                    if i in seen:
                        raise error(f"index {i} is in more than one {part} ({name}[{p}])")
                    seen.add(i)


def _index_of(value: Any) -> int | None:
    """``value`` as an index (a Python, numpy or 0-d tensor integer), else None."""
    try:
        return as_index(value)
    except TypeError:
        return None


def to_python_list(values: Any) -> list[Any]:
    """Group ids and the like as a plain Python list (for :func:`seqbalance.partition`)."""
    if is_tensor(values):
        return values.detach().cpu().tolist()
    if isinstance(values, np.ndarray):
        return values.tolist()
    return list(values)


def grow_to(parts: list[list[int]], m: int, weights: np.ndarray) -> list[list[int]]:
    """``parts`` split until there are exactly ``m`` (no-op if there are already ``m``).

    Each step splits the heaviest part holding two or more items into two balanced halves,
    so every new part weighs (and holds tokens) no more than the part it came from: a plan
    that held a token cap still holds it. Deterministic. Used after a count agreement, where
    a rank must end with the agreed count and must not raise alone; needs ``m`` at most the
    number of items.
    """
    from ._core import partition

    out = [list(p) for p in parts if p]
    if m > sum(len(p) for p in out):
        raise ValueError(f"cannot make {m} non-empty parts of {sum(len(p) for p in out)} items")
    while len(out) < m:
        j = max(
            (j for j in range(len(out)) if len(out[j]) > 1),
            key=lambda j: (float(weights[out[j]].sum()), -j),
        )
        halves = [[out[j][i] for i in h] for h in partition(weights[out[j]], 2)]
        if not all(halves):  # zero weights can leave a half empty: split off one item
            halves = [out[j][:1], out[j][1:]]
        out[j : j + 1] = halves
    return out


class Patcher:
    """Swap functions of an installed framework module for ours, and put them back.

    ``patch()`` replaces each name in ``module`` (and in every already imported module
    that did ``from module import name``, which holds its own reference) with the
    drop-in; ``unpatch()`` restores exactly what was there. ``keep_own=True`` leaves
    seqbalance's own modules alone: a joint mode replaces functions that are usually the
    drop-in's (patched first), which its fallback path still calls there.
    """

    def __init__(
        self, module: str, replacements: Callable[[], dict[str, Any]], *, keep_own: bool = False
    ) -> None:
        self.module = module
        self._replacements = replacements
        self._keep_own = keep_own
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def active(self) -> bool:
        return bool(self._saved)

    def patch(self) -> list[str]:
        """Replace the functions; returns the dotted names replaced. Idempotent."""
        if self._saved:
            return sorted({f"{getattr(m, '__name__', m)}.{n}" for m, n, _ in self._saved})
        target = importlib.import_module(self.module)
        new = self._replacements()
        originals = {n: getattr(target, n) for n in new if hasattr(target, n)}
        if not originals:
            raise ValueError(
                f"{self.module} has none of {sorted(new)}; is this the framework version "
                "the drop-in was written for?"
            )
        done = []
        # Modules that imported a function by name hold their own reference: patch those
        # too (only where the reference is the original function itself).
        for mod in [target, *[m for m in list(sys.modules.values()) if m is not target]]:
            if self._keep_own and getattr(mod, "__name__", "").startswith("seqbalance."):
                continue
            for name, orig in originals.items():
                if getattr(mod, name, None) is orig:
                    self._saved.append((mod, name, orig))
                    setattr(mod, name, new[name])
                    done.append(f"{getattr(mod, '__name__', mod)}.{name}")
        return sorted(done)

    def unpatch(self) -> None:
        """Restore every function :meth:`patch` replaced. A no-op when not patched."""
        for mod, name, orig in reversed(self._saved):
            setattr(mod, name, orig)
        self._saved.clear()


def patch_all(patchers: list[Patcher], framework: str) -> list[str]:
    """:meth:`Patcher.patch` each of ``patchers`` whose module imports; the names replaced.

    ImportError only when none of the modules can be imported (``framework`` names the
    package in the message).
    """
    done: list[str] = []
    missing: list[str] = []
    for p in patchers:
        try:
            done += p.patch()
        except ImportError:
            missing.append(p.module)
    if len(missing) == len(patchers):
        raise ImportError(f"none of {missing} can be imported; is {framework} installed?")
    return sorted(done)


def unpatch_all(patchers: list[Patcher]) -> None:
    """Undo :func:`patch_all`, last patcher first."""
    for p in reversed(patchers):
        p.unpatch()
