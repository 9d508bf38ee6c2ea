"""Loss normalisation for balanced micro-batches.

Balancing changes which sequences share a rank and a micro-batch, so a token mean taken per
micro-batch or per rank weights tokens unequally and no longer equals the mean over the
global batch. The fix: sum token losses locally and divide by the *global* token count.

Under DDP (and FSDP), gradients are averaged over the ``W`` data-parallel ranks, so each
rank's loss must also be multiplied by ``W``::

    count = global_token_count(mask.sum())                 # same on every rank
    loss = token_losses[mask].sum() * world_size / count   # per micro-batch, then backward
    # summed over micro-batches and averaged over ranks, the gradient equals that of
    # (all token losses).sum() / count, the single-process token mean.

:func:`token_mean_loss` does that scaling.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.distributed as dist

from .._validate import check_bool, check_positive_int
from ._transport import comm_device

__all__ = ["global_token_count", "token_mean_loss"]


def global_token_count(local_count: Any, group: Any = None) -> torch.Tensor:
    """Sum a token count over the ranks of ``group`` (collective: every rank must call it).

    Parameters
    ----------
    local_count : int or tensor
        Tokens that enter the loss on this rank (over all its micro-batches of the step).
    group : ProcessGroup, optional
        Data-parallel group (default: the world). Without an initialised process group the
        local count is returned.

    Returns
    -------
    torch.Tensor
        0-d int64 tensor, identical on every rank (on the device of ``local_count`` when it
        is a tensor, else on CPU; under NCCL the sum itself runs on the current CUDA
        device).

    Raises
    ------
    ValueError
        On every rank, when ``local_count`` is not a non-negative integer count on some
        rank (without a process group: when it is not one here).

    Examples
    --------
    >>> int(global_token_count(7))  # no process group: the local count
    7
    """
    try:
        count = _local_count(local_count)
        error: ValueError | None = None
    except ValueError as exc:
        count, error = torch.zeros((), dtype=torch.int64), exc
    except Exception as exc:  # anything int() or a tensor may raise (a masked value...)
        count = torch.zeros((), dtype=torch.int64)
        error = ValueError(f"local_count {local_count!r} is not a usable count: {exc}")
        error.__cause__ = exc
    # Without a process group, or on a rank outside ``group`` (where torch's collectives
    # do nothing), the local count is the answer.
    if not (dist.is_available() and dist.is_initialized()) or (
        group is not None and dist.get_rank(group) < 0
    ):
        if error is not None:
            raise error
        return count
    # The count and a failure flag travel in one all-reduce: a rank whose count is invalid
    # must not raise before it, or every other rank would wait there until the timeout.
    home = local_count.device if isinstance(local_count, torch.Tensor) else torch.device("cpu")
    flag = torch.tensor(int(error is not None), dtype=torch.int64, device=home)
    packed = torch.stack([count.to(home), flag])
    packed = packed.to(comm_device(group, home))  # NCCL: a CPU count goes to CUDA and back
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    bad = int(packed[1])
    if bad:
        mine = f"this rank: {error}" if error is not None else "this rank's count is valid"
        raise ValueError(
            f"global_token_count: local_count is invalid on {bad} of "
            f"{dist.get_world_size(group)} ranks ({mine}); raised on every rank"
        ) from error
    return packed[0].to(home)


def _local_count(local_count: Any) -> torch.Tensor:
    """This rank's count as a 0-d int64 tensor on its own device; ValueError if invalid."""
    if isinstance(local_count, torch.Tensor):
        if local_count.is_floating_point() or local_count.is_complex():
            raise ValueError(
                f"local_count must be an integer count, got a {local_count.dtype} tensor"
            )
        count = local_count.detach().to(torch.int64).sum()
    else:
        try:
            count = torch.tensor(int(local_count), dtype=torch.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"local_count must be an integer, got {local_count!r}") from None
        if int(count) != local_count:  # an int: compares with 2.5, Fraction, 0-d arrays
            raise ValueError(f"local_count must be a whole number, got {local_count!r}")
    if int(count) < 0:
        raise ValueError(f"local_count must be >= 0, got {int(count)}")
    return count


def token_mean_loss(
    loss_sum: torch.Tensor,
    global_count: Any,
    *,
    world_size: int | None = None,
    averaged_gradients: bool = True,
    group: Any = None,
) -> torch.Tensor:
    """Scale a local sum of token losses so gradients match the global token mean.

    Parameters
    ----------
    loss_sum : tensor
        Sum of token losses of one micro-batch (or of all of a rank's micro-batches).
    global_count : int or tensor
        Tokens in the whole global batch, e.g. from :func:`global_token_count`.
    world_size : int, optional
        Number of data-parallel ranks whose gradients are averaged (default: the size of
        ``group``, 1 without a process group).
    averaged_gradients : bool, optional
        True for DDP/FSDP, which average gradients over ranks: the loss is multiplied by
        ``world_size`` to undo that average. False when gradients are summed.
    group : ProcessGroup, optional
        The data-parallel group (default: the whole world), as for
        :func:`global_token_count`; gives the default ``world_size``.

    Returns
    -------
    tensor
        ``loss_sum * world_size / global_count`` (or ``loss_sum / global_count``). Its sum
        over micro-batches and ranks, divided by ``world_size``, is the global token mean.

    Examples
    --------
    >>> float(token_mean_loss(torch.tensor(6.0), 4, world_size=2))
    3.0
    """
    count = _as_count(global_count)
    if world_size is None:
        initialised = dist.is_available() and dist.is_initialized()
        world_size = dist.get_world_size(group) if initialised else 1
    world_size = check_positive_int(world_size, "world_size")
    scale = world_size if check_bool(averaged_gradients, "averaged_gradients") else 1
    # In at least float32: a count above 65,504 is inf in float16, which made the loss 0.
    wide = torch.promote_types(loss_sum.dtype, torch.float32)
    out = loss_sum.to(wide) * scale / count.to(device=loss_sum.device, dtype=wide)
    return out.to(loss_sum.dtype) if loss_sum.is_floating_point() else out


def _as_count(global_count: Any) -> torch.Tensor:
    """``global_count`` as a tensor holding a whole number >= 1, or a ValueError.

    A wrong count (0, negative, fractional, NaN) would silently scale every gradient.
    """
    count = global_count
    if isinstance(count, torch.Tensor):
        if count.numel() != 1 or count.dtype == torch.bool or count.is_complex():
            raise ValueError(
                "global_count must be one whole number of tokens, got a tensor of shape "
                f"{tuple(count.shape)} and dtype {count.dtype}"
            )
        value: Any = count.item()
    else:
        if isinstance(count, bool) or not isinstance(count, numbers.Real):
            raise ValueError(f"global_count must be a whole number of tokens, got {count!r}")
        value = count
        try:
            count = torch.tensor(float(count) if isinstance(count, float) else int(count))  # type: ignore[call-overload]  # a Real
        except (ValueError, OverflowError, RuntimeError):
            raise ValueError(
                f"global_count must be a whole number of tokens below 2**63, got {count!r}"
            ) from None
    try:
        whole = float(value) == int(value)
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(f"global_count must be a whole number of tokens, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"global_count must be >= 1, got {int(value)}")
    return count
