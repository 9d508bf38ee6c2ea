"""How repeatable is one micro-batch's time on this machine? The floor under any model error.

Times forward+backward of the same micro-batch of ``examples/ddp_train.py``'s model
several times in one process (one thread; ``time.thread_time`` and wall clock) and prints,
per micro-batch shape, the spread (slowest / fastest - 1) and the median absolute
deviation from the median, which bounds the median error any cost model can reach against
single runs. Writes bench/results/timing_noise.json.

The example's glibc malloc settings (``ddp_train.MALLOC_ENV``) apply unless
``--glibc-default``.

Run: python bench/timing_noise.py [--runs 10] [--glibc-default]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from _common import machine_info, print_table, write_json

SHAPES = {
    "20 x 100": [100] * 20,
    "8 x 256": [256] * 8,
    "1024+512+256+128+64+64": [1024, 512, 256, 128, 64, 64],
    "1 x 1800": [1800],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default="bench/results/timing_noise.json")
    ap.add_argument("--glibc-default", action="store_true",
                    help="keep glibc's default malloc settings (the example changes them)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import ddp_train as ex

    missing = {k: v for k, v in ex.MALLOC_ENV.items() if k not in os.environ}
    if not args.glibc_default and missing and sys.platform.startswith("linux"):
        # glibc reads these at start-up: run again with the example's settings (values
        # already set are kept, as the example does).
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **missing})
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ex.TinyLM(32, 2, 2, 2048)
    rows = []
    for name, mb in SHAPES.items():
        ids = torch.randint(0, ex.VOCAB, (sum(mb),))
        cu = torch.as_tensor(np.concatenate([[0], np.cumsum(mb)]), dtype=torch.int32)
        cpu, wall = [], []
        for i in range(args.runs + 2):  # two warm-up runs
            c0, w0 = time.thread_time(), time.perf_counter()
            loss, _ = ex.token_loss_sum(model(ids, cu), ids, cu)
            loss.backward()
            if i >= 2:
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - w0)
        for clock, ts in (("thread", np.array(cpu)), ("wall", np.array(wall))):
            med = float(np.median(ts))
            rows.append({
                "micro_batch": name, "clock": clock, "median_ms": round(med * 1e3, 1),
                "spread": f"{ts.max() / ts.min() - 1:.1%}",
                "median_abs_dev": f"{float(np.median(np.abs(ts - med))) / med:.1%}",
            })
    print_table(rows, list(rows[0]))
    out = write_json(args.out, {"machine": machine_info(), "runs": args.runs,
                                "malloc": "glibc default" if args.glibc_default else
                                {k: os.environ.get(k) for k in ex.MALLOC_ENV},
                                "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
