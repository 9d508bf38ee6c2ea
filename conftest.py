"""pytest setup shared by ``tests/`` and the doctests under ``src/seqbalance``.

torch is optional (the ``test`` extra does not install it, so that the test command never
downloads a multi-GB CUDA build or replaces a torch the user already has). Without it:

- the doctests of ``seqbalance.torch`` are not collected (importing that package says
  "needs PyTorch"), and
- every test module that needs torch skips with a reason that says so;

the header of the run says which case applies, and ``-ra`` lists each skip with its reason.

Two tiers. The default run (``python -m pytest``) is the fast one: tests marked ``slow``
(the long property and multi-process suites) are left out by ``-m 'not slow'`` in the
pytest options, and every hypothesis test runs a shorter search, 1/``FAST_DIVISOR`` of
its ``max_examples``. ``python -m pytest -m slow`` runs the rest: the tests marked
``slow`` and every hypothesis test again, at its full ``max_examples``. CI runs both.

Both tiers are deterministic: hypothesis runs under the ``seqbalance`` profile
(``derandomize=True``: each test's examples come from a seed that is a hash of the test;
no deadline: a test is never failed for its time, which depends on the machine's load),
so with one hypothesis version a run fails or passes the same way on every machine and
every run. ``--hypothesis-factor K`` (K >= 2) searches at random, with K times the
examples: the search for counterexamples that a fixed seed cannot give. A failure it finds
is saved to the example database (``.hypothesis/``, replayed by the next run) and printed
with its ``@reproduce_failure`` line. ``--hypothesis-profile default`` also restores the
random search (``--hypothesis-seed`` takes effect only then).
"""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import settings

# Loaded before the test modules are imported: their @settings take what they leave unset
# from it (--hypothesis-profile, read later, still overrides it).
settings.register_profile("seqbalance", derandomize=True, deadline=None)
settings.load_profile("seqbalance")

TORCH_HINT = (
    "torch is not installed; install a CPU build with "
    "`pip install torch --index-url https://download.pytorch.org/whl/cpu` to run these tests"
)

_HAS_TORCH = importlib.util.find_spec("torch") is not None

# The fast tier's hypothesis tests search 1/FAST_DIVISOR of their examples (at least
# FAST_MIN_EXAMPLES); the slow tier repeats them at full strength.
FAST_DIVISOR = 10
FAST_MIN_EXAMPLES = 5
FAST_TIER = "not slow"
SLOW_TIER = "slow"

# Paths relative to this file: the torch integration's modules import torch at import time.
collect_ignore_glob = [] if _HAS_TORCH else ["src/seqbalance/torch/*.py"]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [_torch_header(), *_tier_header(config)]


def _torch_header() -> str:
    if not _HAS_TORCH:
        return f"seqbalance: {TORCH_HINT} (tests and doctests of seqbalance.torch are skipped)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torch")
    except PackageNotFoundError:  # importable but not installed as a distribution
        found = "(version unknown)"
    return f"seqbalance: torch {found} found; the torch tests run"


def _tier_header(config: pytest.Config) -> list[str]:
    tier = (config.getoption("markexpr") or "").strip()
    if tier == FAST_TIER:
        return [
            f"seqbalance: the fast tier (tests marked slow left out, hypothesis tests at "
            f"1/{FAST_DIVISOR} of their examples); `python -m pytest -m slow` runs the rest"
        ]
    if tier == SLOW_TIER:
        return ["seqbalance: the slow tier (the tests marked slow, and every hypothesis "
                "test at its full max_examples)"]  # fmt: skip
    return []


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--hypothesis-factor",
        type=int,
        default=1,
        help="run every hypothesis test with this many times its max_examples (a longer "
        "search for counterexamples than the slow tier's full strength)",
    )


def _hypothesis_function(item: pytest.Item) -> object | None:
    """The function hypothesis reads its settings from, or None for other tests."""
    fn = getattr(item, "obj", None)
    fn = getattr(fn, "__func__", fn)
    return fn if getattr(fn, "hypothesis", None) is not None else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the slow tier adds a marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = (config.getoption("markexpr") or "").strip()
    factor = config.getoption("--hypothesis-factor")
    from hypothesis import HealthCheck

    done: set[int] = set()
    for item in items:
        fn = _hypothesis_function(item)
        if fn is None:
            continue
        if tier == SLOW_TIER:
            item.add_marker(pytest.mark.slow)  # the full search of a fast-tier test
        if id(fn) in done:
            continue
        done.add(id(fn))
        # hypothesis reads the settings from the collected (outer) function at run time.
        current = getattr(fn, "_hypothesis_internal_use_settings", None) or settings.default
        if factor > 1:
            fn._hypothesis_internal_use_settings = settings(
                current, max_examples=current.max_examples * factor, deadline=None,
                suppress_health_check=list(HealthCheck), derandomize=False,
                # (derandomize turned the database off): failures are saved and printed
                database=settings.get_profile("default").database, print_blob=True,
            )  # fmt: skip
        elif tier == FAST_TIER:
            fewer = max(FAST_MIN_EXAMPLES, current.max_examples // FAST_DIVISOR)
            fn._hypothesis_internal_use_settings = settings(
                current, max_examples=min(current.max_examples, fewer)
            )
