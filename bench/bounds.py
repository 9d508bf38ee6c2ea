"""Resource bounds: time and peak memory of planning over random option combinations.

Default mode: ``--cases`` random option combinations (lengths, mesh, capacity, counts,
rules, costs; n <= ``--max-n``) planned in a pool of ``--workers`` processes. Each case
runs under a per-case alarm (``--case-timeout``) and each worker under an address-space
limit (``--memory-limit``), so a runaway case is recorded, never waited for. Per case:
its wall time (``time.perf_counter`` around the ``plan`` call) and CPU time
(``time.process_time``: on a shared, busy machine, nearer what the call takes alone),
whether it planned or raised ``ValueError`` (any other exception is a failure), the
guarantees of a plan
(coverage, the capacity, equal counts, no empty micro-batch unless allowed), and the
worker's peak RSS (``resource.getrusage``) after it: a case that raised the worker's peak
is charged with it. Prints the slowest cases and the peak memory; writes
``bench/results/bounds.json``.

``--reproducers``: requests that once ran for seconds to minutes or exhausted memory (absurd
sizes, thousands of empty micro-batches, option combinations that were time cliffs), each
in a fresh child process (time of the call, the child's peak RSS,
planned or the error's first words).

``--calibrated``: the same random cases under a calibrated cost (the H100 fit of
``bench/results/gpu_step_h100.json``, in seconds, with per-sequence and per-micro-batch
terms) wherever a case has no cost array and no context parallelism; with a
per-micro-batch term the default effort also plans larger counts. Writes
``bench/results/bounds_calibrated.json`` (with ``--json X``: ``X``'s name with
``_calibrated`` added).

    python bench/bounds.py                     # 10,000 cases (about half an hour on 2 cores)
    python bench/bounds.py --quick             # 300 cases
    python bench/bounds.py --reproducers       # the reproducers, one child process each
    python bench/bounds.py --calibrated        # the cases under a calibrated cost (H100 fit)
    git archive REV src | tar -x -C /tmp/base   # ... next to an older commit's, alternately:
    python bench/bounds.py --reproducers --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_json

# ---- reproducers ----------------------------------------------------------------------

L5 = [100, 200, 300, 50, 900]


def _reproducers() -> dict[str, Any]:
    """name -> (description, zero-argument call). Built lazily (in the child)."""
    import seqbalance as sb

    rng = np.random.default_rng(0)
    wide = rng.integers(1, 235931, 2000)
    dyn = rng.integers(1, 8001, 2000)
    dyn[rng.random(2000) < 0.1] = 8000
    grpo = rng.integers(64, 8000, 1000)
    grpo[rng.random(1000) < 0.1] = 32768
    groups = np.repeat(np.arange(250), 4)
    zeros = np.full(2000, 431)
    zeros[rng.choice(2000, 172, replace=False)] = 0
    fzero = zeros.astype(np.float64) * 1.37
    return {
        "dynamic CP, dp_size=10**9": lambda: sb.plan(L5, 10**9, 1000, cp_size=2, cp="dynamic"),
        "dynamic CP, min_micro_batches=10**9": lambda: sb.plan(
            L5, 2, 1000, cp_size=2, cp="dynamic", min_micro_batches=10**9),
        "dynamic CP, micro_batch_multiple=10**9, allow_empty": lambda: sb.plan(
            L5, 2, 1000, cp_size=2, cp="dynamic", micro_batch_multiple=10**9, allow_empty=True),
        "dynamic CP, dp_size=10**6": lambda: sb.plan(L5, 10**6, 1000, cp_size=2, cp="dynamic"),
        "static CP, dp_size=10**9": lambda: sb.plan(L5, 10**9, 1000, cp_size=2),
        "static CP, dp_size=10**6": lambda: sb.plan(L5, 10**6, 1000, cp_size=2),
        "min_micro_batches=32768, allow_empty (fill_slack)": lambda: sb.plan(
            L5, 2, 1000, min_micro_batches=32768, allow_empty=True),
        "pp_size=2, min_micro_batches=4096 (_moves)": lambda: sb.plan(
            L5, 2, 1000, pp_size=2, min_micro_batches=4096, allow_empty=True),
        "pp_size=2, min_micro_batches=32768, allow_empty": lambda: sb.plan(
            L5, 2, 1000, pp_size=2, min_micro_batches=32768, allow_empty=True),
        "pp_size=8 interleaved v=4, min_micro_batches=4000": lambda: sb.plan(
            L5, 2, 1000, pp_size=8, schedule="interleaved", virtual_stages=4,
            min_micro_batches=4000, allow_empty=True),
        "[94]*2000, cap 16, cp_size=8, pp_size=8": lambda: sb.plan(
            [94] * 2000, 1, 16, cp_size=8, pp_size=8),
        "2,000 in 1..235,930, dp 3, cp 32, pp 2 interleaved v=4, extra 2": lambda: sb.plan(
            wide, 3, 8192, cp_size=32, pp_size=2, schedule="interleaved", virtual_stages=4,
            extra_micro_batches=2),
        "[191724]*1000, dp 2, cp 32, ddp, pp 4 interleaved v=2, extra 1, min 3": lambda: (
            sb.plan([191724] * 1000, 2, 8192, cp_size=32, sync="ddp", pp_size=4,
                    schedule="interleaved", virtual_stages=2, extra_micro_batches=1,
                    min_micro_batches=3)),
        "dynamic CP, 2,000 in 1..8,000 (10% at 8,000), dp 1, cap 1,000, cp 8, ddp": lambda: (
            sb.plan(dyn, 1, 1000, cp_size=8, cp="dynamic", sync="ddp")),
        "GRPO 1,000 (10% at 32,768), groups of 4, dp 16, extra 2, ddp, qwen2.5-7b": lambda: (
            sb.plan(grpo, 16, 32768, groups=groups, extra_micro_batches=2, sync="ddp",
                    cost="qwen2.5-7b")),
        "same, allow_empty, order='index'": lambda: sb.plan(
            grpo, 16, 32768, groups=groups, extra_micro_batches=2, allow_empty=True,
            order="index", sync="ddp", cost="qwen2.5-7b"),
        "2,000 of 431 with 172 zeros, cap 1,000, per micro-batch 5, float costs": lambda: (
            sb.plan(zeros, 1, 1000, sequences_per_micro_batch=5, cost=fzero)),
        "pp_size=16384, 5 sequences": lambda: sb.plan(L5, 2, 1000, pp_size=16384),
        "empty lengths, dynamic CP": lambda: sb.plan([], 2, 1000, cp_size=4, cp="dynamic"),
        "static CP x PP with groups, n = 80": lambda: sb.plan(
            rng.integers(1, 3000, 80), 2, 1700, cp_size=2, pp_size=3, cost="qwen2.5-7b",
            groups=np.arange(80) // 4),
    }


def _child(name: str, limit_gb: float) -> None:
    """Run one reproducer here and print its result as JSON (the child process)."""
    lim = int(limit_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    call = _reproducers()[name]
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        p = call()
        outcome = f"plan: {p.num_micro_batches} micro-batches per rank"
    except ValueError as exc:
        outcome = f"ValueError: {exc}"
    except MemoryError:
        outcome = "MemoryError"
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": elapsed, "cpu_s": cpu, "peak_mb": peak, "outcome": outcome}))


def _run_child(name: str, args: argparse.Namespace, src: str | None) -> dict[str, Any]:
    """One reproducer in a child process (``src``: the seqbalance source tree to import)."""
    cmd = [sys.executable, __file__, "--child", name, "--memory-limit", str(args.memory_limit)]
    env = None if src is None else {**os.environ, "PYTHONPATH": src}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=args.case_timeout * 4)  # fmt: skip
        row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        row = {"seconds": None, "peak_mb": None, "outcome": "timeout"}
    except (IndexError, json.JSONDecodeError):
        row = {"seconds": None, "peak_mb": None, "outcome": f"crashed: {out.stderr[-300:]}"}
    return row


def _cells(row: dict[str, Any]) -> str:
    sec = "-" if row["seconds"] is None else f"{row['seconds']:.3f}"
    cpu = "-" if row.get("cpu_s") is None else f"{row['cpu_s']:.3f}"
    peak = "-" if row["peak_mb"] is None else f"{row['peak_mb']:.0f}"
    return f"{sec:>7} {cpu:>7} {peak:>8}"


def run_reproducers(args: argparse.Namespace) -> dict[str, Any]:
    names = list(_reproducers())
    rows = []
    head = f"{'reproducer':72} {'time s':>7} {'cpu s':>7} {'peak MB':>8}"
    if args.baseline_src:  # the same children on another source tree, alternately
        head += f" | {'base s':>7} {'cpu s':>7} {'peak MB':>8}"
    print(head + "  outcome")
    for name in names:
        row = _run_child(name, args, None)
        line = f"{name:72} {_cells(row)}"
        if args.baseline_src:
            row["baseline"] = _run_child(name, args, args.baseline_src)
            line += f" | {_cells(row['baseline'])}"
        row["name"] = name
        rows.append(row)
        print(f"{line}  {row['outcome'][:90]}", flush=True)
    ok = [r for r in rows if r["seconds"] is not None]
    print(f"slowest {max(r['seconds'] for r in ok):.3f} s wall, "
          f"{max(r.get('cpu_s', 0.0) for r in ok):.3f} s CPU; largest peak "
          f"{max(r['peak_mb'] for r in ok):.0f} MB (child process RSS, interpreter included)")
    return {"reproducers": rows}


# ---- random option combinations ---------------------------------------------------------


# The H100 fit of bench/results/gpu_step_h100.json (seconds): a cost with per-sequence and
# per-micro-batch terms, under which the default effort also chooses the count by the step.
CALIBRATED = {"per_microbatch": 9.761e-3, "per_sequence": 5.370e-3, "per_token": 7.641e-5,
              "per_token_sq": 1.296e-9}  # fmt: skip


def random_case(
    seed: int, max_n: int, calibrated: bool = False
) -> tuple[list[int], int, int, dict[str, Any]]:
    """One random request: (lengths, dp_size, max_tokens, keyword options).
    ``calibrated``: the same request with :data:`CALIBRATED`'s cost wherever it has no
    cost array of its own and no context parallelism."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, max_n + 1)) if rng.random() < 0.7 else int(rng.integers(0, 65))
    shape = rng.choice(["uniform", "lognormal", "bimodal", "zeros", "constant"])
    if shape == "uniform":
        lens = rng.integers(1, int(rng.choice([100, 4000, 32768])), n)
    elif shape == "lognormal":
        lens = np.minimum(rng.lognormal(7, 1.2, n).astype(np.int64) + 1, 200_000)
    elif shape == "bimodal":
        lens = np.where(rng.random(n) < 0.1, rng.integers(16000, 32768, n),
                        rng.integers(10, 2000, n))  # fmt: skip
    elif shape == "zeros":
        lens = np.where(rng.random(n) < 0.2, 0, rng.integers(1, 1000, n))
    else:
        lens = np.full(n, int(rng.integers(1, 5000)))
    dp = int(rng.choice([1, 2, 3, 4, 8, 16, 64]))
    top = int(lens.max()) if n else 1000
    kw: dict[str, Any] = {"sync": str(rng.choice(["fsdp", "ddp"]))}
    r = rng.random(24)
    cp = int(rng.choice([2, 4, 8, 32])) if r[0] < 0.25 else 1
    if cp > 1:
        kw["cp_size"] = cp
        kw["cp"] = "dynamic" if r[1] < 0.4 else "static"
    per_gpu = max(1, -(-top // cp))
    cap = max(1, int(per_gpu * float(rng.choice([0.5, 1, 1, 1.5, 2, 4, 16]))))
    if cap < per_gpu:
        if kw.get("cp") == "dynamic" or r[2] < 0.5:
            cap = per_gpu
        else:
            kw["oversized"] = "alone"
    if r[3] < 0.25:
        kw["pp_size"] = int(rng.choice([2, 3, 4, 8, 16]))
        if r[4] < 0.3:
            kw.update(schedule="interleaved", virtual_stages=int(rng.choice([2, 4])))
        elif r[4] < 0.5:
            kw["schedule"] = "gpipe"
        if r[5] < 0.2:
            kw["pp_comm"] = float(rng.choice([1e-3, 1.0]))
    if r[6] < 0.3:
        kw["cost"] = str(rng.choice(["qwen2.5-7b", "llama-3-8b", "qwen3-30b-a3b"]))
    elif r[6] < 0.4 and cp == 1:
        kw["cost"] = (lens * rng.uniform(0.5, 2.0, n)).tolist()
    if r[7] < 0.25:
        kw["allow_empty"] = True
    if r[8] < 0.2:
        kw["min_micro_batches"] = int(rng.choice([2, 4, 16, 64]))
    if r[9] < 0.15:
        kw["micro_batch_multiple"] = int(rng.choice([2, 3, 4]))
    dynamic = kw.get("cp") == "dynamic"
    if not dynamic:
        if r[10] < 0.2:
            kw["extra_micro_batches"] = int(rng.choice([1, 2, 4]))
        if r[11] < 0.15 and n:
            kw["groups"] = (np.arange(n) // int(rng.choice([2, 4, 8, 16]))).tolist()
        elif r[12] < 0.15:
            kw["size"] = str(rng.choice(["equal", "balanced"]))
        if r[13] < 0.15 and "pp_size" not in kw:
            kw["order"] = str(rng.choice(["heaviest_first", "light_ends", "index"]))
        if (r[14] < 0.1 and "pp_size" not in kw and "groups" not in kw and "size" not in kw
                and "extra_micro_batches" not in kw):  # fmt: skip
            kw["sequences_per_micro_batch"] = int(rng.choice([1, 2, 5, 16]))
        if r[15] < 0.05 and cp == 1:
            kw["padded"] = True
    if r[16] < 0.2:
        kw["baselines"] = False
    if calibrated and cp == 1 and not isinstance(kw.get("cost"), list):
        from seqbalance.costs import QuadraticCost

        kw["cost"] = QuadraticCost(**CALIBRATED)
    return lens.tolist(), dp, cap, kw


class _Alarm(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Alarm


def _init_worker(limit_gb: float) -> None:
    lim = int(limit_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    signal.signal(signal.SIGALRM, _on_alarm)
    import seqbalance  # noqa: F401  (imported once per worker, outside the timings)


def _guarantees(p: Any, n: int, cap: int, kw: dict[str, Any]) -> str:
    """'' when the plan keeps its guarantees, else what it broke."""
    v = p.violations()
    if v.get("missing", 0) or v.get("duplicated", 0):
        return "coverage"
    if v.get("unequal_counts", 0):
        return "unequal counts"
    if v.get("over_capacity", 0) and kw.get("oversized") != "alone":
        return "capacity"
    if v.get("empty", 0) and not kw.get("allow_empty"):
        return "empty micro-batch"
    if getattr(p, "cp_size", 1) == 1:
        flat = sorted(i for r in p.micro_batches for mb in r for i in mb)
        if flat != list(range(n)):
            return "coverage"
    return ""


def run_case(job: tuple[int, int, float, bool]) -> dict[str, Any]:
    import seqbalance as sb

    seed, max_n, timeout, calibrated = job
    lens, dp, cap, kw = random_case(seed, max_n, calibrated)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    signal.setitimer(signal.ITIMER_REAL, timeout)
    c0 = time.process_time()
    t0 = time.perf_counter()
    broken = ""
    try:
        p = sb.plan(lens, dp, cap, **kw)
        elapsed = time.perf_counter() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
        outcome = "plan"
        broken = _guarantees(p, len(lens), cap, kw)
    except ValueError:
        elapsed = time.perf_counter() - t0
        outcome = "ValueError"
    except _Alarm:
        elapsed = time.perf_counter() - t0
        outcome = "timeout"
    except MemoryError:
        elapsed = time.perf_counter() - t0
        outcome = "MemoryError"
    except Exception as exc:  # anything else is a failure to report
        elapsed = time.perf_counter() - t0
        outcome = f"{type(exc).__name__}: {str(exc)[:120]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    cpu = time.process_time() - c0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "seed": seed, "n": len(lens), "dp": dp, "max_tokens": cap,
        "options": {k: (f"<{len(v)} values>" if isinstance(v, list)
                        else "calibrated" if k == "cost" and not isinstance(v, str) else v)
                    for k, v in kw.items()},
        "seconds": elapsed, "cpu_s": cpu, "outcome": outcome, "broken": broken,
        "peak_mb": after / 1024, "raised_peak": after > before,
    }  # fmt: skip


def run_random(args: argparse.Namespace) -> dict[str, Any]:
    cases = 300 if args.quick and args.cases == 10_000 else args.cases
    jobs = [(args.seed + i, args.max_n, args.case_timeout, args.calibrated)
            for i in range(cases)]  # fmt: skip
    ctx = mp.get_context("fork")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    # Fresh workers every 250 cases, so that a case's peak is not hidden behind another's.
    with ctx.Pool(args.workers, _init_worker, (args.memory_limit,), maxtasksperchild=250) as pool:
        for k, row in enumerate(pool.imap_unordered(run_case, jobs, chunksize=4), 1):
            rows.append(row)
            if k % 500 == 0:
                print(f"  {k} cases, {time.perf_counter() - t0:.0f} s", flush=True)
                if args.partial:  # what is done so far, in case the run is cut short
                    Path(args.partial).write_text(json.dumps(rows))
    wall = time.perf_counter() - t0
    rows.sort(key=lambda r: r["seed"])
    by_time = sorted(rows, key=lambda r: -r["seconds"])
    peak = max(rows, key=lambda r: r["peak_mb"] if r["raised_peak"] else 0.0)
    counts: dict[str, int] = {}
    for r in rows:
        key = r["outcome"] if r["outcome"] in ("plan", "ValueError", "timeout",
                                               "MemoryError") else "other error"  # fmt: skip
        counts[key] = counts.get(key, 0) + 1
    broken = [r for r in rows if r["broken"]]
    over_1s = sum(r["seconds"] > 1.0 for r in rows)
    times = np.array([r["seconds"] for r in rows])
    print(f"{cases} cases (n <= {args.max_n}) in {wall:.0f} s on {args.workers} workers: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))  # fmt: skip
    cpu = np.array([r.get("cpu_s", r["seconds"]) for r in rows])
    print(f"time per case: median {np.median(times) * 1e3:.1f} ms, p99 "
          f"{np.quantile(times, 0.99) * 1e3:.0f} ms, max {times.max():.3f} s; "
          f"{over_1s} cases over 1 s (CPU time: max {cpu.max():.3f} s, "
          f"{int((cpu > 1.0).sum())} cases over 1 s)")
    print("slowest cases:")
    for r in by_time[:5]:
        print(f"  {r['seconds']:7.3f} s  seed {r['seed']}  n={r['n']} dp={r['dp']} "
              f"max_tokens={r['max_tokens']} {r['options']} -> {r['outcome']}")
    print(f"peak memory: {peak['peak_mb']:.0f} MB worker RSS (interpreter and numpy included), "
          f"reached by seed {peak['seed']} n={peak['n']} dp={peak['dp']} {peak['options']}")
    print(f"guarantees broken: {len(broken)}"
          + "".join(f"\n  seed {r['seed']}: {r['broken']}" for r in broken[:10]))
    others = [r for r in rows if counts.get("other error") and r["outcome"] not in
              ("plan", "ValueError", "timeout", "MemoryError")]  # fmt: skip
    for r in others[:10]:
        print(f"  other error, seed {r['seed']}: {r['outcome']}")
    return {
        "cases": cases, "max_n": args.max_n, "workers": args.workers, "seed": args.seed,
        "calibrated": args.calibrated,
        "wall_s": wall, "outcomes": counts, "over_1s": int(over_1s),
        "over_1s_cpu": int((cpu > 1.0).sum()), "max_cpu_s": float(cpu.max()),
        "median_s": float(np.median(times)), "p99_s": float(np.quantile(times, 0.99)),
        "slowest": by_time[:20],
        "slowest_cpu": sorted(rows, key=lambda r: -r.get("cpu_s", r["seconds"]))[:20],
        "peak": peak, "broken": broken, "other_errors": others,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300 cases instead of 10,000")
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--max-n", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case-timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--memory-limit", type=float, default=4.0, help="GiB per process")
    ap.add_argument("--reproducers", action="store_true", help="run the reproducers instead")
    ap.add_argument("--calibrated", action="store_true", help="the cases under the H100 fit "
                    "(per-sequence and per-micro-batch terms) where they have no cost array "
                    "and no CP; writes bounds_calibrated.json")  # fmt: skip
    ap.add_argument("--baseline-src", help="with --reproducers: also run each on this source "
                    "tree (e.g. an exported older commit's src/), side by side")  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", default="bench/results/bounds.json")
    ap.add_argument("--partial", help="also write the rows done so far here, every 500")
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.memory_limit)
        return 0
    out: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv)}
    if args.reproducers:
        out.update(run_reproducers(args))
        path = Path(args.json)
        path = path.with_name(path.stem + "_reproducers.json")
    else:
        out.update(run_random(args))
        path = Path(args.json)
        if args.calibrated:
            path = path.with_name(path.stem + "_calibrated.json")
    write_json(str(path), out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
