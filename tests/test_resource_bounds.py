"""Resource bounds: absurd requests are refused before work starts, and the searches that
could grow combinatorially stop on deterministic work budgets.

Regression tests for requests that ran for seconds or exhausted memory before they were
refused (or planned) assert the behaviour (a clear ValueError naming the argument, or a
valid plan), never the time: ``bench/bounds.py --reproducers`` measures time and peak memory,
each in a child process. A hypothesis test over option combinations checks the core
guarantees (coverage, caps, equal counts, determinism); the ``slow`` tier runs more
examples (``-m slow``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.partitioning import searches
from seqbalance.planning import limits
from seqbalance.planning.context_parallel import _place_groups
from seqbalance.planning.pipeline_orders import _move_count, _moves
from seqbalance.planning.planner import _deal_slots

L5 = [100, 200, 300, 50, 900]


def _valid(p, n, cap):
    """Coverage, the cap and equal counts, recomputed here."""
    assert sorted(i for r in p.micro_batches for mb in r for i in mb) == list(range(n))
    assert len({len(r) for r in p.micro_batches}) <= 1
    v = p.violations()
    assert v.get("missing", 0) == 0 and v.get("duplicated", 0) == 0
    assert v.get("over_capacity", 0) == 0
    assert v.get("unequal_counts", 0) == 0
    assert max((p.lengths[np.asarray(mb, dtype=np.int64)].sum() for r in p.micro_batches
                for mb in r if len(mb)), default=0) <= cap  # fmt: skip


# ---- refused before any allocation ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"dp_size": 10**9, "cp_size": 2, "cp": "dynamic"}, ["dp_size=1000000000", "dp_size"]),
        ({"dp_size": 10**6, "cp_size": 2, "cp": "dynamic"}, ["dp_size=1000000"]),
        ({"cp_size": 2, "cp": "dynamic", "min_micro_batches": 10**9}, ["min_micro_batches="]),
        (
            {"cp_size": 2, "cp": "dynamic", "micro_batch_multiple": 10**9, "allow_empty": True},
            ["micro_batch_multiple="],
        ),
        ({"dp_size": 10**9, "cp_size": 2}, ["static CP", "dp_size=1000000000"]),
        ({"pp_size": 16384}, ["pp_size = 16384", "pp_size"]),
        (
            {"pp_size": 16, "schedule": "interleaved", "virtual_stages": 32},
            ["pp_size x virtual_stages = 512"],
        ),
        ({"dp_size": 2**15, "cp_size": 2**14, "allow_empty": True}, ["GPUs"]),
        ({"dp_size": 2**12, "cp_size": 64, "allow_empty": True}, ["GPU slots", "cp_size x n"]),
        (
            {"dp_size": 64, "pp_size": 256, "min_micro_batches": 1024, "allow_empty": True},
            ["pipeline operations"],
        ),
    ],
)
def test_absurd_sizes_are_refused_naming_the_argument(kwargs, words):
    kw = {"dp_size": 2, **kwargs}
    dp = kw.pop("dp_size")
    with pytest.raises(ValueError) as info:
        sb.plan(L5, dp, 1000, **kw)
    for w in words:
        assert w in str(info.value)


def test_count_messages_name_the_argument_value_and_fix():
    with pytest.raises(ValueError) as info:
        sb.plan(L5, 1, 1000, extra_micro_batches=10**6)
    msg = str(info.value)
    assert "extra_micro_batches=1000000" in msg
    assert "pass extra_micro_batches near the real number (at most 65541 here)" in msg
    assert " a extra" not in msg
    with pytest.raises(ValueError) as info:
        sb.plan(L5, 2, 1000, min_micro_batches=60000, allow_empty=True)
    msg = str(info.value)
    assert "dp_size x micro-batches (2 x 60000)=120000" in msg
    assert "lower dp_size, min_micro_batches or micro_batch_multiple" in msg
    assert "pass a dp_size" not in msg


def test_limits_table_lists_every_limit():
    doc = limits.__doc__
    for text in ("n + 2**16", "2**20", "2**8", "2**22", "cp_size x n + 2**16", "2**14"):
        assert text in doc
    assert limits.MAX_PIPELINE_CHUNKS == 2**8 and limits.MAX_GPUS == 2**20


# ---- plans inside the limits: memory linear in what they return ----------------------


def test_many_empty_slots_plan_without_quadratic_memory():
    # One destination list per slot would hold m x (dp x m) entries here (11.6 GB).
    p = sb.plan(L5, 2, 1000, min_micro_batches=32768, allow_empty=True)
    assert p.num_micro_batches == 32768
    _valid(p, 5, 1000)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pp_size": 2, "min_micro_batches": 4096},
        {"pp_size": 8, "schedule": "interleaved", "virtual_stages": 4, "min_micro_batches": 4000},
    ],
)
def test_pipelines_with_thousands_of_micro_batches_plan(kwargs):
    # Every neighbour order at once would be 65,472 x 4,096 int64 here (2 GiB).
    p = sb.plan(L5, 2, 1000, allow_empty=True, **kwargs)
    assert p.num_micro_batches == kwargs["min_micro_batches"]
    _valid(p, 5, 1000)
    assert p.simulate_pipeline().step_time > 0


def test_move_count_matches_the_moves():
    for m in [*range(1, 40), 57, 100]:
        assert _move_count(m) == _moves(m).shape[0]
    assert _move_count(4000) == 16 * 4000 - 64  # counted without building them


# ---- clear errors --------------------------------------------------------------------


def test_empty_dynamic_cp_matches_static_cp():
    for cp in ("static", "dynamic"):
        with pytest.raises(ValueError) as info:
            sb.plan([], 2, 1000, cp_size=4, cp=cp)
        assert "allow_empty=True" in str(info.value)
        p = sb.plan([], 2, 1000, cp_size=4, cp=cp, allow_empty=True)
        assert p.cp == cp and p.num_micro_batches == 1
        assert p.violations()["empty"] == 8 and p.violations()["missing"] == 0


def test_rebalance_cost_mismatch_names_the_model():
    pytest.importorskip(
        "torch",
        reason="torch is not installed; install a CPU build with `pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu` to run this test",
    )
    from seqbalance.torch.agreement import canonical, describe_cost

    a = canonical(describe_cost("qwen2.5-7b"))
    b = canonical(describe_cost("llama-3-8b"))
    assert a != b
    assert a.startswith("flops cost 'qwen2.5-7b' (sha256:")
    assert b.startswith("flops cost 'llama-3-8b' (sha256:")
    # the name is read from compared fields: the same model described twice agrees
    assert canonical(describe_cost("qwen2.5-7b")) == a


def test_cost_json_with_a_huge_integer_names_the_file(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text('{"kind": "quadratic", "a": ' + "9" * 5001 + "}")
    with pytest.raises(ValueError) as info:
        sb.costs.load_cost(str(path))
    assert str(path) in str(info.value) and "4,300 digits" in str(info.value)
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": ' + "7" * 5001 + "}")
    with pytest.raises(ValueError) as info:
        sb.costs.load_cost(str(cfg))
    assert str(cfg) in str(info.value)


_MOE = {
    "model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_experts": 0}, ["'num_experts' = 0", "'num_experts_per_tok' = 2"]),
        ({"mlp_only_layers": [999, -1]}, ["'mlp_only_layers'", "999", "4 layers"]),
        (
            {"model_type": "deepseek_v3", "num_experts": None, "n_routed_experts": 8,
             "first_k_dense_replace": 10},
            ["'first_k_dense_replace' = 10", "'num_hidden_layers' = 4"],
        ),
    ],
)
def test_inconsistent_moe_configs_are_refused_naming_key_and_file(tmp_path, change, words):
    cfg = {k: v for k, v in {**_MOE, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for spec in (str(path), str(tmp_path)):
        with pytest.raises(ValueError) as info:
            sb.costs.load_cost(spec)
        for w in [*words, str(path)]:
            assert w in str(info.value)
    with pytest.raises(ValueError):  # a dict too, without a file to name
        sb.costs.FlopsCost.from_hf_config(cfg)
    # dense: no experts field at all, or zero experts and no routing, is fine
    dense = {k: v for k, v in _MOE.items() if "expert" not in k}
    sb.costs.FlopsCost.from_hf_config(dense)
    sb.costs.FlopsCost.from_hf_config({**dense, "num_experts": 0})


# ---- time cliffs: plans stay valid under the budgets ----------------------------------


def test_exact_work_pool_is_shared_and_deterministic():
    assert searches.take_nodes(10) == 10  # outside a pool
    with searches.exact_work_pool(100):
        assert searches.take_nodes(500) == 100
        with searches.exact_work_pool(10**9):  # nested: the outer pool
            searches.spend_nodes(60)
        assert searches.take_nodes(500) == 40 and searches.exact_searches_enabled()
        searches.spend_nodes(40)
        assert searches.take_nodes(500) == 0 and not searches.exact_searches_enabled()
    assert searches.exact_searches_enabled()


def test_grouped_ranks_with_extra_counts_stay_valid():
    # GRPO-like: groups of 4 over 16 ranks, extra counts, DDP, allow_empty, order="index"
    # Ranks of about 64 sequences each run exact searches at every count; the request's
    # pool of exact-search nodes bounds their sum (unbounded: 20 s).
    rng = np.random.default_rng(0)
    lens = rng.integers(64, 8000, 240)
    lens[rng.random(240) < 0.1] = 32768
    groups = np.repeat(np.arange(60), 4)
    kw = dict(groups=groups, extra_micro_batches=2, allow_empty=True, order="index",
              sync="ddp")  # fmt: skip
    p = sb.plan(lens, 16, 32768, **kw)
    assert sorted(i for r in p.micro_batches for mb in r for i in mb) == list(range(240))
    assert p.violations()["over_capacity"] == 0
    assert p.to_json() == sb.plan(lens, 16, 32768, **kw).to_json()


def test_many_tiny_micro_batches_under_cp_and_pp_stay_valid():
    p = sb.plan([94] * 200, 1, 16, cp_size=8, pp_size=8)
    assert p.num_micro_batches == 200
    assert p.violations()["over_capacity"] == 0 and p.violations()["missing"] == 0


def test_dynamic_cp_with_many_long_sequences_stays_valid():
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 8001, 300)
    lens[rng.random(300) < 0.1] = 8000
    p = sb.plan(lens, 1, 1000, cp_size=8, cp="dynamic", sync="ddp")
    v = p.violations()
    assert v["over_capacity"] == 0 and v["missing"] == 0 and v["duplicated"] == 0


def _place_groups_reference(req, deg):
    """The scalar loop :func:`_place_groups` replaced (the same choices, one by one)."""
    W, cap, lens = req.world, req.cap, req.lens
    longs = np.flatnonzero(deg >= 2)
    t_long = np.array([req.tables[int(deg[i])][0][i] for i in longs.tolist()])
    groups, used, level = [], [], []
    for k in np.lexsort((longs, -t_long)).tolist():
        i, d = int(longs[k]), int(deg[longs[k]])
        best, best_head = None, -1.0
        for g in groups:
            if g.d < d or 2 * g.d > lens[i]:
                continue
            head = level[g.slot] - g.time - float(req.tables[g.d][0][i])
            if head >= 0 and g.tok + int(req.tables[g.d][2][i]) <= cap and head > best_head:
                best, best_head = g, head
        if best is None:
            j = next((j for j in range(len(used)) if used[j] + d <= W), len(used))
            if j == len(used):
                used.append(0)
                level.append(0.0)
            best = type("G", (), {})()
            best.d, best.slot, best.seqs, best.time, best.tok = d, j, [], 0.0, 0
            groups.append(best)
            used[j] += d
        best.seqs.append(i)
        best.time += float(req.tables[best.d][0][i])
        best.tok += int(req.tables[best.d][2][i])
        level[best.slot] = max(level[best.slot], best.time)
    return [(g.d, g.slot, g.seqs) for g in groups], used, level


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=60),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([2, 4, 8]),
    st.integers(0, 3),
)
def test_group_placement_matches_the_scalar_loop(lens, dp, cp, raise_by):
    from seqbalance.planning.context_parallel import _degrees_for, _validate

    cap = 700
    lens = [min(x, cap * cp) for x in lens]
    req = _validate(lens, dp, cap, cp, "dynamic", None, None, "fsdp", 1, 1, True)
    t_top = float(max(req.tables[int(d)][0][i] for i, d in enumerate(req.d_min.tolist())))
    deg = _degrees_for(req, t_top / 2**raise_by if raise_by else float("inf"))
    groups, used, level = _place_groups(req, deg)
    ref = _place_groups_reference(req, deg)
    assert [(g.d, g.slot, g.seqs) for g in groups] == ref[0]
    assert used == ref[1] and level == ref[2]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.data())
def test_dealing_costless_slots_at_once_matches_the_loop(dp, m, data):
    cost = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.5, 3.0]),
                                       min_size=dp * m, max_size=dp * m)))  # fmt: skip
    bins = [[i] for i in range(dp * m)]
    order = np.lexsort((np.arange(cost.size), -cost))
    ranks = [[] for _ in range(dp)]
    load = np.zeros(dp)
    for j in range(m):
        lightest = np.lexsort((np.arange(dp), load))
        for r, b in zip(lightest.tolist(), order[j * dp : (j + 1) * dp].tolist()):
            ranks[r].append(bins[b])
            load[r] += cost[b]
    assert _deal_slots(bins, cost, dp, m) == ranks


# ---- option combinations: the guarantees hold, plans are deterministic ----------------


@st.composite
def requests(draw, n_max=40):
    n = draw(st.integers(0, n_max))
    lens = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    dp = draw(st.integers(1, 4))
    cap = max(lens, default=1) * draw(st.sampled_from([1, 2, 3])) or 1
    kw: dict = {"sync": draw(st.sampled_from(["fsdp", "ddp"]))}
    kw["allow_empty"] = draw(st.booleans())
    kw["min_micro_batches"] = draw(st.integers(1, 4))
    mesh = draw(st.sampled_from(["plain", "pp", "static", "dynamic", "static+pp"]))
    if "pp" in mesh:
        kw["pp_size"] = draw(st.sampled_from([2, 3, 4]))
        if draw(st.booleans()):
            kw.update(schedule="interleaved", virtual_stages=2)
    if mesh in ("static", "dynamic", "static+pp"):
        kw["cp_size"] = draw(st.sampled_from([2, 4]))
        kw["cp"] = "dynamic" if mesh == "dynamic" else "static"
    if mesh != "dynamic":
        if draw(st.booleans()):
            kw["extra_micro_batches"] = draw(st.integers(1, 2))
        rule = draw(st.sampled_from(["none", "groups", "equal", "alone"]))
        if rule == "groups" and n:
            kw["groups"] = [i // 3 for i in range(n)]
        elif rule == "equal":
            kw["size"] = "equal"
        elif rule == "alone":
            kw["oversized"] = "alone"
            cap = max(cap // 2, 1)
    return lens, dp, cap, kw


def _check_request(lens, dp, cap, kw):
    try:
        p = sb.plan(lens, dp, cap, **kw)
    except ValueError as exc:
        with pytest.raises(ValueError) as again:  # a refusal, the same every time
            sb.plan(lens, dp, cap, **kw)
        assert str(exc) and str(again.value) == str(exc)
        return
    n = len(lens)
    v = p.violations()
    assert v.get("missing", 0) == 0 and v.get("duplicated", 0) == 0
    assert v.get("unequal_counts", 0) == 0
    over = v.get("over_capacity", 0)
    assert over == 0 or kw.get("oversized") == "alone"
    if not kw.get("allow_empty"):
        assert v.get("empty", 0) == 0
    if getattr(p, "cp_size", 1) == 1:
        assert sorted(i for r in p.micro_batches for mb in r for i in mb) == list(range(n))
    assert p.to_json() == sb.plan(lens, dp, cap, **kw).to_json()  # deterministic


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_option_combinations_keep_the_guarantees(req):
    _check_request(*req)


def _slow_tier_selected() -> bool:
    """Whether the run selects the slow tier (``-m slow``; the default run skips it)."""
    args = sys.argv
    return any(a == "-m" and i + 1 < len(args) and "slow" in args[i + 1]
               and "not slow" not in args[i + 1] for i, a in enumerate(args)) or any(
        a.startswith("-m") and a != "-m" and "slow" in a and "not slow" not in a
        for a in args)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not _slow_tier_selected(), reason="slow tier: run with -m slow")
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests(n_max=120))
def test_option_combinations_keep_the_guarantees_slow_tier(req):
    _check_request(*req)


def test_plans_agree_across_processes():
    rng = np.random.default_rng(3)
    lens = rng.integers(1, 4000, 48).tolist()
    kw = {"cp_size": 2, "pp_size": 2, "sync": "ddp", "extra_micro_batches": 1}
    code = (
        "import json, sys, seqbalance as sb; a = json.loads(sys.argv[1]); "
        "print(sb.plan(a['lens'], 3, 4000, **a['kw']).to_json())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    arg = json.dumps({"lens": lens, "kw": kw})
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True,
                         check=True, env=env).stdout.strip()  # fmt: skip
    assert out == sb.plan(lens, 3, 4000, **kw).to_json()


# ---- the same limits through the sampler and the CLI ---------------------------------


@pytest.mark.parametrize(
    ("options", "word"),
    [({"pp_size": 16384}, "pp_size"), ({"min_micro_batches": 10**9}, "min_micro_batches=")],
)
def test_sampler_refuses_absurd_options_when_built(options, word):
    pytest.importorskip("torch")
    from seqbalance.torch import BalancedDistributedSampler

    with pytest.raises(ValueError) as info:
        BalancedDistributedSampler(L5 * 4, 20, 1000, num_replicas=2, rank=0, shuffle=False,
                                   check_ranks=False, **options)  # fmt: skip
    assert word in str(info.value)


@pytest.mark.parametrize(
    ("flags", "word"),
    [(["--dp", "1000000000"], "--dp"), (["--dp", "2", "--pp-size", "16384"], "--pp-size")],
)
def test_cli_refuses_absurd_sizes_naming_the_flag(tmp_path, capsys, flags, word):
    from seqbalance.cli import main

    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(map(str, L5)) + "\n")
    assert main(["plan", str(f), "--max-tokens", "1000", *flags]) == 2
    err = capsys.readouterr().err
    assert word in err and "error" in err


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.sampled_from(["1f1b", "gpipe", "interleaved"]),
       st.integers(1, 12), st.integers(1, 3), st.booleans(), st.integers(0, 2**16))
def test_pipeline_simulation_node_by_node_matches_the_level_passes(p, schedule, k, rows, comm,
                                                                    seed):  # fmt: skip
    from seqbalance.planning import pipeline

    v = 2 if schedule == "interleaved" else 1
    m = k * (p if schedule == "interleaved" else 1)
    g = pipeline.graph(pipeline.PipelineSpec(p, schedule, v), m)
    rng = np.random.default_rng(seed)
    f, b = rng.random((rows, m)) * 1e3, rng.random((rows, m)) * 2e3
    c = rng.random((rows, m)) if comm else None
    saved = pipeline._SCALAR_RATIO
    try:
        pipeline._SCALAR_RATIO = 0
        by_level = g._run(f, b, c)[1]
        pipeline._SCALAR_RATIO = 2**40
        by_node = g._run(f, b, c)[1]
    finally:
        pipeline._SCALAR_RATIO = saved
    assert np.array_equal(by_level, by_node)


# ---- pipeline searches: cheaper simulations, work budgets -----------------------------


def _moves_by_loop(m):
    """The neighbour moves as a loop over pairs builds them (the specification)."""
    base = np.arange(m)
    full, ends, out = m <= 24, {0, 1, m - 2, m - 1}, []
    for i in range(m):
        for j in range(i + 1, m):
            if full or j - i <= 4 or i in ends or j in ends:
                q = base.copy()
                q[i], q[j] = q[j], q[i]
                out.append(q)
    for i in range(m):
        for j in range(m):
            if abs(i - j) >= 2 and (full or i in ends or j in ends):
                out.append(np.insert(np.delete(base, i), j, i))
    return np.asarray(out, dtype=np.int64).reshape(-1, m)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 24, 25, 40])
def test_moves_match_the_loop(m):
    got = _moves(m)
    assert np.array_equal(got, _moves_by_loop(m))
    assert not got.flags.writeable  # cached: shared by every search of this count


def _stage_orders_by_loop(p, m, schedule, v):
    """Every stage's operations as the schedules' descriptions list them."""
    out = []
    for s in range(p):
        if schedule == "gpipe":
            ops = [(0, i, 0) for i in range(m)] + [(1, i, 0) for i in range(m)]
        elif schedule == "1f1b":
            w = min(p - s - 1, m)
            ops = [(0, i, 0) for i in range(w)]
            for k in range(m - w):
                ops += [(0, w + k, 0), (1, k, 0)]
            ops += [(1, i, 0) for i in range(m - w, m)]
        else:
            total = m * v

            def fwd(k):
                return (0, (k // (p * v)) * p + k % p, (k // p) % v)

            def bwd(k):
                return (1, (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

            w = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
            ops = [fwd(k) for k in range(w)]
            for k in range(total - w):
                ops += [fwd(w + k), bwd(k)]
            ops += [bwd(k) for k in range(total - w, total)]
        out.append(ops)
    return out


@pytest.mark.parametrize(
    ("p", "schedule", "v", "m"),
    [(1, "1f1b", 1, 3), (3, "1f1b", 1, 2), (4, "1f1b", 1, 9), (3, "gpipe", 1, 5),
     (2, "interleaved", 2, 2), (2, "interleaved", 4, 6), (4, "interleaved", 3, 8),
     (1, "interleaved", 2, 3)],
)  # fmt: skip
def test_pipeline_graph_built_with_arrays_matches_the_schedules(p, schedule, v, m):
    from seqbalance.planning.pipeline import PipelineGraph, check_pipeline, stage_orders

    want = _stage_orders_by_loop(p, m, schedule, v)
    assert stage_orders(p, m, schedule, v) == want
    g = PipelineGraph(check_pipeline(p, schedule, v), m)
    node = {}
    for s, ops in enumerate(want):
        for ph, i, c in ops:
            node[(ph, i, c, s)] = len(node)
    n = len(node)
    for (ph, i, c, s), k in node.items():
        if ph == 0:
            src = (0, i, c, s - 1) if s else ((0, i, c - 1, p - 1) if c else None)
        elif s == p - 1 and c == v - 1:
            src = (0, i, c, s)
        else:
            src = (1, i, c, s + 1) if s < p - 1 else (1, i, c + 1, 0)
        assert g.dep[k] == (n if src is None else node[src])
        assert g.cross[k] == (src is not None and src[3] != s)
        assert g.prev[k] == (k - 1 if k % (2 * m * v) else n)
    # every level's nodes depend only on earlier levels
    level = np.empty(n, dtype=np.int64)
    for d, nodes in enumerate(g.levels):
        level[nodes] = d
    for k in range(n):
        for q in (g.prev[k], g.dep[k]):
            assert q == n or level[q] < level[k]


@pytest.mark.parametrize(("p", "schedule", "v"), [(2, "1f1b", 1), (4, "gpipe", 1),
                                                  (3, "interleaved", 2), (2, "interleaved", 4)])
@pytest.mark.parametrize("m", [2, 3, 6, 12])
def test_window_term_matches_the_matrix_product(p, schedule, v, m):
    from seqbalance.planning.pipeline import _stage_orders, _window_term, _windows, check_pipeline

    if m % p and schedule == "interleaved":
        pytest.skip("interleaved needs a multiple of pp_size")
    spec = check_pipeline(p, schedule, v)
    # the counts by definition: operations of position j' outside j's window on stage 0
    ops = _stage_orders(p, m, schedule, v)[0]
    first = {i: t for t, (ph, i, c) in enumerate(ops) if ph == 0 and c == 0}
    last = {i: t for t, (ph, i, c) in enumerate(ops) if ph == 1 and c == 0}
    alpha, beta = _windows(spec, m)
    for ph, table in ((0, alpha), (1, beta)):
        counts = np.zeros((m, m))
        for j in range(m):
            for t, (q, i, _) in enumerate(ops):
                if q == ph and i != j and (t < first[j] or t > last[j]):
                    counts[j, i] += 1
        assert np.array_equal(table, -np.sort(-counts, axis=1)[:, : m - 1])
    rng = np.random.default_rng(m)
    f, b = rng.uniform(0.1, 5.0, m), rng.uniform(0.1, 9.0, m)
    trips = p * (f + b)
    keep = ~np.eye(m, dtype=bool)

    def others(x):
        return np.sort(np.broadcast_to(x, (m, m))[keep].reshape(m, m - 1), axis=1)

    want = float(np.max(trips + (others(f) @ alpha.T + others(b) @ beta.T).min(axis=1)))
    assert _window_term(trips, f, b, (alpha, beta)) == pytest.approx(want, rel=1e-12)


def test_order_search_pool_is_shared_and_deterministic():
    from seqbalance.planning import pipeline_orders as po
    from seqbalance.planning.pipeline import check_pipeline

    rng = np.random.default_rng(3)
    f = rng.uniform(1, 10, (6, 30))
    b = 2 * f + rng.uniform(0, 1, (6, 30))
    spec = check_pipeline(4, "1f1b")
    alone = po.best_orders(f, b, None, spec)
    starts = po.best_orders(f, b, None, spec, exact_limit=0, budget=0)
    with po.search_pool(0):  # nothing to spend: the best starting orders
        spent = po.best_orders(f, b, None, spec)
    assert np.array_equal(spent[0], starts[0]) and np.array_equal(spent[1], starts[1])
    with po.search_pool(po.BUDGET):
        first = po.best_orders(f, b, None, spec)
        assert po._POOL.get()[0] < po.BUDGET  # the search took its work out of the pool
        with po.search_pool(1):  # a nested block shares the outer pool
            assert po._POOL.get()[0] > 1
    assert np.array_equal(first[0], alone[0])  # the pool held the search's own budget
    assert np.all(alone[1] <= starts[1])


def test_exhaustive_order_search_of_many_replicas_keeps_its_budget():
    from seqbalance.planning import pipeline_orders as po
    from seqbalance.planning.pipeline import check_pipeline, graph

    rng = np.random.default_rng(4)
    r, m = 64, 7  # 64 replicas x 7! orders: far beyond one budget
    f = rng.uniform(1, 10, (r, m))
    b = 2 * f
    spec = check_pipeline(4, "1f1b")
    per = 5040 * graph(spec, m).n_nodes
    budget = 3 * per
    with po.search_pool(10**12):
        orders, times = po.best_orders(f, b, None, spec, budget=budget)
        assert 10**12 - po._POOL.get()[0] <= budget
    for row, o, t in zip(range(r), orders, times):
        assert sorted(o.tolist()) == list(range(m))
        assert t == pytest.approx(float(graph(spec, m).step_times(f[row][o], b[row][o])[0]))


def test_remembered_step_times_match_a_fresh_simulation():
    from seqbalance.planning.pipeline import PipelineGraph, check_pipeline, graph

    spec = check_pipeline(2, "1f1b")
    m = 6000  # 24,000 operations: step times of a few orders are remembered
    g = graph(spec, m)
    rng = np.random.default_rng(5)
    f = rng.uniform(0, 3, (3, m))
    b = 2 * f
    c = np.zeros((3, m))
    first = g.step_times(f, b, None)
    again = g.step_times(f[::-1], b[::-1], c)  # zeros run as no transfer time
    fresh = PipelineGraph(spec, m).step_times(f, b, None)
    assert np.array_equal(first, fresh) and np.array_equal(again, first[::-1])
    c[1] = 0.5
    with_comm = g.step_times(f, b, c)
    assert with_comm[1] > first[1] and with_comm[0] == first[0]


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_static_cp_slot_phases_from_the_sequence_table_match_the_pieces(sync):
    from seqbalance.planning.context_parallel import (
        _replica_phases,
        _replica_pieces,
        _static_base,
        _validate,
    )
    from seqbalance.planning.cp_pipeline import slot_phases

    rng = np.random.default_rng(6)
    lens = rng.integers(1, 9000, 60)
    from seqbalance.planning.planner import _plan_replicas

    req = _validate(lens, 2, 4096, 4, "static", "qwen2.5-7b", None, sync, 1, 1, False, True,
                    {}, {"pp_size": 2, "schedule": "1f1b", "virtual_stages": 1,
                         "pp_comm": 0.001}, _plan_replicas)  # fmt: skip
    base = _static_base(req)
    got = _replica_phases(req, base)
    want = slot_phases(_replica_pieces(req, base), req.lens, req.cpc, 4,
                       req.pp.comm_per_token)  # fmt: skip
    for a, b in zip(got, want):
        assert np.allclose(a, b, rtol=1e-12, atol=0)


def test_wide_static_cp_pipeline_with_extra_counts_stays_valid_and_deterministic():
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 235931, 300)
    kw = dict(cp_size=32, pp_size=2, schedule="interleaved", virtual_stages=4,
              extra_micro_batches=2)  # fmt: skip
    p = sb.plan(lens, 3, 8192, **kw)
    assert p.violations().get("missing", 0) == 0 and p.violations().get("duplicated", 0) == 0
    assert p.num_micro_batches % 2 == 0
    assert json.dumps(p.to_dict()) == json.dumps(sb.plan(lens, 3, 8192, **kw).to_dict())
    flat = sb.plan(lens, 3, 8192, cp_size=32).simulate().step_time  # never below its bound
    assert p.simulate_pipeline().step_time > 0 and flat > 0


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_slot_groups_match_union_find(seed):
    """The vectorised components of GPUs sharing a sequence in a slot: the smallest GPU of
    each, as a union-find over the shared pairs gives it."""
    from seqbalance.planning.cp_plans import _slot_groups

    rng = np.random.default_rng(seed)
    world, m = int(rng.integers(1, 12)), int(rng.integers(1, 5))
    pieces = [[[] for _ in range(m)] for _ in range(world)]
    for i in range(int(rng.integers(0, 20))):
        j = int(rng.integers(0, m))
        for g in rng.choice(world, int(rng.integers(1, world + 1)), replace=False).tolist():
            pieces[g][j].append((i, 0, 1))
    got = _slot_groups(pieces, world, m)
    for j in range(m):
        parent = list(range(world))

        def find(x, parent=parent):
            while parent[x] != x:
                x = parent[x]
            return x

        for i in {p[0] for g in range(world) for p in pieces[g][j]}:
            holders = [g for g in range(world) if any(p[0] == i for p in pieces[g][j])]
            for a, b in zip(holders, holders[1:]):
                ra, rb = find(a), find(b)
                parent[max(ra, rb)] = min(ra, rb)
        assert got[j].tolist() == [find(g) for g in range(world)]


def test_replica_plans_remembered_within_a_request_only(monkeypatch):
    """plan() plans a pipelined static CP request again without its extra counts; the
    replica plans made the first time are reused then, never by a later request."""
    import seqbalance.planning._work as _work
    import seqbalance.planning.context_parallel as cpm

    rng = np.random.default_rng(7)
    lens = rng.integers(1, 30000, 120)
    kw = dict(cp_size=4, pp_size=2, extra_micro_batches=1, sync="ddp")
    first = json.dumps(sb.plan(lens, 2, 8192, **kw).to_dict())
    second = json.dumps(sb.plan(lens, 2, 8192, **kw).to_dict())
    monkeypatch.setattr(cpm, "remembered", lambda key, make: make())
    fresh = json.dumps(sb.plan(lens, 2, 8192, **kw).to_dict())
    assert first == second == fresh
    assert _work._MEMO.get() is None  # nothing is kept once the request returns


@pytest.mark.parametrize("kw", [dict(cp_size=4), dict(cp_size=4, pp_size=2, sync="ddp"),
                                dict(cp_size=8, pp_size=2, extra_micro_batches=1),
                                dict(cp_size=32, cp="dynamic", allow_empty=True)])  # fmt: skip
def test_cp_plans_list_the_sequences_their_pieces_hold(kw):
    """The per-GPU sequence lists a CP plan is built with match its pieces."""
    rng = np.random.default_rng(8)
    lens = rng.integers(0, 30000, 150)
    p = sb.plan(lens, 2, 16384, **kw)
    assert p.micro_batches == [[sorted({q[0] for q in slot}) for slot in gpu] for gpu in p.pieces]


# ---- the request's work meter: extra counts, baselines, dynamic CP candidates ----------


def test_extra_counts_stop_at_the_count_budget_with_a_note(monkeypatch):
    from seqbalance.planning import _work

    rng = np.random.default_rng(3)
    lens = rng.integers(1, 4000, 300)
    full = sb.plan(lens, 4, 8192, extra_micro_batches=3)
    monkeypatch.setattr(_work, "COUNT_WORK", 0)  # spent after the first count
    cut = sb.plan(lens, 4, 8192, extra_micro_batches=3)
    _valid(cut, 300, 8192)
    assert any("were not planned" in n for n in cut.notes)
    assert cut.to_json() == sb.plan(lens, 4, 8192, extra_micro_batches=3).to_json()
    # never slower than the fewest count's plan (planned again, as without the budget)
    fewest = sb.plan(lens, 4, 8192)
    assert cut.simulate().step_time <= fewest.simulate().step_time * (1 + 1e-9)
    assert not any("were not planned" in n for n in full.notes)


def test_plans_within_the_budgets_are_the_plans_without_them(monkeypatch):
    from seqbalance.planning import _work
    from seqbalance.planning import context_parallel as cp_mod

    rng = np.random.default_rng(4)
    lens = rng.integers(1, 6000, 200)
    requests = [
        dict(extra_micro_batches=2),
        dict(pp_size=4, extra_micro_batches=1),
        dict(cp_size=4, cp="dynamic"),
        dict(cp_size=2, extra_micro_batches=2),
    ]
    before = [sb.plan(lens, 4, 8192, **kw).to_json() for kw in requests]
    monkeypatch.setattr(_work, "COUNT_WORK", 10**12)
    monkeypatch.setattr(_work, "CANDIDATE_WORK", 10**12)
    monkeypatch.setattr(cp_mod, "DYNAMIC_WORK", 10**12)
    assert [sb.plan(lens, 4, 8192, **kw).to_json() for kw in requests] == before


def test_pipelined_baselines_stay_candidates_past_the_candidate_budget(monkeypatch):
    from seqbalance.planning import _work

    rng = np.random.default_rng(5)
    lens = rng.integers(1, 3000, 120)
    monkeypatch.setattr(_work, "CANDIDATE_WORK", 0)
    p = sb.plan(lens, 2, 4096, pp_size=4, extra_micro_batches=2)
    _valid(p, 120, 4096)
    assert p.to_json() == sb.plan(lens, 2, 4096, pp_size=4, extra_micro_batches=2).to_json()


def test_dynamic_cp_candidates_stop_at_their_budget(monkeypatch):
    from seqbalance.planning import context_parallel as cp_mod

    rng = np.random.default_rng(6)
    lens = rng.integers(1, 4000, 300)
    monkeypatch.setattr(cp_mod, "DYNAMIC_WORK", 0)  # the first candidate only
    p = sb.plan(lens, 2, 1024, cp_size=8, cp="dynamic", allow_empty=True)
    v = p.violations()
    assert v["over_capacity"] == 0 and v["missing"] == 0 and v["duplicated"] == 0
    assert any("DYNAMIC_WORK" in n for n in p.notes)
    q = sb.plan(lens, 2, 1024, cp_size=8, cp="dynamic", allow_empty=True)
    assert p.to_json() == q.to_json()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=14),
       st.integers(0, 7), st.integers(0, 14))
def test_pair_resplit_from_the_subset_table_matches_the_bit_product(w, lo, hi):
    from seqbalance.planning._ranks import _best_split

    w = np.asarray(w)
    k = w.size
    masks = np.arange(1 << k, dtype=np.int64)
    bits = (masks[:, None] >> np.arange(k)) & 1  # the integer rows, product cast by numpy
    side, cnt = bits @ w, bits.sum(axis=1)
    ok = (cnt >= lo) & (cnt <= hi) & (k - cnt >= lo) & (k - cnt <= hi)
    heavier = np.where(ok, np.maximum(side, w.sum() - side), np.inf)
    best = int(np.argmin(heavier))
    want = None if not np.isfinite(heavier[best]) else bits[best].astype(bool)
    got = _best_split(w, lo, hi)
    assert (got is None) == (want is None)
    if want is not None:
        assert np.array_equal(got, want)


# A small pipelined request's rank costs (the H100 fit of bench/results/gpu_step_h100.json
# on 29 lengths): floats, on which the heaviest-part searches rarely prove the optimum
# and used to spend their whole budgets (seconds) inside every plan.
_FLOAT_UNITS = [5.37e-3 + 7.641e-5 * x + 1.296e-9 * x * x for x in (
    0, 98, 0, 0, 616, 58, 0, 781, 822, 120, 878, 619, 917, 428, 202, 804, 0, 177, 598, 279,
    482, 231, 537, 487, 994, 560, 59, 0, 0)]  # fmt: skip


def test_heaviest_part_searches_draw_from_the_request_pool(monkeypatch):
    from seqbalance.partitioning import _heaviest
    from seqbalance.partitioning.kway import HEAVIEST_UNITS_PER_NODE

    spent: list[int] = []
    spend = _heaviest._Search.spend
    monkeypatch.setattr(_heaviest._Search, "spend",
                        lambda self, n: (spent.append(n), spend(self, n))[1])  # fmt: skip
    pool = 2_000
    with searches.exact_work_pool(pool):
        inside = sb.partition(_FLOAT_UNITS, 8)
        assert searches.nodes_left() <= 0
    assert sum(spent) <= pool * HEAVIEST_UNITS_PER_NODE + max(spent)
    spent.clear()
    outside = sb.partition(_FLOAT_UNITS, 8)  # no pool: each search's own budget
    assert sum(spent) > 10 * pool * HEAVIEST_UNITS_PER_NODE
    assert outside.max_load <= inside.max_load
    assert sorted(i for part in inside for i in part) == list(range(len(_FLOAT_UNITS)))


def test_count_search_by_the_step_stops_at_the_count_budget_with_a_note(monkeypatch):
    """With a per-micro-batch cost the default plans larger counts by the step, within the
    request's budget for counts beyond the first (COUNT_WORK), as every count search."""
    from seqbalance.costs import QuadraticCost
    from seqbalance.planning import _work

    # (seed 2: one micro-batch more than the fewest is more than the stop gap shorter)
    lens = sb.workloads.load("rl-math", 1024, seed=2).lengths
    cost = QuadraticCost(per_token=7.64e-5, per_token_sq=1.296e-9, per_sequence=5.37e-3,
                         per_microbatch=9.76e-3)  # fmt: skip
    full = sb.plan(lens, 8, 32768, cost=cost)
    monkeypatch.setattr(_work, "COUNT_WORK", 0)  # spent by the fewest count
    cut = sb.plan(lens, 8, 32768, cost=cost)
    _valid(cut, len(lens), 32768)
    fewest = sb.plan(lens, 8, 32768, cost=cost, effort="thorough")
    assert full.num_micro_batches > cut.num_micro_batches == fewest.num_micro_batches
    assert any("were not planned" in n for n in cut.notes)
    assert not any("were not planned" in n for n in full.notes)
