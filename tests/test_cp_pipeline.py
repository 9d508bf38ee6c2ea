"""Static context parallelism inside pipeline stages (seqbalance.planning.cp_pipeline).

Expected values are written out from the module docstring's model: a piece's linear part
(a/d + b·tokens) has backward 2x its forward, its attention c·(e²−s²) 2.5x, its exposed ring
transfer one third forward; a replica's slot is as slow as its slowest GPU, forward and
backward apart. Run orders are checked against all permutations with the plain pipeline
simulator (sb.simulate_pipeline), which knows nothing of CP.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cli import main
from seqbalance.costs import QuadraticCost
from seqbalance.costs.context_parallel import ContextParallelCost, balanced_layout
from seqbalance.planning.cp_pipeline import (
    CPPipelineSetup,
    _gpu_phases,
    order_slots,
    simulate_cp_pipeline,
    slot_phases,
)
from seqbalance.planning.cp_plans import CPPlan, piece_costs
from seqbalance.planning.pipeline import check_pipeline
from seqbalance.planning.pipeline_orders import ORDERS


def _hand_phases(length, d, a, b, c, comm=0.0):
    """Forward and backward of each of the d pieces of one sequence (module model)."""
    out = []
    for ranges in balanced_layout(length, d):
        tok = sum(e - s for s, e in ranges)
        att = c * sum(e * e - s * s for s, e in ranges)
        lin = a / d + b * tok
        fwd = lin / 3.0 + att / 3.5 + comm / 3.0
        out.append((fwd, lin + att + comm - fwd))
    return out


def test_a_slot_takes_the_slowest_gpu_forward_and_backward_apart():
    # L = 7 over 2 GPUs: GPU 0 holds (0,1),(5,7): 3 tokens, e²−s² = 25; GPU 1 holds
    # (1,3),(3,5): 4 tokens, 24. Both cost 2 + tokens + e²−s² = 30, but GPU 1 has the
    # heavier forward (linear work) and GPU 0 the heavier backward (attention).
    cost = QuadraticCost(per_token=1.0, per_token_sq=1.0, per_sequence=4.0)
    p = sb.plan([7], 1, 8, cost=cost, cp_size=2, pp_size=2)
    f0, b0 = 5 / 3 + 25 / 3.5, 10 / 3 + 25 * 2.5 / 3.5
    f1, b1 = 6 / 3 + 24 / 3.5, 12 / 3 + 24 * 2.5 / 3.5
    assert f0 + b0 == pytest.approx(30.0) and f1 + b1 == pytest.approx(30.0)
    f, b, c = slot_phases(p.pieces, p.lengths, p.cp_cost, 2)
    assert f.shape == b.shape == c.shape == (1, 1)
    assert f[0, 0] == pytest.approx(f1) and b[0, 0] == pytest.approx(b0) and c[0, 0] == 0.0
    # one micro-batch through 2 stages: (m + p - 1)(F + B) / p = F + B, above 30
    assert p.simulate_pipeline().step_time == pytest.approx(f1 + b0)
    assert f1 + b0 > 30.0 + 1e-3


def test_ring_transfers_are_a_third_forward_and_pp_comm_counts_one_gpus_tokens():
    # L = 8, d = 2: each GPU holds 4 tokens, e²−s² = 32; its exposed ring transfer is
    # 3 passes x 4 tokens x 1000 bytes / 1000 bytes/s = 12 cost units (overlap 0).
    cost = QuadraticCost(per_token=1.0, per_token_sq=0.01, per_sequence=4.0, per_microbatch=3.0)
    cp_cost = {"bandwidth": 1000.0, "kv_bytes_per_token": 1000.0, "cost_per_second": 1.0}
    p = sb.plan([8], 1, 8, cost=cost, cp_size=2, cp_cost=cp_cost, pp_size=2, pp_comm=0.5)
    (fa, ba), (fb, bb) = _hand_phases(8, 2, 4.0, 1.0, 0.01, comm=12.0)
    assert (fa, ba) == pytest.approx((fb, bb))  # both GPUs hold 4 tokens, e²−s² = 32
    assert fa == pytest.approx(2.0 + 0.32 / 3.5 + 4.0)
    f, b, c = slot_phases(p.pieces, p.lengths, p.cp_cost, 2, comm_per_token=0.5)
    assert f[0, 0] == pytest.approx(1.0 + fa)  # + the forward third of per_microbatch
    assert b[0, 0] == pytest.approx(2.0 + ba)
    assert c[0, 0] == 0.5 * 4  # each GPU sends its own 4 tokens' activations, in parallel
    assert p.pipeline.comm_per_token == 0.5


def _lens(seed, n, hi):
    return np.random.default_rng(seed).integers(1, hi, size=n)


def _sim_step(f, b, c, spec, sync):
    """The plan's pipeline step from slot phases with the plain simulator."""
    kw = {"schedule": spec.schedule, "virtual_stages": spec.virtual_stages}
    if sync == "fsdp":
        f, b, c = f.max(axis=0)[None], b.max(axis=0)[None], c.max(axis=0)[None]
    return max(
        sb.simulate_pipeline(f[r], b[r], spec.pp_size, comm=c[r], **kw).step_time
        for r in range(len(f))
    )


@pytest.mark.parametrize("ratios", [(2.0, 2.5), (1.0, 6.0)])
@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
@pytest.mark.parametrize("seed", range(4))
def test_slot_order_is_the_best_of_all_orders(seed, sync, ratios):
    # m <= 6 slots: every order of every replica's slots (fsdp: of the slots) is tried with
    # the plain simulator; the plan's order matches the best. With ratios (1, 6) attention
    # and matmul work split very differently, so the replica plan's order (each sequence
    # split with backward_matmul alone) is not the best: the slots must be ordered again.
    lens = _lens(seed, 14, 3000)
    cost = QuadraticCost(per_token=1.0, per_token_sq=2e-3, per_sequence=50.0, per_microbatch=20.0,
                         backward_matmul=ratios[0], backward_attention=ratios[1])
    p = sb.plan(lens, 2, 2000, cost=cost, cp_size=2, pp_size=3, sync=sync,
                cp_cost={"bandwidth": 5e3, "kv_bytes_per_token": 10.0, "cost_per_second": 1.0},
                pp_comm=0.05)  # fmt: skip
    f, b, c = slot_phases(p.pieces, p.lengths, p.cp_cost, 2, 0.05)
    m = f.shape[1]
    assert 2 <= m <= 6
    spec = p.pipeline.spec
    got = p.simulate_pipeline().step_time
    assert got == pytest.approx(_sim_step(f, b, c, spec, sync), rel=1e-12)
    perms = [list(q) for q in itertools.permutations(range(m))]
    if sync == "fsdp":
        best = min(_sim_step(f[:, q], b[:, q], c[:, q], spec, sync) for q in perms)
    else:  # each replica its own order
        best = max(
            min(_sim_step(f[r:r + 1, q], b[r:r + 1, q], c[r:r + 1, q], spec, sync)
                for q in perms)
            for r in range(len(f))
        )  # fmt: skip
    assert got == pytest.approx(best, rel=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 40),
    dp=st.integers(1, 3),
    cp=st.sampled_from([2, 4]),
    layout=st.sampled_from([(2, "1f1b", 1), (3, "gpipe", 1), (4, "1f1b", 1),
                            (2, "interleaved", 2), (3, "interleaved", 3)]),
    sync=st.sampled_from(["ddp", "fsdp"]),
    bandwidth=st.sampled_from([None, 2e3]),
)  # fmt: skip
def test_pipelined_static_cp_plans_hold_every_rule(seed, n, dp, cp, layout, sync, bandwidth):
    pp, schedule, v = layout
    lens = _lens(seed, n, 6000)
    cap = max(1500, int(-(-lens.max() // (2 * cp)) * 2))  # the largest piece fits
    cost = QuadraticCost(per_token=1.0, per_token_sq=1e-3, per_sequence=10.0, per_microbatch=5.0)
    cp_cost = None if bandwidth is None else {
        "bandwidth": bandwidth, "kv_bytes_per_token": 4.0, "cost_per_second": 1.0}
    kw = dict(cost=cost, cp_size=cp, cp_cost=cp_cost, pp_size=pp, schedule=schedule,
              virtual_stages=v, sync=sync, allow_empty=True)  # fmt: skip
    p = sb.plan(lens, dp, cap, **kw)
    assert isinstance(p, CPPlan) and p.cp == "static"
    # allow_empty: an interleaved schedule may need more slots than there are sequences
    assert not any(v for k, v in p.violations().items() if k != "empty")
    assert p.num_micro_batches % (pp if schedule == "interleaved" else 1) == 0
    assert sorted(i for r in p.replica_micro_batches() for mb in r for i in mb) == list(range(n))
    # forward + backward of every GPU's slot is its cost: the split moves no work
    fwd, bwd, _ = _gpu_phases(p.pieces, p.lengths, p.cp_cost)
    assert fwd + bwd == pytest.approx(piece_costs(p.pieces, p.lengths, p.cp_cost), rel=1e-12)
    assert (fwd >= 0).all() and (bwd >= 0).all()
    # never slower than the same slots in a baseline order
    f, b, c = slot_phases(p.pieces, p.lengths, p.cp_cost, cp)
    step = p.simulate_pipeline().step_time
    assert step == pytest.approx(_sim_step(f, b, c, p.pipeline.spec, sync), rel=1e-12)
    w = f + b
    for name in ("input", "light-ends", "largest-first"):
        if sync == "fsdp":
            q = ORDERS[name](w.max(axis=0))
            other = _sim_step(f[:, q], b[:, q], c[:, q], p.pipeline.spec, sync)
        else:
            rows = [ORDERS[name](row) for row in w]
            other = max(
                _sim_step(f[r:r + 1, q], b[r:r + 1, q], c[r:r + 1, q], p.pipeline.spec, sync)
                for r, q in enumerate(rows)
            )  # fmt: skip
        assert step <= other * (1 + 1e-9), name
    # never slower than the static plan made without the pipeline, in its best order
    flat_kw = {k: v for k, v in kw.items() if k not in ("pp_size", "schedule", "virtual_stages")}
    flat = sb.plan(lens, dp, cap, micro_batch_multiple=pp if schedule == "interleaved" else 1,
                   **flat_kw)  # fmt: skip
    ordered = order_slots(flat.pieces, flat.lengths, flat.cp_cost, cp, sync, p.pipeline)
    rival = simulate_cp_pipeline(ordered, flat.lengths, flat.cp_cost, cp, sync, p.pipeline)
    assert step <= rival.step_time * (1 + 1e-9)
    # the same on every run, and through JSON
    assert sb.plan(lens, dp, cap, **kw).to_json() == p.to_json()
    back = sb.Plan.from_json(p.to_json())
    assert back.pipeline == p.pipeline
    assert back.simulate_pipeline().step_time == step


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_extra_micro_batches_never_slow_the_pipeline(sync):
    lens = sb.workloads.lengths("long-mix", 96, seed=3)
    kw = dict(cost="qwen2.5-7b", cp_size=4, pp_size=4, sync=sync,
              cp_cost={"bandwidth": 2.5e10})  # fmt: skip
    base = sb.plan(lens, 2, 16384, **kw)
    more = sb.plan(lens, 2, 16384, extra_micro_batches=4, **kw)
    assert more.simulate_pipeline().step_time <= base.simulate_pipeline().step_time
    assert any("extra_micro_batches=4" in n for n in more.notes)
    # the replica plan's note priced slots at each sequence's slowest piece: replaced
    notes = [n for n in base.notes if n.startswith("pipeline (")]
    assert len(notes) == 1 and "static CP over cp_size=4 GPUs a stage" in notes[0]


def test_extra_micro_batches_are_judged_by_the_pipeline_step():
    # One slot per replica leaves a 4-stage pipeline idle 3/4 of the step; more slots
    # shrink the bubble, which only the pipeline step (not the step without it) shows.
    # With fewer slots than stages the planner now tries the counts up to pp_size itself.
    from seqbalance.planning.cp_pipeline import as_pipeline

    lens = sb.workloads.lengths("long-mix", 64, seed=0)
    kw = dict(cost="qwen2.5-7b", cp_size=4, cp_cost={"bandwidth": 2.5e10})
    flat = sb.plan(lens, 2, 8192, **kw)  # without the pipeline: the fewest, one slot
    assert flat.num_micro_batches == 1
    fewest = as_pipeline(flat, CPPipelineSetup(check_pipeline(4))).simulate_pipeline()
    base = sb.plan(lens, 2, 8192, pp_size=4, **kw)
    more = sb.plan(lens, 2, 8192, pp_size=4, extra_micro_batches=3, **kw)
    assert 1 < base.num_micro_batches <= 4 and 1 < more.num_micro_batches
    assert base.simulate_pipeline().step_time < 0.8 * fewest.step_time
    assert more.simulate_pipeline().step_time < 0.8 * fewest.step_time
    said = f"pipeline: {base.num_micro_batches} micro-batches per replica instead of 1, the fewest"
    assert any(n.startswith(said) for n in base.notes), base.notes
    assert not any("extra_micro_batches" in n for n in base.notes)  # the caller passed none


def test_extra_counts_step_by_the_interleaved_multiple():
    # interleaved runs multiples of pp_size slots: extra_micro_batches=E tries the E next
    # multiples, so it is as fast as the best of the plans asked for those counts.
    lens = sb.workloads.lengths("long-mix", 64, seed=0)
    kw = dict(cost="qwen2.5-7b", cp_size=4, pp_size=2, schedule="interleaved",
              virtual_stages=2, cp_cost={"bandwidth": 2.5e10})  # fmt: skip
    base = sb.plan(lens, 2, 8192, **kw)
    m = base.num_micro_batches
    best = min(
        sb.plan(lens, 2, 8192, min_micro_batches=m + 2 * e, **kw).simulate_pipeline().step_time
        for e in range(4)
    )
    more = sb.plan(lens, 2, 8192, extra_micro_batches=3, **kw)
    assert more.num_micro_batches % 2 == 0
    assert more.simulate_pipeline().step_time <= best * (1 + 1e-12)


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_baseline_orders_move_slots_on_every_gpu_of_a_replica(order, sync):
    lens = _lens(7, 40, 9000)
    p = sb.plan(lens, 3, 8192, cost="qwen2.5-7b", cp_size=2, pp_size=2, sync=sync)
    q = sb.planning.baselines.reorder(p, order)
    assert isinstance(q, CPPlan) and q.strategy == f"seqbalance+{order}"
    assert not any(q.violations().values())
    before, after = p.replica_micro_batches(), q.replica_micro_batches()  # GPUs still agree
    perms = []
    for r in range(3):
        assert sorted(map(tuple, after[r])) == sorted(map(tuple, before[r]))
        perms.append([before[r].index(mb) for mb in after[r]])
    if sync == "fsdp":
        assert perms[0] == perms[1] == perms[2]  # slots stay aligned across replicas
    assert q.simulate_pipeline().step_time >= p.simulate_pipeline().step_time * (1 - 1e-12)
    if order == "largest-first":
        f, b, _ = slot_phases(q.pieces, q.lengths, q.cp_cost, 2)
        w = (f + b).max(axis=0, keepdims=True) if sync == "fsdp" else f + b
        assert (np.diff(w, axis=1) <= 1e-9 * w.max()).all()


def test_groups_and_rules_still_hold_per_replica_with_a_pipeline():
    lens = sb.workloads.lengths("rl-math", 64, seed=2)
    groups = np.arange(64) // 8  # GRPO: 8 responses a prompt, kept on one replica
    p = sb.plan(lens, 4, 16384, cp_size=2, pp_size=2, groups=groups, size="equal")
    assert not any(p.violations().values())
    held = [{int(groups[i]) for mb in r for i in mb} for r in p.replica_micro_batches()]
    assert sum(len(h) for h in held) == 8  # no group on two replicas
    assert {len([i for mb in r for i in mb]) for r in p.replica_micro_batches()} == {16}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cp": "dynamic"}, r"pp_size=2 needs cp='static' with cp_size > 1"),
        ({"order": "index"}, r"order= and sequences_per_micro_batch= cannot be combined"),
        ({"sequences_per_micro_batch": 2}, r"order= and sequences_per_micro_batch="),
        ({"schedule": "interleaved"}, r"schedule='interleaved' needs virtual_stages >= 2"),
        ({"pp_size": 1, "pp_comm": 1.0}, r"pp_comm=1.0 needs pp_size > 1"),
        ({"padded": True}, r"padded=True is not supported with cp_size > 1"),
    ],
)
def test_what_pipelines_with_cp_refuse(kwargs, match):
    args = {"cp_size": 2, "pp_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        sb.plan([100, 200, 300, 400], 1, 200, **args)


def test_plan_documents_with_a_pipeline_are_checked():
    d = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2, pp_size=2).to_dict()
    assert d["pipeline"] == {"pp_size": 2, "schedule": "1f1b", "virtual_stages": 1,
                             "comm_per_token": 0.0}  # fmt: skip
    assert CPPlan.from_dict(d).to_dict() == d
    bad = dict(d, pipeline={**d["pipeline"], "forward_costs": [1.0] * 8})
    with pytest.raises(ValueError, match=r"pipeline has keys \['forward_costs'\]"):
        CPPlan.from_dict(bad)
    odd = dict(d, pipeline={"pp_size": 3, "schedule": "interleaved", "virtual_stages": 2})
    if d["num_micro_batches"] % 3:
        with pytest.raises(ValueError, match="multiple of pp_size=3"):
            CPPlan.from_dict(odd)
    with pytest.raises(ValueError, match=r"pipeline: schedule must be one of"):
        CPPlan.from_dict(dict(d, pipeline={**d["pipeline"], "schedule": "zigzag"}))
    with pytest.raises(ValueError, match=r"pipeline.pp_size is 1"):
        CPPlan.from_dict(dict(d, pipeline={**d["pipeline"], "pp_size": 1}))
    dyn = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2, cp="dynamic").to_dict()
    with pytest.raises(ValueError, match="a pipeline needs cp='static'"):
        CPPlan.from_dict(dict(dyn, pipeline=d["pipeline"]))
    with pytest.raises(ValueError, match="this plan has no pipeline"):
        CPPlan.from_dict(dyn).simulate_pipeline()
    # a hand-made plan may carry a pipeline too
    p = CPPlan.from_dict(d)
    setup = CPPipelineSetup(p.pipeline.spec, 0.25)
    q = CPPlan(p.pieces, p.lengths, max_tokens=16, cp_size=2, cp="static",
               cp_cost=ContextParallelCost(QuadraticCost(1.0, 0.0)), pipeline=setup)  # fmt: skip
    assert q.simulate_pipeline().step_time > 0
    # two 2-GPU rings in one 4-GPU replica: its stage's GPUs would run different slots
    rings = [[[(0, 0, 4), (0, 12, 16)]], [[(0, 4, 12)]], [[(1, 0, 2), (1, 6, 8)]],
             [[(1, 2, 6)]]]  # fmt: skip
    with pytest.raises(ValueError, match="a pipeline needs static CP pieces: replica 0"):
        CPPlan(rings, [16, 8], max_tokens=16, cp_size=4, cp="static",
               cp_cost=ContextParallelCost(QuadraticCost(1.0, 0.0)), pipeline=setup)  # fmt: skip


def test_cli_plans_pipelines_with_static_cp(tmp_path, capsys):
    src = tmp_path / "lengths.txt"
    src.write_text("\n".join(str(x) for x in _lens(5, 60, 20000)) + "\n")
    out = tmp_path / "plan.json"
    argv = ["plan", str(src), "--dp", "2", "--max-tokens", "8192", "--cp-size", "4",
            "--cp", "static", "--pp-size", "2", "--model", "qwen2.5-7b", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "pipeline: 2 stages, 1f1b, simulated step" in err
    assert "static CP over --cp-size=4 GPUs a stage" in err
    p = sb.Plan.from_json(out.read_text())
    assert p.pipeline.spec.pp_size == 2 and json.loads(out.read_text())["cp"] == "static"
    assert main([*argv[:-2], "--cp", "dynamic"]) == 2
    assert "pass --cp static" in capsys.readouterr().err
    # a schedule without --pp-size would do nothing: refused, as without CP
    k = argv.index("--pp-size")
    no_pp = argv[:k] + argv[k + 2 : -2]
    assert main([*no_pp, "--schedule", "gpipe"]) == 2
    assert "--schedule only applies with --pp-size" in capsys.readouterr().err


def test_hand_made_pipelines_and_helpers_refuse_what_json_would():
    """A CPPipelineSetup built by hand took pp_size 1 or a NaN transfer cost, so its plan
    wrote JSON that Plan.from_json refused; the public helpers ran the ddp model for a
    misspelt sync and failed inside numpy for a cp_size that does not divide the GPUs."""

    p = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2, pp_size=2, sync="fsdp")
    with pytest.raises(ValueError, match=r"pipeline.pp_size is 1"):
        CPPipelineSetup(check_pipeline(1))
    for comm, why in ((float("nan"), "not finite"), (-1.0, "negative")):
        with pytest.raises(ValueError, match=rf"pipeline.comm_per_token\[0\] = .* is {why}"):
            CPPipelineSetup(check_pipeline(2), comm)
    with pytest.raises(ValueError, match="spec must be a PipelineSpec"):
        CPPipelineSetup({"pp_size": 2})
    setup = CPPipelineSetup(check_pipeline(2), np.float32(0.5))
    assert type(setup.comm_per_token) is float and setup.comm_per_token == 0.5
    q = CPPlan(p.pieces, p.lengths, max_tokens=16, cp_size=2, cp="static", cp_cost=p.cp_cost,
               pipeline=setup)  # fmt: skip
    assert sb.Plan.from_json(q.to_json()) == q
    for helper in (simulate_cp_pipeline, order_slots):
        with pytest.raises(ValueError, match=r"sync must be one of 'fsdp', 'ddp'; got 'FSDP'"):
            helper(p.pieces, p.lengths, p.cp_cost, 2, "FSDP", p.pipeline)
    with pytest.raises(ValueError, match="cp_size=3 does not divide the 4 GPUs"):
        slot_phases(p.pieces, p.lengths, p.cp_cost, 3)
    from seqbalance.planning.cp_pipeline import as_pipeline, baseline_order

    with pytest.raises(ValueError, match=r"sync must be one of 'fsdp', 'ddp'; got 'FSDP'"):
        baseline_order(p.pieces, p.lengths, p.cp_cost, 2, "FSDP", "light-ends")
    with pytest.raises(ValueError, match="plan must be a static CPPlan"):
        as_pipeline(sb.plan([30, 5, 9], 1, 64), setup)


def test_static_cp_pipelines_search_counts_once_from_the_fewest_the_rules_allow():
    """The replica plan searched the counts on its proxy costs and the CP plan again: the
    note said "per rank" and "instead of the fewest, 7" for a plan whose fewest was 3
    (min_micro_batches=3)."""
    lengths = [1080, 240, 960, 1120, 1000, 1920, 1400, 2600]
    kw = dict(cost="qwen2.5-7b", cp_size=2, cp="static", pp_size=8, allow_empty=True,
              cp_cost={"bandwidth": 2.5e10})  # fmt: skip
    p = sb.plan(lengths, 1, 3740, min_micro_batches=3, **kw)
    said = [n for n in p.notes if n.startswith("pipeline: ")]
    want = f"{p.num_micro_batches} micro-batches per replica instead of 3,"
    assert len(said) == 1 and want in said[0], p.notes
    assert not any("extra_micro_batches" in n for n in p.notes)
    fixed = sb.plan(lengths, 1, 3740, min_micro_batches=3, extra_micro_batches=5, **kw)
    assert p.simulate_pipeline().step_time <= fixed.simulate_pipeline().step_time * (1 + 1e-9)
