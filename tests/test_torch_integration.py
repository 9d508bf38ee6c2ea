"""Packaging of the torch extra, and the DDP example end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# torch is not in the test extra (it would pull a multi-GB CUDA build); skip, saying why.
TORCH_MISSING = (
    "needs torch (not in the test extra); a CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"
)

ROOT = Path(__file__).resolve().parents[1]


def test_core_import_does_not_import_torch():
    code = (
        "import sys, seqbalance, seqbalance.workloads, seqbalance.planning.planner\n"
        "assert 'torch' not in sys.modules, 'import seqbalance pulled in torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_torch_gives_a_clear_import_error():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "import seqbalance\n"
        "try:\n"
        "    import seqbalance.torch\n"
        "except ImportError as exc:\n"
        "    assert 'pip install \".[torch]\"' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ddp_example_quick():
    pytest.importorskip("torch", reason=TORCH_MISSING)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "loss check: ok" in lines
    assert re.fullmatch(r"speedup: \d+\.\d\d", lines[-1]), lines[-1]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_ddp_example_adapt_quick(tmp_path, sync):
    """End to end, both sync modes; with "fsdp" DDP syncs after every micro-batch, which
    hangs (and times out) unless every rank gets the same number of micro-batches."""
    pytest.importorskip("torch")
    import json

    from seqbalance.costs import REPORT_METRICS
    from seqbalance.planning.metrics import PLAN_METRICS

    log = tmp_path / "metrics.jsonl"
    (tmp_path / "t.jsonl").write_text("an earlier run's file, replaced\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--adapt", "--quick",
         "--sync", sync, "--log", str(log), "--save-timings", str(tmp_path / "t.jsonl")],
        capture_output=True,
        text=True,
        timeout=230,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "loss check: ok" in lines
    assert re.fullmatch(r"model error: \d+\.\d%", lines[-2]), lines[-2]
    assert re.fullmatch(r"speedup: \d+\.\d\d", lines[-1]), lines[-1]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["phase"] for r in records} == {"learn", "race"}
    for r in records:
        assert set(PLAN_METRICS) | set(REPORT_METRICS) <= set(r)
    # The token plans' timings, saved, load with the run's settings and every micro-batch.
    from seqbalance.costs import TimingRecorder

    saved = TimingRecorder.load(tmp_path / "t.jsonl")
    assert saved.sync == sync and len(saved) > 0
    assert len(saved.steps) == 2  # --quick: 2 race steps, 1 run each, every one streamed
    assert {r.rank for r in saved.records} == {0, 1}
    assert all(r.seconds > 0 and r.lengths.size > 0 for r in saved.records)
