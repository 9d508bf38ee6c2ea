"""How far the default plan is from the optimum, by HiGHS, on the rows that miss latency targets.

``bench/latency.py`` reports each plan's gap to the capacity-aware lower bound
(``Plan.lower_bound``). Where that gap stays above the default effort's stop gap (0.1%), the
default search runs every candidate family and baseline. This script tells whether the
gap is in the plan (a shorter plan exists) or in the bound (the plan is near the optimum),
on the exact model of a step with the plan's count ``m`` of micro-batches per rank: the
plan picks the fewest count first, so only plans with that count compete with it.

Model (``scipy.optimize.milp``, HiGHS): ``x[i, r, j] = 1`` when sequence ``i`` runs in
micro-batch ``j`` of rank ``r``; every sequence once; at most ``max_tokens`` tokens per
micro-batch; the cost of a micro-batch is the sum of its sequences' costs (the Qwen2.5-7B
FLOPs cost has no per-micro-batch term). FSDP: minimise ``sum_j s_j`` with
``s_j >= cost(r, j)`` for every rank; DDP: minimise ``C >= sum_j cost(r, j)``. Slots are
ordered by ``s_j`` and the longest sequence is put on rank 0 (both only relabel plans).

- ``relaxed``: only the sequences of at least ``--integral`` tokens (or half the capacity,
  if lower) are integral, the
  others may be split (cost and tokens in proportion): a relaxation, so its optimum is a
  lower bound on every plan with ``m`` micro-batches per rank (the dual bound is reported
  when the time limit stops it first).
- ``greedy``: the planner's capacity-aware greedy candidate alone
  (``seqbalance.planning._capacity_greedy``; under FSDP its slots then evened out across
  the ranks, ``seqbalance.planning._slot_balance``, without the default's stop), checked
  and simulated by seqbalance: an upper bound on the optimum.
- ``rank_token_bound``: :func:`seqbalance.planning.bounds.rank_token_bound` at ``m``
  (numpy, well under a millisecond); ``packed_slot_bound`` (FSDP): the slot bound with the
  long sequences packed whole that the default's stop asks
  (``seqbalance.planning._packed_slot``, a few milliseconds). Both are lower bounds the
  planner uses.
- ``exact``: every ``x`` integral, within ``--time-limit`` seconds: its best plan is an
  upper bound on the optimum (a shorter plan than the default's, where it is below the
  plan's step), and its dual bound a lower bound.

All figures are relative to the plan's reported lower bound (``Plan.lower_bound``). Cases
with more than ``--max-binaries`` variables in the exact model run only the relaxation.

    python bench/true_gap.py                         # the five rows (about 15 minutes)
    python bench/true_gap.py --time-limit 60         # shorter
    python bench/true_gap.py --survey                # no HiGHS: every latency --quick row

Writes ``bench/results/true_gap.json`` (``--survey``: ``true_gap_survey.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, print_table, write_json

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost
from seqbalance.planning._capacity_greedy import ddp_greedy, fsdp_greedy
from seqbalance.planning._packed_slot import packed_slot_bound
from seqbalance.planning._slot_balance import balance_slots
from seqbalance.planning.bounds import rank_token_bound

# (workload, n, dp, sync): the rows of bench/latency.py --quick that miss their target
CASES = [
    ("rl-math", 64, 8, "fsdp"), ("rl-math", 1024, 8, "fsdp"), ("rl-math", 8192, 64, "fsdp"),
    ("long-context", 1024, 8, "fsdp"), ("long-context", 1024, 8, "ddp"),
]  # fmt: skip


def model(
    lens: np.ndarray, w: np.ndarray, dp: int, m: int, cap: int, sync: str, integral: np.ndarray
) -> tuple[np.ndarray, LinearConstraint, np.ndarray, Bounds]:
    """The MILP of the module docstring: objective, constraints, integrality, bounds."""
    n, nb = lens.size, dp * m
    nx = n * nb
    ny = m if sync == "fsdp" else 1
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    r0 = 0

    def add(c: np.ndarray, v: np.ndarray, low: float, high: float) -> None:
        nonlocal r0
        rows.append(np.full(c.size, r0))
        cols.append(c)
        vals.append(v)
        lo.append(low)
        hi.append(high)
        r0 += 1

    base = np.arange(n) * nb
    for i in range(n):  # every sequence once
        add(np.arange(i * nb, (i + 1) * nb), np.ones(nb), 1.0, 1.0)
    for b in range(nb):  # the capacity
        add(base + b, lens.astype(float), -np.inf, float(cap))
    for r in range(dp):
        if sync == "fsdp":
            for j in range(m):
                add(np.r_[base + r * m + j, nx + j], np.r_[w, -1.0], -np.inf, 0.0)
        else:
            idx = (base[:, None] + r * m + np.arange(m)[None, :]).ravel()
            add(np.r_[idx, nx], np.r_[np.repeat(w, m), -1.0], -np.inf, 0.0)
    if sync == "fsdp":
        for j in range(m - 1):  # slots ordered by cost (relabels slots only)
            add(np.array([nx + j, nx + j + 1]), np.array([1.0, -1.0]), 0.0, np.inf)
    a = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r0, nx + ny)
    )
    obj = np.zeros(nx + ny)
    obj[nx:] = 1.0
    integ = np.zeros(nx + ny)
    for i in np.flatnonzero(integral):
        integ[i * nb : (i + 1) * nb] = 1
    ub = np.ones(nx + ny)
    ub[nx:] = np.inf
    longest = int(np.argmax(lens))
    ub[longest * nb + m : (longest + 1) * nb] = 0.0  # on rank 0 (relabels ranks only)
    return obj, LinearConstraint(a, lo, hi), integ, Bounds(np.zeros(nx + ny), ub)


def solve(args: tuple[Any, ...], time_limit: float) -> dict[str, Any]:
    obj, cons, integ, bounds = args
    t = time.perf_counter()
    res = milp(obj, constraints=cons, integrality=integ, bounds=bounds,
               options={"time_limit": time_limit, "mip_rel_gap": 1e-5})  # fmt: skip
    return {
        "status": res.message.split("(")[0].strip(),
        "primal": None if res.fun is None else float(res.fun),
        "dual": float(getattr(res, "mip_dual_bound", np.nan) or np.nan),
        "seconds": time.perf_counter() - t,
        "x": res.x,
    }


def _bounds_row(name: str, n: int, dp: int, sync: str) -> tuple[dict[str, Any], Any]:
    """The default and full-search plans, the greedy plan and the planner's stop bounds of
    one row, over the default plan's ``Plan.lower_bound``; and what the HiGHS models need:
    ``(lens, w, cap, m, plan, bound)`` with ``w`` the costs in units of that bound."""
    cost = load_cost("qwen2.5-7b")
    lens = workloads.load(name, n, seed=0).lengths
    cap = max(32768, int(lens.max()))
    plan = sb.plan(lens, dp, cap, cost=cost, sync=sync)
    thorough = sb.plan(lens, dp, cap, cost=cost, sync=sync, effort="thorough")
    bound, m = plan.lower_bound(), plan.num_micro_batches
    w = np.asarray(plan.costs, dtype=float) / bound  # in units of the plan's bound
    row: dict[str, Any] = {
        "workload": name, "n": n, "dp": dp, "sync": sync, "m": m, "max_tokens": cap,
        "plan": plan.simulate().step_time / bound,
        "thorough": thorough.simulate().step_time / bound,
        "rank_token_bound": rank_token_bound(w, lens, dp, m, cap),
    }  # fmt: skip
    if sync == "fsdp":
        row["packed_slot_bound"] = packed_slot_bound(w, lens, dp, cap)
    costs = np.asarray(plan.costs, dtype=float)
    greedy = ddp_greedy if sync == "ddp" else fsdp_greedy
    grid = greedy(costs, lens, dp, m, cap)
    if grid is not None and sync == "fsdp":
        grid = balance_slots(grid, costs, lens, cap)  # (as the planner's candidate, in full)
    if grid is not None and all(mb for rank in grid for mb in rank):
        got = sb.Plan(grid, lens, max_tokens=cap, costs=plan.costs, sync=sync)
        assert not any(got.violations().values()), got.violations()
        row["greedy"] = got.simulate().step_time / bound
    return row, (lens, w, cap, m, plan, bound)


def case_row(name: str, n: int, dp: int, sync: str, opts: argparse.Namespace) -> dict[str, Any]:
    row, (lens, w, cap, m, plan, bound) = _bounds_row(name, n, dp, sync)
    big = lens >= min(opts.integral, cap // 2)
    if n * dp * m <= opts.max_relaxed:
        rel = solve(model(lens, w, dp, m, cap, sync, big), opts.time_limit)
        row["relaxed_integral"] = int(big.sum())
        row["relaxed"] = rel["primal"] if rel["status"].startswith("Optim") else rel["dual"]
        row["relaxed_s"] = rel["seconds"]
    if n * dp * m <= opts.max_binaries:
        ex = solve(model(lens, w, dp, m, cap, sync, np.ones(n, bool)), opts.time_limit)
        row["exact_best"], row["exact_dual"] = ex["primal"], ex["dual"]
        row["exact_status"], row["exact_s"] = ex["status"], ex["seconds"]
        if ex["x"] is not None:  # the plan HiGHS found, checked by seqbalance's simulator
            x = ex["x"][: n * dp * m].reshape(n, dp, m) > 0.5
            grid = [[np.flatnonzero(x[:, r, j]).tolist() for j in range(m)] for r in range(dp)]
            got = sb.Plan(grid, lens, max_tokens=cap, costs=plan.costs, sync=sync)
            row["exact_best_simulated"] = got.simulate().step_time / bound
    print(
        f"{name:13} {n:5} x {dp:3} {sync}  m={m}  plan {row['plan']:.5f}  thorough "
        f"{row['thorough']:.5f}  greedy {row.get('greedy', np.nan):.5f}  relaxed "
        f"{row.get('relaxed', np.nan):.5f}  exact "
        f"[{row.get('exact_dual') or np.nan:.5f}, {row.get('exact_best') or np.nan:.5f}]",
        flush=True,
    )
    return row


def survey_rows() -> list[dict[str, Any]]:
    """Every row of ``bench/latency.py --quick``: the default plan, the full search and
    the greedy plan at the default plan's count, over ``Plan.lower_bound``."""
    rows = []
    for name in ("rl-math", "sft-chat", "long-mix", "long-context"):
        for n, dp in ((48, 8), (64, 8), (256, 16), (1024, 8), (4096, 32), (8192, 64)):
            for sync in ("fsdp", "ddp"):
                row, _ = _bounds_row(name, n, dp, sync)
                del row["max_tokens"]
                rows.append(row)
                print(name, n, dp, sync, {k: row.get(k) for k in
                      ("plan", "thorough", "greedy", "rank_token_bound")}, flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=240.0, help="seconds per HiGHS solve")
    ap.add_argument("--integral", type=int, default=30000,
                    help="tokens from which a sequence is integral in the relaxation "
                         "(or half the capacity, if lower)")  # fmt: skip
    ap.add_argument("--max-binaries", type=int, default=20000)
    ap.add_argument("--max-relaxed", type=int, default=200000)
    ap.add_argument("--out", default="bench/results/true_gap.json")
    ap.add_argument("--survey", action="store_true",
                    help="no HiGHS: the default plan, the full search, the greedy plan and "
                    "rank_token_bound on every row of bench/latency.py --quick")  # fmt: skip
    opts = ap.parse_args(argv)
    if opts.survey:
        rows = survey_rows()
        print_table(rows, ["workload", "n", "dp", "sync", "m", "plan", "thorough", "greedy",
                           "rank_token_bound", "packed_slot_bound"])  # fmt: skip
        better = [r for r in rows if r.get("greedy", np.inf) < min(r["plan"], r["thorough"])]
        print(f"greedy shorter than both efforts' plans on {len(better)} of {len(rows)} rows")
        write_json(opts.out.replace(".json", "_survey.json"), {
            "command": " ".join(["python bench/true_gap.py", *(argv or sys.argv[1:])]),
            "note": "figures relative to Plan.lower_bound(); greedy: the capacity-aware "
                    "greedy plan at the default plan's count; rank_token_bound: valid for that "
                    "count only",
            "machine": machine_info(), "rows": rows,
        })  # fmt: skip
        return 0
    rows = [case_row(*c, opts) for c in CASES]
    cols = ["workload", "n", "dp", "sync", "m", "plan", "thorough", "greedy", "relaxed",
            "exact_dual", "exact_best", "rank_token_bound", "packed_slot_bound"]  # fmt: skip
    print_table(rows, cols)
    write_json(opts.out, {
        "command": " ".join(["python bench/true_gap.py", *(argv or sys.argv[1:])]),
        "note": "figures relative to Plan.lower_bound(); relaxed and exact_dual: lower bounds "
                "on every plan with m micro-batches per rank; exact_best: a plan HiGHS found; "
                "greedy: the capacity-aware greedy plan",
        "machine": machine_info(), "rows": rows,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
