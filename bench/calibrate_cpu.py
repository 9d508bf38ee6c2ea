"""Calibrate small configs on this machine and compare with the FLOPs model.

Prints two tables and writes bench/results/calibrate_cpu.json (machine info, git rev):
1. b/c (tokens) of the FLOPs model for every shipped config: the sequence length at
   which attention costs as much as the matmuls.
2. For a few small CPU-sized configs: the fitted cost, R², held-out relative errors, and
   the fitted b/c beside the FLOPs model's.

Run: python bench/calibrate_cpu.py [--device cuda] [--threads N] [--models a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from seqbalance.costs import SHIPPED, FlopsCost
from seqbalance.costs.calibrate import calibrate

SMALL = {
    "tiny-llama": {
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 256,
    },
    "small-llama": {
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 768,
        "vocab_size": 4000,
    },
    "small-qwen3-moe": {
        "model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 768, "moe_intermediate_size": 128, "num_experts": 16,
        "num_experts_per_tok": 4, "vocab_size": 4000,
    },
}  # fmt: skip


def _git_rev() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--models", default=",".join(SMALL), help="small configs or shipped names")
    ap.add_argument("--out", default="bench/results/calibrate_cpu.json")
    args = ap.parse_args()

    print(f"{'shipped config':18} {'active params':>14} {'b/c (tokens)':>13} exact")
    flops_rows = []
    for name in SHIPPED:
        c = FlopsCost.from_name(name)
        ratio = c.per_token / c.per_token_sq
        flops_rows.append({"name": name, "matmul_params": c.matmul_params, "b_over_c": ratio,
                           "polynomial_is_exact": c.polynomial_is_exact})  # fmt: skip
        print(f"{name:18} {c.matmul_params / 1e9:>13.3f}B {ratio:>13.0f} {c.polynomial_is_exact}")

    print()
    head = f"{'config':16} {'c0 s':>9} {'a s':>9} {'b s/tok':>9} {'c s/tok2':>9} {'R2':>7}"
    print(head + f" {'hold med':>8} {'hold max':>8} {'b/c fit':>8} {'b/c flops':>9} {'wall s':>6}")
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        cost, rep = calibrate(
            SMALL.get(name, name), device=args.device, max_tokens=args.max_tokens,
            threads=args.threads, progress=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        fit_ratio = cost.per_token / cost.per_token_sq if cost.per_token_sq else float("inf")
        hold = rep.holdout
        print(
            f"{name:16} {cost.per_microbatch:9.3g} {cost.per_sequence:9.3g} {cost.per_token:9.3g} "
            f"{cost.per_token_sq:9.3g} {rep.r2:7.4f} {hold.median_rel_error:8.2%} "
            f"{hold.max_rel_error:8.2%} {fit_ratio:8.0f} {cost.meta['flops_b_over_c']:9.0f} "
            f"{wall:6.1f}"
        )
        rows.append({"name": name, "cost": cost.to_dict(), "wall_s": wall})

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor(),
               "cpus": os.cpu_count(), "python": platform.python_version()}  # fmt: skip
    payload = {"git_rev": _git_rev(), "machine": machine, "flops": flops_rows, "calibrations": rows}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
