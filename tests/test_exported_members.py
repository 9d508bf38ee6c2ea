"""The documented public API: each public package's ``__all__`` is exactly what it defines.

For every public package, the names in ``__all__`` equal the public attributes the package
defines (no helper imported by accident, nothing exported that is not there) and equal the
list pinned here, so that a name is added to or removed from the API only on purpose.
Submodules are not attributes a package defines (Python sets them on import); the ones
named in ``__all__`` must exist.
"""

from __future__ import annotations
import __future__

import importlib
import importlib.util
import pkgutil
import re
import types

import pytest

import seqbalance

EXPORTED = {
    "seqbalance": [
        "BASELINES",
        "SHIPPED",
        "ArgumentError",
        "Capacity",
        "CostModel",
        "FitReport",
        "FlopsCost",
        "Mesh",
        "MicroBatching",
        "Note",
        "Partition",
        "Plan",
        "PlanSpec",
        "QuadraticCost",
        "RankRules",
        "Simulation",
        "StreamingPlanner",
        "StreamingRule",
        "TimingRecorder",
        "TokenCost",
        "__version__",
        "balance_stats",
        "contiguous_partition",
        "exact_searches",
        "exact_searches_enabled",
        "fit_cost",
        "inverse_permutation",
        "load_cost",
        "lower_bound",
        "partition",
        "pipeline_lower_bound",
        "plan",
        "simulate",
        "simulate_pipeline",
        "step_time_lower_bound",
        "workloads",
    ],
    "seqbalance.costs": [
        "REPORT_METRICS",
        "SHIPPED",
        "Architecture",
        "BalanceReport",
        "ContextParallelCost",
        "CostModel",
        "FitReport",
        "FlopsCost",
        "PoorlyDeterminedCostWarning",
        "QuadraticCost",
        "ResumedStepsWarning",
        "Timing",
        "TimingFileError",
        "TimingRecorder",
        "TokenCost",
        "UlyssesCost",
        "UnidentifiableCostWarning",
        "ZeroLengthWarning",
        "cost_from_dict",
        "evaluate_cost",
        "fit_cost",
        "load_cost",
        "parse_config",
        "ulysses_bytes_per_token",
        "ulysses_sp_size",
    ],
    "seqbalance.partitioning": [
        "Partition",
        "balance_stats",
        "contiguous_partition",
        "exact_searches",
        "exact_searches_enabled",
        "lower_bound",
        "partition",
        "relative_gap",
    ],
    "seqbalance.planning": [
        "BASELINES",
        "CPPlan",
        "Capacity",
        "Mesh",
        "MicroBatching",
        "Plan",
        "PlanSpec",
        "RankRules",
        "Simulation",
        "inverse_permutation",
        "plan",
        "simulate",
        "step_time_lower_bound",
    ],
    "seqbalance.cli": ["main"],
    "seqbalance.compat": ["areal", "joint_areal", "joint_verl", "openrlhf", "slime", "verl"],
    "seqbalance.torch": [
        "BalancedDistributedSampler",
        "CPShardHandle",
        "MicroBatchTimer",
        "RankAgreementError",
        "RebalanceHandle",
        "Rebalancer",
        "StreamingRebalancer",
        "cp_shard",
        "global_token_count",
        "pack_collate",
        "rebalance",
        "token_mean_loss",
    ],
}

# Reachable as `seqbalance.<name>` (imported from seqbalance.torch on first use), but not in
# `seqbalance.__all__`: a star import would otherwise import torch.
LAZY_TORCH_NAMES = [
    "BalancedDistributedSampler",
    "MicroBatchTimer",
    "RebalanceHandle",
    "Rebalancer",
    "global_token_count",
    "pack_collate",
    "rebalance",
    "token_mean_loss",
]

# Dunder names that are part of the API (all others are Python's own).
PUBLIC_DUNDERS = {"__version__"}


def _import(name: str) -> types.ModuleType:
    if name.startswith("seqbalance.torch") and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch (not in the test extra)")
    return importlib.import_module(name)


def _is_submodule(package: types.ModuleType, name: str, value: object) -> bool:
    return isinstance(value, types.ModuleType) and value.__name__ == f"{package.__name__}.{name}"


def _defined_public_names(package: types.ModuleType) -> set[str]:
    """The public attributes the package defines: no submodules, no `from __future__`."""
    return {
        name
        for name, value in vars(package).items()
        if (not name.startswith("_") or name in PUBLIC_DUNDERS)
        and not isinstance(value, __future__._Feature)
        and not _is_submodule(package, name, value)
    }


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_all_is_the_pinned_list(name):
    package = _import(name)
    assert package.__all__ == EXPORTED[name]


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_all_names_each_name_once(name):
    package = _import(name)
    assert len(package.__all__) == len(set(package.__all__))


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_all_equals_the_public_names_defined(name):
    package = _import(name)
    submodules = {n for n in package.__all__ if importlib.util.find_spec(f"{name}.{n}")}
    for sub in submodules:
        assert _is_submodule(package, sub, importlib.import_module(f"{name}.{sub}"))
    assert set(package.__all__) - submodules == _defined_public_names(package)


def test_compat_lists_every_public_drop_in_module():
    import seqbalance.compat as compat

    modules = {m.name for m in pkgutil.iter_modules(compat.__path__) if not m.name.startswith("_")}
    assert set(compat.__all__) == modules


def test_lazy_torch_names_are_pinned_and_come_from_seqbalance_torch():
    assert list(seqbalance._TORCH_NAMES) == LAZY_TORCH_NAMES
    assert set(LAZY_TORCH_NAMES) <= set(EXPORTED["seqbalance.torch"])
    assert not set(LAZY_TORCH_NAMES) & set(seqbalance.__all__)
    torch_package = _import("seqbalance.torch")
    for name in LAZY_TORCH_NAMES:
        assert getattr(seqbalance, name) is getattr(torch_package, name)


def test_version_is_a_release_string_and_the_cli_prints_it(capsys):
    from seqbalance.cli import main

    version = seqbalance.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", version), version
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.split() == ["seqbalance", version]
