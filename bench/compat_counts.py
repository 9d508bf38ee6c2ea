"""Random inputs with tight caps: the drop-ins never use more parts than the framework,
and are never heavier at an equal count.

    python bench/compat_counts.py --ext /work/ext9 [--cases 1500] [--seed 7]
    python bench/compat_counts.py --ext /work/ext9 --max-n 3000 --slime /tmp/slime \
        --openrlhf /tmp/openrlhf --cases 1000

(set-up as for ``bench/compat.py``; verl and AReaL only). Per case: 2-79 integer lengths
(a third of the cases drawn from five values, so ties are frequent), a cap between the
longest length and a few times it (AReaL) or the total (verl), ``min_groups`` 1-4 and a
divisor in {1, 2, 3} (AReaL). Compared with the originals' own output:

- verl: the default ``micro_batches_of_lengths`` against verl 0.9.1's micro-batching loop
  (``bench/compat.py``'s ``verl_dynamic``), heaviest by verl's workload ``24576 L + L**2``;
- AReaL: ``ffd_allocate`` and ``kk_allocate`` against AReaL 1.0.4's, heaviest by tokens;
  also AReaL's first-fit decreasing against its reproduction
  ``seqbalance.planning._pipelines.areal_ffd_groups``
  (the same groups in the same order).

With ``--max-n`` above 79, AReaL's inputs hold 2 to ``--max-n`` values instead (drawn from a
second random stream, so verl's cases stay those of the default run; verl's own loop is
exponential on large inputs). With ``--slime``: one step of slime's ``build_dp_schedule``
per case (dynamic batch, 2 to ``--max-n`` samples, ``dp`` 1-4, VPP groups of 1-2, with or
without ``balance_data``; a quarter of the cases with empty samples and samples above the
cap) against slime's own: micro-batches per rank, the heaviest rank (FLOPs of a 7B-like
model with ``balance_data``, tokens without), and slime's first fit and bin splitting
against their reproductions (``compat.slime._slime_first_fit`` / ``_slime_expand``).

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
from compat import load_originals, load_slime_openrlhf, slime_args, verl_dynamic

from seqbalance.compat import areal as c_areal
from seqbalance.compat import verl as c_verl
from seqbalance.planning import _pipelines

# AReaL's first-fit decreasing reproduced: the planner's baselines hold it (older checkouts
# keep it in compat.areal, or lack it); None skips that check.
ffd_groups = getattr(_pipelines, "areal_ffd_groups", getattr(c_areal, "_areal_ffd_once", None))

COLUMNS = ["call", "compared", "skipped", "more parts", "fewer parts", "heavier at equal count",
           "reproduction differs"]  # fmt: skip


def values(rng: np.random.Generator, case: int, max_n: int = 79) -> list[int]:
    n = int(rng.integers(2, max_n + 1))
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
    ap.add_argument("--max-n", type=int, default=79, help="most values in AReaL's and "
                    "slime's cases")  # fmt: skip
    ap.add_argument("--slime", help="slime checkout: also compare build_dp_schedule")
    ap.add_argument("--openrlhf", help="OpenRLHF checkout (loaded beside slime)")
    ap.add_argument("--json", default="bench/results/compat_counts.json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # AReaL logs each fallback to FFD
    v_orig, a_orig = load_originals(args.ext)
    rng = np.random.default_rng(args.seed)
    big = np.random.default_rng([args.seed, 1])  # AReaL's and slime's inputs with --max-n
    names = ["verl dynamic mbs (default)", "areal ffd_allocate", "areal kk_allocate"]
    s_orig = None
    if args.slime:
        s_orig = load_slime_openrlhf(args.slime, args.openrlhf or args.slime)[0]
        names.append("slime build_dp_schedule")
    stats = {name: dict.fromkeys(COLUMNS[1:], 0) for name in names}
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
        if args.max_n > 79:
            vals = values(big, case, args.max_n)
            arr = np.asarray(vals, dtype=np.int64)
            n = len(vals)
            cap = int(big.integers(int(arr.max()), 4 * int(arr.max()) + 1))
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
        if mg <= n and ffd_groups is not None:
            ffd = a_orig._ffd_allocate(np.array(vals), cap, mg)
            if [[int(i) for i in g] for g in ffd] != ffd_groups(arr, cap, mg):
                stats["areal ffd_allocate"]["reproduction differs"] += 1
        if s_orig is not None:
            slime_case(stats["slime build_dp_schedule"], s_orig, big, case, args.max_n)
    rows = [{"call": name, **s} for name, s in stats.items()]
    print_table(rows, COLUMNS)
    out = write_json(args.json, {"machine": machine_info(), "cases": args.cases,
                                 "seed": args.seed, "rows": rows})  # fmt: skip
    print(f"wrote {out}")


def slime_case(s: dict, s_orig, rng: np.random.Generator, case: int, max_n: int) -> None:
    """One random step of slime's dynamic schedule, the drop-in against slime's own."""
    from seqbalance.compat import slime as c_slime

    sl = sys.modules["slime.utils.seqlen_balancing"]
    lens = values(rng, case, max_n)
    if case % 4 == 3:  # empty samples, and samples above the cap (alone in a micro-batch)
        lens = [0 if rng.random() < 0.1 else x for x in lens]
        cap = int(rng.integers(max(1, max(lens) // 2), max(lens) + 1))
    else:
        cap = int(rng.integers(max(lens), 4 * max(lens) + 1))
    n, dp, group = len(lens), int(rng.integers(1, 5)), int(rng.integers(1, 3))
    a = slime_args(False, cap)
    a.balance_data = bool(rng.integers(0, 2))
    tp = {"dp_size": dp, "cp_size": 1, "vpp_size": 2 if group > 1 else 1,
          "microbatch_group_size_per_vp_stage": group}  # fmt: skip
    arr = np.asarray(lens, dtype=np.int64)
    bins = sl.first_fit_pack(lens, cap)
    mine = c_slime._slime_first_fit(arr, cap)
    same = bins == mine
    target = max(-(-len(bins) // (dp * group)) * dp * group, dp * group)
    sl.expand_bins_by_splitting(bins, target, lens)
    c_slime._slime_expand(mine, target, arr)
    if not (same and bins == mine):
        s["reproduction differs"] += 1

    def call(mod):
        return mod.build_dp_schedule(a, tp, lens, global_batch_size=n,
                                     rollout_indices=list(range(n)))  # fmt: skip

    try:
        theirs = call(s_orig)
        if any(not mb for rank in theirs[1] for mb in rank):
            raise AssertionError("empty micro-batch")  # the drop-in never returns one
    except AssertionError:  # slime raises, or returns an empty micro-batch: not compared
        s["skipped"] += 1
        return
    ours = call(c_slime)
    check(ours[0], n, arr, float("inf"))
    for part, mbs in zip(ours[0], ours[1]):
        for mb in mbs:
            mb_lens = arr[[part[i] for i in mb]]
            # Over the cap only alone, or beside empty samples where the step has too few
            # samples to move them (docs/migrating.md).
            assert mb_lens.sum() <= cap or mb_lens.sum() == mb_lens.max(), "cap broken"
    w = c_slime.sequence_fwd_flops(arr, a) if a.balance_data else arr.astype(np.float64)
    s["compared"] += 1
    if ours[2][0] != theirs[2][0]:
        s["more parts" if ours[2][0] > theirs[2][0] else "fewer parts"] += 1
    elif max(float(w[p].sum()) for p in ours[0]) > max(float(w[p].sum()) for p in theirs[0]):
        s["heavier at equal count"] += 1


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
