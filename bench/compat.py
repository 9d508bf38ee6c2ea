"""The compat drop-ins against the frameworks' published code on their typical calls.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    python bench/compat.py --ext /work/ext9 [--quick]

verl and AReaL are imported from ``--ext`` without their heavy dependencies: the modules
they import only for other features (ray, omegaconf, numba, ...) are replaced by stubs in
this script (numba.njit becomes the identity). Calls measured, per standard workload:

- verl ``_balance_batch``: ``get_seqlen_balanced_partitions(calculate_workload(L), dp,
  equal_size=True)``; the heaviest rank's workload.
- verl dynamic micro-batching (the loop inside ``rearrange_micro_batches``): micro-batches
  of one rank's ``n / dp`` sequences under ``max_token_len``; heaviest micro-batch workload,
  count, micro-batches over the cap.
- AReaL ``ffd_allocate`` / ``kk_allocate`` of one rank's sequences under
  ``max_tokens_per_mb``; heaviest micro-batch tokens, count, over-cap.

Prints a table and writes JSON to bench/results/compat.json. The machine may be loaded:
times are the best of a few runs, and the ratio is what to read.
"""
# ruff: noqa: B023  (each lambda is called inside the loop iteration that made it)

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import best_time, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.compat import areal as c_areal
from seqbalance.compat import verl as c_verl


def _stub(name: str, **attrs: object) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules.setdefault(name, mod)


def load_originals(ext: str) -> tuple[object, object]:
    """verl.utils.seqlen_balancing and areal.utils.seqpack, with stubs for heavy imports."""
    sys.path.insert(0, ext)
    for pkg in ("verl", "verl.utils", "areal", "areal.utils"):  # skip package __init__s
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(ext, *pkg.split(".")))]
        sys.modules[pkg] = mod
    _stub("verl.protocol", DataProto=object)
    _stub("verl.utils.tensordict_utils")
    _stub("verl.utils.device", get_device_name=lambda: "cpu")
    _stub("numba", njit=lambda f=None, **k: f if f else (lambda g: g))
    import logging

    _stub("areal.utils.logging", getLogger=logging.getLogger)
    import importlib

    return (
        importlib.import_module("verl.utils.seqlen_balancing"),
        importlib.import_module("areal.utils.seqpack"),
    )


def verl_dynamic(orig, lens: list[int], cap: int) -> list[list[int]]:
    """The micro-batching loop of verl 0.9 rearrange_micro_batches, one rank, no dp_group."""
    work = [24576 * x + x * x for x in lens]
    m = min(len(lens), -(-sum(lens) // cap))
    while True:
        parts = orig.get_seqlen_balanced_partitions(work, m, equal_size=False)
        if all(sum(lens[i] for i in p) <= cap for p in parts):
            return parts
        m += 1


def row(call, wl, n, dp, cap, orig_fn, ours_fn, lens, weight, repeat):
    t_o, p_o = best_time(orig_fn, repeat=repeat, budget_s=60)
    t_s, p_s = best_time(ours_fn, repeat=repeat, budget_s=60)

    def heavy(parts):
        return max(float(weight[np.asarray(p, dtype=np.int64)].sum()) for p in parts)

    def over(parts):
        if not cap:
            return 0
        return sum(int(lens[np.asarray(p, dtype=np.int64)].sum()) > cap for p in parts)

    return {
        "call": call, "workload": wl, "n": n, "dp": dp,
        "parts_orig": len(p_o), "parts_sb": len(p_s),
        "heaviest_orig": heavy(p_o), "heaviest_sb": heavy(p_s),
        "sb/orig": heavy(p_s) / heavy(p_o),
        "over_cap_orig": over(p_o), "over_cap_sb": over(p_s),
        "t_orig_s": t_o, "t_sb_s": t_s, "speedup": t_o / t_s,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", default="/work/ext9")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench/results/compat.json")
    args = ap.parse_args()
    v_orig, a_orig = load_originals(args.ext)
    sizes = [1024] if args.quick else [1024, 8192]
    dp, cap = 8, 32768
    repeat = 1 if args.quick else 2
    rows = []
    for wl in ("rl-math", "sft-chat", "long-mix"):
        for n in sizes:
            lens = sb.workloads.lengths(wl, n, seed=0)
            lens = np.minimum(lens, cap)  # both sides reject sequences above the cap
            work = (24576 * lens + lens.astype(np.int64) ** 2).astype(np.float64)
            wl_list = work.astype(np.int64).tolist()
            rows.append(row(
                "verl balance_batch", wl, n, dp, 0,
                lambda: v_orig.get_seqlen_balanced_partitions(wl_list, dp, equal_size=True),
                lambda: c_verl.get_seqlen_balanced_partitions(work, dp, True),
                lens, work, repeat,
            ))  # fmt: skip
            rank = lens[: n // dp].astype(np.int64)
            rank_list = rank.tolist()
            rank_work = work[: n // dp]
            rows.append(row(
                "verl dynamic mbs", wl, n // dp, 1, cap,
                lambda: verl_dynamic(v_orig, rank_list, cap),
                lambda: c_verl.micro_batches_of_lengths(rank, cap),
                rank, rank_work, repeat,
            ))  # fmt: skip
            for name in ("ffd_allocate", "kk_allocate"):
                rows.append(row(
                    f"areal {name}", wl, n // dp, 1, cap,
                    lambda name=name: getattr(a_orig, name)(rank_list, cap, 1),
                    lambda name=name: getattr(c_areal, name)(rank, cap, 1),
                    rank, rank.astype(np.float64), repeat,
                ))  # fmt: skip
            print_table(rows[-4:], list(rows[-1].keys()))
    print_table(rows, list(rows[0].keys()))
    write_json(args.json, {"machine": machine_info(), "rows": rows})


if __name__ == "__main__":
    main()
