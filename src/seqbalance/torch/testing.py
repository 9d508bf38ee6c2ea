"""Run a function on several local processes joined by a process group.

This is what the project's own multi-process tests use, and it is handy for testing a
training loop's distributed logic on a laptop: every process gets its rank, a process group
is initialised from a fresh file store (no fixed port to collide on), every wait has a
timeout, and an exception on any rank is re-raised in the caller with that rank's
traceback. The group is gloo (CPU) by default; ``backend="nccl"`` runs one process per
visible CUDA device, each with its own device current, to test the paths that NCCL
treats differently (it all-reduces and gathers CUDA tensors only).
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_distributed"]


def _worker(
    rank: int,
    world_size: int,
    init_file: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    backend: str = "gloo",
) -> None:
    import torch

    # Each process gets one thread: the tests run several processes on a couple of cores.
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # NCCL refuses two ranks on one device
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    collective_timeout: float | None = None,
    backend: str = "gloo",
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes.

    Parameters
    ----------
    fn : callable
        A module-level function (spawned processes import it by name). A gloo process group
        is initialised before it runs and destroyed after. Its return value must be
        picklable (numpy arrays and plain Python objects are safest).
    world_size : int
        Number of processes.
    *args
        Extra picklable arguments passed to ``fn``.
    timeout : float, optional
        Seconds allowed for the whole run (and for every collective inside it, unless
        ``collective_timeout`` is given).
    collective_timeout : float, optional
        The process group's timeout: a collective that waits longer fails with a gloo
        error. Tests of "no hang" set it well below ``timeout``, so that a hang shows up as
        that error instead of as a slow run.
    backend : {"gloo", "nccl"}, optional
        The process group's backend. ``"nccl"`` needs a CUDA device per process: rank
        ``r`` runs on ``cuda:r``.

    Returns
    -------
    list
        ``fn``'s return value on each rank, indexed by rank.

    Raises
    ------
    ValueError
        If ``backend`` is neither ``"gloo"`` nor ``"nccl"``, or ``"nccl"`` is asked for
        with fewer CUDA devices than ``world_size`` (or without NCCL).
    RuntimeError
        If a rank raised (its traceback is in the message), or the run did not finish
        within ``timeout`` (the processes are then killed).
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        import torch

        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not dist.is_nccl_available() or devices < world_size:
            raise ValueError(
                f"backend='nccl' needs NCCL and one CUDA device per process: world_size="
                f"{world_size}, {devices} CUDA device(s) visible"
                + ("" if dist.is_nccl_available() else ", and this torch has no NCCL")
                + "; use backend='gloo' or a smaller world_size"
            )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="seqbalance-dist-") as tmp:
        init_file = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    r,
                    world_size,
                    init_file,
                    collective_timeout or timeout,
                    fn,
                    args,
                    results,
                    backend,
                ),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        outs: dict[int, Any] = {}
        errors: list[str] = []
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
        try:
            while len(outs) + len(errors) < world_size:
                left = (deadline - datetime.datetime.now()).total_seconds()
                try:
                    rank, ok, value = results.get(timeout=max(left, 0.01))
                except queue.Empty:
                    raise RuntimeError(
                        f"run_distributed timed out after {timeout:g}s; "
                        f"ranks {sorted(outs)} finished"
                        + (": " + "\n".join(errors) if errors else "")
                    ) from None
                if ok:
                    outs[rank] = value
                else:
                    errors.append(f"--- rank {rank} ---\n{value}")
                    # The other ranks may now wait forever on a collective: stop waiting
                    # for them once everyone still alive had a moment to report.
                    if len(errors) == 1:
                        deadline = min(
                            deadline, datetime.datetime.now() + datetime.timedelta(seconds=15)
                        )
        except RuntimeError as exc:
            if errors and "timed out" in str(exc):
                raise RuntimeError("\n".join(errors)) from None
            raise
        finally:
            for p in procs:
                p.join(timeout=5)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
        if errors:
            raise RuntimeError("\n".join(errors))
    return [outs[r] for r in range(world_size)]
