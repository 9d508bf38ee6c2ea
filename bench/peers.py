"""seqbalance against the standalone partitioning and packing packages, same inputs, same run.

Peers are imported from a private folder (``--peers DIR``, default ``/work/ext14``) with one
sub-folder per package, filled with ``pip install --target DIR/<name> <name>``; a peer that
is missing or fails to import is skipped and the reason printed. Never a core dependency.

Sections (``--only`` picks some):

``free``     free-count k-way partitioning of token lengths: the heaviest part of each
             peer's partition vs ``partition(..., method="auto")``; ``sb_le`` says whether
             seqbalance's heaviest part is no heavier than every peer's; ``x_<peer>`` is the
             peer's time / seqbalance's time (above 1: seqbalance is faster).
``pack``     single-rank packing under a token cap: bins used and heaviest bin of compiled
             first/best fit decreasing (lightbinpack) and ``binpacking.to_constant_volume``
             vs ``plan(dp_size=1)``.
``cliffs``   seqbalance alone on the former time cliffs: equal counts at n/k = 4, balanced
             and equal at ~200,000 x 8,192, padded plans.
``exact``    small inputs (n <= 30, k <= 8, GRPO-like and lognormal weights): how often
             ``auto`` proves its result optimal, checked against brute force (n <= 9) and
             an ILP (``scipy.optimize.milp``, n <= 12) on a subset.
``optimum``  the same shapes, every size rule: how often ``auto`` equals the proven
             optimum (its own proof, else an ILP with ``--ilp-seconds``) and its largest
             excess over it; cases the ILP cannot settle in time are counted apart.
``scaling``  time of ``partition`` for n = 1e3 ... 1e6 and the fitted exponent of t ~ n**a.

Times are the best of ``--repeat`` runs (``time.perf_counter``). Writes a table per section
and JSON (machine info, git revision) to ``bench/results/peers.json``.

    python bench/peers.py                  # everything (~10-20 minutes on a loaded VM)
    python bench/peers.py --only free pack
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from _common import best_time, machine_info, print_table, write_json

from seqbalance import workloads
from seqbalance.partitioning import lower_bound, partition
from seqbalance.planning import plan

PEERS = ("prtpy", "numberpartitioning", "binpacking", "lightbinpack")
NOT_INSTALLABLE = {
    "seq-len-balance": "sdist only (Rust/maturin); building needs crates.io, unreachable here",
    "seqpacker": "sdist only (Rust/maturin); building needs crates.io, unreachable here",
}
FREE_CASES = [(16, 4), (24, 8), (30, 4), (512, 8), (2048, 16), (8192, 8), (8192, 128)]
PY_PEER_MAX_WORK = 2**21  # n * k above this: the pure-Python peers take minutes


def load_peers(root: Path) -> dict[str, Any]:
    mods: dict[str, Any] = {}
    for name in PEERS:
        extra = [root / name, root / f"{name}_deps"]
        for p in extra:
            if p.is_dir() and str(p) not in sys.path:
                sys.path.append(str(p))
        try:
            mods[name] = importlib.import_module(name)
        except Exception as exc:  # any import failure means "skip this peer"
            print(f"skipping {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    for name, why in NOT_INSTALLABLE.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    return mods


def max_of(parts: list[list[int]], w: np.ndarray) -> float:
    return max((float(w[np.asarray(p, dtype=np.int64)].sum()) if p else 0.0) for p in parts)


def check_cover(parts: list[list[int]], n: int, who: str) -> None:
    flat = sorted(int(i) for p in parts for i in p)
    if flat != list(range(n)):
        raise RuntimeError(f"{who} lost or repeated an index")


def free_peers(mods: dict[str, Any]) -> dict[str, Callable[[list[int], int], list[list[int]]]]:
    out: dict[str, Callable[[list[int], int], list[list[int]]]] = {}
    if "prtpy" in mods:
        pr = mods["prtpy"]

        def prtpy_alg(alg: Any) -> Callable[[list[int], int], list[list[int]]]:
            def run(w: list[int], k: int) -> list[list[int]]:
                got = pr.partition(algorithm=alg, numbins=k, items=dict(enumerate(w)))
                return [list(b) for b in got]
            return run

        out["prtpy_kk"] = prtpy_alg(pr.partitioning.karmarkar_karp)
        out["prtpy_lpt"] = prtpy_alg(pr.partitioning.greedy)
    if "numberpartitioning" in mods:
        npn = mods["numberpartitioning"]
        out["np_kk"] = lambda w, k: npn.karmarkar_karp(
            w, num_parts=k, return_indices=True).partition
        out["np_greedy"] = lambda w, k: npn.greedy(
            w, num_parts=k, return_indices=True).partition
    if "binpacking" in mods:
        bp = mods["binpacking"]

        def bp_run(w: list[int], k: int) -> list[list[int]]:
            bins = [list(b.keys()) for b in bp.to_constant_bin_number(dict(enumerate(w)), k)]
            return bins + [[] for _ in range(k - len(bins))]

        out["binpacking"] = bp_run
    return out


def section_free(mods: dict[str, Any], repeat: int) -> list[dict[str, Any]]:
    peers = free_peers(mods)
    rows = []
    for name in ("rl-math", "sft-chat"):
        for n, k in FREE_CASES:
            lens = workloads.lengths(name, n, 0)
            w = lens.astype(np.float64)
            wl = [int(x) for x in lens]
            lb = lower_bound(w, k)
            t_sb, p = best_time(lambda w=w, k=k: partition(w, k), repeat)
            row: dict[str, Any] = {"workload": name, "n": n, "k": k, "sb_gap": p.gap,
                                   "sb_ms": t_sb * 1e3, "sb_opt": p.optimal}
            worst_peer = np.inf
            for peer, fn in peers.items():
                if n * k > PY_PEER_MAX_WORK:
                    continue
                t, parts = best_time(lambda fn=fn, wl=wl, k=k: fn(wl, k), repeat, budget_s=3.0)
                check_cover(parts, n, peer)
                mx = max_of(parts, w)
                row[f"{peer}_gap"] = mx / lb - 1
                row[f"x_{peer}"] = t / t_sb
                worst_peer = min(worst_peer, mx)
            row["sb_le"] = bool(p.max_load <= worst_peer)
            rows.append(row)
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def section_pack(mods: dict[str, Any], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name, n, cap in [("sft-chat", 4096, 32768), ("rl-math", 4096, 65536),
                         ("sft-chat", 65536, 32768), ("rl-math", 65536, 65536)]:
        lens = workloads.lengths(name, n, 0)
        ll = [int(x) for x in lens]
        def run_sb(lens: np.ndarray = lens, cap: int = cap) -> Any:
            return plan(lens, dp_size=1, max_tokens=cap)

        t_sb, pl = best_time(run_sb, repeat, 10.0)
        mbs = pl.micro_batches[0]
        tok = [int(lens[np.asarray(mb, dtype=np.int64)].sum()) for mb in mbs]
        row: dict[str, Any] = {"workload": name, "n": n, "cap": cap, "sb_bins": len(mbs),
                               "sb_max": max(tok), "sb_ms": t_sb * 1e3}
        if "lightbinpack" in mods:
            lb = mods["lightbinpack"]
            for alg in ("ffd", "bfd"):
                fn = getattr(lb, alg)
                t, bins = best_time(lambda fn=fn, ll=ll, cap=cap: fn(ll, cap), repeat)
                check_cover(bins, n, alg)
                row[f"{alg}_bins"] = len(bins)
                row[f"{alg}_max"] = max(sum(ll[i] for i in b) for b in bins)
                row[f"x_{alg}"] = t / t_sb
        if "binpacking" in mods and n <= 8192:
            bp = mods["binpacking"]
            items = dict(enumerate(ll))
            t, bins = best_time(lambda: bp.to_constant_volume(items, cap), 1)  # noqa: B023
            row["bp_bins"] = len(bins)
            row["bp_max"] = max(sum(b.values()) for b in bins)
            row["x_bp"] = t / t_sb
        rows.append(row)
    return rows


def section_cliffs(repeat: int) -> list[dict[str, Any]]:
    rows = []
    cases: list[tuple[str, Callable[[], Any]]] = []
    for name in ("rl-math", "sft-chat"):
        for n, k, size in [(8192, 2048, "equal"), (65536, 16384, "equal"),
                           (262144, 65536, "equal"), (196608, 8192, "equal"),
                           (200000, 8192, "balanced")]:
            w = workloads.lengths(name, n, 0).astype(np.float64)
            cases.append((f"partition {name} n={n} k={k} {size}",
                          lambda w=w, k=k, size=size: partition(w, k, size=size)))
    lens = workloads.lengths("rl-math", 2000, 0)
    cases.append(("plan padded rl-math n=2000 dp=64",
                  lambda: plan(lens, dp_size=64, max_tokens=65536, padded=True)))
    tiny = 3 + np.arange(800) % 5
    cases.append(("plan padded 800 tiny, cap 8",
                  lambda: plan(tiny, dp_size=8, max_tokens=8, padded=True)))
    big = workloads.lengths("sft-chat", 262144, 0)
    cases.append(("plan padded sft-chat n=262144 dp=64",
                  lambda: plan(big, dp_size=64, max_tokens=65536, padded=True)))
    cases.append(("plan packed sft-chat n=262144 dp=64",
                  lambda: plan(big, dp_size=64, max_tokens=65536)))
    for label, fn in cases:
        t, out = best_time(fn, repeat, 10.0)
        gap = getattr(out, "gap", None)
        rows.append({"case": label, "s": t, "gap": gap if gap is not None else "",
                     "under_2s": t <= 2.0})
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def brute(w: np.ndarray, k: int, size: str) -> float:
    n = len(w)
    best = np.inf
    for lab in itertools.product(range(k), repeat=n):
        c = np.bincount(lab, minlength=k)
        if size == "equal" and c.min() != c.max():
            continue
        if size == "balanced" and c.max() - c.min() > 1:
            continue
        best = min(best, float(np.bincount(lab, weights=w, minlength=k).max()))
    return best


def milp_opt(w: np.ndarray, k: int, size: str, time_limit: float) -> tuple[float, bool]:
    """min max-load as a MILP (HiGHS via scipy): x[i, p] binary, z >= every part's load."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    m = len(w)
    c, nv = m // k, m * k + 1
    a = lil_matrix((m + 2 * k, nv))
    lo, hi = [], []
    for i in range(m):
        a[i, i * k:(i + 1) * k] = 1
        lo.append(1)
        hi.append(1)
    for p in range(k):
        for i in range(m):
            a[m + p, i * k + p] = w[i]
            a[m + k + p, i * k + p] = 1
        a[m + p, nv - 1] = -1
        lo.append(-np.inf)
        hi.append(0)
    for _ in range(k):
        lo.append({"free": 0, "equal": c, "balanced": c}[size])
        hi.append({"free": m, "equal": c, "balanced": c + 1}[size])
    ub = np.ones(nv)
    ub[-1] = np.inf
    for j, i in enumerate(np.argsort(-w, kind="stable")):  # symmetry: j-th heaviest in 0..j
        ub[i * k + j + 1:(i + 1) * k] = 0
    cost = np.zeros(nv)
    cost[-1] = 1
    integ = np.ones(nv)
    integ[-1] = 0
    res = milp(cost, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=integ,
               bounds=Bounds(np.zeros(nv), ub),
               options={"time_limit": time_limit, "mip_rel_gap": 0.0})
    if res.x is None:
        return np.inf, False
    lab = np.argmax(res.x[:-1].reshape(m, k), axis=1)
    return float(np.bincount(lab, weights=w, minlength=k).max()), res.status == 0


def small_weights(kind: str, n: int, seed: int) -> np.ndarray:
    if kind == "grpo":
        return workloads.lengths("rl-math", n, seed).astype(np.float64)
    return np.random.default_rng(seed).lognormal(0.0, 1.0, n)


def section_exact(seeds: int, ilp_seconds: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    checks = {"brute": 0, "brute_equal": 0, "ilp": 0, "ilp_proven": 0, "ilp_sb_le": 0,
              "max_excess_vs_ilp": 0.0}
    for kind in ("grpo", "logn"):
        for n in (8, 12, 16, 20, 24, 30):
            for k in (2, 3, 4, 8):
                for size in ("free", "equal", "balanced"):
                    if size == "equal" and n % k:
                        continue
                    proven, times, exact_won = 0, [], 0
                    for seed in range(seeds):
                        w = small_weights(kind, n, seed)
                        t0 = time.perf_counter()
                        p = partition(w, k, size=size)
                        times.append(time.perf_counter() - t0)
                        proven += p.optimal
                        exact_won += p.method == "exact"
                        if seed == 0 and n <= 9 and k ** n <= 2**17:
                            checks["brute"] += 1
                            checks["brute_equal"] += abs(brute(w, k, size) - p.max_load) <= (
                                1e-9 * p.max_load)
                        if seed < 2 and n <= 12 and ilp_seconds > 0:
                            opt, ok = milp_opt(w, k, size, ilp_seconds)
                            checks["ilp"] += 1
                            checks["ilp_proven"] += ok
                            checks["ilp_sb_le"] += p.max_load <= opt * (1 + 1e-9)
                            if ok:
                                checks["max_excess_vs_ilp"] = max(
                                    checks["max_excess_vs_ilp"], p.max_load / opt - 1)
                    rows.append({"w": kind, "n": n, "k": k, "size": size,
                                 "proven": f"{proven}/{seeds}", "exact_won": exact_won,
                                 "mean_ms": 1e3 * float(np.mean(times)),
                                 "max_ms": 1e3 * float(np.max(times))})
                    print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows, checks


def section_optimum(
    seeds: int, ilp_seconds: float, kinds: tuple[str, ...] = ("grpo", "logn"),
    verify_seeds: int = 2,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Does ``auto`` equal the proven optimum? Every shape of ``exact``, every size rule.

    A result ``auto`` proves optimal counts as equal (its proofs are checked against brute
    force and the ILP in tests/test_exact.py); every other one is solved by the ILP with
    ``ilp_seconds``: equal when it matches a proven ILP optimum, ``ilp_unproven`` when the
    ILP proves nothing in time (then ``auto`` is compared with the ILP's best solution:
    ``auto_worse_than_ilp_best`` and ``max_excess_vs_ilp_best``).
    ``max_gap`` (against the lower bound) caps the excess over the optimum in every case.
    For the first ``verify_seeds`` seeds, optima that the exact searches proved are solved
    by the ILP as well: ``proofs_refuted`` counts those where it finds something lighter.
    """
    rows = []
    tot = {"cases": 0, "equal": 0, "auto_proven": 0, "ilp_unproven": 0, "above_opt": 0,
           "proofs_checked": 0, "proofs_refuted": 0,
           "max_excess": 0.0, "max_gap": 0.0, "auto_worse_than_ilp_best": 0,
           "max_excess_vs_ilp_best": 0.0, "max_ms": 0.0}
    for kind in kinds:
        for n in (8, 12, 16, 20, 24, 30):
            for k in (2, 3, 4, 8):
                for size in ("free", "equal", "balanced"):
                    if size == "equal" and n % k:
                        continue
                    r = {"w": kind, "n": n, "k": k, "size": size, "cases": 0, "equal": 0,
                         "auto_proven": 0, "ilp_unproven": 0, "max_excess": 0.0,
                         "max_gap": 0.0, "max_ms": 0.0}
                    for seed in range(seeds):
                        w = small_weights(kind, n, seed)
                        t0 = time.perf_counter()
                        p = partition(w, k, size=size)
                        ms = 1e3 * (time.perf_counter() - t0)
                        r["cases"] += 1
                        r["max_ms"] = max(r["max_ms"], ms)
                        r["max_gap"] = max(r["max_gap"], p.gap)
                        if p.optimal:
                            r["auto_proven"] += 1
                            r["equal"] += 1
                            if p.method == "exact" and seed < verify_seeds:
                                # Cross-check the exact searches' proofs with the ILP.
                                opt, ok = milp_opt(w, k, size, ilp_seconds)
                                tot["proofs_checked"] += ok
                                tot["proofs_refuted"] += ok and opt < p.max_load * (1 - 1e-9)
                            continue
                        opt, ok = milp_opt(w, k, size, ilp_seconds)
                        tol = 1e-9 * opt
                        if not ok:
                            r["ilp_unproven"] += 1
                            tot["auto_worse_than_ilp_best"] += p.max_load > opt + tol
                            tot["max_excess_vs_ilp_best"] = max(
                                tot["max_excess_vs_ilp_best"], p.max_load / opt - 1)
                            continue
                        if p.max_load <= opt + tol:
                            r["equal"] += 1
                        else:
                            tot["above_opt"] += 1
                            r["max_excess"] = max(r["max_excess"], p.max_load / opt - 1)
                    for key in ("cases", "equal", "auto_proven", "ilp_unproven"):
                        tot[key] += r[key]
                    for key in ("max_excess", "max_gap", "max_ms"):
                        tot[key] = max(tot[key], r[key])
                    rows.append(r)
                    print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    settled = tot["cases"] - tot["ilp_unproven"]
    tot["equal_rate_of_settled"] = tot["equal"] / settled if settled else 1.0
    tot["equal_rate_all"] = tot["equal"] / tot["cases"] if tot["cases"] else 1.0
    return rows, tot


def section_scaling(repeat: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ns = [1000, 4000, 16000, 64000, 256000, 1000000]
    series = {"free k=64": lambda n: (64, "free"), "equal n/k=4": lambda n: (n // 4, "equal"),
              "balanced k=64": lambda n: (64, "balanced")}
    rows, fits = [], []
    for label, shape in series.items():
        ts = []
        for n in ns:
            k, size = shape(n)
            w = workloads.lengths("sft-chat", n, 0).astype(np.float64)
            t, p = best_time(lambda w=w, k=k, size=size: partition(w, k, size=size), repeat,
                             10.0)
            ts.append(t)
            rows.append({"series": label, "n": n, "k": k, "s": t, "gap": p.gap})
            print(".", end="", file=sys.stderr, flush=True)
        a = float(np.polyfit(np.log(ns), np.log(ts), 1)[0])
        # n log n over the same range fits an exponent of about 1.10.
        ref = float(np.polyfit(np.log(ns), np.log(np.array(ns) * np.log(ns)), 1)[0])
        # Small n often stops early at the lower bound (gap 0), which steepens the full fit;
        # the fit from 64,000 up shows the growth where the refinement does its full work.
        a_big = float(np.polyfit(np.log(ns[3:]), np.log(ts[3:]), 1)[0])
        fits.append({"series": label, "exponent": a, "exponent_64k_up": a_big,
                     "n_log_n_exponent": ref, "ok": a <= ref + 0.05})
    print(file=sys.stderr)
    return rows, fits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default="/work/ext14", help="folder of pip --target installs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=30, help="seeds per shape in 'exact'")
    ap.add_argument("--ilp-seconds", type=float, default=20.0)
    ap.add_argument("--only", nargs="*", default=["free", "pack", "cliffs", "exact", "scaling"])
    ap.add_argument("--kinds", nargs="*", default=["grpo", "logn"],
                    help="weights in 'optimum': grpo, logn")
    ap.add_argument("--verify-seeds", type=int, default=2,
                    help="seeds per shape whose exact proofs the ILP re-checks in 'optimum'")
    ap.add_argument("--out", default="bench/results/peers.json")
    args = ap.parse_args(argv)
    mods = load_peers(Path(args.peers))
    result: dict[str, Any] = {"machine": machine_info(), "peers": sorted(mods),
                              "skipped": NOT_INSTALLABLE}
    if "free" in args.only:
        rows = section_free(mods, args.repeat)
        peer_cols = {c for r in rows for c in r if c.endswith("_gap") and c != "sb_gap"}
        peer_cols |= {c for r in rows for c in r if c.startswith("x_")}
        cols = ["workload", "n", "k", "sb_gap", "sb_ms", "sb_le", *sorted(peer_cols)]
        print_table(rows, cols)
        result["free"] = rows
    if "pack" in args.only:
        rows = section_pack(mods, args.repeat)
        print_table(rows, list(dict.fromkeys(c for r in rows for c in r)))
        result["pack"] = rows
    if "cliffs" in args.only:
        rows = section_cliffs(args.repeat)
        print_table(rows, ["case", "s", "gap", "under_2s"])
        result["cliffs"] = rows
    if "exact" in args.only:
        rows, checks = section_exact(args.seeds, args.ilp_seconds)
        print_table(rows, ["w", "n", "k", "size", "proven", "exact_won", "mean_ms", "max_ms"])
        print(checks)
        result["exact"] = {"rows": rows, "checks": checks}
    if "optimum" in args.only:
        rows, tot = section_optimum(args.seeds, args.ilp_seconds, tuple(args.kinds),
                                    args.verify_seeds)
        print_table(rows, ["w", "n", "k", "size", "cases", "equal", "auto_proven",
                           "ilp_unproven", "max_excess", "max_gap", "max_ms"])
        print(tot)
        result["optimum"] = {"rows": rows, "totals": tot}
    if "scaling" in args.only:
        rows, fits = section_scaling(args.repeat)
        print_table(rows, ["series", "n", "k", "s", "gap"])
        print_table(fits, ["series", "exponent", "exponent_64k_up", "n_log_n_exponent", "ok"])
        result["scaling"] = {"rows": rows, "fits": fits}
    path = write_json(args.out, result)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
