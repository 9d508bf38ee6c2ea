"""What the SEQBALANCE_PATCH switch costs a process that does not use it, and one that does.

    python bench/switch_cost.py [--runs 15]

Rows (best of ``--runs`` fresh interpreters each, ``python -X importtime``; the .pth line
timed in-process with ``timeit``, as ``site`` runs it: ``exec`` of the line's text):

- the ``seqbalance_switch.pth`` line with the variable unset: what every interpreter start
  in the environment pays (it imports nothing then);
- ``import _seqbalance_switch`` with the variable unset: what ``import verl`` pays for the
  ``verl.plugins`` entry point (verl 0.9.0 on loads every plugin);
- the same with ``SEQBALANCE_PATCH=verl`` and no verl imported: the start-up cost of the
  switch when on (it registers an import hook; seqbalance loads only with verl's module);
- ``import seqbalance``: what the switch would cost if it imported the package.

Writes bench/results/switch_cost.json.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, machine_info, print_table, write_json

SRC = ROOT / "src"


def importtime_us(module: str, env_value: str | None, runs: int) -> int:
    """Best cumulative import time of ``module`` in microseconds, over ``runs`` processes."""
    # Bytecode as an installed package has it (pip compiles on install): written once by a
    # first run here, then read.
    drop = ("SEQBALANCE_PATCH", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    if env_value is not None:
        env["SEQBALANCE_PATCH"] = env_value
    best = None
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
        for line in r.stderr.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)$", line)
            if m and m.group(3) == module and not m.group(2):  # the top-level import
                us = int(m.group(1))
                best = us if best is None else min(best, us)
    assert best is not None, module
    return best


def pth_line_us(runs: int) -> float:
    line = (SRC / "seqbalance_switch.pth").read_text().strip()
    saved = os.environ.pop("SEQBALANCE_PATCH", None)
    try:
        number = 20000
        return min(timeit.repeat(lambda: exec(line, {}), number=number, repeat=runs)) / number * 1e6
    finally:
        if saved is not None:
            os.environ["SEQBALANCE_PATCH"] = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", default="bench/results/switch_cost.json")
    args = ap.parse_args()
    rows = [
        {"what": "seqbalance_switch.pth line, SEQBALANCE_PATCH unset",
         "us": pth_line_us(args.runs)},
        {"what": "import _seqbalance_switch, unset (verl plugin)",
         "us": importtime_us("_seqbalance_switch", None, args.runs)},
        {"what": "import _seqbalance_switch, SEQBALANCE_PATCH=verl",
         "us": importtime_us("_seqbalance_switch", "verl", args.runs)},
        {"what": "import seqbalance (for comparison)",
         "us": importtime_us("seqbalance", None, max(3, args.runs // 5))},
    ]  # fmt: skip
    for r in rows:
        r["ms"] = r["us"] / 1000
    print_table(rows, ["what", "ms"])
    write_json(args.json, {"machine": machine_info(), "runs": args.runs, "rows": rows})


if __name__ == "__main__":
    main()
