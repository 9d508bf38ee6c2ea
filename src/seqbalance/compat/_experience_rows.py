"""Regroup OpenRLHF experience batches by gathering rows, without one object per sample.

OpenRLHF's ``balance_experiences`` splits every batch into one ``Experience`` per sample
(``split_experience_batch``) and merges each actor's samples back
(``make_experience_batch``): for 8,192 samples that is 8,192 dataclass instances and one
pad per sample and per-token field, which took 0.4 s of a 0.5 s call (bench/compat.py,
n = 8,192, 64 tokens a row). For OpenRLHF's own ``Experience`` (a dataclass whose tensor
fields are tagged "step" or "episode") this module builds the same merged batches field by
field, with one copy of each gathered block:

- a "step" tensor ``(B, ..., T)``: the group's rows, right-padded with zeros to the widest
  ``T`` among the batches they come from (what padding every sample to the group's widest
  and stacking gives);
- an "episode" tensor, or any ``(B,)`` tensor: the group's rows;
- a list of length ``B``: the group's entries; a list of another length is repeated once
  per sample of its batch (split copies it whole into every sample);
- a dict of tensors or length-``B`` lists: per key, the group's entries as a list, or one
  tensor when they are all Python ints or floats;
- ``None``: ``None``.

:func:`layout` checks first that the batches hold nothing else and nothing the merge
would refuse or resolve by the group's first sample (mixed kinds or dtypes, mismatched
sizes, tensors requiring grad, dict keys or value types that differ between batches);
otherwise it returns None and the caller splits and merges as OpenRLHF does, which gives
OpenRLHF's own result or error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._inputs import is_tensor, to_numpy

__all__ = ["RowLayout", "layout"]


def _rows_of(value: Any) -> int | None:
    """Rows of a dense (strided) tensor with at least one dimension, else None (sparse
    tensors merge into dense ones through the pad and stack, not through a gather)."""
    if not is_tensor(value) or value.dim() < 1 or str(value.layout) != "torch.strided":
        return None
    return int(value.shape[0])


class RowLayout:
    """Batches that :meth:`gather` can regroup: the experience class, each batch's row
    count, and per field how it merges (checked by :func:`layout`)."""

    def __init__(self, cls: type, batches: Sequence[Any], sizes: list[int],
                 kinds: dict[str, str]) -> None:  # fmt: skip
        self.cls, self.batches, self.sizes, self.kinds = cls, list(batches), sizes, kinds
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def lengths(self) -> np.ndarray:
        """Each sample's ``total_length``, batches end to end (float64)."""
        return np.concatenate([to_numpy(b.total_length).astype(np.float64) for b in self.batches])

    def _blocks(self, members: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(batch, rows within it) of ascending global sample ids, batch by batch."""
        cut = np.searchsorted(members, self.starts[1:], side="left")
        out, lo = [], 0
        for b, hi in enumerate(cut.tolist()):
            if hi > lo:
                out.append((b, members[lo:hi] - self.starts[b]))
            lo = hi
        return out

    def gather(self, groups: Sequence[np.ndarray]) -> list[Any]:
        """One batch of ``cls`` per group of global sample ids (each ascending)."""
        import torch

        out = []
        for members in groups:
            blocks = self._blocks(np.asarray(members, dtype=np.int64))
            idx = [(b, torch.from_numpy(np.ascontiguousarray(r))) for b, r in blocks]
            kwargs = {name: self._field(name, kind, blocks, idx)
                      for name, kind in self.kinds.items()}  # fmt: skip
            out.append(self.cls(**kwargs))
        return out

    def _field(self, name: str, kind: str, blocks: list, idx: list) -> Any:
        import torch

        if kind == "none":
            return None
        vals = [getattr(self.batches[b], name) for b, _ in blocks]
        if kind in ("rows", "step") and vals[0].device != idx[0][1].device:
            idx = [(b, i.to(vals[0].device)) for b, i in idx]  # all batches share it
        if kind == "rows":
            return torch.cat([v.index_select(0, i) for v, (_, i) in zip(vals, idx)])
        if kind == "step":
            n = sum(len(r) for _, r in blocks)
            width = max(int(v.shape[-1]) for v in vals)
            merged = vals[0].new_empty((n, *vals[0].shape[1:-1], width))
            at = 0
            for v, (_, i) in zip(vals, idx):
                block, w = merged[at : at + len(i)], int(v.shape[-1])
                if w == width:  # the rows land in place: one copy, no padding
                    torch.index_select(v, 0, i, out=block)
                else:
                    block[..., :w] = v.index_select(0, i)
                    block[..., w:] = 0
                at += len(i)
            return merged
        if kind == "list":
            got: list[Any] = []
            for v, (b, r) in zip(vals, blocks):
                if len(v) == self.sizes[b]:
                    got.extend(v[j] for j in r.tolist())
                else:
                    for _ in range(len(r)):
                        got.extend(v)
            return got
        # "dict": the group's first batch's keys (all batches share them), per key the
        # entries; all Python ints or floats become one tensor, as the merge does.
        merged_d: dict[str, Any] = {}
        for key in vals[0]:
            entries: list[Any] = []
            for v, (_, i), (_, r) in zip(vals, idx, blocks):
                x = v[key]
                if is_tensor(x):
                    entries.extend(x.index_select(0, i.to(x.device)).unbind(0))
                else:
                    entries.extend(x[j] for j in r.tolist())
            numeric = all(isinstance(e, (int, float)) for e in entries)
            merged_d[key] = torch.tensor(entries) if numeric else entries
        return merged_d


def _tensor_kind(cls: type, name: str, vals: list[Any], sizes: list[int]) -> str | None:
    """How a tensor field merges, or None when the merge would not be a plain gather."""
    first = vals[0]
    for v, n in zip(vals, sizes):
        if _rows_of(v) != n or v.requires_grad:
            return None
        if v.dtype != first.dtype or v.device != first.device or v.dim() != first.dim():
            return None
    if cls.is_step_tensor_field(name):
        if first.dim() < 2 or any(v.shape[1:-1] != first.shape[1:-1] for v in vals):
            return None
        return "step"
    if cls.is_episode_tensor_field(name) or first.dim() == 1:
        return "rows" if all(v.shape[1:] == first.shape[1:] for v in vals) else None
    return None


def _dict_ok(vals: list[dict], sizes: list[int]) -> bool:
    """Every batch's dict has the same keys; each value a tensor or list of the batch's
    rows; per key, every list entry of one exact type across batches (the merge checks
    types against the group's first entry, so only then is every grouping accepted)."""
    keys = list(vals[0])
    for d in vals:
        if list(d) != keys:
            return False
    for key in keys:
        kinds = {is_tensor(d[key]) for d in vals}
        if kinds == {True}:
            if any(_rows_of(d[key]) != n or d[key].requires_grad for d, n in zip(vals, sizes)):
                return False
            continue
        if kinds != {False} or not all(isinstance(d[key], list) for d in vals):
            return False
        if any(len(d[key]) != n for d, n in zip(vals, sizes)):
            return False
        types = {type(e) for d in vals for e in d[key]}
        if len(types) > 1:
            return False
    return True


def layout(batches: Sequence[Any], module: Any) -> RowLayout | None:
    """A :class:`RowLayout` when every batch is ``module.Experience`` (OpenRLHF's
    dataclass with "step" / "episode" tensor fields) and holds only what merges as a
    plain gather; else None (split and merge instead). ``index`` is not read: OpenRLHF's
    split sets it to None first (the caller does the same)."""
    cls = getattr(module, "Experience", None)
    if cls is None or not dataclasses.is_dataclass(cls) or not batches:
        return None
    if not all(hasattr(cls, m) for m in ("is_step_tensor_field", "is_episode_tensor_field")):
        return None
    if any(type(b) is not cls for b in batches):
        return None
    sizes = [_rows_of(getattr(b, "sequences", None)) for b in batches]
    if any(n is None or n == 0 for n in sizes):
        return None
    tl = [getattr(b, "total_length", None) for b in batches]
    if any(_rows_of(t) != n or t.dim() != 1 for t, n in zip(tl, sizes)):
        return None
    names = [f.name for f in dataclasses.fields(cls)]
    kinds: dict[str, str] = {}
    for name in names:
        vals = [None if name == "index" else getattr(b, name) for b in batches]
        if all(v is None for v in vals):
            kinds[name] = "none"
        elif all(is_tensor(v) for v in vals):
            kind = _tensor_kind(cls, name, vals, sizes)  # type: ignore[arg-type]
            if kind is None:
                return None
            kinds[name] = kind
        elif all(isinstance(v, list) for v in vals):
            kinds[name] = "list"
        elif all(isinstance(v, dict) for v in vals) and _dict_ok(vals, sizes):  # type: ignore[arg-type]
            kinds[name] = "dict"
        else:
            return None
    return RowLayout(cls, batches, sizes, kinds)
