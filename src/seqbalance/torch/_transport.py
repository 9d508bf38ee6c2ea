"""Move rows of tensors between ranks as raw bytes.

Every tensor is viewed as ``uint8`` rows before it travels, so one collective carries all
keys of a batch whatever their dtypes (bool, bfloat16, complex... which some backends cannot
reduce or even send), and rows arrive bit-exact. Two paths: ``all_to_all_single`` (NCCL,
and gloo in current torch builds) and point-to-point ``isend``/``irecv`` (any backend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .._validate import check_choice

METHODS = ("auto", "all_to_all", "p2p")

# Backends on which all_to_all_single raised "not supported": use p2p from then on.
_NO_ALL_TO_ALL: set[str] = set()


@dataclass(frozen=True)
class Spec:
    """How one key travels: per-sequence rows or per-token rows, dtype and row shape."""

    level: str  # "seq": one row per sequence; "token": one row per token
    dtype: torch.dtype
    trailing: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.trailing) * torch.empty((), dtype=self.dtype).element_size()


def group_info(group: Any) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size, or a ValueError if no group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "torch.distributed is not initialised; call torch.distributed.init_process_group "
            "first (a world of one process is fine)"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def comm_device(group: Any, home: torch.device | None = None) -> torch.device:
    """The device a collective over ``group`` runs a tensor from ``home`` (default CPU) on:
    NCCL takes CUDA tensors only, so a CPU tensor goes to the current CUDA device there;
    otherwise ``home`` itself."""
    home = torch.device("cpu") if home is None else home
    if (home.type == "cpu" and dist.is_available() and dist.is_initialized()
            and dist.get_backend(group) == "nccl"):  # fmt: skip
        return torch.device("cuda", torch.cuda.current_device())
    return home


def to_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """View ``t`` (first dim ``rows``) as a ``[rows, bytes_per_row]`` uint8 tensor."""
    per_row = math.prod(t.shape[1:])
    if rows == 0 or per_row == 0:
        nbytes = per_row * t.element_size()
        return torch.empty((rows, nbytes), dtype=torch.uint8, device=t.device)
    flat = t.detach().reshape(rows, per_row)
    if flat.stride() != (per_row, 1):
        # Size-1 dims may carry any stride, which `view(uint8)` rejects: copy densely.
        flat = torch.empty((rows, per_row), dtype=t.dtype, device=t.device).copy_(flat)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def from_rows(u8: torch.Tensor, spec: Spec) -> torch.Tensor:
    """Inverse of :func:`to_rows` for a freshly allocated ``[rows, bytes]`` uint8 tensor."""
    rows = u8.shape[0]
    if rows == 0 or spec.row_bytes == 0:
        return torch.empty((rows, *spec.trailing), dtype=spec.dtype, device=u8.device)
    return u8.contiguous().view(spec.dtype).reshape(rows, *spec.trailing)


def ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + n)`` for each pair, vectorised (int64)."""
    starts = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    before = np.cumsum(lens) - lens
    return np.repeat(starts - before, lens) + np.arange(total, dtype=np.int64)


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x), dtype=np.int64)
    if len(x):
        np.cumsum(x[:-1], out=out[1:])
    return out


def move(
    rows: dict[str, torch.Tensor],
    specs: dict[str, Spec],
    src: Sequence[np.ndarray],
    dst: Sequence[np.ndarray],
    lengths: np.ndarray,
    *,
    group: Any,
    method: str,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Move items from placement ``src`` to placement ``dst``.

    ``src[r]`` / ``dst[r]`` list the global item ids rank ``r`` holds, in local order, before
    and after the move; both must be permutations of ``0..N-1`` split over ranks and are the
    same on every rank. ``rows[key]`` is this rank's ``[rows, bytes]`` uint8 view of the key
    (one row per item for ``seq`` keys, per token for ``token`` keys, items of ``lengths``
    tokens). Returns the same for the items this rank holds under ``dst``.
    """
    method = check_choice(method, "method", METHODS)
    me, world = dist.get_rank(group), dist.get_world_size(group)
    n = int(lengths.shape[0])
    src_rank = np.empty(n, dtype=np.int64)
    src_pos = np.empty(n, dtype=np.int64)
    for r, ids in enumerate(src):
        src_rank[ids] = r
        src_pos[ids] = np.arange(len(ids), dtype=np.int64)
    my_src_lens = lengths[src[me]]
    my_token_start = _exclusive_cumsum(my_src_lens)
    keys = sorted(specs)

    # What this rank sends to each destination, in the destination's order.
    chunks: list[torch.Tensor] = []
    for d in range(world):
        ids = dst[d][src_rank[dst[d]] == me]
        pos = src_pos[ids]
        parts = []
        for k in keys:
            if specs[k].level == "seq":
                idx = pos
            else:
                idx = ranges(my_token_start[pos], lengths[ids])
            if len(idx):
                sel = torch.as_tensor(idx, dtype=torch.int64, device=device)
                parts.append(rows[k].index_select(0, sel).reshape(-1))
        chunks.append(
            torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        )

    # What this rank receives from each source; items arrive grouped by source.
    mine = dst[me]
    by_source = np.argsort(src_rank[mine], kind="stable")  # arrival order -> dst position
    arrival_ids = mine[by_source]
    arrival_rank = src_rank[arrival_ids]
    recv_sizes: list[int] = []
    seg_sizes: list[list[int]] = []  # [source][key] bytes
    for s in range(world):
        ids = arrival_ids[arrival_rank == s]
        sizes = []
        for k in keys:
            count = len(ids) if specs[k].level == "seq" else int(lengths[ids].sum())
            sizes.append(count * specs[k].row_bytes)
        seg_sizes.append(sizes)
        recv_sizes.append(sum(sizes))

    received = _exchange(chunks, recv_sizes, group=group, method=method, device=device)

    # Reassemble each key in arrival order, then permute into this rank's dst order.
    inv = np.empty(len(mine), dtype=np.int64)
    inv[by_source] = np.arange(len(mine), dtype=np.int64)
    arrival_lens = lengths[arrival_ids]
    arrival_start = _exclusive_cumsum(arrival_lens)
    out: dict[str, torch.Tensor] = {}
    for ki, k in enumerate(keys):
        spec = specs[k]
        pieces = []
        for s in range(world):
            off = sum(seg_sizes[s][:ki])
            pieces.append(received[s][off : off + seg_sizes[s][ki]])
        flat = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.uint8, device=device)
        if spec.level == "seq":
            idx = inv
        else:
            idx = ranges(arrival_start[inv], arrival_lens[inv])
        nrows = len(idx)
        u8 = flat.reshape(nrows, spec.row_bytes) if spec.row_bytes else flat.new_empty((nrows, 0))
        sel = torch.as_tensor(idx, dtype=torch.int64, device=device)
        out[k] = u8.index_select(0, sel)  # fresh storage, so from_rows can re-view it
    return out


def _exchange(
    chunks: list[torch.Tensor],
    recv_sizes: list[int],
    *,
    group: Any,
    method: str,
    device: torch.device,
) -> list[torch.Tensor]:
    """Send ``chunks[d]`` to rank ``d``; return the ``recv_sizes[s]`` bytes from each ``s``."""
    backend = str(dist.get_backend(group))
    if method == "all_to_all" or (method == "auto" and backend not in _NO_ALL_TO_ALL):
        try:
            return _all_to_all(chunks, recv_sizes, group=group, device=device)
        except (RuntimeError, NotImplementedError) as exc:
            msg = str(exc).lower()
            if method != "auto" or not ("support" in msg or "implement" in msg):
                raise
            _NO_ALL_TO_ALL.add(backend)
    return _p2p(chunks, recv_sizes, group=group, device=device)


def _all_to_all(
    chunks: list[torch.Tensor], recv_sizes: list[int], *, group: Any, device: torch.device
) -> list[torch.Tensor]:
    send = torch.cat(chunks)
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=device)
    dist.all_to_all_single(
        recv,
        send,
        output_split_sizes=list(recv_sizes),
        input_split_sizes=[int(c.numel()) for c in chunks],
        group=group,
    )
    return list(torch.split(recv, list(recv_sizes)))


def _p2p(
    chunks: list[torch.Tensor], recv_sizes: list[int], *, group: Any, device: torch.device
) -> list[torch.Tensor]:
    me, world = dist.get_rank(group), dist.get_world_size(group)
    bufs = [torch.empty(size, dtype=torch.uint8, device=device) for size in recv_sizes]
    ops = []
    for peer in range(world):
        if peer == me:
            continue
        peer_global = peer if group is None else dist.get_global_rank(group, peer)
        if chunks[peer].numel():
            ops.append(dist.P2POp(dist.isend, chunks[peer].contiguous(), peer_global, group))
        if recv_sizes[peer]:
            ops.append(dist.P2POp(dist.irecv, bufs[peer], peer_global, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    bufs[me] = chunks[me].clone()
    return bufs
