"""Random small inputs with tight caps: the drop-ins never use more parts than the framework,
and are never heavier at an equal count.

    python bench/compat_counts.py --ext /work/ext9 [--cases 1500] [--seed 7]

(set-up as for ``bench/compat.py``; verl and AReaL only). Per case: 2-79 integer lengths
(a third of the cases drawn from five values, so ties are frequent), a cap between the
longest length and a few times it (AReaL) or the total (verl), ``min_groups`` 1-4 and a
divisor in {1, 2, 3} (AReaL). Compared with the originals' own output:

- verl: the default ``micro_batches_of_lengths`` against verl 0.9.1's micro-batching loop
  (``bench/compat.py``'s ``verl_dynamic``), heaviest by verl's workload ``24576 L + L**2``;
- AReaL: ``ffd_allocate`` and ``kk_allocate`` against AReaL 1.0.4's, heaviest by tokens;
  also AReaL's first-fit decreasing against its reproduction ``compat.areal._areal_ffd_once``
  (the same groups in the same order).

Every drop-in result is also checked to hold every index once and the cap. Prints a table
and writes JSON (default bench/results/compat_counts.json). Inputs where the original
raises are skipped (counted).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, print_table, write_json
from compat import load_originals, verl_dynamic

from seqbalance.compat import areal as c_areal
from seqbalance.compat import verl as c_verl

COLUMNS = ["call", "compared", "skipped", "more parts", "fewer parts", "heavier at equal count",
           "reproduction differs"]  # fmt: skip


def values(rng: np.random.Generator, case: int) -> list[int]:
    n = int(rng.integers(2, 80))
    if case % 3 == 0:
        return [int(x) for x in rng.choice([100, 200, 300, 4000, 8000], n)]
    return rng.integers(1, 16000, n).tolist()


def check(parts, n: int, sizes: np.ndarray, cap: int) -> None:
    assert sorted(i for p in parts for i in p) == list(range(n)), "index lost or repeated"
    assert all(int(sizes[list(p)].sum()) <= cap for p in parts), "cap broken"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", required=True, help="--target folder of verl and AReaL")
    ap.add_argument("--cases", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default="bench/results/compat_counts.json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # AReaL logs each fallback to FFD
    v_orig, a_orig = load_originals(args.ext)
    rng = np.random.default_rng(args.seed)
    stats = {name: dict.fromkeys(COLUMNS[1:], 0) for name in
             ("verl dynamic mbs (default)", "areal ffd_allocate", "areal kk_allocate")}  # fmt: skip
    for case in range(args.cases):
        vals = values(rng, case)
        arr = np.asarray(vals, dtype=np.int64)
        n = len(vals)
        # verl: cap between the longest length and the total.
        cap = int(rng.integers(int(arr.max()), int(arr.sum()) + 2))
        work = 24576 * arr + arr * arr
        theirs = verl_dynamic(v_orig, vals, cap)
        ours = c_verl.micro_batches_of_lengths(arr, cap)
        check(ours, n, arr, cap)
        tally(stats["verl dynamic mbs (default)"], ours, theirs, work)
        # AReaL: a tighter cap, min_groups and a divisor.
        cap = int(rng.integers(int(arr.max()), 4 * int(arr.max()) + 1))
        mg, div = int(rng.integers(1, 5)), int(rng.choice([1, 1, 2, 3]))
        for name in ("ffd_allocate", "kk_allocate"):
            s = stats[f"areal {name}"]
            try:
                theirs = getattr(a_orig, name)(vals, cap, mg, div)
            except Exception:  # AReaL raises (too few values for its count): not compared
                s["skipped"] += 1
                continue
            ours = getattr(c_areal, name)(arr, cap, mg, div)
            check(ours, n, arr, cap)
            tally(s, ours, theirs, arr)
        if mg <= n and hasattr(c_areal, "_areal_ffd_once"):  # (absent before 2026-11-23)
            ffd = a_orig._ffd_allocate(np.array(vals), cap, mg)
            if [[int(i) for i in g] for g in ffd] != c_areal._areal_ffd_once(arr, cap, mg):
                stats["areal ffd_allocate"]["reproduction differs"] += 1
    rows = [{"call": name, **s} for name, s in stats.items()]
    print_table(rows, COLUMNS)
    out = write_json(args.json, {"machine": machine_info(), "cases": args.cases,
                                 "seed": args.seed, "rows": rows})  # fmt: skip
    print(f"wrote {out}")


def tally(s: dict, ours, theirs, weight: np.ndarray) -> None:
    s["compared"] += 1
    if len(ours) > len(theirs):
        s["more parts"] += 1
    elif len(ours) < len(theirs):
        s["fewer parts"] += 1
    elif max(int(weight[list(p)].sum()) for p in ours) > max(
        int(weight[list(p)].sum()) for p in theirs
    ):
        s["heavier at equal count"] += 1


if __name__ == "__main__":
    main()
