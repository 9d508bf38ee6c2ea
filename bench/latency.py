"""Per-step latency of ``plan()`` by effort, side by side with AReaL's FFD pipeline.

``plan`` runs on every training step, on the critical path. This times it at the default
effort (``--thorough``: also at ``effort="thorough"``, the full search; ``--fast``: also at
``effort="fast"``) on the standard
workloads, FSDP and DDP, the Qwen2.5-7B FLOPs cost, ``max_tokens = max(32768, longest)``;
for n >= 1,024 AReaL's own FFD pipeline runs on the same lengths in the same run: its
token-balanced equal-count rank split (``areal.utils.seqpack.balanced_greedy_partition``)
and, per rank, its first-fit-decreasing micro-batches (``ffd_allocate``), every rank
re-allocated with the largest count until the counts agree (what its synced allocation
does across ranks). AReaL is imported from ``--ext`` (``pip install --no-deps --target DIR
areal==1.0.4``) with stand-ins for what ``seqpack`` imports but does not use (``numba``,
its logging module); without it the column is left empty.

Columns: ``ms`` best of ``--repeat`` wall times of ``plan`` (``time.perf_counter``), the
target for that size, ``m`` and ``gap`` (the plan's simulated step over the capacity-aware
lower bound, minus 1), ``areal_ms`` and ``areal/sb`` (above 1: seqbalance is faster);
with ``--thorough`` or ``--fast`` that effort's time and its step against the default's
(``step/thorough``: default over thorough; ``fast/default``: fast over default).
Then two checks: no n <= 4,096 slower than the same workload and sync at n = 8,192, and the
count chosen with a per-micro-batch cost (the H100 fit of ``bench/results/gpu_step_h100.json``)
on rl-math 1,024 (GRPO over dp 64, and dp 8): the simulated step of each count and the
pick. ``--calibrated`` runs instead: that count choice; the rows of n <= 8,192 under the
H100 fit (seconds, with per-sequence and per-micro-batch terms), the default's and fast's
time and the step the default saves over fast (``saved_ms``); and, on rl-math 1,024 x 8
under FSDP with the FLOPs cost, the default's extra planning time against what its plan
saves on the step under the fit. It writes ``bench/results/latency_calibrated.json``.

    python bench/latency.py --ext /work/ext                 # the full grid (minutes)
    python bench/latency.py --ext /work/ext --quick         # n <= 8,192
    python bench/latency.py --ext /work/ext --thorough      # also effort="thorough"
    python bench/latency.py --ext /work/ext --fast          # also effort="fast"
    python bench/latency.py --calibrated                    # under the H100 fit instead
    python bench/latency.py --ext /work/ext --against /tmp/old/src --rows rl-math:1024:8

``--against SRC`` (another checkout's ``src``, e.g. made with ``git worktree add``) times
``--rows`` instead, at the default effort: here and in that checkout (a worker process),
alternating ``--rounds`` times, beside AReaL's pipeline in the same rounds, so that the
ratios hold on a noisy machine.

Writes ``bench/results/latency.json`` (``--quick``: ``latency_quick.json``; ``--calibrated``:
``latency_calibrated.json``; ``--against``: ``latency_against.json``). The machine
is shared: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_time, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost

NAMES = ("rl-math", "sft-chat", "long-mix", "long-context")
# (n, dp, target ms at the default effort)
SIZES = [
    (48, 8, 5.0), (64, 8, 5.0), (256, 16, 5.0), (1024, 8, 15.0), (4096, 32, None),
    (8192, 64, 60.0), (32768, 256, 150.0), (65536, 1024, 400.0),
]  # fmt: skip
QUICK_SIZES = [s for s in SIZES if s[0] <= 8192]
H100 = Path(__file__).resolve().parent / "results" / "gpu_step_h100.json"


def load_areal(ext: str) -> Any:
    """``areal.utils.seqpack`` from ``ext``, its package ``__init__``s skipped."""
    sys.path.insert(0, ext)
    for pkg in ("areal", "areal.utils"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(ext, *pkg.split(".")))]
        sys.modules[pkg] = mod
    for name, attrs in (
        ("numba", {"njit": lambda f=None, **k: f if f else (lambda g: g)}),
        ("areal.utils.logging", {"getLogger": logging.getLogger}),
    ):
        stub = types.ModuleType(name)
        stub.__dict__.update(attrs)
        sys.modules.setdefault(name, stub)
    import importlib

    return importlib.import_module("areal.utils.seqpack")


def areal_ffd(seqpack: Any, lengths: list[int], dp: int, cap: int) -> list[list[list[int]]]:
    """AReaL's pipeline: equal-count greedy rank split by tokens, then per-rank FFD
    micro-batches, re-allocated with the largest count until every rank agrees."""
    ranks = seqpack.balanced_greedy_partition(lengths, K=dp)
    per_rank = [[lengths[i] for i in r] for r in ranks]
    groups = [seqpack.ffd_allocate(v, cap, min_groups=1) for v in per_rank]
    while len({len(g) for g in groups}) > 1:  # the all-gather of counts, then a re-run
        m = max(len(g) for g in groups)
        groups = [g if len(g) == m else seqpack.ffd_allocate(v, cap, min_groups=m)
                  for g, v in zip(groups, per_rank)]  # fmt: skip
    return [[[r[j] for j in mb] for mb in g] for r, g in zip(ranks, groups)]


def latency_rows(
    sizes: list[tuple[int, int, float | None]], repeat: int, seqpack: Any, thorough: bool,
    fast: bool = False,
) -> list[dict[str, Any]]:
    cost = load_cost("qwen2.5-7b")
    rows = []
    for name in NAMES:
        for n, dp, target in sizes:
            lens = workloads.load(name, n, seed=0).lengths
            cap = max(32768, int(lens.max()))
            areal_s = None
            if seqpack is not None and n >= 1024:
                run = functools.partial(areal_ffd, seqpack, lens.tolist(), dp, cap)
                areal_s, grid = best_time(run, repeat)
                assert sorted(i for r in grid for mb in r for i in mb) == list(range(n))
            for sync in ("fsdp", "ddp"):
                ours = functools.partial(sb.plan, lens, dp, cap, cost=cost, sync=sync)
                t, p = best_time(ours, repeat)
                row: dict[str, Any] = {
                    "workload": name, "n": n, "dp": dp, "sync": sync, "ms": t * 1e3,
                    "target_ms": target, "ok": None if target is None else t * 1e3 <= target,
                    "m": p.num_micro_batches, "gap": p.simulate().gap,
                    "areal_ms": None if areal_s is None else areal_s * 1e3,
                    "areal/sb": None if areal_s is None else areal_s / t,
                }  # fmt: skip
                if thorough:
                    tt, q = best_time(functools.partial(ours, effort="thorough"), repeat)
                    row["thorough_ms"] = tt * 1e3
                    row["step/thorough"] = p.simulate().step_time / q.simulate().step_time
                if fast:
                    tf, f = best_time(functools.partial(ours, effort="fast"), repeat)
                    row["fast_ms"] = tf * 1e3
                    row["fast/default"] = f.simulate().step_time / p.simulate().step_time
                rows.append(row)
                print(
                    f"{name:13} {n:6} x {dp:5} {sync}  {t * 1e3:8.1f} ms"
                    + ("" if target is None else f" (target {target:g})")
                    + ("" if areal_s is None else f"  areal {areal_s * 1e3:8.1f} ms")
                    + (f"  thorough {row['thorough_ms']:8.1f} ms" if thorough else "")
                    + (f"  fast {row['fast_ms']:8.1f} ms" if fast else ""),
                    flush=True,
                )
    return rows


def monotone_check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of n <= 4,096 slower than the same workload and sync at n = 8,192."""
    at = {(r["workload"], r["sync"]): r["ms"] for r in rows if r["n"] == 8192}
    return [
        {"workload": r["workload"], "n": r["n"], "sync": r["sync"], "ms": r["ms"],
         "ms_8192": at[(r["workload"], r["sync"])]}
        for r in rows
        if r["n"] <= 4096 and (r["workload"], r["sync"]) in at
        and r["ms"] > at[(r["workload"], r["sync"])]
    ]  # fmt: skip


def count_demo(repeat: int) -> dict[str, Any]:
    """rl-math 1,024, FSDP: GRPO over dp 64 (an equal share per rank, and with groups),
    and over dp 8 with free ranks: the simulated step at each count
    (``min_micro_batches``, full search) and the default effort's pick and time, without
    and with a per-micro-batch cost."""
    w = workloads.load("rl-math", 1024, seed=0)
    cap = max(32768, int(w.lengths.max()))
    costs = {"qwen2.5-7b (no per-micro-batch term)": load_cost("qwen2.5-7b")}
    if H100.exists():
        fit = _h100()
        costs[f"H100 fit (per micro-batch {fit.per_microbatch:.4g} s)"] = fit
    out: dict[str, Any] = {"max_tokens": cap, "cases": []}
    for dp, rule, kw in ((64, "size='equal'", {"size": "equal"}),
                         (64, "groups", {"groups": w.groups}), (8, "free", {})):  # fmt: skip
        for label, cost in costs.items():
            run = functools.partial(sb.plan, w.lengths, dp, cap, cost=cost, **kw)
            m0 = run(effort="thorough").num_micro_batches
            steps = {m: run(min_micro_batches=m, effort="thorough").simulate().step_time
                     for m in range(m0, m0 + 4)}  # fmt: skip
            t, chosen = best_time(run, repeat)
            case = {
                "case": f"rl-math 1,024 x dp {dp}, {rule}, fsdp", "cost": label,
                "step_by_count": steps, "fewest": m0,
                "default_picks": chosen.num_micro_batches,
                "default_step": chosen.simulate().step_time, "default_ms": t * 1e3,
                "note": chosen.notes[-1] if chosen.notes else "",
            }  # fmt: skip
            out["cases"].append(case)
            print(f"{case['case']}, {label}: steps by count {{"
                  + ", ".join(f"{m}: {v:.6g}" for m, v in steps.items())
                  + f"}}; default effort picks {chosen.num_micro_batches} ({t * 1e3:.1f} ms)")
    return out


# The worker that times another checkout's plan() (``--against``): one JSON request a line.
_WORKER = """
import json, sys, time
import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import load_cost
cost = load_cost("qwen2.5-7b")
for line in sys.stdin:
    q = json.loads(line)
    lens = workloads.load(q["workload"], q["n"], seed=0).lengths
    cap = max(32768, int(lens.max()))
    best = float("inf")
    for _ in range(q["repeat"]):
        t0 = time.perf_counter()
        p = sb.plan(lens, q["dp"], cap, cost=cost, sync=q["sync"])
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"ms": best * 1e3, "step": p.simulate().step_time}), flush=True)
"""


def against_rows(
    rows: list[tuple[str, int, int]], src: str, rounds: int, repeat: int, seqpack: Any
) -> list[dict[str, Any]]:
    """Each row's default-effort time here and in the seqbalance at ``src`` (a worker
    process), alternating ``rounds`` times (best of ``repeat`` each, :func:`_alternate`),
    beside AReaL's pipeline in the same rounds: the best of each, their ratios and the
    steps."""
    import subprocess

    path = os.pathsep.join(x for x in (src, os.environ.get("PYTHONPATH")) if x)
    worker = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": path})  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker planning with {src} stopped (see its stderr)")
        return json.loads(line)

    cost = load_cost("qwen2.5-7b")
    out = []
    try:
        for name, n, dp in rows:
            lens = workloads.load(name, n, seed=0).lengths
            cap = max(32768, int(lens.max()))
            for sync in ("fsdp", "ddp"):
                here, there, areal, p, got = _alternate(
                    ask, {"workload": name, "n": n, "dp": dp, "sync": sync, "repeat": repeat},
                    functools.partial(sb.plan, lens, dp, cap, cost=cost, sync=sync),
                    None if seqpack is None else functools.partial(
                        areal_ffd, seqpack, lens.tolist(), dp, cap),
                    rounds, repeat,
                )  # fmt: skip
                sim = p.simulate()
                row = {
                    "workload": name, "n": n, "dp": dp, "sync": sync, "ms": here,
                    "against_ms": there, "ms/against": here / there,
                    "areal_ms": None if seqpack is None else areal,
                    "areal/sb": None if seqpack is None else areal / here,
                    "gap": sim.gap, "step/against": sim.step_time / got["step"],
                }  # fmt: skip
                out.append(row)
                print(f"{name:13} {n:6} x {dp:5} {sync}  {here:8.1f} ms  against "
                      f"{there:8.1f} ms" + ("" if seqpack is None else f"  areal {areal:8.1f} ms"),
                      flush=True)  # fmt: skip
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    return out


def _alternate(
    ask: Any, request: dict[str, Any], here: Any, areal: Any, rounds: int, repeat: int
) -> tuple[float, float, float, Any, dict[str, Any]]:
    """Best times (ms) of ``here`` (a plan call), the worker's answer to ``request`` and
    ``areal`` (None: not run), ``rounds`` rounds of ``repeat`` each, each round starting
    with the next of them (the first run of a round measured up to 15% slower than the
    same code run second); with the last plan and the worker's last answer."""
    best = {"here": float("inf"), "there": float("inf"), "areal": float("inf")}
    last: dict[str, Any] = {}

    def time_here() -> float:
        t, last["plan"] = best_time(here, repeat)
        return t * 1e3

    def time_there() -> float:
        last["got"] = ask(request)
        return float(last["got"]["ms"])

    runs = {"here": time_here, "there": time_there}
    if areal is not None:
        runs["areal"] = lambda: best_time(areal, repeat)[0] * 1e3
    order = list(runs)
    for k in range(rounds):
        for key in order[k % len(order):] + order[: k % len(order)]:
            best[key] = min(best[key], runs[key]())
    return best["here"], best["there"], best["areal"], last["plan"], last["got"]


def _git_rev(src: str) -> str | None:
    """The commit of the checkout that holds ``src``, if it is one."""
    import subprocess

    got = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                         text=True)  # fmt: skip
    return got.stdout.strip() or None


def _h100() -> Any:
    return sb.load_cost(json.loads(H100.read_text())["calibration"]["cost"])


def _record(path: str, cost: str, repeat: int, **parts: Any) -> str:
    """Write ``parts`` to ``path`` with the machine, its load, the cost and the repeats."""
    return str(write_json(path, {"machine": machine_info(), "load_average": os.getloadavg(),
                                 "cost": cost, "repeat": repeat, **parts}))  # fmt: skip


def calibrated_main(args: argparse.Namespace) -> int:
    """``--calibrated``: the count choice, the rows of n <= 8,192 under the H100 fit, and
    what the default's search time buys on the FLOPs-cost row of rl-math 1,024 x 8 under
    FSDP (both efforts' plans simulated under the fit)."""
    if not H100.exists():
        raise SystemExit(f"{H100} is missing")
    counts = count_demo(args.repeat)
    print("\nunder the H100 fit (seconds; saved_ms: the default's step against fast's)")
    rows = calibrated_rows(QUICK_SIZES, args.repeat)
    print_table(rows, ["workload", "n", "dp", "sync", "ms", "fast_ms", "m", "m_fast", "gap",
                       "saved_ms"])  # fmt: skip
    payback = flops_plan_payback(args.repeat)
    out = _record(args.json, "H100 fit (bench/results/gpu_step_h100.json)", args.repeat,
                  count_choice=counts, rows=rows, flops_plan_payback=payback)  # fmt: skip
    print(f"wrote {out}")
    return 0


def flops_plan_payback(repeat: int) -> dict[str, Any]:
    """rl-math 1,024 x 8, FSDP, planned with the FLOPs cost at the default effort and at
    ``effort="fast"``: each plan's time, and its step simulated under the H100 fit (what
    the extra planning time buys on the GPU)."""
    lens = workloads.load("rl-math", 1024, seed=0).lengths
    run = functools.partial(sb.plan, lens, 8, 32768, cost=load_cost("qwen2.5-7b"), sync="fsdp")
    fit = _h100()
    out: dict[str, Any] = {"case": "rl-math 1,024 x 8, fsdp, qwen2.5-7b FLOPs cost"}
    for effort in ("default", "fast"):
        t, p = best_time(functools.partial(run, effort=effort), repeat)
        out[effort] = {"ms": t * 1e3, "step_s_h100": p.simulate(cost=fit).step_time}
    out["extra_ms"] = out["default"]["ms"] - out["fast"]["ms"]
    out["saved_ms"] = (out["fast"]["step_s_h100"] - out["default"]["step_s_h100"]) * 1e3
    print(f"\n{out['case']}: the default plans in {out['extra_ms']:.1f} ms more than fast; "
          f"its step under the H100 fit is {out['saved_ms']:.1f} ms shorter")
    return out


def calibrated_rows(sizes: list[tuple[int, int, float | None]], repeat: int) -> list[dict]:
    """The same workloads under the H100 fit (seconds, with a per-sequence and a
    per-micro-batch term), where the count is chosen by the step: the default's and
    ``effort="fast"``'s time, the count, and the step the default saves over fast."""
    cost = _h100()
    rows = []
    for name in NAMES:
        for n, dp, _ in sizes:
            lens = workloads.load(name, n, seed=0).lengths
            cap = max(32768, int(lens.max()))
            for sync in ("fsdp", "ddp"):
                run = functools.partial(sb.plan, lens, dp, cap, cost=cost, sync=sync)
                t, p = best_time(run, repeat)
                tf, f = best_time(functools.partial(run, effort="fast"), repeat)
                sim = p.simulate()
                row = {
                    "workload": name, "n": n, "dp": dp, "sync": sync, "ms": t * 1e3,
                    "fast_ms": tf * 1e3, "m": p.num_micro_batches, "m_fast": f.num_micro_batches,
                    "gap": sim.gap, "step_s": sim.step_time,
                    "saved_ms": (f.simulate().step_time - sim.step_time) * 1e3,
                }  # fmt: skip
                rows.append(row)
                print(f"{name:13} {n:6} x {dp:5} {sync}  {t * 1e3:8.1f} ms  fast "
                      f"{tf * 1e3:8.1f} ms  m {row['m']}  saved {row['saved_ms']:.1f} ms",
                      flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ext", default=os.environ.get("SEQBALANCE_EXT"),
                    help="folder with areal==1.0.4 installed --no-deps")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="n <= 8,192 only")
    ap.add_argument("--thorough", action="store_true", help='also time effort="thorough"')
    ap.add_argument("--fast", action="store_true", help='also time effort="fast"')
    ap.add_argument("--calibrated", action="store_true",
                    help="instead: the count choice and n <= 8,192 under the H100 fit")
    ap.add_argument("--against", metavar="SRC", default=None,
                    help="instead: time --rows here and in the seqbalance at SRC (another "
                    "checkout's src folder), alternating, beside AReaL's pipeline")
    ap.add_argument("--rows", nargs="+", default=["rl-math:1024:8"],
                    help="with --against: WORKLOAD:N:DP rows (default rl-math:1024:8)")
    ap.add_argument("--rounds", type=int, default=5, help="with --against: alternations")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="default: bench/results/latency.json, "
                    "with --quick latency_quick.json")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.json is None:
        name = "latency_quick.json" if args.quick else "latency.json"
        name = "latency_against.json" if args.against else name
        args.json = f"bench/results/{'latency_calibrated.json' if args.calibrated else name}"
    if args.calibrated:
        return calibrated_main(args)
    seqpack = None
    if args.ext:
        try:
            seqpack = load_areal(args.ext)
        except Exception as exc:  # (a peer that fails to import is skipped)
            print(f"areal not loaded from {args.ext}: {exc!r}")
    if args.against:
        picked = [(w, int(n), int(dp)) for w, n, dp in (r.split(":") for r in args.rows)]
        rows = against_rows(picked, args.against, args.rounds, args.repeat, seqpack)
        print_table(rows, ["workload", "n", "dp", "sync", "ms", "against_ms", "ms/against",
                           "areal_ms", "areal/sb", "gap", "step/against"])  # fmt: skip
        against = {"src": args.against, "rounds": args.rounds, "git_rev": _git_rev(args.against)}
        out = _record(args.json, "qwen2.5-7b", args.repeat, against=against, rows=rows)
        print(f"wrote {out}")
        return 0
    rows = latency_rows(QUICK_SIZES if args.quick else SIZES, args.repeat, seqpack,
                        args.thorough, args.fast)  # fmt: skip
    columns = ["workload", "n", "dp", "sync", "ms", "target_ms", "ok", "m", "gap",
               "areal_ms", "areal/sb"]
    columns += ["thorough_ms", "step/thorough"] if args.thorough else []
    columns += ["fast_ms", "fast/default"] if args.fast else []
    print_table(rows, columns)
    slower = monotone_check(rows)
    missed = [r for r in rows if r["ok"] is False]
    behind = [r for r in rows if r["areal/sb"] is not None and r["areal/sb"] < 1]
    print(f"\ntargets missed: {len(missed)} of {sum(r['ok'] is not None for r in rows)}")
    print(f"n <= 4,096 slower than n = 8,192: {len(slower)}")
    print(f"slower than AReaL's FFD pipeline (n >= 1,024): {len(behind)} of "
          f"{sum(r['areal/sb'] is not None for r in rows)}")  # fmt: skip
    counts = count_demo(args.repeat)
    out = _record(args.json, "qwen2.5-7b", args.repeat, rows=rows, slower_than_8192=slower,
                  count_choice=counts)  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
