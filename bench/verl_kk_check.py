"""Check ``partitioning._verl_kk`` (re-exported by ``compat._verl_kk``) against verl's own
differencing, equal-size and count-free,
and the drop-ins against verl's heaviest part; the same for AReaL's ``_kk_partition``
(verl's rules) and, when their checkouts are given, slime's and OpenRLHF's copies of
``karmarkar_karp``. Also checks the drop-in's
``micro_batches_of_lengths(..., match_framework_count=True)`` against verl's micro-batching
loop: the same count, and a heaviest micro-batch never heavier.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    python bench/verl_kk_check.py --ext /work/ext9 [--slime DIR --openrlhf DIR] [--cases 400]
        [--time]

verl's and AReaL's modules are imported from ``--ext``, slime's and OpenRLHF's from source
checkouts, with their heavy imports stubbed (as in ``bench/compat.py``). Inputs: verl's workloads
``24576 L + L**2`` of the standard workloads (lengths clipped to 32,768; equal-size
n = 64-8,192 and k = 2-64, count-free n up to 2,048 as verl's free mode costs O(n k log k)
Python steps) and small integers drawn from a few values (many ties: where the tie rules
decide). For each: whether the reproduced partition is the original's (same index sets
in the same order), and the heaviest part of the original, of the reproduction and of
the drop-in, minus the lower bound ``ceil(total / k)``. Micro-batching: one rank of
n = 16-512 lengths, caps 4,096-32,768. ``--time``: verl's count-free differencing against
the drop-in's on 8,192 workloads (8 and 1,224 parts), and both modes on tiny inputs.
Prints summary tables and writes JSON (default bench/results/verl_kk_check.json); exits 1
if any check fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_time, machine_info, print_table, write_json
from compat import load_originals, load_slime_openrlhf, verl_dynamic

import seqbalance as sb
from seqbalance.compat import areal as areal_drop_in
from seqbalance.compat import openrlhf as openrlhf_drop_in
from seqbalance.compat import slime as slime_drop_in
from seqbalance.compat import verl as verl_drop_in
from seqbalance.compat._verl_kk import verl_equal_kk_labels, verl_free_kk_labels

WORKLOADS = ("rl-math", "sft-chat", "long-mix", "uniform", "bimodal")


def cases(count: int, seed: int, equal: bool) -> list[tuple[str, np.ndarray, int]]:
    """``count`` (kind, integer weights, k) triples, half workloads and half tie-heavy;
    with ``equal``, n is a multiple of k."""
    rng = np.random.default_rng(seed)
    out = []
    top = 8192 if equal else 2048
    for c in range(count):
        k = int(rng.choice([2, 3, 4, 8, 16, 32, 64]))
        if c % 2 == 0:
            wl = WORKLOADS[(c // 2) % len(WORKLOADS)]
            n = k * int(rng.integers(max(1, 64 // k), top // k + 1))
            if not equal:
                n -= int(rng.integers(0, k))
            lens = np.minimum(sb.workloads.lengths(wl, n, seed=int(rng.integers(1 << 30))),
                              32768).astype(np.int64)  # fmt: skip
            out.append((wl, 24576 * lens + lens * lens, k))
        else:
            n = k * int(rng.integers(1, 64)) - (0 if equal else int(rng.integers(0, k)))
            vals = rng.integers(0, 1000, size=int(rng.integers(1, 6)))
            out.append(("ties", rng.choice(vals, size=n).astype(np.int64), k))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ext", required=True, help="folder with verl 0.9.1 installed (--no-deps)")
    ap.add_argument("--slime", help="slime source checkout (optional)")
    ap.add_argument("--openrlhf", help="OpenRLHF source checkout (optional, with --slime)")
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/verl_kk_check.json")
    ap.add_argument("--time", action="store_true",
                    help="also time verl's count-free karmarkar_karp against the drop-in's "
                    "(8,192 workloads into 8 and 1,224 parts; verl takes ~15 s a call at 1,224)")
    args = ap.parse_args()
    v_orig, a_orig = load_originals(args.ext)
    # Each framework's differencing and the drop-in's, as f(values, k, equal_size).
    frameworks = {
        "verl": (v_orig.karmarkar_karp, verl_drop_in.karmarkar_karp),
        "areal": (a_orig._kk_partition, areal_drop_in._kk_partition),
    }
    if args.slime and args.openrlhf:
        _, o_orig, _ = load_slime_openrlhf(args.slime, args.openrlhf)
        frameworks["slime"] = (
            importlib.import_module("slime.utils.seqlen_balancing").karmarkar_karp,
            slime_drop_in.karmarkar_karp,
        )
        frameworks["openrlhf"] = (o_orig.karmarkar_karp, openrlhf_drop_in.karmarkar_karp)
    records = []
    for equal in (True, False):
        reproduce = verl_equal_kk_labels if equal else verl_free_kk_labels
        mode = "equal" if equal else "free"
        for (kind, w, k), (fw, (orig, drop_in)) in (
            (c, f) for f in frameworks.items() for c in cases(args.cases, args.seed, equal)
        ):
            bound = -(-int(w.sum()) // k)
            theirs = orig(w.tolist(), k, equal)
            labels = reproduce(w.astype(np.float64), k)
            ours = [np.flatnonzero(labels == j).tolist() for j in range(k)]
            same = [sorted(p) for p in theirs] == ours  # the same sets, in verl's order
            heavy_theirs = max(int(w[p].sum()) for p in theirs)
            heavy_ours = max(int(w[p].sum()) for p in ours)
            parts = drop_in(w, k, equal)
            heavy_drop_in = max(int(w[p].sum()) for p in parts)
            records.append({
                "framework": fw, "mode": mode, "kind": kind, "n": int(w.shape[0]), "k": k,
                "same_partition": same, "verl_over_bound": heavy_theirs - bound,
                "reproduction_over_bound": heavy_ours - bound,
                "drop_in_over_bound": heavy_drop_in - bound,
            })  # fmt: skip
    columns = ["framework", "mode", "inputs", "cases", "same partition", "drop-in heavier",
               "drop-in lighter", "drop-in at bound", "original at bound"]  # fmt: skip
    rows = []
    for fw, mode, kind in ((f, m, k) for f in frameworks for m in ("equal", "free")
                           for k in (*WORKLOADS, "ties")):  # fmt: skip
        rs = [r for r in records
              if r["kind"] == kind and r["framework"] == fw and r["mode"] == mode]  # fmt: skip
        if rs:
            rows.append(dict(zip(columns, [
                fw, mode, kind, len(rs), sum(r["same_partition"] for r in rs),
                sum(r["drop_in_over_bound"] > r["verl_over_bound"] for r in rs),
                sum(r["drop_in_over_bound"] < r["verl_over_bound"] for r in rs),
                sum(r["drop_in_over_bound"] == 0 for r in rs),
                sum(r["verl_over_bound"] == 0 for r in rs),
            ])))  # fmt: skip
    print_table(rows, columns)
    bad = [r for r in records if not r["same_partition"]
           or r["drop_in_over_bound"] > r["verl_over_bound"]]  # fmt: skip
    micro = micro_batch_checks(v_orig, max(1, args.cases // 4), args.seed)
    summary = [{
        "workload": wl, "calls": len(rs), "verl failed": sum(r["verl_count"] is None for r in rs),
        "same count": sum(r["same_count"] for r in rs),
        "drop-in heavier": sum(r["heavier"] for r in rs),
    } for wl in WORKLOADS if (rs := [r for r in micro if r["workload"] == wl])]  # fmt: skip
    print_table(summary, list(summary[0]))
    bad += [r for r in micro if r["verl_count"] is not None
            and (not r["same_count"] or r["heavier"])]  # fmt: skip
    print("all reproduced, never heavier" if not bad else f"{len(bad)} FAILED: {bad[:3]}")
    timing = free_timing(v_orig) if args.time else []
    small = small_timing(v_orig) if args.time else []
    if timing:
        print_table(timing, list(timing[0]))
        print_table(small, list(small[0]))
    write_json(args.json, {"machine": machine_info(), "cases": records, "micro_batches": micro,
                           "free_timing": timing, "small_timing": small})  # fmt: skip
    sys.exit(1 if bad else 0)


def free_timing(orig) -> list[dict]:
    """verl's ``karmarkar_karp(equal_size=False)`` against the drop-in's on 8,192 workloads
    (best of 3 for the drop-in, one call of verl's; the two side by side in one run)."""
    out = []
    for wl in ("rl-math", "sft-chat", "long-mix"):
        lens = np.minimum(sb.workloads.lengths(wl, 8192, seed=0), 32768).astype(np.int64)
        w = 24576 * lens + lens * lens
        values = w.tolist()  # verl takes a list
        for k in (8, 1224):
            t_verl, theirs = best_time(lambda k=k, v=values: orig.karmarkar_karp(v, k, False), 1)
            t_ours, parts = best_time(lambda k=k, w=w: verl_drop_in.karmarkar_karp(w, k, False), 3)
            out.append({"workload": wl, "n": 8192, "k": k, "t_verl_s": t_verl,
                        "t_drop_in_s": t_ours, "speedup": t_verl / t_ours,
                        "heaviest drop-in/verl": max(int(w[p].sum()) for p in parts)
                        / max(int(w[p].sum()) for p in theirs)})  # fmt: skip
    return out


def small_timing(orig) -> list[dict]:
    """Tiny inputs (n = 32-64, 4-16 parts), where the drop-in's exact search spends its
    node budget: per workload and mode, the slowest drop-in call against verl's, and the
    range of heaviest-part ratios (drop-in / verl)."""
    out = []
    for equal in (True, False):
        for wl in WORKLOADS:
            t_ours, t_verl, ratios = [], [], []
            for n, k in ((32, 4), (48, 12), (64, 8), (64, 16)):
                lens = np.minimum(sb.workloads.lengths(wl, n, seed=1), 32768).astype(np.int64)
                w = 24576 * lens + lens * lens
                values = w.tolist()
                t1, theirs = best_time(lambda v=values, k=k, e=equal: orig.karmarkar_karp(v, k, e))
                t2, parts = best_time(
                    lambda w=w, k=k, e=equal: verl_drop_in.karmarkar_karp(w, k, e), 1
                )
                t_verl.append(t1)
                t_ours.append(t2)
                ratios.append(max(int(w[p].sum()) for p in parts)
                              / max(int(w[p].sum()) for p in theirs))  # fmt: skip
            out.append({"mode": "equal" if equal else "free", "workload": wl,
                        "slowest drop-in s": max(t_ours), "slowest verl s": max(t_verl),
                        "heaviest drop-in/verl": f"{min(ratios):.3f}-{max(ratios):.3f}",
                        })  # fmt: skip
    return out


def micro_batch_checks(orig, count: int, seed: int) -> list[dict]:
    """verl's micro-batching loop (``verl_dynamic``: from ``ceil(tokens / cap)`` micro-batches
    up until verl's count-free differencing holds the cap) against the drop-in asked for
    verl's count. Should verl raise (its differencing leaving a micro-batch empty, which
    with n >= m it cannot), the call is recorded and not compared."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for c in range(count):
        wl = WORKLOADS[c % len(WORKLOADS)]
        n = int(rng.integers(16, 513))
        cap = int(rng.choice([4096, 8192, 16384, 32768]))
        lens = np.minimum(sb.workloads.lengths(wl, n, seed=int(rng.integers(1 << 30))), cap)
        lens = np.maximum(lens, 1).astype(np.int64)
        work = 24576 * lens + lens * lens
        try:
            theirs = verl_dynamic(orig, lens.tolist(), cap)
        except AssertionError:
            theirs = None
        mine = verl_drop_in.micro_batches_of_lengths(lens, cap, match_framework_count=True)
        record = {"workload": wl, "n": n, "cap": cap, "drop_in_count": len(mine),
                  "verl_count": None if theirs is None else len(theirs),
                  "same_count": theirs is not None and len(theirs) == len(mine),
                  "heavier": theirs is not None and max(int(work[p].sum()) for p in mine)
                  > max(int(work[p].sum()) for p in theirs)}  # fmt: skip
        out.append(record)
    return out


if __name__ == "__main__":
    main()
