"""Plan quality and time where a batch nearly fills its micro-batches.

``bench/plan.py`` and ``bench/latency.py`` use caps of 16,384-65,536 tokens, which seldom
fill the fewest micro-batch count tightly; a training step's batch often does, since the
batch varies from step to step and the cap does not. Here each cap is chosen so that
``m`` micro-batches per rank would be filled to a fraction ``f`` of their tokens,
``max_tokens = ceil(total / (dp * m * f))`` (skipped where a sequence is longer), and every
workload is planned at ``effort="default"`` and ``effort="thorough"`` (the full search),
FSDP and DDP, with the Qwen2.5-7B FLOPs cost.

Reported per sync and fill: the plans, how many default plans are more than 0.1% longer
than the full search's (the default effort's stop gap), the worst ratio, and the default's
time (best of ``--repeat`` calls; the full search is timed once); per size, the
default's time. ``--against FILE`` compares this run's default plans with a
``fill.json`` written by another revision (save one before a change, compare after): the
plans that got longer, the worst, and the time ratio.

    python bench/fill.py                       # the full sweep (a few minutes)
    python bench/fill.py --quick               # n <= 256, fills 0.8-0.995
    python bench/fill.py --json /tmp/before.json      # on the old revision, then:
    python bench/fill.py --against /tmp/before.json   # on the new one

Writes ``bench/results/fill.json`` (``--quick``: ``fill_quick.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_time, machine_info, print_table, write_json

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan

SIZES = [(64, 8), (256, 8), (1024, 8), (512, 16), (2048, 32)]
COUNTS = (2, 3, 4, 6, 9, 14)
FILLS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995)
QUICK_SIZES = [(64, 8), (256, 8)]
QUICK_FILLS = (0.8, 0.95, 0.995)
STOP = 1e-3  # the default effort's stop gap: the full search may be this much shorter


def run_one(lens: np.ndarray, dp: int, cap: int, cost: Any, sync: str, repeat: int) -> dict:
    """Both efforts' plans of one request: step, gap to the bound, count and time."""
    out: dict[str, Any] = {}
    for effort, reps in (("default", repeat), ("thorough", 1)):
        secs, p = best_time(
            lambda e=effort: plan(lens, dp, cap, cost=cost, sync=sync, effort=e), repeat=reps
        )
        sim = p.simulate()
        out[effort] = {"step": sim.step_time, "gap": round(sim.gap, 7),
                       "m": p.num_micro_batches, "ms": round(secs * 1e3, 2)}  # fmt: skip
    out["ratio"] = out["default"]["step"] / out["thorough"]["step"]
    # The baselines that keep the cap and leave no micro-batch empty: the default plan is
    # never slower than one (within the stop gap where its own gap is within it), and
    # never has more micro-batches than AReaL's or verl's.
    costs = cost(lens)
    base = {}
    for name, fn in BASELINES.items():
        b = fn(lens, dp, cap, cost=costs)
        v = b.violations()
        if v["over_capacity"] == 0 and v["empty"] == 0:
            base[name] = {"m": b.num_micro_batches, "step": b.simulate(sync=sync).step_time}
    d = out["default"]
    slack = 1 + STOP if d["gap"] <= STOP else 1 + 1e-12
    beaten = [k for k, b in base.items() if d["m"] == b["m"] and d["step"] > b["step"] * slack]
    more = [k for k in ("areal", "verl") if k in base and d["m"] > base[k]["m"]]
    out["beaten_by"] = beaten + [f"{k} (fewer micro-batches)" for k in more]
    fewest = [b for b in base.values() if b["m"] == d["m"]]
    out["best_baseline_ratio"] = min(b["step"] for b in fewest) / d["step"] if fewest else None
    return out


def _summary(recs: list[dict], key: str) -> list[dict]:
    rows = []
    for value in sorted({r[key] for r in recs}):
        group = [r for r in recs if r[key] == value]
        ms = sorted(r["default"]["ms"] for r in group)
        thorough = sorted(r["thorough"]["ms"] for r in group)
        ratios = [r["best_baseline_ratio"] for r in group if r["best_baseline_ratio"]]
        worst = max(group, key=lambda r: r["ratio"])
        rows.append({
            key: value if key != "size" else f"{value[0]} x {value[1]}",
            "plans": len(group),
            "over_0.1%": sum(r["ratio"] > 1 + STOP for r in group),
            "worst_%": round(100 * (worst["ratio"] - 1), 3),
            "ms_median": round(ms[len(ms) // 2], 1),
            "ms_p90": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 1),
            "ms_max": round(ms[-1], 1),
            "thorough_ms_median": round(thorough[len(thorough) // 2], 1),
            "beaten": sum(bool(r["beaten_by"]) for r in group),
            "baseline/plan": round(_geomean(ratios), 4) if ratios else None,
        })  # fmt: skip
    return rows


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _against(recs: list[dict], path: str) -> dict:
    old = {r["key"]: r for r in json.loads(Path(path).read_text())["records"]}
    pairs = [(r, old[r["key"]]) for r in recs if r["key"] in old]
    if not pairs:
        return {"compared": 0}
    step = [(r["default"]["step"] / o["default"]["step"], r["key"]) for r, o in pairs]
    longer = sorted((s for s in step if s[0] > 1 + 1e-12), reverse=True)
    times = [r["default"]["ms"] / o["default"]["ms"] for r, o in pairs]
    return {
        "file": path,
        "compared": len(pairs),
        "longer": len(longer),
        "longer_over_0.1%": sum(s[0] > 1 + STOP for s in longer),
        "shorter": sum(s[0] < 1 - 1e-12 for s in step),
        "worst": longer[0][0] if longer else 1.0,
        "worst_key": longer[0][1] if longer else None,
        "time_ratio_geomean": _geomean(times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n <= 256, three fills")
    ap.add_argument("--sync", nargs="+", default=["fsdp", "ddp"], choices=["fsdp", "ddp"])
    ap.add_argument("--repeat", type=int, default=3, help="default-effort calls timed (best)")
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--against", help="a fill.json of another revision to compare with")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    cost = load_cost(args.model)
    sizes, fills = (QUICK_SIZES, QUICK_FILLS) if args.quick else (SIZES, FILLS)
    recs: list[dict] = []
    t0 = time.perf_counter()
    for sync in args.sync:
        for name in workloads.NAMES:
            for n, dp in sizes:
                lens = workloads.load(name, n, seed=0).lengths
                for m in COUNTS:
                    for f in fills:
                        cap = math.ceil(int(lens.sum()) / (dp * m * f))
                        if cap < int(lens.max()):
                            continue
                        rec = run_one(lens, dp, cap, cost, sync, args.repeat)
                        rec.update(key=f"{sync} {name} {n}x{dp} m{m} f{f}", sync=sync,
                                   workload=name, size=(n, dp), count=m, fill=f,
                                   max_tokens=cap)  # fmt: skip
                        recs.append(rec)
        print(f"{sync}: {sum(r['sync'] == sync for r in recs)} plans", flush=True)
    cols = ["plans", "over_0.1%", "worst_%", "ms_median", "ms_p90", "ms_max",
            "thorough_ms_median", "beaten", "baseline/plan"]  # fmt: skip
    by_fill, by_size = {}, {}
    for sync in args.sync:
        mine = [r for r in recs if r["sync"] == sync]
        by_fill[sync], by_size[sync] = _summary(mine, "fill"), _summary(mine, "size")
        print(f"\n{sync}: default step / thorough step, and the default's time, by fill")
        print_table(by_fill[sync], ["fill", *cols])
        print(f"\n{sync}: by size (n x dp)")
        print_table(by_size[sync], ["size", *cols])
    worst = sorted(recs, key=lambda r: -r["ratio"])[:10]
    print("\nworst default / thorough:")
    print_table(
        [{"plan": r["key"], "longer_%": round(100 * (r["ratio"] - 1), 3),
          "gap": round(r["default"]["gap"], 5),
          "thorough_gap": round(r["thorough"]["gap"], 5),
          "m": f"{r['default']['m']}/{r['thorough']['m']}", "ms": round(r["default"]["ms"], 1)}
         for r in worst],
        ["plan", "longer_%", "gap", "thorough_gap", "m", "ms"],
    )  # fmt: skip
    slowest = sorted(recs, key=lambda r: -r["default"]["ms"])[:10]
    print("\nslowest at the default effort:")
    print_table(
        [{"plan": r["key"], "ms": round(r["default"]["ms"], 1),
          "thorough_ms": round(r["thorough"]["ms"], 1), "gap": round(r["default"]["gap"], 5)}
         for r in slowest],
        ["plan", "ms", "thorough_ms", "gap"],
    )  # fmt: skip
    beaten = [r for r in recs if r["beaten_by"]]
    print(f"\nplans slower than a baseline, or with more micro-batches: {len(beaten)}")
    for r in beaten[:10]:
        print(f"  {r['key']}: {', '.join(r['beaten_by'])}")
    against = _against(recs, args.against) if args.against else None
    if against is not None:
        print(f"\nagainst {args.against}: {json.dumps(against)}")
    print(f"\n{len(recs)} plans in {time.perf_counter() - t0:.0f} s")
    quick = "bench/results/fill_quick.json"
    path = args.json or (quick if args.quick else "bench/results/fill.json")
    out = write_json(path, {
        "machine": machine_info(), "model": args.model, "counts": COUNTS, "fills": fills,
        "sizes": sizes, "by_fill": by_fill, "by_size": by_size, "against": against,
    })  # fmt: skip
    _add_records(out, recs)
    print(f"wrote {out}")
    return 0


_IN_KEY = ("sync", "workload", "size", "count", "fill")


def _add_records(path: Path, recs: list[dict]) -> None:
    """Append ``recs`` to the JSON object written at ``path``, one compact record a line
    (1,580 records indented would take 1.8 MB)."""
    head = path.read_text().rstrip()
    assert head.endswith("}")
    # (the key names sync, workload, size, count and fill)
    slim = [{k: v for k, v in r.items() if k not in _IN_KEY} for r in recs]
    lines = ",\n".join("    " + json.dumps(r, separators=(",", ":"), default=float) for r in slim)
    path.write_text(head[:-1].rstrip() + ',\n  "records": [\n' + lines + "\n  ]\n}\n")


if __name__ == "__main__":
    raise SystemExit(main())
