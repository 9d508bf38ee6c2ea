"""Context-parallel planning: piece costs, CP plans, their simulation, bound and baselines.

The hard constraints are checked by code written here from the definitions (not by
``CPPlan.violations``), on plans of every CP planner over hypothesis-drawn inputs.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.costs import FlopsCost, QuadraticCost, TokenCost
from seqbalance.costs.context_parallel import (
    FLOPS_PER_SECOND,
    ContextParallelCost,
    balanced_layout,
    kv_bytes_per_token,
)
from seqbalance.planning.cp_baselines import megatron_cp, static_cp
from seqbalance.planning.cp_plans import CPPlan, cp_lower_bound, simulate_pieces

# ---- cost of a piece: exact values from the formula -----------------------------------------


def test_balanced_layout_known_values():
    assert balanced_layout(8, 1) == [[(0, 8)]]
    assert balanced_layout(8, 2) == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    assert balanced_layout(16, 4)[1] == [(2, 4), (12, 14)]  # chunks 1 and 2*4-1-1 = 6


@given(st.integers(0, 5000), st.sampled_from([1, 2, 4, 8, 16]))
def test_balanced_layout_tiles_the_sequence(length, d):
    ranges = sorted(r for rank in balanced_layout(length, d) for r in rank)
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    tokens = [sum(e - s for s, e in rank) for rank in balanced_layout(length, d)]
    assert max(tokens) - min(tokens) <= 2  # balanced up to rounding


@given(st.integers(0, 300), st.sampled_from([1, 2, 4, 8, 16]))
def test_padded_lengths_give_transformer_engines_equal_chunks(units, cp_size):
    # TransformerEngine's THD context parallelism pads each sequence to a multiple of
    # 2 * cp and gives rank r the equal chunks r and 2d - 1 - r. The README tells users of
    # such kernels to pad before planning: then every degree d <= cp_size cuts there too.
    length = units * 2 * cp_size
    d = cp_size
    while d >= 1:
        size = length // (2 * d)
        for r, ranges in enumerate(balanced_layout(length, d)):
            chunks = [(r * size, (r + 1) * size), ((2 * d - 1 - r) * size, (2 * d - r) * size)]
            assert ranges == ([(0, length)] if d == 1 else chunks)
        d //= 2


def test_piece_cost_without_communication_is_the_split_polynomial():
    cp = ContextParallelCost(QuadraticCost(per_token=1.0, per_token_sq=0.01, per_sequence=4.0))
    # rank 0 of L=8, d=2 holds [0,2) and [6,8): 4/2 + 4 + 0.01 * (4 + 64 - 36)
    assert cp.piece_cost(8, [(0, 2), (6, 8)], 2) == pytest.approx(6.32)
    # the pieces add up to the whole sequence's cost: CP moves work, it does not create it
    for length, d in [(1000, 4), (777, 8), (5, 2)]:
        total = sum(cp.piece_cost(length, r, d) for r in balanced_layout(length, d))
        assert total == pytest.approx(4.0 + length + 0.01 * length**2)


def test_communication_term_known_values():
    base = QuadraticCost(per_token=0.0, per_token_sq=1.0)
    cp = ContextParallelCost(
        base, bandwidth=5.0, kv_bytes_per_token=10.0, comm_passes=1.0, cost_per_second=1.0
    )
    # L=8, d=2: one transfer of 4 tokens * 10 bytes / 5 bytes/s = 8; attention 32 on rank 0
    assert cp.piece_cost(8, [(0, 2), (6, 8)], 2) == pytest.approx(32 + 8)
    half = ContextParallelCost(
        base, bandwidth=5.0, kv_bytes_per_token=10.0, comm_passes=1.0, overlap=0.5,
        cost_per_second=1.0,
    )
    # hidden behind half of one step's attention: 8 - 0.5 * 32 / 2 = 0 exposed
    assert half.piece_cost(8, [(0, 2), (6, 8)], 2) == pytest.approx(32)
    # four ranks, three transfers of 2 tokens each, cost_per_second scales seconds to units
    fast = ContextParallelCost(
        base, bandwidth=5.0, kv_bytes_per_token=10.0, comm_passes=1.0, cost_per_second=2.0
    )
    sq = 1 * 1 - 0 + 8 * 8 - 7 * 7  # rank 0 of L=8, d=4 holds [0,1) and [7,8)
    assert fast.piece_cost(8, [(0, 1), (7, 8)], 4) == pytest.approx(sq + 3 * (2 * 10 / 5 * 2))


def test_cost_per_second_defaults_to_the_costs_units():
    # It defaulted to 1 for every cost: with a FLOP cost the transfer's seconds counted as
    # a few FLOPs, so any bandwidth (1 byte/s too) planned as free communication, while
    # the command line used 4e14 FLOP/s for the same settings.
    flops = FlopsCost.from_name("qwen2.5-7b")
    assert ContextParallelCost(flops, bandwidth=2.5e10).cost_per_second == FLOPS_PER_SECOND
    lengths = np.random.default_rng(4).integers(500, 12000, 64)
    kw = dict(cp_size=8, cp="dynamic", cost=flops)
    free = sb.plan(lengths, 2, 8192, **kw)
    slow = sb.plan(lengths, 2, 8192, cp_cost={"bandwidth": 1e8}, **kw)
    assert set(free.degrees()) == {8} and max(slow.degrees()) <= 2  # slow links: split less
    # A cost in seconds (its meta says so) converts at 1; a cost of unknown units must say.
    secs = QuadraticCost(per_token=1e-6, per_token_sq=0.0, meta={"unit": "seconds"})
    assert ContextParallelCost(secs, bandwidth=1e9, kv_bytes_per_token=8.0).cost_per_second == 1
    with pytest.raises(ValueError, match="unknown units, pass cost_per_second="):
        ContextParallelCost(QuadraticCost(1.0, 0.0), bandwidth=1e9, kv_bytes_per_token=8.0)
    # Without a bandwidth nothing is converted.
    assert ContextParallelCost(TokenCost()).cost_per_second == 1.0


def test_kv_bytes_from_the_config():
    # qwen2.5-7b: 28 layers, 4 KV heads, head_dim 3584 / 28 = 128, bf16
    assert kv_bytes_per_token(FlopsCost.from_name("qwen2.5-7b")) == 2 * 4 * 128 * 2 * 28
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        ContextParallelCost(TokenCost(), bandwidth=1e9)


def test_d1_piece_is_the_sequence_cost_exactly():
    model = FlopsCost.from_name("gemma-2-9b")  # sliding windows: polynomial is only a bound
    cp = ContextParallelCost(model, bandwidth=1e11, cost_per_second=4e14)
    lens = np.array([100, 5000, 9000])
    tmax, _, ptok = cp.piece_times(lens, 1)
    np.testing.assert_array_equal(tmax, model(lens))
    np.testing.assert_array_equal(ptok, lens)


# ---- independent checks of the hard constraints ---------------------------------------------


def check_constraints(p: CPPlan, lengths, max_tokens: int, cp_size: int) -> None:
    lengths = np.asarray(lengths)
    m = len(p.pieces[0])
    assert all(len(g) == m for g in p.pieces), "equal slot counts"
    cover: dict[int, list[tuple[int, int]]] = {}
    where: dict[int, set[tuple[int, int]]] = {}
    for g, gpu in enumerate(p.pieces):
        for j, slot in enumerate(gpu):
            assert sum(e - s for _, s, e in slot) <= max_tokens, (g, j)
            for i, s, e in slot:
                cover.setdefault(i, []).append((s, e))
                where.setdefault(i, set()).add((g, j))
    for i, length in enumerate(lengths.tolist()):
        ranges = sorted(r for r in cover.get(i, []) if r[1] > r[0])
        pos = 0
        for s, e in ranges:  # every token in exactly one piece
            assert s == pos, (i, ranges)
            pos = e
        assert pos == length, (i, ranges)
        slots = {j for _, j in where[i]}
        assert len(slots) == 1, f"sequence {i} spans slots {slots}"
        gpus = sorted(g for g, _ in where[i])
        d = len(gpus)
        assert d & (d - 1) == 0 and d <= cp_size, (i, gpus)
        assert gpus == list(range(gpus[0], gpus[0] + d)) and gpus[0] % d == 0  # aligned block


def lengths_strategy():
    short = st.integers(1, 3000)
    long = st.integers(3000, 16000)  # over cp_size * max_tokens only for cp 2 x 4096
    return st.lists(st.one_of(short, short, short, long), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths_strategy(),
    st.integers(1, 3),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([4096, 8192]),
    st.sampled_from(["static", "dynamic", "megatron"]),
    st.sampled_from(["fsdp", "ddp"]),
    st.sampled_from(
        [None, {"bandwidth": 1e3, "kv_bytes_per_token": 1.0, "overlap": 0.5, "cost_per_second": 1}]
    ),
)
def test_every_cp_plan_keeps_the_hard_constraints(lengths, dp, cp_size, cap, mode, sync, comm):
    cost = QuadraticCost(per_token=1.0, per_token_sq=1e-4, per_sequence=10.0, per_microbatch=5.0)
    if max(lengths) > cp_size * cap:  # cannot fit: the error must name the sequence
        with pytest.raises(ValueError, match=r"sequence \d+ has \d+ tokens"):
            sb.plan(
                lengths,
                dp,
                cap,
                cost=cost,
                cp_size=cp_size,
                cp="dynamic",
                cp_cost=comm,
                allow_empty=True,
            )
        return
    if mode == "megatron":
        p = megatron_cp(lengths, dp, cap, cp_size=cp_size, cost=cost, cp_cost=comm, sync=sync)
    else:
        p = sb.plan(
            lengths,
            dp,
            cap,
            cost=cost,
            cp_size=cp_size,
            cp=mode,
            cp_cost=comm,
            sync=sync,
            allow_empty=True,
        )
    check_constraints(p, lengths, cap, cp_size)
    v = p.violations()
    assert {k: x for k, x in v.items() if k != "empty"} == dict.fromkeys(v.keys() - {"empty"}, 0)
    sim = p.simulate()
    assert sim.step_time >= sim.lower_bound * (1 - 1e-9)
    assert p.world_size == dp * cp_size and p.dp_size == dp


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths_strategy(), st.integers(1, 2), st.sampled_from([2, 4]), st.randoms())
def test_bound_holds_for_random_valid_plans(lengths, dp, cp_size, rnd):
    """Random layouts (any allowed degree, any slot, any aligned block): never below the bound."""
    cap = 8192
    if max(lengths) > cp_size * cap:
        return
    cpc = ContextParallelCost(
        QuadraticCost(per_token=1.0, per_token_sq=1e-4, per_sequence=10.0, per_microbatch=5.0),
        bandwidth=1e3,
        kv_bytes_per_token=1.0,
        overlap=0.3,
        cost_per_second=1.0,
    )
    world = dp * cp_size
    m = max(1, math.ceil(sum(lengths) / (world * cap))) + rnd.randint(0, 2)
    tokens = np.zeros((world, m), dtype=np.int64)
    pieces = [[[] for _ in range(m)] for _ in range(world)]
    for i, length in enumerate(lengths):
        ds = [
            d
            for d in (1, 2, 4, 8)
            if d <= cp_size
            and max(sum(e - s for s, e in r) for r in balanced_layout(length, d)) <= cap
        ]
        for _ in range(200):
            d = rnd.choice(ds)
            j = rnd.randrange(m)
            off = d * rnd.randrange(world // d)
            layout = balanced_layout(length, d)
            need = [sum(e - s for s, e in r) for r in layout]
            if all(tokens[off + r, j] + need[r] <= cap for r in range(d)):
                break
        else:
            return  # no room found by chance: skip this example
        for r in range(d):
            tokens[off + r, j] += need[r]
            pieces[off + r][j].extend((i, s, e) for s, e in layout[r])
    bound = cp_lower_bound(lengths, world, cp_size, cap, cpc)
    for sync in ("fsdp", "ddp"):
        sim = simulate_pieces(pieces, lengths, cpc, sync=sync)
        assert sim.step_time >= bound * (1 - 1e-9)


# ---- simulation: known timelines --------------------------------------------------------------


def test_simulation_group_waits_for_its_slowest_member():
    cpc = ContextParallelCost(TokenCost())
    lengths = [10, 1, 1, 1, 10]
    pieces = [
        [[(0, 0, 10)], [(2, 0, 1)], [(4, 0, 2), (4, 7, 10)]],
        [[(1, 0, 1)], [(3, 0, 1)], [(4, 2, 5), (4, 5, 7)]],
    ]
    ddp = simulate_pieces(pieces, lengths, cpc, sync="ddp")
    # GPU 1 is ready at 2 but its CP partner only at 11: the group runs 11..16
    assert ddp.step_time == 16.0 and ddp.start[1, 2] == 11.0 and ddp.rank_idle[1] == 9.0
    fsdp = simulate_pieces(pieces, lengths, cpc, sync="fsdp")
    assert fsdp.step_time == 10 + 1 + 5


# ---- plan(): dispatch, errors, JSON ---------------------------------------------------------


def test_cp_size_one_is_todays_plan_byte_for_byte():
    lengths = sb.workloads.lengths("sft-chat", 300, seed=2)
    for sync in ("fsdp", "ddp"):
        a = sb.plan(lengths, 4, 32768, cost="qwen2.5-7b", sync=sync)
        b = sb.plan(
            lengths,
            4,
            32768,
            cost="qwen2.5-7b",
            sync=sync,
            cp_size=1,
            cp="dynamic",
            cp_cost={"bandwidth": 1e9},
        )
        assert type(b) is sb.Plan and a.to_json() == b.to_json()


def test_cp_size_one_checks_cp_cost_and_uses_the_cost_inside_it():
    lengths = [900, 100, 500, 500, 300, 700, 50, 2000]
    quad = QuadraticCost(per_token=1.0, per_token_sq=1e-3)
    inside = sb.plan(lengths, 2, 4000, cp_cost=ContextParallelCost(quad))
    direct = sb.plan(lengths, 2, 4000, cost=quad)
    tokens = sb.plan(lengths, 2, 4000)
    # The cost given inside cp_cost is the one planned with, as it is at cp_size > 1.
    np.testing.assert_array_equal(inside.costs, quad(np.asarray(lengths, dtype=float)))
    assert inside.to_json() == direct.to_json() != tokens.to_json()
    for bad, match in (
        ({"bogus": 1}, "unknown key"),
        ({"bandwidth": -1.0}, "bandwidth"),
        (3, "cp_cost must be None, a ContextParallelCost or a dict"),
    ):
        with pytest.raises(ValueError, match=match):
            sb.plan(lengths, 2, 4000, cp_cost=bad)
    with pytest.raises(ValueError, match="either as cost= or inside cp_cost="):
        sb.plan(lengths, 2, 4000, cost=quad, cp_cost=ContextParallelCost(quad))
    # Per-sequence costs stay allowed at degree 1 next to a dict of CP arguments.
    costs = np.arange(1.0, 9.0)
    with_dict = sb.plan(lengths, 2, 4000, cost=costs, cp_cost={"bandwidth": 1e9})
    assert with_dict.to_json() == sb.plan(lengths, 2, 4000, cost=costs).to_json()
    for bad, match in (({"bogus": 1}, "unknown key"), ({"bandwidth": -1.0}, "bandwidth"),
                       ({"overlap": 5.0}, "overlap")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            sb.plan(lengths, 2, 4000, cost=costs, cp_cost=bad)


def test_too_long_sequence_is_named():
    with pytest.raises(
        ValueError, match=r"sequence 2 has 40000 tokens.*cp_size=4.*max_tokens=8192"
    ):
        sb.plan([100, 200, 40000, 30], 2, 8192, cp_size=4, cp="dynamic")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cp_size": 3}, "cp_size must be a power of two"),
        ({"cp_size": 2, "cp": "ring"}, "cp must be one of"),
        # Static CP plans its replicas under these; dynamic CP has no replica to hold them.
        (
            {"cp_size": 2, "cp": "dynamic", "groups": [0, 0, 1, 1]},
            "groups=an array needs cp='static' with cp_size > 1",
        ),
        ({"cp_size": 2, "cp": "dynamic", "size": "equal"}, "size='equal' needs cp='static'"),
        ({"cp_size": 2, "cp": "dynamic", "order": "index"}, "order='index' needs cp='static'"),
        (
            {"cp_size": 2, "cp": "dynamic", "oversized": "alone"},
            "oversized='alone' needs cp='static'",
        ),
        (
            {"cp_size": 2, "cp": "dynamic", "extra_micro_batches": 1},
            "extra_micro_batches=1 needs cp='static'",
        ),
        (
            {"cp_size": 2, "cp": "dynamic", "sequences_per_micro_batch": 2},
            "sequences_per_micro_batch=2 needs cp='static'",
        ),
        # A bad value is named as such, in either mode, not as a mode mismatch.
        ({"cp_size": 2, "cp": "dynamic", "size": "even"}, "size must be one of"),
        ({"cp_size": 2, "size": "even"}, "size must be one of"),
        ({"cp_size": 2, "order": "lightest"}, "order must be one of"),
        ({"cp_size": 2, "oversized": "drop"}, "oversized must be one of"),
        ({"cp_size": 2, "extra_micro_batches": -1}, "extra_micro_batches"),
        ({"cp_size": 2, "sequences_per_micro_batch": 0}, "sequences_per_micro_batch"),
        ({"cp_size": 2, "padded": True}, "padded=True is not supported"),
        ({"cp_size": 2, "cost": [1.0, 2.0, 3.0, 4.0]}, "not per-sequence numbers"),
        ({"cp_size": 2, "cp_cost": {"bandwith": 1e9}}, "unknown key"),
        ({"cp_size": 2, "cp_cost": {"overlap": 2.0}}, r"overlap = 2.0 is invalid"),
        # The pipeline keywords were taken unchecked with cp_size > 1; now as at pp_size=1.
        ({"cp_size": 2, "pp_comm": 1.0}, r"pp_comm=1.0 needs pp_size > 1"),
        ({"cp_size": 2, "schedule": "interleaved"}, "needs virtual_stages >= 2"),
        ({"cp_size": 2, "virtual_stages": 2}, "applies to schedule='interleaved' only"),
        ({"cp_size": 2, "schedule": "zb"}, "schedule must be one of"),
        ({"cp_size": 2, "baselines": 1}, "baselines must be True or False"),
        ({"cp_size": 2, "allow_empty": "no"}, "allow_empty must be True or False"),
    ],
)
def test_bad_cp_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sb.plan([100, 200, 300, 400], 2, 1000, **kwargs)


@pytest.mark.parametrize("cp", ["static", "dynamic"])
def test_cp_plan_refuses_the_capacities_plan_refuses(cp):
    # The dynamic planner overflowed int64 (OverflowError) on a capacity of 2**63.
    with pytest.raises(ValueError, match=r"max_tokens=9223372036854775808 .*below 2\*\*62"):
        sb.plan([5, 3, 8, 1], 1, 2**63, cp_size=2, cp=cp)


def _cp_document():
    lengths = [5, 3, 8, 1, 9, 2, 2, 12, 14, 6]  # 12 and 14 need both GPUs of a replica
    d = sb.plan(lengths, 2, 8, cp_size=2, cp="dynamic").to_dict()
    assert d["world_size"] == 4 and d["dp_size"] == 2 and d["cp_size"] == 2
    return d


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("cp_cost", None, r"cp_cost: .*object with a 'cost'.*got NoneType"),
        ("cp_cost", {}, r"cp_cost: .*object with a 'cost'.*got keys \[\]"),
        ("cp_cost", [], r"cp_cost: .*got list"),
        ("cp_cost", {"cost": None}, r"cp_cost: a cost JSON must be an object"),
        ("cp_cost", {"cost": {"kind": "tokens"}, "overlap": 2.0}, r"cp_cost: overlap = 2.0"),
        ("pieces", [], r"pieces has no GPU"),
        ("pieces", None, r"pieces must be nested lists"),
        # cp_size: what plan(cp_size=...) accepts (a power of two up to 2**14), and
        # dp_size x cp_size GPUs (2**40 made simulate() run for ever).
        ("cp_size", 2**40, r"cp_size=1099511627776 is beyond .*at most 16384"),
        ("cp_size", 3, r"cp_size must be a power of two"),
        ("cp_size", 0, r"cp_size must be >= 1"),
        ("cp_size", "2", r"cp_size must be a positive integer"),
        ("cp_size", 4, r"dp_size=2 x cp_size=4 = 8 GPUs, but pieces has 4"),
        ("dp_size", 3, r"dp_size=3 x cp_size=2 = 6 GPUs, but pieces has 4"),
        ("world_size", 7, r"world_size=7 but pieces has 4 GPUs"),
        ("max_tokens", 2**63, r"max_tokens=9223372036854775808 .*below 2\*\*62"),
        ("notes", None, r"notes must be a list of strings"),
        ("notes", 5, r"notes must be a list of strings"),
        ("strategy", 5, r"strategy must be a string"),
    ],
)
def test_cp_from_dict_refuses_bad_fields(key, value, match):
    d = _cp_document()
    assert isinstance(sb.Plan.from_dict(d), CPPlan)  # unedited: loads
    d[key] = value
    with pytest.raises(ValueError, match=match):
        sb.Plan.from_dict(d)
    with pytest.raises(ValueError, match=match):
        sb.Plan.from_json(json.dumps(d))


def test_cp_from_dict_refuses_pieces_that_are_not_ranges():
    d = _cp_document()
    d["pieces"][0][0][0] = [0, 0]  # two values, not (sequence, start, end)
    with pytest.raises(ValueError, match=r"pieces\[0\]\[0\] holds \[0, 0\]"):
        sb.Plan.from_dict(d)


def test_json_round_trip_and_schema(tmp_path):
    lengths = [5000, 300, 700, 20000, 100, 900, 1200, 64]
    p = sb.plan(
        lengths,
        2,
        8192,
        cost="qwen2.5-7b",
        cp_size=4,
        cp="dynamic",
        cp_cost={"bandwidth": 1e11, "cost_per_second": 4e14},
        allow_empty=True,
    )
    d = p.to_dict()
    assert d["cp_size"] == 4 and d["world_size"] == 8 and d["dp_size"] == 2
    assert d["cp"] == "dynamic" and len(d["pieces"]) == 8
    assert all(len(r) == 3 for gpu in d["pieces"] for slot in gpu for r in slot)
    q = sb.Plan.from_json(p.to_json(tmp_path / "p.json"))
    assert isinstance(q, CPPlan) and q == p and q.pieces == p.pieces
    assert q.simulate().step_time == p.simulate().step_time


# ---- baselines and the dynamic planner ---------------------------------------------------------


def test_megatron_degrees_follow_the_published_rule():
    lengths = [70000, 33000, 32768, 100, 130000]
    p = megatron_cp(lengths, 1, 32768, cp_size=8)
    # d = 2^ceil(log2(ceil(L / 32768))): 3 -> 4, 2 -> 2, 1 -> 1, 1, 4 -> 4
    assert p.degrees().tolist() == [4, 2, 1, 1, 4]
    s = static_cp(lengths, 1, 32768, cp_size=8)
    assert s.degrees().tolist() == [8] * 5 and s.strategy == "static-cp"


@pytest.mark.parametrize("bandwidth", [4e11, 2.5e10])
def test_dynamic_is_no_slower_than_static_and_megatron(bandwidth):
    lengths = sb.workloads.lengths("long-context", 600, seed=3)
    kw = dict(
        cost="qwen2.5-7b",
        cp_size=8,
        cp_cost={"bandwidth": bandwidth, "cost_per_second": 4e14, "overlap": 0.5},
    )
    dyn = sb.plan(lengths, 2, 32768, cp="dynamic", **kw)
    check_constraints(dyn, lengths, 32768, 8)
    t = dyn.simulate().step_time
    assert t <= static_cp(lengths, 2, 32768, **kw).simulate().step_time
    assert t <= megatron_cp(lengths, 2, 32768, **kw).simulate().step_time
    assert dyn.notes and dyn.notes[0].startswith("dynamic CP:")


def test_too_few_sequences_needs_allow_empty():
    with pytest.raises(ValueError, match="allow_empty=True"):
        sb.plan([100, 200, 300], 4, 1000, cp_size=2, cp="dynamic")
    p = sb.plan([100, 200, 300], 4, 1000, cp_size=2, cp="dynamic", allow_empty=True)
    check_constraints(p, [100, 200, 300], 1000, 2)
    busy = {(g, j) for g, gpu in enumerate(p.pieces) for j, sl in enumerate(gpu) if sl}
    assert p.violations()["empty"] == 8 * p.num_micro_batches - len(busy) > 0


def test_stats_order_and_degrees():
    lengths = [9000, 100, 200, 300, 400, 500, 600, 700]
    p = sb.plan(lengths, 2, 4096, cp_size=4, cp="dynamic", allow_empty=True)
    assert p.degrees()[0] == 4 and set(p.degrees()[1:].tolist()) <= {1, 2, 4}
    order = p.order()
    assert sorted(order.tolist()) == list(range(8))  # each sequence once
    np.testing.assert_array_equal(order[p.inverse_order()], np.arange(8))
    st_ = p.stats()
    assert st_["world_size"] == 8 and sum(st_["degrees"].values()) == 8
    assert st_["lower_bound"] == p.lower_bound() and st_["violations"] == p.violations()


@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
def test_whole_sequences_simulate_as_without_cp(sync):
    """Pieces that are whole sequences: the CP simulator agrees with the plain one."""
    lengths = sb.workloads.lengths("sft-chat", 200, seed=4)
    cost = sb.FlopsCost.from_name("qwen2.5-7b")
    p = sb.plan(lengths, 4, 32768, cost=cost, sync=sync)
    pieces = [[[(i, 0, int(lengths[i])) for i in mb] for mb in rank] for rank in p.micro_batches]
    cp = simulate_pieces(
        pieces, lengths, ContextParallelCost(cost, bandwidth=1e9, cost_per_second=4e14), sync=sync
    )
    plain = p.simulate(sync=sync)
    np.testing.assert_allclose(cp.mb_costs, plain.mb_costs, rtol=1e-12)
    assert cp.step_time == pytest.approx(plain.step_time, rel=1e-12)


def test_same_inputs_same_plan():
    lengths = sb.workloads.lengths("long-context", 500, seed=7)
    kw = dict(cost="qwen2.5-7b", cp_size=8, cp="dynamic", cp_cost={"bandwidth": 1e11})
    assert sb.plan(lengths, 2, 32768, **kw).to_json() == sb.plan(lengths, 2, 32768, **kw).to_json()


def test_cp_plan_of_empty_sequences_has_no_gap():
    # 0 against a bound of 0 is no gap, as for plans without CP (it was NaN).
    import seqbalance as sb

    for lengths, kw in (([0], {}), ([], {"allow_empty": True})):
        sim = sb.plan(lengths, 1, 20, cp_size=2, **kw).simulate()
        assert sim.step_time == 0.0 and sim.lower_bound == 0.0 and sim.gap == 0.0


def test_simulate_refuses_pieces_that_miss_or_repeat_tokens():
    # A hand-edited document: one piece of sequence 6 dropped, or one piece listed twice.
    # violations() counts it; simulate() and stats() must not report a step for other work.
    p = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2)
    assert p.simulate().gap >= 0
    d = p.to_dict()
    gone = json.loads(json.dumps(d))
    first = gone["pieces"][0][0]
    first.remove(first[0])
    repeated = json.loads(json.dumps(d))
    repeated["pieces"][0][0].append(repeated["pieces"][0][0][0])
    for doc, word in ((gone, "1 sequences miss"), (repeated, "1 have tokens in two")):
        bad = CPPlan.from_dict(doc)
        assert bad.violations()["missing"] + bad.violations()["duplicated"] == 1
        with pytest.raises(ValueError, match=word):
            bad.simulate()
        with pytest.raises(ValueError, match=word):
            bad.stats()


def test_cp_from_dict_refuses_a_num_micro_batches_that_disagrees():
    d = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2).to_dict()
    assert CPPlan.from_dict(d).num_micro_batches == d["num_micro_batches"]
    d["num_micro_batches"] += 1
    with pytest.raises(ValueError, match="num_micro_batches is"):
        CPPlan.from_dict(d)


@pytest.mark.parametrize(
    "key, edit",
    [
        ("micro_batches", lambda v: [[[*slot[::-1], 0] for slot in gpu] for gpu in v]),
        ("costs", lambda v: [c * 2 for c in v]),
        ("per_microbatch", lambda v: v + 1.0),
        ("padded", lambda v: True),
    ],
)
def test_cp_from_dict_refuses_derived_fields_that_disagree(key, edit):
    # A CP plan takes these from pieces, lengths and cp_cost; an edit would do nothing.
    d = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2).to_dict()
    assert CPPlan.from_dict(d).to_dict() == d
    d[key] = edit(d.get(key))
    with pytest.raises(ValueError, match=f"{key} is .* but pieces, lengths and cp_cost give"):
        CPPlan.from_dict(d)


def test_cp_from_dict_takes_derived_fields_left_out_or_in_other_containers():
    p = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2)
    d = p.to_dict()
    derived = ("micro_batches", "costs", "per_microbatch", "padded", "size", "groups")
    bare = {k: v for k, v in d.items() if k not in (*derived, "num_micro_batches")}
    assert CPPlan.from_dict(bare).to_dict() == d
    # Built in Python: tuples and numpy arrays where JSON has lists; costs off by one ulp.
    typed = dict(d)
    typed["micro_batches"] = [tuple(tuple(s) for s in gpu) for gpu in d["micro_batches"]]
    typed["costs"] = np.nextafter(np.asarray(d["costs"]), np.inf)
    assert CPPlan.from_dict(typed).to_dict() == d


def test_cp_pieces_refuse_bools():
    # True and False pass operator.index as 1 and 0; in a piece they are a typo, not a range.
    d = sb.plan([30, 5, 9, 17, 2, 8, 32, 3], 2, 16, cp_size=2).to_dict()
    seq, start, end = d["pieces"][0][0][0]
    assert start == 0  # the first piece of a sequence starts at its first token
    for bad in ([seq, False, end], [seq, 0.0, end], "x", 5):
        d["pieces"][0][0][0] = bad
        # The message names the piece (a float or a string got a generic one).
        with pytest.raises(ValueError, match=r"pieces\[0\]\[0\] holds .* want \(sequence"):
            CPPlan.from_dict(d)


# ---- bad arguments to the piece-cost functions ---------------------------------------------

_CP = ContextParallelCost(QuadraticCost(per_token=1.0, per_token_sq=0.01, per_sequence=4.0))


@pytest.mark.parametrize(
    "length, d, match",
    [
        (8, 0, "d"),  # ZeroDivisionError
        (8, -1, "d"),  # [] (no ranks)
        (8, True, "d"),  # taken as d = 1
        (8, 2.5, "d"),  # TypeError
        (8, 2**20, "d"),  # 2**21 cuts for 8 tokens
        (-5, 2, "length"),  # ranges running backwards
        (8.7, 2, "length"),  # cut as if 8 tokens
        (True, 1, "length"),
    ],
)
def test_balanced_layout_bad_arguments(length, d, match):
    with pytest.raises(ValueError, match=match):
        balanced_layout(length, d)


@pytest.mark.parametrize(
    "lengths, d, match",
    [
        ([8], 0, "d"),  # ZeroDivisionError
        ([8], -2, "d"),  # empty (n, 0) tables
        ([8], 2.0, "d"),  # IndexError
        ([8], True, "d"),  # taken as d = 1
        ([8], 2**30, "d"),  # allocated n x 2**31 int64 cuts
        ([-8], 2, "lengths"),  # negative tokens and costs
        ([8.7], 2, "lengths"),  # truncated to 8
        ([2**62], 2, "lengths"),  # k * L overflowed int64: negative tokens
        ([[8]], 2, "lengths"),  # IndexError
    ],
)
def test_rank_costs_bad_arguments(lengths, d, match):
    with pytest.raises(ValueError, match=match):
        _CP.rank_costs(lengths, d)
    with pytest.raises(ValueError, match=match):
        _CP.piece_times(lengths, d)


@pytest.mark.parametrize(
    "length, ranges, d, match",
    [
        (8, [(0, 8)], 0, "d"),  # inf, with a numpy warning
        (8, [(6, 2)], 2, "range"),  # a backwards range: cost -2.32
        (8, [(0, 100)], 2, "range"),  # past the end of the sequence
        (8, [(-4, 2)], 2, "range"),
        (8, [(0, 2.5)], 2, "range"),
        (8, [(0, True)], 2, "range"),
        (8, [(0, 2, 3)], 2, "range"),
        (-8, [(0, 8)], 1, "length"),
        (8.5, [(0, 8)], 1, "length"),
    ],
)
def test_piece_cost_bad_arguments(length, ranges, d, match):
    with pytest.raises(ValueError, match=match):
        _CP.piece_cost(length, ranges, d)


def test_piece_cost_that_overflows_is_named():
    # Tiny bandwidth x huge kv bytes: the communication term overflowed to inf silently.
    cp = ContextParallelCost(
        QuadraticCost(1.0, 0.0), bandwidth=1e-300, kv_bytes_per_token=1e300, cost_per_second=1e10
    )
    with pytest.raises(ValueError, match="overflows"):
        cp.rank_costs([8], 2)
    with pytest.raises(ValueError, match="overflows"):
        cp.piece_cost(8, [(0, 2), (6, 8)], 2)
    assert cp.piece_cost(8, [(0, 8)], 1) == 8.0  # one GPU: no communication


@pytest.mark.parametrize("dtype_bytes", [0, -2, True, "2", float("nan"), float("inf")])
def test_kv_bytes_bad_dtype_bytes(dtype_bytes):
    # "2" repeated a string 65536 times and read it as inf; -2 gave negative bytes.
    with pytest.raises(ValueError, match="dtype_bytes"):
        kv_bytes_per_token(FlopsCost.from_name("qwen2.5-7b"), dtype_bytes)


def test_kv_bytes_fractional_dtype():
    # 4-bit K/V: half a byte per value
    assert kv_bytes_per_token(FlopsCost.from_name("qwen2.5-7b"), 0.5) == 4 * 128 * 2 * 28 * 0.5


@pytest.mark.parametrize("sync", ["fsdp", "ddp"])
@pytest.mark.parametrize(
    "lengths, dp, cp_size, m_min, mult",
    [
        ([0, 3], 1, 2, 3, 1),
        ([0, 3], 1, 2, 1, 2),
        ([700, 150, 3, 3, 64, 150, 20, 0, 300], 3, 4, 3, 1),
        ([700, 150, 3, 3, 64, 150, 20, 0, 300], 1, 4, 1, 4),
    ],
)
def test_dynamic_cp_keeps_min_micro_batches_and_multiple(sync, lengths, dp, cp_size, m_min, mult):
    # The Megatron-style candidate packs greedily into as few slots as it can; the plan
    # must still have at least min_micro_batches slots, a multiple of micro_batch_multiple
    # (or refuse, naming the remedy), as the static and the dynamic builders do.
    kw = dict(dp_size=dp, max_tokens=200, cp_size=cp_size, cp="dynamic", sync=sync,
              min_micro_batches=m_min, micro_batch_multiple=mult)  # fmt: skip
    for allow_empty in (False, True):
        try:
            p = sb.plan(lengths, allow_empty=allow_empty, **kw)
        except ValueError as exc:
            assert not allow_empty and "allow_empty" in str(exc)
            continue
        m = p.num_micro_batches
        assert m >= m_min and m % mult == 0, (allow_empty, m)
        assert all(len(gpu) == m for gpu in p.pieces)


def test_a_cp_plan_with_an_moe_cost_equals_itself_after_a_json_round_trip():
    # The cost's config came back in another key order, so the JSON (which Plan ==
    # compares) differed although nothing else did.
    import seqbalance as sb
    from seqbalance.planning.plans import Plan

    lens = sb.workloads.lengths("long-context", 200, seed=1)
    for cost in ("qwen3-30b-a3b", "deepseek-v3"):
        p = sb.plan(lens, 1, 32768, cp_size=8, cost=cost)
        back = Plan.from_json(p.to_json())
        assert back == p and back.to_json() == p.to_json()


@pytest.mark.parametrize("cp", ["static", "dynamic"])
def test_cp_plan_honours_baselines_false(cp):
    # baselines=False was ignored with cp_size > 1: the Megatron-style layout and the
    # baselines inside the static replica plan were candidates all the same.
    lengths = np.random.default_rng(1).integers(100, 16000, 300)
    on = sb.plan(lengths, 4, 8192, cp_size=4, cp=cp)
    off = sb.plan(lengths, 4, 8192, cp_size=4, cp=cp, baselines=False)
    assert not any("baseline" in n and "fastest" in n for n in off.notes)
    if cp == "dynamic":
        assert any("Megatron-style layout (baselines=False)" in n for n in off.notes)
    # The schedule a config passes along changes nothing at one stage per replica.
    assert sb.plan(lengths, 4, 8192, cp_size=4, cp=cp, schedule="gpipe") == on
    assert sorted(i for gpu in off.pieces for sl in gpu for i, *_ in sl) == sorted(
        i for gpu in on.pieces for sl in gpu for i, *_ in sl
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300_000), st.sampled_from([1, 2, 4, 8, 16]),
       st.sampled_from(["mistral-7b-v0.1", "gemma-2-9b", "llama-3-8b"]))
def test_pieces_of_a_windowed_model_add_up_to_its_exact_cost(length, d, name):
    """Split pieces were priced as full causal attention while a whole sequence was priced
    under its window: a 131k-token Mistral-7B-v0.1 sequence cost 2.97x as much over 2 GPUs
    as on one, and the CP planner avoided splitting what it had to."""
    cost = FlopsCost.from_name(name)
    cp = ContextParallelCost(cost)
    exact = float(cost([length])[0])
    layout = balanced_layout(length, d)
    total = sum(cp.piece_cost(length, r, d) for r in layout)
    assert total == pytest.approx(exact, rel=1e-9)
    per_rank, _ = cp.rank_costs([length], d)
    assert per_rank.sum() == pytest.approx(exact, rel=1e-9)
    np.testing.assert_allclose(per_rank[0], [cp.piece_cost(length, r, d) for r in layout])


def test_a_piece_past_the_window_costs_its_tokens_times_the_window():
    # Mistral-7B-v0.1 slides every layer over 4096 keys: a query past the window sees 4096
    # keys, so a piece of queries [8192, 12288) costs what 4096 full-window queries cost.
    cost = FlopsCost.from_name("mistral-7b-v0.1")
    cp = ContextParallelCost(cost)
    w = 4096
    lin = cost.per_token  # matmuls per token
    got = cp.piece_cost(3 * w, [(2 * w, 3 * w)], 2)
    want = lin * w + cost.per_token_sq * (2.0 * w * w)  # pairs: w queries x w keys, x2
    assert got == pytest.approx(want, rel=1e-12)


def test_pieces_off_the_balanced_layout_are_counted_and_not_simulated():
    """A sequence split over two slots was priced without the K/V its second half needs,
    and a contiguous (not zigzag) split in one slot too: both simulated below their own
    lower bound (gaps -33% and -6%) while violations() reported nothing for the second."""
    cpc = ContextParallelCost(
        QuadraticCost(per_token=1.0, per_token_sq=0.01), bandwidth=1.0, kv_bytes_per_token=1.0,
        cost_per_second=1.0,
    )
    split = CPPlan([[[(0, 0, 100)], []], [[], [(0, 100, 200)]]], [200], max_tokens=200,
                   cp_size=2, cp="dynamic", cp_cost=cpc, sync="ddp")  # fmt: skip
    sq = ContextParallelCost(QuadraticCost(0.0, 1.0))
    contiguous = CPPlan([[[(0, 0, 4)]], [[(0, 4, 5)]]], [5], max_tokens=5, cp_size=2,
                        cp="dynamic", cp_cost=sq)  # fmt: skip
    for p in (split, contiguous):
        assert p.violations()["off_layout"] == 1
        with pytest.raises(ValueError, match=r"sequences \[0\] are not split in the balanced"):
            p.simulate()
        with pytest.raises(ValueError, match="balanced CP layout"):
            p.stats()
    # The zigzag split of the same sequence, on an aligned block, in one slot, is fine.
    zigzag = CPPlan([[[(0, 0, 1), (0, 3, 5)]], [[(0, 1, 3)]]], [5], max_tokens=5, cp_size=2,
                    cp="dynamic", cp_cost=sq)  # fmt: skip
    assert zigzag.violations()["off_layout"] == 0 and zigzag.simulate().gap >= -1e-12
    # A block must be aligned: GPUs 1 and 2 of 4 are not a CP group of 2.
    unaligned = CPPlan([[[]], [[(0, 0, 1), (0, 3, 5)]], [[(0, 1, 3)]], [[]]], [5],
                       max_tokens=5, cp_size=4, cp="dynamic", cp_cost=sq)  # fmt: skip
    assert unaligned.violations()["off_layout"] == 1


def test_cp_lower_bound_and_simulate_pieces_check_their_inputs():
    # Both took these (priced, or an AttributeError / IndexError); CPPlan checked them.
    cpc = ContextParallelCost(QuadraticCost(1.0, 0.01))
    for kwargs, words in (
        ({"cp_size": 3}, "power of two"),
        ({"world_size": 1, "cp_size": 4}, "not a multiple of cp_size=4"),
        ({"min_micro_batches": -5}, "min_micro_batches"),
        ({"min_micro_batches": 2.7}, "min_micro_batches"),
        ({"cp_cost": {"bandwidth": 1e9}}, "cp_cost must be a seqbalance.costs.ContextParallelCost"),
    ):
        args = {"world_size": 4, "cp_size": 2, "cp_cost": cpc, **kwargs}
        with pytest.raises(ValueError, match=words):
            cp_lower_bound([400, 30], args["world_size"], args["cp_size"], 100, args["cp_cost"],
                           **{k: v for k, v in args.items()
                              if k not in ("world_size", "cp_size", "cp_cost")})  # fmt: skip
    for pieces, words in (
        ([[[(0, 5, 50)]]], r"\(sequence 0, 5, 50\) is not a token range"),
        ([[[(0, -5, 5)]]], r"\(sequence 0, -5, 5\)"),
        ([[[(3, 0, 5)]]], r"\(sequence 3, 0, 5\)"),
    ):
        with pytest.raises(ValueError, match=words):
            simulate_pieces(pieces, [10], cpc)
    with pytest.raises(ValueError, match="cp_cost must be"):
        simulate_pieces([[[(0, 0, 10)]]], [10], None)
    assert simulate_pieces([[[(0, 0, 10)]]], [10], cpc).step_time == pytest.approx(11.0)


def _off_by_tokens(pieces, lengths, cp_size):
    """Sequences off the balanced layout, from the definition token by token: in one slot,
    on an aligned block of d GPUs (d a power of two <= cp_size), each token held once, by
    GPU block + r where balanced_layout(L, d) gives it to rank r."""
    held = {}
    for g, gpu in enumerate(pieces):
        for j, slot in enumerate(gpu):
            for i, a, b in slot:
                for t in range(a, b):
                    held.setdefault(i, []).append((j, g, t))
    bad = []
    for i, toks in sorted(held.items()):
        length = int(lengths[i])
        fine = False
        d = 1
        while d <= cp_size and not fine:
            owner = {}
            for r, ranges in enumerate(balanced_layout(length, d)):
                for a, b in ranges:
                    owner.update((t, r) for t in range(a, b))
            for block in range(0, len(pieces), d):
                want = sorted((t, block + r) for t, r in owner.items())
                if len({j for j, _, _ in toks}) == 1 and sorted((t, g) for _, g, t in toks) == want:
                    fine = True
            d *= 2
        if not fine:
            bad.append(i)
    return bad


@st.composite
def _pieces_near_the_layout(draw):
    """Pieces of a few sequences in the balanced layout, some of them bent out of it."""
    cp_size = draw(st.sampled_from([1, 2, 4, 8]))
    world = cp_size * draw(st.integers(1, 2))
    m = draw(st.integers(1, 3))
    n = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    pieces = [[[] for _ in range(m)] for _ in range(world)]
    for i, length in enumerate(lengths):
        d = draw(st.sampled_from([x for x in (1, 2, 4, 8) if x <= cp_size]))
        block = d * draw(st.integers(0, world // d - 1))
        slot = draw(st.integers(0, m - 1))
        ranges = [(block + r, a, b) for r, rr in enumerate(balanced_layout(length, d))
                  for a, b in rr]  # fmt: skip
        bends = ["none", "split", "shift", "move", "slot", "dup", "swap", "block", "splitmove"]
        bends += ["drop", "gpu_gone"]
        bend = draw(st.sampled_from(bends))
        k = draw(st.integers(0, len(ranges) - 1))
        g, a, b = ranges[k]
        if bend in ("split", "splitmove") and b - a >= 2:  # touching: still the layout
            c = draw(st.integers(a + 1, b - 1))
            h = draw(st.integers(0, world - 1)) if bend == "splitmove" else g
            ranges[k : k + 1] = [(g, a, c), (h, c, b)]
        elif bend == "shift" and b > a:
            ranges[k] = (g, a, b - 1)
        elif bend == "move":
            ranges[k] = (draw(st.integers(0, world - 1)), a, b)
        elif bend == "drop" and len(ranges) > 1:  # a GPU's tokens missing
            del ranges[k]
        elif bend == "gpu_gone" and len({gg for gg, _, _ in ranges}) > 1:
            ranges = [x for x in ranges if x[0] != g]
        elif bend == "dup":
            ranges.append(ranges[k])
        elif bend == "block":  # the whole sequence one GPU on: an unaligned block for d > 1
            ranges = [((gg + 1) % world, a, b) for gg, a, b in ranges]
        elif bend == "swap" and d >= 2:
            ranges = [(block + d - 1 - (gg - block), a, b) for gg, a, b in ranges]
        for gg, a, b in ranges:
            sl = (slot + 1) % m if bend == "slot" and (gg, a, b) == ranges[0] else slot
            pieces[gg][sl].append((i, a, b))
    return pieces, np.array(lengths), cp_size


@given(_pieces_near_the_layout())
@settings(max_examples=400, deadline=None)
def test_off_layout_matches_the_token_definition(case):
    # _off_layout decides planner-shaped sequences vectorised and the rest one by one; both
    # must agree with the definition, token by token.
    from seqbalance.planning.cp_plans import _off_layout

    pieces, lengths, cp_size = case
    assert _off_layout(pieces, lengths, cp_size) == _off_by_tokens(pieces, lengths, cp_size)
