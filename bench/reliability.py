"""Reliability figures: bad inputs refused fast, distributed mistakes raised on every rank.

1. A list of bad inputs (absurd sizes, overflowing sums, inputs users pass
   from pandas or torch...): the outcome (a ValueError/TypeError naming the argument, or a
   result where the input is acceptable) and the time it took (limit of interest: 1 s).
2. Every multi-process scenario of ``tests/test_torch_agreement.py`` on gloo at world sizes
   2, 3 and 4: the outcome on every rank (must be the same ValueError, or a result) and the
   slowest rank's time (limit of interest: 30 s; the process group's timeout is 20 s, so a
   hang would show up as a gloo error).

    python bench/reliability.py            # both parts
    python bench/reliability.py --quick    # world size 2 only

Prints tables and writes JSON to bench/results/reliability.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_rev, machine_info, print_table, write_json

import seqbalance as sb


def bad_inputs() -> list[tuple[str, Callable[[], Any], str | None]]:
    """(name, call, argument the error must name; None where a result is right)."""
    cases: list[tuple[str, Callable[[], Any], str | None]] = [
        ("partition k=10**9", lambda: sb.partition([1, 2], 10**9), "k"),
        ("partition k=2**62", lambda: sb.partition([1, 2], 2**62), "k"),
        ("partition k=2**70", lambda: sb.partition([1, 2], 2**70), "k"),
        ("partition k=10**6, n=2 (empty parts)", lambda: sb.partition([1, 2], 10**6), None),
        ("lower_bound k=2**70", lambda: sb.lower_bound([1, 2], 2**70), "k"),
        ("plan max_tokens=2**63", lambda: sb.plan([1, 2], 1, 2**63), "max_tokens"),
        ("plan max_tokens=2**70", lambda: sb.plan([1, 2], 1, 2**70), "max_tokens"),
        (
            "plan dp_size=10**9, allow_empty",
            lambda: sb.plan([1, 2], 10**9, 10, allow_empty=True),
            "dp_size",
        ),
        (
            "plan micro_batch_multiple=10**9, allow_empty",
            lambda: sb.plan([1, 2], 1, 10, micro_batch_multiple=10**9, allow_empty=True),
            "micro_batch_multiple",
        ),
        (
            "plan min_micro_batches=10**7",
            lambda: sb.plan([1, 2], 1, 10, min_micro_batches=10**7),
            "min_micro_batches",
        ),
        (
            "plan min_micro_batches=10**7, allow_empty",
            lambda: sb.plan([1, 2], 1, 10, min_micro_batches=10**7, allow_empty=True),
            "min_micro_batches",
        ),
        (
            "plan extra_micro_batches=2 (m=1 fits)",
            lambda: sb.plan([1, 1], dp_size=1, max_tokens=10, extra_micro_batches=2),
            None,
        ),
        ("partition([1e308, 1e308], 2)", lambda: sb.partition([1e308, 1e308], 2), "weights"),
        (
            "plan cost=[1e308, 1e308]",
            lambda: sb.plan([1, 1], 1, 10, cost=[1e308, 1e308]),
            "cost",
        ),
        ('plan cost=""', lambda: sb.plan([1, 1], 1, 10, cost=""), "cost"),
        ('Plan.from_json("[1,2]")', lambda: sb.Plan.from_json("[1,2]"), "plan JSON"),
        ("plan lengths=[2**63, 1]", lambda: sb.plan([2**63, 1], 1, 10), "lengths"),
        ("plan lengths=[2**64, 1]", lambda: sb.plan([2**64, 1], 1, 10), "lengths"),
        ("partition weights=[2**70, 1]", lambda: sb.partition([2**70, 1], 2), None),
        ("partition([0.1, 0.2, 0.3], 1).gap == 0", lambda: _exact_gap(), None),
    ]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        cases += [
            (
                "plan cost=torch tensor",
                lambda: sb.plan([1, 2], 1, 10, cost=torch.tensor([1.0, 2.0])),
                None,
            ),
            (
                "plan cost=tensor(requires_grad)",
                lambda: sb.plan([1, 2], 1, 10, cost=torch.tensor([1.0, 2.0], requires_grad=True)),
                None,
            ),
            (
                "plan lengths=bf16 tensor",
                lambda: sb.plan(torch.tensor([1, 2], dtype=torch.bfloat16), 1, 10),
                None,
            ),
            (
                "partition weights=tensor(requires_grad)",
                lambda: sb.partition(torch.tensor([1.0, 2.0], requires_grad=True), 2),
                None,
            ),
        ]
    try:
        import pandas as pd
    except ImportError:
        pd = None
    if pd is not None:
        cases += [
            (
                "partition groups=Series of str",
                lambda: sb.partition([1, 2, 3], 2, groups=pd.Series(["a", "b", "a"])),
                None,
            ),
            (
                "partition groups=categorical",
                lambda: sb.partition(
                    [1, 2, 3], 2, groups=pd.Series(["a", "b", "a"], dtype="category")
                ),
                None,
            ),
            (
                "plan cost=Series",
                lambda: sb.plan([1, 2], 1, 10, cost=pd.Series([1.0, 2.0])),
                None,
            ),
        ]
    return cases


def at_the_limits() -> list[tuple[str, Callable[[], Any]]]:
    """The largest sizes still accepted (n + 2**20 parts, n + 2**16 micro-batch slots)."""
    return [
        ("partition k = n + 2**20, n=2", lambda: sb.partition([1, 2], 2 + 2**20)),
        ("plan dp_size = n + 2**16, allow_empty", lambda: sb.plan([1, 2], 2 + 2**16, 10,
                                                                   allow_empty=True)),
        (
            "plan min_micro_batches = n + 2**16, allow_empty",
            lambda: sb.plan([1, 2], 1, 10, min_micro_batches=2 + 2**16, allow_empty=True),
        ),
    ]


def run_limits() -> list[dict[str, Any]]:
    rows = []
    for name, fn in at_the_limits():
        t = time.perf_counter()
        fn()
        rows.append({"input": name, "seconds": time.perf_counter() - t})
    return rows


def _exact_gap() -> float:
    gap = sb.partition([0.1, 0.2, 0.3], 1).gap
    if gap != 0.0:
        raise AssertionError(f"gap {gap}")
    return gap


def run_bad_inputs() -> list[dict[str, Any]]:
    rows = []
    for name, fn, arg in bad_inputs():
        t = time.perf_counter()
        try:
            fn()
            outcome, ok = "result", arg is None
        except (ValueError, TypeError) as exc:
            outcome = f"{type(exc).__name__}: {str(exc)[:70]}"
            ok = arg is not None and arg in str(exc)
        except Exception as exc:
            outcome, ok = f"{type(exc).__name__}: {str(exc)[:70]}", False
        seconds = time.perf_counter() - t
        rows.append(
            {"input": name, "seconds": seconds, "ok": ok and seconds < 1.0, "outcome": outcome}
        )
    return rows


def run_distributed_scenarios(worlds: list[int]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import test_torch_agreement as t

    from seqbalance.torch.testing import run_distributed

    rows = []
    for world in worlds:
        start = time.perf_counter()
        results = run_distributed(
            t.worker, world, timeout=t.TIMEOUT - 20, collective_timeout=t.COLLECTIVE_TIMEOUT
        )
        wall = time.perf_counter() - start
        for i in range(len(results[0])):
            per_rank = [results[r][i] for r in range(world)]
            kinds = sorted({p[1] for p in per_rank})
            same = len({(p[1], p[2]) for p in per_rank}) == 1
            rows.append(
                {
                    "world": world,
                    "scenario": per_rank[0][0],
                    "outcome": "/".join(kinds) + (" (same on all ranks)" if same else ""),
                    "max_seconds": max(p[3] for p in per_rank),
                    "ok": (same or kinds == ["ok"])
                    and all(k in ("ValueError", "RankAgreementError", "ok") for k in kinds),
                }
            )
        print(f"world {world}: {len(results[0])} scenarios in one spawn, {wall:.1f} s wall")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="world size 2 only")
    ap.add_argument("--no-distributed", action="store_true", help="bad inputs only")
    args = ap.parse_args()

    bad = run_bad_inputs()
    print_table(bad, ["input", "seconds", "ok", "outcome"])
    limits = run_limits()
    print("largest accepted sizes (results, not refusals):")
    print_table(limits, ["input", "seconds"])
    dist_rows: list[dict[str, Any]] = []
    if not args.no_distributed:
        dist_rows = run_distributed_scenarios([2] if args.quick else [2, 3, 4])
        print_table(dist_rows, ["world", "scenario", "max_seconds", "ok", "outcome"])
    ok = all(r["ok"] for r in bad + dist_rows)
    print(f"all ok: {ok}; slowest bad input {max(r['seconds'] for r in bad):.3f} s", end="")
    if dist_rows:
        print(f"; slowest distributed scenario {max(r['max_seconds'] for r in dist_rows):.2f} s")
    else:
        print()
    path = write_json(
        "bench/results/reliability.json",
        {
            "machine": machine_info(),
            "git": git_rev(),
            "bad_inputs": bad,
            "at_the_limits": limits,
            "distributed": dist_rows,
            "all_ok": bool(ok),
            "max_bad_input_seconds": float(np.max([r["seconds"] for r in bad])),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
