"""pytest setup shared by ``tests/`` and the doctests under ``src/seqbalance``.

torch is optional (the ``test`` extra does not install it, so that the test command never
downloads a multi-GB CUDA build or replaces a torch the user already has). Without it:

- the doctests of ``seqbalance.torch`` are not collected (importing that package says
  "needs PyTorch"), and
- every test module that needs torch skips with a reason that says so;

the header of the run says which case applies, and ``-ra`` lists each skip with its reason.
"""

from __future__ import annotations

import importlib.util

TORCH_HINT = (
    "torch is not installed; install a CPU build with "
    "`pip install torch --index-url https://download.pytorch.org/whl/cpu` to run these tests"
)

_HAS_TORCH = importlib.util.find_spec("torch") is not None

# Paths relative to this file: the torch integration's modules import torch at import time.
collect_ignore_glob = [] if _HAS_TORCH else ["src/seqbalance/torch/*.py"]


def pytest_report_header(config: object) -> str:
    if not _HAS_TORCH:
        return f"seqbalance: {TORCH_HINT} (tests and doctests of seqbalance.torch are skipped)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torch")
    except PackageNotFoundError:  # importable but not installed as a distribution
        found = "(version unknown)"
    return f"seqbalance: torch {found} found; the torch tests run"
