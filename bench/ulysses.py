"""Ulysses sequence parallelism: does planning with the group's cost (``UlyssesCost``) pay?

For each workload, Ulysses group size ``sp`` and all-to-all bandwidth, three plans of the
same batch over ``--dp`` groups (micro-batches of up to ``sp * --max-tokens`` tokens, as
verl multiplies its per-GPU budget) are simulated under the Ulysses cost of qwen2.5-7b
(its training FLOPs spread over ``sp`` GPUs plus the exposed all-to-all, at 400 TFLOP/s):

- ``tokens``: planned by token count (verl's default balance);
- ``flops``: planned with the one-GPU FLOPs cost (right shape, no communication);
- ``ulysses``: planned with the ``UlyssesCost`` itself.

Printed and saved: each plan's simulated FSDP step over the ``ulysses`` plan's, the
``ulysses`` plan's gap to the lower bound, and the all-to-all's share of the per-token term.

A second table does the same for ring CP over Ulysses groups (USP: ``--cp`` ranks of a ring,
each a Ulysses group) on the long-context workload, under the USP piece cost (ring at 25
GB/s, overlap 0.5): ``ring-flops`` is planned with the one-GPU ring cost (the whole
model's K/V bytes, no all-to-all), ``usp`` with ``ContextParallelCost(UlyssesCost)``.

    python bench/ulysses.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_rev, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import FlopsCost, UlyssesCost

SETUPS = ((4, 1.5e11), (4, 2.5e10), (28, 2.5e10))  # (sp, all-to-all bytes/s per GPU)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--dp", type=int, default=8, help="Ulysses groups (data-parallel ranks)")
    ap.add_argument("--max-tokens", type=int, default=16384, help="tokens per GPU")
    ap.add_argument("--cp", type=int, default=8, help="CP ranks of a ring (the USP table)")
    ap.add_argument("--json", default="bench/results/ulysses.json")
    args = ap.parse_args()
    flops = FlopsCost.from_name(args.model)
    rows = []
    for workload, n in (("rl-math", 2048), ("sft-chat", 4096), ("long-mix", 2048)):
        lengths = workloads.lengths(workload, n, seed=0)
        for sp, bandwidth in SETUPS:
            cap = sp * args.max_tokens
            if int(lengths.max()) > cap:
                continue  # a sequence the group cannot hold: ring CP's case, not this one
            cost = UlyssesCost(flops, sp, bandwidth=bandwidth)
            plans = {
                "tokens": sb.plan(lengths, args.dp, cap),
                "flops": sb.plan(lengths, args.dp, cap, cost=flops),
                "ulysses": sb.plan(lengths, args.dp, cap, cost=cost),
            }
            steps = {k: p.simulate(cost=cost).step_time for k, p in plans.items()}
            rows.append({
                "workload": workload, "n": n, "sp": sp, "bandwidth": bandwidth,
                "comm_share_b": cost.comm_per_token / cost.per_token,
                "tokens/ulysses": steps["tokens"] / steps["ulysses"],
                "flops/ulysses": steps["flops"] / steps["ulysses"],
                "ulysses_gap": plans["ulysses"].simulate().gap,
                "step_s": steps["ulysses"] / cost.cost_per_second,
            })  # fmt: skip
    print_table(rows, list(rows[0]))
    usp_rows = _usp_rows(flops, args)
    print()
    print_table(usp_rows, list(usp_rows[0]))
    path = write_json(
        args.json,
        {"machine": machine_info(), "git": git_rev(), "args": vars(args), "rows": rows,
         "usp_rows": usp_rows},
    )
    print(f"wrote {path}")


def _usp_rows(flops: FlopsCost, args: argparse.Namespace) -> list[dict]:
    """The USP table (module docstring): long-context batches, rings of Ulysses groups."""
    from seqbalance.costs import ContextParallelCost

    lengths = workloads.lengths("long-context", 1024, seed=0)
    ring = {"bandwidth": 2.5e10, "overlap": 0.5}
    rows = []
    for sp, bandwidth in SETUPS:
        truth = ContextParallelCost(UlyssesCost(flops, sp, bandwidth=bandwidth), **ring)
        kw = {"cp_size": args.cp, "cp": "dynamic"}
        cap = sp * args.max_tokens
        plans = {
            "tokens": sb.plan(lengths, args.dp, cap, **kw),  # token counts, free ring
            "ring-flops": sb.plan(lengths, args.dp, cap, cost=flops, cp_cost=ring, **kw),
            "usp": sb.plan(lengths, args.dp, cap, cp_cost=truth, **kw),
        }
        steps = {k: p.simulate(cost=truth).step_time for k, p in plans.items()}
        rows.append({
            "sp": sp, "cp": args.cp, "a2a_bandwidth": bandwidth,
            "tokens/usp": steps["tokens"] / steps["usp"],
            "ring-flops/usp": steps["ring-flops"] / steps["usp"],
            "usp_gap": plans["usp"].simulate().gap,
            "step_s": steps["usp"] / truth.cost_per_second,
        })  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
