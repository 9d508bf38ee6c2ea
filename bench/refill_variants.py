"""FSDP plans on random small inputs under three settings of the slot refill
(``planning/_slots.fill_to_levels``): no look-ahead, the look-ahead alone, and both (each
pass run with and without it, the faster plan kept; the default on small grids).

    python bench/refill_variants.py [--plans 400] [--seed 7]

Each setting runs on the same inputs (dp 2-32, 2-19 sequences a rank, caps 8k-32k, the
five standard workloads, Qwen2.5-7B FLOPs cost). Prints, for each pair of settings, in
how many plans the first has a shorter simulated FSDP step than the second and in how
many a longer one, and the total planning time of each; writes JSON (default
bench/results/refill_variants.json). Exits 1 if "both" is ever slower than either of
the others.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, print_table, write_json

from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning import _slots
from seqbalance.planning.planner import plan

SETTINGS = {
    "none": {"_LOOKAHEAD": 1, "_LEVEL_BOTH_WORK": -1},
    "ahead": {"_LEVEL_BOTH_WORK": -1},
    "both": {"_LOOKAHEAD": _slots._LOOKAHEAD},  # the defaults
}
NAMES = ("uniform", "bimodal", "rl-math", "sft-chat", "long-mix")


def inputs(count: int, seed: int) -> list[tuple[str, int, int, np.ndarray]]:
    """``count`` (workload, dp, cap, lengths) draws."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(count):
        name = NAMES[c % len(NAMES)]
        dp, per = int(rng.integers(2, 33)), int(rng.integers(2, 20))
        cap = int(rng.choice([8192, 16384, 32768]))
        lens = workloads.load(name, dp * per, seed=int(rng.integers(1 << 20))).lengths
        out.append((name, dp, cap, np.minimum(lens, cap)))
    return out


def steps(cases, cost, setting: dict) -> tuple[list[float], float]:
    """The simulated FSDP step of every case's plan under ``setting``, and the time spent."""
    with mock.patch.multiple(_slots, **setting):
        t0 = time.perf_counter()
        out = [plan(lens, dp, cap, cost=cost(lens), sync="fsdp").simulate().step_time
               for _, dp, cap, lens in cases]  # fmt: skip
        return [float(s) for s in out], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default="bench/results/refill_variants.json")
    args = ap.parse_args()
    cost = load_cost("qwen2.5-7b")
    cases = inputs(args.plans, args.seed)
    results = {name: steps(cases, cost, s) for name, s in SETTINGS.items()}
    rows = []
    for a, b in (("ahead", "none"), ("both", "none"), ("both", "ahead")):
        sa, sb = results[a][0], results[b][0]
        rows.append({
            "setting": a, "against": b, "plans": len(cases),
            "shorter step": sum(x < y * (1 - 1e-12) for x, y in zip(sa, sb)),
            "longer step": sum(x > y * (1 + 1e-12) for x, y in zip(sa, sb)),
            "time s": f"{results[a][1]:.1f} / {results[b][1]:.1f}",
        })  # fmt: skip
    print_table(rows, list(rows[0]))
    worse = [i for i, s in enumerate(results["both"][0])
             if s > min(results["none"][0][i], results["ahead"][0][i]) * (1 + 1e-12)]  # fmt: skip
    print("both never slower" if not worse else f"both slower in cases {worse[:10]}")
    write_json(args.json, {"machine": machine_info(), "rows": rows,
                           "cases": [{"workload": n, "dp": dp, "cap": cap, "n": int(lens.size),
                                      **{s: results[s][0][i] for s in SETTINGS}}
                                     for i, (n, dp, cap, lens) in enumerate(cases)]})  # fmt: skip
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
