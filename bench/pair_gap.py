"""Whether a shorter FSDP plan exists where the default stays above its stop gap: a slow,
exhaustive search over pairs of micro-batches, outside the planner.

``bench/true_gap.py`` asks HiGHS, which cannot settle the rl-math rows (64 x 8: neither a
shorter plan nor a higher bound in 180 s; 1,024 x 8: too large). This script starts from
the default plan and repeats rounds: for each slot, heaviest first, the heaviest
micro-batch pools its sequences with those of every other micro-batch (pools of up to
``--pool`` sequences) and takes the best of all their splits within the token cap (the
sum of slot maxima lowered most); after each round the micro-batches are dealt into slots
again by cost, heaviest ``dp`` first (for a fixed set of micro-batches the dealing that
minimises the sum of slot maxima). It ends when a round changes nothing or after
``--rounds``. Every plan it reports is checked (each sequence once, every micro-batch
within the cap) and simulated by seqbalance.

The planner's own pass (``seqbalance.planning._pair_split``) does the same with at most 9
sequences and 8 partners, without dealing again, within a small budget; this one shows
what a wider search reaches, and so whether the gap is in the plan or in the bound.

    python bench/pair_gap.py                     # rl-math 64 x 8 and 1,024 x 8 (about 20 s)
    python bench/pair_gap.py --json bench/results/pair_gap.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost

ROWS = [("rl-math", 64, 8), ("rl-math", 1024, 8)]


def slot_sum(bins: list[list[int]], costs: np.ndarray, dp: int) -> float:
    loads = np.array([costs[b].sum() for b in bins]).reshape(-1, dp)
    return float(loads.max(axis=1).sum())


def best_split(bins, a, costs, lens, cap, dp, pool_max):
    """The best new split of bin ``a`` with any other bin: (gain, b, to_a, to_b)."""
    loads = np.array([costs[b].sum() for b in bins]).reshape(-1, dp)
    ja = a // dp
    best = (0.0, None, None, None)
    for b in range(len(bins)):
        pool = bins[a] + bins[b]
        k = len(pool)
        if b == a or k > pool_max or k < 2:
            continue
        jb = b // dp
        c, t = costs[pool], lens[pool]
        bits = ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1).astype(bool)
        x, tx = bits @ c, bits @ t
        ok = bits.any(axis=1) & ~bits.all(axis=1) & (tx <= cap) & (t.sum() - tx <= cap)
        rest_a = np.delete(loads[ja], [a % dp, b % dp] if jb == ja else [a % dp]).max(
            initial=0.0
        )
        if jb == ja:
            old = loads[ja].max()
            new = np.maximum(rest_a, np.maximum(x, c.sum() - x))
        else:
            rest_b = np.delete(loads[jb], b % dp).max(initial=0.0)
            old = loads[ja].max() + loads[jb].max()
            new = np.maximum(rest_a, x) + np.maximum(rest_b, c.sum() - x)
        gain = np.where(ok, old - new, 0.0)
        s = int(np.argmax(gain))
        if gain[s] > best[0] * (1 + 1e-12) and gain[s] > 1e-12 * old:
            best = (float(gain[s]), b, [pool[q] for q in range(k) if bits[s, q]],
                    [pool[q] for q in range(k) if not bits[s, q]])  # fmt: skip
    return best


def search(name: str, n: int, dp: int, pool_max: int, rounds: int) -> dict:
    cost = load_cost("qwen2.5-7b")
    lens = workloads.load(name, n, seed=0).lengths
    cap = max(32768, int(lens.max()))
    costs = np.asarray(cost(lens), dtype=np.float64)
    p = sb.plan(lens, dp, cap, cost=cost)
    bound = p.simulate().lower_bound
    m = p.num_micro_batches
    bins = [list(p.micro_batches[r][j]) for j in range(m) for r in range(dp)]
    trail = [slot_sum(bins, costs, dp) / bound - 1]
    t0 = time.perf_counter()
    moves = 0
    for _ in range(rounds):
        changed = False
        levels = np.array([costs[b].sum() for b in bins]).reshape(m, dp).max(axis=1)
        for j in np.argsort(-levels, kind="stable").tolist():
            loads = np.array([costs[b].sum() for b in bins[j * dp : (j + 1) * dp]])
            a = j * dp + int(np.argmax(loads))
            _, b, to_a, to_b = best_split(bins, a, costs, lens, cap, dp, pool_max)
            if b is not None:
                bins[a], bins[b] = to_a, to_b
                changed, moves = True, moves + 1
        order = np.argsort(-np.array([costs[b].sum() for b in bins]), kind="stable")
        bins = [bins[i] for i in order]  # dealt again: heaviest dp bins form a slot
        trail.append(slot_sum(bins, costs, dp) / bound - 1)
        if not changed:
            break
    grid = [[sorted(bins[j * dp + r]) for j in range(m)] for r in range(dp)]
    found = sb.Plan(grid, lens, max_tokens=cap, costs=costs, sync="fsdp")
    assert sorted(i for r in grid for mb in r for i in mb) == list(range(n))
    assert not any(found.violations().values())
    return {
        "workload": name, "n": n, "dp": dp, "m": m, "pool": pool_max,
        "default_gap": p.simulate().gap, "found_gap": found.simulate().gap,
        "gap_by_round": trail, "moves": moves, "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=14, help="most sequences a pair pools")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = []
    for name, n, dp in ROWS:
        row = search(name, n, dp, args.pool, args.rounds)
        out.append(row)
        print(f"{name} {n} x {dp} (m {row['m']}): default {100 * row['default_gap']:.3f}% "
              f"above the bound, pair search {100 * row['found_gap']:.3f}% "
              f"({row['moves']} exchanges, {len(row['gap_by_round']) - 1} rounds, "
              f"{row['seconds']:.0f} s)", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
