"""Check the re-implemented framework pipelines against the frameworks' own functions.

The frameworks' balancing functions are loaded from an installed copy without importing
their packages (which need torch, ray, numba...): the module source is parsed and only the
needed top-level functions and classes are executed. Nothing of theirs is copied into
seqbalance; this script only compares outputs.

    pip install --no-deps --target /tmp/ext verl==0.9.1 areal==1.0.4
    python bench/pipelines_check.py --site /tmp/ext
"""

from __future__ import annotations

import argparse
import ast
import bisect
import heapq
import json
import math
from pathlib import Path

import numpy as np

from seqbalance import workloads
from seqbalance.planning import _pipelines as ours


def load_functions(path: Path, names: set[str]) -> dict:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    keep = [n for n in tree.body if isinstance(n, kinds) and n.name in names]
    for n in keep:  # drop decorators such as numba.njit
        n.decorator_list = []
    ns: dict = {"np": np, "heapq": heapq, "bisect": bisect, "math": math}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    return ns


def verl_reference(ns, lengths, dp, cap):
    """verl's trainer + rearrange_micro_batches, composed from its own KK (no torch)."""
    work = [24576 * int(x) + int(x) ** 2 for x in lengths]
    toks = [int(x) for x in lengths]
    parts = ns["get_seqlen_balanced_partitions"](work, dp, equal_size=True)
    ranks = []
    for p in parts:
        p = sorted(p, key=lambda i: (work[i], i))
        ranks.append(p[::2] + p[1::2][::-1])
    m = max(min(len(r), math.ceil(sum(toks[i] for i in r) / cap)) for r in ranks)
    while True:
        mbs = [ns["get_seqlen_balanced_partitions"]([work[i] for i in r], m, False) for r in ranks]
        if all(sum(toks[r[j]] for j in mb) <= cap for r, rm in zip(ranks, mbs) for mb in rm):
            break
        m += 1
    out = []
    for r, rm in zip(ranks, mbs):
        rm.sort(key=lambda mb: (sum(work[r[j]] for j in mb), mb[0]), reverse=True)
        rm = rm[::2][::-1] + rm[1::2]
        out.append([[r[j] for j in mb] for mb in rm])
    return out


def areal_reference(ns, lengths, dp, cap):
    toks = [int(x) for x in lengths]
    n = len(toks)
    pad = (-n) % dp
    parts = ns["balanced_greedy_partition"](toks + [0] * pad, dp)
    ranks = [[i for i in p if i < n] for p in parts]
    m = 1
    while True:
        mbs = [ns["ffd_allocate"]([toks[i] for i in r], cap, m) for r in ranks]
        mbs = [sorted(sorted(g) for g in x) for x in mbs]
        c = [len(x) for x in mbs]
        if len(set(c)) == 1:
            break
        m = max(c)
    return [[[r[j] for j in g] for g in rm] for r, rm in zip(ranks, mbs)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--site",
        default="/work/ext8",
        help="folder of `pip install --no-deps --target DIR verl==0.9.1 areal==1.0.4`",
    )
    ap.add_argument("--json", default="bench/results/pipelines_check.json")
    args = ap.parse_args()
    site = Path(args.site)
    verl_ns = load_functions(
        site / "verl/utils/seqlen_balancing.py",
        {"karmarkar_karp", "get_seqlen_balanced_partitions"},
    )
    areal_ns = load_functions(
        site / "areal/utils/seqpack.py",
        {"_ffd_allocate", "ffd_allocate", "balanced_greedy_partition"},
    )
    rows = []
    rng = np.random.default_rng(0)
    cases = []
    for name in workloads.NAMES:
        for dp, per_rank, cap in ((4, 16, 32768), (8, 64, 32768), (16, 32, 65536)):
            lens = workloads.lengths(name, dp * per_rank, seed=1)
            if lens.max() <= cap:
                cases.append((name, lens, dp, cap))
    for t in range(30):  # verl-test-shaped batches
        lens = rng.integers(50, 91, size=int(rng.integers(20, 26)) * 2)
        cases.append((f"verl-shape-{t}", lens, 2, 300))
    for name, lens, dp, cap in cases:
        kk_ok = all(
            ours.kk_partition(v, k, eq) == verl_ns["get_seqlen_balanced_partitions"](v, k, eq)
            for v, k, eq in (
                (lens.tolist(), dp, True),
                (ours.verl_workload(lens), 3, False),
                (lens.tolist(), max(2, len(lens) // 5), False),
            )
        )
        ffd_ok = ours.areal_ffd(lens.tolist(), cap, 2) == sorted(
            sorted(g) for g in areal_ns["ffd_allocate"](lens.tolist(), cap, 2)
        )
        verl_ok = ours.verl_pipeline(lens, dp, cap) == verl_reference(verl_ns, lens, dp, cap)
        areal_ok = ours.areal_pipeline(lens, dp, cap) == areal_reference(areal_ns, lens, dp, cap)
        rows.append({"case": name, "n": int(lens.size), "dp": dp, "kk": kk_ok, "ffd": ffd_ok,
                     "verl_pipeline": verl_ok, "areal_pipeline": areal_ok})
        print(f"{name:14} n={lens.size:5} dp={dp:3}  kk {kk_ok}  areal-ffd {ffd_ok}  "
              f"verl {verl_ok}  areal {areal_ok}", flush=True)
    ok = {k: all(r[k] for r in rows) for k in ("kk", "ffd", "verl_pipeline", "areal_pipeline")}
    print("all identical:", ok)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "identical": ok}, indent=1))
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
