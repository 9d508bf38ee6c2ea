"""Plan.metrics: the predicted-balance dict for loggers."""

from __future__ import annotations

import pytest

from seqbalance.costs import REPORT_METRICS, QuadraticCost
from seqbalance.planning.metrics import PLAN_METRICS
from seqbalance.planning.planner import plan
from seqbalance.planning.plans import Plan


def _plan() -> Plan:
    # Rank 0 runs 4 then 2 tokens, rank 1 runs 3 then 1.
    return Plan([[[0], [1]], [[2], [3]]], [4, 2, 3, 1], max_tokens=4, sync="ddp")


def test_known_values():
    m = _plan().metrics()
    assert set(m) == set(PLAN_METRICS)
    assert m["balance/plan_imbalance"] == pytest.approx(6 / 5 - 1)
    assert m["balance/plan_token_imbalance"] == pytest.approx(6 / 5 - 1)
    assert m["balance/plan_step_time"] == pytest.approx(6.0)
    assert m["balance/plan_gap"] == pytest.approx(6 / 5 - 1)  # bound: 10 tokens / 2 ranks
    assert m["balance/plan_idle_fraction"] == pytest.approx(1 - 10 / 12)
    assert m["balance/plan_micro_batches"] == 2
    assert m["balance/plan_capacity_utilisation"] == pytest.approx(10 / 16)


def test_other_cost_and_prefix():
    # Costs L²: 16, 4 on rank 0 and 9, 1 on rank 1; tokens are unchanged.
    m = _plan().metrics(QuadraticCost(per_token=0.0, per_token_sq=1.0), prefix="sb/")
    assert m["sb/plan_imbalance"] == pytest.approx(20 / 15 - 1)
    assert m["sb/plan_token_imbalance"] == pytest.approx(6 / 5 - 1)
    assert m["sb/plan_step_time"] == pytest.approx(20.0)


def test_keys_do_not_collide_with_the_report():
    assert not set(PLAN_METRICS) & set(REPORT_METRICS)
    assert all(k.startswith("balance/") for k in [*PLAN_METRICS, *REPORT_METRICS])


def test_planner_output_metrics_are_consistent():
    p = plan([7, 2, 4, 6, 5, 8, 3, 3], dp_size=2, max_tokens=16, sync="fsdp")
    m = p.metrics()
    sim = p.simulate()
    assert m["balance/plan_step_time"] == sim.step_time
    assert m["balance/plan_micro_batches"] == p.num_micro_batches


def test_every_key_is_documented():
    # The metrics table of the closing-the-loop guide is what users read: each key a logger
    # can receive must have its row there, and each row must name a key that exists.
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "howto" / "closing-the-loop.md"
    rows = [line for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `balance/")]  # fmt: skip
    documented = {line.split("`")[1] for line in rows}
    assert documented == set(PLAN_METRICS) | set(REPORT_METRICS)


def test_capacity_utilisation_of_a_context_parallel_plan_counts_every_gpu():
    # It divided by dp_size: 3.72 for a dp 2 x cp 4 plan within its cap (stats: 0.93).
    import seqbalance as sb

    lengths = sb.workloads.lengths("long-context", 300, seed=2)
    p = sb.plan(lengths, 1, 32768, cp_size=8, cost="qwen2.5-7b")
    tokens = p.microbatch_tokens()
    assert tokens.shape[0] == 8 and p.dp_size == 1 and p.violations()["over_capacity"] == 0
    used = p.metrics()["balance/plan_capacity_utilisation"]
    assert used == pytest.approx(tokens.sum() / (8 * p.num_micro_batches * 32768))
    assert 0 < used <= 1
