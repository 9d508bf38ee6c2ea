"""Helpers shared by the bench scripts: machine info, git revision, timing, tables, JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["best_time", "git_rev", "machine_info", "print_table", "write_json"]

ROOT = Path(__file__).resolve().parent.parent


def git_rev() -> str:
    """The checked-out commit, with ``-dirty`` when tracked files differ from it."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, OS, Python, numpy, git revision."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "git_rev": git_rev(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def best_time(
    fn: Callable[[], Any], repeat: int = 3, budget_s: float = 5.0, fast_repeat: int = 0
) -> tuple[float, Any]:
    """Best wall time (seconds, ``time.perf_counter``) of ``repeat`` calls, and the last result.

    Stops repeating once the calls so far took ``budget_s`` in total (slow baselines).
    ``fast_repeat``: calls under a second are repeated up to this many times instead (on a
    shared machine one noisy moment can double a 0.2 s call; more tries find its floor).
    """
    best, spent, out = float("inf"), 0.0, None
    done = 0
    while done < max(1, repeat) or (best < 1.0 and done < fast_repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best, spent, done = min(best, dt), spent + dt, done + 1
        if spent >= budget_s:
            break
    return best, out


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` (dicts) as an aligned plain-text table of ``columns``."""
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(wd) for c, wd in zip(columns, widths)))
    print("  ".join("-" * wd for wd in widths))
    for row in cells:
        print("  ".join(v.rjust(wd) if _numeric(v) else v.ljust(wd) for v, wd in zip(row, widths)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def _numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (numpy scalars/arrays converted), creating folders."""
    p = Path(path)
    if not p.is_absolute():
        p = ROOT / p
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return p


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")
