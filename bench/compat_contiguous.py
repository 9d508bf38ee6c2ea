"""AReaL's contiguous split and count-capped batches against the drop-ins, side by side.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    pip install numba            # optional: AReaL jits its programme; without it, it runs
                                 # as plain Python (then only the small sizes are timed)
    python bench/compat_contiguous.py --ext /work/ext9

Calls (``areal.utils.seqpack``, imported as in ``bench/compat.py``, but with the real
numba when it is installed):

- ``min_abs_diff_partition(lengths, k, min_size)``: ``k`` consecutive runs. AReaL's
  dynamic programme (O(n^2 k)) aims at the least spread; the drop-in
  (:func:`seqbalance.contiguous_partition`) minimises the heaviest run exactly, then the
  spread. Columns: heaviest run and spread, drop-in over AReaL; times.
- the same on verl's workloads ``24576 L + L**2`` (sums above AReaL's 1e10 sentinel).
- ``reorder_to_balanced_batches(lengths, c)``: batches of at most ``c`` sequences;
  heaviest batch and AReaL's ``max_diff``, drop-in over AReaL (with ``n`` a multiple of
  ``c`` every batch is full, so consecutive runs of ``c`` indices are the batches).
- ``--random`` small random inputs (n <= 12): how often the drop-in's heaviest run or
  batch is heavier than AReaL's (by construction never), and how often AReaL's answer was
  an error or an empty run.

Prints tables and writes JSON (default bench/results/compat_contiguous.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import best_time, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.compat import areal as c_areal

try:  # before compat's loader, which stubs numba only where it is missing
    import numba

    JIT = f"numba {numba.__version__}"
except ImportError:
    JIT = "none (AReaL's programme runs as plain Python)"
from compat import load_originals

SPLIT_COLUMNS = ["call", "workload", "n", "k", "min_size", "heavy sb-areal", "spread sb/areal",
                 "t_areal_s", "t_sb_s", "areal/sb"]  # fmt: skip
BATCH_COLUMNS = ["workload", "n", "c", "heavy sb/areal", "max_diff areal", "max_diff sb",
                 "t_areal_s", "t_sb_s", "areal/sb"]  # fmt: skip


def run_loads(w: np.ndarray, runs: list) -> list[int]:
    return [int(w[a:b].sum()) for a, b in runs]


def split_row(call: str, wl: str, w: np.ndarray, k: int, s: int, orig, repeat: int) -> dict:
    t_a, theirs = best_time(lambda: orig.min_abs_diff_partition(w, k, s), repeat)
    t_b, ours = best_time(lambda: c_areal.min_abs_diff_partition(w, k, s), repeat)
    la, lb = run_loads(w, theirs), run_loads(w, ours)
    spread_a, spread_b = max(la) - min(la), max(lb) - min(lb)
    return {
        "call": call, "workload": wl, "n": len(w), "k": k, "min_size": s,
        "heavy sb/areal": max(lb) / max(la), "heavy sb-areal": max(lb) - max(la),
        "spread sb/areal": spread_b / spread_a if spread_a else float(spread_b == 0),
        "t_areal_s": t_a, "t_sb_s": t_b, "areal/sb": t_a / t_b,
    }  # fmt: skip


def batch_row(wl: str, v: np.ndarray, c: int, orig, repeat: int) -> dict:
    t_a, (ia, da) = best_time(lambda: orig.reorder_to_balanced_batches(v, c), repeat)
    t_b, (ib, db) = best_time(lambda: c_areal.reorder_to_balanced_batches(v, c), repeat)

    def heaviest(idx: np.ndarray) -> int:
        return max(int(v[idx[j : j + c]].sum()) for j in range(0, len(idx), c))

    return {
        "workload": wl, "n": len(v), "c": c, "heavy sb/areal": heaviest(ib) / heaviest(ia),
        "max_diff areal": int(da), "max_diff sb": int(db),
        "t_areal_s": t_a, "t_sb_s": t_b, "areal/sb": t_a / t_b,
    }  # fmt: skip


def random_check(orig, cases: int, seed: int = 0) -> dict:
    """Small random calls: heavier counts (expected 0) and AReaL's failures."""
    rng = np.random.default_rng(seed)
    out = {"cases": cases, "split heavier": 0, "split lighter": 0, "split spread larger": 0,
           "areal split failed": 0, "batches heavier": 0, "batches lighter": 0,
           "areal batches failed": 0}  # fmt: skip
    for _ in range(cases):
        n = int(rng.integers(1, 13))
        k = int(rng.integers(1, n + 1))
        s = int(rng.integers(1, n // k + 1))
        big = rng.random() < 0.2  # sums past AReaL's 1e10 sentinel
        w = rng.integers(0, 10**6 if big else 100, n).astype(np.int64) * (10**5 if big else 1)
        lb = run_loads(w, c_areal.min_abs_diff_partition(w, k, s))
        try:
            runs = orig.min_abs_diff_partition(w, k, s)
        except ValueError:
            out["areal split failed"] += 1
        else:
            la = run_loads(w, runs)
            out["split heavier"] += max(lb) > max(la)
            out["split lighter"] += max(lb) < max(la)
            out["split spread larger"] += (max(lb) == max(la)
                                           and max(lb) - min(lb) > max(la) - min(la))  # fmt: skip
        c = int(rng.integers(1, 5))
        m = n - n % c or c  # full batches only, so that the batches can be read back
        v = w[:m] if m <= n else np.concatenate([w, np.zeros(m - n, np.int64)])
        ib, _ = c_areal.reorder_to_balanced_batches(v, c)
        try:
            ia, _ = orig.reorder_to_balanced_batches(v, c)
        except OverflowError:  # its int32 batch sums (numpy 2 raises; numpy 1 wraps)
            out["areal batches failed"] += 1
            continue
        ha = max(int(v[ia[j : j + c]].sum()) for j in range(0, m, c))
        hb = max(int(v[ib[j : j + c]].sum()) for j in range(0, m, c))
        out["batches heavier"] += hb > ha
        out["batches lighter"] += hb < ha
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", default="/work/ext9", help="folder with areal 1.0.4 (--no-deps)")
    ap.add_argument("--random", type=int, default=2000, help="small random cases")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="bench/results/compat_contiguous.json")
    args = ap.parse_args()
    _, orig = load_originals(args.ext)
    jitted = JIT.startswith("numba")
    if jitted:  # compile once, outside the clocks
        orig.min_abs_diff_partition(np.arange(1, 20), 3, 1)
    sizes = (256, 1024, 4096, 8192) if jitted else (64, 256)
    split, batches = [], []
    for wl in ("rl-math", "sft-chat", "long-mix"):
        for n in sizes:
            lens = sb.workloads.lengths(wl, n, seed=0).astype(np.int64)
            for k in (4, 16, 64):
                if k <= n // 4:
                    split.append(split_row("lengths", wl, lens, k, 1, orig, args.repeat))
            if n == sizes[1]:
                split.append(split_row("lengths", wl, lens, 8, 4, orig, args.repeat))
                work = 24576 * lens + lens * lens
                split.append(split_row("verl workload", wl, work, 8, 1, orig, args.repeat))
        for n in (1024, 8192):
            lens = sb.workloads.lengths(wl, n, seed=0).astype(np.int64)
            for c in (4, 16, 64):
                batches.append(batch_row(wl, lens, c, orig, args.repeat))
    print(f"AReaL jit: {JIT}\n")
    print_table(split, SPLIT_COLUMNS)
    print()
    print_table(batches, BATCH_COLUMNS)
    rand = random_check(orig, args.random)
    print("\nsmall random calls:", rand)
    out = write_json(args.json, {"machine": machine_info(), "areal_jit": JIT, "split": split,
                                 "batches": batches, "random": rand})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
