"""Fit from time under context parallelism: does a cost refit from timed CP steps plan better?

A "true" cost in seconds (qwen2.5-7b training FLOPs at 400 TFLOP/s, plus 0.2 ms per
sequence and 5 ms per micro-batch) and a CP link (25 GB/s and 2.5 GB/s per GPU, half of a
ring step's attention hiding its transfer) time every GPU's micro-batch of dynamic-CP plans
(``piece_costs``, lognormal noise). Warm-up: ``--warmup`` steps planned with a token cost.
Their records refit:

- ``refit``: ``TimingRecorder(ContextParallelCost(TokenCost(), link))``, which subtracts the
  link's modelled communication before fitting;
- ``blind``: ``TimingRecorder(TokenCost())``, which does not know the link (the exposed
  communication lands in the fitted terms), then planned with the same link.

Then ``--eval`` fresh batches are planned with the token cost, both refits and the truth
(oracle), and every plan is simulated under the truth. Printed and saved: the coefficients
each refit found against the truth, and each strategy's mean simulated step and gap to the
CP lower bound under the truth.

    python bench/cp_refit.py            # 8 + 8 steps of long-context, 4 x 8 GPUs
    python bench/cp_refit.py --quick    # 4 + 4 steps
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.costs import ContextParallelCost, QuadraticCost, TimingRecorder, TokenCost
from seqbalance.costs.context_parallel import kv_bytes_per_token
from seqbalance.costs.feedback import records_from_plan
from seqbalance.planning.cp_plans import _slot_groups, piece_costs

FLOPS = 4e14


def truth_cost(bandwidth: float) -> tuple[QuadraticCost, dict]:
    flops = sb.FlopsCost.from_name("qwen2.5-7b")
    _, _, b, c = flops.polynomial
    truth = QuadraticCost(per_token=b / FLOPS, per_token_sq=c / FLOPS, per_sequence=2e-4,
                          per_microbatch=5e-3, meta={"unit": "seconds"})  # fmt: skip
    link = {"bandwidth": bandwidth, "overlap": 0.5, "kv_bytes_per_token": kv_bytes_per_token(flops)}
    return truth, link


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="long-context")
    ap.add_argument("--n", type=int, default=512, help="sequences per step")
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--cp-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32768)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--eval", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of the times")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[2.5e10, 2.5e9],
                    help="CP ring bytes/s per GPU, one run each")  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench/results/cp_refit.json")
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.eval = 4, 4
    coef_rows, rows = [], []
    for bandwidth in args.bandwidths:
        c, r = run(args, bandwidth)
        coef_rows += c
        rows += r
    print_table(coef_rows, list(coef_rows[0]))
    print()
    print_table(rows, list(rows[0]))
    path = write_json(
        args.json,
        {"machine": machine_info(), "args": vars(args), "coefficients": coef_rows,
         "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")


def run(args: argparse.Namespace, bandwidth: float) -> tuple[list[dict], list[dict]]:
    """Warm-up, both refits and the evaluation at one link bandwidth."""
    truth, link = truth_cost(bandwidth)
    truth_cp = ContextParallelCost(truth, cost_per_second=1.0, **link)
    # The token cost's link: tokens per second at the true linear rate (a fair guess).
    token_cp = ContextParallelCost(TokenCost(), cost_per_second=1 / truth.per_token, **link)
    rng = np.random.default_rng(0)

    def plan(lengths, cp_cost):
        return sb.plan(lengths, args.dp, args.max_tokens, cp_size=args.cp_size, cp="dynamic",
                       cp_cost=cp_cost, sync="fsdp")  # fmt: skip

    spread = 0.0  # largest relative cost difference between the GPUs of one CP group
    refit_rec = TimingRecorder(token_cp, sync="fsdp", window=args.warmup)
    blind_rec = TimingRecorder(TokenCost(), sync="fsdp", window=args.warmup)
    for step in range(args.warmup):
        lens = sb.workloads.lengths(args.workload, args.n, seed=100 + step)
        p = plan(lens, token_cp)
        t = piece_costs(p.pieces, np.asarray(p.lengths), truth_cp)
        for j, roots in enumerate(_slot_groups(p.pieces, p.world_size, p.num_micro_batches)):
            for root in np.unique(roots):
                g = t[roots == root, j]
                spread = max(spread, float(g.max() / g.min() - 1))
        t = t * rng.lognormal(0.0, args.noise, t.shape)
        recs = records_from_plan(p.micro_batches, p.lengths, t.tolist(), step, pieces=p.pieces)
        refit_rec.extend(recs)
        blind_rec.extend(recs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refit = refit_rec.refit()
        blind = blind_rec.refit()
    for w in caught:
        print(f"warning: {w.message}")
    refit_cp = refit_rec.cp_cost
    blind_cp = ContextParallelCost(blind, cost_per_second=1.0, **link)

    gbs = f"{bandwidth / 1e9:g}"
    coef_rows = []
    for name, cost in (("truth", truth), ("refit", refit), ("blind", blind)):
        c0, a, b, c = cost.polynomial
        coef_rows.append({"GB/s": gbs, "cost": name, "c0_ms": c0 * 1e3, "a_ms": a * 1e3,
                          "b_us": b * 1e6, "c_ps": c * 1e12,
                          "b_vs_truth": b / truth.per_token,
                          "c_vs_truth": c / truth.per_token_sq,
                          "group_spread": spread})  # fmt: skip
    strategies = {"tokens": token_cp, "blind": blind_cp, "refit": refit_cp, "truth": truth_cp}
    steps: dict[str, list[float]] = {k: [] for k in strategies}
    gaps: dict[str, list[float]] = {k: [] for k in strategies}
    for step in range(args.eval):
        lens = sb.workloads.lengths(args.workload, args.n, seed=10_000 + step)
        for name, cpc in strategies.items():
            sim = plan(lens, cpc).simulate(cost=truth_cp)
            steps[name].append(sim.step_time)
            gaps[name].append(sim.gap)
    oracle = np.array(steps["truth"])
    rows = [
        {"GB/s": gbs, "plan cost": name, "step_s": float(np.mean(v)),
         "vs_truth": float(np.mean(np.array(v) / oracle)),
         "worst_vs_truth": float(np.max(np.array(v) / oracle)),
         "gap_to_bound": float(np.mean(gaps[name]))}
        for name, v in steps.items()
    ]  # fmt: skip
    return coef_rows, rows


if __name__ == "__main__":
    main()
