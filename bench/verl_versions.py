"""verl's dynamic micro-batching in two versions, against the drop-in's counts for each.

    pip install --no-deps --target /work/ext verl==0.9.1
    # verl main: a source tree (git archive of a snapshot), e.g. /work/verl_main
    python bench/verl_versions.py --verl 0.9.1=/work/ext --verl main=/work/verl_main

Each ``--verl LABEL=ROOT`` loads ``ROOT/verl/utils/seqlen_balancing.py`` (verl's package
``__init__`` files are skipped; ``verl.protocol``, ``verl.utils.device`` and
``verl.utils.tensordict_utils`` are stubbed: the functions called here use none of them
but ``tu.index_select_tensor_dict``, which returns the rows). On the README demo's four
workloads (``seqbalance compare --demo``: rl-math 1,024 sequences over dp 8, sft-chat 4,096
over 16, bimodal 2,048 over 8, long-mix 16,384 over 16; caps 32,768 and 131,072), as verl
runs them: ranks from the version's own ``get_seqlen_balanced_partitions`` of
``calculate_workload`` (equal counts, as ``_balance_batch``), then on each rank, alone (no
process group: no count agreement), the version's own ``rearrange_micro_batches``. Against
them: the drop-in's ``micro_batches_of_lengths`` on the same ranks, by default and with
``match_framework_count`` set to each version (its label, or its version file).

Per row: micro-batches summed over ranks, how many are over the cap, the largest one in
tokens, and whether the drop-in's count equals the version's on every rank. Writes
bench/results/verl_versions.json; tests/test_compat_switch.py holds its figures as the
expectations CI checks (with verl's splits reproduced, as CI has no verl).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, print_table, write_json

import seqbalance.workloads as workloads
from seqbalance.compat import verl as c_verl

#: The demo's setups (seqbalance.cli.commands.DEMO_SETUPS): workload, n, dp, cap.
SETUPS = (("rl-math", 1024, 8, 32768), ("sft-chat", 4096, 16, 32768),
          ("bimodal", 2048, 8, 32768), ("long-mix", 16384, 16, 131072))  # fmt: skip

COLUMNS = ["workload", "n", "dp", "cap", "code", "micro-batches", "over cap", "largest",
           "per-rank counts", "same counts as"]  # fmt: skip


class _Nested:
    """What ``rearrange_micro_batches`` reads of a jagged ``input_ids``: its offsets."""

    is_nested = True

    def __init__(self, lengths: np.ndarray) -> None:
        import torch

        self._offsets = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]))

    def offsets(self) -> object:
        return self._offsets


def load_verl(label: str, root: str) -> types.ModuleType:
    """``ROOT/verl/utils/seqlen_balancing.py`` as module ``verl_<label>``, with stubs."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "verl"}
    try:
        for pkg in ("verl", "verl.utils"):
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(Path(root, *pkg.split(".")))]
            sys.modules[pkg] = mod
        stubs = {
            "verl.protocol": {"DataProto": object},
            "verl.utils.device": {"get_device_name": lambda: "cpu"},
            "verl.utils.tensordict_utils": {"index_select_tensor_dict": lambda b, idx: idx},
        }
        for name, attrs in stubs.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
        sys.modules["verl.utils"].tensordict_utils = sys.modules["verl.utils.tensordict_utils"]
        path = Path(root, "verl", "utils", "seqlen_balancing.py")
        spec = importlib.util.spec_from_file_location(f"verl_{label}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        version_file = Path(root, "verl", "version", "version")
        module.VERSION = version_file.read_text().strip() if version_file.is_file() else label
        return module
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] == "verl"]:
            del sys.modules[k]
        sys.modules.update(saved)


def verl_ranks(orig: types.ModuleType, lens: np.ndarray, dp: int) -> list[list[int]]:
    """verl's driver split (``_balance_batch``): equal-count KK of the workloads."""
    import torch

    work = orig.calculate_workload(torch.as_tensor(lens))
    return orig.get_seqlen_balanced_partitions(work.tolist(), dp, equal_size=True)


def summarise(parts_per_rank: list[list[list[int]]], lens: np.ndarray, cap: int) -> dict:
    tokens = [int(lens[p].sum()) for parts in parts_per_rank for p in parts]
    return {
        "counts": [len(parts) for parts in parts_per_rank],
        "micro_batches": len(tokens),
        "over_cap": sum(t > cap for t in tokens),
        "largest": max(tokens),
    }


def run(versions: dict[str, types.ModuleType]) -> list[dict]:
    rows = []
    for name, n, dp, cap in SETUPS:
        lens = workloads.lengths(name, n)
        # verl's driver split is the same code in every version loaded: take the first's.
        first = next(iter(versions.values()))
        ranks = [np.asarray(sorted(r)) for r in verl_ranks(first, lens, dp)]
        for label, orig in versions.items():
            assert verl_ranks(orig, lens, dp) == [list(r) for r in ranks], label
        base = {"workload": name, "n": n, "dp": dp, "cap": cap}
        ref = {}
        for label, orig in versions.items():
            parts = [orig.rearrange_micro_batches({"input_ids": _Nested(lens[r])}, cap)[1]
                     for r in ranks]  # fmt: skip
            parts = [[[int(r[i]) for i in p] for p in ps] for r, ps in zip(ranks, parts)]
            ref[label] = summarise(parts, lens, cap)
            rows.append({**base, "code": f"verl {label} ({orig.VERSION})", **ref[label]})
        for match in [False, *[orig.VERSION for orig in versions.values()]]:
            parts = [[[int(r[i]) for i in p] for p in c_verl.micro_batches_of_lengths(
                lens[r], cap, match_framework_count=match)] for r in ranks]  # fmt: skip
            s = summarise(parts, lens, cap)
            same = [lab for lab, o in versions.items() if ref[lab]["counts"] == s["counts"]]
            code = f"drop-in, match_framework_count={match!r}"
            rows.append({**base, "code": code, **s, "same counts as": same})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verl", action="append", required=True, metavar="LABEL=ROOT",
                    help="a verl tree to compare (repeat): e.g. 0.9.1=/work/ext")  # fmt: skip
    ap.add_argument("--json", default="bench/results/verl_versions.json")
    args = ap.parse_args()
    versions = {}
    for item in args.verl:
        label, _, root = item.partition("=")
        versions[label] = load_verl(label.replace(".", "_"), root)
        versions[label].VERSION = versions[label].VERSION
    rows = run(versions)
    table = [{**r, "micro-batches": r["micro_batches"], "over cap": r["over_cap"],
              "per-rank counts": " ".join(map(str, r["counts"])),
              "same counts as": ", ".join(r.get("same counts as", []))} for r in rows]  # fmt: skip
    print_table(table, COLUMNS)
    write_json(args.json, {"machine": machine_info(), "command": " ".join(sys.argv),
                           "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
