"""Planner benchmark: seqbalance against the baselines over the standard workloads.

For every workload x dp x max_tokens where every sequence fits, plans one global batch of
``per_rank x dp`` sequences with seqbalance and each baseline, simulates the step under
FSDP (and DDP), and checks the planner's guarantees. Prints a table, writes JSON.

    python bench/plan.py                 # full grid (a few minutes on 2 cores)
    python bench/plan.py --quick         # a small subset
    python bench/plan.py --json out.json

The cost is the FLOPs model of Qwen2.5-7B (``--model`` to change it, ``--model tokens``
for raw tokens). The gap is ``step_time / lower_bound - 1`` with
``seqbalance.planning.simulation.step_time_lower_bound`` (valid for every plan, see its docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import seqbalance
from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan


def machine_info() -> dict:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        rev = ""
    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "seqbalance": seqbalance.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "git_rev": rev,
    }


def run_config(name: str, dp: int, cap: int, per_rank: int, cost, seed: int) -> dict | None:
    w = workloads.load(name, per_rank * dp, seed=seed)
    if int(w.lengths.max()) > cap:
        return None
    costs = cost(w.lengths)
    t0 = time.perf_counter()
    ours = plan(w.lengths, dp, cap, cost=costs, sync="fsdp")
    plan_s = time.perf_counter() - t0
    v = ours.violations()
    row = {
        "workload": name,
        "dp": dp,
        "max_tokens": cap,
        "n": int(w.lengths.size),
        "m": ours.num_micro_batches,
        "m_bound": ours.min_micro_batches_bound(),
        "plan_s": plan_s,
        "violations": v,
        "fsdp_gap": ours.simulate(sync="fsdp").gap,
        "ddp_gap": ours.simulate(sync="ddp").gap,
        "fsdp_step": ours.simulate(sync="fsdp").step_time,
        "baselines": {},
    }
    for bname, fn in BASELINES.items():
        b = fn(w.lengths, dp, cap, cost=costs)
        bv = b.violations()
        sim = b.simulate(sync="fsdp")
        row["baselines"][bname] = {
            "m": b.num_micro_batches,
            "fsdp_gap": sim.gap,
            "fsdp_step": sim.step_time,
            "over_capacity": bv["over_capacity"],
            "empty": bv["empty"],
            "valid": bv["over_capacity"] == 0 and bv["empty"] == 0,
        }
    valid = [b for b in row["baselines"].values() if b["valid"]]
    row["checks"] = {
        "no_violations": all(x == 0 for x in v.values()),
        "m_le_token_ffd": row["m"] <= row["baselines"]["token-ffd"]["m"],
        "beats_valid_baselines": all(
            row["fsdp_step"] <= b["fsdp_step"] * (1 + 1e-12) for b in valid
        ),
        "beats_all_baselines": all(
            row["fsdp_step"] <= b["fsdp_step"] * (1 + 1e-12) for b in row["baselines"].values()
        ),
        "gap_le_3pct_if_m_ge_8": row["m"] < 8 or row["fsdp_gap"] <= 0.03,
    }
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of the grid")
    ap.add_argument("--model", default="qwen2.5-7b", help="cost model (name, config, 'tokens')")
    ap.add_argument("--per-rank", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/plan.json")
    args = ap.parse_args(argv)

    cost = load_cost(args.model)
    names = workloads.NAMES
    dps, caps = (8, 64, 256), (16384, 32768, 65536)
    if args.quick:
        names, dps, caps = ("rl-math", "sft-chat"), (8, 64), (32768,)
    rows, skipped = [], []
    head = (
        f"{'workload':9} {'dp':>4} {'cap':>6} {'n':>6} {'m':>4} {'plan_s':>7} "
        f"{'fsdp_gap':>9} {'ddp_gap':>8}  " + "  ".join(f"{b:>16}" for b in BASELINES)
    )
    print(head)
    for name in names:
        for dp in dps:
            for cap in caps:
                for per_rank in args.per_rank:
                    row = run_config(name, dp, cap, per_rank, cost, args.seed)
                    if row is None:
                        skipped.append(f"{name} dp={dp} cap={cap} per_rank={per_rank}")
                        continue
                    rows.append(row)
                    cells = []
                    for r in row["baselines"].values():
                        flag = "" if r["valid"] else "*"
                        cells.append(f"{r['fsdp_gap']:>9.4f}{flag:1} m{r['m']:<4}")
                    print(
                        f"{name:9} {dp:>4} {cap:>6} {row['n']:>6} {row['m']:>4} "
                        f"{row['plan_s']:>7.3f} {row['fsdp_gap']:>9.4f} {row['ddp_gap']:>8.4f}  "
                        + "  ".join(cells),
                        flush=True,
                    )
    # The speed acceptance point: 65,536 sequences over 1,024 ranks.
    speed = {}
    for name in ("rl-math", "sft-chat", "uniform", "bimodal"):
        w = workloads.load(name, 65536, seed=args.seed)
        costs = cost(w.lengths)
        speed[name] = min(_timed(plan, w.lengths, 1024, 32768, cost=costs) for _ in range(2))
    print("\n* = baseline plan breaks the capacity or has empty micro-batches (not runnable)")
    print("skipped (a sequence is longer than max_tokens): " + (", ".join(skipped) or "none"))
    checks = {k: all(r["checks"][k] for r in rows) for k in rows[0]["checks"]}
    failed = {
        k: [
            f"{r['workload']} dp={r['dp']} cap={r['max_tokens']} n={r['n']}"
            for r in rows
            if not r["checks"][k]
        ]
        for k in checks
    }
    m8 = [r["fsdp_gap"] for r in rows if r["m"] >= 8]
    print(f"configs: {len(rows)}; worst FSDP gap with m >= 8: {max(m8, default=0):.4f}")
    for k, ok in checks.items():
        print(f"check {k}: {'ok' if ok else 'FAILED ' + '; '.join(failed[k][:5])}")
    print(
        "plan time, n=65,536, dp=1,024, max_tokens=32,768: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in speed.items())
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "model": args.model,
                "rows": rows,
                "skipped": skipped,
                "checks": checks,
                "speed_65536x1024_s": speed,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


def _label(row: dict) -> str:
    return f"{row['workload']} dp={row['dp']} cap={row['max_tokens']} n={row['n']}"


def _timed(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
