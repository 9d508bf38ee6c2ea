"""Pipelines over static context parallelism (``dp x pp x cp``): seqbalance against the plans
a user gets without it.

Every plan here is a static-CP plan (each sequence over its replica's ``cp_size`` GPUs, in
the balanced layout), run through the same pipeline model
(:mod:`seqbalance.planning.cp_pipeline`: a replica's slot as slow as its slowest GPU,
forward and backward apart) and simulated by the same simulator. Rows:

``seqbalance``
    ``plan(..., cp="static", pp_size=P)``: replicas planned for the pipeline, slots ordered
    on the pieces' phases.
``no-pp``
    ``plan(..., cp="static")`` without the pipeline (the same micro-batch multiple), run in
    its own slot order: what a static-CP user gets today. ``no-pp+order`` is the same slots
    in the order seqbalance's search gives them (packing vs order).
``verl``
    verl's dynamic micro-batching (:func:`seqbalance.planning.baselines.verl`, its KK
    pipeline and light-ends order; bench/pipelines_check.py compares it with verl's code)
    over the replicas, each sequence's largest piece as its tokens, then split over the
    replica's GPUs; ``verl+order`` the same slots in seqbalance's order. Under the interleaved
    schedule only where verl's count is a multiple of ``pp`` (verl raises it with
    ``num_batches_divided_by``, which this baseline does not reproduce).

Cost: training FLOPs of qwen2.5-7b, 400 TFLOP/s a GPU, CP ring at 25 GB/s (inter-node) with
half a step's attention hiding its transfer; ``pp_comm``: one token's activations (hidden
3,584 x 2 bytes) over the same 25 GB/s. Columns: simulated pipeline step (PFLOP-equivalent
on one stage's share), ratio to seqbalance, the gap of seqbalance to the pipeline bound of its
own slots, slots per GPU, plan time. Every plan's pieces are checked (no GPU over the cap,
every token once, the layout) with ``violations()``.

    python bench/cp_pp.py            # the grid (a few minutes on 2 cores)
    python bench/cp_pp.py --quick    # a subset
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.costs.context_parallel import largest_piece_tokens
from seqbalance.planning.cp_pipeline import CPPipelineSetup, order_slots
from seqbalance.planning.cp_plans import CPPlan
from seqbalance.planning.pipeline import check_pipeline

FLOPS = 4e14
BANDWIDTH = 2.5e10
CP_COST = {"bandwidth": BANDWIDTH, "cost_per_second": FLOPS, "overlap": 0.5}
PP_COMM = 3584 * 2 / BANDWIDTH * FLOPS  # FLOP-equivalent per token sent to the next stage

# (workload, sequences, dp, cp, pp, max_tokens): the largest piece fits at cp
GRID = [
    ("long-mix", 2048, 2, 8, 4, 16384),
    ("long-mix", 2048, 4, 4, 2, 32768),
    ("long-context", 1024, 2, 8, 4, 32768),
    ("long-context", 2048, 2, 8, 8, 32768),
    ("rl-math", 2048, 8, 2, 4, 16384),
    ("sft-chat", 4096, 8, 2, 8, 16384),
]
LAYOUTS = [("1f1b", 1), ("interleaved", 2)]


def _pieces(grid: list[list[list[int]]], lens: np.ndarray, cp: int) -> list:
    """Static CP pieces of a replica grid: every sequence over its replica's cp GPUs."""
    out: list = [[] for _ in range(len(grid) * cp)]
    for r, rank in enumerate(grid):
        for mb in rank:
            slot: list[list] = [[] for _ in range(cp)]
            for i in mb:
                for k, ranges in enumerate(sb.costs.context_parallel.balanced_layout(
                        int(lens[i]), cp)):
                    slot[k].extend((i, s, e) for s, e in ranges)
            for k in range(cp):
                out[r * cp + k].append(slot[k])
    return out


def _as_pipelined(pieces, lens, cap, cp, cpc, sync, setup, strategy) -> CPPlan:
    return CPPlan(pieces, lens, max_tokens=cap, cp_size=cp, cp="static", cp_cost=cpc,
                  sync=sync, strategy=strategy, pipeline=setup)  # fmt: skip


def _ordered(p: CPPlan, setup, sync) -> CPPlan:
    pieces = order_slots(p.pieces, p.lengths, p.cp_cost, p.cp_size, sync, setup)
    return _as_pipelined(pieces, p.lengths, p.max_tokens, p.cp_size, p.cp_cost, sync, setup,
                         p.strategy + "+order")  # fmt: skip


def run_case(workload, n, dp, cp, pp, cap, schedule, v, sync) -> dict:
    lens = sb.workloads.lengths(workload, n, seed=0)
    kw = {"cost": "qwen2.5-7b", "cp_size": cp, "cp": "static", "cp_cost": CP_COST, "sync": sync}
    mult = pp if schedule == "interleaved" else 1
    setup = CPPipelineSetup(check_pipeline(pp, schedule, v), PP_COMM)
    t = time.perf_counter()
    ours = sb.plan(lens, dp, cap, pp_size=pp, schedule=schedule, virtual_stages=v,
                   pp_comm=PP_COMM, **kw)  # fmt: skip
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    flat = sb.plan(lens, dp, cap, micro_batch_multiple=mult, **kw)
    t_flat = time.perf_counter() - t
    cpc = flat.cp_cost
    plans = {"seqbalance": ours}
    plans["no-pp"] = _as_pipelined(flat.pieces, lens, cap, cp, cpc, sync, setup, "no-pp")
    plans["no-pp+order"] = _ordered(plans["no-pp"], setup, sync)
    ptok = largest_piece_tokens(lens, cp)
    grid = sb.planning.baselines.verl(ptok, dp, cap, cost=None, sync=sync).micro_batches
    if max(len(r) for r in grid) % mult == 0:  # else verl would raise its count (module doc)
        plans["verl"] = _as_pipelined(_pieces(grid, lens, cp), lens, cap, cp, cpc, sync, setup,
                                      "verl")  # fmt: skip
        plans["verl+order"] = _ordered(plans["verl"], setup, sync)
    steps = {k: p.simulate_pipeline().step_time for k, p in plans.items()}
    bad = {k: {a: b for a, b in p.violations().items() if b and a != "empty"}
           for k, p in plans.items()}  # fmt: skip
    sim = ours.simulate_pipeline()
    return {
        "workload": workload, "n": n, "dp": dp, "cp": cp, "pp": pp, "max_tokens": cap,
        "schedule": schedule if v == 1 else f"{schedule} v={v}", "sync": sync,
        "slots": {k: p.num_micro_batches for k, p in plans.items()},
        "steps": steps,
        "ratio": {k: s / steps["seqbalance"] for k, s in steps.items()},
        "gap": sim.gap, "bubble": sim.bubble_fraction,
        "violations": {k: b for k, b in bad.items() if b},
        "plan_s": t_ours, "plan_no_pp_s": t_flat,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "cp_pp.json"))
    args = ap.parse_args()
    grid = GRID[::3] if args.quick else GRID
    rows, table = [], []
    for case in grid:
        for schedule, v in LAYOUTS:
            for sync in ("fsdp", "ddp"):
                r = run_case(*case, schedule, v, sync)
                rows.append(r)
                table.append({
                    "workload": f"{r['workload']} {r['n']}",
                    "dp x pp x cp": f"{r['dp']}x{r['pp']}x{r['cp']}",
                    "schedule": r["schedule"], "sync": sync,
                    "step PF": r["steps"]["seqbalance"] / 1e15,
                    "no-pp": r["ratio"]["no-pp"], "no-pp+order": r["ratio"]["no-pp+order"],
                    "verl": r["ratio"].get("verl", float("nan")),
                    "verl+order": r["ratio"].get("verl+order", float("nan")),
                    "gap": f"{r['gap']:+.1%}", "bubble": f"{r['bubble']:.1%}",
                    "slots": f"{r['slots']['seqbalance']}/{r['slots']['no-pp']}/"
                             f"{r['slots'].get('verl', '-')}",
                    "plan s": r["plan_s"],
                    "bad": "yes" if r["violations"] else "",
                })  # fmt: skip
                print(f"  {table[-1]['workload']} {table[-1]['dp x pp x cp']} {schedule} {sync}",
                      file=sys.stderr)  # fmt: skip
    print_table(table, list(table[0]))
    ratios = {k: [r["ratio"][k] for r in rows if k in r["ratio"]]
              for k in ("no-pp", "no-pp+order", "verl", "verl+order")}  # fmt: skip
    summary = {k: {"min": min(v), "median": float(np.median(v)), "max": max(v), "cases": len(v)}
               for k, v in ratios.items() if v}  # fmt: skip
    print("\nstep / seqbalance's step (above 1: slower than seqbalance)")
    for k, s in summary.items():
        print(f"  {k:12s} min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f}  "
              f"({s['cases']} cases)")  # fmt: skip
    print(f"cases with a constraint broken: {sum(1 for r in rows if r['violations'])}")
    write_json(args.json, {"machine": machine_info(), "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
