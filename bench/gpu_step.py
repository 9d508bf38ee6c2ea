"""Measured step time of plans on a real GPU: does the planned balance hold up in time?

The planner ranks plans by a cost model's simulated step time. This script checks that
ranking against measured time, on one GPU:

1. Calibrate the model (``seqbalance.costs.calibrate``: ``--layers`` decoder layers with
   random weights, forward + backward of packed micro-batches, scaled to the model's
   depth, plus the LM head) and fit ``t = c0 + sum(a + b*L + c*L^2)`` in seconds.
2. Plan one global batch of a built-in workload for ``--dp`` ranks with seqbalance (with
   the calibrated cost, the FLOPs model, and tokens) and with the baselines other
   frameworks use (:data:`seqbalance.planning.baselines.BASELINES`).
3. Time every micro-batch of every plan on the GPU with the same layers (fastest of
   ``--repeats`` runs; identical micro-batches are timed once) and compose the step time
   under each synchronisation model: FSDP runs micro-batch slots in lockstep (the step is
   the sum over slots of the slowest rank's micro-batch), DDP waits once (the step is the
   slowest rank's total).

One GPU times every rank's micro-batches in turn, so communication is not in the figures
(the calibration does not see it either); what is measured is the compute each rank
would do and the wait that imbalance causes under each sync model.

Also reported: the calibrated cost's relative error on every micro-batch timed in step 3
(micro-batches it was not fitted on), and the FLOPs model's b/c beside the fitted one.

Run (GPU): python bench/gpu_step.py --json bench/results/gpu_step.json
A quick CPU check of the script itself: python bench/gpu_step.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, print_table, write_json

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import FlopsCost, load_cost
from seqbalance.costs.architecture import parse_config
from seqbalance.costs.calibrate import (
    _layer_indices,
    _Model,
    _resolve,
    _Timer,
    calibrate,
)
from seqbalance.planning.baselines import BASELINES

TINY = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 256,
}  # fmt: skip


def _step_times(times: list[list[float]]) -> tuple[float, float]:
    """(FSDP lockstep, DDP) step time from per-rank, per-slot micro-batch seconds."""
    m = max(len(t) for t in times)
    grid = np.zeros((len(times), m))
    for r, t in enumerate(times):
        grid[r, : len(t)] = t
    return float(grid.max(axis=0).sum()), float(grid.sum(axis=1).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-7b", help="shipped model name")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--layers", type=int, default=2, help="decoder layers built and timed")
    ap.add_argument("--workloads", default="rl-math,sft-chat,long-mix")
    ap.add_argument("--n", type=int, default=256, help="sequences per global batch")
    ap.add_argument("--dp", type=int, default=8, help="data-parallel ranks")
    ap.add_argument("--max-tokens", type=int, default=32768, help="tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per micro-batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, to check the script")
    ap.add_argument("--json", default=None, metavar="PATH", help="write results here")
    args = ap.parse_args()

    import torch

    config: Any = TINY if args.tiny else args.model
    cap = 2048 if args.tiny else args.max_tokens
    n = 48 if args.tiny else args.n
    t0 = time.perf_counter()
    cal, report = calibrate(
        config, device=args.device, layers=args.layers, max_tokens=cap, seed=args.seed,
        progress=False,
    )  # fmt: skip
    cal_s = time.perf_counter() - t0
    print(
        f"calibrated {cal.meta['model']} on {cal.meta['device']} ({cal.meta['attention']}, "
        f"{cal.meta['dtype']}) in {cal_s:.0f} s"
    )
    print(report)
    flops_bc = cal.meta["flops_b_over_c"]
    fit_bc = cal.per_token / cal.per_token_sq if cal.per_token_sq > 0 else math.inf
    print(f"b/c: fitted {fit_bc:.6g} tokens, FLOPs model {flops_bc:.6g} tokens\n")

    # The same layers (same seed, shapes and dtype) time the plans' micro-batches.
    cfg, _ = _resolve(config)
    arch = parse_config(cfg)
    idx = _layer_indices(arch.num_layers, args.layers)
    torch.manual_seed(args.seed)
    model = _Model(torch, arch, [arch.layers[i] for i in idx], args.device,
                   getattr(torch, cal.meta["dtype"]), args.seed)  # fmt: skip
    timer = _Timer(torch, model, include_head=True)
    flops = FlopsCost(arch) if args.tiny else load_cost(args.model)
    cache: dict[tuple[int, ...], float] = {}

    def measured(lengths: list[int]) -> float:
        key = tuple(sorted(lengths))
        if not key:
            return 0.0
        if key not in cache:
            cache[key] = timer(list(key), args.repeats)
        return cache[key]

    results: dict[str, Any] = {
        "machine": machine_info(),
        "torch": str(torch.__version__),
        "args": vars(args),
        "calibration": {
            "seconds": cal_s,
            "cost": cal.to_dict(),
            "r2": report.r2,
            "fitted_b_over_c": fit_bc,
            "flops_b_over_c": flops_bc,
        },
        "workloads": {},
    }
    all_errors: list[float] = []
    for name in args.workloads.split(","):
        lengths = workloads.lengths(name, n, args.seed)
        lengths = np.minimum(lengths, cap)  # the cap bounds every sequence (no CP here)
        plans: dict[str, Any] = {
            "seqbalance (calibrated)": sb.plan(lengths, args.dp, cap, cost=cal, sync="fsdp"),
            "seqbalance (FLOPs)": sb.plan(lengths, args.dp, cap, cost=flops, sync="fsdp"),
            "seqbalance (tokens)": sb.plan(lengths, args.dp, cap, sync="fsdp"),
        }
        for bname, fn in BASELINES.items():
            plans[bname] = fn(lengths, args.dp, cap, cost=flops, sync="fsdp")
        rows = []
        for pname, p in plans.items():
            times = [[measured(list(map(int, lengths[mb]))) for mb in rank]
                     for rank in p.micro_batches]  # fmt: skip
            pred = [[cal.microbatch_cost(lengths[mb]) if len(mb) else 0.0 for mb in rank]
                    for rank in p.micro_batches]  # fmt: skip
            for tr, pr in zip(times, pred):
                all_errors += [pj / tj - 1 for tj, pj in zip(tr, pr) if tj > 0]
            fsdp, ddp = _step_times(times)
            pf, pd = _step_times(pred)
            over = int(p.violations().get("over_capacity", 0))
            rows.append({
                "plan": pname, "mbs/rank": p.num_micro_batches, "over cap": over,
                "FSDP s": fsdp, "DDP s": ddp, "pred FSDP s": pf, "pred DDP s": pd,
            })  # fmt: skip
        best_f = rows[0]["FSDP s"]
        best_d = rows[0]["DDP s"]
        for row in rows:
            row["FSDP ×"] = row["FSDP s"] / best_f
            row["DDP ×"] = row["DDP s"] / best_d
        print(f"== {name}: {n} sequences, {int(lengths.sum())} tokens, dp {args.dp}, "
              f"cap {cap}; step times in s (× = over seqbalance (calibrated))")  # fmt: skip
        print_table(rows, ["plan", "mbs/rank", "over cap", "FSDP s", "FSDP ×", "DDP s",
                           "DDP ×", "pred FSDP s", "pred DDP s"])  # fmt: skip
        print()
        results["workloads"][name] = rows
    err = np.abs(np.asarray(all_errors))
    summary = {
        "micro_batches_timed": len(cache),
        "abs_rel_error_median": float(np.median(err)),
        "abs_rel_error_p90": float(np.quantile(err, 0.9)),
        "abs_rel_error_max": float(err.max()),
    }
    results["calibrated_cost_on_plan_micro_batches"] = summary
    med, p90, top = (summary[f"abs_rel_error_{k}"] for k in ("median", "p90", "max"))
    print(
        "calibrated cost on the plans' micro-batches (not fitted on them): "
        f"{len(cache)} distinct, |pred/measured - 1| median {med:.1%}, p90 {p90:.1%}, "
        f"max {top:.1%}"
    )
    if args.json:
        print(f"wrote {write_json(args.json, results)}")


if __name__ == "__main__":
    main()
