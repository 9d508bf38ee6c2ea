"""Collate functions that pack variable-length samples into one row without padding."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import numpy as np
import torch

__all__ = ["pack_collate"]


def _tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} cannot be made a tensor ({exc})") from None


def pack_collate(
    samples: Sequence[Any],
    *,
    token_key: str = "input_ids",
    token_keys: Collection[str] | None = None,
    cu_seqlens_dtype: torch.dtype = torch.int32,
) -> dict[str, Any]:
    """Pack samples into one concatenated row, varlen-attention style.

    Parameters
    ----------
    samples : sequence
        Items from the dataset: dicts (``token_key`` holds the token ids) or bare sequences
        of token ids. May be empty (a rank's empty micro-batch), which gives empty tensors.
    token_key : str, optional
        Key whose length is the sample's length.
    token_keys : collection of str, optional
        Keys concatenated along tokens. Default: ``token_key`` and every key whose value has
        ``len == len(sample[token_key])`` in every sample of this batch. Other tensor-like
        values are stacked (one row per sample); anything else is returned as a list.
    cu_seqlens_dtype : torch.dtype, optional
        dtype of ``cu_seqlens`` (int32 is what flash-attention kernels take).

    Returns
    -------
    dict
        The concatenated token keys, plus ``cu_seqlens`` ([n + 1], starting at 0),
        ``position_ids`` (0..L-1 within each sample, int64, unless a sample provides them),
        ``lengths`` ([n], int64) and ``max_seqlen`` (int).

    Examples
    --------
    >>> b = pack_collate([[5, 6, 7], [8, 9]])
    >>> b["input_ids"].tolist(), b["cu_seqlens"].tolist(), b["position_ids"].tolist()
    ([5, 6, 7, 8, 9], [0, 3, 5], [0, 1, 2, 0, 1])
    """
    items = [s if isinstance(s, Mapping) else {token_key: s} for s in samples]
    for i, s in enumerate(items):
        if token_key not in s:
            raise ValueError(
                f"samples[{i}] has no {token_key!r} key (keys: {sorted(s)}); pass token_key="
            )
    ids = [_tensor(s[token_key], f"samples[{i}][{token_key!r}]") for i, s in enumerate(items)]
    for i, t in enumerate(ids):
        if t.dim() != 1:
            raise ValueError(
                f"samples[{i}][{token_key!r}] must be 1-D token ids, got shape {tuple(t.shape)}"
            )
    lens = np.array([t.shape[0] for t in ids], dtype=np.int64)
    keys = list(items[0]) if items else [token_key]
    for i, s in enumerate(items):
        if list(s) != keys:
            raise ValueError(f"samples[{i}] has keys {list(s)} but samples[0] has {keys}")

    def per_token(k: str) -> bool:
        if token_keys is not None:
            return k == token_key or k in token_keys
        return all(
            hasattr(s[k], "__len__") and not isinstance(s[k], (str, bytes)) and len(s[k]) == n
            for s, n in zip(items, lens)
        )

    out: dict[str, Any] = {}
    for k in keys:
        name = f"samples[*][{k!r}]"
        if per_token(k):
            if items:
                vals = [_tensor(s[k], name) for s in items]
                for i, (v, n) in enumerate(zip(vals, lens)):
                    if v.shape[0] != n:
                        raise ValueError(
                            f"samples[{i}][{k!r}] has {v.shape[0]} rows but {n} tokens"
                        )
                out[k] = torch.cat(vals)
            else:
                out[k] = torch.zeros(0, dtype=torch.int64)
        else:
            vals = [s[k] for s in items]
            try:
                out[k] = torch.stack([_tensor(v, name) for v in vals])
            except (ValueError, RuntimeError):
                out[k] = vals  # strings, ragged metadata: leave as a list
    cu = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    out["cu_seqlens"] = _offsets(cu, cu_seqlens_dtype)
    if "position_ids" not in out:
        starts = np.repeat(cu[:-1], lens)
        out["position_ids"] = torch.as_tensor(np.arange(int(cu[-1])) - starts, dtype=torch.int64)
    out.setdefault("lengths", torch.as_tensor(lens, dtype=torch.int64))
    out["max_seqlen"] = int(lens.max()) if len(lens) else 0
    return out


def is_integer_dtype(dtype: Any) -> bool:
    """True for torch's integer dtypes: offsets in any other (float, complex, bool) would be
    rounded or truncated."""
    return isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )


def _offsets(cu: np.ndarray, dtype: Any) -> torch.Tensor:
    """``cu`` as an integer tensor of ``dtype``, refusing a dtype that would wrap or round it."""
    if not is_integer_dtype(dtype):
        raise ValueError(
            f"cu_seqlens_dtype must be an integer torch dtype (torch.int32 for flash-attention, "
            f"or torch.int64), got {dtype!r}"
        )
    top = int(cu[-1]) if cu.size else 0
    if top > torch.iinfo(dtype).max:
        raise ValueError(
            f"the batch holds {top} tokens, more than {dtype} offsets can hold "
            f"({torch.iinfo(dtype).max}); pass cu_seqlens_dtype=torch.int64"
        )
    return torch.as_tensor(cu, dtype=dtype)
