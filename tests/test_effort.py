"""plan(effort=): the work budget of one planning request.

Properties at every effort (every index once, the capacity held, equal counts, the same plan
on every call); ``"thorough"`` is the full search, pinned on samples to the plans it made
before the budgets existed; the default is never more than its stop gap behind a baseline
with as many micro-batches, and within 0.1% of the full search on the standard workloads;
with a per-micro-batch cost the default never picks a count slower than the fewest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_capacity_bounds import _set_partitions

import seqbalance as sb
from seqbalance import workloads
from seqbalance.costs import QuadraticCost
from seqbalance.partitioning.searches import exact_searches
from seqbalance.planning import planner
from seqbalance.planning._effort import EFFORTS, effort_of, exact_pool
from seqbalance.planning._exact import NODE_LIMIT
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.bounds import capacity_step_bound
from seqbalance.planning.limits import EXACT_NODES_PER_REQUEST

_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def requests(draw: st.DrawFn) -> dict:
    n = draw(st.integers(0, 60))
    cap = draw(st.integers(50, 2000))
    lengths = draw(st.lists(st.integers(0, cap), min_size=n, max_size=n))
    dp = draw(st.integers(1, 6))
    sync = draw(st.sampled_from(["fsdp", "ddp"]))
    squared = draw(st.booleans())
    costs = None if not squared else [x + x * x / 500.0 for x in lengths]
    return {"lengths": lengths, "dp_size": dp, "max_tokens": cap, "sync": sync,
            "cost": costs, "allow_empty": True}  # fmt: skip


def _check(p: sb.Plan, n: int, cap: int) -> None:
    seen = sorted(i for rank in p.micro_batches for mb in rank for i in mb)
    assert seen == list(range(n))  # every index exactly once
    assert len({len(rank) for rank in p.micro_batches}) <= 1  # equal counts
    lens = np.asarray(p.lengths)
    for rank in p.micro_batches:
        for mb in rank:
            assert int(lens[mb].sum()) <= cap


@_SETTINGS
@given(req=requests(), effort=st.sampled_from(EFFORTS))
def test_every_effort_plans_validly_and_deterministically(req: dict, effort: str) -> None:
    p = sb.plan(**req, effort=effort)
    _check(p, len(req["lengths"]), req["max_tokens"])
    assert sb.plan(**req, effort=effort).to_json() == p.to_json()


@_SETTINGS
@given(req=requests())
def test_default_is_never_behind_a_baseline_by_more_than_its_stop_gap(req: dict) -> None:
    """Either the plan is within the stop gap of the step bound (no plan beats it by more)
    or the baselines ran as candidates: against every baseline that keeps the capacity, has
    no empty micro-batch and as many micro-batches, the step is then no longer at all."""
    req = {**req, "allow_empty": False}
    n, dp = len(req["lengths"]), req["dp_size"]
    if n < dp:
        return
    try:
        p = sb.plan(**req)
    except ValueError:
        return
    gap = effort_of("default").stop_gap
    step = p.simulate().step_time
    lens = np.asarray(req["lengths"], dtype=np.int64)
    costs = lens.astype(np.float64) if req["cost"] is None else np.asarray(req["cost"])
    bound = capacity_step_bound(costs, lens, dp, req["max_tokens"], sync=req["sync"],
                                min_micro_batches_given=p.num_micro_batches)  # fmt: skip
    within = step <= bound * (1 + gap) * (1 + 1e-12)
    for name, fn in BASELINES.items():
        b = fn(req["lengths"], dp, req["max_tokens"], cost=req["cost"], sync=req["sync"])
        v = b.violations()
        if v["over_capacity"] or v["empty"] or b.num_micro_batches != p.num_micro_batches:
            continue
        assert step <= b.simulate().step_time * (1 + (gap if within else 0.0)) * (1 + 1e-12), name


def test_effort_is_validated_by_name() -> None:
    for bad in ("Default", "slow", None, 1):
        with pytest.raises(ValueError, match="effort must be one of"):
            sb.plan([5, 3, 2], 1, 10, effort=bad)


def test_effort_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        sb.plan([5, 3, 2], 1, 10, None, "fsdp")  # type: ignore[misc]


def _pin(p: sb.Plan) -> str:
    return hashlib.sha256(json.dumps([p.micro_batches, list(p.notes)]).encode()).hexdigest()[:16]


_QWEN = "qwen2.5-7b"


@pytest.mark.parametrize(
    ("name", "n", "dp", "sync", "options", "pin"),
    [
        ("rl-math", 256, 8, "fsdp", {}, "72488c9cdcce6803"),
        ("sft-chat", 200, 4, "ddp", {}, "c7ba2a67af18caa5"),
        ("long-context", 64, 8, "fsdp", {}, "4fa5dc1c02b9e1af"),
        ("rl-math", 128, 4, "fsdp", {"groups": True}, "8ab88c5072608dd1"),
        ("uniform", 304, 8, "ddp", {"size": "equal"}, "9407933d8940acc4"),
        ("long-mix", 48, 8, "ddp", {}, "4d17b9641a37c01e"),
        ("long-context", 96, 4, "fsdp", {"cp_size": 4, "cp": "dynamic"}, "60b3e7812f982e1f"),
        ("long-context", 96, 4, "fsdp", {"cp_size": 4, "cp": "static"}, "31395829b6e0cde1"),
    ],
)
def test_thorough_reproduces_the_full_search(name, n, dp, sync, options, pin) -> None:
    """The micro-batches and notes of the plans made before effort existed (their hashes,
    taken then), reproduced by effort="thorough"."""
    w = workloads.load(name, n, seed=0)
    options = dict(options)
    if options.pop("groups", False):
        options["groups"] = w.groups
    cap = max(32768, int(w.lengths.max()))
    p = sb.plan(w.lengths, dp, cap, cost=_QWEN, sync=sync, effort="thorough", **options)
    assert _pin(p) == pin


def test_thorough_reproduces_the_full_search_on_random_lengths() -> None:
    lengths = np.random.default_rng(7).integers(1, 1000, 40)
    assert _pin(sb.plan(lengths, 3, 1500, effort="thorough")) == "ffd73f4bb690c91e"


@pytest.mark.parametrize("name", ["rl-math", "sft-chat", "long-mix", "long-context"])
@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
def test_default_is_within_a_tenth_of_a_percent_of_the_full_search(name, sync) -> None:
    w = workloads.load(name, 512, seed=0)
    cap = max(32768, int(w.lengths.max()))
    full = sb.plan(w.lengths, 8, cap, cost=_QWEN, sync=sync, effort="thorough")
    default = sb.plan(w.lengths, 8, cap, cost=_QWEN, sync=sync)
    assert default.num_micro_batches == full.num_micro_batches
    assert default.simulate().step_time <= full.simulate().step_time * (1 + 1e-3)


def test_a_baseline_that_wins_at_the_default_is_slack_filled() -> None:
    """At a tight cap (99.5% of 3 micro-batches per rank) a baseline's rank split wins the
    pick; the default fills it as the full search fills every baseline (0.64% above the
    bound as it is, 0.15% filled: the full search's plan)."""
    lengths = workloads.load("rl-math-truncated", 256, seed=0).lengths
    cap = int(np.ceil(lengths.sum() / (8 * 3 * 0.995)))
    full = sb.plan(lengths, 8, cap, cost=_QWEN, effort="thorough")
    default = sb.plan(lengths, 8, cap, cost=_QWEN)
    assert any("baseline's plan, slack-filled," in n for n in default.notes)
    assert default.num_micro_batches == full.num_micro_batches == 3
    assert default.simulate().step_time <= full.simulate().step_time * (1 + 1e-3)
    assert default.simulate().gap < 0.002
    _check(default, 256, cap)


def test_thorough_past_its_candidate_budget_keeps_the_baselines_as_they_are(monkeypatch):
    """Past ``CANDIDATE_WORK`` the full search takes the baselines as they are; the
    default's filling of a winning baseline does not run there."""
    from seqbalance.planning import planner

    lengths = workloads.load("rl-math-truncated", 256, seed=0).lengths
    cap = int(np.ceil(lengths.sum() / (8 * 3 * 0.995)))
    monkeypatch.setattr(planner, "candidates_spent", lambda: True)
    p = sb.plan(lengths, 8, cap, cost=_QWEN, effort="thorough")
    assert "the token-kk baseline's plan was the fastest candidate" in p.notes


@pytest.mark.parametrize(("name", "sync"), [("sft-chat", "fsdp"), ("rl-math", "fsdp"),
                                          ("rl-math", "ddp")])
def test_large_default_stays_near_the_full_search(name, sync) -> None:
    """Above 20,000 sequences the default stops adding candidate families within five stop
    gaps of the bound (where no baseline runs): on these rows it is within its stop gap of
    the full search (measured: the same step)."""
    w = workloads.load(name, 32768, seed=0)
    cap = max(32768, int(w.lengths.max()))
    full = sb.plan(w.lengths, 256, cap, cost=_QWEN, sync=sync, effort="thorough")
    default = sb.plan(w.lengths, 256, cap, cost=_QWEN, sync=sync)
    _check(default, 32768, cap)
    assert default.num_micro_batches == full.num_micro_batches
    assert default.simulate().step_time <= full.simulate().step_time * (1 + 1e-3)


def test_fast_is_a_valid_plan_no_slower_to_make() -> None:
    w = workloads.load("rl-math", 512, seed=0)
    p = sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort="fast")
    _check(p, 512, 32768)
    assert p.num_micro_batches == sb.plan(w.lengths, 8, 32768, cost=_QWEN).num_micro_batches


@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
def test_fast_gives_the_default_plan_where_the_default_stops_on_a_first_candidate(
    sync: str,
) -> None:
    """"fast" tries the default's first candidates with the same stop: where the default
    stops on one of them (the capacity-aware greedy plan on long-context sequences, the
    global packing's second start under ddp), "fast" makes the same plan. The first
    packing alone was 6-26% longer on these."""
    for n, dp in ((1024, 8), (4096, 32)):
        w = workloads.load("long-context", n, seed=0)
        cap = max(32768, int(w.lengths.max()))
        fast = sb.plan(w.lengths, dp, cap, cost=_QWEN, sync=sync, effort="fast")
        default = sb.plan(w.lengths, dp, cap, cost=_QWEN, sync=sync)
        assert fast.micro_batches == default.micro_batches
        assert fast.notes == default.notes


def test_fast_skips_the_later_candidates() -> None:
    """Where the default goes on past its first candidates (rl-math 1,024 x 8, fsdp, at a
    97.8% fill), "fast" stops after them: a valid plan at the same count, no baseline
    among its candidates, a step no shorter than the default's and within 0.5% of it."""
    w = workloads.load("rl-math", 1024, seed=0)
    fast = sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort="fast")
    default = sb.plan(w.lengths, 8, 32768, cost=_QWEN)
    _check(fast, 1024, 32768)
    assert fast.num_micro_batches == default.num_micro_batches == 19
    assert not any(item.kind == "won_baseline" for item in fast.note_items)
    f, d = fast.simulate().step_time, default.simulate().step_time
    assert d < f <= d * 1.005  # (the later candidates would have found the default's)


def test_fast_does_not_even_out_its_packing(monkeypatch) -> None:
    """At "fast" the global packing is slack-filled on its small budget and left there:
    no slot evening out, no pair splits (``settle`` None), where the default has them."""
    from seqbalance.planning import planner

    seen: list[object] = []
    real = planner._plan_global

    def spy(*args, **kwargs):
        seen.append(kwargs.get("settle"))
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "_plan_global", spy)
    # (seed 2: at the default no candidate before the packings stops the search)
    w = workloads.load("rl-math", 1024, seed=2)
    sb.plan(w.lengths, 8, 32768, cost=_QWEN, effort="fast")
    assert seen and all(x is None for x in seen)
    seen.clear()
    sb.plan(w.lengths, 8, 32768, cost=_QWEN)
    assert seen and all(x is not None for x in seen)


def test_fast_keeps_the_early_full_rank_split_as_a_candidate() -> None:
    """Under fsdp with one micro-batch per rank the full-rank split is tried before the
    packing; not within the stop gap, at "fast" it stays a candidate and wins here (78
    lengths over 2 ranks, 4 of them above the cap and alone, costs given)."""
    lengths = [449, 627, 1324, 1791, 906, 30844, 220, 1618, 30292, 875, 18485, 475, 1127,
               845, 1416, 40, 412, 1575, 1496, 1273, 26380, 221, 1650, 1924, 23124, 35, 1024,
               22907, 24021, 1630, 1103, 1465, 14, 1144, 1498, 406, 1630, 1884, 75, 1840, 55,
               21544, 450, 1812, 1667, 1998, 470, 1905, 1317, 31884, 795, 1327, 1879, 1957,
               18877, 584, 469, 541, 386, 858, 1812, 87, 1963, 106, 1427, 1895, 1483, 941,
               338, 1983, 1582, 1578, 1526, 939, 1887, 332, 415, 317]  # fmt: skip
    costs = [567.4, 890.0, 2240.1, 1708.4, 1025.4, 28024.3, 263.8, 1082.1, 19186.9, 1537.2,
             15282.1, 798.1, 1960.9, 1582.8, 1506.2, 76.9, 765.9, 1936.3, 2252.7, 1749.8,
             46781.7, 241.7, 2446.1, 2510.1, 32454.6, 35.8, 1027.5, 39431.6, 25805.4,
             1036.0, 1287.2, 1394.2, 11.3, 1349.9, 1700.9, 775.3, 2457.3, 2685.0, 139.8,
             2274.9, 30.9, 25832.3, 347.7, 1514.5, 2339.8, 3470.4, 370.7, 2261.0, 2396.9,
             58032.4, 1207.1, 1024.6, 2064.8, 2590.1, 35139.0, 636.3, 751.4, 945.5, 766.8,
             505.5, 2390.3, 62.4, 2202.8, 189.8, 2278.7, 1251.5, 2238.5, 698.3, 490.3,
             1792.5, 3010.8, 3040.8, 1382.9, 497.9, 1168.4, 578.9, 438.3, 432.3]  # fmt: skip
    fast = sb.plan(lengths, 2, 15942, cost=costs, oversized="alone", effort="fast")
    assert [n.kind for n in fast.note_items] == ["oversized_alone", "won_full_rank"]
    assert not fast.violations()["missing"] and not fast.violations()["duplicated"]


def test_fast_ddp_keeps_the_exchange_between_ranks() -> None:
    """Under ddp, where the rank split stopped within the stop gap does not pack and the
    global packing is 3% above the bound, "fast" still exchanges sequences between ranks
    as the default does (29 lengths over 2 ranks, costs given)."""
    lengths = [804, 712, 45, 928, 507, 769, 690, 645, 323, 626, 464, 929, 875, 931, 670,
               1013, 149, 29, 547, 526, 550, 521, 59, 543, 856, 663, 117, 617, 1040]  # fmt: skip
    costs = [2096.832, 813.3888, 49.05, 18151.68, 1021.098, 1951.722, 785.22, 1477.05,
             531.658, 1409.752, 894.592, 18189.82, 1028.125, 18266.22, 1567.8, 3065.338,
             593.02, 29.1682, 6531.18, 1079.352, 610.5, 575.2882, 65.962, 1132.698,
             1002.5472, 9454.38, 390.78, 693.1378, 3203.2]  # fmt: skip
    kw = {"cost": costs, "sync": "ddp", "micro_batch_multiple": 2}
    fast = sb.plan(lengths, 2, 1101, effort="fast", **kw)
    default = sb.plan(lengths, 2, 1101, **kw)
    _check(fast, len(lengths), 1101)
    assert fast.simulate().step_time <= default.simulate().step_time * (1 + 1e-3)


def test_count_by_the_step_with_a_per_micro_batch_cost() -> None:
    """A per-micro-batch cost: the default's count is the fewest or a larger one with a
    shorter simulated step, never slower than the fewest; without the term the fewest."""
    w = workloads.load("rl-math", 256, seed=0)
    cap = 32768
    for c0 in (0.0, 1e-3, 5e-2):
        cost = QuadraticCost(per_token=1e-6, per_token_sq=1e-11, per_microbatch=c0)
        fewest = sb.plan(w.lengths, 16, cap, cost=cost, effort="thorough")
        chosen = sb.plan(w.lengths, 16, cap, cost=cost)
        assert chosen.num_micro_batches >= fewest.num_micro_batches
        assert chosen.simulate().step_time <= fewest.simulate().step_time * (1 + 1e-3)
        if c0 == 0.0:
            assert chosen.num_micro_batches == fewest.num_micro_batches
        if chosen.num_micro_batches > fewest.num_micro_batches:
            assert "instead of the fewest" in chosen.notes[-1]


def test_pipelined_and_context_parallel_plans_keep_the_full_search() -> None:
    """Their candidate search is the full one at every effort; the exact-search nodes,
    slack filling's work and static CP's replica plans follow the effort, within its stop
    gap of the full search."""
    w = workloads.load("rl-math", 64, seed=0)
    for kw in ({"pp_size": 2}, {"cp_size": 2}, {"cp_size": 2, "cp": "dynamic"}):
        a = sb.plan(w.lengths, 4, 32768, cost=_QWEN, **kw)
        b = sb.plan(w.lengths, 4, 32768, cost=_QWEN, effort="thorough", **kw)
        assert a.simulate().step_time <= b.simulate().step_time * (1 + 1e-3)


# The H100 fit of bench/results/gpu_step_h100.json: about 10 ms a micro-batch, 5 ms a sequence.
_H100 = QuadraticCost(per_token=7.64e-5, per_token_sq=1.296e-9, per_sequence=5.37e-3,
                      per_microbatch=9.76e-3)  # fmt: skip


def test_a_larger_count_is_kept_when_its_step_is_shorter() -> None:
    """rl-math, 1,024 over 8 ranks (seed 2), FSDP, with ~10 ms a micro-batch: one
    micro-batch more than the fewest runs a step more than the stop gap (0.1%) shorter,
    and is picked."""
    w = workloads.load("rl-math", 1024, seed=2)
    fewest = sb.plan(w.lengths, 8, 32768, cost=_H100, effort="thorough")
    chosen = sb.plan(w.lengths, 8, 32768, cost=_H100)
    assert chosen.num_micro_batches == fewest.num_micro_batches + 1
    assert chosen.simulate().step_time < fewest.simulate().step_time * (1 - 1e-3)
    assert "instead of the fewest" in chosen.notes[-1]
    assert not any("min_micro_batches=" in n for n in chosen.notes)


def test_larger_counts_are_not_planned_where_their_bound_leaves_no_gain() -> None:
    """GRPO with groups (rl-math, 1,024 over 64 ranks), ~10 ms a micro-batch: one
    micro-batch more is 0.02% shorter, within the stop gap, and the bound at that count
    says so before it is planned: the fewest stays, and only the fewest is planned."""
    w = workloads.load("rl-math", 1024, seed=0)
    run = partial(sb.plan, w.lengths, 64, 32768, cost=_H100, groups=w.groups)
    fewest = run(effort="thorough")
    more = run(min_micro_batches=fewest.num_micro_batches + 1)
    assert more.simulate().step_time < fewest.simulate().step_time  # (a gain, but small)
    counts = []
    original = planner._plan_attempt

    def spy(*args, **kw):
        counts.append(kw.get("min_micro_batches"))
        return original(*args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner, "_plan_attempt", spy)
        chosen = run()
    assert len(counts) == 1
    assert chosen.num_micro_batches == fewest.num_micro_batches
    assert chosen.simulate().step_time <= more.simulate().step_time * (1 + 1e-3)


def _least_step_at(lengths, costs, dp, cap, c0, m, sync) -> float:
    """The least step over every plan with ``m`` micro-batches per rank (empty ones
    allowed: a floor that holds for them holds for the planner's), by brute force."""
    best = np.inf
    n = len(lengths)
    if sync == "fsdp":  # bins dealt into m slots of dp, sorted (the best slotting)
        for part in _set_partitions(list(range(n))):
            if len(part) > dp * m or any(sum(lengths[i] for i in b) > cap for b in part):
                continue
            c = sorted((sum(costs[i] for i in b) for b in part), reverse=True)
            best = min(best, sum(c[::dp]) + m * c0)
        return best
    for assign in itertools.product(range(dp), repeat=n):  # ddp: each rank in <= m bins
        ranks = [[i for i in range(n) if assign[i] == r] for r in range(dp)]
        if all(any(len(p) <= m and all(sum(lengths[i] for i in b) <= cap for b in p)
                   for p in _set_partitions(r)) for r in ranks):  # fmt: skip
            best = min(best, max(sum(costs[i] for i in r) for r in ranks) + m * c0)
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 12), min_size=2, max_size=6),
    cap=st.integers(12, 20),
    dp=st.integers(1, 3),
    sync=st.sampled_from(["fsdp", "ddp"]),
    c0=st.sampled_from([0.5, 3.0]),
    quad=st.booleans(),
)
# (the tokens-per-rank bound at the fewest count is above the best plan at one more)
@example(lengths=[5, 11, 11, 7, 2, 5], dp=3, cap=17, sync="ddp", c0=3.0, quad=True)
def test_the_floor_over_counts_is_below_every_plan_up_to_its_top_count(
    lengths, cap, dp, sync, c0, quad
) -> None:
    """The floor the count search stops on, plus m per-micro-batch costs, is at most the
    best step of any plan with m micro-batches per rank, for every m from the fewest to
    the top count it was computed for (brute force over every plan)."""
    costs = [float(x) ** 2 if quad else float(x) for x in lengths]
    try:
        fewest = sb.plan(lengths, dp, cap, cost=costs, sync=sync, effort="thorough")
    except ValueError:  # fewer sequences than micro-batches
        return
    top = fewest.num_micro_batches + 2
    floor = planner._counts_floor(fewest, top)
    for m in range(fewest.num_micro_batches, top + 1):
        least = _least_step_at(lengths, costs, dp, cap, c0, m, sync)
        assert least >= (floor + m * c0) * (1 - 1e-12), m


def test_exact_search_nodes_by_effort() -> None:
    """"thorough" keeps the full node pool and the joint search's own limit; below it both
    are smaller, except that a caller who turned the searches on keeps the full pool."""
    full = effort_of("thorough")
    assert (full.exact_pool, full.joint_nodes) == (EXACT_NODES_PER_REQUEST, NODE_LIMIT)
    for name in ("default", "fast"):
        e = effort_of(name)
        assert e.exact_pool < full.exact_pool and e.joint_nodes < full.joint_nodes
        assert exact_pool(name) == e.exact_pool
        with exact_searches(True):
            assert exact_pool(name) == EXACT_NODES_PER_REQUEST
        with exact_searches(False):
            assert exact_pool(name) == e.exact_pool


def test_static_cp_with_pipeline_at_default_is_valid_and_near_thorough() -> None:
    """Static CP x PP with groups: the replicas planned at the default effort (a smaller
    exact-search pool) cover every sequence once, keep the capacity, and simulate within
    0.1% of the full search's plan."""
    rng = np.random.default_rng(5)
    lens = rng.integers(1, 3000, 80)
    kw = {"cp_size": 2, "pp_size": 3, "cost": "qwen2.5-7b", "groups": np.arange(80) // 4}
    a = sb.plan(lens, 2, 1700, **kw)
    b = sb.plan(lens, 2, 1700, effort="thorough", **kw)
    v = a.violations()
    assert not any(v.get(k, 0) for k in ("missing", "duplicated", "over_capacity", "empty"))
    assert a.num_micro_batches == b.num_micro_batches
    step_a = a.simulate_pipeline().step_time
    step_b = b.simulate_pipeline().step_time
    assert step_a <= step_b * (1 + 1e-3)


@pytest.mark.parametrize(
    ("name", "n", "dp", "sync", "options", "step"),
    [
        ("rl-math", 128, 4, "fsdp", {"pp_size": 4, "schedule": "interleaved",
                                     "virtual_stages": 2}, 2488042716880896.0),
        ("long-mix", 120, 2, "ddp", {"cp_size": 2, "pp_size": 2}, 811508176625664.0),
    ],
)
def test_thorough_pipelines_keep_the_full_search_step(name, n, dp, sync, options, step) -> None:
    """Pipelined plans: the order searches run on a work budget at every effort (their notes
    name it), so "thorough" is held to the step the unbudgeted search found, not its bytes."""
    w = workloads.load(name, n, seed=0)
    p = sb.plan(w.lengths, dp, 32768, cost=_QWEN, sync=sync, effort="thorough", **options)
    assert p.simulate().step_time <= step


@pytest.mark.parametrize(
    ("name", "n", "dp", "m", "fill", "skips"),
    # (rl-math 64 x 8 and uniform 64 x 8 stop within the stop gap before any full-rank
    # split, since pairs of micro-batches are split anew: nothing to skip there)
    [("rl-math", 64, 8, None, None, False), ("rl-math", 1024, 8, None, None, False),
     ("sft-chat", 256, 8, 3, 0.7, True), ("rl-math-truncated", 256, 16, 4, 0.95, True),
     ("uniform", 64, 8, 2, 0.9, False)],
)  # fmt: skip
def test_a_full_rank_split_that_cannot_win_is_not_packed(
    monkeypatch, name, n, dp, m, fill, skips
) -> None:
    """Below "thorough" a full-rank split whose busiest rank alone is slower than a grid
    already built at that count is not packed. The plan and its notes are the same as
    when every split is packed (the candidates made as if no step were known yet)."""
    from seqbalance.planning import planner

    lengths = workloads.load(name, n, seed=0).lengths
    cap = (max(32768, int(lengths.max())) if m is None
           else int(np.ceil(lengths.sum() / (dp * m * fill))))  # fmt: skip
    packed: list[int] = []
    fill_rank_slack = planner._fill_rank_slack
    monkeypatch.setattr(planner, "_fill_rank_slack",
                        lambda req, mbs: packed.append(1) or fill_rank_slack(req, mbs))
    skipping = sb.plan(lengths, dp, cap, cost=_QWEN)
    skipped_packs = len(packed)
    full_rank = planner._full_rank_candidates

    def every_split(req, m_best, found, enough=None, memo=None, beat=None):
        # (found only gates this on inputs above _PIPELINE_MAX_ITEMS, not these)
        return full_rank(req, m_best, [], enough, memo=memo)

    monkeypatch.setattr(planner, "_full_rank_candidates", every_split)
    packed.clear()
    every = sb.plan(lengths, dp, cap, cost=_QWEN)
    assert skipping.micro_batches == every.micro_batches
    assert skipping.notes == every.notes
    assert (skipped_packs < len(packed)) == skips
