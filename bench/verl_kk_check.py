"""Check ``compat._verl_kk`` against verl's own equal-size differencing, and the drop-in's
``get_seqlen_balanced_partitions(equal_size=True)`` against verl's heaviest part; the same
for slime's and OpenRLHF's copies of that function when their checkouts are given.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    python bench/verl_kk_check.py --ext /work/ext9 [--slime DIR --openrlhf DIR] [--cases 400]

verl's module is imported from ``--ext``, slime's and OpenRLHF's from source checkouts,
with their heavy imports stubbed (as in ``bench/compat.py``). Inputs: verl's workloads
``24576 L + L**2`` of the standard workloads (n = 64-8,192, k = 2-64, lengths clipped to
32,768) and small integers drawn from a few values (many ties: where the tie rules
decide). For each: whether the reproduced partition is the original's (same index sets),
and the heaviest part of the original, of the reproduction and of the drop-in, minus the
lower bound ``ceil(total / k)``. Prints a summary table and writes JSON (default
bench/results/verl_kk_check.json); exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, print_table, write_json
from compat import load_originals, load_slime_openrlhf

import seqbalance as sb
from seqbalance.compat import openrlhf as openrlhf_drop_in
from seqbalance.compat import slime as slime_drop_in
from seqbalance.compat import verl as verl_drop_in
from seqbalance.compat._verl_kk import verl_equal_kk_labels

WORKLOADS = ("rl-math", "sft-chat", "long-mix", "uniform", "bimodal")


def cases(count: int, seed: int) -> list[tuple[str, np.ndarray, int]]:
    """``count`` (kind, integer weights, k) triples, half workloads and half tie-heavy."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(count):
        k = int(rng.choice([2, 3, 4, 8, 16, 32, 64]))
        if c % 2 == 0:
            wl = WORKLOADS[(c // 2) % len(WORKLOADS)]
            n = k * int(rng.integers(max(1, 64 // k), 8192 // k + 1))
            lens = np.minimum(sb.workloads.lengths(wl, n, seed=int(rng.integers(1 << 30))),
                              32768).astype(np.int64)  # fmt: skip
            out.append((wl, 24576 * lens + lens * lens, k))
        else:
            n = k * int(rng.integers(1, 64))
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
    args = ap.parse_args()
    v_orig, _ = load_originals(args.ext)
    frameworks = {"verl": (v_orig, verl_drop_in)}
    if args.slime and args.openrlhf:
        _, o_orig, _ = load_slime_openrlhf(args.slime, args.openrlhf)
        frameworks["slime"] = (importlib.import_module("slime.utils.seqlen_balancing"),
                               slime_drop_in)  # fmt: skip
        frameworks["openrlhf"] = (o_orig, openrlhf_drop_in)
    records = []
    for (kind, w, k), (fw, (orig, drop_in)) in (
        (c, f) for f in frameworks.items() for c in cases(args.cases, args.seed)
    ):
        bound = -(-int(w.sum()) // k)
        theirs = orig.karmarkar_karp(w.tolist(), k, True)
        labels = verl_equal_kk_labels(w.astype(np.float64), k)
        ours = [np.flatnonzero(labels == j).tolist() for j in range(k)]
        same = sorted(map(sorted, theirs)) == sorted(ours)
        heavy_theirs = max(int(w[p].sum()) for p in theirs)
        heavy_ours = max(int(w[p].sum()) for p in ours)
        parts = drop_in.get_seqlen_balanced_partitions(w, k, True)
        heavy_drop_in = max(int(w[p].sum()) for p in parts)
        records.append({
            "framework": fw, "kind": kind, "n": int(w.shape[0]), "k": k, "same_partition": same,
            "verl_over_bound": heavy_theirs - bound,
            "reproduction_over_bound": heavy_ours - bound,
            "drop_in_over_bound": heavy_drop_in - bound,
        })  # fmt: skip
    columns = ["framework", "inputs", "cases", "same partition", "drop-in heavier",
               "drop-in lighter", "drop-in at bound", "original at bound"]  # fmt: skip
    rows = []
    for fw, kind in ((f, k) for f in frameworks for k in (*WORKLOADS, "ties")):
        rs = [r for r in records if r["kind"] == kind and r["framework"] == fw]
        if rs:
            rows.append(dict(zip(columns, [
                fw, kind, len(rs), sum(r["same_partition"] for r in rs),
                sum(r["drop_in_over_bound"] > r["verl_over_bound"] for r in rs),
                sum(r["drop_in_over_bound"] < r["verl_over_bound"] for r in rs),
                sum(r["drop_in_over_bound"] == 0 for r in rs),
                sum(r["verl_over_bound"] == 0 for r in rs),
            ])))  # fmt: skip
    print_table(rows, columns)
    bad = [r for r in records if not r["same_partition"]
           or r["drop_in_over_bound"] > r["verl_over_bound"]]  # fmt: skip
    print("all reproduced, never heavier" if not bad else f"{len(bad)} FAILED: {bad[:3]}")
    write_json(args.json, {"machine": machine_info(), "cases": records})
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
