"""Planner benchmark: seqbalance against every baseline over the standard workloads.

For every workload x dp x max_tokens where every sequence fits, plans one global batch of
``per_rank x dp`` sequences with seqbalance (once for FSDP, once for DDP) and each
baseline, simulates the step under both sync models, and checks:

- the planner's guarantees (no violation);
- FSDP and DDP step <= every baseline that respects the capacity (and runs: no empty
  micro-batch), within the default effort's tolerance: a plan at most 0.1% above its
  bound may stop before the baselines run, so it is held to <= 1.001x each of them;
- ``m`` <= the least micro-batch count reached by partition-based packing, AReaL's FFD
  pipeline or verl's pipeline with retry;
- the gap ``step / bound - 1`` against the capacity-aware bound
  (:func:`seqbalance.planning.bounds.capacity_step_bound`, proven in its docstring);
- GRPO rows with groups (``rl-math``, responses of a prompt on one rank): the gap to the
  group-aware bound.

Then times ``plan`` on 65,536 sequences over 1,024 ranks (every workload that fits), and
with ``--huge`` on 1,048,576 sequences over 8,192 ranks.

    python bench/plan.py                 # full grid (several minutes on 2 cores)
    python bench/plan.py --quick         # a small subset
    python bench/plan.py --huge          # also the 1M x 8,192 timing

The cost is the FLOPs model of Qwen2.5-7B (``--model``; ``--model tokens`` for raw tokens).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_time, machine_info, write_json

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.partitioning.kway import partition_arrays
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.bounds import min_micro_batches
from seqbalance.planning.planner import plan

_TOL = 1 + 1e-12
_STOP = 1e-3  # the default effort stops once a plan is provably this close to its bound
_SLOW_BASELINE_WORK = 5e6  # slime's KK keeps k parts per state: skip it above n * k of this


def _within(step: float, gap: float, other: float) -> bool:
    """``step`` at or below ``other``; within ``_STOP`` of it where the plan's ``gap`` to
    its bound let the default effort stop before the baselines ran."""
    return step <= other * (1 + _STOP if gap <= _STOP else _TOL)


def partition_m(lengths: np.ndarray, dp: int, cap: int) -> int:
    """Least m for which a token-balanced partition into dp * m parts fits the capacity."""
    m = min_micro_batches(lengths, dp, cap)
    while True:
        parts = partition_arrays(lengths.astype(np.float64), dp * m, "free", "auto", None)
        if max(int(lengths[np.asarray(p, dtype=np.int64)].sum()) for p in parts) <= cap:
            return m
        m += 1


def run_config(name: str, dp: int, cap: int, per_rank: int, cost, seed: int) -> dict | None:
    w = workloads.load(name, per_rank * dp, seed=seed)
    lens = w.lengths
    if int(lens.max()) > cap:
        return None
    costs = cost(lens)
    t0 = time.perf_counter()
    ours = {"fsdp": plan(lens, dp, cap, cost=costs, sync="fsdp")}
    plan_s = time.perf_counter() - t0
    ours["ddp"] = plan(lens, dp, cap, cost=costs, sync="ddp")
    sims = {s: ours[s].simulate() for s in ("fsdp", "ddp")}
    row = {
        "workload": name,
        "dp": dp,
        "max_tokens": cap,
        "n": int(lens.size),
        "m": ours["fsdp"].num_micro_batches,
        "m_ddp": ours["ddp"].num_micro_batches,
        "m_bound": ours["fsdp"].min_micro_batches_bound(),
        "plan_s": plan_s,
        "violations": {s: ours[s].violations() for s in ours},
        "fsdp_step": sims["fsdp"].step_time,
        "ddp_step": sims["ddp"].step_time,
        "fsdp_gap": sims["fsdp"].gap,
        "ddp_gap": sims["ddp"].gap,
        "fsdp_bound": sims["fsdp"].lower_bound,
        "ddp_bound": sims["ddp"].lower_bound,
        "notes": list(ours["fsdp"].notes),
        "baselines": {},
    }
    k = math.ceil(int(lens.sum()) / cap)
    for bname, fn in BASELINES.items():
        if bname == "slime-flops" and lens.size * k > _SLOW_BASELINE_WORK:
            continue
        b = fn(lens, dp, cap, cost=costs)
        bv = b.violations()
        bf, bd = b.simulate(sync="fsdp"), b.simulate(sync="ddp")
        row["baselines"][bname] = {
            "m": b.num_micro_batches,
            "fsdp_step": bf.step_time,
            "ddp_step": bd.step_time,
            "fsdp_gap": bf.gap,
            "ddp_gap": bd.gap,
            "over_capacity": bv["over_capacity"],
            "empty": bv["empty"],
            "valid": bv["over_capacity"] == 0 and bv["empty"] == 0,
        }
    valid = {k: b for k, b in row["baselines"].items() if b["valid"]}
    least = [partition_m(lens, dp, cap)]
    least += [valid[x]["m"] for x in ("areal", "verl") if x in valid]
    row["least_other_m"] = min(least)
    row["checks"] = {
        "no_violations": all(x == 0 for v in row["violations"].values() for x in v.values()),
        "fsdp_le_valid_baselines": all(
            _within(row["fsdp_step"], row["fsdp_gap"], b["fsdp_step"]) for b in valid.values()
        ),
        "ddp_le_valid_baselines": all(
            _within(row["ddp_step"], row["ddp_gap"], b["ddp_step"]) for b in valid.values()
        ),
        "m_le_least_other_m": row["m"] <= row["least_other_m"]
        and row["m_ddp"] <= row["least_other_m"],
    }
    return row


def run_groups(dp: int, cap: int, per_rank: int, cost, seed: int) -> dict | None:
    """GRPO with groups: every prompt's responses on one rank; gap to the group-aware bound."""
    w = workloads.load("rl-math", per_rank * dp, seed=seed)
    if int(w.lengths.max()) > cap:
        return None
    costs = cost(w.lengths)
    p = plan(w.lengths, dp, cap, cost=costs, sync="fsdp", groups=w.groups)
    sim = p.simulate()
    return {
        "workload": "rl-math+groups",
        "dp": dp,
        "max_tokens": cap,
        "n": int(w.lengths.size),
        "m": p.num_micro_batches,
        "fsdp_gap": sim.gap,
        "violations": p.violations(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of the grid")
    ap.add_argument("--huge", action="store_true", help="also time 1,048,576 x 8,192")
    ap.add_argument("--model", default="qwen2.5-7b", help="cost model (name, config, 'tokens')")
    ap.add_argument("--per-rank", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/plan.json")
    args = ap.parse_args(argv)

    cost = load_cost(args.model)
    names = workloads.NAMES
    dps, caps = (8, 64, 256), (16384, 32768, 65536)
    if args.quick:
        names, dps, caps = ("rl-math", "sft-chat", "rl-math-truncated"), (8, 64), (32768,)
    rows, skipped = [], []
    short = {"sequential": "seq", "token-ffd": "ffd", "token-kk": "tkk",
             "cost-kk-uncapped": "ckk", "areal": "areal", "verl": "verl", "slime-flops": "slime"}
    print(
        f"{'workload':17} {'dp':>4} {'cap':>6} {'n':>6} {'m':>3} {'m_oth':>5} {'plan_s':>6} "
        f"{'fsdp_gap':>8} {'ddp_gap':>8}  baselines: fsdp gap (* = breaks cap or empty)"
    )
    for name in names:
        for dp in dps:
            for cap in caps:
                for per_rank in args.per_rank:
                    row = run_config(name, dp, cap, per_rank, cost, args.seed)
                    if row is None:
                        skipped.append(f"{name} dp={dp} cap={cap} per_rank={per_rank}")
                        continue
                    rows.append(row)
                    cells = " ".join(
                        f"{short[k]}={b['fsdp_gap']:.4f}{'' if b['valid'] else '*'}"
                        for k, b in row["baselines"].items()
                    )
                    print(
                        f"{name:17} {dp:>4} {cap:>6} {row['n']:>6} {row['m']:>3} "
                        f"{row['least_other_m']:>5} {row['plan_s']:>6.2f} "
                        f"{row['fsdp_gap']:>8.4f} {row['ddp_gap']:>8.4f}  {cells}",
                        flush=True,
                    )
    group_rows = []
    for dp in (8, 64) if args.quick else (8, 64, 256):
        for per_rank in args.per_rank:
            g = run_groups(dp, 32768, per_rank, cost, args.seed)
            if g is not None:
                group_rows.append(g)
                print(
                    f"{g['workload']:17} {dp:>4} {32768:>6} {g['n']:>6} {g['m']:>3} "
                    f"{'':>5} {'':>6} {g['fsdp_gap']:>8.4f}  (gap to the group-aware bound)",
                    flush=True,
                )
    speed, speed_gap = {}, {}
    for name in workloads.NAMES:
        w = workloads.load(name, 65536, seed=args.seed)
        if int(w.lengths.max()) > 32768:
            continue
        costs = cost(w.lengths)
        speed[name], big = best_time(
            lambda lens=w.lengths, c=costs: plan(lens, 1024, 32768, cost=c), repeat=2
        )
        speed_gap[name] = big.simulate().gap  # plan's default sync: fsdp
    huge = {}
    if args.huge:
        for name in ("rl-math", "sft-chat"):
            w = workloads.load(name, 1_048_576, seed=args.seed)
            costs = cost(w.lengths)
            t0 = time.perf_counter()
            p = plan(w.lengths, 8192, 32768, cost=costs)
            huge[name] = {"plan_s": time.perf_counter() - t0, "m": p.num_micro_batches,
                          "fsdp_gap": p.simulate().gap}
    print("\nskipped (a sequence is longer than max_tokens): " + (", ".join(skipped) or "none"))
    checks = {k: all(r["checks"][k] for r in rows) for k in rows[0]["checks"]}
    for k, ok in checks.items():
        bad = [
            f"{r['workload']} dp={r['dp']} cap={r['max_tokens']} n={r['n']}"
            for r in rows
            if not r["checks"][k]
        ]
        print(f"check {k}: {'ok' if ok else 'FAILED ' + '; '.join(bad[:5])}")
    print(
        f"configs: {len(rows)}; worst gap to the capacity-aware bound: "
        f"FSDP {max(r['fsdp_gap'] for r in rows):.4f}, DDP {max(r['ddp_gap'] for r in rows):.4f}"
    )
    if group_rows:
        print(
            "GRPO with groups, worst FSDP gap to the group-aware bound: "
            f"{max(g['fsdp_gap'] for g in group_rows):.4f}"
        )
    print(
        "plan time (best of 2), n=65,536, dp=1,024, max_tokens=32,768 (loaded machine): "
        + ", ".join(f"{k} {v:.2f}s (FSDP gap {speed_gap[k]:.4f})" for k, v in speed.items())
    )
    for k, v in huge.items():
        print(f"plan time, n=1,048,576, dp=8,192: {k} {v['plan_s']:.1f}s (m={v['m']})")
    out = write_json(
        args.json,
        {
            "machine": machine_info(),
            "model": args.model,
            "rows": rows,
            "groups": group_rows,
            "skipped": skipped,
            "checks": checks,
            "speed_65536x1024_s": speed,
            "gap_65536x1024": speed_gap,
            "huge_1048576x8192": huge,
        },
    )
    print(f"wrote {out}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
