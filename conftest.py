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


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--hypothesis-factor",
        type=int,
        default=1,
        help="run every hypothesis test with this many times its max_examples (a longer "
        "search for counterexamples than the default run; e.g. 10 takes ~15 min here)",
    )


def pytest_collection_modifyitems(config, items) -> None:
    factor = config.getoption("--hypothesis-factor")
    if factor <= 1:
        return
    from hypothesis import HealthCheck, settings

    done: set[int] = set()
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if getattr(fn, "hypothesis", None) is None or id(fn) in done:
            continue
        done.add(id(fn))
        # hypothesis reads the settings from the collected (outer) function at run time.
        current = getattr(fn, "_hypothesis_internal_use_settings", None) or settings.default
        fn._hypothesis_internal_use_settings = settings(
            current, max_examples=current.max_examples * factor, deadline=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
