"""The compat drop-ins against the frameworks' code on small calls: a few dozen sequences.

    python bench/compat_small.py --ext /work/ext9 --slime /tmp/slime --openrlhf /tmp/openrlhf

(set-up as for ``bench/compat.py``). Frameworks call their balancing code inside every
step, often on one rank's share of one mini-batch: 8 to 128 sequences. There the
originals answer in 0.05-10 ms, and ``seqbalance.partition``'s small-problem exact
searches could spend up to a second. The drop-ins leave those searches off unless the
caller turns them on (``with seqbalance.exact_searches(True)``); this script measures
both settings side by side on the same inputs:

- ``t_orig``, ``t_sb``, ``t_sb_exact``: the slowest call of the original, the drop-in, and
  the drop-in with the searches on (each the best of a few runs of that input);
- ``heavy sb/orig``, ``heavy exact/orig``: the drop-in's heaviest part (or micro-batch,
  or rank) over the original's, on inputs where both give the same number of parts:
  largest and mean, and the number of inputs where it is above 1 (``sb heavier``,
  ``exact heavier``); the drop-ins promise "never above 1";
- ``count sb-orig``: the drop-in's part count minus the original's, smallest and largest
  (never above 0: the drop-ins use no more micro-batches than the framework);
- ``exact fewer``: inputs where the searches found a smaller count than the default.

Cases: three workloads x n in {8, 16, 24, 32, 48, 64, 96, 128} x three seeds x caps
{8,192, 32,768} (raised to the longest sequence); the equal-size and count-free partition
rows also split into k in {2, 4, 8} where k divides n. ``--quick``: one seed, one cap.
Prints a table, writes JSON (default bench/results/compat_small.json).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import best_time, machine_info, print_table, write_json
from compat import (
    load_originals,
    load_slime_openrlhf,
    openrlhf_dynamic,
    slime_args,
    verl_dynamic,
)

import seqbalance as sb
from seqbalance.compat import areal as c_areal
from seqbalance.compat import openrlhf as c_orlhf
from seqbalance.compat import slime as c_slime
from seqbalance.compat import verl as c_verl

COLUMNS = [
    "call", "cases", "t_orig max s", "t_sb max s", "t_sb_exact max s", "sb/orig time max",
    "heavy sb/orig max", "heavy sb/orig mean", "heavy exact/orig max", "heavy exact/orig mean",
    "sb heavier", "exact heavier", "count sb-orig", "exact fewer",
]  # fmt: skip


def calls(lens, cap, v_orig, a_orig, o_orig, s_orig):
    """(name, original, drop-in, weight per sequence, result -> (parts, weights)) for one
    input; ``weight`` measures the heaviest part."""
    n = lens.shape[0]
    work = 24576 * lens + lens * lens
    lst, wl = lens.tolist(), work.tolist()
    out = []
    for k in (2, 4, 8):  # k=k: these calls run after the loop
        if n % k == 0 and n >= 2 * k:
            out.append((f"verl partitions equal_size, k={k}",
                        lambda k=k: v_orig.get_seqlen_balanced_partitions(wl, k, True),
                        lambda k=k: c_verl.get_seqlen_balanced_partitions(work, k, True), work))
            out.append((f"verl partitions count-free, k={k}",
                        lambda k=k: v_orig.get_seqlen_balanced_partitions(wl, k, False),
                        lambda k=k: c_verl.get_seqlen_balanced_partitions(work, k, False), work))
    out += [
        ("verl dynamic mbs", lambda: verl_dynamic(v_orig, lst, cap),
         lambda: c_verl.micro_batches_of_lengths(lens, cap), work),
        ("verl dynamic mbs, match_framework_count", lambda: verl_dynamic(v_orig, lst, cap),
         lambda: c_verl.micro_batches_of_lengths(lens, cap, match_framework_count=True), work),
        ("areal ffd_allocate", lambda: a_orig.ffd_allocate(lst, cap, 1),
         lambda: c_areal.ffd_allocate(lens, cap, 1), lens),
        ("areal kk_allocate", lambda: a_orig.kk_allocate(lst, cap, 1),
         lambda: c_areal.kk_allocate(lens, cap, 1), lens),
        ("openrlhf dynamic mbs", lambda: openrlhf_dynamic(o_orig, lst, cap),
         lambda: openrlhf_dynamic(c_orlhf, lens, cap), lens),
    ]  # fmt: skip
    return out


def slime_calls(lens, cap, s_orig):
    """slime's FLOPs schedule of the whole (small) rollout over 2 and 4 ranks: heaviest rank
    by FLOPs; counts are micro-batches per rank."""
    out = []
    a = slime_args(False, cap)
    flops = c_slime.sequence_fwd_flops(lens, a)
    n = lens.shape[0]
    for dp in (2, 4):
        if n < 2 * dp:
            continue
        tp = {"dp_size": dp, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}

        def call(mod, tp=tp):  # tp=tp: called after the loop
            return lambda: mod.build_dp_schedule(a, tp, lens.tolist(), global_batch_size=n,
                                                 rollout_indices=list(range(n)))  # fmt: skip

        out.append((f"slime dp_schedule, dp={dp}", call(s_orig), call(c_slime), flops))
    return out


def heaviest(parts, weight) -> float:
    return max(float(weight[np.asarray(p, dtype=np.int64)].sum()) for p in parts)


def count_of(name: str, result) -> tuple[list[list[int]], int]:
    if name.startswith("slime"):
        return result[0], int(result[2][0])  # ranks' sequences; micro-batches per rank
    return result, len(result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", required=True, help="--target folder of verl and AReaL")
    ap.add_argument("--slime", required=True, help="slime source checkout")
    ap.add_argument("--openrlhf", required=True, help="OpenRLHF source checkout")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench/results/compat_small.json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # AReaL logs each fallback to FFD
    v_orig, a_orig = load_originals(args.ext)
    s_orig, o_orig, _ = load_slime_openrlhf(args.slime, args.openrlhf)
    seeds = range(1) if args.quick else range(3)
    caps = (16384,) if args.quick else (8192, 32768)
    acc = defaultdict(list)
    for wl in ("rl-math", "sft-chat", "long-mix"):
        for n in (8, 16, 24, 32, 48, 64, 96, 128):
            for seed in seeds:
                lens = np.minimum(sb.workloads.lengths(wl, n, seed=seed), 32768).astype(np.int64)
                for cap0 in caps:
                    cap = max(cap0, int(lens.max()))
                    for name, orig, ours, weight in (
                        calls(lens, cap, v_orig, a_orig, o_orig, s_orig)
                        + slime_calls(lens, cap, s_orig)
                    ):
                        t_o, r_o = best_time(orig, repeat=3)
                        t_s, r_s = best_time(ours, repeat=3)
                        with sb.exact_searches(True):
                            t_e, r_e = best_time(ours, repeat=1)
                        (p_o, c_o), (p_s, c_s), (p_e, c_e) = (
                            count_of(name, r) for r in (r_o, r_s, r_e)
                        )
                        h_o = heaviest(p_o, weight)
                        acc[name.split(", k=")[0].split(", dp=")[0]].append({
                            "workload": wl, "n": n, "seed": seed, "cap": cap, "call": name,
                            "t_orig": t_o, "t_sb": t_s, "t_exact": t_e,
                            "count_orig": c_o, "count_sb": c_s, "count_exact": c_e,
                            "heavy_sb": heaviest(p_s, weight) / h_o,
                            "heavy_exact": heaviest(p_e, weight) / h_o,
                        })  # fmt: skip
    rows = []
    for name, cases in acc.items():
        same = [c for c in cases if c["count_sb"] == c["count_orig"]]
        same_e = [c for c in cases if c["count_exact"] == c["count_orig"]]
        diff = [c["count_sb"] - c["count_orig"] for c in cases]
        rows.append({
            "call": name, "cases": len(cases),
            "t_orig max s": max(c["t_orig"] for c in cases),
            "t_sb max s": max(c["t_sb"] for c in cases),
            "t_sb_exact max s": max(c["t_exact"] for c in cases),
            "sb/orig time max": max(c["t_sb"] / c["t_orig"] for c in cases),
            "heavy sb/orig max": max(c["heavy_sb"] for c in same),
            "heavy sb/orig mean": float(np.mean([c["heavy_sb"] for c in same])),
            "heavy exact/orig max": max(c["heavy_exact"] for c in same_e),
            "heavy exact/orig mean": float(np.mean([c["heavy_exact"] for c in same_e])),
            # Inputs where the drop-in's heaviest part is above the original's (should be 0).
            "sb heavier": sum(c["heavy_sb"] > 1.0 for c in same),
            "exact heavier": sum(c["heavy_exact"] > 1.0 for c in same_e),
            "count sb-orig": f"{min(diff)}..{max(diff)}",
            "exact fewer": sum(c["count_exact"] < c["count_sb"] for c in cases),
        })  # fmt: skip
    print_table(rows, COLUMNS)
    out = write_json(args.json, {"machine": machine_info(), "rows": rows,
                                 "cases": [c for cs in acc.values() for c in cs]})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
