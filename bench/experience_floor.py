"""How fast can any ``balance_experiences`` be? The work its output format itself needs.

    python bench/experience_floor.py --slime /tmp/slime --openrlhf /tmp/openrlhf

(set-up as for ``bench/compat.py``.) OpenRLHF's ``balance_experiences`` returns one merged
``Experience`` batch per actor: every per-token tensor regrouped by rows, and every
``info`` entry as a list holding one 0-d tensor per sample. Whatever does the balancing
has to produce that, so on the rollouts of ``bench/compat.py`` (8,192 samples in 8
batches, rows of 64 and 2,048 tokens) this times, side by side with OpenRLHF's call and
the drop-in's:

- ``copy``: one ``torch.cat`` of every per-token field over the batches (each byte
  copied once, the least a regrouping copies);
- ``info``: the per-sample 0-d tensors of the ``info`` lists (8 keys x 8,192 samples);
- ``floor``: both, the least work that returns OpenRLHF's format;

and the speed-up over OpenRLHF that the floor allows (``orig / floor``), against the
drop-in's (``orig / sb``). Times are the best of several calls, results freed inside the
timed call (OpenRLHF's caller frees them every step too). Prints a table and writes JSON
(default bench/results/experience_floor.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import best_time, machine_info, print_table, write_json
from compat import (
    EXPERIENCE_WIDTH,
    EXPERIENCE_WIDTH_WIDE,
    experiences,
    load_slime_openrlhf,
    openrlhf_balance,
)

import seqbalance as sb

COLUMNS = ["workload", "width", "t_orig_s", "t_sb_s", "t_copy_s", "t_info_s", "t_floor_s",
           "orig/sb", "orig/floor"]  # fmt: skip
STEP_FIELDS = ("sequences", "attention_mask", "action_mask", "action_log_probs", "advantages")


def copy_rows(exps: list) -> list:
    """Every per-token field of the batches, concatenated: each byte copied once."""
    import torch

    return [torch.cat([getattr(e, f) for e in exps]) for f in STEP_FIELDS]


def info_lists(exps: list) -> dict:
    """The merged ``info``: per key, one 0-d tensor per sample."""
    return {k: [t for e in exps for t in e.info[k].unbind(0)] for k in exps[0].info}


def floor(exps: list) -> tuple:
    return copy_rows(exps), info_lists(exps)


def freed(fn, *args):
    """A call of ``fn(*args)`` whose result is freed before the clock stops."""

    def call() -> None:
        out = fn(*args)
        del out

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slime", default="/tmp/i9fw/src", help="slime checkout")
    ap.add_argument("--openrlhf", default="/tmp/i9fw/orlhf", help="OpenRLHF checkout")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default="bench/results/experience_floor.json")
    args = ap.parse_args()
    from seqbalance.compat import openrlhf as c_orlhf

    _, _, o_exp = load_slime_openrlhf(args.slime, args.openrlhf)
    rows = []
    for wl in ("rl-math", "sft-chat", "long-mix"):
        lens = np.minimum(sb.workloads.lengths(wl, args.n, seed=0), 32768)
        for width in (EXPERIENCE_WIDTH, EXPERIENCE_WIDTH_WIDE):
            exps = experiences(o_exp, lens, width=width)

            calls = {
                "orig": freed(openrlhf_balance, o_exp, exps, args.dp),
                "sb": freed(openrlhf_balance, c_orlhf, exps, args.dp),
                "copy": freed(copy_rows, exps),
                "info": freed(info_lists, exps),
                "floor": freed(floor, exps),
            }
            t = {k: best_time(fn, repeat=args.repeat, budget_s=30)[0] for k, fn in calls.items()}
            rows.append({
                "workload": wl, "width": width, **{f"t_{k}_s": v for k, v in t.items()},
                "orig/sb": t["orig"] / t["sb"], "orig/floor": t["orig"] / t["floor"],
            })  # fmt: skip
            print_table(rows[-1:], COLUMNS)
    print()
    print_table(rows, COLUMNS)
    out = write_json(args.json, {"machine": machine_info(), "n": args.n, "dp": args.dp,
                                 "rows": rows})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
