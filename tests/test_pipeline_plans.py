"""Pipeline plans: cost split, order search against brute force, plan(pp_size=...) guarantees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.costs import FlopsCost, QuadraticCost
from seqbalance.costs.phases import phase_costs, split_costs
from seqbalance.planning.pipeline import check_pipeline, simulate_pipeline
from seqbalance.planning.pipeline_orders import ORDERS, best_orders, light_ends
from seqbalance.planning.pipeline_plans import reorder


def test_split_keeps_totals_and_ratios():
    lin = QuadraticCost(per_token=3.0, per_token_sq=0.0)
    f, b, _, _ = phase_costs([5, 7], lin)
    np.testing.assert_allclose(b, 2.0 * f)  # matmuls: backward = 2 x forward
    quad = QuadraticCost(per_token=0.0, per_token_sq=1.0)
    f, b, _, _ = phase_costs([4], quad)
    np.testing.assert_allclose(b, 2.5 * f)  # attention: 2.5 x
    f, b, f0, b0 = phase_costs([4], QuadraticCost(1.0, 1.0, per_microbatch=3.0))
    assert (f0, b0) == (1.0, 2.0)
    np.testing.assert_allclose(f, 4 / 3 + 16 / 3.5)
    cost = FlopsCost.from_name("gemma-2-9b")  # sliding windows: exact != polynomial
    lens = np.array([100, 5000, 20000])
    f, b, _, _ = phase_costs(lens, cost)
    np.testing.assert_allclose(f + b, cost(lens), rtol=1e-12)
    with pytest.raises(ValueError, match="r_mm"):
        split_costs([1.0], r_mm=0.0)
    # A model carries its own ratios (e.g. recompute makes the backward heavier).
    own = QuadraticCost(per_token=1.0, per_token_sq=0.0, backward_matmul=3.0)
    f, b, _, _ = phase_costs([8], own)
    np.testing.assert_allclose(b, 3.0 * f)
    rec = FlopsCost.from_name("qwen2.5-7b", recompute=True)
    assert (rec.backward_matmul, rec.backward_attention) == (3.0, 3.0)


@pytest.mark.parametrize("recompute", [False, True])
def test_flops_cost_forward_phase_is_its_forward_flops(recompute):
    # FlopsCost counts training as 3x forward (4x with recompute) for every term, but told
    # the split that attention's backward is 2.5x: the forward phase came out 0.90x the
    # model's own forward FLOPs at 131k tokens.
    cost = FlopsCost.from_name("llama-3-8b", recompute=recompute)
    lens = np.array([1, 4096, 131072])
    f, b, _, _ = phase_costs(lens, cost)
    np.testing.assert_allclose(f, cost.forward_flops(lens), rtol=1e-12)
    np.testing.assert_allclose(b, (3.0 if recompute else 2.0) * f, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    b=st.floats(0.0, 10.0),
    c=st.floats(0.0, 1.0),
    a=st.floats(0.0, 5.0),
    r1=st.floats(0.5, 4.0),
    r2=st.floats(0.5, 4.0),
    lens=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
)
def test_split_follows_the_model_ratios(b, c, a, r1, r2, lens):
    cost = QuadraticCost(b, c, a, backward_matmul=r1, backward_attention=r2)
    x = np.asarray(lens, dtype=float)
    f, bw, _, _ = phase_costs(lens, cost)
    # Independent: each term's forward share is 1 / (1 + its ratio).
    np.testing.assert_allclose(f, (a + b * x) / (1 + r1) + c * x * x / (1 + r2), rtol=1e-9)
    np.testing.assert_allclose(f + bw, cost(lens), rtol=1e-12, atol=1e-12)
    back = sb.load_cost(cost.to_dict())
    assert back == cost and back.backward_matmul == r1 and back.backward_attention == r2


def test_bad_ratio_on_the_model():
    with pytest.raises(ValueError, match="backward_attention"):
        QuadraticCost(1.0, 0.0, backward_attention=0.0)
    with pytest.raises(ValueError, match="backward_matmul"):
        QuadraticCost(1.0, 0.0, backward_matmul=float("nan"))
    # Default ratios keep the JSON of older releases.
    assert "backward_matmul" not in QuadraticCost(1.0, 0.0).to_dict()


def test_light_ends_matches_verl_rule():
    # verl: sort heaviest first, then d[::2][::-1] + d[1::2]
    w = np.array([10.0, 60.0, 30.0, 50.0, 20.0, 40.0])
    d = sorted(range(6), key=lambda i: -w[i])
    assert light_ends(w).tolist() == d[::2][::-1] + d[1::2]
    assert w[light_ends(w)].tolist() == [20.0, 40.0, 60.0, 50.0, 30.0, 10.0]


def _brute(f, b, spec):
    return min(
        simulate_pipeline(
            f[list(o)],
            b[list(o)],
            spec.pp_size,
            schedule=spec.schedule,
            virtual_stages=spec.virtual_stages,
        ).step_time
        for o in itertools.permutations(range(len(f)))
    )


@settings(max_examples=25, deadline=None)
@given(
    layout=st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]),
    p=st.integers(2, 4),
    m=st.integers(2, 6),
    seed=st.integers(0, 10**6),
)
def test_search_finds_the_brute_force_optimum(layout, p, m, seed):
    schedule, v = layout
    if schedule == "interleaved":
        m = p
    rng = np.random.default_rng(seed)
    f = rng.lognormal(0.0, 0.8, m)
    b = f * rng.uniform(2.0, 2.5, m)
    spec = check_pipeline(p, schedule, v)
    orders, times = best_orders(f[None], b[None], None, spec)
    assert sorted(orders[0].tolist()) == list(range(m))
    assert times[0] == pytest.approx(_brute(f, b, spec), rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 8), m=st.integers(9, 30), seed=st.integers(0, 10**6))
def test_heuristic_never_worse_than_a_baseline_order(p, m, seed):
    rng = np.random.default_rng(seed)
    f = rng.lognormal(0.0, 0.7, (2, m))
    b = 2.2 * f
    spec = check_pipeline(p)
    orders, times = best_orders(f, b, None, spec)
    for r in range(2):
        for fn in ORDERS.values():
            o = fn(f[r] + b[r])
            t = simulate_pipeline(f[r][o], b[r][o], p).step_time
            assert times[r] <= t * (1 + 1e-12)
        got = simulate_pipeline(f[r][orders[r]], b[r][orders[r]], p).step_time
        assert got == pytest.approx(times[r], rel=1e-12)


LENS = sb.workloads.lengths("rl-math", 400, seed=1)


@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
@pytest.mark.parametrize("layout", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
def test_plan_with_pipeline(sync, layout):
    schedule, v = layout
    p = sb.plan(
        LENS,
        4,
        32768,
        cost="qwen2.5-7b",
        sync=sync,
        pp_size=4,
        schedule=schedule,
        virtual_stages=v,
        min_micro_batches=6,
    )
    assert p.violations() == {k: 0 for k in p.violations()}
    assert sorted(p.order().tolist()) == list(range(LENS.size))
    if schedule == "interleaved":
        assert p.num_micro_batches % 4 == 0
    sim = p.simulate_pipeline()
    assert sim.step_time >= sim.lower_bound * (1 - 1e-12)
    for name in ORDERS:
        other = reorder(p, name)
        assert sorted(other.order().tolist()) == list(range(LENS.size))
        assert sim.step_time <= other.simulate_pipeline().step_time * (1 + 1e-12)
    assert sb.Plan.from_json(p.to_json()) == p
    assert sb.Plan.from_json(p.to_json()).simulate_pipeline().step_time == sim.step_time


def test_fsdp_pipeline_is_lockstep_of_slot_maxima():
    p = sb.plan(LENS, 3, 32768, cost="qwen2.5-7b", sync="fsdp", pp_size=2, min_micro_batches=4)
    setup = p.pipeline
    fwd, tot = setup.forward, p.costs
    f = np.array([[fwd[mb].sum() for mb in rank] for rank in p.micro_batches]).max(axis=0)
    b = np.array([[(tot[mb] - fwd[mb]).sum() for mb in rank] for rank in p.micro_batches])
    ref = simulate_pipeline(f, b.max(axis=0), 2).step_time
    assert p.simulate_pipeline().step_time == pytest.approx(ref, rel=1e-12)


def test_ddp_pipeline_is_slowest_replica():
    p = sb.plan(LENS, 3, 32768, cost="qwen2.5-7b", sync="ddp", pp_size=2, min_micro_batches=4)
    fwd, tot = p.pipeline.forward, p.costs
    times = []
    for rank in p.micro_batches:
        f = np.array([fwd[mb].sum() for mb in rank])
        b = np.array([(tot[mb] - fwd[mb]).sum() for mb in rank])
        times.append(simulate_pipeline(f, b, 2).step_time)
    sim = p.simulate_pipeline()
    assert sim.step_time == pytest.approx(max(times), rel=1e-12)
    np.testing.assert_allclose(sim.replica_times, times, rtol=1e-12)


def test_pp_size_one_is_todays_plan():
    for sync in ("fsdp", "ddp"):
        a = sb.plan(LENS, 4, 32768, cost="qwen2.5-7b", sync=sync)
        b = sb.plan(LENS, 4, 32768, cost="qwen2.5-7b", sync=sync, pp_size=1)
        assert a.to_json() == b.to_json()
        assert a.pipeline is None


def test_pipeline_argument_errors():
    with pytest.raises(ValueError, match="virtual_stages >= 2"):
        sb.plan(LENS, 2, 32768, pp_size=2, schedule="interleaved")
    with pytest.raises(ValueError, match="pp_comm"):
        sb.plan(LENS, 2, 32768, pp_comm=0.5)
    # Finite, but its product with the batch's tokens is not: refused before numpy's
    # overflow warnings and an "inf is not finite" message about an internal array.
    with pytest.raises(ValueError, match=r"pp_comm=1e\+308 times the batch's \d+ tokens "):
        sb.plan(LENS, 2, 32768, pp_size=2, pp_comm=1e308)
    with pytest.raises(ValueError, match="schedule"):
        sb.plan(LENS, 2, 32768, pp_size=2, schedule="zero-bubble")
    p = sb.plan(LENS, 2, 32768)
    with pytest.raises(ValueError, match="pp_size > 1"):
        p.simulate_pipeline()
    with pytest.raises(ValueError, match="pp_size > 1"):
        reorder(p, "input")


def test_comm_time_slows_the_step():
    kw = {"cost": "qwen2.5-7b", "sync": "ddp", "pp_size": 4, "min_micro_batches": 4}
    slow = sb.plan(LENS, 2, 32768, pp_comm=1e9, **kw).simulate_pipeline()
    fast = sb.plan(LENS, 2, 32768, **kw).simulate_pipeline()
    assert slow.step_time > fast.step_time


def test_notes_say_what_the_pipeline_order_did():
    p = sb.plan(
        LENS, 2, 32768, cost="qwen2.5-7b", pp_size=2, schedule="interleaved",
        virtual_stages=2, min_micro_batches=3,
    )
    assert p.num_micro_batches % 2 == 0
    assert any("micro_batch_multiple=1 raised to 2" in n for n in p.notes)
    (note,) = [n for n in p.notes if n.startswith("pipeline (interleaved, pp_size=2")]
    sim = p.simulate_pipeline()
    assert f"{sim.gap:+.2%} vs the pipeline lower bound" in note
    # A multiple that already suits the schedule is not mentioned.
    q = sb.plan(
        LENS, 2, 32768, pp_size=2, schedule="interleaved", virtual_stages=2,
        micro_batch_multiple=4,
    )
    assert not any("raised" in n for n in q.notes)
    assert q.num_micro_batches % 4 == 0


def test_pipeline_plans_are_deterministic():
    kw = {"cost": "qwen2.5-7b", "pp_size": 4, "min_micro_batches": 12, "sync": "ddp"}
    a = sb.plan(LENS, 3, 32768, **kw)
    b = sb.plan(LENS.copy(), 3, 32768, **kw)
    assert a.to_json() == b.to_json()


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_pp_comm_is_a_per_token_transfer(sync):
    c = 1e9  # cost units per token sent between stages
    p = sb.plan(LENS, 3, 32768, cost="qwen2.5-7b", sync=sync, pp_size=3, min_micro_batches=4,
                pp_comm=c)
    fwd, tot, lens = p.pipeline.forward, p.costs, p.lengths
    f = np.array([[fwd[mb].sum() for mb in rank] for rank in p.micro_batches])
    b = np.array([[(tot[mb] - fwd[mb]).sum() for mb in rank] for rank in p.micro_batches])
    t = np.array([[c * lens[mb].sum() for mb in rank] for rank in p.micro_batches])
    if sync == "fsdp":
        f, b, t = f.max(axis=0)[None], b.max(axis=0)[None], t.max(axis=0)[None]
    ref = max(simulate_pipeline(f[r], b[r], 3, comm=t[r]).step_time for r in range(len(f)))
    assert p.simulate_pipeline().step_time == pytest.approx(ref, rel=1e-12)


def test_order_baselines_reachable_from_baselines():
    assert list(sb.planning.baselines.PIPELINE_ORDERS) == [
        "input",
        "largest-first",
        "smallest-first",
        "light-ends",
    ]
    p = sb.plan(LENS, 2, 32768, pp_size=2, min_micro_batches=4)
    verl = sb.planning.baselines.reorder(p, "light-ends")
    assert verl.strategy.endswith("+light-ends")
    assert sorted(verl.order().tolist()) == list(range(LENS.size))


def test_plan_json_with_a_count_the_schedule_cannot_run():
    p = sb.plan(LENS, 2, 32768, pp_size=2, schedule="interleaved", virtual_stages=2)
    data = p.to_dict()
    data["micro_batches"] = [[*rank, []] for rank in data["micro_batches"]]  # one more: odd
    with pytest.raises(ValueError, match="multiple of pp_size=2, got"):
        sb.Plan.from_dict(data)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(8, 80),
    dp=st.integers(1, 3),
    p=st.integers(2, 4),
    layout=st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
    sync=st.sampled_from(["ddp", "fsdp"]),
)
def test_pipelined_plan_properties(seed, n, dp, p, layout, sync):
    schedule, v = layout
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 4000, n)
    plan = sb.plan(
        lens, dp, 4096, cost="qwen2.5-7b", sync=sync, pp_size=p, schedule=schedule,
        virtual_stages=v, allow_empty=True,
    )
    assert sorted(plan.order().tolist()) == list(range(n))
    assert plan.violations()["over_capacity"] == 0
    if schedule == "interleaved":
        assert plan.num_micro_batches % p == 0
    sim = plan.simulate_pipeline()
    assert sim.step_time >= sim.lower_bound * (1 - 1e-12)
    for name in ORDERS:
        assert sim.step_time <= reorder(plan, name).simulate_pipeline().step_time * (1 + 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
@pytest.mark.parametrize("layout", [("1f1b", 1), ("interleaved", 2)])
def test_plan_order_is_the_brute_force_optimum_for_its_micro_batches(sync, layout):
    schedule, v = layout
    lens = sb.workloads.lengths("sft-chat", 120, seed=3)
    p = sb.plan(lens, 2, 32768, cost="qwen2.5-7b", sync=sync, pp_size=3, schedule=schedule,
                virtual_stages=v, min_micro_batches=6)
    assert p.num_micro_batches == 6
    fwd, tot = p.pipeline.forward, p.costs
    f = np.array([[fwd[mb].sum() for mb in rank] for rank in p.micro_batches])
    b = np.array([[(tot[mb] - fwd[mb]).sum() for mb in rank] for rank in p.micro_batches])
    if sync == "fsdp":  # lockstep: one pipeline of slot maxima, orders permute slots
        f, b = f.max(axis=0)[None], b.max(axis=0)[None]
    best = max(
        min(
            simulate_pipeline(f[r][list(o)], b[r][list(o)], 3, schedule=schedule,
                              virtual_stages=v).step_time
            for o in itertools.permutations(range(6))
        )
        for r in range(len(f))
    )
    assert p.simulate_pipeline().step_time == pytest.approx(best, rel=1e-12)


def test_pipelines_combine_with_static_context_parallelism_only():
    # Dynamic CP gives the GPUs of one stage different slots; static CP plans pipelines
    # (tests/test_cp_pipeline.py).
    with pytest.raises(ValueError, match=r"pp_size=2 needs cp='static' with cp_size > 1"):
        sb.plan(LENS, 2, 32768, cp_size=2, cp="dynamic", pp_size=2)
    assert sb.plan(LENS, 2, 32768, cp_size=2, pp_size=2).pipeline.spec.pp_size == 2


@pytest.mark.parametrize("quadratic", [[1.0], [1.0, 0.5, 0.25]])
def test_split_costs_quadratic_must_match_totals(quadratic):
    # One quadratic part for two totals was broadcast: both taken as all attention.
    with pytest.raises(ValueError, match="quadratic"):
        split_costs([1.0, 2.0], quadratic=quadratic)


def test_split_costs_quadratic_above_total_is_capped():
    # Documented: the attention part of a total is at most the total.
    f, b = split_costs([3.5], quadratic=[10.0], r_attn=2.5)
    assert (float(f[0]), float(b[0])) == (1.0, 2.5)


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_oversized_alone_runs_alone_with_pipelines(sync):
    # oversized="alone" promises the long sequence its own micro-batch; with pp_size > 1
    # the empty sequences packing let share it (it sees the long one as exactly the cap)
    # must move out too, as they do without pipelines.
    lens = [200, 0, 5, 50, 50]
    for pp in (1, 2):
        p = sb.plan(lens, dp_size=1, max_tokens=100, oversized="alone", pp_size=pp, sync=sync)
        (rank,) = p.micro_batches
        assert sorted(i for mb in rank for i in mb) == list(range(5))
        assert [0] in rank, (pp, rank)
        assert p.violations()["over_capacity"] == 1


@pytest.mark.parametrize(
    "key, value, match",
    [
        # a forward above the sequence's training cost leaves a negative backward
        ("forward_costs", [100.0, 1.0, 1.0, 1.0], r"pipeline\.forward_costs\[0\].*costs\[0\]"),
        # the forward share of the per-micro-batch cost must lie in [0, per_microbatch]
        ("forward_per_microbatch", -5.0, r"pipeline\.forward_per_microbatch"),
        ("forward_per_microbatch", 1.0, r"pipeline\.forward_per_microbatch"),
        ("comm_per_token", "x", r"pipeline\.comm_per_token"),
        ("comm_per_token", -1.0, r"pipeline\.comm_per_token"),
    ],
)
def test_plan_json_pipeline_fields_are_checked_on_load(key, value, match):
    # A hand-edited pipeline object is refused when loaded, naming the field, instead of
    # simulating other work (or failing later on a derived 'backward[0]').
    p = sb.plan([10, 20, 30, 40], dp_size=1, max_tokens=50, pp_size=2)
    data = p.to_dict()
    data["pipeline"][key] = value
    with pytest.raises(ValueError, match=match):
        sb.Plan.from_dict(data)


@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
def test_oversized_alone_splits_forward_and_backward_at_the_true_length(sync):
    # The forward share was computed at the length clipped to max_tokens while the cost
    # used the true one: a 300-token sequence ran a 62-unit forward and a 1,138-unit
    # backward (18x) instead of 357 and 843, and the simulated step was 2% off.
    from seqbalance.costs.phases import phase_costs

    lens = [300, 40, 60, 50, 70, 20]
    cost = sb.QuadraticCost(per_token=1.0, per_token_sq=0.01)
    p = sb.plan(lens, 1, 100, cost=cost, pp_size=2, oversized="alone", sync=sync)
    fwd, bwd, _, _ = phase_costs(np.asarray(lens), cost)
    np.testing.assert_allclose(p.pipeline.forward, fwd)
    assert p.pipeline.forward[0] == pytest.approx(1200 / 3.36)  # 1 : 2.36 at this length
    f = [float(fwd[mb].sum()) for mb in p.micro_batches[0]]
    b = [float(bwd[mb].sum()) for mb in p.micro_batches[0]]
    want = sb.simulate_pipeline(f, b, 2).step_time
    assert p.simulate_pipeline().step_time == pytest.approx(want)


def test_notes_and_errors_name_the_schedule_that_raised_the_count_multiple():
    """The interleaved schedule raises the count multiple: a note said
    "micro_batch_multiple=2" to a caller who passed 1, and the too-few-sequences error
    advised lowering micro_batch_multiple alone."""
    lens = np.random.default_rng(0).integers(100, 4000, 64)
    p = sb.plan(lens, 2, 8192, pp_size=2, schedule="interleaved", virtual_stages=2)
    assert p.num_micro_batches % 2 == 0
    raised = [n for n in p.notes if n.startswith(f"{p.num_micro_batches} micro-batches")]
    assert raised, p.notes  # the capacity alone needs 9 here, an odd count
    assert "the interleaved schedule's multiple of pp_size=2" in raised[0]
    assert "micro_batch_multiple=2" not in raised[0]
    needs = r"the interleaved schedule also needs a multiple of pp_size=4 micro-batches"
    with pytest.raises(ValueError, match=needs):
        sb.plan([5, 6, 7], 2, 8192, pp_size=4, schedule="interleaved", virtual_stages=2)


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
def test_fewer_micro_batches_than_stages_try_counts_up_to_pp_size(sync):
    """Eight sequences of 100 tokens fit one micro-batch of 800, but a 4-stage 1F1B
    pipeline then runs (m + p - 1) stage slots of work for m micro-batches: 4 x 800 / 4 =
    800 at m = 1, (4 + 3) x 200 / 4 = 350 at m = 4. The planner tries the counts up to
    pp_size when the fewest is below it and says so; more than that is the caller's call
    (extra_micro_batches: 275 at m = 8); at or above pp_size nothing changes."""
    p = sb.plan([100] * 8, 1, 800, pp_size=4, sync=sync)
    assert p.num_micro_batches == 4
    assert p.simulate_pipeline().step_time == pytest.approx(350.0)
    assert any("4 micro-batches per rank instead of 1, the fewest the rules allow" in n
               and "-56.2%" in n for n in p.notes)  # fmt: skip
    # asking for fewer extra counts than the search runs is never slower (it gave 2 and 3)
    for extra in (1, 2, 3):
        q = sb.plan([100] * 8, 1, 800, pp_size=4, sync=sync, extra_micro_batches=extra)
        assert q.num_micro_batches == 4 and q.simulate_pipeline().step_time == pytest.approx(350.0)
    # the fewest the rules allow: min_micro_batches=2 -> counts 2..4 (500 at 2, 350 at 4)
    q = sb.plan([100] * 8, 1, 800, pp_size=4, sync=sync, min_micro_batches=2)
    assert q.num_micro_batches == 4 and any("instead of 2, the fewest" in n for n in q.notes)
    # in steps of micro_batch_multiple: 3 -> 6 (the first at or above pp_size=4)
    q = sb.plan([100] * 12, 1, 1200, pp_size=4, sync=sync, micro_batch_multiple=3)
    assert q.num_micro_batches == 6
    more = sb.plan([100] * 8, 1, 800, pp_size=4, sync=sync, extra_micro_batches=7)
    assert more.num_micro_batches == 8
    assert more.simulate_pipeline().step_time == pytest.approx(275.0)
    full = sb.plan([100] * 8, 1, 100, pp_size=4, sync=sync)  # the cap alone needs 8 >= 4
    assert full.num_micro_batches == 8 and not any("instead of the fewest" in n for n in full.notes)
    flat = sb.plan([100] * 8, 1, 800, sync=sync)  # no pipeline: the fewest, as always
    assert flat.num_micro_batches == 1


def test_pipeline_counts_keep_ties_and_add_no_empty_micro_batches():
    """A step that differs by rounding alone is a tie (the fewest stays), and counts whose
    micro-batches would not all get a sequence are not tried (allow_empty would have filled
    them with empty ones)."""
    p = sb.plan([97, 81, 29, 62, 56], 1, 97, pp_size=5, sync="ddp", schedule="gpipe")
    assert not any("instead of" in n for n in p.notes)
    q = sb.plan([75, 56, 59, 6, 94, 99, 66, 87], 3, 236, pp_size=5, sync="ddp",
                allow_empty=True, baselines=False)  # fmt: skip
    assert q.violations()["empty"] == 0 and q.num_micro_batches <= 8 // 3
    # groups leave a rank short of sequences: a larger count would need an empty one there
    lens = [31, 23, 94, 89, 78, 90, 18, 25, 48, 98, 19, 2]
    groups = [3, 3, 5, 1, 4, 0, 2, 6, 3, 5, 2, 1]
    g = sb.plan(lens, 3, 351, pp_size=3, schedule="gpipe", allow_empty=True, groups=groups)
    assert g.violations()["empty"] == 0 and g.violations()["split_groups"] == 0


def _flat_step(lens, dp, cap, p, **options):
    """The plain plan (no pipeline, at the schedule's count multiple) run through ``p``'s
    pipeline in its own order."""
    from seqbalance.planning.pipeline_plans import simulate_plan_pipeline

    q = sb.plan(lens, dp, cap, micro_batch_multiple=p.pipeline.spec.count_multiple, **options)
    return simulate_plan_pipeline(
        q.micro_batches, q.costs, q.per_microbatch, q.lengths, q.padded, q.sync, p.pipeline
    ).step_time


def test_pipelined_plan_not_slower_than_the_plain_plan_known_case():
    # The pipelined packings reached 1648 (their own slots' bound); the plain plan's
    # slots, ordered for the pipeline, run in 1620.
    lens = [581, 95, 807, 45, 408, 151, 506, 577, 83, 993, 876, 232, 673, 67, 334, 229, 178,
            988, 529, 474]  # fmt: skip
    p = sb.plan(lens, 4, 1000, pp_size=2, schedule="gpipe")
    assert p.simulate_pipeline().step_time == pytest.approx(1620)
    assert p.simulate_pipeline().step_time <= _flat_step(lens, 4, 1000, p) * (1 + 1e-9)
    assert any("made without the pipeline" in n for n in p.notes)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 1000), min_size=4, max_size=40),
    st.integers(1, 4),
    st.integers(2, 4),
    st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    st.sampled_from(["fsdp", "ddp"]),
)
def test_pipelined_plan_never_slower_than_the_plain_plan(lens, dp, pp, schedule, sync):
    extra = {"virtual_stages": 2} if schedule == "interleaved" else {}
    try:
        p = sb.plan(lens, dp, 1000, pp_size=pp, schedule=schedule, sync=sync, **extra)
    except ValueError:
        return
    flat = _flat_step(lens, dp, 1000, p, sync=sync)
    assert p.simulate_pipeline().step_time <= flat * (1 + 1e-9)
