"""What measuring costs: MicroBatchTimer + TimingRecorder bookkeeping per training step.

One process (no collective; the gather is one all_gather of m + 1 floats per step, timed by
the DDP example itself), ``m`` micro-batches per step, each timed region empty, so every
microsecond counted is the timer's: entering/leaving ``timer.time()``, reading the clock,
building the step's records from the plan and adding them to the recorder. Reported as CPU
time (``time.thread_time``, insensitive to other processes on a shared machine) and wall
time, per step and as a share of a reference step time (``--step-ms``, default 300 ms: the
busiest rank's compute per step in ``examples/ddp_train.py --adapt``).

Run: python bench/timing_overhead.py [--steps 200] [--step-ms 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import machine_info, print_table, write_json

from seqbalance.costs import TimingRecorder, TokenCost
from seqbalance.planning.planner import plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=300.0)
    ap.add_argument("--out", default="bench/results/timing_overhead.json")
    args = ap.parse_args()
    from seqbalance.torch.timing import MicroBatchTimer

    rows = []
    for m in (4, 16, 64):
        for clock in ("thread", "wall"):
            rng = np.random.default_rng(m)
            lengths = rng.integers(10, 600, size=8 * m)
            p = plan(lengths, 1, int(lengths.sum()) // m + 600, sync="ddp",
                     min_micro_batches=m)
            rec = TimingRecorder(TokenCost(), sync="ddp", window=24)
            timer = MicroBatchTimer(rec, clock=clock, device="cpu")
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(args.steps):
                for _mb in p.micro_batches[0]:
                    with timer.time():
                        pass
                timer.end_step(p)
            cpu = (time.thread_time() - c0) / args.steps
            wall = (time.perf_counter() - w0) / args.steps
            rows.append({
                "micro_batches": p.num_micro_batches, "clock": clock,
                "cpu_us_per_step": round(cpu * 1e6, 1), "wall_us_per_step": round(wall * 1e6, 1),
                "cpu_share_of_step": f"{cpu / (args.step_ms / 1e3):.3%}",
            })
    print_table(rows, list(rows[0]))
    out = write_json(args.out, {"machine": machine_info(), "step_ms": args.step_ms,
                                "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
