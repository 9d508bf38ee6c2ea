"""Pipeline benchmark: the planner's micro-batch order against the baseline orders.

Four parts, one JSON (``bench/results/pp.json``):

0. Closed forms. Equal micro-batches (integer per-operation costs, so sums are exact):
   the simulated step against ``(m + p - 1)(f + b)`` (GPipe, 1F1B) and
   ``(m + (p - 1)/v)(f + b)`` (interleaved), p in 1..8, every valid m up to 4p + 2.
1. Orders. For each standard workload x pp_size p in {2, 4, 8} x micro-batches m in
   {p, 2p, 4p, 8p} x schedule (gpipe, 1f1b, interleaved with v = 2), plans
   ``dp x m`` micro-batches (``min_micro_batches=m``, a capacity loose enough for m), and
   simulates the pipeline step of the planner's order and of the same micro-batches in
   each baseline order (input, largest-first, smallest-first, light-ends = verl). Reports
   whether the planner is <= every baseline, its improvement over verl's order, and its gap
   to ``pipeline_lower_bound``.
2. Brute force. Random micro-batch costs (lognormal, backward 2-2.5x forward), m <= 7:
   the optimum over all m! orders against the planner's search (exhaustive up to m = 8)
   and against its heuristic alone (``exact_limit=0``).
2b. End to end against verl. verl's own plan (its packing, and its light-ends order by
   its workload proxy) run as a pipeline, against seqbalance planned for the same pipeline
   with as many micro-batches as verl uses (the bubble depends on the count): dp 8,
   max_tokens 32768, 1,024 sequences per workload, GPipe and 1F1B.
3. Speed. 8,192 rl-math sequences for dp 64 x pp 8, best of 3, next to the same plan
   without pipelines.

    python bench/pp.py            # full grid (several minutes on 2 loaded cores)
    python bench/pp.py --quick    # a subset
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, machine_info, print_table, write_json

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning.pipeline import (
    check_pipeline,
    graph,
    pipeline_lower_bound,
    simulate_pipeline,
)
from seqbalance.planning.pipeline_orders import ORDERS, best_orders
from seqbalance.planning.pipeline_plans import reorder
from seqbalance.planning.planner import plan

WORKLOADS = ("rl-math", "sft-chat", "bimodal", "long-mix")
LAYOUTS = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))


def closed_forms_part() -> dict:
    layouts = [("gpipe", 1), ("1f1b", 1), *(("interleaved", v) for v in (2, 3, 4))]
    checked = exact = 0
    for schedule, v in layouts:
        for p in range(1, 9):
            step = p if schedule == "interleaved" else 1
            for m in range(step, 4 * p + 3, step):
                for f_op, b_op in ((1, 2), (2, 5), (3, 3)):
                    sim = simulate_pipeline(
                        [float(f_op * p * v)] * m,
                        [float(b_op * p * v)] * m,
                        p,
                        schedule=schedule,
                        virtual_stages=v,
                    )
                    f, b = f_op * v, b_op * v  # per stage, all chunks
                    want = m * (f + b) + (p - 1) * (f + b) // v  # (f + b) divisible by v
                    checked += 1
                    exact += sim.step_time == want
    return {"configs": checked, "exact": exact}


def orders_part(quick: bool, sync: str, dp: int, cost) -> list[dict]:
    rows = []
    pps = (2, 4) if quick else (2, 4, 8)
    for name in WORKLOADS[:2] if quick else WORKLOADS:
        for p in pps:
            for m in (p, 2 * p, 4 * p, 8 * p):
                n = max(512, dp * m * 8)
                lens = workloads.lengths(name, n, seed=0)
                per_mb = -(-int(lens.sum()) // (dp * m))
                cap = max(int(lens.max()), 2 * per_mb)
                for schedule, v in LAYOUTS:
                    t0 = time.perf_counter()
                    ours = plan(
                        lens,
                        dp,
                        cap,
                        cost=cost,
                        sync=sync,
                        min_micro_batches=m,
                        pp_size=p,
                        schedule=schedule,
                        virtual_stages=v,
                    )
                    dt = time.perf_counter() - t0
                    sim = ours.simulate_pipeline()
                    row = {
                        "workload": name,
                        "p": p,
                        "m": ours.num_micro_batches,
                        "schedule": schedule + (f"/v{v}" if v > 1 else ""),
                        "planner": sim.step_time,
                        "bound": sim.lower_bound,
                        "gap": sim.gap,
                        "plan_s": dt,
                    }
                    worst = 0.0
                    for order in ORDERS:
                        t = reorder(ours, order).simulate_pipeline().step_time
                        row[order] = t / sim.step_time - 1  # how much slower than ours
                        worst = min(worst, row[order])
                    row["planner_le_all"] = worst >= -1e-12
                    rows.append(row)
    return rows


def brute_part(quick: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cases = 60 if quick else 240
    rec = []
    for _ in range(cases):
        schedule, v = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
        if schedule == "interleaved":
            p = int(rng.choice([2, 3]))
            m = p * int(rng.integers(1, 7 // p + 1))
        else:
            p = int(rng.choice([2, 4, 8]))
            m = int(rng.integers(2, 8))
        f = rng.lognormal(0.0, 0.8, m)
        b = f * rng.uniform(2.0, 2.5, m)
        spec = check_pipeline(p, schedule, v)
        perms = np.asarray(list(itertools.permutations(range(m))))
        opt = float(graph(spec, m).step_times(f[perms], b[perms]).min())
        _, t_plan = best_orders(f[None], b[None], None, spec)
        _, t_heur = best_orders(f[None], b[None], None, spec, exact_limit=0)
        o = ORDERS["light-ends"](f + b)
        t_verl = float(graph(spec, m).step_times(f[o][None], b[o][None])[0])
        rec.append((float(t_plan[0]) / opt - 1, float(t_heur[0]) / opt - 1, t_verl / opt - 1))
    arr = np.asarray(rec)
    return {
        "cases": cases,
        "planner_within_1pct": float(np.mean(arr[:, 0] <= 0.01)),
        "planner_optimal": float(np.mean(arr[:, 0] <= 1e-12)),
        "heuristic_within_1pct": float(np.mean(arr[:, 1] <= 0.01)),
        "heuristic_optimal": float(np.mean(arr[:, 1] <= 1e-12)),
        "heuristic_worst": float(arr[:, 1].max()),
        "verl_within_1pct": float(np.mean(arr[:, 2] <= 0.01)),
        "verl_median_excess": float(np.median(arr[:, 2])),
    }


def random_part(quick: bool, seed: int = 1) -> list[dict]:
    """Unequal micro-batches (lognormal costs, sigma 0.8), larger m: where order matters."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in (4, 8):
        for m in (2 * p, 4 * p, 8 * p):
            for schedule, v in LAYOUTS[1:]:
                spec = check_pipeline(p, schedule, v)
                reps = 3 if quick else 10
                f = rng.lognormal(0.0, 0.8, (reps, m))
                b = f * rng.uniform(2.0, 2.5, (reps, m))
                # One draw at a time: passed together they would be replicas of one step, and
                # replicas that cannot set the step are not searched.
                ours = np.array(
                    [best_orders(f[r : r + 1], b[r : r + 1], None, spec)[1][0] for r in range(reps)]
                )
                g = graph(spec, m)
                row = {"p": p, "m": m, "schedule": schedule + (f"/v{v}" if v > 1 else "")}
                for name, fn in ORDERS.items():
                    o = np.stack([fn(f[r] + b[r]) for r in range(reps)])
                    t = g.step_times(np.take_along_axis(f, o, 1), np.take_along_axis(b, o, 1))
                    row[name] = float(np.median(t / ours - 1))
                bounds = [
                    pipeline_lower_bound(f[r], b[r], p, virtual_stages=v, schedule=schedule)
                    for r in range(reps)
                ]
                row["gap"] = float(np.median(ours / np.asarray(bounds) - 1))
                rows.append(row)
    return rows


def verl_part(quick: bool, sync: str, cost) -> list[dict]:
    from seqbalance.planning.baselines import verl
    from seqbalance.planning.pipeline_plans import pipeline_setup, simulate_plan_pipeline

    rows = []
    dp, cap = 8, 32768
    for name in WORKLOADS[:2] if quick else WORKLOADS:
        lens = workloads.lengths(name, 1024, seed=0)
        theirs = verl(lens, dp, cap, cost=cost, sync=sync)
        m = theirs.num_micro_batches
        for p in (2, 4) if quick else (2, 4, 8):
            for schedule in ("gpipe", "1f1b"):
                setup = pipeline_setup(lens, cost, p, schedule, 1)
                t_verl = simulate_plan_pipeline(
                    theirs.micro_batches, theirs.costs, theirs.per_microbatch, theirs.lengths,
                    False, sync, setup,
                ).step_time
                ours = plan(
                    lens, dp, cap, cost=cost, sync=sync, pp_size=p, schedule=schedule,
                    min_micro_batches=m,
                )
                t_ours = ours.simulate_pipeline().step_time
                rows.append(
                    {
                        "workload": name,
                        "p": p,
                        "schedule": schedule,
                        "m_verl": m,
                        "m_ours": ours.num_micro_batches,
                        "verl_over_cap": theirs.violations()["over_capacity"],
                        "verl_vs_ours": t_verl / t_ours - 1,
                    }
                )
    return rows


def speed_part(cost) -> list[dict]:
    lens = workloads.lengths("rl-math", 8192, seed=0)
    out = []
    for sync in ("fsdp", "ddp"):
        base, _ = best_time(lambda s=sync: plan(lens, 64, 32768, cost=cost, sync=s), repeat=5)
        for schedule, v in LAYOUTS[1:]:
            pp, p = best_time(
                lambda s=sync, sc=schedule, vv=v: plan(
                    lens, 64, 32768, cost=cost, sync=s, pp_size=8, schedule=sc, virtual_stages=vv
                ),
                repeat=5,
            )
            out.append(
                {
                    "sync": sync,
                    "schedule": schedule + (f"/v{v}" if v > 1 else ""),
                    "m": p.num_micro_batches,
                    "plan_s_pp1": base,
                    "plan_s_pp8": pp,
                    "ratio": pp / base,
                    "gap": p.simulate_pipeline().gap,
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sync", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--json", default="bench/results/pp.json")
    args = ap.parse_args()
    cost = load_cost(args.model)

    closed = closed_forms_part()
    print(f"closed forms (equal micro-batches): {closed['exact']}/{closed['configs']} exact\n")
    rows = orders_part(args.quick, args.sync, args.dp, cost)
    cols = ["workload", "p", "m", "schedule", "gap", *ORDERS, "planner_le_all", "plan_s"]
    print(f"orders ({args.sync}, dp={args.dp}): columns per order = its step / planner's - 1")
    print_table(rows, cols)
    verl = np.array([r["light-ends"] for r in rows])
    gaps = np.array([r["gap"] for r in rows])
    # GPipe's step does not depend on the order (flow-shop formula): summarise without it too.
    ordered = [r for r in rows if not r["schedule"].startswith("gpipe")]
    verl_o = np.array([r["light-ends"] for r in ordered])
    summary = {
        "configs": len(rows),
        "planner_le_every_baseline": all(r["planner_le_all"] for r in rows),
        "median_improvement_over_verl": float(np.median(verl)),
        "median_improvement_over_verl_1f1b_interleaved": float(np.median(verl_o)),
        "mean_improvement_over_verl_1f1b_interleaved": float(np.mean(verl_o)),
        "configs_better_than_verl": int(np.sum(verl > 1e-12)),
        "max_improvement_over_verl": float(verl.max()),
        "median_gap_to_bound": float(np.median(gaps)),
        "p90_gap_to_bound": float(np.quantile(gaps, 0.9)),
        "max_gap_to_bound": float(gaps.max()),
        **{f"median_vs_{o}": float(np.median([r[o] for r in rows])) for o in ORDERS},
    }
    print("\nsummary:", {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()})

    brute = brute_part(args.quick)
    print("\nbrute force (m <= 7):", brute)
    e2e = verl_part(args.quick, args.sync, cost)
    print("\nend to end vs verl (its packing and order; seqbalance at verl's count)")
    print_table(e2e, ["workload", "p", "schedule", "m_verl", "m_ours", "verl_over_cap",
                      "verl_vs_ours"])
    v = np.array([r["verl_vs_ours"] for r in e2e])
    print(f"verl's step / seqbalance's - 1: median {np.median(v):.4f}, min {v.min():.4f}, "
          f"max {v.max():.4f}")
    rand = random_part(args.quick)
    print("\nunequal micro-batches (lognormal, 1 replica; median over draws of order / ours - 1)")
    print_table(rand, ["p", "m", "schedule", "gap", *ORDERS])
    speed = speed_part(cost)
    print("\nspeed: 8,192 rl-math sequences, dp 64 x pp 8 (best of 5; machine shared)")
    print_table(speed, ["sync", "schedule", "m", "plan_s_pp1", "plan_s_pp8", "ratio", "gap"])
    path = write_json(
        args.json,
        {
            "machine": machine_info(),
            "closed_forms": closed,
            "sync": args.sync,
            "dp": args.dp,
            "model": args.model,
            "orders": rows,
            "summary": summary,
            "brute_force": brute,
            "verl_end_to_end": e2e,
            "unequal": rand,
            "speed": speed,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
