"""Train a small decoder-only transformer with DDP (gloo, CPU) on RL-math-like lengths.

Two strategies run the same global batches from the same initial weights:

- ``naive``: each rank keeps the contiguous slice of rollouts it produced and cuts it into
  micro-batches of at most ``--max-tokens`` tokens, in order. Ranks with hard prompts do
  more work and everybody waits for them at the gradient all-reduce.
- ``seqbalance``: the ranks call :func:`seqbalance.torch.rebalance` (lengths all-gathered,
  one plan computed everywhere, sequences moved with one all-to-all), then run the plan's
  micro-batches. The rebalance is inside the timed step.

Both normalise the loss by the global token count (:func:`global_token_count`), so they
compute the same global token-mean loss. The script checks that at step 1 (same data,
same weights), prints the median and mean step time of each strategy, and ends with
``speedup: X.XX``: naive mean step time / seqbalance mean step time, i.e. the ratio of
training throughputs (step sizes vary ~10x across steps, so a ratio of medians would hinge
on whichever step lands in the middle). Each step runs ``--repeats`` times per
strategy (training on the batch again; both strategies alike) and its fastest run counts,
which filters out bursts of other processes on a shared machine.

Run::

    python examples/ddp_train.py            # ~40 s on 2 idle CPU cores
    python examples/ddp_train.py --quick    # a few seconds: checks it works end to end
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from seqbalance import workloads
from seqbalance.costs import QuadraticCost, TimingRecorder, TokenCost, fit_cost
from seqbalance.torch import (
    MicroBatchTimer,
    Rebalancer,
    global_token_count,
    rebalance,
    token_mean_loss,
)

VOCAB = 256


# ---- model ---------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
        t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(t, 3, self.heads, d // self.heads)
        # Attention stays inside each packed sequence: one causal SDPA call per sequence,
        # so a sequence of L tokens really costs O(L^2).
        outs = []
        for s, e in spans:
            q, k, v = qkv[s:e].permute(1, 2, 0, 3)  # each [heads, L, head_dim]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            outs.append(o.transpose(0, 1).reshape(e - s, d))
        x = x + self.proj(torch.cat(outs))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        cu = cu_seqlens.tolist()
        spans = [(cu[i], cu[i + 1]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]
        lens = torch.as_tensor(np.diff(cu), dtype=torch.int64)
        starts = torch.repeat_interleave(torch.as_tensor(cu[:-1], dtype=torch.int64), lens)
        pos = torch.arange(input_ids.shape[0]) - starts
        x = self.tok(input_ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x, spans)
        return self.head(self.ln(x))


def token_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor, cu_seqlens: torch.Tensor):
    """Sum of next-token cross-entropies inside each sequence, and how many tokens it has."""
    target = torch.roll(input_ids, -1).clone()
    target[cu_seqlens[1:].long() - 1] = -100  # a sequence's last token has no target
    loss = F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")
    return loss, int((target != -100).sum())


# Micro-batch shapes to time: totals and sequence counts vary independently, so the fit can
# tell the per-token, per-sequence, quadratic and per-micro-batch terms apart.
CALIBRATION = (
    [16] * 8, [16] * 48, [64] * 4, [64] * 16, [128] * 8, [256], [256] * 3, [512], [768],
    [1024], [1536], [2048], [32] * 8 + [512],
)


def calibrate(model: nn.Module, max_tokens: int, reps: int = 2) -> QuadraticCost:
    """Time forward+backward of a few micro-batch shapes and fit ``a + b·L + c·L²`` per
    sequence (plus a per-micro-batch constant) with :func:`seqbalance.costs.fit_cost`.

    FLOP counts would under-weight attention here: on a CPU the per-sequence attention
    kernels run several times less efficiently than the big matmuls, so we measure."""
    shapes = [[min(L, max_tokens) for L in mb] for mb in CALIBRATION]
    shapes = [mb for mb in shapes if sum(mb) <= max_tokens]
    seconds = []
    for mb in shapes:
        ids = torch.randint(0, VOCAB, (sum(mb),))
        cu = torch.as_tensor(np.concatenate([[0], np.cumsum(mb)]), dtype=torch.int32)
        best = math.inf
        for _ in range(reps + 1):  # the first rep warms up
            t0 = time.perf_counter()
            loss, _ = token_loss_sum(model(ids, cu), ids, cu)
            loss.backward()
            best = min(best, time.perf_counter() - t0)
        seconds.append(best)
    model.zero_grad(set_to_none=True)
    return fit_cost(shapes, seconds)


# ---- data ------------------------------------------------------------------------------------
def step_lengths(args: argparse.Namespace) -> np.ndarray:
    """Lengths of every global batch, [steps, batch]: rl-math scaled down by --scale."""
    steps = getattr(args, "total_steps", args.steps + args.warmup)
    full = workloads.load("rl-math", args.batch * steps, seed=args.seed).lengths
    scaled = np.maximum(2, np.round(full / args.scale)).astype(np.int64)
    return np.minimum(scaled, args.max_tokens).reshape(steps, args.batch)


def sequence_tokens(step: int, index: int, length: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, step, index])
    return torch.from_numpy(rng.integers(0, VOCAB, size=length, dtype=np.int64))


def local_rollouts(step: int, lengths: np.ndarray, rank: int, world: int, seed: int) -> dict:
    """The contiguous slice of the step's batch that rank `rank` produced, packed."""
    per = -(-len(lengths) // world)
    ids = range(rank * per, min(len(lengths), (rank + 1) * per))
    toks = [sequence_tokens(step, i, int(lengths[i]), seed) for i in ids]
    cu = np.concatenate([[0], np.cumsum([len(t) for t in toks])])
    return {
        "input_ids": torch.cat(toks) if toks else torch.zeros(0, dtype=torch.int64),
        "cu_seqlens": torch.as_tensor(cu, dtype=torch.int32),
    }


def naive_micro_batches(batch: dict, max_tokens: int) -> list[dict]:
    """Cut the local batch in order into micro-batches of at most max_tokens tokens."""
    cu = batch["cu_seqlens"].tolist()
    groups: list[list[int]] = [[]]
    used = 0
    for i in range(len(cu) - 1):
        n = cu[i + 1] - cu[i]
        if groups[-1] and used + n > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    out = []
    for g in groups:
        s, e = cu[g[0]], cu[g[-1] + 1]
        sub = np.asarray([cu[i] for i in g] + [e]) - s
        out.append({"input_ids": batch["input_ids"][s:e],
                    "cu_seqlens": torch.as_tensor(sub, dtype=torch.int32)})
    return out


# ---- training --------------------------------------------------------------------------------
def train_step(ddp: DDP, opt: torch.optim.Optimizer, micro_batches: list[dict], timer=None,
               every_micro_batch: bool = False):
    """One optimizer step over this rank's micro-batches; returns the global token-mean loss.

    With a ``MicroBatchTimer``, each micro-batch's forward+backward is timed. Unless
    ``every_micro_batch``, every micro-batch then runs under ``no_sync()`` and the
    gradients are all-reduced (and averaged, as DDP does) after the last one, outside the
    timed regions: otherwise the last micro-batch's backward would also hold DDP's bucket
    copies and the wait for the slowest rank, which are no part of what the cost model
    predicts.

    ``every_micro_batch``: no ``no_sync()`` at all, so DDP all-reduces after every
    micro-batch's backward and the ranks run the micro-batches in lockstep, as under
    FSDP / ZeRO-3 (the planner's ``sync="fsdp"``). Still the same gradients: what was
    already averaged is equal on every rank and stays so. The timed region then ends with
    DDP's wait for the other rank, which the default thread clock does not count."""
    local_count = sum(
        int(mb["cu_seqlens"][-1]) - (len(mb["cu_seqlens"]) - 1) for mb in micro_batches
    )
    count = global_token_count(local_count)
    opt.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64)
    for j, mb in enumerate(micro_batches):
        last = j == len(micro_batches) - 1 and timer is None
        ctx = ddp.no_sync() if not (last or every_micro_batch) else _nullcontext()
        with ctx, (timer.time() if timer is not None else _nullcontext()):
            logits = ddp(mb["input_ids"], mb["cu_seqlens"])
            s, _ = token_loss_sum(logits, mb["input_ids"], mb["cu_seqlens"])
            token_mean_loss(s, count).backward()
        loss_sum += s.detach().double()
    if timer is not None and not every_micro_batch:
        grads = [p.grad for p in ddp.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    opt.step()
    dist.all_reduce(loss_sum)
    return float(loss_sum / count.double())


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def make_model(args: argparse.Namespace) -> tuple[DDP, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)
    model = TinyLM(args.dim, args.heads, args.layers, args.max_tokens)
    ddp = DDP(model)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05)


def worker(rank: int, world: int, init_file: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    if args.adapt:
        return adapt_worker(rank, world, args)
    lengths = step_lengths(args)
    models = {name: make_model(args) for name in ("naive", "seqbalance")}
    # Every rank must plan with the same cost model: rank 0 measures, then broadcasts it.
    box: list = [None]
    if args.cost == "fit" and rank == 0:
        fitted = calibrate(models["naive"][0].module, args.max_tokens)
        box[0] = (fitted.per_token, fitted.per_token_sq, fitted.per_sequence,
                  fitted.per_microbatch)
    dist.broadcast_object_list(box, src=0)
    cost = QuadraticCost(*box[0]) if box[0] is not None else None
    if rank == 0 and cost is not None:
        print(f"fitted cost per sequence: {cost.per_sequence:.2e} + {cost.per_token:.2e}*L + "
              f"{cost.per_token_sq:.2e}*L^2 s, per micro-batch {cost.per_microbatch:.2e} s")
    times: dict[str, list[float]] = {name: [] for name in models}
    cpus: dict[str, list[float]] = {name: [] for name in models}
    first_loss: dict[str, float] = {}
    first_grad: dict[str, torch.Tensor] = {}
    for step in range(args.warmup + args.steps):
        batch = local_rollouts(step, lengths[step], rank, world, args.seed)
        best = {name: (math.inf, math.inf) for name in models}
        for rep in range(args.repeats):
            # Alternate which strategy goes first, so drift in machine speed hits both alike.
            first = ("naive", "seqbalance") if (step + rep) % 2 == 0 else ("seqbalance", "naive")
            for name in first:
                ddp, opt = models[name]
                dist.barrier()
                t0, c0 = time.perf_counter(), time.thread_time()
                if name == "naive":
                    mbs = naive_micro_batches(batch, args.max_tokens)
                else:
                    mbs, _ = rebalance(batch, max_tokens=args.max_tokens, cost=cost, sync="ddp")
                loss = train_step(ddp, opt, mbs)
                cpu = time.thread_time() - c0  # this rank's own compute (waits do not count)
                dist.barrier()
                elapsed = time.perf_counter() - t0
                if step == 0 and rep == 0:
                    first_loss[name] = loss
                    first_grad[name] = torch.cat(
                        [p.grad.reshape(-1) for p in ddp.parameters() if p.grad is not None]
                    )
                if args.verbose:
                    print(f"rank {rank} step {step} {name:>10}: wall {elapsed * 1e3:6.0f} ms, "
                          f"cpu {cpu * 1e3:6.0f} ms, {len(mbs)} micro-batches", flush=True)
                best[name] = min(best[name], (elapsed, cpu))
        if step >= args.warmup:
            for name, (elapsed, cpu) in best.items():
                times[name].append(elapsed)
                cpus[name].append(cpu)
    # Busiest rank's CPU time per step: what the step would take on idle, dedicated cores.
    gathered: list = [None] * world
    dist.all_gather_object(gathered, cpus)
    busiest = {name: np.max([g[name] for g in gathered], axis=0) for name in cpus}
    # Free the DDP wrappers (and their communication hooks) before the group goes away;
    # tearing them down at interpreter exit instead can abort the process.
    del models, ddp, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    a, b = first_loss["naive"], first_loss["seqbalance"]
    rel = abs(a - b) / abs(a)
    ga, gb = first_grad["naive"], first_grad["seqbalance"]
    grad_rel = float((ga - gb).norm() / ga.norm())
    print(f"step-1 global token-mean loss: naive {a:.8f}  seqbalance {b:.8f}  rel diff {rel:.1e}")
    print(f"step-1 gradient rel diff: {grad_rel:.1e}")
    if not (rel <= 1e-5 and grad_rel <= 1e-4):
        raise SystemExit("loss check FAILED: the strategies do not compute the same loss")
    print("loss check: ok")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    mean = {name: statistics.fmean(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:>10}: median step {med[name] * 1e3:7.1f} ms, mean {mean[name] * 1e3:7.1f} ms"
              f"  (steps: {', '.join(f'{t * 1e3:.0f}' for t in ts)})")
    cpu_mean = {name: float(np.mean(v)) for name, v in busiest.items()}
    print(f"busiest rank's CPU time per step (mean): naive {cpu_mean['naive'] * 1e3:.1f} ms, "
          f"seqbalance {cpu_mean['seqbalance'] * 1e3:.1f} ms, "
          f"ratio {cpu_mean['naive'] / cpu_mean['seqbalance']:.2f}")
    # Speedup in training throughput: total (= mean) step time. Step sizes vary ~10x from
    # step to step, so a ratio of medians hinges on which step lands in the middle.
    print(f"speedup: {mean['naive'] / mean['seqbalance']:.2f}")


# ---- --adapt: learn the cost from the run ---------------------------------------------------
def _log(fh, record: dict) -> None:
    if fh is not None:
        fh.write(json.dumps(record, allow_nan=False, default=float) + "\n")
        fh.flush()


def _check_loss(first_loss: dict, first_grad: dict, a_name: str, b_name: str) -> None:
    a, b = first_loss[a_name], first_loss[b_name]
    rel = abs(a - b) / abs(a)
    ga, gb = first_grad[a_name], first_grad[b_name]
    grad_rel = float((ga - gb).norm() / ga.norm())
    print(f"step-1 global token-mean loss: {a_name} {a:.8f}  {b_name} {b:.8f}  "
          f"rel diff {rel:.1e}")
    print(f"step-1 gradient rel diff: {grad_rel:.1e}")
    if not (rel <= 1e-5 and grad_rel <= 1e-4):
        raise SystemExit("loss check FAILED: the strategies do not compute the same loss")
    print("loss check: ok")


def adapt_worker(rank: int, world: int, args: argparse.Namespace) -> None:
    """Start from TokenCost, time every micro-batch, refit, then race both costs.

    Steps ``0..warmup-1`` warm up (not recorded); the next ``--refit-after`` steps train
    with token-balanced plans while a MicroBatchTimer records every micro-batch; then every
    rank refits the cost from the same gathered records (so all get the same cost) and the
    "refit" strategy switches to it. The token-cost strategy gets the same weights, and
    the next ``--steps`` steps run both, alternately, best of ``--repeats``; every
    ``--refit-every`` steps the refit strategy refits on its rolling window. ``--sync``
    says when ranks wait for each other (every micro-batch with "fsdp", once per step
    with "ddp"): both the plans and the reports assume it.
    """
    lengths = step_lengths(args)
    ddp_a, opt_a = make_model(args)     # "refit": token plans first, then the fitted cost
    ddp_t, opt_t = make_model(args)     # "tokens": token plans throughout
    names = ("tokens", "refit")
    # Each recorder's window holds the last --window timed runs (of one strategy).
    rec = {name: TimingRecorder(TokenCost(), sync=args.sync, window=args.window)
           for name in names}
    timer = {name: MicroBatchTimer(rec[name], clock=args.clock, device="cpu") for name in names}
    if args.save_timings and rank == 0:
        # Every token-plan record goes to disk as its step ends (for `seqbalance refit`),
        # beyond the recorder's window; the gathered records are the same on every rank.
        open(args.save_timings, "w").close()  # a new run replaces the file, as --log does
        rec["tokens"].stream_to(args.save_timings)
    bal = {name: Rebalancer(args.max_tokens, cost=TokenCost(), sync=args.sync) for name in names}
    models = {"refit": (ddp_a, opt_a), "tokens": (ddp_t, opt_t)}
    log = open(args.log, "w", encoding="utf-8") if args.log and rank == 0 else None
    learn = args.warmup + args.refit_after
    # Race records of the refit strategy with the prediction of the cost that planned them.
    judged: list[tuple[int, int, int, float, float]] = []
    every = {name: [] for name in names}  # all race records, for the final reports
    # Step time on the timer's clock (CPU time with --clock thread), for its overhead.
    clocked = {name: 0.0 for name in names}

    def run(name: str, step: int, batch: dict) -> tuple[float, float, Any]:
        ddp, opt = models[name]
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        mbs, handle = bal[name](batch)
        loss = train_step(ddp, opt, mbs, timer[name], every_micro_batch=args.sync == "fsdp")
        records = timer[name].end_step(handle)
        clocked[name] += time.thread_time() - c0 if args.clock == "thread" else 0.0
        dist.barrier()
        elapsed = time.perf_counter() - t0
        clocked[name] += elapsed if args.clock == "wall" else 0.0
        if step >= learn:
            every[name] += records
            if name == "refit":
                cost = bal[name].cost
                judged.extend((step, r.rank, r.slot, r.seconds, cost.microbatch_cost(r.lengths))
                              for r in records)
        return elapsed, loss, handle.plan

    def metrics(name: str, plan: Any) -> dict:
        return {**plan.metrics(), **rec[name].metrics()}

    # 1. learn: token-cost plans, every micro-batch timed.
    learn_times = []
    for step in range(learn):
        batch = local_rollouts(step, lengths[step], rank, world, args.seed)
        elapsed, _, plan = run("refit", step, batch)
        if step < args.warmup:
            rec["refit"].clear()  # warm-up steps time allocation and lazy init
            continue
        learn_times.append(elapsed)
        if rank == 0:
            _log(log, {"step": step, "phase": "learn", "strategy": "refit",
                       "step_time": elapsed, **metrics("refit", plan)})
    before = rec["refit"].report()
    # 2. refit: the same records on every rank, so every rank gets the same cost.
    cost = rec["refit"].refit()
    bal["refit"].set_cost(cost)
    ddp_t.module.load_state_dict(ddp_a.module.state_dict())  # race from the same weights
    if rank == 0:
        print(f"token-cost plans, {len(learn_times)} steps: measured imbalance "
              f"{before.imbalance_measured:.1%}, step time "
              f"{statistics.fmean(learn_times) * 1e3:.0f} ms, TokenCost shape error "
              f"{before.model_error:.1%} (after the best scale)")
        print(f"refit on {before.samples} micro-batches: {_describe_cost(cost)}")
    # 3. race: both strategies on the same batches, alternating, best of --repeats.
    times: dict[str, list[float]] = {name: [] for name in names}
    first_loss: dict[str, float] = {}
    first_grad: dict[str, torch.Tensor] = {}
    race_plans: dict[str, list] = {name: [] for name in names}
    overhead_from = {name: (timer[name].overhead, timer[name].gather_overhead)
                     for name in names}
    clocked_from = dict(clocked)
    for step in range(learn, learn + args.steps):
        batch = local_rollouts(step, lengths[step], rank, world, args.seed)
        best = {name: math.inf for name in names}
        for rep in range(args.repeats):
            order = names if (step + rep) % 2 == 0 else names[::-1]
            for name in order:
                elapsed, loss, plan = run(name, step, batch)
                if step == learn and rep == 0:
                    first_loss[name] = loss
                    first_grad[name] = torch.cat([p.grad.reshape(-1)
                                                  for p in models[name][0].parameters()
                                                  if p.grad is not None])
                best[name] = min(best[name], elapsed)
                if rep == 0:
                    race_plans[name].append(plan)
                if rank == 0:
                    _log(log, {"step": step, "rep": rep, "phase": "race", "strategy": name,
                               "step_time": elapsed, **metrics(name, plan)})
        for name in names:
            times[name].append(best[name])
        done = step - learn + 1
        if args.refit_every and done % args.refit_every == 0 and done < args.steps:
            bal["refit"].set_cost(rec["refit"].refit())  # rolling window, same on all ranks
    reports = {}
    for name in names:
        full = TimingRecorder(rec[name].cost, sync=args.sync, window=10**6)
        full.extend(every[name])
        reports[name] = full.report()
    if args.save_timings and rank == 0:
        rec["tokens"].stream_to(None)
    # The timer's own cost as a share of step time, both on the timer's clock (CPU time
    # of this thread with --clock thread): local (timed regions, clocks, records) and the
    # one small all_gather per step.
    spent = {name: clocked[name] - clocked_from[name] for name in names}
    gather = {name: (timer[name].gather_overhead - overhead_from[name][1]) / spent[name]
              for name in names}
    local = {name: (timer[name].overhead - overhead_from[name][0]) / spent[name]
             - gather[name] for name in names}
    # Model error: each race micro-batch of the refit strategy (every run) against the
    # prediction, in seconds (no rescaling), of the cost that planned it, i.e. fitted on
    # earlier steps only. Also against the fastest of the --repeats runs of each
    # micro-batch (the filter the step times get).
    table = np.array(judged)
    rel_all = np.abs(table[:, 4] - table[:, 3]) / table[:, 3]
    runs: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for step, r, slot, secs, pred in judged:
        runs.setdefault((step, r, slot), []).append((secs, pred))
    best_t, best_p = np.array([min(v) for v in runs.values()]).T
    error_best = float(np.median(np.abs(best_p - best_t) / best_t))
    model_error = float(np.median(rel_all))
    # Run-to-run noise: spread (slowest / fastest - 1) of the --repeats runs of one
    # micro-batch (same lengths, same rank; weights one SGD step apart), median.
    noise = [max(v)[0] / min(v)[0] - 1 for v in runs.values() if len(v) > 1]
    noise_floor = float(np.median(noise)) if noise else math.nan
    final_cost = bal["refit"].cost
    models.clear()
    del ddp_a, ddp_t, opt_a, opt_t
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    if log is not None:
        log.close()
    _check_loss(first_loss, first_grad, "tokens", "refit")
    mean = {name: statistics.fmean(ts) for name, ts in times.items()}
    if args.refit_every:
        print(f"last refit: {_describe_cost(final_cost)}")
    for name in names:
        r = reports[name]
        print(f"{name:>6} plans: measured imbalance {r.imbalance_measured:6.1%} "
              f"(predicted {r.imbalance_predicted:6.1%}), idle {r.idle_fraction:6.1%}, "
              f"mean step {mean[name] * 1e3:6.1f} ms")
    print(f"timer overhead per step ({args.clock} clock): " + ", ".join(
        f"{name} {local[name]:.2%} local + {gather[name]:.2%} gather" for name in names))
    if args.verbose:
        for name in names:
            print(f"--- {name} plans, race steps ---\n{reports[name]}")
    print(f"slowest rank {reports['refit'].slowest_rank}, straggler score "
          f"{reports['refit'].straggler_score:.2f}")
    cpu = {name: reports[name].step_time_measured for name in names}
    # Step time implied by the measured micro-batches under the sync model: the busiest
    # rank's sum (ddp), or the sum over slots of the slowest rank's micro-batch (fsdp).
    print(f"compute per step from measured micro-batches ({args.sync} sync, {args.clock} "
          f"clock): tokens "
          f"{cpu['tokens'] * 1e3:.1f} ms, refit {cpu['refit'] * 1e3:.1f} ms, ratio "
          f"{cpu['tokens'] / cpu['refit']:.2f}")
    # What the balance can buy at most on these batches, by the model: the token plans'
    # and the refit plans' compute step time, both under the last refit cost.
    bound = {name: sum(p.simulate(final_cost).step_time for p in race_plans[name])
             for name in names}
    print(f"compute speedup the last refit cost predicts: {bound['tokens'] / bound['refit']:.2f}"
          f" (token plans' imbalance under it: "
          f"{statistics.fmean(_imbalance(p, final_cost) for p in race_plans['tokens']):.1%})")
    print(f"refit cost vs the fastest of each micro-batch's {args.repeats} runs: median "
          f"error {error_best:.1%}; spread of one micro-batch's runs: {noise_floor:.1%}")
    print(f"model error: {model_error:.1%}")
    print(f"speedup: {mean['tokens'] / mean['refit']:.2f}")


def _imbalance(plan: Any, cost: Any) -> float:
    loads = plan.simulate(cost).mb_costs.sum(axis=1)
    return float(loads.max() / loads.mean() - 1.0)


def _describe_cost(cost: Any) -> str:
    return (f"{cost.per_microbatch:.2e} + sum({cost.per_sequence:.2e} + {cost.per_token:.2e}*L"
            f" + {cost.per_token_sq:.2e}*L^2) s; rank speed "
            + ", ".join(f"{r}: {v:.3f}" for r, v in cost.meta.get("rank_speed", {}).items()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per strategy")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (step 1 included)")
    p.add_argument("--repeats", type=int, default=3,
                   help="run each step this many times per strategy and keep the fastest "
                        "(filters out other processes' bursts on a shared machine)")
    p.add_argument("--batch", type=int, default=64, help="sequences per global batch")
    p.add_argument("--scale", type=float, default=16.0, help="divide rl-math lengths by this")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per micro-batch")
    p.add_argument("--cost", choices=("fit", "tokens"), default="fit",
                   help="plan for fitted step times, or for token counts")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--world", type=int, default=2, help="processes (one CPU thread each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run to check it works")
    p.add_argument("--verbose", action="store_true", help="print every rank's every step")
    p.add_argument("--adapt", action="store_true",
                   help="start from TokenCost, time every micro-batch, refit the cost after "
                        "--refit-after steps, then race token-cost plans against refit plans")
    p.add_argument("--refit-after", type=int, default=4,
                   help="--adapt: steps timed with token-cost plans before the refit")
    p.add_argument("--clock", choices=("wall", "thread"), default="thread",
                   help="--adapt: per-micro-batch clock; 'thread' = this thread's CPU time "
                        "(leaves out waits and time other processes take the core)")
    p.add_argument("--refit-every", type=int, default=2,
                   help="--adapt: refit on the rolling window every this many race steps "
                        "(0: refit once)")
    p.add_argument("--window", type=int, default=24,
                   help="--adapt: timed runs a refit looks back on")
    p.add_argument("--sync", choices=("ddp", "fsdp"), default=None,
                   help="--adapt: 'fsdp' (default there, as in the planner) lets DDP sync "
                        "after every micro-batch, so the ranks run micro-batches in lockstep "
                        "as under FSDP / ZeRO-3, and plans for that; 'ddp' syncs gradients "
                        "once per step (no_sync on every micro-batch), the only mode without "
                        "--adapt")
    p.add_argument("--log", metavar="FILE",
                   help="--adapt: write the balance metrics of every step as JSON lines")
    p.add_argument("--save-timings", metavar="FILE",
                   help="--adapt: stream the token-plan race records to FILE as each step "
                        "ends (TimingRecorder.stream_to), for `seqbalance refit FILE`")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.scale, args.dim, args.layers = 2, 32, 64.0, 32, 1
        args.max_tokens, args.repeats = 512, 1
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (step 1 is the loss check)")
    if args.repeats < 1 or args.steps < 1:
        p.error("--repeats and --steps must be >= 1")
    if args.adapt and args.refit_after < 2:
        p.error("--refit-after must be >= 2 (the fit needs varied micro-batches)")
    if args.log and not args.adapt:
        p.error("--log goes with --adapt")
    if args.save_timings and not args.adapt:
        p.error("--save-timings goes with --adapt")
    if args.sync is None:
        args.sync = "fsdp" if args.adapt else "ddp"
    if args.sync == "fsdp" and args.clock == "wall":
        p.error("--clock wall with --sync fsdp would time DDP's wait for the other rank in "
                "every micro-batch; use --clock thread, or --sync ddp")
    if args.sync != "ddp" and not args.adapt:
        p.error("--sync goes with --adapt (the naive split's micro-batch counts differ by "
                "rank, so syncing every micro-batch would hang)")
    if args.adapt:
        args.total_steps = args.warmup + args.refit_after + args.steps
    return args


# glibc hands buffers above 128 KiB back to the OS when freed, so every micro-batch faults
# its activations in again: time that grows with the micro-batch and varies from run to
# run by 10-40% here, which no per-sequence cost model can predict. Keeping freed memory
# in the heap makes the CPU behave like a GPU's caching allocator. Read by glibc when the
# workers start (mp.spawn starts fresh interpreters); ignored elsewhere.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's largest: heap, not mmap, below it
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),  # keep up to 1 GiB of freed heap mapped
    "MALLOC_TOP_PAD_": str(256 << 20),  # grow the heap in large steps
}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory(prefix="ddp-train-") as tmp:
        init_file = os.path.join(tmp, "store")
        mp.spawn(worker, args=(args.world, init_file, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
