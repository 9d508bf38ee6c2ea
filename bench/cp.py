"""Context-parallel planning: dynamic CP against static CP and a Megatron-style scheduler.

Grid: long-context mixes (``long-context``: 1% of 32k-256k; ``long-mix``: 0.1% of 16k-128k)
x meshes ``dp x cp`` from 8 to 256 GPUs x ``max_tokens`` per GPU 8k-64k x ring bandwidth
from NVLink-class (400 GB/s) to inter-node (25 GB/s). Cost: training FLOPs of qwen2.5-7b,
400 TFLOP/s achieved per GPU, half of a ring step's attention overlapping its transfer.

For every configuration it prints and saves: the simulated FSDP step of each planner, the
ratios dynamic / static and dynamic / Megatron-style, the gap of each to the proven CP lower
bound (``cp_lower_bound``), the time to plan, and a check of the hard constraints of all
three plans made here from the pieces (not from ``violations()``): no GPU above
``max_tokens`` in any slot, every token of every sequence in exactly one piece, every CP
group ``d`` distinct GPUs with ``d`` a power of two <= ``cp_size``, equal slot counts.
Last, it times a 10,000-sequence, 256-GPU dynamic plan (best of 3).

    python bench/cp.py            # full grid (a few minutes)
    python bench/cp.py --quick    # a small subset
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.planning.cp_baselines import megatron_cp, static_cp

BANDWIDTHS = {"nvlink": 4e11, "ib-800g": 1e11, "ib-200g": 2.5e10}
CP_COST = {"cost_per_second": 4e14, "overlap": 0.5}


def constraint_errors(p, lengths: np.ndarray, cap: int, cp_size: int) -> list[str]:
    """Hard constraints checked directly on ``p.pieces``; an empty list when all hold."""
    errs = []
    m = len(p.pieces[0])
    if any(len(g) != m for g in p.pieces):
        errs.append("unequal slot counts")
    cover: dict[int, list[tuple[int, int]]] = {}
    where: dict[int, set[tuple[int, int]]] = {}
    for g, gpu in enumerate(p.pieces):
        for j, slot in enumerate(gpu):
            if sum(e - s for _, s, e in slot) > cap:
                errs.append(f"GPU {g} slot {j} above max_tokens")
            for i, s, e in slot:
                cover.setdefault(i, []).append((s, e))
                where.setdefault(i, set()).add((g, j))
    for i, length in enumerate(lengths.tolist()):
        ranges = sorted(r for r in cover.get(i, []) if r[1] > r[0])
        pos = 0
        for s, e in ranges:
            if s != pos:
                errs.append(f"sequence {i}: tokens {pos}..{s} missing or doubled")
                break
            pos = e
        if pos != length:
            errs.append(f"sequence {i}: covered to {pos} of {length}")
        places = where.get(i, set())
        gpus = sorted({g for g, _ in places})
        d = len(gpus)
        if len({j for _, j in places}) != 1 or d & (d - 1) or d > cp_size:
            errs.append(f"sequence {i}: bad CP group {sorted(places)}")
    return errs[:5]


def run_config(name, n, dp, cp, cap, bw_name, seed, cost):
    lengths = sb.workloads.lengths(name, n, seed)
    kw = {"cost": cost, "cp_size": cp, "cp_cost": dict(CP_COST, bandwidth=BANDWIDTHS[bw_name])}
    t0 = time.perf_counter()
    dyn = sb.plan(lengths, dp, cap, cp="dynamic", allow_empty=True, **kw)
    plan_s = time.perf_counter() - t0
    plans = {
        "dynamic": dyn,
        "static": static_cp(lengths, dp, cap, **kw),
        "megatron": megatron_cp(lengths, dp, cap, **kw),
    }
    sims = {k: p.simulate() for k, p in plans.items()}
    errors = {k: constraint_errors(p, lengths, cap, cp) for k, p in plans.items()}
    step = {k: s.step_time for k, s in sims.items()}
    deg = dyn.degrees()
    return {
        "workload": name,
        "n": n,
        "dp": dp,
        "cp": cp,
        "gpus": dp * cp,
        "max_tokens": cap,
        "link": bw_name,
        "bandwidth": BANDWIDTHS[bw_name],
        "slots": dyn.num_micro_batches,
        "plan_s": plan_s,
        "dyn/static": step["dynamic"] / step["static"],
        "dyn/megatron": step["dynamic"] / step["megatron"],
        "gap_dyn": sims["dynamic"].gap,
        "gap_static": sims["static"].gap,
        "gap_megatron": sims["megatron"].gap,
        "lower_bound": sims["dynamic"].lower_bound,
        "steps": step,
        "dyn_cp_seqs": int((deg > 1).sum()),
        "empty": dyn.violations()["empty"],
        "constraints_ok": not any(errors.values()),
        "errors": errors,
        "chosen": dyn.notes[0] if dyn.notes else "",
    }


def grid(quick: bool):
    # (cp, dp values, max_tokens values): every sequence (<= 256k) fits at d = cp
    meshes = [(8, (1, 8, 32), (32768, 65536)), (32, (1, 8), (8192, 16384, 32768))]
    names = ("long-context", "long-mix")
    links = tuple(BANDWIDTHS)
    if quick:
        meshes = [(8, (1, 8), (32768,)), (32, (1,), (8192,))]
        names, links = ("long-context",), ("nvlink", "ib-200g")
    for name in names:
        for cp, dps, caps in meshes:
            for dp in dps:
                for cap in caps:
                    for link in links:
                        n = int(np.clip(16 * dp * cp, 1024, 8192))
                        yield name, n, dp, cp, cap, link


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of the grid")
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/cp.json")
    args = ap.parse_args(argv)
    cost = sb.load_cost(args.model)
    rows = []
    cols = [
        "workload",
        "gpus",
        "dp",
        "cp",
        "max_tokens",
        "link",
        "slots",
        "dyn_cp_seqs",
        "dyn/static",
        "dyn/megatron",
        "gap_dyn",
        "gap_static",
        "gap_megatron",
        "plan_s",
        "constraints_ok",
    ]
    for cfg in grid(args.quick):
        rows.append(run_config(*cfg, args.seed, cost))
        r = rows[-1]
        print(
            f"{r['workload']} gpus={r['gpus']} cp={r['cp']} cap={r['max_tokens']} "
            f"{r['link']}: dyn/static {r['dyn/static']:.3f} dyn/megatron "
            f"{r['dyn/megatron']:.3f} gap {r['gap_dyn']:.3f} ok={r['constraints_ok']}",
            flush=True,
        )
    print()
    print_table(rows, cols)
    ok = all(r["constraints_ok"] for r in rows)
    not_worse = all(r["dyn/static"] <= 1 + 1e-9 and r["dyn/megatron"] <= 1 + 1e-9 for r in rows)
    rs = np.array([r["dyn/static"] for r in rows])
    rm = np.array([r["dyn/megatron"] for r in rows])
    gaps = np.array([r["gap_dyn"] for r in rows])
    summary = {
        "configs": len(rows),
        "constraints_ok_all": ok,
        "dynamic_not_slower_all": not_worse,
        "dyn/static": {
            "min": float(rs.min()),
            "geomean": float(np.exp(np.log(rs).mean())),
            "max": float(rs.max()),
        },
        "dyn/megatron": {
            "min": float(rm.min()),
            "geomean": float(np.exp(np.log(rm).mean())),
            "max": float(rm.max()),
        },
        "gap_dyn": {
            "min": float(gaps.min()),
            "median": float(np.median(gaps)),
            "max": float(gaps.max()),
        },
        "chosen_own_construction": sum("layout" not in r["chosen"] for r in rows),
    }
    # The speed target: 10,000 sequences on 256 GPUs (dp 32 x cp 8), max_tokens 32k.
    lengths = sb.workloads.lengths("long-context", 10_000, args.seed)
    kw = {"cost": cost, "cp_size": 8, "cp_cost": dict(CP_COST, bandwidth=BANDWIDTHS["nvlink"])}
    t, p = best_time(lambda: sb.plan(lengths, 32, 32768, cp="dynamic", **kw), repeat=3, budget_s=30)
    summary["time_10k_seqs_256_gpus_s"] = t
    summary["time_10k_constraints_ok"] = not constraint_errors(p, lengths, 32768, 8)
    print()
    for k, v in summary.items():
        print(f"{k}: {v}")
    path = write_json(args.json, {"machine": machine_info(), "summary": summary, "rows": rows})
    print(f"wrote {path}")
    return 0 if ok and not_worse else 1


if __name__ == "__main__":
    sys.exit(main())
