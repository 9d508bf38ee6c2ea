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


def _rows(value: Any) -> int | None:
    """First-dimension size of a per-token candidate, or None for scalars and strings
    (a 0-d tensor or array has ``__len__`` but ``len`` raises on it)."""
    if isinstance(value, (str, bytes, Mapping)):
        return None
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    return len(value) if hasattr(value, "__len__") else None


def check_token_keys(token_keys: Any) -> None:
    """Refuse a string: ``key in "input_ids"`` would match substrings ("ids", "put")."""
    if isinstance(token_keys, (str, bytes)):
        raise ValueError(
            f"token_keys must be a collection of key names, got the string {token_keys!r}; "
            f"write token_keys=[{token_keys!r}]"
        )


#: Keys pack_collate writes itself; a sample's own would be overwritten.
_WRITTEN = ("cu_seqlens", "max_seqlen")


def pack_collate(
    samples: Sequence[Any],
    *,
    token_key: str = "input_ids",
    token_keys: Collection[str] | None = None,
    cu_seqlens_dtype: torch.dtype = torch.int32,
    template: Any = None,
) -> dict[str, Any]:
    """Pack samples into one concatenated row, varlen-attention style.

    Parameters
    ----------
    samples : sequence
        Items from the dataset: dicts (``token_key`` holds the token ids) or bare sequences
        of token ids. May be empty (a rank's empty micro-batch), which gives empty
        ``token_key``, ``cu_seqlens``, ``position_ids`` and ``lengths`` tensors and
        ``max_seqlen`` 0, and the other keys only with ``template``.
    token_key : str, optional
        Key whose length is the sample's length.
    token_keys : collection of str, optional
        Keys concatenated along tokens. Default: ``token_key`` and every key whose value has
        ``len == len(sample[token_key])`` in every sample of this batch. Other tensor-like
        values are stacked (one row per sample); anything else is returned as a list.
        A sample's ``position_ids`` are always per token. Must name keys the samples have
        (a string is refused: write ``["labels"]``).
    cu_seqlens_dtype : torch.dtype, optional
        dtype of ``cu_seqlens`` (int32 is what flash-attention kernels take).
    template : sample, optional
        A sample that shows the dataset's keys, used only when ``samples`` is empty: the
        result then has every key a batch of it would have, with zero rows and the same
        dtypes and trailing shapes (lists for list fields). With
        ``functools.partial(pack_collate, template=dataset[0])`` as the ``collate_fn``, a
        rank's empty micro-batch (the sampler's ``[]``) has the keys the training loop reads.

    Returns
    -------
    dict
        The concatenated token keys, plus ``cu_seqlens`` ([n + 1], starting at 0),
        ``position_ids`` (0..L-1 within each sample, int64, unless a sample provides them),
        ``lengths`` ([n], int64) and ``max_seqlen`` (int).

    Raises
    ------
    ValueError
        Samples with other keys than the first, non-1-D token ids, per-token values whose
        rows differ from the tokens, a sample key ``cu_seqlens`` or ``max_seqlen`` (they
        would be overwritten) or ``lengths`` other than the token counts.

    Examples
    --------
    >>> b = pack_collate([[5, 6, 7], [8, 9]])
    >>> b["input_ids"].tolist(), b["cu_seqlens"].tolist(), b["position_ids"].tolist()
    ([5, 6, 7, 8, 9], [0, 3, 5], [0, 1, 2, 0, 1])
    """
    check_token_keys(token_keys)
    if template is not None and len(samples) == 0:
        one = pack_collate([template], token_key=token_key, token_keys=token_keys,
                           cu_seqlens_dtype=cu_seqlens_dtype)  # fmt: skip
        empty: dict[str, Any] = {
            k: v[:0] if isinstance(v, torch.Tensor) else [] for k, v in one.items()
        }
        empty["cu_seqlens"] = one["cu_seqlens"][:1]  # [0]
        empty["max_seqlen"] = 0
        return empty
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

    for k in _WRITTEN:
        if k in keys:
            raise ValueError(
                f"samples have a {k!r} key, which pack_collate writes itself (it would be "
                "overwritten); rename or drop that key"
            )
    if token_keys is not None and items:
        unknown = sorted(str(k) for k in token_keys if k not in keys)
        if unknown:
            raise ValueError(
                f"token_keys names {unknown}, which the samples do not have (keys: {keys}); "
                "fix the names"
            )

    def per_token(k: str) -> bool:
        if k in (token_key, "position_ids"):  # positions given by samples are per token
            return True
        if token_keys is not None:
            return k in token_keys
        return all(_rows(s[k]) == n for s, n in zip(items, lens))

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
                # An empty list becomes a float32 tensor, which torch.cat would promote
                # the other samples' ids to: leave such empty pieces out.
                full = [
                    v for v, s in zip(vals, items)
                    if v.shape[0] or isinstance(s[k], (torch.Tensor, np.ndarray))
                ]  # fmt: skip
                out[k] = torch.cat(full) if full else torch.zeros(0, dtype=torch.int64)
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
    counts = torch.as_tensor(lens, dtype=torch.int64)
    if "lengths" in out:  # the samples' own: kept, as long as they are the token counts
        given = out["lengths"]
        if not (
            isinstance(given, torch.Tensor)
            and tuple(given.shape) == (len(lens),)
            and bool((given == counts).all())
        ):
            shown = given.tolist() if isinstance(given, torch.Tensor) else given
            raise ValueError(
                f"samples have a 'lengths' key ({shown}) that is not their token counts "
                f"({lens.tolist()}); pack_collate returns the token counts as 'lengths': "
                "rename that key"
            )
    out["lengths"] = counts
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
